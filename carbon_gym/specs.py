"""Model and GPU specifications, loaded from ``carbon_gym/data/{models,gpus}.toml``.

A new model or GPU is a new TOML table, not new code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ._toml import data_path, load_toml
from .errors import ConfigError
from .schema import Ctx, integer, num, parse_table, string
from .schema import spec as spec_field


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


#: Accepted ranges of a GPU table's numbers (each checked finite; bounds far beyond any shipped
#: accelerator, there to catch unit slips and sign errors, not to pick winners).
GPU_MEMORY_BYTES_MAX = 1024e9  # 1 TiB-class device memory
GPU_FLOPS_MAX = 1e17  # 100 PFLOP/s dense bf16
GPU_HBM_BYTES_PER_S_MAX = 1e14  # 100 TB/s
GPU_TDP_W_MAX = 5000
GPUS_PER_NODE_MAX = 64


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator type: a ``[<gpu name>]`` table of ``gpus.toml`` (or of a user file given by
    path, e.g. a scenario's ``[gpu_files.<name>] spec``), validated like a scenario table by
    :func:`~carbon_gym.schema.parse_table` (every field required, typed and finite; an unknown key
    is refused with a suggestion).

    Attributes:
        name: registry key (the table's name), e.g. ``"a100-80gb"``.
        display_name: a label, e.g. ``"A100-SXM4-80GB"``.
        memory_bytes: device memory in bytes, in (0, 1.024e12].
        peak_bf16_flops: dense bf16 FLOP/s, in (0, 1e17].
        hbm_bytes_per_s: memory bandwidth in bytes/s, in (0, 1e14].
        tdp_w: thermal design power in watts, in (0, 5000].
        gpus_per_node: GPUs in one server of this type, an integer in [1, 64].
    """

    name: str
    display_name: str = spec_field(string(), "label shown in tables and plots")
    memory_bytes: float = spec_field(num(0, GPU_MEMORY_BYTES_MAX, lo_open=True), "device memory, bytes")
    peak_bf16_flops: float = spec_field(num(0, GPU_FLOPS_MAX, lo_open=True), "dense bf16 FLOP/s")
    hbm_bytes_per_s: float = spec_field(num(0, GPU_HBM_BYTES_PER_S_MAX, lo_open=True), "memory bandwidth, bytes/s")
    tdp_w: float = spec_field(num(0, GPU_TDP_W_MAX, lo_open=True), "thermal design power, watts")
    gpus_per_node: int = spec_field(integer(1, GPUS_PER_NODE_MAX), "GPUs in one server")


@cache
def _table(file: str) -> dict:
    return load_toml(data_path(file))


def available_models() -> list[str]:
    """Names of the models shipped in ``models.toml``."""
    return sorted(_table("models.toml"))


def available_gpus(path: str | Path | None = None) -> list[str]:
    """Names of the GPUs shipped in ``gpus.toml`` (or the tables of a user GPU file ``path``)."""
    return sorted(load_toml(path) if path else _table("gpus.toml"))


def load_model_spec(name: str, path: str | Path | None = None) -> ModelSpec:
    """Load a :class:`ModelSpec` by name from the packaged table (or a user TOML file)."""
    table = load_toml(path) if path else _table("models.toml")
    if name not in table:
        raise ConfigError("model", f"unknown model {name!r}", allowed=sorted(table))
    return ModelSpec(name=name, **table[name])


def load_gpu_spec(name: str, path: str | Path | None = None) -> GpuSpec:
    """Load a :class:`GpuSpec` by name from the packaged table (or a user TOML file ``path``).

    Raises:
        ConfigError: ``gpu`` if the file has no table ``name``; else ``<name>.<field>``, the
            error's ``source`` the file, for a missing, mistyped, non-finite or out-of-range field
            or an unknown key (ranges: see :class:`GpuSpec`).
    """
    table = load_toml(path) if path else _table("gpus.toml")
    if name not in table:
        raise ConfigError("gpu", f"unknown GPU {name!r}", allowed=sorted(table))
    source = str(path) if path else str(data_path("gpus.toml"))
    return parse_table(GpuSpec, table[name], name, Ctx(source), fixed={"name": name})
