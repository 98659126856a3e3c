"""Validation report: the study's protocol replayed through carbon_gym, against reference runs.

Protocol (the study's validation of its simulator against real vLLM): one node (8 engines of
Llama-3.1-8B on A100, TP 1), 19 Poisson arrival rates from 2 to 50 requests/s, at least 40,000
requests in total (``REQUESTS_PER_RATE`` = 2,200 per rate: 41,800), Azure LLM inference
conversation-trace lengths.

With a reference directory (one vLLM ``--save-result`` JSON per rate), each run is replayed with
its own request lengths at its own rate and the report gives the absolute percentage error of
the mean TTFT, the mean TPOT and (when the file carries ``gpu_energy_j``) the GPU energy, per rate
and overall (mean over rates), as a table and a PNG plot. Without one, it prints the simulator's
own predictions per rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from carbon_gym.errors import ConfigError, DataError

from .io import BenchResult, load_bench_result, write_bench_result
from .replay import ReplayFn, ReplaySetup, simulate
from .serving_fit import RateComparison, compare, comparison_lines, replay_result

PROTOCOL_RATES = tuple(float(x) for x in np.round(np.linspace(2.0, 50.0, 19), 4))
REQUESTS_PER_RATE = 2200
PROTOCOL_ENGINES = 8
LENGTHS = "azure-conv"


@dataclass(frozen=True)
class Prediction:
    """The simulator's means at one rate (no reference)."""

    rate: float
    requests: int
    ttft_s: float
    tpot_s: float
    p99_ttft_s: float
    p99_tpot_s: float
    gpu_energy_j: float
    makespan_s: float


def protocol_runs(rates: Sequence[float] = PROTOCOL_RATES, requests_per_rate: int = REQUESTS_PER_RATE,
                  seed: int = 0, lengths: str = LENGTHS, max_context_tokens: int | None = 32768) -> list[BenchResult]:
    """Request lengths of the protocol's runs (no measured values), one per rate, seeded."""
    from carbon_gym.workload import make_length_sampler

    sampler = make_length_sampler(lengths, max_context_tokens=max_context_tokens)
    runs = []
    for i, rate in enumerate(rates):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1000 + i,)))
        p, o = sampler.sample(rng, requests_per_rate)
        empty = np.zeros(len(p))
        runs.append(BenchResult(f"protocol@{rate}", float(rate), float("nan"), len(p), np.asarray(p, np.int64),
                                np.asarray(o, np.int64), empty, tuple(np.zeros(0) for _ in p)))
    return runs


def load_reference_dir(path: str | Path) -> list[BenchResult]:
    """Every ``*.json`` benchmark result in ``path``, sorted by request rate."""
    d = Path(path)
    if not d.is_dir():
        raise DataError(str(d), "reference directory not found")
    files = sorted(d.glob("*.json"))
    if not files:
        raise DataError(str(d), "no *.json benchmark results in the reference directory")
    return sorted((load_bench_result(f) for f in files), key=lambda r: r.request_rate)


def predict(setup: ReplaySetup, runs: Sequence[BenchResult], seed: int = 0, replay: ReplayFn = simulate,
            write_dir: str | Path | None = None) -> list[Prediction]:
    """Simulate every run; optionally write each as a vLLM-style result JSON into ``write_dir``.

    Written files carry per-request ``ttfts`` and, per request, ``itls`` as one element holding
    the sum of its inter-token latencies (what TPOT needs, without a list per token), plus the
    simulated ``gpu_energy_j``: they can serve as a reference directory for this report.
    """
    out = []
    for i, r in enumerate(runs):
        res = replay_result(setup, r, seed, i, replay)
        m = res.output_tokens > 1
        out.append(Prediction(r.request_rate, len(r.input_lens), res.mean_ttft_s(), res.mean_tpot_s(),
                              float(np.percentile(res.ttft_s, 99)),
                              float(np.percentile(res.tpot_s[m], 99)) if np.any(m) else 0.0,
                              res.gpu_energy_j, res.makespan_s))
        if write_dir is not None:
            d = Path(write_dir)
            d.mkdir(parents=True, exist_ok=True)
            itls = tuple(np.array([t * (n - 1)]) if n > 1 else np.zeros(0) for t, n in zip(res.tpot_s, res.output_tokens))
            sim_run = BenchResult(f"sim@{r.request_rate}", r.request_rate, res.makespan_s, len(r.input_lens),
                                  r.input_lens, r.output_lens, res.ttft_s, itls, res.gpu_energy_j, r.burstiness)
            write_bench_result(d / f"sim_rate_{r.request_rate:g}.json", sim_run, {"simulated_by": "carbon_gym"})
    return out


def prediction_lines(preds: Sequence[Prediction]) -> list[str]:
    """Table of the simulator's predictions per rate."""
    lines = [f"  {'rate':>6s}{'reqs':>7s}{'TTFT_ms':>10s}{'p99_TTFT':>10s}{'TPOT_ms':>9s}{'p99_TPOT':>10s}"
             f"{'GPU_kJ':>9s}{'span_s':>8s}"]
    for p in preds:
        lines.append(f"  {p.rate:>6.2f}{p.requests:>7d}{p.ttft_s * 1e3:>10.1f}{p.p99_ttft_s * 1e3:>10.1f}"
                     f"{p.tpot_s * 1e3:>9.2f}{p.p99_tpot_s * 1e3:>10.2f}{p.gpu_energy_j / 1e3:>9.1f}{p.makespan_s:>8.1f}")
    return lines


def plot_comparison(rows: Sequence[RateComparison], path: str | Path, title: str = "") -> Path | None:
    """PNG of reference vs simulated TTFT, TPOT and energy per rate; None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rates = [r.rate for r in rows]
    has_energy = any(r.ref_energy_j is not None for r in rows)
    panels = 3 if has_energy else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6))
    specs = [("mean TTFT (ms)", [r.ref_ttft_s * 1e3 for r in rows], [r.sim_ttft_s * 1e3 for r in rows],
              [r.ttft_ape_pct for r in rows]),
             ("mean TPOT (ms)", [r.ref_tpot_s * 1e3 for r in rows], [r.sim_tpot_s * 1e3 for r in rows],
              [r.tpot_ape_pct for r in rows])]
    if has_energy:
        specs.append(("GPU energy (kJ)", [(r.ref_energy_j or math.nan) / 1e3 for r in rows],
                      [r.sim_energy_j / 1e3 for r in rows], [r.energy_ape_pct for r in rows]))
    for ax, (label, ref, sim, err) in zip(np.atleast_1d(axes), specs):
        ax.plot(rates, ref, "o", label="reference")
        ax.plot(rates, sim, "-", label="carbon_gym")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        ax.set_title(f"MAPE {np.nanmean(err):.1f}%")
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_report(setup: ReplaySetup, reference_dir: str | Path | None = None, *, rates: Sequence[float] = PROTOCOL_RATES,
               requests_per_rate: int = REQUESTS_PER_RATE, seed: int = 0, plot_path: str | Path | None = None,
               write_predictions: str | Path | None = None, replay: ReplayFn = simulate) -> list[str]:
    """Run the validation protocol; returns the report's lines (see the module docstring)."""
    if requests_per_rate < 1:
        raise ConfigError("requests_per_rate", f"must be >= 1, got {requests_per_rate}")
    head = (f"validation: {setup.latency.name}, power {setup.power.name}, one node of {setup.engines} engine(s) "
            f"x TP{setup.tp}")
    if reference_dir is None:
        runs = protocol_runs(rates, requests_per_rate, seed)
        preds = predict(setup, runs, seed, replay, write_predictions)
        total = sum(p.requests for p in preds)
        return [head, f"protocol: {len(runs)} Poisson rates {min(rates):g}-{max(rates):g} req/s, {total} requests, "
                      f"{LENGTHS} lengths",
                *prediction_lines(preds),
                "no reference given (pass --reference DIR with one vLLM --save-result JSON per rate): "
                "these are the simulator's own predictions"]
    refs = load_reference_dir(reference_dir)
    rows = compare(setup, refs, seed, replay)
    lines = [head, f"reference: {reference_dir} ({len(refs)} runs, {sum(r.requests for r in rows)} requests)",
             *comparison_lines(rows)]
    if len(refs) < 19 or sum(r.requests for r in rows) < 40_000:
        lines.append(f"  note: the study's protocol has 19 rates and >= 40,000 requests; this reference has "
                     f"{len(refs)} rates and {sum(r.requests for r in rows)} requests")
    if plot_path is not None:
        p = plot_comparison(rows, plot_path, head)
        lines.append(f"plot: {p}" if p else "plot: skipped (matplotlib not installed)")
    return lines
