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
(:func:`chain_key`; ``key_{-1}`` = :data:`ROOT_KEY`), computed once per request, when it is
submitted (:func:`prefix_keys`), and kept on it: a key names the whole prefix ``0..i``, so a hit at
block ``i`` implies the prefix matches; ids are never trusted to be chained themselves. As in vLLM, a hit
trusts the 64-bit key: for a fixed parent CPython's tuple hash is injective in an id in ``[0,
2**61)``, so only two different prefixes can collide, with probability about ``n**2 / 2**65`` for
``n`` distinct blocks (below 1e-7 for a million), and the later one would then count a hit on the
other's block.

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
  :data:`PrefixIndex` (key -> the runs of its engines' caches that start with it) gives every
  engine's cached prefix of a request by a walk of its runs (cache-aware dispatch, the
  simulator's queries).
* An engine that falls asleep, powers off, is aborted or reset loses its cache (:meth:`clear`).

**Data.** No object per block: per engine, runs of consecutive entries with the same references
(:class:`Segment`, a radix tree: split where references differ or the chain branches) found by
the key of their first entry, and a list of runs in LRU order, kept lazily (see
:class:`PrefixCache`); per datacenter the index of the runs by first key. Cost: per admission
and release O(runs of the request's prefix) plus key comparisons inside runs, per prefill chunk
O(1) (the request's own run grows), O(1) amortised per eviction (a dict operation only when a
run empties), per dispatch a walk of the runs of each engine caching the first block; never per
token. Compiled with the engine
(``setup.py``, :data:`carbon_gym.sim._native.COMPILED_MODULES`).
"""

from __future__ import annotations

import operator
from typing import Any, Final

from ..errors import ConfigError
from .request import CopyableState, RequestState, mypyc_attr

__all__ = ["PrefixCache", "Segment", "PrefixIndex", "common_entries", "run_depth", "Key", "ROOT_KEY", "MAX_BLOCK_ID", "chain_key", "chain_keys", "prefix_keys",
           "batch_prefix_keys", "attach_prefix"]

#: Parent key of every request's first prefix block.
ROOT_KEY: Final = 0x5EED
#: Block ids must lie in [0, MAX_BLOCK_ID) (where the chained keys are injective per parent, see the docstring).
MAX_BLOCK_ID: Final = 2 ** 61 - 1


#: A chained key: a Python int, typed ``object`` so that compiled code keeps it as the object it is
#: (mypyc unboxes an ``int`` of up to 62 bits and boxes it again, an allocation, at every dict access).
Key = object


def chain_key(parent: Key, block_id: Any) -> Key:
    """The key of a block: ``hash((parent key, block id))`` (typed ``Key``: boxed once, here)."""
    return hash((parent, block_id))


def chain_keys(ids: Any, n: int) -> tuple[Key, ...]:
    """The chained keys of the first ``n`` block ids: ``key_i = chain_key(key_{i-1}, ids[i])``."""
    prev: Key = ROOT_KEY
    out: list[Key] = []
    for i in range(n):
        prev = chain_key(prev, ids[i])
        out.append(prev)
    return tuple(out)


def prefix_keys(hashes: Any, prompt_tokens: int, prefix_tokens: int, caching: bool, row: int = -1) -> tuple[Key, ...] | None:
    """Validate one request's ``prefix_hashes`` (None or block ids, at most one per
    ``prefix_tokens``-token block of its ``prompt_tokens``-token prompt, each an integer, not a
    bool, in [0, :data:`MAX_BLOCK_ID`)) - :class:`ConfigError` naming ``prefix_hashes`` (``prefix_hashes[row]``
    with ``row >= 0``) - and return the chained keys of its full blocks, or None (no ids, no full
    block, or ``caching`` off)."""
    if hashes is None:
        return None
    if isinstance(hashes, (list, tuple)) and len(hashes) <= -(-prompt_tokens // prefix_tokens):
        # the usual input, checked and chained in one pass (anything else: the general path)
        n = prompt_tokens // prefix_tokens if caching else 0
        out: list[Key] = []
        prev: Key = ROOT_KEY
        ok = True
        for h in hashes:
            x = h  # (narrowed to int below; h stays the object it is)
            if type(x) is not int or x < 0 or x >= MAX_BLOCK_ID:
                ok = False
                break
            if len(out) < n:
                prev = chain_key(prev, h)
                out.append(prev)
        if ok:
            return tuple(out) if out else None
    field = "prefix_hashes" if row < 0 else f"prefix_hashes[{row}]"
    try:
        items = list(hashes)
        ids = [operator.index(x) for x in items]
    except TypeError:
        raise ConfigError(field, f"must be None or a sequence of integer block ids, got {hashes!r}") from None
    flags = [i for i, x in enumerate(items) if isinstance(x, bool)]
    if flags:  # (operator.index takes True as 1: a list of flags is a slip, not block ids)
        raise ConfigError(field, f"block ids must be integers, not bools: entry {flags[0]} is {items[flags[0]]!r} "
                          f"in {hashes!r}", allowed="0 <= id < 2**61 - 1 (int or numpy integer; not bool)")
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
                      caching: bool) -> list[tuple[Key, ...] | None] | None:
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
    out = [prefix_keys(h, p, prefix_tokens, caching, i) for i, (h, p) in enumerate(zip(hashes, prompts))]
    return out if any(k is not None for k in out) else None


def attach_prefix(requests: dict[int, RequestState], first: int, hashes: Any,
                  keys: list[tuple[Key, ...] | None] | None) -> None:
    """Give the requests ``first, first + 1, ...`` of a batch (``requests``: by id) their block ids
    ``hashes`` (None, or one entry per request; kept for ``AbortedRequests``) and prefix ``keys``
    (:func:`batch_prefix_keys`)."""
    if hashes is None:
        return
    for i, h in enumerate(hashes):
        if h is not None:
            r = requests[first + i]
            r.prefix_hashes = h
            if keys is not None:
                r.prefix_keys = keys[i]


#: A datacenter's prefix index: key -> the runs (:class:`Segment`, of any of its engines) whose
#: first entry it is.
PrefixIndex = dict[Key, list["Segment"]]


@mypyc_attr(allow_interpreted_subclasses=True)
class Segment(CopyableState):
    """A run of consecutive entries of one engine's cache: the prefix blocks ``lo .. lo + n - 1``
    of the chain ``keys`` (any request's keys with that prefix), all with the same references
    ``refs`` (0: cached-free), whose parent run ends at block ``lo - 1`` (None: ``lo == 0``).
    Runs are split where references differ or the chain branches, never merged."""

    __slots__ = ("keys", "lo", "n", "refs", "place", "parent", "nchild", "eng")

    def __init__(self, keys: tuple[Key, ...], lo: int, n: int, refs: int, parent: Segment | None, eng: int) -> None:
        self.eng = eng  # index of its engine in the datacenter
        self.keys = keys
        self.lo = lo
        self.n = n
        self.refs = refs
        self.place = -1  # cached-free: its place in the LRU order (-1: not in it)
        self.parent = parent
        self.nchild = 0  # runs whose parent it is


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixCache(CopyableState):
    """The prefix cache of one engine (see the module docstring). Counts are in entries (prefix
    blocks) unless named ``_blocks`` (KV blocks).

    The entries are held as :class:`Segment` runs (a radix tree): ``heads`` maps the key of each
    run's first block to the run, so a lookup walks runs, comparing keys inside a run, and a
    request's prefill extends its own run without a dict operation per block. Every entry of a
    run has its references (``refs``; 0: cached-free). The LRU order of the cached-free entries
    is kept per run: a release appends the runs it frees deepest first (an entry at a time, that
    is the order of their blocks from the deepest), and eviction takes blocks from the tail of the
    first run of the list ``lru`` (runs in the order they became cached-free; place ``p`` at
    ``lru[p - lru_base]``), read from ``lru_head`` on; a run taken again leaves its place empty
    (None). The used places are cut off when they are half the list, and the list is rebuilt
    without its empty places when they outnumber the cached-free entries (amortised O(1) per
    release). :attr:`state` and :meth:`lru_order` give the per-entry view (for checks)."""

    __slots__ = (
        "prefix_tokens",     # tokens per prefix block
        "block_tokens",      # tokens per KV block
        "kv_per_block",      # KV blocks per entry (prefix_block_tokens / block_tokens)
        "eng",               # this engine's index in its datacenter
        "index",             # the datacenter's PrefixIndex (shared by its engines)
        "heads",             # key of a run's first block -> the run
        "entries",           # entries cached (blocks of the runs)
        "lru",               # runs in the order they became cached-free (None: an empty place)
        "lru_base",          # place of lru[0]
        "lru_head",          # index in lru of the first place not used up
        "evictable_blocks",  # KV blocks of the cached-free entries
        "evictions",         # entries evicted so far
        "inserted",          # entries created so far
    )

    def __init__(self, prefix_tokens: int, block_tokens: int, index: PrefixIndex, engine: int) -> None:
        self.prefix_tokens = prefix_tokens
        self.block_tokens = block_tokens
        self.kv_per_block = prefix_tokens // block_tokens
        self.index = index
        self.eng = engine
        self.heads: dict[Key, Segment] = {}
        self.entries = 0
        self.lru: list[Segment | None] = []
        self.lru_base = self.lru_head = 0
        self.evictable_blocks = 0
        self.evictions = 0
        self.inserted = 0

    def __len__(self) -> int:
        return self.entries

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

    def _walk(self, keys: tuple[Key, ...], n_max: int, mode: int, doomed: dict[Segment, int] | None) -> int:
        """Entries of the longest cached prefix of ``keys`` (at most ``n_max``): all of them (mode
        0), those held by running requests (1), or those left after the evictions ``doomed`` (run
        -> blocks evicted from its tail; mode 2)."""
        heads = self.heads
        h = 0
        while h < n_max:
            seg = heads.get(keys[h])
            if seg is None or (mode == 1 and seg.refs == 0):
                break
            n = seg.n
            if doomed is not None:
                n -= doomed.get(seg, 0)
                if n <= 0:
                    break
            end = h + n
            stop = end > n_max or n < seg.n
            if end > n_max:
                end = n_max
            j = h + common_entries(keys, h, seg, n_max, n)
            if j < end or stop:
                return j
            h = j
        return h

    def match(self, keys: tuple[Key, ...], n_max: int) -> int:
        """Entries of the longest cached prefix of ``keys`` (at most ``n_max``)."""
        return self._walk(keys, n_max, 0, None)

    def live(self, keys: tuple[Key, ...], n_max: int) -> int:
        """Entries of the longest prefix of ``keys`` (at most ``n_max``) held by running requests:
        admitting the request takes no new blocks for them (they are already allocated)."""
        return self._walk(keys, n_max, 1, None)

    def peek(self, keys: tuple[Key, ...], n_max: int, free_blocks: int) -> int:
        """:meth:`match` as it will be after :meth:`settle` with ``free_blocks`` (nothing changes)."""
        deficit = self.evictable_blocks - free_blocks
        if deficit <= 0:
            return self._walk(keys, n_max, 0, None)
        m = self.kv_per_block
        left = (deficit + m - 1) // m
        lru = self.lru
        doomed: dict[Segment, int] = {}
        i = self.lru_head
        while left > 0:
            seg = lru[i]
            if seg is not None:
                e = seg.n if seg.n < left else left
                doomed[seg] = e
                left -= e
            i += 1
        return self._walk(keys, n_max, 2, doomed)

    def lru_order(self) -> list[Key]:
        """Keys of the cached-free entries, least recently used first (for checks)."""
        out: list[Key] = []
        lru = self.lru
        for i in range(self.lru_head, len(lru)):
            seg = lru[i]
            if seg is not None:
                for j in range(seg.lo + seg.n - 1, seg.lo - 1, -1):
                    out.append(seg.keys[j])
        return out

    @property
    def state(self) -> dict[Key, int]:
        """Key -> references (>= 1) of every entry, or ``-1 - p`` for a cached-free one, ``p`` its
        place in :meth:`lru_order` (the per-entry view, for checks)."""
        out: dict[Key, int] = {}
        for seg in self.heads.values():
            if seg.refs:
                for j in range(seg.lo, seg.lo + seg.n):
                    out[seg.keys[j]] = seg.refs
        for p, k in enumerate(self.lru_order()):
            out[k] = -1 - p
        return out

    # ------------------------------------------------------------------ changes
    def _split(self, seg: Segment, x: int) -> Segment:
        """Cut the run ``seg`` after its first ``x`` entries (0 < x < seg.n): they become a new
        run, the parent of the rest (``seg``, which keeps its place in the LRU order); return it."""
        f = Segment(seg.keys, seg.lo, x, seg.refs, seg.parent, self.eng)
        f.nchild = 1
        heads = self.heads
        k = seg.keys[seg.lo]
        heads[k] = f
        runs = self.index[k]
        runs[runs.index(seg)] = f
        seg.lo += x
        seg.n -= x
        seg.parent = f
        self._register(seg)
        return f

    def _register(self, seg: Segment) -> None:
        """``seg`` is a run of this cache: find it by its first key (here and in the index)."""
        k = seg.keys[seg.lo]
        self.heads[k] = seg
        runs = self.index.get(k)
        if runs is None:
            self.index[k] = [seg]
        else:
            runs.append(seg)

    def _take(self, seg: Segment) -> None:
        """One more reference on the entries of ``seg`` (cached-free ones are taken again)."""
        if seg.refs == 0:
            if seg.place >= 0:
                self.lru[seg.place - self.lru_base] = None
                seg.place = -1
            self.evictable_blocks -= seg.n * self.kv_per_block
        seg.refs += 1

    def _drop(self, seg: Segment) -> None:
        """Forget the run ``seg``, emptied by evictions (its children are gone already)."""
        k = seg.keys[seg.lo]
        del self.heads[k]
        runs = self.index[k]
        if len(runs) == 1:
            del self.index[k]
        else:
            runs.remove(seg)
        parent = seg.parent
        if parent is not None:
            parent.nchild -= 1

    def settle(self, free_blocks: int) -> None:
        """Evict least-recently-used cached-free entries until the unallocated blocks
        (``free_blocks`` - cached-free blocks) are not negative."""
        deficit = self.evictable_blocks - free_blocks
        if deficit <= 0:
            return
        m = self.kv_per_block
        n = (deficit + m - 1) // m
        lru = self.lru
        i = self.lru_head
        left = n
        while left:
            seg = lru[i]
            if seg is None:
                i += 1
                continue
            e = seg.n if seg.n <= left else left
            left -= e
            seg.n -= e  # (its deepest entries evicted)
            if not seg.n:
                self._drop(seg)
                seg.place = -1
                lru[i] = None
                i += 1
        if i > 64 and 2 * i > len(lru):  # cut off the used places
            del lru[:i]
            self.lru_base += i
            i = 0
        self.lru_head = i
        self.evictable_blocks -= n * m
        self.evictions += n
        self.entries -= n

    def acquire(self, req: RequestState, free_blocks: int) -> int:
        """Admission of ``req`` with ``free_blocks`` free (cached-free included): settle, then take
        a reference on its longest cached prefix (at most :meth:`limit` entries); return the
        entries (``req.held``). The engine's free blocks drop by :meth:`admission_blocks`."""
        self.settle(free_blocks)
        keys = req.prefix_keys
        assert keys is not None
        n_max = self.limit(req)
        heads = self.heads
        h = 0
        tail: Segment | None = None
        while h < n_max:
            seg = heads.get(keys[h])
            if seg is None:
                break
            x = common_entries(keys, h, seg, n_max)
            full = x == seg.n
            if not full:
                seg = self._split(seg, x)
            self._take(seg)
            h += x
            tail = seg
            if not full:
                break
        req.held = h
        req.seg = tail
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
        heads = self.heads
        m = self.kv_per_block
        tail: Segment | None = req.seg
        delta = 0
        while i < n_full:
            seg = heads.get(keys[i])
            if seg is None:  # new entries: i .. n_full - 1
                k = n_full - i
                if tail is not None and tail.refs == 1 and not tail.nchild:
                    tail.keys = keys  # (its own run: extended; the keys agree on the run's blocks)
                    tail.n += k
                else:
                    new = Segment(keys, i, k, 1, tail, self.eng)
                    self._register(new)
                    if tail is not None:
                        tail.nchild += 1
                    tail = new
                self.inserted += k
                self.entries += k
                req.kv_blocks -= k * m
                break
            # computed by another request meanwhile: share it, free this copy
            x = common_entries(keys, i, seg, n_full)
            if x < seg.n:
                seg = self._split(seg, x)
            if seg.refs:
                delta += x * m
            self._take(seg)
            req.kv_blocks -= x * m
            i += x
            tail = seg
        req.held = n_full
        req.seg = tail
        return delta

    def release(self, req: RequestState, free_blocks: int) -> int:
        """``req`` leaves the engine (completed or preempted) with ``free_blocks`` free: settle,
        drop its references deepest first; return the KV blocks that became cached-free (they
        count as free)."""
        self.settle(free_blocks)  # (for every request: its blocks may have needed evictions)
        if not req.held:
            return 0
        lru = self.lru
        b = self.lru_base
        n = 0
        seg: Segment | None = req.seg
        while seg is not None:
            seg.refs -= 1
            if not seg.refs:
                seg.place = b + len(lru)
                lru.append(seg)
                n += seg.n
            seg = seg.parent
        req.held = 0
        req.seg = None
        freed = n * self.kv_per_block
        self.evictable_blocks += freed
        if len(lru) - self.lru_head > 2 * (self.evictable_blocks // self.kv_per_block) + 64:
            self._compact()
        return freed

    def _compact(self) -> None:
        """Rebuild the LRU list without its empty places (same order)."""
        lru = self.lru
        live: list[Segment | None] = []
        for i in range(self.lru_head, len(lru)):
            seg = lru[i]
            if seg is not None:
                seg.place = len(live)
                live.append(seg)
        self.lru = live
        self.lru_base = self.lru_head = 0

    def clear(self) -> None:
        """Forget every entry (the engine lost its KV cache: asleep, off, aborted, reset)."""
        index = self.index
        for k, seg in self.heads.items():
            runs = index[k]
            if len(runs) == 1:
                del index[k]
            else:
                runs.remove(seg)
        self.heads = {}
        self.entries = 0
        self.lru = []
        self.lru_base = self.lru_head = 0
        self.evictable_blocks = 0


def common_entries(keys: tuple[Key, ...], h: int, seg: Segment, n_max: int, n: int = -1) -> int:
    """Entries of the run ``seg`` (whose first entry is ``keys[h]``; its first ``n`` entries, all
    of them with ``n < 0``) matching ``keys`` from ``h`` on, at most ``n_max - h``."""
    end = h + (seg.n if n < 0 else n)
    if end > n_max:
        end = n_max
    sk = seg.keys
    d = seg.lo - h
    j = h + 1
    while j < end and keys[j] == sk[j + d]:
        j += 1
    return j - h


def run_depth(index: PrefixIndex, seg: Segment, keys: tuple[Key, ...], n_max: int) -> int:
    """Entries of the longest prefix of ``keys`` (at most ``n_max``) cached by the engine of the
    run ``seg``, a run whose first entry is ``keys[0]`` (a walk of that engine's runs through the
    datacenter's ``index``)."""
    h = 0
    eng = seg.eng
    while True:
        x = common_entries(keys, h, seg, n_max)
        h += x
        if x < seg.n or h >= n_max:
            return h
        runs = index.get(keys[h])
        if runs is None:
            return h
        nxt: Segment | None = None
        for r in runs:
            if r.eng == eng:
                nxt = r
                break
        if nxt is None:
            return h
        seg = nxt
