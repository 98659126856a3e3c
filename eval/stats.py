"""Statistics of the evaluation: 95% Student-t intervals, percentiles, paired differences.

Every table of :mod:`eval` averages over seeds with these (``*_ci95`` columns are the
half-widths of the 95% t-interval of the mean).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

__all__ = ["t_critical_95", "mean_ci95", "percentile", "paired_difference"]

# Two-sided 95% Student-t critical values for df = 1..30.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)


def t_critical_95(df: int) -> float:
    """Two-sided 95% critical value of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        return float("nan")
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.959963984540054
    # Cornish-Fisher expansion; error < 1e-4 for df > 30.
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(values: Iterable[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% t-interval of the mean (NaN half-width for n < 2).

    NaN entries are ignored (e.g. a latency percentile of a run with no completed request).
    """
    x = np.asarray([v for v in values], dtype=np.float64)
    x = x[np.isfinite(x)]
    n = x.size
    if n == 0:
        return float("nan"), float("nan")
    m = float(x.mean())
    if n < 2:
        return m, float("nan")
    sd = float(x.std(ddof=1))
    return m, t_critical_95(n - 1) * sd / math.sqrt(n)


def percentile(x: np.ndarray, q: float) -> float:
    """``np.percentile`` (linear) that returns NaN for an empty array."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.percentile(x, q)) if x.size else float("nan")


def paired_difference(runs, scenario_col: str, a: str, b: str, metric: str) -> tuple[float, float, int]:
    """Mean and 95% CI half-width over seeds of ``metric[a] - metric[b]`` (same scenario+seed)."""
    ra = runs[runs["policy"] == a].set_index([scenario_col, "seed"])[metric]
    rb = runs[runs["policy"] == b].set_index([scenario_col, "seed"])[metric]
    common = ra.index.intersection(rb.index)
    diff = (ra.loc[common] - rb.loc[common]).to_numpy(np.float64)
    m, ci = mean_ci95(diff)
    return m, ci, int(np.isfinite(diff).sum())
