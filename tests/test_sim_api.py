"""Simulator API: bad input gets a ConfigError naming the field; snapshot, estimates,
pop_completed, totals and datacenter outages."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from carbon_gym.errors import ConfigError
from carbon_gym.sim import EngineConfig, Simulator, available_dispatchers
from carbon_gym.specs import load_model_spec
from carbon_gym.topology import DatacenterSpec, Topology
from test_sim_fixtures import GPU, LAT, MODEL, POW, drive, make_sim, random_workload, world


def field_of(excinfo) -> str:
    return excinfo.value.field


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(datacenter=2), "datacenter"),
        (dict(datacenter=-1), "datacenter"),
        (dict(origin=7), "origin"),
        (dict(prompt_tokens=float("nan")), "prompt_tokens"),
        (dict(prompt_tokens=0), "prompt_tokens"),
        (dict(prompt_tokens=12.5), "prompt_tokens"),
        (dict(output_tokens=-3), "output_tokens"),
        (dict(output_tokens=float("inf")), "output_tokens"),
        (dict(arrival_s=float("nan")), "arrival_s"),
        (dict(arrival_s=-1.0), "arrival_s"),
        (dict(arrival_s=5.0), "arrival_s"),  # in the future
        (dict(prompt_tokens=30000, output_tokens=3000), "prompt_tokens"),  # > max_model_len
    ],
)
def test_submit_rejects_bad_input_naming_the_field(kwargs, field):
    sim = make_sim()
    sim.advance_to(1.0)
    args = dict(origin=0, arrival_s=0.5, prompt_tokens=10, output_tokens=10, datacenter=0)
    args.update(kwargs)
    with pytest.raises(ConfigError) as ei:
        sim.submit(**args)
    assert field_of(ei) == field
    assert sim.totals().submitted == 0


def test_submit_batch_validates_and_returns_sequential_ids():
    sim = make_sim()
    sim.advance_to(1.0)
    ids = sim.submit_batch([0, 1, 1], [0.1, 0.2, 1.0], [10, 20, 30], [5, 5, 5], [1, 0, 1])
    assert ids.tolist() == [0, 1, 2]
    assert sim.submit(0, 1.0, 3, 3, 0) == 3
    with pytest.raises(ConfigError) as ei:
        sim.submit_batch([0, 1], [0.1, 0.2], [10, -2], [5, 5], [0, 0])
    assert ei.value.field == "prompt_tokens[1]"
    with pytest.raises(ConfigError) as ei:
        sim.submit_batch([0, 1], [0.1, 0.2], [10, 2], [5, 5], [0, 9])
    assert ei.value.field == "datacenters[1]"
    with pytest.raises(ConfigError) as ei:
        sim.submit_batch([0, 1], [0.1, np.nan], [10, 2], [5, 5], [0, 0])
    assert ei.value.field == "arrival_s[1]"
    with pytest.raises(ConfigError):
        sim.submit_batch([0, 1], [0.1], [10, 2], [5, 5], [0, 0])
    assert sim.totals().submitted == 4
    # ids are owned by each simulator
    assert make_sim().submit(0, 0.0, 3, 3, 0) == 0


def test_constructor_rejects_bad_configuration():
    topo, net, ct = world(2, nodes=1, gpus_per_node=8)
    base = dict(topology=topo, model=MODEL, gpu=GPU, latency=LAT, power=POW, network=net, carbon=ct)

    def build(**kw):
        args = dict(base)
        args.update(kw)
        return Simulator(args.pop("topology"), args.pop("model"), args.pop("gpu"), args.pop("latency"),
                         args.pop("power"), args.pop("network"), args.pop("carbon"), **args)

    with pytest.raises(ConfigError) as ei:
        build(engine=EngineConfig(tp=3))
    assert ei.value.field == "engine.tp" and "1, 2, 4, 8" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        build(model=load_model_spec("mixtral-8x7b"))  # 93 GB of weights on one 80 GB GPU
    assert ei.value.field == "engine.gpu_memory_utilization" and "engine.tp" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        build(gpu=dataclasses.replace(GPU, memory_bytes=18e9))  # fits, but not max_model_len of KV
    assert ei.value.field == "engine.max_model_len"
    with pytest.raises(ConfigError) as ei:
        build(dispatcher="random")
    assert ei.value.field == "dispatcher" and "least_work" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        build(engine=EngineConfig(max_num_batched_tokens=100))
    assert ei.value.field == "engine.max_num_batched_tokens"
    with pytest.raises(ConfigError) as ei:
        build(engine=EngineConfig(gpu_memory_utilization=1.5))
    assert ei.value.field == "engine.gpu_memory_utilization"
    with pytest.raises(ConfigError) as ei:
        build(carbon_offset_s=float("nan"))
    assert ei.value.field == "carbon_offset_s"
    bad_zone = Topology(topo.regions, (DatacenterSpec("x", "r0", "NOPE"),) + topo.datacenters[1:])
    with pytest.raises(ConfigError) as ei:
        build(topology=bad_zone)
    assert ei.value.field == "zone" and "Z0" in str(ei.value)
    net3 = type(net)(np.ones((3, 2)) * 0.01)
    with pytest.raises(ConfigError) as ei:
        build(network=net3)
    assert ei.value.field == "network.one_way_s"
    assert set(available_dispatchers()) >= {"least_work", "most_free_kv"}
    sim = build()
    with pytest.raises(ConfigError) as ei:
        sim.advance_to(float("nan"))
    assert ei.value.field == "t_s"
    sim.advance_to(2.0)
    with pytest.raises(ConfigError):
        sim.advance_to(1.0)


def test_pop_completed_returns_each_request_once():
    sim = make_sim()
    rng = np.random.default_rng(0)
    wl = random_workload(rng, 40, 2, rate_per_s=10.0, max_prompt=500, max_output=100)
    drive(sim, wl, until_s=float(wl["send_s"][-1]))
    first = sim.pop_completed()
    assert 0 < len(first) < 40
    assert len(sim.pop_completed()) == 0
    sim.advance_to(1e4)
    second = sim.pop_completed()
    ids = np.concatenate([first.request_id, second.request_id])
    assert sorted(ids.tolist()) == list(range(40))
    assert sim.totals().completed == 40 and sim.totals().in_flight == 0


def test_snapshot_counts_and_estimates_track_load():
    sim = make_sim(n_dc=2, nodes=1, gpus_per_node=1)
    s0 = sim.snapshot()
    assert s0.queue_len.tolist() == [0, 0] and s0.running.tolist() == [0, 0]
    assert (s0.free_kv_blocks == s0.total_kv_blocks).all() and s0.up.all()
    assert np.all(np.isfinite(s0.est_tpot_s)) and np.all(s0.est_queue_wait_s == 0)
    # a lone decode iteration with one sequence at context ~1 token
    assert s0.est_tpot_s[0] == pytest.approx(LAT.iteration_time_s(0, 0.0, 1, 1.0, 1), rel=1e-12)
    # load datacenter 0 with 40 requests sent now
    for _ in range(40):
        sim.submit(0, 0.0, 1500, 200, 0)
    s1 = sim.snapshot()
    assert s1.queue_len.tolist() == [40, 0]  # in transit
    sim.advance_to(0.02)
    s2 = sim.snapshot()
    assert s2.queue_len[0] + s2.running[0] == 40 and s2.busy_engines.tolist() == [1, 0]
    assert s2.est_queue_wait_s[0] > 0.5 and s2.est_queue_wait_s[1] == 0
    assert s2.power_w[0] > s2.power_w[1]
    sim.advance_to(4.0)
    s3 = sim.snapshot()
    assert s3.running[0] > 20
    assert s3.est_tpot_s[0] > 1.3 * s3.est_tpot_s[1]
    # decode iteration with the running batch + 1 at its mean context, stretched by the share of
    # time prefill chunks take (40 x 1500 prompt tokens arrived ~4 s ago, 60 s average)
    n = int(s3.running[0])
    mean_ctx = (s3.total_kv_blocks[0] - s3.free_kv_blocks[0]) * 16 / n
    t_dec = LAT.iteration_time_s(0, 0.0, n + 1, (n + 1) * (mean_ctx + 1), n + 1)
    arr = sim.network.uplink_s(0, 0, 1500)
    rho = 40 * 1500 * math.exp(-(4.0 - arr) / 60.0) / 60.0 * s3.est_prefill_s_per_token[0]
    assert s3.est_tpot_s[0] == pytest.approx(t_dec / (1 - rho), rel=1e-9)
    assert s3.tpot_slope_s_per_seq[0] > 0
    assert s3.free_kv_blocks[0] < s3.total_kv_blocks[0]
    est = sim.estimate([100, 4000], [0, 1])
    assert est.ttft_s.shape == (2, 2)
    np.testing.assert_allclose(est.ttft_s, est.network_s + est.queue_wait_s + est.prefill_s)
    assert est.prefill_s[1, 1] > est.prefill_s[0, 1]
    np.testing.assert_allclose(est.tpot_s[:, 0], s3.est_tpot_s[0])
    assert est.network_s[0, 0] == pytest.approx(sim.network.uplink_s(0, 0, 100) + sim.network.downlink_s(0, 0))


def test_idle_estimate_is_close_to_a_lone_requests_actual_ttft():
    sim = make_sim(n_dc=1, gpus_per_node=1)
    for p in (200, 1000, 3000):
        est = sim.estimate([p], [0])
        probe = make_sim(n_dc=1, gpus_per_node=1)
        probe.submit(0, 0.0, p, 2, 0)
        probe.advance_to(100.0)
        actual = probe.pop_completed().ttft_s[0]
        assert est.ttft_s[0, 0] == pytest.approx(actual, rel=0.25)


def test_datacenter_outage_aborts_its_requests_and_stops_its_power():
    sim = make_sim(n_dc=2, nodes=1, gpus_per_node=2)
    rng = np.random.default_rng(4)
    wl = random_workload(rng, 60, 2, rate_per_s=20.0, max_prompt=800, max_output=300)
    drive(sim, wl, until_s=float(wl["send_s"][-1]))
    before = sim.totals()
    aborted = sim.set_datacenter_up(0, False)
    assert len(aborted) > 0 and (aborted.datacenter == 0).all()
    t = sim.totals()
    assert t.submitted == t.completed + t.aborted + t.in_flight and t.aborted == len(aborted)
    snap = sim.snapshot()
    assert not snap.up[0] and snap.power_w[0] == 0 and snap.queue_len[0] == 0 and math.isinf(snap.est_tpot_s[0])
    with pytest.raises(ConfigError) as ei:
        sim.submit(0, sim.now_s, 10, 10, 0)
    assert ei.value.field == "datacenter"
    e0 = before.facility_energy_j[0]
    sim.advance_to(sim.now_s + 100.0)
    sim.set_datacenter_up(0, True)
    # resubmit the aborted requests to datacenter 1; everything completes
    sim.submit_batch(aborted.origin, aborted.arrival_s, aborted.prompt_tokens, aborted.output_tokens,
                     np.ones(len(aborted), dtype=np.int64))
    sim.advance_to(sim.now_s + 1e4)
    t2 = sim.totals()
    assert t2.in_flight == 0 and t2.completed + t2.aborted == t2.submitted
    done = sim.pop_completed()
    assert len(done) == t2.completed
    assert t.facility_energy_j[0] >= e0
    # while down (100 s) datacenter 0 drew nothing: its energy grew only by the idle period after
    idle_w = (2 * POW.idle_w + POW.host_w) * sim.topology.datacenters[0].pue
    assert t2.facility_energy_j[0] - t.facility_energy_j[0] == pytest.approx(idle_w * (t2.time_s - t.time_s - 100.0),
                                                                               rel=1e-9)


def test_large_submit_batch_validates_with_numpy_and_matches_scalar_submits():
    n = 40
    rng = np.random.default_rng(1)
    o = rng.integers(0, 2, n)
    p = rng.integers(1, 500, n)
    q = rng.integers(1, 50, n)
    d = rng.integers(0, 2, n)
    a = np.sort(rng.uniform(0, 1, n))
    sims = [make_sim(), make_sim()]
    for s in sims:
        s.advance_to(1.0)
    ids = sims[0].submit_batch(o, a, p, q, d)
    assert ids.tolist() == list(range(n))
    for i in range(n):
        sims[1].submit(int(o[i]), float(a[i]), int(p[i]), int(q[i]), int(d[i]))
    recs = []
    for s in sims:
        s.run_until_idle()
        assert s.next_event_s() == math.inf
        recs.append(s.pop_completed().sorted_by_id())
    np.testing.assert_array_equal(recs[0].done_s, recs[1].done_s)
    bad = p.astype(float)
    bad[33] = np.nan
    with pytest.raises(ConfigError) as ei:
        sims[0].submit_batch(o, a, bad, q, d)
    assert ei.value.field == "prompt_tokens[33]"
    bad_d = d.copy()
    bad_d[35] = 2
    with pytest.raises(ConfigError) as ei:
        sims[0].submit_batch(o, a, p, q, bad_d)
    assert ei.value.field == "datacenters[35]"
    late = a.copy()
    late[20] = sims[0].now_s + 1.0
    with pytest.raises(ConfigError) as ei:
        sims[0].submit_batch(o, late, p, q, d)
    assert ei.value.field == "arrival_s[20]"
    assert sims[0].totals().submitted == n  # nothing of a rejected batch was submitted


@pytest.mark.parametrize("interpolation", ["step", "linear"])
def test_zone_clock_equals_the_trace_integral(interpolation):
    from carbon_gym.sim.datacenter import ZoneClock

    _, _, ct = world(2, hours=30, interpolation=interpolation)
    clock = ZoneClock(ct, 1, 1000.0)
    assert clock.fast
    rng = np.random.default_rng(0)
    for t in np.concatenate([rng.uniform(0, 3 * ct.period_s, 200), [0.0, 2600.0, ct.period_s - 1000.0]]):
        ref = ct.integral(1, 0.0, 1000.0 + t)
        assert clock(t) == pytest.approx(ref, rel=1e-12, abs=1e-9)

    class OtherTrace:  # any object with integral() works through the slow path
        def integral(self, zone, t0, t1):
            return 2.0 * (t1 - t0)

    slow = ZoneClock(OtherTrace(), 0, 5.0)
    assert not slow.fast and slow(10.0) == pytest.approx(30.0)


def test_datacenter_engine_count_is_the_simulators():
    """``DatacenterSpec.engines(tp)`` (the one formula the tools use) equals the engines the
    simulator builds: whole engines of ``tp`` GPUs, none where the datacenter has fewer GPUs."""
    from carbon_gym.env import GeoServeEnv

    assert [DatacenterSpec("x", "r", "Z", nodes=n, gpus_per_node=g).engines(tp) for n, g, tp in
            ((4, 8, 1), (4, 8, 4), (1, 2, 4), (3, 8, 8))] == [32, 8, 0, 3]
    for name in ("dev", "mixtral8x7b-moderate"):
        env = GeoServeEnv(name, {"duration_s": 1.0})
        env.reset(seed=0)
        sc, topo = env.unwrapped.scenario, env.unwrapped.world_parts.topology
        assert [d.n_engines for d in env.unwrapped.simulator.datacenters] == [d.engines(sc.tp) for d in topo.datacenters]
