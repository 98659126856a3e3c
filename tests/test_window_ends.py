"""The end of a measurement window (issue 40, item 4): what the simulator says each request in
flight has not computed yet, an upper count (``Simulator.work_left``), what a window run records
of it (``left_*``, ``requests_unplaced``), and what the bound does with it
(``eval.bound.left_engine_s``: the unplaced undone whole, the placed by their work not computed)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from carbon_gym.episode import EpisodeTally
from eval.bound import _engine_seconds, bound_for_spec, iteration_k_max, left_engine_s
from eval.runner import RunSpec, largest_window_left, run_one
from test_sim_equivalence import CONFIGS
from test_sim_fixtures import drive, make_sim, random_workload


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


@pytest.mark.parametrize("policy, rate, control", [("rr", 30.0, "always_on"), ("rr", 80.0, "always_on"), ("milp", 30.0, "agent")])
def test_window_end_work_left_tightens_the_bound_and_it_stays_below_the_run(policy, rate, control):
    """A 20 s window after a 20 s burn-in, at a load the cluster serves (30/s) and one it does
    not (80/s: requests pile up unplaced), and with the MILP powering servers off (the capacity
    bound): with what the run left at the end (the unplaced whole, the placed by the work they
    had not computed) both figures are above the whole-request allowance's and still below the
    run's window carbon."""
    over = (("capacity.control", control), ("duration_s", 40.0), ("env.measure", "window"), ("env.warmup_s", 20.0),
            ("workload.rate_per_s", rate))
    spec = RunSpec("dev", policy, 0, overrides=over, carbon_start=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = run_one(spec).metrics
    left = largest_window_left(pd.DataFrame([m]))
    assert left is not None and left["left_requests"] + left["requests_unplaced"] == m["backlog_end"]
    assert (left["requests_unplaced"] > 0) == (rate > 50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = bound_for_spec(spec, backlog_end=int(m["backlog_end"]))
        tight = bound_for_spec(spec, backlog_end=int(m["backlog_end"]), window_left=left)
    assert plain.active_g < tight.active_g and tight.carbon_g <= m["carbon_g"]
    assert plain.slo_carbon_g < tight.slo_carbon_g <= m["carbon_g"]


def test_largest_window_left_is_the_largest_of_each_figure_and_none_without_them():
    from carbon_gym.episode import LEFT_METRICS

    cols = ["requests_unplaced", *LEFT_METRICS]
    a = {k: float(i + 1) for i, k in enumerate(cols)}
    b = {k: float(10 - i) for i, k in enumerate(cols)}
    assert largest_window_left(pd.DataFrame([a, b])) == {k: max(a[k], b[k]) for k in cols}
    assert largest_window_left(pd.DataFrame([{"backlog_end": 3}])) is None  # a run from before the figures
    assert largest_window_left(pd.DataFrame([a, {**b, "left_samples": float("nan")}])) is None
