"""Prefix workloads: the Mooncake loader, session inference, the fitted session generator, the
context-window rule and the plumbing of prefix hashes through batches and pending requests."""

from __future__ import annotations

import gzip
import json
import math
import warnings

import numpy as np
import pytest

from carbon_gym.errors import ConfigError, DataError
from carbon_gym.mooncake import PrefixReplayWorkload, infer_sessions, load_prefix_trace, splitmix_uniform
from carbon_gym.sessions import (SessionWorkload, batch_session_stats, fit_context, load_session_params,
                                 trace_session_stats)
from carbon_gym.workload import RequestBatch

BT = 512


def full_blocks(h, prompt):
    return tuple(h[: prompt // BT])


# ----------------------------------------------------------------------------- loader


@pytest.mark.parametrize("name,n,mean_in,mean_out,span_s", [
    ("mooncake-conv", 12031, 12035.06, 342.62, 3536.999),
    ("mooncake-synth", 3993, 15325.48, 149.12, 1022.025),
])
def test_packaged_traces_load_with_the_documented_figures(name, n, mean_in, mean_out, span_s):
    t = load_prefix_trace(name)
    assert len(t) == n
    assert t.prompt_tokens.mean() == pytest.approx(mean_in, abs=0.01)
    assert t.output_tokens.mean() == pytest.approx(mean_out, abs=0.01)
    assert t.arrival_s[0] == 0.0 and t.arrival_s[-1] == pytest.approx(span_s, abs=1e-9)
    counts = np.diff(t.hash_offsets)
    assert np.array_equal(counts, -(-t.prompt_tokens // BT))  # one id per 512-token block
    assert np.all(np.diff(t.arrival_s) >= 0)


def write_trace(tmp_path, lines, name="t.jsonl", gz=False):
    p = tmp_path / (name + (".gz" if gz else ""))
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    if gz:
        with gzip.open(p, "wt") as fh:
            fh.write(text)
    else:
        p.write_text(text)
    return str(p)


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def test_user_file_gz_and_block_size(tmp_path):
    p = write_trace(tmp_path, [GOOD, {"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [1, 2, 3]}], gz=True)
    t = load_prefix_trace(p)
    assert len(t) == 2 and t.hashes(1) == (1, 2, 3) and t.arrival_s.tolist() == [0.0, 1.5]
    p2 = write_trace(tmp_path, [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2, 3, 4, 5]}], "b.jsonl")
    assert load_prefix_trace(p2, block_tokens=128).hashes(0) == (1, 2, 3, 4, 5)


@pytest.mark.parametrize("bad,field", [
    ("{not json", "line"),
    ("[1, 2]", "line"),
    ({"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}, "output_length"),
    ({**GOOD, "input_length": 0}, "input_length"),
    ({**GOOD, "input_length": 600.5}, "input_length"),
    ({**GOOD, "output_length": "5"}, "output_length"),
    ({**GOOD, "hash_ids": [1]}, "hash_ids"),
    ({**GOOD, "hash_ids": [1, -2]}, "hash_ids"),
    ({**GOOD, "hash_ids": "1,2"}, "hash_ids"),
    ({**GOOD, "timestamp": -1}, "timestamp"),
])
def test_bad_lines_name_the_field_the_line_and_the_allowed_values(tmp_path, bad, field):
    p = write_trace(tmp_path, [GOOD, bad])
    with pytest.raises(ConfigError) as e:
        load_prefix_trace(p)
    assert e.value.field == field and e.value.allowed is not None
    assert e.value.source == f"{p}:2"


def test_unsorted_times_wrong_block_size_and_missing_files(tmp_path):
    p = write_trace(tmp_path, [{**GOOD, "timestamp": 10}, GOOD])
    with pytest.raises(ConfigError, match="earlier than the previous"):
        load_prefix_trace(p)
    with pytest.raises(ConfigError, match=r"block_tokens = 256") as e:
        load_prefix_trace("mooncake-synth", block_tokens=256)
    assert e.value.field == "hash_ids" and e.value.source.endswith(":1")
    with pytest.raises(ConfigError) as e:
        load_prefix_trace("mooncake-chat")
    assert "mooncake-conv" in e.value.allowed
    with pytest.raises(DataError):
        load_prefix_trace(str(tmp_path / "none.jsonl"))
    with pytest.raises(DataError, match="no requests"):
        load_prefix_trace(write_trace(tmp_path, [""], "empty.jsonl"))


# ----------------------------------------------------------------------------- sessions


def test_inferred_sessions_are_prefix_chains():
    t = load_prefix_trace("mooncake-conv")
    inf = infer_sessions(t)
    assert inf.n_sessions == 8056 and np.all(inf.system_blocks == 1)  # block 0: the shared system prompt
    lists = t.hash_lists()
    kids = np.flatnonzero(inf.parent >= 0)
    assert kids.size == 12031 - 8056
    for j in kids.tolist():
        i = int(inf.parent[j])
        assert i < j and inf.session[i] == inf.session[j] and inf.turn[j] == inf.turn[i] + 1
        f = int(t.prompt_tokens[i]) // BT
        assert f > 1 and lists[j][:f] == lists[i][:f]  # the parent's full blocks, beyond the system prompt
    synth = infer_sessions(load_prefix_trace("mooncake-synth"))
    assert np.all(synth.system_blocks == 0) and synth.n_sessions == 2538


def make_gen(seed=0, rate=3.4, cap=None, **kw):
    return SessionWorkload(load_session_params(), rate_per_s=rate, seed=seed, max_context_tokens=cap, **kw)


def test_generator_is_deterministic_and_slicing_free():
    a = make_gen(seed=5, rate=20.0, n_regions=3, block_s=30.0).arrivals_between(0.0, 400.0)
    w = make_gen(seed=5, rate=20.0, n_regions=3, block_s=30.0)
    edges = [0.0, 0.7, 31.0, 59.99, 60.0, 250.3, 400.0]
    b = RequestBatch.concat([w.arrivals_between(x, y) for x, y in zip(edges[:-1], edges[1:])])
    for f in ("origin", "arrival_s", "prompt_tokens", "output_tokens", "session_id", "turn", "context_truncated_tokens"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert a.prefix_hashes == b.prefix_hashes
    c = w.with_seed(6).arrivals_between(0.0, 400.0)
    assert len(c) != len(a) or not np.array_equal(c.prompt_tokens, a.prompt_tokens)
    d = make_gen(seed=6, rate=20.0, n_regions=3, block_s=30.0).arrivals_between(0.0, 400.0)
    assert np.array_equal(c.arrival_s, d.arrival_s) and c.prefix_hashes == d.prefix_hashes
    assert len(a) / 400.0 == pytest.approx(20.0, rel=0.15)  # stationary from t = 0


def test_generated_sessions_have_the_claimed_prefix_structure():
    w = make_gen(seed=1, rate=10.0, n_regions=2, cap=32768)
    b = w.arrivals_between(0.0, 1800.0)
    sys_ids = set()
    owner: dict[int, int] = {}
    by_session: dict[int, list[int]] = {}
    for i, s in enumerate(b.session_id.tolist()):
        by_session.setdefault(s, []).append(i)
    n_pairs = n_trunc = 0
    for s, rows in by_session.items():
        rows.sort(key=lambda i: b.turn[i])
        assert len({int(b.origin[i]) for i in rows}) == 1  # one region per session
        for i in rows:
            h, p = b.prefix_hashes[i], int(b.prompt_tokens[i])
            assert len(h) == -(-p // BT)
            sys_ids.add(h[0])
            for x in h[1:]:
                assert owner.setdefault(x, s) == s  # no id after the system prompt is shared by two sessions
        for i, j in zip(rows, rows[1:]):
            assert b.turn[j] == b.turn[i] + 1 and b.arrival_s[j] > b.arrival_s[i]
            hi, hj = b.prefix_hashes[i], b.prefix_hashes[j]
            if b.context_truncated_tokens[j] == 0:
                n_pairs += 1
                assert b.prompt_tokens[j] >= b.prompt_tokens[i] + b.output_tokens[i] + 1
                assert hj[: int(b.prompt_tokens[i]) // BT] == full_blocks(hi, int(b.prompt_tokens[i]))  # turn k extends k-1
            else:
                n_trunc += 1
                assert hj[0] == hi[0] and hj[1] != hi[1]  # only the system prompt survives a truncation
    assert sys_ids == {0} and n_pairs > 1000 and n_trunc > 0
    assert max(max(h) for h in b.prefix_hashes) < 1 << 61  # the simulator's id range
    assert np.all(b.prompt_tokens + b.output_tokens <= 32768)


def test_fitted_statistics_match_the_trace():
    """The generator at the trace's rate over four trace spans vs the trace (tolerances stated)."""
    t = load_prefix_trace("mooncake-conv")
    tr = trace_session_stats(t, infer_sessions(t))
    b = make_gen(seed=0, rate=len(t) / float(t.arrival_s[-1])).arrivals_between(0.0, 4 * 3537.0)
    g = batch_session_stats(b, 512)
    from calibration.fit_sessions import block_reuse

    tol = {"mean_turns": 0.06, "mean_prompt_tokens": 0.08, "mean_output_tokens": 0.05, "mean_first_message_tokens": 0.05,
           "mean_followup_message_tokens": 0.15, "median_think_time_s": 0.08, "mean_think_time_s": 0.08}
    for k, rel in tol.items():
        assert g[k] == pytest.approx(tr[k], rel=rel), k
    assert g["system_prompt_share"] == tr["system_prompt_share"] == 1.0
    reuse_trace = block_reuse(t.hash_lists(), t.prompt_tokens, BT)
    assert reuse_trace == pytest.approx(0.3819, abs=1e-4)
    assert block_reuse(b.prefix_hashes, b.prompt_tokens, BT) == pytest.approx(reuse_trace, abs=0.03)


def test_system_prompt_overrides():
    w = make_gen(seed=2, rate=30.0, system_prompts=4, system_prompt_tokens=1300)
    b = w.arrivals_between(0.0, 300.0)
    firsts = {h[:2] for h in b.prefix_hashes}
    assert {f for f in firsts if f[0] < 1 << 20} == {(s << 11, (s << 11) | 1) for s in range(4)}  # 2 full blocks each
    none = make_gen(seed=2, rate=30.0, system_prompt_share=0.0).arrivals_between(0.0, 300.0)
    assert all(h[0] >= 1 << 20 for h in none.prefix_hashes)


# ----------------------------------------------------------------------------- context window


def test_fit_context_rule():
    assert fit_context(1000, 100, 512, 2000) == (1000, 100, 0)
    assert fit_context(1000, 100, 512, None) == (1000, 100, 0)
    assert fit_context(5000, 100, 512, 2000) == (1900, 100, 3100)  # oldest context dropped, output kept
    assert fit_context(5000, 1900, 512, 2000) == (513, 1487, 4487 + 413)  # system + 1 token kept, output clipped
    p, o, cut = fit_context(130_000, 2000, 512, 131072)
    assert p + o == 131072 and o == 2000 and cut == 928


def test_truncations_are_counted_by_the_env():
    from carbon_gym.env import GeoServeEnv
    from carbon_gym.scenario import scenario_from_dict

    raw = {"name": "s", "model": "llama-3.1-8b", "duration_s": 40.0,
           "topology": {"preset": "default", "only_regions": ["europe"], "datacenters_per_region": 1, "nodes_per_datacenter": 1},
           "workload": {"arrival": "sessions", "rate_per_s": 3.0, "max_context_tokens": 16384},
           "engine": {"max_model_len": 16384}, "env": {"max_pending": 64}}
    s = scenario_from_dict(raw)
    env = GeoServeEnv(s)
    from carbon_gym.world import build_workload

    expect = build_workload(s, seed=0).arrivals_between(0.0, 40.0)
    assert np.count_nonzero(expect.context_truncated_tokens) > 3
    env.reset(seed=0)
    done = False
    with warnings.catch_warnings():  # (a simulator without prefix_hashes warns that it drops them)
        warnings.simplefilter("ignore", RuntimeWarning)
        while not done:
            _, _, _, done, info = env.step(np.zeros(64, dtype=np.int64))
    em = info["episode_metrics"]
    assert em["arrived"] == len(expect) and em["completed"] == len(expect)
    assert em["context_truncated"] == np.count_nonzero(expect.context_truncated_tokens)
    assert em["context_truncated_tokens"] == int(expect.context_truncated_tokens.sum())


# ----------------------------------------------------------------------------- replay, scenarios, plumbing


def test_replay_assigns_sessions_to_regions_and_offsets_loops():
    t = load_prefix_trace("mooncake-conv")
    w = PrefixReplayWorkload(t, time_scale=0.5, n_regions=4, seed=3, max_context_tokens=131072)
    period = w.arrivals.period_s
    one = w.arrivals_between(0.0, period)
    assert len(one) == 12031 and period == pytest.approx(0.5 * 3536.999 * 12031 / 12030)
    region_of: dict[int, int] = {}
    for s, r in zip(one.session_id.tolist(), one.origin.tolist()):
        assert region_of.setdefault(s, r) == r
    shares = np.bincount(list(region_of.values()), minlength=4) / len(region_of)
    assert np.allclose(shares, 0.25, atol=0.03)
    assert sorted(one.prefix_hashes) == sorted(t.hash_lists()) or True  # (order: by time, ties stable)
    assert [list(h) for h in one.prefix_hashes] == t.hash_lists()
    two = w.arrivals_between(period, 2 * period)
    assert len(two) == 12031 and all(h[0] == 0 for h in two.prefix_hashes)
    assert not set(x for h in two.prefix_hashes for x in h[1:]) & set(x for h in one.prefix_hashes for x in h[1:])
    u = splitmix_uniform(3, np.arange(10_000), np.zeros(10_000, np.int64))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_replay_truncates_over_the_window():
    t = load_prefix_trace("mooncake-synth")
    w = PrefixReplayWorkload(t, max_context_tokens=131072)
    b = w.arrivals_between(0.0, w.arrivals.period_s)
    over = (t.prompt_tokens + t.output_tokens) > 131072
    assert np.count_nonzero(b.context_truncated_tokens) == np.count_nonzero(over) == 10
    assert np.all(b.prompt_tokens + b.output_tokens <= 131072)
    assert max(max(h) for h in b.prefix_hashes) < 1 << 61
    for i in np.flatnonzero(b.context_truncated_tokens).tolist():
        assert len(b.prefix_hashes[i]) == -(-int(b.prompt_tokens[i]) // BT) and b.prefix_hashes[i][1] >= 1 << 60


def test_shipped_prefix_scenarios_and_their_errors(tmp_path):
    from carbon_gym.scenario import load_scenario, scenario_from_dict
    from carbon_gym.world import build_workload

    for name in ("llama8b-sessions-low", "llama8b-sessions-moderate", "llama8b-mooncake-low"):
        s = load_scenario(name)
        assert len(s.topology_spec().datacenters) == 16 and s.n_engines() == 512
        assert "session workload capacity" in s.rate_source and s.rate_per_s > 0
        b = build_workload(s).arrivals_between(0.0, 5.0)
        assert b.has_sessions and len(b) > 0
    lo, mid = load_scenario("llama8b-sessions-low"), load_scenario("llama8b-sessions-moderate")
    assert mid.rate_per_s == pytest.approx(2 * lo.rate_per_s)
    base = {"name": "x", "model": "llama-3.1-8b", "topology": {"preset": "default"},
            "workload": {"arrival": "replay", "trace": "mooncake-conv", "lengths": "azure-conv", "max_context_tokens": 8192}}
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(base)
    assert e.value.field == "workload.lengths" and e.value.allowed == ["trace"]
    with pytest.raises(ConfigError) as e:
        scenario_from_dict({**base, "workload": {**base["workload"], "lengths": "trace", "diurnal_amplitude": 0.5}})
    assert e.value.field == "workload.diurnal_amplitude"
    with pytest.raises(ConfigError) as e:
        scenario_from_dict({**base, "workload": {"arrival": "sessions", "rate_per_s": 1.0, "sessions": {"generator": "nope"}}})
    assert e.value.field == "workload.sessions.generator" and "mooncake-conv" in e.value.allowed
    s = scenario_from_dict({**base, "workload": {**base["workload"], "lengths": "trace"}})
    assert s.rate_per_s == pytest.approx(12031 / (3536.999 * 12031 / 12030))  # the trace's own rate


def test_batches_and_pending_carry_hashes():
    from carbon_gym.pending import PendingStore
    from carbon_gym.predict import make_predictor

    b = make_gen(seed=4, rate=5.0).arrivals_between(0.0, 60.0)
    assert b.take(np.arange(len(b)) % 2 == 0).prefix_hashes == b.prefix_hashes[::2]
    assert b.take(np.array([2, 0])).session_id.tolist() == [b.session_id[2], b.session_id[0]]
    ps = PendingStore(make_predictor("oracle"))
    ps.append_batch(b)
    rows, _ = ps.offer(8, np.ones((1, 1), bool), np.array([10**6]), 16, 10**7)
    info = ps.prefix_of(rows)
    assert info is not None and info[0] == b.prefix_hashes[:8] and info[1].tolist() == b.session_id[:8].tolist()
    place = np.zeros(8, bool)
    place[[1, 5]] = True
    ps.take(8, place)
    assert ps.placed_hashes == [b.prefix_hashes[1], b.prefix_hashes[5]] and len(ps.prefix) == len(b) - 2
    plain = PendingStore(make_predictor("oracle"))  # a workload without prefix structure: nothing kept
    plain.append_batch(RequestBatch(np.zeros(3, np.int64), np.arange(3.0), np.full(3, 10), np.full(3, 5)))
    rows, _ = plain.offer(3, np.ones((1, 1), bool), np.array([10**6]), 16, 10**7)
    assert plain.prefix_of(rows) is None
    plain.take(3, np.ones(3, bool))
    assert plain.placed_hashes is None and not math.isnan(0.0)


def test_prefix_hashes_reach_the_prefix_cache_through_the_env():
    """Sessions through the env into a datacenter of 8 engines with prefix caching and the
    cache-aware dispatcher: the cached prompt tokens are at most what an unbounded cache of one
    engine could hit (the full blocks of each prompt seen before), and most of it."""
    from carbon_gym.env import GeoServeEnv
    from carbon_gym.scenario import scenario_from_dict
    from carbon_gym.sim import EngineConfig
    from carbon_gym.world import build_workload

    if "prefix_caching" not in {f for f in EngineConfig.__dataclass_fields__}:
        pytest.skip("this simulator has no prefix cache")
    raw = {"name": "s", "model": "llama-3.1-8b", "duration_s": 300.0,
           "topology": {"preset": "default", "only_regions": ["europe"], "datacenters_per_region": 1, "nodes_per_datacenter": 1},
           "workload": {"arrival": "sessions", "rate_per_s": 0.5, "max_context_tokens": 131072},
           "engine": {"max_model_len": 131072, "prefix_caching": True, "dispatcher": "cache_aware"}, "env": {"max_pending": 64}}
    s = scenario_from_dict(raw)
    b = build_workload(s, seed=0).arrivals_between(0.0, 300.0)
    seen: set[int] = set()
    bound = 0
    for h, p in zip(b.prefix_hashes, b.prompt_tokens.tolist()):
        k, matching = 0, True
        for x in h[: p // BT]:
            k = hash((k, x))
            if matching and k in seen:
                bound += BT
            else:
                matching = False
                seen.add(k)
    env = GeoServeEnv(s)
    env.reset(seed=0)
    done = False
    while not done:
        _, _, _, done, info = env.step(np.zeros(64, dtype=np.int64))
    t = env._sim.totals()
    assert int(t.prompt_tokens.sum()) == int(b.prompt_tokens.sum()) and info["episode_metrics"]["completed"] == len(b)
    cached = int(t.cached_prompt_tokens.sum())
    assert 0.6 * bound < cached <= bound


def test_failed_over_session_requests_keep_their_prefix_and_session():
    """Sessions on two datacenters, everything sent to gb until its outage (40-80 s): each request
    the outage aborts comes back pending with its arrival's prefix hashes, session and turn, and
    placed again at de it is submitted with its hashes (it hits the system prompts cached there)."""
    from carbon_gym import pending as P
    from carbon_gym.env import GeoServeEnv
    from carbon_gym.scenario import scenario_from_dict
    from carbon_gym.sim import RequestRecords
    from carbon_gym.world import build_workload

    raw = {"name": "s", "model": "llama-3.1-8b", "duration_s": 120.0,
           "topology": {"preset": "default", "only_regions": ["europe"], "datacenters_per_region": 2, "nodes_per_datacenter": 1},
           "workload": {"arrival": "sessions", "rate_per_s": 2.0, "max_context_tokens": 131072},
           "engine": {"max_model_len": 131072, "prefix_caching": True, "dispatcher": "cache_aware"}, "env": {"max_pending": 64},
           "faults": [{"kind": "datacenter_outage", "datacenter": "gb", "start_s": 40.0, "end_s": 80.0}]}
    s = scenario_from_dict(raw)
    b = build_workload(s, seed=0).arrivals_between(0.0, 120.0)
    arrival = {(a, p): (h, sid, t) for a, p, h, sid, t in zip(b.arrival_s.tolist(), b.prompt_tokens.tolist(),
                                                              b.prefix_hashes, b.session_id.tolist(), b.turn.tolist())}
    env = GeoServeEnv(s)
    env.reset(seed=0)
    assert [d.name for d in env._sim.datacenters] == ["de", "gb"]
    aborted = []
    requeue = env._requeue
    env._requeue = lambda ab: (aborted.append(ab), requeue(ab))
    K = env.layout.max_pending
    parts, seen, done = [], 0, False
    while not done:
        mask = env.action_masks().reshape(K, 3)
        _, _, _, done, info = env.step(np.where(mask[:, 1], 1, 0))  # gb while it is up, else de
        parts.append(env._last_completed)
        rows = env._pending.rows
        back = rows[rows[:, P.FAILED] == 1]
        if len(back):
            for r, *got in zip(back, *env._pending.prefix_of(back)):
                h, sid, turn = got
                assert (h, int(sid), int(turn)) == arrival[(r[P.ARRIVAL], int(r[P.PROMPT]))]
                seen += 1
    m = info["episode_metrics"]
    n_ab = sum(len(ab) for ab in aborted)
    assert n_ab == m["failed_over"] == m["failed_over_completed"] == seen > 10  # each seen pending once
    for ab in aborted:
        assert ab.prefix_hashes == [arrival[(a, p)][0] for a, p in zip(ab.arrival_s.tolist(), ab.prompt_tokens.tolist())]
    rec = RequestRecords.concat(parts)
    ab_ids = {i for ab in aborted for i in ab.request_id.tolist()}
    ab_arrival = {a for ab in aborted for a in ab.arrival_s.tolist()}
    again = np.array([a in ab_arrival and i not in ab_ids for a, i in zip(rec.arrival_s.tolist(), rec.request_id.tolist())])
    assert again.sum() == n_ab and (rec.datacenter[again] == 0).all()
    assert rec.cached_tokens[again].sum() > 0  # (0 when they came back without their hashes)
