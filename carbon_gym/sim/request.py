"""The simulator's small stateful classes shared by the engine, the datacenter and the simulator:
:class:`CopyableState` (copy / pickle of compiled instances), :class:`RequestState` (one
in-flight request), :class:`EventQueue` (the event heap, and each engine's heap of decode
completions) and :class:`EngineModels` (the latency and power models of a simulation, with
caches). Compiled with them (``setup.py``, :data:`carbon_gym.sim._native.COMPILED_MODULES`).
"""

from __future__ import annotations

from typing import Any, Final

from .kernels import blank_instance, phase_power_params, slot_state, table_latency_params

try:  # compile-time class options for mypyc (setup.py); a no-op when the module runs as Python
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - pure-Python install without mypy_extensions

    def mypyc_attr(*args: Any, **kwargs: Any) -> Any:  # type: ignore  # (a second definition, by design)
        """No-op stand-in for ``mypy_extensions.mypyc_attr``."""
        return lambda cls: cls


__all__ = ["CopyableState", "RequestState", "Event", "EventQueue", "EngineModels", "PRIO_SHIFT", "mypyc_attr", "record_column"]

#: An event's key is ``priority << PRIO_SHIFT | sequence number`` (:meth:`EventQueue.push`): events
#: at the same time pop by priority, then in the order they were pushed.
PRIO_SHIFT: Final = 48


@mypyc_attr(allow_interpreted_subclasses=True)
class CopyableState:
    """Base of the simulator's stateful classes: ``copy`` / ``pickle`` through their attributes,
    which also works when the modules are compiled (mypyc instances have no ``__dict__``)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        """Copy / pickle support that also works when this module is compiled (no ``__dict__``)."""
        return (blank_instance, (type(self),), slot_state(self))

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


@mypyc_attr(allow_interpreted_subclasses=True)
class RequestState(CopyableState):
    """Mutable state of one in-flight request (internal; results come out as RequestRecords).

    The decode fields come in two sets: the fast path (``step_mode=False``) keeps a decoding
    request's context and output count as offsets from its engine's ``decode_iters`` (nothing is
    updated per iteration); step mode counts ``ctx_tokens`` and ``generated`` explicitly.
    """

    __slots__ = (
        "rid", "origin", "dc",      # request id (submission order), origin region and datacenter indices
        "arrival_s", "sent_s", "dc_arrival_s",  # issued by the client, placed, reached the datacenter, s
        "up_s", "down_s",           # uplink (one way + prompt transfer) and downlink delays, s
        "prompt_tokens",            # prompt length, tokens
        "output_tokens",            # true output length, tokens (hidden from schedulers)
        "prefill_len",              # tokens to prefill: the prompt, or prompt + generated after a preemption
        "prefilled",                # tokens of prefill_len computed so far
        "kv_blocks",                # KV blocks allocated at admission (for all of prefill_len), while prefilling
        "generated",                # output tokens sampled (fast path: up to date only while not decoding)
        "decoding",                 # prefill done: decoding, holding ceil(context / block_tokens) blocks
        "ctx_offset",               # fast path, decoding: context tokens minus the engine's decode_iters
        "gen_offset",               # fast path, decoding: generated minus the engine's decode_iters
        "finish_seq",               # fast path: sequence number of its live finish_heap entry (-1: none)
        "ctx_tokens",               # step mode, decoding: context tokens in the KV cache
        "share_mark_j", "share_mark_g",  # fast path: the engine's decode_share_j / _g when it began decoding
        "first_sched_s",            # engine time of its first prefill chunk (-1 before), s
        "first_token_s",            # engine time its first output token was sampled (-1 before), s
        "preemptions",              # times it was preempted (and recomputed)
        "energy_j", "carbon_g",     # facility energy (J) and carbon (gCO2eq) attributed so far
        "alive",                    # False once completed or aborted (its heap entries are stale)
        "engine_index",             # completed: index of the engine that served it in its datacenter
        "done_s",                   # completed: engine time its last token was sampled, s
        # prefix caching (carbon_gym.sim.prefix_cache; None / 0 without it)
        "prefix_hashes",            # its block ids as submitted, or None (kept for AbortedRequests)
        "prefix_keys",              # chained keys of its full prompt prefix blocks, or None (not cacheable)
        "held",                     # leading prefix-cache entries it holds a reference on
        "seg",                      # the prefix-cache run (prefix_cache.Segment) of its last held entry, or None
        "cached_tokens",            # prompt tokens served from the cache at its first admission
    )

    def __init__(self, rid: int, origin: int, dc: int, arrival_s: float, sent_s: float,
                 up_s: float, down_s: float, prompt_tokens: int, output_tokens: int) -> None:
        self.rid = rid
        self.origin = origin
        self.dc = dc
        self.arrival_s = arrival_s
        self.sent_s = sent_s
        self.up_s = up_s
        self.down_s = down_s
        self.dc_arrival_s = sent_s + up_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.prefill_len = prompt_tokens
        self.prefilled = self.kv_blocks = self.generated = self.preemptions = 0
        self.decoding = False
        self.ctx_offset = self.gen_offset = self.ctx_tokens = 0
        self.finish_seq = -1
        self.share_mark_j = self.share_mark_g = self.energy_j = self.carbon_g = 0.0
        self.first_sched_s = self.first_token_s = -1.0
        self.alive = True
        self.engine_index = -1
        self.done_s = -1.0
        self.prefix_hashes: Any = None
        self.prefix_keys: tuple[object, ...] | None = None  # (prefix_cache.Key: ints kept as objects)
        self.held = self.cached_tokens = 0
        self.seg: Any = None


@mypyc_attr(allow_interpreted_subclasses=True)
class Event(CopyableState):
    """One entry of an :class:`EventQueue`: at time ``t`` (s), ordered by ``(t, key)``, for
    ``item`` (the object the event is for), with ``tag`` (an integer its owner checks when the
    event pops: a version or sequence number; a stale entry is skipped by its reader)."""

    __slots__ = ("t", "key", "item", "tag")

    def __init__(self, t: float, key: int, item: object, tag: int) -> None:
        self.t = t
        self.key = key
        self.item = item
        self.tag = tag


@mypyc_attr(allow_interpreted_subclasses=True)
class EventQueue(CopyableState):
    """A binary min-heap of :class:`Event` objects ordered by ``(t, key)`` (keys are unique:
    :data:`PRIO_SHIFT`), so the pop order is the sorted order whatever the heap's layout: exactly
    the order ``heapq`` gives the tuples ``(time, priority, sequence, ...)``.

    The simulator's event heap pushes with :meth:`push` (arrivals priority 0, engine events 1,
    capacity transitions 2); an engine's heap of decode completions with :meth:`push_key`
    (time: the decode iteration of the last token; key: a sequence number from the event heap).
    Read the top as ``heap[0]``, then :meth:`pop` it; a reader done with a popped event may hand
    it back with :meth:`recycle` (a later push reuses it: no allocation per event).
    """

    __slots__ = ("heap", "seq", "spare")

    def __init__(self) -> None:
        self.heap: list[Event] = []
        self.seq = 0  # the next sequence number
        self.spare: list[Event] = []  # popped events handed back (recycle), reused by push_key

    def __len__(self) -> int:
        return len(self.heap)

    def next_seq(self) -> int:
        """A new sequence number (0, 1, 2, ... over the queue's life)."""
        s = self.seq
        self.seq = s + 1
        return s

    def push(self, t: float, prio: int, item: object, tag: int) -> None:
        """Push an event at time ``t`` (s) of priority ``prio`` (0 pops first among equal times)
        with a new sequence number."""
        s = self.seq
        self.seq = s + 1
        self.push_key(t, (prio << PRIO_SHIFT) | s, item, tag)

    def push_key(self, t: float, key: int, item: object, tag: int) -> None:
        """Push an entry with its own ``key`` (unique in this heap)."""
        spare = self.spare
        if spare:
            ev = spare.pop()
            ev.t = t
            ev.key = key
            ev.item = item
            ev.tag = tag
        else:
            ev = Event(t, key, item, tag)
        heap = self.heap
        i = len(heap)
        heap.append(ev)
        while i > 0:  # sift up
            p = (i - 1) >> 1
            up = heap[p]
            if t < up.t or (t == up.t and key < up.key):
                heap[i] = up
                i = p
            else:
                break
        heap[i] = ev

    def pop(self) -> Event:
        """Remove and return the top entry (the heap must not be empty)."""
        heap = self.heap
        last = heap.pop()
        n = len(heap)
        if n == 0:
            return last
        top = heap[0]
        t = last.t
        key = last.key
        i = 0  # sift the last entry down from the root
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            child = heap[c]
            r = c + 1
            if r < n:
                right = heap[r]
                if right.t < child.t or (right.t == child.t and right.key < child.key):
                    c = r
                    child = right
            if child.t < t or (child.t == t and child.key < key):
                heap[i] = child
                i = c
            else:
                break
        heap[i] = last
        return top

    def recycle(self, ev: Event) -> None:
        """Hand back ``ev``, popped and read: a later push reuses it."""
        ev.item = None
        self.spare.append(ev)

    def clear(self) -> None:
        """Remove every entry (the sequence numbers go on)."""
        self.heap.clear()


def _bisect_right(a: list[float], x: float) -> int:
    """``bisect.bisect_right(a, x)`` (the same algorithm, on native floats)."""
    lo = 0
    hi = len(a)
    while lo < hi:
        mid = (lo + hi) >> 1
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@mypyc_attr(allow_interpreted_subclasses=True)
class EngineModels(CopyableState):
    """Latency and power models shared by the engines of a simulation, with small caches.

    :meth:`iteration_time_s` and :meth:`prefill_engine_w` are the models' own formulas, evaluated
    here (compiled with this module) for the table latency model and the phase power model, from
    the parameters those models hand over (:func:`~carbon_gym.sim.kernels.table_latency_params`,
    :func:`~carbon_gym.sim.kernels.phase_power_params`), with the same floating-point operations
    in the same order (the same floats: ``tests/test_perf_paths.py``); any other model's own
    method is called. ``decode_fixed_s(n)`` is the part of a pure-decode iteration's time that
    does not depend on the context sum (the latency contract guarantees the time is affine in
    it), and ``decode_power_w(n)`` the engine's (all TP GPUs) power while decoding ``n`` sequences.
    """

    __slots__ = (
        "latency", "power", "tp",  # the latency model (for tp GPUs), the per-GPU power model, GPUs per engine
        "states",                  # PowerStates of the capacity states (sleep, wake, boot), or None
        "decode_ctx_coeff_s",      # seconds a decode iteration gains per context token
        "idle_engine_w",           # engine watts with no work (tp x idle GPU power)
        # the table latency model's parameters (table_latency_params; table False: another model)
        "table", "grid", "lin", "slopes", "last",
        "dec_fixed", "dec_seq", "dec_ctx", "pre_fixed", "pre_tok", "pre_pair",
        "overhead", "ar_fixed", "ar_tok", "lm_fixed", "per_sampled",
        "ptable", "pg", "pa", "psa", "pb", "psb",  # prefill attention tables (ptable False: none)
        # the phase power model's (phase_power_params; phase False: another model)
        "phase", "prefill_w", "prefill_sat",
        "_decode_fixed", "_decode_power", "_decode_base",  # caches of decode_fixed_s / decode_power_w /
                                                           # per-GPU decode_power_w, by sequences
    )

    def __init__(self, latency: Any, power: Any, tp: int, states: Any = None) -> None:
        self.latency = latency
        self.power = power
        self.tp = tp
        self.states = states
        self.decode_ctx_coeff_s = float(latency.decode_ctx_coeff_s())
        self.idle_engine_w = tp * float(power.idle_w)
        lp = table_latency_params(latency)
        self.table = lp is not None
        if lp is None:
            lp = ([0.0, 1.0], [0.0, 0.0], [0.0], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None)
        self.grid: list[float] = lp[0]
        self.lin: list[float] = lp[1]
        self.slopes: list[float] = lp[2]
        self.last = len(self.grid) - 2
        self.dec_fixed: float = lp[3]
        self.dec_seq: float = lp[4]
        self.dec_ctx: float = lp[5]
        self.pre_fixed: float = lp[6]
        self.pre_tok: float = lp[7]
        self.pre_pair: float = lp[8]
        self.overhead: float = lp[9]
        self.ar_fixed: float = lp[10]
        self.ar_tok: float = lp[11]
        self.lm_fixed: float = lp[12]
        self.per_sampled: float = lp[13]
        pt = lp[14]
        self.ptable = pt is not None
        if pt is None:
            pt = ([0.0, 1.0], [0.0, 0.0], [0.0], [0.0, 0.0], [0.0])
        self.pg: list[float] = pt[0]
        self.pa: list[float] = pt[1]
        self.psa: list[float] = pt[2]
        self.pb: list[float] = pt[3]
        self.psb: list[float] = pt[4]
        pp = phase_power_params(power)
        self.phase = pp is not None
        self.prefill_w: float = pp[0] if pp is not None else 0.0
        self.prefill_sat: float = pp[1] if pp is not None else 1.0
        self._decode_fixed: dict[int, float] = {}
        self._decode_power: dict[int, float] = {}
        self._decode_base: dict[int, float] = {}

    def iteration_time_s(self, pt: int, pairs: float, nd: int, ctx_sum: float, n_sampled: int) -> float:
        """Seconds of an iteration computing ``pt`` prompt tokens (``pairs`` attention pairs) and
        decoding ``nd`` sequences (context sum ``ctx_sum``), ``n_sampled`` of them sampling: the
        latency model's ``iteration_time_s`` (the table model's formula, same floats)."""
        if not self.table:
            return float(self.latency.iteration_time_s(pt, pairs, nd, ctx_sum, n_sampled))
        tokens = pt + nd
        if tokens <= 0:
            return 0.0
        x = float(tokens)  # (exact: the same floats, with float-float comparisons in the bisections)
        grid = self.grid
        i = _bisect_right(grid, x) - 1
        if i < 0:
            i = 0
        elif i > self.last:
            i = self.last
        t = self.lin[i] + self.slopes[i] * (x - grid[i])
        if nd > 0:
            t += self.dec_fixed + self.dec_seq * nd
            t += self.dec_ctx * ctx_sum
        if pt > 0:
            t += self.pre_fixed + self.pre_tok * pt
            t += self.pre_pair * pairs
            if self.ptable:  # physics.latency.prefill_table_s
                p = float(pt)
                g = self.pg
                if p <= g[0]:
                    t += self.pa[0] + self.pb[0] * pairs
                else:
                    j = _bisect_right(g, p) - 1
                    if j > len(g) - 2:
                        j = len(g) - 2
                    dx = p - g[j]
                    a = self.pa[j] + self.psa[j] * dx
                    b = self.pb[-1] if p >= g[-1] else self.pb[j] + self.psb[j] * dx
                    t += a + b * pairs
        t += self.overhead + self.ar_fixed + self.ar_tok * tokens
        if n_sampled > 0:
            t += self.lm_fixed + self.per_sampled * n_sampled
        return t

    def prefill_engine_w(self, pt: int, nd: int) -> float:
        """The engine's watts (all ``tp`` GPUs) during an iteration with ``pt > 0`` prompt tokens
        and ``nd`` decoding sequences: ``tp x`` the power model's ``gpu_power_w(pt, nd)``."""
        if not self.phase:
            return self.tp * float(self.power.gpu_power_w(pt, nd))
        base = self._decode_base.get(nd)
        if base is None:
            base = self._decode_base[nd] = float(self.power.decode_power_w(nd))
        frac = min(1.0, pt / self.prefill_sat)
        return self.tp * (base + (self.prefill_w - base) * frac)

    def decode_fixed_s(self, n: int) -> float:
        """Seconds of a pure-decode iteration of ``n`` sequences with zero context."""
        v = self._decode_fixed.get(n)
        if v is None:
            v = self._decode_fixed[n] = self.iteration_time_s(0, 0.0, n, 0.0, n)
        return v

    def decode_power_w(self, n: int) -> float:
        """Engine watts during a pure-decode iteration of ``n`` sequences."""
        v = self._decode_power.get(n)
        if v is None:
            v = self._decode_power[n] = self.tp * float(self.power.gpu_power_w(0, n))
        return v


def record_column(reqs: list[RequestState], j: int) -> list:  # noqa: C901  (one branch per column)
    """Column ``j`` of :data:`~carbon_gym.sim.records.RECORD_COLUMNS` for the completed requests
    ``reqs`` (ints or floats, one per request): what :class:`RequestRecords` reads when the column
    is first used. The derived columns are computed as the engine computed them at completion
    before records became lazy (the same floating-point operations, in the same order)."""
    if j == 0:
        return [r.rid for r in reqs]
    if j == 1:
        return [r.origin for r in reqs]
    if j == 2:
        return [r.dc for r in reqs]
    if j == 3:
        return [r.engine_index for r in reqs]
    if j == 4:
        return [r.arrival_s for r in reqs]
    if j == 5:
        return [r.sent_s for r in reqs]
    if j == 6:
        return [r.dc_arrival_s for r in reqs]
    if j == 7:
        return [r.first_sched_s for r in reqs]
    if j == 8:
        return [r.first_token_s + r.down_s for r in reqs]
    if j == 9:
        return [r.done_s + r.down_s for r in reqs]
    if j == 10:
        return [r.prompt_tokens for r in reqs]
    if j == 11:
        return [r.output_tokens for r in reqs]
    if j == 12:  # ttft_s
        return [r.first_token_s + r.down_s - r.arrival_s for r in reqs]
    if j == 13:  # tpot_s
        out: list[float] = []
        for r in reqs:
            ttft = r.first_token_s + r.down_s - r.arrival_s
            e2e = r.done_s + r.down_s - r.arrival_s
            n = r.output_tokens
            out.append((e2e - ttft) / (n - 1) if n > 1 else 0.0)
        return out
    if j == 14:  # e2e_s
        return [r.done_s + r.down_s - r.arrival_s for r in reqs]
    if j == 15:  # queue_wait_s
        return [r.first_sched_s - r.dc_arrival_s for r in reqs]
    if j == 16:  # prefill_s
        return [r.first_token_s - r.first_sched_s for r in reqs]
    if j == 17:  # network_s
        return [r.up_s + r.down_s for r in reqs]
    if j == 18:
        return [r.preemptions for r in reqs]
    if j == 19:
        return [r.energy_j for r in reqs]
    if j == 20:
        return [r.carbon_g for r in reqs]
    if j == 21:
        return [r.cached_tokens for r in reqs]
    raise IndexError(f"record column {j} (RECORD_COLUMNS has 22)")
