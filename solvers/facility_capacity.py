r"""The facility MILP's capacity stage (``[capacity] control = "agent"``): how many engines stay
awake and how many servers stay powered per datacenter, decided with the period's routing split.

At each capacity decision (``EnvState.capacity_decision``: the first step and every
``capacity.period_s``) :func:`solve_capacity` solves a small MILP (D datacenters, 5 columns each);
between decisions the per-step placement MILP (:mod:`solvers.facility`) routes within the
capacity it chose (:func:`capacity_view`). Both are deterministic functions of the state.

Formulation (per decision; seconds, watts, joules, grams, requests/s)
--------------------------------------------------------------------
Data, per datacenter d (``up`` datacenters only; one that is down keeps its targets)
    E_d engines, S_d servers, k_d = engines per server, G_d = k_d tp GPUs per server
    A_d = awake + waking engines now;  N_d = servers powered now (on, standby or booting)
    U_d = awake + waking + sleeping engines now: the engines on powered servers, usable within
        the period (a boot, ``boot_s`` ~ 345 s > period, only serves from a later decision)
    T = max(period_s, ``capacity_lookahead_s``)               the lookahead, s
    gbar_d = PUE_d x mean intensity over [t, t + T] / 3.6e6    g per IT joule (the current hour's
        intensity for the rest of the hour, then the hourly forecast)
    P_on_d = host_w + G_d idle_w   floor of a powered server, W (a sleeping engine draws its GPUs'
        idle power: level-1 sleep keeps the CUDA context; a node in standby draws host idle)
    P_off = host_off_w             a server that is off (its GPUs draw nothing), W
    J_boot_d = boot_s (boot_host_w + G_d boot_gpu_w)   energy of booting one server, J
    J_wake = wake_s tp (transition_w - sleep_w)        energy a wake adds above the floor, J
    e_d = energy of the routed work per request at d (the placement MILP's marginal energy at the
        current batch plus the engine's fixed energy over the batch, mean of the pending
        requests; remembered between steps), J
    Lam = (1 + ``capacity_load_margin``) x r+   the period's expected arrivals, requests/s: r+ the
        99% upper confidence bound of the fleet's arrival rate (:func:`fleet_rate_per_s`: the
        EWMA the simulator publishes, sum_d arrival_rate_per_s_d; on an empty cluster, where
        it is 0, the requests pending now over one polling period; a backlog raises it)
    c = engine_capacity_per_s (measured requests/s per engine within the SLO; with
        ``capacity_basis = "datacenter"`` x r_d, the datacenter figure over it), u =
        ``capacity_util_cap``; lam = ``violation_penalty_g`` grams per request over capacity

Variables
    a_d in Z [0, E_d]   awake engines;  n_d in Z [0, S_d]   servers powered
    l_d >= 0            the period's arrival rate routed to d, requests/s
    b_d >= 0            servers booted (>= n_d - N_d);  w_d >= 0  engines woken (>= a_d - A_d)
    o >= 0              requests/s the awake capacity cannot hold (penalised, never hidden)
    l'_d >= 0, o' >= 0  the routing split and shortfall once the servers booted now are up

Objective (grams over the lookahead)
    sum_d gbar_d [T (P_on_d - P_off) n_d + T e_d l_d + J_boot_d b_d + J_wake w_d] + lam T (o + o')
    (the constant floor sum_d gbar_d T S_d P_off of the servers is left out)

Constraints
    servers     k_d n_d - a_d >= 0                       (the awake engines need their servers)
    demand      sum_d l_d + o = Lam
    capacity    l_d - c u a_d <= 0;  l_d <= c u U_d      (load within the awake capacity at the
                                                          utilisation cap; only usable engines)
    boots       b_d - n_d >= -N_d;   wakes  w_d - a_d >= -A_d
    later       sum_d l'_d + o' = min(Lam, c sum_d E_d);  l'_d - c a_d <= 0
                                                         (the same load once boots are up, within
                                                         the measured capacity itself)

Why the later rows: a server that is off only serves after its boot, so within the period the
capacity rows alone never pay for a boot, and a fleet sized too small once (by a low rate
estimate, or before the load grew) would stay short for good. The later rows charge a load the
engines could not hold within p99 even once the servers booted now are up, at the price of
load over capacity now: deferring the boot one period leaves it uncovered one period longer
for the same boot energy, so the stage boots when lam T o' outweighs the boot and floor energy
(about 0.5 requests/s short at 100 g/kWh). They count the measured capacity c, not c u: the
period's routing plans at u, and a boot waits until the load would pass c itself, so the
band between u and 1 keeps the EWMA's noise from booting and powering off servers in turn.
Demand beyond the whole fleet's measured capacity is charged once, in o.

The expected load Lam is an upper confidence bound: a bias-corrected EWMA over tau = 60 s of a
Poisson stream of rate r, observed for t seconds, has variance r / t_obs with t_obs = 2 tau
tanh(t / (2 tau)), so r+ = r + z sqrt(r / t_obs) with z = 2.326, the one-sided 99% point to
match the p99 targets; under 1% above r once a minute of arrivals is known. The first decision
on an empty cluster sees only one polling period's count (~91 requests at 0.1 s on
llama8b-moderate, +-10%), and its bound keeps the fleet from being sized on a low count. The
count's lower bound is a floor (a backlog raises the plan), but a count merely high by chance is
not: taking max(EWMA, count) at every decision, as before, booted and powered off servers in
turn once boots could pay.

Routing between decisions (:func:`capacity_view`): the placement problem sees ``S_d =
min(target_d, U_d)`` serving engines at d (its TPOT, prefill and TTFT budgets scale with them);
a datacenter with no serving engine is masked for every request that has another datacenter
allowed; where no engine is awake now, the wake latency (``wake_latency_s``) is added to the
queue wait of the TTFT constraints. With ``control = "always_on"`` none of this runs and the
facility MILP is exactly the routing MILP.

Fallback: when HiGHS returns no incumbent, :func:`capacity_greedy` fills the awake capacity
datacenter by datacenter in order of ``gbar_d`` and boots what the later rows still lack,
counted in ``stats["capacity_fallbacks"]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from carbon_gym.sim.simulator import RATE_TAU_S
from carbon_gym.state import EnvState

from ._highs import rowwise_model
from ._highs import run as run_highs
from .problem import J_PER_KWH, PlacementProblem

__all__ = ["CapacityFacts", "CapacityProblem", "CapacityResult", "capacity_problem", "solve_capacity",
           "capacity_greedy", "capacity_view", "horizon_intensity_g_per_kwh", "fleet_rate_per_s", "RATE_Z"]


@dataclass(frozen=True)
class CapacityFacts:
    """Static power and latency facts of an env for the capacity stage (watts, joules, seconds):
    each a float, or (D,) per datacenter (each datacenter's GPU's power file, heterogeneous
    topologies); ``tp`` is every engine's."""

    tp: int
    idle_w: float | np.ndarray
    host_w: float | np.ndarray
    host_off_w: float | np.ndarray
    boot_j_per_gpu_server: tuple[Any, Any]  # (J per server from the host, J per GPU) while booting
    wake_j: float | np.ndarray
    wake_s: float | np.ndarray
    boot_s: float | np.ndarray

    @classmethod
    def from_env(cls, env: Any) -> CapacityFacts:
        """From ``env.unwrapped.world_parts`` (every datacenter's GPU must have capacity states):
        floats when every datacenter has the same GPU, else (D,) arrays."""
        parts = env.unwrapped.world_parts
        models = parts.datacenter_gpus()
        if parts.power_states is None or any(m.states is None for m in models):
            raise ValueError("the env's GPU power file has no capacity states")
        tp = int(parts.engine.tp)
        gb = float(parts.model.weight_bytes) / tp / 1e9
        per_gpu: dict[str, tuple[float, ...]] = {}
        for m in models:
            if m.spec.name in per_gpu:
                continue
            st, pw = m.states, m.power
            boot_s = float(st.boot_s(gb))
            wake_s = float(st.wake_s(gb, tp))
            per_gpu[m.spec.name] = (float(pw.idle_w), float(pw.host_w), float(st.host_off_w), boot_s * float(st.boot_host_w),
                                    boot_s * float(st.boot_gpu_w), wake_s * tp * max(float(st.transition_w) - float(st.sleep_w), 0.0),
                                    wake_s, boot_s)
        rows = [per_gpu[m.spec.name] for m in models]
        cols: list[Any] = ([float(v) for v in rows[0]] if len(per_gpu) == 1 else
                           [np.array(c, dtype=np.float64) for c in zip(*rows)])
        idle, host, off, boot_host, boot_gpu, wake_j, wake_s, boot_s = cols
        return cls(tp=tp, idle_w=idle, host_w=host, host_off_w=off, boot_j_per_gpu_server=(boot_host, boot_gpu),
                   wake_j=wake_j, wake_s=wake_s, boot_s=boot_s)


@dataclass
class CapacityProblem:
    """One capacity decision's data (arrays (D,), each datacenter its own GPU's figures; see the
    module docstring for the symbols)."""

    up: np.ndarray
    engines: np.ndarray
    servers: np.ndarray
    engines_per_node: np.ndarray
    awake_now: np.ndarray
    servers_now: np.ndarray
    usable_now: np.ndarray
    target_engines: np.ndarray
    target_servers: np.ndarray
    g_per_j: np.ndarray
    server_on_w: np.ndarray
    server_off_w: np.ndarray
    boot_j: np.ndarray
    wake_j: np.ndarray
    work_j: np.ndarray
    arrival_per_s: float
    engine_capacity_per_s: np.ndarray
    util_cap: float
    horizon_s: float
    penalty_g: float

    def __post_init__(self) -> None:
        # a float (every datacenter the same GPU) becomes (D,)
        d_n = np.asarray(self.up).size
        for name in ("server_off_w", "wake_j", "engine_capacity_per_s"):
            setattr(self, name, np.broadcast_to(np.asarray(getattr(self, name), dtype=np.float64), (d_n,)))


@dataclass
class CapacityResult:
    """Awake engines and servers per datacenter (D,), the period's routing split (requests/s),
    the objective (grams), the solver status and whether the greedy decided."""

    awake: np.ndarray
    servers: np.ndarray
    rate_per_s: np.ndarray
    objective_g: float
    status: str
    fallback: bool = False


def horizon_intensity_g_per_kwh(now: np.ndarray, forecast: np.ndarray, hour_utc: float, horizon_s: float) -> np.ndarray:
    """(D,) mean intensity over the next ``horizon_s`` seconds, gCO2eq/kWh: ``now`` for the rest of
    the current hour, then the forecast's whole hours (``forecast`` (D, H); the last hour repeats)."""
    now = np.asarray(now, dtype=np.float64)
    fc = np.asarray(forecast, dtype=np.float64)
    left_s = (1.0 - (hour_utc % 1.0)) * 3600.0
    first = min(horizon_s, left_s)
    total = now * first
    rest = horizon_s - first
    h = 0
    while rest > 1e-9:
        col = fc[:, min(h, fc.shape[1] - 1)] if fc.ndim == 2 and fc.shape[1] else now
        step = min(rest, 3600.0)
        total = total + col * step
        rest -= step
        h += 1
    return total / max(horizon_s, 1e-12)


#: One-sided 99% normal quantile: the expected load is planned at the rate's 99% upper
#: confidence bound, to match the p99 targets (module docstring).
RATE_Z = 2.326


def fleet_rate_per_s(ewma_per_s: float, pending: float, time_s: float, poll_s: float, z: float = RATE_Z) -> float:
    """The fleet's arrival rate the capacity stage plans for, requests/s (module docstring).

    Two estimates of a Poisson rate r: the simulator's bias-corrected EWMA of the requests
    reaching the datacenters (``ewma_per_s``, over ``RATE_TAU_S``; equivalent to counting for
    ``t_obs = 2 tau tanh(time_s / (2 tau))`` seconds, variance r / t_obs) and the requests
    pending now over one polling period (``pending / poll_s``, variance r / poll_s). The plan
    takes the EWMA's upper bound ``r + z sqrt(r / t_obs)`` (the count's, over one poll, while
    the EWMA has seen nothing: the first decision on an empty cluster), at least the count's
    lower bound ``r_p - z sqrt(r_p / poll_s)``: a backlog, or requests deferred, well beyond one
    poll's arrivals raises it, a count that is merely high by chance does not. With ``z`` 0 it
    is ``max(ewma, pending / poll_s)``."""
    poll = max(float(poll_s), 1e-9)
    r_p = max(float(pending), 0.0) / poll
    spread_p = z * math.sqrt(r_p / poll)  # the count's, over one poll
    r_e = max(float(ewma_per_s), 0.0)
    t_e = 2.0 * RATE_TAU_S * math.tanh(max(float(time_s), 0.0) / (2.0 * RATE_TAU_S))
    up = r_e + z * math.sqrt(r_e / t_e) if r_e > 0.0 and t_e > 0.0 else r_p + spread_p
    return max(up, r_p - spread_p)


def capacity_problem(state: EnvState, problem: PlacementProblem, facts: CapacityFacts, work_j: np.ndarray,
                     util_cap: float, load_margin: float, lookahead_s: float, penalty_g: float,
                     rate_z: float = RATE_Z, capacity_scale: float | np.ndarray = 1.0) -> CapacityProblem:
    """The :class:`CapacityProblem` of a decision step (``problem``: its placement problem, for the
    carbon stand-ins and PUE; ``rate_z``: the arrival rate's upper confidence bound, 0 for the
    estimate itself; ``capacity_scale``: c is the state's engine figure x this, a float or (D,):
    the datacenter figure over the engine figure with ``capacity_basis = "datacenter"``)."""
    dc = state.datacenters
    horizon = max(float(state.capacity_period_s), float(lookahead_s))
    fc = problem.carbon_forecast_g_per_kwh
    fc = np.zeros((problem.n_datacenters, 0)) if fc is None else fc
    ci = horizon_intensity_g_per_kwh(problem.carbon_g_per_kwh, fc, float(state.hour_utc), horizon)
    epn = np.maximum(np.asarray(state.engines_per_node, dtype=np.int64), 1)
    gpus = epn * facts.tp
    boot_host_j, boot_gpu_j = facts.boot_j_per_gpu_server
    awake = np.asarray(dc.awake_engines, dtype=np.int64) + np.asarray(dc.waking_engines, dtype=np.int64)
    usable = awake + np.asarray(dc.sleeping_engines, dtype=np.int64)
    rate = np.asarray(dc.arrival_rate_per_s, dtype=np.float64)
    rate = np.where(np.isfinite(rate), np.maximum(rate, 0.0), 0.0)
    fleet = fleet_rate_per_s(float(rate.sum()), float(state.pending_total), float(state.time_s), float(problem.poll_s), rate_z)
    return CapacityProblem(
        up=np.asarray(dc.up, dtype=bool), engines=np.asarray(dc.n_engines, dtype=np.int64),
        servers=np.asarray(state.servers, dtype=np.int64), engines_per_node=epn, awake_now=awake,
        servers_now=np.asarray(dc.servers_on, dtype=np.int64), usable_now=usable,
        target_engines=np.asarray(state.capacity_target_engines, dtype=np.int64),
        target_servers=np.asarray(state.capacity_target_servers, dtype=np.int64),
        g_per_j=ci * problem.pue / J_PER_KWH, server_on_w=facts.host_w + gpus * facts.idle_w,
        server_off_w=np.asarray(facts.host_off_w), boot_j=boot_host_j + gpus * boot_gpu_j, wake_j=np.asarray(facts.wake_j),
        work_j=np.asarray(work_j, dtype=np.float64), arrival_per_s=fleet * (1.0 + load_margin),
        engine_capacity_per_s=np.asarray(state.engine_capacity_per_s, dtype=np.float64) * np.asarray(capacity_scale, dtype=np.float64),
        util_cap=float(util_cap), horizon_s=horizon,
        penalty_g=float(penalty_g),
    )


def _per_engine_cap(cp: CapacityProblem) -> np.ndarray:
    """(D,) requests/s one awake engine may carry: the measured capacity (1 where unknown) x the cap."""
    return _measured_cap(cp) * cp.util_cap


def _objective_g(cp: CapacityProblem, a: np.ndarray, n: np.ndarray, rate: np.ndarray) -> float:
    live = cp.up
    b = np.maximum(n - cp.servers_now, 0)
    w = np.maximum(a - cp.awake_now, 0)
    over = max(cp.arrival_per_s - float(rate.sum()), 0.0)
    over_later = max(_later_demand(cp) - float((_measured_cap(cp) * a)[live].sum()), 0.0)
    g = cp.g_per_j
    per = g * (cp.horizon_s * (cp.server_on_w - cp.server_off_w) * n + cp.horizon_s * cp.work_j * rate
               + cp.boot_j * b + cp.wake_j * w)
    return float(per[live].sum()) + cp.penalty_g * cp.horizon_s * (over + over_later)


def _measured_cap(cp: CapacityProblem) -> np.ndarray:
    """(D,) requests/s one awake engine serves within p99: the measured capacity (1 where unknown)."""
    c = cp.engine_capacity_per_s
    return np.where(np.isfinite(c) & (c > 0), c, 1.0)


def _later_demand(cp: CapacityProblem) -> float:
    """Requests/s the later rows plan for: the expected load, at most what every engine of the
    up datacenters serves within p99."""
    return min(cp.arrival_per_s, float((_measured_cap(cp) * cp.engines)[cp.up].sum()))


def capacity_greedy(cp: CapacityProblem) -> CapacityResult:
    """Fill the load into the up datacenters in order of carbon per request (floor share
    included), each up to its usable capacity at the utilisation cap, then boot, in the same
    order, the engines the rest of the later rows' demand needs; the others keep what they need
    (nothing) and datacenters that are down keep their targets."""
    d_n = cp.up.size
    cap = _per_engine_cap(cp)
    a = np.where(cp.up, 0, cp.target_engines).astype(np.int64)
    n = np.where(cp.up, 0, cp.target_servers).astype(np.int64)
    rate = np.zeros(d_n)
    left = cp.arrival_per_s
    per_req = cp.g_per_j * (cp.work_j + (cp.server_on_w / np.maximum(cp.engines_per_node, 1)) / cap)
    for d in np.argsort(per_req, kind="stable"):
        if not cp.up[d] or left <= 0:
            continue
        c = float(cap[d])
        take = min(left, c * float(cp.usable_now[d]))
        k = int(min(math.ceil(take / c - 1e-9), cp.engines[d]))
        a[d] = k
        n[d] = -(-k // int(cp.engines_per_node[d]))
        rate[d] = take
        left -= take
    full = _measured_cap(cp)
    short = _later_demand(cp) - float((full * a)[cp.up].sum())
    for d in np.argsort(per_req, kind="stable"):
        if not cp.up[d] or short <= 1e-9:
            continue
        c = float(full[d])
        k = int(min(math.ceil(short / c - 1e-9), cp.engines[d] - a[d]))
        a[d] += k
        n[d] = -(-int(a[d]) // int(cp.engines_per_node[d]))
        short -= k * c
    return CapacityResult(a, n, rate, _objective_g(cp, a, n, rate), "greedy")


def solve_capacity(cp: CapacityProblem, threads: int = 1) -> CapacityResult:
    """Solve the capacity MILP (module docstring) with HiGHS; :func:`capacity_greedy` on failure."""

    live = np.flatnonzero(cp.up)
    m = live.size
    if m == 0:
        return CapacityResult(cp.target_engines.copy(), cp.target_servers.copy(), np.zeros(cp.up.size), 0.0, "no datacenter up")
    cap = _per_engine_cap(cp)
    T = cp.horizon_s
    g = cp.g_per_j[live]
    # columns: a (m), n (m), l (m), b (m), w (m), o (1), l' (m), o' (1)
    A0, N0, L0, B0, W0, O0 = 0, m, 2 * m, 3 * m, 4 * m, 5 * m
    LL0, OL0 = 5 * m + 1, 6 * m + 1
    n_cols = 6 * m + 2
    cost = np.zeros(n_cols)
    lo = np.zeros(n_cols)
    hi = np.full(n_cols, np.inf)
    integ = np.zeros(n_cols, dtype=np.int32)
    cost[N0:L0] = g * T * (cp.server_on_w[live] - cp.server_off_w[live])
    cost[L0:B0] = g * T * cp.work_j[live]
    cost[B0:W0] = g * cp.boot_j[live]
    cost[W0:O0] = g * cp.wake_j[live]
    cost[O0] = cp.penalty_g * T
    cost[OL0] = cp.penalty_g * T
    hi[A0:N0] = cp.engines[live]
    hi[N0:L0] = cp.servers[live]
    hi[L0:B0] = cap[live] * cp.usable_now[live]
    full = _measured_cap(cp)
    hi[LL0:OL0] = full[live] * cp.engines[live]
    integ[A0:L0] = 1
    rows: list[tuple[dict[int, float], float, float]] = []
    for j in range(m):
        d = int(live[j])
        rows.append(({N0 + j: float(cp.engines_per_node[d]), A0 + j: -1.0}, 0.0, np.inf))
        rows.append(({L0 + j: 1.0, A0 + j: -float(cap[d])}, -np.inf, 0.0))
        rows.append(({B0 + j: 1.0, N0 + j: -1.0}, -float(cp.servers_now[d]), np.inf))
        rows.append(({W0 + j: 1.0, A0 + j: -1.0}, -float(cp.awake_now[d]), np.inf))
        rows.append(({LL0 + j: 1.0, A0 + j: -float(full[d])}, -np.inf, 0.0))
    demand = {L0 + j: 1.0 for j in range(m)}
    demand[O0] = 1.0
    rows.append((demand, cp.arrival_per_s, cp.arrival_per_s))
    later = {LL0 + j: 1.0 for j in range(m)}
    later[OL0] = 1.0
    lam_later = _later_demand(cp)
    rows.append((later, lam_later, lam_later))
    h = rowwise_model(threads, cost, lo, hi, integ, rows)
    h.setOptionValue("mip_rel_gap", 1e-4)
    run_highs(h)
    info = h.getInfo()
    status = h.modelStatusToString(h.getModelStatus())
    if info.primal_solution_status != 2:
        res = capacity_greedy(cp)
        return replace(res, status=f"greedy (milp: {status})", fallback=True)
    col = np.asarray(h.getSolution().col_value)
    a = np.where(cp.up, 0, cp.target_engines).astype(np.int64)
    n = np.where(cp.up, 0, cp.target_servers).astype(np.int64)
    rate = np.zeros(cp.up.size)
    a[live] = np.rint(col[A0:N0]).astype(np.int64)
    n[live] = np.rint(col[N0:L0]).astype(np.int64)
    rate[live] = col[L0:B0]
    return CapacityResult(a, n, rate, float(info.objective_function_value), f"milp: {status}")


def serving_engines(state: EnvState, targets: np.ndarray) -> np.ndarray:
    """(D,) engines serving within the period: the awake target, at most the engines on powered
    servers (awake, waking or sleeping now)."""
    dc = state.datacenters
    usable = np.asarray(dc.awake_engines) + np.asarray(dc.waking_engines) + np.asarray(dc.sleeping_engines)
    return np.minimum(np.asarray(targets, dtype=np.int64), usable.astype(np.int64))


def capacity_view(problem: PlacementProblem, state: EnvState, targets: np.ndarray) -> PlacementProblem:
    """The placement problem restricted to the capacity in force (module docstring): ``n_engines``
    = the serving engines, datacenters without one masked where a request has another choice,
    the wake latency added to the queue wait where no engine is awake now."""
    serving = serving_engines(state, targets)
    has = serving > 0
    allowed = problem.allowed & problem.up[None, :]
    keep = allowed & has[None, :]
    no_other = ~keep.any(axis=1)
    allowed_view = np.where(no_other[:, None], problem.allowed, problem.allowed & has[None, :])
    dc = state.datacenters
    asleep = np.asarray(dc.awake_engines) <= 0
    wake = np.where(np.isfinite(dc.wake_latency_s), np.maximum(dc.wake_latency_s, 0.0), 0.0)
    n_eng = np.maximum(serving, 1)
    backlog_wait = np.where(problem.up, problem.backlog_prompt_tokens * problem.prefill_s_per_token / n_eng, 0.0)
    wait = np.maximum(problem.est_queue_wait_s, backlog_wait) + np.where(asleep & problem.up, wake, 0.0)
    return replace(problem, allowed=allowed_view, n_engines=n_eng, busy_engines=np.minimum(problem.busy_engines, n_eng),
                   est_queue_wait_s=wait)
