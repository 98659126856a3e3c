"""Fit :class:`~carbon_gym.physics.latency.TableLatencyModel` parameters from kernel profiles.

Inputs: an operator CSV (per-layer ms of each token-level operator vs ``num_tokens``, per TP
degree) and an attention-anchors file (per-layer ms of prefill / decode attention and KV-cache
save at measured (chunk, kv) and (batch, kv) points); see :mod:`calibration.io`.

What is fitted (all least squares on *relative* error, so small and large batches count alike):

* **Token-level operators** -> ``linear_s``: each operator's per-layer time is fitted by a
  piecewise-linear function on a tokens grid (``DEFAULT_KNOTS`` clipped to the profile's range);
  ``linear_s`` = sum over operators of (fitted time x layers) + the embedding once per iteration.
* **Decode attention** (per layer): ``fixed + per_seq * batch + per_ctx * batch * kv`` for the
  attention kernel and ``fixed + per_seq * batch`` for the KV-cache save.
* **Prefill attention** (per layer): ``fixed + per_token * chunk + per_pair * pairs`` with
  ``pairs = chunk * (kv + (chunk + 1) / 2)`` (the causal (query, key) pairs), and
  ``fixed + per_token * chunk`` for the KV-cache save.
* **Achieved efficiencies** of the GPU: memory (weight bytes of the four projections / HBM
  bandwidth / their time at the smallest batch) and compute (their FLOPs / peak / time at the
  largest batch). They price the parts the profile leaves out, and the derived models.

What is *chosen* (not in the profile), see ``calibration/README.md``:

* ``overhead_s`` = ``FRAMEWORK_OVERHEAD_S`` (2.0 ms): vLLM's per-step CPU work (scheduler, input
  preparation, sampler synchronisation, output processing), the middle of the 1-3 ms range
  observed on real engines; refit end to end with ``calibrate serving`` when benchmarks exist.
* ``lm_head_fixed_s``: the LM head's ``vocab x hidden / tp`` bf16 weights read once per iteration
  that samples, at HBM bandwidth x fitted memory efficiency.
* ``per_sampled_seq_s``: ``2 * vocab * hidden / tp`` FLOPs per sampled row at peak x fitted
  compute efficiency, plus ``SAMPLING_PASSES`` passes over that row's fp32 logits (softmax,
  top-p / top-k, sampling) at HBM bandwidth x memory efficiency.
* TP > 1: ``2 * layers + 1`` all-reduces per iteration (after attention and after the MLP in every
  layer, plus the vocabulary-parallel embedding), ring algorithm:
  ``latency + 2 (tp - 1) / tp * tokens * hidden * 2 bytes / bus bandwidth``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError
from carbon_gym.physics.latency import TableLatencyModel
from carbon_gym.specs import GpuSpec, ModelSpec, load_gpu_spec, load_model_spec

from .io import (
    SHIPPED_ATTENTION, SHIPPED_MLP_CSV, AttentionAnchors, OperatorProfile, load_attention_anchors,
    load_operator_profile,
)
from .shapes import ITERATION_OPS, LAYER_OPS, MATMUL_OPS, OPTIONAL_LAYER_OPS, lm_head_cost, op_cost

# Calibrated by calibration/overhead.py from the median inter-token latencies ML.ENERGY v3 published
# for vLLM 0.11.1 (Llama-3.1-8B, H100, batches 8-32): the measured steps leave no time beyond the
# kernels (residual -0.25..-0.50 ms, within the +-0.3 ms of the derivation), i.e. vLLM V1 overlaps its
# CPU work with the GPU. Documented range: 0-0.5 ms (V1 with async scheduling) up to 4-13 ms of GPU
# idle per step (V0 before multi-step scheduling, vLLM issue 6854). See measurements/README.md.
FRAMEWORK_OVERHEAD_S = 0.0
SAMPLING_PASSES = 4
ALLREDUCE_LATENCY_S = 10e-6
# Effective ring all-reduce bus bandwidth per GPU, bytes/s. A100 NVLink3: 600 GB/s counts both
# directions (300 GB/s each way); NCCL's all_reduce_perf reaches ~230 GB/s bus bandwidth on a
# DGX A100. H100 NVLink4: 900 GB/s both ways; ~360 GB/s bus bandwidth at medium message sizes.
# A100-40GB: same NVLink3 as the 80GB part; H200: same NVLink4 as the H100.
ALLREDUCE_BUS_BYTES_PER_S = {"a100-80gb": 230e9, "a100-40gb": 230e9, "h100-80gb": 360e9, "h200": 360e9}
DEFAULT_KNOTS = (
    1, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
    12288, 16384, 24576, 32768,
)
SIG_DIGITS = 6


def sig(x: float, digits: int = SIG_DIGITS) -> float:
    """``x`` rounded to ``digits`` significant digits (what the parameter files store)."""
    return float(f"{float(x):.{digits}g}")


def mape_pct(pred: np.ndarray, meas: np.ndarray) -> float:
    """Mean absolute percentage error of ``pred`` against ``meas`` (rows with meas > 0)."""
    pred, meas = np.asarray(pred, dtype=np.float64), np.asarray(meas, dtype=np.float64)
    m = meas > 0
    return float(np.mean(np.abs(pred[m] - meas[m]) / meas[m]) * 100.0) if np.any(m) else float("nan")


# --------------------------------------------------------------------------- least squares


def hat_basis(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Matrix (len(x), len(knots)) of piecewise-linear 'hat' functions (linear extrapolation)."""
    x = np.asarray(x, dtype=np.float64)
    B = np.zeros((x.size, knots.size))
    i = np.clip(np.searchsorted(knots, x, side="right") - 1, 0, knots.size - 2)
    w = (x - knots[i]) / (knots[i + 1] - knots[i])
    rows = np.arange(x.size)
    B[rows, i] = 1.0 - w
    B[rows, i + 1] = w
    return B


def weighted_lstsq(A: np.ndarray, y: np.ndarray, scale: np.ndarray | None = None, nonneg: bool = True) -> np.ndarray:
    """Coefficients minimising sum(((A c - y) / scale)^2) (``scale`` defaults to ``y``: relative error).

    With ``nonneg`` the coefficients are constrained to be >= 0 (exact search over the active
    sets; meant for a handful of coefficients).
    """
    A = np.asarray(A, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    scale = y if scale is None else np.asarray(scale, dtype=np.float64)
    if np.any(scale <= 0) or np.any(~np.isfinite(scale)):
        raise ConfigError("calibration", "least-squares weights need positive finite measurements")
    Aw, yw = A / scale[:, None], y / scale
    c, *_ = np.linalg.lstsq(Aw, yw, rcond=None)
    if not nonneg or np.all(c >= 0):
        return c
    if A.shape[1] > 6:
        raise ConfigError("calibration", "non-negative fit supported for at most 6 coefficients")
    best, best_err = np.zeros(A.shape[1]), float(np.sum(yw**2))
    for k in range(1, A.shape[1] + 1):
        for cols in itertools.combinations(range(A.shape[1]), k):
            sub, *_ = np.linalg.lstsq(Aw[:, cols], yw, rcond=None)
            if np.any(sub < 0):
                continue
            full = np.zeros(A.shape[1])
            full[list(cols)] = sub
            err = float(np.sum((Aw @ full - yw) ** 2))
            if err < best_err:
                best, best_err = full, err
    return best


# --------------------------------------------------------------------------- pieces


@dataclass(frozen=True)
class Efficiencies:
    """Fractions of HBM bandwidth and of peak bf16 FLOP/s the profiled projections achieve."""

    mem: float
    compute: float


def fit_efficiencies(profile: OperatorProfile, spec: ModelSpec, gpu: GpuSpec) -> Efficiencies:
    """Achieved memory efficiency at the smallest batch and compute efficiency at the largest.

    Uses the four dense projections (only the two attention projections for a mixture-of-experts
    model, whose MLP work depends on the routing).
    """
    lo, hi = float(profile.tokens[0]), float(profile.tokens[-1])
    ops = MATMUL_OPS if spec.experts <= 1 else ("attn_pre_proj", "attn_post_proj")
    t_lo = sum(float(profile.op_at(op, lo)) for op in ops) * 1e-3
    t_hi = sum(float(profile.op_at(op, hi)) for op in ops) * 1e-3
    bytes_lo = sum(op_cost(spec, profile.tp, op, lo).bytes for op in ops)
    flops_hi = sum(op_cost(spec, profile.tp, op, hi).flops for op in ops)
    return Efficiencies(mem=bytes_lo / gpu.hbm_bytes_per_s / t_lo, compute=flops_hi / gpu.peak_bf16_flops / t_hi)


@dataclass(frozen=True)
class LinearFit:
    """Fitted token-level operator tables.

    Attributes:
        knots: tokens grid.
        op_tables_ms: per-layer fitted ms of each operator at the knots.
        multiplicity: calls per iteration of each operator (layers, or 1 for the embedding).
        op_mape_pct: fit error of each operator over the profile's rows.
        linear_mape_pct: fit error of the per-iteration sum over the profile's rows.
    """

    knots: np.ndarray
    op_tables_ms: dict[str, np.ndarray]
    multiplicity: dict[str, int]
    op_mape_pct: dict[str, float]
    linear_mape_pct: float

    def linear_s(self) -> np.ndarray:
        """Seconds of all token-level operators of one iteration at each knot.

        Not smoothed or made monotone: the profile's dips (another kernel or tile shape chosen
        at one size, e.g. 416 -> 424 tokens is 4.8% cheaper) are repeatable structure, well above
        the rows' own noise, and are kept.
        """
        return np.asarray(sum(self.multiplicity[op] * t for op, t in self.op_tables_ms.items()) * 1e-3)


def profile_ops(profile: OperatorProfile) -> list[str]:
    """The operators of ``profile`` that make up an iteration (layer ops + embedding)."""
    ops = [op for op in LAYER_OPS + OPTIONAL_LAYER_OPS + ITERATION_OPS if op in profile.ops_ms]
    missing = [op for op in LAYER_OPS if op not in profile.ops_ms]
    if missing:
        raise ConfigError("profile", f"{profile.source}: missing operators {', '.join(missing)}", allowed=LAYER_OPS)
    return ops


def measured_linear_s(profile: OperatorProfile, layers: int, tokens: np.ndarray | float) -> np.ndarray:
    """Measured seconds of all token-level operators of one iteration (layer ops x layers + embedding)."""
    total = 0.0
    for op in profile_ops(profile):
        total = total + (1 if op in ITERATION_OPS else layers) * profile.op_at(op, tokens)
    return np.asarray(total) * 1e-3


def choose_knots(profile: OperatorProfile, knots: tuple[float, ...] | None = None) -> np.ndarray:
    """Tokens grid: ``knots`` inside the profile's range plus its two ends."""
    lo, hi = float(profile.tokens[0]), float(profile.tokens[-1])
    k = [float(x) for x in (knots or DEFAULT_KNOTS) if lo < x < hi]
    return np.array([lo] + k + [hi])


def fit_linear(profile: OperatorProfile, layers: int, knots: tuple[float, ...] | None = None) -> LinearFit:
    """Token-level operator tables of ``profile``.

    Default (``knots`` None): **interpolation of the measured points** - the tables are the
    profile's own per-layer medians at every measured token count, so the model passes through
    each measured point (moved by 0, less than any noise) and interpolates linearly between
    them. With ``knots`` the older smoothing fit is used instead: a piecewise-linear function on
    those knots, relative least squares (kept for experiments; it moves measured points by up to
    ~13% at 128-512 tokens on the shipped profile).
    """
    tables, errs, mult = {}, {}, {}
    if knots is None:
        grid = np.asarray(profile.tokens, dtype=np.float64)
        for op in profile_ops(profile):
            tables[op] = np.array([sig(v) for v in profile.ops_ms[op]])
            errs[op] = mape_pct(tables[op], profile.ops_ms[op])
            mult[op] = 1 if op in ITERATION_OPS else layers
    else:
        grid = choose_knots(profile, knots)
        B = hat_basis(profile.tokens, grid)
        for op in profile_ops(profile):
            y = profile.ops_ms[op]
            floor = max(float(np.min(y[y > 0])) if np.any(y > 0) else 1e-6, 1e-6)
            c = weighted_lstsq(B, np.maximum(y, floor))
            tables[op] = np.array([sig(v) for v in c])
            errs[op] = mape_pct(B @ tables[op], y)
            mult[op] = 1 if op in ITERATION_OPS else layers
    fit = LinearFit(grid, tables, mult, errs, float("nan"))
    pred = np.interp(profile.tokens, grid, fit.linear_s())
    meas = measured_linear_s(profile, layers, profile.tokens)
    return LinearFit(grid, tables, mult, errs, mape_pct(pred, meas))


# Prefill anchors: chunk sizes within this relative distance of each other form one cluster; the
# prefill tables get a grid point at every cluster with at least PREFILL_KNOT_MIN_ANCHORS anchors
# (its median chunk size) plus the largest measured chunk.
PREFILL_CLUSTER_REL = 0.05
PREFILL_KNOT_MIN_ANCHORS = 3


def prefill_knots(chunks: np.ndarray) -> np.ndarray:
    """Grid of the prefill attention tables chosen from the anchors' chunk sizes (see above)."""
    cs = np.sort(np.asarray(chunks, dtype=np.float64))
    clusters: list[list[float]] = [[float(cs[0])]]
    for x in cs[1:]:
        if x <= clusters[-1][-1] * (1.0 + PREFILL_CLUSTER_REL):
            clusters[-1].append(float(x))
        else:
            clusters.append([float(x)])
    knots = [float(np.median(c)) for c in clusters if len(c) >= PREFILL_KNOT_MIN_ANCHORS]
    if not knots or knots[-1] < cs[-1]:
        knots.append(float(cs[-1]))
    if len(knots) < 2:
        knots = [float(cs[0]), float(cs[-1])]
    return np.array(sorted(set(knots)))


@dataclass(frozen=True)
class AttentionFit:
    """Per-layer attention coefficients in milliseconds (see the module docstring).

    Attributes:
        prefill_grid: chunk sizes (tokens) of the prefill tables.
        prefill_attn_a: prefill attention kernel, ms at each grid chunk size, excluding the per-pair part.
        prefill_attn_b: prefill attention kernel, ms per (query, key) pair at each grid chunk size.
        prefill_save_a: prefill KV-cache save, ms at each grid chunk size.
        decode_attn: (fixed, per_seq, per_ctx) of the decode attention kernel.
        decode_save: (fixed, per_seq) of the decode KV-cache save.
        mape_pct: fit error of each of the four components over the anchors.
    """

    prefill_grid: tuple[float, ...]
    prefill_attn_a: tuple[float, ...]
    prefill_attn_b: tuple[float, ...]
    prefill_save_a: tuple[float, ...]
    decode_attn: tuple[float, float, float]
    decode_save: tuple[float, float]
    mape_pct: dict[str, float] = field(default_factory=dict)

    def scaled(self, q_ratio: float, kv_ratio: float) -> AttentionFit:
        """Attention of a model with ``q_ratio`` x the query heads and ``kv_ratio`` x the KV heads per GPU.

        Work terms scale with the heads they touch (prefill attention with the query heads; KV
        reads per context token, KV-cache save and per-sequence decode work with the KV heads);
        the fixed decode kernel-launch terms do not scale.
        """
        da, ds = self.decode_attn, self.decode_save
        return AttentionFit(
            self.prefill_grid,
            tuple(x * q_ratio for x in self.prefill_attn_a),
            tuple(x * q_ratio for x in self.prefill_attn_b),
            tuple(x * kv_ratio for x in self.prefill_save_a),
            (da[0], da[1] * kv_ratio, da[2] * kv_ratio),
            (ds[0], ds[1] * kv_ratio),
            {},
        )

    def roofline_scaled(self, mem_ratio: float, compute_ratio: float) -> AttentionFit:
        """The same kernels on another GPU: memory-bound terms x ``mem_ratio`` (decode attention, KV
        saves, the per-chunk part of prefill attention), compute-bound terms x ``compute_ratio``
        (prefill work per (query, key) pair); fixed decode launch terms kept."""
        da, ds = self.decode_attn, self.decode_save
        return AttentionFit(
            self.prefill_grid,
            tuple(x * mem_ratio for x in self.prefill_attn_a),
            tuple(x * compute_ratio for x in self.prefill_attn_b),
            tuple(x * mem_ratio for x in self.prefill_save_a),
            (da[0], da[1] * mem_ratio, da[2] * mem_ratio),
            (ds[0], ds[1] * mem_ratio),
            {},
        )

    def latency_fields(self, layers: int) -> dict[str, Any]:
        """Per-iteration seconds of the ``[latency]`` attention fields for ``layers`` layers."""
        f = layers * 1e-3
        return {
            "attn_decode_fixed_s": sig((self.decode_attn[0] + self.decode_save[0]) * f),
            "attn_decode_per_seq_s": sig((self.decode_attn[1] + self.decode_save[1]) * f),
            "attn_decode_per_ctx_s": sig(self.decode_attn[2] * f),
            "attn_prefill_fixed_s": 0.0,
            "attn_prefill_per_token_s": 0.0,
            "attn_prefill_per_pair_s": 0.0,
            "attn_prefill_grid": [float(x) for x in self.prefill_grid],
            "attn_prefill_table_s": [sig((a + s) * f) for a, s in zip(self.prefill_attn_a, self.prefill_save_a)],
            "attn_prefill_pair_table_s": [sig(b * f) for b in self.prefill_attn_b],
        }


def prefill_pairs(chunk: np.ndarray | float, kv: np.ndarray | float) -> np.ndarray:
    """Causal (query, key) pairs of a prefill chunk of ``chunk`` tokens after ``kv`` cached tokens."""
    chunk = np.asarray(chunk, dtype=np.float64)
    return chunk * (np.asarray(kv, dtype=np.float64) + (chunk + 1.0) / 2.0)


def _table_basis(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Hat basis with the latency model's end rules: held below the grid's first point."""
    B = hat_basis(np.maximum(x, grid[0]), grid)
    return B


def fit_attention(anchors: AttentionAnchors, profile: OperatorProfile | None = None) -> AttentionFit:
    """Fit the attention components to the anchors (weighted least squares).

    Decode: ``fixed + per_seq b + per_ctx b kv`` (attention) and ``fixed + per_seq b`` (KV save),
    coefficients >= 0. Prefill: piecewise-linear tables over the chunk size on
    :func:`prefill_knots`, ``A(c) + B(c) pairs`` for the attention kernel and ``A_save(c)`` for the
    KV save: the measured cost per (query, key) pair is 2x higher for 448-token chunks than for
    5-10K-token ones, which no single affine form represents.

    Without ``profile`` each component is fitted on its own relative error. With ``profile`` (the
    token-level operators at the anchors' TP degree) every anchor's error is weighted by its whole
    per-layer iteration time (operators + attention + KV save), so the fit minimises the relative
    error of whole iterations, the quantity the simulator needs right.
    """
    a = anchors
    one_d = np.ones_like(a.decode_batch)
    pairs = prefill_pairs(a.prefill_chunk, a.prefill_kv)
    errs = {}

    def whole(size: np.ndarray, attn: np.ndarray, save: np.ndarray) -> np.ndarray | None:
        if profile is None:
            return None
        lin = sum(profile.op_at(op, size) for op in profile_ops(profile) if op not in ITERATION_OPS)
        return lin + attn + np.where(np.isfinite(save), save, 0.0)

    w_p = whole(a.prefill_chunk, a.prefill_attn_ms, a.prefill_save_ms)
    w_d = whole(a.decode_batch, a.decode_attn_ms, a.decode_save_ms)

    def fit(name: str, A: np.ndarray, y: np.ndarray, w: np.ndarray | None, nonneg: bool = True) -> tuple[float, ...]:
        ok = np.isfinite(y) & (y > 0)
        if ok.sum() < A.shape[1]:
            raise ConfigError("attention", f"{a.source}: too few {name} anchors ({ok.sum()}) to fit {A.shape[1]} terms")
        c = weighted_lstsq(A[ok], y[ok], None if w is None else w[ok], nonneg=nonneg)
        c = np.maximum(c, 0.0)
        c = tuple(sig(v) for v in c)
        errs[name] = mape_pct(A[ok] @ np.array(c), y[ok])
        return c

    grid = prefill_knots(a.prefill_chunk)
    n_ok = int(np.sum(np.isfinite(a.prefill_attn_ms) & (a.prefill_attn_ms > 0)))
    if n_ok < 2 * grid.size:  # few anchors (e.g. a quick profile): two grid points, one per-pair cost
        grid = np.array([float(np.min(a.prefill_chunk)), float(np.max(a.prefill_chunk))])
        if grid[1] <= grid[0]:
            grid = np.array([grid[0], grid[0] + 1.0])
    H = _table_basis(a.prefill_chunk, grid)
    k = grid.size
    if n_ok < 2 * k:
        pa = fit("prefill_attn", np.column_stack([H, pairs]), a.prefill_attn_ms, w_p, nonneg=False)
        pa = pa[:k] + (pa[k],) * k
    else:
        pa = fit("prefill_attn", np.column_stack([H, H * pairs[:, None]]), a.prefill_attn_ms, w_p, nonneg=False)
    ps = fit("prefill_save", H, a.prefill_save_ms, w_p, nonneg=False)
    da = fit("decode_attn", np.column_stack([one_d, a.decode_batch, a.decode_batch * a.decode_kv]), a.decode_attn_ms, w_d)
    ds = fit("decode_save", np.column_stack([one_d, a.decode_batch]), a.decode_save_ms, w_d)
    return AttentionFit(tuple(float(x) for x in grid), pa[:k], pa[k:], ps, da, ds, errs)  # type: ignore[arg-type]


def framework_fields(spec: ModelSpec, gpu: GpuSpec, tp: int, eff: Efficiencies,
                     overhead_s: float = FRAMEWORK_OVERHEAD_S) -> dict[str, float]:
    """``overhead_s``, ``lm_head_fixed_s`` and ``per_sampled_seq_s`` from first principles."""
    w = lm_head_cost(spec, tp, 0.0)
    per_row = lm_head_cost(spec, tp, 1.0)
    logits_bytes = SAMPLING_PASSES * 4.0 * spec.vocab / tp
    return {
        "overhead_s": sig(overhead_s),
        "lm_head_fixed_s": sig(w.bytes / (gpu.hbm_bytes_per_s * eff.mem)),
        "per_sampled_seq_s": sig(per_row.flops / (gpu.peak_bf16_flops * eff.compute)
                                 + logits_bytes / (gpu.hbm_bytes_per_s * eff.mem)),
    }


def allreduce_fields(spec: ModelSpec, gpu: GpuSpec, tp: int, latency_s: float = ALLREDUCE_LATENCY_S,
                     bus_bytes_per_s: float | None = None) -> dict[str, float]:
    """``allreduce_fixed_s`` and ``allreduce_per_token_s`` of ``2 * layers + 1`` ring all-reduces."""
    if tp <= 1:
        return {"allreduce_fixed_s": 0.0, "allreduce_per_token_s": 0.0}
    bw = bus_bytes_per_s or ALLREDUCE_BUS_BYTES_PER_S.get(gpu.name)
    if bw is None:
        raise ConfigError("gpu", f"no all-reduce bandwidth known for {gpu.name!r}; pass bus_bytes_per_s",
                          allowed=sorted(ALLREDUCE_BUS_BYTES_PER_S))
    count = 2 * spec.layers + 1
    per_token = 2.0 * (tp - 1) / tp * spec.hidden * 2.0 / bw
    return {"allreduce_fixed_s": sig(count * latency_s), "allreduce_per_token_s": sig(count * per_token)}


# --------------------------------------------------------------------------- whole iterations


@dataclass(frozen=True)
class IterationCheck:
    """One whole-iteration comparison: measured kernels (profile) vs the model's kernel time."""

    kind: str
    size: int
    kv: int
    measured_s: float
    model_s: float

    @property
    def error_pct(self) -> float:
        """Signed error of the model, percent of the measurement."""
        return (self.model_s - self.measured_s) / self.measured_s * 100.0


def evaluate_iterations(model: TableLatencyModel, profile: OperatorProfile, anchors: AttentionAnchors,
                        layers: int) -> list[IterationCheck]:
    """Whole iterations at every attention anchor with a complete measurement.

    Measured = (token-level operators, interpolated between profile rows) x layers + embedding
    + (attention + KV-cache save) x layers; model = :meth:`TableLatencyModel.kernel_time_s`.
    """
    out = []
    for c, kv, at, sv in zip(anchors.prefill_chunk, anchors.prefill_kv, anchors.prefill_attn_ms, anchors.prefill_save_ms):
        if not (math.isfinite(at) and math.isfinite(sv)):
            continue
        meas = float(measured_linear_s(profile, layers, c)) + layers * (at + sv) * 1e-3
        pred = model.kernel_time_s(int(c), float(prefill_pairs(c, kv)), 0, 0.0)
        out.append(IterationCheck("prefill", int(c), int(kv), meas, pred))
    for b, kv, at, sv in zip(anchors.decode_batch, anchors.decode_kv, anchors.decode_attn_ms, anchors.decode_save_ms):
        if not (math.isfinite(at) and math.isfinite(sv)):
            continue
        meas = float(measured_linear_s(profile, layers, b)) + layers * (at + sv) * 1e-3
        pred = model.kernel_time_s(0, 0.0, int(b), float(b * kv))
        out.append(IterationCheck("decode", int(b), int(kv), meas, pred))
    return out


def checks_mape_pct(checks: list[IterationCheck]) -> float:
    """MAPE (%) of ``checks`` (NaN when empty)."""
    if not checks:
        return float("nan")
    return mape_pct([c.model_s for c in checks], [c.measured_s for c in checks])


def check_categories(checks: list[IterationCheck]) -> dict[str, float]:
    """Whole-iteration MAPE over all checks, decode batches 1-128 and prefill chunks 128-4096 tokens."""
    return {
        "all": checks_mape_pct(checks),
        "decode_b1_128": checks_mape_pct([c for c in checks if c.kind == "decode" and 1 <= c.size <= 128]),
        "prefill_c128_4096": checks_mape_pct([c for c in checks if c.kind == "prefill" and 128 <= c.size <= 4096]),
    }


# --------------------------------------------------------------------------- the whole fit


@dataclass
class ProfileFit:
    """Result of :func:`fit_profile`: the ``[latency]`` parameters and how well they fit."""

    name: str
    params: dict[str, Any]
    calibration: dict[str, Any]
    linear: LinearFit
    attention: AttentionFit
    efficiencies: Efficiencies
    checks: list[IterationCheck]
    profile: OperatorProfile | None = None
    layers: int = 0

    @property
    def iteration_mape_pct(self) -> float:
        """MAPE of whole iterations against the profile (NaN if no anchors at this TP)."""
        return checks_mape_pct(self.checks)

    def category_mape_pct(self) -> dict[str, float]:
        """Whole-iteration MAPE: all anchors, decode batches 1-128, prefill chunks 128-4096 tokens."""
        return check_categories(self.checks)

    def model(self) -> TableLatencyModel:
        """The fitted latency model."""
        p = dict(self.params)
        return TableLatencyModel(name=p.pop("name"), **p)

    def tables(self) -> dict[str, dict[str, Any]]:
        """TOML tables of the parameter file: ``[latency]`` and ``[calibration]`` (metadata)."""
        return {"latency": self.params, "calibration": self.calibration}

    def linear_max_move_pct(self) -> float:
        """Largest relative difference (%) between the model's token-level time and the measured one
        at the profile's own rows."""
        if self.profile is None:
            return float("nan")
        m = self.model()
        toks = self.profile.tokens
        pred = np.array([m.linear_time_s(float(t)) for t in toks])
        meas = measured_linear_s(self.profile, self.layers, toks)
        return float(np.max(np.abs(pred - meas) / meas) * 100.0)

    def report_lines(self) -> list[str]:
        """Human-readable fit report (per operator, attention, whole iterations)."""
        lines = [f"fit {self.name}: efficiencies mem={self.efficiencies.mem:.3f} compute={self.efficiencies.compute:.3f}",
                 "per-operator fit error over the profile rows (MAPE %):"]
        for op, e in self.linear.op_mape_pct.items():
            lines.append(f"  {op:<26s} {e:6.2f}")
        lines.append(f"  {'token-level sum':<26s} {self.linear.linear_mape_pct:6.2f}")
        lines.append("attention fit error over the anchors (MAPE %):")
        for k, e in self.attention.mape_pct.items():
            lines.append(f"  {k:<26s} {e:6.2f}")
        if self.checks:
            lines.append("whole iterations (kernels: operators x layers + embedding + attention x layers):")
            lines.append(f"  {'kind':<8s}{'size':>6s}{'kv':>7s}{'measured_ms':>13s}{'model_ms':>10s}{'err_%':>8s}")
            for c in self.checks:
                lines.append(f"  {c.kind:<8s}{c.size:>6d}{c.kv:>7d}{c.measured_s * 1e3:>13.3f}{c.model_s * 1e3:>10.3f}"
                             f"{c.error_pct:>8.2f}")
            errs = np.abs([c.error_pct for c in self.checks])
            lines.append(f"whole-iteration error: mean {errs.mean():.2f}%, max {errs.max():.2f}% over {len(errs)} iterations")
            cat = self.category_mape_pct()
            n_dec = sum(1 for c in self.checks if c.kind == "decode" and c.size <= 128)
            n_pre = sum(1 for c in self.checks if c.kind == "prefill" and 128 <= c.size <= 4096)
            lines.append(f"whole-iteration MAPE: all {cat['all']:.2f}% ({len(errs)}), decode batches 1-128 "
                         f"{cat['decode_b1_128']:.2f}% ({n_dec}), prefill chunks 128-4096 {cat['prefill_c128_4096']:.2f}% "
                         f"({n_pre})")
            lines.append(f"token-level table: {len(self.linear.knots)} points = the profile's measured rows "
                         f"(max move of a measured point {self.linear_max_move_pct():.3f}%)")
        p = self.params
        lines.append(f"added (not in the profile): overhead_s={p['overhead_s']} lm_head_fixed_s={p['lm_head_fixed_s']} "
                     f"per_sampled_seq_s={p['per_sampled_seq_s']} allreduce_fixed_s={p['allreduce_fixed_s']} "
                     f"allreduce_per_token_s={p['allreduce_per_token_s']}")
        return lines


def check_profile_matches(profile: OperatorProfile, spec: ModelSpec) -> None:
    """Raise :class:`ConfigError` if the profile's shape columns disagree with ``spec``."""
    want = {"n_head": spec.query_heads, "n_kv_head": spec.kv_heads, "n_embd": spec.hidden,
            "n_expanded_embd": spec.mlp_intermediate, "vocab_size": spec.vocab}
    bad = [f"{k}={profile.shape[k]} (model {v})" for k, v in want.items() if k in profile.shape and profile.shape[k] != v]
    if bad:
        raise ConfigError("model", f"profile {profile.source} does not match {spec.name}: {', '.join(bad)}")


def fit_profile(
    mlp_csv: str | Path = SHIPPED_MLP_CSV,
    attention: str | Path = SHIPPED_ATTENTION,
    model: str = "llama-3.1-8b",
    gpu: str = "a100-80gb",
    tp: int = 1,
    knots: tuple[float, ...] | None = None,
    overhead_s: float = FRAMEWORK_OVERHEAD_S,
    command: str = "python -m calibration fit --write",
    model_spec_path: str | Path | None = None,
    gpu_spec_path: str | Path | None = None,
) -> ProfileFit:
    """Fit the latency parameters of (gpu, model, tp) from an operator CSV and attention anchors.

    The token-level table uses the profile's rows at ``tp``; attention measured at another TP
    degree is rescaled by the heads per GPU; all-reduce and framework terms are added (see the
    module docstring). Whole-iteration checks are made when the anchors were measured at ``tp``.
    ``model_spec_path`` / ``gpu_spec_path``: TOML files with the model / GPU table when they are not
    shipped in ``carbon_gym/data/{models,gpus}.toml``.
    """
    spec, g = load_model_spec(model, model_spec_path), load_gpu_spec(gpu, gpu_spec_path)
    profiles = load_operator_profile(mlp_csv)
    if tp not in profiles:
        raise ConfigError("tp", f"profile {mlp_csv} has no rows for tp={tp}", allowed=sorted(profiles))
    prof = profiles[tp]
    check_profile_matches(prof, spec)
    anchors = load_attention_anchors(attention)
    eff = fit_efficiencies(prof, spec, g)
    lin = fit_linear(prof, spec.layers, knots)
    att_measured = fit_attention(anchors, profiles.get(anchors.tp))
    att = att_measured if anchors.tp == tp else att_measured.scaled(anchors.tp / tp, anchors.tp / tp)
    name = f"{gpu}__{model}__tp{tp}"
    params: dict[str, Any] = {
        "name": name,
        "tokens_grid": [float(x) for x in lin.knots],
        "linear_s": [sig(x) for x in lin.linear_s()],
    }
    params.update(framework_fields(spec, g, tp, eff, overhead_s))
    params.update(att.latency_fields(spec.layers))
    params.update(allreduce_fields(spec, g, tp))
    params["source"] = (
        f"Fitted by calibration/profile_fit.py from {Path(mlp_csv).name} (tp={tp}) and {Path(attention).name} "
        f"(tp={anchors.tp}{'' if anchors.tp == tp else ', rescaled by heads per GPU'}): token-level operators "
        f"(x{spec.layers} layers, embedding once; the table interpolates every measured row) and attention "
        f"(decode affine, prefill chunk-size tables) are measured; overhead_s = {overhead_s * 1e3:g} ms framework "
        f"step cost (calibrated from published vLLM 0.11 step times, calibration/overhead.py); lm_head_fixed_s = "
        f"vocab x hidden / tp bf16 weights at HBM bandwidth x fitted memory efficiency {eff.mem:.3f}; "
        f"per_sampled_seq_s = 2 x vocab x hidden / tp FLOPs at peak x fitted compute efficiency {eff.compute:.3f} "
        f"+ {SAMPLING_PASSES} fp32 passes over the logits; "
        + ("no all-reduce (tp=1)." if tp == 1 else
           f"all-reduce: {2 * spec.layers + 1} ring all-reduces, {ALLREDUCE_LATENCY_S * 1e6:g} us each + "
           f"2(tp-1)/tp x tokens x hidden x 2 B / {ALLREDUCE_BUS_BYTES_PER_S.get(gpu, float('nan')) / 1e9:g} GB/s.")
    )
    fit = ProfileFit(name, params, {}, lin, att, eff, [], prof, spec.layers)
    if anchors.tp == tp:
        fit.checks = evaluate_iterations(fit.model(), prof, anchors, spec.layers)
    fit.calibration = {
        "command": command,
        "profile": Path(mlp_csv).name,
        "attention": Path(attention).name,
        "mem_efficiency": sig(eff.mem),
        "compute_efficiency": sig(eff.compute),
        "framework_overhead_s": sig(overhead_s),
        "linear_mape_pct": sig(lin.linear_mape_pct, 4),
        "iteration_mape_pct": sig(fit.iteration_mape_pct, 4) if fit.checks else -1.0,
        "operators": list(lin.op_mape_pct),
        "operator_mape_pct": [sig(v, 4) for v in lin.op_mape_pct.values()],
    }
    return fit
