"""Request workloads: arrival processes x length samplers x regions -> :class:`RequestBatch`.

A :class:`Workload` answers ``arrivals_between(t0_s, t1_s)`` with every request that arrives in
``[t0_s, t1_s)`` (seconds since the episode start), sorted by arrival time. Requests are
generated lazily in fixed time blocks (``block_s``, 60 s by default), each from its own
``numpy.random.Generator`` seeded by ``SeedSequence(seed, spawn_key=(block, region))``, so:

* a 24-hour episode never holds more than a couple of blocks in memory;
* the requests are the same, bit for bit, however the caller slices time.

Arrival processes (per region, independent):

* :class:`PoissonArrivals` — exponential inter-arrival times at a mean rate;
* :class:`GammaArrivals` — bursty renewal process with gamma inter-arrival times of a given
  coefficient of variation (cv = 1 is Poisson; cv > 1 is burstier). Each block starts in the
  stationary state (the first arrival is drawn from the equilibrium forward-recurrence
  distribution), so the rate has no edge effect at block boundaries;
* :class:`TraceReplayArrivals` — the Azure LLM inference trace's timestamps, inter-arrival times
  multiplied by ``time_scale`` and looped past the trace's end. One stream is replayed and each
  request is assigned an origin region at random by the region shares.

Per-region traffic: region ``r`` receives ``share_r`` of the mean rate. An optional diurnal
profile modulates each region's rate in its local time,
``rate_r(t) = mean_r * (1 + A cos(2 pi (local_hour(t) - peak_hour) / 24))``, implemented by
thinning: candidates are generated at the peak rate ``mean_r (1 + A)`` and each is kept with
probability ``(1 + A cos(...)) / (1 + A)``; the daily mean stays ``mean_r``.

Length samplers resample empirical (prompt, output) pairs jointly from a dataset: ``azure-conv``,
``azure-code`` (Azure 2023 traces), ``sharegpt`` (ShareGPT, Llama-2 tokenizer), ``arxiv``
(arXiv summarization). A max-context cap ``prompt + output <= max_context_tokens`` is enforced:
``cap_policy="resample"`` (default) draws only from the pairs that fit (identical to rejection
resampling; the excluded fraction is reported in ``excluded_fraction``), ``"clip"`` truncates
the prompt to ``cap - 1`` tokens if needed and then the output to what is left. No request
ever exceeds the cap.

Output lengths travel with the requests for the simulator only; schedulers must not read them
(use :mod:`carbon_gym.predict`).

Workloads with prefix structure (multi-turn sessions, Mooncake replay: :mod:`carbon_gym.sessions`,
:mod:`carbon_gym.mooncake`) answer the same ``arrivals_between`` with batches that also carry
per-request prefix hashes, session ids and turns.
"""

from __future__ import annotations

import copy
import math
from bisect import bisect_left
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from ._csv import norm_name, parse_float, parse_utc, read_rows, to_float
from ._toml import data_path
from .errors import ConfigError, DataError, check_choice, check_finite_nonneg

# --------------------------------------------------------------------------------- datasets

LENGTH_DATASETS: dict[str, str] = {
    "azure-conv": "AzureLLMInferenceTrace_conv_2023.csv",
    "azure-code": "AzureLLMInferenceTrace_code_2023.csv",
    "sharegpt": "sarathi_sharegpt8k_lengths_llama2tok.csv",
    "arxiv": "vidur_arxiv_summarization_lengths_llama2tok.csv",
}
"""Packaged length datasets (files under ``carbon_gym/data/workload/``)."""

TRACES: dict[str, str] = {k: v for k, v in LENGTH_DATASETS.items() if k.startswith("azure-")}
"""Packaged traces with timestamps, usable for replay."""

CAP_POLICIES = ("resample", "clip")

_PROMPT_COLS = ("contexttokens", "numprefilltokens", "prompttokens", "inputtokens", "prompt", "input")
_OUTPUT_COLS = ("generatedtokens", "numdecodetokens", "outputtokens", "output", "completiontokens", "generated")
_TIME_COLS = ("timestamp", "arrivals", "arrivaltime", "time", "datetime")


def _dataset_path(name_or_path: str, field: str, allowed: dict[str, str]) -> Path:
    if name_or_path in allowed:
        return data_path("workload", allowed[name_or_path])
    p = Path(name_or_path)
    if p.suffix.lower() == ".csv":
        if not p.exists():
            raise DataError(str(p), "file not found")
        return p
    raise ConfigError(field, f"unknown dataset {name_or_path!r}", allowed=[*allowed, "<path to a .csv file>"])


@dataclass(frozen=True)
class LengthTable:
    """Columns of a workload CSV file.

    Attributes:
        prompt_tokens: int64 prompt lengths.
        output_tokens: int64 output lengths (>= 1).
        arrival_s: float64 seconds since the first request, or ``None`` if the file has no times.
        source: file path.
    """

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None
    source: str


#: Largest prompt or output length a workload file may hold, tokens.
MAX_LENGTH_TOKENS = 2**31 - 1


def _time_cell(cell: str, where: str, column: str, t_first: datetime | None) -> tuple[float, str, datetime | None]:
    """``(seconds, format, t_first)`` of one time cell: a number of seconds or an ISO date-time
    (seconds since the first one, ``t_first``); DataError unless finite."""
    try:
        ts, kind = to_float(cell), "seconds"
    except ValueError:
        try:
            dt = parse_utc(cell)
        except ValueError:
            raise DataError(where, f"cannot parse time {cell.strip()!r} in column {column!r}") from None
        if t_first is None:
            t_first = dt
        ts, kind = (dt - t_first).total_seconds(), "ISO date-times"
    if not math.isfinite(ts):
        raise DataError(where, f"time {cell.strip()!r} in column {column!r} is not a finite number")
    return ts, kind, t_first


@lru_cache(maxsize=16)
def _read_table(path: str, mtime_ns: int) -> LengthTable:
    header, rows = read_rows(path)
    normed = [norm_name(h) for h in header]

    def find(names: tuple[str, ...]) -> int | None:
        return next((normed.index(n) for n in names if n in normed), None)

    pc, oc, tc = find(_PROMPT_COLS), find(_OUTPUT_COLS), find(_TIME_COLS)
    if pc is None or oc is None:
        raise DataError(f"{path}:1", f"needs a prompt-length and an output-length column (e.g. ContextTokens, GeneratedTokens); header: {', '.join(header)}")
    prompts: list[int] = []
    outputs: list[int] = []
    times: list[float] = []
    t_first = None
    prev_t = None
    time_kind: str | None = None
    for line, row in rows:
        where = f"{path}:{line}"
        if len(row) < len(header):
            raise DataError(where, f"expected {len(header)} columns, got {len(row)}")
        for col, dst, what in ((pc, prompts, "prompt length"), (oc, outputs, "output length")):
            v = parse_float(row[col], where, f"{header[col]} ({what})")
            if v != int(v) or v < 1 or v > MAX_LENGTH_TOKENS:
                raise DataError(where, f"{header[col]} ({what}) must be a whole number >= 1 and <= {MAX_LENGTH_TOKENS}, "
                                f"got {row[col].strip()!r}")
            dst.append(int(v))
        if tc is not None:
            cell = row[tc]
            ts, kind, t_first = _time_cell(cell, where, header[tc], t_first)
            if time_kind is None:
                time_kind = kind
            elif kind != time_kind:
                raise DataError(where, f"time {cell.strip()!r} in column {header[tc]!r} mixes formats: earlier rows "
                                f"hold {time_kind} (allowed: one format, seconds or ISO date-times)")
            if prev_t is not None and ts < prev_t:
                raise DataError(where, f"arrival times not sorted: {cell.strip()!r} is earlier than the previous row")
            prev_t = ts
            times.append(ts)
    if not prompts:
        raise DataError(path, "no data rows")
    arrival = None
    if tc is not None:
        arrival = np.asarray(times, dtype=np.float64)
        arrival -= arrival[0]
        arrival.flags.writeable = False
    p = np.asarray(prompts, dtype=np.int64)
    o = np.asarray(outputs, dtype=np.int64)
    p.flags.writeable = False
    o.flags.writeable = False
    return LengthTable(prompt_tokens=p, output_tokens=o, arrival_s=arrival, source=path)


def load_length_table(name_or_path: str, field: str = "workload.lengths") -> LengthTable:
    """Read a packaged dataset by name (see :data:`LENGTH_DATASETS`) or a user CSV file.

    A user file needs a prompt-length column (``ContextTokens``, ``num_prefill_tokens``,
    ``prompt_tokens``, ...) and an output-length column (``GeneratedTokens``,
    ``num_decode_tokens``, ``output_tokens``, ...), and optionally a time column (``TIMESTAMP`` as
    ISO date-time or seconds) for replay. Results are cached per file.
    """
    p = _dataset_path(name_or_path, field, LENGTH_DATASETS)
    return _read_table(str(p), p.stat().st_mtime_ns)


# --------------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class RequestBatch:
    """Requests as a struct of numpy arrays, sorted by ``arrival_s``.

    Attributes:
        origin: int64 region index of each request.
        arrival_s: float64 arrival time, seconds since the episode start.
        prompt_tokens: int64 prompt length, tokens.
        output_tokens: int64 output length, tokens (hidden from schedulers; for the simulator).
        prefix_hashes: per request, the ids of its prompt's consecutive prefix blocks (a tuple of
            ints, Mooncake ``hash_ids`` semantics; see :mod:`carbon_gym.sessions`), or ``None``
            for the whole batch: a workload without prefix structure.
        session_id: int64 session of each request (-1: none), or ``None`` for the whole batch.
        turn: int32 turn of each request in its session (0 = first), or ``None``.
        context_truncated_tokens: int64 context tokens dropped to fit the context window
            (0: not truncated; :func:`carbon_gym.sessions.fit_context`), or ``None``.
    """

    origin: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_hashes: list[tuple[int, ...]] | None = None
    session_id: np.ndarray | None = None
    turn: np.ndarray | None = None
    context_truncated_tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def has_sessions(self) -> bool:
        """True when the batch carries prefix hashes, sessions and turns."""
        return self.prefix_hashes is not None

    @classmethod
    def empty(cls) -> RequestBatch:
        """A batch with no requests."""
        return cls(np.empty(0, np.int64), np.empty(0, np.float64), np.empty(0, np.int64), np.empty(0, np.int64))

    @classmethod
    def concat(cls, batches: Sequence[RequestBatch]) -> RequestBatch:
        """Concatenate batches that are already in time order relative to each other (all with
        prefix hashes or all without)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            return cls.empty()
        if len(batches) == 1:
            return batches[0]
        cols = [np.concatenate([getattr(b, f) for b in batches]) for f in ("origin", "arrival_s", "prompt_tokens", "output_tokens")]
        if not batches[0].has_sessions:
            return cls(*cols)
        hashes = [h for b in batches for h in (b.prefix_hashes or ())]
        extra = [np.concatenate([getattr(b, f) for b in batches]) for f in ("session_id", "turn", "context_truncated_tokens")]
        return cls(*cols, hashes, *extra)

    def take(self, idx: np.ndarray | slice) -> RequestBatch:
        """Rows ``idx`` (an index array, boolean mask or slice)."""
        if self.prefix_hashes is None:
            return RequestBatch(self.origin[idx], self.arrival_s[idx], self.prompt_tokens[idx], self.output_tokens[idx])
        if isinstance(idx, slice):
            hashes = self.prefix_hashes[idx]
        else:
            ix = np.asarray(idx)
            ix = np.flatnonzero(ix) if ix.dtype == bool else ix
            hashes = [self.prefix_hashes[i] for i in ix.tolist()]
        assert self.session_id is not None and self.turn is not None and self.context_truncated_tokens is not None
        return RequestBatch(self.origin[idx], self.arrival_s[idx], self.prompt_tokens[idx], self.output_tokens[idx], hashes,
                            self.session_id[idx], self.turn[idx], self.context_truncated_tokens[idx])


def _check_shares(region_shares: Sequence[float] | None, n_regions: int) -> np.ndarray:
    """Normalized traffic share per region (equal by default); ConfigError unless ``n_regions``
    finite shares >= 0 summing to 1."""
    if n_regions < 1:
        raise ConfigError("workload.n_regions", f"must be >= 1, got {n_regions}")
    shares = np.full(n_regions, 1.0 / n_regions) if region_shares is None else np.asarray(region_shares, dtype=np.float64)
    if shares.shape != (n_regions,) or np.any(~np.isfinite(shares)) or np.any(shares < 0) or abs(shares.sum() - 1.0) > 1e-6:
        raise ConfigError("workload.region_shares", f"need {n_regions} shares >= 0 summing to 1, got {list(np.atleast_1d(shares))}")
    return shares / shares.sum()


def remember_block(cache: dict[int, RequestBatch], times: dict[int, list[float]], b: int, batch: RequestBatch) -> RequestBatch:
    """Keep generation block ``b`` (and its arrival times as a list) in a two-block cache."""
    if len(cache) >= 2:
        oldest = next(iter(cache))
        del cache[oldest]
        del times[oldest]
    cache[b] = batch
    times[b] = batch.arrival_s.tolist()
    return batch


def blocked_arrivals(workload: Any, t0_s: float, t1_s: float) -> RequestBatch:
    """Every request of ``workload`` (with ``block_s``, ``_block(b)`` and ``_times``) arriving in
    ``[t0_s, t1_s)``, sorted by time: the blocks' requests in that range."""
    if not (t0_s >= 0 and math.isfinite(t0_s)) or not math.isfinite(t1_s):
        raise ConfigError("t0_s", f"times must be finite and >= 0, got [{t0_s}, {t1_s})")
    if t1_s <= t0_s:
        return RequestBatch.empty()
    b0 = int(math.floor(t0_s / workload.block_s))
    b1 = int(math.ceil(t1_s / workload.block_s))
    out = []
    for b in range(b0, b1):
        blk = workload._block(b)
        times = workload._times[b]  # the block's arrival times as a list: bisect == searchsorted "left"
        lo = bisect_left(times, t0_s)
        hi = bisect_left(times, t1_s)
        if hi > lo:
            out.append(blk.take(slice(lo, hi)))
    return RequestBatch.concat(out)


# ------------------------------------------------------------------------------ lengths


class LengthSampler(Protocol):
    """Draws (prompt, output) token lengths."""

    max_context_tokens: int | None

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` prompt lengths and ``n`` output lengths (int64 arrays)."""
        ...


def _apply_cap(prompt: np.ndarray, output: np.ndarray, cap: int | None, policy: str) -> tuple[np.ndarray, np.ndarray]:
    """Clip (prompt, output) so that prompt + output <= cap (policy "clip")."""
    if cap is None or policy != "clip":
        return prompt, output
    prompt = np.minimum(prompt, cap - 1)
    output = np.minimum(output, cap - prompt)
    return prompt, output


def fit_context(prompt_tokens: int, output_tokens: int, system_tokens: int, max_context_tokens: int | None) -> tuple[int, int, int]:
    """``(prompt, output, dropped)`` of a request under the context-window rule (:mod:`carbon_gym.sessions`):
    unchanged (``dropped = 0``) when ``prompt + output <= max_context_tokens``; else the oldest
    context after the first ``system_tokens`` is dropped (then, if needed, the output clipped) so
    that ``prompt + output == max_context_tokens``; ``dropped`` = tokens removed (>= 1)."""
    if max_context_tokens is None or prompt_tokens + output_tokens <= max_context_tokens:
        return prompt_tokens, output_tokens, 0
    cap = int(max_context_tokens)
    min_prompt = max(1, min(system_tokens + 1, cap - 1, prompt_tokens))
    out = min(output_tokens, cap - min_prompt)
    p = cap - out
    return p, out, (prompt_tokens - p) + (output_tokens - out)


class EmpiricalLengthSampler:
    """Resamples (prompt, output) pairs jointly from an empirical table.

    Args:
        prompt_tokens, output_tokens: the pairs (same length, >= 1).
        max_context_tokens: cap on prompt + output (``None`` = no cap).
        cap_policy: ``"resample"`` (draw only pairs that fit) or ``"clip"`` (truncate).
        name: dataset name for messages.
    """

    def __init__(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray, *, max_context_tokens: int | None = None,
                 cap_policy: str = "resample", name: str = ""):
        check_choice("workload.cap_policy", cap_policy, CAP_POLICIES)
        p = np.asarray(prompt_tokens, dtype=np.int64)
        o = np.asarray(output_tokens, dtype=np.int64)
        if p.shape != o.shape or p.ndim != 1 or p.size == 0:
            raise ConfigError("workload.lengths", "prompt and output arrays must be 1-D, non-empty and the same length")
        if np.any(p < 1) or np.any(o < 1):
            raise ConfigError("workload.lengths", "lengths must be >= 1 token")
        if max_context_tokens is not None and max_context_tokens < 2:
            raise ConfigError("workload.max_context_tokens", f"must be >= 2, got {max_context_tokens}")
        self.name = name
        self.max_context_tokens = max_context_tokens
        self.cap_policy = cap_policy
        self.n_pairs = int(p.size)
        if max_context_tokens is not None and cap_policy == "resample":
            keep = (p + o) <= max_context_tokens
            if not keep.any():
                raise ConfigError("workload.max_context_tokens", f"no request of {name or 'the dataset'} fits in {max_context_tokens} tokens")
            p, o = p[keep], o[keep]
        self.excluded_fraction = 1.0 - p.size / self.n_pairs
        self._p, self._o = p, o

    @property
    def prompt_tokens(self) -> np.ndarray:
        """Pairs the sampler draws from (after the cap), prompt side."""
        return self._p

    @property
    def output_tokens(self) -> np.ndarray:
        """Pairs the sampler draws from (after the cap), output side."""
        return self._o

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) pairs drawn uniformly with replacement."""
        idx = rng.integers(0, self._p.size, size=n)
        return _apply_cap(self._p[idx], self._o[idx], self.max_context_tokens, self.cap_policy)


class FixedLengthSampler:
    """Every request has the same prompt and output length (for tests and capacity probes)."""

    def __init__(self, prompt_tokens: int, output_tokens: int, *, max_context_tokens: int | None = None):
        if prompt_tokens < 1 or output_tokens < 1:
            raise ConfigError("workload.prompt_tokens", "fixed lengths must be >= 1")
        if max_context_tokens is not None and prompt_tokens + output_tokens > max_context_tokens:
            raise ConfigError("workload.max_context_tokens", f"fixed lengths {prompt_tokens}+{output_tokens} exceed the cap {max_context_tokens}")
        self.prompt = int(prompt_tokens)
        self.output = int(output_tokens)
        self.max_context_tokens = max_context_tokens
        self.excluded_fraction = 0.0

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` copies of the fixed pair (the generator is not used)."""
        return np.full(n, self.prompt, np.int64), np.full(n, self.output, np.int64)


def make_length_sampler(name_or_path: str, *, max_context_tokens: int | None = None, cap_policy: str = "resample",
                        prompt_tokens: int = 512, output_tokens: int = 128) -> LengthSampler:
    """Length sampler by dataset name (``azure-conv``, ``azure-code``, ``sharegpt``, ``arxiv``,
    ``fixed``) or path of a CSV file with prompt/output columns."""
    if name_or_path == "fixed":
        return FixedLengthSampler(prompt_tokens, output_tokens, max_context_tokens=max_context_tokens)
    table = load_length_table(name_or_path)
    return EmpiricalLengthSampler(table.prompt_tokens, table.output_tokens, max_context_tokens=max_context_tokens,
                                  cap_policy=cap_policy, name=name_or_path)


# ------------------------------------------------------------------------------ arrivals


class PoissonArrivals:
    """Poisson arrivals (exponential inter-arrival times)."""

    kind = "poisson"
    per_region = True

    def sample(self, rng: np.random.Generator, t0_s: float, t1_s: float, rate_per_s: float) -> np.ndarray:
        """Sorted arrival times in ``[t0_s, t1_s)`` at ``rate_per_s``."""
        dur = t1_s - t0_s
        n = int(rng.poisson(rate_per_s * dur)) if rate_per_s > 0 and dur > 0 else 0
        t = t0_s + np.sort(rng.random(n)) * dur
        return np.minimum(t, np.nextafter(t1_s, -np.inf))


class GammaArrivals:
    """Bursty renewal arrivals: gamma inter-arrival times with coefficient of variation ``cv``.

    Shape ``k = 1 / cv**2``, scale ``1 / (rate k)``; mean inter-arrival ``1 / rate``.
    """

    kind = "gamma"
    per_region = True

    def __init__(self, cv: float):
        self.cv = check_finite_nonneg("workload.cv", cv, allow_zero=False)
        self.shape = 1.0 / (self.cv * self.cv)

    def sample(self, rng: np.random.Generator, t0_s: float, t1_s: float, rate_per_s: float) -> np.ndarray:
        """Sorted arrival times in ``[t0_s, t1_s)`` of a stationary gamma renewal process."""
        dur = t1_s - t0_s
        if rate_per_s <= 0 or dur <= 0:
            return np.empty(0)
        k = self.shape
        scale = 1.0 / (rate_per_s * k)
        # stationary start: forward recurrence time = U * (length-biased interval ~ Gamma(k+1))
        first = rng.random() * rng.gamma(k + 1.0, scale)
        chunks = [np.array([first])]
        last = first
        expected = rate_per_s * dur
        while last < dur:
            m = int(expected - rate_per_s * last + 4.0 * math.sqrt(expected * (1 + self.cv ** 2)) + 16)
            gaps = rng.gamma(k, scale, size=m)
            c = last + np.cumsum(gaps)
            chunks.append(c)
            last = float(c[-1])
        t = np.concatenate(chunks)
        return np.minimum(t0_s + t[t < dur], np.nextafter(t1_s, -np.inf))


class TraceReplayArrivals:
    """Replays a trace's arrival times with inter-arrival times multiplied by ``time_scale``.

    The trace is looped: copy ``j`` starts at ``j * period`` with ``period = (span + mean gap)``
    (scaled), so replay continues past the trace's end with the same rhythm.

    Attributes:
        times_s: trace arrival times, seconds since its first request.
        time_scale: factor on inter-arrival times (0.5 = twice as fast).
        trace_rate_per_s: the trace's mean rate before scaling, requests/s.
    """

    kind = "replay"
    per_region = False

    def __init__(self, times_s: np.ndarray, time_scale: float = 1.0, source: str = ""):
        t = np.asarray(times_s, dtype=np.float64)
        if t.ndim != 1 or t.size < 2 or np.any(np.diff(t) < 0):
            raise ConfigError("workload.trace", "a replay trace needs at least 2 sorted arrival times")
        self.time_scale = check_finite_nonneg("workload.time_scale", time_scale, allow_zero=False)
        self.source = source
        if not np.all(np.isfinite(t)):
            raise ConfigError("workload.trace", "arrival times must be finite numbers", source=source or None)
        t = t - t[0]
        span = float(t[-1])
        if not span > 0:
            raise ConfigError("workload.trace", f"every arrival time is the same ({t.size} rows at one instant): "
                              "a replay trace needs arrivals spread over time (span > 0 s)", source=source or None)
        self._period_raw = span + span / (t.size - 1)
        self.trace_rate_per_s = t.size / self._period_raw
        self._t = t

    @property
    def period_s(self) -> float:
        """Scaled length of one loop of the trace, seconds."""
        return self._period_raw * self.time_scale

    @property
    def rate_per_s(self) -> float:
        """Mean rate of the scaled replay, requests/s."""
        return self.trace_rate_per_s / self.time_scale

    def events(self, t0_s: float, t1_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Arrival times in ``[t0_s, t1_s)`` and the index of each in the trace."""
        period = self.period_s
        scaled = self._t * self.time_scale
        j0, j1 = int(math.floor(t0_s / period)), int(math.floor(t1_s / period))
        times, idx = [], []
        for j in range(j0, j1 + 1):
            base = j * period
            lo = np.searchsorted(scaled, t0_s - base, side="left")
            hi = np.searchsorted(scaled, t1_s - base, side="left")
            if hi > lo:
                times.append(base + scaled[lo:hi])
                idx.append(np.arange(lo, hi))
        if not times:
            return np.empty(0), np.empty(0, np.int64)
        t = np.concatenate(times)
        i = np.concatenate(idx)
        keep = (t >= t0_s) & (t < t1_s)  # guard against rounding at copy boundaries
        return t[keep], i[keep]


def make_trace_replay(trace: str, *, time_scale: float | None = None, rate_per_s: float | None = None) -> TraceReplayArrivals:
    """Replay of a packaged trace (``azure-conv``, ``azure-code``) or a CSV with a time column.

    Give ``time_scale`` directly, or ``rate_per_s`` to derive it (``trace rate / rate_per_s``).
    """
    p = _dataset_path(trace, "workload.trace", TRACES)
    table = _read_table(str(p), p.stat().st_mtime_ns)
    if table.arrival_s is None:
        raise DataError(str(p), "has no time column (TIMESTAMP) to replay")
    probe = TraceReplayArrivals(table.arrival_s, 1.0, source=str(p))
    if time_scale is None:
        if rate_per_s is None:
            time_scale = 1.0
        else:
            rate = check_finite_nonneg("workload.rate_per_s", rate_per_s, allow_zero=False)
            time_scale = probe.trace_rate_per_s / rate
    return TraceReplayArrivals(table.arrival_s, time_scale, source=str(p))


# ------------------------------------------------------------------------------ diurnal


@dataclass(frozen=True)
class DiurnalProfile:
    """Daily rate modulation in each region's local (standard) time.

    ``factor(t) = 1 + amplitude * cos(2 pi (local_hour - peak_hour) / 24)``, mean 1 over a day.

    Attributes:
        amplitude: 0 (flat) .. 1 (rate drops to zero at the trough).
        peak_hour: local hour of the peak, 0..24.
        utc_offsets_h: UTC offset of each region, hours (e.g. -8 for Los Angeles standard time).
        start_utc: wall-clock UTC time of the episode start (sim time 0).
    """

    amplitude: float
    peak_hour: float
    utc_offsets_h: tuple[float, ...]
    start_utc: datetime

    def __post_init__(self) -> None:
        if not (0.0 <= self.amplitude <= 1.0):
            raise ConfigError("workload.diurnal_amplitude", f"must be in [0, 1], got {self.amplitude}")
        if not (0.0 <= self.peak_hour <= 24.0):
            raise ConfigError("workload.diurnal_peak_hour", f"must be in [0, 24], got {self.peak_hour}")
        object.__setattr__(self, "utc_offsets_h", tuple(float(x) for x in self.utc_offsets_h))

    def factor(self, region: int, t_s: np.ndarray) -> np.ndarray:
        """Rate multiplier of ``region`` at episode times ``t_s``."""
        h0 = self.start_utc.hour + self.start_utc.minute / 60 + self.start_utc.second / 3600
        local = h0 + np.asarray(t_s) / 3600.0 + self.utc_offsets_h[region]
        return 1.0 + self.amplitude * np.cos(2.0 * np.pi * (local - self.peak_hour) / 24.0)


# ------------------------------------------------------------------------------ workload


class Workload:
    """Requests from every region, generated lazily and deterministically (see module docstring).

    Args:
        arrivals: :class:`PoissonArrivals`, :class:`GammaArrivals` or :class:`TraceReplayArrivals`.
        lengths: a length sampler (or ``None`` for replay with the trace's own lengths).
        rate_per_s: mean total rate over all regions, requests/s (ignored for replay, whose rate
            is set by its ``time_scale``).
        n_regions: number of origin regions.
        region_shares: fraction of traffic per region (sums to 1; default equal).
        diurnal: optional :class:`DiurnalProfile`.
        seed: seed of every random draw.
        block_s: generation block length, seconds.
        replay_lengths: for replay, take (prompt, output) from the trace row itself; the cap is
            then applied per ``cap_policy`` (``"resample"`` redraws an oversize row from ``lengths``).
        max_context_tokens, cap_policy: cap for replayed lengths.
    """

    def __init__(self, arrivals: PoissonArrivals | GammaArrivals | TraceReplayArrivals, lengths: LengthSampler | None, *, rate_per_s: float = 0.0, n_regions: int = 1,
                 region_shares: Sequence[float] | None = None, diurnal: DiurnalProfile | None = None, seed: int = 0,
                 block_s: float = 60.0, replay_lengths: bool = False, max_context_tokens: int | None = None,
                 cap_policy: str = "resample", replay_table: LengthTable | None = None):
        self.region_shares = _check_shares(region_shares, n_regions)
        self.arrivals = arrivals
        self.lengths = lengths
        self.n_regions = int(n_regions)
        if diurnal is not None and len(diurnal.utc_offsets_h) != n_regions:
            raise ConfigError("workload.utc_offsets_h", f"need one UTC offset per region ({n_regions}), got {len(diurnal.utc_offsets_h)}")
        self.diurnal = diurnal if (diurnal is not None and diurnal.amplitude > 0) else None
        self.seed = int(seed)
        self.block_s = check_finite_nonneg("workload.block_s", block_s, allow_zero=False)
        self.replay_lengths = bool(replay_lengths)
        self.max_context_tokens = max_context_tokens
        self.cap_policy = check_choice("workload.cap_policy", cap_policy, CAP_POLICIES)
        self._replay_table = replay_table
        if replay_lengths and (replay_table is None or arrivals.per_region):
            raise ConfigError("workload.lengths", "'trace' lengths need trace replay arrivals")
        if lengths is None and not replay_lengths:
            raise ConfigError("workload.lengths", "a length sampler is required")
        if replay_lengths and cap_policy == "resample" and max_context_tokens is not None and lengths is None:
            raise ConfigError("workload.lengths", "resampling oversize replayed requests needs a length sampler")
        if isinstance(arrivals, TraceReplayArrivals):
            peak = 1.0 + (self.diurnal.amplitude if self.diurnal else 0.0)
            self.rate_per_s = arrivals.rate_per_s / peak
        else:
            self.rate_per_s = check_finite_nonneg("workload.rate_per_s", rate_per_s)
        self._cache: dict[int, RequestBatch] = {}
        self._times: dict[int, list[float]] = {}  # arrival times of the cached blocks, as lists

    def with_seed(self, seed: int) -> Workload:
        """This generator with another seed: the requests a Workload built with the same arguments
        and ``seed`` would give (the arrival process, length sampler and profile hold no random
        state and are shared; nothing generated is carried over). Cheap: no data is reloaded."""
        w = copy.copy(self)
        w.seed = int(seed)
        w._cache = {}
        w._times = {}
        return w

    @property
    def mean_rate_per_s(self) -> float:
        """Mean total arrival rate (over a day if diurnal), requests/s."""
        return self.rate_per_s

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=tuple(key))))

    def _thin(self, rng: np.random.Generator, region: int, t: np.ndarray) -> np.ndarray:
        if self.diurnal is None or t.size == 0:
            return np.ones(t.size, dtype=bool)
        peak = 1.0 + self.diurnal.amplitude
        return rng.random(t.size) * peak < self.diurnal.factor(region, t)

    def _block(self, b: int) -> RequestBatch:
        cached = self._cache.get(b)
        if cached is not None:
            return cached
        t0, t1 = b * self.block_s, (b + 1) * self.block_s
        parts: list[tuple[np.ndarray, ...]] = []
        peak = 1.0 + (self.diurnal.amplitude if self.diurnal else 0.0)
        lengths = self.lengths
        arrivals = self.arrivals
        if not isinstance(arrivals, TraceReplayArrivals):
            assert lengths is not None  # (checked in __init__: only trace replay has no sampler)
            for r in range(self.n_regions):
                rng = self._rng(b, r)
                t = arrivals.sample(rng, t0, t1, self.rate_per_s * self.region_shares[r] * peak)
                t = t[self._thin(rng, r, t)]
                p, o = lengths.sample(rng, t.size)
                parts.append((np.full(t.size, r, np.int64), t, p, o))
        else:
            rng = self._rng(b)
            t, idx = arrivals.events(t0, t1)
            origin = rng.choice(self.n_regions, size=t.size, p=self.region_shares).astype(np.int64)
            keep = np.ones(t.size, dtype=bool)
            for r in range(self.n_regions):
                m = origin == r
                keep[m] = self._thin(rng, r, t[m])
            t, idx, origin = t[keep], idx[keep], origin[keep]
            if self.replay_lengths:
                table = self._replay_table
                assert table is not None  # (checked in __init__)
                p = table.prompt_tokens[idx].copy()
                o = table.output_tokens[idx].copy()
                cap = self.max_context_tokens
                if cap is not None:
                    if self.cap_policy == "clip":
                        p, o = _apply_cap(p, o, cap, "clip")
                    else:
                        bad = (p + o) > cap
                        if bad.any():
                            assert lengths is not None  # (checked in __init__)
                            p[bad], o[bad] = lengths.sample(rng, int(bad.sum()))
            else:
                assert lengths is not None  # (checked in __init__)
                p, o = lengths.sample(rng, t.size)
            parts.append((origin, t, p, o))
        origin = np.concatenate([x[0] for x in parts]) if parts else np.empty(0, np.int64)
        t = np.concatenate([x[1] for x in parts]) if parts else np.empty(0)
        p = np.concatenate([x[2] for x in parts]) if parts else np.empty(0, np.int64)
        o = np.concatenate([x[3] for x in parts]) if parts else np.empty(0, np.int64)
        order = np.argsort(t, kind="stable")
        batch = RequestBatch(origin[order], t[order].astype(np.float64), p[order].astype(np.int64), o[order].astype(np.int64))
        return remember_block(self._cache, self._times, b, batch)

    def arrivals_between(self, t0_s: float, t1_s: float) -> RequestBatch:
        """Every request arriving in ``[t0_s, t1_s)`` (seconds since the episode start), sorted by time."""
        return blocked_arrivals(self, t0_s, t1_s)

    def expected_count(self, t0_s: float, t1_s: float) -> float:
        """Expected number of arrivals in ``[t0_s, t1_s)`` ignoring the diurnal profile."""
        return self.rate_per_s * max(0.0, t1_s - t0_s)
