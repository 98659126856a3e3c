"""Evaluation harness: run a (scenario x policy x seed) matrix with common random numbers.

One *run* is one episode of one policy on one scenario under one seed. For a given
(scenario, seed) every policy sees exactly the same episode: the env is reset with the same seed
(same requests, same lengths) and the episode starts at the same point of the carbon year. The
start is drawn deterministically from (scenario, seed) with a low-discrepancy sequence over
day-of-year x hour-of-day (:func:`episode_start_offset_s`), so a table with a few seeds averages
over seasons and hours rather than one afternoon, and adding seeds never moves the earlier ones.

Outputs of :func:`run_matrix` + :func:`write_outputs` (under ``out``):

``summary.csv`` / ``summary.md``
    one row per (scenario, policy): means over seeds with 95% t-intervals (``*_ci95`` = half
    width), carbon reduction vs round-robin computed per seed from the *same seeds'* round-robin
    runs, SLO violation rate (per request), the MLPerf p99 verdict (share of seeds whose p99 TTFT
    and p99 TPOT are within the targets), decision time.
``runs.csv``
    one row per run (the per-seed numbers behind the summary).
``requests/<scenario>__<policy>__seed<k>.parquet`` (``.csv`` if pyarrow is missing)
    one row per completed request (the simulator's ``RequestRecords`` fields).
``steps/<scenario>__<policy>__seed<k>.parquet``
    one row per env step: carbon, energy, completions, violations, latencies, decision time,
    per-datacenter carbon and grid intensity.
``config.json``
    the command, the run specs, episode starts, package versions.
``fault_report.csv`` / ``fault_report.md`` / ``fault_runs.csv`` (:func:`write_fault_report`)
    for scenarios with ``[[faults]]`` run together with their fault-free twins
    (:func:`fault_twin`): per (scenario, policy), requests failed over, SLO violations, carbon and
    p99 TTFT with and without the faults, the differences, ledger balanced; per seed in
    ``fault_runs.csv``. Runs of fault scenarios also carry the fault counters (``failed_over``,
    ``failed_over_completed``, ``wasted_energy_kj``, ``wasted_carbon_g``, ``ledger_ok``) in
    ``runs.csv``, their means in ``summary.csv``/``.md``, and ``failed_over`` per step.

Everything except the decision (wall-clock) times is a deterministic function of the specs, so
re-running reproduces ``summary.csv`` bit for bit in every column not starting with
``decision_``. The local (process pool) and Ray backends run the same :func:`run_one` and the
driver orders results by spec, so both give the same tables.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from solvers import POLICY_ALIASES as SOLVER_ALIASES

REFERENCE_POLICY = "rr"

# scenario override keys (carbon_gym.scenario field names)
OVERRIDE_CARBON_START = "carbon.start_utc"  # ISO-8601 UTC episode start on the carbon trace
OVERRIDE_POLLING = "polling_period_s"
OVERRIDE_PREDICTOR = "env.predictor"
OVERRIDE_DURATION = "duration_s"
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
DAYS_PER_YEAR = 365

# Two-sided 95% Student-t critical values for df = 1..30.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)


# ----------------------------------------------------------------------------------------------
# statistics


def t_critical_95(df: int) -> float:
    """Two-sided 95% critical value of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        return float("nan")
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.959963984540054
    # Cornish-Fisher expansion; error < 1e-4 for df > 30.
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(values: Iterable[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% t-interval of the mean (NaN half-width for n < 2).

    NaN entries are ignored (e.g. a latency percentile of a run with no completed request).
    """
    x = np.asarray([v for v in values], dtype=np.float64)
    x = x[np.isfinite(x)]
    n = x.size
    if n == 0:
        return float("nan"), float("nan")
    m = float(x.mean())
    if n < 2:
        return m, float("nan")
    sd = float(x.std(ddof=1))
    return m, t_critical_95(n - 1) * sd / math.sqrt(n)


def percentile(x: np.ndarray, q: float) -> float:
    """``np.percentile`` (linear) that returns NaN for an empty array."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.percentile(x, q)) if x.size else float("nan")


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


def _freeze(mapping: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    if not mapping:
        return ()
    return tuple(sorted((str(k), v) for k, v in mapping.items()))


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


def make_specs(
    scenarios: Sequence[str],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    overrides: Mapping[str, Any] | None = None,
    policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[RunSpec]:
    """The full matrix, ordered scenario -> policy -> seed. ``policy_kwargs`` is per policy name."""
    pk = {canonical_policy(k): v for k, v in (policy_kwargs or {}).items()}

    def kw(p: str) -> Any:
        return pk.get(canonical_policy(p), pk.get("learned") if is_learned(p) else None)

    return [
        RunSpec(scenario=s, policy=canonical_policy(p), seed=int(k), overrides=_freeze(overrides), policy_kwargs=_freeze(kw(p)),
                label=learned_label(p) if is_learned(p) and p != "learned" else "")
        for s in scenarios
        for p in policies
        for k in seeds
    ]


# ----------------------------------------------------------------------------------------------
# policies


# Short names used in tables and on the command line -> names in solvers' registry. Either
# form is accepted everywhere; tables and files use the short one.
POLICY_ALIASES = SOLVER_ALIASES  # short names -> registry names (one table, in solvers)
_SHORT = {v: k for k, v in POLICY_ALIASES.items()}

# the study's comparison (experiment a's default policy list)
STUDY_POLICIES = ("rr", "greedy", "least-loaded", "planner", "ilp", "ilp-state", "milp")


def canonical_policy(name: str) -> str:
    """Short table name of a policy (``facility-milp`` -> ``milp``); unknown names unchanged."""
    return _SHORT.get(name, name)


def solver_policy_name(name: str) -> str:
    """Name of a policy in solvers' registry (``milp`` -> ``facility-milp``)."""
    return POLICY_ALIASES.get(name, name)


def local_policies() -> dict[str, Callable[..., Any]]:
    """Policies defined in ``eval`` itself (not in ``solvers``): name -> factory(env, **kw)."""
    from eval.experiments import ClairvoyantPolicy

    return {"clairvoyant": lambda env, **kw: ClairvoyantPolicy(**kw)}


def _solver_registry() -> list[str] | None:
    try:
        from solvers import available_policies as solver_policies
    except ImportError:
        return None
    return list(solver_policies())


def available_policies() -> list[str]:
    """Every policy name the harness can run (short names: solvers' registry + eval's own)."""
    names = [canonical_policy(n) for n in (_solver_registry() or [])]
    if REFERENCE_POLICY in names:
        names.remove(REFERENCE_POLICY)
    names.insert(0, REFERENCE_POLICY)
    for n in local_policies():
        if n not in names:
            names.append(n)
    return names


def default_policies() -> list[str]:
    """What ``--policies all`` means: every registered scheduler (not the clairvoyant bound;
    learned agents are named explicitly)."""
    return [n for n in available_policies() if n not in local_policies()]


LEARNED_PREFIXES = ("learned:", "ppo:")


def is_learned(name: str) -> bool:
    """``learned`` (the shipped checkpoint), ``learned:<path>`` or ``ppo:<path>`` (train/)."""
    return name == "learned" or str(name).startswith(LEARNED_PREFIXES)


def learned_label(name: str) -> str:
    """Table name of a learned policy: ``learned`` or ``learned:<checkpoint stem>``."""
    if name == "learned":
        return name
    prefix, _, path = name.partition(":")
    return f"{prefix}:{os.path.splitext(os.path.basename(path))[0]}"


def make_policy(name: str, env: Any, **kwargs: Any) -> Any:
    """Build policy ``name`` (short or solvers' name, or a learned checkpoint) for ``env``."""
    name = canonical_policy(name)
    local = local_policies()
    if name in local:
        return local[name](env, **kwargs)
    if is_learned(name):
        from train.policy import make_learned_policy

        return make_learned_policy(name, env, **kwargs)
    if _solver_registry() is not None:
        from solvers import make_policy as solver_make_policy

        return solver_make_policy(solver_policy_name(name), env, **kwargs)
    if name == REFERENCE_POLICY:
        from carbon_gym.policy import RoundRobinPolicy

        return RoundRobinPolicy(**kwargs)
    from carbon_gym.errors import ConfigError

    raise ConfigError("policy", f"unknown policy {name!r} (solvers package not importable)", allowed=available_policies())


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

            from carbon_gym.world import build_carbon

            trace, _ = build_carbon(scenario)
            offset = episode_start_offset_s(spec.start_key or spec.scenario_name, spec.seed, period_s=trace.period_s)
            start = trace.start_utc + timedelta(seconds=offset)
            overrides[OVERRIDE_CARBON_START] = start.strftime("%Y-%m-%dT%H:%M:%SZ")
            scenario = load(overrides)
    return scenario, overrides


def run_one(spec: RunSpec, *, keep_requests: bool = True) -> RunResult:
    """Run one episode of ``spec`` and collect its metrics and records.

    The loop is :func:`carbon_gym.policy.rollout`'s (``policy.reset(env)`` after ``env.reset``,
    ``policy.act`` timed outside the env) with per-step and per-request recording added. Per-step
    records: ``step``, ``time_s`` (end of the step), the env's step ``info`` counters, the
    decision wall time, latency percentiles of the step's completions, cumulative carbon and
    violation rate, and per datacenter ``carbon_g_dc<d>`` (emitted in the step) and
    ``intensity_g_per_kwh_dc<d>`` (grid intensity at the step's start).
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
        obs, info = env.reset(seed=int(spec.seed))
        u = env.unwrapped
        reset_fn = getattr(policy, "reset", None)
        if callable(reset_fn):
            reset_fn(env)
        sim = u.simulator
        trace = sim.carbon
        dcs = sim.topology.datacenters
        zone_idx = np.array([trace.zone_index(d.zone) for d in dcs], dtype=np.int64)
        n_dc = len(dcs)
        offset = float(sim.carbon_offset_s)
        ttft_target = float(scenario.ttft_s)
        tpot_target = float(scenario.tpot_s)

        cols: dict[str, list] = {k: [] for k in (
            "step", "time_s", "carbon_g", "cumulative_carbon_g", "energy_j", "arrived", "placed", "deferred",
            "overflow", "pending", "completed", "violations", "violation_rate", "ttft_p50_s", "ttft_p99_s",
            "tpot_p50_s", "tpot_p99_s", "decision_s", "reward", "failed_over")}
        dc_carbon_rows: list[np.ndarray] = []
        intensity_rows: list[np.ndarray] = []
        req_parts: list[dict[str, np.ndarray]] = []
        prev_dc_carbon = np.asarray(sim.totals().carbon_g, dtype=np.float64).copy()
        cum_carbon = float(info.get("carbon_g", 0.0))  # the reset's first (idle) polling period
        pre_carbon_g = cum_carbon
        completed_total = 0
        violations_total = 0
        step = 0
        ended = False
        max_steps = int(getattr(u, "max_episode_steps", 10**9))
        while step < max_steps + 1:
            t_start = float(sim.now_s)
            intensity_rows.append(trace.intensity_all(offset + t_start)[zone_idx])
            t0 = time.perf_counter()
            action = policy.act(obs, info)
            dt = time.perf_counter() - t0
            obs, reward, terminated, truncated, info = env.step(action)
            sim = u.simulator
            recs = u.last_completed
            n_done = int(info.get("completed", 0))
            viol = int(info.get("violations", 0))
            completed_total += n_done
            violations_total += viol
            cum_carbon += float(info["carbon_g"])
            dc_now = np.asarray(sim.totals().carbon_g, dtype=np.float64)
            dc_carbon_rows.append(dc_now - prev_dc_carbon)
            prev_dc_carbon = dc_now.copy()
            if recs is not None and len(recs):
                ttft, tpot = recs.ttft_s, recs.tpot_s
                if keep_requests:
                    req_parts.append(recs.to_dict())
            else:
                ttft = tpot = np.zeros(0)
            for k, v in (
                ("step", step), ("time_s", float(info.get("time_s", sim.now_s))), ("carbon_g", float(info["carbon_g"])),
                ("cumulative_carbon_g", cum_carbon), ("energy_j", float(info["energy_j"])),
                ("arrived", int(info.get("arrived", 0))), ("placed", int(info.get("placed", 0))),
                ("deferred", int(info.get("deferred", 0))), ("overflow", int(info.get("overflow", 0))),
                ("pending", int(info.get("pending", 0))), ("completed", n_done), ("violations", viol),
                ("violation_rate", violations_total / completed_total if completed_total else float("nan")),
                ("ttft_p50_s", percentile(ttft, 50)), ("ttft_p99_s", percentile(ttft, 99)),
                ("tpot_p50_s", percentile(tpot, 50)), ("tpot_p99_s", percentile(tpot, 99)),
                ("decision_s", dt), ("reward", float(reward)), ("failed_over", int(info.get("failed_over", 0))),
            ):
                cols[k].append(v)
            step += 1
            if terminated or truncated:
                ended = True
                break
        if not ended:
            raise RuntimeError(f"episode did not end after {step} steps (max_episode_steps={max_steps})")
        em = dict(info["episode_metrics"])
    finally:
        env.close()

    steps: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in cols.items()}
    dc_c = np.vstack(dc_carbon_rows) if dc_carbon_rows else np.zeros((0, n_dc))
    ci = np.vstack(intensity_rows) if intensity_rows else np.zeros((0, n_dc))
    for d in range(n_dc):
        steps[f"carbon_g_dc{d}"] = dc_c[:, d]
        steps[f"intensity_g_per_kwh_dc{d}"] = ci[:, d]
    requests: dict[str, np.ndarray] = {}
    if keep_requests and req_parts:
        requests = {k: np.concatenate([p[k] for p in req_parts]) for k in req_parts[0]}
    elif keep_requests:
        from carbon_gym.sim.records import RequestRecords

        requests = RequestRecords.empty().to_dict()

    dec = steps["decision_s"].astype(np.float64)
    ledger = dict(em.get("ledger") or {})
    arrived = int(em.get("arrived", 0))
    unfinished = int(em.get("in_flight_at_truncation", 0)) + int(em.get("unplaced_at_end", 0))
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
        "mlperf_p99_pass": bool(float(em["ttft_p99_s"]) <= ttft_target and float(em["tpot_p99_s"]) <= tpot_target),
        "requests_arrived": arrived,
        "requests_completed": int(em.get("completed", 0)),
        "requests_in_flight": int(em.get("in_flight_at_truncation", 0)),
        "requests_unplaced": int(em.get("unplaced_at_end", 0)),
        "unfinished_pct": 100.0 * unfinished / arrived if arrived else 0.0,
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
        "steps": int(em.get("steps", step)),
        "decision_mean_s": float(dec.mean()) if dec.size else 0.0,
        "decision_p95_s": float(np.percentile(dec, 95)) if dec.size else 0.0,
        "decision_max_s": float(dec.max()) if dec.size else 0.0,
        "wall_s": time.perf_counter() - wall0,
        "cpu_s": time.process_time() - cpu0,
    }
    dc_names = [d.name for d in dcs]
    meta = {
        "datacenters": dc_names,
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
        "reset_carbon_g": pre_carbon_g,
        "world_seed": em.get("world_seed"),
        "dc_carbon_g": [float(x) for x in np.asarray(em.get("dc_carbon_g", []), dtype=float)],
        "dc_placed": [int(x) for x in np.asarray(em.get("dc_placed", []))],
        "warnings": list(dict.fromkeys(str(w.message) for w in caught)),
    }
    return RunResult(spec=spec, metrics=metrics, steps=steps, requests=requests, meta=meta)


class WorkerError(Exception):
    """A picklable stand-in for an exception raised in a worker process or on a Ray node.

    (Some exception types, e.g. ones with required constructor arguments, cannot be unpickled,
    which would break the process pool.) ``kind`` is ``"config"`` for
    :class:`~carbon_gym.errors.ConfigError`, ``"carbon_gym"`` for other documented carbon_gym
    errors, ``"other"`` otherwise; ``traceback`` is the worker's formatted traceback.
    """

    def __init__(self, kind: str, type_name: str, message: str, traceback: str = ""):
        super().__init__(kind, type_name, message, traceback)
        self.kind = kind
        self.type_name = type_name
        self.message = message
        self.traceback = traceback

    def __str__(self) -> str:
        return self.message if self.kind != "other" else f"{self.type_name}: {self.message}"


def _wrap_exception(exc: BaseException) -> WorkerError:
    import traceback

    from carbon_gym.errors import CarbonGymError, ConfigError

    kind = "config" if isinstance(exc, ConfigError) else "carbon_gym" if isinstance(exc, CarbonGymError) else "other"
    return WorkerError(kind, type(exc).__name__, str(exc), "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def _run_one_worker(spec: RunSpec, keep_requests: bool) -> RunResult:
    """Top-level (picklable) entry point for process-pool and Ray workers; errors come back as
    :class:`WorkerError`."""
    try:
        return run_one(spec, keep_requests=keep_requests)
    except Exception as exc:  # noqa: BLE001 - re-raised in the driver as RunFailed
        raise _wrap_exception(exc) from None


# ----------------------------------------------------------------------------------------------
# the matrix


class RunFailed(RuntimeError):
    """A run of the matrix raised; the message names the run and the original error."""

    def __init__(self, spec: RunSpec, exc: BaseException):
        self.spec = spec
        self.original = exc
        name = exc.type_name if isinstance(exc, WorkerError) else type(exc).__name__
        super().__init__(f"run {spec.run_id} failed: {name}: {exc}")

    @property
    def kind(self) -> str:
        """``"config"``, ``"carbon_gym"`` or ``"other"`` (see :class:`WorkerError`)."""
        exc = self.original
        kind = getattr(exc, "kind", None)
        if isinstance(exc, WorkerError) and kind:
            return kind
        return _wrap_exception(exc).kind


_POLICY_COST = {"milp": 8.0, "ilp-state": 5.0, "ilp": 4.0, "clairvoyant": 1.5}


def _cost_hint(spec: RunSpec) -> float:
    """Rough relative cost used only to start long runs first (better packing of workers)."""
    load = 1.0
    for word, w in (("high", 3.0), ("moderate", 2.0), ("low", 1.0)):
        if word in spec.scenario_name:
            load = w
            break
    model = 2.0 if "mixtral" in spec.scenario_name else 1.0
    return _POLICY_COST.get(spec.policy, 1.0) * load * model


def default_workers() -> int:
    """All local cores (``os.cpu_count()``)."""
    return max(1, os.cpu_count() or 1)


def run_matrix(
    specs: Sequence[RunSpec],
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: bool = True,
    keep_requests: bool | Callable[[RunSpec], bool] = True,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every spec and return the results **in the order of** ``specs``.

    Args:
        workers: local processes (default: all cores); 1 runs in this process.
        ray_address: if given, fan out over Ray instead (``"local"`` starts a local instance,
            anything else is passed to ``ray.init(address=...)``, e.g. ``"auto"`` or
            ``"ray://head:10001"``); Ray is the optional ``carbon-gym[ray]`` extra.
        progress: a tqdm bar over runs on stderr.
        keep_requests: return per-request records (else only metrics and steps); a callable
            decides per spec.
        on_result: called in this process with each result as it arrives (any order), e.g. to
            write its files; it may clear ``result.requests`` to free memory.
    """
    specs = list(specs)
    if not specs:
        return []
    keep = [bool(keep_requests(s)) if callable(keep_requests) else bool(keep_requests) for s in specs]
    order = sorted(range(len(specs)), key=lambda i: (-_cost_hint(specs[i]), i))
    results: list[RunResult | None] = [None] * len(specs)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(specs), unit="run", desc="eval", file=sys.stderr, dynamic_ncols=True)

    def done(i: int, res: RunResult) -> None:
        if on_result is not None:
            on_result(res)
        results[i] = res
        if bar is not None:
            bar.set_postfix_str(specs[i].run_id, refresh=False)
            bar.update(1)

    try:
        if ray_address:
            _run_ray(specs, order, ray_address, keep, done)
        else:
            n = workers if workers is not None else default_workers()
            if n <= 1 or len(specs) == 1:
                for i in order:
                    try:
                        res = _run_one_worker(specs[i], keep[i])
                    except WorkerError as exc:
                        raise RunFailed(specs[i], exc) from None
                    done(i, res)
            else:
                _run_pool(specs, order, min(n, len(specs)), keep, done)
    finally:
        if bar is not None:
            bar.close()
    return [r for r in results if r is not None]


def _run_pool(specs: list[RunSpec], order: list[int], n: int, keep: list[bool], done: Callable[[int, RunResult], None]) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # spawn: no fork of a parent holding threads (tqdm) or solver state; workers import afresh.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        futures = {pool.submit(_run_one_worker, specs[i], keep[i]): i for i in order}
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    i = futures[fut]
                    exc = fut.exception()
                    if exc is not None:
                        raise RunFailed(specs[i], exc) from exc
                    done(i, fut.result())
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


def _run_ray(specs: list[RunSpec], order: list[int], address: str, keep: list[bool], done: Callable[[int, RunResult], None]) -> None:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray-address needs Ray: pip install 'carbon-gym[ray]'") from None
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False}
        if address not in ("local",):
            kwargs["address"] = address
        ray.init(**kwargs)
    remote = ray.remote(_run_one_worker)
    refs = {remote.remote(specs[i], keep[i]): i for i in order}
    pending = list(refs)
    while pending:
        finished, pending = ray.wait(pending, num_returns=1)
        for ref in finished:
            i = refs[ref]
            try:
                res = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - RayTaskError wraps the worker's WorkerError
                for r in pending:
                    ray.cancel(r)
                cause = getattr(exc, "cause", None)
                raise RunFailed(specs[i], cause if isinstance(cause, WorkerError) else exc) from None
            done(i, res)


# ----------------------------------------------------------------------------------------------
# tables

# per-run metrics summarised across seeds (mean and 95% CI), in table order
SUMMARY_METRICS = (
    "carbon_g",
    "reduction_vs_rr_pct",
    "energy_kwh",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "slo_violation_pct",
    "unfinished_pct",
)
TIMING_COLUMNS = ("decision_mean_s", "decision_p95_s")
# per-run fault counters averaged over seeds in the summary (only when a scenario has faults)
FAULT_SUMMARY_COLUMNS = ("failed_over", "failed_over_completed", "wasted_carbon_g")
NONDETERMINISTIC_PREFIXES = ("decision_", "wall_", "cpu_")  # wall-clock columns, excluded from reproducibility checks


def runs_table(results: Sequence[RunResult], reference: str = REFERENCE_POLICY):
    """One row per run (pandas DataFrame) with ``reduction_vs_rr_pct`` from the same seed's rr run.

    Reduction = 100 x (carbon_rr - carbon) / carbon_rr for the round-robin run with the same
    scenario (label) and seed; NaN when that run is not in ``results``.
    """
    import pandas as pd

    rows = []
    for r in results:
        row = {"scenario": r.spec.scenario_name, "policy": r.spec.policy_name, "seed": int(r.spec.seed)}
        row.update({k: v for k, v in r.metrics.items() if np.isscalar(v) or v is None})
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    ref = df[df["policy"] == reference].set_index(["scenario", "seed"])["carbon_g"]
    keys = list(zip(df["scenario"], df["seed"]))
    ref_carbon = np.array([ref.get(k, np.nan) for k in keys], dtype=np.float64)
    df["rr_carbon_g"] = ref_carbon
    df["reduction_vs_rr_pct"] = 100.0 * (ref_carbon - df["carbon_g"].to_numpy(np.float64)) / ref_carbon
    return df


def summarise(runs, *, reference: str = REFERENCE_POLICY):
    """Summary DataFrame: one row per (scenario, policy), in first-appearance order.

    ``runs`` is the output of :func:`runs_table` (or a list of :class:`RunResult`). When any
    run's scenario has faults, every row also gets the mean fault counters
    (:data:`FAULT_SUMMARY_COLUMNS`) and ``ledger_ok_share`` (share of seeds whose end-of-episode
    ledger balanced).
    """
    import pandas as pd

    if not hasattr(runs, "columns"):
        runs = runs_table(runs, reference)
    faults = "scenario_faults" in runs and bool((runs["scenario_faults"].fillna(0) > 0).any())
    out = []
    for (scen, pol), g in runs.groupby(["scenario", "policy"], sort=False):
        row: dict[str, Any] = {"scenario": scen, "policy": pol, "seeds": int(len(g))}
        for m in SUMMARY_METRICS:
            if m not in g:
                continue
            mean, ci = mean_ci95(g[m].to_numpy(np.float64))
            row[m] = mean
            row[m + "_ci95"] = ci
        if "mlperf_p99_pass" in g:
            row["mlperf_p99_pass_share"] = float(np.mean(g["mlperf_p99_pass"].astype(float)))
        for c in ("requests_completed", "requests_in_flight", "requests_failed"):
            if c in g:
                row[c] = float(g[c].mean())
        if faults:
            for c in FAULT_SUMMARY_COLUMNS:
                if c in g:
                    row[c] = float(g[c].mean())
            if "ledger_ok" in g:
                row["ledger_ok_share"] = float(np.mean(g["ledger_ok"].astype(float)))
        for c in TIMING_COLUMNS:
            if c in g:
                row[c] = float(g[c].mean())
        out.append(row)
    return pd.DataFrame(out)


def _sig(x: float, digits: int = 3) -> str:
    if x is None or not np.isfinite(x):
        return "–"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:,.{decimals}f}"


def _pm(mean: float, ci: float, digits: int = 3, scale: float = 1.0) -> str:
    if mean is None or not np.isfinite(mean):
        return "–"
    text = _sig(mean * scale, digits)
    if ci is not None and np.isfinite(ci):
        text += f" ± {_sig(ci * scale, 2)}"
    return text


def _fixed(mean: float, ci: float, decimals: int = 1) -> str:
    if mean is None or not np.isfinite(mean):
        return "–"
    text = f"{mean:.{decimals}f}"
    if ci is not None and np.isfinite(ci):
        text += f" ± {ci:.{decimals}f}"
    return text


def summary_markdown(summary, *, timing: bool = True) -> str:
    """The summary as a Markdown table (means ± 95% CI half-widths; latencies in ms); with a
    ``failed over`` column (mean requests failed over per episode) when the summary has one."""
    faults = "failed_over" in getattr(summary, "columns", ())
    head = [
        "scenario", "policy", "seeds", "carbon (kg)", "vs rr (%)", "energy (kWh)",
        "TTFT p50/p90/p99 (ms)", "TPOT p50/p90/p99 (ms)", "SLO viol. (%)", "unfinished (%)", "MLPerf p99 pass",
    ]
    if faults:
        head.append("failed over")
    if timing:
        head.append("decision mean/p95 (ms)")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for _, r in summary.iterrows():
        def g(k: str) -> float:
            v = r.get(k, float("nan"))
            return float(v) if v is not None else float("nan")

        lat = lambda p: "/".join(_sig(g(f"{p}_{q}_s") * 1e3, 3) for q in ("p50", "p90", "p99"))  # noqa: E731
        share = g("mlperf_p99_pass_share")
        seeds = int(r["seeds"])
        cells = [
            str(r["scenario"]), str(r["policy"]), str(seeds),
            _pm(g("carbon_g"), g("carbon_g_ci95"), 3, 1e-3),
            _fixed(g("reduction_vs_rr_pct"), g("reduction_vs_rr_pct_ci95"), 1),
            _pm(g("energy_kwh"), g("energy_kwh_ci95"), 3),
            lat("ttft"), lat("tpot"),
            _fixed(g("slo_violation_pct"), g("slo_violation_pct_ci95"), 2),
            _fixed(g("unfinished_pct"), float("nan"), 1),
            "–" if not np.isfinite(share) else f"{int(round(share * seeds))}/{seeds}",
        ]
        if faults:
            cells.append(_sig(g("failed_over"), 3))
        if timing:
            cells.append(f"{_sig(g('decision_mean_s') * 1e3, 2)}/{_sig(g('decision_p95_s') * 1e3, 2)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# fault report: each run of a fault scenario against the same run without its faults


def fault_pairs(results: Sequence[RunResult]):
    """One row per run of a scenario with faults whose fault-free twin (:func:`fault_twin`) is
    also in ``results`` (pandas DataFrame, in the order of ``results``).

    Columns: ``scenario``, ``policy``, ``seed``, ``arrived``; the fault counters of the fault
    run: ``failed_over`` (requests aborted by an outage and placed again; a request in transit
    to, queued at or running in a datacenter that goes down counts once per abort),
    ``failed_over_completed``, ``wasted_energy_kj`` / ``wasted_carbon_g`` (work lost to
    aborts), ``invalid_actions``; then each metric with and without the faults (``*_base``):
    ``slo_violations``, ``slo_violation_pct`` (per completed request), ``carbon_g``,
    ``ttft_p99_s``, ``unfinished`` (in flight at truncation + never placed); the differences
    ``slo_violation_pp`` (percentage points), ``extra_carbon_g`` (= ``carbon_g - carbon_g_base``
    exactly) and ``extra_carbon_pct`` (of the fault-free run); ``ledger_ok`` (both runs'
    end-of-episode ledgers balanced).
    """
    import pandas as pd

    by_id = {r.spec.run_id: r for r in results}
    rows = []
    for r in results:
        if not r.spec.faults or not r.metrics.get("scenario_faults"):
            continue
        twin = by_id.get(fault_twin(r.spec).run_id)
        if twin is None:
            continue
        m, b = r.metrics, twin.metrics

        def unfinished(x: Mapping[str, Any]) -> int:
            return int(x.get("requests_in_flight", 0)) + int(x.get("requests_unplaced", 0))

        extra = float(m["carbon_g"]) - float(b["carbon_g"])
        rows.append({
            "scenario": r.spec.scenario_name,
            "policy": r.spec.policy_name,
            "seed": int(r.spec.seed),
            "arrived": int(m["requests_arrived"]),
            "failed_over": int(m["failed_over"]),
            "failed_over_completed": int(m["failed_over_completed"]),
            "failed_over_base": int(b["failed_over"]),
            "wasted_energy_kj": float(m["wasted_energy_kj"]),
            "wasted_carbon_g": float(m["wasted_carbon_g"]),
            "invalid_actions": int(m.get("invalid_actions", 0)),
            "slo_violations": int(m["slo_violations"]),
            "slo_violations_base": int(b["slo_violations"]),
            "slo_violation_pct": float(m["slo_violation_pct"]),
            "slo_violation_pct_base": float(b["slo_violation_pct"]),
            "slo_violation_pp": float(m["slo_violation_pct"]) - float(b["slo_violation_pct"]),
            "carbon_g": float(m["carbon_g"]),
            "carbon_g_base": float(b["carbon_g"]),
            "extra_carbon_g": extra,
            "extra_carbon_pct": 100.0 * extra / float(b["carbon_g"]) if b["carbon_g"] else float("nan"),
            "ttft_p99_s": float(m["ttft_p99_s"]),
            "ttft_p99_s_base": float(b["ttft_p99_s"]),
            "unfinished": unfinished(m),
            "unfinished_base": unfinished(b),
            "ledger_ok": bool(m["ledger_ok"]) and bool(b["ledger_ok"]),
        })
    return pd.DataFrame(rows)


# fault_pairs columns averaged over seeds by fault_summary (the differences are recomputed from
# the means, so extra_carbon_g = carbon_g - carbon_g_base holds in the summary too)
_FAULT_MEANS = (
    "arrived", "failed_over", "failed_over_completed", "failed_over_base", "wasted_energy_kj", "wasted_carbon_g",
    "invalid_actions", "slo_violations", "slo_violations_base", "slo_violation_pct", "slo_violation_pct_base",
    "carbon_g", "carbon_g_base", "ttft_p99_s", "ttft_p99_s_base", "unfinished", "unfinished_base",
)


def fault_summary(pairs):
    """Per (scenario, policy) of :func:`fault_pairs`: ``seeds``, the mean of each column over
    seeds, ``slo_violation_pp`` = ``slo_violation_pct - slo_violation_pct_base``,
    ``extra_carbon_g`` = ``carbon_g - carbon_g_base`` and ``extra_carbon_pct`` (of
    ``carbon_g_base``) from those means, 95% t-interval half-widths ``*_ci95`` of the two
    differences over the per-seed pairs, and ``ledger_ok`` (every run balanced)."""
    import pandas as pd

    out = []
    if len(pairs) == 0:
        return pd.DataFrame(out)
    for (scen, pol), g in pairs.groupby(["scenario", "policy"], sort=False):
        row: dict[str, Any] = {"scenario": scen, "policy": pol, "seeds": int(len(g))}
        for c in _FAULT_MEANS:
            row[c] = mean_ci95(g[c].to_numpy(np.float64))[0]
        row["slo_violation_pp"] = row["slo_violation_pct"] - row["slo_violation_pct_base"]
        row["slo_violation_pp_ci95"] = mean_ci95(g["slo_violation_pp"].to_numpy(np.float64))[1]
        row["extra_carbon_g"] = row["carbon_g"] - row["carbon_g_base"]
        row["extra_carbon_g_ci95"] = mean_ci95(g["extra_carbon_g"].to_numpy(np.float64))[1]
        row["extra_carbon_pct"] = 100.0 * row["extra_carbon_g"] / row["carbon_g_base"] if row["carbon_g_base"] else float("nan")
        row["ledger_ok"] = bool(g["ledger_ok"].astype(bool).all())
        out.append(row)
    return pd.DataFrame(out)


def fault_markdown(table) -> str:
    """:func:`fault_summary` (or :func:`fault_pairs`) as a Markdown table: means over seeds;
    ``w/o`` = the same run without the faults; ± = 95% CI half-width over seeds."""
    head = ["scenario", "policy", "seeds", "failed over", "f.o. completed", "wasted (kJ)", "SLO viol. (%)", "w/o (%)",
            "Δ (pp)", "carbon (g)", "w/o (g)", "extra (g)", "extra (%)", "TTFT p99 (ms)", "w/o (ms)", "unfinished",
            "ledger balanced"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for _, r in table.iterrows():
        def g(k: str) -> float:
            v = r.get(k, float("nan"))
            return float(v) if v is not None else float("nan")

        def num(k: str) -> str:  # counts: integers when they are
            v = g(k)
            return str(int(v)) if np.isfinite(v) and v == int(v) else _sig(v, 3)

        cells = [
            str(r["scenario"]), str(r["policy"]), str(int(r.get("seeds", 1))),
            num("failed_over"), num("failed_over_completed"), f"{g('wasted_energy_kj'):.2f}",
            f"{g('slo_violation_pct'):.2f}", f"{g('slo_violation_pct_base'):.2f}",
            _fixed(g("slo_violation_pp"), g("slo_violation_pp_ci95"), 2),
            f"{g('carbon_g'):.3f}", f"{g('carbon_g_base'):.3f}",
            _fixed(g("extra_carbon_g"), g("extra_carbon_g_ci95"), 3), f"{g('extra_carbon_pct'):+.1f}",
            _sig(g("ttft_p99_s") * 1e3, 3), _sig(g("ttft_p99_s_base") * 1e3, 3), num("unfinished"),
            "yes" if bool(r["ledger_ok"]) else "NO",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_fault_report(results: Sequence[RunResult], out: str):
    """Write ``fault_report.csv`` / ``fault_report.md`` (:func:`fault_summary`) and
    ``fault_runs.csv`` (:func:`fault_pairs`) under ``out``; returns the summary, or None (and
    writes nothing) when no run of ``results`` has both faults and its fault-free twin."""
    pairs = fault_pairs(results)
    if pairs.empty:
        return None
    table = fault_summary(pairs)
    os.makedirs(out, exist_ok=True)
    pairs.to_csv(os.path.join(out, "fault_runs.csv"), index=False)
    table.to_csv(os.path.join(out, "fault_report.csv"), index=False)
    with open(os.path.join(out, "fault_report.md"), "w", encoding="utf-8") as f:
        f.write(fault_markdown(table))
    return table


# ----------------------------------------------------------------------------------------------
# files


def write_table(columns: Mapping[str, np.ndarray] | Any, path_stem: str, fmt: str = "parquet") -> str:
    """Write a column dict or DataFrame as ``path_stem.parquet`` (or ``.csv``); returns the path.

    Parquet needs pyarrow; without it (or with ``fmt="csv"``) the table is written as CSV.
    """
    import pandas as pd

    df = columns if hasattr(columns, "to_parquet") else pd.DataFrame({k: np.asarray(v) for k, v in columns.items()})
    os.makedirs(os.path.dirname(path_stem) or ".", exist_ok=True)
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401

            path = path_stem + ".parquet"
            df.to_parquet(path, index=False)
            return path
        except ImportError:
            pass
    path = path_stem + ".csv"
    df.to_csv(path, index=False)
    return path


def read_table(path_stem_or_path: str):
    """Read a table written by :func:`write_table` (given the stem or the full path)."""
    import pandas as pd

    p = path_stem_or_path
    if p.endswith(".parquet"):
        return pd.read_parquet(p)
    if p.endswith(".csv"):
        return pd.read_csv(p)
    if os.path.exists(p + ".parquet"):
        return pd.read_parquet(p + ".parquet")
    return pd.read_csv(p + ".csv")


def write_tensorboard(result: RunResult, root: str, reduction_pct: float | None = None) -> str:
    """Write one run's per-step scalars (and the final reduction) under ``root``; returns its dir."""
    from eval.tb import TAGS, ScalarWriter, run_dir

    d = run_dir(root, result.spec.scenario_name, result.spec.policy_name, result.spec.seed)
    steps = result.steps
    cols = {
        TAGS.carbon_step_g: "carbon_g",
        TAGS.carbon_cumulative_g: "cumulative_carbon_g",
        TAGS.energy_step_j: "energy_j",
        TAGS.slo_violations: "violations",
        TAGS.slo_violation_rate: "violation_rate",
        TAGS.ttft_p50_s: "ttft_p50_s",
        TAGS.ttft_p99_s: "ttft_p99_s",
        TAGS.tpot_p50_s: "tpot_p50_s",
        TAGS.tpot_p99_s: "tpot_p99_s",
        TAGS.decision_time_s: "decision_s",
    }
    n = len(steps.get("step", ()))
    with ScalarWriter(d) as w:
        arrays = {tag: np.asarray(steps[c], dtype=np.float64) for tag, c in cols.items() if c in steps}
        for i in range(n):
            step = int(steps["step"][i])
            for tag, a in arrays.items():
                w.scalar(tag, a[i], step)
        if reduction_pct is not None:
            w.scalar(TAGS.reduction_vs_rr_pct, reduction_pct, max(n - 1, 0))
    return d


def report_warnings(results: Sequence[RunResult], stream: Any = None) -> list[str]:
    """Print each distinct warning the runs recorded (env construction) once, as ``note:`` lines."""
    seen = list(dict.fromkeys(w for r in results for w in r.meta.get("warnings", [])))
    for w in seen:
        print(f"carbon-gym: note: {w}", file=stream or sys.stderr)
    return seen


def versions() -> dict[str, str]:
    """Versions of Python and the packages that shape results."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    from importlib import metadata

    try:
        import subprocess

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        if rev.returncode == 0:
            dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5)
            out["git"] = rev.stdout.strip() + ("+modified" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    for pkg in ("carbon-gym", "numpy", "gymnasium", "pyomo", "highspy", "pandas", "pyarrow", "matplotlib", "torch", "stable-baselines3", "ray"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


class OutputWriter:
    """Writes each run's records as it arrives and the tables at the end (``on_result`` hook)."""

    def __init__(self, out: str, *, requests: bool = True, steps: bool = True, fmt: str = "parquet"):
        self.out = out
        self.requests = requests
        self.steps = steps
        self.fmt = fmt
        os.makedirs(out, exist_ok=True)
        self.paths: dict[str, dict[str, str]] = {}

    def __call__(self, result: RunResult) -> None:
        paths = {}
        rid = result.spec.run_id
        if self.requests and result.requests:
            paths["requests"] = write_table(result.requests, os.path.join(self.out, "requests", rid), self.fmt)
        if self.steps and result.steps:
            paths["steps"] = write_table(result.steps, os.path.join(self.out, "steps", rid), self.fmt)
        result.requests = {}  # free memory: the records are on disk now
        self.paths[rid] = paths


def write_outputs(
    results: Sequence[RunResult],
    out: str,
    *,
    command: str | None = None,
    tensorboard: str | None = None,
    extra_config: Mapping[str, Any] | None = None,
):
    """Write runs.csv, summary.csv, summary.md, config.json (and TensorBoard runs); return the summary."""
    os.makedirs(out, exist_ok=True)
    runs = runs_table(results)
    summary = summarise(runs)
    runs.to_csv(os.path.join(out, "runs.csv"), index=False)
    summary.to_csv(os.path.join(out, "summary.csv"), index=False)
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(summary_markdown(summary))
    if tensorboard:
        red = {(r.spec.scenario_name, r.spec.policy_name, r.spec.seed): v for r, v in zip(results, runs["reduction_vs_rr_pct"])}
        for r in results:
            write_tensorboard(r, tensorboard, red.get((r.spec.scenario_name, r.spec.policy_name, r.spec.seed)))
    config = {
        "command": command,
        "versions": versions(),
        "runs": [
            {**_spec_json(r.spec), **{k: v for k, v in r.meta.items() if _jsonable(v)}}
            for r in results
        ],
    }
    if extra_config:
        config.update(extra_config)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1, default=str)
    return summary


def _spec_json(spec: RunSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["overrides"] = dict(spec.overrides)
    d["policy_kwargs"] = dict(spec.policy_kwargs)
    d["run_id"] = spec.run_id
    return d


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False
