"""Automatic prefix caching of one engine (like vLLM's automatic prefix caching): :class:`PrefixCache`.

**Units.** A request names its prompt's prefix by ``prefix_hashes``: one integer id per
consecutive ``prefix_block_tokens``-token block of the prompt (Mooncake's ``hash_ids``, 512
tokens; the last id may be of a partial block). The cache works in those *prefix blocks*: only
FULL prompt blocks are cacheable (block ``i`` is full when ``(i + 1) x prefix_block_tokens <=
prompt_tokens``) and a hit is a whole number of them. The engine's paged KV cache keeps its
16-token blocks (``EngineConfig.block_tokens``): ``prefix_block_tokens`` must be a multiple of
``block_tokens``, and one cache entry (one prefix block) holds ``kv_per_block = prefix_block_tokens
/ block_tokens`` KV blocks (512 / 16 = 32), allocated, shared, freed and evicted together. The
trace knows reuse only at its own granularity, so the partial last block of a prompt is never a
hit (vLLM would also reuse its full 16-token blocks: hits here are lower by less than one prefix
block per request).

**Keys.** Entry ``i`` of a request is keyed by a chained hash ``key_i = hash((key_{i-1}, id_i))``
(``key_{-1}`` = :data:`ROOT_KEY`), computed once per request (:func:`chain_keys`), so a hit at
block ``i`` implies the whole prefix ``0..i`` matches; ids are never trusted to be chained
themselves. Each entry stores its parent's key and a lookup checks it: for a fixed parent
CPython's tuple hash is injective in an id in ``[0, 2**61)``, so hits are exact.

**Rules** (the engine calls them; blocks are KV blocks):

* *Admission* (:meth:`acquire`): the longest cached prefix of the request, capped at ``(prefill_len
  - 1) // prefix_block_tokens`` entries so that at least one prompt token is computed (vLLM), is a
  hit: the request takes a reference on those entries (shared, not allocated again) and prefills
  only the rest (the attention of the computed tokens still covers the cached context).
* *Prefill* (:meth:`insert`): as the request's prefill completes full prefix blocks, they become
  entries it holds (an entry another request inserted meanwhile is adopted, the duplicate blocks
  freed), so concurrent requests share a prefix as soon as it is computed.
* *Release* (:meth:`release`, completion or preemption): the request drops its references,
  deepest block first; an entry nobody references stays cached as *cached-free*, at the tail of an
  LRU list. Generated tokens are not cached (the trace names prompt blocks only: a next turn
  recomputes the previous answer's blocks unless an earlier prompt covered them).
* *Eviction* (:meth:`settle`): cached-free blocks count as free for admission and decode growth
  (the engine's ``free_blocks`` = unallocated + cached-free); when the blocks allocated exceed the
  unallocated ones, least-recently-used cached-free entries are evicted, as many as needed. The
  engine jumps over decode runs in closed form, so evictions are applied at the next cache
  operation (admission, prefill insertion, release) or publication; no cache operation happens in
  between, so the result is that of evicting at each allocation, and both modes of the engine
  (closed-form runs, step mode) see the same cache. Dispatch and the simulator's queries read the
  cache as last settled (like the engine's published KV view).
* A child entry is always evicted before its parent (releases go deepest first and every holder of
  an entry holds its ancestors), so each engine's cache is closed under prefixes: the datacenter's
  ``index`` (key -> engines holding it) gives the best engine's cached prefix by one walk.
* An engine that falls asleep, powers off, is aborted or reset loses its cache (:meth:`clear`).

Cost: O(prefix blocks) per admission, prefill chunk and release, O(1) per eviction; never per token.
Compiled with the engine (``setup.py``, :data:`carbon_gym.sim._native.COMPILED_MODULES`).
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Any

from ..errors import ConfigError
from .request import CopyableState, RequestState, mypyc_attr

__all__ = ["PrefixCache", "ROOT_KEY", "MAX_BLOCK_ID", "chain_keys", "prefix_keys", "batch_prefix_keys"]

#: Parent key of every request's first prefix block.
ROOT_KEY = 0x5EED
#: Block ids must lie in [0, MAX_BLOCK_ID) (where the chained keys are exact, see the docstring).
MAX_BLOCK_ID = 2 ** 61 - 1


def chain_keys(ids: Any, n: int) -> tuple[int, ...]:
    """The chained keys of the first ``n`` block ids: ``key_i = hash((key_{i-1}, ids[i]))``."""
    prev = ROOT_KEY
    out: list[int] = []
    for i in range(n):
        prev = hash((prev, ids[i]))
        out.append(prev)
    return tuple(out)


def prefix_keys(hashes: Any, prompt_tokens: int, prefix_tokens: int, caching: bool, field: str) -> tuple[int, ...] | None:
    """Validate one request's ``prefix_hashes`` (None or block ids, at most one per
    ``prefix_tokens``-token block of its ``prompt_tokens``-token prompt, each in [0,
    :data:`MAX_BLOCK_ID`)) - :class:`ConfigError` naming ``field`` - and return the chained keys of
    its full blocks, or None (no ids, no full block, or ``caching`` off)."""
    if hashes is None:
        return None
    try:
        ids = [operator.index(x) for x in hashes]
    except TypeError:
        raise ConfigError(field, f"must be None or a sequence of integer block ids, got {hashes!r}") from None
    nb = -(-prompt_tokens // prefix_tokens)
    if len(ids) > nb:
        raise ConfigError(field, f"{len(ids)} block ids for a {prompt_tokens}-token prompt in {prefix_tokens}-token "
                          "blocks", allowed=f"at most ceil(prompt_tokens / prefix_block_tokens) = {nb} ids")
    if ids and (min(ids) < 0 or max(ids) >= MAX_BLOCK_ID):
        raise ConfigError(field, f"block ids must lie in [0, 2**61 - 1), got {min(ids)}..{max(ids)}",
                          allowed="0 <= id < 2**61 - 1")
    if not caching:
        return None
    n = min(len(ids), prompt_tokens // prefix_tokens)
    return chain_keys(ids, n) if n else None


def batch_prefix_keys(hashes: Any, prompts: list[int], prefix_tokens: int,
                      caching: bool) -> list[tuple[int, ...] | None] | None:
    """:func:`prefix_keys` of each row of a batch (``hashes``: None, or one entry per prompt);
    None when no row has keys."""
    if hashes is None:
        return None
    n = len(prompts)
    try:
        m = len(hashes)
    except TypeError:
        m = -1
    if m != n:
        raise ConfigError("prefix_hashes", f"must be None or a sequence of {n} entries (one per request), got "
                          f"{m if m >= 0 else type(hashes).__name__}")
    out = [prefix_keys(h, p, prefix_tokens, caching, f"prefix_hashes[{i}]") for i, (h, p) in enumerate(zip(hashes, prompts))]
    return out if any(k is not None for k in out) else None


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixCache(CopyableState):
    """The prefix cache of one engine (see the module docstring). Counts are in entries (prefix
    blocks) unless named ``_blocks`` (KV blocks)."""

    __slots__ = (
        "prefix_tokens",     # tokens per prefix block
        "block_tokens",      # tokens per KV block
        "kv_per_block",      # KV blocks per entry (prefix_block_tokens / block_tokens)
        "refs",              # key -> requests holding the entry (0: cached-free, in lru)
        "parents",           # key -> the key of its parent entry (ROOT_KEY for a first block)
        "lru",               # keys of the cached-free entries, least recently used first
        "evictable_blocks",  # KV blocks of the cached-free entries
        "index",             # the datacenter's key -> engines holding it (shared by its engines)
        "evictions",         # entries evicted so far
        "inserted",          # entries created so far
    )

    def __init__(self, prefix_tokens: int, block_tokens: int, index: dict[int, int]) -> None:
        self.prefix_tokens = prefix_tokens
        self.block_tokens = block_tokens
        self.kv_per_block = prefix_tokens // block_tokens
        self.index = index
        self.refs: dict[int, int] = {}
        self.parents: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.evictable_blocks = 0
        self.evictions = 0
        self.inserted = 0

    def __len__(self) -> int:
        return len(self.refs)

    # ------------------------------------------------------------------ queries
    def limit(self, req: RequestState) -> int:
        """Most entries ``req`` may hit: its full prompt blocks, leaving at least one token of its
        ``prefill_len`` to compute."""
        keys = req.prefix_keys
        assert keys is not None
        n = (req.prefill_len - 1) // self.prefix_tokens
        return n if n < len(keys) else len(keys)

    def admission_blocks(self, req: RequestState, free_blocks: int, budget_tokens: int) -> int:
        """The engine's admission rule for ``req`` (it has prefix keys) with ``free_blocks`` free:
        the blocks its admission takes from them, ``ceil(prefill_len / block_tokens) - live x
        kv_per_block`` (entries held by running requests are allocated already, cached-free ones
        leave the free count), or 0 if they do not fit or, with ``budget_tokens >= 0`` (no chunked
        prefill, the iteration not empty), its uncached tokens exceed that budget."""
        keys = req.prefix_keys
        assert keys is not None
        L = req.prefill_len
        n_max = self.limit(req)
        if budget_tokens >= 0 and L - self.peek(keys, n_max, free_blocks) * self.prefix_tokens > budget_tokens:
            return 0
        bt = self.block_tokens
        blocks = (L + bt - 1) // bt - self.live(keys, n_max) * self.kv_per_block
        return blocks if blocks <= free_blocks else 0

    def match(self, keys: tuple[int, ...], n_max: int) -> int:
        """Entries of the longest cached prefix of ``keys`` (at most ``n_max``)."""
        parents = self.parents
        prev = ROOT_KEY
        h = 0
        while h < n_max:
            k = keys[h]
            p = parents.get(k)
            if p is None or p != prev:
                break
            prev = k
            h += 1
        return h

    def live(self, keys: tuple[int, ...], n_max: int) -> int:
        """Entries of the longest prefix of ``keys`` (at most ``n_max``) held by running requests:
        admitting the request takes no new blocks for them (they are already allocated)."""
        parents = self.parents
        refs = self.refs
        prev = ROOT_KEY
        h = 0
        while h < n_max:
            k = keys[h]
            p = parents.get(k)
            if p is None or p != prev or refs[k] == 0:
                break
            prev = k
            h += 1
        return h

    def peek(self, keys: tuple[int, ...], n_max: int, free_blocks: int) -> int:
        """:meth:`match` as it will be after :meth:`settle` with ``free_blocks`` (nothing changes)."""
        deficit = self.evictable_blocks - free_blocks
        if deficit <= 0:
            return self.match(keys, n_max)
        m = self.kv_per_block
        n = (deficit + m - 1) // m
        doomed: set[int] = set()
        for k in self.lru:
            if len(doomed) >= n:
                break
            doomed.add(k)
        parents = self.parents
        prev = ROOT_KEY
        h = 0
        while h < n_max:
            k = keys[h]
            p = parents.get(k)
            if p is None or p != prev or k in doomed:
                break
            prev = k
            h += 1
        return h

    # ------------------------------------------------------------------ changes
    def settle(self, free_blocks: int) -> None:
        """Evict least-recently-used cached-free entries until the unallocated blocks
        (``free_blocks`` - cached-free blocks) are not negative."""
        deficit = self.evictable_blocks - free_blocks
        if deficit <= 0:
            return
        m = self.kv_per_block
        n = (deficit + m - 1) // m
        lru = self.lru
        refs = self.refs
        parents = self.parents
        index = self.index
        for _ in range(n):
            k = lru.popitem(last=False)[0]
            del refs[k]
            del parents[k]
            c = index[k] - 1
            if c:
                index[k] = c
            else:
                del index[k]
        self.evictable_blocks -= n * m
        self.evictions += n

    def acquire(self, req: RequestState, free_blocks: int) -> int:
        """Admission of ``req`` with ``free_blocks`` free (cached-free included): settle, then take
        a reference on its longest cached prefix (at most :meth:`limit` entries); return the
        entries (``req.held``). The engine's free blocks drop by :meth:`admission_blocks`."""
        self.settle(free_blocks)
        keys = req.prefix_keys
        assert keys is not None
        h = self.match(keys, self.limit(req))
        if h:
            refs = self.refs
            lru = self.lru
            back = 0
            for i in range(h):
                k = keys[i]
                c = refs[k]
                if c == 0:
                    del lru[k]
                    back += 1
                refs[k] = c + 1
            self.evictable_blocks -= back * self.kv_per_block
        req.held = h
        return h

    def insert(self, req: RequestState, n_full: int, free_blocks: int) -> int:
        """``req``'s prefill has computed ``n_full`` full prefix blocks: its blocks ``held ..
        n_full - 1`` become entries it holds (an existing entry is adopted and the request's copy
        freed). Returns the change of the engine's free blocks."""
        i = req.held
        keys = req.prefix_keys
        assert keys is not None
        if i >= n_full:
            return 0
        self.settle(free_blocks)
        refs = self.refs
        parents = self.parents
        index = self.index
        m = self.kv_per_block
        prev = keys[i - 1] if i else ROOT_KEY
        delta = 0
        while i < n_full:
            k = keys[i]
            p = parents.get(k)
            if p is None:
                refs[k] = 1
                parents[k] = prev
                index[k] = index.get(k, 0) + 1
                self.inserted += 1
            elif p == prev:  # computed by another request meanwhile: share it, free this copy
                c = refs[k]
                if c == 0:
                    del self.lru[k]
                    self.evictable_blocks -= m
                else:
                    delta += m
                refs[k] = c + 1
            else:  # a key collision (another chain): this chain is not cached beyond here
                req.prefix_keys = keys[:i]
                break
            req.kv_blocks -= m
            prev = k
            i += 1
        req.held = i
        return delta

    def release(self, req: RequestState, free_blocks: int) -> int:
        """``req`` leaves the engine (completed or preempted) with ``free_blocks`` free: settle,
        drop its references deepest first; return the KV blocks that became cached-free (they
        count as free)."""
        self.settle(free_blocks)  # (for every request: its blocks may have needed evictions)
        h = req.held
        if not h:
            return 0
        keys = req.prefix_keys
        assert keys is not None
        refs = self.refs
        lru = self.lru
        n = 0
        for i in range(h - 1, -1, -1):
            k = keys[i]
            c = refs[k] - 1
            refs[k] = c
            if c == 0:
                lru[k] = None
                n += 1
        req.held = 0
        freed = n * self.kv_per_block
        self.evictable_blocks += freed
        return freed

    def clear(self) -> None:
        """Forget every entry (the engine lost its KV cache: asleep, off, aborted, reset). Only
        cached-free entries may remain when it is called (nothing runs on the engine)."""
        index = self.index
        for k in self.refs:
            c = index[k] - 1
            if c:
                index[k] = c
            else:
                del index[k]
        self.refs = {}
        self.parents = {}
        self.lru = OrderedDict()
        self.evictable_blocks = 0
