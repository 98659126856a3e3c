"""Automatic prefix caching (carbon_gym.sim.prefix_cache): hits and evictions equal a reference LRU
block cache, the hit rate on the Mooncake trace equals its block reuse, a hit saves exactly the
cached tokens' prefill, the fast path equals step mode, KV stays within capacity, nothing is lost,
and a sleeping engine loses its cache."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carbon_gym.errors import ConfigError
from carbon_gym.sim import RECORD_COLUMNS, EngineConfig
from carbon_gym.sim.engine import ITER
from carbon_gym.sim.prefix_cache import ROOT_KEY, chain_keys
from test_sim_fixtures import GPU, LAT, POW, make_sim, starved_gpu

MOONCAKE = Path("/work/shared/data/workload/mooncake/conversation_trace.jsonl")
INT_COLS = [n for n, dt in RECORD_COLUMNS if dt is np.int64]
FLOAT_COLS = [n for n, dt in RECORD_COLUMNS if dt is np.float64]
TOKEN_TOTALS = ("prompt_tokens", "cached_prompt_tokens", "prefill_saved_tokens", "prefix_evictions")


def session_requests(rng: np.random.Generator, n_sessions: int, max_turns: int, P: int, max_len: int,
                     think_s: float = 2.0, rate_per_s: float = 2.0) -> list[dict]:
    """Multi-turn sessions in ``P``-token prefix blocks, ordered by arrival: each session starts with
    one of three shared system prompts (whole blocks); turn k's prompt = turn k-1's prompt + its
    output + a new message; the blocks wholly inside the previous prompt keep their ids (Mooncake's
    ``hash_ids`` structure), the rest get new ids."""
    next_id = [0]

    def fresh(n: int) -> list[int]:
        out = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return out

    systems = [fresh(int(rng.integers(0, 4))) for _ in range(3)]
    reqs = []
    t = 0.0
    for s in range(n_sessions):
        t += float(rng.exponential(1.0 / rate_per_s))
        sys_ids = systems[int(rng.integers(0, 3))]
        prev_prompt, prev_out, ids = len(sys_ids) * P, 0, list(sys_ids)
        at = t
        for turn in range(int(rng.integers(1, max_turns + 1))):
            prompt = prev_prompt + prev_out + int(rng.integers(1, 3 * P))
            out = int(rng.integers(1, 2 * P))
            if prompt + out > max_len:
                break
            keep = ids[:prev_prompt // P]
            ids = keep + fresh(-(-prompt // P) - len(keep))
            reqs.append(dict(session=s, turn=turn, arrival_s=at, prompt=prompt, output=out, ids=tuple(ids)))
            prev_prompt, prev_out = prompt, out
            at += float(rng.exponential(think_s))
    reqs.sort(key=lambda r: r["arrival_s"])
    return reqs


class ReferenceLRU:
    """A straightforward LRU cache of prefix blocks for one engine serving one request at a time:
    a cached block is keyed by its whole id prefix (a tuple), blocks of finished requests stay
    cached-free (least recently used first), and cached-free blocks are evicted only when the
    request's KV blocks plus the cached ones exceed the engine's."""

    def __init__(self, total_blocks: int, P: int, block_tokens: int = 16) -> None:
        self.total, self.P, self.bt, self.m = total_blocks, P, block_tokens, P // block_tokens
        self.lru: OrderedDict[tuple, None] = OrderedDict()
        self.evictions = 0

    def _room(self, used_blocks: int) -> None:
        while used_blocks + len(self.lru) * self.m > self.total:
            self.lru.popitem(last=False)
            self.evictions += 1

    def serve(self, ids: tuple, prompt: int, output: int) -> int:
        """Serve one request; return its cached prompt tokens."""
        P, bt = self.P, self.bt
        full = min(len(ids), prompt // P)
        keys = [tuple(ids[:i + 1]) for i in range(full)]
        n_max = min(full, (prompt - 1) // P)  # at least one prompt token computed
        h = 0
        while h < n_max and keys[h] in self.lru:
            h += 1
        for k in keys[:h]:
            del self.lru[k]  # in use by the request
        self._room(-(-prompt // bt))  # admission: its prompt blocks (the hits among them)
        for k in keys[h:]:
            self.lru.pop(k, None)  # prefill done: a block still cached (the capped last one) is shared
        self._room(-(-(prompt + output - 1) // bt))  # decode growth
        for k in reversed(keys):  # released deepest first
            self.lru[k] = None
        return h * P


def parents_of(reqs: list[dict]) -> dict[int, int]:
    """Chained key -> the key of the block before it, over the blocks of ``reqs``."""
    out: dict[int, int] = {}
    for r in reqs:
        keys = chain_keys(r["ids"], len(r["ids"]))
        out.update(zip(keys, (ROOT_KEY,) + keys[:-1]))
    return out


def check_cache_invariants(sim, parent_of: dict[int, int]) -> None:
    """KV accounting of every engine with prefix caching (called after single events; keys ->
    their parent keys in ``parent_of``)."""
    for dc in sim.datacenters:
        index: dict[int, int] = {}
        for e in dc.engines:
            c = e.cache
            m = c.kv_per_block
            assert e.free_blocks >= 0
            holders: dict[int, int] = {}
            private = 0
            for r in e.running.values():
                keys = r.prefix_keys
                for i in range(r.held):
                    holders[keys[i]] = holders.get(keys[i], 0) + 1
                if r.decoding:
                    ctx = r.ctx_tokens if e.step_mode else r.ctx_offset + e.decode_iters
                    private += -(-ctx // e.block_tokens) - r.held * m
                    if e.state == ITER and e.iter_decodes and ctx % e.block_tokens == 0:
                        private += 1  # the block its decode in the iteration under way took
                else:
                    private += r.kv_blocks
                assert r.kv_blocks >= 0
            for r in e.waiting:
                assert r.held == 0
            refs = {k: max(v, 0) for k, v in c.state.items()}
            lru = c.lru_order()
            # every block is unallocated, a request's own or a cache entry's
            unallocated = e.free_blocks - c.evictable_blocks  # < 0: evictions due at the next cache operation
            assert unallocated + private + len(refs) * m == e.total_blocks
            assert -unallocated <= c.evictable_blocks
            assert {k: v for k, v in refs.items() if v} == holders
            assert sorted(lru) == sorted(k for k, v in refs.items() if v == 0)
            assert c.evictable_blocks == len(lru) * m
            pos = {k: i for i, k in enumerate(lru)}
            for k in refs:
                p = parent_of[k]
                assert p == ROOT_KEY or p in refs  # prefix-closed
                if k in pos and p in pos:
                    assert pos[k] < pos[p]  # a child is evicted before its parent
            for k in refs:
                index[k] = index.get(k, 0) | 1 << e.index
            runs = c.heads
            assert sum(r.n for r in runs.values()) == len(c) == len(refs)
            for k, r in runs.items():
                assert r.keys[r.lo] == k and r.n > 0 and r.eng == e.index
                assert r in dc.prefix_index[k]  # the datacenter's index of runs by first key
        assert sum(len(v) for v in dc.prefix_index.values()) == sum(len(e.cache.heads) for e in dc.engines)
        # a request's first block: the engines holding it are those with a run starting with it
        firsts = {k: m for k, m in index.items() if parent_of[k] == ROOT_KEY}
        assert firsts == {k: sum(1 << r.eng for r in v) for k, v in dc.prefix_index.items() if parent_of[k] == ROOT_KEY}


def submit(sim, r: dict, dc: int = 0, origin: int = 0, arrival_s: float | None = None) -> int:
    return sim.submit(origin, sim.now_s if arrival_s is None else arrival_s, r["prompt"], r["output"], dc,
                      prefix_hashes=r["ids"])


# ---------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 31 - 1), blocks=st.integers(30, 160), P=st.sampled_from([16, 32, 64]),
       chunked=st.booleans())
def test_hits_and_evictions_equal_a_reference_lru(seed, blocks, P, chunked):
    rng = np.random.default_rng(seed)
    mml = blocks * 16
    eng = EngineConfig(max_model_len=mml, max_num_batched_tokens=256, max_num_seqs=8, chunked_prefill=chunked,
                       prefix_caching=True, prefix_block_tokens=P)
    sim = make_sim(n_dc=1, gpus_per_node=1, gpu=starved_gpu(blocks), engine=eng)
    assert sim.kv_blocks_per_engine == blocks
    reqs = session_requests(rng, 12, 6, P, mml)
    order = rng.permutation(len(reqs))  # sessions interleaved, turns of one session in any order
    ref = ReferenceLRU(blocks, P)
    expect = []
    for i in order:
        r = reqs[int(i)]
        submit(sim, r)
        sim.run_until_idle()
        expect.append(ref.serve(r["ids"], r["prompt"], r["output"]))
    rec = sim.pop_completed().sorted_by_id()
    np.testing.assert_array_equal(rec.cached_tokens, expect)
    tot = sim.totals()
    assert int(tot.prefix_evictions.sum()) == ref.evictions
    assert int(tot.cached_prompt_tokens.sum()) == sum(expect) == int(tot.prefill_saved_tokens.sum())
    cache = sim.datacenters[0].engines[0].cache
    assert sorted(cache.state) == sorted(cache.lru_order())  # all cached-free
    assert len(cache) == len(ref.lru)  # the same number of blocks left cached


def mooncake_requests(n: int) -> list[dict]:
    if not MOONCAKE.exists():
        pytest.skip(f"{MOONCAKE} not found")
    out = []
    with open(MOONCAKE) as f:
        for line in f:
            d = json.loads(line)
            out.append(dict(arrival_s=d["timestamp"] / 1e3, prompt=d["input_length"], output=d["output_length"],
                            ids=tuple(d["hash_ids"])))
            if len(out) == n:
                break
    return out


def block_reuse(reqs: list[dict], P: int) -> tuple[int, int]:
    """(cached prompt tokens, prompt tokens) if every full prompt block is kept once computed: a
    request reuses its longest prefix of full blocks whose id prefix an earlier request had as full
    blocks, at most leaving one prompt token to compute."""
    seen: set[tuple] = set()
    cached = total = 0
    for r in reqs:
        ids, prompt = r["ids"], r["prompt"]
        full = min(len(ids), prompt // P)
        n_max = min(full, (prompt - 1) // P)
        h = 0
        while h < n_max and tuple(ids[:h + 1]) in seen:
            h += 1
        cached += h * P
        total += prompt
        seen.update(tuple(ids[:i + 1]) for i in range(full))
    return cached, total


def test_unbounded_cache_hit_rate_equals_mooncake_block_reuse():
    import dataclasses

    reqs = mooncake_requests(2000)
    mml = max(r["prompt"] + r["output"] for r in reqs)
    eng = EngineConfig(max_model_len=mml, prefix_caching=True, prefix_block_tokens=512)
    huge = dataclasses.replace(GPU, memory_bytes=GPU.memory_bytes * 2000)  # never evicts
    sim = make_sim(n_dc=1, gpus_per_node=1, gpu=huge, engine=eng)
    for r in reqs:  # one at a time: every earlier prompt is computed before the next is admitted
        submit(sim, r)
        sim.run_until_idle()
    tot = sim.totals()
    cached, total = block_reuse(reqs, 512)
    assert tot.completed == len(reqs) and int(tot.prefix_evictions.sum()) == 0
    assert int(tot.prompt_tokens.sum()) == total
    assert int(tot.cached_prompt_tokens.sum()) == cached
    assert tot.overall_prefix_hit_rate == cached / total
    assert 0.2 < cached / total < 0.9  # the trace reuses its context (29% over its first 2,000 requests)
    rec = sim.pop_completed()
    assert int(rec.cached_tokens.sum()) == cached and int(rec.prompt_tokens.sum()) == total


def test_a_hit_saves_exactly_the_cached_tokens_prefill():
    """A 1,124-token prompt whose first two 512-token blocks are cached computes 100 tokens in one
    iteration attending to the 1,024 cached ones: its prefill time and energy are that iteration's."""
    for step in (False, True):
        sim = make_sim(n_dc=1, gpus_per_node=1, engine=EngineConfig(prefix_caching=True), step_mode=step)
        sim.submit(0, 0.0, 1500, 1, 0, prefix_hashes=[7, 8, 9])
        sim.run_until_idle()
        a = sim.pop_completed()
        t0 = sim.now_s
        sim.submit(0, t0, 1124, 1, 0, prefix_hashes=[7, 8, 10])
        sim.run_until_idle()
        b = sim.pop_completed()
        miss = LAT.iteration_time_s(1500, 1500 * 0.5 * 1501, 0, 0.0, 1)
        hit = LAT.iteration_time_s(100, 100 * (1024 + 0.5 * 101), 0, 0.0, 1)
        assert a.cached_tokens[0] == 0 and b.cached_tokens[0] == 1024
        assert a.prefill_s[0] == pytest.approx(miss, rel=1e-12)
        assert b.prefill_s[0] == pytest.approx(hit, rel=1e-12)
        pue = sim.datacenters[0].pue
        assert b.energy_j[0] == pytest.approx(hit * float(POW.gpu_power_w(100, 0)) * pue, rel=1e-9)
        tot = sim.totals()
        assert tot.prompt_tokens.tolist() == [2624] and tot.cached_prompt_tokens.tolist() == [1024]
        # without the cache the same request computes all 1,124 tokens
        cold = make_sim(n_dc=1, gpus_per_node=1, step_mode=step)
        cold.submit(0, 0.0, 1124, 1, 0, prefix_hashes=[7, 8, 10])
        cold.run_until_idle()
        c = cold.pop_completed()
        assert c.cached_tokens[0] == 0
        assert c.prefill_s[0] == pytest.approx(LAT.iteration_time_s(1124, 1124 * 0.5 * 1125, 0, 0.0, 1), rel=1e-12)


def test_at_least_one_prompt_token_is_computed():
    sim = make_sim(n_dc=1, gpus_per_node=1, engine=EngineConfig(prefix_caching=True))
    sim.submit(0, 0.0, 1024, 3, 0, prefix_hashes=[1, 2])
    sim.run_until_idle()
    sim.submit(0, sim.now_s, 1024, 3, 0, prefix_hashes=[1, 2])  # all cached: the last block is recomputed
    sim.run_until_idle()
    sim.submit(0, sim.now_s, 1025, 3, 0, prefix_hashes=[1, 2, 3])
    sim.run_until_idle()
    assert sim.pop_completed().sorted_by_id().cached_tokens.tolist() == [0, 512, 1024]
    e = sim.datacenters[0].engines[0]
    assert len(e.cache) == 2 and e.free_blocks == e.total_blocks  # the duplicate block was shared, not kept


# ---------------------------------------------------------------------------------------------
def drive_sessions(sim, reqs: list[dict], n_dc: int, check=None, rng_seed: int = 0) -> None:
    rng = np.random.default_rng(rng_seed)
    for r in reqs:
        t = r["arrival_s"]
        if check is None:
            sim.advance_to(t)
        else:
            while sim.next_event_s() <= t:
                sim.advance_to(sim.next_event_s())
                check(sim)
            sim.advance_to(t)
        submit(sim, r, dc=r["session"] % n_dc, origin=int(rng.integers(0, n_dc)), arrival_s=t)
    if check is None:
        sim.run_until_idle()
    else:
        while sim.next_event_s() < math.inf:
            sim.advance_to(sim.next_event_s())
            check(sim)


CONFIGS = {
    "cache_aware": dict(n_dc=2, gpus_per_node=4, dispatcher="cache_aware", P=512, sessions=60,
                        engine=dict(max_num_batched_tokens=1024)),
    "starved": dict(n_dc=1, gpus_per_node=2, gpu=starved_gpu(90), P=32, sessions=40,
                    engine=dict(max_model_len=1440, max_num_seqs=12, max_num_batched_tokens=200)),
    "starved_unchunked": dict(n_dc=1, gpus_per_node=1, gpu=starved_gpu(90), P=32, sessions=25,
                              engine=dict(max_model_len=1440, max_num_seqs=12, max_num_batched_tokens=300,
                                          chunked_prefill=False)),
    "most_free_kv": dict(n_dc=1, gpus_per_node=3, gpu=starved_gpu(120), P=64, sessions=40, dispatcher="most_free_kv",
                         engine=dict(max_model_len=1920, max_num_seqs=16, max_num_batched_tokens=256)),
}


def build(name: str, step: bool, caching: bool = True):
    cfg = dict(CONFIGS[name])
    P = cfg.pop("P")
    cfg.pop("sessions")
    eng = EngineConfig(**cfg.pop("engine"), prefix_caching=caching, prefix_block_tokens=P)
    return make_sim(**cfg, engine=eng, step_mode=step)


def workload(name: str) -> list[dict]:
    cfg = CONFIGS[name]
    mml = cfg["engine"].get("max_model_len", 32768)
    rng = np.random.default_rng(abs(hash(name)) % 1000)
    small = cfg["P"] < 512  # the memory-starved configurations: enough load to preempt
    return session_requests(rng, cfg["sessions"], 6, cfg["P"], min(mml, 6000), think_s=0.3 if small else 1.0,
                            rate_per_s=15.0 if small else 20.0)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fast_path_equals_step_mode_with_prefix_caching(name):
    reqs = workload(name)
    n_dc = CONFIGS[name]["n_dc"]
    out = []
    for step in (False, True):
        sim = build(name, step)
        drive_sessions(sim, reqs, n_dc)
        out.append((sim.pop_completed().sorted_by_id(), sim.totals(), sim))
    (ra, ta, sa), (rb, tb, sb) = out
    assert ta.completed == len(reqs) == len(ra) == len(rb)
    assert sa.events_processed < sb.events_processed  # the fast path really jumps
    for c in INT_COLS:
        np.testing.assert_array_equal(getattr(ra, c), getattr(rb, c), err_msg=c)
    for c in FLOAT_COLS:
        np.testing.assert_allclose(getattr(ra, c), getattr(rb, c), rtol=1e-9, atol=1e-12, err_msg=c)
    for f in ("completed", "preemptions", "iterations"):
        assert getattr(ta, f) == getattr(tb, f), f
    for f in TOKEN_TOTALS:
        np.testing.assert_array_equal(getattr(ta, f), getattr(tb, f), err_msg=f)
    for f in ("facility_energy_j", "carbon_g", "idle_energy_j"):
        np.testing.assert_allclose(getattr(ta, f), getattr(tb, f), rtol=1e-9, err_msg=f)
    assert ta.cached_prompt_tokens.sum() > 0
    assert np.all(ta.prefill_saved_tokens >= ta.cached_prompt_tokens)
    if name.startswith("starved"):
        assert ta.preemptions > 0 and ta.prefix_evictions.sum() > 0
    # nothing lost: every prompt token of every completed request is counted once
    assert int(ra.prompt_tokens.sum()) == int(ta.prompt_tokens.sum())
    assert int(ra.cached_tokens.sum()) == int(ta.cached_prompt_tokens.sum())
    assert np.all(ra.cached_tokens <= ra.prompt_tokens - 1)


@pytest.mark.parametrize("name", ["starved", "starved_unchunked", "cache_aware"])
@pytest.mark.parametrize("step", [False, True])
def test_kv_within_capacity_after_every_event(name, step):
    reqs = workload(name)[:150]
    sim = build(name, step)
    parent_of = parents_of(reqs)
    drive_sessions(sim, reqs, CONFIGS[name]["n_dc"], check=lambda s: check_cache_invariants(s, parent_of))
    assert sim.totals().completed == len(reqs)
    for dc in sim.datacenters:
        for e in dc.engines:
            assert e.free_blocks == e.total_blocks and not e.running
            e.cache.settle(e.free_blocks)
            assert e.cache.evictable_blocks <= e.total_blocks


def test_caching_off_ignores_prefix_hashes():
    reqs = workload("starved")[:120]
    out = []
    for hashes in (True, False):
        sim = build("starved", False, caching=False)
        for r in reqs:
            sim.advance_to(r["arrival_s"])
            sim.submit(0, r["arrival_s"], r["prompt"], r["output"], 0, prefix_hashes=r["ids"] if hashes else None)
        sim.run_until_idle()
        out.append((sim.pop_completed().sorted_by_id(), sim.totals()))
    (ra, ta), (rb, tb) = out
    for c, _ in RECORD_COLUMNS:
        np.testing.assert_array_equal(getattr(ra, c), getattr(rb, c), err_msg=c)
    assert ra.cached_tokens.sum() == 0 and ta.cached_prompt_tokens.sum() == 0
    assert int(ta.prompt_tokens.sum()) == sum(r["prompt"] for r in reqs)


# ---------------------------------------------------------------------------------------------
def test_cache_aware_dispatch_and_the_cached_prefix_query():
    eng = EngineConfig(prefix_caching=True)
    sim = make_sim(n_dc=2, gpus_per_node=2, engine=eng, dispatcher="cache_aware")
    ids = list(range(100, 106))
    sim.submit(0, 0.0, 6 * 512 + 10, 2, 0, prefix_hashes=ids)
    sim.run_until_idle()
    assert [len(e.cache) for e in sim.datacenters[0].engines] == [6, 0]
    np.testing.assert_array_equal(sim.cached_prefix_tokens(ids[:4] + [1], 4 * 512 + 300), [2048, 0])
    np.testing.assert_array_equal(sim.cached_prefix_tokens(ids, 6 * 512), [5 * 512, 0])  # one token computed
    np.testing.assert_array_equal(sim.cached_prefix_tokens([5] + ids, 7 * 512), [0, 0])
    q = sim.cached_prefix_tokens_batch([ids, None, ids[:1]], [6 * 512 + 1, 50, 600])
    np.testing.assert_array_equal(q, [[3072, 0], [0, 0], [512, 0]])
    # engine 0 busy with an uncached prompt, engine 1 idle: least_work would pick engine 1, the
    # 2,048 cached tokens at engine 0 outweigh its 1,008 tokens of work
    for dispatcher, engine, cached in (("cache_aware", 0, 2048), ("least_work", 1, 0)):
        s = make_sim(n_dc=2, gpus_per_node=2, engine=eng, dispatcher=dispatcher)
        s.submit(0, 0.0, 6 * 512 + 10, 2, 0, prefix_hashes=ids)
        s.run_until_idle()
        s.submit(0, s.now_s, 1000, 400, 0)
        s.advance_to(s.now_s + 0.3)  # (its prefill done: the engine published its KV use)
        e0, e1 = s.datacenters[0].engines
        assert len(e0.running) == 1 and not e1.running and e0.view_used_blocks == 63
        s.submit(0, s.now_s, 4 * 512 + 100, 2, 0, prefix_hashes=ids[:4] + [7])
        s.run_until_idle()
        rec = s.pop_completed().sorted_by_id()
        assert rec.engine.tolist() == [0, 0, engine] and rec.cached_tokens.tolist() == [0, 0, cached]


def test_a_sleeping_engine_loses_its_cache():
    import dataclasses

    from test_capacity_sim import make_sim as capacity_sim

    base = capacity_sim()
    args, kwargs = base._ctor
    from carbon_gym.sim import Simulator

    sim = Simulator(*args, **dict(kwargs, engine=dataclasses.replace(kwargs["engine"], prefix_caching=True)))
    dc = sim.datacenters[0]
    ids = [1, 2, 3]
    sim.submit(0, 0.0, 1600, 4, 0, prefix_hashes=ids)
    sim.run_until_idle()
    assert sim.cached_prefix_tokens(ids, 1600)[0] == 1536 and dc.prefix_index
    sim.set_capacity(0, 0, servers_on=1)  # every engine falls asleep (the node stands by)
    sim.run_until_idle(sim.now_s + 60.0)
    assert dc.cap_counts[3] == dc.n_engines  # asleep
    assert all(len(e.cache) == 0 for e in dc.engines) and not dc.prefix_index
    assert sim.cached_prefix_tokens(ids, 1600)[0] == 0
    sim.set_capacity(0, dc.n_engines)
    sim.run_until_idle(sim.now_s + 120.0)
    sim.submit(0, sim.now_s, 1600, 4, 0, prefix_hashes=ids)
    sim.run_until_idle()
    assert sim.pop_completed().cached_tokens.tolist() == [0, 0]
    # an outage loses it too
    sim.submit(0, sim.now_s, 1600, 4, 0, prefix_hashes=ids)
    sim.run_until_idle()
    assert sim.cached_prefix_tokens(ids, 1600)[0] == 1536
    sim.set_datacenter_up(0, False)
    sim.set_datacenter_up(0, True)
    assert not dc.prefix_index and all(len(e.cache) == 0 for e in dc.engines)


def test_aborted_requests_keep_their_prefix_hashes():
    """An outage returns each aborted request's block ids (cache on or off): resubmitted with them
    to another datacenter, a request hits the prefix cached there."""
    ids = [11, 12, 13]
    for caching in (True, False):
        sim = make_sim(n_dc=2, gpus_per_node=1, engine=EngineConfig(prefix_caching=caching))
        sim.submit(0, 0.0, 1600, 2, 0, prefix_hashes=ids)  # datacenter 0 computes the prefix
        sim.run_until_idle()
        t = sim.now_s
        sim.submit_batch([0, 0], [t, t], [1600, 900], [200, 200], [1, 1], prefix_hashes=[ids, None])
        sim.advance_to(t + 0.5)  # (both at datacenter 1, running)
        ab = sim.set_datacenter_up(1, False)
        assert ab.request_id.tolist() == [1, 2] and ab.prefix_hashes == [tuple(ids), None]
        sim.submit_batch(ab.origin, ab.arrival_s, ab.prompt_tokens, ab.output_tokens, [0, 0],
                         prefix_hashes=ab.prefix_hashes)
        sim.run_until_idle()
        rec = sim.pop_completed().sorted_by_id()
        assert rec.request_id.tolist() == [0, 3, 4]
        assert rec.cached_tokens.tolist() == ([0, 1536, 0] if caching else [0, 0, 0])
        sim.set_datacenter_up(1, True)
        sim.submit(0, sim.now_s, 900, 5, 1)
        assert sim.set_datacenter_up(1, False).prefix_hashes is None  # none of them had ids


def test_bad_prefix_input_is_refused_clearly():
    sim = make_sim(n_dc=1, gpus_per_node=1, engine=EngineConfig(prefix_caching=True))
    with pytest.raises(ConfigError, match="prefix_hashes"):
        sim.submit(0, 0.0, 600, 2, 0, prefix_hashes=[1, 2, 3])  # 3 ids for 2 blocks
    with pytest.raises(ConfigError, match="prefix_hashes"):
        sim.submit(0, 0.0, 600, 2, 0, prefix_hashes=[1, -2])
    with pytest.raises(ConfigError, match="prefix_hashes"):
        sim.submit(0, 0.0, 600, 2, 0, prefix_hashes=[1.5])
    with pytest.raises(ConfigError, match=r"prefix_hashes\[1\]"):
        sim.submit_batch([0, 0], [0.0, 0.0], [600, 600], [2, 2], [0, 0], prefix_hashes=[[1], "ab"])
    with pytest.raises(ConfigError, match="prefix_hashes"):
        sim.submit_batch([0, 0], [0.0, 0.0], [600, 600], [2, 2], [0, 0], prefix_hashes=[[1]])
    assert sim.totals().submitted == 0  # a refused batch submits nothing
    with pytest.raises(ConfigError, match="prefix_block_tokens"):
        make_sim(n_dc=1, engine=EngineConfig(prefix_caching=True, prefix_block_tokens=500))
    with pytest.raises(ConfigError, match="prefix_caching"):
        make_sim(n_dc=1, engine=EngineConfig(prefix_caching=1))
    ids = sim.submit_batch([0] * 20, [0.0] * 20, [600] * 20, [2] * 20, [0] * 20, prefix_hashes=[[1, 2]] * 20)
    sim.run_until_idle()
    # the first iteration admits 4 (2,048-token budget) before block 0 is computed; the 16 others hit it
    assert len(ids) == 20 and sim.totals().cached_prompt_tokens.tolist() == [16 * 512]


def test_bool_block_ids_are_refused():
    """``prefix_hashes=[True, False]`` was taken as block ids 1 and 0 (operator.index accepts
    bools); now a ConfigError naming prefix_hashes, on every path that takes block ids (issue 43
    item 5)."""
    sim = make_sim(n_dc=1, gpus_per_node=1, engine=EngineConfig(prefix_caching=True))
    for bad in ([True, False], (7, True), [np.int64(3), False]):
        with pytest.raises(ConfigError, match=r"^prefix_hashes: block ids must be integers, not bools") as e:
            sim.submit(0, 0.0, 600, 2, 0, prefix_hashes=bad)
        assert e.value.field == "prefix_hashes"
        with pytest.raises(ConfigError, match="not bools") as e:
            sim.cached_prefix_tokens(bad, 600)
        with pytest.raises(ConfigError, match="not bools") as e:
            sim.submit_batch([0, 0], [0.0, 0.0], [600, 600], [2, 2], [0, 0], prefix_hashes=[[1], bad])
        assert e.value.field == "prefix_hashes[1]"
    off = make_sim(n_dc=1, gpus_per_node=1, engine=EngineConfig(prefix_caching=False))
    with pytest.raises(ConfigError, match="not bools"):  # (checked with caching off too)
        off.submit(0, 0.0, 600, 2, 0, prefix_hashes=[True])
    assert sim.totals().submitted == 0 and off.totals().submitted == 0
    sim.submit(0, 0.0, 600, 2, 0, prefix_hashes=[np.int64(1), 0])  # (numpy integers stay accepted)
    assert sim.totals().submitted == 1


def test_copy_and_pickle_keep_the_cache():
    import copy
    import pickle

    sim = make_sim(n_dc=1, gpus_per_node=2, engine=EngineConfig(prefix_caching=True), dispatcher="cache_aware")
    reqs = session_requests(np.random.default_rng(3), 20, 4, 512, 20000, rate_per_s=10.0)
    for r in reqs[:40]:
        sim.advance_to(r["arrival_s"])
        submit(sim, r)
    sim.advance_to(sim.now_s + 0.3)
    clones = [copy.deepcopy(sim), pickle.loads(pickle.dumps(sim))]
    for s in [sim, *clones]:
        for r in reqs[40:]:
            s.advance_to(max(r["arrival_s"], s.now_s))
            submit(s, r)
        s.run_until_idle()
    recs = [s.pop_completed().sorted_by_id() for s in [sim, *clones]]
    for r in recs[1:]:
        for c, _ in RECORD_COLUMNS:
            np.testing.assert_array_equal(getattr(r, c), getattr(recs[0], c), err_msg=c)
    assert recs[0].cached_tokens.sum() > 0
