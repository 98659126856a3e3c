"""The closed-form fast path gives the same results as one-iteration stepping, and the simulator
is deterministic and loses no request (property-based tests over random workloads)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carbon_gym.sim import RECORD_COLUMNS, EngineConfig
from test_sim_fixtures import drive, make_sim, random_workload, starved_gpu

INT_COLS = [n for n, dt in RECORD_COLUMNS if dt is np.int64]
FLOAT_COLS = [n for n, dt in RECORD_COLUMNS if dt is np.float64]


def run_both(cfg: dict, wl: dict, until_s: float | None = None):
    out = []
    for step in (False, True):
        sim = make_sim(**cfg, step_mode=step)
        drive(sim, wl, until_s=until_s)
        out.append((sim.pop_completed().sorted_by_id(), sim.totals(), sim))
    return out


def assert_same(a, b, rel: float = 1e-9):
    (ra, ta, _), (rb, tb, _) = a, b
    assert len(ra) == len(rb)
    for c in INT_COLS:
        np.testing.assert_array_equal(getattr(ra, c), getattr(rb, c), err_msg=c)
    for c in FLOAT_COLS:
        np.testing.assert_allclose(getattr(ra, c), getattr(rb, c), rtol=rel, atol=1e-12, err_msg=c)
    for f in ("submitted", "completed", "in_flight", "preemptions", "aborted", "iterations"):
        assert getattr(ta, f) == getattr(tb, f), f
    for f in ("it_energy_j", "facility_energy_j", "carbon_g", "idle_energy_j", "host_energy_j", "gpu_energy_j"):
        np.testing.assert_allclose(getattr(ta, f), getattr(tb, f), rtol=rel, err_msg=f)


CONFIGS = {
    "default": dict(n_dc=2, gpus_per_node=2),
    "starved": dict(n_dc=1, gpus_per_node=2, gpu=starved_gpu(40),
                    engine=EngineConfig(max_model_len=600, max_num_seqs=12, max_num_batched_tokens=200)),
    "starved_unchunked": dict(n_dc=1, gpus_per_node=1, gpu=starved_gpu(40),
                              engine=EngineConfig(max_model_len=600, max_num_seqs=12, max_num_batched_tokens=200,
                                                  chunked_prefill=False)),
    "unchunked": dict(n_dc=2, gpus_per_node=2, engine=EngineConfig(chunked_prefill=False)),
    "most_free_kv": dict(n_dc=1, gpus_per_node=4, gpu=starved_gpu(60), dispatcher="most_free_kv",
                         engine=EngineConfig(max_model_len=900, block_tokens=8, max_num_seqs=32,
                                             max_num_batched_tokens=512)),
    "tp2": dict(n_dc=2, gpus_per_node=4, engine=EngineConfig(tp=2, max_num_seqs=8, max_num_batched_tokens=300)),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fast_path_equals_stepping_on_random_workloads(name):
    cfg = CONFIGS[name]
    rng = np.random.default_rng(abs(hash(name)) % 1000)
    mml = cfg.get("engine", EngineConfig()).max_model_len
    wl = random_workload(rng, 250, cfg["n_dc"], rate_per_s=25.0, max_prompt=min(2500, mml // 2),
                         max_output=min(400, mml // 2), place_delay_s=0.0)
    a, b = run_both(cfg, wl)
    assert a[1].completed == 250
    assert a[2].events_processed < b[2].events_processed  # the fast path really jumps
    assert_same(a, b)
    if name.startswith("starved"):
        assert a[1].preemptions > 0


def test_fast_path_equals_stepping_mid_run_and_with_placement_wait():
    """Compare at an intermediate time too (runs in progress) and with clients waiting for
    placement (arrival_s < send time)."""
    cfg = CONFIGS["default"]
    rng = np.random.default_rng(11)
    wl = random_workload(rng, 150, 2, rate_per_s=30.0, max_prompt=3000, max_output=500, place_delay_s=0.3)
    t_mid = float(wl["send_s"][-1]) + 0.5
    a, b = run_both(cfg, wl, until_s=t_mid)
    assert 0 < a[1].completed < 150
    assert_same(a, b)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 30))
    seed = draw(st.integers(0, 2**31 - 1))
    rate = draw(st.sampled_from([2.0, 20.0, 200.0]))
    rng = np.random.default_rng(seed)
    name = draw(st.sampled_from(sorted(CONFIGS)))
    cfg = CONFIGS[name]
    mml = cfg.get("engine", EngineConfig()).max_model_len
    wl = random_workload(rng, n, cfg["n_dc"], rate_per_s=rate, max_prompt=min(3000, mml // 2),
                         max_output=min(300, mml // 2), place_delay_s=draw(st.sampled_from([0.0, 0.05])))
    return name, wl


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_property_every_request_completes_once_and_paths_agree(case):
    name, wl = case
    a, b = run_both(CONFIGS[name], wl)
    n = len(wl["arrival_s"])
    for recs, tot, sim in (a, b):
        assert tot.submitted == tot.completed == n and tot.in_flight == 0
        assert sorted(recs.request_id.tolist()) == list(range(n))  # none lost, none duplicated
        assert len(sim.pop_completed()) == 0
        # causality of every record
        assert np.all(recs.sent_s >= recs.arrival_s)
        assert np.all(recs.dc_arrival_s > recs.sent_s)
        assert np.all(recs.first_scheduled_s >= recs.dc_arrival_s)
        assert np.all(recs.first_token_s > recs.first_scheduled_s)
        assert np.all(recs.done_s >= recs.first_token_s)
        assert np.all(recs.queue_wait_s >= 0) and np.all(recs.prefill_s > 0)
        assert np.all(recs.energy_j > 0) and np.all(recs.carbon_g > 0)
        np.testing.assert_array_equal(recs.prompt_tokens, wl["prompt"][recs.request_id])
        np.testing.assert_array_equal(recs.output_tokens, wl["output"][recs.request_id])
        for e in (e for dc in sim.datacenters for e in dc.engines):
            assert e.free_blocks == e.total_blocks and not e.running and not e.waiting
    assert_same(a, b)


def test_deterministic_bit_for_bit():
    cfg = CONFIGS["starved"]
    rng = np.random.default_rng(5)
    wl = random_workload(rng, 120, 1, rate_per_s=30.0, max_prompt=300, max_output=300)
    runs = []
    for _ in range(2):
        sim = make_sim(**cfg)
        drive(sim, wl)
        runs.append((sim.pop_completed(), sim.totals()))
    for c in INT_COLS + FLOAT_COLS:
        assert np.array_equal(getattr(runs[0][0], c), getattr(runs[1][0], c)), c
    assert np.array_equal(runs[0][1].carbon_g, runs[1][1].carbon_g)
