"""End-to-end tests of the evaluation runner and backends on the dev scenario (real env + simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from eval import backends, runner, tables
from eval.runner import RunSpec


@pytest.fixture(scope="module")
def dev_runs():
    specs = [RunSpec("dev", p, s) for p in ("rr", "clairvoyant") for s in (0, 1)]
    return backends.run_matrix(specs, workers=1, progress=False)


def test_records_are_consistent_with_episode_metrics(dev_runs):
    for r in dev_runs:
        m, steps, req = r.metrics, r.steps, r.requests
        # every completed request has a record; the cumulative step carbon ends at the episode total
        assert len(req["request_id"]) == m["requests_completed"] == m["requests_arrived"] > 300
        assert steps["cumulative_carbon_g"][-1] == pytest.approx(m["carbon_g"], rel=1e-12)
        dc_cols = [k for k in steps if k.startswith("carbon_g_dc")]
        assert len(dc_cols) == 2
        per_dc = sum(steps[k].sum() for k in dc_cols)
        assert per_dc + r.meta["reset_carbon_g"] == pytest.approx(m["carbon_g"], rel=1e-9)
        assert steps["completed"].sum() == m["requests_completed"]
        # percentiles recomputed from the per-request records
        assert np.percentile(req["ttft_s"], 99) == pytest.approx(m["ttft_p99_s"], rel=1e-12)
        viol = (req["ttft_s"] > r.meta["ttft_target_s"]) | (req["tpot_s"] > r.meta["tpot_target_s"])
        assert 100.0 * viol.mean() == pytest.approx(m["slo_violation_pct"], abs=1e-12)
        assert m["steps"] == len(steps["step"]) == 60


def test_common_random_numbers_and_sampled_starts(dev_runs):
    by = {(r.spec.policy, r.spec.seed): r for r in dev_runs}
    for s in (0, 1):
        rr, cv = by[("rr", s)], by[("clairvoyant", s)]
        assert rr.meta["start_utc"] == cv.meta["start_utc"]  # same carbon for every policy
        assert rr.metrics["requests_arrived"] == cv.metrics["requests_arrived"]  # same workload
        a = np.sort(rr.requests["arrival_s"])
        b = np.sort(cv.requests["arrival_s"])
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(rr.steps["intensity_g_per_kwh_dc0"], cv.steps["intensity_g_per_kwh_dc0"])
    assert by[("rr", 0)].meta["start_utc"] != by[("rr", 1)].meta["start_utc"]
    # the start is the sampled offset into the packaged 2023 trace
    assert by[("rr", 0)].meta["carbon_offset_s"] == runner.episode_start_offset_s("dev", 0, period_s=8760 * 3600.0)


def test_clairvoyant_fills_the_cleanest_datacenter(dev_runs):
    # dev: Frankfurt (DE, ~370 g/kWh) vs Paris (FR, ~50 g/kWh), 8 req/s on 8 engines each: all of it
    # fits in FR's capacity, so the clairvoyant policy sends everything there and beats rr.
    for r in dev_runs:
        if r.spec.policy != "clairvoyant":
            continue
        fr = r.meta["datacenters"].index("fr")
        assert r.meta["dc_placed"][fr] == r.metrics["requests_arrived"]
    runs = tables.runs_table(dev_runs)
    red = runs[runs.policy == "clairvoyant"]["reduction_vs_rr_pct"]
    assert (red > 10).all()


def test_clairvoyant_twin_workload_matches_env():
    from eval.clairvoyant import ClairvoyantPolicy

    env = runner.make_env(runner.resolve_run_scenario(RunSpec("dev", "clairvoyant", 3))[0])
    pol = ClairvoyantPolicy()
    obs, info = env.reset(seed=3)
    pol.reset(env)
    for _ in range(10):
        obs, _, _, _, info = env.step(pol.act(obs, info))
    assert pol.mismatches == 0
    assert pol.batch >= 1 and np.all((0 < pol.t_decode_per_token_s) & (pol.t_decode_per_token_s < 0.05))
