"""Facility MILP: optimality against enumeration, class vs per-request form, Pyomo == highspy,
hard constraints, the independent-cost double count of the per-request ILP, fallback."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from carbon_gym.errors import ConfigError
from solvers.facility import (
    FacilityConfig,
    FacilityMILP,
    assignment_from_counts,
    class_greedy,
    compile_facility,
    facility_greedy,
    facility_objective,
    marginal_energy_j,
    solve_highspy,
    solve_pyomo,
)
from solvers.per_request import PerRequestILP, per_request_costs
from solvers.problem import PlacementProblem, synthetic_problem

EXACT = dict(mip_gap=0.0, time_limit_s=30.0, bb_max_columns=10_000, bb_node_limit=10**9, bb_work_limit=10**9,
             lp_iteration_limit=10**9)


def tight_problem(seed: int, n_requests: int, n_dc: int = 3, engines: int = 2) -> PlacementProblem:
    """A small instance where every term of the objective can matter: few engines (fixed
    energy of waking them, TPOT room), slow prefill (the token budget binds), little free KV,
    requests that waited long (TTFT misses)."""
    rng = np.random.default_rng(seed)
    p = synthetic_problem(rng, n_requests, n_datacenters=n_dc, n_regions=2, load=0.6, engines_per_dc=engines,
                          waited_max_s=1.6)
    p.busy_engines = rng.integers(0, engines + 1, n_dc)
    p.running = p.busy_engines * rng.integers(0, 4, n_dc).astype(float)
    p.queue_len = np.zeros(n_dc)
    p.prefill_s_per_token = rng.uniform(2e-4, 1.5e-3, n_dc)
    p.free_kv_tokens = rng.uniform(500, 4000, n_dc)
    p.max_seqs_per_engine = 2
    return p


def all_assignments(p: PlacementProblem):
    allowed = p.allowed & p.up[None, :]
    choices = [list(np.flatnonzero(allowed[r])) + [p.defer] for r in range(p.n_requests)]
    for combo in itertools.product(*choices):
        yield np.array(combo, dtype=np.int64)


@pytest.mark.parametrize("engine_model", ["spread", "pack"])
@pytest.mark.parametrize("seed", range(4))
def test_binary_milp_is_optimal_by_enumeration(seed: int, engine_model: str) -> None:
    p = tight_problem(seed, n_requests=4)
    cfg = FacilityConfig(binary=True, engine_model=engine_model, **EXACT)
    pol = FacilityMILP(config=cfg)
    a = pol.place(p)
    got = facility_objective(p, a, cfg)["objective_g"]
    best = min(facility_objective(p, x, cfg)["objective_g"] for x in all_assignments(p))
    assert pol.stats["fallbacks"] == 0
    assert got == pytest.approx(best, rel=1e-7, abs=1e-9)
    # the solver's own objective is the same number (binary form == per-request objective)
    assert pol.stats["objective_g"][-1] == pytest.approx(best, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_milp_never_worse_than_per_request_ilps(seed: int) -> None:
    p = tight_problem(seed, n_requests=8, n_dc=4, engines=3)
    cfg = FacilityConfig(binary=True, **EXACT)
    milp = facility_objective(p, FacilityMILP(config=cfg).place(p), cfg)["objective_g"]
    for state_aware in (False, True):
        ilp = facility_objective(p, PerRequestILP(state_aware=state_aware).place(p), cfg)["objective_g"]
        assert milp <= ilp + 1e-9
    assert milp <= facility_objective(p, facility_greedy(p, cfg), cfg)["objective_g"] + 1e-9


@pytest.mark.parametrize("seed", range(5))
def test_class_form_gap_to_binary_form(seed: int) -> None:
    """The class form's placement, scored by the per-request objective, is within a few % of
    the per-request binary form's optimum (and never better, which would contradict optimality)."""
    rng = np.random.default_rng(100 + seed)
    p = synthetic_problem(rng, 24, n_datacenters=4, n_regions=2, load=0.7, engines_per_dc=4)
    p.prefill_s_per_token = rng.uniform(3e-4, 1e-3, 4)
    exact = FacilityConfig(binary=True, **EXACT)
    binary = facility_objective(p, FacilityMILP(config=exact).place(p), exact)["objective_g"]
    cls_cfg = FacilityConfig(**EXACT)
    cls = FacilityMILP(config=cls_cfg)
    a = cls.place(p)
    scored = facility_objective(p, a, exact)["objective_g"]
    assert cls.stats["n_classes"][-1] < p.n_requests  # requests were actually grouped
    assert binary <= scored + 1e-9
    assert (scored - binary) / binary < 0.15


def test_pyomo_reference_equals_highspy() -> None:
    for seed in range(3):
        p = tight_problem(seed, n_requests=10, n_dc=3, engines=3)
        for engine_model in ("spread", "pack"):
            cfg = FacilityConfig(engine_model=engine_model, **EXACT)
            data = compile_facility(p, cfg)
            a = solve_highspy(data, cfg)
            b = solve_pyomo(data, cfg)
            assert a.x is not None and b.x is not None
            assert a.objective == pytest.approx(b.objective, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_hard_constraints(seed: int) -> None:
    """Every request placed exactly once (or deferred), only where allowed and up; requests with
    no allowed datacenter are deferred."""
    rng = np.random.default_rng(seed)
    p = synthetic_problem(rng, 300, down_fraction=0.25, load=0.8)
    p.allowed[:5] = False  # nowhere to go
    p.allowed[5:40, : p.n_datacenters // 2] = False
    for pol in (FacilityMILP(), FacilityMILP(engine_model="pack")):
        a = pol.place(p)
        assert a.shape == (p.n_requests,)
        placed = a < p.defer
        ok = p.allowed & p.up[None, :]
        assert ok[np.flatnonzero(placed), a[placed]].all()
        assert (a[:5] == p.defer).all()
        data = compile_facility(p, pol.config)
        counts = np.bincount(data.class_of, minlength=data.n_classes)
        assert counts.sum() == p.n_requests


def test_independent_cost_double_counts_fixed_energy() -> None:
    """Two identical requests that fit one idle engine: the per-request ILP charges each the
    full engine increment (P_dec(1) - P_idle) over its decode time; the facility objective pays
    the fixed energy of that engine once."""
    p = PlacementProblem(
        origin=[0, 0], prompt_tokens=[500, 500], output_tokens=[200, 200], waited_s=[0.0, 0.0],
        network_s=[[0.02], [0.02]], allowed=[[True], [True]], carbon_g_per_kwh=[400.0], pue=[1.2], up=[True],
        n_engines=[1], busy_engines=[0], running=[0], queue_len=[0], free_kv_tokens=[1e6], est_queue_wait_s=[0.0],
        prefill_s_per_token=[1e-4], tpot_now_s=[0.0125], tpot_idle_s=[0.0125], tpot_slope_s_per_seq=[1e-4],
    )
    g = 400.0 * 1.2 / 3.6e6
    p1 = p.decode_power_w(1.0)
    full = (p.gpu_prefill_w - p.gpu_idle_w) * 500 * 1e-4 + (p1 - p.gpu_idle_w) * 200 * 0.0125  # J, tp = 1
    for r in (0, 1):
        cost = per_request_costs(p, r, np.zeros(1), np.array([0.0125]), violation_penalty_g=1.0)
        assert cost[0] == pytest.approx(g * full, rel=1e-12)
    ilp = PerRequestILP(state_aware=False)
    assert (ilp.place(p) == 0).all()
    # facility: the woken engine's fixed energy F is paid once for the two requests
    cfg = FacilityConfig(binary=True, engine_model="pack")
    obj = facility_objective(p, np.array([0, 0]), cfg)
    _, fixed = marginal_energy_j(p)
    hold = 500 * 1e-4 + 200 * 0.0125
    assert fixed[0] == pytest.approx((p1 - p.gpu_idle_w) * hold, rel=1e-12)
    assert obj["fixed_g"] == pytest.approx(g * fixed[0], rel=1e-12)
    # the per-request ILPs' total counts that fixed energy twice
    per_request_total_fixed = 2 * g * (p1 - p.gpu_idle_w) * 200 * 0.0125
    assert per_request_total_fixed == pytest.approx(2 * obj["fixed_g"] * (200 * 0.0125) / hold, rel=1e-12)
    assert obj["fixed_g"] < per_request_total_fixed


def test_forced_solver_failure_falls_back_and_is_counted(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    rng = np.random.default_rng(0)
    p = synthetic_problem(rng, 200, load=0.5)

    def boom(*args, **kwargs):
        raise RuntimeError("solver crashed")

    monkeypatch.setattr("solvers.facility.solve_highspy", boom)
    pol = FacilityMILP()
    with caplog.at_level("WARNING", logger="solvers.facility"):
        a = pol.place(p)
    assert pol.stats["fallbacks"] == 1 and pol.stats["solves"] == 1
    assert "solver crashed" in pol.stats["fallback_reasons"][0]
    assert "falls back" in caplog.text
    np.testing.assert_array_equal(a, facility_greedy(p, pol.config))


def test_no_incumbent_falls_back() -> None:
    """No warm start and no time: the LP cannot finish, there is no incumbent -> fallback."""
    rng = np.random.default_rng(1)
    p = synthetic_problem(rng, 400, load=0.5)
    pol = FacilityMILP(time_limit_s=0.0, warm_start=False)
    a = pol.place(p)
    assert pol.stats["fallbacks"] == 1
    assert "no incumbent" in pol.stats["fallback_reasons"][0]
    np.testing.assert_array_equal(a, facility_greedy(p, pol.config))


def test_class_greedy_and_disaggregation_are_consistent() -> None:
    rng = np.random.default_rng(3)
    p = synthetic_problem(rng, 500, load=0.7)
    cfg = FacilityConfig()
    data = compile_facility(p, cfg)
    x, defer = class_greedy(data)
    assert np.allclose(np.bincount(data.pc, weights=x, minlength=data.n_classes) + defer, data.count)
    a = assignment_from_counts(p, data, x, defer)
    table = np.zeros((data.n_classes, p.n_datacenters + 1))
    np.add.at(table, (data.class_of, a), 1)
    np.testing.assert_array_equal(table[data.pc, data.pd], x)


def test_deterministic_and_timed() -> None:
    rng = np.random.default_rng(5)
    p = synthetic_problem(rng, 800, load=0.6)
    # the default has no wall-clock limit: the two solves stop at the same point however loaded
    a1 = FacilityMILP().place(p)
    pol = FacilityMILP()
    a2 = pol.place(p)
    np.testing.assert_array_equal(a1, a2)
    assert len(pol.stats["place_s"]) == 1 and pol.stats["place_s"][0] > 0
    assert math.isfinite(pol.stats["mip_gap"][0]) and pol.stats["mip_gap"][0] >= -1e-9
    assert FacilityConfig().time_limit_s is None


def _busy_processes(n: int) -> list:
    """``n`` processes spinning on the CPU (the machine made busy); the caller kills them."""
    import subprocess
    import sys

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_work_limits_are_deterministic_on_a_busy_machine() -> None:
    """A mid-size program (4 datacenters, where branch-and-bound runs and its work limit binds):
    solved on a quiet machine and again with every core busy, the same answer, the same work."""
    rng = np.random.default_rng(0)
    p = synthetic_problem(rng, 100, n_datacenters=4, n_regions=2, load=0.5, engines_per_dc=8)
    cfg = FacilityConfig(bb_work_limit=15)
    data = compile_facility(p, cfg)
    warm = class_greedy(data)
    quiet = solve_highspy(data, cfg, warm)
    procs = _busy_processes(3)
    try:
        busy = solve_highspy(data, cfg, warm)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert quiet.limit == "bb_work" and quiet.bb_work == 15  # the work limit stopped it ...
    assert quiet.mip_gap > cfg.mip_gap  # ... before the gap was reached
    np.testing.assert_array_equal(quiet.x, busy.x)
    np.testing.assert_array_equal(quiet.defer, busy.defer)
    assert (quiet.objective, quiet.mip_gap, quiet.bb_nodes, quiet.bb_work, quiet.limit, quiet.status) == \
        (busy.objective, busy.mip_gap, busy.bb_nodes, busy.bb_work, busy.limit, busy.status)
    # more work, a better certified answer: the limit is what stopped it
    more = solve_highspy(data, replace(cfg, bb_work_limit=10**6), warm)
    assert more.objective <= quiet.objective and more.mip_gap < quiet.mip_gap


def test_work_budget_is_a_share_of_the_polling_period() -> None:
    """bb_work_limit is a 1 s poll's budget; a shorter poll gets its share (at least one check point),
    a longer one the whole budget; the MILP's solves stop at that share."""
    cfg = FacilityConfig(bb_work_limit=40)
    assert [cfg.work_limit_at(s) for s in (4.0, 1.0, 0.5, 0.25, 0.1, 0.001)] == [40, 40, 20, 10, 4, 1]
    assert FacilityConfig(bb_work_poll_s=None).work_limit_at(0.1) == 40
    assert FacilityConfig(bb_work_limit=0).work_limit_at(0.1) == 0
    rng = np.random.default_rng(0)
    for poll_s, want in ((0.25, 10), (0.5, 20)):
        p = synthetic_problem(rng, 100, n_datacenters=4, n_regions=2, load=0.5, engines_per_dc=8)
        p.poll_s = poll_s
        pol = FacilityMILP()
        pol.place(p)
        assert (pol.stats["limit"][-1], pol.stats["bb_work"][-1]) == ("bb_work", want), poll_s
    with pytest.raises(ConfigError, match="facility.bb_work_poll_s"):
        FacilityConfig(bb_work_poll_s=0.0)


def test_wall_clock_budget_is_an_option() -> None:
    """``time_limit_s`` restores the real-time behaviour: a solve stopped by the deadline says so."""
    rng = np.random.default_rng(0)
    p = synthetic_problem(rng, 100, n_datacenters=4, n_regions=2, load=0.5, engines_per_dc=8)
    cfg = FacilityConfig(time_limit_s=0.03, bb_work_limit=10**6)
    res = solve_highspy(compile_facility(p, cfg), cfg, class_greedy(compile_facility(p, cfg)))
    assert res.limit == "time" and res.x is not None
    pol = FacilityMILP(time_limit_s=0.03, bb_work_limit=10**6)
    pol.place(p)
    st = pol.episode_stats()
    assert st["time_limited"] == 1.0 and st["work_limited"] == 0.0 and st["solves"] == 1.0 and st["wall_solve_s"] > 0


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="engine_model"):
        FacilityConfig(engine_model="nope")
    with pytest.raises(ConfigError, match="unknown setting"):
        FacilityMILP(time_limit=1)
    with pytest.raises(ConfigError, match="max_prefill_share"):
        replace(FacilityConfig(), max_prefill_share=0.0)
    with pytest.raises(ConfigError, match="facility.bb_work_limit"):
        FacilityConfig(bb_work_limit=-1)
    with pytest.raises(ConfigError, match="facility.time_limit_s"):
        FacilityConfig(time_limit_s=-0.1)


def test_survives_highs_thread_pool_set_up_elsewhere() -> None:
    """Another HiGHS user in the process sized the thread pool differently first: the MILP still
    solves (no silent degradation to the greedy)."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 2)
    h.passModel(1, 1, 1, 2, 1, 0.0, np.ones(1), np.zeros(1), np.ones(1), np.ones(1), np.ones(1),
                np.array([0, 1], dtype=np.int32), np.array([0], dtype=np.int32), np.ones(1), np.zeros(1, dtype=np.int32))
    h.run()
    rng = np.random.default_rng(9)
    p = synthetic_problem(rng, 600, load=0.6)
    pol = FacilityMILP()
    pol.place(p)
    assert pol.stats["fallbacks"] == 0
    assert pol.stats["status"][0].startswith(("lp-rounding", "milp"))


def overloaded_problem(seed: int) -> PlacementProblem:
    """A paper-sized step (1,500 requests, 16 datacenters of 12 engines) whose pending prompts
    need more than the fleet's prompt-token budget at the prefill-share cap, on grids of very
    different carbon intensity."""
    rng = np.random.default_rng(seed)
    p = synthetic_problem(rng, 1500, load=0.6, waited_max_s=0.3, engines_per_dc=12)
    p.queue_len = np.zeros(p.n_datacenters)
    p.backlog_prompt_tokens = np.zeros(p.n_datacenters)
    p.est_queue_wait_s = np.zeros(p.n_datacenters)
    p.carbon_g_per_kwh = np.geomspace(20.0, 800.0, p.n_datacenters)
    return p


@pytest.mark.parametrize("seed", range(2))
def test_fleet_overload_is_spread_in_proportion_to_capacity(seed: int) -> None:
    """Regression (high load): when the whole fleet is over its prompt-token budget, the MILP
    places everything (no deferral) and no datacenter gets more than its capacity share of the
    prompts x (1 + slack) (plus one request), instead of piling the overflow on clean grids."""
    p = overloaded_problem(seed)
    cfg = FacilityConfig()
    cap = p.prefill_rate_cap_tokens(cfg.prefill_share)
    assert p.prompt_tokens.sum() > 1.1 * cap.sum()  # the fleet really is overloaded
    share = cap / cap.sum() * p.prompt_tokens.sum() * (1.0 + cfg.overload_slack)
    for pol in (FacilityMILP(config=cfg), FacilityGreedyPolicy(cfg)):
        a = pol.place(p)
        assert (a < p.defer).all()
        tokens = np.bincount(a, weights=p.prompt_tokens, minlength=p.n_datacenters)
        assert np.all(tokens <= share + p.prompt_tokens.max() + 1e-6), (tokens / share).round(2)
    # without the spreading, the same step piles far more than its share on some datacenter
    a = FacilityMILP(overload_spread=False).place(p)
    tokens = np.bincount(a, weights=p.prompt_tokens, minlength=p.n_datacenters)
    assert np.max(tokens / share) > 1.3


def FacilityGreedyPolicy(cfg: FacilityConfig):  # noqa: N802 - the greedy fallback as a placer
    from solvers.facility import FacilityGreedy

    return FacilityGreedy(config=cfg)


def test_backlog_shrinks_budget_and_adds_wait() -> None:
    """A datacenter's queued prompts use up its prefill budget for this poll and delay a new
    prompt by backlog x prefill s/token / engines."""
    rng = np.random.default_rng(4)
    p = synthetic_problem(rng, 200, n_datacenters=4, load=0.3)
    p.queue_len = np.array([0.0, 100.0, 0.0, 0.0])
    p.backlog_prompt_tokens = p.queue_len * 1000.0
    assert p.backlog_wait_s[1] == pytest.approx(1e5 * p.prefill_s_per_token[1] / p.n_engines[1])
    data = compile_facility(p, FacilityConfig())
    q0 = p.prefill_rate_cap_tokens(FacilityConfig().prefill_share)
    np.testing.assert_allclose(data.prefill_cap, np.maximum(q0 - p.backlog_prompt_tokens, 0.0))
    # default backlog: queue_len x the mean pending prompt
    q = replace(p, backlog_prompt_tokens=None)
    np.testing.assert_allclose(q.backlog_prompt_tokens, p.queue_len * p.prompt_tokens.mean())


def test_prefill_horizon_scales_the_per_poll_cap_at_short_periods_only() -> None:
    """``prefill_horizon_s`` H: Q0_d holds max(poll_s, H) seconds of prefill, the backlog still
    subtracted; None and any period >= H (the default 0.5 s at the scenarios' 1 s) give the
    one-period program."""
    rng = np.random.default_rng(5)
    p = synthetic_problem(rng, 200, n_datacenters=4, load=0.3)
    p.queue_len = np.array([0.0, 100.0, 0.0, 20.0])
    p.backlog_prompt_tokens = p.queue_len * 1000.0
    p.poll_s = 0.1
    share = FacilityConfig().prefill_share
    q0 = p.prefill_rate_cap_tokens(share)  # one 0.1 s period
    base = compile_facility(p, FacilityConfig(prefill_horizon_s=None))
    np.testing.assert_allclose(base.prefill_cap, np.maximum(q0 - p.backlog_prompt_tokens, 0.0))
    assert FacilityConfig().prefill_horizon_s == 0.5
    h05 = compile_facility(p, FacilityConfig())
    np.testing.assert_allclose(h05.prefill_cap, np.maximum(5.0 * q0 - p.backlog_prompt_tokens, 0.0))
    h1 = compile_facility(p, FacilityConfig(prefill_horizon_s=1.0))
    np.testing.assert_allclose(h1.prefill_cap, np.maximum(10.0 * q0 - p.backlog_prompt_tokens, 0.0))
    assert (h1.prefill_cap > base.prefill_cap).any()
    for poll_s in (1.0, 2.0):  # at or above the horizon: the default program, coefficient for coefficient
        q = replace(p, poll_s=poll_s)
        a, b = compile_facility(q, FacilityConfig(prefill_horizon_s=None)), compile_facility(q, FacilityConfig(prefill_horizon_s=1.0))
        np.testing.assert_array_equal(a.prefill_cap, b.prefill_cap)
        np.testing.assert_array_equal(a.tok_cap, b.tok_cap)
        c = compile_facility(q, FacilityConfig())
        np.testing.assert_array_equal(a.prefill_cap, c.prefill_cap)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="facility.prefill_horizon_s"):
            FacilityConfig(prefill_horizon_s=bad)
