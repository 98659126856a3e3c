"""Runs of the evaluation: what one episode is (:class:`RunSpec`), its episode start, and
:func:`run_one`, which runs it and records its metrics, per-step and per-request columns.

One *run* is one episode of one policy on one scenario under one seed. For a given
(scenario, seed) every policy sees exactly the same episode: the env is reset with the same seed
(same requests, same lengths) and the episode starts at the same point of the carbon year. The
start is drawn deterministically from (scenario, seed) with a low-discrepancy sequence over
day-of-year x hour-of-day (:func:`episode_start_offset_s`), so a table with a few seeds averages
over seasons and hours rather than one afternoon, and adding seeds never moves the earlier ones.

Policies are built by name from the one registry (:func:`carbon_gym.registry.make_policy`); the
episode is :func:`carbon_gym.policy.run_episode`'s loop with :class:`EpisodeRecorder` observing
it. Everything except the decision (wall-clock) times is a deterministic function of the spec.
Matrices of runs: :mod:`eval.backends`; tables: :mod:`eval.tables`; files: :mod:`eval.writers`.
"""

from __future__ import annotations

import math
import os
import re
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from carbon_gym.episode import LEFT_METRICS, unfinished_requests
from carbon_gym.policy import EpisodeObserver, run_episode
from carbon_gym.registry import canonical_policy_name, make_policy, split_prefix
from carbon_gym.sessions_state import SESSION_METRICS

from eval.estimate_error import error_metrics, estimate_errors
from eval.stats import percentile

__all__ = [
    "RunSpec", "RunResult", "always_on_overrides", "largest_backlog_ages", "largest_window_left", "BACKLOG_AGE_EDGES_S",
    "EpisodeRecorder",
    "make_specs", "fault_twin", "episode_start_offset_s",
    "make_env", "resolve_run_scenario", "run_one", "freeze", "policy_label", "policy_labels", "split_label",
    "scenario_labels", "FAULT_TWIN_SUFFIX", "StepProgress", "episode_steps", "VALID_UNFINISHED_PCT",
]

# scenario override keys (carbon_gym.scenario field names)
OVERRIDE_CARBON_START = "carbon.start_utc"  # ISO-8601 UTC episode start on the carbon trace
OVERRIDE_POLLING = "polling_period_s"
OVERRIDE_PREDICTOR = "env.predictor"
OVERRIDE_DURATION = "duration_s"
SECONDS_PER_DAY = 86400.0
#: A run leaving more than this share of its arrived requests unfinished (in flight when the
#: drain limit ended it, or never placed) is invalid: the energy of that work was never spent,
#: so its carbon is not comparable. Tables mark it and frontiers leave it out.
VALID_UNFINISHED_PCT = 1.0
DAYS_PER_YEAR = 365


# ----------------------------------------------------------------------------------------------
# episode starts (common random numbers across policies)

_PLASTIC = 1.324717957244746  # generalised golden ratio for the 2-D R2 sequence


def episode_start_offset_s(scenario_key: str, seed: int, *, period_s: float = DAYS_PER_YEAR * SECONDS_PER_DAY) -> float:
    """Carbon-trace offset (s since the trace's first hour) at which episode ``seed`` starts.

    Day of year and hour of day follow the 2-D R2 low-discrepancy sequence indexed by ``seed``,
    shifted by a hash of ``scenario_key``, so any number of consecutive seeds spreads evenly
    over seasons and hours, every policy gets the same start for the same (scenario, seed), and
    adding seeds never changes earlier ones. Rounded to the minute; wrapped into ``period_s``.
    """
    h = zlib.crc32(str(scenario_key).encode("utf-8"))
    u0 = (h & 0xFFFF) / 65536.0
    v0 = (h >> 16) / 65536.0
    k = int(seed) + 1
    u = (u0 + k / _PLASTIC) % 1.0  # season
    v = (v0 + k / _PLASTIC**2) % 1.0  # hour of day
    days = max(1, int(period_s // SECONDS_PER_DAY))
    offset = math.floor(u * days) * SECONDS_PER_DAY + v * SECONDS_PER_DAY
    offset = round(offset / 60.0) * 60.0
    return float(offset % period_s) if period_s > 0 else 0.0


# ----------------------------------------------------------------------------------------------
# run specs


def window_overrides(window_s: float, warmup_s: float) -> dict[str, Any]:
    """Scenario overrides of a measurement window: ``window_s`` measured after ``warmup_s``."""
    return {OVERRIDE_DURATION: float(warmup_s) + float(window_s), "env.measure": "window", "env.warmup_s": float(warmup_s)}


def window_of(overrides: Mapping[str, Any]) -> tuple[float, float]:
    """``(burn-in s, measured window s)`` of a matrix's overrides (the window NaN when they set
    no duration): what the experiments' table headers say."""
    warm = float(overrides.get("env.warmup_s", 0.0))
    window = float(overrides[OVERRIDE_DURATION]) - warm if OVERRIDE_DURATION in overrides else float("nan")
    return warm, window


def freeze(mapping: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """A mapping as sorted ``(key, value)`` pairs (for :class:`RunSpec` fields; hashable when the
    values are: a ``faults`` override is a list of tables)."""
    if not mapping:
        return ()
    return tuple(sorted((str(k), v) for k, v in mapping.items()))


#: Ages (s) at which a windowed run counts what it left in flight (:meth:`EpisodeRecorder.backlog_ages`).
BACKLOG_AGE_EDGES_S = (1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


def largest_backlog_ages(runs: Any) -> dict[float, float] | None:
    """{e: the most requests any of ``runs`` left undone at its window's end that may have
    arrived more than e s before it} (``backlog_end_age_gt_<e>s``,
    :meth:`EpisodeRecorder.backlog_ages`),
    or None unless every run has every figure (runs from before them: the plain allowance)."""
    most = _largest_of(runs, [f"backlog_end_age_gt_{e:g}s" for e in BACKLOG_AGE_EDGES_S])
    return None if most is None else {float(e): float(v) for e, v in zip(BACKLOG_AGE_EDGES_S, most)}


def largest_window_left(runs: Any) -> dict[str, float] | None:
    """{figure: the largest of it over ``runs``} for what each windowed run left undone at its
    window's end: the requests not yet placed (``requests_unplaced``) and the work not yet
    computed of those placed (:data:`carbon_gym.episode.LEFT_METRICS`, :meth:`EpisodeTally.window_left
    <carbon_gym.episode.EpisodeTally.window_left>`): each figure at least any run's, so what they
    describe is an upper count for every run; None unless every run has every figure (runs from
    before them: the bound keeps its whole-request allowance)."""
    cols = ["requests_unplaced", *LEFT_METRICS]
    most = _largest_of(runs, cols)
    return None if most is None else {k: float(v) for k, v in zip(cols, most)}


def _largest_of(runs: Any, cols: list[str]) -> np.ndarray | None:
    """The largest of each of ``cols`` over ``runs`` (a runs table), or None unless every run has
    a finite figure in every column."""
    if len(runs) == 0 or not all(c in runs for c in cols):
        return None
    vals = runs[cols].to_numpy(float)
    return vals.max(axis=0) if np.isfinite(vals).all() else None


def always_on_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` for a matrix's always-on reference rows: ``capacity.control = "always_on"``
    and no autoscaler settings (``capacity.params`` or ``capacity.params.<key>``, which only the
    rows that decide capacity read; the simulator refuses them under ``always_on``)."""
    out = {k: v for k, v in overrides.items() if k != "capacity.params" and not str(k).startswith("capacity.params.")}
    out["capacity.control"] = "always_on"
    return out


@dataclass(frozen=True)
class RunSpec:
    """One episode to run: a scenario, a policy (with keyword arguments) and a seed.

    Attributes:
        scenario: shipped scenario name or path to a scenario TOML file.
        policy: policy registry name (``rr``, ``milp``, ``clairvoyant``, ...).
        seed: env seed (workload, lengths) and episode-start index.
        overrides: scenario overrides as sorted ``(dotted.key, value)`` pairs.
        policy_kwargs: keyword arguments of the policy factory as sorted pairs.
        label: name of this policy variant in tables (default: ``policy``).
        scenario_label: name of the scenario variant in tables (default: ``scenario``).
        start_key: key hashed for the episode start (default: ``scenario``); variants of one
            scenario (a sweep) share it so they also share their episode starts.
        carbon_start: whether to override the scenario's carbon start with the sampled one.
        faults: False runs the scenario's fault-free twin (its ``[[faults]]`` removed with
            :func:`carbon_gym.faults.without_faults`); see :func:`fault_twin`.
    """

    scenario: str
    policy: str
    seed: int
    overrides: tuple[tuple[str, Any], ...] = ()
    policy_kwargs: tuple[tuple[str, Any], ...] = ()
    label: str = ""
    scenario_label: str = ""
    start_key: str = ""
    carbon_start: bool = True
    faults: bool = True

    @property
    def policy_name(self) -> str:
        return self.label or self.policy

    @property
    def scenario_name(self) -> str:
        return self.scenario_label or _scenario_stem(self.scenario)

    @property
    def run_id(self) -> str:
        """File-safe id ``<scenario>__<policy>__seed<k>``."""
        return f"{_safe(self.scenario_name)}__{_safe(self.policy_name)}__seed{int(self.seed)}"

    def start_offset_s(self) -> float:
        return episode_start_offset_s(self.start_key or self.scenario_name, self.seed)


#: Table name of a fault scenario's fault-free twin: ``<scenario>`` + this suffix.
FAULT_TWIN_SUFFIX = "+no-faults"


def fault_twin(spec: RunSpec) -> RunSpec:
    """The same run without the scenario's faults: same scenario file, overrides, policy, seed
    and episode start (``start_key`` stays the fault scenario's), labelled
    ``<scenario>+no-faults`` in tables and file names."""
    return replace(spec, faults=False, scenario_label=spec.scenario_name + FAULT_TWIN_SUFFIX,
                   start_key=spec.start_key or spec.scenario_name)


def _scenario_stem(scenario: str) -> str:
    s = str(scenario)
    if s.endswith(".toml") or os.sep in s:
        return os.path.splitext(os.path.basename(s))[0]
    return s


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", str(name)) or "_"



_LABEL = re.compile(r"^([A-Za-z0-9_.+-]+)=(.+)$")


def split_label(text: str) -> tuple[str | None, str]:
    """``"mine=learned:runs/a/best.npz"`` -> ``("mine", "learned:runs/a/best.npz")``: a policy
    given a table name of its own (``NAME=POLICY``); ``(None, text)`` without one."""
    m = _LABEL.match(str(text).strip())
    if m and ":" not in m.group(1):
        return m.group(1), m.group(2).strip()
    return None, str(text).strip()


def policy_label(name: str) -> str:
    """Table name of a policy: its registered (short) name (``facility-milp`` -> ``milp``); a
    prefix form's is ``<prefix>:<file stem>`` (``learned:runs/x/best.npz`` -> ``learned:best``);
    a ``module:Class`` form is its own label; ``NAME=POLICY`` is ``NAME``. (Two checkpoints with
    the same file name get labels by path: :func:`policy_labels`.)"""
    given, name = split_label(name)
    if given:
        return given
    pre = split_prefix(name)
    if pre is not None:
        return f"{pre[0]}:{os.path.splitext(os.path.basename(pre[1]))[0]}"
    return canonical_policy_name(name)


def _path_label(prefix: str, path: str, depth: int) -> str:
    parts = os.path.normpath(os.path.splitext(path)[0]).split(os.sep)
    return f"{prefix}:{'/'.join(parts[-depth:])}"


def policy_labels(policies: Sequence[str]) -> dict[str, str]:
    """Table names of ``policies`` (policy text -> label), distinct: labels as
    :func:`policy_label`, except that prefix forms whose file stems collide (two
    ``learned:<dir>/best.npz``) are labelled by as much of their path as tells them apart
    (``learned:a/best``, ``learned:b/best``), so that two checkpoints are never merged as if
    they were seeds of one policy. A given name (``NAME=POLICY``) that collides is a
    :class:`~carbon_gym.errors.ConfigError`."""
    from carbon_gym.errors import ConfigError

    out = {p: policy_label(p) for p in policies}
    groups: dict[str, list[str]] = {}
    for p, lab in out.items():
        groups.setdefault(lab, []).append(p)
    for lab, members in groups.items():
        distinct = list(dict.fromkeys(split_label(m)[1] for m in members))
        if len(distinct) < 2:
            continue
        if any(split_label(m)[0] for m in members):
            raise ConfigError("policies", f"two policies are named {lab!r}: {', '.join(members)}; give each its own "
                              "name (NAME=POLICY)")
        pres = [split_prefix(split_label(m)[1]) for m in members]
        if any(pr is None for pr in pres):
            raise ConfigError("policies", f"two policies have the table name {lab!r}: {', '.join(members)}; name them "
                              "(NAME=POLICY)")
        for depth in range(2, 64):
            labs = [_path_label(pr[0], pr[1], depth) for pr in pres]
            if len(set(labs)) == len(set(distinct)):
                break
        for m, new in zip(members, labs):
            out[m] = new
    return out


def make_specs(
    scenarios: Sequence[str],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    overrides: Mapping[str, Any] | None = None,
    policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[RunSpec]:
    """The full matrix, ordered scenario -> policy -> seed. ``policy_kwargs`` is per policy name
    (short or long; a prefix form such as ``learned:<path>`` also takes those of its prefix)."""
    pk = {canonical_policy_name(k): v for k, v in (policy_kwargs or {}).items()}
    labels = policy_labels(policies)

    def kw(text: str) -> Any:
        given, p = split_label(text)
        own = pk.get(given) if given else None
        if own is None:
            own = pk.get(canonical_policy_name(p))
        if own is None and split_prefix(p) is not None:
            own = pk.get(split_prefix(p)[0])
        return own

    def label(text: str) -> str:
        given, p = split_label(text)
        return labels[text] if given or split_prefix(p) is not None else ""

    scen_labels = scenario_labels(scenarios)
    return [
        RunSpec(scenario=s, policy=canonical_policy_name(split_label(p)[1]), seed=int(k), overrides=freeze(overrides),
                policy_kwargs=freeze(kw(p)), label=label(p), scenario_label=scen_labels.get(s, ""))
        for s in scenarios
        for p in policies
        for k in seeds
    ]


def scenario_labels(scenarios: Sequence[str]) -> dict[str, str]:
    """Table names of scenario files: the scenario's own ``name`` where it differs from the file
    stem (a file ``runs/x/test3.toml`` with ``name = "llama-eu"`` is ``llama-eu`` in every
    table), unless two of ``scenarios`` share that name (then both keep their stems). Shipped
    names are their own labels (``{}`` for them)."""
    import warnings

    from carbon_gym.scenario import load_scenario

    named: dict[str, str] = {}
    for s in dict.fromkeys(scenarios):
        if not (str(s).endswith(".toml") or os.sep in str(s)):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                name = str(load_scenario(s).name or "")
        except Exception:  # noqa: BLE001 - a bad file fails later, with its own error, when it is run
            continue
        if name and name != _scenario_stem(s):
            named[s] = name
    counts: dict[str, int] = {}
    for s in dict.fromkeys(scenarios):
        lab = named.get(s, _scenario_stem(s))
        counts[lab] = counts.get(lab, 0) + 1
    return {s: lab for s, lab in named.items() if counts[lab] == 1}


# ----------------------------------------------------------------------------------------------
# one run


@dataclass
class RunResult:
    """What one run returns: scalar metrics, per-step and per-request columns (numpy arrays)."""

    spec: RunSpec
    metrics: dict[str, Any]
    steps: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)


ENV_ID = "carbon_gym/GeoServe-v0"


def make_env(scenario: Any) -> Any:
    """The registered env for a :class:`~carbon_gym.scenario.Scenario` (or name), checker off."""
    import gymnasium as gym

    import carbon_gym  # noqa: F401 - registers the env ids

    try:
        return gym.make(ENV_ID, scenario=scenario, disable_env_checker=True)
    except gym.error.Error:  # not registered (yet): construct the class directly
        from carbon_gym.env import GeoServeEnv

        return GeoServeEnv(scenario=scenario)


def resolve_run_scenario(spec: RunSpec) -> tuple[Any, dict[str, Any]]:
    """Load the spec's scenario with its overrides and, unless ``carbon_start`` is off, the
    sampled episode start written into ``carbon.start_utc``; without its faults when
    ``spec.faults`` is False. Returns (scenario, overrides used)."""
    import warnings

    from carbon_gym.faults import without_faults
    from carbon_gym.scenario import load_scenario

    def load(ov: dict[str, Any]) -> Any:
        sc = load_scenario(spec.scenario, ov)
        return sc if spec.faults else without_faults(sc)

    overrides = dict(spec.overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # e.g. provisional load levels: reported once by the CLI
        scenario = load(overrides)
        if spec.carbon_start and OVERRIDE_CARBON_START not in overrides:
            from datetime import timedelta

            from carbon_gym.world import carbon_trace_of

            trace = carbon_trace_of(scenario)  # (the scenario's own start may lie outside a user file's year)
            offset = episode_start_offset_s(spec.start_key or spec.scenario_name, spec.seed, period_s=trace.period_s)
            start = trace.start_utc + timedelta(seconds=offset)
            overrides[OVERRIDE_CARBON_START] = start.strftime("%Y-%m-%dT%H:%M:%SZ")
            scenario = load(overrides)
    return scenario, overrides


#: Per-step columns of :class:`EpisodeRecorder`, in file order (then ``carbon_g_dc<d>`` and
#: ``intensity_g_per_kwh_dc<d>`` per datacenter).
STEP_COLUMNS = (
    "step", "time_s", "carbon_g", "cumulative_carbon_g", "energy_j", "arrived", "placed", "deferred",
    "overflow", "pending", "completed", "violations", "violation_rate", "ttft_p50_s", "ttft_p99_s",
    "tpot_p50_s", "tpot_p99_s", "decision_s", "reward", "failed_over")


class EpisodeRecorder(EpisodeObserver):
    """Per-step and per-request recording of one episode (an observer of
    :func:`carbon_gym.policy.run_episode`).

    Per step (:data:`STEP_COLUMNS`): ``step``, ``time_s`` (end of the step), the env's step
    ``info`` counters, the decision wall time, latency percentiles of the step's completions,
    cumulative carbon and violation rate; per datacenter ``carbon_g_dc<d>`` (emitted in the
    step) and ``intensity_g_per_kwh_dc<d>`` (grid intensity at the step's start), and under
    capacity control (``capacity.control`` other than ``always_on``) ``servers_on_dc<d>`` (nodes
    powered) and ``awake_engines_dc<d>`` at the step's end. Per request:
    the simulator's ``RequestRecords`` of every completion (when ``keep_requests``).
    """

    def __init__(self, keep_requests: bool = True, keep_latency: bool = False) -> None:
        self.keep_requests = bool(keep_requests)
        # (without the full records) the columns the estimate check joins on
        self.keep_latency = bool(keep_latency) and not self.keep_requests
        self._lat_parts: list[dict[str, np.ndarray]] = []
        self.cols: dict[str, list] = {k: [] for k in STEP_COLUMNS}
        self._dc_carbon_rows: list[np.ndarray] = []
        self._intensity_rows: list[np.ndarray] = []
        self._capacity_rows: list[np.ndarray] = []
        self._record_capacity = False
        self._req_parts: list[dict[str, np.ndarray]] = []
        self._done_ids: list[np.ndarray] = []
        self._ingested: list[tuple[float, int]] = []  # (sim time after the step, requests the step took in)

    def on_reset(self, env: Any, observation: Any, info: dict[str, Any]) -> None:
        u = env.unwrapped
        self._u = u
        sim = u.simulator
        self.trace = sim.carbon
        self.datacenters = sim.topology.datacenters
        self._zone_idx = np.array([self.trace.zone_index(d.zone) for d in self.datacenters], dtype=np.int64)
        self.n_dc = len(self.datacenters)
        self._capacity_rows = []
        self._record_capacity = str(u.scenario.capacity.control) != "always_on"
        self.offset_s = float(sim.carbon_offset_s)
        self._prev_dc_carbon = np.asarray(sim.totals().carbon_g, dtype=np.float64).copy()
        self._cum_carbon = float(info.get("carbon_g", 0.0))  # the reset's first (idle) polling period
        self.reset_carbon_g = self._cum_carbon
        self._completed_total = 0
        self._violations_total = 0
        self._done_ids, self._ingested = [], []
        self._polling_s = float(u.scenario.polling_period_s)

    def before_step(self, env: Any, step: int) -> None:
        t_start = float(self._u.simulator.now_s)
        self._intensity_rows.append(self.trace.intensity_all(self.offset_s + t_start)[self._zone_idx])

    def after_step(self, env: Any, step: int, action: Any, reward: float, terminated: bool, truncated: bool,
                   info: dict[str, Any], decision_s: float) -> None:
        u = self._u
        sim = u.simulator
        recs = u.last_completed
        n_done = int(info.get("completed", 0))
        viol = int(info.get("violations", 0))
        self._completed_total += n_done
        self._violations_total += viol
        self._cum_carbon += float(info["carbon_g"])
        dc_now = np.asarray(sim.totals().carbon_g, dtype=np.float64)
        self._dc_carbon_rows.append(dc_now - self._prev_dc_carbon)
        self._prev_dc_carbon = dc_now.copy()
        if self._record_capacity:
            dcs = u.state().datacenters
            self._capacity_rows.append(np.concatenate([dcs.servers_on, dcs.awake_engines]).astype(np.int64))
        self._ingested.append((float(sim.now_s), int(info.get("arrived", 0))))
        if recs is not None and len(recs):
            self._done_ids.append(np.asarray(recs.request_id, dtype=np.int64))
            ttft, tpot = recs.ttft_s, recs.tpot_s
            if self.keep_requests:
                self._req_parts.append(recs.to_dict())
            elif self.keep_latency:
                self._lat_parts.append({"arrival_s": np.asarray(recs.arrival_s), "origin": np.asarray(recs.origin),
                                        "ttft_s": np.asarray(ttft), "tpot_s": np.asarray(tpot)})
        else:
            ttft = tpot = np.zeros(0)
        done, vt = self._completed_total, self._violations_total
        cols = self.cols
        for k, v in (
            ("step", step), ("time_s", float(info.get("time_s", sim.now_s))), ("carbon_g", float(info["carbon_g"])),
            ("cumulative_carbon_g", self._cum_carbon), ("energy_j", float(info["energy_j"])),
            ("arrived", int(info.get("arrived", 0))), ("placed", int(info.get("placed", 0))),
            ("deferred", int(info.get("deferred", 0))), ("overflow", int(info.get("overflow", 0))),
            ("pending", int(info.get("pending", 0))), ("completed", n_done), ("violations", viol),
            ("violation_rate", vt / done if done else float("nan")),
            ("ttft_p50_s", percentile(ttft, 50)), ("ttft_p99_s", percentile(ttft, 99)),
            ("tpot_p50_s", percentile(tpot, 50)), ("tpot_p99_s", percentile(tpot, 99)),
            ("decision_s", decision_s), ("reward", float(reward)), ("failed_over", int(info.get("failed_over", 0))),
        ):
            cols[k].append(v)

    def steps(self) -> dict[str, np.ndarray]:
        """The per-step columns (numpy arrays)."""
        out: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in self.cols.items()}
        dc_c = np.vstack(self._dc_carbon_rows) if self._dc_carbon_rows else np.zeros((0, self.n_dc))
        ci = np.vstack(self._intensity_rows) if self._intensity_rows else np.zeros((0, self.n_dc))
        for d in range(self.n_dc):
            out[f"carbon_g_dc{d}"] = dc_c[:, d]
            out[f"intensity_g_per_kwh_dc{d}"] = ci[:, d]
        if self._capacity_rows:
            cap = np.vstack(self._capacity_rows)
            for d in range(self.n_dc):
                out[f"servers_on_dc{d}"] = cap[:, d]
            for d in range(self.n_dc):
                out[f"awake_engines_dc{d}"] = cap[:, self.n_dc + d]
        return out

    def backlog_ages(self, arrived_total: int, left_total: int) -> dict[str, float]:
        """``backlog_end_age_gt_<e>s`` for e in :data:`BACKLOG_AGE_EDGES_S`: how many requests left
        in flight or pending at the episode's end *may* have arrived more than e seconds before it
        (an upper count: a request taken in by a step arrived within that step's polling period, so
        it counts when the period's start is more than e s before the end). Requests are numbered in
        the order the env takes them in (``request_id``), ``arrived_total`` of them in the episode;
        the steps' ``arrived`` say which step took each in, the reset (the first polling period) the
        rest. Empty when the records do not fit that numbering or leave another count than
        ``left_total`` unfinished (then the bound keeps its plain window-end allowance). The
        SLO-true bound (:mod:`eval.bound_slo`) uses them to restrict which arrivals its allowance
        may leave undone."""
        ids = np.concatenate(self._done_ids) if self._done_ids else np.zeros(0, dtype=np.int64)
        per_step = np.array([n for _, n in self._ingested], dtype=np.int64)
        first = int(arrived_total) - int(per_step.sum())
        if first < 0 or (ids.size and (ids.min() < 0 or ids.max() >= arrived_total)) or np.unique(ids).size != ids.size:
            return {}
        done = np.zeros(int(arrived_total), dtype=bool)
        done[ids] = True
        left = np.flatnonzero(~done)
        if left.size != int(left_total):
            return {}
        # the end of the polling period in which each request arrived (the reset's: one period in)
        ends = np.array([self._polling_s] + [t for t, _ in self._ingested])
        period_end = ends[np.searchsorted(np.cumsum(np.concatenate([[first], per_step])), left, side="right")]
        t_end = ends[-1]
        oldest_possible_age = t_end - (period_end - self._polling_s)
        return {f"backlog_end_age_gt_{e:g}s": float(np.sum(oldest_possible_age > e)) for e in BACKLOG_AGE_EDGES_S}

    def requests(self) -> dict[str, np.ndarray]:
        """The per-request columns (empty dict unless ``keep_requests``)."""
        if not self.keep_requests:
            return {}
        if self._req_parts:
            return {k: np.concatenate([p[k] for p in self._req_parts]) for k in self._req_parts[0]}
        from carbon_gym.sim.records import RequestRecords

        return RequestRecords.empty().to_dict()

    def latency(self) -> dict[str, np.ndarray]:
        """Arrival time, origin, TTFT and TPOT of every completion (from the full records when
        kept, else from the light copy kept with ``keep_latency``)."""
        parts = self._req_parts or self._lat_parts
        keys = ("arrival_s", "origin", "ttft_s", "tpot_s")
        if not parts:
            return {k: np.zeros(0) for k in keys}
        return {k: np.concatenate([p[k] for p in parts]) for k in keys}


#: Episode metrics of capacity control copied into the run's row (with the energy_kwh_<state> ones).
CAPACITY_METRICS = ("mean_awake_engines", "mean_servers_on", "capacity_decisions", "engine_wakes", "server_boots",
                    "engine_sleeps", "capacity_waits")


def _policy_stats(policy: Any) -> dict[str, float]:
    """The policy's own episode figures (an optional ``episode_stats()`` method, e.g. the
    facility MILP's solves, work-limited solves and gaps) as run metrics ``policy_<key>``;
    wall-clock ones (keys starting ``wall_``) as ``wall_policy_<rest>`` so that every
    reproducibility check (:data:`eval.tables.NONDETERMINISTIC_PREFIXES`) leaves them out."""
    fn = getattr(policy, "episode_stats", None)
    if not callable(fn):
        return {}
    out: dict[str, float] = {}
    for k, v in dict(fn()).items():
        name = f"wall_policy_{k[len('wall_'):]}" if str(k).startswith("wall_") else f"policy_{k}"
        out[name] = float(v)
    return out


class StepProgress(EpisodeObserver):
    """Reports the steps done so far to ``report(steps)`` at most every ``every_s`` seconds of
    wall time (for a progress bar that moves inside long runs); reads nothing else."""

    def __init__(self, report: Any, every_s: float = 0.5) -> None:
        self.report = report
        self.every_s = float(every_s)
        self._last = time.perf_counter()

    def after_step(self, env: Any, step: int, action: Any, reward: float, terminated: bool, truncated: bool,
                   info: dict[str, Any], decision_s: float) -> None:
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            self.report(step + 1)


def episode_steps(spec: RunSpec) -> int:
    """Env steps of ``spec``'s episode: ceil(duration / polling period) of its scenario."""
    import warnings

    from carbon_gym.scenario import load_scenario

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc = load_scenario(spec.scenario, dict(spec.overrides))
    return max(1, int(math.ceil(float(sc.duration_s) / float(sc.polling_period_s) - 1e-9)))


def run_one(spec: RunSpec, *, keep_requests: bool = True, observers: Sequence[EpisodeObserver] = ()) -> RunResult:
    """Run one episode of ``spec`` and collect its metrics and records.

    The policy is built by name (:func:`carbon_gym.registry.make_policy`) before ``env.reset``;
    the episode is :func:`carbon_gym.policy.run_episode` (``policy.reset(env)`` after
    ``env.reset``, ``policy.act`` timed outside the env) observed by an :class:`EpisodeRecorder`
    and then ``observers`` (extra read-only hooks, e.g. a test capturing the final ``info``).
    """
    import warnings

    wall0 = time.perf_counter()
    cpu0 = time.process_time()
    scenario, overrides = resolve_run_scenario(spec)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = make_env(scenario)
    try:
        policy = make_policy(spec.policy, env, **dict(spec.policy_kwargs))
        logs_estimates = callable(getattr(policy, "episode_estimates", None))
        rec = EpisodeRecorder(keep_requests, keep_latency=logs_estimates)
        max_steps = int(getattr(env.unwrapped, "max_episode_steps", 10**9))
        ep = run_episode(env, policy, seed=int(spec.seed), max_steps=max_steps + 1, observers=[rec, *observers])
        if not ep.ended:
            raise RuntimeError(f"episode did not end after {ep.steps} steps (max_episode_steps={max_steps})")
        em = dict(ep.info["episode_metrics"])
        policy_stats = _policy_stats(policy)
        if logs_estimates:
            # the scheduler's TTFT / TPOT estimates against the simulator's (eval.estimate_error)
            errors = estimate_errors(policy.episode_estimates(), rec.latency(),
                                     float(em["window_start_s"]) if em.get("measure") == "window" else -np.inf)
            policy_stats.update(error_metrics(errors))
    finally:
        env.close()

    steps = rec.steps()
    requests = rec.requests()
    ttft_target = float(scenario.ttft_s)
    tpot_target = float(scenario.tpot_s)
    dec = steps["decision_s"].astype(np.float64)
    ledger = dict(em.get("ledger") or {})
    arrived = int(em.get("arrived", 0))
    windowed = em.get("measure") == "window"
    unfinished = unfinished_requests(em)
    vr = em.get("violation_rate", float("nan"))
    metrics: dict[str, Any] = {
        "carbon_g": float(em["carbon_g"]),
        "energy_kwh": float(em["energy_kwh"]),
        "it_energy_kwh": float(em.get("it_energy_kwh", float("nan"))),
        "ttft_p50_s": float(em["ttft_p50_s"]), "ttft_p90_s": float(em["ttft_p90_s"]), "ttft_p99_s": float(em["ttft_p99_s"]),
        "tpot_p50_s": float(em["tpot_p50_s"]), "tpot_p90_s": float(em["tpot_p90_s"]), "tpot_p99_s": float(em["tpot_p99_s"]),
        "slo_violation_pct": 100.0 * float(vr),
        "ttft_violation_pct": 100.0 * float(em.get("ttft_violation_rate", float("nan"))),
        "tpot_violation_pct": 100.0 * float(em.get("tpot_violation_rate", float("nan"))),
        # MLPerf's latency criterion (per run): p99 TTFT and p99 TPOT within the scenario's targets
        "mlperf_p99_pass": bool(float(em["ttft_p99_s"]) <= ttft_target and float(em["tpot_p99_s"]) <= tpot_target),
        "mlperf_ttft_p99_pass": bool(float(em["ttft_p99_s"]) <= ttft_target),
        "mlperf_tpot_p99_pass": bool(float(em["tpot_p99_s"]) <= tpot_target),
        "requests_arrived": arrived,
        "requests_completed": int(em.get("completed", 0)),
        "requests_in_flight": int(em.get("in_flight_at_truncation", 0)),
        "requests_unplaced": int(em.get("unplaced_at_end", 0)),
        "unfinished_pct": 100.0 * unfinished / arrived if arrived else 0.0,
        # a run that leaves work unfinished did not pay for it: invalid (its carbon flatters it)
        "run_valid": bool((100.0 * unfinished / arrived if arrived else 0.0) <= VALID_UNFINISHED_PCT),
        "slo_violations": int(em.get("violations", 0)),
        "deferred_slot_steps": int(em.get("deferred", 0)),
        "invalid_actions": int(em.get("invalid_actions", 0)),
        # faults (carbon_gym.faults): counts and wasted work of requests aborted by outages
        "scenario_faults": len(getattr(scenario, "faults", ()) or ()),
        "failed_over": int(em.get("failed_over", 0)),
        "failed_over_completed": int(em.get("failed_over_completed", 0)),
        "wasted_energy_kj": float(ledger.get("wasted_energy_j", float("nan"))) / 1e3,
        "wasted_carbon_g": float(ledger.get("wasted_carbon_g", float("nan"))),
        "ledger_ok": bool(ledger.get("ok", False)),  # no ledger reported: not shown as balanced
        "steps": int(em.get("steps", ep.steps)),
        "decision_mean_s": float(dec.mean()) if dec.size else 0.0,
        "decision_p95_s": float(np.percentile(dec, 95)) if dec.size else 0.0,
        "decision_max_s": float(dec.max()) if dec.size else 0.0,
        "wall_s": time.perf_counter() - wall0,
        "cpu_s": time.process_time() - cpu0,
    }
    metrics.update(policy_stats)
    # capacity control (carbon_gym.control): facility energy by power state, awake capacity, events
    metrics.update({k: v for k, v in em.items() if k in CAPACITY_METRICS or k.startswith("energy_kwh_")})
    # prefix caches and sessions (prefix workloads only: carbon_gym.sessions_state)
    metrics.update({k: v for k, v in em.items() if k in SESSION_METRICS and np.isscalar(v)})
    if windowed:
        metrics.update({"window_start_s": float(em["window_start_s"]), "window_s": float(em["window_s"]),
                        "backlog_start": int(em["backlog_start"]), "backlog_end": int(em["backlog_end"])})
        metrics.update(rec.backlog_ages(int(ledger.get("arrived", -1)), int(em["backlog_end"])))
        metrics.update({k: float(em[k]) for k in LEFT_METRICS if k in em})
    dcs, trace, offset = rec.datacenters, rec.trace, rec.offset_s
    meta = {
        "datacenters": [d.name for d in dcs],
        "zones": [d.zone for d in dcs],
        "start_utc": overrides.get(OVERRIDE_CARBON_START, scenario.carbon.start_utc),
        # seconds since a UTC midnight at which the episode starts (for hour-of-day plots)
        "start_offset_s": float(offset + trace.start_utc.hour * 3600 + trace.start_utc.minute * 60 + trace.start_utc.second),
        "carbon_offset_s": offset,
        "ttft_target_s": ttft_target,
        "tpot_target_s": tpot_target,
        "polling_period_s": float(scenario.polling_period_s),
        "duration_s": float(scenario.duration_s),
        "rate_per_s": float(scenario.rate_per_s),
        "reset_carbon_g": rec.reset_carbon_g,
        "world_seed": em.get("world_seed"),
        "dc_carbon_g": [float(x) for x in np.asarray(em.get("dc_carbon_g", []), dtype=float)],
        "dc_placed": [int(x) for x in np.asarray(em.get("dc_placed", []))],
        **({"dc_prefix_hit_rate": [float(x) for x in em["dc_prefix_hit_rate"]]} if "dc_prefix_hit_rate" in em else {}),
        "warnings": list(dict.fromkeys(str(w.message) for w in caught)),
    }
    return RunResult(spec=spec, metrics=metrics, steps=steps, requests=requests, meta=meta)

