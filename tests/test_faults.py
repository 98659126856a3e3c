"""Fault injection: schema validation, each fault kind's effect on the simulator and the env,
exact timing, and equivalence of the fast path with step mode under faults."""

from __future__ import annotations

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv, decode_observation
from carbon_gym.errors import ActionError, ConfigError
from carbon_gym.faults import FaultRuntime, parse_faults, scenario_faults
from carbon_gym.policy import RoundRobinPolicy, rollout
from carbon_gym.scenario import load_scenario, scenario_from_dict
from carbon_gym.world import build_world

DE, FR = 0, 1


def dev(faults: list[dict], **overrides) -> object:
    """The dev scenario (1 region, de + fr, 16 engines) with these faults."""
    base = load_scenario("dev", overrides={"duration_s": 30.0, **overrides})
    raw = base.to_dict()
    raw["faults"] = faults
    return scenario_from_dict(raw)


def two_region(faults: list[dict], **overrides) -> object:
    raw = load_scenario("dev-fault", overrides={"duration_s": 30.0, **overrides}).to_dict()
    raw["faults"] = faults
    return scenario_from_dict(raw)


def step_all(env, d: int, seed: int = 0):
    """Run an episode sending everything allowed to datacenter d (else the first allowed, else defer)."""
    obs, info = env.reset(seed=seed)
    D = env.layout.n_datacenters
    infos = [info]
    while True:
        m = info["action_mask"]
        a = np.where(m[:, d], d, np.where(m[:, :D].any(1), np.argmax(m[:, :D], axis=1), D))
        obs, r, term, trunc, info = env.step(a)
        infos.append(info)
        if trunc:
            return infos


# ----------------------------------------------------------------------------- schema
@pytest.mark.parametrize(
    "fault, field, allowed",
    [
        ({"kind": "meteor", "start_s": 1.0}, "faults[0].kind", "datacenter_outage"),
        ({"start_s": 1.0}, "faults[0].kind", "region_outage"),
        ({"kind": "datacenter_outage", "datacenter": "xx", "start_s": 1.0}, "faults[0].datacenter", "de"),
        ({"kind": "datacenter_outage", "datacenter": "de"}, "faults[0].start_s", None),
        ({"kind": "datacenter_outage", "datacenter": "de", "start_s": 5.0, "end_s": 5.0}, "faults[0].end_s", "> 5.0"),
        ({"kind": "datacenter_outage", "datacenter": "de", "start_s": -1.0}, "faults[0].start_s", None),
        ({"kind": "datacenter_outage", "datacenter": "de", "start_s": "10 s"}, "faults[0].start_s", None),
        ({"kind": "datacenter_outage", "datacenter": "de", "start_s": 1.0, "typo": 1}, "faults[0].typo", None),
        ({"kind": "region_outage", "region": "mars", "start_s": 1.0}, "faults[0].region", "europe"),
        ({"kind": "link_degradation", "region": "europe", "start_s": 1.0}, "faults[0].rtt_factor", None),
        ({"kind": "link_degradation", "region": "europe", "start_s": 1.0, "rtt_factor": 2.0, "cut": True},
         "faults[0].rtt_factor", None),
        ({"kind": "link_degradation", "region": "europe", "start_s": 1.0, "rtt_factor": 0.5}, "faults[0].rtt_factor", None),
        ({"kind": "link_degradation", "region": "europe", "datacenters": ["de", "zz"], "start_s": 1.0, "cut": True},
         "faults[0].datacenters[1]", "fr"),
        ({"kind": "carbon_feed_gap", "mode": "garbled", "start_s": 1.0}, "faults[0].mode", "stale"),
        ({"kind": "engine_drain", "datacenter": "fr", "engines": 9, "start_s": 1.0}, "faults[0].engines", "[1, 8]"),
        ({"kind": "engine_drain", "datacenter": "fr", "engines": 0, "start_s": 1.0}, "faults[0].engines", None),
    ],
)
def test_bad_faults_get_an_error_naming_the_field(fault, field, allowed):
    with pytest.raises(ConfigError) as e:
        dev([fault])
    assert e.value.field == field, str(e.value)
    if allowed is not None:
        assert allowed in str(e.value)


def test_a_fault_after_the_episode_end_is_warned_about():
    with pytest.warns(UserWarning, match=r"faults\[0\].start_s = 99.0 s is not within the episode"):
        dev([{"kind": "datacenter_outage", "datacenter": "de", "start_s": 99.0}])


def test_faults_table_must_be_tables_and_round_trip_through_toml(tmp_path):
    with pytest.raises(ConfigError, match="faults"):
        scenario_from_dict({**load_scenario("dev").to_dict(), "faults": [1, 2]})
    s = load_scenario("dev-fault")
    assert [f.kind for f in scenario_faults(s)] == ["datacenter_outage", "link_degradation", "carbon_feed_gap",
                                                   "engine_drain"]
    p = tmp_path / "x.toml"
    p.write_text(s.to_toml())
    s2 = load_scenario(p)
    assert scenario_faults(s2) == scenario_faults(s)
    # dotted overrides reach into the fault list
    s3 = load_scenario("dev-fault", overrides={"faults.0.start_s": 20.0})
    assert scenario_faults(s3)[0].start_s == 20.0
    with pytest.raises(ConfigError) as e:
        load_scenario("dev-fault", overrides={"faults.0.datacenter": "atlantis"})
    assert e.value.field == "faults[0].datacenter"


# ----------------------------------------------------------------------------- outages
def test_outage_fails_requests_over_at_its_exact_time_with_their_arrival_time():
    # Everything goes to fr; fr goes down at 10.5 s (between decisions), back at 20 s.
    env = GeoServeEnv(dev([{"kind": "datacenter_outage", "datacenter": "fr", "start_s": 10.5, "end_s": 20.0}]))
    obs, info = env.reset(seed=1)
    D = 2
    for _ in range(10):
        obs, *_ , info = env.step(np.where(info["action_mask"][:, FR], FR, D))
    sim = env.simulator
    assert sim.now_s == 11.0 and not sim.datacenters[FR].up
    aborted = info["failed_over"]
    assert aborted > 0 and env.episode_metrics()["failed_over"] == aborted
    # the aborted requests are pending again with their original arrival times (< 10.5 s) ...
    pend = env.pending_requests(include_overflow=True)
    assert np.sum(pend["arrival_s"] < 10.0) == aborted
    # ... and fr is masked for everyone; de is allowed
    m = info["action_mask"]
    valid = decode_observation(obs, env)["slot_valid"]
    assert not m[valid, FR].any() and m[valid, DE].all()
    dec = decode_observation(obs, env)
    assert not dec["up"][FR] and dec["up"][DE]
    # choosing fr now is refused with the reason
    with pytest.raises(ActionError, match="down"):
        env.step(np.where(valid, FR, D))
    # the sim drew no power at fr while down
    e0 = env.simulator.totals().facility_energy_j[FR]
    obs, *_, info = env.step(np.where(valid, DE, D))
    assert env.simulator.totals().facility_energy_j[FR] == e0
    while True:
        m = info["action_mask"]
        obs, r, term, trunc, info = env.step(np.where(m[:, FR], FR, np.where(m[:, DE], DE, D)))
        if trunc:
            break
    met = info["episode_metrics"]
    assert met["arrived"] == met["completed"] and met["ledger"]["ok"]
    assert met["failed_over_completed"] == aborted
    assert met["dc_placed"].sum() == met["placed"] == met["arrived"] + aborted


def test_requests_sent_just_before_an_outage_are_failed_over():
    # fr goes down 0.05 s after the decision at t = 5: what was sent at 5 is still in transit
    env = GeoServeEnv(dev([{"kind": "datacenter_outage", "datacenter": "fr", "start_s": 5.05}]))
    obs, info = env.reset(seed=0)
    for _ in range(4):
        obs, *_, info = env.step(np.full(env.layout.max_pending, 2))  # defer everything
    n = int(decode_observation(obs, env)["slot_valid"].sum())
    assert n > 10
    obs, *_, info = env.step(np.where(info["action_mask"][:, FR], FR, 2))  # all pending -> fr
    assert info["failed_over"] == n and env.simulator.totals().aborted == n


def test_overlapping_outages_keep_the_datacenter_down_until_the_last_ends():
    sc = two_region([
        {"kind": "region_outage", "region": "europe", "start_s": 5.0, "end_s": 15.0},
        {"kind": "datacenter_outage", "datacenter": "fr", "start_s": 10.0, "end_s": 20.0},
    ])
    sim, _ = build_world(sc, 0)
    rt = FaultRuntime(scenario_faults(sc), sim)
    ups = {}
    for t in (4.0, 5.0, 12.0, 15.0, 19.9, 20.0):
        rt.advance(t)
        ups[t] = [dc.up for dc in sim.datacenters]
    assert ups[4.0] == [True] * 4
    assert ups[5.0] == [False, False, True, True]
    assert ups[12.0] == [False, False, True, True]
    assert ups[15.0] == [True, False, True, True]
    assert ups[19.9] == [True, False, True, True] and ups[20.0] == [True] * 4
    assert [(e.time_s, e.start) for e in rt.applied] == [(5.0, True), (10.0, True), (15.0, False), (20.0, False)]


def test_region_outage_with_every_link_cut_leaves_only_defer_and_loses_nothing():
    faults = [
        {"kind": "region_outage", "region": "north_america", "start_s": 5.0, "end_s": 12.0},
        {"kind": "link_degradation", "region": "europe", "cut": True, "start_s": 6.0, "end_s": 10.0,
         "datacenters": ["de", "fr"]},
    ]
    env = GeoServeEnv(two_region(faults))
    obs, info = env.reset(seed=0)
    rr = RoundRobinPolicy()
    rr.reset(env)
    saw_empty = False
    while True:
        t = env.simulator.now_s
        m = info["action_mask"]
        if 6.0 <= t < 10.0:
            o = env.pending_requests()["origin"]
            assert m[:, 4].all() and not np.any(o == 0)  # European requests: blocked, no slot (issue 22)
            assert (m[: len(o)] == [True, True, False, False, True]).all()  # NA: only Europe
            every = env.pending_requests(include_overflow=True)["origin"]
            assert info["blocked"] == env.state().pending_blocked == np.count_nonzero(every == 0)
            saw_empty = saw_empty or info["blocked"] > 0
        obs, r, term, trunc, info = env.step(rr.act(obs, info))
        if trunc:
            break
    met = info["episode_metrics"]
    assert saw_empty and met["completed"] == met["arrived"] and met["ledger"]["ok"]


# ----------------------------------------------------------------------------- links
def test_degraded_link_adds_delay_to_observation_and_to_requests_sent_during_it():
    factor = 5.0
    sc = two_region([{"kind": "link_degradation", "region": "europe", "datacenters": ["ca-on"],
                      "rtt_factor": factor, "start_s": 10.0, "end_s": 20.0}])
    env = GeoServeEnv(sc)
    obs, info = env.reset(seed=0)
    base_ow = np.array(env.simulator.network.one_way_s)
    CA = 3
    checked = 0
    while True:
        t = env.simulator.now_s
        pend = env.pending_requests()
        if len(pend["origin"]):
            dec = decode_observation(obs, env)
            o = pend["origin"]
            prompt = pend["prompt_tokens"]
            up_per_tok = env.simulator._bytes_per_token_s
            f = factor if 10.0 <= t < 20.0 else 1.0
            expect = 2 * base_ow[o, CA] * np.where(o == 0, f, 1.0) + prompt * up_per_tok
            np.testing.assert_allclose(pend["network_s"][:, CA], expect, rtol=1e-12)
            np.testing.assert_allclose(dec["slot_network_s"][: len(o), CA], expect, rtol=1e-5)
            checked += int(((o == 0) & (10.0 <= t < 20.0)).sum())
        a = np.where(info["action_mask"][:, CA], CA, 4)
        obs, r, term, trunc, info = env.step(a)
        if trunc:
            break
    assert checked > 20
    assert info["episode_metrics"]["completed"] == info["episode_metrics"]["arrived"]
    assert np.array_equal(env.simulator.network.one_way_s, base_ow)  # restored after the fault


def test_network_delay_of_records_follows_the_link_state():
    factor = 4.0
    sc = dev([{"kind": "link_degradation", "region": "europe", "rtt_factor": factor, "start_s": 10.0, "end_s": 20.0}])
    sim, wl = build_world(sc, 0)
    rt = FaultRuntime(scenario_faults(sc), sim)
    ow = np.array(sim.network.one_way_s)
    for t in range(1, 30):
        b = wl.arrivals_between(t - 1, t)
        rt.advance(float(t))
        sim.submit_batch(b.origin, b.arrival_s, b.prompt_tokens, b.output_tokens, np.full(len(b), FR))
    sim.run_until_idle()
    r = sim.pop_completed()
    f = np.where((r.sent_s >= 10.0) & (r.sent_s < 20.0), factor, 1.0)
    per_tok = sim._bytes_per_token_s
    np.testing.assert_allclose(r.network_s, 2 * ow[0, FR] * f + r.prompt_tokens * per_tok, rtol=1e-12)
    assert (f > 1).sum() > 50 and (f == 1).sum() > 50


def test_cut_link_masks_only_that_region_and_names_the_reason():
    sc = two_region([{"kind": "link_degradation", "region": "europe", "datacenters": ["de"], "cut": True,
                      "start_s": 0.0}])
    env = GeoServeEnv(sc)
    obs, info = env.reset(seed=0)
    pend = env.pending_requests()
    m = info["action_mask"][: len(pend["origin"])]
    eu = pend["origin"] == 0
    assert eu.any() and (~eu).any()
    assert not m[eu, DE].any() and m[~eu, DE].all() and m[:, 1:4].all()
    k = int(np.flatnonzero(eu)[0])
    a = np.full(env.layout.max_pending, 4)
    a[k] = DE
    with pytest.raises(ActionError, match="link from region 0 is cut"):
        env.step(a)


def test_cutting_a_link_fails_over_the_requests_travelling_over_it():
    # north_america's clients -> de: ~70 ms one way; cut 10 ms after the decision at t = 5
    na, de = 1, DE
    sc = two_region([{"kind": "link_degradation", "region": "north_america", "datacenters": ["de"], "cut": True,
                      "start_s": 5.01, "end_s": 8.0}])
    env = GeoServeEnv(sc)
    obs, info = env.reset(seed=0)
    K, D = env.layout.max_pending, env.layout.n_datacenters
    for _ in range(4):
        obs, *_, info = env.step(np.full(K, D))  # defer everything
    pend = env.pending_requests()
    n = len(pend["origin"])
    from_na = int((pend["origin"][:K] == na).sum())
    assert from_na >= 5 and n <= K
    assert env.simulator.network.one_way_s[na, de] > 0.02
    obs, *_, info = env.step(np.where(info["action_mask"][:, de], de, D))  # everything -> de
    # the ones from north_america were still on the wire at 5.01 s: failed over, nothing else
    assert info["failed_over"] == from_na and env.simulator.totals().aborted == from_na
    back = env.pending_requests()
    sent = pend["arrival_s"][pend["origin"] == na]
    again = np.isin(back["arrival_s"], sent)  # back with their arrival times (the rest are new arrivals)
    assert again.sum() == from_na and (back["origin"][again] == na).all()
    assert not info["action_mask"][np.flatnonzero(back["origin"] == na), de].any()  # masked while cut
    # placed elsewhere, they complete; the episode's ledger balances and nothing is lost
    while True:
        obs, _, _, trunc, info = env.step(RoundRobinPolicy().act(obs, info))
        if trunc:
            break
    m = info["episode_metrics"]
    assert m["ledger"]["ok"] and m["failed_over"] == from_na
    assert m["failed_over_completed"] == from_na
    assert m["completed"] + m["in_flight_at_truncation"] + m["failed_over"] == m["placed"]

# ----------------------------------------------------------------------------- carbon feed
@pytest.mark.parametrize("mode", ["stale", "missing"])
def test_carbon_feed_gap_hides_intensity_but_emissions_stay_real(mode):
    # the episode starts 30 s before an hour change: a stale feed keeps the old hour's value
    ov = {"carbon.start_utc": "2023-06-15T11:59:30Z", "duration_s": 60.0}
    gap = {"kind": "carbon_feed_gap", "mode": mode, "datacenters": ["fr"], "start_s": 10.0, "end_s": 45.0}
    env_gap = GeoServeEnv(dev([gap], **ov))
    env_ok = GeoServeEnv(load_scenario("dev", overrides=ov))
    L = env_gap.layout
    assert L.n_dc_features == env_ok.layout.n_dc_features + 2
    assert env_gap.observation_space["datacenters"].shape == (2 * L.n_dc_features,)
    o1, i1 = env_gap.reset(seed=3)
    o2, i2 = env_ok.reset(seed=3)
    rr1, rr2 = RoundRobinPolicy(), RoundRobinPolicy()
    seen = set()
    while True:
        t = env_gap.simulator.now_s
        d1, d2 = decode_observation(o1, env_gap), decode_observation(o2, env_ok)
        assert env_gap.observation_space.contains(o1)
        np.testing.assert_array_equal(d1["carbon_g_per_kwh"][DE], d2["carbon_g_per_kwh"][DE])
        if 10.0 <= t < 45.0:
            assert d1["carbon_stale"][FR] == (mode == "stale") and d1["carbon_missing"][FR] == (mode == "missing")
            assert not d1["carbon_stale"][DE] and not d1["carbon_missing"][DE]
            if mode == "missing":
                assert np.isnan(d1["carbon_g_per_kwh"][FR]) and np.isnan(d1["carbon_forecast_g_per_kwh"][FR]).all()
            else:  # frozen at the value of 10 s (the old hour), whatever the true value is now
                frozen = env_gap.simulator.datacenters[FR].intensity(10.0)
                assert d1["carbon_g_per_kwh"][FR] == pytest.approx(frozen, rel=1e-6)
                seen.add(bool(d2["carbon_g_per_kwh"][FR] != pytest.approx(frozen, rel=1e-6)))
        else:
            assert not d1["carbon_stale"].any() and not d1["carbon_missing"].any()
            np.testing.assert_array_equal(d1["carbon_g_per_kwh"], d2["carbon_g_per_kwh"])
            np.testing.assert_array_equal(d1["carbon_forecast_g_per_kwh"], d2["carbon_forecast_g_per_kwh"])
        a1, a2 = rr1.act(o1, i1), rr2.act(o2, i2)
        np.testing.assert_array_equal(a1, a2)
        o1, r1, _, t1, i1 = env_gap.step(a1)
        o2, r2, _, t2, i2 = env_ok.step(a2)
        assert i1["carbon_g"] == i2["carbon_g"] and r1 == r2  # the real emissions, bit for bit
        if t1:
            break
    if mode == "stale":
        assert seen == {False, True}  # the stale value differed from the live one after the hour change
    m1, m2 = i1["episode_metrics"], i2["episode_metrics"]
    assert m1["carbon_g"] == m2["carbon_g"] and m1["ledger"]["ok"]


# ----------------------------------------------------------------------------- drains
def test_engine_drain_moves_queue_finishes_work_then_powers_off():
    sc = dev([{"kind": "engine_drain", "datacenter": "fr", "engines": 6, "start_s": 5.0, "end_s": 20.0}],
             **{"workload.rate_per_s": 40.0})
    sim, wl = build_world(sc, 0)
    rt = FaultRuntime(scenario_faults(sc), sim)
    fr = sim.datacenters[FR]
    idle_w = sim._models.idle_engine_w
    for t in range(1, 30):
        b = wl.arrivals_between(t - 1, t)
        rt.advance(float(t))
        if t == 5:
            drained = fr.engines[2:]
            assert all(e.draining for e in drained) and not any(e.draining for e in fr.engines[:2])
            assert all(len(e.waiting) == 0 for e in drained)  # their queues moved to engines 0-1
            assert sim.snapshot().accepting_engines[FR] == 2
        if 7 <= t < 20:
            # drained engines got no new request; once empty they draw nothing
            for e in fr.engines[2:]:
                assert not e.waiting
                if not e.running:
                    assert e.power_w == 0.0 and e.is_idle
        if t == 19:
            assert all(not e.running for e in fr.engines[2:])
            gpu = sum(e.power_w for e in fr.engines)
            assert fr.gpu_w == pytest.approx(gpu) and fr.gpu_w <= 2 * max(e.power_w for e in fr.engines[:2]) * (1 + 1e-12)
        if t == 20:
            assert not any(e.draining for e in fr.engines) and fr.accepting_engines == 8
            assert all(e.power_w == idle_w for e in fr.engines[2:] if e.is_idle)
        sim.submit_batch(b.origin, b.arrival_s, b.prompt_tokens, b.output_tokens, np.full(len(b), FR))
    sim.run_until_idle()
    t = sim.totals()
    assert t.completed == t.submitted and t.aborted == 0
    recs = sim.pop_completed()
    late = (recs.dc_arrival_s > 6.0) & (recs.dc_arrival_s < 20.0)
    assert late.sum() > 100 and set(recs.engine[late].tolist()) <= {0, 1}


def test_draining_every_engine_masks_the_datacenter():
    env = GeoServeEnv(dev([{"kind": "engine_drain", "datacenter": "de", "engines": 8, "start_s": 3.0, "end_s": 8.0}]))
    obs, info = env.reset(seed=0)
    while True:
        t = env.simulator.now_s
        valid = decode_observation(obs, env)["slot_valid"]
        if valid.any():
            assert info["action_mask"][valid, DE].all() == (not 3.0 <= t < 8.0)
        obs, r, term, trunc, info = env.step(np.where(info["action_mask"][:, DE], DE, FR))
        if trunc:
            break
    assert info["episode_metrics"]["completed"] == info["episode_metrics"]["arrived"]


# ----------------------------------------------------------------------------- fast path == step mode
def test_fast_path_equals_step_mode_under_every_fault_kind():
    sc = two_region([
        {"kind": "datacenter_outage", "datacenter": "de", "start_s": 7.3, "end_s": 15.0},
        {"kind": "engine_drain", "datacenter": "fr", "engines": 5, "start_s": 4.2, "end_s": 18.0},
        {"kind": "link_degradation", "region": "north_america", "rtt_factor": 3.0, "start_s": 2.0, "end_s": 12.0},
        {"kind": "engine_drain", "datacenter": "ca-on", "engines": 8, "start_s": 6.0, "end_s": 9.5, "power_off": False},
    ], **{"workload.rate_per_s": 30.0})
    results = []
    for step_mode in (False, True):
        sim, wl = build_world(sc, 0, step_mode=step_mode)
        rt = FaultRuntime(scenario_faults(sc), sim)
        aborted = []
        for t in range(1, 25):
            b = wl.arrivals_between(t - 1, t)
            for ab in rt.advance(float(t)):
                aborted.append(ab)
            up = [i for i, dc in enumerate(sim.datacenters) if dc.up]
            dcs = np.array(up)[np.arange(len(b)) % len(up)]
            sim.submit_batch(b.origin, b.arrival_s, b.prompt_tokens, b.output_tokens, dcs)
        sim.run_until_idle()
        results.append((sim.pop_completed().sorted_by_id(), sim.totals(), aborted))
    (r0, t0, a0), (r1, t1, a1) = results
    assert len(r0) == len(r1) > 300 and t0.aborted == t1.aborted > 0
    for k, v in r0.to_dict().items():
        np.testing.assert_allclose(v, getattr(r1, k), rtol=1e-9, atol=1e-9, err_msg=k)
    np.testing.assert_allclose(t0.carbon_g, t1.carbon_g, rtol=1e-9)
    np.testing.assert_allclose(t0.idle_energy_j, t1.idle_energy_j, rtol=1e-9)
    np.testing.assert_array_equal(np.concatenate([a.request_id for a in a0]), np.concatenate([a.request_id for a in a1]))


def test_simulator_fault_api_validates_arguments():
    sim, _ = build_world(load_scenario("dev"), 0)
    with pytest.raises(ConfigError, match="one_way_s"):
        sim.set_link_delay(0, 0, float("nan"))
    with pytest.raises(ConfigError, match="dc"):
        sim.set_link_delay(0, 5, 0.1)
    with pytest.raises(ConfigError, match="n_engines"):
        sim.set_engines_draining(0, 9)
    with pytest.raises(ConfigError, match="origin"):
        sim.set_link_delay(3, 0, 0.1)


def test_parse_faults_is_reusable_without_a_scenario():
    topo = load_scenario("dev").topology_spec()
    f = parse_faults([{"kind": "region_outage", "region": "europe", "start_s": 0.0}], topo, duration_s=10.0)
    assert f[0].end_s is None and f[0].region == "europe"
    m = rollout(GeoServeEnv(dev([{"kind": "region_outage", "region": "europe", "start_s": 10.0, "end_s": 12.0}])),
                RoundRobinPolicy(), seed=0)
    assert m["completed"] == m["arrived"] and m["failed_over"] > 0 and m["ledger"]["ok"]


def test_faults_do_not_leak_into_the_next_episode():
    # link delays, drains and outages applied in one episode are gone after reset
    env = GeoServeEnv("dev-fault", overrides={"duration_s": 40.0})
    runs = [rollout(env, RoundRobinPolicy(), seed=5) for _ in range(2)]
    for k in ("arrived", "completed", "failed_over", "carbon_g", "ttft_p99_s", "energy_kwh"):
        assert runs[0][k] == runs[1][k], k
    env.reset(seed=5)
    fresh = GeoServeEnv("dev-fault", overrides={"duration_s": 40.0})
    fresh.reset(seed=5)
    np.testing.assert_array_equal(env.simulator.network.one_way_s, fresh.simulator.network.one_way_s)
    assert all(dc.up and dc.n_draining == 0 for dc in env.simulator.datacenters)
