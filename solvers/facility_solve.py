"""Solving the facility MILP: the program as highspy arrays (:func:`solve_highspy`, the hot path:
LP bound, rounding, warm-started branch-and-bound under a deadline) and as a Pyomo model
(:func:`solve_pyomo`, the readable reference). Formulation: :mod:`solvers.facility`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from carbon_gym.numeric import exact_dot

from ._highs import new_highs
from ._highs import run as run_highs
from .facility_model import FacilityConfig, FacilityData, class_greedy, engine_terms

__all__ = ["SolveResult", "solve_highspy", "solve_pyomo"]


# ---------------------------------------------------------------------------------- MILP arrays
@dataclass
class _Layout:
    """Column layout: x (P), defer (C), y, s, o_seq (D), o_tok (D), o_kv (D)."""

    n_x: int
    defer0: int
    y0: int
    y_dc: np.ndarray
    s0: int
    oseq0: int
    otok0: int
    okv0: int
    n_cols: int


def _layout(data: FacilityData) -> _Layout:
    d_n = data.n_datacenters
    n_x = int(data.pc.size)
    y_dc = np.flatnonzero(data.idle > 0)
    n_s = y_dc.size if data.engine_model == "spread" else 0
    defer0 = n_x
    y0 = defer0 + data.n_classes
    s0 = y0 + y_dc.size
    oseq0 = s0 + n_s
    otok0 = oseq0 + d_n
    okv0 = otok0 + d_n
    return _Layout(n_x, defer0, y0, y_dc, s0, oseq0, otok0, okv0, okv0 + d_n)


def _build_arrays(data: FacilityData, integer_x: bool = True) -> tuple[_Layout, dict[str, np.ndarray]]:
    """Column bounds/costs/integrality and the row-wise constraint matrix of the program."""
    lay = _layout(data)
    d_n = data.n_datacenters
    c_n = data.n_classes
    n_x = lay.n_x
    inf = np.inf
    cost = np.zeros(lay.n_cols)
    lo = np.zeros(lay.n_cols)
    hi = np.full(lay.n_cols, inf)
    integ = np.zeros(lay.n_cols, dtype=np.int32)
    cost[:n_x] = data.cost
    hi[:n_x] = data.count[data.pc]
    cost[lay.defer0:lay.y0] = data.defer_cost
    hi[lay.defer0:lay.y0] = data.count
    if integer_x:
        integ[:lay.y0] = 1
    cost[lay.y0:lay.s0] = data.fixed_g[lay.y_dc]
    hi[lay.y0:lay.s0] = data.idle[lay.y_dc]
    if data.engine_model == "pack":
        integ[lay.y0:lay.s0] = 1
    hi[lay.s0:lay.oseq0] = 1.0
    integ[lay.s0:lay.oseq0] = 1
    cost[lay.oseq0:lay.otok0] = data.lam
    cost[lay.otok0:lay.okv0] = data.lam_tok
    cost[lay.okv0:] = data.lam_kv

    rr: list[np.ndarray] = []
    cc: list[np.ndarray] = []
    vv: list[np.ndarray] = []
    rlo: list[np.ndarray] = []
    rhi: list[np.ndarray] = []
    nrow = 0

    def add(r: np.ndarray, c: np.ndarray, v: Any) -> None:
        r = np.asarray(r, np.int64)
        rr.append(r)
        cc.append(np.asarray(c, np.int64))
        vv.append(np.broadcast_to(np.asarray(v, np.float64), r.shape))

    xi = np.arange(n_x)
    ar = np.arange(d_n)
    # assignment
    add(data.pc, xi, 1.0)
    add(np.arange(c_n), lay.defer0 + np.arange(c_n), 1.0)
    rlo.append(data.count)
    rhi.append(data.count)
    nrow += c_n
    # TPOT / batch
    add(nrow + data.pd, xi, 1.0)
    add(nrow + ar, lay.oseq0 + ar, -1.0)
    if data.engine_model == "pack" and lay.y_dc.size:
        add(nrow + lay.y_dc, lay.y0 + np.arange(lay.y_dc.size), -data.spe[lay.y_dc])
    rlo.append(np.full(d_n, -inf))
    rhi.append(data.cap_seq)
    nrow += d_n
    # TTFT / prefill, in mean prompts: (Pr_d - o_tok_d) / pbar <= T_d / pbar   (rows scaled)
    ps = data.lam / data.lam_tok
    add(nrow + data.pd, xi, data.pair_prompt / ps)
    add(nrow + ar, lay.otok0 + ar, -1.0 / ps)
    rlo.append(np.full(d_n, -inf))
    rhi.append(data.tok_cap / ps)
    nrow += d_n
    # KV, in mean request footprints (rows scaled)
    ks = data.lam / data.lam_kv
    add(nrow + data.pd, xi, data.kv[data.pc] / ks)
    add(nrow + ar, lay.okv0 + ar, -1.0 / ks)
    rlo.append(np.full(d_n, -inf))
    rhi.append(np.minimum(data.free_kv / ks, 1e7))
    nrow += d_n
    # spread: y = min(K, I)
    if data.engine_model == "spread" and lay.y_dc.size:
        ny = lay.y_dc.size
        pos = np.full(d_n, -1)
        pos[lay.y_dc] = np.arange(ny)
        sel = pos[data.pd] >= 0
        add(nrow + pos[data.pd[sel]], xi[sel], 1.0)
        add(nrow + np.arange(ny), lay.y0 + np.arange(ny), -1.0)
        add(nrow + np.arange(ny), lay.s0 + np.arange(ny), -data.big_m[lay.y_dc])
        rlo.append(np.full(ny, -inf))
        rhi.append(np.zeros(ny))
        nrow += ny
        add(nrow + np.arange(ny), lay.y0 + np.arange(ny), 1.0)
        add(nrow + np.arange(ny), lay.s0 + np.arange(ny), -data.idle[lay.y_dc])
        rlo.append(np.zeros(ny))
        rhi.append(np.full(ny, inf))
        nrow += ny
        # valid inequalities (tighten the LP): y_d >= min(1, I_d / N_c) x_cd, since
        # min(K_d, I_d) >= min(x_cd, I_d) >= x_cd min(1, I_d / N_c) for 0 <= x_cd <= N_c
        cut = np.flatnonzero(sel) if _CUTS else np.zeros(0, np.int64)
        nc = cut.size
        if nc:
            coef = np.minimum(1.0, data.idle[data.pd[cut]] / np.maximum(data.count[data.pc[cut]], 1.0))
            add(nrow + np.arange(nc), cut, coef)
            add(nrow + np.arange(nc), lay.y0 + pos[data.pd[cut]], -1.0)
            rlo.append(np.full(nc, -inf))
            rhi.append(np.zeros(nc))
            nrow += nc
    r = np.concatenate(rr)
    c = np.concatenate(cc)
    v = np.concatenate(vv)
    o = np.lexsort((c, r))
    r, c, v = r[o], c[o], v[o]
    start = np.zeros(nrow + 1, dtype=np.int32)
    np.cumsum(np.bincount(r, minlength=nrow), out=start[1:])
    arrays = dict(cost=cost, lo=lo, hi=hi, integ=integ, rlo=np.concatenate(rlo), rhi=np.concatenate(rhi),
                  start=start, index=c.astype(np.int32), value=v, nrow=np.array(nrow))
    return lay, arrays


def _complete_solution(data: FacilityData, lay: _Layout, x: np.ndarray, defer: np.ndarray) -> np.ndarray:
    """The full column vector (optimal y, s, overflows) for pair counts ``x`` and ``defer``."""
    d_n = data.n_datacenters
    col = np.zeros(lay.n_cols)
    col[:lay.n_x] = x
    col[lay.defer0:lay.y0] = defer
    k = np.bincount(data.pd, weights=x, minlength=d_n)
    pr = np.bincount(data.pd, weights=x * data.pair_prompt, minlength=d_n)
    kv = np.bincount(data.pd, weights=x * data.kv[data.pc], minlength=d_n)
    y, _, over = engine_terms(data, k)
    col[lay.y0:lay.s0] = y[lay.y_dc]
    if data.engine_model == "spread":
        col[lay.s0:lay.oseq0] = (k[lay.y_dc] > data.idle[lay.y_dc]).astype(float)
    col[lay.oseq0:lay.otok0] = over
    col[lay.otok0:lay.okv0] = np.maximum(0.0, pr - data.tok_cap)
    col[lay.okv0:] = np.maximum(0.0, kv - data.free_kv)
    return col




@dataclass
class SolveResult:
    """One MILP solve: ``x`` (P,) pair counts and ``defer`` (C,) (None without an incumbent),
    ``status`` text, ``objective`` (grams + penalties), ``mip_gap``, timings in seconds (wall
    clock, reported only), the work done (``lp_iterations``: simplex iterations of the LP
    relaxation, ``bb_nodes``: branch-and-bound nodes, ``bb_work``: HiGHS interrupt check points
    passed in branch-and-bound) and ``limit``: the limit that stopped the solve before the gap was
    reached (``""`` none, ``"lp_iterations"``, ``"bb_nodes"``, ``"bb_work"``, ``"bb_columns"``: the program is
    larger than ``bb_max_columns``, ``"time"``: the wall-clock deadline of ``time_limit_s``)."""

    x: np.ndarray | None
    defer: np.ndarray | None
    status: str
    objective: float
    build_s: float
    solve_s: float
    mip_gap: float = float("nan")
    lp_iterations: int = 0
    bb_nodes: int = 0
    bb_work: int = 0
    limit: str = ""


#: HiGHS options of the hot path: the greedy incumbent is handed over, so the expensive sub-MIP
#: heuristics (RINS / RENS) are off; they cost 0.1-0.3 s per solve at 1,000 requests and rarely
#: beat the incumbent by more than the MIP gap (measured with eval/bench_solvers.py).
#: The feasibility-jump heuristic is off too: it does not check HiGHS's interrupt callback and
#: ran for 0.3-0.5 s at 1,000 requests, blowing the deadline.
#: Per-pair valid inequalities y_d >= min(1, I_d / N_c) x_cd (spread engine model). On the
#: problems of eval/bench_solvers.py they cut the certified gap (p50) from 39% to 12% at low load
#: and from 9% to 0.4% at moderate load for a few ms; on synthetic problems with many partly
#: idle datacenters they made the LP 5-10x slower.
_CUTS = True
_HIGHS_OPTIONS: dict[str, Any] = {"mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False,
                                  "mip_heuristic_run_feasibility_jump": False}


def solve_highspy(  # noqa: C901 - one pass through the solve's stages, each a few lines
    data: FacilityData, cfg: FacilityConfig = FacilityConfig(), warm: tuple[np.ndarray, np.ndarray] | None = None
) -> SolveResult:
    """Solve the program with highspy arrays, within the work limits of ``cfg`` (and, when
    ``cfg.time_limit_s`` is set, within that wall-clock budget, build included).

    1. LP relaxation (dual simplex, no presolve: a few ms at 2,000 requests), at most
       ``cfg.lp_iteration_limit`` simplex iterations -> lower bound.
    2. Rounding: the LP counts rounded down, the requests left placed by :func:`class_greedy`;
       the better of this and ``warm`` (pair counts, defer counts) is the incumbent.
    3. If the incumbent is within ``cfg.mip_gap`` of the LP bound, it is returned (the gap is
       certified by the bound). Otherwise, on programs with at most ``cfg.bb_max_columns`` x
       columns, the MILP is solved by HiGHS branch-and-bound from that incumbent until the gap,
       ``cfg.bb_node_limit`` nodes or ``cfg.bb_work_limit`` of HiGHS's interrupt check points
       (counted by the interrupt callback: the same points on every run); larger programs return
       the incumbent and its certified gap.

    With the default ``time_limit_s=None`` nothing depends on the wall clock: HiGHS runs on one
    thread with a fixed seed, so the same problem gets the same answer on any machine under any
    load. With a time limit the LP and branch-and-bound also stop at the deadline (the interrupt
    callback enforces it, as HiGHS's own time limit is only checked between root-node phases and
    overran it by up to 1 s here) and branch-and-bound is skipped when less than 20 ms remain.

    ``status`` says which step produced the answer; ``mip_gap`` is the certified relative gap;
    ``limit`` the limit that stopped the solve early, if any.
    """
    import highspy

    t0 = time.perf_counter()
    timed = cfg.time_limit_s is not None
    deadline = t0 + float(cfg.time_limit_s) if cfg.time_limit_s is not None else np.inf
    lay, arr = _build_arrays(data)
    integ = arr["integ"].copy()
    h = new_highs(cfg.threads)
    h.setOptionValue("presolve", "off")
    status = h.passModel(
        lay.n_cols, int(arr["nrow"]), int(arr["value"].size), int(highspy.MatrixFormat.kRowwise),
        int(highspy.ObjSense.kMinimize), 0.0, arr["cost"], arr["lo"], arr["hi"], arr["rlo"], arr["rhi"],
        arr["start"], arr["index"], arr["value"], np.zeros_like(integ),
    )
    if status == highspy.HighsStatus.kError:
        return SolveResult(None, None, "model_error", float("nan"), time.perf_counter() - t0, 0.0)
    t1 = time.perf_counter()
    if timed:
        h.setOptionValue("time_limit", max(deadline - t1, 1e-3))
    h.setOptionValue("simplex_iteration_limit", int(cfg.lp_iteration_limit))
    run_highs(h)
    lp_status = h.getModelStatus()
    lp_ok = lp_status == highspy.HighsModelStatus.kOptimal
    lp_iters = int(h.getInfo().simplex_iteration_count)
    limit = ""
    if lp_status == highspy.HighsModelStatus.kIterationLimit:
        limit = "lp_iterations"
    elif lp_status == highspy.HighsModelStatus.kTimeLimit:
        limit = "time"
    bound = float(h.getInfo().objective_function_value) if lp_ok else -np.inf
    cost = arr["cost"]
    candidates: list[tuple[float, np.ndarray, np.ndarray, str]] = []
    if lp_ok:
        col = np.asarray(h.getSolution().col_value)
        xf = np.floor(col[:lay.n_x] + 1e-6)
        df = np.floor(col[lay.defer0:lay.y0] + 1e-6)
        xr, dr = class_greedy(data, xf, df)
        candidates.append((exact_dot(cost, _complete_solution(data, lay, xr, dr)), xr, dr, "lp-rounding"))
    if warm is not None:
        candidates.append((exact_dot(cost, _complete_solution(data, lay, warm[0], warm[1])), warm[0], warm[1], "greedy"))
    best = min(candidates, key=lambda t: t[0]) if candidates else None

    def gap_of(obj: float) -> float:
        return (obj - bound) / max(abs(obj), 1e-12) if np.isfinite(bound) else float("inf")

    def result(x: Any, defer: Any, text: str, obj: float, t_end: float, gap: float = float("nan"), **kw: Any) -> SolveResult:
        return SolveResult(x, defer, text, obj, t1 - t0, t_end - t1, gap, lp_iterations=lp_iters, limit=limit, **kw)

    too_big = lay.n_x > cfg.bb_max_columns
    out_of_time = timed and deadline - time.perf_counter() < 0.02  # (wall clock: only with a time limit)
    no_bb = too_big or out_of_time or cfg.bb_node_limit == 0
    if best is not None and gap_of(best[0]) <= cfg.mip_gap:
        return result(best[1], best[2], best[3], best[0], time.perf_counter(), gap_of(best[0]))
    if no_bb:
        if not limit:
            limit = "bb_columns" if too_big else "time" if out_of_time else "bb_nodes"
        if best is None:
            return result(None, None, "no incumbent (LP relaxation unsolved)", float("nan"), time.perf_counter())
        return result(best[1], best[2], best[3], best[0], time.perf_counter(), gap_of(best[0]))
    # branch-and-bound from the incumbent
    h.setOptionValue("presolve", "choose")
    h.setOptionValue("mip_rel_gap", float(cfg.mip_gap))
    h.setOptionValue("mip_max_nodes", int(cfg.bb_node_limit))
    h.setOptionValue("simplex_iteration_limit", 2**31 - 1)  # (the LP's limit; branch-and-bound has bb_work_limit)
    for key, value in _HIGHS_OPTIONS.items():
        h.setOptionValue(key, value)
    h.changeColsIntegrality(lay.n_cols, np.arange(lay.n_cols, dtype=np.int32), integ)
    if best is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(_complete_solution(data, lay, best[1], best[2]))
        sol.value_valid = True
        h.setSolution(sol)
    if timed:
        h.setOptionValue("time_limit", max(deadline - time.perf_counter(), 1e-3))
    stopped: list[str] = []
    checks = [0]
    work_limit = int(cfg.bb_work_limit)

    def interrupt(event: Any) -> None:
        checks[0] += 1
        if checks[0] > work_limit:
            if not stopped:
                stopped.append("bb_work")
            event.interrupt()
        elif timed and time.perf_counter() >= deadline:
            if not stopped:
                stopped.append("time")
            event.interrupt()

    h.cbMipInterrupt.subscribe(interrupt)
    run_highs(h)
    t2 = time.perf_counter()
    info = h.getInfo()
    model_status = h.getModelStatus()
    text = h.modelStatusToString(model_status)
    nodes = int(info.mip_node_count)
    if stopped:
        limit = stopped[0]
    elif model_status == highspy.HighsModelStatus.kSolutionLimit:  # (HiGHS's status for mip_max_nodes)
        limit = "bb_nodes"
    elif model_status == highspy.HighsModelStatus.kIterationLimit:
        limit = "lp_iterations"
    elif model_status == highspy.HighsModelStatus.kTimeLimit:
        limit = "time"
    else:
        limit = ""
    work = {"bb_nodes": nodes, "bb_work": min(checks[0], work_limit)}
    bnd = max(bound, float(info.mip_dual_bound)) if np.isfinite(info.mip_dual_bound) else bound
    if info.primal_solution_status == 2:
        col = np.asarray(h.getSolution().col_value)
        obj = float(info.objective_function_value)
        if best is None or obj < best[0] - 1e-12:
            g = (obj - bnd) / max(abs(obj), 1e-12)
            return result(np.rint(col[:lay.n_x]), np.rint(col[lay.defer0:lay.y0]), f"milp: {text}", obj, t2, g, **work)
    if best is None:
        return result(None, None, f"milp: {text}", float("nan"), t2, **work)
    return result(best[1], best[2], f"{best[3]} (milp: {text})", best[0], t2, (best[0] - bnd) / max(abs(best[0]), 1e-12), **work)


def solve_pyomo(data: FacilityData, cfg: FacilityConfig = FacilityConfig()) -> SolveResult:
    """Reference formulation in Pyomo (the same program as :func:`solve_highspy`), solved by
    HiGHS through ``appsi_highs``. Written to be read against the module docstring."""
    import pyomo.environ as pyo
    from pyomo.contrib.appsi.base import TerminationCondition

    t0 = time.perf_counter()
    d_n = data.n_datacenters
    pc, pd, count = data.pc, data.pd, data.count
    at_d = [np.flatnonzero(pd == d).tolist() for d in range(d_n)]
    of_c = [np.flatnonzero(pc == c).tolist() for c in range(data.n_classes)]
    m = pyo.ConcreteModel()
    m.C = pyo.Set(initialize=range(data.n_classes))
    m.D = pyo.Set(initialize=range(d_n))
    m.P = pyo.Set(initialize=range(pc.size))
    m.Y = pyo.Set(initialize=[int(d) for d in np.flatnonzero(data.idle > 0)])
    m.x = pyo.Var(m.P, domain=pyo.NonNegativeIntegers, bounds=lambda m, i: (0, count[pc[i]]))
    m.defer = pyo.Var(m.C, domain=pyo.NonNegativeIntegers, bounds=lambda m, c: (0, count[c]))
    if data.engine_model == "pack":
        m.y = pyo.Var(m.Y, domain=pyo.NonNegativeIntegers, bounds=lambda m, d: (0, data.idle[d]))
    else:
        m.y = pyo.Var(m.Y, domain=pyo.NonNegativeReals, bounds=lambda m, d: (0, data.idle[d]))
        m.s = pyo.Var(m.Y, domain=pyo.Binary)
    m.oseq = pyo.Var(m.D, domain=pyo.NonNegativeReals)
    m.otok = pyo.Var(m.D, domain=pyo.NonNegativeReals)
    m.okv = pyo.Var(m.D, domain=pyo.NonNegativeReals)

    def added(m: Any, d: int) -> Any:
        return sum(m.x[i] for i in at_d[d])

    m.obj = pyo.Objective(
        expr=sum((data.kappa[i] + data.lam * data.miss[i]) * m.x[i] for i in m.P)
        + sum(data.fixed_g[d] * m.y[d] for d in m.Y)
        + sum(data.lam * m.oseq[d] + data.lam_tok * m.otok[d] + data.lam_kv * m.okv[d] for d in m.D)
        + sum(data.defer_cost[c] * m.defer[c] for c in m.C),
        sense=pyo.minimize,
    )
    m.assign = pyo.Constraint(m.C, rule=lambda m, c: sum(m.x[i] for i in of_c[c]) + m.defer[c] == count[c])

    def tpot_rule(m: Any, d: int) -> Any:
        lhs = added(m, d) - m.oseq[d]
        if data.engine_model == "pack" and d in m.Y:
            lhs = lhs - data.spe[d] * m.y[d]
        return lhs <= data.cap_seq[d]

    m.tpot = pyo.Constraint(m.D, rule=tpot_rule)
    tok_cap = data.tok_cap
    m.ttft = pyo.Constraint(m.D, rule=lambda m, d: sum(data.pair_prompt[i] * m.x[i] for i in at_d[d]) - m.otok[d]
                            <= tok_cap[d])
    m.kv = pyo.Constraint(m.D, rule=lambda m, d: sum(data.kv[pc[i]] * m.x[i] for i in at_d[d]) - m.okv[d] <= data.free_kv[d])
    if data.engine_model == "spread":
        m.wake_a = pyo.Constraint(m.Y, rule=lambda m, d: added(m, d) - m.y[d] - data.big_m[d] * m.s[d] <= 0)
        m.wake_b = pyo.Constraint(m.Y, rule=lambda m, d: m.y[d] - data.idle[d] * m.s[d] >= 0)
    t1 = time.perf_counter()
    from pyomo.contrib.appsi.solvers import Highs  # the APPSI interface behind SolverFactory("appsi_highs")

    solver = Highs()
    if cfg.time_limit_s is not None:
        solver.config.time_limit = float(cfg.time_limit_s)
    solver.config.mip_gap = float(cfg.mip_gap)
    solver.config.load_solution = False
    solver.highs_options = {"threads": int(cfg.threads), "random_seed": 0}
    res = solver.solve(m)
    t2 = time.perf_counter()
    if res.best_feasible_objective is None or res.termination_condition == TerminationCondition.error:
        return SolveResult(None, None, str(res.termination_condition), float("nan"), t1 - t0, t2 - t1)
    res.solution_loader.load_vars()
    x = np.array([round(pyo.value(m.x[i])) for i in range(pc.size)], dtype=np.float64)
    defer = np.array([round(pyo.value(m.defer[c])) for c in range(data.n_classes)], dtype=np.float64)
    return SolveResult(x, defer, str(res.termination_condition), float(res.best_feasible_objective), t1 - t0, t2 - t1)


