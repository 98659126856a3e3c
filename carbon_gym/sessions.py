"""Multi-turn sessions with prefix structure: a synthetic generator fitted to the Mooncake
conversation trace, the context-window rule, and the scenario's ``[workload.sessions]`` table.

**Generator** (:class:`SessionWorkload`, ``workload.arrival = "sessions"``). In each region
sessions start as a Poisson process (thinned by the diurnal profile at their start time, as
:class:`~carbon_gym.workload.Workload` does) at ``rate_r / E[turns]`` sessions/s, so that
``workload.rate_per_s`` stays a *request* rate. A session draws: its number of turns (empirical
pmf), a system prompt (with probability ``system_prompt_share``, one of the shared prompts by
weight; each a chain of ``ceil(tokens / block)`` prefix blocks), the first user message, one
output per turn, one follow-up message and one think time per later turn (empirical quantile
tables, inverse-CDF sampling with linear interpolation). Turn ``k`` then has

    prompt_0 = system + message_0,    prompt_k = prompt_{k-1} + output_{k-1} + message_k

and arrives ``think_k`` seconds after turn ``k-1`` (open loop: every arrival time is computed when
the session starts, whatever the service; the think times are the trace's inter-turn gaps, which
include the previous answer's serving time). Turns later than ``max_session_span_s`` after the
first are dropped (the trace spans 59 min: no session there is longer). Stationary start:
sessions also start before t = 0 (up to ``max_session_span_s`` earlier), and their turns from
t = 0 on are emitted, so the request rate is ``rate_per_s`` from the first second (a turn of a
session begun before the episode has a context no engine has cached).

**Prefix hashes** (one id per ``prefix_block_tokens`` block of the prompt, Mooncake semantics):
full blocks of the system prompt carry the prompt's ids (shared by every session using it);
every later full block carries an id unique to (session, epoch, position), so that turn ``k``'s
ids extend turn ``k-1``'s full blocks; a partial last block has an id unique to (session, turn).
Session ids: ``1 + ((block + lookback) << 21 | region << 15 | index)`` (``lookback`` =
``ceil(max_session_span_s / block_s)``); block ids ``session << 20 | ...``, below 2**61 (the
simulator's range).

**Context window** (:func:`fit_context`): a request with ``prompt + output > max_context_tokens``
keeps its system prompt and the most recent context: the oldest context tokens after the system
prompt are dropped until it fits (the output is clipped only if even system + 1 token + output
does not fit). Its blocks after the system prompt get new ids (the content shifted: only the
system prompt can hit the cache) and the session continues from the truncated context (a new
*epoch*). Every truncated request is counted: ``context_truncated_tokens`` per request, and the
env's ``context_truncated`` / ``context_truncated_tokens`` episode metrics; none is dropped.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._toml import data_path, load_toml
from .errors import ConfigError, DataError, check_finite_nonneg
from .numeric import exact_dot
from .schema import integer, num, spec, string
from .workload import fit_context

__all__ = ["SessionsConfig", "SessionParams", "SESSION_PARAMS", "load_session_params", "fit_context", "SessionWorkload",
           "trace_session_stats", "batch_session_stats"]

SESSION_PARAMS: dict[str, str] = {"mooncake-conv": "mooncake_conv.toml"}
"""Packaged generator parameter files (``carbon_gym/data/params/sessions/``), fitted by
``calibration/fit_sessions.py``."""


@dataclass(frozen=True)
class SessionsConfig:
    """``[workload.sessions]``: prefix-structured workloads (synthetic sessions, Mooncake replay)."""

    generator: str = spec(string(), "arrival = 'sessions': generator parameters, 'mooncake-conv' (fitted) or a TOML path",
                       "mooncake-conv")
    prefix_block_tokens: int = spec(integer(16, 1 << 20), "tokens per prefix hash block (the Mooncake traces: 512)", 512)
    max_session_span_s: float = spec(num(1, 86400), "a session's turns end this long after its first turn, s", 3600.0)
    system_prompts: int | None = spec(integer(1, 255), "number of shared system prompts, equally popular (default: fitted)", None)
    system_prompt_tokens: int | None = spec(integer(1, 1 << 20), "tokens of each system prompt (default: fitted)", None)
    system_prompt_share: float | None = spec(num(0, 1), "fraction of sessions with a system prompt (default: fitted)", None)
    min_system_children: int = spec(integer(2, 1 << 30), "replay: a trace block shared by this many continuations is "
                                    "system prompt (carbon_gym.mooncake.infer_sessions)", 32)


# ------------------------------------------------------------------------------ parameters


@dataclass(frozen=True)
class SessionParams:
    """Fitted generator parameters (``carbon_gym/data/params/sessions/*.toml``).

    Attributes:
        turns_pmf: P(turns = 1, 2, ...) per session.
        levels: quantile levels in [0, 1] of the tables below (increasing, 0 and 1 included).
        first_message_tokens, followup_message_tokens, output_tokens, think_time_s: quantiles.
        system_prompt_tokens: tokens of each shared system prompt.
        system_prompt_weights: popularity of each (sums to 1).
        system_prompt_share: fraction of sessions with a system prompt.
        capacity: {"<model>/<gpu>/tp<k>": per-engine requests/s within the SLO} for load levels.
        trace: the Mooncake-format trace the parameters were fitted to (name or path).
        source: file path.
    """

    turns_pmf: np.ndarray
    levels: np.ndarray
    first_message_tokens: np.ndarray
    followup_message_tokens: np.ndarray
    output_tokens: np.ndarray
    think_time_s: np.ndarray
    system_prompt_tokens: tuple[int, ...]
    system_prompt_weights: tuple[float, ...]
    system_prompt_share: float
    capacity: dict[str, float]
    trace: str
    source: str

    @property
    def mean_turns(self) -> float:
        """E[turns per session] of the pmf."""
        return exact_dot(np.arange(1, self.turns_pmf.size + 1), self.turns_pmf)


def _params_path(name_or_path: str) -> Path:
    if name_or_path in SESSION_PARAMS:
        return data_path("params", "sessions", SESSION_PARAMS[name_or_path])
    p = Path(name_or_path)
    if p.suffix.lower() == ".toml":
        if not p.exists():
            raise DataError(str(p), "file not found")
        return p
    raise ConfigError("workload.sessions.generator", f"unknown session parameters {name_or_path!r}",
                      allowed=[*SESSION_PARAMS, "<path>.toml"])


@lru_cache(maxsize=8)
def _read_params(path: str, mtime_ns: int) -> SessionParams:
    raw = load_toml(path)

    def arr(table: str, key: str, lo: float) -> np.ndarray:
        try:
            a = np.asarray(raw[table][key], dtype=np.float64)
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{table}.{key}", "missing or not an array of numbers", source=path) from None
        if a.ndim != 1 or a.size < 2 or not np.all(np.isfinite(a)) or np.any(a < lo) or np.any(np.diff(a) < 0):
            raise ConfigError(f"{table}.{key}", f"needs >= 2 finite, non-decreasing values >= {lo}", source=path)
        a.flags.writeable = False
        return a

    levels = arr("quantiles", "levels", 0.0)
    if levels[0] != 0.0 or levels[-1] != 1.0:
        raise ConfigError("quantiles.levels", "must start at 0 and end at 1", source=path)
    tables = {k: arr("quantiles", k, 1.0 if k != "think_time_s" else 0.0)
              for k in ("first_message_tokens", "followup_message_tokens", "output_tokens", "think_time_s")}
    for k, a in tables.items():
        if a.size != levels.size:
            raise ConfigError(f"quantiles.{k}", f"needs one value per level ({levels.size}), got {a.size}", source=path)
    try:
        pmf = np.asarray(raw["turns"]["pmf"], dtype=np.float64)
        sp = raw["system_prompts"]
        sp_tokens = tuple(int(x) for x in sp["tokens"])
        sp_weights = tuple(float(x) for x in sp["weights"])
        share = float(sp["share"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError("turns.pmf / system_prompts", "missing or malformed (tokens, weights, share)", source=path) from None
    if pmf.ndim != 1 or pmf.size < 1 or np.any(pmf < 0) or abs(pmf.sum() - 1.0) > 1e-6:
        raise ConfigError("turns.pmf", "needs probabilities >= 0 summing to 1", source=path)
    if len(sp_tokens) != len(sp_weights) or any(t < 1 for t in sp_tokens) or (sp_weights and abs(sum(sp_weights) - 1) > 1e-6):
        raise ConfigError("system_prompts", "tokens (>= 1) and weights (summing to 1) of equal length", source=path)
    if not 0.0 <= share <= 1.0 or (share > 0 and not sp_tokens):
        raise ConfigError("system_prompts.share", f"must be in [0, 1] (and 0 without prompts), got {share}", source=path)
    cap = {str(k): float(v["per_engine_rate_per_s"]) for k, v in raw.get("capacity", {}).items()}
    return SessionParams(pmf / pmf.sum(), levels, tables["first_message_tokens"], tables["followup_message_tokens"],
                         tables["output_tokens"], tables["think_time_s"], sp_tokens, sp_weights, share, cap,
                         str(raw.get("trace", "mooncake-conv")), path)


def load_session_params(name_or_path: str = "mooncake-conv") -> SessionParams:
    """Generator parameters by packaged name (``mooncake-conv``) or TOML path (cached per file)."""
    p = _params_path(name_or_path)
    return _read_params(str(p), p.stat().st_mtime_ns)


# ------------------------------------------------------------------------------ context window


# ------------------------------------------------------------------------------ generator

_SESSION_BLOCK_BITS, _REGION_BITS, _INDEX_BITS = 20, 6, 15  # uid < 2**41: every id < 2**61
_EPOCH_BITS, _POS_BITS = 8, 11


def _inverse_cdf(levels: np.ndarray, q: np.ndarray, u: np.ndarray) -> np.ndarray:
    return np.interp(u, levels, q)


class SessionWorkload:
    """Synthetic multi-turn sessions (module docstring). Lazily generated per time block, each
    block's session starts from ``SeedSequence(seed, spawn_key=(block + lookback, region))``: the same
    requests however time is sliced.

    Args:
        params: fitted :class:`SessionParams`.
        rate_per_s: mean total *request* rate over all regions, requests/s.
        n_regions, region_shares, diurnal, seed, block_s: as :class:`~carbon_gym.workload.Workload`.
        max_context_tokens: context window (prompt + output), see :func:`fit_context`.
        block_tokens: tokens per prefix hash block.
        max_session_span_s: turns later than this after a session's first turn are dropped.
        system_prompts, system_prompt_tokens, system_prompt_share: overrides of the fitted values.
    """

    def __init__(self, params: SessionParams, *, rate_per_s: float, n_regions: int = 1,
                 region_shares: Sequence[float] | None = None, diurnal: Any = None, seed: int = 0, block_s: float = 60.0,
                 max_context_tokens: int | None = 131072, block_tokens: int = 512, max_session_span_s: float = 3600.0,
                 system_prompts: int | None = None, system_prompt_tokens: int | None = None,
                 system_prompt_share: float | None = None):
        from .workload import _check_shares

        self.params = params
        self.n_regions = int(n_regions)
        if self.n_regions > 1 << _REGION_BITS:
            raise ConfigError("topology.regions", f"sessions support at most {1 << _REGION_BITS} regions, got {n_regions}")
        self.region_shares = _check_shares(region_shares, self.n_regions)
        if diurnal is not None and len(diurnal.utc_offsets_h) != n_regions:
            raise ConfigError("workload.utc_offsets_h", f"need one UTC offset per region ({n_regions}), got {len(diurnal.utc_offsets_h)}")
        self.diurnal = diurnal if (diurnal is not None and diurnal.amplitude > 0) else None
        self.seed = int(seed)
        self.block_s = check_finite_nonneg("workload.block_s", block_s, allow_zero=False)
        self.rate_per_s = check_finite_nonneg("workload.rate_per_s", rate_per_s)
        self.block_tokens = int(block_tokens)
        self.max_context_tokens = max_context_tokens
        if max_context_tokens is not None and max_context_tokens // self.block_tokens >= 1 << _POS_BITS:
            raise ConfigError("workload.max_context_tokens", f"{max_context_tokens} tokens is over {1 << _POS_BITS} prefix "
                              f"blocks of {self.block_tokens}: raise workload.sessions.prefix_block_tokens")
        if params.turns_pmf.size >= 1 << 19:
            raise ConfigError("turns.pmf", "too many turns per session", source=params.source)
        self.max_session_span_s = check_finite_nonneg("workload.sessions.max_session_span_s", max_session_span_s, allow_zero=False)
        self.lookback_blocks = int(math.ceil(self.max_session_span_s / self.block_s))
        tokens, weights, share = params.system_prompt_tokens, params.system_prompt_weights, params.system_prompt_share
        if system_prompts is not None or system_prompt_tokens is not None:
            k = system_prompts if system_prompts is not None else max(1, len(tokens))
            t = system_prompt_tokens if system_prompt_tokens is not None else (int(round(np.mean(tokens))) if tokens else 512)
            tokens, weights = (int(t),) * k, (1.0 / k,) * k
            if share == 0 and system_prompt_share is None:
                share = 1.0
        if system_prompt_share is not None:
            share = float(system_prompt_share)
        if share > 0 and not tokens:
            raise ConfigError("workload.sessions.system_prompt_share", "> 0 needs system prompts (system_prompts = k)")
        self.system_prompt_tokens = tuple(tokens)
        self.system_prompt_weights = np.asarray(weights, dtype=np.float64)
        self.system_prompt_share = share
        bt = self.block_tokens
        self._sys_full = [t // bt for t in tokens]
        self._sys_ids = [tuple((s << _POS_BITS) | q for q in range(f)) for s, f in enumerate(self._sys_full)]
        self.turns_per_session = self._mean_emitted_turns()
        self._sessions: dict[int, dict[str, np.ndarray]] = {}
        self._cache: dict[int, Any] = {}
        self._times: dict[int, list[float]] = {}

    # ---- API shared with Workload -------------------------------------------------------------

    @property
    def mean_rate_per_s(self) -> float:
        """Mean total request rate (over a day if diurnal), requests/s."""
        return self.rate_per_s

    @property
    def session_rate_per_s(self) -> float:
        """Mean total rate of new sessions, sessions/s."""
        return self.rate_per_s / self.turns_per_session

    def with_seed(self, seed: int) -> SessionWorkload:
        """This generator with another seed (nothing generated is carried over)."""
        w = copy.copy(self)
        w.seed, w._sessions, w._cache, w._times = int(seed), {}, {}, {}
        return w

    def expected_count(self, t0_s: float, t1_s: float) -> float:
        """Expected number of requests in ``[t0_s, t1_s)`` ignoring the diurnal profile (steady state)."""
        return self.rate_per_s * max(0.0, t1_s - t0_s)

    def arrivals_between(self, t0_s: float, t1_s: float) -> Any:
        """Every request arriving in ``[t0_s, t1_s)``, sorted by time, with prefix hashes."""
        from .workload import blocked_arrivals

        return blocked_arrivals(self, t0_s, t1_s)

    # ---- generation ----------------------------------------------------------------------------

    def _draw(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        """Turn counts, think-time offsets and lengths of ``n`` sessions (ragged, by session)."""
        p = self.params
        turns = rng.choice(p.turns_pmf.size, size=n, p=p.turns_pmf) + 1
        total = int(turns.sum())
        lv = p.levels
        return {
            "turns": turns,
            "sys": np.where(rng.random(n) < self.system_prompt_share,
                            rng.choice(max(1, len(self.system_prompt_tokens)), size=n,
                                       p=self.system_prompt_weights if self.system_prompt_tokens else None), -1),
            "first": np.maximum(1, np.rint(_inverse_cdf(lv, p.first_message_tokens, rng.random(n)))).astype(np.int64),
            "output": np.maximum(1, np.rint(_inverse_cdf(lv, p.output_tokens, rng.random(total)))).astype(np.int64),
            "followup": np.maximum(1, np.rint(_inverse_cdf(lv, p.followup_message_tokens, rng.random(total)))).astype(np.int64),
            "think": _inverse_cdf(lv, p.think_time_s, rng.random(total)),
        }

    def _mean_emitted_turns(self) -> float:
        """E[turns emitted per session] (the span cut included), from 20,000 sessions of a fixed
        stream (independent of the seed)."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20250, spawn_key=(7,))))
        d = self._draw(rng, 20_000)
        starts = np.cumsum(d["turns"]) - d["turns"]
        think = d["think"].copy()
        think[starts] = 0.0  # the first turn of each session has no think time
        c = np.cumsum(think)
        elapsed = c - np.repeat(c[starts], d["turns"])  # time since the session's first turn
        return float(max(1.0, np.count_nonzero(elapsed <= self.max_session_span_s) / 20_000))

    def _session_block(self, b: int) -> dict[str, np.ndarray]:
        """Every turn of the sessions that start in block ``b``, sorted by arrival."""
        got = self._sessions.get(b)
        if got is not None:
            return got
        if b + self.lookback_blocks >= (1 << _SESSION_BLOCK_BITS) - 1:
            raise ConfigError("workload.block_s", f"sessions support {(1 << _SESSION_BLOCK_BITS) - 1} generation blocks "
                              "per episode: raise workload.block_s")
        t0, t1 = b * self.block_s, (b + 1) * self.block_s
        peak = 1.0 + (self.diurnal.amplitude if self.diurnal else 0.0)
        cols: dict[str, list] = {k: [] for k in ("arrival", "origin", "prompt", "output", "uid", "turn", "epoch", "sys", "cut")}
        cap, span = self.max_context_tokens, self.max_session_span_s
        for r in range(self.n_regions):
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(b + self.lookback_blocks, r))))
            lam = self.rate_per_s * self.region_shares[r] / self.turns_per_session * peak
            n = int(rng.poisson(lam * self.block_s)) if lam > 0 else 0
            start = t0 + np.sort(rng.random(n)) * (t1 - t0)
            start = np.minimum(start, np.nextafter(t1, -np.inf))
            if self.diurnal is not None and n:
                start = start[rng.random(n) * peak < self.diurnal.factor(r, start)]
                n = start.size
            if n >= (1 << _INDEX_BITS) - 1:
                raise ConfigError("workload.rate_per_s", f"over {1 << _INDEX_BITS} sessions per block and region: lower block_s")
            d = self._draw(rng, n)
            turns, sys_i = d["turns"].tolist(), d["sys"].tolist()
            first, out, fol, think = d["first"].tolist(), d["output"].tolist(), d["followup"].tolist(), d["think"].tolist()
            k = 0
            for i in range(n):
                uid = 1 + (((((b + self.lookback_blocks) << _REGION_BITS) | r) << _INDEX_BITS) | i)
                s = sys_i[i]
                sys_tokens = self.system_prompt_tokens[s] if s >= 0 else 0
                t, epoch, prompt = float(start[i]), 0, 0
                for j in range(turns[i]):
                    if j == 0:
                        prompt = sys_tokens + first[i]
                    else:
                        t += think[k + j]
                        if t - start[i] > span:
                            break
                        prompt = prompt + out[k + j - 1] + fol[k + j]
                    p, o, cut = fit_context(prompt, out[k + j], sys_tokens, cap)
                    if cut:
                        epoch += 1
                        if epoch >= 1 << _EPOCH_BITS:
                            raise ConfigError("workload.max_context_tokens", "a session was truncated over 255 times")
                        prompt = p
                    for key, v in (("arrival", t), ("origin", r), ("prompt", p), ("output", o), ("uid", uid), ("turn", j),
                                   ("epoch", epoch), ("sys", s), ("cut", cut)):
                        cols[key].append(v)
                    if cut:
                        out[k + j] = o
                k += turns[i]
        arrival = np.asarray(cols["arrival"], dtype=np.float64)
        order = np.argsort(arrival, kind="stable")
        blk = {k: np.asarray(v, dtype=np.float64 if k == "arrival" else np.int64)[order] for k, v in cols.items()}
        for old in [x for x in self._sessions if x < b - self.lookback_blocks - 1]:
            del self._sessions[old]
        self._sessions[b] = blk
        return blk

    def _hashes(self, uid: int, epoch: int, s: int, prompt: int, turn: int) -> tuple[int, ...]:
        bt = self.block_tokens
        nf = prompt // bt
        head = self._sys_ids[s] if s >= 0 else ()
        base = (uid << _SESSION_BLOCK_BITS) | (epoch << _POS_BITS)
        ids = head + tuple(range(base, base + nf - len(head)))
        if prompt % bt:
            ids += ((uid << _SESSION_BLOCK_BITS) | (1 << 19) | turn,)
        return ids

    def _block(self, b: int) -> Any:
        from .workload import RequestBatch, remember_block

        cached = self._cache.get(b)
        if cached is not None:
            return cached
        t0, t1 = b * self.block_s, (b + 1) * self.block_s
        parts = []
        for sb in range(b - self.lookback_blocks, b + 1):  # (blocks < 0: sessions in progress at t = 0)
            blk = self._session_block(sb)
            lo, hi = np.searchsorted(blk["arrival"], [t0, t1], side="left")
            if hi > lo:
                parts.append({k: v[lo:hi] for k, v in blk.items()})
        if not parts:
            return remember_block(self._cache, self._times, b, RequestBatch(
                np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64), [],
                np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int64)))
        c = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.argsort(c["arrival"], kind="stable")
        c = {k: v[order] for k, v in c.items()}
        hashes = [self._hashes(u, e, s, p, t) for u, e, s, p, t in zip(
            c["uid"].tolist(), c["epoch"].tolist(), c["sys"].tolist(), c["prompt"].tolist(), c["turn"].tolist())]
        batch = RequestBatch(c["origin"], c["arrival"], c["prompt"], c["output"], hashes, c["uid"],
                             c["turn"].astype(np.int32), c["cut"])
        return remember_block(self._cache, self._times, b, batch)


# ------------------------------------------------------------------------------ statistics


def _stats(prompt: np.ndarray, output: np.ndarray, arrival: np.ndarray, session: np.ndarray, parent: np.ndarray,
           system_tokens: np.ndarray, first_turn: np.ndarray) -> dict[str, float]:
    has_p = parent >= 0
    pp = parent[has_p]
    followup = prompt[has_p] - prompt[pp] - output[pp]
    _, sizes = np.unique(session, return_counts=True)
    return {
        "requests": float(prompt.size),
        "sessions": float(sizes.size),
        "mean_turns": float(sizes.mean()),
        "mean_prompt_tokens": float(prompt.mean()),
        "mean_output_tokens": float(output.mean()),
        "mean_first_message_tokens": float((prompt[first_turn] - system_tokens[first_turn]).mean()),
        "mean_followup_message_tokens": float(np.maximum(1, followup).mean()) if followup.size else float("nan"),
        "median_think_time_s": float(np.median(arrival[has_p] - arrival[pp])) if pp.size else float("nan"),
        "mean_think_time_s": float(np.mean(arrival[has_p] - arrival[pp])) if pp.size else float("nan"),
        "system_prompt_share": float(np.mean(system_tokens[first_turn] > 0)),
    }


def trace_session_stats(trace: Any, inference: Any) -> dict[str, float]:
    """Session statistics of a Mooncake trace (:func:`carbon_gym.mooncake.infer_sessions`):
    turns per session, mean lengths, follow-up message (``prompt - parent prompt - parent output``,
    at least 1), think time (arrival gap to the parent), system prompt share."""
    first = inference.parent < 0
    return _stats(trace.prompt_tokens, trace.output_tokens, trace.arrival_s, inference.session, inference.parent,
                  inference.system_blocks * trace.block_tokens, first)


def batch_session_stats(batch: Any, system_tokens: int) -> dict[str, float]:
    """The same statistics of a generated :class:`~carbon_gym.workload.RequestBatch` (sessions of
    a chain: turn k's parent is turn k - 1; ``system_tokens``: tokens of the system prompt where a
    session has one, i.e. a request whose first prefix id is a system-prompt id)."""
    sid, turn = batch.session_id, batch.turn
    order = np.lexsort((turn, sid))
    parent = np.full(len(batch), -1, np.int64)
    same = (sid[order][1:] == sid[order][:-1]) & (turn[order][1:] == turn[order][:-1] + 1)
    parent[order[1:][same]] = order[:-1][same]
    sys_t = np.array([system_tokens if h and h[0] < (1 << _SESSION_BLOCK_BITS) else 0 for h in batch.prefix_hashes], np.int64)
    keep_first = turn == 0
    return _stats(batch.prompt_tokens, batch.output_tokens, batch.arrival_s, sid, parent, sys_t, keep_first)


# ------------------------------------------------------------------------------ scenarios


def is_prefix_workload(w: Any) -> bool:
    """True when a scenario's ``[workload]`` is synthetic sessions or a Mooncake-format replay."""
    from .mooncake import is_prefix_trace

    return w.arrival == "sessions" or (w.arrival == "replay" and is_prefix_trace(w.trace))


def _resolve_file(value: str, names: Sequence[str], suffixes: tuple[str, ...], field: str, base_dir: Path | None, ctx: Any) -> str:
    if value in names:
        return value
    p = Path(value)
    if not str(p).lower().endswith(suffixes):
        raise ctx.err(field, f"unknown value {value!r}", allowed=[*names, *(f"<path>{x}" for x in suffixes)])
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    if not p.exists():
        raise ctx.err(field, f"file not found: {p}")
    return str(p)


def resolve_prefix_workload(w: Any, *, model: str, tp: int, engine_groups: dict[str, int], fractions: dict[str, float] | None,
                            base_dir: Path | None, ctx: Any) -> tuple[Any, float, str] | None:
    """Checks and the request rate of a prefix workload's ``[workload]`` (``w``): ``(w with
    resolved paths, rate_per_s, where the rate comes from)``, or None for any other workload.

    Rates: ``rate_per_s``; or ``load`` = fraction x the per-engine capacity measured *for this
    workload* (the parameter file's ``[capacity."<model>/<gpu>/tp<k>"]``, heavy prompts included)
    x engines; or, for replay, ``time_scale`` / the trace's own rate.
    """
    import dataclasses

    from .mooncake import MOONCAKE_TRACES, load_prefix_trace

    if not is_prefix_workload(w):
        return None
    sc = w.sessions
    if w.diurnal_amplitude > 0 and w.arrival == "replay":
        raise ctx.err("workload.diurnal_amplitude", "a Mooncake replay keeps the trace's own arrival pattern: set it to 0")
    if w.arrival == "replay":
        if w.lengths != "trace":
            raise ctx.err("workload.lengths", f"a Mooncake replay takes the trace's own lengths and hashes, got {w.lengths!r}",
                          allowed=["trace"])
        w = dataclasses.replace(w, trace=_resolve_file(w.trace, list(MOONCAKE_TRACES), (".jsonl", ".jsonl.gz"), "workload.trace", base_dir, ctx))
        if w.time_scale is not None and (w.load is not None or w.rate_per_s is not None):
            raise ctx.err("workload.time_scale", "give one of workload.load, workload.rate_per_s, workload.time_scale for replay")
    else:
        w = dataclasses.replace(w, sessions=dataclasses.replace(
            sc, generator=_resolve_file(sc.generator, list(SESSION_PARAMS), (".toml",), "workload.sessions.generator", base_dir, ctx)))
    if w.load is not None and w.rate_per_s is not None:
        raise ctx.err("workload.rate_per_s", "give either workload.load or workload.rate_per_s, not both")
    if w.rate_per_s is not None:
        return w, float(w.rate_per_s), "workload.rate_per_s"
    if w.load is not None:
        params = load_session_params(w.sessions.generator if w.arrival == "sessions" else "mooncake-conv")
        assert fractions is not None
        rate, texts = 0.0, []
        for gpu, n in engine_groups.items():
            key = f"{model}/{gpu}/tp{int(tp)}"
            if key not in params.capacity:
                raise ctx.err("workload.load", f"no per-engine capacity measured for this session workload on {key} in "
                              f"{params.source}: give workload.rate_per_s (or measure it: python eval/measure_session_capacity.py)",
                              allowed=sorted(params.capacity))
            f, c = fractions[w.load], params.capacity[key]
            rate += f * c * n
            texts.append(f"workload.load = {w.load!r}: {f} x {c} requests/s per engine (session workload capacity of {key}, "
                         f"{Path(params.source).name}) x {n} engines")
        return w, rate, " + ".join(texts)
    if w.arrival == "replay":
        trace = load_prefix_trace(w.trace, sc.prefix_block_tokens)
        from .workload import TraceReplayArrivals

        rate = TraceReplayArrivals(trace.arrival_s, w.time_scale or 1.0).rate_per_s
        return w, rate, f"the replayed trace {w.trace!r} (time_scale {w.time_scale or 1.0})"
    raise ctx.err("workload.rate_per_s", "set workload.rate_per_s or workload.load")


def build_prefix_workload(w: Any, *, rate_per_s: float, n_regions: int, diurnal: Any, seed: int) -> Any:
    """The :class:`SessionWorkload` or :class:`~carbon_gym.mooncake.PrefixReplayWorkload` of a
    resolved prefix ``[workload]`` (``seed``: the workload stream's own seed)."""
    from .mooncake import PrefixReplayWorkload, load_prefix_trace

    sc = w.sessions
    if w.arrival == "sessions":
        return SessionWorkload(load_session_params(sc.generator), rate_per_s=rate_per_s, n_regions=n_regions,
                               region_shares=w.region_shares, diurnal=diurnal, seed=seed, block_s=w.block_s,
                               max_context_tokens=w.max_context_tokens, block_tokens=sc.prefix_block_tokens,
                               max_session_span_s=sc.max_session_span_s, system_prompts=sc.system_prompts,
                               system_prompt_tokens=sc.system_prompt_tokens, system_prompt_share=sc.system_prompt_share)
    trace = load_prefix_trace(w.trace, sc.prefix_block_tokens)
    from .workload import TraceReplayArrivals

    time_scale = w.time_scale if w.time_scale is not None else TraceReplayArrivals(trace.arrival_s).trace_rate_per_s / rate_per_s
    return PrefixReplayWorkload(trace, time_scale=time_scale, n_regions=n_regions, region_shares=w.region_shares, seed=seed,
                                block_s=w.block_s, max_context_tokens=w.max_context_tokens,
                                min_system_children=sc.min_system_children)


def prefix_length_pairs(w: Any) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) pairs an output-length predictor of a prefix workload is fitted on: the
    replayed trace, or the trace the generator's parameters were fitted to."""
    from .mooncake import load_prefix_trace

    name = w.trace if w.arrival == "replay" else load_session_params(w.sessions.generator).trace
    t = load_prefix_trace(name, w.sessions.prefix_block_tokens)
    keep = t.prompt_tokens + t.output_tokens <= w.max_context_tokens
    return t.prompt_tokens[keep], t.output_tokens[keep]
