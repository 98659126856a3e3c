"""Derive latency parameters of other models / TP degrees from a measured reference profile.

How (see also ``calibration/README.md``):

* **Reference.** The measured operator profile of the reference model (Llama-3-8B on A100) at the
  target's TP degree if the profile has it, else at TP 1; the attention anchors (TP 1); and the
  GPU's achieved memory / compute efficiencies fitted from them
  (:func:`calibration.profile_fit.fit_efficiencies`).
* **Dense token-level operators.** For every operator and token count ``n``, the target's time is
  the reference's *measured* (fitted) time multiplied by the ratio of the two operators'
  roofline times at the fitted efficiencies, ``max(bytes / (BW * e_mem), flops / (peak * e_comp))``
  with FLOPs and bytes per GPU from the shapes (:mod:`calibration.shapes`). The measured
  kernel-selection steps and efficiencies are kept; only the work changes. (Check: deriving
  Llama TP2 / TP4 from TP1 this way reproduces the measured TP2 / TP4 rows; the error is printed
  by ``calibrate derive``.)
* **MoE (Mixtral top-2 of 8).** ``n`` tokens touch ``E(n) = 8 (1 - (6/8)^n)`` distinct experts on
  average, each receiving ``n_e = 2 n / E(n)`` tokens, so the MLP operators take
  ``E(n) x t_expert(n_e)``, where ``t_expert`` is the reference MLP operator scaled to one
  expert's shape: at small batches the weight bytes read grow with the experts touched, at
  large batches the FLOPs are 2 experts per token. A router (gate matmul, top-k, token permute /
  un-permute) adds ``ROUTER_KERNELS`` minimal kernel times (the profile's smallest operator) plus
  its bytes at the fitted memory efficiency.
* **Attention.** The fitted per-layer coefficients scaled by query heads per GPU (prefill
  per-token and per-pair work) and KV heads per GPU (KV reads per context token, KV-cache save),
  times the target's layers; fixed launch terms per layer are kept.
* **Framework, LM head, all-reduce:** as in :mod:`calibration.profile_fit`, from the target's
  shapes (vocabulary, hidden, layers, TP).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError
from carbon_gym.physics.latency import TableLatencyModel, latency_params_path
from carbon_gym.specs import GpuSpec, ModelSpec, load_gpu_spec, load_model_spec

from .io import SHIPPED_ATTENTION, SHIPPED_MLP_CSV, dump_params_toml, load_attention_anchors, load_operator_profile
from .profile_fit import (
    ALLREDUCE_BUS_BYTES_PER_S, ALLREDUCE_LATENCY_S, FRAMEWORK_OVERHEAD_S, AttentionFit, Efficiencies, LinearFit,
    allreduce_fields, check_profile_matches, fit_attention, fit_efficiencies, fit_linear, fit_profile,
    framework_fields, mape_pct, measured_linear_s, sig,
)
from .shapes import ITERATION_OPS, MLP_OPS, OpCost, expected_experts_touched, op_cost, roofline_s

ROUTER_KERNELS = 4
DERIVED_GRID = (
    1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
    3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
)
REFERENCE_MODEL = "llama-3.1-8b"
# (model, tp) pairs shipped for the A100; the reference model's own TP degrees are fitted directly.
SHIPPED_TARGETS = (("qwen2.5-7b", 1), ("mixtral-8x7b", 4), ("llama-3.1-8b", 2), ("llama-3.1-8b", 4))


@dataclass
class DerivedFit:
    """Derived ``[latency]`` parameters of (gpu, model, tp) and how they were obtained."""

    name: str
    params: dict[str, Any]
    calibration: dict[str, Any] = field(default_factory=dict)
    grid: np.ndarray | None = None
    per_op_ms: dict[str, np.ndarray] = field(default_factory=dict)
    attention: AttentionFit | None = None
    efficiencies: Efficiencies | None = None

    def model(self) -> TableLatencyModel:
        """The derived latency model."""
        p = dict(self.params)
        return TableLatencyModel(name=p.pop("name"), **p)

    def tables(self) -> dict[str, dict[str, Any]]:
        """TOML tables of the parameter file."""
        return {"latency": self.params, "calibration": self.calibration}


def _ratio(tgt: ModelSpec, tgt_tp: int, ref: ModelSpec, ref_tp: int, op: str, n: float, gpu: GpuSpec,
           eff: Efficiencies) -> float:
    return roofline_s(op_cost(tgt, tgt_tp, op, n), gpu, eff.mem, eff.compute) / roofline_s(
        op_cost(ref, ref_tp, op, n), gpu, eff.mem, eff.compute)


def derived_op_ms(lin: LinearFit, op: str, ref: ModelSpec, ref_tp: int, tgt: ModelSpec, tp: int, gpu: GpuSpec,
                  eff: Efficiencies, n: float) -> float:
    """Per-layer ms of ``op`` for ``n`` tokens on the target, from the reference's fitted table."""
    t_ref = lambda x: float(np.interp(x, lin.knots, lin.op_tables_ms[op]))  # noqa: E731
    if tgt.experts > 1 and op in MLP_OPS:
        e = expected_experts_touched(tgt, n)
        n_e = n * tgt.experts_per_token / e
        return e * t_ref(n_e) * _ratio(tgt, tp, ref, ref_tp, op, n_e, gpu, eff)
    return t_ref(n) * _ratio(tgt, tp, ref, ref_tp, op, n, gpu, eff)


def router_ms(tgt: ModelSpec, n: float, floor_ms: float, gpu: GpuSpec, eff: Efficiencies) -> float:
    """Per-layer ms of MoE routing: gate matmul, top-k, permute and un-permute of the tokens."""
    k = tgt.experts_per_token
    cost = OpCost(2.0 * n * tgt.hidden * tgt.experts, 2.0 * (tgt.hidden * tgt.experts + n * tgt.hidden * (1 + 4 * k)))
    return ROUTER_KERNELS * floor_ms + roofline_s(cost, gpu, eff.mem, eff.compute) * 1e3


def derived_linear_s(lin: LinearFit, ref: ModelSpec, ref_tp: int, tgt: ModelSpec, tp: int, gpu: GpuSpec,
                     eff: Efficiencies, grid: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Seconds of all token-level operators of one target iteration at each ``grid`` point."""
    floor_ms = float(min(t[0] for t in lin.op_tables_ms.values()))
    per_op: dict[str, np.ndarray] = {}
    for op in lin.op_tables_ms:
        per_op[op] = np.array([derived_op_ms(lin, op, ref, ref_tp, tgt, tp, gpu, eff, n) for n in grid])
    if tgt.experts > 1:
        per_op["moe_router"] = np.array([router_ms(tgt, n, floor_ms, gpu, eff) for n in grid])
    total = sum((1 if op in ITERATION_OPS else tgt.layers) * t for op, t in per_op.items())
    return np.asarray(total) * 1e-3, per_op


def derive_latency(model: str, tp: int, gpu: str = "a100-80gb", reference: str = REFERENCE_MODEL,
                   mlp_csv: str | Path = SHIPPED_MLP_CSV, attention: str | Path = SHIPPED_ATTENTION,
                   reference_tp: int | None = None, overhead_s: float = FRAMEWORK_OVERHEAD_S,
                   command: str = "python -m calibration derive --write") -> DerivedFit:
    """Derive the ``[latency]`` parameters of (gpu, model, tp) from the reference profile.

    ``reference_tp`` forces the TP degree of the reference rows (default: ``tp`` if the profile
    has it, else 1).
    """
    ref, tgt, g = load_model_spec(reference), load_model_spec(model), load_gpu_spec(gpu)
    if tp < 1 or g.gpus_per_node % tp:
        raise ConfigError("tp", f"must divide the {g.gpus_per_node} GPUs of a node, got {tp}")
    profiles = load_operator_profile(mlp_csv)
    ref_tp = reference_tp if reference_tp is not None else (tp if tp in profiles else 1)
    if ref_tp not in profiles:
        raise ConfigError("reference_tp", f"profile has no rows for tp={ref_tp}", allowed=sorted(profiles))
    prof = profiles[ref_tp]
    check_profile_matches(prof, ref)
    anchors = load_attention_anchors(attention)
    eff = fit_efficiencies(profiles.get(1, prof), ref, g) if 1 in profiles else fit_efficiencies(prof, ref, g)
    lin = fit_linear(prof, ref.layers)
    grid = np.asarray(lin.knots, dtype=np.float64)  # the reference profile's measured rows
    linear, per_op = derived_linear_s(lin, ref, ref_tp, tgt, tp, g, eff, grid)
    att = fit_attention(anchors, profiles.get(anchors.tp))
    q_ratio = (tgt.query_heads * tgt.head_dim / tp) / (ref.query_heads * ref.head_dim / anchors.tp)
    kv_ratio = (tgt.kv_heads * tgt.head_dim / tp) / (ref.kv_heads * ref.head_dim / anchors.tp)
    att = att.scaled(q_ratio, kv_ratio)
    name = f"{gpu}__{model}__tp{tp}"
    params: dict[str, Any] = {"name": name, "tokens_grid": [float(x) for x in grid], "linear_s": [sig(x) for x in linear]}
    params.update(framework_fields(tgt, g, tp, eff, overhead_s))
    params.update(att.latency_fields(tgt.layers))
    params.update(allreduce_fields(tgt, g, tp))
    moe = (f" MoE: E(n) = {tgt.experts} (1 - (1 - {tgt.experts_per_token}/{tgt.experts})^n) experts touched, each "
           f"running the reference MLP scaled to one expert at 2n/E(n) tokens, + router ({ROUTER_KERNELS} minimal kernels + "
           f"its bytes).") if tgt.experts > 1 else ""
    params["source"] = (
        f"Derived by calibration/derive.py from the measured {reference} profile ({Path(mlp_csv).name}, tp={ref_tp}) "
        f"and attention anchors (tp={anchors.tp}): each token-level operator = measured reference time x ratio of "
        f"roofline times (bytes / (BW x {eff.mem:.3f}) vs FLOPs / (peak x {eff.compute:.3f}), fitted efficiencies) "
        f"of the target's and the reference's shapes per GPU.{moe} Attention scaled by query heads ({q_ratio:.4g}x) and "
        f"KV heads ({kv_ratio:.4g}x) per GPU and x{tgt.layers} layers. Framework overhead "
        f"{overhead_s * 1e3:g} ms, LM head and sampling from the shapes"
        + ("." if tp == 1 else
           f"; {2 * tgt.layers + 1} ring all-reduces ({ALLREDUCE_LATENCY_S * 1e6:g} us + "
           f"{ALLREDUCE_BUS_BYTES_PER_S.get(gpu, float('nan')) / 1e9:g} GB/s bus bandwidth).")
    )
    calib = {"command": command, "reference": reference, "reference_tp": ref_tp, "profile": Path(mlp_csv).name,
             "mem_efficiency": sig(eff.mem), "compute_efficiency": sig(eff.compute), "query_head_ratio": sig(q_ratio),
             "kv_head_ratio": sig(kv_ratio), "framework_overhead_s": sig(overhead_s)}
    return DerivedFit(name, params, calib, grid, per_op, att, eff)


def tp_scaling_check(gpu: str = "a100-80gb", mlp_csv: str | Path = SHIPPED_MLP_CSV) -> dict[int, float]:
    """MAPE (%) of the token-level time derived from TP 1 against each measured TP > 1 profile.

    Validates the roofline-ratio method used for the models without a measured profile.
    """
    ref, g = load_model_spec(REFERENCE_MODEL), load_gpu_spec(gpu)
    profiles = load_operator_profile(mlp_csv)
    eff = fit_efficiencies(profiles[1], ref, g)
    lin = fit_linear(profiles[1], ref.layers)
    out = {}
    for tp, prof in sorted(profiles.items()):
        if tp == 1 or g.gpus_per_node % tp:
            continue
        grid = np.asarray(prof.tokens, dtype=np.float64)
        derived, _ = derived_linear_s(lin, ref, 1, ref, tp, g, eff, grid)
        pred = np.interp(prof.tokens, grid, derived)
        out[tp] = mape_pct(pred, measured_linear_s(prof, ref.layers, prof.tokens))
    return out


def shipped_fit(model: str, tp: int, gpu: str = "a100-80gb", **kw: Any):
    """Parameters of a shipped (model, tp): fitted from the profile for the reference model, else derived."""
    if model == REFERENCE_MODEL:
        return fit_profile(model=model, gpu=gpu, tp=tp, command=kw.pop("command", "python -m calibration derive --write"), **kw)
    return derive_latency(model, tp, gpu=gpu, **kw)


def write_fit(fit: Any, path: str | Path | None = None) -> Path:
    """Write a fit's parameter file (default: the packaged path for its name)."""
    gpu, model, tp = fit.name.split("__")
    p = Path(path) if path else latency_params_path(gpu, model, int(tp[2:]))
    header = [f"GENERATED by `{fit.calibration.get('command', 'calibration')}` -- do not edit by hand.",
              "See calibration/README.md for how these numbers were obtained and how to recalibrate."]
    dump_params_toml(p, fit.tables(), header)
    return p


# --------------------------------------------------------------------------- other GPUs

SOURCE_GPU = "a100-80gb"
# (gpu, model, tp) sets shipped for GPUs without a kernel profile: derived from the A100-80GB ones.
SHIPPED_GPU_TARGETS = tuple((g, m, tp) for g in ("a100-40gb", "h100-80gb", "h200")
                            for m, tp in (("llama-3.1-8b", 1), ("llama-3.1-8b", 2), ("llama-3.1-8b", 4),
                                          ("qwen2.5-7b", 1), ("mixtral-8x7b", 4)))


def _op_tables(fit: Any) -> tuple[np.ndarray, dict[str, np.ndarray], AttentionFit, Efficiencies]:
    """(grid, per-layer ms of each operator, attention fit, efficiencies) of a fitted or derived set."""
    if isinstance(fit, DerivedFit):
        assert fit.grid is not None and fit.attention is not None and fit.efficiencies is not None
        return fit.grid, fit.per_op_ms, fit.attention, fit.efficiencies
    return np.asarray(fit.linear.knots), fit.linear.op_tables_ms, fit.attention, fit.efficiencies


def gpu_op_ratio(spec: ModelSpec, tp: int, op: str, n: float, src: GpuSpec, tgt: GpuSpec, eff: Efficiencies) -> float:
    """Roofline time of ``op`` (``n`` tokens, per GPU) on ``tgt`` over that on ``src``, same efficiencies.

    Operators without a cost model (the MoE router) are memory-bound at serving batch sizes and
    scale with the bandwidth ratio.
    """
    try:
        cost = op_cost(spec, tp, op, n)
    except KeyError:
        return src.hbm_bytes_per_s / tgt.hbm_bytes_per_s
    return roofline_s(cost, tgt, eff.mem, eff.compute) / roofline_s(cost, src, eff.mem, eff.compute)


def derive_for_gpu(model: str, tp: int, gpu: str, source_gpu: str = SOURCE_GPU,
                   overhead_s: float = FRAMEWORK_OVERHEAD_S,
                   command: str = "python -m calibration derive --gpus --write") -> DerivedFit:
    """Latency set of (``gpu``, model, tp) from the measured-profile set on ``source_gpu`` by roofline scaling.

    Every token-level operator at every token count: source time x (target roofline time /
    source roofline time), ``max(bytes / (BW e_mem), FLOPs / (peak e_comp))`` with the source's
    fitted efficiencies (the two GPUs are assumed to reach the same fractions of their peaks).
    Attention: memory-bound terms (decode attention per sequence and per context token, KV-cache
    saves, the per-chunk part of prefill attention) x the bandwidth ratio; the per-(query, key)
    pair prefill work x the peak FLOP/s ratio; fixed launch terms kept. LM head and sampling from
    the target's bandwidth / FLOP/s; all-reduce from its NVLink; the framework overhead (CPU work)
    is kept.
    """
    src, tgt, spec = load_gpu_spec(source_gpu), load_gpu_spec(gpu), load_model_spec(model)
    if tp < 1 or tgt.gpus_per_node % tp:
        raise ConfigError("tp", f"must divide the {tgt.gpus_per_node} GPUs of a node, got {tp}")
    base = shipped_fit(model, tp, gpu=source_gpu, overhead_s=overhead_s)
    grid, per_op, att, eff = _op_tables(base)
    total = np.zeros(grid.size)
    for op, t in per_op.items():
        ratio = np.array([gpu_op_ratio(spec, tp, op, float(n), src, tgt, eff) for n in grid])
        total = total + (1 if op in ITERATION_OPS else spec.layers) * np.asarray(t) * ratio
    mem_ratio = src.hbm_bytes_per_s / tgt.hbm_bytes_per_s
    compute_ratio = src.peak_bf16_flops / tgt.peak_bf16_flops
    att_t = att.roofline_scaled(mem_ratio, compute_ratio)
    name = f"{gpu}__{model}__tp{tp}"
    params: dict[str, Any] = {"name": name, "tokens_grid": [float(x) for x in grid],
                              "linear_s": [sig(x) for x in total * 1e-3]}
    params.update(framework_fields(spec, tgt, tp, eff, overhead_s))
    params.update(att_t.latency_fields(spec.layers))
    params.update(allreduce_fields(spec, tgt, tp))
    params["source"] = (
        f"Derived by calibration/derive.py (derive_for_gpu) from {source_gpu}__{model}__tp{tp} by roofline scaling: "
        f"each token-level operator x max(bytes/BW, FLOPs/peak) on {tgt.display_name} over that on {src.display_name} "
        f"at the source's fitted efficiencies (mem {eff.mem:.3f}, compute {eff.compute:.3f}); attention: memory-bound "
        f"terms x {mem_ratio:.4g} (HBM bandwidth ratio), prefill per-pair work x {compute_ratio:.4g} (peak bf16 ratio), "
        f"launch terms kept; LM head / sampling / all-reduce from the target's datasheet figures; framework "
        f"overhead {overhead_s * 1e3:g} ms kept (CPU work, see calibration/measurements/README.md)."
    )
    calib = {"command": command, "source_set": f"{source_gpu}__{model}__tp{tp}", "mem_efficiency": sig(eff.mem),
             "compute_efficiency": sig(eff.compute), "hbm_ratio": sig(mem_ratio), "peak_ratio": sig(compute_ratio),
             "framework_overhead_s": sig(overhead_s)}
    return DerivedFit(name, params, calib, grid, {}, att_t, eff)


def gpu_scaling_check(source_csv: str | Path, target_csv: str | Path, source_gpu: str, target_gpu: str,
                      model: str = "llama-3.1-8b", model_spec_path: str | Path | None = None,
                      tp: int = 1) -> dict[str, float]:
    """Check of :func:`derive_for_gpu`'s method against two measured operator profiles of one model.

    Derives the token-level time on ``target_gpu`` from the ``source_csv`` profile measured on
    ``source_gpu`` and compares it with ``target_csv`` measured on ``target_gpu`` (both Vidur
    ``mlp.csv`` format, same model). Returns MAPE (%) over the common token counts, overall and for
    <= 128 tokens (decode-sized) and > 128 tokens.
    """
    spec = load_model_spec(model, model_spec_path)
    src, tgt = load_gpu_spec(source_gpu), load_gpu_spec(target_gpu)
    ps, pt = load_operator_profile(source_csv)[tp], load_operator_profile(target_csv)[tp]
    eff = fit_efficiencies(ps, spec, src)
    toks = np.array(sorted(set(ps.tokens.tolist()) & set(pt.tokens.tolist())), dtype=np.float64)
    pred = np.zeros(toks.size)
    from .profile_fit import profile_ops
    for op in profile_ops(ps):
        ratio = np.array([gpu_op_ratio(spec, tp, op, float(n), src, tgt, eff) for n in toks])
        pred = pred + (1 if op in ITERATION_OPS else spec.layers) * ps.op_at(op, toks) * ratio
    meas = measured_linear_s(pt, spec.layers, toks) * 1e3
    small = toks <= 128
    return {"all": mape_pct(pred, meas), "tokens<=128": mape_pct(pred[small], meas[small]),
            "tokens>128": mape_pct(pred[~small], meas[~small]), "points": float(toks.size)}
