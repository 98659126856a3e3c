"""Capacity control in the simulator (issue 19; carbon_gym/sim/capacity.py): analytic powers,
energies and waits of sleeping / waking / powered-off / booting engines and nodes, draining,
random schedules (hypothesis), compiled == pure Python, copies, outages, argument errors."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import carbon_gym.sim as sim_pkg
from carbon_gym.errors import ConfigError
from carbon_gym.scenario import load_scenario
from carbon_gym.sim import _native
from carbon_gym.sim.capacity import (ASLEEP, AWAKE, BOOTING, DRAINING, FALLING, NODE_BOOTING, NODE_OFF, NODE_ON,
                                     NODE_STANDBY, OFF, WAKING)
from carbon_gym.sim.simulator import Simulator
from carbon_gym.world import build_world

ROOT = Path(__file__).resolve().parents[1]
#: Capacity-state powers that differ from the idle ones (the A100's sleep_w == idle_w and host
#: standby == host idle would let a mixed-up state pass unseen), W.
DISTINCT = dict(sleep_w=20.0, transition_w=90.0, host_standby_w=300.0, host_off_w=40.0, boot_host_w=500.0,
                boot_gpu_w=30.0)
STATES = ("gpu_active", "gpu_idle", "gpu_falling_asleep", "gpu_asleep", "gpu_waking", "gpu_booting",
          "host_on", "host_standby", "host_off", "host_booting")


def make_sim(seed: int = 0, nodes: int = 1, **states: float) -> Simulator:
    """The dev world's simulator (2 datacenters x ``nodes`` nodes x 8 A100, TP1), optionally with
    other capacity-state parameters."""
    sim, _ = build_world(load_scenario("dev", overrides={"topology.nodes_per_datacenter": nodes}), seed)
    if states:
        args, kwargs = sim._ctor
        sim = Simulator(*args, **dict(kwargs, power_states=dataclasses.replace(sim.power_states, **states)))
    return sim


def durations(sim: Simulator) -> tuple[float, float, float]:
    """(fall asleep, wake, boot) seconds of one engine of ``sim``."""
    st, tp = sim.power_states, sim.engine_config.tp
    gb = sim.model.weight_bytes / tp / 1e9
    return st.fall_asleep_s(gb, tp), st.wake_s(gb, tp), st.boot_s(gb)


def by_state(sim: Simulator, d: int) -> dict[str, float]:
    return {k: float(v[d]) for k, v in sim.totals().energy_by_state().items()}


def check_ledger(sim: Simulator) -> None:
    """Energy by state sums to the GPU + host energy of every datacenter; none is negative."""
    t = sim.totals()
    es = t.energy_by_state()
    assert set(es) == set(STATES)
    total = sum(es.values())
    np.testing.assert_allclose(total, t.gpu_energy_j + t.host_energy_j, rtol=1e-9, atol=1e-6)
    for k, v in es.items():
        assert np.all(v >= -1e-9 * (t.gpu_energy_j + t.host_energy_j) - 1e-6), (k, v)


def check_states(sim: Simulator) -> None:
    """Engine / node states agree with each other and with the counts; KV within capacity;
    dormant engines hold no request and no KV."""
    for dc in sim.datacenters:
        counts = [0] * 7
        for e in dc.engines:
            counts[e.cap_state] += 1
            assert 0 <= e.free_blocks <= e.total_blocks
            if e.cap_state in (FALLING, ASLEEP, OFF):  # (requests may wait for a falling one to wake again)
                assert not e.running and e.free_blocks == e.total_blocks
                assert not e.waiting or (e.cap_state == FALLING and e.wake_after)
        assert list(dc.cap_counts) == counts
        cap = dc.capacity
        if cap is None:
            continue
        for n, s in enumerate(cap.node_state):
            st = [e.cap_state for e in dc.engines[n * cap.epn:(n + 1) * cap.epn]]
            assert (s == NODE_OFF) == all(x == OFF for x in st), (n, s, st)
            assert (s == NODE_STANDBY) == all(x == ASLEEP for x in st), (n, s, st)
            assert (s == NODE_BOOTING) == all(x in (BOOTING, AWAKE) for x in st) or s != NODE_BOOTING
            assert cap.node_asleep[n] == st.count(ASLEEP)


def settled_power_w(sim: Simulator, d: int) -> float:
    """Facility power of datacenter ``d`` with no request and no transition in progress."""
    dc, st, tp = sim.datacenters[d], sim.power_states, sim.engine_config.tp
    gpu = {ASLEEP: tp * st.sleep_w, OFF: 0.0}
    host = {NODE_ON: sim.power.host_w, NODE_STANDBY: st.host_standby_w, NODE_OFF: st.host_off_w}
    nodes = dc.capacity.node_state if dc.capacity is not None else [NODE_ON] * dc.spec.nodes
    for e in dc.engines:  # awake: idle power, or 0 W drained by a fault (power_off)
        assert e.rest_w == (0.0 if e.draining and e.rest_w == 0.0 else tp * sim.power.idle_w)
    return dc.pue * (sum(e.rest_w if e.cap_state == AWAKE else gpu[e.cap_state] for e in dc.engines)
                     + sum(host[s] for s in nodes))


# ---------------------------------------------------------------------------------------- 1
@pytest.mark.parametrize("states", [{}, DISTINCT], ids=["a100", "distinct"])
def test_sleeping_and_off_datacenter_draws_the_analytic_power(states):
    sim = make_sim(**states)
    st, dc = sim.power_states, sim.datacenters[0]
    fall_s, _, _ = durations(sim)
    n, tp, pue = dc.n_engines, sim.engine_config.tp, dc.pue
    sim.set_capacity(0, 0, 1)
    assert dc.cap_counts[FALLING] == n
    assert dc.power_w() == pytest.approx(pue * (n * tp * st.transition_w + sim.power.host_w), rel=1e-12)
    sim.advance_to(5.0)
    asleep_w = n * tp * st.sleep_w + st.host_standby_w
    assert dc.cap_counts[ASLEEP] == n and dc.capacity.node_state == [NODE_STANDBY]
    assert dc.power_w() == pytest.approx(pue * asleep_w, rel=1e-12)
    if not states:  # the A100's design point: sleep and standby draw what idle does
        assert dc.power_w() == pytest.approx(sim.datacenters[1].power_w(), rel=1e-12)
    e0 = by_state(sim, 0)
    sim.advance_to(25.0)
    e1 = by_state(sim, 0)
    assert e1["gpu_asleep"] - e0["gpu_asleep"] == pytest.approx(n * tp * st.sleep_w * 20.0, rel=1e-12)
    assert e1["host_standby"] - e0["host_standby"] == pytest.approx(st.host_standby_w * 20.0, rel=1e-12)
    for k in STATES:
        if k not in ("gpu_asleep", "host_standby"):
            assert e1[k] - e0[k] == pytest.approx(0.0, abs=1e-6), k
    t0 = sim.totals()
    # servers off (the engines are already asleep: the node powers off at once)
    sim.set_capacity(0, 0, 0)
    assert dc.capacity.node_state == [NODE_OFF] and dc.cap_counts[OFF] == n
    assert dc.power_w() == pytest.approx(pue * st.host_off_w, rel=1e-12) and dc.gpu_w == 0.0
    sim.advance_to(125.0)
    t1 = sim.totals()
    e2 = by_state(sim, 0)
    assert t1.gpu_energy_j[0] == t0.gpu_energy_j[0]
    assert t1.facility_energy_j[0] - t0.facility_energy_j[0] == pytest.approx(pue * st.host_off_w * 100.0, rel=1e-12)
    assert e2["host_off"] == pytest.approx(st.host_off_w * 100.0, rel=1e-12)
    # the whole history, state by state: falling, asleep 25 s - fall, off 100 s
    assert e2["gpu_falling_asleep"] == pytest.approx(n * tp * st.transition_w * fall_s, rel=1e-12)
    assert e2["gpu_asleep"] == pytest.approx(n * tp * st.sleep_w * (25.0 - fall_s), rel=1e-12)
    assert e2["host_on"] == pytest.approx(sim.power.host_w * fall_s, rel=1e-12)
    assert e2["host_standby"] == pytest.approx(st.host_standby_w * (25.0 - fall_s), rel=1e-12)
    # the other datacenter is untouched: idle all along
    e_other = by_state(sim, 1)
    assert e_other["gpu_idle"] == pytest.approx(n * tp * sim.power.idle_w * 125.0, rel=1e-12)
    assert e_other["host_on"] == pytest.approx(sim.power.host_w * 125.0, rel=1e-12)
    snap = sim.snapshot()
    assert snap.off_engines.tolist() == [n, 0] and snap.servers_on.tolist() == [0, 1]
    assert snap.awake_engines.tolist() == [0, n]
    check_ledger(sim)
    check_states(sim)


# ---------------------------------------------------------------------------------------- 2
def _one(sim: Simulator, t_s: float, prompt: int = 300, output: int = 20):
    """The record of one request sent to datacenter 0 at ``t_s``."""
    sim.advance_to(t_s)
    sim.submit(0, t_s, prompt, output, 0)
    sim.run_until_idle()
    r = sim.pop_completed()
    assert len(r) == 1
    return r


def _ttft(sim: Simulator, t_s: float) -> tuple[float, float]:
    r = _one(sim, t_s)
    return float(r.ttft_s[0]), float(r.queue_wait_s[0])


@pytest.mark.parametrize("states", [{}, DISTINCT], ids=["a100", "distinct"])
def test_a_request_waits_exactly_the_wake_or_the_boot(states):
    awake = _one(make_sim(**states), 10.0)
    fall_s, wake_s, boot_s = durations(make_sim(**states))
    assert 0.0 < fall_s < 10.0 and wake_s > 0.0
    # every engine asleep, the node in standby: one wakes for the request
    sim = make_sim(**states)
    sim.set_capacity(0, 0, 1)
    ttft, wait = _ttft(sim, 10.0)
    assert ttft == pytest.approx(awake.ttft_s[0] + wake_s, rel=1e-12)
    assert wait == pytest.approx(awake.queue_wait_s[0] + wake_s, rel=1e-12, abs=1e-12)
    cap = sim.datacenters[0].capacity
    assert cap.wakes == 1 and cap.awake_target == 1  # on demand: the target rose
    assert sim.datacenters[0].cap_counts[AWAKE] == 1
    # the node off: the request waits for the boot
    sim = make_sim(**states)
    sim.set_capacity(0, 0, 0)
    ttft, wait = _ttft(sim, 10.0)
    assert ttft == pytest.approx(awake.ttft_s[0] + boot_s, rel=1e-12)
    assert wait == pytest.approx(awake.queue_wait_s[0] + boot_s, rel=1e-12, abs=1e-12)
    assert sim.datacenters[0].capacity.boots == 1
    # reaching the datacenter while the engines fall asleep: the rest of the fall, then the wake
    sim = make_sim(**states)
    sim.advance_to(10.0)
    sim.set_capacity(0, 0, 1)
    r = _one(sim, 10.0 + fall_s / 2)
    rest_s = 10.0 + fall_s - r.dc_arrival_s[0]
    assert 0.0 < rest_s < fall_s / 2
    assert r.queue_wait_s[0] == pytest.approx(awake.queue_wait_s[0] + rest_s + wake_s, rel=1e-9, abs=1e-12)
    assert r.ttft_s[0] == pytest.approx(awake.ttft_s[0] + rest_s + wake_s, rel=1e-9)
    check_ledger(sim)


def test_a_request_wakes_a_sleeping_engine_rather_than_wait_for_a_boot():
    awake_ttft, _ = _ttft(make_sim(nodes=2), 10.0)
    sim = make_sim(nodes=2)
    _, wake_s, boot_s = durations(sim)
    dc = sim.datacenters[0]
    sim.set_capacity(0, 0, 1)  # node 0 stands by, node 1 powers off
    sim.advance_to(10.0)
    sim.set_capacity(0, 0, 2)  # node 1 boots (345 s)
    assert dc.capacity.node_state == [NODE_STANDBY, NODE_BOOTING]
    snap = sim.snapshot()
    assert snap.est_queue_wait_s[0] == pytest.approx(snap.est_queue_wait_s[1] + wake_s, rel=1e-9)
    assert snap.wake_latency_s[0] == wake_s and snap.waking_engines.tolist() == [8, 0]
    ttft, _ = _ttft(sim, 10.0)
    assert ttft == pytest.approx(awake_ttft + wake_s, rel=1e-9)
    # estimates: all asleep -> + wake_s; node off -> + boot_s
    for servers, extra in ((1, wake_s), (0, boot_s)):
        sim = make_sim()
        sim.set_capacity(0, 0, servers)
        sim.advance_to(10.0)
        est = sim.estimate([300], [0])
        assert est.queue_wait_s[0, 0] == pytest.approx(est.queue_wait_s[0, 1] + extra, rel=1e-9)


# ---------------------------------------------------------------------------------------- 3
def test_energy_by_state_through_a_schedule_is_analytic():
    """2 nodes x 8 engines: node 1 falls asleep and powers off, boots, half of it sleeps again,
    then wakes; every state's energy is its power x its time."""
    sim = make_sim(nodes=2, **DISTINCT)
    st, tp, idle_w, host_w = sim.power_states, sim.engine_config.tp, sim.power.idle_w, sim.power.host_w
    fall_s, wake_s, boot_s = durations(sim)
    dc = sim.datacenters[0]
    cap_of = lambda: dc.capacity  # noqa: E731
    sim.set_capacity(0, 8, 1)  # node 1 (engines 8-15) falls asleep, then powers off
    assert [e.cap_state for e in dc.engines] == [AWAKE] * 8 + [FALLING] * 8
    sim.advance_to(10.0)
    assert cap_of().node_state == [NODE_ON, NODE_OFF]
    assert dc.power_w() == pytest.approx(dc.pue * (8 * tp * idle_w + host_w + st.host_off_w), rel=1e-12)
    sim.set_capacity(0, 12, 2)  # node 1 boots; at the end 4 of its engines (15, 14, 13, 12) fall asleep
    assert cap_of().node_state == [NODE_ON, NODE_BOOTING] and dc.cap_counts[BOOTING] == 8
    t_up = 10.0 + boot_s
    sim.advance_to(t_up)
    assert [e.cap_state for e in dc.engines[8:]] == [AWAKE] * 4 + [FALLING] * 4
    sim.advance_to(400.0)
    assert [e.cap_state for e in dc.engines[8:]] == [AWAKE] * 4 + [ASLEEP] * 4
    assert cap_of().node_state == [NODE_ON, NODE_ON]
    sim.set_capacity(0, 16)  # the 4 wake
    assert dc.cap_counts[WAKING] == 4
    sim.advance_to(410.0)
    assert dc.cap_counts[AWAKE] == 16
    T = 410.0
    e = by_state(sim, 0)
    expect = {
        "gpu_active": 0.0,
        "gpu_idle": tp * idle_w * (8 * T + 4 * (T - t_up) + 4 * (T - 400.0 - wake_s)),
        "gpu_falling_asleep": tp * st.transition_w * fall_s * (8 + 4),
        "gpu_asleep": 4 * tp * st.sleep_w * (400.0 - t_up - fall_s),  # (node 1's first sleep: 0 s, off at once)
        "gpu_waking": 4 * tp * st.transition_w * wake_s,
        "gpu_booting": 8 * tp * st.boot_gpu_w * boot_s,
        "host_on": host_w * (T + fall_s + (T - t_up)),
        "host_standby": 0.0,
        "host_off": st.host_off_w * (10.0 - fall_s),
        "host_booting": st.boot_host_w * boot_s,
    }
    for k in STATES:
        assert e[k] == pytest.approx(expect[k], rel=1e-9, abs=1e-6), k
    t = sim.totals()
    assert sum(e.values()) == pytest.approx(t.gpu_energy_j[0] + t.host_energy_j[0], rel=1e-12)
    assert t.facility_energy_j[0] == pytest.approx(dc.pue * sum(expect.values()), rel=1e-9)
    cap = cap_of()
    assert (cap.sleeps, cap.boots, cap.wakes) == (12, 1, 4)
    check_states(sim)


# ---------------------------------------------------------------------------------------- 4
def _fill(sim: Simulator, n: int, t_s: float, output: int = 200) -> None:
    for i in range(n):
        sim.submit(0, t_s, 200 + 37 * i, output, 0)


def test_draining_engines_finish_their_work_and_take_no_new_requests():
    sim = make_sim()
    dc = sim.datacenters[0]
    _fill(sim, 80, 0.0)
    sim.advance_to(0.5)
    assert all(e.running for e in dc.engines)
    busy = {e.index: set(e.running) for e in dc.engines}
    moved = {r.rid for e in dc.engines[4:] for r in e.waiting}
    assert moved
    sim.set_capacity(0, 4)  # engines 7, 6, 5, 4 drain
    draining = [e.index for e in dc.engines if e.cap_state == DRAINING]
    assert draining == [4, 5, 6, 7]
    assert all(not dc.engines[i].waiting for i in draining)  # their queues moved to engines 0-3
    assert sim.snapshot().sleeping_engines.tolist()[0] == 4
    # new requests while they drain: none goes to a draining engine
    for k in range(20):
        t = 0.5 + 0.05 * k
        sim.advance_to(t)
        sim.submit(0, t, 100, 10, 0)
    assert all(e.cap_state == DRAINING for e in dc.engines[4:])  # (still draining: busy all along)
    sim.run_until_idle()
    r = sim.pop_completed()
    t = sim.totals()
    assert t.completed == t.submitted == 100 and t.aborted == 0 and len(r) == 100
    engine_of = dict(zip(r.request_id.tolist(), r.engine.tolist()))
    for i in draining:  # what ran on a draining engine finished there
        assert all(engine_of[rid] == i for rid in busy[i])
    assert all(engine_of[rid] < 4 for rid in list(moved) + list(range(80, 100)))
    assert [e.cap_state for e in dc.engines] == [AWAKE] * 4 + [ASLEEP] * 4
    check_ledger(sim)
    check_states(sim)


def test_with_no_engine_left_awake_draining_engines_keep_their_queues():
    sim = make_sim()
    dc = sim.datacenters[0]
    _fill(sim, 60, 0.0, output=100)
    sim.advance_to(0.3)
    queued = {e.index: [r.rid for r in e.waiting] for e in dc.engines}
    assert sum(map(len, queued.values())) > 0
    sim.set_capacity(0, 0, 1)
    assert dc.cap_counts[DRAINING] == 8
    assert {e.index: [r.rid for r in e.waiting] for e in dc.engines} == queued  # nothing moved, nothing lost
    sim.run_until_idle()
    r = sim.pop_completed()
    t = sim.totals()
    assert t.completed == 60 and t.aborted == 0
    engine_of = dict(zip(r.request_id.tolist(), r.engine.tolist()))
    assert all(engine_of[rid] == i for i, rids in queued.items() for rid in rids)
    assert dc.cap_counts[ASLEEP] == 8 and dc.capacity.node_state == [NODE_STANDBY]
    assert dc.power_w() == pytest.approx(settled_power_w(sim, 0), rel=1e-12)
    check_ledger(sim)


# ---------------------------------------------------------------------------------------- 5
@cache
def _alone_ttft(prompt: int, d: int) -> float:
    """TTFT of one request alone on an awake datacenter (a lower bound for any other run)."""
    sim = make_sim()
    sim.submit(0, 0.0, prompt, 4, d)
    sim.run_until_idle()
    return float(sim.pop_completed().ttft_s[0])


PROMPTS = (16, 200, 1000, 3000)
_op = hs.one_of(
    hs.tuples(hs.just("req"), hs.integers(0, 1), hs.sampled_from(PROMPTS), hs.integers(1, 300)),
    hs.tuples(hs.just("cap"), hs.integers(0, 1), hs.integers(0, 16), hs.sampled_from([None, 0, 1, 2])),
)
_schedule = hs.lists(hs.tuples(hs.floats(0.0, 3.0), _op), min_size=1, max_size=40)


def check_attribution(sim: Simulator, records, aborted_e: np.ndarray, aborted_c: np.ndarray) -> None:
    """Active energy / carbon (dormant states excluded) = the requests' shares (all finished)."""
    a = sim.energy_attribution()
    done_e = np.bincount(records.datacenter, weights=records.energy_j, minlength=2)
    done_c = np.bincount(records.datacenter, weights=records.carbon_g, minlength=2)
    np.testing.assert_allclose(a.active_energy_j, done_e + aborted_e + a.aborted_partial_j, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(a.active_carbon_g, done_c + aborted_c + a.aborted_partial_carbon_g, rtol=1e-9,
                               atol=1e-9)


def _play(sim: Simulator, schedule, outages: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Apply ``schedule`` ((dt, op) pairs; targets clipped to the datacenter's size); the energy
    and carbon shares of the requests aborted by outages, per datacenter."""
    ab_e, ab_c = np.zeros(2), np.zeros(2)
    t = 0.0
    for dt, op in schedule:
        t += dt
        sim.advance_to(t)
        check_states(sim)
        dc = sim.datacenters[op[1]]
        if op[0] == "req":
            if dc.up:
                sim.submit(0, t, op[2], op[3], op[1])
        elif op[0] == "cap":
            s = op[3] if op[3] is None else min(op[3], dc.spec.nodes)
            sim.set_capacity(op[1], min(op[2], dc.n_engines), s)  # (servers below what the engines need: raised)
        elif op[0] == "drain":  # maintenance drain of the last engines (faults)
            sim.set_engines_draining(op[1], min(op[2], dc.n_engines), op[3])
        else:
            ab = sim.set_datacenter_up(op[1], op[2])
            ab_e[op[1]] += ab.energy_j.sum()
            ab_c[op[1]] += ab.carbon_g.sum()
    if outages:
        for d in range(2):
            sim.set_datacenter_up(d, True)
    return ab_e, ab_c


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.sampled_from([1, 2]), _schedule)
def test_random_capacity_schedules_lose_nothing(nodes, schedule):
    sim = make_sim(nodes=nodes, **DISTINCT)
    _play(sim, schedule)
    sim.run_until_idle()
    t = sim.totals()
    assert t.completed == t.submitted and t.aborted == 0 and t.in_flight == 0
    r = sim.pop_completed()
    assert len(r) == t.submitted
    check_attribution(sim, r, np.zeros(2), np.zeros(2))
    for p, d, ttft in zip(r.prompt_tokens.tolist(), r.datacenter.tolist(), r.ttft_s.tolist()):
        assert ttft >= _alone_ttft(p, d) - 1e-9
    check_ledger(sim)
    check_states(sim)
    for d in range(2):  # settled: no transition left, the power is the states' power
        assert sim.datacenters[d].cap_counts[DRAINING] == sim.datacenters[d].cap_counts[FALLING] == 0
        assert sim.datacenters[d].power_w() == pytest.approx(settled_power_w(sim, d), rel=1e-12)


_op_outage = hs.one_of(_op, hs.tuples(hs.just("up"), hs.integers(0, 1), hs.booleans()),
                       hs.tuples(hs.just("drain"), hs.integers(0, 1), hs.integers(0, 16), hs.booleans()))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.sampled_from([1, 2]), hs.lists(hs.tuples(hs.floats(0.0, 3.0), _op_outage), min_size=1, max_size=40))
def test_random_schedules_with_outages_and_drains_keep_the_ledger(nodes, schedule):
    sim = make_sim(nodes=nodes, **DISTINCT)
    ab_e, ab_c = _play(sim, schedule, outages=True)
    sim.run_until_idle()
    t = sim.totals()
    assert t.completed + t.aborted == t.submitted and t.in_flight == 0
    check_attribution(sim, sim.pop_completed(), ab_e, ab_c)
    check_ledger(sim)
    check_states(sim)
    for d in range(2):
        assert sim.datacenters[d].power_w() == pytest.approx(settled_power_w(sim, d), rel=1e-12)


# ---------------------------------------------------------------------------------------- 8
def test_outage_during_transitions():
    sim = make_sim(**DISTINCT)
    st = sim.power_states
    fall_s, wake_s, boot_s = durations(sim)
    dc = sim.datacenters[0]
    sim.set_capacity(0, 0, 0)
    sim.advance_to(5.0)
    sim.submit(0, 5.0, 300, 20, 0)  # boots the node
    sim.advance_to(50.0)
    assert dc.capacity.node_state == [NODE_BOOTING]
    boot_start = dc.engines[0].cap_end_s - boot_s  # (when the request reached it)
    assert 5.0 < boot_start < 5.01
    ab = sim.set_datacenter_up(0, False)
    assert ab.request_id.tolist() == [0]
    assert dc.power_w() == 0.0
    sim.advance_to(60.0)
    sim.set_capacity(0, 0, 0)  # while down: kept for when it is back
    sim.set_datacenter_up(0, True)  # back: every engine awake, then the targets: asleep, off
    assert dc.cap_counts[FALLING] == 8
    sim.advance_to(60.0 + fall_s / 2)
    sim.submit(0, sim.now_s, 300, 20, 0)  # waits for the fall, then a wake
    sim.advance_to(60.0 + fall_s + 0.5 * wake_s)
    ab = sim.set_datacenter_up(0, False)  # down mid-wake
    assert ab.request_id.tolist() == [1]
    sim.set_datacenter_up(0, True)
    sim.submit(0, sim.now_s, 300, 20, 0)
    sim.run_until_idle()
    t = sim.totals()
    assert t.submitted == 3 and t.aborted == 2 and t.completed == 1
    check_ledger(sim)
    check_states(sim)
    e = by_state(sim, 0)
    assert e["host_booting"] == pytest.approx(st.boot_host_w * (50.0 - boot_start), rel=1e-12)  # then down
    assert e["gpu_booting"] == pytest.approx(8 * st.boot_gpu_w * (50.0 - boot_start), rel=1e-12)
    assert e["host_off"] == pytest.approx(st.host_off_w * (boot_start - fall_s), rel=1e-12)
    assert sim.datacenters[0].power_w() == pytest.approx(settled_power_w(sim, 0), rel=1e-12)


# ---------------------------------------------------------------------------------------- 7
def _schedule_a(sim: Simulator, t0: float, t1: float) -> None:
    """Arrivals every 0.25 s and capacity changes over [t0, t1)."""
    k = 0
    t = t0
    while t < t1:
        sim.advance_to(t)
        sim.submit(0, t, 100 + 53 * (k % 17), 5 + 11 * (k % 13), k % 2)
        if k % 9 == 0:
            sim.set_capacity(k % 2, (3 * k) % 9, None)
        k += 1
        t = t0 + 0.25 * k


def _results(sim: Simulator) -> tuple:
    sim.run_until_idle()
    r = sim.pop_completed()
    t = sim.totals()
    return (r.request_id.tolist(), r.ttft_s.tolist(), r.e2e_s.tolist(), r.energy_j.tolist(), r.engine.tolist(),
            t.gpu_energy_j.tolist(), t.host_energy_j.tolist(), t.carbon_g.tolist(),
            {k: v.tolist() for k, v in t.energy_by_state().items()})


def test_copies_mid_transition_evolve_identically():
    sim = make_sim(**DISTINCT)
    _schedule_a(sim, 0.0, 6.0)
    sim.set_capacity(0, 0, 0)
    sim.set_capacity(1, 2, None)
    sim.advance_to(6.3)  # dc 0 falling asleep or draining, dc 1 draining
    assert sim.datacenters[0].cap_counts[AWAKE] < 8
    twin = copy.deepcopy(sim)
    assert twin.datacenters[0].capacity.dc is twin.datacenters[0]
    assert twin.datacenters[0].capacity is not sim.datacenters[0].capacity
    for s in (sim, twin):
        _schedule_a(s, 7.0, 12.0)
    later = copy.deepcopy(twin)  # (a copy of a copy, with other transitions in progress)
    a, b, c = _results(sim), _results(twin), _results(later)
    assert a == b == c
    # fresh(): a new episode with no capacity state; the same schedule gives the same results
    f = sim.fresh()
    assert all(dc.capacity is None for dc in f.datacenters)
    g = make_sim(**DISTINCT)
    for s in (f, g):
        _schedule_a(s, 0.0, 12.0)
    assert _results(f) == _results(g)


# ---------------------------------------------------------------------------------------- 6
_CAPACITY_RUN = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, "tests")
    import carbon_gym.sim as s
    from test_capacity_sim import DISTINCT, make_sim, _schedule_a, _results
    out = {"implementation": s.IMPLEMENTATION["engine"]}
    for states in ({}, DISTINCT):
        sim = make_sim(**states)
        _schedule_a(sim, 0.0, 8.0)
        sim.set_capacity(0, 0, 0)
        _schedule_a(sim, 9.0, 14.0)
        sim.set_datacenter_up(1, False)
        sim.set_datacenter_up(1, True)
        out[str(bool(states))] = _results(sim)
    print(json.dumps(out))
""")


@pytest.mark.skipif(sim_pkg.IMPLEMENTATION["engine"] != "compiled",
                    reason=f"no compiled simulator here ({sim_pkg.IMPLEMENTATION['reason']})")
def test_compiled_and_pure_python_give_identical_capacity_results():
    outs = []
    for pure in (False, True):
        env = dict(os.environ)
        env.pop(_native.PURE_ENV_VAR, None)
        if pure:
            env[_native.PURE_ENV_VAR] = "1"
        res = subprocess.run([sys.executable, "-c", _CAPACITY_RUN], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        outs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    fast, slow = outs
    assert fast.pop("implementation") == "compiled" and slow.pop("implementation") == "python"
    assert len(fast["True"][0]) > 30
    assert fast == slow  # every float, bit for bit


# ---------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("args,field", [
    ((2, 1), "dc"), ((-1, 1), "dc"), ((0, 9), "awake_engines"), ((0, -1), "awake_engines"),
    ((0, 1.5), "awake_engines"), ((0, "x"), "awake_engines"), ((0, 4, 2), "servers_on"),
    ((0, 4, -1), "servers_on"), ((0, 4, float("nan")), "servers_on"),
])
def test_set_capacity_errors_name_the_field(args, field):
    sim = make_sim()
    with pytest.raises(ConfigError) as err:
        sim.set_capacity(*args)
    assert err.value.field == field
    assert sim.datacenters[0].capacity is None or sim.datacenters[0].cap_counts[AWAKE] == 8


def test_set_capacity_needs_power_states():
    sim = make_sim()
    args, kwargs = sim._ctor
    bare = Simulator(*args, **dict(kwargs, power_states=None))
    with pytest.raises(ConfigError) as err:
        bare.set_capacity(0, 4)
    assert err.value.field == "capacity"
