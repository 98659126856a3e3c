"""The look-ahead baseline (``milp-mpc``, :mod:`solvers.mpc`): blocks and block carbon, the plan
against the one-period capacity stage on analytic cases (equal with a one-period horizon; a known
load step: the plan boots servers ahead of it, the one-period stage only follows; it never plans
below the SLO floor), settings errors, and the scheduler in the env."""

from __future__ import annotations

import numpy as np
import pytest

import carbon_gym
from carbon_gym.errors import ConfigError
from solvers.facility_capacity import CapacityProblem, solve_capacity
from solvers.mpc import (
    MPCFacilityMILP,
    MPCSettings,
    PlanProblem,
    block_intensity_g_per_kwh,
    fleet_diurnal_factor,
    plan_blocks,
    solve_plan,
)

SERVER_ON_W = 1000.0 + 8 * 63.0
BOOT_S = 345.0
CAP = 2.5  # requests/s per engine at the utilisation cap (5 x 0.5)


def two_dc(servers_now: tuple[int, int] = (4, 4), awake_now: tuple[int, int] = (32, 32), rate_per_s: float = 20.0,
           ci: tuple[float, float] = (100.0, 800.0)) -> CapacityProblem:
    """Two datacenters of 4 servers x 8 engines, d0 clean and d1 dirty (g/kWh), PUE 1."""
    sn, an = np.array(servers_now), np.array(awake_now)
    return CapacityProblem(
        up=np.array([True, True]), engines=np.array([32, 32]), servers=np.array([4, 4]), engines_per_node=np.array([8, 8]),
        awake_now=an, servers_now=sn, usable_now=np.minimum(an, 8 * sn), target_engines=an.copy(), target_servers=sn.copy(),
        g_per_j=np.array(ci) / 3.6e6, server_on_w=np.full(2, SERVER_ON_W), server_off_w=40.0,
        boot_j=np.full(2, BOOT_S * SERVER_ON_W), wake_j=20.0, work_j=np.full(2, 50.0), arrival_per_s=rate_per_s,
        engine_capacity_per_s=5.0, util_cap=0.5, horizon_s=30.0, penalty_g=1.0)


def plan_of(cp: CapacityProblem, lam_of_t, *, horizon_s: float = 3600.0, block_s: float = 300.0, ready_now=None,
            pending=None, integer_blocks: int = 1) -> PlanProblem:
    starts, lens = plan_blocks(30.0, horizon_s, block_s)
    lam = np.array([max(lam_of_t(t) for t in np.linspace(s, s + L, 7)) for s, L in zip(starts, lens)])
    B = len(starts)
    return PlanProblem(cp=cp, starts=starts, lens=lens, g_per_j=np.tile(cp.g_per_j, (B, 1)), arrival_per_s=lam,
                       ready_now=cp.usable_now.astype(float) if ready_now is None else np.asarray(ready_now, float),
                       pending_ready=np.zeros((B, 2)) if pending is None else pending, boot_s=BOOT_S,
                       integer_blocks=integer_blocks)


def test_blocks_and_block_carbon() -> None:
    starts, lens = plan_blocks(30.0, 3600.0, 300.0)
    assert starts[:3].tolist() == [0.0, 30.0, 330.0] and lens[:2].tolist() == [30.0, 300.0]
    assert len(starts) == 13 and lens.sum() == pytest.approx(3600.0) and lens[-1] == pytest.approx(270.0)
    assert plan_blocks(30.0, 10.0, 300.0)[1].tolist() == [30.0]  # never shorter than one period
    # half an hour left of the current hour at 100 g/kWh, then 500: a block across the change
    now, fc = np.array([100.0, 200.0]), np.array([[500.0, 900.0], [200.0, 200.0]])
    ci = block_intensity_g_per_kwh(now, fc, 0.5, np.array([0.0, 1500.0, 1800.0]), np.array([1500.0, 600.0, 5400.0]))
    np.testing.assert_allclose(ci[:, 0], [100.0, 300.0, (3600 * 500.0 + 1800 * 900.0) / 5400])
    np.testing.assert_allclose(ci[:, 1], [200.0, 200.0, 200.0])


def test_one_period_plan_equals_the_capacity_stage() -> None:
    for servers_now, awake_now, rate in (((4, 4), (32, 32), 20.0), ((4, 4), (32, 32), 150.0), ((1, 4), (8, 32), 40.0),
                                        ((4, 4), (32, 32), 200.0)):
        cp = two_dc(servers_now, awake_now, rate)
        one = solve_capacity(cp)
        plan = solve_plan(plan_of(cp, lambda t, r=rate: r, horizon_s=30.0))
        assert len(plan.awake) == 1
        assert plan.servers[0].tolist() == one.servers.tolist()
        np.testing.assert_allclose(plan.rate_per_s[0], one.rate_per_s, atol=1e-6)
        assert plan.objective_g == pytest.approx(one.objective_g, rel=1e-6)


def _receding(decide, lam_of_t, t_end: float) -> list[tuple[float, int, float]]:
    """Run capacity decisions every 30 s on the clean datacenter alone (the dirty one is down)
    with a model of its servers (a boot is up boot_s after it starts); returns (t, servers
    powered, engines ready) after each decision."""
    powered, boots, out = 1, [], []
    t = 0.0
    while t <= t_end:
        boots = [r for r in boots if r > t]
        ready = 8 * (powered - len(boots))
        cp = two_dc((powered, 0), (ready, 0), lam_of_t(t))
        cp.up = np.array([True, False])
        cp.usable_now = np.array([ready, 0])
        servers = decide(cp, t, boots)
        s0 = int(servers[0])
        if s0 > powered:
            boots += [t + BOOT_S] * (s0 - powered)
        elif s0 < powered:  # (the model powers off servers that are up)
            powered = max(s0, len(boots))
        powered = max(powered, s0)
        out.append((t, powered, float(8 * (powered - len([r for r in boots if r > t])))))
        t += 30.0
    return out


def test_plan_boots_ahead_of_a_known_load_step_the_one_period_stage_follows() -> None:
    step_t = 1200.0
    lam_of_t = lambda t: 15.0 if t < step_t else 60.0  # noqa: E731 - 60 requests/s need 24 engines: 3 servers

    def mpc(cp, t, boots):
        starts, lens = plan_blocks(30.0, 3600.0, 300.0)
        pend = np.zeros((len(starts), 2))
        for r in boots:
            share = np.clip((starts + lens - (r - t)) / lens, 0.0, 1.0)
            pend[:, 0] += 8 * (share - np.concatenate([[0.0], share[:-1]]))
        return solve_plan(plan_of(cp, lambda x: lam_of_t(t + x), ready_now=cp.usable_now, pending=pend)).servers[0]

    def one_period(cp, t, boots):
        return solve_capacity(cp).servers

    with_plan = _receding(mpc, lam_of_t, step_t)
    follow = _receding(one_period, lam_of_t, step_t)
    first_boot = next(t for t, powered, _ in with_plan if powered > 1)
    # boots no earlier than needed (none at t = 0: the step is 20 minutes away) ...
    assert 0.0 < first_boot <= step_t - BOOT_S
    assert first_boot >= step_t - BOOT_S - 300.0 - 30.0  # within one plan block of the latest useful start
    # ... and the capacity is ready when the step comes
    assert with_plan[-1][2] >= 60.0 / CAP
    # the one-period stage sizes for the load now: one server until the step, then it boots the
    # servers the step needs, which serve only boot_s later
    assert all(powered == 1 for t, powered, _ in follow if t < step_t)
    assert follow[-1][1] == 2 and follow[-1][2] == 8.0  # (60 requests/s within 5 per engine: 12 engines)


def test_plan_never_below_the_slo_floor() -> None:
    rng = np.random.default_rng(7)
    for _ in range(25):
        servers_now = tuple(int(x) for x in rng.integers(0, 5, 2))
        awake_now = tuple(int(8 * s) for s in servers_now)
        cp = two_dc(servers_now, awake_now, ci=tuple(float(x) for x in rng.uniform(20.0, 900.0, 2)))
        base, peak = rng.uniform(0.0, 150.0, 2)
        step = rng.uniform(0.0, 3600.0)
        pp = plan_of(cp, lambda t, b=base, s=step, p=peak: b if t < s else p)
        plan = solve_plan(pp)
        assert plan.ok
        lam0 = float(pp.arrival_per_s[0])
        floor = min(lam0, CAP * float(np.minimum(cp.usable_now, cp.engines).sum()))
        assert CAP * plan.awake[0].sum() >= floor - 1e-6
        assert plan.rate_per_s[0].sum() >= floor - 1e-6
        # servers cover the awake engines, every block (block 0 in integers; the rest relaxed)
        assert np.all(8 * plan.servers >= plan.awake - 1e-6)
        assert plan.awake[0].tolist() == np.rint(plan.awake[0]).tolist()


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="mpc.load_forecast"):
        MPCSettings(load_forecast="crystal-ball")
    with pytest.raises(ConfigError, match="mpc.horizon_s"):
        MPCSettings(horizon_s=0.0)
    with pytest.raises(ConfigError, match="mpc.integer_blocks"):
        MPCSettings(integer_blocks=0)
    with pytest.raises(ConfigError, match="facility.capacity_util_cap"):
        MPCFacilityMILP(None, capacity_util_cap=2.0)


def test_diurnal_factor_of_the_scenario() -> None:
    from carbon_gym.scenario import load_scenario

    sc = load_scenario("llama8b-diurnal")
    F = fleet_diurnal_factor(sc)
    assert F is not None
    day = np.arange(0.0, 86400.0, 60.0)
    assert F(day).mean() == pytest.approx(1.0, abs=1e-6)  # mean 1 over a day
    assert F(day).max() - F(day).min() > 0.15  # (the regions' peaks are hours apart: the fleet's swing is smaller)
    assert fleet_diurnal_factor(load_scenario("dev")) is None


def _dev_env(duration_s: float):
    from carbon_gym.scenario import load_scenario
    from eval.runner import make_env

    return make_env(load_scenario("dev", {"duration_s": duration_s, "capacity.control": "agent"}))


def _servers_trace(policy: str, duration_s: float, **kw) -> tuple[list[int], dict]:
    env = _dev_env(duration_s)
    pol = carbon_gym.make_policy(policy, env, **kw)
    obs, info = env.reset(seed=0)
    pol.reset(env)
    servers, decisions = [], 0
    done = False
    while not done:
        a = pol.act(obs, info)
        decisions += isinstance(a, dict)
        obs, _, term, trunc, info = env.step(a)
        servers.append(int(np.asarray(env.unwrapped.state().datacenters.servers_on).sum()))
        done = term or trunc
    env.close()
    return servers, {"decisions": decisions, **pol.episode_stats()}


def test_mpc_in_the_env_keeps_the_capacity_a_forecast_step_needs() -> None:
    # dev: Paris (clean) and Frankfurt, one 8-engine server each, 8 requests/s: one server holds
    # it, and the one-period MILP powers Frankfurt's off at t = 0. A forecast of 40 requests/s
    # from t = 420 s needs both servers (12 engines at 5.19 x 0.7 requests/s each): powering one
    # off for less than ~6 minutes costs more than its boot saves, so the plan keeps it on; a step
    # 25 minutes away lets it power off now (as the one-period MILP does) and boot later.
    near, st = _servers_trace("milp-mpc", 60.0, load_forecast=lambda state, t: np.where(t >= 420.0, 40.0, 8.0))
    assert isinstance(carbon_gym.make_policy("milp-mpc"), MPCFacilityMILP)
    assert st["decisions"] == 2 and st["mpc_plans"] == 2 and st["mpc_fallbacks"] == 0  # t = 0 and 30 s
    assert near == [2] * 60
    far, st = _servers_trace("milp-mpc", 60.0, load_forecast=lambda state, t: np.where(t >= 1500.0, 40.0, 8.0))
    assert far == [1] * 60 and st["mpc_boots"] == 0
    follow, _ = _servers_trace("milp", 60.0)
    assert follow == [1] * 60


def test_load_forecasters() -> None:
    from carbon_gym.scenario import load_scenario
    from eval.runner import make_env

    sc = load_scenario("llama8b-diurnal", {"duration_s": 10.0})
    env = make_env(sc)
    env.reset(seed=0)
    state = env.unwrapped.state()
    F = fleet_diurnal_factor(sc)
    t = np.array([0.0, 3600.0, 7200.0])
    for name, want in (("persistence", np.full(3, 100.0)), ("diurnal", 100.0 * F(t) / F(np.array([state.time_s]))[0]),
                       ("profile", sc.rate_per_s * F(t))):
        pol = MPCFacilityMILP(env, load_forecast=name)
        pol.reset(env)
        np.testing.assert_allclose(pol.load_forecast_per_s(state, 100.0, t), want, rtol=1e-12)
    bad = MPCFacilityMILP(env, load_forecast=lambda s, x: -np.ones_like(x))
    bad.reset(env)
    with pytest.raises(ConfigError, match="mpc.load_forecast"):
        bad.load_forecast_per_s(state, 100.0, t)
    env.close()
