"""The two ends of a measurement window (issue 40, item 4): what the simulator says each request
in flight still has to do, at least (``Simulator.work_ahead``, for the work a window carries in)
and at most (``Simulator.work_left``, for the work it leaves at its end), what a window run
records of them (``carry_in_*``, ``left_*``), and what the bound does with them
(``eval.bound.carry_in_engine_s``, ``eval.bound.left_engine_s``)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from carbon_gym.episode import EpisodeTally
from eval.bound import _engine_seconds, bound_for_spec, iteration_k_max, left_engine_s
from eval.runner import RunSpec, largest_window_left, least_carry_in, run_one
from test_sim_equivalence import CONFIGS
from test_sim_fixtures import drive, make_sim, random_workload


def test_a_request_in_transit_has_all_its_work_ahead_and_a_finished_one_none():
    sim = make_sim()
    rid = sim.submit(0, 0.0, 100, 20, 1)  # to the other region's datacenter: tens of ms in transit
    sim.advance_to(0.001)
    np.testing.assert_array_equal(sim.work_ahead(), [[rid, 100, 19, 100]])
    sim.run_until_idle()
    assert sim.work_ahead().shape == (0, 4)


def _truth(sim) -> dict[int, tuple[int, int, bool]]:
    """Step mode: {request id: (output tokens still to sample, prompt tokens still to prefill,
    decoding)} of every request on an engine, from its explicit counters (the iteration in
    progress included: it ends after now)."""
    out = {}
    for dc in sim.datacenters:
        for e in dc.engines:
            for r in list(e.running.values()) + list(e.waiting):
                out[r.rid] = (r.output_tokens - r.generated, 0 if r.decoding else r.prefill_len - r.prefilled, bool(r.decoding))
    return out


@pytest.mark.parametrize("cfg", ["default", "starved", "unchunked", "tp2"])
def test_work_ahead_never_exceeds_what_is_left_and_the_fast_path_counts_no_more_than_step_mode(cfg):
    """Halfway through a random workload (preemptions in the starved case), every row of both
    paths is at most what the request still has to do (step mode's counters): decode tokens after
    the first sample, prompt tokens; the fast path (a decode run in progress counted as done)
    credits no more decode tokens than step mode (one iteration in progress), the same prompt
    tokens, and both name the same requests."""
    rng = np.random.default_rng(7)
    wl = random_workload(rng, 300, CONFIGS[cfg].get("n_dc", 2), 40.0, 400, 200)
    mid = float(wl["send_s"][150])
    rows = []
    for step in (False, True):
        sim = make_sim(**CONFIGS[cfg], step_mode=step)
        drive(sim, {k: v[:151] for k, v in wl.items()}, until_s=mid)
        rows.append(sim.work_ahead())
        if step:
            truth = _truth(sim)
    fast, slow = rows
    np.testing.assert_array_equal(fast[:, 0], slow[:, 0])
    assert len(truth) > 20 and set(truth) <= set(slow[:, 0].tolist())
    for rid, pre, dec, ctx in slow:
        if rid not in truth:  # in transit: all of it ahead
            continue
        left_out, left_pre, decoding = truth[rid]
        assert pre <= left_pre and dec <= max(0, left_out - (0 if decoding else 1)) and ctx >= 1
    assert (fast[:, 2] <= slow[:, 2]).all() and (fast[:, 1] == slow[:, 1]).all()
    assert slow[:, 2].sum() > 0 and slow[:, 1].sum() > 0


def test_window_credits_the_carried_work_and_the_bound_stays_below_the_run():
    """A 4 s window after a 20 s burn-in, so that the requests in flight when it opens are much
    of its work: the run records the carried-in work it finished (no more requests than it
    carried in), the bound with that credit is above the one without it and still below the
    run's window carbon (physical and SLO-true)."""
    over = (("duration_s", 24.0), ("env.measure", "window"), ("env.warmup_s", 20.0), ("workload.rate_per_s", 30.0))
    spec = RunSpec("dev", "rr", 0, overrides=over, carbon_start=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = run_one(spec).metrics
    assert 0 < m["carry_in_done"] <= m["backlog_start"]
    assert m["carry_in_decode_tokens"] > 0 and m["carry_in_samples"] >= m["carry_in_decode_tokens"]
    carry = least_carry_in(pd.DataFrame([m]))
    assert carry is not None and carry["carry_in_done"] == m["carry_in_done"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = bound_for_spec(spec, backlog_end=int(m["backlog_end"]))
        credited = bound_for_spec(spec, backlog_end=int(m["backlog_end"]), carry_in=carry)
    assert plain.active_g < credited.active_g and credited.floor_g == plain.floor_g
    assert credited.carbon_g <= m["carbon_g"]
    assert plain.slo_carbon_g < credited.slo_carbon_g <= m["carbon_g"]
    # the credit is the same grams in both figures
    assert credited.slo_active_g - plain.slo_active_g == pytest.approx(credited.active_g - plain.active_g, rel=1e-6)


def test_least_carry_in_is_the_least_of_each_figure_and_none_without_them():
    from carbon_gym.episode import CARRY_IN_METRICS

    a = {k: float(i + 1) for i, k in enumerate(CARRY_IN_METRICS)}
    b = {k: float(10 - i) for i, k in enumerate(CARRY_IN_METRICS)}
    got = least_carry_in(pd.DataFrame([a, b]))
    assert got == {k: min(a[k], b[k]) for k in CARRY_IN_METRICS}
    assert least_carry_in(pd.DataFrame([{"backlog_end": 3}])) is None
    assert least_carry_in(pd.DataFrame([a, {**b, "carry_in_samples": float("nan")}])) is None


def test_a_request_in_transit_has_all_its_work_left_and_the_bound_counts_it_whole():
    """Analytic: a request not yet at its datacenter has every prompt position and decode
    iteration left, and the window-end tally's engine-seconds equal the bound's for the whole
    request (the positions are counted as the bound counts them)."""
    from carbon_gym.world import build_parts

    sim = make_sim()
    sim.submit(0, 0.0, 700, 90, 1)
    sim.advance_to(0.001)
    w = sim.work_left()
    assert (w["prompt_left"].tolist(), w["decode_left"].tolist(), w["first_token_left"].tolist()) == ([700], [89], [1])
    left = EpisodeTally.window_left(sim)
    assert left["left_requests"] == 1 and left["left_samples"] == 90
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc = _scenario_dev()
    parts = build_parts(sc)
    lat, eng = parts.datacenter_gpus()[0].latency, parts.engine
    p, o = np.array([700.0]), np.array([90.0])
    k = iteration_k_max(sc, eng, p)
    assert left_engine_s(lat, k, left) == pytest.approx(float(_engine_seconds(lat, eng, p, o, k)[0].sum()), rel=1e-12)
    sim.run_until_idle()
    assert EpisodeTally.window_left(sim)["left_requests"] == 0


def _scenario_dev():
    from eval.runner import resolve_run_scenario

    return resolve_run_scenario(RunSpec("dev", "rr", 0, carbon_start=False))[0]


@pytest.mark.parametrize("cfg", ["default", "starved", "unchunked", "tp2"])
def test_work_left_is_what_step_mode_has_not_computed_and_the_fast_path_counts_no_less(cfg):
    """Halfway through a random workload: step mode's rows are exactly what its explicit
    counters have not computed (prompt positions before the first token, decode iterations
    after it; a preempted request's prompt counted as computed); the fast path (whose decode
    run in progress is not counted yet) leaves at least as many decode iterations and the same
    prompt positions, for the same requests."""
    rng = np.random.default_rng(11)
    wl = random_workload(rng, 300, CONFIGS[cfg].get("n_dc", 2), 40.0, 400, 200)
    mid = float(wl["send_s"][150])
    got = []
    for step in (False, True):
        sim = make_sim(**CONFIGS[cfg], step_mode=step)
        drive(sim, {k: v[:151] for k, v in wl.items()}, until_s=mid)
        got.append(sim.work_left())
        if step:
            truth = {r.rid: r for dc in sim.datacenters for e in dc.engines for r in list(e.running.values()) + list(e.waiting)}
    fast, slow = got
    np.testing.assert_array_equal(fast["request_id"], slow["request_id"])
    assert len(truth) > 20
    for i, rid in enumerate(slow["request_id"].tolist()):
        r = truth.get(rid)
        if r is None:  # in transit
            assert slow["prompt_left"][i] == slow["prompt_tokens"][i] and slow["first_token_left"][i] == 1
            continue
        assert slow["first_token_left"][i] == (r.generated == 0)
        assert slow["decode_left"][i] == (r.output_tokens - r.generated if r.generated else r.output_tokens - 1)
        assert slow["prompt_left"][i] == (0 if r.generated else r.prompt_tokens - r.prefilled)
    assert (fast["decode_left"] >= slow["decode_left"]).all() and (fast["prompt_left"] == slow["prompt_left"]).all()
    assert slow["decode_left"].sum() > 0 and slow["prompt_left"].sum() > 0


@pytest.mark.parametrize("rate", [30.0, 80.0])
def test_window_end_work_left_tightens_the_bound_and_it_stays_below_the_run(rate):
    """A 20 s window after a 20 s burn-in, at a load the cluster serves (30/s) and one it does
    not (80/s: requests pile up unplaced): with what the run left at the end (the unplaced whole,
    the placed by the work they had not computed) both figures are above the whole-request
    allowance's and still below the run's window carbon."""
    over = (("duration_s", 40.0), ("env.measure", "window"), ("env.warmup_s", 20.0), ("workload.rate_per_s", rate))
    spec = RunSpec("dev", "rr", 0, overrides=over, carbon_start=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = run_one(spec).metrics
    left = largest_window_left(pd.DataFrame([m]))
    assert left is not None and left["left_requests"] + left["backlog_end_unplaced"] == m["backlog_end"]
    assert (left["backlog_end_unplaced"] > 0) == (rate > 50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = bound_for_spec(spec, backlog_end=int(m["backlog_end"]))
        tight = bound_for_spec(spec, backlog_end=int(m["backlog_end"]), window_left=left)
    assert plain.active_g < tight.active_g and tight.carbon_g <= m["carbon_g"]
    assert plain.slo_carbon_g < tight.slo_carbon_g <= m["carbon_g"]
