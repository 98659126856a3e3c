"""A datacenter: its engines, the dispatcher that spreads arrivals over them, and its
power / energy / carbon ledger.

Power is piecewise constant between events. The ledger keeps the current GPU power of all
engines (active + idle), the idle part, and the constant host power of the nodes, and integrates
them exactly whenever any of them changes (O(1) per change)::

    IT power       = sum of engine powers (tp x per-GPU watts) + nodes x host_w
    facility power = IT power x PUE
    carbon [t0,t1] = facility power x integral of intensity over [off+t0, off+t1] / 3.6e6  (grams)

A datacenter that is down draws nothing. Under capacity control (:mod:`carbon_gym.sim.capacity`)
the ledger also keeps the GPU power of the engines in each dormant state (falling asleep,
asleep, waking, booting) and the host power of the nodes in standby, off and booting, each
integrated into its own energy account; the active GPU power (what requests share) excludes them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Final

import numpy as np

from ..physics.carbon import CarbonTrace
from ..topology import DatacenterSpec
from .engine import IDLE, Engine, EngineConfig, least_work_score, most_free_kv_score
from .prefix_cache import Key, PrefixIndex, run_depth
from .request import CopyableState, EngineModels, EventQueue, RequestState, mypyc_attr
from .kernels import draining_score_fn

if TYPE_CHECKING:  # pragma: no cover
    from .capacity import CapacityControl

J_PER_KWH: Final = 3.6e6
SECONDS_PER_HOUR: Final = 3600.0


@mypyc_attr(allow_interpreted_subclasses=True)
class ZoneClock(CopyableState):
    """Cumulative carbon intensity of one zone: ``clock(t) = integral of intensity over
    [0, offset + t]`` (gCO2eq/kWh x s), so that the integral over any interval is a difference.

    For a :class:`~carbon_gym.physics.carbon.CarbonTrace` with ``"step"`` or ``"linear"``
    interpolation it evaluates the trace's exact piecewise integral in pure Python (the hot path
    calls it once per event); it checks itself against ``trace.integral`` at construction and
    otherwise falls back to ``trace.integral(zone, 0, offset + t)``.
    """

    __slots__ = (
        "carbon", "zone", "offset_s",  # the trace, the zone's column in it, carbon time of time 0 (s)
        "fast",                   # the pure-Python evaluation below matches trace.integral (else call it)
        "hours", "period_s",      # trace length, hours and seconds (the trace repeats)
        "hour_g_per_kwh",         # [h]: intensity at the start of hour h, gCO2eq/kWh
        "hour_slope",             # [h]: its slope over hour h (linear interpolation), gCO2eq/kWh per s
        "hour_cum",               # [h]: integral from the trace start to hour h, (gCO2eq/kWh) x s
        "period_cum",             # integral over one period, (gCO2eq/kWh) x s
        "linear",                 # linear interpolation (else step)
        "seg_lo", "seg_hi", "seg_start", "seg_cum", "seg_v", "seg_slope",  # memo of the last hour (below)
    )

    def __init__(self, carbon: Any, zone: int, offset_s: float) -> None:
        self.carbon = carbon
        self.zone = zone
        self.offset_s = float(offset_s)
        self.fast = False
        # memo of the last hour evaluated in the first trace period: for seg_lo < x < seg_hi
        # (strictly inside hour h, so divmod gives (0, x) and int(x / 3600) == h) the value is
        # seg_cum + seg_v * (x - seg_start) (+ 0.5 * seg_slope * dt * dt), the same floats
        self.seg_lo = self.seg_hi = 0.0
        self.seg_start = self.seg_cum = self.seg_v = self.seg_slope = 0.0
        interp = getattr(carbon, "interpolation", None)
        values = getattr(carbon, "hourly_g_per_kwh", None)
        if interp in ("step", "linear") and values is not None:
            # numpy elementwise ops and the (sequential) cumulative sum give the same floats as
            # the equivalent Python loops, in a fraction of the time for year-long traces
            va = np.asarray(values[:, zone], dtype=np.float64)
            H = int(va.shape[0])
            nxt = np.roll(va, -1)
            per_hour = va * SECONDS_PER_HOUR if interp == "step" else 0.5 * (va + nxt) * SECONDS_PER_HOUR
            cum_arr = np.zeros(H + 1)
            np.cumsum(per_hour, out=cum_arr[1:])
            v = va.tolist()
            cum = cum_arr.tolist()
            # (annotated: the compiled class keeps them as native floats / bools, not objects)
            self.hour_g_per_kwh: list[float] = v
            self.hour_slope: list[float] = ((nxt - va) / SECONDS_PER_HOUR).tolist()
            self.hour_cum: list[float] = cum
            self.period_cum: float = cum[-1]
            self.hours = H
            self.period_s = H * SECONDS_PER_HOUR
            self.linear: bool = interp == "linear"
            self.fast = True
            for x in (0.0, 1234.5, 0.37 * self.period_s + 17.0, 2.5 * self.period_s + 3599.9):
                ref = float(carbon.integral(zone, 0.0, x)) if x > 0 else 0.0
                if abs(self._fast(x) - ref) > 1e-9 * max(abs(ref), 1.0):
                    self.fast = False
                    break

    def _fast(self, x: float) -> float:
        if self.seg_lo < x < self.seg_hi:
            dt = x - self.seg_start
            if self.linear:
                return self.seg_cum + self.seg_v * dt + 0.5 * self.seg_slope * dt * dt
            return self.seg_cum + self.seg_v * dt
        periods, rem = divmod(x, self.period_s)
        h = int(rem / SECONDS_PER_HOUR)
        if h >= self.hours:
            h = self.hours - 1
        start = h * SECONDS_PER_HOUR
        dt = rem - start
        base = periods * self.period_cum + self.hour_cum[h]
        if periods == 0.0:
            self.seg_lo = start + 1e-3
            self.seg_hi = start + (SECONDS_PER_HOUR - 1e-3)
            self.seg_start = start
            self.seg_cum = base
            self.seg_v = self.hour_g_per_kwh[h]
            self.seg_slope = self.hour_slope[h]
        if self.linear:
            return base + self.hour_g_per_kwh[h] * dt + 0.5 * self.hour_slope[h] * dt * dt
        return base + self.hour_g_per_kwh[h] * dt

    def intensity(self, x: float) -> float:
        """Intensity (gCO2eq/kWh) at carbon time ``x`` (fast clocks only), computed exactly as
        :meth:`CarbonTrace.intensity` does."""
        h_float = (x % self.period_s) / SECONDS_PER_HOUR
        h = int(h_float)
        v = self.hour_g_per_kwh
        if not self.linear:
            return v[h]
        f = h_float - h
        return v[h] + (v[(h + 1) % self.hours] - v[h]) * f

    def __call__(self, t: float) -> float:
        x = self.offset_s + t
        if self.fast:
            return self._fast(x)
        return float(self.carbon.integral(self.zone, 0.0, x)) if x > 0 else 0.0


@mypyc_attr(allow_interpreted_subclasses=True)
class Datacenter(CopyableState):
    """Engines + dispatcher + power/energy/carbon ledger of one datacenter (internal).

    Attributes (ledger, all since time 0): ``gpu_j`` (all GPU energy, IT level), ``idle_j``
    (GPU energy of idle engines), ``host_j`` (non-GPU node energy), ``carbon_g`` (facility,
    grams CO2eq). Counters: ``in_transit``, ``waiting``, ``running``, ``iterations`` (completed
    iterations, decode runs in progress excluded), ``completed``, ``preemptions``.
    """

    # Slots, not a __dict__ (see Engine.__slots__): a new attribute needs its name here.
    __slots__ = (
        # set-up
        "index", "spec", "name",  # position in Simulator.datacenters, its DatacenterSpec, its name
        "zone", "carbon", "offset_s",  # zone column in the carbon trace, the trace, carbon time of time 0 (s)
        "pue",                    # power usage effectiveness (facility / IT power)
        "n_engines", "engines",   # its Engines
        "models",                 # EngineModels shared by the engines
        "clock",                  # ZoneClock: the zone's intensity integral
        "_exact_intensity",       # the clock's intensity replicates CarbonTrace.intensity (same floats)
        # dispatch
        "score_fn",               # dispatcher score (engine -> float, lowest wins), draining-aware
        "score_kind",             # score_fn is least_work_score (1), most_free_kv_score (2), another (0)
        "base_score_fn",          # the dispatcher's own score
        "scores",                 # [i]: score_fn(engines[i]), refreshed when engine i changes
        "n_draining",             # engines draining (the last ones)
        "capacity",               # CapacityControl, or None (always on: every engine awake)
        "cap_counts",             # [s]: engines in capacity state s (carbon_gym.sim.capacity)
        # power now
        "up",                     # False during an outage (draws nothing)
        "host_on_w", "host_w",    # non-GPU node power when up / now, W
        "gpu_w",                  # GPU power of all engines now (tp x per-GPU watts), W
        "idle_gpu_w",             # the part of gpu_w drawn by idle engines, W
        "n_idle",                 # idle engines
        "state_gpu_w",            # [k]: GPU power of the engines falling asleep / asleep / waking / booting / off, W
        "dormant_gpu_w",          # their sum, W (0 without capacity control)
        "state_host_w",           # [node state]: host power of the nodes on (0), in standby (1), off (2), booting (3), W
        # ledger (since time 0)
        "_cum_memo_t_s", "_cum_memo",  # the last time cum(t) was evaluated at, and its value
        "ledger_t_s", "ledger_cum",  # the time the ledger was integrated to, and cum(ledger_t_s)
        "gpu_j", "idle_j", "host_j",  # GPU (all, of idle engines) and host energy, IT level, J
        "state_gpu_j", "state_host_j",  # the energy of state_gpu_w / state_host_w, IT level, J
        "carbon_g",               # facility carbon, gCO2eq
        "active_carbon_g",        # carbon of the power drawn by engines with work (split per request), g
        "aborted_active_j", "aborted_active_carbon_g",  # of iterations cut by outages (no request's), J / g
        # counters
        "in_transit", "waiting", "running",  # requests travelling to it, in engine queues, running
        "iterations", "completed", "preemptions",  # sums of its engines' (decode runs in progress excluded)
        # estimates
        "tok_rate_sum", "tok_rate_t",  # EWMA of prompt tokens arriving: sum (tokens), last update (s)
        "req_rate_sum",           # EWMA of requests arriving (same decay and time): sum (requests)
        "est_key", "est_val",     # memo of the simulator's latency estimates for (running, used blocks)
        # prefix caching (carbon_gym.sim.prefix_cache)
        "prefix_index",           # key -> its engines' cache runs starting with it (prefix_cache.PrefixIndex; empty without caching)
        "prefix_weight",          # dispatch: load tokens one cached prompt token is worth (0: not cache-aware)
        "prefix_tokens",          # tokens per prefix block
        "prompt_tokens",          # prompt tokens of the requests admitted (first admission), tokens
        "cached_prompt_tokens",   # of those, served from the prefix cache at the first admission, tokens
        "prefill_saved_tokens",   # prompt tokens not computed thanks to the cache, every admission, tokens
    )

    def __init__(
        self,
        index: int,
        spec: DatacenterSpec,
        zone: int,
        carbon: Any,
        carbon_offset_s: float,
        cfg: EngineConfig,
        total_blocks: int,
        models: EngineModels,
        host_w_per_node: float,
        score_fn: Callable[[Engine], float],
        step_mode: bool,
        heap: EventQueue,
        finished: list[RequestState],
        clock: ZoneClock | None = None,
    ) -> None:
        self.index = index
        self.spec = spec
        self.name = spec.name
        self.zone = zone
        self.carbon = carbon
        self.offset_s = float(carbon_offset_s)
        self.pue = float(spec.pue)
        self._set_score_fn(score_fn)
        self.prefix_index: PrefixIndex = {}
        self.prefix_weight = 0.0
        self.prefix_tokens: int = cfg.prefix_block_tokens  # (typed: the compiled code does not see EngineConfig's)
        self.prompt_tokens = self.cached_prompt_tokens = self.prefill_saved_tokens = 0
        # (the power and count attributes are annotated: native floats and ints when compiled)
        self.n_engines: int = spec.nodes * spec.gpus_per_node // cfg.tp
        self.scores: list[float] = [0.0] * self.n_engines
        self.engines = [
            Engine(self, i, cfg, total_blocks, models, step_mode, heap, finished) for i in range(self.n_engines)
        ]
        for e in self.engines:
            self.scores[e.index] = self.score(e)
        self.models = models
        self.host_on_w: float = spec.nodes * float(host_w_per_node)
        self.up = True
        self.host_w: float = self.host_on_w
        self.gpu_w: float = self.n_engines * models.idle_engine_w
        self.idle_gpu_w: float = self.gpu_w
        self.n_idle: int = self.n_engines
        self.capacity: CapacityControl | None = None
        self.cap_counts = [self.n_engines, 0, 0, 0, 0, 0, 0]
        self.state_gpu_w = [0.0, 0.0, 0.0, 0.0, 0.0]
        self.dormant_gpu_w = 0.0
        self.state_host_w = [0.0, 0.0, 0.0, 0.0]
        self.state_gpu_j = [0.0, 0.0, 0.0, 0.0, 0.0]
        self.state_host_j = [0.0, 0.0, 0.0, 0.0]
        self._cum_memo_t_s = -1.0
        self._cum_memo = 0.0
        # a ZoneClock is immutable once built: simulators of the same world share it (see Simulator.fresh)
        self.clock = clock if clock is not None else ZoneClock(carbon, zone, self.offset_s)
        # the clock's pure-Python intensity replicates CarbonTrace.intensity (same floats)
        self._exact_intensity = self.clock.fast and type(carbon) is CarbonTrace
        self.ledger_t_s = 0.0
        self.ledger_cum = self.cum(0.0)
        self.gpu_j = 0.0
        self.idle_j = 0.0
        self.host_j = 0.0
        self.carbon_g = 0.0
        # carbon of the power drawn by engines with work (the part per-request shares split)
        self.active_carbon_g = 0.0
        # energy / carbon of iterations cut short by an outage (attributed to no request)
        self.aborted_active_j = 0.0
        self.aborted_active_carbon_g = 0.0
        self.base_score_fn = score_fn
        self.n_draining = 0
        self.in_transit = 0
        self.waiting = 0
        self.running = 0
        self.iterations = 0
        self.completed = 0  # requests completed (sum of its engines' counters)
        self.preemptions = 0  # preemptions (sum of its engines' counters)
        # EWMA of prompt tokens arriving per second (for decode-time estimates; updated by the
        # simulator at each arrival: sum *= exp(-dt / tau); sum += prompt tokens)
        self.tok_rate_sum = 0.0
        self.tok_rate_t = 0.0
        self.req_rate_sum = 0.0
        # memo of the simulator's latency estimates for the last (running, used blocks) seen here
        self.est_key: tuple = ()
        self.est_val: tuple = ()

    # ------------------------------------------------------------------ carbon / ledger
    def cum(self, t: float) -> float:
        """Integral of the zone's intensity from the trace start to ``off + t`` (g/kWh x s)."""
        if t == self._cum_memo_t_s:
            return self._cum_memo
        clock = self.clock
        if clock.fast:
            x = clock.offset_s + t
            if clock.seg_lo < x < clock.seg_hi and not clock.linear:  # ZoneClock._fast, inlined
                v = clock.seg_cum + clock.seg_v * (x - clock.seg_start)
            else:
                v = clock._fast(x)
        else:
            v = clock(t)
        self._cum_memo_t_s = t
        self._cum_memo = v
        return v

    def intensity(self, t: float) -> float:
        """Grid intensity now, gCO2eq/kWh."""
        if self._exact_intensity:
            return self.clock.intensity(self.offset_s + t)
        return float(self.carbon.intensity(self.zone, self.offset_s + t))

    def flush(self, t: float) -> None:
        """Integrate the current (constant) power from the last change up to ``t``."""
        dt = t - self.ledger_t_s
        if dt <= 0.0:
            return
        gpu_w = self.gpu_w
        host = self.host_w
        self.gpu_j += gpu_w * dt
        self.idle_j += self.idle_gpu_w * dt
        self.host_j += host * dt
        if self.capacity is not None:
            sg, sgj, sh, shj = self.state_gpu_w, self.state_gpu_j, self.state_host_w, self.state_host_j
            for i in range(5):
                sgj[i] += sg[i] * dt
            for i in range(4):
                shj[i] += sh[i] * dt
        c = self.cum(t)
        k = self.pue * (c - self.ledger_cum) / J_PER_KWH
        self.carbon_g += (gpu_w + host) * k
        self.active_carbon_g += (gpu_w - self.idle_gpu_w - self.dormant_gpu_w) * k
        self.ledger_cum = c
        self.ledger_t_s = t

    def engine_power_changed(self, t: float, old_w: float, new_w: float, old_idle: bool, new_idle: bool) -> None:
        """An engine's power changes at ``t`` (flush the ledger first)."""
        if not self.up:
            return
        self.flush(t)
        self.gpu_w += new_w - old_w
        if old_idle:
            self.idle_gpu_w -= old_w
            self.n_idle -= 1
        if new_idle:
            self.idle_gpu_w += new_w
            self.n_idle += 1

    def engine_state_changed(self, t: float, old_w: float, new_w: float, old_cls: int, new_cls: int) -> None:
        """An engine's capacity state changes at ``t``: its power moves from ledger class
        ``old_cls`` to ``new_cls`` (0 active, 1 idle, 2.. the dormant states, see
        :mod:`carbon_gym.sim.capacity`)."""
        if not self.up:
            return
        self.flush(t)
        self.gpu_w += new_w - old_w
        if old_cls == 1:
            self.idle_gpu_w -= old_w
            self.n_idle -= 1
        elif old_cls >= 2:
            self.state_gpu_w[old_cls - 2] -= old_w
            self.dormant_gpu_w -= old_w
        if new_cls == 1:
            self.idle_gpu_w += new_w
            self.n_idle += 1
        elif new_cls >= 2:
            self.state_gpu_w[new_cls - 2] += new_w
            self.dormant_gpu_w += new_w

    def node_state_changed(self, t: float, old_w: float, new_w: float, old_state: int, new_state: int) -> None:
        """A node's state changes at ``t`` (0 on, 1 standby, 2 off, 3 booting): its host power
        moves from ``old_w`` to ``new_w``."""
        if not self.up:
            return
        self.flush(t)
        self.host_w += new_w - old_w
        self.state_host_w[old_state] -= old_w
        self.state_host_w[new_state] += new_w

    def accepting_now(self) -> bool:
        """Some engine takes new requests (awake, not draining)."""
        for e in self.engines:
            if e.cap_state == 0 and not e.draining:
                return True
        return False

    def refresh_scores(self) -> None:
        """Recompute the dispatch scores after engines stopped or started taking work (faults'
        drains, capacity states)."""
        base = self.base_score_fn
        if self.n_draining or self.cap_counts[0] != self.n_engines:
            self._set_score_fn(draining_score_fn(base))
        else:
            self._set_score_fn(base)
        for e in self.engines:
            self.scores[e.index] = self.score(e)

    def _set_score_fn(self, fn: Callable[[Engine], float]) -> None:
        """Dispatch by ``fn`` from now on (see :meth:`score`)."""
        self.score_fn = fn
        self.score_kind = 1 if fn is least_work_score else 2 if fn is most_free_kv_score else 0

    def score(self, e: Engine) -> float:
        """``score_fn(e)``: the dispatch score of engine ``e`` (lower is better); the built-in
        scores are called directly (a native call when compiled, not a Python object call)."""
        k = self.score_kind
        if k == 1:
            return least_work_score(e)
        if k == 2:
            return most_free_kv_score(e)
        return self.score_fn(e)

    def power_w(self) -> float:
        """Facility power now, watts."""
        return (self.gpu_w + self.host_w) * self.pue

    # ------------------------------------------------------------------ dispatch
    def pick(self) -> Engine:
        """The engine with the lowest dispatcher score (ties: lowest index)."""
        s = self.scores
        best = 0
        v = s[0]
        for i in range(1, len(s)):  # (a native loop when compiled; min() compares boxed floats)
            if s[i] < v:
                v = s[i]
                best = i
        return self.engines[best]

    def pick_cached(self, req: RequestState) -> Engine:
        """Cache-aware dispatch of ``req`` (which has prefix keys): the engine with the lowest
        ``score - prefix_weight x cached prefix tokens of req there`` (ties: lowest index); the
        plain :meth:`pick` when no engine holds its first block.

        The engines caching the request's first block are those with a run (of their prefix
        cache) starting at it, in the prefix index; each one's cached prefix is a walk of its
        runs (:func:`~carbon_gym.sim.prefix_cache.run_depth`), and the best engine is the plain
        pick (nothing cached) or one of them."""
        keys = req.prefix_keys
        assert keys is not None
        n_max = (req.prefill_len - 1) // self.prefix_tokens
        if n_max > len(keys):
            n_max = len(keys)
        best = self.pick()
        if n_max <= 0:
            return best
        index = self.prefix_index
        roots = index.get(keys[0])
        if roots is None:
            return best
        w = self.prefix_weight * self.prefix_tokens
        s = self.scores
        i_best = best.index
        v_best = s[i_best]
        inf = math.inf
        for root in roots:
            i = root.eng
            v = s[i]
            if v != inf:
                v -= w * float(run_depth(index, root, keys, n_max))
                if v < v_best or (v == v_best and i < i_best):
                    v_best = v
                    i_best = i
        return self.engines[i_best]

    def cached_prefix_blocks(self, keys: tuple[Key, ...], n_max: int) -> int:
        """Prefix blocks of ``keys`` (at most ``n_max``) cached at the best engine that takes
        work (0 when down or none does)."""
        if not self.up or n_max <= 0:
            return 0
        index = self.prefix_index
        roots = index.get(keys[0])
        if roots is None:
            return 0
        every = not (self.n_draining or self.cap_counts[0] != self.n_engines)  # all take work
        engines = self.engines
        d = 0
        for root in roots:
            if not every:
                e = engines[root.eng]
                if e.cap_state != 0 or e.draining:
                    continue
            h = run_depth(index, root, keys, n_max)
            if h > d:
                d = h
        return d

    def request_rate(self, t: float, tau_s: float = 60.0) -> float:
        """Requests per second arriving at this datacenter (EWMA over ``tau_s``, bias-corrected
        over the first minutes: divided by ``1 - exp(-t / tau_s)``)."""
        dt = max(t - self.tok_rate_t, 0.0)
        warm = 1.0 - math.exp(-t / tau_s) if t > 0.0 else 1.0
        return self.req_rate_sum * math.exp(-dt / tau_s) / tau_s / warm

    def token_rate(self, t: float, tau_s: float = 60.0) -> float:
        """Prompt tokens per second arriving at this datacenter (EWMA)."""
        dt = max(t - self.tok_rate_t, 0.0)
        return self.tok_rate_sum * math.exp(-dt / tau_s) / tau_s

    # ------------------------------------------------------------------ faults
    def set_up(self, t: float, up: bool) -> list[RequestState]:
        """Bring the datacenter down (abort all its requests; returns them) or back up (idle)."""
        if up == self.up:
            return []
        self.flush(t)
        aborted: list[RequestState] = []
        if not up:
            for e in self.engines:
                aborted.extend(e.abort_all(t))
            self.waiting = 0
            self.running = 0
            self.gpu_w = 0.0
            self.idle_gpu_w = 0.0
            self.host_w = 0.0
            if self.capacity is not None:  # every engine and node comes back awake and on
                for e in self.engines:
                    e.cap_state = 0
                    e.cap_version += 1
                    e.wake_after = False
                self.cap_counts = [self.n_engines, 0, 0, 0, 0, 0, 0]
                self.state_gpu_w = [0.0, 0.0, 0.0, 0.0, 0.0]
                self.dormant_gpu_w = 0.0
                self.state_host_w = [0.0, 0.0, 0.0, 0.0]
                self.capacity.reset_after_outage()
        else:
            p = 0.0
            for e in self.engines:
                e.reset()
                e.power_w = e.rest_w  # drained engines stay off
                p += e.rest_w
            self.gpu_w = p
            self.idle_gpu_w = p
            self.host_w = self.host_on_w
            if self.capacity is not None:
                self.state_host_w = [self.host_on_w, 0.0, 0.0, 0.0]
        self.n_idle = self.n_engines
        self.up = up
        self.refresh_scores()
        if up and self.capacity is not None:
            self.capacity.reconcile(t)
        return aborted

    def set_draining(self, t: float, n: int, power_off: bool = True) -> None:
        """Drain the last ``n`` engines (by index) for maintenance from ``t``; the others stop draining.

        A draining engine gets no new request from the dispatcher (unless every engine of the
        datacenter drains); the requests waiting in its queue are re-dispatched to the others,
        its running batch finishes, then it draws ``0 W`` (``power_off``) or idle power until
        the drain ends.
        """
        n = max(0, min(int(n), self.n_engines))
        first = self.n_engines - n
        moved: list[RequestState] = []
        for e in self.engines:
            drain = e.index >= first
            rest = 0.0 if (drain and power_off) else self.models.idle_engine_w
            if drain and not e.draining:
                e.draining = True
                if n < self.n_engines:  # some engine still takes work: move the queue there
                    moved.extend(e.take_waiting())
                if power_off and e.state == IDLE and e.cache is not None:
                    e.cache.clear()  # powered off: its KV cache is lost
            elif not drain and e.draining:
                e.draining = False
            if rest != e.rest_w:
                e.rest_w = rest
                if e.state == IDLE and self.up and e.cap_state <= 1:  # idle and awake now: switch its power
                    e._set_power(t, rest, True)
        self.n_draining = n
        self.refresh_scores()
        for r in sorted(moved, key=lambda r: r.rid):
            self.pick().enqueue(r, t)

    @property
    def accepting_engines(self) -> int:
        """Engines that take new requests: 0 when down, else those not draining."""
        return self.n_engines - self.n_draining if self.up else 0
