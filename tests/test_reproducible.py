"""The same numbers on every machine (issue 39): why the golden MILP cells drifted, and the fix.

The cause. On a fresh machine the golden ``milp`` cells differed in the last digits of
``policy_mip_gap_mean`` / ``_p95`` only. HiGHS is not the cause: it runs on one thread
(``FacilityConfig.threads = 1``, the ILPs and the MPC plan ``threads=1`` too, every instance
with ``random_seed = 0``), so its answers do not depend on the scheduling of threads. The cause
is numpy's BLAS: the MILP scored its candidate incumbents with ``cost @ x``, and numpy hands a
1-D float64 dot product to OpenBLAS, which chooses a kernel for the CPU when it loads
(``DYNAMIC_ARCH``: Prescott, Haswell, SkylakeX, Zen, ...). Each kernel sums in its own order
(2, 4 or 8 partial sums, FMA or not), so the objective of the same incumbent differed by an ulp
between an AVX-512 machine (the SkylakeX kernel, where the cells were pinned) and an AVX2 or
unknown-to-OpenBLAS one (the Haswell kernel, e.g. the AMD EPYC CI runner), and with it the
certified gap. ``OPENBLAS_CORETYPE`` forces a kernel, which reproduces the drift on one machine.
The same objectives choose between the LP rounding and the greedy incumbent, so a near tie could
have changed a decision too. The objectives are now summed by
:func:`carbon_gym.numeric.exact_dot` (products rounded one by one, then ``math.fsum``: one
rounding, the same float on any CPU), as is the one ``np.dot`` in ``carbon_gym``
(``SessionParams.mean_turns``). numpy's own reductions and basic arithmetic (``sum``, ``cumsum``,
``mean``, ``percentile``, ``+ - * /``, ``sqrt``) give the same bits whichever SIMD extensions
numpy dispatches to (checked below with ``NPY_DISABLE_CPU_FEATURES``); its transcendental ufuncs
do not: ``np.exp`` on the AVX-512 path differs from the AVX2 / scalar one in the last bit of
~5% of values (``log``, ``power``, ``tanh``, ``expm1`` too). The one the simulation used, the
carbon forecast's log-normal error (``CarbonForecaster.forecast``), now takes ``math.exp`` (the C
library's, which numpy's dispatch does not touch); the rest of ``carbon_gym`` and ``solvers``
calls none of them on arrays. The full golden matrix (429 cells) is bit-identical with numpy's
AVX-512 paths off and under the SkylakeX, Haswell and Prescott OpenBLAS kernels.

What is left machine-dependent: the LP bound HiGHS reports (its compiled simplex), which enters
only the gap (compared within a relative 1e-9 by the golden tests, :data:`golden.TOLERANT`), and
the learned policy's matrix products (``train/fast.py``, torch), whose last bits may differ
across BLAS kernels; the learned golden cells are exact under every kernel tried here.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import golden  # tests/golden.py

from carbon_gym.numeric import exact_dot

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _openblas_kernels() -> list[str]:
    """The OpenBLAS kernels this machine can run, weakest first ([] unless numpy's BLAS is a
    DYNAMIC_ARCH OpenBLAS on x86-64, where ``OPENBLAS_CORETYPE`` chooses among them)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    cfg = json.dumps(np.show_config(mode="dicts"), default=str).lower()
    if "openblas" not in cfg:
        return []
    flags = _cpu_flags()
    kernels = ["Prescott"]
    if {"avx2", "fma"} <= flags:
        kernels.append("Haswell")
    if {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= flags:
        kernels.append("SkylakeX")
    return kernels


KERNELS = _openblas_kernels()
needs_kernels = pytest.mark.skipif(len(KERNELS) < 2, reason="needs numpy on a DYNAMIC_ARCH OpenBLAS with two or more x86-64 kernels")


def _run(code: str, env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          env={**os.environ, **env}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


DOTS = """
import json, numpy as np
from carbon_gym.numeric import exact_dot
rng = np.random.default_rng(7)
out = []
for n in (37, 200, 1000, 5000):
    a = rng.random(n) * 10.0
    b = rng.integers(0, 4, n).astype(float)
    out.append([repr(float(a @ b)), repr(exact_dot(a, b))])
print(json.dumps(out))
"""


@needs_kernels
def test_exact_dot_is_the_same_under_every_blas_kernel():
    """``a @ b`` changes with the OpenBLAS kernel (the cause of the drift); ``exact_dot`` does not."""
    runs = {k: json.loads(_run(DOTS, {"OPENBLAS_CORETYPE": k})) for k in KERNELS}
    blas = {k: [r[0] for r in v] for k, v in runs.items()}
    exact = {k: [r[1] for r in v] for k, v in runs.items()}
    assert len({json.dumps(v) for v in exact.values()}) == 1, exact
    if len({json.dumps(v) for v in blas.values()}) == 1:
        pytest.skip(f"this OpenBLAS sums these dot products alike under {KERNELS}: the hazard is not shown here")


MILP_CELL = """
import json, sys, warnings
sys.path.insert(0, "tests")
warnings.simplefilter("ignore")
import golden
print(json.dumps(golden.run_cell(("dev", "milp", 1))))
"""


@pytest.mark.slow
@needs_kernels
def test_milp_cell_is_bit_identical_under_every_blas_kernel():
    """The golden cell that drifted (dev, MILP, seed 1), rerun under each OpenBLAS kernel: every
    field equal to the pinned cell *exactly*, the MIP gap included (with ``cost @ x`` it moved
    in its 15th digit between the Haswell and SkylakeX kernels)."""
    pinned = golden.load_golden()["dev|milp|1"]
    for k in KERNELS:
        got = json.loads(_run(MILP_CELL, {"OPENBLAS_CORETYPE": k}))
        assert got == pinned, (k, golden.diff(pinned, got)[:5])


UFUNCS = """
import json, numpy as np
rng = np.random.default_rng(3)
out = {}
for n in (7, 100, 1001, 100003):
    a = rng.random(n) * 1e3 + 1e-3
    for name, f in [("sum", np.sum), ("cumsum", lambda a: np.cumsum(a)[-1]), ("mean", np.mean),
                    ("percentile", lambda a: np.percentile(a, [50, 90, 95, 99])), ("sqrt", np.sqrt),
                    ("multiply_add", lambda a: a * 0.37 + a[::-1]), ("divide", lambda a: 1.0 / a), ("maximum", lambda a: np.maximum(a, 500.0))]:
        out[f"{name}{n}"] = np.asarray(f(a), dtype=np.float64).tobytes().hex()
print(json.dumps(out))
"""


def test_numpy_reductions_do_not_depend_on_the_simd_extensions():
    """numpy's own reductions and basic arithmetic give the same bits with its AVX-512 and AVX2
    paths switched off (``NPY_DISABLE_CPU_FEATURES``), so only BLAS calls and transcendental
    ufuncs need care."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 SIMD groups only")
    base = json.loads(_run(UFUNCS, {}))
    tried = 0
    for off in ("X86_V4 AVX512_ICL AVX512_SPR", "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"):
        proc = subprocess.run([sys.executable, "-c", UFUNCS], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "NPY_DISABLE_CPU_FEATURES": off}, cwd=ROOT)
        if proc.returncode != 0:  # (feature names of another numpy release)
            continue
        tried += 1
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got == base, sorted(k for k in base if base[k] != got[k])
    if not tried:
        pytest.skip("this numpy does not take these NPY_DISABLE_CPU_FEATURES names")


FORECAST = """
import hashlib, numpy as np
from carbon_gym.physics.carbon import CarbonForecaster, load_carbon_trace
fc = CarbonForecaster(load_carbon_trace(), horizon_h=24, error_std_frac=0.05, seed=3)
h = hashlib.sha256()
for hour in range(0, 2000, 37):
    h.update(fc.forecast(hour * 3600.0 + 1.0).tobytes())
x = np.random.default_rng(1).standard_normal(4096) * 0.3
print(h.hexdigest(), hashlib.sha256(np.exp(x).tobytes()).hexdigest())
"""


def test_carbon_forecast_does_not_depend_on_numpy_simd():
    """The noisy carbon forecast is the same bits with numpy's AVX-512 paths off, where
    ``np.exp`` itself (printed beside it) gives other bits on an AVX-512 machine."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 SIMD groups only")
    base = _run(FORECAST, {}).split()
    proc = subprocess.run([sys.executable, "-c", FORECAST], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"})
    if proc.returncode != 0:
        pytest.skip("this numpy does not take these NPY_DISABLE_CPU_FEATURES names")
    other = proc.stdout.split()
    assert other[0] == base[0]
    if other[1] == base[1]:
        pytest.skip("np.exp is the same without AVX-512 here (no AVX-512 CPU): the hazard is not shown")


def test_exact_dot_values():
    """Correctly rounded: exact on integers, and the one float nearest the true sum where naive
    summation loses it."""
    assert exact_dot(np.arange(5.0), np.arange(5.0)) == 30.0
    a = np.array([1e16, 1.0, -1e16, 1.0])
    assert exact_dot(a, np.ones(4)) == 2.0 and float(np.sum(a)) != 2.0  # naive left-to-right gives 1.0 or 0.0
    assert exact_dot(np.zeros(0), np.zeros(0)) == 0.0
    with pytest.raises(ValueError, match="1-D arrays of one length"):
        exact_dot(np.ones(3), np.ones(4))
