"""Engine behaviour with real numbers: lone requests against the latency model, chunking,
KV capacity, preemption by recompute."""

from __future__ import annotations

import math

import numpy as np
import pytest

from carbon_gym.sim import EngineConfig
from carbon_gym.sim.engine import ITER
from carbon_gym.sim.request import RequestState
from test_sim_fixtures import LAT, POW, drive, make_sim, random_workload, starved_gpu


def lone_expected(prompt: int, output: int, budget: int = 2048, chunked: bool = True):
    """Engine-side (prefill_end, [decode iteration times], [(tokens, n_dec, T)]) computed from the
    latency model directly, one iteration at a time."""
    iters = []
    done, t = 0, 0.0
    while done < prompt:
        c = min(prompt - done, budget) if chunked else prompt
        last = done + c == prompt
        T = LAT.iteration_time_s(c, c * (done + (c + 1) / 2), 0, 0.0, 1 if last else 0)
        iters.append((c, 0, T))
        t += T
        done += c
    decodes = []
    for j in range(1, output):
        T = LAT.iteration_time_s(0, 0.0, 1, float(prompt + j), 1)
        decodes.append(T)
        iters.append((0, 1, T))
    return t, decodes, iters


@pytest.mark.parametrize("prompt,output", [(1, 1), (300, 1), (700, 120), (2048, 17), (5000, 40), (33, 600)])
@pytest.mark.parametrize("step_mode", [False, True])
def test_lone_request_matches_latency_model_plus_network(prompt, output, step_mode):
    sim = make_sim(step_mode=step_mode)
    sim.advance_to(0.25)
    rid = sim.submit(1, 0.1, prompt, output, 0)
    sim.advance_to(1e4)
    r = sim.pop_completed()
    assert len(r) == 1 and r.request_id[0] == rid
    net = sim.network
    up = net.uplink_s(1, 0, prompt)
    down = net.downlink_s(1, 0)
    prefill, decodes, iters = lone_expected(prompt, output)
    ttft = 0.25 - 0.1 + up + prefill + down
    e2e = ttft + sum(decodes)
    assert r.ttft_s[0] == pytest.approx(ttft, rel=1e-12)
    assert r.e2e_s[0] == pytest.approx(e2e, rel=1e-12)
    exp_tpot = sum(decodes) / (output - 1) if output > 1 else 0.0
    assert r.tpot_s[0] == pytest.approx(exp_tpot, rel=1e-9, abs=1e-15)
    assert r.queue_wait_s[0] == pytest.approx(0.0, abs=1e-12)
    assert r.prefill_s[0] == pytest.approx(prefill, rel=1e-12)
    assert r.network_s[0] == pytest.approx(up + down, rel=1e-12)
    assert r.first_scheduled_s[0] == pytest.approx(0.25 + up, rel=1e-12)
    assert r.preemptions[0] == 0
    # energy share: the lone request gets all active GPU energy of its engine, x PUE
    pue = sim.topology.datacenters[0].pue
    e_exp = sum(POW.gpu_power_w(c, nd) * T for c, nd, T in iters) * pue
    assert r.energy_j[0] == pytest.approx(e_exp, rel=1e-9)
    tot = sim.totals()
    assert tot.iterations == len(iters)
    active = tot.gpu_energy_j - tot.idle_energy_j
    assert active.sum() * pue == pytest.approx(e_exp, rel=1e-9)


def test_unchunked_long_prompt_runs_alone_in_one_iteration():
    eng = EngineConfig(chunked_prefill=False)
    sim = make_sim(engine=eng)
    sim.submit(0, 0.0, 5000, 3, 0)
    sim.advance_to(100.0)
    r = sim.pop_completed()
    T = LAT.iteration_time_s(5000, 5000 * 5001 / 2, 0, 0.0, 1)
    assert r.prefill_s[0] == pytest.approx(T, rel=1e-12)


def test_two_requests_share_iterations_and_energy_by_tokens():
    """Two simultaneous requests on one engine: one mixed prefill iteration, shares by tokens."""
    sim = make_sim(n_dc=1, gpus_per_node=1)
    sim.submit(0, 0.0, 100, 3, 0)
    sim.submit(0, 0.0, 300, 3, 0)  # arrives 0.64 us later: waits for the first iteration
    sim.advance_to(10.0)
    r = sim.pop_completed().sorted_by_id()
    up0 = sim.network.uplink_s(0, 0, 100)
    T1 = LAT.iteration_time_s(100, 100 * 50.5, 0, 0.0, 1)
    # iteration 2: decode of req 0 (ctx 101) + prefill of req 1
    T2 = LAT.iteration_time_s(300, 300 * 150.5, 1, 101.0, 2)
    assert r.first_token_s[0] - sim.network.downlink_s(0, 0) == pytest.approx(up0 + T1, rel=1e-12)
    assert r.first_scheduled_s[1] == pytest.approx(up0 + T1, rel=1e-12)
    assert r.first_token_s[1] - sim.network.downlink_s(0, 0) == pytest.approx(up0 + T1 + T2, rel=1e-12)
    # iteration 3: both decode (ctx 102 and 301); request 0 finishes its 3rd token
    T3 = LAT.iteration_time_s(0, 0.0, 2, 102.0 + 301.0, 2)
    assert r.done_s[0] - sim.network.downlink_s(0, 0) == pytest.approx(up0 + T1 + T2 + T3, rel=1e-12)
    pue = sim.topology.datacenters[0].pue
    e1 = POW.gpu_power_w(100, 0) * T1 * pue
    e2 = POW.gpu_power_w(300, 1) * T2 * pue
    e3 = POW.gpu_power_w(0, 2) * T3 * pue
    assert r.energy_j[0] == pytest.approx(e1 + e2 / 301 + e3 / 2, rel=1e-9)
    T4 = LAT.iteration_time_s(0, 0.0, 1, 302.0, 1)
    e4 = POW.gpu_power_w(0, 1) * T4 * pue
    assert r.energy_j[1] == pytest.approx(e2 * 300 / 301 + e3 / 2 + e4, rel=1e-9)


def test_least_work_dispatch_spreads_over_engines():
    sim = make_sim(n_dc=1, nodes=1, gpus_per_node=4)
    for _ in range(4):
        sim.submit(0, 0.0, 500, 50, 0)
    sim.advance_to(100.0)
    r = sim.pop_completed()
    assert sorted(r.engine.tolist()) == [0, 1, 2, 3]


def _check_kv(sim):
    for dc in sim.datacenters:
        for e in dc.engines:
            assert 0 <= e.free_blocks <= e.total_blocks
            held = 0
            # an iteration in progress has already allocated the slot of its decode token
            ahead = 1 if (e.state == ITER and e.iter_decodes) else 0
            for r in e.running.values():
                if r.decoding:
                    ctx = r.ctx_tokens if e.step_mode else r.ctx_offset + e.decode_iters
                    held += math.ceil((ctx + ahead) / e.block_tokens)
                else:
                    held += r.kv_blocks
            assert held == e.total_blocks - e.free_blocks
            assert len(e.running) <= e.max_seqs


@pytest.mark.parametrize("step_mode", [True, False])
@pytest.mark.parametrize("chunked", [True, False])
def test_kv_blocks_never_exceed_capacity_and_preemption_recovers(step_mode, chunked):
    eng = EngineConfig(max_model_len=640, max_num_seqs=16, max_num_batched_tokens=256, chunked_prefill=chunked)
    sim = make_sim(n_dc=1, gpus_per_node=1, gpu=starved_gpu(48), engine=eng, step_mode=step_mode)
    assert sim.kv_blocks_per_engine == 48
    rng = np.random.default_rng(3)
    wl = random_workload(rng, 60, 1, rate_per_s=40.0, max_prompt=300, max_output=300)
    drive(sim, wl, check=_check_kv)
    tot = sim.totals()
    r = sim.pop_completed()
    assert tot.completed == tot.submitted == 60 and tot.in_flight == 0
    assert tot.preemptions > 0 and r.preemptions.sum() == tot.preemptions
    assert sorted(r.request_id.tolist()) == list(range(60))
    e = sim.datacenters[0].engines[0]
    assert e.free_blocks == e.total_blocks and not e.running and not e.waiting


def test_preempted_request_recomputes_prompt_plus_generated():
    """Two requests that cannot both fit: the newer one is preempted, then recomputed."""
    eng = EngineConfig(max_model_len=320, max_num_seqs=4, max_num_batched_tokens=512)
    sim = make_sim(n_dc=1, gpus_per_node=1, gpu=starved_gpu(20), engine=eng, step_mode=True)
    sim.submit(0, 0.0, 160, 150, 0)  # 10 blocks, grows to 20
    sim.advance_to(0.001)
    sim.submit(0, 0.0, 96, 150, 0)   # 6 blocks: admitted in the next iteration, later preempted
    sim.advance_to(1e3)
    r = sim.pop_completed().sorted_by_id()
    assert r.preemptions.tolist() == [0, 1]
    assert (r.output_tokens == 150).all()
    # the victim's first token came before its preemption; it finished after the survivor
    assert r.done_s[1] > r.done_s[0]
    assert r.first_token_s[1] < r.done_s[0]


@pytest.mark.parametrize("chunked", [True, False])
def test_admission_rule_sequences_blocks_and_budget(chunked):
    """Engine._head_admission, the one rule every planning path admits by: the head's blocks when
    a sequence slot is free, all its prompt blocks fit and its first chunk fits the budget."""
    eng = EngineConfig(max_model_len=1024, max_num_seqs=2, max_num_batched_tokens=256, chunked_prefill=chunked)
    e = make_sim(n_dc=1, gpus_per_node=1, engine=eng).datacenters[0].engines[0]
    assert e._head_admission(1000, 256) == 0  # empty queue
    e._queue(RequestState(0, 0, 0, 0.0, 0.0, 0.01, 0.01, 300, 5))  # 300 tokens: ceil(300 / 16) = 19 blocks
    assert e.pending_tokens == 300 and e.waiting_blocks == 19
    assert e._head_admission(19, 256) == 19  # nothing scheduled yet: a prompt longer than the budget goes
    assert e._head_admission(18, 256) == 0  # its blocks do not fit
    # part of the budget left: a chunk of it with chunked prefill, never part of a whole prompt
    assert e._head_admission(19, 1) == (19 if chunked else 0)
    assert e._head_admission(19, 255) == (19 if chunked else 0)
    assert e._head_admission(19, 0) == 0
    e._queue(RequestState(1, 0, 0, 0.0, 0.0, 0.01, 0.01, 40, 5))
    e.waiting.popleft()  # the 40-token prompt is the head: 3 blocks
    assert e._head_admission(3, 40) == 3 and e._head_admission(3, 39) == (3 if chunked else 0)
    other = RequestState(2, 0, 0, 0.0, 0.0, 0.01, 0.01, 8, 5)
    e.running = {2: other}
    assert e._head_admission(3, 40) == 3
    e.running = {2: other, 3: other}  # max_num_seqs sequences running
    assert e._head_admission(1000, 256) == 0
