"""GeoServeEnv: the Gymnasium environment of carbon-aware, geo-distributed LLM serving.

One step = one scheduler polling period. See :class:`GeoServeEnv` for the observation, action,
reward and episode definitions, and :func:`decode_observation` to read an observation back in
physical units.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .errors import ActionError, ConfigError, check_choice
from .faults import has_carbon_feed_gap
from .sim.simulator import SNAPSHOT_ARRAY_ROWS

__all__ = [
    "GeoServeEnv",
    "ENV_VERSION",
    "observation_signature",
    "env_fingerprint",
    "check_env_compatible",
    "ObservationLayout",
    "decode_observation",
    "CARBON_SCALE_G_PER_KWH",
    "TOKENS_SCALE",
    "QUEUE_PER_ENGINE_SCALE",
    "PREFILL_REF_TOKENS",
    "TPOT_SLOPE_REF_SEQS",
    "REFERENCE_INTENSITY_G_PER_KWH",
    "ESTIMATE_CAP",
    "OBS_HIGH",
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
#: Latency-estimate features are capped at this value (in units of the SLO target); estimates are
#: infinite for a datacenter that is down.
ESTIMATE_CAP = 100.0
#: Finite upper bound of the unbounded features in the observation space (Gymnasium's checker
#: rejects infinite bounds); time waited and the global counters are clipped to it.
OBS_HIGH = 1e9
#: Reward normalisation: grid intensity (gCO2eq/kWh) used for the nominal grams per step.
REFERENCE_INTENSITY_G_PER_KWH = 400.0
#: Default bound of the end-of-episode drain: this many TTFT targets ...
DRAIN_TTFT_MULTIPLE = 10.0
#: ... plus this many TPOT targets per output token of the longest request placed.
DRAIN_TPOT_MULTIPLE = 2.0

INVALID_ACTION_MODES = ("raise", "defer")

# Pending-request store columns (one float64 matrix; integers are exact in float64).
# _P_FAILED: times the request was failed over (aborted by an outage and re-queued).
_P_ORIGIN, _P_ARRIVAL, _P_PROMPT, _P_OUTPUT, _P_PRED, _P_SEQ, _P_FAILED = range(7)
_P_COLS = 7

#: Version of the env's observation / action / reward definitions. Bump it when their meaning
#: changes; :func:`env_fingerprint` combines it with an env's layout so that checkpoints can
#: store it and refuse to run on an incompatible env (:func:`check_env_compatible`).
ENV_VERSION = "geoserve-0.2"


# Rows of Simulator.snapshot_array() that the datacenter block uses, in its column order (after
# the forecast): carbon now, PUE, queue, running, free KV, power, busy, the five estimates, up.
_SNAP_OBS_ROWS = np.array([SNAPSHOT_ARRAY_ROWS.index(k) for k in (
    "carbon_g_per_kwh", "pue", "queue_len", "running", "free_kv_blocks", "power_w", "busy_engines",
    "est_queue_wait_s", "est_prefill_s_per_token", "est_iteration_s", "est_tpot_s", "tpot_slope_s_per_seq", "up")],
    dtype=np.intp)
_SNAP_UP = SNAPSHOT_ARRAY_ROWS.index("up")
# Up to this many visible requests, _observe fills the slot rows in Python (same floats).
_SLOTS_IN_PYTHON = 16
# Up to this many completions in a step, step() tallies them in Python (same numbers).
_STATS_IN_PYTHON = 64
# Up to this many datacenters, _observe builds the datacenter block in Python (same floats).
_DC_IN_PYTHON = 4
_SNAP_OBS_ROWS_LIST = _SNAP_OBS_ROWS.tolist()
# Integer columns of the pending store handed to submit_batch: origin, prompt, output.
_P_INT_COLS = np.array([_P_ORIGIN, _P_PROMPT, _P_OUTPUT], dtype=np.intp)
# The ufunc reductions behind ndarray.sum/max/min/all (same results, without the Python wrapper).
_SUM, _MAX, _MIN, _ALL = np.add.reduce, np.maximum.reduce, np.minimum.reduce, np.logical_and.reduce


# ------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class ObservationLayout:
    """Shapes, column indices and fixed scales of the observation (everything
    :func:`decode_observation` needs), plus static per-datacenter facts.

    Attributes:
        n_datacenters (D), n_regions (R), max_pending (K), forecast_hours (H).
        dc_columns: column name -> index in the ``(D, F_D)`` view of ``obs["datacenters"]``.
        slot_columns: column name -> first index in the ``(K, F_S)`` view of ``obs["slots"]``
            (``origin`` spans R columns, ``network`` spans D columns).
        global_columns: name -> index in ``obs["globals"]``.
        ttft_target_s, tpot_target_s: SLO targets (seconds) used as time scales.
        duration_s, polling_period_s: episode length and step length (seconds).
        n_engines: engines per datacenter (D,). engine_kv_blocks: KV blocks per engine (D,).
        block_tokens: tokens per KV block. max_num_seqs: per-engine running-sequence cap.
        nameplate_w: per-datacenter facility nameplate power = GPUs x GPU TDP x PUE (W), (D,).
        datacenter_names, region_names: names in index order.
        carbon_feed_flags: the datacenter rows end with the ``carbon_stale`` and
            ``carbon_missing`` flags (scenarios with a carbon-feed gap fault).
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

    # ---- column maps (derived)
    @property
    def dc_columns(self) -> dict[str, int]:
        """Column index of each per-datacenter feature."""
        h = self.forecast_hours
        names = ["carbon_now"] + [f"carbon_forecast_{i + 1}h" for i in range(h)] + [
            "pue", "queue_len", "running", "free_kv", "power", "busy_engines",
            "est_queue_wait", "est_prefill", "est_iteration", "est_tpot", "tpot_slope", "up",
        ] + (["carbon_stale", "carbon_missing"] if self.carbon_feed_flags else [])
        return {n: i for i, n in enumerate(names)}

    @property
    def n_dc_features(self) -> int:
        """F_D: features per datacenter."""
        return 13 + self.forecast_hours + (2 if self.carbon_feed_flags else 0)

    @property
    def slot_columns(self) -> dict[str, int]:
        """First column of each per-slot feature (origin: R columns; network: D columns)."""
        r = self.n_regions
        return {"valid": 0, "origin": 1, "prompt": 1 + r, "predicted_output": 2 + r,
                "waited": 3 + r, "network": 4 + r}

    @property
    def n_slot_features(self) -> int:
        """F_S: features per slot."""
        return 4 + self.n_regions + self.n_datacenters

    @property
    def global_columns(self) -> dict[str, int]:
        """Index of each global feature."""
        return {"hour_sin": 0, "hour_cos": 1, "pending_total": 2, "elapsed": 3}

    @property
    def n_global_features(self) -> int:
        """F_G: global features."""
        return 4


def _layout_of(env_or_layout: Any) -> ObservationLayout:
    if isinstance(env_or_layout, ObservationLayout):
        return env_or_layout
    base = getattr(env_or_layout, "unwrapped", env_or_layout)
    layout = getattr(base, "layout", None)
    if isinstance(layout, ObservationLayout):
        return layout
    raise ConfigError("env_or_layout", f"expected a GeoServeEnv (possibly wrapped) or an ObservationLayout, got {type(env_or_layout).__name__}")


def decode_observation(obs: dict[str, np.ndarray], env_or_layout: Any) -> dict[str, Any]:
    """Turn an observation back into physical units.

    Args:
        obs: one (unbatched) observation of :class:`GeoServeEnv`.
        env_or_layout: the env (wrapped or not) or its :class:`ObservationLayout` (``env.unwrapped.layout``).

    Returns:
        dict of numpy arrays (float64 unless noted; D datacenters, K slots, H forecast hours):

        per datacenter (D,): ``carbon_g_per_kwh``; ``carbon_forecast_g_per_kwh`` (D, H) for
        now + 1..H hours (both NaN where the carbon feed is missing); ``carbon_stale`` /
        ``carbon_missing`` (bool; all False without a carbon-feed gap fault); ``pue``; ``queue_len`` (int, requests); ``running`` (int, sequences);
        ``free_kv_fraction``; ``free_kv_blocks`` (int); ``power_w`` (facility W);
        ``busy_engines`` (int); ``est_queue_wait_s``; ``est_prefill_s_per_token``;
        ``est_iteration_s`` (fixed time of one prefill chunk's iteration); ``est_tpot_s``;
        ``tpot_slope_s_per_seq``; ``up`` (bool). The estimates are ``inf`` where ``up`` is False
        and at most ``ESTIMATE_CAP`` x the SLO target otherwise (capped in the observation).

        per slot: ``slot_valid`` (K,) bool; ``slot_origin`` (K,) int, -1 on padded slots;
        ``slot_prompt_tokens``; ``slot_predicted_output_tokens``; ``slot_waited_s`` (seconds
        since the request arrived at its origin); ``slot_network_s`` (K, D) uplink + downlink
        seconds to each datacenter.

        global: ``hour_utc`` (float in [0, 24)); ``pending_total`` (int, pending requests
        including those beyond the K slots); ``elapsed_s`` (simulated seconds since the start).

        static (copied from the layout): ``n_engines``, ``engine_kv_blocks``, ``block_tokens``,
        ``max_num_seqs``, ``nameplate_w``, ``ttft_target_s``, ``tpot_target_s``.
    """
    L = _layout_of(env_or_layout)
    D, K, H, R = L.n_datacenters, L.max_pending, L.forecast_hours, L.n_regions
    dc = np.asarray(obs["datacenters"], dtype=np.float64).reshape(D, L.n_dc_features)
    sl = np.asarray(obs["slots"], dtype=np.float64).reshape(K, L.n_slot_features)
    gl = np.asarray(obs["globals"], dtype=np.float64)
    c = L.dc_columns
    s = L.slot_columns
    g = L.global_columns
    ttft, tpot = L.ttft_target_s, L.tpot_target_s
    engines = L.n_engines.astype(np.float64)
    total_blocks = engines * L.engine_kv_blocks
    free_frac = dc[:, c["free_kv"]]
    valid = sl[:, s["valid"]] > 0.5
    origin = np.where(valid, np.argmax(sl[:, s["origin"]:s["origin"] + R], axis=1), -1)
    down = dc[:, c["up"]] <= 0.5

    def est(col: str, scale: float) -> np.ndarray:
        return np.where(down, np.inf, dc[:, c[col]] * scale)

    if L.carbon_feed_flags:
        stale = dc[:, c["carbon_stale"]] > 0.5
        missing = dc[:, c["carbon_missing"]] > 0.5
    else:
        stale = missing = np.zeros(D, dtype=bool)
    carbon_block = dc[:, c["carbon_now"]:c["carbon_now"] + 1 + H] * CARBON_SCALE_G_PER_KWH
    carbon_block[missing] = np.nan

    hour = (math.degrees(math.atan2(gl[g["hour_sin"]], gl[g["hour_cos"]])) / 15.0) % 24.0
    return {
        "carbon_g_per_kwh": carbon_block[:, 0].copy(),
        "carbon_forecast_g_per_kwh": carbon_block[:, 1:].copy(),
        "carbon_stale": stale,
        "carbon_missing": missing,
        "pue": dc[:, c["pue"]].copy(),
        "queue_len": np.rint(dc[:, c["queue_len"]] * engines * QUEUE_PER_ENGINE_SCALE).astype(np.int64),
        "running": np.rint(dc[:, c["running"]] * engines * L.max_num_seqs).astype(np.int64),
        "free_kv_fraction": free_frac.copy(),
        "free_kv_blocks": np.rint(free_frac * total_blocks).astype(np.int64),
        "power_w": dc[:, c["power"]] * L.nameplate_w,
        "busy_engines": np.rint(dc[:, c["busy_engines"]] * engines).astype(np.int64),
        "est_queue_wait_s": est("est_queue_wait", ttft),
        "est_prefill_s_per_token": est("est_prefill", ttft / PREFILL_REF_TOKENS),
        "est_iteration_s": est("est_iteration", tpot),
        "est_tpot_s": est("est_tpot", tpot),
        "tpot_slope_s_per_seq": est("tpot_slope", tpot / TPOT_SLOPE_REF_SEQS),
        "up": dc[:, c["up"]] > 0.5,
        "slot_valid": valid,
        "slot_origin": origin.astype(np.int64),
        "slot_prompt_tokens": np.rint(sl[:, s["prompt"]] * TOKENS_SCALE) * valid,
        "slot_predicted_output_tokens": sl[:, s["predicted_output"]] * TOKENS_SCALE,
        "slot_waited_s": sl[:, s["waited"]] * ttft,
        "slot_network_s": sl[:, s["network"]:s["network"] + D] * ttft,
        "hour_utc": hour,
        "pending_total": int(round(gl[g["pending_total"]] * K)),
        "elapsed_s": gl[g["elapsed"]] * L.duration_s,
        "n_engines": L.n_engines.copy(),
        "engine_kv_blocks": L.engine_kv_blocks.copy(),
        "block_tokens": L.block_tokens,
        "max_num_seqs": L.max_num_seqs,
        "nameplate_w": L.nameplate_w.copy(),
        "ttft_target_s": ttft,
        "tpot_target_s": tpot,
    }


# ---------------------------------------------------------------------------------- env
class GeoServeEnv(gym.Env):
    """Place LLM inference requests on geo-distributed datacenters, one polling period per step.

    ## Description

    Requests arrive continuously at origin regions (the scenario's workload). Every
    ``polling_period_s`` seconds of simulated time the agent sees the requests that arrived since
    the last decision and are not placed yet (plus any it deferred or that did not fit in the K
    slots), oldest first, and the state of every datacenter. Its action sends each visible request
    to a datacenter or defers it. Placed requests leave their origin at the decision time (the
    wait since their arrival counts in their TTFT); then the simulator advances one polling
    period. A request arriving mid-period is first seen at the next step. Nothing is ever lost:
    a deferred or overflowing request stays pending, oldest first.

    Sizes: D datacenters, R origin regions, K = ``env.max_pending`` slots, H forecast hours.
    Time scales T_ttft, T_tpot are the scenario's SLO targets (``slo.ttft_s``, ``slo.tpot_s``).

    ## Action Space

    ``MultiDiscrete([D + 1] * K)``: entry k is the datacenter index (0..D-1) for the request in
    slot k, or D = defer (keep it pending to the next step). :meth:`action_masks` returns the
    allowed choices as a flat bool array of length K x (D + 1) (sb3-contrib MaskablePPO
    convention: slot-major); ``info["action_mask"]`` holds the same as a (K, D + 1) array.

    * Padded slots (no request): only defer is allowed by the mask, but any value is accepted and
      ignored.
    * Datacenter d is masked for a request when d is down, or when the request cannot fit any of
      d's engines even when it is empty: ``ceil((prompt_tokens + 1) / block_tokens)`` (its prompt
      plus its first generated token) exceeds the KV blocks of one engine, or d has no engine.
      Defer is always allowed. (The simulator requires ``engine.max_model_len`` to fit one
      engine's KV cache and the env requires ``workload.max_context_tokens <= max_model_len``,
      so with valid settings the KV condition never binds and only down datacenters are masked.)
    * Invalid actions — a masked choice for a pending slot, an out-of-range value (< 0 or > D)
      or a non-integer value (float entries must be integral, e.g. ``3.0``) in a pending slot:
      with ``invalid_action="raise"`` (default) :class:`~carbon_gym.errors.ActionError` is raised
      naming the slot, the value and the allowed values, and the env state is unchanged; with
      ``invalid_action="defer"`` each such slot is deferred instead and counted in
      ``info["invalid_actions"]``. A wrong shape (anything but K entries) or dtype (bool,
      object, strings) raises in both modes.

    ## Observation Space

    ``Dict`` of three 1-D float32 ``Box``es (SB3 ``MultiInputPolicy`` compatible). Matrices are
    flattened row-major; :func:`decode_observation` reshapes and rescales them to physical units.

    ``"datacenters"``: shape (D x F_D,), F_D = 13 + H, row d = datacenter d:

    | col      | feature                                              | unit      | scaling                          |
    |----------|------------------------------------------------------|-----------|----------------------------------|
    | 0        | grid carbon intensity now                            | g/kWh     | / 1000                           |
    | 1..H     | forecast intensity of the H whole hours after the current one | g/kWh | / 1000                   |
    | H+1      | PUE                                                  | -         | none                             |
    | H+2      | requests queued (engine queues + in transit to d)    | requests  | / (engines_d x 16)               |
    | H+3      | sequences in running batches                         | sequences | / (engines_d x max_num_seqs)     |
    | H+4      | free KV cache                                        | fraction  | free / total blocks              |
    | H+5      | facility power now                                   | W         | / (GPUs_d x GPU TDP x PUE_d)     |
    | H+6      | engines with work                                    | engines   | / engines_d                      |
    | H+7      | est. queueing wait of a new request                  | s         | / T_ttft                         |
    | H+8      | est. marginal prefill time of 1024 prompt tokens     | s         | / T_ttft                         |
    | H+9      | est. fixed time of one prefill-chunk iteration       | s         | / T_tpot                         |
    | H+10     | est. per-token decode time (TPOT) of a new request   | s         | / T_tpot                         |
    | H+11     | TPOT added by 64 more running sequences              | s         | / T_tpot                         |
    | H+12     | datacenter up                                        | flag      | 0 / 1                            |

    Columns H+7..H+11 are the simulator's ``ClusterSnapshot`` estimates for the engine the
    datacenter's dispatcher would pick (a prompt of p tokens is estimated to take
    ceil(p / chunk) x col H+9 + p x col H+8 of prefill, chunk = max_num_batched_tokens - running
    sequences of that engine); they are capped at 100 (= ``ESTIMATE_CAP`` x the target) and set to
    100 for a datacenter that is down (where the simulator reports infinity).

    ``"slots"``: shape (K x F_S,), F_S = 4 + R + D, row k = pending request k (oldest first);
    padded rows are all zero:

    | col          | feature                                          | unit    | scaling          |
    |--------------|--------------------------------------------------|---------|------------------|
    | 0            | valid (a request is in this slot)                | flag    | 0 / 1            |
    | 1..R         | origin region, one-hot                           | flag    | 0 / 1            |
    | R+1          | prompt length                                    | tokens  | / 1024           |
    | R+2          | predicted output length (scenario's predictor; "oracle" = true length) | tokens | / 1024 |
    | R+3          | time waited since arrival at the origin          | s       | / T_ttft         |
    | R+4..R+3+D   | network delay to each datacenter (uplink + downlink) | s   | / T_ttft         |

    ``"globals"``: shape (4,): sin and cos of 2 pi x (UTC hour of day) / 24 (carbon-trace
    clock); pending requests in total (slots + overflow) / K; simulated seconds since the
    episode start / ``duration_s``.

    Bounds: [0, 1e9] (``OBS_HIGH``; the time waited and the global counters are clipped to it)
    except sin/cos in [-1, 1], flags and the free-KV fraction in [0, 1].

    ## Rewards

    ``reward = -carbon_weight x carbon_g / nominal_g - slo_weight x violations`` where
    ``carbon_g`` is the facility carbon emitted by all datacenters during the step (idle power
    included), ``nominal_g = sum_d (GPUs_d x GPU TDP x PUE_d) x 400 g/kWh x polling_period_s /
    3.6e6`` (the whole fleet at nameplate power on a 400 g/kWh grid for one step; exposed as
    ``env.unwrapped.nominal_carbon_g_per_step``) and ``violations`` counts requests completed
    during the step whose TTFT > T_ttft or TPOT > T_tpot. Both weights are scenario parameters
    (``env.carbon_weight``, ``env.slo_weight``).

    ## Starting State

    ``reset`` builds a fresh simulator and workload from the scenario with the episode's seed,
    then simulates the first polling period with no placement (all datacenters idle) so the
    first observation holds the arrivals of [0, polling_period_s). Seeds: ``reset(seed=s)`` uses
    world seed s; the first ``reset()`` without a seed uses the scenario's ``seed``; a later
    ``reset()`` without a seed draws the world seed from ``env.np_random`` (so a seeded reset
    followed by unseeded ones is reproducible). ``reset``'s info has ``time_s``, ``carbon_g`` and
    ``energy_j`` of that first idle period (counted in the episode totals, in no step's reward),
    ``arrived``, ``pending``, ``completed`` (0) and ``action_mask``.

    ## Episode End

    Decisions happen at t = P, 2P, ..., N P with P = polling_period_s and N = ceil(duration_s / P)
    (the episode has N steps); arrivals stop at ``duration_s``. ``terminated`` is always False.
    The N-th step places its requests, then drains: it advances (no new arrivals) until every
    placed request has completed or the drain limit passes (default 10 x T_ttft + 2 x T_tpot x
    the longest output placed, argument ``drain_limit_s``), and returns ``truncated=True``.
    Placed requests still unfinished then are reported as ``in_flight_at_truncation``; requests
    that were never placed (deferred or overflowing at the last step) as ``unplaced_at_end``;
    neither is counted in latency percentiles. Ledger (checked, :class:`LedgerError` otherwise):
    ``arrived = completed + in_flight_at_truncation + unplaced_at_end`` and
    ``placed = completed + in_flight_at_truncation + aborted`` (``aborted`` = requests lost to a
    datacenter outage, see :meth:`set_datacenter_up`; 0 without outages, and then
    ``arrived = placed + unplaced_at_end``).
    Stepping after the end raises ``RuntimeError`` (call ``reset``).

    ## Faults

    A scenario's ``[[faults]]`` (see :mod:`carbon_gym.faults`) apply at their exact simulated
    times: the env advances the simulator in sub-steps to each fault's time. Outages abort the
    datacenter's requests; they return to the pending queue with their original arrival time
    (failed over: counted in ``failed_over``, their progress lost, their energy kept as wasted
    work) and the policy places them again. The mask forbids datacenters that are down, whose
    engines are all drained, or whose link from the request's region is cut; a degraded link's
    extra delay shows in the slots' network columns. With a carbon-feed gap, the datacenter rows
    get two more columns (``carbon_stale``, ``carbon_missing``, flags) and the carbon columns
    hold the last values before the gap (stale) or 0 (missing; NaN after
    :func:`decode_observation`); emissions are always accounted with the real intensity.

    ## Info

    Deterministic (no wall-clock values). Every step: ``time_s`` (simulated time of the next
    decision), ``carbon_g``, ``energy_j`` (facility) of the step, ``arrived`` (new requests seen),
    ``placed``, ``deferred`` (pending slots left unplaced, incl. invalid ones in defer mode),
    ``overflow`` (pending beyond K at the decision), ``pending`` (requests pending now),
    ``completed``, ``violations``, ``ttft_mean_s`` / ``tpot_mean_s`` / ``ttft_max_s`` /
    ``tpot_max_s`` of the requests completed in the step (0.0 when none), ``invalid_actions``,
    ``failed_over`` (requests aborted by outages during the step and re-queued),
    ``action_mask`` (K, D + 1) for the new observation. Per-request arrays of the step's
    completions: ``env.unwrapped.last_completed`` (a ``RequestRecords``); they are not in info
    because their length varies, which Gymnasium vector envs cannot batch. On the final step:
    ``episode_metrics`` (dict, see :meth:`episode_metrics`) — not ``"episode"``, which SB3's
    ``Monitor`` and Gymnasium's ``RecordEpisodeStatistics`` overwrite. Its ``ledger`` entry is
    the end-of-episode accounting of :func:`carbon_gym.ledger.check_ledger` (every request and
    joule accounted for); a failed check raises :class:`~carbon_gym.errors.LedgerError` when
    ``strict_ledger`` (default), else is reported with ``ledger["ok"] = False`` and a warning.

    ## Arguments

    ``gymnasium.make("carbon_gym/GeoServe-v0", scenario="dev", overrides=None,
    invalid_action="raise", forecast_hours=None, drain_limit_s=None)``

    * ``scenario``: a shipped scenario name, a path to a scenario TOML file, or a ``Scenario``.
    * ``overrides``: dict of dotted-key field overrides (``load_scenario``), e.g.
      ``{"duration_s": 600, "env.max_pending": 2048}``. A warning suggests a larger
      ``env.max_pending`` when the mean arrivals per step + 4 standard deviations exceed K.
    * ``invalid_action``: ``"raise"`` or ``"defer"`` (see Action Space).
    * ``forecast_hours``: H, 0..``carbon.forecast_horizon_h``; default: the scenario's horizon.
      The forecast comes from the scenario's ``CarbonForecaster`` (error
      ``carbon.forecast_error_std_frac``, seeded from the episode's world seed); a forecast
      issued during hour h covers hours h+1..h+H of the carbon trace.
    * ``drain_limit_s``: bound on the end-of-episode drain (seconds); default see Episode End.
    * ``strict_ledger``: raise on a failed end-of-episode ledger check (default True).
    * ``record_dir``: stream every completed request's record to ``.npz`` chunk files under
      ``record_dir/episode-NNNNN/`` (``carbon_gym.sim.load_record_dir`` reads them back) instead
      of keeping per-request latencies in memory: memory stays flat on long runs, and the
      latency percentiles are computed exactly from the files at the end.
      ``record_chunk_rows``: rows per file (default 50,000, about 8 MB buffered).

    Read-only attributes: ``scenario``, ``simulator`` (after reset; read it, do not drive it),
    ``layout`` (:class:`ObservationLayout`), ``nominal_carbon_g_per_step``,
    ``max_episode_steps``, ``last_completed``. :meth:`pending_requests` returns the raw data of
    the pending requests, :meth:`episode_metrics` the metrics so far, and
    :meth:`set_datacenter_up` is the outage hook (aborted requests are re-queued).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        scenario: Any = "dev",
        overrides: dict[str, Any] | None = None,
        *,
        invalid_action: str = "raise",
        forecast_hours: int | None = None,
        drain_limit_s: float | None = None,
        render_mode: str | None = None,
        strict_ledger: bool = True,
        record_dir: Any = None,
        record_chunk_rows: int = 50_000,
    ) -> None:
        if render_mode is not None:
            raise ConfigError("render_mode", f"this environment does not render, got {render_mode!r}", allowed=[None])
        self.render_mode = None
        self._invalid_action = check_choice("invalid_action", invalid_action, INVALID_ACTION_MODES)
        self._scenario = _resolve_scenario(scenario, overrides)
        sc = self._scenario
        self._P = float(sc.polling_period_s)
        self._duration = float(sc.duration_s)
        self._n_steps = max(1, int(math.ceil(self._duration / self._P - 1e-9)))
        self._ttft_target = float(sc.ttft_s)
        self._tpot_target = float(sc.tpot_s)
        self._carbon_weight = float(sc.env.carbon_weight)
        self._slo_weight = float(sc.env.slo_weight)
        self._K = int(sc.env.max_pending)
        horizon = int(sc.carbon.forecast_horizon_h)
        if forecast_hours is None:
            forecast_hours = horizon
        if isinstance(forecast_hours, bool) or not isinstance(forecast_hours, (int, np.integer)) or not (0 <= forecast_hours <= horizon):
            raise ConfigError("forecast_hours", f"must be an integer in 0..{horizon} (carbon.forecast_horizon_h), got {forecast_hours!r}")
        self._H = int(forecast_hours)
        if drain_limit_s is not None and not (float(drain_limit_s) >= 0):
            raise ConfigError("drain_limit_s", f"must be >= 0 seconds, got {drain_limit_s}")
        self._drain_limit_s = None if drain_limit_s is None else float(drain_limit_s)
        if not isinstance(strict_ledger, (bool, np.bool_)):
            raise ConfigError("strict_ledger", f"expected true or false, got {strict_ledger!r}", allowed=[True, False])
        self._strict_ledger = bool(strict_ledger)
        if record_dir is not None and not isinstance(record_dir, (str, bytes)) and not hasattr(record_dir, "__fspath__"):
            raise ConfigError("record_dir", f"expected a directory path, got {type(record_dir).__name__}")
        if isinstance(record_chunk_rows, bool) or not isinstance(record_chunk_rows, (int, np.integer)) or record_chunk_rows < 1:
            raise ConfigError("record_chunk_rows", f"must be an integer >= 1, got {record_chunk_rows!r}")
        self._record_dir = record_dir
        self._record_chunk_rows = int(record_chunk_rows)
        self._episode_count = 0
        self._writer = None
        if sc.workload.max_context_tokens > sc.engine.max_model_len:
            raise ConfigError(
                "workload.max_context_tokens",
                f"{sc.workload.max_context_tokens} exceeds engine.max_model_len={sc.engine.max_model_len}: "
                "some requests could never be served",
                allowed=f"<= {sc.engine.max_model_len}",
                source=sc.source or None,
            )
        expected = sc.rate_per_s * (1.0 + sc.workload.diurnal_amplitude) * self._P  # at the daily peak
        if expected + 4.0 * math.sqrt(expected) > self._K:
            warnings.warn(
                f"scenario {sc.name!r}: about {expected:.0f} requests arrive per polling period but only "
                f"env.max_pending={self._K} are shown per step; the rest overflow to later steps. "
                f"Consider overrides={{'env.max_pending': {_suggest_max_pending(expected)}}}.",
                stacklevel=2,
            )

        from .world import build_parts, build_predictor

        self._parts = build_parts(sc)
        self._predictor = build_predictor(sc)
        # A first simulator gives the static facts (engines, KV blocks) the layout needs.
        sim, _ = self._new_world(int(sc.seed))
        self._static_setup(sim)
        D, R, K = self._D, self._R, self._K
        L = self.layout
        inf = np.float32(OBS_HIGH)
        dc_high = np.full((D, L.n_dc_features), inf, np.float32)
        dc_high[:, L.dc_columns["up"]] = 1.0
        dc_high[:, L.dc_columns["free_kv"]] = 1.0
        if L.carbon_feed_flags:
            dc_high[:, L.dc_columns["carbon_stale"]] = 1.0
            dc_high[:, L.dc_columns["carbon_missing"]] = 1.0
        sl_high = np.full((K, L.n_slot_features), inf, np.float32)
        sl_high[:, : 1 + R] = 1.0
        self.observation_space = spaces.Dict(
            {
                "datacenters": spaces.Box(np.zeros(D * L.n_dc_features, np.float32), dc_high.reshape(-1), dtype=np.float32),
                "slots": spaces.Box(np.zeros(K * L.n_slot_features, np.float32), sl_high.reshape(-1), dtype=np.float32),
                "globals": spaces.Box(
                    np.array([-1, -1, 0, 0], np.float32), np.array([1, 1, inf, inf], np.float32), dtype=np.float32
                ),
            }
        )
        self.action_space = spaces.MultiDiscrete(np.full(K, D + 1, dtype=np.int64))
        self._sim = None
        self._workload = None
        self._done = True
        self._last_completed = None
        self._world_seed = None

    # ------------------------------------------------------------------ static set-up
    def _new_world(self, seed: int) -> tuple[Any, Any]:
        """A fresh (Simulator, Workload) for an episode with world seed ``seed``.

        The first call builds them with :func:`~carbon_gym.world.build_world`; later calls get
        the simulator from ``Simulator.fresh()`` of that first one (same arguments, shared
        immutable tables) and the workload by reseeding the first one
        (:func:`~carbon_gym.world.reseed_workload`): the same objects, much cheaper."""
        from .world import build_world, reseed_workload

        template = getattr(self, "_sim_template", None)
        if template is None:
            sim, workload = build_world(self._scenario, seed)
            self._sim_template = sim.fresh()  # never driven: a clean source of fresh simulators
            self._workload_template = workload.with_seed(workload.seed)  # never used: nothing cached
            return sim, workload
        return template.fresh(), reseed_workload(self._workload_template, seed)

    def _static_setup(self, sim: Any) -> None:
        parts = self._parts
        topo = parts.topology
        self._D = int(topo.n_datacenters)
        self._R = int(topo.n_regions)
        snap = sim.snapshot()
        n_engines = np.asarray(snap.n_engines, dtype=np.int64)
        total_blocks = np.asarray(snap.total_kv_blocks, dtype=np.int64)
        engine_blocks = np.where(n_engines > 0, total_blocks // np.maximum(n_engines, 1), 0)
        eng_cfg = parts.engine
        gpus = np.array([d.gpus for d in topo.datacenters], dtype=np.float64)
        pue = np.array([d.pue for d in topo.datacenters], dtype=np.float64)
        nameplate = gpus * float(parts.gpu.tdp_w) * pue
        self.layout = ObservationLayout(
            n_datacenters=self._D,
            n_regions=self._R,
            max_pending=self._K,
            forecast_hours=self._H,
            ttft_target_s=self._ttft_target,
            tpot_target_s=self._tpot_target,
            duration_s=self._duration,
            polling_period_s=self._P,
            n_engines=n_engines,
            engine_kv_blocks=engine_blocks,
            block_tokens=int(eng_cfg.block_tokens),
            max_num_seqs=int(eng_cfg.max_num_seqs),
            nameplate_w=nameplate,
            datacenter_names=tuple(d.name for d in topo.datacenters),
            region_names=tuple(topo.regions),
            carbon_feed_flags=has_carbon_feed_gap(self._scenario),
        )
        self.nominal_carbon_g_per_step = float(nameplate.sum() * REFERENCE_INTENSITY_G_PER_KWH * self._P / 3.6e6)
        # Precomputed constants for observation building.
        self._engines_f = np.maximum(n_engines, 1).astype(np.float64)
        self._queue_div = self._engines_f * QUEUE_PER_ENGINE_SCALE
        self._running_div = self._engines_f * eng_cfg.max_num_seqs
        D, R, K = self._D, self._R, self._K
        ones = np.ones(D)
        total_kv = np.maximum(n_engines * engine_blocks, 1).astype(np.float64)
        # Scale of each raw snapshot column (order as in _observe), shape (13, D).
        self._dc_scale = np.stack(
            (
                ones / CARBON_SCALE_G_PER_KWH, ones, 1.0 / self._queue_div, 1.0 / self._running_div, 1.0 / total_kv,
                1.0 / nameplate, 1.0 / self._engines_f, ones / self._ttft_target,
                ones * (PREFILL_REF_TOKENS / self._ttft_target), ones / self._tpot_target, ones / self._tpot_target,
                ones * (TPOT_SLOPE_REF_SEQS / self._tpot_target), ones,
            ),
            axis=0,
        )
        cap = np.full((13, 1), np.inf)
        cap[7:12] = ESTIMATE_CAP  # the five estimate rows
        self._dc_cap = cap
        self._dc_scale_rows = self._dc_scale.T.tolist()  # (D, 13) as lists, for the Python path
        self._dc_extra = [0.0] * (self.layout.n_dc_features - 13 - self._H)  # trailing flag columns
        layout = self.layout
        self._n_dc_features = layout.n_dc_features
        self._n_slot_features = layout.n_slot_features
        sc_ = layout.slot_columns
        self._slot_cols = (sc_["prompt"], sc_["predicted_output"], sc_["waited"], sc_["network"])
        self._inv_ttft = 1.0 / self._ttft_target
        # Per-origin template slot row: valid flag, one-hot origin, base network delay (2 x one-way).
        net = parts.network
        rows = np.zeros((R, layout.n_slot_features), dtype=np.float32)
        rows[:, 0] = 1.0
        rows[:, 1:1 + R] = np.eye(R)
        rows[:, sc_["network"]:] = 2.0 * np.asarray(net.one_way_s, dtype=np.float64) / self._ttft_target
        self._region_rows = rows
        self._region_rows_py = rows.astype(np.float64).tolist()  # the same float32 values, as Python floats
        c = self._slot_cols  # _observe's Python path writes prompt, predicted output, waited in a row
        assert c[1] == c[0] + 1 and c[2] == c[0] + 2 and c[3] == c[0] + 3, c
        self._uplink_per_token_scaled = float(net.bytes_per_token) / float(net.bandwidth_bytes_per_s) / self._ttft_target
        mask = np.zeros((K, D + 1), dtype=bool)
        mask[:, D] = True
        self._mask_template = mask
        self._block_tokens = int(eng_cfg.block_tokens)
        self._engine_kv_blocks = engine_blocks
        self._min_engine_kv_tokens = int(engine_blocks.min()) * self._block_tokens
        self._arange_k = np.arange(K)
        start = parts.carbon.start_utc
        self._carbon_t0_s = float(parts.carbon_offset_s)
        self._clock_s_of_day = float(start.hour * 3600 + start.minute * 60 + start.second) + self._carbon_t0_s
        self._zone_cols = np.array([parts.carbon.zone_index(d.zone) for d in topo.datacenters], dtype=np.int64)
        net = parts.network
        self._one_way_x2 = 2.0 * np.asarray(net.one_way_s, dtype=np.float64)
        self._uplink_s_per_token = float(net.bytes_per_token) / float(net.bandwidth_bytes_per_s)

    # ------------------------------------------------------------------ properties
    @property
    def scenario(self) -> Any:
        """The (read-only) scenario this env runs."""
        return self._scenario

    @property
    def simulator(self) -> Any:
        """The current episode's simulator (None before the first reset). Read it, do not drive it."""
        return self._sim

    @property
    def max_episode_steps(self) -> int:
        """Steps in an episode: ceil(duration_s / polling_period_s)."""
        return self._n_steps

    @property
    def last_completed(self) -> Any:
        """``RequestRecords`` of the requests completed during the last step (None before a step)."""
        return self._last_completed

    # ------------------------------------------------------------------ reset
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start a new episode (see the class docstring, Starting State)."""
        if options:
            raise ConfigError("options", f"no reset options are supported, got {sorted(options)}", allowed=[])
        if seed is None and self._np_random is None:
            seed = int(self._scenario.seed)
        super().reset(seed=seed)
        world_seed = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self._world_seed = world_seed
        self._sim, self._workload = self._new_world(world_seed)
        from .world import build_fault_runtime, build_forecaster

        self._faults = build_fault_runtime(self._scenario, self._sim)

        self._forecaster = build_forecaster(self._scenario, self._parts.carbon, seed=world_seed) if self._H else None
        self._pending = np.empty((0, _P_COLS), dtype=np.float64)
        self._seq = 0
        self._step_index = 0
        self._done = False
        self._arrived = 0
        self._placed = 0
        self._aborted = 0
        self._completed = 0
        self._violations = 0
        self._ttft_violations = 0
        self._tpot_violations = 0
        self._deferred_total = 0
        self._invalid_total = 0
        self._max_output_placed = 0
        self._drain_s = 0.0
        self._in_flight_end = 0
        self._ttft_parts: list[np.ndarray] = []
        self._tpot_parts: list[np.ndarray] = []
        self._ttft_sum = 0.0
        self._tpot_sum = 0.0
        self._failover_ids: set[int] = set()
        self._failed_over_completed = 0
        self._step_failed_over = 0
        self._done_energy_j = np.zeros(self._D)
        self._done_carbon_g = np.zeros(self._D)
        self._fo_energy_j = np.zeros(self._D)
        self._fo_carbon_g = np.zeros(self._D)
        self._reported_energy_j = 0.0
        self._reported_carbon_g = 0.0
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._record_dir is not None:
            from pathlib import Path

            from .sim.records import RecordWriter

            self._writer = RecordWriter(Path(self._record_dir) / f"episode-{self._episode_count:05d}",
                                        self._record_chunk_rows)
        self._episode_count += 1
        self._dc_completed = np.zeros(self._D, dtype=np.int64)
        self._dc_placed = np.zeros(self._D, dtype=np.int64)
        self._last_completed = None
        self._cum_carbon_g = 0.0
        self._cum_energy_j = 0.0
        self._forecast_cache_key = None
        self._forecast_cache = None
        self._dc_template = None

        arrived = self._advance_and_collect(self._P)
        records = self._sim.pop_completed()  # nothing can complete: nothing was placed
        carbon_g, energy_j = self._totals_delta()
        obs = self._observe()
        info = {
            "time_s": float(self._sim.now_s),
            "carbon_g": carbon_g,
            "energy_j": energy_j,
            "arrived": arrived,
            "pending": int(self._pending.shape[0]),
            "completed": len(records),
            "action_mask": self._mask.copy(),
        }
        return obs, info

    # ------------------------------------------------------------------ step
    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """Place the visible pending requests per ``action``, then advance one polling period."""
        if self._done:
            raise RuntimeError("the episode has ended (or reset() was never called): call reset() first")
        sim = self._sim
        D = self._D
        n_vis = self._n_visible
        choice, n_invalid = self._parse_action(action)
        overflow = int(self._pending.shape[0]) - n_vis
        place = choice < D
        n_place = int(np.count_nonzero(place))
        deferred = n_vis - n_place
        if n_place:
            if n_place == n_vis:
                rows = self._pending[:n_vis]
                dcs = choice
            else:
                rows = self._pending[:n_vis][place]
                dcs = choice[place]
            ints = rows[:, _P_INT_COLS].astype(np.int64)  # origin, prompt, output
            ids = sim.submit_batch(ints[:, 0], rows[:, _P_ARRIVAL], ints[:, 1], ints[:, 2], dcs)
            if self._aborted:
                fo = rows[:, _P_FAILED] > 0
                if fo.any():
                    self._failover_ids.update(ids[fo].tolist())
            self._placed += n_place
            self._dc_placed += np.bincount(dcs, minlength=D)
            mo = int(_MAX(ints[:, 2]))
            if mo > self._max_output_placed:
                self._max_output_placed = mo
            if n_place == n_vis:
                self._pending = self._pending[n_vis:]
            else:
                keep = np.ones(self._pending.shape[0], dtype=bool)
                keep[:n_vis][place] = False
                self._pending = self._pending[keep]
        self._deferred_total += deferred
        self._invalid_total += n_invalid
        self._step_index += 1

        last = self._step_index >= self._n_steps
        if last:
            records = self._drain()
            arrived = 0
        else:
            # decision k happens at exactly k x P (no drift from repeated additions)
            arrived = self._advance_and_collect((self._step_index + 1) * self._P)
            records = sim.pop_completed()
        self._last_completed = records
        carbon_g, energy_j = self._totals_delta()
        n_done = len(records)
        step_failed_over, self._step_failed_over = self._step_failed_over, 0
        violations = 0
        stats = (0.0, 0.0, 0.0, 0.0)
        if n_done:
            ttft = records.ttft_s
            tpot = records.tpot_s
            if n_done <= _STATS_IN_PYTHON:  # few: in Python (same counts and sums, fewer numpy calls)
                t_ttft, t_tpot = self._ttft_target, self._tpot_target
                n_ttft = n_tpot = 0
                ttft_l = ttft.tolist()
                tpot_l = tpot.tolist()
                for a, b in zip(ttft_l, tpot_l):
                    a = a > t_ttft
                    b = b > t_tpot
                    n_ttft += a
                    n_tpot += b
                    violations += a or b
                ttft_max, tpot_max = max(ttft_l), max(tpot_l)  # (finite values)
                # per datacenter: completions, energy, carbon - added in row order from 0.0, as
                # np.bincount(..., weights=...) does
                cnt, e_dc, c_dc = [0] * D, [0.0] * D, [0.0] * D
                for d, e, c in zip(records.datacenter.tolist(), records.energy_j.tolist(), records.carbon_g.tolist()):
                    cnt[d] += 1
                    e_dc[d] += e
                    c_dc[d] += c
                for d in range(D):
                    if cnt[d]:
                        self._dc_completed[d] += cnt[d]
                        self._done_energy_j[d] += e_dc[d]
                        self._done_carbon_g[d] += c_dc[d]
            else:
                v_ttft = ttft > self._ttft_target
                v_tpot = tpot > self._tpot_target
                violations = int(np.count_nonzero(v_ttft | v_tpot))
                n_ttft = int(np.count_nonzero(v_ttft))
                n_tpot = int(np.count_nonzero(v_tpot))
                ttft_max, tpot_max = float(_MAX(ttft)), float(_MAX(tpot))
                self._dc_completed += np.bincount(records.datacenter, minlength=D)
                self._done_energy_j += np.bincount(records.datacenter, weights=records.energy_j, minlength=D)
                self._done_carbon_g += np.bincount(records.datacenter, weights=records.carbon_g, minlength=D)
            self._ttft_violations += n_ttft
            self._tpot_violations += n_tpot
            self._violations += violations
            self._completed += n_done
            if self._writer is not None:
                self._writer.append(records)
                self._ttft_sum += float(_SUM(ttft))
                self._tpot_sum += float(_SUM(tpot))
            else:
                # copies: the record columns are views of one table holding every column
                self._ttft_parts.append(ttft.copy())
                self._tpot_parts.append(tpot.copy())
            if self._failover_ids:
                hit = [i for i in records.request_id.tolist() if i in self._failover_ids]
                if hit:
                    self._failover_ids.difference_update(hit)
                    self._failed_over_completed += len(hit)
            # sum / n is what ndarray.mean computes (same floats) without its Python-level wrapper
            stats = (float(_SUM(ttft)) / n_done, float(_SUM(tpot)) / n_done, float(ttft_max), float(tpot_max))
        reward = -self._carbon_weight * carbon_g / self.nominal_carbon_g_per_step - self._slo_weight * violations

        obs = self._observe()
        info: dict[str, Any] = {
            "time_s": float(sim.now_s),
            "carbon_g": carbon_g,
            "energy_j": energy_j,
            "arrived": arrived,
            "placed": n_place,
            "deferred": deferred,
            "overflow": overflow,
            "pending": int(self._pending.shape[0]),
            "completed": n_done,
            "violations": violations,
            "ttft_mean_s": stats[0],
            "tpot_mean_s": stats[1],
            "ttft_max_s": stats[2],
            "tpot_max_s": stats[3],
            "invalid_actions": n_invalid,
            "failed_over": step_failed_over,
            "action_mask": self._mask.copy(),
        }
        if last:
            self._done = True
            info["episode_metrics"] = self.episode_metrics(check_ledger=True)
        return obs, float(reward), False, bool(last), info

    # ------------------------------------------------------------------ action handling
    def _parse_action(self, action: Any) -> tuple[np.ndarray, int]:
        """Validate ``action``; return (choice per visible slot, number of invalid entries deferred)."""
        K, D, n = self._K, self._D, self._n_visible
        try:
            a = action if type(action) is np.ndarray else np.asarray(action)
        except Exception as exc:  # pragma: no cover - exotic objects
            raise ActionError(f"action could not be converted to an array: {exc}") from None
        if a.shape != (K,):
            raise ActionError(
                f"action must have shape ({K},): one entry per pending-request slot "
                f"(a datacenter index 0..{D - 1}, or {D} = defer); got shape {a.shape}"
            )
        kind = a.dtype.kind
        if kind in "iu":
            v = a[:n].astype(np.int64, copy=False)
            if n == 0:
                return v, 0
            # fast path: every entry in range and allowed by the mask
            if n <= _SLOTS_IN_PYTHON:  # a few: checked in Python (cheaper than three reductions)
                mask = self._mask
                for k, c in enumerate(v.tolist()):
                    if not (0 <= c <= D and mask[k, c]):
                        break
                else:
                    return v, 0
            # (ufunc reductions called directly: ndarray.min/max/all add a Python-level wrapper)
            elif _MIN(v) >= 0 and _MAX(v) <= D and _ALL(self._mask[self._arange_k[:n], v]):
                return v, 0
            nonint = None
        elif kind == "f":
            av = a[:n]
            ok = np.isfinite(av)
            ok[ok] = av[ok] == np.round(av[ok])
            nonint = ~ok
            v = np.where(ok, av, -1).astype(np.int64)
        else:
            raise ActionError(
                f"action must hold integers (datacenter index 0..{D - 1}, or {D} = defer); got dtype {a.dtype}"
            )
        out_of_range = (v < 0) | (v > D)
        if nonint is not None:
            out_of_range |= nonint
        masked = np.zeros(n, dtype=bool)
        in_range = ~out_of_range
        if n:
            masked[in_range] = ~self._mask[np.flatnonzero(in_range), v[in_range]]
        invalid = out_of_range | masked
        n_invalid = int(np.count_nonzero(invalid))
        if n_invalid == 0:
            return v, 0
        if self._invalid_action == "raise":
            k = int(np.flatnonzero(invalid)[0])
            more = f" ({n_invalid - 1} more invalid entries)" if n_invalid > 1 else ""
            raise ActionError(self._invalid_message(k, a[k].item(), bool(out_of_range[k])) + more)
        return np.where(invalid, D, v), n_invalid

    def _invalid_message(self, k: int, value: Any, out_of_range: bool) -> str:
        D = self._D
        allowed = np.flatnonzero(self._mask[k])
        if out_of_range:
            return (
                f"action[{k}] = {value!r} is not a valid choice for slot {k} (a pending request): "
                f"expected an integer 0..{D - 1} (datacenter) or {D} (defer); allowed now: {allowed.tolist()}"
            )
        d = int(value)
        name = self.layout.datacenter_names[d]
        prompt = int(self._pending[k, _P_PROMPT])
        need = -(-(prompt + 1) // self.layout.block_tokens)
        fault_why = self._faults.masked_reason(int(self._pending[k, _P_ORIGIN]), d) if self._faults is not None else None
        if fault_why is not None:
            why = fault_why
        elif not self._up[d]:
            why = "the datacenter is down"
        else:
            why = f"the request needs {need} KV blocks, one engine there has {int(self.layout.engine_kv_blocks[d])}"
        return (
            f"action[{k}] = {d} sends slot {k}'s request to datacenter {d} ({name!r}), which is masked: {why}; "
            f"allowed now: {allowed.tolist()} ({D} = defer)"
        )

    def action_masks(self) -> np.ndarray:
        """Allowed choices, flat bool array of length K x (D + 1), slot-major (MaskablePPO)."""
        if self._sim is None:
            raise RuntimeError("call reset() before action_masks()")
        return self._mask.reshape(-1).copy()

    # ------------------------------------------------------------------ simulation helpers
    def _advance_and_collect(self, t_s: float) -> int:
        """Advance the simulator to ``t_s`` and append the arrivals of [now, t_s) ∩ [0, duration)."""
        t0 = self._sim.now_s
        self._advance_sim(t_s)
        t1 = min(t_s, self._duration)
        if t1 <= t0:
            return 0
        batch = self._workload.arrivals_between(t0, t1)
        n = len(batch)
        if n == 0:
            return 0
        # the new rows appended to the pending table (one allocation)
        old = self._pending
        m = old.shape[0]
        table = np.empty((m + n, _P_COLS), dtype=np.float64)
        if m:
            table[:m] = old
        self._fill_rows(table[m:], batch.origin, batch.arrival_s, batch.prompt_tokens, batch.output_tokens, 0.0)
        self._arrived += n
        self._pending = table
        return n

    def _fill_rows(self, out: np.ndarray, origin: np.ndarray, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
                   output_tokens: np.ndarray, failed_over: float) -> None:
        """Write pending-table rows (columns in _P_* order, float64, exact conversions) for the
        ``len(out)`` requests given, with their predicted output and the next sequence numbers."""
        n = out.shape[0]
        out[:, _P_ORIGIN] = origin
        out[:, _P_ARRIVAL] = arrival_s
        out[:, _P_PROMPT] = prompt_tokens
        out[:, _P_OUTPUT] = output_tokens
        out[:, _P_PRED] = self._predictor.predict(prompt_tokens, output_tokens)
        out[:, _P_SEQ] = np.arange(self._seq, self._seq + n)
        out[:, _P_FAILED] = failed_over
        self._seq += n

    def _advance_sim(self, t_s: float) -> None:
        """Advance the simulator to ``t_s``, applying the scenario's faults at their times."""
        if self._faults is None:
            self._sim.advance_to(t_s)
            return
        for ab in self._faults.advance(t_s):
            self._requeue(ab)

    def _requeue(self, ab: Any) -> None:
        """Put requests aborted by an outage back in the pending queue (fail-over)."""
        n = len(ab)
        if not n:
            return
        rows = np.empty((n, _P_COLS), dtype=np.float64)
        self._fill_rows(rows, ab.origin, ab.arrival_s, ab.prompt_tokens, ab.output_tokens, 1.0)
        self._aborted += n
        self._step_failed_over += n
        self._fo_energy_j += np.bincount(ab.datacenter, weights=ab.energy_j, minlength=self._D)
        self._fo_carbon_g += np.bincount(ab.datacenter, weights=ab.carbon_g, minlength=self._D)
        lost = set(ab.request_id.tolist()) & self._failover_ids
        if lost:  # failed over again: the new submission is the one that counts
            self._failover_ids.difference_update(lost)
        merged = np.concatenate([self._pending, rows])
        self._pending = merged[np.argsort(merged[:, _P_ARRIVAL], kind="stable")]

    def _drain(self) -> Any:
        """Advance without arrivals until every placed request completes or the drain limit passes."""
        from .sim.records import RequestRecords

        sim = self._sim
        t_start = sim.now_s
        limit = self._drain_limit_s
        if limit is None:
            limit = DRAIN_TTFT_MULTIPLE * self._ttft_target + DRAIN_TPOT_MULTIPLE * self._tpot_target * self._max_output_placed
        t_end = t_start + limit
        chunk = max(self._P, 1.0)
        parts = [sim.pop_completed()]
        done = self._completed + len(parts[0])
        while done < self._placed - self._aborted and sim.now_s < t_end:
            self._advance_sim(min(sim.now_s + chunk, t_end))
            part = sim.pop_completed()
            done += len(part)
            parts.append(part)
        self._drain_s = float(sim.now_s - t_start)
        return parts[0] if len(parts) == 1 else RequestRecords.concat(parts)

    def _totals_delta(self) -> tuple[float, float]:
        carbon, energy = self._sim.carbon_energy_totals()
        d_c, d_e = carbon - self._cum_carbon_g, energy - self._cum_energy_j
        self._cum_carbon_g, self._cum_energy_j = carbon, energy
        self._reported_carbon_g += d_c
        self._reported_energy_j += d_e
        return d_c, d_e

    # ------------------------------------------------------------------ observation
    def _observe(self) -> dict[str, np.ndarray]:
        """Build the observation and the action mask for the current state (vectorised)."""
        sim = self._sim
        D, K, H = self._D, self._K, self._H
        now = float(sim.now_s)
        # ---- datacenters: raw columns x fixed per-datacenter scales, estimates capped
        if D <= _DC_IN_PYTHON:
            # a few datacenters: the same float64 products / caps in Python, one float32 conversion
            snap_rows = sim.snapshot_rows()  # one tuple per datacenter, SNAPSHOT_ARRAY_ROWS order
            if H:
                self._forecast(now)  # (a new hour clears the template)
                tmpl = self._dc_template
                if tmpl is None:  # this hour's forecast, as lists
                    tmpl = self._dc_template = self._forecast_cache.tolist()
            flat: list[float] = []
            up_list = []
            for d in range(D):
                r = snap_rows[d]
                v = [r[i] * f for i, f in zip(_SNAP_OBS_ROWS_LIST, self._dc_scale_rows[d])]
                for k in range(7, 12):  # the five estimates: np.minimum(v, ESTIMATE_CAP)
                    if v[k] > ESTIMATE_CAP:
                        v[k] = ESTIMATE_CAP
                flat.append(v[0])
                if H:
                    flat.extend(tmpl[d])
                flat.extend(v[1:])
                flat.extend(self._dc_extra)
                up_list.append(r[_SNAP_UP] > 0.5)
            dc = np.array(flat, dtype=np.float32).reshape(D, self._n_dc_features)
            up = np.array(up_list, dtype=bool)
        else:
            snap = sim.snapshot_array()  # (fields, D) float64, rows named by SNAPSHOT_ARRAY_ROWS
            up = snap[_SNAP_UP] > 0.5
            raw = snap[_SNAP_OBS_ROWS]  # (13, D): carbon, pue, queue, running, free KV, power, busy, estimates, up
            raw *= self._dc_scale
            np.minimum(raw, self._dc_cap, out=raw)  # the five estimates capped at ESTIMATE_CAP
            if H:
                fc = self._forecast(now)  # (a new hour clears the template)
                tmpl = self._dc_template
                if tmpl is None:  # zeros with this hour's forecast columns
                    tmpl = self._dc_template = np.zeros((D, self._n_dc_features), dtype=np.float32)
                    tmpl[:, 1:1 + H] = fc
                dc = tmpl.copy()
            else:
                dc = np.zeros((D, self._n_dc_features), dtype=np.float32)
            dc[:, 0] = raw[0]
            dc[:, 1 + H:13 + H] = raw[1:].T
        self._up = up
        # ---- slots: region template rows + per-request columns
        n_pend = int(self._pending.shape[0])
        n = n_pend if n_pend < K else K
        self._n_visible = n
        slots = np.zeros(K * self._n_slot_features, dtype=np.float32)
        sl = slots.reshape(K, self._n_slot_features)  # (a view)
        mask = self._mask_template.copy()
        if 0 < n <= _SLOTS_IN_PYTHON:
            # a few requests: the same float64 arithmetic per value in Python, one float32 conversion
            # (numpy's per-call overhead dominates the vectorised version at this size); the slot
            # columns are: valid + one-hot origin (< c0), prompt (c0), predicted output, waited,
            # network (>= c3 = c0 + 3)
            c0, _, _, c3 = self._slot_cols
            region_rows = self._region_rows_py
            inv_ttft = self._inv_ttft
            upk = self._uplink_per_token_scaled
            flat: list[float] = []
            prompt_max = 0.0
            for r in self._pending[:n].tolist():
                base = region_rows[int(r[_P_ORIGIN])]
                prompt = r[_P_PROMPT]
                w = (now - r[_P_ARRIVAL]) * inv_ttft
                x = prompt * upk
                flat.extend(base[:c0])
                flat.append(prompt * (1.0 / TOKENS_SCALE))
                flat.append(r[_P_PRED] * (1.0 / TOKENS_SCALE))
                flat.append(OBS_HIGH if w > OBS_HIGH else w)  # np.minimum(w, OBS_HIGH)
                flat.extend([v + x for v in base[c3:]])
                if prompt > prompt_max:
                    prompt_max = prompt
            slots[:len(flat)] = flat
            if prompt_max < self._min_engine_kv_tokens:
                mask[:n, :D] = up
            else:  # some prompt does not fit an empty engine of some datacenter
                prompt = self._pending[:n, _P_PROMPT]
                need = np.ceil((prompt + 1.0) / self._block_tokens)
                mask[:n, :D] = (need[:, None] <= self._engine_kv_blocks[None, :]) & up[None, :]
        elif n:
            p = self._pending[:n]
            prompt = p[:, _P_PROMPT]
            sl[:n] = self._region_rows[p[:, _P_ORIGIN].astype(np.intp)]
            c = self._slot_cols
            sl[:n, c[0]] = prompt * (1.0 / TOKENS_SCALE)
            sl[:n, c[1]] = p[:, _P_PRED] * (1.0 / TOKENS_SCALE)
            sl[:n, c[2]] = np.minimum((now - p[:, _P_ARRIVAL]) * self._inv_ttft, OBS_HIGH)
            sl[:n, c[3]:] += (prompt * self._uplink_per_token_scaled)[:, None]
            if prompt.max() < self._min_engine_kv_tokens:
                mask[:n, :D] = up
            else:  # some prompt does not fit an empty engine of some datacenter
                need = np.ceil((prompt + 1.0) / self._block_tokens)
                mask[:n, :D] = (need[:, None] <= self._engine_kv_blocks[None, :]) & up[None, :]
        faults = self._faults
        if faults is not None:
            origins = self._pending[:n, _P_ORIGIN].astype(np.intp)
            faults.adjust_observation(now, self.layout, dc, sl[:n], mask[:n], origins, self._forecast if H else None)
        self._mask = mask
        # ---- globals
        ang = (2.0 * math.pi / 86400.0) * ((self._clock_s_of_day + now) % 86400.0)
        gl = np.array([math.sin(ang), math.cos(ang), min(n_pend / K, OBS_HIGH), min(now / self._duration, OBS_HIGH)],
                      dtype=np.float32)
        return {"datacenters": dc.reshape(-1), "slots": slots, "globals": gl}

    def _forecast(self, now: float) -> np.ndarray:
        """(D, H) forecast intensity of the H hours after the current hour / 1000 (cached per hour)."""
        t = self._carbon_t0_s + now
        key = int(t // 3600.0)
        if key != self._forecast_cache_key:
            fc = self._forecaster.forecast(t)[: self._H]  # (H, zones)
            self._forecast_cache = np.ascontiguousarray(fc[:, self._zone_cols].T) * (1.0 / CARBON_SCALE_G_PER_KWH)
            self._forecast_cache_key = key
            self._dc_template = None  # _observe's float32 datacenter block for this hour
        return self._forecast_cache

    # ------------------------------------------------------------------ public helpers
    def pending_requests(self, include_overflow: bool = False) -> dict[str, np.ndarray]:
        """Raw data of the pending requests in slot order (oldest first).

        Returns arrays (one entry per request; the first K are the slots): ``seq`` (arrival
        order in the episode), ``origin`` (region index), ``arrival_s``, ``prompt_tokens``,
        ``predicted_output_tokens``, ``waited_s``, ``network_s`` (n, D) uplink + downlink
        seconds. The true output length is not exposed. ``include_overflow`` adds the requests
        beyond the K slots.
        """
        if self._sim is None:
            raise RuntimeError("call reset() first")
        p = self._pending if include_overflow else self._pending[: self._n_visible]
        origin = p[:, _P_ORIGIN].astype(np.int64)
        prompt = p[:, _P_PROMPT].astype(np.int64)
        return {
            "seq": p[:, _P_SEQ].astype(np.int64),
            "origin": origin,
            "arrival_s": p[:, _P_ARRIVAL].copy(),
            "prompt_tokens": prompt,
            "predicted_output_tokens": p[:, _P_PRED].copy(),
            "waited_s": self._sim.now_s - p[:, _P_ARRIVAL],
            "network_s": self._one_way_x2[origin] + (prompt * self._uplink_s_per_token)[:, None]
            + (2.0 * self._faults.one_way_delta_s()[origin] if self._faults is not None else 0.0),
        }

    def set_datacenter_up(self, dc: int, up: bool) -> dict[str, np.ndarray]:
        """Take datacenter ``dc`` down or bring it back (fault hook, between steps).

        Requests the simulator aborts (queued, running or in transit to ``dc``) go back to the
        pending list with their original arrival time (their wait keeps counting), in arrival
        order, with new ``seq`` numbers; they count in ``aborted``. Returns the refreshed
        observation (the action mask changes too: see :meth:`action_masks`).
        """
        if self._sim is None or self._done:
            raise RuntimeError("set_datacenter_up needs a running episode: call reset() first")
        self._requeue(self._sim.set_datacenter_up(dc, up))
        return self._observe()

    def episode_metrics(self, check_ledger: bool = False) -> dict[str, Any]:
        """Metrics of the episode so far (final once the episode has ended).

        Keys: ``steps``, ``sim_time_s``, ``drain_s``, ``arrived``, ``placed`` (submissions,
        re-submissions after an outage included), ``completed``, ``in_flight_at_truncation``
        (placed, not completed, not aborted), ``aborted`` (lost to an outage and re-queued),
        ``unplaced_at_end`` (pending),
        ``failed_over`` (= ``aborted``), ``failed_over_completed`` (failed over, placed again and
        completed), ``deferred`` (slot-steps deferred), ``invalid_actions``, ``carbon_g`` (facility, all
        datacenters, from t = 0 to the end of the drain), ``energy_kwh`` (facility),
        ``it_energy_kwh``, ``carbon_g_per_request`` (carbon_g / completed), TTFT / TPOT
        ``mean``, ``p50``, ``p90``, ``p99`` in seconds over completed requests (NaN when none),
        ``violations``, ``violation_rate`` (violations / completed), ``ttft_violation_rate``,
        ``tpot_violation_rate``, per-datacenter arrays (D,): ``dc_carbon_g``,
        ``dc_energy_kwh``, ``dc_placed``, ``dc_completed``; ``world_seed``; ``ledger`` (dict, see
        :meth:`ledger`; with ``check_ledger`` a failure raises when ``strict_ledger``).
        """
        if self._sim is None:
            raise RuntimeError("call reset() first")
        totals = self._sim.totals()
        in_flight = self._placed - self._completed - self._aborted
        unplaced = int(self._pending.shape[0])
        ledger = self.ledger(strict=check_ledger and self._strict_ledger)
        if check_ledger and not ledger["ok"]:
            warnings.warn(f"episode ledger check failed: {ledger['problems']}", RuntimeWarning, stacklevel=2)
        c = self._completed
        if self._writer is not None:
            tq = self._writer.percentiles("ttft_s", (50, 90, 99))
            pq = self._writer.percentiles("tpot_s", (50, 90, 99))
            ttft_mean = self._ttft_sum / c if c else float("nan")
            tpot_mean = self._tpot_sum / c if c else float("nan")
        else:
            ttft = np.concatenate(self._ttft_parts) if self._ttft_parts else np.zeros(0)
            tpot = np.concatenate(self._tpot_parts) if self._tpot_parts else np.zeros(0)
            # (one call per array: the same values as one call per percentile)
            tq = np.percentile(ttft, (50, 90, 99)).tolist() if ttft.size else [float("nan")] * 3
            pq = np.percentile(tpot, (50, 90, 99)).tolist() if tpot.size else [float("nan")] * 3
            ttft_mean = float(ttft.mean()) if c else float("nan")
            tpot_mean = float(tpot.mean()) if c else float("nan")

        dc_carbon = np.asarray(totals.carbon_g, dtype=np.float64).copy()
        dc_energy = np.asarray(totals.facility_energy_j, dtype=np.float64) / 3.6e6
        return {
            "steps": self._step_index,
            "sim_time_s": float(self._sim.now_s),
            "drain_s": self._drain_s,
            "arrived": self._arrived,
            "placed": self._placed,
            "completed": c,
            "in_flight_at_truncation": in_flight,
            "aborted": self._aborted,
            "failed_over": self._aborted,
            "failed_over_completed": self._failed_over_completed,
            "unplaced_at_end": unplaced,
            "deferred": self._deferred_total,
            "invalid_actions": self._invalid_total,
            "carbon_g": float(dc_carbon.sum()),
            "energy_kwh": float(dc_energy.sum()),
            "it_energy_kwh": float(np.sum(totals.it_energy_j) / 3.6e6),
            "carbon_g_per_request": float(dc_carbon.sum() / c) if c else float("nan"),
            "ttft_mean_s": ttft_mean,
            "ttft_p50_s": tq[0],
            "ttft_p90_s": tq[1],
            "ttft_p99_s": tq[2],
            "tpot_mean_s": tpot_mean,
            "tpot_p50_s": pq[0],
            "tpot_p90_s": pq[1],
            "tpot_p99_s": pq[2],
            "violations": self._violations,
            "violation_rate": self._violations / c if c else float("nan"),
            "ttft_violation_rate": self._ttft_violations / c if c else float("nan"),
            "tpot_violation_rate": self._tpot_violations / c if c else float("nan"),
            "dc_carbon_g": dc_carbon,
            "dc_energy_kwh": dc_energy,
            "dc_placed": self._dc_placed.copy(),
            "dc_completed": self._dc_completed.copy(),
            "world_seed": self._world_seed,
            "ledger": ledger,
        }

    def ledger(self, strict: bool = False) -> dict[str, Any]:
        """The accounting check of the episode so far (:func:`carbon_gym.ledger.check_ledger`):
        request counts and the energy / carbon identities; raises
        :class:`~carbon_gym.errors.LedgerError` on a failure when ``strict``."""
        from .ledger import check_ledger

        if self._sim is None:
            raise RuntimeError("call reset() first")
        sim = self._sim
        return check_ledger(
            arrived=self._arrived, placed=self._placed, completed=self._completed, failed_over=self._aborted,
            failed_over_completed=self._failed_over_completed,
            in_flight=self._placed - self._completed - self._aborted, unplaced=int(self._pending.shape[0]),
            totals=sim.totals(), attribution=sim.energy_attribution(),
            completed_energy_j=self._done_energy_j, completed_carbon_g=self._done_carbon_g,
            failed_over_energy_j=self._fo_energy_j, failed_over_carbon_g=self._fo_carbon_g,
            reported_energy_j=self._reported_energy_j, reported_carbon_g=self._reported_carbon_g,
            pue=np.array([d.pue for d in self._parts.topology.datacenters], dtype=np.float64), strict=strict,
        )

    def render(self) -> None:
        """This environment has no rendering."""
        return None

    def close(self) -> None:
        """Release the simulator (and flush streamed records)."""
        if self._writer is not None:
            self._writer.close()
        self._sim = None
        self._workload = None
        self._done = True


# ------------------------------------------------------------------------ adapters
# The few places that touch the scenario / world APIs.


def _resolve_scenario(scenario: Any, overrides: dict[str, Any] | None) -> Any:
    from pathlib import Path

    from .scenario import Scenario, load_scenario, scenario_from_dict

    if isinstance(scenario, Scenario):
        if not overrides:
            return scenario
        base = Path(scenario.source).resolve().parent if scenario.source else None
        return scenario_from_dict(scenario.to_dict(), source=scenario.source or None, base_dir=base, overrides=overrides)
    if isinstance(scenario, (str, Path)):
        return load_scenario(scenario, overrides=overrides)
    raise ConfigError("scenario", f"expected a scenario name, a path or a Scenario, got {type(scenario).__name__}")


def _suggest_max_pending(expected_per_step: float) -> int:
    """A slot count that holds a step's arrivals with margin: next power of two >= 1.25 x mean + 4 sd + 16."""
    need = 1.25 * expected_per_step + 4.0 * math.sqrt(expected_per_step) + 16
    return int(2 ** math.ceil(math.log2(need)))


# ------------------------------------------------------------------------ compatibility
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
        "action_nvec": [int(L.n_datacenters) + 1] * int(L.max_pending),
        "scales": {
            "carbon_g_per_kwh": CARBON_SCALE_G_PER_KWH, "tokens": TOKENS_SCALE,
            "queue_per_engine": QUEUE_PER_ENGINE_SCALE, "prefill_ref_tokens": PREFILL_REF_TOKENS,
            "tpot_slope_ref_seqs": TPOT_SLOPE_REF_SEQS, "estimate_cap": ESTIMATE_CAP, "obs_high": OBS_HIGH,
        },
    }


def env_fingerprint(env_or_layout: Any) -> str:
    """Short hash of :func:`observation_signature` (store it in checkpoints)."""
    import hashlib
    import json

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
