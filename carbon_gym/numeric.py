"""Floating-point sums that give the same float on every machine.

numpy hands a 1-D float64 ``a @ b`` (and ``np.dot``) to its BLAS (OpenBLAS in numpy's wheels),
which picks a kernel for the CPU when it loads (``DYNAMIC_ARCH``: Prescott, Haswell, SkylakeX,
Zen, ...). The kernels accumulate in different orders (2, 4 or 8 partial sums, FMA or not), so
the same dot product differs in its last bits from one machine to the next. Where such a sum
decides something (which incumbent a solver keeps) or is reported exactly (a golden figure),
:func:`exact_dot` is used instead: the products rounded one by one (IEEE multiplication, the
same everywhere) and summed exactly by :func:`math.fsum`, which rounds once. numpy's own
reductions (``sum``, ``cumsum``, ``mean``, ``percentile``) use a fixed pairwise order and need no
such care (``tests/test_reproducible.py`` checks both under several OpenBLAS kernels).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["episode_steps", "exact_dot"]


def exact_dot(a: np.ndarray, b: np.ndarray) -> float:
    """``sum(a[i] * b[i])`` correctly rounded, independent of the BLAS and the CPU (same units as
    ``a * b``). ``a`` and ``b`` are 1-D and of one length (a ValueError otherwise)."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"exact_dot: needs two 1-D arrays of one length, got shapes {x.shape} and {y.shape}")
    return math.fsum((x * y).tolist())


def episode_steps(duration_s: float, polling_period_s: float) -> int:
    """Decisions in an episode of ``duration_s`` seconds polled every ``polling_period_s``
    seconds: ceil(duration / period) (at least 1; a duration within 1e-9 periods of a multiple
    counts as that multiple). The env's length and its Gymnasium ``max_episode_steps``."""
    return max(1, int(math.ceil(float(duration_s) / float(polling_period_s) - 1e-9)))
