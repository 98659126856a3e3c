"""GeoServeEnv: the Gymnasium environment of carbon-aware, geo-distributed LLM serving.

One step = one scheduler polling period. See :class:`GeoServeEnv` for the observation, action,
reward and episode definitions; :mod:`carbon_gym.observation` for the feature table and
:func:`decode_observation`; :meth:`GeoServeEnv.state` for the typed state schedulers read.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from . import pending as P
from .actions import parse_route_action
from .control import EnvCapacity
from .episode import EpisodeTally
from .errors import ConfigError, RecordWriteError, check_choice, check_seed
from .faults import has_carbon_feed_gap
from .numeric import episode_steps
from .observation import (CARBON_SCALE_G_PER_KWH, ENV_VERSION, ESTIMATE_CAP, OBS_HIGH, PREFILL_REF_TOKENS,  # noqa: F401
                          QUEUE_PER_ENGINE_SCALE, TOKENS_SCALE, TPOT_SLOPE_REF_SEQS, DatacenterEncoder, ObservationLayout,
                          check_env_compatible, decode_observation, env_fingerprint, features_markdown,
                          observation_signature, observation_space, suggest_max_pending)
from .pending import PendingStore
from .scenario import resolve_scenario
from .sessions import is_prefix_workload
from .sessions_state import session_tracker
from .sim.results import SNAPSHOT_ARRAY_ROWS, snapshot_from_array
from .state import DatacenterState, EnvState, PendingRequests

if TYPE_CHECKING:  # pragma: no cover
    from gymnasium.envs.registration import EnvSpec

    from .scenario import Scenario
    from .sim import Simulator
    from .sim.records import AbortedRequests, RequestRecords
    from .workload import Workload
    from .world import WorldParts

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

#: Reward normalisation: grid intensity (gCO2eq/kWh) used for the nominal grams per step.
REFERENCE_INTENSITY_G_PER_KWH = 400.0
#: Default bound of the end-of-episode drain: this many TTFT targets ...
DRAIN_TTFT_MULTIPLE = 10.0
#: ... plus this many TPOT targets per output token of the longest request placed.
DRAIN_TPOT_MULTIPLE = 2.0

INVALID_ACTION_MODES = ("raise", "defer")

_SNAP_UP = SNAPSHOT_ARRAY_ROWS.index("up")
_SNAP_CARBON = SNAPSHOT_ARRAY_ROWS.index("carbon_g_per_kwh")
_SNAP_AWAKE = SNAPSHOT_ARRAY_ROWS.index("awake_engines")
_SNAP_SERVERS = SNAPSHOT_ARRAY_ROWS.index("servers_on")


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

    With ``[capacity] control = "agent"`` the action is a ``Dict`` of this ``"route"``, a
    ``"capacity"`` (awake engines per datacenter) and a ``"servers"`` (servers powered) part,
    applied at each capacity decision (``state().capacity_decision``); a bare route array keeps
    the capacity. See :mod:`carbon_gym.control`, :class:`~carbon_gym.wrappers.FlattenCapacityAction`
    (one ``MultiDiscrete`` for SB3) and :mod:`carbon_gym.sim.capacity` (sleep, wake, power-off).

    ## Observation Space

    ``Dict`` of three 1-D float32 ``Box``es (SB3 ``MultiInputPolicy`` compatible). Matrices are
    flattened row-major; :func:`decode_observation` reshapes and rescales them to physical units.

    Shapes: ``"datacenters"`` (D x F_D,), row d = datacenter d, F_D = 13 + H (+ 2 flag columns
    with a carbon-feed gap); ``"slots"`` (K x F_S,), row k = the k-th oldest placeable pending request (blocked ones take no slot;
    padded rows are all zero), F_S = 4 + R + D; ``"globals"`` (4,). The columns, in order, are
    the rows of the feature tables of :mod:`carbon_gym.observation` (generated below): each
    feature encodes a field of the typed state (:meth:`state`) times a fixed scale. The five
    estimates are the simulator's ``ClusterSnapshot`` estimates for the engine the datacenter's
    dispatcher would pick (a prompt of p tokens is estimated to take ceil(p / chunk) x
    ``est_iteration`` + p x ``est_prefill`` / 1024 of prefill, chunk = max_num_batched_tokens -
    running sequences of that engine); they are clipped to [0, 100] (= ``ESTIMATE_CAP`` x the
    target; 0 floors a TPOT slope below 0) and are 100 for a datacenter that is down (sim: inf).

    {FEATURE_TABLES}

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

    Measurement window (opt-in, ``[env] measure = "window"``, ``warmup_s = W``): ``[0, W)`` is a
    burn-in (the policy acts, nothing is counted), the metrics cover ``[W, N P]`` and the N-th
    step ends the episode at its decision, without a drain (see
    :meth:`~carbon_gym.episode.EpisodeTally.start_window`); steps and the ledger are unchanged.

    ## Faults

    A scenario's ``[[faults]]`` (see :mod:`carbon_gym.faults`) apply at their exact simulated
    times: the env advances the simulator in sub-steps to each fault's time. Outages abort the
    datacenter's requests; they return to the pending queue with their original arrival time
    (failed over: counted in ``failed_over``, their progress lost, their energy kept as wasted
    work) and the policy places them again. The mask forbids datacenters that are down, whose
    engines are all drained, or whose link from the request's region is cut. A request with no
    allowed datacenter is *blocked*: it stays pending (in order, its wait counting) but takes no
    slot, so the slots always show the oldest K requests that can be placed (``info["blocked"]``,
    ``state().pending_blocked``; episode metrics ``blocked`` (request-steps) and
    ``blocked_at_end``). A datacenter whose engines all sleep (capacity control) is not masked: a
    request sent there wakes an engine. A degraded link's
    extra delay shows in the slots' network columns. With a carbon-feed gap, the datacenter rows
    get two more columns (``carbon_stale``, ``carbon_missing``, flags) and the carbon columns
    hold the last values before the gap (stale) or 0 (missing; NaN after
    :func:`decode_observation`); emissions are always accounted with the real intensity.

    ## Info

    Deterministic (no wall-clock values). Every step: ``time_s`` (simulated time of the next
    decision), ``carbon_g``, ``energy_j`` (facility) of the step, ``arrived`` (new requests seen),
    ``placed``, ``deferred`` (pending slots left unplaced, incl. invalid ones in defer mode),
    ``overflow`` (placeable requests pending beyond K at the decision), ``blocked`` (requests
    pending now with no allowed datacenter: they take no slot, see Faults), ``pending``
    (requests pending now, blocked ones included),
    ``completed``, ``violations`` (TTFT or TPOT over its target), ``ttft_violations`` and
    ``tpot_violations`` (each target on its own: MLPerf's p99 criterion holds while each is at
    most 1% of the completions), ``ttft_mean_s`` / ``tpot_mean_s`` / ``ttft_max_s`` /
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
      ``record_chunk_rows``: rows per file (default 50,000, about 8 MB buffered). A bad path
      (empty, NUL byte, under a file, unwritable) raises ``ConfigError`` at construction; a
      failed write (disk full) raises :class:`~carbon_gym.errors.RecordWriteError` naming the
      directory and ends the episode: nothing is lost (unwritten records stay in memory, the
      metrics and the ledger cover them) and ``reset()`` starts a new one.

    Read-only attributes: ``scenario``, ``simulator`` (after reset; read it, do not drive it),
    ``layout`` (:class:`ObservationLayout`), ``nominal_carbon_g_per_step``,
    ``max_episode_steps``, ``last_completed``. :meth:`state` returns the typed decision state in
    physical units (what schedulers read), :meth:`pending_requests` the raw data of the pending
    requests, :meth:`episode_metrics` the metrics so far, and :meth:`set_datacenter_up` is the
    outage hook (aborted requests are re-queued).
    """

    metadata = {"render_modes": []}
    _spec: EnvSpec | None = None

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
        self._scenario = resolve_scenario(scenario, overrides)
        sc = self._scenario
        self._P = float(sc.polling_period_s)
        self._duration = float(sc.duration_s)
        self._n_steps = episode_steps(self._duration, self._P)
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
        if drain_limit_s is not None and (isinstance(drain_limit_s, (bool, str, bytes)) or not (float(drain_limit_s) >= 0)
                                          or math.isinf(float(drain_limit_s))):
            raise ConfigError("drain_limit_s", f"must be a finite number of seconds >= 0, got {drain_limit_s!r}",
                              allowed="None or a number >= 0")
        self._drain_limit_s = None if drain_limit_s is None else float(drain_limit_s)
        if not isinstance(strict_ledger, (bool, np.bool_)):
            raise ConfigError("strict_ledger", f"expected true or false, got {strict_ledger!r}", allowed=[True, False])
        self._strict_ledger = bool(strict_ledger)
        if record_dir is not None:
            from .sim.records import check_record_dir

            record_dir = check_record_dir(record_dir)
        if isinstance(record_chunk_rows, bool) or not isinstance(record_chunk_rows, (int, np.integer)) or record_chunk_rows < 1:
            raise ConfigError("record_chunk_rows", f"must be an integer >= 1, got {record_chunk_rows!r}")
        self._record_dir = record_dir
        self._record_chunk_rows = int(record_chunk_rows)
        self._window = sc.env.measure == "window"
        self._warmup_s = float(sc.env.warmup_s)
        if self._warmup_s > 0 and not self._window:
            raise ConfigError("env.warmup_s", "a warm-up needs a measurement window", allowed=["env.measure = 'window'"])
        if self._window and not (abs(self._warmup_s / self._P - round(self._warmup_s / self._P)) < 1e-9
                                 and round(self._warmup_s / self._P) < self._n_steps):
            raise ConfigError("env.warmup_s", f"must be a multiple of polling_period_s={self._P:g} below duration_s="
                              f"{self._duration:g}, got {self._warmup_s:g}", source=sc.source or None)
        self._episode_count = 0
        self._writer: Any = None
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
                f"Consider overrides={{'env.max_pending': {suggest_max_pending(expected)}}}.",
                stacklevel=2,
            )

        from .world import build_parts, build_predictor

        self._parts = build_parts(sc)
        self._predictor = build_predictor(sc)
        # A first simulator gives the static facts (engines, KV blocks) the layout needs.
        sim, _ = self._new_world(int(sc.seed))
        self._static_setup(sim)
        self.observation_space = observation_space(self.layout)
        self.action_space = self._capacity.action_space(spaces.MultiDiscrete(np.full(self._K, self._D + 1, dtype=np.int64)))
        self._sim: Any = None
        self._workload: Any = None
        self._done = True
        self._last_completed: Any = None
        self._world_seed: int | None = None

    # ------------------------------------------------------------------ static set-up
    def _new_world(self, seed: int) -> tuple[Simulator, Workload]:
        """A fresh (Simulator, Workload) for an episode with world seed ``seed``.

        The first call (the constructor's) builds them with :func:`~carbon_gym.world.build_world`
        from the env's parts; the first episode then runs on that simulator (the constructor
        only reads its snapshot), later ones on ``Simulator.fresh()`` of it (a simulator built
        from the same arguments and shared immutable tables, which driving one does not change),
        and the workload is the first one reseeded (:func:`~carbon_gym.world.reseed_workload`):
        the same objects, much cheaper (an env that serves one episode builds one simulator). From
        the second episode on, fresh copies come from a clean copy of the first simulator, so the
        first episode's end state is not kept alive."""
        from .world import build_world, reseed_workload

        template = getattr(self, "_sim_template", None)
        if template is None:
            sim, workload = build_world(self._scenario, seed, parts=self._parts)
            self._sim_template = sim
            self._unused_sim: Simulator | None = sim  # not driven yet: the first episode's
            self._sim_template_driven = True  # (once that episode has run)
            self._workload_template = workload.with_seed(workload.seed)  # never used: nothing cached
            return sim, workload
        if self._unused_sim is not None:
            sim, self._unused_sim = self._unused_sim, None
            return sim, reseed_workload(self._workload_template, seed)
        if self._sim_template_driven:  # the first episode's: keep a clean copy, not its end state
            template = self._sim_template = template.fresh()
            self._sim_template_driven = False
        return template.fresh(), reseed_workload(self._workload_template, seed)

    def _static_setup(self, sim: Simulator) -> None:
        parts = self._parts
        topo = parts.topology
        self._D = D = int(topo.n_datacenters)
        self._R = R = int(topo.n_regions)
        K = self._K
        snap = sim.snapshot()
        n_engines = np.asarray(snap.n_engines, dtype=np.int64)
        total_blocks = np.asarray(snap.total_kv_blocks, dtype=np.int64)
        engine_blocks = np.where(n_engines > 0, total_blocks // np.maximum(n_engines, 1), 0)
        eng_cfg = parts.engine
        gpus = np.array([d.gpus for d in topo.datacenters], dtype=np.float64)
        self._pue = np.array([d.pue for d in topo.datacenters], dtype=np.float64)
        nameplate = gpus * np.array([float(g.spec.tdp_w) for g in parts.datacenter_gpus()]) * self._pue
        servers = np.array([d.nodes for d in topo.datacenters], dtype=np.int64)
        epn = np.array([d.gpus_per_node // int(eng_cfg.tp) for d in topo.datacenters], dtype=np.int64)
        self._capacity = EnvCapacity(self._scenario, parts.datacenter_gpus(), n_engines, servers, epn, self._P)
        self.layout = layout = ObservationLayout(
            n_datacenters=D, n_regions=R, max_pending=K, forecast_hours=self._H,
            ttft_target_s=self._ttft_target, tpot_target_s=self._tpot_target, duration_s=self._duration,
            polling_period_s=self._P, n_engines=n_engines, engine_kv_blocks=engine_blocks,
            block_tokens=int(eng_cfg.block_tokens), max_num_seqs=int(eng_cfg.max_num_seqs), nameplate_w=nameplate,
            datacenter_names=tuple(d.name for d in topo.datacenters), region_names=tuple(topo.regions),
            carbon_feed_flags=has_carbon_feed_gap(self._scenario),
            capacity_control=self._capacity.active, capacity_agent=self._capacity.control == "agent", n_servers=servers,
            prefix_cache=is_prefix_workload(self._scenario.workload),
        )
        self._sessions = session_tracker(layout, parts, self._pue)  # (None without a prefix workload)
        self.nominal_carbon_g_per_step = float(nameplate.sum() * REFERENCE_INTENSITY_G_PER_KWH * self._P / 3.6e6)
        self._dc_encoder = DatacenterEncoder(layout)
        sc_ = layout.slot_columns
        self._slot_cols = (sc_["prompt"], sc_["predicted_output"], sc_["waited"], sc_["network"])
        self._inv_ttft = 1.0 / self._ttft_target
        # Per-origin template slot row: valid flag, one-hot origin, base network delay (2 x one-way).
        net = parts.network
        rows = np.zeros((R, layout.n_slot_features), dtype=np.float32)
        rows[:, sc_["valid"]] = 1.0
        rows[:, sc_["origin"]:sc_["origin"] + R] = np.eye(R)
        rows[:, sc_["network"]:] = 2.0 * np.asarray(net.one_way_s, dtype=np.float64) / self._ttft_target
        self._region_rows = rows
        self._uplink_per_token_scaled = float(net.bytes_per_token) / float(net.bandwidth_bytes_per_s) / self._ttft_target
        mask = np.zeros((K, D + 1), dtype=bool)
        mask[:, D] = True
        self._mask_template = mask
        self._mask: np.ndarray = mask.copy()
        self._all_up = np.ones((R, D), dtype=bool)
        self._block_tokens = int(eng_cfg.block_tokens)
        self._engine_kv_blocks = engine_blocks
        self._min_engine_kv_tokens = int(engine_blocks.min()) * self._block_tokens
        self._arange_k = np.arange(K)
        start = parts.carbon.start_utc
        self._carbon_t0_s = float(parts.carbon_offset_s)
        self._clock_s_of_day = float(start.hour * 3600 + start.minute * 60 + start.second) + self._carbon_t0_s
        self._zone_cols = np.array([parts.carbon.zone_index(d.zone) for d in topo.datacenters], dtype=np.int64)
        self._one_way_x2 = 2.0 * np.asarray(net.one_way_s, dtype=np.float64)
        self._uplink_s_per_token = float(net.bytes_per_token) / float(net.bandwidth_bytes_per_s)

    # ------------------------------------------------------------------ properties
    @property
    def scenario(self) -> Scenario:
        """The (read-only) scenario this env runs."""
        return self._scenario

    @property
    def simulator(self) -> Simulator | None:
        """The current episode's simulator (None before the first reset). Read it, do not drive it."""
        return self._sim

    @property
    def world_parts(self) -> WorldParts:
        """The static parts of the world (:class:`carbon_gym.world.WorldParts`: topology, model and
        GPU specs, engine settings, latency, power and network models, carbon trace), shared by
        every episode. Read them, do not change them."""
        return self._parts

    @property
    def max_episode_steps(self) -> int:
        """Steps in an episode: ceil(duration_s / polling_period_s)."""
        return self._n_steps

    @property
    def spec(self) -> EnvSpec | None:
        """Gymnasium's ``EnvSpec`` of this env (set by ``gymnasium.make``), its
        ``max_episode_steps`` always this env's own :attr:`max_episode_steps`."""
        return self._spec

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        if value is not None and value.max_episode_steps != self._n_steps:
            registered = gym.registry.get(value.id)
            limit = registered.max_episode_steps if registered is not None else None
            if limit is not None and limit < self._n_steps:
                warnings.warn(f"{value.id} is registered with max_episode_steps={limit} (its scenario as shipped), but these "
                              f"arguments give {self._n_steps} steps: gymnasium.make's TimeLimit would end the episode before "
                              f"its last step and drain; pass max_episode_steps={self._n_steps} to gymnasium.make "
                              "(nothing to do if you did)", stacklevel=3)
            value = dataclasses.replace(value, max_episode_steps=self._n_steps)
        self._spec = value

    @property
    def last_completed(self) -> RequestRecords | None:
        """``RequestRecords`` of the requests completed during the last step (None before a step)."""
        return self._last_completed

    # ------------------------------------------------------------------ reset
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start a new episode (see the class docstring, Starting State). ``seed``: None or an
        integer >= 0, a Python ``int`` or any numpy integer; anything else is a
        :class:`~carbon_gym.errors.ConfigError` naming ``seed``."""
        if options is not None and not isinstance(options, dict):
            raise ConfigError("options", f"expected a dict or None, got {type(options).__name__}", allowed=[None, {}])
        if options:
            raise ConfigError("options", f"no reset options are supported, got {sorted(options)}", allowed=[])
        seed = check_seed(seed)  # (numpy integers accepted; the rest named, not Gymnasium's bare Error)
        if seed is None and self._np_random is None:
            seed = int(self._scenario.seed)
        super().reset(seed=seed)
        world_seed = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self._world_seed = world_seed
        self._sim, self._workload = self._new_world(world_seed)
        from .world import build_fault_runtime, build_forecaster

        self._faults = build_fault_runtime(self._scenario, self._sim)
        self._forecaster = build_forecaster(self._scenario, self._parts.carbon, seed=world_seed) if self._H else None
        self._pending = PendingStore(self._predictor)
        if self._sessions is not None:
            self._sessions.reset()
        self._step_index = 0
        self._capacity.reset()
        self._done = False
        self._drain_s = 0.0
        self._step_failed_over = 0
        old_writer, self._writer = self._writer, None
        if old_writer is not None and old_writer.failed is None:
            old_writer.close()
        if self._record_dir is not None:
            from pathlib import Path

            from .sim.records import RecordWriter

            self._writer = RecordWriter(Path(self._record_dir) / f"episode-{self._episode_count:05d}",
                                        self._record_chunk_rows)
        self._episode_count += 1
        self._tally = EpisodeTally(self._D, self._ttft_target, self._tpot_target, self._writer)
        self._last_completed = None
        self._cum_carbon_g = 0.0
        self._cum_energy_j = 0.0
        self._forecast_key: Any = None
        self._forecast_g: np.ndarray = np.zeros((self._D, 0))
        self._forecast_scaled: np.ndarray = self._forecast_g
        self._dc_encoder.clear()
        self._state: EnvState | None = None

        if self._window and self._warmup_s == 0.0:
            self._tally.start_window(self._sim, 0)
        arrived = self._advance_and_collect(self._P)
        records = self._sim.pop_completed()  # nothing can complete: nothing was placed
        carbon_g, energy_j = self._totals_delta()
        self._maybe_open_window()
        obs = self._observe()
        info = {
            "time_s": float(self._sim.now_s),
            "carbon_g": carbon_g,
            "energy_j": energy_j,
            "arrived": arrived,
            "pending": len(self._pending),
            "blocked": self._pending.n_blocked,
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
        tally = self._tally
        n_vis = self._n_visible
        cap = self._capacity
        if cap.active:
            action, targets = cap.split(action)
            choice, n_invalid = parse_route_action(self, action)
            cap.decide(self._step_index, targets, self.state, sim)
        else:
            choice, n_invalid = parse_route_action(self, action)
        blocked = self._pending.n_blocked
        overflow = len(self._pending) - n_vis - blocked
        place = choice < D
        n_place = int(np.count_nonzero(place))
        deferred = n_vis - n_place
        if n_place:
            dcs = choice if n_place == n_vis else choice[place]
            rows, ints = self._pending.take(n_vis, place)  # origin, prompt, output
            ids = P.submit_placed(sim, ints[:, 0], rows[:, P.ARRIVAL], ints[:, 1], ints[:, 2], dcs,
                                  self._pending.placed_hashes)  # (prefix_hashes= only when there are any)
            tally.add_placed(ids, rows[:, P.FAILED], dcs, ints[:, 2])
            if self._sessions is not None:
                self._sessions.placed(place, dcs, self._snap, ids)
        tally.deferred += deferred
        tally.blocked += blocked
        tally.invalid_actions += n_invalid
        self._step_index += 1

        last = self._step_index >= self._n_steps
        if last and self._window:  # the window ends at this decision: no drain (see Episode End)
            records = sim.pop_completed()
            arrived = 0
        elif last:
            records = self._drain()
            arrived = 0
        else:
            # decision k happens at exactly k x P (no drift from repeated additions)
            arrived = self._advance_and_collect((self._step_index + 1) * self._P)
            records = sim.pop_completed()
        self._last_completed = records
        carbon_g, energy_j = self._totals_delta()
        step_failed_over, self._step_failed_over = self._step_failed_over, 0
        if self._sessions is not None:
            self._sessions.completed(records.request_id)
        ttft_v0, tpot_v0 = tally.ttft_violations, tally.tpot_violations
        try:
            violations, stats = tally.add_completed(records)
        except RecordWriteError as e:
            raise self._records_failed(e) from e
        self._maybe_open_window()
        reward = -self._carbon_weight * carbon_g / self.nominal_carbon_g_per_step - self._slo_weight * violations

        obs = self._observe()
        if cap.active:
            cap.sample(self._snap[_SNAP_AWAKE], self._snap[_SNAP_SERVERS])
        info: dict[str, Any] = {
            "time_s": float(sim.now_s),
            "carbon_g": carbon_g,
            "energy_j": energy_j,
            "arrived": arrived,
            "placed": n_place,
            "deferred": deferred,
            "overflow": overflow,
            "blocked": self._pending.n_blocked,
            "pending": len(self._pending),
            "completed": len(records),
            "violations": violations,
            "ttft_violations": tally.ttft_violations - ttft_v0,
            "tpot_violations": tally.tpot_violations - tpot_v0,
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
            if self._writer is not None and self._writer.failed is not None:  # (the final flush)
                raise self._records_failed(self._writer.failed)
        return obs, float(reward), False, bool(last), info

    def _records_failed(self, err: RecordWriteError) -> RecordWriteError:
        """End the episode after a failed record write: the error to raise (see ``record_dir``)."""
        self._done = True
        return RecordWriteError(err.directory, f"{err.reason}; the episode is closed at t = {self._sim.now_s:g} s "
                                "(episode_metrics() and ledger() still cover it; reset() starts a new one)")

    # ------------------------------------------------------------------ action handling
    def action_masks(self) -> np.ndarray:
        """Allowed choices, flat bool array of length K x (D + 1), slot-major (MaskablePPO); with
        ``capacity.control = "agent"`` followed by the capacity and servers parts (every value
        allowed), in the order of :class:`~carbon_gym.wrappers.FlattenCapacityAction`."""
        if self._sim is None:
            raise RuntimeError("call reset() before action_masks()")
        if self._capacity.control == "agent":
            return np.concatenate(list(self._capacity.masks(self._mask.reshape(-1)).values()))
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
        self._pending.append_batch(batch)  # (with any prefix hashes and sessions: carbon_gym.sessions)
        self._tally.add_context_truncated(batch.context_truncated_tokens)
        self._tally.arrived += n
        return n

    def _advance_sim(self, t_s: float) -> None:
        """Advance the simulator to ``t_s``, applying the scenario's faults at their times."""
        if self._faults is None:
            self._sim.advance_to(t_s)
            return
        for ab in self._faults.advance(t_s):
            self._requeue(ab)

    def _requeue(self, ab: AbortedRequests) -> None:
        """Put requests aborted by an outage back in the pending queue (fail-over), prefix and session kept."""
        n = len(ab)
        if not n:
            return
        sid, turn = self._sessions.aborted(ab.request_id) if self._sessions is not None else (None, None)
        self._pending.requeue(ab.origin, ab.arrival_s, ab.prompt_tokens, ab.output_tokens, ab.prefix_hashes, sid, turn)
        self._tally.add_aborted(ab)
        self._step_failed_over += n

    def _maybe_open_window(self) -> None:
        """Open the measurement window when the burn-in ends (``env.measure = "window"``)."""
        if self._window and self._tally.window is None and self._sim.now_s >= self._warmup_s - 1e-9:
            self._tally.start_window(self._sim, len(self._pending))
            self._capacity.start_window(self._sim)

    def _drain(self) -> RequestRecords:
        """Advance without arrivals until every placed request completes or the drain limit passes."""
        from .sim.records import RequestRecords

        sim = self._sim
        tally = self._tally
        t_start = sim.now_s
        limit = self._drain_limit_s
        if limit is None:
            limit = DRAIN_TTFT_MULTIPLE * self._ttft_target + DRAIN_TPOT_MULTIPLE * self._tpot_target * tally.max_output_placed
        t_end = t_start + limit
        chunk = max(self._P, 1.0)
        parts = [sim.pop_completed()]
        done = tally.completed + len(parts[0])
        while done < tally.placed - tally.aborted and sim.now_s < t_end:
            self._advance_sim(min(sim.now_s + chunk, t_end))
            part = sim.pop_completed()
            done += len(part)
            parts.append(part)
        self._drain_s = float(sim.now_s - t_start)
        return RequestRecords.concat(parts)  # (one part: that part; request lists stay lazy)

    def _totals_delta(self) -> tuple[float, float]:
        carbon, energy = self._sim.carbon_energy_totals()
        d_c, d_e = carbon - self._cum_carbon_g, energy - self._cum_energy_j
        self._cum_carbon_g, self._cum_energy_j = carbon, energy
        self._tally.add_reported(d_c, d_e)
        return d_c, d_e

    # ------------------------------------------------------------------ observation
    def _forecast(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """(D, H) forecast intensity (g/kWh) of the H hours after the current hour, and the same
        times the observation's carbon factor (both cached per hour)."""
        t = self._carbon_t0_s + now
        key = int(t // 3600.0)
        if key != self._forecast_key:
            assert self._forecaster is not None  # (H > 0)
            fc = self._forecaster.forecast(t)[: self._H]  # (H, zones)
            self._forecast_g = np.ascontiguousarray(fc[:, self._zone_cols].T)
            self._forecast_scaled = self._forecast_g * (1.0 / CARBON_SCALE_G_PER_KWH)
            self._forecast_key = key
        return self._forecast_g, self._forecast_scaled

    def _carbon_view(self, now: float, true_now_g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """Carbon as the feed reports it (:meth:`FaultRuntime.carbon_view`), or None."""
        if self._faults is None or not self.layout.carbon_feed_flags:
            return None
        H = self._H

        def forecast_at(t_s: float) -> np.ndarray:
            fc = self._forecast(t_s)[0].copy() if H else np.zeros((self._D, 0))
            self._forecast(now)  # the cache holds the current hour again
            return fc

        return self._faults.carbon_view(true_now_g, self._forecast_g if H else np.zeros((self._D, 0)), forecast_at)

    def _observe(self) -> dict[str, np.ndarray]:
        """Build the observation and the action mask for the current state (the typed state
        :meth:`state` describes is cached with it)."""
        sim = self._sim
        D, K, H = self._D, self._K, self._H
        now = float(sim.now_s)
        # ---- datacenters: the feature table's encoder
        snap = sim.snapshot_array()  # (fields, D) float64, rows named by SNAPSHOT_ARRAY_ROWS
        up = snap[_SNAP_UP] > 0.5
        fc_scaled = self._forecast(now)[1] if H else None
        view = self._carbon_view(now, snap[_SNAP_CARBON])
        dc = self._dc_encoder.encode(snap, fc_scaled, (self._episode_count, self._forecast_key), view)
        self._up = up
        self._snap = snap
        self._view = view
        self._state = None
        # ---- slots: region template rows + per-request columns; the oldest K placeable requests
        faults = self._faults
        if faults is None:  # (read only below: one cached all-up matrix, else a fresh one)
            region_ok = self._all_up if up.all() else np.repeat(up[None, :], self._R, axis=0)
        else:
            region_ok = (up & faults.accepting())[None, :] & ~faults.link_cut
        n_pend = len(self._pending)
        p, allowed = self._pending.offer(K, region_ok, self._engine_kv_blocks, self._block_tokens,
                                         self._min_engine_kv_tokens)
        n = self._n_visible = self._pending.n_visible
        slots = np.zeros(K * self.layout.n_slot_features, dtype=np.float32)
        sl = slots.reshape(K, self.layout.n_slot_features)  # (a view)
        mask = self._mask_template.copy()
        if n:
            prompt = p[:, P.PROMPT]
            origins = p[:, P.ORIGIN].astype(np.intp)
            sl[:n] = self._region_rows[origins]
            c = self._slot_cols
            sl[:n, c[0]] = prompt * (1.0 / TOKENS_SCALE)
            sl[:n, c[1]] = p[:, P.PRED] * (1.0 / TOKENS_SCALE)
            sl[:n, c[2]] = np.minimum((now - p[:, P.ARRIVAL]) * self._inv_ttft, OBS_HIGH)
            sl[:n, c[3]:] += (prompt * self._uplink_per_token_scaled)[:, None]
            mask[:n, :D] = allowed
            if faults is not None:
                delta = faults.one_way_delta_s()
                if np.any(delta != 0.0):
                    net = c[3]
                    sl[:n, net:net + D] += (2.0 * delta[origins] / self._ttft_target).astype(np.float32)
        if self._sessions is not None:  # cached prefixes and sessions of the visible requests
            self._sessions.observe(sim, self._pending, p, self._window and self._tally.window is not None)
            self._sessions.encode(sl, n, self.layout.slot_columns["cached_prefix"], p[:, P.PROMPT] if n else None)
        self._mask = mask
        # ---- globals
        ang = (2.0 * math.pi / 86400.0) * ((self._clock_s_of_day + now) % 86400.0)
        gl = np.array([math.sin(ang), math.cos(ang), min(n_pend / K, OBS_HIGH), min(now / self._duration, OBS_HIGH)],
                      dtype=np.float32)
        return {"datacenters": dc.reshape(-1), "slots": slots, "globals": gl}

    # ------------------------------------------------------------------ public helpers
    def state(self) -> EnvState:
        """The typed decision state of the current step, in physical units (float64; what
        schedulers read): the datacenters (:class:`~carbon_gym.state.DatacenterState`: the
        simulator's snapshot, carbon as the feed reports it, the forecast), the visible pending
        requests, the action mask and the static layout. Exact where the observation is scaled,
        capped and rounded to float32; the true output lengths stay hidden."""
        if self._sim is None:
            raise RuntimeError("call reset() first")
        if self._state is not None:
            return self._state
        now = float(self._sim.now_s)
        snap = snapshot_from_array(now, self._snap)
        D, H = self._D, self._H
        fc = self._forecast_g if H else np.zeros((D, 0))
        view = self._view
        if view is None:
            carbon, stale, missing = snap.carbon_g_per_kwh, np.zeros(D, dtype=bool), np.zeros(D, dtype=bool)
        else:
            carbon, fc, stale, missing = view[0], view[1], view[2] & ~view[3], view[3]
        fields = {f.name: getattr(snap, f.name) for f in dataclasses.fields(snap)}
        fields["carbon_g_per_kwh"] = carbon
        dcs = DatacenterState(**fields, carbon_forecast_g_per_kwh=fc, carbon_stale=stale, carbon_missing=missing)
        ang_h = ((self._clock_s_of_day + now) % 86400.0) / 3600.0
        n = self._n_visible
        self._state = EnvState(time_s=now, hour_utc=ang_h, elapsed_s=now, datacenters=dcs,
                               pending=self._pending_view(n), pending_total=len(self._pending),
                               pending_blocked=self._pending.n_blocked,
                               action_mask=self._mask[:n].copy(), layout=self.layout,
                               **self._capacity.state_fields(self._step_index))
        return self._state

    def _pending_view(self, n: int) -> PendingRequests:
        """The visible pending requests (or, with ``n`` > visible, the first ``n`` in arrival
        order) as :class:`~carbon_gym.state.PendingRequests`."""
        p = self._pending.visible_rows(n)
        origin = p[:, P.ORIGIN].astype(np.int64)
        prompt = p[:, P.PROMPT].astype(np.int64)
        network = self._one_way_x2[origin] + (prompt * self._uplink_s_per_token)[:, None]
        if self._faults is not None:
            network = network + 2.0 * self._faults.one_way_delta_s()[origin]
        return PendingRequests(
            seq=p[:, P.SEQ].astype(np.int64), origin=origin, arrival_s=p[:, P.ARRIVAL].copy(), prompt_tokens=prompt,
            predicted_output_tokens=p[:, P.PRED].copy(), waited_s=self._sim.now_s - p[:, P.ARRIVAL],
            network_s=network, failed_over=p[:, P.FAILED] > 0,
            **(self._sessions.state_fields(n) if self._sessions is not None else {}),
        )

    def pending_requests(self, include_overflow: bool = False) -> dict[str, np.ndarray]:
        """Raw data of the pending requests in slot order (oldest first), as a dict of the
        :class:`~carbon_gym.state.PendingRequests` fields without ``failed_over``: ``seq``,
        ``origin``, ``arrival_s``, ``prompt_tokens``, ``predicted_output_tokens``, ``waited_s``,
        ``network_s`` (n, D). The true output length is not exposed. ``include_overflow``: every
        pending request in arrival order instead (beyond the K slots, blocked ones included)."""
        if self._sim is None:
            raise RuntimeError("call reset() first")
        view = self._pending_view(len(self._pending) if include_overflow else self._n_visible)
        out = {k: getattr(view, k) for k in ("seq", "origin", "arrival_s", "prompt_tokens", "predicted_output_tokens",
                                            "waited_s", "network_s")}
        return out

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
        ``unplaced_at_end`` (pending), ``blocked`` (request-steps: at each decision, the pending
        requests with no allowed datacenter), ``blocked_at_end`` (of ``unplaced_at_end``),
        ``context_truncated`` / ``context_truncated_tokens`` (arrivals cut to the context window,
        tokens dropped: :func:`carbon_gym.workload.fit_context`), ``failed_over`` (= ``aborted``),
        ``failed_over_completed`` (failed over, placed again and completed), ``deferred``
        (slot-steps deferred), ``invalid_actions``, ``carbon_g`` (facility, all datacenters, from
        t = 0 to the end of the drain), ``energy_kwh`` (facility), ``it_energy_kwh``,
        ``carbon_g_per_request`` (carbon_g / completed), TTFT / TPOT
        ``mean``, ``p50``, ``p90``, ``p99`` in seconds over completed requests (NaN when none),
        ``violations``, ``violation_rate`` (violations / completed), ``ttft_violation_rate``,
        ``tpot_violation_rate``, per-datacenter arrays (D,): ``dc_carbon_g``,
        ``dc_energy_kwh``, ``dc_placed``, ``dc_completed``; ``world_seed``; ``ledger`` (dict, see
        :meth:`ledger`; with ``check_ledger`` a failure raises when ``strict_ledger``).
        """
        if self._sim is None:
            raise RuntimeError("call reset() first")
        out = self._tally.metrics(self._sim, unplaced=len(self._pending), blocked=self._pending.n_blocked, steps=self._step_index, drain_s=self._drain_s,
                                  world_seed=self._world_seed, pue=self._pue, check_ledger=check_ledger,
                                  strict=self._strict_ledger)
        out.update(self._capacity.metrics(self._sim, self._pue))
        if self._sessions is not None:
            out.update(self._sessions.metrics(self._sim))
        return out

    def ledger(self, strict: bool = False) -> dict[str, Any]:
        """The accounting check of the episode so far (:func:`carbon_gym.ledger.check_ledger`):
        request counts and the energy / carbon identities; raises
        :class:`~carbon_gym.errors.LedgerError` on a failure when ``strict``."""
        if self._sim is None:
            raise RuntimeError("call reset() first")
        return self._tally.ledger(self._sim, len(self._pending), self._pue, strict=strict)

    def render(self) -> None:
        """This environment has no rendering."""
        return None

    def close(self) -> None:
        """Release the simulator (and flush streamed records)."""
        self._sim = None
        self._workload = None
        self._done = True
        if self._writer is not None and self._writer.failed is None:
            self._writer.close()


if GeoServeEnv.__doc__:  # the observation feature tables, generated (python -OO strips docstrings)
    GeoServeEnv.__doc__ = GeoServeEnv.__doc__.replace("{FEATURE_TABLES}", features_markdown().replace("\n", "\n    "))
