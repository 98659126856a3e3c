"""Power model: watts drawn by one GPU given what its engine is doing, plus node host power.

One interface, :class:`PowerModel`; one implementation, :class:`PhasePowerModel`, with its
parameters in ``carbon_gym/data/params/power/<gpu>.toml``.

Per GPU (watts)::

    idle:    idle_w                                                 (engine has no work)
    decode:  P_dec(n) = decode_max_w - (decode_max_w - decode_min_w) * exp(-(n - 1) / decode_sat_seqs)
    mixed:   P_dec(n) + (prefill_w - P_dec(n)) * min(1, prefill_tokens / prefill_sat_tokens)

(``n`` = decoding sequences; a prefill-only iteration uses ``P_dec(1)`` as its base). An engine of
TP degree ``k`` draws ``k`` times the per-GPU power. Each node also draws ``host_w`` (CPUs, memory,
fans, NICs) while it is on. Facility power = IT power x PUE (applied by the datacenter).

Capacity states (:class:`PowerStates`, the ``[states]`` table of the same file): an engine that
sleeps (vLLM sleep mode level 1: weights offloaded to host memory, KV cache freed) draws
``sleep_w`` per GPU; falling asleep and waking copy its weights (a fixed part + weights /
copy rate) at ``transition_w``; a node whose engines all sleep is in standby
(``host_standby_w``); a node that is off draws ``host_off_w`` (GPUs 0 W) and takes the boot
(``server_boot_s`` + the engines' cold start) at ``boot_host_w`` plus ``boot_gpu_w`` per GPU,
after which its engines are awake.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .._toml import data_path, load_toml
from ..errors import ConfigError, DataError, check_finite_nonneg


class PowerModel(Protocol):
    """Watts drawn per GPU by an engine in a given state, and the phase parameters the schedulers'
    energy estimates use (watts; sequences)."""

    idle_w: float
    host_w: float
    prefill_w: float
    decode_min_w: float
    decode_max_w: float
    decode_sat_seqs: float

    def gpu_power_w(self, prefill_tokens: int, n_decode: int) -> float:
        """Per-GPU watts during an iteration with this batch (``idle_w`` if both are 0)."""
        ...


@dataclass(frozen=True)
class PhasePowerModel:
    """Idle / prefill / batch-dependent decode power per GPU (see module docstring).

    Attributes:
        name: identifier, e.g. ``"a100-80gb"``.
        idle_w: GPU power with no work, watts.
        prefill_w: GPU power during a compute-bound prefill iteration, watts.
        decode_min_w: GPU power decoding a single sequence, watts.
        decode_max_w: GPU power decoding a saturated batch, watts.
        decode_sat_seqs: e-folding batch size of the decode power curve, sequences.
        prefill_sat_tokens: prefill tokens in an iteration at which power reaches prefill_w.
        host_w: non-GPU power of one node (server), watts.
        source: where the numbers come from.
    """

    name: str
    idle_w: float
    prefill_w: float
    decode_min_w: float
    decode_max_w: float
    decode_sat_seqs: float
    prefill_sat_tokens: float
    host_w: float
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("idle_w", "prefill_w", "decode_min_w", "decode_max_w", "host_w"):
            check_finite_nonneg(f"power.{f}", getattr(self, f))
        for f in ("decode_sat_seqs", "prefill_sat_tokens"):
            check_finite_nonneg(f"power.{f}", getattr(self, f), allow_zero=False)
        if self.decode_max_w < self.decode_min_w:
            raise ConfigError("power.decode_max_w", "must be >= decode_min_w")

    def decode_power_w(self, n_decode: int) -> float:
        """Per-GPU watts of a pure decode iteration with ``n_decode`` sequences (>= 1)."""
        n = max(n_decode, 1)
        return self.decode_max_w - (self.decode_max_w - self.decode_min_w) * math.exp(-(n - 1) / self.decode_sat_seqs)

    def gpu_power_w(self, prefill_tokens: int, n_decode: int) -> float:
        """Per-GPU watts during an iteration (``idle_w`` if the batch is empty)."""
        if prefill_tokens <= 0 and n_decode <= 0:
            return self.idle_w
        base = self.decode_power_w(n_decode)
        if prefill_tokens <= 0:
            return base
        frac = min(1.0, prefill_tokens / self.prefill_sat_tokens)
        return base + (self.prefill_w - base) * frac

    @classmethod
    def from_file(cls, path: str | Path) -> PhasePowerModel:
        """Load the ``[power]`` table of a parameter file."""
        raw = load_toml(path)
        if "power" not in raw:
            raise DataError(str(path), "missing [power] table")
        p = dict(raw["power"])
        name = str(p.pop("name", Path(path).stem))
        try:
            return cls(name=name, **p)
        except TypeError as exc:
            raise DataError(str(path), f"[power] keys wrong: {exc}") from None


@dataclass(frozen=True)
class PowerStates:
    """Power and latency of the capacity states (see the module docstring). Per GPU unless the
    name says host (per node); watts, seconds, GB (1e9 bytes).

    Attributes:
        sleep_w: GPU power of a sleeping engine (vLLM sleep level 1 keeps the CUDA context, which
            sets the idle floor: the same as an idle awake engine), W.
        transition_w: GPU power while weights are copied to or from host memory (falling asleep,
            waking), W.
        fall_asleep_fixed_s, wake_fixed_s: fixed part of falling asleep / waking, s.
        copy_gb_per_s_single: weights copied per second by one GPU alone (a TP1 engine), GB/s.
        copy_gb_per_s_node: per GPU when all the GPUs of an engine copy at once (TP > 1), GB/s.
        host_standby_w: non-GPU power of a node whose engines all sleep, W.
        host_off_w: power of a node that is off (BMC / standby rail; its GPUs draw nothing), W.
        server_boot_s: from off to the OS and GPU driver ready, s.
        cold_start_fixed_s, cold_start_s_per_gb: an engine's cold start after the boot (weights
            loaded, CUDA graphs captured): fixed part, s, and per GB of weights per GPU, s/GB.
        boot_host_w, boot_gpu_w: non-GPU power of a booting node, W, and per-GPU power meanwhile, W.
        source: where the numbers come from.

    :meth:`fall_asleep_s`, :meth:`wake_s` and :meth:`boot_s` give the durations for an engine
    holding ``weights_gb_per_gpu`` on each of its ``tp`` GPUs.
    """

    sleep_w: float
    transition_w: float
    fall_asleep_fixed_s: float
    wake_fixed_s: float
    copy_gb_per_s_single: float
    copy_gb_per_s_node: float
    host_standby_w: float
    host_off_w: float
    server_boot_s: float
    cold_start_fixed_s: float
    cold_start_s_per_gb: float
    boot_host_w: float
    boot_gpu_w: float
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("sleep_w", "transition_w", "fall_asleep_fixed_s", "wake_fixed_s", "host_standby_w", "host_off_w",
                  "server_boot_s", "cold_start_fixed_s", "cold_start_s_per_gb", "boot_host_w", "boot_gpu_w"):
            check_finite_nonneg(f"states.{f}", getattr(self, f))
        for f in ("copy_gb_per_s_single", "copy_gb_per_s_node"):
            check_finite_nonneg(f"states.{f}", getattr(self, f), allow_zero=False)

    def _copy_s(self, weights_gb_per_gpu: float, tp: int) -> float:
        rate = self.copy_gb_per_s_single if tp == 1 else self.copy_gb_per_s_node
        return weights_gb_per_gpu / rate

    def fall_asleep_s(self, weights_gb_per_gpu: float, tp: int) -> float:
        """Seconds an idle engine takes to fall asleep (offload its weights)."""
        return self.fall_asleep_fixed_s + self._copy_s(weights_gb_per_gpu, tp)

    def wake_s(self, weights_gb_per_gpu: float, tp: int) -> float:
        """Seconds a sleeping engine takes to wake (weights back; its KV cache is empty)."""
        return self.wake_fixed_s + self._copy_s(weights_gb_per_gpu, tp)

    def boot_s(self, weights_gb_per_gpu: float) -> float:
        """Seconds from a node's power-on to its engines serving (boot + cold start)."""
        return self.server_boot_s + self.cold_start_fixed_s + self.cold_start_s_per_gb * weights_gb_per_gpu

    @classmethod
    def from_table(cls, table: dict, source: str) -> PowerStates:
        """The ``[states]`` table of a parameter file (``source`` names it in errors)."""
        try:
            return cls(**table)
        except TypeError as exc:
            raise DataError(source, f"[states] keys wrong: {exc}") from None


def load_power_states(gpu: str, path: str | Path | None = None) -> PowerStates:
    """The capacity-state parameters (``[states]`` table) of ``gpu``'s power file, or of ``path``."""
    p = Path(path) if path else data_path("params", "power", f"{gpu}.toml")
    if not p.exists():
        shipped = sorted(x.stem for x in data_path("params", "power").glob("*.toml"))
        raise ConfigError("power", f"no power parameters for gpu={gpu!r}", allowed=shipped)
    raw = load_toml(p)
    if "states" not in raw:
        raise DataError(str(p), "missing [states] table (capacity-state parameters)")
    return PowerStates.from_table(dict(raw["states"]), str(p))


def load_power_model(gpu: str, path: str | Path | None = None) -> PhasePowerModel:
    """Load the power model of ``gpu`` from the package or from ``path``."""
    p = Path(path) if path else data_path("params", "power", f"{gpu}.toml")
    if not p.exists():
        shipped = sorted(x.stem for x in data_path("params", "power").glob("*.toml"))
        raise ConfigError("power", f"no power parameters for gpu={gpu!r}", allowed=shipped)
    return PhasePowerModel.from_file(p)
