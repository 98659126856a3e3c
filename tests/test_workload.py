"""Workloads: arrival processes, length samplers, regions, diurnal profile, lazy chunking (issue 3)."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pytest

from carbon_gym.errors import ConfigError, DataError
from carbon_gym.workload import (
    DiurnalProfile,
    EmpiricalLengthSampler,
    FixedLengthSampler,
    GammaArrivals,
    PoissonArrivals,
    RequestBatch,
    TraceReplayArrivals,
    Workload,
    load_length_table,
    make_length_sampler,
    make_trace_replay,
)

FIELDS = ("origin", "arrival_s", "prompt_tokens", "output_tokens")


def same(a: RequestBatch, b: RequestBatch) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def chunked(w: Workload, edges) -> RequestBatch:
    return RequestBatch.concat([w.arrivals_between(a, b) for a, b in zip(edges[:-1], edges[1:])])


# ----------------------------------------------------------------------------- datasets


@pytest.mark.parametrize(
    "name, n, p50_prompt, p50_output",
    [("azure-conv", 19366, 1020, 129), ("azure-code", 8819, 1469, 13), ("sharegpt", 30731, None, None), ("arxiv", 28257, None, None)],
)
def test_packaged_length_datasets_have_every_row(name, n, p50_prompt, p50_output):
    t = load_length_table(name)
    assert t.prompt_tokens.size == n and t.output_tokens.size == n
    assert t.prompt_tokens.min() >= 1 and t.output_tokens.min() >= 1
    if p50_prompt is not None:  # figures quoted in the shared data README
        assert np.median(t.prompt_tokens) == p50_prompt and np.median(t.output_tokens) == p50_output
        assert t.arrival_s is not None and t.arrival_s[0] == 0 and np.all(np.diff(t.arrival_s) >= 0)
    else:
        assert t.arrival_s is None


def test_azure_trace_rate_matches_readme():
    conv = make_trace_replay("azure-conv")
    code = make_trace_replay("azure-code")
    assert conv.trace_rate_per_s == pytest.approx(5.5, abs=0.05)
    assert code.trace_rate_per_s == pytest.approx(2.6, abs=0.05)


def test_user_length_file_and_bad_rows(tmp_path):
    p = tmp_path / "mine.csv"
    p.write_text("prompt_tokens,output_tokens\n10,5\n20,7\n")
    s = make_length_sampler(str(p))
    assert set(s.prompt_tokens.tolist()) == {10, 20}
    p.write_text("prompt_tokens,output_tokens\n10,5\n20,0\n")
    with pytest.raises(DataError, match=r"mine\.csv:3: .*whole number >= 1"):
        make_length_sampler(str(p))
    with pytest.raises(ConfigError, match="workload.lengths"):
        make_length_sampler("wikipedia")


# ----------------------------------------------------------------------------- lengths


@pytest.mark.parametrize("name", ["azure-conv", "azure-code", "sharegpt", "arxiv"])
def test_length_sampler_statistics_match_dataset(name):
    t = load_length_table(name)
    s = make_length_sampler(name)  # no cap: pure resampling
    n = 200_000
    p, o = s.sample(np.random.default_rng(1), n)
    for got, pop in ((p, t.prompt_tokens), (o, t.output_tokens)):
        se = pop.std() / math.sqrt(n)
        assert abs(got.mean() - pop.mean()) < 4 * se
    # joint pairs are preserved: every drawn pair exists in the dataset
    pairs = set(zip(t.prompt_tokens.tolist(), t.output_tokens.tolist()))
    assert all((a, b) in pairs for a, b in zip(p[:2000].tolist(), o[:2000].tolist()))


def test_cap_resample_never_exceeds_and_reports_exclusions():
    t = load_length_table("sharegpt")
    cap = 4096
    s = make_length_sampler("sharegpt", max_context_tokens=cap)
    over = float(np.mean(t.prompt_tokens + t.output_tokens > cap))
    assert s.excluded_fraction == pytest.approx(over) and over > 0.2
    p, o = s.sample(np.random.default_rng(0), 50_000)
    assert np.all(p + o <= cap)
    ok = t.prompt_tokens + t.output_tokens <= cap
    assert abs(p.mean() - t.prompt_tokens[ok].mean()) < 4 * t.prompt_tokens[ok].std() / math.sqrt(p.size)


def test_cap_clip_truncates_prompt_then_output():
    s = EmpiricalLengthSampler(np.array([100, 5000, 10]), np.array([50, 10, 3000]), max_context_tokens=1000, cap_policy="clip")
    p, o = s.sample(np.random.default_rng(0), 3000)
    assert np.all(p + o <= 1000) and np.all(p >= 1) and np.all(o >= 1)
    got = set(zip(p.tolist(), o.tolist()))
    assert got == {(100, 50), (999, 1), (10, 990)}
    with pytest.raises(ConfigError, match="max_context_tokens"):
        EmpiricalLengthSampler(np.array([900]), np.array([200]), max_context_tokens=1000)
    with pytest.raises(ConfigError, match="cap_policy"):
        EmpiricalLengthSampler(np.array([9]), np.array([2]), cap_policy="truncate")
    with pytest.raises(ConfigError):
        FixedLengthSampler(900, 200, max_context_tokens=1000)


# ----------------------------------------------------------------------------- arrivals


def test_poisson_rate_and_interarrival_cv():
    rate, dur = 40.0, 3600.0
    w = Workload(PoissonArrivals(), FixedLengthSampler(10, 10), rate_per_s=rate, seed=3)
    b = w.arrivals_between(0.0, dur)
    n = len(b)
    assert abs(n - rate * dur) < 4 * math.sqrt(rate * dur)
    gaps = np.diff(b.arrival_s)
    assert gaps.mean() == pytest.approx(1 / rate, rel=4 / math.sqrt(n))
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.02)
    assert np.all(gaps >= 0) and b.arrival_s[0] >= 0 and b.arrival_s[-1] < dur
    # counts in 1-s windows are Poisson: variance / mean ~ 1
    counts = np.bincount(b.arrival_s.astype(int), minlength=int(dur))
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_rate_and_cv(cv):
    rate, dur = 20.0, 20_000.0
    w = Workload(GammaArrivals(cv), FixedLengthSampler(10, 10), rate_per_s=rate, seed=5, block_s=600.0)
    b = w.arrivals_between(0.0, dur)
    n = len(b)
    # renewal-process count variance ~ rate * t * cv^2
    assert abs(n - rate * dur) < 5 * math.sqrt(rate * dur) * cv
    gaps = np.diff(b.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_gamma_blocks_have_no_edge_effect():
    # arrivals in the first second of each block must have the same rate as elsewhere
    w = Workload(GammaArrivals(3.0), FixedLengthSampler(1, 1), rate_per_s=50.0, seed=1, block_s=10.0)
    b = w.arrivals_between(0.0, 20_000.0)
    pos = np.mod(b.arrival_s, 10.0)
    first = np.mean(pos < 1.0)
    assert first == pytest.approx(0.1, abs=0.01)


def test_trace_replay_reproduces_interarrival_times():
    t = load_length_table("azure-conv")
    gaps = np.diff(t.arrival_s)
    rep = make_trace_replay("azure-conv", time_scale=1.0)
    w = Workload(rep, None, replay_lengths=True, replay_table=t, max_context_tokens=None, seed=0)
    b = w.arrivals_between(0.0, rep.period_s)
    assert len(b) == t.arrival_s.size
    np.testing.assert_allclose(np.diff(b.arrival_s), gaps, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(b.prompt_tokens, t.prompt_tokens)
    np.testing.assert_array_equal(b.output_tokens, t.output_tokens)
    # time scaling: half the inter-arrival times, twice the rate
    fast = make_trace_replay("azure-conv", time_scale=0.5)
    bf = Workload(fast, make_length_sampler("azure-conv"), seed=0).arrivals_between(0.0, fast.period_s)
    np.testing.assert_allclose(np.diff(bf.arrival_s), 0.5 * gaps, atol=1e-9)
    assert fast.rate_per_s == pytest.approx(2 * rep.rate_per_s)
    # looping: the second copy repeats the first shifted by one period
    b2 = w.arrivals_between(rep.period_s, 2 * rep.period_s)
    np.testing.assert_allclose(b2.arrival_s - rep.period_s, b.arrival_s, atol=1e-6)


def test_trace_replay_rate_target():
    rep = make_trace_replay("azure-code", rate_per_s=26.0)
    assert rep.rate_per_s == pytest.approx(26.0)
    assert rep.time_scale == pytest.approx(rep.trace_rate_per_s / 26.0)
    with pytest.raises(ConfigError, match="workload.trace"):
        make_trace_replay("sharegpt")  # lengths only, no timestamps


def test_replay_lengths_respect_cap():
    t = load_length_table("azure-conv")
    rep = make_trace_replay("azure-conv")
    cap = 2048
    for policy in ("resample", "clip"):
        w = Workload(rep, make_length_sampler("azure-conv", max_context_tokens=cap), replay_lengths=True, replay_table=t,
                     max_context_tokens=cap, cap_policy=policy)
        b = w.arrivals_between(0.0, rep.period_s)
        assert len(b) == t.arrival_s.size and np.all(b.prompt_tokens + b.output_tokens <= cap)
        fits = t.prompt_tokens + t.output_tokens <= cap
        np.testing.assert_array_equal(b.prompt_tokens[fits], t.prompt_tokens[fits])


# ----------------------------------------------------------------------------- regions, diurnal


def test_region_shares():
    shares = [0.5, 0.3, 0.2]
    w = Workload(PoissonArrivals(), FixedLengthSampler(5, 5), rate_per_s=30.0, n_regions=3, region_shares=shares, seed=2)
    b = w.arrivals_between(0.0, 3600.0)
    counts = np.bincount(b.origin, minlength=3)
    for c, s in zip(counts, shares):
        lam = 30.0 * 3600 * s
        assert abs(c - lam) < 4 * math.sqrt(lam)
    with pytest.raises(ConfigError, match="region_shares"):
        Workload(PoissonArrivals(), FixedLengthSampler(5, 5), rate_per_s=1.0, n_regions=2, region_shares=[0.7, 0.7])


def test_diurnal_profile_follows_local_time():
    amp, rate = 0.5, 20.0
    start = datetime(2023, 6, 15, 0, 0)
    offsets = (-8.0, 9.0)
    d = DiurnalProfile(amp, 14.0, offsets, start)
    w = Workload(PoissonArrivals(), FixedLengthSampler(5, 5), rate_per_s=rate, n_regions=2, diurnal=d, seed=4)
    b = w.arrivals_between(0.0, 2 * 86400.0)
    for r, off in enumerate(offsets):
        t = b.arrival_s[b.origin == r]
        # daily mean is preserved
        lam = rate / 2 * 2 * 86400
        assert abs(t.size - lam) < 4 * math.sqrt(lam)
        local_hour = np.floor(np.mod(t / 3600.0 + off, 24.0)).astype(int)
        per_hour = np.bincount(local_hour, minlength=24) / 2 / 3600.0  # requests/s by local hour
        expected = rate / 2 * (1 + amp * np.cos(2 * np.pi * (np.arange(24) + 0.5 - 14.0) / 24))
        # hour-averaged cosine differs from the midpoint value by < 0.3%; Poisson error per hour
        assert np.all(np.abs(per_hour - expected) < 4 * np.sqrt(expected / 7200) + 0.01 * expected)
        assert np.argmax(per_hour) in (13, 14)
    with pytest.raises(ConfigError, match="diurnal_amplitude"):
        DiurnalProfile(1.5, 14.0, (0.0,), start)


# ----------------------------------------------------------------------------- lazy + deterministic


def _workloads():
    start = datetime(2023, 6, 15, 12)
    s = make_length_sampler("azure-conv", max_context_tokens=8192)
    rep = make_trace_replay("azure-conv", time_scale=0.25)
    return {
        "poisson": lambda: Workload(PoissonArrivals(), s, rate_per_s=50.0, n_regions=4, seed=11, block_s=7.0),
        "gamma-diurnal": lambda: Workload(GammaArrivals(2.0), s, rate_per_s=50.0, n_regions=3, seed=11, block_s=13.0,
                                          diurnal=DiurnalProfile(0.8, 14.0, (-8, 1, 9), start)),
        "replay": lambda: Workload(rep, s, n_regions=2, region_shares=[0.25, 0.75], seed=11, block_s=5.0,
                                   diurnal=DiurnalProfile(0.3, 14.0, (-8, 9), start)),
    }


@pytest.mark.parametrize("kind", ["poisson", "gamma-diurnal", "replay"])
def test_chunking_invariance(kind):
    make = _workloads()[kind]
    whole = make().arrivals_between(0.0, 200.0)
    assert len(whole) > 1000
    assert np.all(np.diff(whole.arrival_s) >= 0)
    rng = np.random.default_rng(0)
    edges = np.concatenate([[0.0], np.sort(rng.uniform(0, 200, 60)), [200.0]])
    assert same(chunked(make(), edges), whole)
    assert same(chunked(make(), np.linspace(0.0, 200.0, 201)), whole)  # polling at 1 s
    # block boundaries themselves and out-of-order queries
    w = make()
    late = w.arrivals_between(100.0, 200.0)
    early = w.arrivals_between(0.0, 100.0)
    assert same(RequestBatch.concat([early, late]), whole)


def test_seed_determinism_and_memory_bound():
    s = FixedLengthSampler(5, 5)
    a = Workload(PoissonArrivals(), s, rate_per_s=10.0, seed=1).arrivals_between(0.0, 100.0)
    b = Workload(PoissonArrivals(), s, rate_per_s=10.0, seed=1).arrivals_between(0.0, 100.0)
    c = Workload(PoissonArrivals(), s, rate_per_s=10.0, seed=2).arrivals_between(0.0, 100.0)
    assert same(a, b) and not np.array_equal(a.arrival_s, c.arrival_s)
    w = Workload(PoissonArrivals(), s, rate_per_s=100.0, seed=1)
    total = 0
    for t in range(0, 86400, 600):  # a whole day, 10-min polling, never more than 2 blocks held
        total += len(w.arrivals_between(float(t), float(t + 600)))
        assert len(w._cache) <= 2
    assert abs(total - 100.0 * 86400) < 4 * math.sqrt(100.0 * 86400)


def test_arrivals_between_edge_cases():
    w = Workload(PoissonArrivals(), FixedLengthSampler(5, 5), rate_per_s=10.0, seed=1)
    assert len(w.arrivals_between(5.0, 5.0)) == 0
    b = w.arrivals_between(0.0, 10.0)
    assert b.origin.dtype == np.int64 and b.arrival_s.dtype == np.float64
    assert b.prompt_tokens.dtype == np.int64 and b.output_tokens.dtype == np.int64
    with pytest.raises(ConfigError):
        w.arrivals_between(-1.0, 3.0)
    with pytest.raises(ConfigError):
        w.arrivals_between(0.0, float("nan"))
    with pytest.raises(ConfigError, match="trace"):
        Workload(PoissonArrivals(), None, rate_per_s=1.0, replay_lengths=True)
    with pytest.raises(ConfigError):
        TraceReplayArrivals(np.array([1.0]))
