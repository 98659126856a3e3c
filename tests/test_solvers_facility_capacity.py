"""The facility MILP's capacity stage (``[capacity] control = "agent"``): analytic capacity
decisions (clean vs dirty datacenter, low and high load, boots that cannot serve within the
period), the greedy fallback, the routing view, the action's shape and schedule in the env, and
always-on unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest

import carbon_gym
from carbon_gym.scenario import load_scenario
from eval.runner import make_env
from solvers.facility import FacilityMILP
from solvers.facility_capacity import (
    CapacityProblem,
    capacity_greedy,
    capacity_view,
    horizon_intensity_g_per_kwh,
    solve_capacity,
)
from solvers.problem import synthetic_problem

SERVER_ON_W = 1000.0 + 8 * 63.0
WORK_J = 50.0
T_S = 30.0


def two_dc(rate_per_s: float, servers_now: tuple[int, int] = (4, 4), awake_now: tuple[int, int] = (32, 32)) -> CapacityProblem:
    """Two datacenters of 4 servers x 8 engines; d0 clean (100 g/kWh), d1 dirty (800 g/kWh), PUE 1;
    2.5 requests/s per engine at the cap (5 x 0.5)."""
    g = np.array([100.0, 800.0]) / 3.6e6
    sn = np.array(servers_now)
    an = np.array(awake_now)
    return CapacityProblem(
        up=np.array([True, True]), engines=np.array([32, 32]), servers=np.array([4, 4]), engines_per_node=np.array([8, 8]),
        awake_now=an, servers_now=sn, usable_now=np.minimum(an, 8 * sn), target_engines=an.copy(), target_servers=sn.copy(),
        g_per_j=g, server_on_w=np.full(2, SERVER_ON_W), server_off_w=40.0, boot_j=np.full(2, 345.0 * (1000 + 8 * 63.0)),
        wake_j=1.0 * 20.0, work_j=np.full(2, WORK_J), arrival_per_s=rate_per_s, engine_capacity_per_s=5.0, util_cap=0.5,
        horizon_s=T_S, penalty_g=1.0)


def test_low_load_powers_down_the_dirty_datacenter() -> None:
    res = solve_capacity(two_dc(20.0))
    # 20 requests/s need 8 engines at 2.5/s: one server of the clean datacenter, nothing of the dirty one
    assert res.awake.tolist() == [8, 0]
    assert res.servers.tolist() == [1, 0]
    np.testing.assert_allclose(res.rate_per_s, [20.0, 0.0], atol=1e-6)
    # objective: the clean server's floor above off and the work, over 30 s (no boot, no wake)
    want = 100.0 / 3.6e6 * T_S * ((SERVER_ON_W - 40.0) * 1 + WORK_J * 20.0)
    assert res.objective_g == pytest.approx(want, rel=1e-6)
    assert not res.fallback
    g = capacity_greedy(two_dc(20.0))
    assert g.awake.tolist() == [8, 0] and g.servers.tolist() == [1, 0]
    assert g.objective_g == pytest.approx(want, rel=1e-9)


def test_high_load_keeps_everything_on() -> None:
    # 150 requests/s: the clean datacenter's 80 at the cap, the dirty one the other 70 (28 engines)
    res = solve_capacity(two_dc(150.0))
    assert res.servers.tolist() == [4, 4]
    assert res.awake.tolist() == [32, 28]
    np.testing.assert_allclose(res.rate_per_s, [80.0, 70.0], atol=1e-6)
    # beyond the fleet's 160 requests/s everything stays on and the excess is penalised
    over = solve_capacity(two_dc(200.0))
    assert over.awake.tolist() == [32, 32] and over.servers.tolist() == [4, 4]
    np.testing.assert_allclose(over.rate_per_s, [80.0, 80.0], atol=1e-6)


def test_servers_off_now_cannot_serve_within_the_period() -> None:
    # the clean datacenter has one server on (8 engines: 20 requests/s); a boot would only serve
    # after the period, so the other 20 requests/s go to the dirty datacenter and nothing boots
    res = solve_capacity(two_dc(40.0, servers_now=(1, 4), awake_now=(8, 32)))
    np.testing.assert_allclose(res.rate_per_s, [20.0, 20.0], atol=1e-6)
    assert res.servers.tolist() == [1, 1]
    assert res.awake.tolist() == [8, 8]


def test_a_shortfall_the_powered_servers_cannot_hold_boots_a_server() -> None:
    # one server on at each datacenter: 16 engines hold 40 requests/s at the cap (2.5 each) and
    # 80 at the measured capacity (5 each). At 100 requests/s the 60 beyond the cap are over
    # capacity this period (penalised), and the later rows boot a server where the floor is
    # cleaner with the 4 engines the 20 beyond the measured capacity need (before them nothing
    # ever booted)
    res = solve_capacity(two_dc(100.0, servers_now=(1, 1), awake_now=(8, 8)))
    np.testing.assert_allclose(res.rate_per_s, [20.0, 20.0], atol=1e-6)
    assert res.servers.tolist() == [2, 1]
    assert res.awake.tolist() == [12, 8]
    g = np.array([100.0, 800.0]) / 3.6e6
    want = (float((g * T_S * ((SERVER_ON_W - 40.0) * np.array([2, 1]) + WORK_J * 20.0)).sum())
            + g[0] * (345.0 * (1000 + 8 * 63.0) + 4 * 20.0) + 1.0 * T_S * 60.0)  # boot, 4 wakes, overflow
    assert res.objective_g == pytest.approx(want, rel=1e-6)
    greedy = capacity_greedy(two_dc(100.0, servers_now=(1, 1), awake_now=(8, 8)))
    assert greedy.servers.tolist() == [2, 1] and greedy.awake.tolist() == [12, 8]
    assert greedy.objective_g == pytest.approx(want, rel=1e-6)
    # within the band between the cap and the measured capacity nothing boots: 70 requests/s
    # are 30 over the cap now, but the powered engines hold them within p99
    band = solve_capacity(two_dc(70.0, servers_now=(1, 1), awake_now=(8, 8)))
    assert band.servers.tolist() == [1, 1] and band.awake.tolist() == [8, 8]
    # a boot costs ~16 g at 100 g/kWh (14.4 g of boot energy, 1.2 g of floor over 30 s) against
    # 30 g per request/s short over 30 s: 0.4 requests/s beyond 80 is not worth it, 0.6 is
    for rate, servers in ((80.4, [1, 1]), (80.6, [2, 1])):
        assert solve_capacity(two_dc(rate, servers_now=(1, 1), awake_now=(8, 8))).servers.tolist() == servers


def test_the_fleet_rate_bounds() -> None:
    from solvers.facility_capacity import RATE_Z, fleet_rate_per_s
    z = RATE_Z
    # the first decision on an empty cluster (EWMA 0): one 0.1 s poll's count and its spread
    assert fleet_rate_per_s(0.0, 90.0, 0.1, 0.1) == pytest.approx(900.0 + z * math.sqrt(9000.0))
    # the bias-corrected 60 s EWMA: t_obs = 2 tau tanh(t / 2 tau) ~ t early on, 2 tau = 120 s at length
    assert fleet_rate_per_s(900.0, 90.0, 30.0, 0.1) == pytest.approx(900.0 + z * math.sqrt(900.0 / (120.0 * math.tanh(0.25))))
    assert fleet_rate_per_s(900.0, 90.0, 1e5, 0.1) == pytest.approx(900.0 + z * math.sqrt(900.0 / 120.0))
    # a count 1.5 sigma high does not move it; a backlog (three polls' worth) does, at its lower bound
    assert fleet_rate_per_s(900.0, 104.0, 1e5, 0.1) == pytest.approx(900.0 + z * math.sqrt(900.0 / 120.0))
    assert fleet_rate_per_s(900.0, 270.0, 1e5, 0.1) == pytest.approx(2700.0 - z * math.sqrt(27000.0))
    assert fleet_rate_per_s(0.0, 0.0, 10.0, 0.1) == 0.0
    # z = 0: the rule before, max(EWMA, count) (milp-mpc's plan starts from it)
    assert fleet_rate_per_s(900.0, 104.0, 30.0, 0.1, z=0.0) == pytest.approx(1040.0)
    assert fleet_rate_per_s(900.0, 80.0, 30.0, 0.1, z=0.0) == 900.0


def test_wake_energy_prefers_engines_awake_now() -> None:
    # equal grids: the load goes where engines are awake already (waking costs energy)
    cp = two_dc(20.0, awake_now=(0, 8))
    cp.g_per_j = np.full(2, 300.0 / 3.6e6)
    res = solve_capacity(cp)
    assert res.awake.tolist() == [0, 8]


def test_horizon_intensity() -> None:
    now = np.array([100.0])
    fc = np.array([[200.0, 300.0]])
    # half an hour left at 100, then half an hour of the next hour's 200
    assert horizon_intensity_g_per_kwh(now, fc, 12.5, 3600.0)[0] == pytest.approx(150.0)
    assert horizon_intensity_g_per_kwh(now, fc, 12.5, 30.0)[0] == pytest.approx(100.0)
    # 0.25 h at 100, 1 h at 200, 0.75 h at 300
    assert horizon_intensity_g_per_kwh(now, fc, 3.75, 7200.0)[0] == pytest.approx((900 * 100 + 3600 * 200 + 2700 * 300) / 7200)


class _DC:
    def __init__(self, awake: list[int], sleeping: list[int], wake_s: float) -> None:
        self.awake_engines = np.array(awake)
        self.waking_engines = np.zeros(len(awake), dtype=np.int64)
        self.sleeping_engines = np.array(sleeping)
        self.wake_latency_s = np.full(len(awake), wake_s)


class _State:
    def __init__(self, dc: _DC) -> None:
        self.datacenters = dc


def test_capacity_view_masks_and_adds_the_wake_latency() -> None:
    rng = np.random.default_rng(0)
    p = synthetic_problem(rng, 6, n_datacenters=3, n_regions=2, load=0.3, engines_per_dc=4)
    p.allowed[:] = True
    p.allowed[0] = [False, False, True]  # request 0 may only go to datacenter 2
    # d0: 2 of 4 awake (target 2); d1: all asleep, target 2 (wakes within the period); d2: target 0
    st = _State(_DC([2, 0, 0], [2, 4, 4], 0.8))
    v = capacity_view(p, st, np.array([2, 2, 0]))  # type: ignore[arg-type]
    assert v.n_engines.tolist() == [2, 2, 1]
    assert not v.allowed[1:, 2].any()  # no serving engine at d2: masked ...
    assert v.allowed[0, 2]  # ... except for the request with no other choice
    assert v.allowed[1:, :2].all()
    # no engine awake at d1 and d2: the wake latency counts in their TTFT
    base = np.maximum(p.est_queue_wait_s, p.backlog_prompt_tokens * p.prefill_s_per_token / v.n_engines)
    np.testing.assert_allclose(v.est_queue_wait_s, base + np.array([0.0, 0.8, 0.8]))


def _env(control: str, duration_s: float = 65.0):  # type: ignore[no-untyped-def]
    return make_env(load_scenario("dev", {"capacity.control": control, "duration_s": duration_s}))


def test_agent_actions_shape_schedule_and_range() -> None:
    env = _env("agent")
    pol = FacilityMILP(env)
    obs, info = env.reset(seed=0)
    pol.reset(env)
    base = env.unwrapped
    decisions = []
    for step in range(65):
        st = base.state()
        a = pol.act(obs, info)
        if st.capacity_decision:
            decisions.append(step)
            assert isinstance(a, dict) and set(a) == {"route", "capacity", "servers"}
            cap, srv = np.asarray(a["capacity"]), np.asarray(a["servers"])
            assert cap.shape == srv.shape == st.servers.shape
            assert np.all((0 <= cap) & (cap <= st.datacenters.n_engines))
            assert np.all((0 <= srv) & (srv <= st.servers))
            assert np.all(st.engines_per_node * srv >= cap)
            assert base.action_space.contains({k: np.asarray(v, dtype=np.int64) for k, v in a.items()})
        else:
            assert isinstance(a, np.ndarray)  # between decisions: the route alone keeps the targets
        obs, r, term, trunc, info = env.step(a)
        if term or trunc:
            break
    # period 30 s at a 1 s poll: decisions at steps 0, 30, 60 and no other
    assert decisions == [0, 30, 60]
    assert len(pol.stats["capacity_s"]) == 3 and pol.stats["capacity_fallbacks"] == 0
    assert pol.episode_stats()["capacity_solves"] == 3.0


def test_always_on_is_the_routing_milp() -> None:
    env = _env("always_on", 10.0)
    pol = carbon_gym.make_policy("milp", env)
    obs, info = env.reset(seed=0)
    pol.reset(env)
    for _ in range(10):
        a = pol.act(obs, info)
        assert isinstance(a, np.ndarray)
        obs, r, term, trunc, info = env.step(a)
    assert pol.stats["capacity_s"] == []
    assert "capacity_solves" not in pol.episode_stats()
