"""Work of each profiled operator from a model's shapes: FLOPs and bytes moved per GPU.

Used three ways: to fit the GPU's achieved memory / compute efficiency from a profile, to
derive another model's (or TP degree's) operator times from a measured one by the ratio of
their roofline times, and to size the profiler's tensors.

Conventions (bf16, 2 bytes per element; ``n`` tokens in the iteration; ``tp`` GPUs per engine,
Megatron-style sharding as in vLLM: QKV and MLP-up column-parallel, out and MLP-down
row-parallel, norms / residual add replicated, vocabulary-parallel embedding and LM head).
"""

from __future__ import annotations

from dataclasses import dataclass

from carbon_gym.specs import GpuSpec, ModelSpec

BYTES_BF16 = 2
MATMUL_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
LAYER_OPS = (
    "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
    "mlp_up_proj", "mlp_act", "mlp_down_proj", "add",
)
OPTIONAL_LAYER_OPS = ("moe_router",)  # measured by the profiler for mixture-of-experts models
ITERATION_OPS = ("emb",)
MLP_OPS = ("mlp_up_proj", "mlp_act", "mlp_down_proj")


@dataclass(frozen=True)
class OpCost:
    """FLOPs and HBM bytes of one operator call on one GPU."""

    flops: float
    bytes: float


def matmul_dims(spec: ModelSpec, tp: int, op: str) -> tuple[int, int]:
    """(K, M) of the weight of a dense projection on one GPU: input and output features."""
    q = spec.query_heads * spec.head_dim
    kv = spec.kv_heads * spec.head_dim
    if op == "attn_pre_proj":
        return spec.hidden, (q + 2 * kv) // tp
    if op == "attn_post_proj":
        return q // tp, spec.hidden
    if op == "mlp_up_proj":  # gate and up fused (SwiGLU)
        return spec.hidden, 2 * spec.mlp_intermediate // tp
    if op == "mlp_down_proj":
        return spec.mlp_intermediate // tp, spec.hidden
    raise KeyError(op)


def op_cost(spec: ModelSpec, tp: int, op: str, n: float) -> OpCost:
    """Work of ``op`` for ``n`` tokens on one GPU of a TP-``tp`` engine (one dense expert for MLP ops)."""
    b = BYTES_BF16
    h = spec.hidden
    if op in MATMUL_OPS:
        k, m = matmul_dims(spec, tp, op)
        return OpCost(2.0 * n * k * m, b * (k * m + n * (k + m)))
    if op in ("input_layernorm", "post_attention_layernorm"):
        return OpCost(4.0 * n * h, b * (2 * n * h + h))
    if op == "attn_rope":
        width = (spec.query_heads + spec.kv_heads) * spec.head_dim / tp
        return OpCost(3.0 * n * width, b * 2 * n * width)
    if op == "mlp_act":  # silu(gate) * up
        width = spec.mlp_intermediate / tp
        return OpCost(5.0 * n * width, b * 3 * n * width)
    if op == "add":
        return OpCost(n * h, b * 3 * n * h)
    if op == "emb":
        return OpCost(0.0, b * 2 * n * h / tp)
    raise KeyError(op)


def roofline_s(cost: OpCost, gpu: GpuSpec, mem_eff: float, compute_eff: float) -> float:
    """Seconds of an operator at the fitted efficiencies: max(memory time, compute time)."""
    return max(cost.bytes / (gpu.hbm_bytes_per_s * mem_eff), cost.flops / (gpu.peak_bf16_flops * compute_eff))


def expected_experts_touched(spec: ModelSpec, n: float) -> float:
    """Expected distinct experts a batch of ``n`` tokens routes to (uniform top-k routing).

    Each token picks ``k`` distinct experts of ``E``; an expert is missed by one token with
    probability ``1 - k/E``, so ``E * (1 - (1 - k/E)**n)`` experts are touched on average.
    """
    e, k = spec.experts, spec.experts_per_token
    if e <= 1:
        return 1.0
    return e * (1.0 - (1.0 - k / e) ** n)


def lm_head_cost(spec: ModelSpec, tp: int, n_sampled: float) -> OpCost:
    """LM head on one GPU: vocabulary-parallel ``hidden x vocab/tp`` weight, ``n_sampled`` rows."""
    k, m = spec.hidden, spec.vocab / tp
    return OpCost(2.0 * n_sampled * k * m, BYTES_BF16 * (k * m + n_sampled * (k + m)))
