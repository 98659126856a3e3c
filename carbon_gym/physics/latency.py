"""Iteration latency model: how long one engine iteration takes for a given batch.

One interface, :class:`IterationLatencyModel`, and one implementation,
:class:`TableLatencyModel`, whose coefficients live in
``carbon_gym/data/params/latency/<gpu>__<model>__tp<k>.toml`` (written by ``calibration/``).

Functional form (all times in seconds, for the whole forward pass of one iteration)::

    T = overhead_s                                    # framework / scheduler, every iteration
      + [n_sampled > 0] * lm_head_fixed_s             # LM-head weight read, once per iteration
      + per_sampled_seq_s      * n_sampled            # LM head flops + sampling, per sequence
      + linear(num_tokens)                            # token-level operators x layers (table)
      + [n_decode > 0] * attn_decode_fixed_s          # decode attention kernels, fixed part
      + attn_decode_per_seq_s  * n_decode             # decode attention + KV save, per sequence
      + attn_decode_per_ctx_s  * decode_ctx_sum       # decode attention, per cached token read
      + [prefill_tokens > 0] * attn_prefill_fixed_s   # prefill attention kernels, fixed part
      + attn_prefill_per_token_s * prefill_tokens     # prefill attention + KV save, per token
      + attn_prefill_per_pair_s  * prefill_attn_pairs # prefill attention, per (query, key) pair
      + [prefill_tokens > 0] * (A(prefill_tokens) + B(prefill_tokens) * prefill_attn_pairs)
                                                      # prefill attention + KV save, tables (optional)
      + allreduce_fixed_s + allreduce_per_token_s * num_tokens   # TP > 1 all-reduces

with ``num_tokens = prefill_tokens + n_decode`` and ``linear`` a piecewise-linear interpolation
of a (tokens, seconds) table (linear extrapolation past its ends). ``A`` (seconds) and ``B``
(seconds per pair) are optional piecewise-linear tables over the iteration's prefill tokens
(``attn_prefill_grid``, ``attn_prefill_table_s``, ``attn_prefill_pair_table_s``): the measured
attention kernels' cost per (query, key) pair depends on the chunk size, which one affine form
cannot represent. Below the grid's first point both are held at their first value; above its
last, ``A`` is extrapolated linearly and ``B`` held. Files without the tables use the scalar
terms alone. ``[c]`` is 1 if ``c`` holds else 0. The *kernel* part (:meth:`TableLatencyModel.kernel_time_s`: linear + attention terms) is
what a per-operator profile measures; the rest (overhead, LM head, all-reduce) is added by
``calibration/`` from first principles or fitted end to end (see ``calibration/README.md``).

**Contract used by the simulator's closed-form fast path:** T is *affine in decode_ctx_sum* with
slope :meth:`IterationLatencyModel.decode_ctx_coeff_s`, everything else held fixed. During a run
of pure decode iterations with ``n`` sequences, the context sum grows by ``n`` per iteration, so
iteration ``k`` of the run takes ``T_0 + k * n * decode_ctx_coeff_s``. Any other implementation
must keep this property.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from .._toml import data_path, load_toml
from ..errors import ConfigError, DataError, check_finite_nonneg

_SCALAR_FIELDS = (
    "overhead_s", "per_sampled_seq_s", "attn_decode_per_seq_s", "attn_decode_per_ctx_s",
    "attn_prefill_per_token_s", "attn_prefill_per_pair_s", "allreduce_fixed_s",
    "allreduce_per_token_s", "lm_head_fixed_s", "attn_decode_fixed_s", "attn_prefill_fixed_s",
)


_TABLE_FIELDS = ("attn_prefill_grid", "attn_prefill_table_s", "attn_prefill_pair_table_s")

# (grid, A, slopes of A, B, slopes of B), plain Python floats: shared by the model and by the
# simulator's pure-Python copy (carbon_gym/sim/kernels.py) so that both compute the same floats.
PrefillTable = tuple[list[float], list[float], list[float], list[float], list[float]]


def _prefill_table(grid: object, a: object, b: object) -> PrefillTable | None:
    """Validated prefill attention tables (None when the file has none)."""
    g = [float(x) for x in grid]  # type: ignore[attr-defined]
    av = [float(x) for x in a]  # type: ignore[attr-defined]
    bv = [float(x) for x in b]  # type: ignore[attr-defined]
    if not g and not av and not bv:
        return None
    if len(g) < 2 or len(av) != len(g) or len(bv) != len(g):
        raise ConfigError("latency.attn_prefill_grid",
                          "attn_prefill_grid, attn_prefill_table_s and attn_prefill_pair_table_s need the same "
                          "length, at least 2 points")
    if any(y <= x for x, y in zip(g, g[1:])):
        raise ConfigError("latency.attn_prefill_grid", "must be strictly increasing")
    if any(not np.isfinite(v) or v < 0 for v in av + bv):
        raise ConfigError("latency.attn_prefill_table_s", "tables must be finite and >= 0")
    sa = [(av[i + 1] - av[i]) / (g[i + 1] - g[i]) for i in range(len(g) - 1)]
    sb = [(bv[i + 1] - bv[i]) / (g[i + 1] - g[i]) for i in range(len(g) - 1)]
    return g, av, sa, bv, sb


def prefill_table_s(table: PrefillTable, prefill_tokens: float, pairs: float) -> float:
    """``A(prefill_tokens) + B(prefill_tokens) * pairs`` of the prefill attention tables, seconds."""
    g, av, sa, bv, sb = table
    if prefill_tokens <= g[0]:
        return av[0] + bv[0] * pairs
    i = bisect_right(g, prefill_tokens) - 1
    last = len(g) - 2
    if i > last:
        i = last
    dx = prefill_tokens - g[i]
    a = av[i] + sa[i] * dx
    b = bv[-1] if prefill_tokens >= g[-1] else bv[i] + sb[i] * dx
    return a + b * pairs


class IterationLatencyModel(Protocol):
    """Time of one engine iteration as a function of its batch."""

    def iteration_time_s(
        self,
        prefill_tokens: int,
        prefill_attn_pairs: float,
        n_decode: int,
        decode_ctx_sum: float,
        n_sampled: int,
    ) -> float:
        """Seconds for one iteration.

        Args:
            prefill_tokens: prompt tokens computed in this iteration (all chunks).
            prefill_attn_pairs: sum over prefill chunks of ``chunk * (kv_before + (chunk + 1) / 2)``,
                the number of (query, key) pairs the prefill attention computes.
            n_decode: sequences decoding one token each.
            decode_ctx_sum: sum of the context lengths (tokens in KV) the decode sequences attend to.
            n_sampled: sequences that sample a token at the end of the iteration
                (decodes + prefills that finish their prompt).
        """
        ...

    def decode_ctx_coeff_s(self) -> float:
        """Slope of :meth:`iteration_time_s` in ``decode_ctx_sum`` (seconds per context token)."""
        ...


@dataclass(frozen=True)
class TableLatencyModel:
    """Calibrated iteration latency model (see the module docstring for its form).

    Attributes:
        name: identifier, e.g. ``"a100-80gb__llama-3.1-8b__tp1"``.
        tokens_grid: increasing token counts of the linear-operator table.
        linear_s: seconds of all token-level operators of all layers at each grid point.
        overhead_s: per-iteration framework / scheduling overhead, seconds.
        per_sampled_seq_s: LM head flops + sampling per sampled sequence, seconds.
        attn_decode_per_seq_s, attn_decode_per_ctx_s: decode attention coefficients, seconds.
        attn_prefill_per_token_s, attn_prefill_per_pair_s: prefill attention coefficients, seconds.
        allreduce_fixed_s, allreduce_per_token_s: tensor-parallel communication, seconds.
        lm_head_fixed_s: LM-head weight read, once per iteration that samples, seconds.
        attn_decode_fixed_s, attn_prefill_fixed_s: fixed attention kernel time per iteration
            that has decodes / prefill tokens, seconds.
        attn_prefill_grid: prefill tokens of the optional prefill attention tables (empty: none).
        attn_prefill_table_s: prefill attention + KV save seconds at each grid point, excluding
            the per-pair part.
        attn_prefill_pair_table_s: prefill attention seconds per (query, key) pair at each grid point.
        source: free text saying how the numbers were obtained.
    """

    name: str
    tokens_grid: np.ndarray
    linear_s: np.ndarray
    overhead_s: float
    per_sampled_seq_s: float
    attn_decode_per_seq_s: float
    attn_decode_per_ctx_s: float
    attn_prefill_per_token_s: float
    attn_prefill_per_pair_s: float
    allreduce_fixed_s: float = 0.0
    allreduce_per_token_s: float = 0.0
    lm_head_fixed_s: float = 0.0
    attn_decode_fixed_s: float = 0.0
    attn_prefill_fixed_s: float = 0.0
    attn_prefill_grid: tuple[float, ...] = ()
    attn_prefill_table_s: tuple[float, ...] = ()
    attn_prefill_pair_table_s: tuple[float, ...] = ()
    source: str = ""
    _slopes: np.ndarray = field(init=False, repr=False, compare=False)
    _prefill_table: PrefillTable | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grid = np.asarray(self.tokens_grid, dtype=np.float64)
        lin = np.asarray(self.linear_s, dtype=np.float64)
        if grid.ndim != 1 or grid.shape != lin.shape or grid.size < 2:
            raise ConfigError("latency.tokens_grid", "must be 1-D, at least 2 points, same length as linear_s")
        if np.any(np.diff(grid) <= 0):
            raise ConfigError("latency.tokens_grid", "must be strictly increasing")
        if np.any(~np.isfinite(lin)) or np.any(lin < 0):
            raise ConfigError("latency.linear_s", "must be finite and >= 0")
        for f in _SCALAR_FIELDS:
            object.__setattr__(self, f, check_finite_nonneg(f"latency.{f}", getattr(self, f)))
        object.__setattr__(self, "tokens_grid", grid)
        object.__setattr__(self, "linear_s", lin)
        object.__setattr__(self, "_slopes", np.diff(lin) / np.diff(grid))
        object.__setattr__(self, "_prefill_table", _prefill_table(
            self.attn_prefill_grid, self.attn_prefill_table_s, self.attn_prefill_pair_table_s))
        for f in ("attn_prefill_grid", "attn_prefill_table_s", "attn_prefill_pair_table_s"):
            object.__setattr__(self, f, tuple(float(x) for x in getattr(self, f)))

    def linear_time_s(self, num_tokens: float) -> float:
        """Seconds of the token-level operators (all layers) for ``num_tokens`` tokens."""
        g = self.tokens_grid
        if num_tokens <= 0:
            return 0.0
        i = int(np.searchsorted(g, num_tokens, side="right")) - 1
        i = min(max(i, 0), g.size - 2)
        return float(self.linear_s[i] + self._slopes[i] * (num_tokens - g[i]))

    def iteration_time_s(
        self,
        prefill_tokens: int,
        prefill_attn_pairs: float,
        n_decode: int,
        decode_ctx_sum: float,
        n_sampled: int,
    ) -> float:
        """Seconds for one iteration (see :class:`IterationLatencyModel`)."""
        tokens = prefill_tokens + n_decode
        if tokens <= 0:
            return 0.0
        t = self.kernel_time_s(prefill_tokens, prefill_attn_pairs, n_decode, decode_ctx_sum)
        t += self.overhead_s + self.allreduce_fixed_s + self.allreduce_per_token_s * tokens
        if n_sampled > 0:
            t += self.lm_head_fixed_s + self.per_sampled_seq_s * n_sampled
        return t

    def kernel_time_s(
        self, prefill_tokens: int, prefill_attn_pairs: float, n_decode: int, decode_ctx_sum: float
    ) -> float:
        """Seconds of the profiled kernels only (token-level operators + attention, all layers).

        This is the part a per-operator profile measures; :meth:`iteration_time_s` adds the
        framework overhead, the LM head and the tensor-parallel all-reduces.
        """
        tokens = prefill_tokens + n_decode
        if tokens <= 0:
            return 0.0
        t = self.linear_time_s(tokens)
        if n_decode > 0:
            t += self.attn_decode_fixed_s + self.attn_decode_per_seq_s * n_decode
            t += self.attn_decode_per_ctx_s * decode_ctx_sum
        if prefill_tokens > 0:
            t += self.attn_prefill_fixed_s + self.attn_prefill_per_token_s * prefill_tokens
            t += self.attn_prefill_per_pair_s * prefill_attn_pairs
            if self._prefill_table is not None:
                t += prefill_table_s(self._prefill_table, prefill_tokens, prefill_attn_pairs)
        return t

    def decode_ctx_coeff_s(self) -> float:
        """Seconds per decode context token (the slope the closed-form fast path relies on)."""
        return self.attn_decode_per_ctx_s

    def prefill_time_s(self, prompt_tokens: int, chunk_tokens: int = 2048) -> float:
        """Seconds to prefill a lone prompt in chunks of ``chunk_tokens`` (no other work in the batch)."""
        done, total = 0, 0.0
        while done < prompt_tokens:
            c = min(chunk_tokens, prompt_tokens - done)
            pairs = c * (done + (c + 1) / 2)
            last = done + c >= prompt_tokens
            total += self.iteration_time_s(c, pairs, 0, 0.0, 1 if last else 0)
            done += c
        return total

    @classmethod
    def from_file(cls, path: str | Path) -> TableLatencyModel:
        """Load the ``[latency]`` table of a parameter file."""
        raw = load_toml(path)
        if "latency" not in raw:
            raise DataError(str(path), "missing [latency] table")
        lat = dict(raw["latency"])
        required = [
            "tokens_grid", "linear_s", "overhead_s", "per_sampled_seq_s", "attn_decode_per_seq_s",
            "attn_decode_per_ctx_s", "attn_prefill_per_token_s", "attn_prefill_per_pair_s",
        ]
        missing = [k for k in required if k not in lat]
        if missing:
            raise DataError(str(path), f"[latency] is missing {', '.join(missing)}")
        known = set(required) | set(_SCALAR_FIELDS) | set(_TABLE_FIELDS) | {"source", "name"}
        unknown = sorted(set(lat) - known)
        if unknown:
            raise DataError(str(path), f"[latency] has unknown keys {', '.join(unknown)}")
        name = str(lat.pop("name", Path(path).stem))
        return cls(name=name, **lat)


def latency_params_path(gpu: str, model: str, tp: int) -> Path:
    """Path of the packaged latency parameter file for (gpu, model, tp)."""
    return data_path("params", "latency", f"{gpu}__{model}__tp{tp}.toml")


def load_latency_model(gpu: str, model: str, tp: int, path: str | Path | None = None) -> TableLatencyModel:
    """Load the latency model for (gpu, model, tp) from the package or from ``path``."""
    p = Path(path) if path else latency_params_path(gpu, model, tp)
    if not p.exists():
        shipped = sorted(x.stem for x in data_path("params", "latency").glob("*.toml"))
        raise ConfigError(
            "latency", f"no latency parameters for gpu={gpu!r} model={model!r} tp={tp}", allowed=shipped
        )
    if path:
        return TableLatencyModel.from_file(p)
    return _packaged_latency_model(str(p.resolve()), p.stat().st_mtime_ns)


@lru_cache(maxsize=16)
def _packaged_latency_model(path: str, mtime_ns: int) -> TableLatencyModel:
    """A packaged latency file, parsed once per process and version of the file (every env
    construction reads it; the model is frozen and its arrays are made read-only)."""
    m = TableLatencyModel.from_file(path)
    for f in fields(m):
        v = getattr(m, f.name)
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return m
