r"""Look-ahead baseline: model predictive control of capacity with the facility MILP routing
(``milp-mpc``, :class:`MPCFacilityMILP`).

The facility MILP's capacity stage (:mod:`solvers.facility_capacity`) looks one capacity period
ahead: a server it powers off now it will need back in an hour costs it nothing today, and a
server it boots now serves only after ``boot_s`` (~345 s), beyond that period, so it never boots
ahead of a rise in load; it follows the rise (the simulator boots on demand once requests wait).
This scheduler replaces that stage by a *plan* over the next ``horizon_s`` (default one hour),
re-solved at every capacity decision (every ``capacity.period_s``), executing only its first
period (receding horizon); between decisions the placement MILP routes within the capacity in
force, exactly as :class:`~solvers.facility.FacilityMILP` does (:func:`capacity_view`).

Model (per decision; seconds, watts, joules, grams, requests/s)
---------------------------------------------------------------
Blocks (move blocking): block 0 is one capacity period; blocks 1.. are ``block_s`` long (the
last one cut at the horizon). t_b, L_b: start (from now) and length of block b.

Data, per up datacenter d (as in :mod:`solvers.facility_capacity`, whose
:func:`capacity_problem` supplies the static part: E_d, S_d, k_d, A_d, N_d, P_on_d, P_off,
J_boot_d, J_wake, e_d, c, u, lam):
    g_bd = PUE_d x mean carbon intensity over block b / 3.6e6, g per IT joule (the current hour's
        intensity for the rest of the hour, then the hourly forecast of the env's typed state)
    Lam_b = (1 + ``capacity_load_margin``) x the load forecast's *peak* over block b (sampled
        every 60 s and at the block's ends), requests/s; forecasters (``load_forecast``):
        ``"persistence"``: the fleet's arrival rate now (the EWMA the simulator publishes, at
        least the pending requests over one poll: the one-period MILP's load) for every block;
        ``"diurnal"`` (default): that rate x F(t) / F(now), F the scenario's diurnal profile
        (``workload.diurnal_amplitude`` / ``diurnal_peak_hour``, regions weighted by their
        shares); persistence when the scenario has no profile;
        ``"profile"``: the scenario's mean rate x F(t) (the nominal load, not the measured one);
        or a callable ``f(state, times_s) -> requests/s`` (times from the episode start).
    R_d = engines ready now: awake + waking + sleeping engines minus those on servers this
        scheduler booted that are not up yet (its own boot ledger; boots the simulator started on
        demand are not visible in the state and count as ready, as in the one-period stage)
    P_bd = engines of those in-flight boots that become ready during block b (fractionally:
        the share of the block after the boot ends)
    r_tb = share of block b during which a server booted at the start of block t is up
        (``clip((t_b + L_b - t_t - boot_s) / L_b, 0, 1)``); inc_tb = r_tb - r_t,b-1 (sums to 1)

Variables (b over blocks)
    a_bd in Z [0, E_d] awake engines;  n_bd in Z [0, S_d] servers powered (on, standby, booting)
    q_bd in [0, E_d] engines on servers that are up (ready);  l_bd >= 0 requests/s routed to d
    x_bd >= 0 servers booted at the start of block b; w_bd >= 0 engines woken; o_b >= 0 overflow
    (blocks from ``integer_blocks`` on are relaxed to continuous a, n: only block 0 is executed)

Objective (grams over the horizon)
    sum_b sum_d g_bd [L_b (P_on_d - P_off) n_bd + L_b e_d l_bd + J_boot_d x_bd + J_wake w_bd]
    + lam sum_b L_b o_b

Constraints (n_-1 = N_d, a_-1 = A_d, q_-1 = R_d)
    ready       a_bd <= q_bd;  q_bd <= k_d n_bd;
                q_bd <= q_b-1,d + P_bd + k_d sum_{t <= b} inc_tb x_td   (capacity comes back only
                                                                        boot_s after a boot)
    boots       x_bd >= n_bd - n_b-1,d;   wakes  w_bd >= a_bd - a_b-1,d
    capacity    l_bd <= c u a_bd
    demand      sum_d l_bd + o_b = Lam_b

Executed: the targets ``capacity = a_0``, ``servers = n_0`` (a boot at block 0 is a boot now:
recorded in the ledger with its ready time). The SLO floor: the overflow penalty lam (grams per
request over capacity) exceeds the floor cost of an engine's capacity by two orders of magnitude,
so block 0 keeps ``c u sum_d a_0d >= Lam_0`` whenever the ready engines can hold it (tested).

With ``always_on`` the scheduler is the facility MILP (no capacity decisions); with
``control = "agent"`` at a decision it returns ``{"route", "capacity", "servers"}``.
Fallback: when HiGHS returns no incumbent, the one-period capacity stage decides (counted in
``stats["mpc_fallbacks"]``, logged).

Parameters (keyword arguments, besides every :class:`~solvers.facility_model.FacilityConfig`
field): ``horizon_s`` (3600), ``block_s`` (300), ``load_forecast`` ("diurnal"),
``integer_blocks`` (1), ``plan_mip_gap`` (1e-3).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from carbon_gym.errors import ConfigError

from ._highs import rowwise_model
from ._highs import run as run_highs
from .facility import FacilityMILP
from .facility_capacity import CapacityFacts, CapacityProblem, CapacityResult, capacity_problem, horizon_intensity_g_per_kwh
from .problem import J_PER_KWH, PlacementProblem

log = logging.getLogger(__name__)

__all__ = ["MPCSettings", "PlanProblem", "PlanResult", "plan_blocks", "block_intensity_g_per_kwh", "solve_plan",
           "fleet_diurnal_factor", "MPCFacilityMILP", "LOAD_FORECASTS"]

LOAD_FORECASTS = ("persistence", "diurnal", "profile")
#: Sampling step of the load forecast inside a block (its peak is planned for), s.
FORECAST_SAMPLE_S = 60.0


@dataclass(frozen=True)
class MPCSettings:
    """The plan's settings (see the module docstring); checked on construction."""

    horizon_s: float = 3600.0
    block_s: float = 300.0
    load_forecast: Any = "diurnal"
    integer_blocks: int = 1
    plan_mip_gap: float = 1e-3

    def __post_init__(self) -> None:
        for name in ("horizon_s", "block_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ConfigError(f"mpc.{name}", f"must be a finite number of seconds > 0, got {v!r}")
        if not callable(self.load_forecast) and self.load_forecast not in LOAD_FORECASTS:
            raise ConfigError("mpc.load_forecast", f"unknown forecaster {self.load_forecast!r}",
                              allowed=[*LOAD_FORECASTS, "a callable f(state, times_s) -> requests/s"])
        if isinstance(self.integer_blocks, bool) or not isinstance(self.integer_blocks, int) or self.integer_blocks < 1:
            raise ConfigError("mpc.integer_blocks", f"must be an integer >= 1, got {self.integer_blocks!r}")
        if not (isinstance(self.plan_mip_gap, (int, float)) and 0.0 <= self.plan_mip_gap < 1.0):
            raise ConfigError("mpc.plan_mip_gap", f"must be in [0, 1), got {self.plan_mip_gap!r}")


def plan_blocks(period_s: float, horizon_s: float, block_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(starts (B,), lengths (B,)) of the plan's blocks, s from now: one capacity period, then
    ``block_s`` blocks up to ``max(horizon_s, period_s)`` (the last one cut there)."""
    end = max(float(horizon_s), float(period_s))
    starts = [0.0]
    lens = [float(period_s)]
    t = float(period_s)
    while t < end - 1e-9:
        step = min(float(block_s), end - t)
        starts.append(t)
        lens.append(step)
        t += step
    return np.asarray(starts), np.asarray(lens)


def block_intensity_g_per_kwh(now: np.ndarray, forecast: np.ndarray, hour_utc: float, starts: np.ndarray,
                              lens: np.ndarray) -> np.ndarray:
    """(B, D) mean intensity over each block, gCO2eq/kWh (as :func:`horizon_intensity_g_per_kwh`:
    ``now`` for the rest of the current hour, then the forecast's whole hours)."""
    now = np.asarray(now, dtype=np.float64)

    def total(t_s: float) -> np.ndarray:  # integral of the intensity over [0, t_s], g/kWh x s
        return horizon_intensity_g_per_kwh(now, forecast, hour_utc, t_s) * t_s if t_s > 0 else np.zeros_like(now)

    return np.stack([(total(float(s + L)) - total(float(s))) / max(float(L), 1e-12) for s, L in zip(starts, lens)])


@dataclass
class PlanProblem:
    """One plan's data: the one-period problem ``cp`` (its static arrays and costs; its
    ``g_per_j``, ``arrival_per_s`` and ``horizon_s`` are not used) and per block b: ``starts``,
    ``lens`` (s), ``g_per_j`` (B, D), ``arrival_per_s`` (B,) (margin included), ``ready_now`` (D,)
    engines ready now, ``pending_ready`` (B, D) engines of in-flight boots ready during each
    block, ``boot_s``."""

    cp: CapacityProblem
    starts: np.ndarray
    lens: np.ndarray
    g_per_j: np.ndarray
    arrival_per_s: np.ndarray
    ready_now: np.ndarray
    pending_ready: np.ndarray
    boot_s: float
    integer_blocks: int = 1
    mip_gap: float = 1e-3


@dataclass
class PlanResult:
    """The plan: awake engines, servers powered, ready engines, routed rate (B, D), boots (B, D)
    (float arrays: integers in the first ``integer_blocks`` blocks, the LP relaxation's values
    after them), overflow (B,), objective (grams), solver status; ``awake[0]`` / ``servers[0]``
    are executed."""

    awake: np.ndarray
    servers: np.ndarray
    ready: np.ndarray
    rate_per_s: np.ndarray
    boots: np.ndarray
    overflow_per_s: np.ndarray
    objective_g: float
    status: str
    ok: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def _boot_share(starts: np.ndarray, lens: np.ndarray, boot_s: float) -> np.ndarray:
    """(B, B) r[t, b]: share of block b during which a server booted at the start of block t is up."""
    ends = starts + lens
    ready = starts[:, None] + boot_s
    return np.clip((ends[None, :] - ready) / np.maximum(lens[None, :], 1e-12), 0.0, 1.0)


def solve_plan(pp: PlanProblem, threads: int = 1) -> PlanResult:
    """Solve the plan (module docstring) with HiGHS."""

    cp = pp.cp
    live = np.flatnonzero(cp.up)
    m, B = live.size, len(pp.starts)
    D = cp.up.size
    if m == 0:
        z = np.zeros((B, D))
        return PlanResult(np.tile(cp.target_engines, (B, 1)), np.tile(cp.target_servers, (B, 1)), z, z, z, np.zeros(B),
                          0.0, "no datacenter up", ok=False)
    # requests/s per awake engine within the SLO: one figure, or (D,) when the datacenters' GPUs differ
    c = np.broadcast_to(np.asarray(cp.engine_capacity_per_s, dtype=np.float64), (D,))
    cap = np.where(np.isfinite(c) & (c > 0), c, 1.0) * cp.util_cap
    k = cp.engines_per_node[live].astype(np.float64)
    # column blocks, each (B, m) row-major: a, n, q, l, x (boots), w (wakes); then o (B)
    nv = B * m
    A0, N0, Q0, L0, X0, W0 = (i * nv for i in range(6))
    O0 = 6 * nv
    n_cols = O0 + B

    def col(base: int, b: int, j: int) -> int:
        return base + b * m + j

    cost = np.zeros(n_cols)
    lo = np.zeros(n_cols)
    hi = np.full(n_cols, np.inf)
    integ = np.zeros(n_cols, dtype=np.int32)
    g = pp.g_per_j[:, live]  # (B, m)
    L = pp.lens[:, None]
    def per_dc(x: Any) -> np.ndarray:  # a figure or a (D,) array (heterogeneous GPUs), at the live datacenters
        return np.broadcast_to(np.asarray(x, dtype=np.float64), (D,))[live]

    cost[N0:N0 + nv] = (g * L * (per_dc(cp.server_on_w) - per_dc(cp.server_off_w))[None, :]).ravel()
    cost[L0:L0 + nv] = (g * L * cp.work_j[live][None, :]).ravel()
    cost[X0:X0 + nv] = (g * cp.boot_j[live][None, :]).ravel()
    cost[W0:W0 + nv] = (g * per_dc(cp.wake_j)[None, :]).ravel()
    cost[O0:] = cp.penalty_g * pp.lens
    hi[A0:A0 + nv] = np.tile(cp.engines[live], B)
    hi[N0:N0 + nv] = np.tile(cp.servers[live], B)
    hi[Q0:Q0 + nv] = np.tile(cp.engines[live], B)
    n_int = min(int(pp.integer_blocks), B) * m
    integ[A0:A0 + n_int] = 1
    integ[N0:N0 + n_int] = 1
    share = _boot_share(pp.starts, pp.lens, pp.boot_s)
    inc = share - np.concatenate([np.zeros((B, 1)), share[:, :-1]], axis=1)  # inc[t, b]
    ready_now = pp.ready_now[live].astype(np.float64)
    pend = pp.pending_ready[:, live]
    rows: list[tuple[dict[int, float], float, float]] = []
    for b in range(B):
        for j in range(m):
            d = int(live[j])
            a, n, q = col(A0, b, j), col(N0, b, j), col(Q0, b, j)
            rows.append(({a: 1.0, q: -1.0}, -np.inf, 0.0))
            rows.append(({q: 1.0, n: -k[j]}, -np.inf, 0.0))
            ready: dict[int, float] = {q: 1.0}
            if b > 0:
                ready[col(Q0, b - 1, j)] = -1.0
            for t in range(b + 1):
                if inc[t, b] > 1e-12:
                    ready[col(X0, t, j)] = ready.get(col(X0, t, j), 0.0) - k[j] * inc[t, b]
            rows.append((ready, -np.inf, float(pend[b, j]) + (ready_now[j] if b == 0 else 0.0)))
            boots = {col(X0, b, j): 1.0, n: -1.0}
            wakes = {col(W0, b, j): 1.0, a: -1.0}
            if b > 0:
                boots[col(N0, b - 1, j)] = 1.0
                wakes[col(A0, b - 1, j)] = 1.0
            rows.append((boots, -float(cp.servers_now[d]) if b == 0 else 0.0, np.inf))
            rows.append((wakes, -float(cp.awake_now[d]) if b == 0 else 0.0, np.inf))
            rows.append(({col(L0, b, j): 1.0, a: -float(cap[d])}, -np.inf, 0.0))
        demand = {col(L0, b, j): 1.0 for j in range(m)}
        demand[O0 + b] = 1.0
        lam = float(pp.arrival_per_s[b])
        rows.append((demand, lam, lam))
    h = rowwise_model(threads, cost, lo, hi, integ, rows)
    h.setOptionValue("mip_rel_gap", float(pp.mip_gap))
    run_highs(h)
    info = h.getInfo()
    status = h.modelStatusToString(h.getModelStatus())
    if info.primal_solution_status != 2:
        z = np.zeros((B, D))
        return PlanResult(np.tile(cp.target_engines, (B, 1)), np.tile(cp.target_servers, (B, 1)), z, z, z, np.zeros(B),
                          float("nan"), f"milp: {status}", ok=False)
    x = np.asarray(h.getSolution().col_value)

    def grid(base: int, keep: np.ndarray | None = None) -> np.ndarray:
        out = np.zeros((B, D)) if keep is None else np.tile(keep, (B, 1)).astype(np.float64)
        out[:, live] = x[base:base + nv].reshape(B, m)
        return out

    awake = grid(A0, np.where(cp.up, 0, cp.target_engines))
    servers = grid(N0, np.where(cp.up, 0, cp.target_servers))
    n_int_blocks = min(int(pp.integer_blocks), B)
    awake[:n_int_blocks] = np.rint(awake[:n_int_blocks])
    servers[:n_int_blocks] = np.rint(servers[:n_int_blocks])
    return PlanResult(awake, servers, grid(Q0), grid(L0), grid(X0), x[O0:O0 + B].copy(),
                      float(info.objective_function_value), f"milp: {status}")


def fleet_diurnal_factor(scenario: Any) -> Callable[[np.ndarray], np.ndarray] | None:
    """``F(t_s)``: the fleet's rate multiplier at episode times ``t_s`` (the regions' diurnal
    factors weighted by their shares, mean 1 over a day), or None when the scenario's workload
    has no diurnal profile."""
    from carbon_gym.physics.carbon import parse_start_utc
    from carbon_gym.scenario import resolve_topology
    from carbon_gym.workload import DiurnalProfile

    w = scenario.workload
    if not w.diurnal_amplitude > 0:
        return None
    _, regions = resolve_topology(scenario)
    prof = DiurnalProfile(w.diurnal_amplitude, w.diurnal_peak_hour, tuple(r.utc_offset_h for r in regions),
                          parse_start_utc(scenario.carbon.start_utc))
    n = len(regions)
    shares = np.full(n, 1.0 / n) if w.region_shares is None else np.asarray(w.region_shares, dtype=np.float64)
    shares = shares / shares.sum()

    def factor(t_s: np.ndarray) -> np.ndarray:
        t = np.asarray(t_s, dtype=np.float64)
        return np.asarray(sum(shares[r] * prof.factor(r, t) for r in range(n)), dtype=np.float64)

    return factor


class MPCFacilityMILP(FacilityMILP):
    """The facility MILP with a receding-horizon capacity plan (``name = "milp-mpc"``; module
    docstring). Keyword arguments: :class:`MPCSettings` fields, then any
    :class:`~solvers.facility_model.FacilityConfig` field (the routing MILP's and the shared
    capacity settings ``capacity_util_cap``, ``capacity_basis``, ``capacity_load_margin``).
    Unlike ``milp``, its ``capacity_basis`` defaults to ``"engine"`` (the load margin then 0.1):
    its plan sizes for the load forecast's peak, not the arrival rate's 99% bound, and every row
    of it was measured there; the datacenter basis is not tested for it."""

    name = "milp-mpc"

    def __init__(self, env: Any = None, config: Any = None, **overrides: Any) -> None:
        names = MPCSettings.__dataclass_fields__
        self.mpc = MPCSettings(**{k: overrides.pop(k) for k in list(overrides) if k in names})
        if config is None:
            overrides.setdefault("capacity_basis", "engine")
        super().__init__(env, config, **overrides)

    def reset_stats(self) -> None:
        """Clear the statistics (the facility MILP's, plus ``mpc_plans``, ``mpc_fallbacks``,
        ``mpc_boots`` and ``mpc_plan_s``)."""
        super().reset_stats()
        self.stats.update(mpc_plans=0, mpc_fallbacks=0, mpc_boots=0, mpc_plan_s=[])

    def reset_state(self) -> None:
        """Forget the capacity memory and the boot ledger; read the scenario's diurnal profile."""
        super().reset_state()
        self._boots: list[tuple[int, float, int]] = []  # (datacenter, ready time s, servers)
        self._factor: Callable[[np.ndarray], np.ndarray] | None = None
        self._nominal_rate = float("nan")
        self.last_plan: PlanResult | None = None
        env = self.env
        if env is not None:
            sc = getattr(env.unwrapped, "scenario", None)
            if sc is not None:
                self._factor = fleet_diurnal_factor(sc)
                self._nominal_rate = float(sc.rate_per_s)

    def episode_stats(self) -> dict[str, float]:
        """The facility MILP's episode figures plus the plan's: plans, fallbacks, servers booted by
        plan, and the plan solve time (wall, mean and p95, s; reported, not used)."""
        out = super().episode_stats()
        st = self.stats
        ps = np.asarray(st["mpc_plan_s"], dtype=np.float64)
        out.update(mpc_plans=float(st["mpc_plans"]), mpc_fallbacks=float(st["mpc_fallbacks"]),
                   mpc_boots=float(st["mpc_boots"]), mpc_plan_s_mean=float(ps.mean()) if ps.size else float("nan"),
                   mpc_plan_s_p95=float(np.percentile(ps, 95)) if ps.size else float("nan"))
        return out

    # ------------------------------------------------------------------ forecasts
    def load_forecast_per_s(self, state: Any, now_rate_per_s: float, times_s: np.ndarray) -> np.ndarray:
        """The fleet's forecast arrival rate (requests/s) at episode times ``times_s`` (module
        docstring, ``load_forecast``), before the margin."""
        f = self.mpc.load_forecast
        t = np.asarray(times_s, dtype=np.float64)
        if callable(f):
            out = np.asarray(f(state, t), dtype=np.float64)
            if out.shape != t.shape or not np.all(np.isfinite(out)) or np.any(out < 0):
                raise ConfigError("mpc.load_forecast", f"the callable must return {t.shape} finite rates >= 0, got "
                                  f"shape {out.shape}")
            return out
        if f == "persistence" or self._factor is None:
            if f == "profile" and math.isfinite(self._nominal_rate):
                return np.full(t.shape, self._nominal_rate)
            return np.full(t.shape, now_rate_per_s)
        F = self._factor
        if f == "profile":
            return self._nominal_rate * F(t)
        f_now = float(F(np.array([float(state.time_s)]))[0])
        return now_rate_per_s * F(t) / max(f_now, 1e-6)

    def _ready_and_pending(self, state: Any, cp: CapacityProblem, starts: np.ndarray, lens: np.ndarray,
                           facts: CapacityFacts) -> tuple[np.ndarray, np.ndarray]:
        now = float(state.time_s)
        self._boots = [e for e in self._boots if e[1] > now + 1e-9]
        D = cp.up.size
        B = len(starts)
        pend = np.zeros((B, D))
        in_flight = np.zeros(D)
        ends = starts + lens
        waking = np.asarray(state.datacenters.waking_engines, dtype=np.float64)
        for d, ready_t, servers in self._boots:
            eng = float(servers * cp.engines_per_node[d])
            eng = min(eng, max(waking[d] - in_flight[d], 0.0))  # (what is still booting)
            if eng <= 0:
                continue
            in_flight[d] += eng
            r = ready_t - now
            share = np.clip((ends - r) / np.maximum(lens, 1e-12), 0.0, 1.0)
            pend[:, d] += eng * (share - np.concatenate([[0.0], share[:-1]]))
        ready = np.maximum(cp.usable_now.astype(np.float64) - in_flight, 0.0)
        return ready, pend

    # ------------------------------------------------------------------ capacity decision
    def plan_problem(self, state: Any, problem: PlacementProblem) -> PlanProblem:
        """The :class:`PlanProblem` of a capacity decision."""
        if self._cap_facts is None:
            self._cap_facts = CapacityFacts.from_env(self.env)
        facts = self._cap_facts
        cfg = self.config
        work = self._work_j if self._work_j is not None else np.zeros(problem.n_datacenters)
        # (the rate estimate itself, rate_z 0: the plan's load forecast starts from it)
        cp = capacity_problem(state, problem, facts, work, self.util_cap, 0.0, 0.0, cfg.violation_penalty_g, rate_z=0.0,
                              capacity_scale=self.capacity_scale)
        period = float(state.capacity_period_s)
        starts, lens = plan_blocks(period, self.mpc.horizon_s, self.mpc.block_s)
        fc = problem.carbon_forecast_g_per_kwh
        fc = np.zeros((problem.n_datacenters, 0)) if fc is None else fc
        ci = block_intensity_g_per_kwh(problem.carbon_g_per_kwh, fc, float(state.hour_utc), starts, lens)
        g = ci * problem.pue[None, :] / J_PER_KWH
        now_rate = float(cp.arrival_per_s)  # (margin 0 above: the fleet's rate now)
        now = float(state.time_s)
        lam = np.empty(len(starts))
        for b, (s, L) in enumerate(zip(starts, lens)):
            n_pts = max(int(math.ceil(L / FORECAST_SAMPLE_S)), 1)
            ts = now + s + np.linspace(0.0, L, n_pts + 1)
            lam[b] = float(self.load_forecast_per_s(state, now_rate, ts).max())
        lam *= 1.0 + self.load_margin
        ready, pend = self._ready_and_pending(state, cp, starts, lens, facts)
        # boot_s: the slowest GPU's boot when the datacenters' GPUs differ (a conservative ready time)
        return PlanProblem(cp=cp, starts=starts, lens=lens, g_per_j=g, arrival_per_s=lam, ready_now=ready,
                           pending_ready=pend, boot_s=float(np.max(facts.boot_s)), integer_blocks=self.mpc.integer_blocks,
                           mip_gap=self.mpc.plan_mip_gap)

    def decide_capacity(self, state: Any, problem: PlacementProblem) -> CapacityResult:
        """The plan's first block as the capacity decision (the one-period stage on failure)."""
        t0 = time.perf_counter()
        pp = self.plan_problem(state, problem)
        try:
            plan = solve_plan(pp, self.config.threads)
        except Exception as exc:  # noqa: BLE001 - any solver failure falls back, counted and logged
            plan = PlanResult(*(np.zeros((1, 1)),) * 6, float("nan"), f"error: {type(exc).__name__}: {exc}", ok=False)
        st = self.stats
        st["mpc_plans"] += 1
        st["mpc_plan_s"].append(time.perf_counter() - t0)
        if not plan.ok and pp.cp.up.any():
            st["mpc_fallbacks"] += 1
            log.warning("milp-mpc: plan failed at t=%.1f s (%s); the one-period capacity stage decides", state.time_s,
                        plan.status)
            return super().decide_capacity(state, problem)
        self.last_plan = plan
        awake = np.rint(plan.awake[0]).astype(np.int64)
        servers = np.rint(plan.servers[0]).astype(np.int64)
        now = float(state.time_s)
        booted = np.maximum(servers - np.asarray(state.datacenters.servers_on, dtype=np.int64), 0)
        for d in np.flatnonzero(booted):
            self._boots.append((int(d), now + pp.boot_s, int(booted[d])))
        st["mpc_boots"] += int(booted.sum())
        st["capacity_s"].append(time.perf_counter() - t0)
        st["capacity_status"].append(plan.status)
        return CapacityResult(awake, servers, plan.rate_per_s[0].copy(), plan.objective_g, plan.status)
