"""The observation of :class:`~carbon_gym.env.GeoServeEnv`: one declarative feature table.

Every observation feature is a row of :data:`DC_FEATURES`, :data:`SLOT_FEATURES` or
:data:`GLOBAL_FEATURES`: its column name, the field of the typed state it encodes
(:class:`carbon_gym.state.EnvState`; per-datacenter fields are those of
:class:`carbon_gym.state.DatacenterState`), the physical unit of that field, a fixed scaling rule,
an optional cap and a one-line doc. From the tables come the column maps of
:class:`ObservationLayout`, the observation space bounds, the per-datacenter encoder
(:class:`DatacenterEncoder`), :func:`decode_observation` and the feature docs
(:func:`features_markdown`, also appended to ``GeoServeEnv``'s docstring).

Adding a datacenter feature from the simulator takes two edits: the state field (a
:class:`~carbon_gym.sim.results.ClusterSnapshot` field and its value in
``Simulator.snapshot_rows``) and one :class:`Feature` row here. See
``docs/observation.md`` ("Adding a feature") for a worked example.

Scaling rules (:data:`SCALES`) multiply the physical value by a fixed per-datacenter factor (the
reciprocal of a physical reference: the SLO targets, the engine count, the nameplate power...), so
the observation is unit-free and stable across scenarios; ``decode`` multiplies back.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .errors import ConfigError
from .sim.results import SNAPSHOT_ARRAY_ROWS

__all__ = [
    "Feature", "Scale", "SCALES", "DC_FEATURES", "SLOT_FEATURES", "GLOBAL_FEATURES", "ObservationLayout",
    "DatacenterEncoder", "observation_space", "decode_observation", "features_markdown", "observation_signature", "env_fingerprint",
    "check_env_compatible", "ENV_VERSION", "CARBON_SCALE_G_PER_KWH", "TOKENS_SCALE", "QUEUE_PER_ENGINE_SCALE",
    "PREFILL_REF_TOKENS", "TPOT_SLOPE_REF_SEQS", "ESTIMATE_CAP", "OBS_HIGH", "suggest_max_pending",
]

# --------------------------------------------------------------------------- fixed scales
#: Carbon intensities are divided by this (gCO2eq/kWh).
CARBON_SCALE_G_PER_KWH = 1000.0
#: Prompt and predicted output lengths are divided by this (tokens).
TOKENS_SCALE = 1024.0
#: Queue lengths are divided by (engines in the datacenter x this) (requests per engine).
QUEUE_PER_ENGINE_SCALE = 16.0
#: The prefill feature is the estimated prefill time of a prompt of this many tokens (/ TTFT target).
PREFILL_REF_TOKENS = 1024.0
#: The TPOT-slope feature is the TPOT added by this many more running sequences (/ TPOT target).
TPOT_SLOPE_REF_SEQS = 64.0
#: Latency-estimate features are capped at this value (in units of the SLO target; and floored at
#: 0, the observation space's bound); estimates are infinite for a datacenter that is down.
ESTIMATE_CAP = 100.0
#: Finite upper bound of the unbounded features in the observation space (Gymnasium's checker
#: rejects infinite bounds); time waited and the global counters are clipped to it.
OBS_HIGH = 1e9

#: Version of the env's observation / action / reward definitions. Bump it when their meaning
#: changes; :func:`env_fingerprint` combines it with an env's layout so that checkpoints can
#: store it and refuse to run on an incompatible env (:func:`check_env_compatible`).
ENV_VERSION = "geoserve-0.2"


# --------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class ObservationLayout:
    """Shapes, column indices and fixed scales of the observation (everything
    :func:`decode_observation` needs), plus static per-datacenter facts.

    Attributes:
        n_datacenters (D), n_regions (R), max_pending (K), forecast_hours (H).
        ttft_target_s, tpot_target_s: SLO targets (seconds) used as time scales.
        duration_s, polling_period_s: episode length and step length (seconds).
        n_engines: engines per datacenter (D,). engine_kv_blocks: KV blocks per engine (D,).
        block_tokens: tokens per KV block. max_num_seqs: per-engine running-sequence cap.
        nameplate_w: per-datacenter facility nameplate power = GPUs x GPU TDP x PUE (W), (D,).
        datacenter_names, region_names: names in index order.
        carbon_feed_flags: the datacenter rows end with the ``carbon_stale`` and
            ``carbon_missing`` flags (scenarios with a carbon-feed gap fault).
        capacity_control: the rows carry the capacity columns (``[capacity] control`` other
            than ``always_on``); capacity_agent: the action has capacity parts (``control = "agent"``).
            n_servers: servers per datacenter (D,).
        prefix_cache: the slots carry the ``cached_prefix`` columns (scenarios with a prefix
            workload, :func:`carbon_gym.sessions.is_prefix_workload`).

    Column maps (derived from the feature tables): ``dc_columns`` (name -> index in the
    ``(D, F_D)`` view of ``obs["datacenters"]``; the forecast spans ``carbon_forecast_1h`` ..
    ``carbon_forecast_<H>h``), ``slot_columns`` (name -> first index in the ``(K, F_S)`` view of
    ``obs["slots"]``; ``origin`` spans R columns, ``network`` D), ``global_columns``.
    """

    n_datacenters: int
    n_regions: int
    max_pending: int
    forecast_hours: int
    ttft_target_s: float
    tpot_target_s: float
    duration_s: float
    polling_period_s: float
    n_engines: np.ndarray
    engine_kv_blocks: np.ndarray
    block_tokens: int
    max_num_seqs: int
    nameplate_w: np.ndarray
    datacenter_names: tuple[str, ...]
    region_names: tuple[str, ...]
    carbon_feed_flags: bool = False
    capacity_control: bool = False
    capacity_agent: bool = False
    n_servers: Any = None
    prefix_cache: bool = False

    def width(self, feature: Feature) -> int:
        """Columns ``feature`` spans in this layout (0 when it is not present)."""
        if feature.when is not None and not getattr(self, feature.when):
            return 0
        return {"1": 1, "H": self.forecast_hours, "R": self.n_regions, "D": self.n_datacenters}[feature.width]

    def _columns(self, table: tuple[Feature, ...], expand: bool) -> dict[str, int]:
        out: dict[str, int] = {}
        i = 0
        for f in table:
            w = self.width(f)
            if expand and f.width == "H":
                for h in range(w):
                    out[f"{f.name}_{h + 1}h"] = i + h
            elif w:
                out[f.name] = i
            i += w
        return out

    @property
    def dc_columns(self) -> dict[str, int]:
        """Column index of each per-datacenter feature."""
        return self._columns(DC_FEATURES, expand=True)

    @property
    def n_dc_features(self) -> int:
        """F_D: features per datacenter."""
        return sum(self.width(f) for f in DC_FEATURES)

    @property
    def slot_columns(self) -> dict[str, int]:
        """First column of each per-slot feature (origin: R columns; network: D columns)."""
        return self._columns(SLOT_FEATURES, expand=False)

    @property
    def n_slot_features(self) -> int:
        """F_S: features per slot."""
        return sum(self.width(f) for f in SLOT_FEATURES)

    @property
    def global_columns(self) -> dict[str, int]:
        """Index of each global feature."""
        return self._columns(GLOBAL_FEATURES, expand=False)

    @property
    def n_global_features(self) -> int:
        """F_G: global features."""
        return sum(self.width(f) for f in GLOBAL_FEATURES)


# --------------------------------------------------------------------------- scaling rules
@dataclass(frozen=True)
class Scale:
    """A fixed scaling rule: ``factor(layout) -> (D,)`` multiplies the physical value into the
    observation, ``inverse(layout) -> (D,)`` multiplies it back (decode); ``text`` documents it."""

    text: str
    factor: Callable[[ObservationLayout], np.ndarray]
    inverse: Callable[[ObservationLayout], np.ndarray]


def _ones(L: ObservationLayout) -> np.ndarray:
    return np.ones(L.n_datacenters)


def _engines(L: ObservationLayout) -> np.ndarray:
    return np.maximum(L.n_engines, 1).astype(np.float64)


def _servers(L: ObservationLayout) -> np.ndarray:
    n = np.ones(L.n_datacenters) if L.n_servers is None else np.asarray(L.n_servers, dtype=np.float64)
    return np.maximum(n, 1.0)


def _kv_blocks(L: ObservationLayout) -> np.ndarray:
    return np.maximum(L.n_engines * L.engine_kv_blocks, 1).astype(np.float64)


SCALES: dict[str, Scale] = {
    "none": Scale("none", _ones, _ones),
    "flag": Scale("0 / 1", _ones, _ones),
    "carbon": Scale("/ 1000", lambda L: _ones(L) / CARBON_SCALE_G_PER_KWH, lambda L: _ones(L) * CARBON_SCALE_G_PER_KWH),
    "queue": Scale("/ (engines_d x 16)", lambda L: 1.0 / (_engines(L) * QUEUE_PER_ENGINE_SCALE),
                   lambda L: L.n_engines.astype(np.float64) * QUEUE_PER_ENGINE_SCALE),
    "running": Scale("/ (engines_d x max_num_seqs)", lambda L: 1.0 / (_engines(L) * L.max_num_seqs),
                     lambda L: L.n_engines.astype(np.float64) * L.max_num_seqs),
    "kv_fraction": Scale("free / total blocks", lambda L: 1.0 / _kv_blocks(L),
                         lambda L: L.n_engines.astype(np.float64) * L.engine_kv_blocks),
    "nameplate": Scale("/ (GPUs_d x GPU TDP x PUE_d)", lambda L: 1.0 / L.nameplate_w, lambda L: L.nameplate_w),
    "engines": Scale("/ engines_d", lambda L: 1.0 / _engines(L), lambda L: L.n_engines.astype(np.float64)),
    "servers": Scale("/ servers_d", lambda L: 1.0 / _servers(L), lambda L: _servers(L)),
    "ttft": Scale("/ T_ttft", lambda L: _ones(L) / L.ttft_target_s, lambda L: _ones(L) * L.ttft_target_s),
    "prefill_ref": Scale("x 1024 / T_ttft", lambda L: _ones(L) * (PREFILL_REF_TOKENS / L.ttft_target_s),
                         lambda L: _ones(L) * (L.ttft_target_s / PREFILL_REF_TOKENS)),
    "tpot": Scale("/ T_tpot", lambda L: _ones(L) / L.tpot_target_s, lambda L: _ones(L) * L.tpot_target_s),
    "tpot_slope_ref": Scale("x 64 / T_tpot", lambda L: _ones(L) * (TPOT_SLOPE_REF_SEQS / L.tpot_target_s),
                            lambda L: _ones(L) * (L.tpot_target_s / TPOT_SLOPE_REF_SEQS)),
    "tokens": Scale("/ 1024", lambda L: _ones(L) / TOKENS_SCALE, lambda L: _ones(L) * TOKENS_SCALE),
    "prompt_fraction": Scale("/ prompt tokens of the slot", _ones, _ones),
}
"""Scaling rules by name (per-datacenter factors; slot and global rules are documented here and
applied by the env's slot encoder)."""


# --------------------------------------------------------------------------- the tables
@dataclass(frozen=True)
class Feature:
    """One observation feature (a table row).

    Attributes:
        name: column name (key of the layout's column map).
        source: field of the typed state it encodes (per datacenter: a
            :class:`~carbon_gym.state.DatacenterState` field).
        unit: physical unit of ``source``.
        scale: key of :data:`SCALES`.
        doc: what it is, in a few words.
        cap: upper bound applied after scaling (latency estimates), or None.
        high: upper bound of the observation space.
        width: columns it spans: ``"1"``, ``"H"`` (forecast hours), ``"R"`` (regions) or ``"D"``.
        when: a boolean layout attribute that must be true for the feature to be present.
        kind: decoded type: ``"float"``, ``"int"`` (rounded) or ``"bool"``.
        estimate: a latency estimate (``inf`` while the datacenter is down; decoded as ``inf``).
    """

    name: str
    source: str
    unit: str
    scale: str
    doc: str
    cap: float | None = None
    high: float = OBS_HIGH
    width: str = "1"
    when: str | None = None
    kind: str = "float"
    estimate: bool = False


def _est(name: str, source: str, scale: str, doc: str) -> Feature:
    return Feature(name, source, "s", scale, doc, cap=ESTIMATE_CAP, estimate=True)


DC_FEATURES: tuple[Feature, ...] = (
    Feature("carbon_now", "carbon_g_per_kwh", "g/kWh", "carbon", "grid carbon intensity now"),
    Feature("carbon_forecast", "carbon_forecast_g_per_kwh", "g/kWh", "carbon",
            "forecast intensity of the H whole hours after the current one", width="H"),
    Feature("pue", "pue", "-", "none", "PUE"),
    Feature("queue_len", "queue_len", "requests", "queue", "requests queued (engine queues + in transit to d)", kind="int"),
    Feature("running", "running", "sequences", "running", "sequences in running batches", kind="int"),
    Feature("free_kv", "free_kv_blocks", "blocks", "kv_fraction", "free KV cache", high=1.0, kind="int"),
    Feature("power", "power_w", "W", "nameplate", "facility power now"),
    Feature("busy_engines", "busy_engines", "engines", "engines", "engines with work", kind="int"),
    _est("est_queue_wait", "est_queue_wait_s", "ttft", "est. queueing wait of a new request"),
    _est("est_prefill", "est_prefill_s_per_token", "prefill_ref", "est. marginal prefill time of 1024 prompt tokens"),
    _est("est_iteration", "est_iteration_s", "tpot", "est. fixed time of one prefill-chunk iteration"),
    _est("est_tpot", "est_tpot_s", "tpot", "est. per-token decode time (TPOT) of a new request"),
    _est("tpot_slope", "tpot_slope_s_per_seq", "tpot_slope_ref", "TPOT added by 64 more running sequences"),
    Feature("up", "up", "flag", "flag", "datacenter up", high=1.0, kind="bool"),
    Feature("carbon_stale", "carbon_stale", "flag", "flag", "carbon feed stale (values frozen at the gap's start)",
            high=1.0, when="carbon_feed_flags", kind="bool"),
    Feature("carbon_missing", "carbon_missing", "flag", "flag", "carbon feed missing (carbon columns 0)",
            high=1.0, when="carbon_feed_flags", kind="bool"),
    Feature("awake_engines", "awake_engines", "engines", "engines", "engines awake (serving or able to)",
            high=1.0, when="capacity_control", kind="int"),
    Feature("waking_engines", "waking_engines", "engines", "engines", "engines waking or booting",
            high=1.0, when="capacity_control", kind="int"),
    Feature("sleeping_engines", "sleeping_engines", "engines", "engines", "engines draining to sleep, falling asleep "
            "or asleep", high=1.0, when="capacity_control", kind="int"),
    Feature("off_engines", "off_engines", "engines", "engines", "engines on servers that are off",
            high=1.0, when="capacity_control", kind="int"),
    Feature("servers_on", "servers_on", "servers", "servers", "servers powered (on, standby or booting)",
            high=1.0, when="capacity_control", kind="int"),
    Feature("wake_latency", "wake_latency_s", "s", "ttft", "time a sleeping engine takes to wake",
            when="capacity_control"),
)
"""Per-datacenter features, in column order (row d of ``obs["datacenters"]`` = datacenter d)."""

SLOT_FEATURES: tuple[Feature, ...] = (
    Feature("valid", "valid", "flag", "flag", "valid (a request is in this slot)", high=1.0, kind="bool"),
    Feature("origin", "origin", "flag", "flag", "origin region, one-hot", high=1.0, width="R", kind="int"),
    Feature("prompt", "prompt_tokens", "tokens", "tokens", "prompt length"),
    Feature("predicted_output", "predicted_output_tokens", "tokens", "tokens",
            "predicted output length (scenario's predictor; \"oracle\" = true length)"),
    Feature("cached_prefix", "cached_prefix_tokens", "tokens", "prompt_fraction", "share of the prompt cached at the "
            "best engine of each datacenter", high=1.0, width="D", when="prefix_cache"),
    Feature("waited", "waited_s", "s", "ttft", "time waited since arrival at the origin"),
    Feature("network", "network_s", "s", "ttft", "network delay to each datacenter (uplink + downlink)", width="D"),
)
"""Per-slot features (row k of ``obs["slots"]`` = pending request k, oldest first)."""

GLOBAL_FEATURES: tuple[Feature, ...] = (
    Feature("hour_sin", "hour_utc", "h", "none", "sin of 2 pi x (UTC hour of day) / 24 (carbon-trace clock)", high=1.0),
    Feature("hour_cos", "hour_utc", "h", "none", "cos of 2 pi x (UTC hour of day) / 24", high=1.0),
    Feature("pending_total", "pending_total", "requests", "none", "pending requests in total (slots + overflow) / K"),
    Feature("elapsed", "elapsed_s", "s", "none", "simulated seconds since the episode start / duration_s"),
)
"""Global features."""


# --------------------------------------------------------------------------- datacenter encoder
class DatacenterEncoder:
    """Encodes the per-datacenter block of the observation from the simulator's snapshot array,
    the forecast and the carbon-feed flags, following :data:`DC_FEATURES` (precomputed for one
    layout: the scale factors, caps, source rows and destination columns).

    ``encode(snap, forecast_scaled, carbon_view)`` returns the (D, F_D) float32 block: each
    snapshot-sourced feature is ``value x factor`` clipped to ``[0, cap]`` (the observation
    space's floor is 0; the simulator's TPOT-slope estimate, a difference of two points of the
    piecewise-linear latency table, is negative where that table dips, e.g. between 40 and 48
    batched tokens on the A100 set, so its feature is 0 there while the typed state keeps the
    estimate), computed in float64 and rounded once to float32; ``forecast_scaled`` is the (D, H) forecast already multiplied by the carbon
    factor (the env caches it per hour); ``carbon_view`` (optional) is a carbon-feed-gap view
    ``(now_g_per_kwh, forecast_g_per_kwh, stale, missing)`` that replaces the carbon columns of
    the datacenters whose feed is stale or missing (missing: 0) and sets the flag columns.
    """

    def __init__(self, layout: ObservationLayout) -> None:
        self.layout = L = layout
        cols = L.dc_columns
        self.n_features = L.n_dc_features
        src, dst, factor, cap = [], [], [], []
        for f in DC_FEATURES:
            if not L.width(f) or f.source not in SNAPSHOT_ARRAY_ROWS:
                continue
            src.append(SNAPSHOT_ARRAY_ROWS.index(f.source))
            dst.append(cols[f.name])
            factor.append(SCALES[f.scale].factor(L))
            cap.append(np.inf if f.cap is None else f.cap)
        self.src_rows = np.array(src, dtype=np.intp)
        self.dst_cols = np.array(dst, dtype=np.intp)
        self.factor = np.stack(factor, axis=0)  # (n, D)
        self.cap = np.array(cap, dtype=np.float64)[:, None]
        self.carbon_factor = float(SCALES["carbon"].factor(L)[0])
        H = L.forecast_hours
        self.forecast_cols = slice(cols["carbon_forecast_1h"], cols["carbon_forecast_1h"] + H) if H else slice(0, 0)
        self.carbon_col = cols["carbon_now"]
        self.stale_col = cols.get("carbon_stale")
        self.missing_col = cols.get("carbon_missing")
        self._template_key: Any = None
        self._template = np.zeros((L.n_datacenters, self.n_features), dtype=np.float32)

    def clear(self) -> None:
        """Forget the cached forecast template (a new episode has a new forecast)."""
        self._template_key = None

    def encode(self, snap: np.ndarray, forecast_scaled: np.ndarray | None, hour_key: Any = None,
               carbon_view: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """The (D, F_D) float32 datacenter block (see the class docstring). ``hour_key`` names the
        forecast: the float32 template holding it is rebuilt only when the key changes."""
        raw = snap[self.src_rows]
        raw *= self.factor
        np.clip(raw, 0.0, self.cap, out=raw)  # (the space's floor: the TPOT slope can dip below 0)
        if forecast_scaled is not None and forecast_scaled.shape[1]:
            if hour_key != self._template_key or hour_key is None:
                self._template = np.zeros_like(self._template)
                self._template[:, self.forecast_cols] = forecast_scaled
                self._template_key = hour_key
            dc = self._template.copy()
        else:
            dc = np.zeros((self.layout.n_datacenters, self.n_features), dtype=np.float32)
        dc[:, self.dst_cols] = raw.T
        if carbon_view is not None and self.stale_col is not None:
            now_g, fc_g, stale, missing = carbon_view
            dc[:, self.stale_col] = stale & ~missing
            dc[:, self.missing_col] = missing
            k = self.carbon_factor
            for d in np.flatnonzero(stale | missing):
                if missing[d]:
                    dc[d, self.carbon_col] = 0.0
                    dc[d, self.forecast_cols] = 0.0
                else:
                    dc[d, self.carbon_col] = now_g[d] / CARBON_SCALE_G_PER_KWH
                    dc[d, self.forecast_cols] = fc_g[d] * k
        return dc


def observation_space(L: ObservationLayout) -> Any:
    """The observation space of a layout (a gymnasium ``Dict`` of three float32 ``Box``es): bounds
    from the feature tables ([0, high]; sin/cos in [-1, 1])."""
    from gymnasium import spaces as gym_spaces

    D, K = L.n_datacenters, L.max_pending
    inf = np.float32(OBS_HIGH)
    dc_high = np.full((D, L.n_dc_features), inf, np.float32)
    cols = L.dc_columns
    for f in DC_FEATURES:
        if L.width(f) and f.width == "1" and f.high != OBS_HIGH:
            dc_high[:, cols[f.name]] = f.high
    sl_high = np.full((K, L.n_slot_features), inf, np.float32)
    sc = L.slot_columns
    sl_high[:, sc["valid"]] = 1.0
    sl_high[:, sc["origin"]:sc["origin"] + L.n_regions] = 1.0
    if L.prefix_cache:
        sl_high[:, sc["cached_prefix"]:sc["cached_prefix"] + L.n_datacenters] = 1.0
    g_lo = np.array([-1.0 if f.name.startswith("hour_") else 0.0 for f in GLOBAL_FEATURES], np.float32)
    g_hi = np.array([f.high for f in GLOBAL_FEATURES], np.float32)
    return gym_spaces.Dict({
        "datacenters": gym_spaces.Box(np.zeros(D * L.n_dc_features, np.float32), dc_high.reshape(-1), dtype=np.float32),
        "slots": gym_spaces.Box(np.zeros(K * L.n_slot_features, np.float32), sl_high.reshape(-1), dtype=np.float32),
        "globals": gym_spaces.Box(g_lo, g_hi, dtype=np.float32),
    })


# --------------------------------------------------------------------------- decode
def _layout_of(env_or_layout: Any) -> ObservationLayout:
    if isinstance(env_or_layout, ObservationLayout):
        return env_or_layout
    base = getattr(env_or_layout, "unwrapped", env_or_layout)
    layout = getattr(base, "layout", None)
    if isinstance(layout, ObservationLayout):
        return layout
    raise ConfigError("env_or_layout", f"expected a GeoServeEnv (possibly wrapped) or an ObservationLayout, got {type(env_or_layout).__name__}")


def decode_observation(obs: Mapping[str, np.ndarray], env_or_layout: Any) -> dict[str, Any]:
    """Turn an observation back into physical units (for inspection; schedulers read the typed
    state, :meth:`GeoServeEnv.state`, which is exact where the observation is rounded to float32
    and capped).

    Args:
        obs: one (unbatched) observation of :class:`~carbon_gym.env.GeoServeEnv`.
        env_or_layout: the env (wrapped or not) or its :class:`ObservationLayout`.

    Returns:
        dict of numpy arrays (float64 unless noted; D datacenters, K slots, H forecast hours).
        Per datacenter (D,), one entry per :data:`DC_FEATURES` row, keyed by its ``source``
        field (``carbon_g_per_kwh``, ``carbon_forecast_g_per_kwh`` (D, H), ``pue``, ``queue_len``
        (int), ``running`` (int), ``free_kv_blocks`` (int), ``power_w``, ``busy_engines`` (int),
        the five estimates (``inf`` where ``up`` is False, at most ``ESTIMATE_CAP`` x the SLO
        target otherwise), ``up`` (bool), ``carbon_stale`` / ``carbon_missing`` (bool; all False
        without a carbon-feed gap; carbon NaN where missing)), plus ``free_kv_fraction``.
        Per slot: ``slot_valid`` (K,) bool; ``slot_origin`` (K,) int, -1 on padded slots;
        ``slot_prompt_tokens``; ``slot_predicted_output_tokens``; ``slot_waited_s``;
        ``slot_network_s`` (K, D); ``slot_cached_prefix_tokens`` (K, D) (zeros without a prefix
        workload; from the rounded prompt share, so within a token or so). Global: ``hour_utc`` in [0, 24); ``pending_total`` (int);
        ``elapsed_s``. Static (copied from the layout): ``n_engines``, ``engine_kv_blocks``,
        ``block_tokens``, ``max_num_seqs``, ``nameplate_w``, ``ttft_target_s``, ``tpot_target_s``.
    """
    L = _layout_of(env_or_layout)
    D, K, R = L.n_datacenters, L.max_pending, L.n_regions
    dc = np.asarray(obs["datacenters"], dtype=np.float64).reshape(D, L.n_dc_features)
    sl = np.asarray(obs["slots"], dtype=np.float64).reshape(K, L.n_slot_features)
    gl = np.asarray(obs["globals"], dtype=np.float64)
    cols = L.dc_columns
    up = dc[:, cols["up"]] > 0.5
    out: dict[str, Any] = {}
    missing = np.zeros(D, dtype=bool)
    for f in DC_FEATURES:
        w = L.width(f)
        if not w:
            continue
        first = cols[f"{f.name}_1h"] if f.width == "H" else cols[f.name]
        v = dc[:, first:first + w] if f.width == "H" else dc[:, first]
        inv = SCALES[f.scale].inverse(L)
        if f.name == "free_kv":
            out["free_kv_fraction"] = v.copy()
        if f.kind == "bool":
            x: np.ndarray = v > 0.5
        elif f.kind == "int":
            x = np.rint(v * inv).astype(np.int64)
        else:
            x = v * (inv[:, None] if f.width == "H" else inv)
        if f.estimate:
            x = np.where(up, x, np.inf)
        out[f.source] = x
    if L.carbon_feed_flags:
        missing = out["carbon_missing"]
    else:
        out["carbon_stale"] = np.zeros(D, dtype=bool)
        out["carbon_missing"] = missing
    for k in ("carbon_g_per_kwh", "carbon_forecast_g_per_kwh"):
        out[k] = np.array(out[k], dtype=np.float64)
        out[k][missing] = np.nan
    s = L.slot_columns
    valid = sl[:, s["valid"]] > 0.5
    origin = np.where(valid, np.argmax(sl[:, s["origin"]:s["origin"] + R], axis=1), -1)
    g = L.global_columns
    hour = (math.degrees(math.atan2(gl[g["hour_sin"]], gl[g["hour_cos"]])) / 15.0) % 24.0
    out.update({
        "slot_valid": valid,
        "slot_origin": origin.astype(np.int64),
        "slot_prompt_tokens": np.rint(sl[:, s["prompt"]] * TOKENS_SCALE) * valid,
        "slot_predicted_output_tokens": sl[:, s["predicted_output"]] * TOKENS_SCALE,
        "slot_waited_s": sl[:, s["waited"]] * L.ttft_target_s,
        "slot_network_s": sl[:, s["network"]:s["network"] + D] * L.ttft_target_s,
        "slot_cached_prefix_tokens": (np.rint(sl[:, s["cached_prefix"]:s["cached_prefix"] + D] * sl[:, [s["prompt"]]]
                                              * TOKENS_SCALE) if L.prefix_cache else np.zeros((K, D))),
        "hour_utc": hour,
        "pending_total": int(round(gl[g["pending_total"]] * K)),
        "elapsed_s": gl[g["elapsed"]] * L.duration_s,
        "n_engines": L.n_engines.copy(),
        "engine_kv_blocks": L.engine_kv_blocks.copy(),
        "block_tokens": L.block_tokens,
        "max_num_seqs": L.max_num_seqs,
        "nameplate_w": L.nameplate_w.copy(),
        "ttft_target_s": L.ttft_target_s,
        "tpot_target_s": L.tpot_target_s,
    })
    return out


def suggest_max_pending(expected_per_step: float) -> int:
    """A slot count K that holds a step's arrivals with margin: next power of two >= 1.25 x mean + 4 sd + 16."""
    need = 1.25 * expected_per_step + 4.0 * math.sqrt(expected_per_step) + 16
    return int(2 ** math.ceil(math.log2(need)))


# --------------------------------------------------------------------------- docs
def _width_text(f: Feature) -> str:
    return {"1": "", "H": " (H columns)", "R": " (R columns)", "D": " (D columns)"}[f.width]


def features_markdown() -> str:
    """Markdown tables of the observation features (generated from the feature tables)."""
    out = []
    for title, table in (("datacenters", DC_FEATURES), ("slots", SLOT_FEATURES), ("globals", GLOBAL_FEATURES)):
        out.append(f'``"{title}"``:\n')
        out.append("| column | feature | state field | unit | scaling |")
        out.append("|---|---|---|---|---|")
        for f in table:
            cap = f", clipped to [0, {f.cap:g}]" if f.cap is not None else ""
            when = f" (only with {f.when})" if f.when else ""
            out.append(f"| `{f.name}`{_width_text(f)} | {f.doc}{when} | `{f.source}` | {f.unit} | "
                       f"{SCALES[f.scale].text}{cap} |")
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- compatibility
def observation_signature(env_or_layout: Any) -> dict[str, Any]:
    """What a trained policy depends on: ``ENV_VERSION``, the sizes (D, R, K, H), the column
    maps and the fixed feature scales of the observation, and the action size. JSON-friendly."""
    L = _layout_of(env_or_layout)
    return {
        "env_version": ENV_VERSION,
        "n_datacenters": int(L.n_datacenters),
        "n_regions": int(L.n_regions),
        "max_pending": int(L.max_pending),
        "forecast_hours": int(L.forecast_hours),
        "dc_columns": dict(L.dc_columns),
        "slot_columns": dict(L.slot_columns),
        "global_columns": dict(L.global_columns),
        "action_nvec": [int(L.n_datacenters) + 1] * int(L.max_pending) + (
            [int(x) + 1 for x in L.n_engines] + [int(x) + 1 for x in L.n_servers] if L.capacity_agent else []),
        "scales": {
            "carbon_g_per_kwh": CARBON_SCALE_G_PER_KWH, "tokens": TOKENS_SCALE,
            "queue_per_engine": QUEUE_PER_ENGINE_SCALE, "prefill_ref_tokens": PREFILL_REF_TOKENS,
            "tpot_slope_ref_seqs": TPOT_SLOPE_REF_SEQS, "estimate_cap": ESTIMATE_CAP, "obs_high": OBS_HIGH,
        },
    }


def env_fingerprint(env_or_layout: Any) -> str:
    """Short hash of :func:`observation_signature` (store it in checkpoints)."""
    text = json.dumps(observation_signature(env_or_layout), sort_keys=True)
    return f"{ENV_VERSION}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def check_env_compatible(stored: Any, env_or_layout: Any, what: str = "checkpoint") -> None:
    """Raise :class:`~carbon_gym.errors.ConfigError` (field ``what``) unless ``stored`` — a
    fingerprint string or a signature dict saved with a checkpoint — matches the env; with a
    signature, the message names the entries that differ."""
    current = observation_signature(env_or_layout)
    if isinstance(stored, str):
        mine = env_fingerprint(env_or_layout)
        if stored != mine:
            raise ConfigError(what, f"was made for env {stored!r}, this env is {mine!r} (different env version or "
                              "observation layout: retrain, or store the signature to see what differs)", allowed=[mine])
        return
    if not isinstance(stored, dict):
        raise ConfigError(what, f"expected a fingerprint string or a signature dict, got {type(stored).__name__}")
    diffs = [f"{k}: stored {stored.get(k)!r}, env {v!r}" for k, v in current.items() if stored.get(k) != v]
    diffs += [f"{k}: stored {stored[k]!r}, not in this env" for k in stored if k not in current]
    if diffs:
        raise ConfigError(what, "incompatible with this env: " + "; ".join(diffs[:5]) + (" ..." if len(diffs) > 5 else ""))
