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
KV-block shortage: iteration ``k`` of the run takes ``T0 + k * n * decode_ctx_coeff_s``. The
engine jumps over ``K`` iterations at once, with ``K`` = iterations to the earliest completion
(heap of finish iterations) capped so that the blocks the run allocates - computed exactly from a
histogram of ``(context - iteration) mod block_tokens`` - fit in the free blocks. An arrival at
an engine whose queue was empty truncates the run at the first iteration boundary at or after
the arrival. ``step_mode=True`` runs every iteration as its own event with explicit per-sequence
bookkeeping (the slow reference); both give the same results.

**Published state.** Dispatch scores and snapshots read ``view_free_blocks`` /
``view_used_blocks``, refreshed at the end of every iteration that admitted, prefilled,
preempted or completed something - moments that exist identically in both modes - so decisions
do not depend on how decode runs were cut.

**Energy shares.** Each iteration's facility energy (engine power x duration x PUE) is split over
its batch in proportion to the tokens computed (a decode = 1 token); decoding sequences collect
theirs through engine-level cumulative per-sequence counters (O(1) per sequence).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from .config import EngineConfig
from .kernels import iteration_time_fn, prefill_power_fn

try:  # compile-time class options for mypyc (setup.py); a no-op when the module runs as Python
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - pure-Python install without mypy_extensions

    def mypyc_attr(*args: Any, **kwargs: Any) -> Any:  # type: ignore  # (a second definition, by design)
        """No-op stand-in for ``mypy_extensions.mypyc_attr``."""
        return lambda cls: cls

if TYPE_CHECKING:  # pragma: no cover
    from .datacenter import Datacenter

J_PER_KWH = 3.6e6

# engine states
IDLE, WAKE, ITER, RUN = 0, 1, 2, 3


def _blank(cls: Any) -> Any:
    """An instance of ``cls`` whose ``__init__`` has not run (copy / pickle support)."""
    return cls.__new__(cls)


def _slot_state(obj: Any) -> dict[str, Any]:
    """The attributes set on ``obj``, an instance of a class of the simulator, compiled (mypyc
    lists them in ``__mypyc_attrs__``) or not (the ``__slots__`` along its classes, and its
    ``__dict__`` if it has one), for copy / pickle."""
    cls = type(obj)
    names = getattr(cls, "__mypyc_attrs__", None)
    if names is None:
        names = [n for k in cls.__mro__ for n in k.__dict__.get("__slots__", ())]
    state: dict[str, Any] = {}
    for name in names:
        try:
            state[name] = getattr(obj, name)
        except AttributeError:  # never set
            pass
    if hasattr(obj, "__dict__"):
        state.update(vars(obj))
    return state


@mypyc_attr(allow_interpreted_subclasses=True)
class CopyableState:
    """Base of the simulator's stateful classes: ``copy`` / ``pickle`` through their attributes,
    which also works when the modules are compiled (mypyc instances have no ``__dict__``)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        """Copy / pickle support that also works when this module is compiled (no ``__dict__``)."""
        return (_blank, (type(self),), _slot_state(self))

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


@mypyc_attr(allow_interpreted_subclasses=True)
class RequestState(CopyableState):
    """Mutable state of one in-flight request (internal; results come out as RequestRecords)."""

    __slots__ = (
        "rid", "origin", "dc", "eng", "arrival_s", "sent_s", "dc_arrival_s", "up_s", "down_s",
        "prompt", "output", "prefill_len", "prefilled", "blocks", "gen", "decoding",
        "base", "gbase", "fin", "fseq", "ctx", "e_mark", "c_mark",
        "first_sched_s", "first_token_s", "preemptions", "energy_j", "carbon_g", "alive",
    )

    def __init__(self, rid: int, origin: int, dc: int, arrival_s: float, sent_s: float,
                 up_s: float, down_s: float, prompt: int, output: int) -> None:
        self.rid = rid
        self.origin = origin
        self.dc = dc
        self.eng = -1
        self.arrival_s = arrival_s
        self.sent_s = sent_s
        self.up_s = up_s
        self.down_s = down_s
        self.dc_arrival_s = sent_s + up_s
        self.prompt = prompt
        self.output = output
        self.prefill_len = prompt
        self.prefilled = 0
        self.blocks = 0
        self.gen = 0
        self.decoding = False
        self.base = 0
        self.gbase = 0
        self.fin = -1
        self.fseq = -1
        self.ctx = 0
        self.e_mark = 0.0
        self.c_mark = 0.0
        self.first_sched_s = -1.0
        self.first_token_s = -1.0
        self.preemptions = 0
        self.energy_j = 0.0
        self.carbon_g = 0.0
        self.alive = True


@mypyc_attr(allow_interpreted_subclasses=True)
class EngineModels(CopyableState):
    """Latency and power models shared by the engines of a simulation, with small caches.

    ``decode_fixed_s(n)`` is the part of a pure-decode iteration's time that does not depend on
    the context sum (the latency contract guarantees the time is affine in it), and
    ``decode_power_w(n)`` the engine's (all TP GPUs) power while decoding ``n`` sequences.
    """

    __slots__ = ("latency", "power", "tp", "coeff", "idle_engine_w", "_fixed", "_pow", "iteration_time_s",
                 "prefill_engine_w")

    def __init__(self, latency: Any, power: Any, tp: int) -> None:
        self.latency = latency
        self.power = power
        self.tp = tp
        self.coeff = float(latency.decode_ctx_coeff_s())
        #: ``iteration_time_s(prefill_tokens, pairs, n_decode, ctx_sum, n_sampled) -> float``: the
        #: latency model's (a pure-Python copy for the table model, same floats; see kernels.iteration_time_fn)
        self.iteration_time_s = iteration_time_fn(latency)
        #: ``prefill_engine_w(prefill_tokens > 0, n_decode) -> float``: engine watts of that iteration
        self.prefill_engine_w = prefill_power_fn(power, tp)
        self.idle_engine_w = tp * float(power.idle_w)
        self._fixed: dict[int, float] = {}
        self._pow: dict[int, float] = {}

    def decode_fixed_s(self, n: int) -> float:
        """Seconds of a pure-decode iteration of ``n`` sequences with zero context."""
        v = self._fixed.get(n)
        if v is None:
            v = self._fixed[n] = self.iteration_time_s(0, 0.0, n, 0.0, n)
        return v

    def decode_power_w(self, n: int) -> float:
        """Engine watts during a pure-decode iteration of ``n`` sequences."""
        v = self._pow.get(n)
        if v is None:
            v = self._pow[n] = self.tp * float(self.power.gpu_power_w(0, n))
        return v


@mypyc_attr(allow_interpreted_subclasses=True)
class Engine(CopyableState):
    """One tensor-parallel group serving the model (see the module docstring for the rules).

    Created by :class:`~carbon_gym.sim.datacenter.Datacenter`; driven by the simulator through
    :meth:`enqueue` (a request reaches the engine) and :meth:`on_event` (an iteration or a run
    of iterations ends, or an idle engine wakes up).
    """

    # Slots, not a __dict__: CPython's specialised attribute access works for slots whatever
    # their number (an instance dict with more than 30 keys falls back to slower lookups), and
    # the hot path is mostly attribute access. A new attribute needs its name here.
    __slots__ = (
        "dc", "index", "block_tokens", "max_seqs", "budget", "chunked", "step", "models", "heap", "counter",
        "rows", "total_blocks", "draining", "rest_w", "waiting", "running", "prefilling", "n_dec", "base_sum",
        "hist", "fin_heap", "free", "pending_tokens", "waiting_blocks", "cum_e", "cum_c", "state", "version",
        "t0", "c0", "t_end", "K", "T0", "B", "power_w", "is_idle", "chunks", "n_iter_dec", "prefill_tokens",
        "sig", "last_prefill_only", "view_free_blocks", "view_used_blocks", "it", "dit", "preemptions",
        "completed",
    )

    def __init__(
        self,
        dc: "Datacenter",
        index: int,
        cfg: EngineConfig,
        total_blocks: int,
        models: EngineModels,
        step_mode: bool,
        heap: list,
        counter: Callable[[], int],
        rows: list,
    ) -> None:
        self.dc = dc
        self.index = index
        self.block_tokens = cfg.block_tokens
        self.max_seqs = cfg.max_num_seqs
        self.budget = cfg.max_num_batched_tokens
        self.chunked = cfg.chunked_prefill
        self.step = step_mode
        self.models = models
        self.heap = heap
        self.counter = counter
        self.rows = rows
        self.total_blocks = total_blocks
        # faults (engine drain): a draining engine receives no new requests from the dispatcher;
        # ``rest_w`` is what it draws when it has no work (0 W once drained with power-off)
        self.draining = False
        self.rest_w = models.idle_engine_w
        self.reset()

    def reset(self) -> None:
        """Empty the engine (no requests, all blocks free, idle). Counters are kept if present."""
        self.waiting: deque[RequestState] = deque()
        self.running: dict[int, RequestState] = {}
        self.prefilling: list[RequestState] = []
        self.n_dec = 0
        self.base_sum = 0
        self.hist = [0] * self.block_tokens
        self.fin_heap: list[tuple[int, int, RequestState]] = []
        self.free = self.total_blocks
        self.pending_tokens = 0
        self.waiting_blocks = 0
        self.cum_e = 0.0
        self.cum_c = 0.0
        self.state = IDLE
        self.version = getattr(self, "version", 0) + 1
        self.t0 = 0.0
        self.c0 = 0.0
        self.t_end = 0.0
        self.K = 0
        self.T0 = 0.0
        self.B = 0.0
        self.power_w = self.models.idle_engine_w
        self.is_idle = True
        self.chunks: list[tuple[RequestState, int]] = []
        self.n_iter_dec = 0
        self.prefill_tokens = 0
        self.sig = False
        self.last_prefill_only = False
        self.view_free_blocks = self.total_blocks
        self.view_used_blocks = 0
        if not hasattr(self, "it"):
            self.it = 0  # iterations run (all kinds)
            self.dit = 0  # iterations in which the decoding sequences advanced
            self.preemptions = 0
            self.completed = 0

    # ------------------------------------------------------------------ queries
    def _blocks_for(self, tokens: int) -> int:
        bt = self.block_tokens
        return (tokens + bt - 1) // bt

    # ------------------------------------------------------------------ arrivals
    def enqueue(self, req: RequestState, t: float) -> None:
        """A request reaches this engine's waiting queue at time ``t``."""
        waiting = self.waiting
        was_empty = not waiting
        waiting.append(req)
        L = req.prefill_len
        self.pending_tokens += L
        self.waiting_blocks += (L + self.block_tokens - 1) // self.block_tokens
        dc = self.dc
        dc.waiting += 1
        dc.scores[self.index] = dc.score_fn(self)
        state = self.state
        if state == IDLE:
            self.state = WAKE
            self.version += 1
            heapq.heappush(self.heap, (t, 1, self.counter(), self, self.version))
        elif state == RUN and was_empty:
            self._truncate(t)

    def enqueue_and_plan(self, req: RequestState, t: float) -> None:
        """A request reaches this IDLE engine at ``t`` and the engine plans at once: the same as
        :meth:`enqueue` followed by its wake-up event, for a caller that knows that wake-up
        event would be the next event processed (no other event at time ``t`` or earlier)."""
        self.waiting.append(req)
        L = req.prefill_len
        self.pending_tokens += L
        self.waiting_blocks += (L + self.block_tokens - 1) // self.block_tokens
        dc = self.dc
        dc.waiting += 1
        dc.scores[self.index] = dc.score_fn(self)
        self.state = WAKE
        self.version += 1
        self._plan(t)

    def _run_end(self, k: int) -> float:
        return self.t0 + (k * self.T0 + 0.5 * self.B * k * (k - 1))

    def _truncate(self, a: float) -> None:
        """Cut the current decode run at the first iteration boundary at or after ``a``."""
        K = self.K
        x = a - self.t0
        T0, B = self.T0, self.B
        if x <= 0.0:
            k = 1
        else:
            # smallest k with k*T0 + B*k*(k-1)/2 >= x  (positive root, cancellation-free form)
            b = T0 - 0.5 * B
            if B > 0.0:
                disc = b * b + 2.0 * B * x
                root = 2.0 * x / (b + disc ** 0.5) if b > 0.0 else (-b + disc ** 0.5) / B
            else:
                root = x / T0
            k = int(root) if root < K else K
            if k < 1:
                k = 1
            while k > 1 and self._run_end(k - 1) >= a:
                k -= 1
            while k < K and self._run_end(k) < a:
                k += 1
        if k < K:
            self.K = k
            self.t_end = self._run_end(k)
            self.version += 1
            heapq.heappush(self.heap, (self.t_end, 1, self.counter(), self, self.version))

    def run_iterations_done(self, t: float) -> int:
        """Iterations of the decode run in progress that have ended by ``t`` (0 if none): the
        largest k in [0, K] with run_end(k) <= t (run_end is increasing in k)."""
        if self.state != RUN:
            return 0
        K = self.K
        if t >= self.t_end:  # t_end == run_end(K)
            return K
        t0, T0, B = self.t0, self.T0, self.B
        if t < t0 + (T0 + 0.0):  # run_end(1)
            return 0
        # here run_end(1) <= t < run_end(K): estimate from the positive root, then correct exactly
        x = t - t0
        b = T0 - 0.5 * B
        if B > 0.0:
            disc = b * b + 2.0 * B * x
            root = 2.0 * x / (b + disc ** 0.5) if b > 0.0 else (-b + disc ** 0.5) / B
        else:
            root = x / T0
        k = int(root) if root < K else K - 1
        if k < 1:
            k = 1
        run_end = self._run_end
        while k < K - 1 and run_end(k + 1) <= t:
            k += 1
        while k > 1 and run_end(k) > t:
            k -= 1
        return k

    # ------------------------------------------------------------------ events
    def on_event(self, t: float) -> None:
        """The current iteration/run ends (or an idle engine wakes) at ``t``: account, then plan."""
        state = self.state
        if state == RUN:
            self._finish_run(t)
        elif state == ITER:
            self._finish_iter(t)
        self._plan(t)

    def _publish(self) -> None:
        self.view_free_blocks = self.free
        self.view_used_blocks = self.total_blocks - self.free
        dc = self.dc
        dc.scores[self.index] = dc.score_fn(self)

    def _allocs(self, K: int) -> int:
        """Blocks the decoding sequences allocate over the next ``K`` decode iterations."""
        bt = self.block_tokens
        q, r = divmod(K, bt)
        total = self.n_dec * q
        if r:
            # iterations dit+1..dit+r need hist[s], hist[s-1], ..., hist[s-r+1] (cyclically)
            hist = self.hist
            s = (-(self.dit + 1)) % bt
            lo = s - r + 1
            if lo >= 0:
                total += sum(hist[lo:s + 1])
            else:
                total += sum(hist[:s + 1]) + sum(hist[bt + lo:])
        return total

    def _finish_run(self, t: float) -> None:
        n = self.n_dec
        K = self.K
        dc = self.dc
        c1 = dc._cc if t == dc._ct else dc.cum(t)
        pf = self.power_w * dc.pue
        self.cum_e += pf * (t - self.t0) / n
        self.cum_c += pf * (c1 - self.c0) / (J_PER_KWH * n)
        self.free -= self._allocs(K)
        self.dit += K
        self.it += K
        dc.iterations += K
        fh = self.fin_heap
        dit = self.dit
        done = False
        while fh and fh[0][0] <= dit:
            fin, seq, req = heapq.heappop(fh)
            if req.fseq != seq:
                continue
            self._complete(req, t)
            done = True
        if done:
            self._publish()

    def _finish_iter(self, t: float) -> None:
        dc = self.dc
        c1 = dc._cc if t == dc._ct else dc.cum(t)
        pf = self.power_w * dc.pue
        e = pf * (t - self.t0)
        c = pf * (c1 - self.c0) / J_PER_KWH
        nd = self.n_iter_dec
        tot = nd + self.prefill_tokens
        self.it += 1
        dc.iterations += 1
        if self.step:
            self._finish_iter_step(t, e, c, nd, tot)
            return
        if nd:
            self.dit += 1
            self.cum_e += e / tot
            self.cum_c += c / tot
        for req, ch in self.chunks:
            f = ch / tot
            req.energy_j += e * f
            req.carbon_g += c * f
            req.prefilled += ch
            if req.prefilled == req.prefill_len:
                self._prompt_done(req, t)
        self.chunks = []
        fh = self.fin_heap
        if fh:
            dit = self.dit
            while fh and fh[0][0] <= dit:
                fin, seq, req = heapq.heappop(fh)
                if req.fseq != seq:
                    continue
                self._complete(req, t)
                self.sig = True
        if self.sig:
            self._publish()

    def _finish_iter_step(self, t: float, e: float, c: float, nd: int, tot: int) -> None:
        """:meth:`_finish_iter` in step mode (explicit per-sequence bookkeeping)."""
        if nd:
            self.dit += 1
            ei, ci = e / tot, c / tot
            for r in self.running.values():
                if r.decoding:
                    r.energy_j += ei
                    r.carbon_g += ci
                    r.ctx += 1
                    r.gen += 1
        for req, ch in self.chunks:
            f = ch / tot
            req.energy_j += e * f
            req.carbon_g += c * f
            req.prefilled += ch
            if req.prefilled == req.prefill_len:
                self._prompt_done(req, t)
        self.chunks = []
        if nd:
            done = [r for r in self.running.values() if r.decoding and r.gen >= r.output]
            for r in done:
                self._complete(r, t)
                self.sig = True
        if self.sig:
            self._publish()

    def _prompt_done(self, req: RequestState, t: float) -> None:
        """``req`` computed its last prompt token in the iteration ending at ``t``."""
        self.prefilling.remove(req)
        req.gen += 1
        if req.first_token_s < 0.0:
            req.first_token_s = t
        if req.gen >= req.output:
            self._complete(req, t)
            self.sig = True
            return
        req.decoding = True
        ctx = req.prefill_len
        if self.step:
            req.ctx = ctx
            return
        dit = self.dit
        req.base = ctx - dit
        req.gbase = req.gen - dit
        self.n_dec += 1
        self.base_sum += req.base
        self.hist[(req.base - 1) % self.block_tokens] += 1
        req.e_mark = self.cum_e
        req.c_mark = self.cum_c
        req.fin = req.output - req.gbase
        seq = self.counter()
        req.fseq = seq
        heapq.heappush(self.fin_heap, (req.fin, seq, req))

    def _drop_decoder(self, req: RequestState) -> int:
        """Remove a decoding ``req`` from the decode aggregates; return the blocks it holds."""
        if self.step:
            ctx = req.ctx
        else:
            ctx = req.base + self.dit
            self.n_dec -= 1
            self.base_sum -= req.base
            self.hist[(req.base - 1) % self.block_tokens] -= 1
            req.energy_j += self.cum_e - req.e_mark
            req.carbon_g += self.cum_c - req.c_mark
            req.fseq = -1
            req.gen = req.gbase + self.dit
        req.decoding = False
        return self._blocks_for(ctx)

    def _complete(self, req: RequestState, t: float) -> None:
        """``req`` produced its last token at engine time ``t``: free it and record it."""
        if req.decoding:
            if self.step:
                self.free += self._drop_decoder(req)
            else:
                base = req.base
                bt = self.block_tokens
                self.free += (base + self.dit + bt - 1) // bt
                self.n_dec -= 1
                self.base_sum -= base
                self.hist[(base - 1) % bt] -= 1
                req.energy_j += self.cum_e - req.e_mark
                req.carbon_g += self.cum_c - req.c_mark
                req.fseq = -1
                req.decoding = False
                req.gen = req.output
        else:
            self.free += req.blocks
        del self.running[req.rid]
        req.alive = False
        dc = self.dc
        dc.running -= 1
        dc.completed += 1
        self.completed += 1
        down = req.down_s
        arrival = req.arrival_s
        ttft = req.first_token_s + down - arrival
        e2e = t + down - arrival
        out = req.output
        tpot = (e2e - ttft) / (out - 1) if out > 1 else 0.0
        self.rows.append((
            req.rid, req.origin, req.dc, self.index, arrival, req.sent_s, req.dc_arrival_s,
            req.first_sched_s, req.first_token_s + down, t + down, req.prompt, out, ttft, tpot, e2e,
            req.first_sched_s - req.dc_arrival_s, req.first_token_s - req.first_sched_s,
            req.up_s + down, req.preemptions, req.energy_j, req.carbon_g,
        ))

    def _preempt_newest(self) -> RequestState:
        """Preempt the newest running request (recompute later); return it."""
        victim = next(reversed(self.running.values()))
        if victim.decoding:
            self.free += self._drop_decoder(victim)
        else:
            self.free += victim.blocks
            self.prefilling.remove(victim)
        del self.running[victim.rid]
        victim.prefill_len = victim.prompt + victim.gen
        victim.prefilled = 0
        victim.blocks = 0
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

    def _decode_need(self) -> int:
        """Blocks the decoding sequences need for the next decode iteration."""
        bt = self.block_tokens
        if self.step:
            return sum(1 for r in self.running.values() if r.decoding and r.ctx % bt == 0)
        return self.hist[(-(self.dit + 1)) % bt]

    def _preempt_for_decode(self) -> int:
        """Preempt newest requests until the next decode's blocks fit; return blocks needed."""
        bt = self.block_tokens
        if self.step:
            # explicit vLLM order: walk decoders oldest first, allocate, preempt from the back
            need = 0
            for r in list(self.running.values()):
                if r.rid not in self.running or not r.decoding or r.ctx % bt:
                    continue
                while self.free - need < 1:
                    v = self._preempt_newest()
                    if v is r:
                        break
                if r.rid in self.running:
                    need += 1
                else:
                    break
            return need
        need = self._decode_need()
        j = self.dit + 1
        while need > self.free:
            v = next(reversed(self.running.values()))
            if v.decoding and (v.base + j - 1) % bt == 0:
                need -= 1
            self._preempt_newest()
        return need

    def _head_fits(self, free: int) -> bool:
        head = self.waiting[0]
        return len(self.running) < self.max_seqs and self._blocks_for(head.prefill_len) <= free

    def _admit(self, t: float) -> RequestState:
        head = self.waiting.popleft()
        b = self._blocks_for(head.prefill_len)
        self.running[head.rid] = head
        self.prefilling.append(head)
        head.blocks = b
        self.free -= b
        self.pending_tokens -= head.prefill_len
        self.waiting_blocks -= b
        if head.first_sched_s < 0.0:
            head.first_sched_s = t
        dc = self.dc
        dc.waiting -= 1
        dc.running += 1
        return head

    def _plan(self, t: float) -> None:
        """Schedule the next iteration (or run of decode iterations) starting at ``t``."""
        if not self.running:
            if not self.waiting:
                # nothing to run: go idle (what _plan_general concludes, without its set-up)
                self.last_prefill_only = False
                self.state = IDLE
                self._set_power(t, self.rest_w, True)
                self.sig = False
                return
            if self.chunked and not self.step:
                self._plan_chunks(t, 0, 0)
                return
        n = self.n_dec
        if n and not self.step and self.chunked and not self.prefilling:
            # common case first: a pure decode run (no partial prefill, the head cannot be admitted)
            bt = self.block_tokens
            free = self.free
            need = self.hist[(-(self.dit + 1)) % bt]
            if need <= free:
                waiting = self.waiting
                if not waiting or len(self.running) >= self.max_seqs or self.budget <= n or (
                        (waiting[0].prefill_len + bt - 1) // bt > free - need):
                    self._plan_run(t, n)
                else:  # the head joins the running decodes
                    self._plan_chunks(t, n, need)
                return
        self._plan_general(t)

    def _admit_chunks(self, t: float, budget: int, free_after: int, chunks: list) -> None:
        """Chunked prefill admission: admit requests from the head of the queue (FCFS) while
        sequences, ``free_after`` blocks and the ``budget`` of tokens allow, appending each one's
        first chunk ``(request, tokens)`` to ``chunks``."""
        waiting = self.waiting
        running = self.running
        max_seqs = self.max_seqs
        bt = self.block_tokens
        dc = self.dc
        while waiting and budget > 0 and len(running) < max_seqs:
            head = waiting[0]
            L = head.prefill_len
            b = (L + bt - 1) // bt
            if b > free_after:
                break
            # self._admit(t), inlined
            waiting.popleft()
            running[head.rid] = head
            self.prefilling.append(head)
            head.blocks = b
            self.free -= b
            self.pending_tokens -= L
            self.waiting_blocks -= b
            if head.first_sched_s < 0.0:
                head.first_sched_s = t
            dc.waiting -= 1
            dc.running += 1
            free_after -= b
            ch = L if L < budget else budget
            chunks.append((head, ch))
            budget -= ch

    def _plan_chunks(self, t: float, n: int, need: int) -> None:
        """:meth:`_plan_general` in fast-path mode with chunked prefill when nothing is partially
        prefilled and no preemption is needed: ``n`` decoding sequences (possibly 0) that need
        ``need`` new blocks in the next iteration (``need <= free``); admit from the queue and
        plan one iteration with their first chunks, or a decode run (or idle) if none fits.
        The same steps as the general case, without its set-up."""
        chunks: list[tuple[RequestState, int]] = []
        self._admit_chunks(t, self.budget - n, self.free - need, chunks)
        self.last_prefill_only = False
        if not chunks:
            if n:
                self._plan_run(t, n)
            else:
                self.state = IDLE
                self._set_power(t, self.rest_w, True)
                self.sig = False
            return
        dc = self.dc
        dc.scores[self.index] = dc.score_fn(self)
        self.free -= need
        pt = 0
        pairs = 0.0
        sampled = n
        for req, ch in chunks:
            pt += ch
            pairs += ch * (req.prefilled + 0.5 * (ch + 1))
            if req.prefilled + ch == req.prefill_len:
                sampled += 1
        ctx_sum = self.base_sum + n * (self.dit + 1) if n else 0
        models = self.models
        T = models.iteration_time_s(pt, pairs, n, float(ctx_sum), sampled)
        p = models.prefill_engine_w(pt, n)
        self.chunks = chunks
        self.n_iter_dec = n
        self.prefill_tokens = pt
        self.sig = True
        self.t0 = t
        self.t_end = t_end = t + T
        self.state = ITER
        if p != self.power_w or self.is_idle:  # self._set_power(t, p, False), inlined
            dc.engine_power_changed(t, self.power_w, p, self.is_idle, False)
            self.power_w = p
            self.is_idle = False
        self.c0 = dc._cc if t == dc._ct else dc.cum(t)
        self.version = v = self.version + 1
        heapq.heappush(self.heap, (t_end, 1, self.counter(), self, v))

    def _plan_run(self, t: float, n: int) -> None:
        """Plan a closed-form run of pure decode iterations of the ``n`` decoding sequences."""
        fh = self.fin_heap
        while fh[0][2].fseq != fh[0][1]:
            heapq.heappop(fh)
        dit = self.dit
        K = fh[0][0] - dit
        bt = self.block_tokens
        free = self.free
        full = free // n
        if bt * full < K:
            rem = free - n * full
            hist = self.hist
            j = dit + bt * full
            i = 0
            while True:
                a = hist[(-(j + i + 1)) % bt]
                if a > rem:
                    break
                rem -= a
                i += 1
            kkv = bt * full + i
            if kkv < K:
                K = kkv
        models = self.models
        coeff = models.coeff
        fixed = models._fixed.get(n)
        if fixed is None:
            fixed = models.decode_fixed_s(n)
        T0 = fixed + coeff * (self.base_sum + n * (dit + 1))
        B = n * coeff
        self.t0 = t
        self.K = K
        self.T0 = T0
        self.B = B
        t_end = self.t_end = t + (K * T0 + 0.5 * B * K * (K - 1))
        self.state = RUN
        self.last_prefill_only = False
        self.sig = False
        watts = models._pow.get(n)
        if watts is None:
            watts = models.decode_power_w(n)
        dc = self.dc
        if watts != self.power_w or self.is_idle:
            dc.engine_power_changed(t, self.power_w, watts, self.is_idle, False)
            self.power_w = watts
            self.is_idle = False
        self.c0 = dc._cc if t == dc._ct else dc.cum(t)
        self.version = v = self.version + 1
        heapq.heappush(self.heap, (t_end, 1, self.counter(), self, v))

    def _plan_general(self, t: float) -> None:
        """Schedule the next iteration in the general case (or a run, via :meth:`_plan_run`)."""
        waiting = self.waiting
        n = self.n_dec if not self.step else sum(1 for r in self.running.values() if r.decoding)
        chunks: list[tuple[RequestState, int]] = []
        preempted = False
        prefill_only = False
        dec = n > 0
        need = 0
        if not self.chunked and waiting and (n == 0 or not self.last_prefill_only) and self._head_fits(self.free):
            prefill_only = True
            dec = False
        if dec:
            need = self._decode_need()
            if need > self.free:
                need = self._preempt_for_decode()
                preempted = True
                n = self.n_dec if not self.step else sum(1 for r in self.running.values() if r.decoding)
                dec = n > 0
        budget = self.budget - (n if dec else 0)
        free_after = self.free - need
        if prefill_only or (not self.chunked and not dec and waiting):
            # prefill-only iteration: whole prompts while they fit the budget (at least one)
            prefill_only = True
            while waiting and len(self.running) < self.max_seqs:
                head = waiting[0]
                b = self._blocks_for(head.prefill_len)
                if b > free_after or (chunks and head.prefill_len > budget):
                    break
                self._admit(t)
                free_after -= b
                budget -= head.prefill_len
                chunks.append((head, head.prefill_len))
        elif self.chunked:
            for req in self.prefilling:
                if budget <= 0:
                    break
                ch = req.prefill_len - req.prefilled
                if ch > budget:
                    ch = budget
                chunks.append((req, ch))
                budget -= ch
            if not preempted or (not dec and not chunks):
                self._admit_chunks(t, budget, free_after, chunks)
        self.last_prefill_only = prefill_only
        dc = self.dc
        if chunks or preempted:
            dc.scores[self.index] = dc.score_fn(self)
        if not dec and not chunks:
            self.state = IDLE
            self._set_power(t, self.rest_w, True)
            self.sig = False
            return
        models = self.models
        if (not self.step and dec and not chunks and not preempted
                and (self.chunked or not (waiting and self._head_fits(free_after)))):
            # closed-form run of pure decode iterations
            self._plan_run(t, n)
            return
        # one iteration, explicit
        self.free -= need
        pt = 0
        pairs = 0.0
        sampled = n if dec else 0
        for req, ch in chunks:
            pt += ch
            pairs += ch * (req.prefilled + 0.5 * (ch + 1))
            if req.prefilled + ch == req.prefill_len:
                sampled += 1
        nd = n if dec else 0
        if nd:
            if self.step:
                ctx_sum = sum(r.ctx + 1 for r in self.running.values() if r.decoding)
            else:
                ctx_sum = self.base_sum + n * (self.dit + 1)
        else:
            ctx_sum = 0
        T = models.iteration_time_s(pt, pairs, nd, float(ctx_sum), sampled)
        if pt:
            p = models.prefill_engine_w(pt, nd)
        else:
            p = models.decode_power_w(nd) if not self.step else models.tp * float(models.power.gpu_power_w(0, nd))
        self.chunks = chunks
        self.n_iter_dec = nd
        self.prefill_tokens = pt
        self.sig = bool(chunks) or preempted
        self.t0 = t
        self.t_end = t_end = t + T
        self.state = ITER
        if p != self.power_w or self.is_idle:  # self._set_power(t, p, False), inlined
            dc.engine_power_changed(t, self.power_w, p, self.is_idle, False)
            self.power_w = p
            self.is_idle = False
        self.c0 = dc._cc if t == dc._ct else dc.cum(t)
        self.version = v = self.version + 1
        heapq.heappush(self.heap, (t_end, 1, self.counter(), self, v))

    def _set_power(self, t: float, watts: float, idle: bool) -> None:
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
            if r.decoding and not self.step:
                r.energy_j += self.cum_e - r.e_mark
                r.carbon_g += self.cum_c - r.c_mark
            r.alive = False
        self.reset()
        return reqs

    def in_progress_share(self, t: float) -> tuple[float, float]:
        """Facility energy (J) and carbon (g) of the iteration or decode run in progress from its
        start to ``t`` (not yet attributed to requests; (0, 0) when none is in progress)."""
        if self.state not in (ITER, RUN) or t <= self.t0:
            return 0.0, 0.0
        dc = self.dc
        pf = self.power_w * dc.pue
        return pf * (t - self.t0), pf * (dc.cum(t) - self.c0) / J_PER_KWH

    def request_shares(self) -> tuple[float, float, int]:
        """(energy J, carbon g, count) already attributed to the requests on this engine
        (running and waiting; completed iterations only)."""
        e = c = 0.0
        n = 0
        for r in list(self.running.values()) + list(self.waiting):
            e += r.energy_j
            c += r.carbon_g
            if r.decoding and not self.step:
                e += self.cum_e - r.e_mark
                c += self.cum_c - r.c_mark
            n += 1
        return e, c, n

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
        dc.scores[self.index] = dc.score_fn(self)
        return reqs
