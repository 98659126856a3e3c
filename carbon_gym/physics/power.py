"""Power model: watts drawn by one GPU given what its engine is doing, plus node host power.

One interface, :class:`PowerModel`; one implementation, :class:`PhasePowerModel`, with its
parameters in ``carbon_gym/data/params/power/<gpu>.toml``.

Per GPU (watts)::

    idle:    idle_w                                                 (engine has no work)
    decode:  P_dec(n) = decode_max_w - (decode_max_w - decode_min_w) * exp(-(n - 1) / decode_sat_seqs)
    mixed:   P_dec(n) + (prefill_w - P_dec(n)) * min(1, prefill_tokens / prefill_sat_tokens)

(``n`` = decoding sequences; a prefill-only iteration uses ``P_dec(1)`` as its base). An engine of
TP degree ``k`` draws ``k`` times the per-GPU power. Each node also draws ``host_w`` (CPUs, memory,
fans, NICs) whatever the GPUs do. Facility power = IT power x PUE (applied by the datacenter).
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


def load_power_model(gpu: str, path: str | Path | None = None) -> PhasePowerModel:
    """Load the power model of ``gpu`` from the package or from ``path``."""
    p = Path(path) if path else data_path("params", "power", f"{gpu}.toml")
    if not p.exists():
        shipped = sorted(x.stem for x in data_path("params", "power").glob("*.toml"))
        raise ConfigError("power", f"no power parameters for gpu={gpu!r}", allowed=shipped)
    return PhasePowerModel.from_file(p)
