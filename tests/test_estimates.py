"""The schedulers' per-request TTFT / TPOT estimates and their error against the simulator
(solvers/estimates.py, eval/estimate_error.py; issue 40 item 1)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

from eval.estimate_error import ERROR_METRICS, error_metrics, estimate_errors
from solvers.estimates import EstimateLog, placed_estimates
from solvers.problem import PlacementProblem


def _problem() -> PlacementProblem:
    """3 requests (slot order = oldest first), 2 datacenters of 2 engines; hand-checkable numbers."""
    return PlacementProblem(
        origin=np.array([0, 1, 0]), prompt_tokens=np.array([1000.0, 2000.0, 500.0]), output_tokens=np.array([10.0, 10.0, 10.0]),
        waited_s=np.array([0.5, 0.3, 0.1]), network_s=np.array([[0.01, 0.2], [0.2, 0.01], [0.01, 0.2]]),
        allowed=np.ones((3, 2), dtype=bool), carbon_g_per_kwh=np.array([100.0, 300.0]), pue=np.array([1.1, 1.1]),
        up=np.array([True, True]), n_engines=np.array([2, 2]), busy_engines=np.array([1, 2]),
        running=np.array([3.0, 8.0]), queue_len=np.array([1.0, 0.0]), free_kv_tokens=np.array([1e6, 1e6]),
        est_queue_wait_s=np.array([0.05, 0.0]), prefill_s_per_token=np.array([1e-4, 2e-4]),
        tpot_now_s=np.array([0.02, 0.03]), tpot_idle_s=np.array([0.012, 0.012]), tpot_slope_s_per_seq=np.array([0.001, 0.002]),
        prefill_fixed_s=np.array([0.02, 0.03]),
    )


def test_placed_estimates_by_hand() -> None:
    p = _problem()
    ttft, tpot = placed_estimates(p, np.array([0, 1, 0]))
    # r0 at d0: 0.5 + 0.01 + W0 0.05 + f 0.02 + 1000 x 1e-4, nobody older at d0
    assert ttft[0] == pytest.approx(0.5 + 0.01 + 0.05 + 0.02 + 0.1, abs=1e-12)
    # r1 at d1: alone there
    assert ttft[1] == pytest.approx(0.3 + 0.01 + 0.0 + 0.03 + 0.4, abs=1e-12)
    # r2 at d0 waits behind r0's 1000 prompt tokens spread over 2 engines: 1000 x 1e-4 / 2
    assert ttft[2] == pytest.approx(0.1 + 0.01 + 0.05 + 0.02 + 0.05 + 0.05, abs=1e-12)
    # TPOT: tpot_base = tpot_now - slope (batch per busy engine - 1); d0: 0.02 - 0.001 x 2 = 0.018,
    # batch after = (3 running + 1 queued + 2 placed) / 2 engines = 3 -> 0.018 + 0.001 x 2
    assert tpot[0] == tpot[2] == pytest.approx(0.020, abs=1e-12)
    # d1: base 0.03 - 0.002 x 3 = 0.024, after (8 + 0 + 1) / 2 = 4.5 -> 0.024 + 0.002 x 3.5
    assert tpot[1] == pytest.approx(0.031, abs=1e-12)


def test_deferred_requests_have_no_estimate() -> None:
    p = _problem()
    ttft, tpot = placed_estimates(p, np.array([2, 0, 2]))  # D = 2 defers
    assert np.isnan(ttft[[0, 2]]).all() and np.isnan(tpot[[0, 2]]).all()
    # r1 alone at d0: nobody older placed there (r0 deferred)
    assert ttft[1] == pytest.approx(0.3 + 0.2 + 0.05 + 0.02 + 0.2, abs=1e-12)
    log = EstimateLog()
    log.record(p, np.array([2, 0, 2]), np.array([1.0, 2.0, 3.0]), p.origin)
    assert len(log) == 1 and log.to_dict()["arrival_s"].tolist() == [2.0]


def test_join_keeps_last_estimate_and_resolves_arrival_ties() -> None:
    est = {"arrival_s": np.array([1.0, 1.0, 2.0, 1.0]), "origin": np.array([0, 1, 0, 0]),
           "datacenter": np.array([0, 0, 1, 1]), "decided_s": np.zeros(4),
           "ttft_estimate_s": np.array([0.5, 0.7, 0.9, 0.6]), "tpot_estimate_s": np.array([0.02, 0.03, 0.04, 0.05])}
    # request (1.0, 0) was placed twice (re-queued): its last estimate (0.6, 0.05) counts
    rec = {"arrival_s": np.array([2.0, 1.0, 1.0, 0.5]), "origin": np.array([0, 1, 0, 3]),
           "ttft_s": np.array([1.0, 1.0, 1.0, 1.0]), "tpot_s": np.array([0.04, 0.04, 0.04, 0.04])}
    err = estimate_errors(est, rec)
    assert sorted(np.round(err["ttft_error_s"], 12).tolist()) == [-0.4, -0.3, -0.1]
    assert sorted(np.round(err["tpot_error_s"], 12).tolist()) == [-0.01, 0.0, 0.01]
    m = error_metrics(err)
    assert set(m) == set(ERROR_METRICS)
    assert m["estimate_matched_pct"] == pytest.approx(75.0)  # (0.5, 3) was never estimated
    assert m["ttft_estimate_error_p50_ms"] == pytest.approx(-300.0)
    # a window drops earlier arrivals
    assert error_metrics(estimate_errors(est, rec, window_start_s=1.5))["estimate_matched_pct"] == 100.0


def test_run_reports_the_milp_estimate_error() -> None:
    from eval.runner import RunSpec, run_one

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        milp = run_one(RunSpec("dev", "milp", 1), keep_requests=False).metrics
        rr = run_one(RunSpec("dev", "rr", 1)).metrics
    assert milp["estimate_matched_pct"] == 100.0  # every completion was placed by the MILP
    q = [milp[f"ttft_estimate_error_p{p}_ms"] for p in (1, 10, 50, 90, 99)]
    assert q == sorted(q) and q[0] < 0 < q[-1]
    assert all(abs(x) < 2000.0 for x in q)
    assert "ttft_estimate_error_p90_ms" not in rr  # rr (carbon_gym's own) plans with no latency model


def test_eval_prints_the_estimate_error_line(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "eval", "eval", "--scenarios", "dev", "--policies", "milp",
                          "--seeds", "1", "--no-requests", "--no-plots", "--no-tensorboard", "--no-progress",
                          "--out", str(tmp_path / "e")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("dev milp (1 seeds):"))
    assert "ttft_estimate_error_p90_ms=" in line and "tpot_estimate_error_p99_ms=" in line
    assert (tmp_path / "e" / "estimate_error.md").read_text().count("| dev | milp | 1 |") == 1


def test_auto_margin_is_the_residual_quantile_of_its_own_completions() -> None:
    from solvers.base import DEFAULT_TTFT_MARGIN, MARGIN_MAX_SHARE, MARGIN_MIN_SAMPLES, Scheduler

    s = Scheduler(ttft_margin="auto", margin_quantile=0.9)
    p = _problem()
    arrival = np.array([10.0, 11.0, 12.0])
    s.estimate_log.record(p, np.array([0, 1, 0]), arrival, p.origin)
    ttft_est, _ = placed_estimates(p, np.array([0, 1, 0]))
    res = s.estimate_log.observe(arrival[::-1], p.origin[::-1], ttft_est[::-1] + np.array([0.3, 0.2, 0.1]))
    assert sorted(np.round(res, 12).tolist()) == [0.1, 0.2, 0.3]
    assert s.estimate_log.observe(arrival, p.origin, ttft_est).size == 0  # each completion counts once
    # too few residuals: the fractional default
    assert s.ttft_margin_s(2.0) == DEFAULT_TTFT_MARGIN * 2.0
    # enough: the quantile of the most recent window, clipped to [0, MARGIN_MAX_SHARE x target]
    s._residuals[:MARGIN_MIN_SAMPLES] = np.linspace(-1.0, 1.0, MARGIN_MIN_SAMPLES)
    s._n_residuals = MARGIN_MIN_SAMPLES
    assert s.ttft_margin_s(2.0) == pytest.approx(np.quantile(np.linspace(-1.0, 1.0, MARGIN_MIN_SAMPLES), 0.9))
    s._residuals[:MARGIN_MIN_SAMPLES] = 5.0
    assert s.ttft_margin_s(2.0) == MARGIN_MAX_SHARE * 2.0
    s._residuals[:MARGIN_MIN_SAMPLES] = -5.0
    assert s.ttft_margin_s(2.0) == 0.0
    assert Scheduler(ttft_margin=0.1).ttft_margin_s(2.0) == pytest.approx(0.2)


@pytest.mark.parametrize("kw, field", [({"ttft_margin": "sometimes"}, "ttft_margin"), ({"ttft_margin": 1.0}, "ttft_margin"),
                                       ({"margin_quantile": 1.0}, "margin_quantile"), ({"margin_quantile": "x"}, "margin_quantile")])
def test_bad_margins_are_named(kw, field) -> None:
    from carbon_gym.errors import ConfigError
    from solvers.base import Scheduler

    with pytest.raises(ConfigError, match=field):
        Scheduler(**kw)


def test_milp_with_the_auto_margin_reports_it() -> None:
    from eval.runner import RunSpec, run_one

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = run_one(RunSpec("dev", "milp", 1, overrides=(("duration_s", 120.0),), policy_kwargs=(("ttft_margin", "auto"),)),
                    keep_requests=False).metrics
        fixed = run_one(RunSpec("dev", "milp", 1, overrides=(("duration_s", 120.0),)), keep_requests=False).metrics
    assert 0.0 <= m["policy_ttft_margin_mean_s"] <= m["policy_ttft_margin_max_s"] <= 0.9 * 2.0
    # a measured margin, not the fractional default (0.5 s of the dev scenario's 2 s target)
    assert m["policy_ttft_margin_mean_s"] != pytest.approx(0.5)
    assert "policy_ttft_margin_mean_s" not in fixed
