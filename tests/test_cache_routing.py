"""Cache-aware routing across datacenters (issue 23): cached prefixes in the typed state, the
observation and the placement problem; the schedulers' cached-prefix-adjusted prefill; the
session-sticky baseline; the MILP's affinity knob; the cache and session-move metrics."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import carbon_gym
from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError
from carbon_gym.pending import COLUMNS, PROMPT, SEQ
from carbon_gym.sessions_state import SESSION_METRICS, SessionTracker
from carbon_gym.sim.results import SNAPSHOT_ARRAY_ROWS
from solvers.baselines import LeastLoaded, SharePlanner
from solvers.facility import FacilityMILP
from solvers.facility_model import FacilityConfig, compile_facility, facility_greedy, marginal_energy_j
from solvers.per_request import PerRequestILP, per_request_costs
from solvers.problem import PlacementProblem

PPT = 1.0e-4  # prefill s per token
CACHE_ENV = {"engine.prefix_caching": True, "engine.dispatcher": "cache_aware"}


def two_dc_problem(prompt=(8000.0,), cached=None, carbon=(300.0, 300.0), session_dc=None, allowed=None) -> PlacementProblem:
    """R requests, two identical idle datacenters (carbon aside), optional cached prefixes."""
    r = len(prompt)
    return PlacementProblem(
        origin=np.zeros(r, dtype=int), prompt_tokens=np.array(prompt), output_tokens=np.full(r, 200.0),
        waited_s=np.zeros(r), network_s=np.full((r, 2), 0.05),
        allowed=np.ones((r, 2), bool) if allowed is None else np.asarray(allowed),
        carbon_g_per_kwh=np.array(carbon), pue=np.ones(2), up=np.ones(2, bool),
        n_engines=np.full(2, 4), busy_engines=np.full(2, 2), running=np.full(2, 8.0), queue_len=np.zeros(2),
        free_kv_tokens=np.full(2, 1e6), est_queue_wait_s=np.zeros(2), prefill_s_per_token=np.full(2, PPT),
        tpot_now_s=np.full(2, 0.015), tpot_idle_s=np.full(2, 0.012), tpot_slope_s_per_seq=np.full(2, 1e-4),
        ttft_slo_s=2.0, tpot_slo_s=0.1,
        cached_prompt_tokens=None if cached is None else np.asarray(cached, dtype=float),
        session_dc=session_dc,
    )


# ---------------------------------------------------------------------------- the problem
def test_prefill_uses_the_cached_prefix_adjusted_prompt():
    p = two_dc_problem(cached=[[0.0, 6144.0]])
    assert p.prefill_tokens.tolist() == [[8000.0, 1856.0]]
    assert p.prefill_compute_s[0].tolist() == pytest.approx([0.8, 0.1856])
    assert p.prefill_s[0, 1] - p.prefill_s[0, 0] == pytest.approx(-6144 * PPT)
    ttft = p.ttft_estimate_s()
    assert ttft[0, 0] - ttft[0, 1] == pytest.approx(6144 * PPT)
    # without cached tokens: the prompt everywhere, the same floats as before the field existed
    q = two_dc_problem()
    assert q.prefill_compute_s.tolist() == (q.prompt_tokens[:, None] * q.prefill_s_per_token[None, :]).tolist()
    assert q.prefill_tokens_of(0) == 8000.0
    # subset keeps them
    assert p.subset(np.array([0])).cached_prompt_tokens.tolist() == [[0.0, 6144.0]]


def test_problem_rejects_bad_cached_tokens():
    with pytest.raises(ConfigError, match="cached_prompt_tokens"):
        two_dc_problem(cached=[[0.0, 9000.0]])  # more than the prompt
    with pytest.raises(ConfigError, match="cached_prompt_tokens"):
        two_dc_problem(cached=[[-1.0, 0.0]])
    with pytest.raises(ConfigError, match="session_dc"):
        two_dc_problem(session_dc=np.array([2]))


def test_per_request_ilp_prefers_the_datacenter_holding_the_prefix():
    p = two_dc_problem(cached=[[0.0, 6144.0]])
    cost = per_request_costs(p, 0, np.zeros(2), np.full(2, 0.015), 1.0)
    # the energy difference is exactly the cached tokens' prefill energy: tp (P_prefill - P_idle) c alpha g
    saved_j = p.tp * (p.gpu_prefill_w - p.gpu_idle_w) * 6144 * PPT
    assert cost[0] - cost[1] == pytest.approx(saved_j * p.grams_per_joule[0], rel=1e-12)
    for state_aware in (True, False):
        assert PerRequestILP(state_aware=state_aware).place(p).tolist() == [1]
        assert PerRequestILP(state_aware=state_aware).place(two_dc_problem()).tolist() == [0]  # tie: lowest index


def test_facility_energy_and_choice_use_the_cached_prefix():
    p = two_dc_problem(cached=[[0.0, 6144.0]])
    e, _ = marginal_energy_j(p)
    e0, _ = marginal_energy_j(two_dc_problem())
    n = np.maximum(p.batch_per_busy_engine, 1.0)
    per_token = p.tp * (p.gpu_prefill_w - p.decode_power_w(n)) * PPT
    assert e0[0, 1] - e[0, 1] == pytest.approx(6144 * per_token[1], rel=1e-12)
    assert e[0, 0] == e0[0, 0]
    assert FacilityMILP().place(p).tolist() == [1]
    assert facility_greedy(p).tolist() == [1]
    d = compile_facility(p, FacilityConfig(binary=True))
    assert d.pair_prompt.tolist() == [8000.0, 1856.0]  # the prefill tokens each pair adds to the token budget


def test_affinity_knob_trades_carbon_for_cache_hits():
    # datacenter 0 is much cleaner; datacenter 1 holds 6,144 of the prompt's tokens
    p = two_dc_problem(cached=[[0.0, 6144.0]], carbon=(50.0, 700.0))
    assert FacilityMILP().place(p).tolist() == [0]  # carbon wins at affinity 0
    cfg = FacilityConfig(binary=True)
    k0 = compile_facility(p, cfg).kappa
    k1 = compile_facility(p, FacilityConfig(binary=True, affinity_g_per_ktok=2.0)).kappa
    assert (k1 - k0).tolist() == pytest.approx([2.0 * 6.144, 0.0])  # charged where the prefix is not cached
    assert FacilityMILP(affinity_g_per_ktok=10.0).place(p).tolist() == [1]
    with pytest.raises(ConfigError, match="affinity_g_per_ktok"):
        FacilityConfig(affinity_g_per_ktok=-1.0)


def test_least_loaded_and_sticky():
    # two requests; request 0's session was last at datacenter 1, request 1's at 0 (not allowed now)
    p = two_dc_problem(prompt=(1000.0, 1000.0), session_dc=np.array([1, 0]), allowed=[[True, True], [False, True]])
    assert LeastLoaded(sticky=True).place(p).tolist() == [1, 1]
    plain = LeastLoaded().place(p).tolist()
    assert plain[1] == 1
    assert carbon_gym.make_policy("sticky").name == "sticky"
    # least-loaded is cache-aware too: the cached datacenter has the shorter prefill
    assert LeastLoaded().place(two_dc_problem(cached=[[0.0, 6144.0]])).tolist() == [1]


def test_planner_routes_to_the_planned_datacenter_holding_the_prefix():
    pl = SharePlanner()
    p = two_dc_problem()
    pl.place(p)  # plans
    pl._shares[:] = 0.5  # both datacenters planned for origin 0
    pl._credit[:] = 0.0
    pl._next_plan_s = np.inf
    out = [int(pl.place(two_dc_problem(cached=[[0.0, 4096.0]]))[0]) for _ in range(4)]
    assert out == [1, 1, 1, 1]
    out = [int(pl.place(two_dc_problem())[0]) for _ in range(4)]
    assert out == [0, 0, 0, 0]  # the credit the cached ones drew pays back: 4 of 8 at each, the planned shares


# ---------------------------------------------------------------------------- metrics
class _Store:
    def __init__(self, sid):
        self.sid = np.asarray(sid, dtype=np.int64)

    def prefix_of(self, rows):
        n = rows.shape[0]
        return [(1, 2)] * n, self.sid[:n], np.zeros(n, dtype=np.int32)


class _Totals:
    def __init__(self, prompt, cached):
        self.prompt_tokens = np.asarray(prompt, dtype=np.int64)
        self.cached_prompt_tokens = np.asarray(cached, dtype=np.int64)
        self.prefill_saved_tokens = np.asarray(cached, dtype=np.int64)


class _Sim:
    def __init__(self, cached):
        self.cached = np.asarray(cached, dtype=np.int64)
        self.t = _Totals([1000, 3000, 0], [500, 1500, 0])

    def cached_prefix_tokens_batch(self, hashes, prompts):
        return self.cached[: len(hashes)]

    def totals(self):
        return self.t


def test_session_metrics_hand_built():
    power_w = np.array([300.0, 400.0, 500.0])
    pue = np.array([1.1, 1.2, 1.3])
    tr = SessionTracker(3, power_w, pue)
    rows = np.zeros((3, len(COLUMNS)))
    rows[:, PROMPT] = 5000
    rows[:, SEQ] = [0, 1, 2]
    snap = np.zeros((len(SNAPSHOT_ARRAY_ROWS), 3))
    snap[SNAPSHOT_ARRAY_ROWS.index("est_prefill_s_per_token")] = [1e-4, 2e-4, 3e-4]
    snap[SNAPSHOT_ARRAY_ROWS.index("carbon_g_per_kwh")] = [100.0, 200.0, 300.0]
    # first turns of sessions 7, 8 and a request without a session
    tr.observe(_Sim(np.zeros((3, 3))), _Store([7, 8, -1]), rows)
    tr.placed(np.ones(3, bool), np.array([0, 1, 2]), snap)
    assert tr.session_dc == {7: 0, 8: 1}
    # second turns: session 7 moves 0 -> 2 (4,096 cached at 0, 1,024 at 2), session 8 stays at 1
    sim = _Sim([[4096, 0, 1024], [0, 2048, 0]])
    tr.observe(sim, _Store([7, 8]), rows[:2])
    assert tr.session_dc_of.tolist() == [0, 1]
    assert tr.state_fields(2)["session_dc"].tolist() == [0, 1]
    tr.placed(np.ones(2, bool), np.array([2, 1]), snap)
    m = tr.metrics(sim)
    assert set(m) == set(SESSION_METRICS)
    assert (m["session_turns"], m["session_moves"], m["session_move_rate"]) == (2, 1, 0.5)
    lost = 4096 - 1024
    assert m["move_reprefill_tokens"] == lost
    assert m["move_ttft_cost_s"] == pytest.approx(lost * 3e-4)
    e_j = lost * 3e-4 * 500.0 * 1.3
    assert m["move_reprefill_energy_j"] == pytest.approx(e_j)
    assert m["move_reprefill_carbon_g"] == pytest.approx(e_j * 300.0 / 3.6e6)
    assert m["prefix_hit_rate"] == pytest.approx(2000 / 4000)
    assert m["dc_prefix_hit_rate"][:2].tolist() == [0.5, 0.5] and np.isnan(m["dc_prefix_hit_rate"][2])


# ---------------------------------------------------------------------------- the env
def _env(scenario: str, **ov) -> GeoServeEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GeoServeEnv(scenario=scenario, overrides=ov)


def test_default_layout_unchanged_and_state_defaults():
    env = _env("dev")
    assert not env.layout.prefix_cache and "cached_prefix" not in env.layout.slot_columns
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, *_ = env.step(np.full(env.layout.max_pending, 0))
    pend = env.state().pending
    assert pend.cached_prefix_tokens.shape == (len(pend), env.layout.n_datacenters)
    assert not pend.cached_prefix_tokens.any() and (pend.session_dc == -1).all() and (pend.session_id == -1).all()
    assert not any(k in env.episode_metrics() for k in SESSION_METRICS)


def test_session_env_state_observation_and_sticky():
    env = _env("llama8b-sessions-low", duration_s=60.0, **CACHE_ENV)
    L = env.layout
    assert L.prefix_cache
    col = L.slot_columns["cached_prefix"]
    pol = carbon_gym.make_policy("sticky", env)
    obs, info = env.reset(seed=0)
    pol.reset(env)
    seen_cached = 0
    while True:
        st = env.state()
        pend = st.pending
        n = len(pend)
        if n:
            sl = obs["slots"].reshape(L.max_pending, L.n_slot_features)
            frac = pend.cached_prefix_tokens / pend.prompt_tokens[:, None]
            assert np.allclose(sl[:n, col:col + L.n_datacenters], frac, atol=1e-6)
            assert (pend.cached_prefix_tokens < pend.prompt_tokens[:, None]).all()
            seen_cached += int(pend.cached_prefix_tokens.any(axis=1).sum())
        obs, _, term, trunc, info = env.step(pol.act(obs, info))
        if term or trunc:
            break
    m = env.episode_metrics()
    assert seen_cached > 0  # shared system prompts and later turns hit
    assert m["session_turns"] > 0 and m["session_moves"] == 0  # nothing forbids a session's datacenter here
    assert 0 < m["prefix_hit_rate"] < 1
    assert m["prefix_cached_tokens"] <= m["prefix_prompt_tokens"]


def test_cache_blind_milp_ignores_the_cache():
    env = _env("llama8b-sessions-low", duration_s=30.0, **CACHE_ENV)
    env.reset(seed=0)
    for _ in range(25):
        env.step(np.full(env.layout.max_pending, 0))
    aware = carbon_gym.make_policy("milp", env)
    blind = carbon_gym.make_policy("milp", env, cache_aware=False)
    aware.reset(env)
    blind.reset(env)
    pa, pb = aware.problem(), blind.problem()
    assert pb.cached_prompt_tokens is None
    if pa.cached_prompt_tokens is not None:
        assert (pa.cached_prompt_tokens <= pa.prompt_tokens[:, None] - 1).all()


# ---------------------------------------------------------------------------- the experiment
def test_sessions_experiment_quick(tmp_path):
    from eval import cli
    from eval.sessions_experiment import SESSION_POLICIES

    out = tmp_path / "res"
    argv = ["experiment", "sessions", "--workers", "1", "--no-progress", "--no-tensorboard", "--no-plots", "--out", str(out)]
    assert cli.main(argv) == 0
    import pandas as pd

    t = pd.read_csv(out / "sessions" / "sessions.csv")
    labels = [r[0] for r in SESSION_POLICIES] + ["milp (affinity=1)"]
    assert list(t["policy"]) == labels and set(t["scenario"]) == {"llama8b-sessions-low"}
    assert (t["prefix_hit_rate"] > 0).all() and (t["prefix_hit_rate"] < 1).all()
    sticky = t.set_index("policy").loc["sticky"]
    assert sticky["session_moves"] == 0 and sticky["session_turns"] > 0
    f = pd.read_csv(out / "sessions" / "sessions_frontier.csv")
    assert f["affinity_g_per_ktok"].tolist() == [0.0, 1.0]
    md = (out / "sessions" / "sessions.md").read_text()
    assert "Carbon-vs-affinity frontier" in md and "| llama8b-sessions-low | sticky |" in md


def test_session_metrics_are_window_relative():
    tr = SessionTracker(3, np.ones(3), np.ones(3))
    rows = np.zeros((1, len(COLUMNS)))
    rows[:, PROMPT] = 5000
    sim = _Sim(np.zeros((1, 3)))  # totals at the window's start: prompt (1000, 3000, 0), cached (500, 1500, 0)
    tr.observe(sim, _Store([5]), rows, window_open=False)
    tr.observe(sim, _Store([5]), rows, window_open=True)  # the window opens: baseline
    sim.t = _Totals([2000, 3000, 100], [900, 1500, 0])
    m = tr.metrics(sim)
    assert (m["prefix_prompt_tokens"], m["prefix_cached_tokens"]) == (1100, 400)
    assert m["prefix_hit_rate"] == pytest.approx(400 / 1100)
    assert m["dc_prefix_hit_rate"][0] == pytest.approx(0.4) and np.isnan(m["dc_prefix_hit_rate"][1])
