"""Model and GPU specifications, loaded from ``carbon_gym/data/{models,gpus}.toml``.

A new model or GPU is a new TOML table, not new code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ._toml import data_path, load_toml
from .errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a transformer LLM served in bf16.

    Attributes:
        name: registry key, e.g. ``"llama-3.1-8b"``.
        layers, hidden, query_heads, kv_heads, head_dim, mlp_intermediate, vocab: shapes.
        experts, experts_per_token: MoE routing (1, 1 for dense models).
        params_total, params_active: parameter counts (active = per token).
        weight_bytes: bytes of weights in GPU memory across the whole TP group.
        default_tp: tensor-parallel degree used unless a scenario overrides it.
    """

    name: str
    display_name: str
    layers: int
    hidden: int
    query_heads: int
    kv_heads: int
    head_dim: int
    mlp_intermediate: int
    experts: int
    experts_per_token: int
    vocab: int
    params_total: float
    params_active: float
    weight_bytes: float
    default_tp: int

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache per token across the whole model (K and V, all layers, bf16)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator type.

    Attributes:
        memory_bytes: device memory in bytes.
        peak_bf16_flops: dense bf16 FLOP/s.
        hbm_bytes_per_s: memory bandwidth in bytes/s.
        tdp_w: thermal design power in watts.
        gpus_per_node: GPUs in one server of this type.
    """

    name: str
    display_name: str
    memory_bytes: float
    peak_bf16_flops: float
    hbm_bytes_per_s: float
    tdp_w: float
    gpus_per_node: int


@cache
def _table(file: str) -> dict:
    return load_toml(data_path(file))


def available_models() -> list[str]:
    """Names of the models shipped in ``models.toml``."""
    return sorted(_table("models.toml"))


def available_gpus() -> list[str]:
    """Names of the GPUs shipped in ``gpus.toml``."""
    return sorted(_table("gpus.toml"))


def load_model_spec(name: str, path: str | Path | None = None) -> ModelSpec:
    """Load a :class:`ModelSpec` by name from the packaged table (or a user TOML file)."""
    table = load_toml(path) if path else _table("models.toml")
    if name not in table:
        raise ConfigError("model", f"unknown model {name!r}", allowed=sorted(table))
    return ModelSpec(name=name, **table[name])


def load_gpu_spec(name: str, path: str | Path | None = None) -> GpuSpec:
    """Load a :class:`GpuSpec` by name from the packaged table (or a user TOML file)."""
    table = load_toml(path) if path else _table("gpus.toml")
    if name not in table:
        raise ConfigError("gpu", f"unknown GPU {name!r}", allowed=sorted(table))
    return GpuSpec(name=name, **table[name])
