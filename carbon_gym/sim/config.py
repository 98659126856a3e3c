"""The vLLM engine settings shared by every engine of a simulation (:class:`EngineConfig`).

Kept out of :mod:`carbon_gym.sim.engine`, which may be compiled (mypyc): a configuration object
stays a plain frozen dataclass (copyable, picklable, ``dataclasses.replace``-able) and reports
bad values through :meth:`EngineConfig.validate` rather than a compiled type check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["EngineConfig", "GpuModels"]


@dataclass(frozen=True)
class GpuModels:
    """The models of one GPU type, for the datacenters whose nodes have it (heterogeneous
    topologies: ``Simulator(..., gpus={name: GpuModels(...)})``).

    Attributes:
        spec: :class:`~carbon_gym.specs.GpuSpec` (memory: the KV cache; TDP).
        latency: iteration latency model for this GPU, the simulation's model and ``tp``.
        power: per-GPU power model (``host_w``: a node's non-GPU power).
        states: :class:`~carbon_gym.physics.power.PowerStates` (capacity control), or None.
    """

    spec: Any
    latency: Any
    power: Any
    states: Any = None


@dataclass(frozen=True)
class EngineConfig:
    """vLLM engine settings shared by every engine of a simulation.

    Attributes:
        tp: GPUs per engine (tensor-parallel degree); must divide the node's GPU count.
        block_tokens: tokens per paged KV block.
        gpu_memory_utilization: fraction of GPU memory for weights + KV cache.
        max_num_seqs: most sequences in a running batch.
        max_num_batched_tokens: per-iteration token budget (decode tokens + prefill chunks);
            must be >= max_num_seqs.
        chunked_prefill: mix prefill chunks with decodes (vLLM V1 default) or alternate
            prefill-only and decode-only iterations.
        max_model_len: largest prompt + output accepted, tokens.
        prefix_caching: automatic prefix caching (:mod:`carbon_gym.sim.prefix_cache`): requests
            that carry ``prefix_hashes`` reuse the KV blocks of cached prompt prefixes. Off by
            default (then every result is that of an engine without it).
        prefix_block_tokens: tokens per prefix block, the unit of ``prefix_hashes`` (Mooncake:
            512); a multiple of ``block_tokens`` (one prefix block = that many / block_tokens KV blocks).
    """

    tp: int = 1
    block_tokens: int = 16
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    chunked_prefill: bool = True
    max_model_len: int = 32768
    prefix_caching: bool = False
    prefix_block_tokens: int = 512

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid field."""
        for name in ("tp", "block_tokens", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "prefix_block_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"engine.{name}", f"must be an integer >= 1, got {v!r}")
        g = self.gpu_memory_utilization
        if not isinstance(g, (int, float)) or not (0.0 < g <= 1.0):
            raise ConfigError("engine.gpu_memory_utilization", f"must be in (0, 1], got {g!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                "engine.max_num_batched_tokens",
                f"must be >= max_num_seqs ({self.max_num_seqs}), got {self.max_num_batched_tokens}",
            )
        if self.max_model_len < 2:
            raise ConfigError("engine.max_model_len", "must be >= 2 (one prompt and one output token)")
        if not isinstance(self.prefix_caching, bool):
            raise ConfigError("engine.prefix_caching", f"must be true or false, got {self.prefix_caching!r}",
                              allowed=[True, False])
        if self.prefix_block_tokens % self.block_tokens:
            bt = self.block_tokens
            raise ConfigError("engine.prefix_block_tokens", f"must be a multiple of block_tokens ({bt}), got "
                              f"{self.prefix_block_tokens}", allowed=f"{bt}, {2 * bt}, ... (Mooncake traces: 512)")
