"""The facility MILP's default operating point (issue 40): each datacenter held per step to its
measured SLO capacity (``FacilityConfig.operating_point``), from the load-level file's datacenter
figures (``dc_*``, ``eval/measure_capacity.py --datacenter``)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError, DataError
from carbon_gym.load_levels import load_load_levels, load_levels_path
from carbon_gym.registry import make_policy
from solvers.baselines import CapacityBudget
from solvers.facility_model import FacilityConfig

SHORT = {"duration_s": 20.0}


def test_packaged_datacenter_figures() -> None:
    """The study models' datacenter figures at 0.1 s and 1 s polling, against their engine
    figures: the step caps the MILP's measured operating point uses (1.205 / 1.204 / 1.036 of the
    engine figure at 0.1 s, the ``milp-opdc-c1`` cap on Mixtral; below 1 at 1 s, where the
    polling wait takes half the TTFT budget); an unmeasured (engines, period) is None."""
    levels = load_load_levels()
    cases = [("llama-3.1-8b", "tp1", 1, 32, 6.25, 5.1875), ("qwen2.5-7b", "tp1", 1, 32, 8.125, 6.75),
             ("mixtral-8x7b", "tp4", 4, 8, 12.75, 12.3125)]
    for model, _, tp, engines, c01, engine_figure in cases:
        cap = levels.find(model, "a100-80gb", tp)
        assert cap is not None and cap.per_engine_rate_per_s == engine_figure
        assert cap.datacenter_rate_per_s(engines, 0.1) == c01
        assert cap.datacenter_rate_per_s(engines, 1.0) < engine_figure  # (1 s polling: the wait eats the budget)
        assert cap.datacenter_rate_per_s(engines, 2.0) < 0.01 * engine_figure  # (2 s: nothing passes p99 TTFT)
        assert cap.datacenter_rate_per_s(engines + 1, 0.1) is None and cap.datacenter_rate_per_s(engines, 0.3) is None
    assert levels.find("mixtral-8x7b", "a100-80gb", 4).datacenter_rate_per_s(8, 0.1) / 12.3125 == pytest.approx(1.0355, abs=1e-4)


def test_file_figure_is_the_bound_probe() -> None:
    """The file's datacenter figure is the SLO-true bound's own probe (``eval.bound_slo``), the
    same bisection and settings: re-measured here for one cheap case (8 Llama engines, 1 s)."""
    from carbon_gym.scenario import load_scenario
    from eval.bound_slo import measured_capacity

    sc = load_scenario("llama8b-moderate", {"workload.rate_per_s": 1.0, "polling_period_s": 1.0})
    res = measured_capacity(sc, "a100-80gb", 8)
    assert round(float(res.per_engine_rate_per_s), 4) == load_load_levels().find("llama-3.1-8b", "a100-80gb", 1).datacenter_rate_per_s(8, 1.0)


def test_malformed_datacenter_figures_are_a_data_error(tmp_path) -> None:
    """``dc_*`` lists of different lengths (or a non-positive period) name the entry."""
    text = load_levels_path().read_text()
    bad = text.replace("dc_polling_period_s = [0.1, 0.1,", "dc_polling_period_s = [0.1,", 1)
    assert bad != text
    p = tmp_path / "levels.toml"
    p.write_text(bad)
    with pytest.raises(DataError, match="llama-3.1-8b/a100-80gb/tp1.*one length"):
        load_load_levels(p)


def test_operating_point_resolution(caplog) -> None:
    """``"auto"`` resolves to the measured operating point in a routing-only env (the step cap at
    the datacenter figure over the engine figure, 1 s credit, prefill share 1.0, mix_fill), to the
    prefill budget under capacity control and without an env; explicit settings win; an unmeasured
    or impossible point (2 s polling) falls back to the budget with a warning naming why."""
    env = GeoServeEnv("llama8b-high", {**SHORT, "polling_period_s": 0.1})
    m = make_policy("milp", env)
    c = m.config
    assert (c.operating_point, c.prefill_share, c.mix_fill, c.step_cap_credit_s) == ("measured", 1.0, True, 1.0)
    assert m.step_cap == pytest.approx(6.25 / 5.1875) and m.operating_point_note == ""
    assert m.episode_stats()["operating_point_measured"] == 1.0
    b = make_policy("milp", env, operating_point="budget")
    assert (b.config.operating_point, b.config.prefill_share, b.config.mix_fill, b.step_cap) == ("budget", 0.5, False, None)
    assert b.episode_stats()["operating_point_measured"] == 0.0
    own = make_policy("milp", env, step_cap=0.9, max_prefill_share=0.7, mix_fill=False, step_cap_credit_s=3.0)
    assert (own.step_cap, own.config.prefill_share, own.config.mix_fill, own.config.step_cap_credit_s) == (0.9, 0.7, False, 3.0)
    assert make_policy("milp", None).config.operating_point == "budget"
    cap_env = GeoServeEnv("dev", {**SHORT, "capacity.control": "agent"})
    cap_milp = make_policy("milp", cap_env)
    cc = cap_milp.config
    assert (cc.operating_point, cc.max_prefill_share, cc.mix_fill, cc.step_cap, cc.step_cap_credit_s, cap_milp.step_cap) == (
        "budget", 0.5, False, None, None, None)  # (the capacity MILP's settings before the measured point)
    with caplog.at_level(logging.WARNING, logger="solvers.facility"):
        slow = make_policy("milp", GeoServeEnv("llama8b-moderate", {**SHORT, "polling_period_s": 2.0}))
    assert slow.config.operating_point == "budget" and slow.step_cap is None
    assert "outside [0.01, 2]" in slow.operating_point_note and "falls back to 'budget'" in caplog.text
    odd = make_policy("milp", GeoServeEnv("llama8b-moderate", {**SHORT, "polling_period_s": 0.2}))
    assert odd.config.operating_point == "budget" and "no datacenter figure measured" in odd.operating_point_note
    with pytest.raises(ConfigError, match="facility.operating_point") as exc:
        FacilityConfig(operating_point="tight")
    assert "measured" in str(exc.value) and "budget" in str(exc.value)
    with pytest.raises(ConfigError, match="facility.max_prefill_share"):
        FacilityConfig(max_prefill_share=1.5)


def test_capacity_util_cap_default(caplog) -> None:
    """``capacity_util_cap`` None: 0.9 of the datacenter figure on the default basis at any measured
    polling period (at 1 s that figure is 0.76 of the engine figure, so an engine is planned at
    0.68 c); on the engine basis 0.9 where the datacenter figure is at least the engine figure
    (0.1 s polling), 0.9 x the ratio below it (1 s: the engines never planned past 90% of what
    they serve within p99); 0.7 with one warning under capacity control where nothing was measured
    (dev's 8-engine datacenters at 0.5 s); an explicit cap wins and is recorded per episode; a cap
    outside (0, 1] names the field."""
    cap = load_load_levels().find("llama-3.1-8b", "a100-80gb", 1)
    fast = make_policy("milp", GeoServeEnv("llama8b-moderate", {**SHORT, "polling_period_s": 0.1, "capacity.control": "agent"}))
    assert fast.config.capacity_util_cap == 0.9 and fast.config.operating_point == "budget"
    env_1s = GeoServeEnv("llama8b-moderate", {**SHORT, "polling_period_s": 1.0, "capacity.control": "agent"})
    ratio = cap.datacenter_rate_per_s(32, 1.0) / cap.per_engine_rate_per_s
    slow = make_policy("milp", env_1s)
    assert (slow.capacity_basis, slow.config.capacity_util_cap, slow.config.capacity_load_margin) == ("datacenter", 0.9, 0.0)
    assert slow.capacity_scale == pytest.approx(ratio) and 0.7 < ratio < 0.8
    slow = make_policy("milp", env_1s, capacity_basis="engine")
    assert slow.config.capacity_util_cap == pytest.approx(0.9 * ratio) and slow.config.capacity_load_margin == 0.1
    assert 0.6 < slow.config.capacity_util_cap < 0.7
    with caplog.at_level(logging.WARNING, logger="solvers.facility"):
        odd = make_policy("milp", GeoServeEnv("llama8b-moderate", {**SHORT, "polling_period_s": 0.2, "capacity.control": "agent"}))
    assert odd.config.capacity_util_cap == 0.7 and "capacity_util_cap falls back to 0.7" in caplog.text
    own = make_policy("milp", GeoServeEnv("llama8b-moderate", {**SHORT, "polling_period_s": 0.1, "capacity.control": "agent"}),
                      capacity_util_cap=0.5)
    assert own.config.capacity_util_cap == 0.5 and own.requested_config.capacity_util_cap == 0.5
    assert make_policy("milp", None).config.capacity_util_cap == 0.7
    for bad in (0.0, 1.5, True):
        with pytest.raises(ConfigError, match="facility.capacity_util_cap"):
            FacilityConfig(capacity_util_cap=bad)


def test_capacity_basis_datacenter(caplog) -> None:
    """``capacity_basis = "datacenter"`` (the default's choice, ``"auto"``, where the figure is
    measured): the capacity stage plans each engine at the datacenter figure (c x 6.25 / 5.1875 on
    Llama at 0.1 s polling) with the cap 0.9 of it and no load margin, so at a decision it keeps
    fewer engines awake than the engine basis (0.9 c, margin 0.1), by about that ratio; an
    unmeasured figure falls back to the engine basis (with a warning when the datacenter basis was
    asked for, silently under ``"auto"``); ``milp-mpc`` keeps the engine basis; an unknown basis
    or a negative margin names the field and the allowed values."""
    from solvers.facility_capacity import capacity_problem, solve_capacity

    opts = {**SHORT, "polling_period_s": 0.1, "capacity.control": "agent"}
    env = GeoServeEnv("llama8b-moderate", opts)
    eng = make_policy("milp", env, capacity_basis="engine")
    dc = make_policy("milp", env, capacity_basis="datacenter")
    auto = make_policy("milp", env)
    assert (eng.capacity_basis, eng.capacity_scale, eng.util_cap, eng.config.capacity_load_margin) == ("engine", 1.0, 0.9, 0.1)
    assert dc.capacity_basis == "datacenter" and dc.util_cap == 0.9 and dc.config.capacity_load_margin == 0.0
    assert dc.capacity_scale == pytest.approx(6.25 / 5.1875)
    assert (auto.requested_config.capacity_basis, auto.capacity_basis, auto.config.capacity_load_margin) == ("auto", "datacenter", 0.0)
    assert np.all(auto.capacity_scale == dc.capacity_scale)
    assert make_policy("milp", env, capacity_load_margin=0.2).config.capacity_load_margin == 0.2
    mpc = make_policy("milp-mpc", env)
    assert (mpc.capacity_basis, mpc.config.capacity_load_margin) == ("engine", 0.1)
    assert make_policy("milp", GeoServeEnv("llama8b-moderate", SHORT)).capacity_basis == "engine"  # (routing only: no stage)
    env.reset(seed=3)
    for _ in range(20):  # 2 s of arrivals: the rate estimate is the arrivals' own
        env.step(eng.act(None, {}))
    state = env.unwrapped.state()
    problem = eng.problem_of(state)
    work = np.full(problem.n_datacenters, 100.0)
    plans = {}
    for name, pol in (("engine", eng), ("datacenter", dc)):
        cp = capacity_problem(state, problem, eng._cap_facts, work, pol.util_cap, 0.1, 0.0, 1.0, capacity_scale=pol.capacity_scale)
        c = np.asarray(state.engine_capacity_per_s, dtype=np.float64) * pol.capacity_scale
        np.testing.assert_allclose(cp.engine_capacity_per_s, np.broadcast_to(c, cp.engine_capacity_per_s.shape))
        res = solve_capacity(cp)
        plans[name] = int(res.awake.sum())
        # the awake engines hold the planned load at the cap, and not one engine more than that needs
        per = float(np.min(cp.engine_capacity_per_s)) * pol.util_cap
        assert plans[name] * per >= cp.arrival_per_s - 1e-6
        assert plans[name] <= math.ceil(cp.arrival_per_s / per) + problem.n_datacenters
    assert plans["datacenter"] < plans["engine"]
    assert plans["engine"] / plans["datacenter"] == pytest.approx(6.25 / 5.1875, rel=0.1)
    with caplog.at_level(logging.WARNING, logger="solvers.facility"):
        odd = make_policy("milp", GeoServeEnv("llama8b-moderate", {**opts, "polling_period_s": 0.2}), capacity_basis="datacenter")
    assert (odd.capacity_basis, odd.capacity_scale) == ("engine", 1.0)
    assert "capacity_basis 'datacenter' falls back to 'engine'" in caplog.text
    assert odd.util_cap == 0.7 and "capacity_util_cap falls back to 0.7" in caplog.text
    assert odd.config.capacity_load_margin == 0.1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="solvers.facility"):
        quiet = make_policy("milp", GeoServeEnv("llama8b-moderate", {**opts, "polling_period_s": 0.2}))
    assert (quiet.capacity_basis, quiet.config.capacity_load_margin) == ("engine", 0.1)
    assert "capacity_basis" not in caplog.text and "capacity_util_cap falls back to 0.7" in caplog.text
    with pytest.raises(ConfigError, match="facility.capacity_basis") as exc:
        FacilityConfig(capacity_basis="fleet")
    assert all(b in str(exc.value) for b in ("auto", "datacenter", "engine"))
    for bad in (-0.1, float("nan"), True):
        with pytest.raises(ConfigError, match="facility.capacity_load_margin"):
            FacilityConfig(capacity_load_margin=bad)


def test_per_datacenter_step_caps() -> None:
    """:class:`CapacityBudget` with one cap per datacenter (datacenters of different GPUs):
    ``floor(cap_d x E_d x r x poll_s)`` each; a cap outside (0, 2] anywhere is a ConfigError."""
    from tests.test_solvers import small_problem

    p = small_problem(n_engines=[2, 4, 1])
    b = CapacityBudget(np.array([0.5, 1.0, 2.0]))
    np.testing.assert_array_equal(b.budget(p, None), np.floor(np.array([0.5 * 2, 1.0 * 4, 2.0 * 1]) * 4.0 * p.poll_s))
    for bad in (np.array([0.5, 0.0, 1.0]), np.array([0.5, 2.5, 1.0]), np.zeros((2, 2)) + 1.0):
        with pytest.raises(ConfigError, match="capacity_cap"):
            CapacityBudget(bad)


def test_measured_step_cap_holds_each_datacenter_in_a_rollout(monkeypatch) -> None:
    """In a rollout at the default operating point (dev, 1 s polling: 8-engine datacenters at
    their measured 3.875 requests/s per engine, 0.747 of the engine figure's 5.19), every step's
    placements at each datacenter are within the budget it had that step whenever the fleet's
    budget holds the step's placements; and nothing is lost (every arrival completed or in flight)."""
    from carbon_gym.policy import rollout

    steps: list[tuple[np.ndarray, np.ndarray]] = []
    seen: dict[str, np.ndarray] = {}
    budget_of, spend_of = CapacityBudget.budget, CapacityBudget.spend

    def budget(self, p, env):
        seen["b"] = budget_of(self, p, env).copy()
        return seen["b"]

    def spend(self, used):
        steps.append((seen["b"], np.asarray(used, dtype=np.float64).copy()))
        spend_of(self, used)

    monkeypatch.setattr(CapacityBudget, "budget", budget)
    monkeypatch.setattr(CapacityBudget, "spend", spend)
    env = GeoServeEnv("dev", {"duration_s": 60.0})
    m = make_policy("milp", env)
    metrics = rollout(env, m, seed=0)
    assert m.step_cap == pytest.approx(3.875 / 5.1875) and m.config.operating_point == "measured"
    assert len(steps) >= 50
    within = [bool((u <= b).all()) for b, u in steps if u.sum() <= b.sum()]
    assert len(within) >= 0.9 * len(steps) and all(within)
    assert metrics["completed"] == metrics["arrived"] > 0  # (every placement counted once: each arrival placed once)
    assert sum(int(u.sum()) for _, u in steps) == metrics["arrived"]


def test_measure_capacity_writes_parallel_datacenter_lists(monkeypatch) -> None:
    """``eval/measure_capacity.py --datacenter``: one probe per (period, engines), written as the
    parallel ``dc_*`` lists the loader reads (the probe itself stubbed here: it is the bound's,
    re-measured in :func:`test_file_figure_is_the_bound_probe`)."""
    import types

    import eval.bound_slo as bound_slo
    from eval import measure_capacity

    seen: list[tuple[float, int]] = []

    def probe(s, gpu, n, log=None):
        seen.append((float(s.polling_period_s), int(n)))
        return types.SimpleNamespace(per_engine_rate_per_s=10.0 * s.polling_period_s + n, active_j_per_request=20.0 + n)

    monkeypatch.setattr(bound_slo, "measured_capacity", probe)
    out = measure_capacity._datacenter("llama8b", None, [0.1, 1.0], [8, 32], "cmd")
    assert seen == [(0.1, 8), (0.1, 32), (1.0, 8), (1.0, 32)]
    assert out["dc_engines"] == [8, 32, 8, 32] and out["dc_polling_period_s"] == [0.1, 0.1, 1.0, 1.0]
    assert out["dc_per_engine_rate_per_s"] == [9.0, 33.0, 18.0, 42.0] and out["dc_active_j_per_request"] == [28.0, 52.0, 28.0, 52.0]
    assert out["dc_command"] == "cmd" and "eval.bound_slo.PROBE" in out["dc_probe"]


def test_greedy_cap_and_ilp_cap_default_to_the_measured_operating_point(caplog) -> None:
    """``greedy-cap`` / ``ilp-cap`` default to ``capacity_cap="measured"``: at the first step of an
    episode each datacenter's step cap is its datacenter figure over the engine figure at the env's
    polling period (6.25 / 5.1875 on Llama at 0.1 s; 0.76 at 1 s), recorded per episode
    (``capacity_cap_mean``, ``capacity_cap_measured`` 1); where nothing is measured (0.2 s) 0.9,
    once with a warning, ``capacity_cap_measured`` 0; a given share wins; an unknown word names the
    field and the allowed values."""
    cap = load_load_levels().find("llama-3.1-8b", "a100-80gb", 1)
    for name in ("greedy-cap", "ilp-cap"):
        for poll_s, want in ((0.1, 6.25 / 5.1875), (1.0, cap.datacenter_rate_per_s(32, 1.0) / cap.per_engine_rate_per_s)):
            env = GeoServeEnv("llama8b-moderate", {**SHORT, "polling_period_s": poll_s})
            pol = make_policy(name, env)
            assert pol.capacity is not None and pol.capacity.requested == "measured"
            env.reset(seed=1)
            pol.reset(env)
            env.step(pol.act(None, {}))
            assert pol.capacity.cap == pytest.approx(want) and pol.episode_stats() == {
                "capacity_cap_mean": pytest.approx(want), "capacity_cap_measured": 1.0}
        env = GeoServeEnv("llama8b-moderate", {**SHORT, "polling_period_s": 0.2})
        pol = make_policy(name, env)
        env.reset(seed=1)
        pol.reset(env)
        with caplog.at_level(logging.WARNING, logger="solvers.baselines"):
            for _ in range(3):
                env.step(pol.act(None, {}))
        assert pol.episode_stats() == {"capacity_cap_mean": 0.9, "capacity_cap_measured": 0.0}
        assert caplog.text.count("capacity_cap 'measured' falls back to 0.9") == 1
        caplog.clear()
        own = make_policy(name, env, capacity_cap=1.0)
        env.reset(seed=1)
        own.reset(env)
        env.step(own.act(None, {}))
        assert own.episode_stats() == {"capacity_cap_mean": 1.0, "capacity_cap_measured": 0.0}
    with pytest.raises(ConfigError, match="capacity_cap") as exc:
        make_policy("greedy-cap", None, capacity_cap="measure")
    assert "measured" in str(exc.value)
    assert make_policy("greedy-cap", None).capacity.cap == 0.9  # (no env yet: the fallback until the first step)
