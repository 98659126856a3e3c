"""The performance shortcuts give exactly the results of the straightforward code they replace:
pure-Python copies of the latency / power / carbon models, Simulator.fresh(), the snapshot
variants, the cheap totals and Workload.with_seed."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest

import carbon_gym  # noqa: F401  (registers the envs)
from carbon_gym.physics.carbon import CarbonTrace
from carbon_gym.physics.latency import TableLatencyModel, latency_params_path
from carbon_gym.physics.power import load_power_model
from carbon_gym.scenario import load_scenario
from carbon_gym.sim import RECORD_COLUMNS, SNAPSHOT_ARRAY_ROWS
from carbon_gym.sim.datacenter import ZoneClock
from carbon_gym.sim.engine import RUN
from carbon_gym.sim.request import EngineModels
from carbon_gym.sim.records import RequestRecords
from carbon_gym.world import build_workload, build_world, reseed_workload
from test_sim_fixtures import drive, make_sim, random_workload


def test_table_latency_copy_returns_the_models_floats():
    rng = np.random.default_rng(0)
    for spec in (("a100-80gb", "llama-3.1-8b", 1), ("a100-80gb", "mixtral-8x7b", 4)):
        model = TableLatencyModel.from_file(latency_params_path(*spec))
        fast = EngineModels(model, load_power_model("a100-80gb"), spec[2]).iteration_time_s
        m = EngineModels(model, load_power_model("a100-80gb"), spec[2])
        assert m.table and m.ptable  # (the compiled evaluation, prefill tables included)
        for _ in range(5000):
            pt = int(rng.choice([0, 1, rng.integers(0, 5000), rng.integers(0, 40000)]))
            nd = int(rng.choice([0, 1, rng.integers(0, 300)]))
            pairs = float(rng.uniform(0, 1e8))
            ctx = float(rng.uniform(0, 1e6))
            ns = int(rng.integers(0, 300))
            assert fast(pt, pairs, nd, ctx, ns) == float(model.iteration_time_s(pt, pairs, nd, ctx, ns))


def test_phase_power_copy_returns_the_models_floats():
    rng = np.random.default_rng(1)
    power = load_power_model("a100-80gb")
    for tp in (1, 4):
        fast = EngineModels(TableLatencyModel.from_file(latency_params_path("a100-80gb", "llama-3.1-8b", 1)),
                            power, tp).prefill_engine_w
        for _ in range(3000):
            pt, nd = int(rng.integers(1, 9000)), int(rng.integers(0, 300))
            assert fast(pt, nd) == tp * float(power.gpu_power_w(pt, nd))


@pytest.mark.parametrize("interp", ["step", "linear"])
def test_zone_clock_matches_the_trace(interp):
    rng = np.random.default_rng(2)
    trace = CarbonTrace(("a", "b"), datetime(2023, 1, 1), rng.uniform(0, 900, (30, 2)), interp)
    clock = ZoneClock(trace, 1, 1234.5)
    assert clock.fast
    # increasing times (the hour memo is used) and hour boundaries, over several periods
    times = np.concatenate([np.cumsum(rng.exponential(20.0, 3000)),
                            [k * 3600.0 - 1234.5 + d for k in range(1, 30) for d in (-1e-3, 0.0, 1e-3)]])
    for t in times.tolist():
        ref = trace.integral(1, 0.0, 1234.5 + t)
        assert clock(t) == pytest.approx(ref, rel=1e-12, abs=1e-9)
        assert clock.intensity(1234.5 + t) == float(trace.intensity(1, 1234.5 + t))
    # the memo gives the value the full evaluation gives
    clock2 = ZoneClock(trace, 1, 1234.5)
    for t in times.tolist():
        clock2.seg_lo = clock2.seg_hi = 0.0  # forget the memo
        assert clock(t) == clock2(t)


def _run(sim, wl):
    drive(sim, wl)
    return sim.pop_completed().sorted_by_id(), sim.totals()


def test_fresh_simulator_gives_the_same_results_as_a_new_one():
    rng = np.random.default_rng(3)
    wl = random_workload(rng, 120, 2, rate_per_s=20.0, max_prompt=2000, max_output=300)
    first = make_sim(n_dc=2, gpus_per_node=2)
    a, ta = _run(first, wl)
    b, tb = _run(first.fresh(), wl)  # fresh() of a used simulator starts from time 0
    c, tc = _run(make_sim(n_dc=2, gpus_per_node=2), wl)
    for name, _ in RECORD_COLUMNS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        np.testing.assert_array_equal(getattr(a, name), getattr(c, name), err_msg=name)
    for t in (tb, tc):
        np.testing.assert_array_equal(ta.carbon_g, t.carbon_g)
        np.testing.assert_array_equal(ta.facility_energy_j, t.facility_energy_j)
        assert (ta.completed, ta.iterations) == (t.completed, t.iterations)


@pytest.mark.parametrize("n_dc", [2, 5, 9])  # (carbon_energy_totals sums in Python below 8 datacenters)
def test_snapshot_variants_and_cheap_totals_agree(n_dc):
    rng = np.random.default_rng(4)
    wl = random_workload(rng, 200, n_dc, rate_per_s=40.0, max_prompt=2000, max_output=400)
    sim = make_sim(n_dc=n_dc, gpus_per_node=2)
    checked = 0

    def check(s):
        nonlocal checked
        snap = s.snapshot()
        arr = s.snapshot_array()
        rows = s.snapshot_rows()
        assert arr.shape == (len(SNAPSHOT_ARRAY_ROWS), s.n_datacenters)
        for i, name in enumerate(SNAPSHOT_ARRAY_ROWS):
            field = np.asarray(getattr(snap, name), dtype=np.float64)
            np.testing.assert_array_equal(arr[i], field, err_msg=name)
            np.testing.assert_array_equal(np.array([r[i] for r in rows], dtype=np.float64), field, err_msg=name)
        tot = s.totals()
        assert s.carbon_energy_totals() == (float(np.sum(tot.carbon_g)), float(np.sum(tot.facility_energy_j)))
        checked += 1

    drive(sim, wl, check=check)
    assert checked > 10


def test_run_iterations_done_is_the_largest_finished_iteration():
    rng = np.random.default_rng(5)
    wl = random_workload(rng, 300, 2, rate_per_s=60.0, max_prompt=1500, max_output=600)
    sim = make_sim(n_dc=2, gpus_per_node=2)
    seen = 0

    def check(s):
        nonlocal seen
        for dc in s.datacenters:
            for e in dc.engines:
                if e.state != RUN:
                    continue
                ts = [e.start_s, e.end_s, np.nextafter(e.end_s, 0.0), e.start_s + e.run_first_s]
                ts += list(rng.uniform(e.start_s, e.end_s, 10))
                ts += [e._run_end(k) for k in range(0, e.run_iters + 1, max(1, e.run_iters // 10))]
                for t in ts:
                    t = float(t)
                    lo, hi = 0, e.run_iters  # reference: binary search for the largest k with run_end(k) <= t
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        if e._run_end(mid) <= t:
                            lo = mid
                        else:
                            hi = mid - 1
                    assert e.run_iterations_done(t) == lo
                    seen += 1

    drive(sim, wl, check=check)
    assert seen > 100


def test_records_from_rows_has_the_column_dtypes_and_values():
    rows = [tuple(float(i * 100 + j) + (0.25 if dt is np.float64 else 0.0) for j, (_, dt) in enumerate(RECORD_COLUMNS))
            for i in range(5)]
    rec = RequestRecords.from_rows(rows)
    for j, (name, dt) in enumerate(RECORD_COLUMNS):
        col = getattr(rec, name)
        assert col.dtype == dt
        np.testing.assert_array_equal(col, np.array([r[j] for r in rows], dtype=dt))
    empty = RequestRecords.empty()
    assert len(empty) == 0 and all(getattr(empty, n).dtype == dt for n, dt in RECORD_COLUMNS)
    # columns are made when first read: copies, pickles and replace() see the same values
    import copy
    import dataclasses
    import pickle

    for other in (pickle.loads(pickle.dumps(RequestRecords.from_rows(rows))), copy.copy(RequestRecords.from_rows(rows)),
                  dataclasses.replace(RequestRecords.from_rows(rows)), RequestRecords.concat([rec])):
        assert isinstance(other, RequestRecords) and len(other) == 5
        for name, dt in RECORD_COLUMNS:
            np.testing.assert_array_equal(getattr(other, name), getattr(rec, name), err_msg=name)
            assert getattr(other, name).dtype == dt
    with pytest.raises(AttributeError):
        _ = RequestRecords.from_rows(rows).no_such_column


def test_reseeded_workload_equals_a_new_one():
    sc = load_scenario("dev")
    _, w = build_world(sc, 0)
    w.arrivals_between(0.0, 90.0)  # fill its cache: nothing of it may carry over
    for seed in (1, 7):
        a = reseed_workload(w, seed)
        b = build_workload(sc, seed)
        for t0, t1 in ((0.0, 0.5), (0.5, 61.0), (61.0, 200.0)):
            x, y = a.arrivals_between(t0, t1), b.arrivals_between(t0, t1)
            for f in ("origin", "arrival_s", "prompt_tokens", "output_tokens"):
                np.testing.assert_array_equal(getattr(x, f), getattr(y, f))


def test_records_concat_of_tables_equals_the_column_wise_concat():
    rng = np.random.default_rng(5)
    parts = []
    for n in (3, 0, 4, 1):
        rows = [tuple(float(rng.integers(0, 1000)) if dt is np.int64 else float(rng.random())
                      for _, dt in RECORD_COLUMNS) for _ in range(n)]
        parts.append(RequestRecords.from_rows(rows))
    fast = RequestRecords.concat(parts)  # every part a table: one concatenation
    built = [RequestRecords(**p.to_dict()) for p in parts]  # plain dataclasses: the column-wise path
    slow = RequestRecords.concat(built)
    mixed = RequestRecords.concat([parts[0], built[2]])
    assert type(fast) is not RequestRecords and type(slow) is RequestRecords and len(fast) == len(slow) == 8
    for name, dt in RECORD_COLUMNS:
        assert getattr(fast, name).dtype == dt
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)
        np.testing.assert_array_equal(getattr(mixed, name), np.concatenate([getattr(parts[0], name), getattr(parts[2], name)]))


def test_records_concat_of_request_lists_stays_lazy_and_equals_the_column_wise_concat():
    # the env's end-of-episode drain concatenates the simulator's per-chunk records: they stay
    # request lists (columns made when first read), with the values of a column-wise concat
    rng = np.random.default_rng(7)
    wl = random_workload(rng, 150, 2, rate_per_s=20.0, max_prompt=2000, max_output=300)
    sim = make_sim(n_dc=2, gpus_per_node=2)
    drive(sim, wl, until_s=float(wl["send_s"][-1]))
    parts = [sim.pop_completed()]
    t = sim.now_s
    for _ in range(40):
        t += 2.0
        sim.advance_to(t)
        parts.append(sim.pop_completed())
    assert sum(len(p) == 0 for p in parts) >= 1 and sum(len(p) > 0 for p in parts) >= 3  # empties in between
    columns = [{name: getattr(p, name) for name, _ in RECORD_COLUMNS} for p in parts]  # materialised
    lazy = RequestRecords.concat(parts)
    assert "_reqs" in lazy.__dict__ and not any(name in lazy.__dict__ for name, _ in RECORD_COLUMNS)
    assert len(lazy) == sum(len(p) for p in parts) == 150
    for name, dt in RECORD_COLUMNS:
        col = getattr(lazy, name)
        assert col.dtype == dt
        np.testing.assert_array_equal(col, np.concatenate([c[name] for c in columns]).astype(dt), err_msg=name)
    one = [p for p in parts if len(p)][:1]
    assert RequestRecords.concat(one + [RequestRecords.empty()]) is one[0]


def test_packaged_latency_model_is_parsed_once_and_read_only(tmp_path):
    from carbon_gym.physics.latency import load_latency_model

    a = load_latency_model("a100-80gb", "llama-3.1-8b", 1)
    b = load_latency_model("a100-80gb", "llama-3.1-8b", 1)
    assert a is b  # every env construction reads it: parsed once per process
    assert not a.tokens_grid.flags.writeable and not a.linear_s.flags.writeable
    with pytest.raises(ValueError):
        a.linear_s[0] = 0.0
    # a file named by the scenario is read each time (it may be edited between runs)
    p = tmp_path / "lat.toml"
    p.write_bytes(latency_params_path("a100-80gb", "llama-3.1-8b", 1).read_bytes())
    c = load_latency_model("a100-80gb", "llama-3.1-8b", 1, p)
    assert c is not load_latency_model("a100-80gb", "llama-3.1-8b", 1, p) and c.tokens_grid.flags.writeable
    for n in (1.0, 700.0, 5000.0):
        assert c.linear_time_s(n) == a.linear_time_s(n)


def _rr_episode(env, seed):
    from carbon_gym.policy import RoundRobinPolicy

    policy = RoundRobinPolicy()
    obs, info = env.reset(seed=seed)
    policy.reset(env)
    rewards = []
    while True:
        obs, reward, _, trunc, info = env.step(policy.act(obs, info))
        rewards.append(reward)
        if trunc:
            return rewards, info["episode_metrics"]


def test_env_first_episode_on_the_constructors_simulator_equals_a_later_one():
    # the first episode runs on the simulator the constructor built (no fresh() copy), later
    # ones on fresh() of it: the same episode either way
    from carbon_gym.env import GeoServeEnv

    over = {"duration_s": 20}
    a = GeoServeEnv(scenario="dev", overrides=over)
    first = a._sim_template
    r_a, m_a = _rr_episode(a, 5)
    assert a._sim is first
    b = GeoServeEnv(scenario="dev", overrides=over)
    first_b = b._sim_template
    _rr_episode(b, 9)
    r_b, m_b = _rr_episode(b, 5)
    assert b._sim is not b._sim_template and b._sim_template is not first_b  # its end state let go
    assert b._sim_template.now_s == 0.0
    assert r_a == r_b and m_a["carbon_g"] == m_b["carbon_g"] and m_a["completed"] == m_b["completed"] > 0
    assert m_a.keys() == m_b.keys()
    for k in m_a:
        np.testing.assert_equal(m_a[k], m_b[k], err_msg=k)


def test_binned_predictor_lookup_equals_binning():
    from carbon_gym.predict import _LOOKUP_TOKENS, BinnedPredictor

    rng = np.random.default_rng(2)
    p = rng.integers(1, 20000, 5000)
    pred = BinnedPredictor().fit(p, (p * rng.uniform(0.1, 2.0, p.size)).astype(np.int64) + 1)
    q = np.concatenate([np.arange(0, 3000), rng.integers(0, _LOOKUP_TOKENS, 3000), [_LOOKUP_TOKENS - 1]])
    for dtype in (np.int64, np.int32, np.uint16):
        np.testing.assert_array_equal(pred.predict(q.astype(dtype)), pred.table[pred._bin(q)])
    # outside the table, floats, empty input: the binning path, same values
    big = np.array([_LOOKUP_TOKENS, 10 * _LOOKUP_TOKENS], dtype=np.int64)
    np.testing.assert_array_equal(pred.predict(big), pred.table[pred._bin(big)])
    np.testing.assert_array_equal(pred.predict(q.astype(np.float64)), pred.table[pred._bin(q)])
    assert pred.predict(np.zeros(0, dtype=np.int64)).shape == (0,)


def test_record_column_covers_every_record_column_and_no_more() -> None:
    """carbon_gym.sim.request.record_column computes each of RECORD_COLUMNS (lazy records) and
    refuses an index past them."""
    from carbon_gym.sim.records import RECORD_COLUMNS
    from carbon_gym.sim.request import record_column

    for j in range(len(RECORD_COLUMNS)):
        assert record_column([], j) == []
    with pytest.raises(IndexError, match=f"has {len(RECORD_COLUMNS)}"):
        record_column([], len(RECORD_COLUMNS))
