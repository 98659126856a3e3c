"""Correct the latency model end to end from real serving benchmarks.

Input: vLLM ``benchmark_serving.py`` / ``vllm bench serve --save-result [--save-detailed]`` JSON
files, one per request rate (per-request input / output lengths, TTFT, inter-token latencies).
Each run is replayed through a one-node simulation (:mod:`calibration.replay`) with the same
lengths at the same rate; the per-iteration framework overhead ``overhead_s`` (the one latency
term a kernel profile cannot see) is then chosen by a bounded 1-D minimisation of the mean
absolute percentage error of the mean TTFT and mean TPOT over the rates. Everything else in the
parameter file stays as fitted from the kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from carbon_gym.errors import ConfigError

from .io import BenchResult
from .profile_fit import sig
from .replay import ReplayFn, ReplayResult, ReplaySetup, arrival_times, simulate

METRICS = ("both", "ttft", "tpot")


@dataclass(frozen=True)
class RateComparison:
    """Measured vs simulated means of one benchmark run (seconds, joules)."""

    rate: float
    requests: int
    ref_ttft_s: float
    sim_ttft_s: float
    ref_tpot_s: float
    sim_tpot_s: float
    ref_energy_j: float | None
    sim_energy_j: float

    @staticmethod
    def _ape(sim: float, ref: float | None) -> float:
        if ref is None or not (ref > 0):
            return float("nan")
        return abs(sim - ref) / ref * 100.0

    @property
    def ttft_ape_pct(self) -> float:
        """Absolute percentage error of the mean TTFT."""
        return self._ape(self.sim_ttft_s, self.ref_ttft_s)

    @property
    def tpot_ape_pct(self) -> float:
        """Absolute percentage error of the mean TPOT."""
        return self._ape(self.sim_tpot_s, self.ref_tpot_s)

    @property
    def energy_ape_pct(self) -> float:
        """Absolute percentage error of the GPU energy (NaN without a reference energy)."""
        return self._ape(self.sim_energy_j, self.ref_energy_j)


def ref_means(result: BenchResult) -> tuple[float, float]:
    """Mean TTFT and mean TPOT (requests with > 1 output token) of a benchmark run, seconds."""
    m = result.output_lens > 1
    return float(np.mean(result.ttfts_s)), float(np.mean(result.tpots_s[m])) if np.any(m) else 0.0


def replay_result(setup: ReplaySetup, result: BenchResult, seed: int, index: int,
                  replay: ReplayFn = simulate) -> ReplayResult:
    """Replay one benchmark run (arrivals regenerated with ``SeedSequence(seed, spawn_key=(index,))``)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
    arr = arrival_times(len(result.input_lens), result.request_rate, rng, result.burstiness)
    return replay(setup, arr, result.input_lens, result.output_lens)


def compare(setup: ReplaySetup, results: Sequence[BenchResult], seed: int = 0,
            replay: ReplayFn = simulate) -> list[RateComparison]:
    """Replay every run and compare its mean TTFT, TPOT and (if recorded) GPU energy."""
    rows = []
    for i, r in enumerate(results):
        sim = replay_result(setup, r, seed, i, replay)
        ttft, tpot = ref_means(r)
        rows.append(RateComparison(r.request_rate, len(r.input_lens), ttft, sim.mean_ttft_s(), tpot,
                                   sim.mean_tpot_s(), r.gpu_energy_j, sim.gpu_energy_j))
    return rows


def objective(rows: Sequence[RateComparison], metric: str = "both") -> float:
    """Mean over rates of the TTFT and/or TPOT absolute percentage errors."""
    if metric == "ttft":
        v = [r.ttft_ape_pct for r in rows]
    elif metric == "tpot":
        v = [r.tpot_ape_pct for r in rows]
    else:
        v = [0.5 * (r.ttft_ape_pct + r.tpot_ape_pct) for r in rows]
    return float(np.nanmean(v))


def minimize_bounded(f: Callable[[float], float], lo: float, hi: float, points: Sequence[int] = (21, 11, 11, 11)) -> float:
    """Minimise ``f`` on [lo, hi] by a zooming grid search.

    Level ``k`` evaluates ``points[k]`` evenly spaced values in the current window and narrows the
    window to one grid step either side of the best. Replayed errors are piecewise smooth with
    small jumps (batch composition changes discretely with the latency), which trap bracketing
    methods such as golden section in a local dip; a grid over the window does not.
    """
    best_x, best_f = lo, math.inf
    a, b = lo, hi
    for n in points:
        xs = np.linspace(a, b, n)
        for x in xs:
            fx = f(float(x))
            if fx < best_f:
                best_x, best_f = float(x), fx
        step = (b - a) / (n - 1)
        a, b = max(lo, best_x - step), min(hi, best_x + step)
    return best_x


@dataclass
class ServingFit:
    """Result of :func:`fit_overhead`: the corrected overhead and the errors before / after."""

    overhead_s: float
    before: list[RateComparison]
    after: list[RateComparison]
    metric: str


def fit_overhead(setup: ReplaySetup, results: Sequence[BenchResult], seed: int = 0, lo_s: float = 0.0,
                 hi_s: float = 0.02, metric: str = "both", replay: ReplayFn = simulate) -> ServingFit:
    """Choose ``overhead_s`` in [lo_s, hi_s] minimising the TTFT/TPOT error over the runs."""
    if metric not in METRICS:
        raise ConfigError("metric", f"unknown value {metric!r}", allowed=METRICS)
    if not results:
        raise ConfigError("results", "need at least one benchmark result")
    if not (0 <= lo_s < hi_s):
        raise ConfigError("overhead bounds", f"need 0 <= lo < hi, got {lo_s}, {hi_s}")
    cache: dict[float, list[RateComparison]] = {}

    def rows_for(x: float) -> list[RateComparison]:
        if x not in cache:
            cache[x] = compare(setup.with_latency(replace(setup.latency, overhead_s=x)), results, seed, replay)
        return cache[x]

    before = compare(setup, results, seed, replay)
    best = minimize_bounded(lambda x: objective(rows_for(x), metric), lo_s, hi_s)
    best = sig(best)
    return ServingFit(best, before, rows_for(best), metric)


def comparison_lines(rows: Sequence[RateComparison], title: str = "") -> list[str]:
    """Table of measured vs simulated means and their errors per rate, with the overall MAPE."""
    lines = [title] if title else []
    lines.append(f"  {'rate':>6s}{'reqs':>7s}{'TTFT_ref_ms':>13s}{'TTFT_sim_ms':>13s}{'err_%':>7s}"
                 f"{'TPOT_ref_ms':>13s}{'TPOT_sim_ms':>13s}{'err_%':>7s}{'E_ref_kJ':>10s}{'E_sim_kJ':>10s}{'err_%':>7s}")
    for r in rows:
        e_ref = f"{r.ref_energy_j / 1e3:10.2f}" if r.ref_energy_j is not None else f"{'-':>10s}"
        lines.append(f"  {r.rate:>6.2f}{r.requests:>7d}{r.ref_ttft_s * 1e3:>13.2f}{r.sim_ttft_s * 1e3:>13.2f}"
                     f"{r.ttft_ape_pct:>7.2f}{r.ref_tpot_s * 1e3:>13.2f}{r.sim_tpot_s * 1e3:>13.2f}{r.tpot_ape_pct:>7.2f}"
                     f"{e_ref}{r.sim_energy_j / 1e3:>10.2f}{r.energy_ape_pct:>7.2f}")
    lines.append(overall_line(rows))
    return lines


def overall_line(rows: Sequence[RateComparison]) -> str:
    """``MAPE overall: TTFT x%, TPOT y%, energy z%`` (mean of the per-rate errors)."""
    def m(v: list[float]) -> str:
        v = [x for x in v if not math.isnan(x)]
        return f"{np.mean(v):.2f}%" if v else "n/a"
    return (f"  MAPE overall ({len(rows)} rates): TTFT {m([r.ttft_ape_pct for r in rows])}, "
            f"TPOT {m([r.tpot_ape_pct for r in rows])}, energy {m([r.energy_ape_pct for r in rows])}")
