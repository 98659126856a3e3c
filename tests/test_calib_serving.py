"""End-to-end correction from serving benchmarks and the validation report."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from carbon_gym.physics.latency import load_latency_model
from carbon_gym.physics.power import load_power_model
from carbon_gym.specs import load_gpu_spec, load_model_spec
from calibration.io import load_bench_result
from calibration.replay import ReplayResult, ReplaySetup, arrival_times, simulate
from calibration.report import PROTOCOL_RATES, REQUESTS_PER_RATE, load_reference_dir, predict, protocol_runs, run_report
from calibration.serving_fit import compare, fit_overhead, minimize_bounded

DATA = Path(__file__).parent / "data"


def _setup(engines: int = 1, overhead_s: float | None = None) -> ReplaySetup:
    lat = load_latency_model("a100-80gb", "llama-3.1-8b", 1)
    if overhead_s is not None:
        lat = replace(lat, overhead_s=overhead_s)
    return ReplaySetup(load_model_spec("llama-3.1-8b"), load_gpu_spec("a100-80gb"), lat, load_power_model("a100-80gb"),
                       engines=engines)


def test_protocol_size():
    assert len(PROTOCOL_RATES) == 19 and PROTOCOL_RATES[0] == 2.0 and PROTOCOL_RATES[-1] == 50.0
    assert 19 * REQUESTS_PER_RATE >= 40_000


def test_arrivals_are_seeded_poisson():
    a = arrival_times(20000, 5.0, np.random.default_rng(1))
    b = arrival_times(20000, 5.0, np.random.default_rng(1))
    assert np.array_equal(a, b) and a[0] == 0.0
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(0.2, rel=0.03) and gaps.std() == pytest.approx(0.2, rel=0.05)
    assert np.all(arrival_times(5, float("inf"), np.random.default_rng(0)) == 0.0)


def test_lone_request_matches_latency_model():
    s = _setup()
    res = simulate(s, np.array([0.0]), np.array([1000]), np.array([50]))
    lat = s.latency
    # chunked prefill of 1000 tokens in one iteration (budget 2048), the first token sampled at its end
    want_ttft = lat.iteration_time_s(1000, 1000 * 1001 / 2, 0, 0.0, 1)
    assert res.ttft_s[0] == pytest.approx(want_ttft, rel=1e-9)
    # decode k (k = 0..48) attends the prompt, the k tokens before it and its own: 1001 + k
    steps = [lat.iteration_time_s(0, 0.0, 1, 1001.0 + k, 1) for k in range(49)]
    assert res.tpot_s[0] == pytest.approx(sum(steps) / 49, rel=1e-9)


def test_serving_fit_recovers_overhead(tmp_path):
    truth = _setup(overhead_s=0.0035)
    runs = protocol_runs((1.0, 4.0), 150, seed=3)
    predict(truth, runs, seed=5, write_dir=tmp_path)  # synthetic "measurements" made by the model itself
    refs = load_reference_dir(tmp_path)
    assert [r.request_rate for r in refs] == [1.0, 4.0] and refs[0].gpu_energy_j > 0
    fit = fit_overhead(_setup(), refs, seed=5)
    assert fit.overhead_s == pytest.approx(0.0035, rel=1e-2)
    assert max(r.tpot_ape_pct for r in fit.after) < 0.5 < max(r.tpot_ape_pct for r in fit.before)


def test_minimize_bounded_with_stub_replay():
    # a stub "simulator" whose TTFT/TPOT grow linearly with the overhead: the fit finds the exact value
    def replay(setup, arr, p, o):
        x = setup.latency.overhead_s
        n = len(arr)
        return ReplayResult(np.full(n, 0.1 + 3 * x), np.full(n, 0.001 + x), np.asarray(o), 100.0, 1.0)

    ref = load_bench_result(DATA / "vllm_bench_llama8b_rate4.json")
    ttft, tpot = float(np.mean(ref.ttfts_s)), float(np.mean(ref.tpots_s[ref.output_lens > 1]))
    fit = fit_overhead(_setup(), [ref], seed=0, metric="tpot", replay=replay)
    assert fit.overhead_s == pytest.approx(tpot - 0.001, abs=5e-6)  # final grid step 8e-6
    assert minimize_bounded(lambda x: (x - 0.3) ** 2, 0.0, 1.0) == pytest.approx(0.3, abs=1e-3)
    rows = compare(_setup(), [ref], replay=replay)
    assert rows[0].ref_ttft_s == pytest.approx(ttft) and rows[0].ref_energy_j is None
    assert np.isnan(rows[0].energy_ape_pct)


def test_report_against_own_predictions(tmp_path):
    setup = _setup(engines=2)
    lines = run_report(setup, None, rates=(2.0, 6.0), requests_per_rate=120, write_predictions=tmp_path / "ref")
    assert "no reference given" in lines[-1]
    assert len(list((tmp_path / "ref").glob("*.json"))) == 2
    lines = run_report(setup, tmp_path / "ref", plot_path=tmp_path / "r.png")
    text = "\n".join(lines)
    assert "MAPE overall (2 rates): TTFT 0.00%, TPOT 0.00%, energy 0.00%" in text
    assert (tmp_path / "r.png").stat().st_size > 1000
    # a different latency model shows up as a non-zero error
    worse = _setup(engines=2, overhead_s=0.004)
    text = "\n".join(run_report(worse, tmp_path / "ref"))
    assert "TPOT 0.00%" not in text
