"""One vLLM-like inference engine: paged KV cache, FCFS waiting queue, continuous batching,
chunked prefill, preemption by recompute, and closed-form jumps over runs of decode iterations.

Scheduling (one *iteration* = one forward pass), mirroring vLLM V1 with chunked prefill:

1. Every decoding sequence decodes one token. A sequence holding ``c`` tokens in KV needs a new
   block when ``c % block_tokens == 0``; if the free blocks cannot cover all of them, the NEWEST
   running request (prefilling or decoding) is preempted - its blocks are freed, it goes to the
   FRONT of the waiting queue and will recompute ``prompt + generated`` tokens - until they fit
   (the request needing the block may preempt itself). An iteration that preempted admits no
   new request (vLLM V1 rule), unless it would otherwise be empty.
2. Partially prefilled requests continue: chunk = min(remaining prompt, budget left), where the
   budget is ``max_num_batched_tokens`` minus one token per decoding sequence.
3. New requests are admitted from the head of the waiting queue (FCFS, no skipping) while
   running sequences < ``max_num_seqs``, the head's blocks ``ceil(prefill / block_tokens)`` fit
   in the free blocks (all prompt blocks are allocated at admission) and budget is left; each
   takes a chunk of ``min(prompt, budget left)``.

With ``chunked_prefill=False`` an engine alternates: when the head of the queue fits (sequences,
blocks) and the previous iteration was not a prefill iteration (or nothing is decoding), it runs
a *prefill-only* iteration admitting whole prompts while their sum fits the token budget (at
least one, even if longer than the budget); otherwise a *decode-only* iteration.

The iteration that computes the last prompt token samples the first output token (or, after a
recompute, the next one); every decode iteration samples one more. A request with one output
token completes at the end of its prefill.

**Fast path.** When an iteration has no prefill work, no preemption, and the queue head cannot be
admitted (or the queue is empty), the batch stays fixed until the next completion, arrival or
KV-block shortage: iteration ``k`` (1-based) of the run lasts ``run_first_s + (k - 1) *
run_growth_s``, with ``run_growth_s = n * decode_ctx_coeff_s``. The engine jumps over
``run_iters`` iterations at once: the iterations to the earliest completion (``finish_heap``)
capped so that the blocks the run allocates - computed exactly from ``ctx_phase_counts``, the
decoders counted by ``(context - decode_iters) mod block_tokens`` - fit in the free blocks. An
arrival at an engine whose queue was empty truncates the run at the first iteration boundary at
or after the arrival. ``step_mode=True`` runs every iteration as its own event with explicit
per-sequence bookkeeping (the slow reference); both give the same results.

**Published state.** Dispatch scores and snapshots read ``view_free_blocks`` /
``view_used_blocks``, refreshed at the end of every iteration that admitted, prefilled,
preempted or completed something - moments that exist identically in both modes - so decisions
do not depend on how decode runs were cut.

**Prefix caching** (``EngineConfig.prefix_caching``; :mod:`carbon_gym.sim.prefix_cache`): a
request with prefix keys is admitted with its cached prefix already "prefilled" (``prefilled``
starts at the hit: those tokens take no chunk, no time and no energy, while the attention of the
computed ones still covers them) and those blocks shared; ``free_blocks`` counts cached-free
blocks as free and the cache evicts them, least recently used first, when allocations need them.

**Energy shares.** Each iteration's facility energy (engine power x duration x PUE) is split over
its batch in proportion to the tokens computed (a decode = 1 token); decoding sequences collect
theirs through engine-level cumulative per-sequence counters (``decode_share_j`` / ``_g``, O(1)
per sequence).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final, cast

from .config import EngineConfig
from .prefix_cache import PrefixCache
from .request import CopyableState, EngineModels, EventQueue, RequestState, mypyc_attr

if TYPE_CHECKING:  # pragma: no cover
    from .datacenter import Datacenter

J_PER_KWH: Final = 3.6e6

# engine states
# (Final: the compiled modules inline them)
IDLE: Final = 0
WAKE: Final = 1
ITER: Final = 2
RUN: Final = 3


@mypyc_attr(allow_interpreted_subclasses=True)
class Engine(CopyableState):
    """One tensor-parallel group serving the model (see the module docstring for the rules).

    Created by :class:`~carbon_gym.sim.datacenter.Datacenter`. The simulator drives it with
    :meth:`enqueue` when a request reaches it (:meth:`enqueue_and_plan` when the engine is idle
    and its wake-up would be the next event anyway), and :meth:`on_event` when the engine's
    event pops from the heap with the engine's current ``version`` (older entries are stale:
    a decode run was cut short or the engine was reset): the iteration or run in progress ends
    (or an idle engine wakes up), and the engine plans what it does next and pushes that event.
    """

    # Slots, not a __dict__: CPython's specialised attribute access works for slots whatever
    # their number (an instance dict with more than 30 keys falls back to slower lookups), and
    # the hot path is mostly attribute access. A new attribute needs its name here.
    __slots__ = (
        # set-up
        "dc", "index",          # the Datacenter it belongs to (ledger, counters, scores); index in dc.engines
        "block_tokens",         # tokens per KV block
        "max_seqs",             # max_num_seqs: most running (prefilling + decoding) sequences
        "token_budget",         # max_num_batched_tokens: tokens per iteration (decodes + prefill chunks)
        "chunked_prefill",      # mix prefill chunks with decodes (else prefill-only iterations)
        "step_mode",            # every iteration its own event, per-sequence bookkeeping (the reference)
        "models",               # EngineModels: latency and power
        "heap",                 # the simulator's EventQueue (events, and the sequence numbers of the finish heaps), shared
        "finished",             # completed RequestStates, in completion order, shared with the simulator
        "total_blocks",         # KV blocks of the engine
        "draining",             # fault: takes no new requests (the dispatcher skips it)
        "rest_w",               # watts with no work: idle power, or 0 once drained with power-off
        # capacity (carbon_gym.sim.capacity): AWAKE 0, DRAINING 1 (awake, told to sleep), FALLING,
        # ASLEEP, WAKING, OFF, BOOTING; only AWAKE and DRAINING engines run iterations
        "cap_state",            # capacity state
        "cap_version",          # bumped at every capacity state change: older transition events are stale
        "cap_end_s",            # when the transition in progress (FALLING, WAKING, BOOTING) ends, s
        "wake_after",           # FALLING: wake again as soon as asleep
        # requests
        "waiting",              # FCFS queue (a deque of RequestState)
        "running",              # rid -> RequestState, prefilling and decoding, oldest first
        "prefilling",           # the running requests still prefilling, oldest first
        "pending_tokens",       # sum of prefill_len over the queue, tokens
        "waiting_blocks",       # KV blocks the queued prompts need at admission
        "free_blocks",          # KV blocks not allocated
        # decoding sequences (fast path: aggregates; each sequence's state is an offset)
        "n_decoding",           # sequences decoding
        "ctx_offset_sum",       # sum of their ctx_offset, tokens
        "ctx_phase_counts",     # [p]: decoders with (ctx_offset - 1) % block_tokens == p
        "finish_heap",          # EventQueue of decoders: time decode_iters at the last token, key and tag seq,
                                # item the request; tag != its finish_seq: stale
        "decode_iters",         # iterations in which the decoding sequences advanced (kept by reset)
        "decode_share_j", "decode_share_g",  # energy (J) / carbon (g) attributed per decoding sequence so far
        # the iteration (ITER) or run of decode iterations (RUN) in progress
        "state",                # IDLE, WAKE, ITER or RUN
        "version",              # bumped at every event it pushes: older heap entries are stale
        "start_s", "end_s",     # when it started / ends (the time of its event), s
        "start_cum",            # dc.cum(start_s): the intensity integral then, (gCO2eq/kWh) x s
        "run_iters",            # RUN: decode iterations in the run
        "run_first_s",          # RUN: duration of its first iteration, s
        "run_growth_s",         # RUN: each iteration lasts this much longer than the previous one, s
        "power_w", "is_idle",   # engine watts now; drawing rest power (the ledger counts it idle)
        "iter_chunks",          # ITER: prefill chunks, (request, tokens)
        "iter_decodes",         # ITER: sequences decoding one token
        "iter_prefill_tokens",  # ITER: sum of the chunks, tokens
        "iter_publish",         # ITER: admitted, prefilled, preempted or completed: publish at its end
        "last_prefill_only",    # without chunked prefill: the last iteration was prefill-only
        # published state (what dispatch scores and snapshots read)
        "view_free_blocks", "view_used_blocks",  # free_blocks when last published; total_blocks - that
        # counters (kept by reset)
        "iterations",           # iterations run (all kinds)
        "preemptions", "completed",  # requests preempted / completed
        # automatic prefix caching (carbon_gym.sim.prefix_cache)
        "cache",                # PrefixCache, or None (prefix caching off)
        "prefix_tokens",        # tokens per prefix block
        "prefix_kv",            # KV blocks per prefix block
    )

    def __init__(self, dc: Datacenter, index: int, cfg: EngineConfig, total_blocks: int, models: EngineModels,
                 step_mode: bool, heap: EventQueue, finished: list[RequestState]) -> None:
        self.dc = dc
        self.index = index
        # (typed: the compiled engine does not see EngineConfig's types; validate() checked them)
        self.block_tokens: int = cfg.block_tokens
        self.max_seqs: int = cfg.max_num_seqs
        self.token_budget: int = cfg.max_num_batched_tokens
        self.chunked_prefill: bool = cfg.chunked_prefill
        self.step_mode = step_mode
        self.models = models
        self.heap = heap
        self.finished = finished
        self.total_blocks = total_blocks
        self.draining = False
        self.rest_w = models.idle_engine_w
        self.cap_state = 0
        self.cap_version = 0
        self.cap_end_s = 0.0
        self.wake_after = False
        self.prefix_tokens: int = cfg.prefix_block_tokens
        self.prefix_kv: int = cfg.prefix_block_tokens // cfg.block_tokens
        self.cache: PrefixCache | None = (
            PrefixCache(cfg.prefix_block_tokens, cfg.block_tokens, dc.prefix_index, index) if cfg.prefix_caching else None)
        self.reset()

    def reset(self) -> None:
        """Empty the engine (no requests, all blocks free, idle). Counters are kept if present."""
        self.waiting: deque[RequestState] = deque()
        self.running: dict[int, RequestState] = {}
        self.prefilling: list[RequestState] = []
        self.pending_tokens = self.waiting_blocks = 0
        self.free_blocks = self.total_blocks
        self.n_decoding = self.ctx_offset_sum = 0
        self.ctx_phase_counts = [0] * self.block_tokens
        self.finish_heap = EventQueue()
        self.decode_share_j = self.decode_share_g = 0.0
        self.state = IDLE
        self.version: int = getattr(self, "version", 0) + 1
        self.start_s = self.start_cum = self.end_s = 0.0
        self.run_iters = 0
        self.run_first_s = self.run_growth_s = 0.0
        self.power_w = self.models.idle_engine_w
        self.is_idle = True
        self.iter_chunks: list[tuple[RequestState, int]] = []
        self.iter_decodes = self.iter_prefill_tokens = 0
        self.iter_publish = self.last_prefill_only = False
        self.view_free_blocks = self.total_blocks
        self.view_used_blocks = 0
        if self.cache is not None:
            self.cache.clear()
        if not hasattr(self, "iterations"):
            self.iterations = self.decode_iters = self.preemptions = self.completed = 0

    def _blocks_for(self, tokens: int) -> int:
        """KV blocks holding ``tokens`` tokens."""
        bt = self.block_tokens
        return (tokens + bt - 1) // bt

    # ------------------------------------------------------------------ arrivals
    def _queue(self, req: RequestState) -> None:
        """Append ``req`` to the waiting queue (and count it in the queue totals and the score)."""
        self.waiting.append(req)
        L = req.prefill_len
        self.pending_tokens += L
        self.waiting_blocks += (L + self.block_tokens - 1) // self.block_tokens
        dc = self.dc
        dc.waiting += 1
        dc.scores[self.index] = dc.score(self)

    def enqueue(self, req: RequestState, t: float) -> None:
        """A request reaches this engine's waiting queue at time ``t``."""
        was_empty = not self.waiting
        self._queue(req)
        state = self.state
        if state == IDLE and self.cap_state <= 1:  # (a dormant engine plans when it is awake)
            self.state = WAKE
            self.version += 1
            self.heap.push(t, 1, self, self.version)
        elif state == RUN and was_empty:
            self._truncate(t)

    def enqueue_and_plan(self, req: RequestState, t: float) -> None:
        """A request reaches this IDLE engine at ``t`` and the engine plans at once: the same as
        :meth:`enqueue` followed by its wake-up event, for a caller that knows that wake-up
        event would be the next event processed (no other event at time ``t`` or earlier)."""
        self._queue(req)
        self.state = WAKE
        self.version += 1
        self._plan(t)

    # ------------------------------------------------------------------ decode runs
    def _run_end(self, k: int) -> float:
        """When iteration ``k`` (1-based; 0: the start) of the decode run in progress ends, s."""
        return self.start_s + (k * self.run_first_s + 0.5 * self.run_growth_s * k * (k - 1))

    def _run_root(self, x: float) -> float:
        """The positive root k of ``k * run_first_s + run_growth_s * k * (k - 1) / 2 = x`` (an
        estimate of the iterations ending ``x`` seconds into the run; cancellation-free form)."""
        T0, B = self.run_first_s, self.run_growth_s
        b = T0 - 0.5 * B
        if B > 0.0:
            disc = b * b + 2.0 * B * x
            return 2.0 * x / (b + disc ** 0.5) if b > 0.0 else (-b + disc ** 0.5) / B
        return x / T0

    def _truncate(self, a: float) -> None:
        """Cut the current decode run at the first iteration boundary at or after ``a``."""
        K = self.run_iters
        x = a - self.start_s
        if x <= 0.0:
            k = 1
        else:  # the smallest k with run_end(k) >= a
            root = self._run_root(x)
            k = int(root) if root < K else K
            if k < 1:
                k = 1
            while k > 1 and self._run_end(k - 1) >= a:
                k -= 1
            while k < K and self._run_end(k) < a:
                k += 1
        if k < K:
            self.run_iters = k
            self.end_s = self._run_end(k)
            self.version += 1
            self.heap.push(self.end_s, 1, self, self.version)

    def run_iterations_done(self, t: float) -> int:
        """Iterations of the decode run in progress that have ended by ``t`` (0 if none): the
        largest k in [0, run_iters] with run_end(k) <= t (run_end is increasing in k)."""
        if self.state != RUN:
            return 0
        K = self.run_iters
        if t >= self.end_s:  # end_s == run_end(K)
            return K
        if t < self.start_s + (self.run_first_s + 0.0):  # run_end(1)
            return 0
        # here run_end(1) <= t < run_end(K): estimate from the positive root, then correct exactly
        root = self._run_root(t - self.start_s)
        k = int(root) if root < K else K - 1
        if k < 1:
            k = 1
        run_end = self._run_end
        while k < K - 1 and run_end(k + 1) <= t:
            k += 1
        while k > 1 and run_end(k) > t:
            k -= 1
        return k

    def _allocs(self, K: int) -> int:
        """Blocks the decoding sequences allocate over the next ``K`` decode iterations."""
        bt = self.block_tokens
        q = K // bt
        r = K % bt
        total = self.n_decoding * q
        if r:
            # iterations decode_iters+1..decode_iters+r need counts[s], counts[s-1], ...,
            # counts[s-r+1] (cyclically)
            counts = self.ctx_phase_counts
            s = (-(self.decode_iters + 1)) % bt
            for i in range(r):
                total += counts[(s - i) % bt]
        return total

    # ------------------------------------------------------------------ events
    def on_event(self, t: float) -> None:
        """The engine's event at ``t``: the iteration or decode run in progress ends (its
        requests are accounted for), or an idle engine wakes up; then plan the next one."""
        state = self.state
        if state == RUN:
            self._finish_run(t)
        elif state == ITER:
            self._finish_iter(t)
        self._plan(t)

    def _publish(self) -> None:
        """Publish the KV occupancy (``view_*``) and refresh the dispatch score."""
        if self.cache is not None:
            self.cache.settle(self.free_blocks)
        self.view_free_blocks = self.free_blocks
        self.view_used_blocks = self.total_blocks - self.free_blocks
        dc = self.dc
        dc.scores[self.index] = dc.score(self)

    def _complete_finished(self, t: float) -> bool:
        """Complete the decoders whose last token came at ``decode_iters`` (at ``t``); whether any did."""
        fh = self.finish_heap
        evs = fh.heap
        it = float(self.decode_iters)  # (exact: the heap's times are integers below 2**53)
        done = False
        while evs and evs[0].t <= it:
            ev = fh.pop()
            req = cast(RequestState, ev.item)
            seq = ev.tag
            fh.recycle(ev)
            if req.finish_seq != seq:
                continue
            self._complete(req, t)
            done = True
        return done

    def _finish_run(self, t: float) -> None:
        """The decode run ends at ``t`` (possibly cut short): account for its iterations."""
        n = self.n_decoding
        K = self.run_iters
        dc = self.dc
        c1 = dc._cum_memo if t == dc._cum_memo_t_s else dc.cum(t)
        pf = self.power_w * dc.pue
        self.decode_share_j += pf * (t - self.start_s) / n
        self.decode_share_g += pf * (c1 - self.start_cum) / (J_PER_KWH * n)
        self.free_blocks -= self._allocs(K)
        self.decode_iters += K
        self.iterations += K
        dc.iterations += K
        if self._complete_finished(t):
            self._publish()

    def _finish_iter(self, t: float) -> None:  # noqa: C901
        """The iteration ends at ``t``: account for its decodes and chunks; publish if it changed
        the batch."""
        dc = self.dc
        c1 = dc._cum_memo if t == dc._cum_memo_t_s else dc.cum(t)
        pf = self.power_w * dc.pue
        e = pf * (t - self.start_s)
        c = pf * (c1 - self.start_cum) / J_PER_KWH
        nd = self.iter_decodes
        tot = nd + self.iter_prefill_tokens
        self.iterations += 1
        dc.iterations += 1
        step = self.step_mode
        if nd:
            self.decode_iters += 1
            if step:  # explicit per-sequence bookkeeping
                ei, ci = e / tot, c / tot
                for r in self.running.values():
                    if r.decoding:
                        r.energy_j += ei
                        r.carbon_g += ci
                        r.ctx_tokens += 1
                        r.generated += 1
            else:
                self.decode_share_j += e / tot
                self.decode_share_g += c / tot
        cache = self.cache
        for req, ch in self.iter_chunks:
            f = ch / tot
            req.energy_j += e * f
            req.carbon_g += c * f
            req.prefilled += ch
            if cache is not None:
                keys = req.prefix_keys
                if keys is not None:  # its full prefix blocks computed so far become cache entries
                    n_full = req.prefilled // self.prefix_tokens
                    if n_full > len(keys):
                        n_full = len(keys)
                    if n_full > req.held:
                        self.free_blocks += cache.insert(req, n_full, self.free_blocks)
            if req.prefilled == req.prefill_len:
                self._prompt_done(req, t)
        self.iter_chunks = []
        if step:
            if nd:
                done = [r for r in self.running.values() if r.decoding and r.generated >= r.output_tokens]
                for r in done:
                    self._complete(r, t)
                    self.iter_publish = True
        elif self.finish_heap.heap and self._complete_finished(t):
            self.iter_publish = True
        if self.iter_publish:
            self._publish()

    def _prompt_done(self, req: RequestState, t: float) -> None:
        """``req`` computed its last prompt token in the iteration ending at ``t``."""
        self.prefilling.remove(req)
        req.generated += 1
        if req.first_token_s < 0.0:
            req.first_token_s = t
        if req.generated >= req.output_tokens:
            self._complete(req, t)
            self.iter_publish = True
            return
        req.decoding = True
        ctx = req.prefill_len
        if self.step_mode:
            req.ctx_tokens = ctx
            return
        it = self.decode_iters
        req.ctx_offset = ctx - it
        req.gen_offset = req.generated - it
        self.n_decoding += 1
        self.ctx_offset_sum += req.ctx_offset
        self.ctx_phase_counts[(req.ctx_offset - 1) % self.block_tokens] += 1
        req.share_mark_j = self.decode_share_j
        req.share_mark_g = self.decode_share_g
        seq = self.heap.next_seq()
        req.finish_seq = seq
        self.finish_heap.push_key(float(req.output_tokens - req.gen_offset), seq, req, seq)

    def _drop_decoder(self, req: RequestState) -> int:
        """Remove a decoding ``req`` from the decode aggregates; return the blocks it holds."""
        if self.step_mode:
            ctx = req.ctx_tokens
        else:
            it = self.decode_iters
            ctx = req.ctx_offset + it
            self.n_decoding -= 1
            self.ctx_offset_sum -= req.ctx_offset
            self.ctx_phase_counts[(req.ctx_offset - 1) % self.block_tokens] -= 1
            req.energy_j += self.decode_share_j - req.share_mark_j
            req.carbon_g += self.decode_share_g - req.share_mark_g
            req.finish_seq = -1
            req.generated = req.gen_offset + it
        req.decoding = False
        return self._blocks_for(ctx)

    def _complete(self, req: RequestState, t: float) -> None:
        """``req`` produced its last token at engine time ``t``: free it and record it."""
        self._free_request(req)
        del self.running[req.rid]
        req.alive = False
        dc = self.dc
        dc.running -= 1
        dc.completed += 1
        self.completed += 1
        req.engine_index = self.index
        req.done_s = t
        self.finished.append(req)  # (its record row is computed when read: request.record_column)

    def _free_request(self, req: RequestState) -> None:
        """Free the KV blocks of ``req`` (completed or preempted); with prefix caching its
        cache entries are released (those no request holds stay cached, as cached-free)."""
        cache = self.cache
        if cache is None:
            if req.decoding:
                self.free_blocks += self._drop_decoder(req)
            else:
                self.free_blocks += req.kv_blocks
            return
        if req.decoding:  # its context blocks, the held entries' included
            b = self._drop_decoder(req) - req.held * self.prefix_kv
        else:
            b = req.kv_blocks  # its private blocks
        b += cache.release(req, self.free_blocks)
        self.free_blocks += b

    # ------------------------------------------------------------------ preemption
    def _preempt_newest(self) -> RequestState:
        """Preempt the newest running request (recompute later); return it."""
        victim = next(reversed(self.running.values()))
        if not victim.decoding:
            self.prefilling.remove(victim)
        self._free_request(victim)
        del self.running[victim.rid]
        victim.prefill_len = victim.prompt_tokens + victim.generated
        victim.prefilled = 0
        victim.kv_blocks = 0
        victim.preemptions += 1
        self.preemptions += 1
        self.dc.preemptions += 1
        self.waiting.appendleft(victim)
        self.pending_tokens += victim.prefill_len
        self.waiting_blocks += self._blocks_for(victim.prefill_len)
        dc = self.dc
        dc.running -= 1
        dc.waiting += 1
        return victim

    def _decoding_count(self) -> int:
        """Sequences decoding."""
        if self.step_mode:
            return sum(1 for r in self.running.values() if r.decoding)
        return self.n_decoding

    def _decode_need(self) -> int:
        """Blocks the decoding sequences need for the next decode iteration."""
        bt = self.block_tokens
        if self.step_mode:
            return sum(1 for r in self.running.values() if r.decoding and r.ctx_tokens % bt == 0)
        return self.ctx_phase_counts[(-(self.decode_iters + 1)) % bt]

    def _preempt_for_decode(self) -> int:
        """Preempt newest requests until the next decode's blocks fit; return blocks needed."""
        bt = self.block_tokens
        if self.step_mode:
            # explicit vLLM order: walk decoders oldest first, allocate, preempt from the back
            need = 0
            for r in list(self.running.values()):
                if r.rid not in self.running or not r.decoding or r.ctx_tokens % bt:
                    continue
                while self.free_blocks - need < 1:
                    v = self._preempt_newest()
                    if v is r:
                        break
                if r.rid in self.running:
                    need += 1
                else:
                    break
            return need
        need = self._decode_need()
        j = self.decode_iters + 1
        while need > self.free_blocks:
            v = next(reversed(self.running.values()))
            if v.decoding and (v.ctx_offset + j - 1) % bt == 0:
                need -= 1
            self._preempt_newest()
        return need

    # ------------------------------------------------------------------ admission
    def _head_admission(self, free_blocks: int, budget_tokens: int) -> int:
        """The admission rule: the KV blocks the head of the waiting queue takes if it can be
        admitted now, with ``free_blocks`` blocks and ``budget_tokens`` tokens of the iteration's
        budget left; 0 if it cannot (or the queue is empty).

        FCFS, no skipping: the head gets in when a sequence slot is free (running < max_num_seqs),
        all its prompt blocks ``ceil(prefill_len / block_tokens)`` fit in ``free_blocks``, and
        its first chunk fits the budget: with chunked prefill any budget left (the chunk is
        ``min(prefill_len, budget_tokens)``); without, the whole prompt, unless nothing is
        scheduled in the iteration yet (``budget_tokens == max_num_batched_tokens``: a prompt
        longer than the budget still goes, alone).
        """
        waiting = self.waiting
        if not waiting or len(self.running) >= self.max_seqs:
            return 0
        cache = self.cache
        if cache is not None and waiting[0].prefix_keys is not None:  # its cached prefix takes no new blocks
            if self.chunked_prefill:
                return cache.admission_blocks(waiting[0], free_blocks, -1) if budget_tokens > 0 else 0
            return cache.admission_blocks(waiting[0], free_blocks,
                                          -1 if budget_tokens == self.token_budget else budget_tokens)
        L = waiting[0].prefill_len
        if self.chunked_prefill:
            if budget_tokens <= 0:
                return 0
        elif L > budget_tokens and budget_tokens != self.token_budget:
            return 0
        bt = self.block_tokens
        blocks = (L + bt - 1) // bt
        return blocks if blocks <= free_blocks else 0

    def _admit(self, t: float, budget_tokens: int, free_blocks: int, chunks: list[tuple[RequestState, int]]) -> None:
        """Admit requests from the head of the queue at ``t`` while :meth:`_head_admission`
        lets them in (``budget_tokens`` and ``free_blocks`` shrink with each), appending each
        one's first chunk ``(request, tokens)`` to ``chunks``: ``min(prefill_len, budget left)``
        with chunked prefill, else the whole prompt."""
        waiting = self.waiting
        whole = not self.chunked_prefill
        dc = self.dc
        while True:
            b = self._head_admission(free_blocks, budget_tokens)
            if not b:
                return
            head = waiting.popleft()
            self.running[head.rid] = head
            self.prefilling.append(head)
            L = head.prefill_len
            cache = self.cache
            cached = 0
            if cache is not None and head.prefix_keys is not None:
                # its cached prefix is shared, not allocated, and not computed
                h = cache.acquire(head, free_blocks)
                cached = h * self.prefix_tokens
                head.prefilled = cached
                full = (L + self.block_tokens - 1) // self.block_tokens
                head.kv_blocks = full - h * self.prefix_kv
                self.waiting_blocks -= full
            else:
                head.kv_blocks = b
                self.waiting_blocks -= b
            self.free_blocks -= b
            self.pending_tokens -= L
            if head.first_sched_s < 0.0:
                head.first_sched_s = t
                head.cached_tokens = cached
                dc.prompt_tokens += head.prompt_tokens
                dc.cached_prompt_tokens += cached
            dc.prefill_saved_tokens += cached
            dc.waiting -= 1
            dc.running += 1
            free_blocks -= b
            rest = L - cached
            ch = rest if (whole or rest < budget_tokens) else budget_tokens
            chunks.append((head, ch))
            budget_tokens -= ch

    # ------------------------------------------------------------------ planning
    def _plan(self, t: float) -> None:
        """Schedule the next iteration (or run of decode iterations) starting at ``t``."""
        if not self.running:
            if not self.waiting:
                # nothing to run: go idle (what _plan_general concludes, without its set-up)
                self.last_prefill_only = False
                self._go_idle(t)
                return
            if self.chunked_prefill and not self.step_mode:
                self._plan_chunks(t, 0, 0)
                return
        n = self.n_decoding
        if n and not self.step_mode and self.chunked_prefill and not self.prefilling:
            # common case first: a pure decode run (no partial prefill, the head cannot be admitted)
            need = self.ctx_phase_counts[(-(self.decode_iters + 1)) % self.block_tokens]
            if need <= self.free_blocks:
                if self._head_admission(self.free_blocks - need, self.token_budget - n):
                    self._plan_chunks(t, n, need)  # the head joins the running decodes
                else:
                    self._plan_run(t, n)
                return
        self._plan_general(t)

    def _plan_chunks(self, t: float, n: int, need: int) -> None:
        """:meth:`_plan_general` without its set-up, for the fast path with chunked prefill when
        nothing is partially prefilled and ``n`` decoders (maybe 0) need ``need <= free_blocks``
        new blocks: admit, and plan one iteration with the first chunks, else a decode run or idle."""
        chunks: list[tuple[RequestState, int]] = []
        self._admit(t, self.token_budget - n, self.free_blocks - need, chunks)
        self.last_prefill_only = False
        if not chunks:
            if n:
                self._plan_run(t, n)
            else:
                self._go_idle(t)
            return
        dc = self.dc
        dc.scores[self.index] = dc.score(self)
        self._start_iteration(t, chunks, n, need, True)

    def _plan_general(self, t: float) -> None:
        """Schedule the next iteration in the general case (or a run, via :meth:`_plan_run`)."""
        n = self._decoding_count()
        chunks: list[tuple[RequestState, int]] = []
        preempted = False
        prefill_only = False
        dec = n > 0
        need = 0
        if (not self.chunked_prefill and (n == 0 or not self.last_prefill_only)
                and self._head_admission(self.free_blocks, self.token_budget)):
            prefill_only = True
            dec = False
        if dec:
            need = self._decode_need()
            if need > self.free_blocks:
                need = self._preempt_for_decode()
                preempted = True
                n = self._decoding_count()
                dec = n > 0
        budget = self.token_budget - (n if dec else 0)
        free_after = self.free_blocks - need
        if prefill_only or (not self.chunked_prefill and not dec and self.waiting):
            # prefill-only iteration: whole prompts while they fit the budget (at least one)
            prefill_only = True
            self._admit(t, budget, free_after, chunks)
        elif self.chunked_prefill:
            for req in self.prefilling:
                if budget <= 0:
                    break
                ch = req.prefill_len - req.prefilled
                if ch > budget:
                    ch = budget
                chunks.append((req, ch))
                budget -= ch
            if not preempted or (not dec and not chunks):
                self._admit(t, budget, free_after, chunks)
        self.last_prefill_only = prefill_only
        dc = self.dc
        if chunks or preempted:
            dc.scores[self.index] = dc.score(self)
        if not dec and not chunks:
            self._go_idle(t)
            return
        if (not self.step_mode and dec and not chunks and not preempted
                and (self.chunked_prefill or not self._head_admission(free_after, self.token_budget))):
            # closed-form run of pure decode iterations
            self._plan_run(t, n)
            return
        self._start_iteration(t, chunks, n if dec else 0, need, bool(chunks) or preempted)

    def _start_iteration(self, t: float, chunks: list[tuple[RequestState, int]], nd: int, need: int,
                         publish: bool) -> None:
        """Start one iteration at ``t``: ``nd`` sequences decode a token (taking ``need`` new
        blocks) and ``chunks`` ``(request, tokens)`` prefill; ``publish`` at its end."""
        self.free_blocks -= need
        pt = 0
        pairs = 0.0
        sampled = nd
        for req, ch in chunks:
            pt += ch
            pairs += ch * (req.prefilled + 0.5 * (ch + 1))
            if req.prefilled + ch == req.prefill_len:
                sampled += 1
        if not nd:
            ctx_sum = 0
        elif self.step_mode:
            ctx_sum = sum(r.ctx_tokens + 1 for r in self.running.values() if r.decoding)
        else:
            ctx_sum = self.ctx_offset_sum + nd * (self.decode_iters + 1)
        models = self.models
        T = models.iteration_time_s(pt, pairs, nd, float(ctx_sum), sampled)
        p = models.prefill_engine_w(pt, nd) if pt else models.decode_power_w(nd)
        self.iter_chunks = chunks
        self.iter_decodes = nd
        self.iter_prefill_tokens = pt
        self.iter_publish = publish
        self._begin(t, t + T, ITER, p)

    def _plan_run(self, t: float, n: int) -> None:
        """Plan a closed-form run of pure decode iterations of the ``n`` decoding sequences."""
        fh = self.finish_heap
        evs = fh.heap
        while cast(RequestState, evs[0].item).finish_seq != evs[0].tag:
            fh.recycle(fh.pop())
        it = self.decode_iters
        K = int(evs[0].t) - it  # iterations to the earliest completion
        bt = self.block_tokens
        free = self.free_blocks
        full = free // n
        if bt * full < K:
            # cap K where the blocks the run allocates would exceed the free ones: every
            # sequence takes one block each block_tokens iterations, the rest follow the counts
            rem = free - n * full
            counts = self.ctx_phase_counts
            j = it + bt * full
            i = 0
            while True:
                a = counts[(-(j + i + 1)) % bt]
                if a > rem:
                    break
                rem -= a
                i += 1
            kkv = bt * full + i
            if kkv < K:
                K = kkv
        models = self.models
        coeff = models.decode_ctx_coeff_s
        T0 = models.decode_fixed_s(n) + coeff * (self.ctx_offset_sum + n * (it + 1))
        B = n * coeff
        self.run_iters = K
        self.run_first_s = T0
        self.run_growth_s = B
        self.last_prefill_only = False
        self.iter_publish = False
        self._begin(t, t + (K * T0 + 0.5 * B * K * (K - 1)), RUN, models.decode_power_w(n))

    def _begin(self, t: float, end_s: float, state: int, watts: float) -> None:
        """Start an iteration or run (``state``) at ``t`` drawing ``watts``; push its end event."""
        self.start_s = t
        self.end_s = end_s
        self.state = state
        self._set_power(t, watts, False)
        dc = self.dc
        self.start_cum = dc._cum_memo if t == dc._cum_memo_t_s else dc.cum(t)
        self.version = v = self.version + 1
        self.heap.push(end_s, 1, self, v)

    def _go_idle(self, t: float) -> None:
        """Nothing to run at ``t``: idle (rest power) until a request arrives; an engine told to
        sleep (DRAINING) falls asleep."""
        self.state = IDLE
        self._set_power(t, self.rest_w, True)
        self.iter_publish = False
        if self.cap_state == 1:
            cap = self.dc.capacity
            assert cap is not None  # (only capacity control drains engines to sleep)
            cap.engine_drained(self, t)
        elif self.draining and self.rest_w == 0.0 and self.cache is not None:
            self.cache.clear()  # drained for maintenance and powered off: its KV cache is lost

    def _set_power(self, t: float, watts: float, idle: bool) -> None:
        """The engine draws ``watts`` from ``t`` on (``idle``: rest power); tell the ledger."""
        if watts != self.power_w or idle != self.is_idle:
            self.dc.engine_power_changed(t, self.power_w, watts, self.is_idle, idle)
            self.power_w = watts
            self.is_idle = idle

    # ------------------------------------------------------------------ faults
    def abort_all(self, t: float | None = None) -> list[RequestState]:
        """Drop every request on this engine (datacenter outage); return them.

        With ``t``, the energy and carbon of the iteration (or decode run) in progress, drawn
        since it started and attributed to no request, are added to the datacenter's
        ``aborted_active_j`` / ``aborted_active_carbon_g``.
        """
        if t is not None and self.state in (ITER, RUN):
            e, c = self.in_progress_share(t)
            self.dc.aborted_active_j += e
            self.dc.aborted_active_carbon_g += c
        reqs = list(self.running.values()) + list(self.waiting)
        for r in reqs:
            if r.decoding and not self.step_mode:
                r.energy_j += self.decode_share_j - r.share_mark_j
                r.carbon_g += self.decode_share_g - r.share_mark_g
            r.alive = False
        self.reset()
        return reqs

    def in_progress_share(self, t: float) -> tuple[float, float]:
        """Facility energy (J) and carbon (g) of the iteration or decode run in progress from its
        start to ``t`` (not yet attributed to requests; (0, 0) when none is in progress)."""
        if self.state not in (ITER, RUN) or t <= self.start_s:
            return 0.0, 0.0
        dc = self.dc
        pf = self.power_w * dc.pue
        return pf * (t - self.start_s), pf * (dc.cum(t) - self.start_cum) / J_PER_KWH

    def request_shares(self) -> tuple[float, float, int]:
        """(energy J, carbon g, count) already attributed to the requests on this engine
        (running and waiting; completed iterations only)."""
        e = c = 0.0
        n = 0
        for r in list(self.running.values()) + list(self.waiting):
            e += r.energy_j
            c += r.carbon_g
            if r.decoding and not self.step_mode:
                e += self.decode_share_j - r.share_mark_j
                c += self.decode_share_g - r.share_mark_g
            n += 1
        return e, c, n

    def work_left(self) -> list[tuple[RequestState, int, int]]:
        """(request, prompt positions, decode positions) each request on this engine (running or
        waiting) has not computed yet, an upper count: the iteration or decode run in progress
        counted as not done, a preempted request's prompt as computed (it was, once: it had
        sampled tokens), a prompt served from the prefix cache as not computed. Decode positions
        are the ``output - 1`` iterations after the first token; ``generated`` of them leave
        ``output - generated`` (``output - 1`` before the first token)."""
        out: list[tuple[RequestState, int, int]] = []
        it = self.decode_iters
        for r in list(self.running.values()) + list(self.waiting):
            if r.decoding:
                gen = r.generated if self.step_mode else r.gen_offset + it
                out.append((r, 0, r.output_tokens - gen))
            elif r.generated > 0:  # preempted after its prefill: recomputing
                out.append((r, 0, r.output_tokens - r.generated))
            else:
                left = r.prompt_tokens - r.prefilled + r.cached_tokens
                out.append((r, min(r.prompt_tokens, max(0, left)), max(0, r.output_tokens - 1)))
        return out

    def take_waiting(self) -> list[RequestState]:
        """Remove and return the requests waiting in this engine's queue (engine drain: they are
        re-dispatched to the other engines of the datacenter)."""
        reqs = list(self.waiting)
        if not reqs:
            return reqs
        self.waiting.clear()
        self.pending_tokens = 0
        self.waiting_blocks = 0
        dc = self.dc
        dc.waiting -= len(reqs)
        dc.scores[self.index] = dc.score(self)
        return reqs


# ---------------------------------------------------------------------- built-in dispatch scores
# (carbon_gym.sim.dispatch registers them; defined here to be compiled with the engine, whose
# queue and published state they read at every queue change)
def least_work_score(engine: Engine) -> float:
    """Queued prompt tokens + tokens resident in the engine's KV cache (lower is better)."""
    return float(engine.pending_tokens + engine.view_used_blocks * engine.block_tokens)


def most_free_kv_score(engine: Engine) -> float:
    """Minus (published free KV blocks - blocks needed by the waiting prompts)."""
    return float(-(engine.view_free_blocks - engine.waiting_blocks))
