"""Mooncake-format request traces: loader, session inference, replay workload.

**Format** (the Mooncake FAST'25 release, ``kvcache-ai/Mooncake`` ``FAST25-release/traces/``): one
JSON object a line with ``timestamp`` (ms since the trace start, non-decreasing),
``input_length`` and ``output_length`` (tokens, >= 1) and ``hash_ids``: one integer per
consecutive ``block_tokens``-token block of the prompt (``ceil(input_length / block_tokens)`` of
them; equal ids = the same prefix, reusable KV; the last block may be partial). Other keys are
ignored. Packaged: ``mooncake-conv`` (12,031 chat requests over 59 min) and ``mooncake-synth``
(3,993 requests, multi-turn order kept), Apache-2.0 (``carbon_gym/data/workload/``); any file
of that format by path (``.jsonl`` or ``.jsonl.gz``). Bad input raises
:class:`~carbon_gym.errors.ConfigError` naming the field, the file and line and the allowed values.

**Sessions** (the traces have no session ids; :func:`infer_sessions`):

1. *System prompt*: the longest prefix of a request's ``hash_ids`` every block of which is shared
   by at least ``min_system_children`` distinct continuations (trie nodes with that many
   children). The conversation trace has one: block ``0``, followed by 7,373 distinct blocks;
   the synthetic trace has none (no node has more than 13 children).
2. *Turns*: request ``j`` is a later turn of request ``i`` (its parent) when ``i`` arrived
   earlier, ``i``'s full blocks (``floor(input_length / block_tokens)``, more than the system
   prompt) are a prefix of ``j``'s ``hash_ids``; of several, the one with the longest match,
   the latest on ties. ``j`` joins ``i``'s session with turn ``turn(i) + 1``; a request with no
   parent starts a session (turn 0). A session may branch (two later turns of one request).

**Replay** (:class:`PrefixReplayWorkload`): the trace's arrival times (scaled by ``time_scale``,
looped past its end as :class:`~carbon_gym.workload.TraceReplayArrivals` does) with its lengths and
``hash_ids``. Origin regions are drawn per *session*, so that every turn of a conversation comes
from one region: ``region = the region whose cumulative share first exceeds u``, ``u`` a uniform
hashed (splitmix64) from (seed, session, loop copy). Loop copy ``j`` offsets every id after the
system prompt by ``j * (max id + 1)``: a new loop is new conversations, the system prompt stays
shared. Context-window rule: :func:`carbon_gym.workload.fit_context` (see :mod:`carbon_gym.sessions`).
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._toml import data_path
from .errors import ConfigError, DataError, check_finite_nonneg
from .workload import RequestBatch, TraceReplayArrivals, _check_shares, blocked_arrivals, fit_context, remember_block

__all__ = ["MOONCAKE_TRACES", "PrefixTrace", "load_prefix_trace", "SessionInference", "infer_sessions",
           "PrefixReplayWorkload", "splitmix_uniform", "is_prefix_trace"]

MOONCAKE_TRACES: dict[str, str] = {
    "mooncake-conv": "mooncake_conversation_trace.jsonl.gz",
    "mooncake-synth": "mooncake_synthetic_trace.jsonl.gz",
}
"""Packaged Mooncake traces (files under ``carbon_gym/data/workload/``)."""

_SUFFIXES = (".jsonl", ".jsonl.gz")
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
#: Largest hash id a trace may hold (the replay offsets ids per loop copy below 2**60).
MAX_HASH_ID = 2**40 - 1
#: Id space of the blocks of truncated prompts (see carbon_gym.sessions.fit_context); every id < 2**61.
TRUNCATED_ID_BASE = 1 << 60


def is_prefix_trace(name_or_path: str) -> bool:
    """True for a packaged Mooncake trace name or a ``.jsonl`` / ``.jsonl.gz`` path."""
    return name_or_path in MOONCAKE_TRACES or str(name_or_path).lower().endswith(_SUFFIXES)


@dataclass(frozen=True, eq=False)  # (hashed by identity: inferences are cached per loaded trace)
class PrefixTrace:
    """A Mooncake-format trace as arrays.

    Attributes:
        arrival_s: float64 arrival times, seconds since the first request.
        prompt_tokens, output_tokens: int64 lengths, tokens.
        hash_offsets: int64 (n + 1,): the ids of request ``i`` are ``hash_ids[hash_offsets[i]:hash_offsets[i+1]]``.
        hash_ids: int64, every request's block ids concatenated.
        block_tokens: tokens per hash block.
        source: file path.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_offsets: np.ndarray
    hash_ids: np.ndarray
    block_tokens: int
    source: str

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def hashes(self, i: int) -> tuple[int, ...]:
        """Block ids of request ``i``."""
        return tuple(self.hash_ids[self.hash_offsets[i]:self.hash_offsets[i + 1]].tolist())

    def hash_lists(self) -> list[list[int]]:
        """Every request's block ids, as lists."""
        flat = self.hash_ids.tolist()
        off = self.hash_offsets.tolist()
        return [flat[a:b] for a, b in zip(off[:-1], off[1:])]


def _trace_path(name_or_path: str, field: str) -> Path:
    if name_or_path in MOONCAKE_TRACES:
        return data_path("workload", MOONCAKE_TRACES[name_or_path])
    p = Path(name_or_path)
    if str(p).lower().endswith(_SUFFIXES):
        if not p.exists():
            raise DataError(str(p), "file not found")
        return p
    raise ConfigError(field, f"unknown prefix trace {name_or_path!r}", allowed=[*MOONCAKE_TRACES, "<path>.jsonl", "<path>.jsonl.gz"])


def _bad(field: str, where: str, message: str, allowed: Any) -> ConfigError:
    return ConfigError(field, message, allowed=allowed, source=where)


def _whole(v: Any, field: str, where: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and (not math.isfinite(v) or v != int(v))):
        raise _bad(field, where, f"expected a whole number, got {v!r}", f"integers >= {lo}")
    if v < lo:
        raise _bad(field, where, f"{v!r} is out of range", f"integers >= {lo}")
    return int(v)


def _parse_line(line: str, where: str, block_tokens: int, prev_ms: float) -> tuple[float, int, int, list[int]]:
    """``(timestamp ms, input_length, output_length, hash_ids)`` of one line; ConfigError naming
    the field, ``where`` (file:line) and the allowed values."""
    lines = "one JSON object a line with " + ", ".join(_FIELDS)
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise _bad("line", where, f"not valid JSON ({e.msg})", lines) from None
    if not isinstance(obj, dict):
        raise _bad("line", where, f"expected a JSON object, got {type(obj).__name__}", lines)
    for k in _FIELDS:
        if k not in obj:
            raise _bad(k, where, "required field is missing", list(_FIELDS))
    ts = obj["timestamp"]
    ts_allowed = "ms since the trace start, >= 0, non-decreasing"
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise _bad("timestamp", where, f"expected a finite number of ms >= 0, got {ts!r}", ts_allowed)
    if ts < prev_ms:
        raise _bad("timestamp", where, f"{ts!r} is earlier than the previous line's {prev_ms!r}", ts_allowed)
    p = _whole(obj["input_length"], "input_length", where, 1)
    o = _whole(obj["output_length"], "output_length", where, 1)
    h = obj["hash_ids"]
    need = -(-p // block_tokens)
    ids_allowed = f"ceil(input_length / {block_tokens}) integers in [0, {MAX_HASH_ID}]"
    if not isinstance(h, list):
        raise _bad("hash_ids", where, f"expected an array, got {h!r}", ids_allowed)
    if len(h) != need:
        raise _bad("hash_ids", where, f"{len(h)} ids for input_length {p}: expected ceil({p} / block_tokens) = {need} "
                   f"(block_tokens = {block_tokens}; is the trace's block size another one?)", ids_allowed)
    for x in h:
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_HASH_ID:
            raise _bad("hash_ids", where, f"bad id {x!r}", f"integers in [0, {MAX_HASH_ID}]")
    return float(ts), p, o, h


@lru_cache(maxsize=8)
def _read_trace(path: str, mtime_ns: int, block_tokens: int) -> PrefixTrace:
    opener: Any = gzip.open if path.lower().endswith(".gz") else open
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    offsets: list[int] = [0]
    ids: list[int] = []
    prev_ms = -math.inf
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                prev_ms, p, o, h = _parse_line(line, f"{path}:{line_no}", block_tokens, prev_ms)
                times.append(prev_ms / 1000.0)
                prompts.append(p)
                outputs.append(o)
                ids.extend(h)
                offsets.append(len(ids))
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(path, f"cannot read: {e}") from None
    if not prompts:
        raise DataError(path, "no requests")
    t = np.asarray(times, dtype=np.float64)
    t -= t[0]
    arrays = [t, np.asarray(prompts, np.int64), np.asarray(outputs, np.int64), np.asarray(offsets, np.int64), np.asarray(ids, np.int64)]
    for a in arrays:
        a.flags.writeable = False
    return PrefixTrace(*arrays, block_tokens=block_tokens, source=path)


def load_prefix_trace(name_or_path: str, block_tokens: int = 512, field: str = "workload.trace") -> PrefixTrace:
    """Read a packaged Mooncake trace (``mooncake-conv``, ``mooncake-synth``) or a file of that
    format (``.jsonl`` / ``.jsonl.gz``) with ``block_tokens`` tokens per hash block (cached per file)."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ConfigError("workload.sessions.prefix_block_tokens", f"expected an integer >= 1, got {block_tokens!r}", allowed=">= 1 tokens")
    p = _trace_path(name_or_path, field)
    return _read_trace(str(p), p.stat().st_mtime_ns, int(block_tokens))


# ------------------------------------------------------------------------------ sessions


@dataclass(frozen=True)
class SessionInference:
    """Sessions inferred from a trace's prefix chains (see the module docstring).

    Attributes:
        session: int64 session index of each request (0, 1, ... in order of first turns).
        turn: int32 turn of each request in its session (0 = first).
        parent: int64 the earlier turn a request extends, -1 for a first turn.
        system_blocks: int64 blocks of each request's system prompt (0: none).
        system_prompt: int64 index of each request's system prompt (-1: none), distinct prefixes
            in order of first use.
        match_blocks: int64 blocks a request shares with its parent (0 for first turns).
    """

    session: np.ndarray
    turn: np.ndarray
    parent: np.ndarray
    system_blocks: np.ndarray
    system_prompt: np.ndarray
    match_blocks: np.ndarray

    @property
    def n_sessions(self) -> int:
        """Number of sessions."""
        return int(self.session.max()) + 1 if self.session.size else 0


def _chain_keys(h: Sequence[int]) -> list[int]:
    """Chained keys of every prefix of ``h``: ``key[i]`` identifies ``h[:i + 1]``."""
    out = []
    k = 0
    for x in h:
        k = hash((k, x))
        out.append(k)
    return out


@lru_cache(maxsize=8)
def _infer(trace: PrefixTrace, min_system_children: int) -> SessionInference:
    lists = trace.hash_lists()
    n = len(lists)
    keys = [_chain_keys(h) for h in lists]
    children: dict[int, set[int]] = {}
    for h, ks in zip(lists, keys):
        for i in range(len(h) - 1):
            children.setdefault(ks[i], set()).add(h[i + 1])
    sys_blocks = np.zeros(n, np.int64)
    for j, ks in enumerate(keys):
        s = 0
        while s < len(ks) and len(children.get(ks[s], ())) >= min_system_children:
            s += 1
        sys_blocks[j] = s
    bt = trace.block_tokens
    full = (trace.prompt_tokens // bt).tolist()
    ends: dict[int, int] = {}  # key of a request's full-block prefix -> latest such request
    parent = np.full(n, -1, np.int64)
    match = np.zeros(n, np.int64)
    session = np.zeros(n, np.int64)
    turn = np.zeros(n, np.int32)
    sys_ids: dict[tuple[int, ...], int] = {}
    sys_prompt = np.full(n, -1, np.int64)
    n_sess = 0
    for j in range(n):
        ks, s = keys[j], int(sys_blocks[j])
        if s:
            sys_prompt[j] = sys_ids.setdefault(tuple(lists[j][:s]), len(sys_ids))
        p = -1
        for m in range(len(ks), s, -1):
            p = ends.get(ks[m - 1], -1)
            if p >= 0:
                match[j] = m
                break
        if p >= 0:
            parent[j], session[j], turn[j] = p, session[p], turn[p] + 1
        else:
            session[j], n_sess = n_sess, n_sess + 1
        f = full[j]
        if f > s:
            ends[ks[f - 1]] = j
    return SessionInference(session, turn, parent, sys_blocks, sys_prompt, match)


def infer_sessions(trace: PrefixTrace, min_system_children: int = 32) -> SessionInference:
    """Sessions, turns and system prompts of a trace from its prefix chains (module docstring)."""
    if min_system_children < 2:
        raise ConfigError("min_system_children", f"must be >= 2, got {min_system_children}")
    return _infer(trace, int(min_system_children))


# ------------------------------------------------------------------------------ replay


def splitmix_uniform(seed: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1) hashed (splitmix64) from ``(seed, a, b)`` elementwise (int64 arrays)."""
    with np.errstate(over="ignore"):
        x = (np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
             ^ a.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
             ^ b.astype(np.uint64) * np.uint64(0x94D049BB133111EB))
        for s, m in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            x = (x ^ (x >> np.uint64(s))) * np.uint64(m)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


class PrefixReplayWorkload:
    """Replay of a :class:`PrefixTrace` with prefix hashes, sessions and per-session regions.

    Args:
        trace: the trace.
        time_scale: factor on inter-arrival times (0.5 = twice as fast).
        n_regions, region_shares: origin regions and their shares of sessions.
        seed: seed of the region draw.
        block_s: generation block length, s (determinism unit, as in :class:`~carbon_gym.workload.Workload`).
        max_context_tokens: cap on prompt + output; longer requests follow
            :func:`carbon_gym.workload.fit_context` (counted in ``context_truncated_tokens``).
        min_system_children: system-prompt threshold of :func:`infer_sessions`.
    """

    def __init__(self, trace: PrefixTrace, *, time_scale: float = 1.0, n_regions: int = 1,
                 region_shares: Sequence[float] | None = None, seed: int = 0, block_s: float = 60.0,
                 max_context_tokens: int | None = None, min_system_children: int = 32):
        self.trace = trace
        self.arrivals = TraceReplayArrivals(trace.arrival_s, time_scale, source=trace.source)
        self.n_regions = int(n_regions)
        self.region_shares = _check_shares(region_shares, self.n_regions)
        self.seed = int(seed)
        self.block_s = check_finite_nonneg("workload.block_s", block_s, allow_zero=False)
        self.max_context_tokens = max_context_tokens
        self.inference = infer_sessions(trace, min_system_children)
        self.rate_per_s = self.arrivals.rate_per_s
        self._id_stride = int(trace.hash_ids.max()) + 1 if trace.hash_ids.size else 1
        self._cache: dict[int, Any] = {}
        self._times: dict[int, list[float]] = {}

    @property
    def mean_rate_per_s(self) -> float:
        """Mean request rate of the scaled replay, requests/s."""
        return self.rate_per_s

    def with_seed(self, seed: int) -> PrefixReplayWorkload:
        """This replay with another seed (regions redrawn; nothing reloaded)."""
        import copy

        w = copy.copy(self)
        w.seed, w._cache, w._times = int(seed), {}, {}
        return w

    def expected_count(self, t0_s: float, t1_s: float) -> float:
        """Expected number of arrivals in ``[t0_s, t1_s)``."""
        return self.rate_per_s * max(0.0, t1_s - t0_s)

    def _block(self, b: int) -> Any:
        cached = self._cache.get(b)
        if cached is not None:
            return cached
        tr, inf = self.trace, self.inference
        t, idx = self.arrivals.events(b * self.block_s, (b + 1) * self.block_s)
        period = self.arrivals.period_s
        copy_j = np.floor((t - tr.arrival_s[idx] * self.arrivals.time_scale) / period + 0.5).astype(np.int64)
        sess = inf.session[idx]
        u = splitmix_uniform(self.seed, sess, copy_j)
        origin = np.minimum(np.searchsorted(np.cumsum(self.region_shares), u, side="right"), self.n_regions - 1).astype(np.int64)
        n_sess = inf.n_sessions
        session_id = copy_j * n_sess + sess
        prompt = tr.prompt_tokens[idx].copy()
        output = tr.output_tokens[idx].copy()
        flat, off = tr.hash_ids, tr.hash_offsets
        bt = tr.block_tokens
        hashes: list[tuple[int, ...]] = []
        trunc = np.zeros(idx.size, np.int64)
        for k, (i, j) in enumerate(zip(idx.tolist(), copy_j.tolist())):
            h = flat[off[i]:off[i + 1]]
            s = int(inf.system_blocks[i])
            if j:
                h = h.copy()
                h[s:] += j * self._id_stride
            p, o, cut = fit_context(int(prompt[k]), int(output[k]), s * bt, self.max_context_tokens)
            if cut:
                trunc[k] = cut
                prompt[k], output[k] = p, o
                base = TRUNCATED_ID_BASE + ((j * len(tr) + i) << 11)
                nb = -(-p // bt)
                h = np.concatenate([h[:s], base + np.arange(nb - s, dtype=np.int64)])
            hashes.append(tuple(h.tolist()))
        batch = RequestBatch(origin, t.astype(np.float64), prompt, output, prefix_hashes=hashes,
                             session_id=session_id, turn=inf.turn[idx].copy(), context_truncated_tokens=trunc)
        return remember_block(self._cache, self._times, b, batch)

    def arrivals_between(self, t0_s: float, t1_s: float) -> Any:
        """Every request arriving in ``[t0_s, t1_s)``, sorted by time (with prefix hashes)."""
        return blocked_arrivals(self, t0_s, t1_s)
