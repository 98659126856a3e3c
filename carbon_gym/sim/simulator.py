"""The simulator: a clock, an event heap and the datacenters.

Events are (time, priority, sequence number, object, version) entries in one heap
(:class:`~carbon_gym.sim.request.EventQueue`, parallel lists): request arrivals at a datacenter
(priority 0, so arrivals at the same instant are seen before an engine plans its next iteration),
engine events (priority 1: an iteration or a closed-form run of decode iterations ends, or an
idle engine wakes) and capacity transitions (priority 2). Engine events are invalidated lazily by
a per-engine version counter when a run is cut short.

A request's life: :meth:`Simulator.submit` at ``now_s`` (the client issued it at ``arrival_s``,
the wait counts in its TTFT) -> uplink delay -> the datacenter's dispatcher picks an engine ->
engine queue -> prefill -> decode -> the last token travels back (downlink delay) -> a row in
:meth:`Simulator.pop_completed`.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from math import exp
from typing import TYPE_CHECKING, Any, Final, cast

import numpy as np

from ..errors import ConfigError
from .datacenter import Datacenter
from .dispatch import get_dispatcher, get_prefix_weight
from .engine import IDLE, RUN, Engine, EngineConfig
from .prefix_cache import Key, attach_prefix, batch_prefix_keys, prefix_keys
from .request import PRIO_SHIFT, CopyableState, EngineModels, EventQueue, RequestState, mypyc_attr, record_column
from .records import AbortedRequests, RequestRecords
from .results import ClusterSnapshot, EnergyAttribution, LatencyEstimates, SimTotals, snapshot_from_array

if TYPE_CHECKING:  # pragma: no cover - types only (the compiled build treats them as Any)
    from ..physics.carbon import CarbonTrace
    from ..physics.latency import IterationLatencyModel
    from ..physics.network import Network
    from ..physics.power import PowerModel, PowerStates
    from ..specs import GpuSpec, ModelSpec
    from ..topology import Topology

_VIEW_FREE = operator.attrgetter("view_free_blocks")
#: Type of the public methods' scalar arguments (an int, float or numpy scalar, as the docstring
#: says): each method checks and converts its arguments itself, naming a bad one in a
#: ConfigError, so they are not typed narrowly - a compiled build would reject, say, a float
#: prompt length or a numpy integer with a bare TypeError before that check.
Scalar = Any

#: Time constant of the prompt-token arrival-rate average used by the estimates, seconds.
RATE_TAU_S: Final = 60.0
#: Output length assumed by the estimates before any request has completed, tokens.
DEFAULT_MEAN_OUTPUT_TOKENS: Final = 128.0


def _as_int(field: str, value: Any, lo: int, hi: int | None = None) -> int:
    """Validate an integer in [lo, hi] (hi inclusive)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, f"expected an integer, got {value!r}") from None
    if f != f or not math.isfinite(f) or f != int(f):
        raise ConfigError(field, f"expected a finite integer, got {value!r}")
    v = int(f)
    if v < lo or (hi is not None and v > hi):
        allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(field, f"out of range: {v}", allowed=allowed)
    return v


@mypyc_attr(allow_interpreted_subclasses=True)
class Simulator(CopyableState):
    """Discrete-event simulator of vLLM-like engines in geo-distributed datacenters.

    Args:
        topology: regions and datacenters (:class:`~carbon_gym.topology.Topology`).
        model, gpu: :class:`~carbon_gym.specs.ModelSpec` / :class:`~carbon_gym.specs.GpuSpec`.
        latency: iteration latency model (for this model, GPU and ``engine.tp``).
        power: per-GPU power model.
        network: one-way delays (regions x datacenters).
        carbon: carbon intensity trace holding every datacenter's zone.
        engine: engine settings shared by all engines.
        carbon_offset_s: carbon-trace time of simulation time 0, seconds.
        dispatcher: intra-datacenter dispatcher name (see :mod:`carbon_gym.sim.dispatch`).
        step_mode: run every iteration as its own event (slow reference; same results).
            Prefix caching is ``engine.prefix_caching`` (requests carry ``prefix_hashes``, see
            :meth:`submit` and :mod:`carbon_gym.sim.prefix_cache`).
        power_states: capacity states of ``gpu`` (the power file's ``[states]``), or None.
        gpus: :class:`~carbon_gym.sim.config.GpuModels` of the other GPU types datacenters name
            (``DatacenterSpec.gpu``), by name: each datacenter runs its GPU's latency and power
            models, KV capacity and capacity states (heterogeneous topologies).

    Request ids are 0, 1, 2, ... in submission order, per simulator.
    """

    def __init__(
        self,
        topology: Topology,
        model: ModelSpec,
        gpu: GpuSpec,
        latency: IterationLatencyModel,
        power: PowerModel,
        network: Network,
        carbon: CarbonTrace,
        *,
        engine: EngineConfig = EngineConfig(),
        carbon_offset_s: float = 0.0,
        dispatcher: str = "least_work",
        step_mode: bool = False,
        power_states: PowerStates | None = None,
        gpus: dict[str, Any] | None = None,
        _shared: Any = None,
    ) -> None:
        # ``_shared`` (internal, set by :meth:`fresh`): the immutable tables of a simulator built
        # from the same arguments - ({GPU: EngineModels}, per-datacenter ZoneClocks) - reused as they are
        if not isinstance(engine, EngineConfig):
            raise ConfigError("engine", f"expected an EngineConfig, got {type(engine).__name__}")
        engine.validate()
        score_fn = get_dispatcher(dispatcher)
        off = float(carbon_offset_s)
        if not math.isfinite(off) or off < 0:
            raise ConfigError("carbon_offset_s", f"must be finite and >= 0, got {carbon_offset_s!r}")
        tp = engine.tp
        for i, d in enumerate(topology.datacenters):
            if d.gpus_per_node % tp:
                divisors = [k for k in range(1, d.gpus_per_node + 1) if d.gpus_per_node % k == 0]
                raise ConfigError(
                    "engine.tp", f"tp={tp} does not divide the {d.gpus_per_node} GPUs per node of datacenter "
                    f"{i} ({d.name})", allowed=divisors,
                )
        if getattr(topology, "gpu", gpu.name) != gpu.name:
            raise ConfigError("gpu", f"topology uses {topology.gpu!r} but the GPU spec is {gpu.name!r}", allowed=[topology.gpu])
        # every GPU type in use: (spec, latency, power, states), the simulation's own first
        types: dict[str, tuple] = {gpu.name: (gpu, latency, power, power_states)}
        for i, d in enumerate(topology.datacenters):
            g = d.gpu or gpu.name
            if g not in types:
                if gpus is None or g not in gpus:
                    raise ConfigError(f"topology.datacenters[{i}].gpu", f"no models for GPU {g!r} of datacenter "
                                      f"{d.name}: pass them in Simulator(..., gpus={{name: GpuModels}})",
                                      allowed=[gpu.name, *(gpus or {})])
                m = gpus[g]
                types[g] = (m.spec, m.latency, m.power, m.states)
        blocks: dict[str, int] = {g: self._kv_blocks(t[0], model, engine) for g, t in types.items()}
        D = topology.n_datacenters
        R = topology.n_regions
        ow = np.asarray(network.one_way_s)
        if ow.shape != (R, D):
            raise ConfigError("network.one_way_s", f"shape {ow.shape} does not match (regions, datacenters) = {(R, D)}")
        zones = [carbon.zone_index(d.zone) for d in topology.datacenters]

        self.topology = topology
        self.model = model
        self.gpu = gpu
        self.latency = latency
        self.power = power
        self.network = network
        self.carbon = carbon
        self.engine_config = engine
        self.carbon_offset_s = off
        self.dispatcher = dispatcher
        self.step_mode = bool(step_mode)
        self.power_states = power_states
        self.kv_blocks_per_engine = blocks[gpu.name]
        self.now_s = 0.0
        self._heap = EventQueue()
        self._rows: list[RequestState] = []  # completed requests not yet popped (pop_completed)
        self._ctor: tuple[tuple[Any, ...], dict[str, Any]] = ((topology, model, gpu, latency, power, network, carbon),
                      dict(engine=engine, carbon_offset_s=carbon_offset_s, dispatcher=dispatcher, step_mode=step_mode,
                           power_states=power_states, gpus=gpus))
        by_gpu: dict[str, EngineModels] = (
            {g: EngineModels(t[1], t[2], tp, t[3]) for g, t in types.items()} if _shared is None else _shared[0])
        self._models_by_gpu = by_gpu
        self._models = by_gpu[gpu.name]
        clocks = [None] * D if _shared is None else _shared[1]
        self._one_way = [[float(x) for x in row] for row in ow]
        self._bytes_per_token_s = float(network.bytes_per_token) / float(network.bandwidth_bytes_per_s)
        self.datacenters = [
            Datacenter(
                i, d, zones[i], carbon, off, engine, blocks[d.gpu or gpu.name], by_gpu[d.gpu or gpu.name],
                float(types[d.gpu or gpu.name][2].host_w), score_fn,
                self.step_mode, self._heap, self._rows, clocks[i],
            )
            for i, d in enumerate(topology.datacenters)
        ]
        prefix_weight = get_prefix_weight(dispatcher) if engine.prefix_caching else 0.0
        for center in self.datacenters:
            center.prefix_weight = prefix_weight
        self._in_transit: dict[int, RequestState] = {}
        self._next_id = 0
        self._aborted = 0
        self._out_sum = 0
        self._out_n = 0
        self.events_processed = 0

    def fresh(self) -> Simulator:
        """A new simulator built from the same arguments as this one, at time 0 with nothing
        submitted (faults applied to this one - outages, link delays, drains - are not carried
        over). It shares this simulator's immutable tables (zone carbon clocks, latency / power
        caches), so it is much cheaper to build than a new :class:`Simulator`: use it to start
        another episode of the same world."""
        args, kwargs = self._ctor
        return Simulator(*args, **kwargs, _shared=(self._models_by_gpu, [dc.clock for dc in self.datacenters]))

    @staticmethod
    def _kv_blocks(gpu: Any, model: Any, engine: EngineConfig) -> int:
        """KV blocks of one engine of ``engine.tp`` x ``gpu`` serving ``model`` (ConfigError if none fit)."""
        tp = engine.tp
        kv_budget = tp * gpu.memory_bytes * engine.gpu_memory_utilization - model.weight_bytes
        block_bytes = engine.block_tokens * model.kv_bytes_per_token
        total_blocks = int(math.floor(kv_budget / block_bytes)) if kv_budget > 0 else 0
        if total_blocks <= 0:
            raise ConfigError(
                "engine.gpu_memory_utilization", f"{model.name} ({model.weight_bytes / 1e9:.1f} GB of weights) does not fit in tp={tp} x "
                f"{gpu.name} at gpu_memory_utilization={engine.gpu_memory_utilization} (no room for KV cache)",
                allowed="a larger engine.tp, GPU or gpu_memory_utilization",
            )
        if total_blocks * engine.block_tokens < engine.max_model_len:
            raise ConfigError(
                "engine.max_model_len",
                f"{engine.max_model_len} tokens exceed one engine's KV cache ({total_blocks * engine.block_tokens} "
                f"tokens, {gpu.name})", allowed=f"<= {total_blocks * engine.block_tokens}",
            )
        return total_blocks

    # ------------------------------------------------------------------ properties
    @property
    def n_datacenters(self) -> int:
        """Number of datacenters."""
        return len(self.datacenters)

    @property
    def n_regions(self) -> int:
        """Number of origin regions."""
        return self.topology.n_regions

    # ------------------------------------------------------------------ submission
    def submit(self, origin: Scalar, arrival_s: Scalar, prompt_tokens: Scalar, output_tokens: Scalar, datacenter: Scalar,
               prefix_hashes: Any = None) -> int:
        """Send one request from ``origin`` to ``datacenter`` now; return its id.

        ``arrival_s`` (<= ``now_s``) is when the client issued it; ``output_tokens`` is the true
        output length (hidden from schedulers, used only to end the request). ``prefix_hashes``:
        None, or one integer id in [0, 2**61) per consecutive ``engine.prefix_block_tokens``-token
        block of the prompt (at most ``ceil(prompt_tokens / prefix_block_tokens)``; Mooncake's
        ``hash_ids``): equal ids mean reusable KV; used when ``engine.prefix_caching`` is on.
        """
        R, D = self.topology.n_regions, len(self.datacenters)
        o = _as_int("origin", origin, 0, R - 1)
        d = _as_int("datacenter", datacenter, 0, D - 1)
        p = _as_int("prompt_tokens", prompt_tokens, 1)
        q = _as_int("output_tokens", output_tokens, 1)
        try:
            a = float(arrival_s)
        except (TypeError, ValueError):
            a = math.nan
        if not math.isfinite(a) or a < 0:
            raise ConfigError("arrival_s", f"must be finite and >= 0, got {arrival_s!r}")
        self._check_request(a, p, q, d)
        keys = self._prefix_keys(prefix_hashes, p)
        rid = self._submit(o, a, p, q, d)
        attach_prefix(self._in_transit, rid, None if prefix_hashes is None else [prefix_hashes], [keys])
        return rid

    def _prefix_keys(self, hashes: Any, p: int) -> tuple[Key, ...] | None:
        """Validated ``prefix_hashes`` of a ``p``-token prompt -> its chained keys (or None)."""
        cfg = self.engine_config
        return prefix_keys(hashes, p, cfg.prefix_block_tokens, cfg.prefix_caching)

    def _batch_keys(self, hashes: Any, prompts: list[int]) -> list[tuple[Key, ...] | None] | None:
        cfg = self.engine_config
        return batch_prefix_keys(hashes, prompts, cfg.prefix_block_tokens, cfg.prefix_caching)

    def _check_request(self, a: float, p: int, q: int, d: int, index: str = "") -> None:
        """Checks shared by submit and submit_batch (``index`` = "[i]" names the batch row)."""
        if a > self.now_s:
            raise ConfigError(f"arrival_s{index}", f"{a} is after now_s={self.now_s}; advance the simulator first",
                              allowed=f"<= {self.now_s}")
        mml = self.engine_config.max_model_len
        if p + q > mml:
            raise ConfigError(f"prompt_tokens{index}", f"prompt + output = {p + q} exceeds engine.max_model_len={mml}",
                              allowed=f"prompt_tokens + output_tokens <= {mml}")
        if not self.datacenters[d].up:
            raise ConfigError("datacenters" + index if index else "datacenter",
                              f"datacenter {d} ({self.datacenters[d].name}) is down",
                              allowed=[i for i, x in enumerate(self.datacenters) if x.up])

    def _submit(self, o: int, a: float, p: int, q: int, d: int) -> int:
        rid = self._next_id
        self._next_id = rid + 1
        row = self._one_way[o]
        down = row[d]
        up = down + p * self._bytes_per_token_s
        now = self.now_s
        req = RequestState(rid, o, d, a, now, up, down, p, q)
        self.datacenters[d].in_transit += 1
        self._in_transit[rid] = req
        self._heap.push(req.dc_arrival_s, 0, req, 0)
        return rid

    def _submit_rows(self, origins: list[int], arrivals: list[float], prompts: list[int], outputs: list[int],
                     dc_index: list[int]) -> np.ndarray:
        """:meth:`_submit` of each validated request (its origin, arrival_s, prompt and output
        tokens and datacenter at the same position of the five lists), inlined; returns the ids
        (consecutive) as int64."""
        first = rid = self._next_id
        one_way = self._one_way
        per_token = self._bytes_per_token_s
        now = self.now_s
        dcs = self.datacenters
        in_transit = self._in_transit
        heap = self._heap
        for i in range(len(origins)):
            o = origins[i]
            d = dc_index[i]
            p = prompts[i]
            down = one_way[o][d]
            req = RequestState(rid, o, d, arrivals[i], now, down + p * per_token, down, p, outputs[i])
            dcs[d].in_transit += 1
            in_transit[rid] = req
            heap.push(req.dc_arrival_s, 0, req, 0)
            rid += 1
        self._next_id = rid
        return np.arange(first, rid, dtype=np.int64)

    def submit_batch(self, origins: Any, arrival_s: Any, prompt_tokens: Any, output_tokens: Any,  # noqa: C901
                     datacenters: Any, prefix_hashes: Any = None) -> np.ndarray:
        """Submit several requests now (arrays of equal length); return their ids (int64).
        ``prefix_hashes``: None, or one entry per request, each None or its block ids (:meth:`submit`)."""
        try:
            n_small = len(origins)
        except TypeError:
            n_small = -1
        if 0 <= n_small <= 16:
            # small batches: scalar validation is cheaper than a dozen numpy reductions
            names = ("origins", "arrival_s", "prompt_tokens", "output_tokens", "datacenters")
            cols = []
            for k, x in zip(names, (origins, arrival_s, prompt_tokens, output_tokens, datacenters)):
                c = x if isinstance(x, np.ndarray) else np.asarray(x)
                if c.ndim != 1 or c.shape[0] != n_small:
                    raise ConfigError(k, f"must be 1-D arrays of the same length ({n_small}), got shape {c.shape}")
                cols.append(c.tolist())
            R, D = self.topology.n_regions, len(self.datacenters)
            now = self.now_s
            mml = self.engine_config.max_model_len
            dcs = self.datacenters
            ro: list[int] = []
            ra: list[float] = []
            rp: list[int] = []
            rq: list[int] = []
            rd: list[int] = []
            for i, (o, a, p, q, d) in enumerate(zip(*cols)):
                if not (type(o) is int and 0 <= o < R):
                    o = _as_int(f"origins[{i}]", o, 0, R - 1)
                if not (type(d) is int and 0 <= d < D):
                    d = _as_int(f"datacenters[{i}]", d, 0, D - 1)
                if not (type(p) is int and p >= 1):
                    p = _as_int(f"prompt_tokens[{i}]", p, 1)
                if not (type(q) is int and q >= 1):
                    q = _as_int(f"output_tokens[{i}]", q, 1)
                if type(a) is not float:
                    try:
                        a = float(a)
                    except (TypeError, ValueError):
                        a = math.nan
                if not (0.0 <= a <= now):  # NaN, infinite, negative or after now: say which
                    if not math.isfinite(a) or a < 0:
                        raise ConfigError(f"arrival_s[{i}]", f"must be finite, >= 0 and <= now_s={now}, got {a!r}")
                    self._check_request(a, p, q, d, f"[{i}]")
                if p + q > mml or not dcs[d].up:
                    self._check_request(a, p, q, d, f"[{i}]")
                ro.append(o)
                ra.append(a)
                rp.append(p)
                rq.append(q)
                rd.append(d)
            keys = self._batch_keys(prefix_hashes, rp)
            first = self._next_id
            ids = self._submit_rows(ro, ra, rp, rq, rd)
            attach_prefix(self._in_transit, first, prefix_hashes, keys)
            return ids
        arrs = {
            "origins": np.asarray(origins), "arrival_s": np.asarray(arrival_s, dtype=np.float64),
            "prompt_tokens": np.asarray(prompt_tokens), "output_tokens": np.asarray(output_tokens),
            "datacenters": np.asarray(datacenters),
        }
        n = arrs["origins"].shape[0] if arrs["origins"].ndim == 1 else -1
        for k, v in arrs.items():
            if v.ndim != 1 or v.shape[0] != n:
                raise ConfigError(k, f"must be 1-D arrays of the same length, got shape {v.shape}")
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        R, D = self.topology.n_regions, len(self.datacenters)
        ints = {}
        for k, lo, hi in (("origins", 0, R - 1), ("datacenters", 0, D - 1), ("prompt_tokens", 1, None),
                          ("output_tokens", 1, None)):
            v = arrs[k]
            if v.dtype.kind not in "iu":
                f = v.astype(np.float64)
                if not np.all(np.isfinite(f)) or np.any(f != np.round(f)):
                    bad = int(np.flatnonzero(~np.isfinite(f) | (f != np.round(f)))[0])
                    raise ConfigError(f"{k}[{bad}]", f"expected a finite integer, got {v[bad]!r}")
                v = f.astype(np.int64)
            v = v.astype(np.int64)
            badm = (v < lo) | ((v > hi) if hi is not None else False)
            if np.any(badm):
                bad = int(np.flatnonzero(badm)[0])
                allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
                raise ConfigError(f"{k}[{bad}]", f"out of range: {int(v[bad])}", allowed=allowed)
            ints[k] = v
        a = arrs["arrival_s"]
        badm = ~np.isfinite(a) | (a < 0) | (a > self.now_s)
        if np.any(badm):
            bad = int(np.flatnonzero(badm)[0])
            raise ConfigError(f"arrival_s[{bad}]", f"must be finite, >= 0 and <= now_s={self.now_s}, got {a[bad]!r}")
        mml = self.engine_config.max_model_len
        tot = ints["prompt_tokens"] + ints["output_tokens"]
        if np.any(tot > mml):
            bad = int(np.flatnonzero(tot > mml)[0])
            raise ConfigError(f"prompt_tokens[{bad}]", f"prompt + output = {int(tot[bad])} exceeds engine.max_model_len={mml}",
                              allowed=f"prompt_tokens + output_tokens <= {mml}")
        dc_index = ints["datacenters"]
        for d in np.unique(dc_index):
            if not self.datacenters[int(d)].up:
                raise ConfigError("datacenters", f"datacenter {int(d)} ({self.datacenters[int(d)].name}) is down",
                                  allowed=[i for i, x in enumerate(self.datacenters) if x.up])
        prompts = ints["prompt_tokens"].tolist()
        keys = self._batch_keys(prefix_hashes, prompts)
        first = self._next_id
        ids = self._submit_rows(ints["origins"].tolist(), a.tolist(), prompts, ints["output_tokens"].tolist(),
                                dc_index.tolist())
        attach_prefix(self._in_transit, first, prefix_hashes, keys)
        return ids

    # ------------------------------------------------------------------ time
    def advance_to(self, t_s: Scalar) -> None:
        """Process every event with time <= ``t_s``; then ``now_s = t_s``."""
        t = float(t_s)
        if not (t == t) or t < self.now_s:
            raise ConfigError("t_s", f"must be >= now_s={self.now_s}, got {t_s!r}")
        heap = self._heap
        evs = heap.heap
        dcs = self.datacenters
        in_transit = self._in_transit
        n_ev = 0
        while evs and evs[0].t <= t:
            ev = heap.pop()
            time = ev.t
            prio = ev.key >> PRIO_SHIFT
            item = ev.item
            ver = ev.tag
            heap.recycle(ev)
            n_ev += 1
            if prio == 1:
                e = cast(Engine, item)
                if ver == e.version:  # not a stale entry
                    e.on_event(time)
                continue
            if prio:  # a capacity transition (carbon_gym.sim.capacity)
                tr: Any = item
                if ver == tr.version:
                    tr.on_event(time)
                continue
            obj = cast(RequestState, item)
            if not obj.alive:
                continue
            del in_transit[obj.rid]
            dc = dcs[obj.dc]
            dc.in_transit -= 1
            # prompt-token arrival rate (EWMA), for the estimates
            dt = time - dc.tok_rate_t
            if dt > 0.0:
                decay = exp(-dt / RATE_TAU_S)
                dc.tok_rate_sum *= decay
                dc.req_rate_sum *= decay
                dc.tok_rate_t = time
            dc.tok_rate_sum += obj.prompt_tokens
            dc.req_rate_sum += 1.0
            if dc.prefix_weight > 0.0 and obj.prefix_keys is not None:
                eng = dc.pick_cached(obj)  # cache-aware dispatch (carbon_gym.sim.dispatch)
            else:
                eng = dc.pick()
            if eng.cap_state:  # no engine takes work: one wakes for it (carbon_gym.sim.capacity)
                cap: Any = dc.capacity
                eng = cap.engine_for_arrival(time)
            if eng.state == IDLE and eng.cap_state <= 1 and (not evs or evs[0].t > time):
                # its wake-up event would be the next one popped: run it now (counted as one)
                n_ev += 1
                eng.enqueue_and_plan(obj, time)
            else:
                eng.enqueue(obj, time)
        self.events_processed += n_ev
        self.now_s = t

    def run_until_idle(self, max_time_s: Scalar = math.inf) -> float:
        """Process events until none is left (or the next is after ``max_time_s``, then advance
        to ``max_time_s``); return the new ``now_s``."""
        while True:
            t = self.next_event_s()
            if t == math.inf or t > max_time_s:
                break
            self.advance_to(max(t, self.now_s))
        if max_time_s < math.inf and max_time_s > self.now_s:
            self.advance_to(max_time_s)
        return self.now_s

    def next_event_s(self) -> float:
        """Time of the next pending event (``inf`` if none); stale entries are dropped."""
        heap = self._heap
        evs = heap.heap
        while evs:
            ev = evs[0]
            prio = ev.key >> PRIO_SHIFT
            obj: Any = ev.item
            if (prio and ev.tag != obj.version) or (not prio and not obj.alive):
                heap.recycle(heap.pop())
                continue
            return ev.t
        return math.inf

    # ------------------------------------------------------------------ results
    def pop_completed(self) -> RequestRecords:
        """Records of the requests completed since the last call (then forgotten here)."""
        reqs = self._rows[:]
        self._rows.clear()
        if not reqs:
            return RequestRecords.empty()
        out = 0
        for r in reqs:
            out += r.output_tokens
        self._out_sum += out
        self._out_n += len(reqs)
        return RequestRecords.from_requests(reqs, record_column)

    def totals(self) -> SimTotals:
        """Cumulative energy/carbon per datacenter and request counts, up to ``now_s``."""
        now = self.now_s
        gl, hl, pl, cl, il = [], [], [], [], []
        sg, sh = [], []
        tok: list[tuple[int, int, int, int]] = []
        completed = preemptions = iterations = 0
        for dc in self.datacenters:
            dc.flush(now)
            gl.append(dc.gpu_j)
            hl.append(dc.host_j)
            sg.append(list(dc.state_gpu_j))
            sh.append(list(dc.state_host_j) if dc.capacity is not None else [dc.host_j, 0.0, 0.0, 0.0])
            pl.append(dc.pue)
            cl.append(dc.carbon_g)
            il.append(dc.idle_j)
            completed += dc.completed
            preemptions += dc.preemptions
            iterations += dc.iterations
            ev = 0
            for e in dc.engines:
                if e.cache is not None:
                    ev += e.cache.evictions
            tok.append((dc.prompt_tokens, dc.cached_prompt_tokens, dc.prefill_saved_tokens, ev))
            for e in dc.engines:
                if e.state == RUN:
                    iterations += e.run_iterations_done(now)
        g = np.array(gl)
        h = np.array(hl)
        return SimTotals(
            time_s=now,
            it_energy_j=g + h,
            facility_energy_j=(g + h) * np.array(pl),
            carbon_g=np.array(cl),
            idle_energy_j=np.array(il),
            host_energy_j=h,
            gpu_energy_j=g,
            submitted=self._next_id,
            completed=completed,
            in_flight=self._next_id - completed - self._aborted,
            preemptions=preemptions,
            aborted=self._aborted,
            iterations=iterations,
            gpu_state_energy_j=np.array(sg, dtype=np.float64).reshape(-1, 5).T.copy(),
            host_state_energy_j=np.array(sh, dtype=np.float64).reshape(-1, 4).T.copy(),
            prompt_tokens=np.array([x[0] for x in tok], dtype=np.int64),
            cached_prompt_tokens=np.array([x[1] for x in tok], dtype=np.int64),
            prefill_saved_tokens=np.array([x[2] for x in tok], dtype=np.int64),
            prefix_evictions=np.array([x[3] for x in tok], dtype=np.int64),
        )

    def cached_prefix_tokens(self, prefix_hashes: Any, prompt_tokens: Scalar) -> np.ndarray:
        """Prompt tokens of a request (its block ids ``prefix_hashes``, as :meth:`submit` takes
        them, and its length) that the prefix cache of the best engine of each datacenter holds
        now: int64 array (D,), 0 where prefix caching is off, nothing matches, the datacenter is
        down or none of its engines takes work. Whole prefix blocks, at most the hit its admission
        could get (at least one prompt token computed); read from the caches as last settled
        (:mod:`carbon_gym.sim.prefix_cache`)."""
        p = _as_int("prompt_tokens", prompt_tokens, 1)
        out = np.zeros(len(self.datacenters), dtype=np.int64)
        keys = self._prefix_keys(prefix_hashes, p)
        if keys is not None:
            P = self.engine_config.prefix_block_tokens
            n_max = min(len(keys), (p - 1) // P)
            for d, dc in enumerate(self.datacenters):
                out[d] = dc.cached_prefix_blocks(keys, n_max) * P
        return out

    def cached_prefix_tokens_batch(self, prefix_hashes: Any, prompt_tokens: Any) -> np.ndarray:
        """:meth:`cached_prefix_tokens` of R requests (a sequence of R block-id sequences or
        None, and R prompt lengths): int64 array (R, D)."""
        p = np.asarray(prompt_tokens).reshape(-1)
        R = int(p.shape[0])
        out = np.zeros((R, len(self.datacenters)), dtype=np.int64)
        if prefix_hashes is None:
            return out
        if len(prefix_hashes) != R:
            raise ConfigError("prefix_hashes", f"must have one entry per request ({R}), got {len(prefix_hashes)}")
        for i in range(R):
            if prefix_hashes[i] is not None:
                out[i] = self.cached_prefix_tokens(prefix_hashes[i], p[i])
        return out

    def carbon_energy_totals(self) -> tuple[float, float]:
        """(carbon g, facility energy J) of all datacenters from time 0 to ``now_s``: the same
        floats as ``np.sum(totals().carbon_g)`` and ``np.sum(totals().facility_energy_j)``,
        without the rest of :meth:`totals` (cheap enough to call every step)."""
        now = self.now_s
        cl, fl = [], []
        for dc in self.datacenters:
            dc.flush(now)
            cl.append(dc.carbon_g)
            fl.append((dc.gpu_j + dc.host_j) * dc.pue)
        if 0 < len(cl) < 8:
            # below 8 values numpy's sum adds left to right: the same floats, without two arrays
            c, e = cl[0], fl[0]
            for i in range(1, len(cl)):
                c += cl[i]
                e += fl[i]
            return c, e
        add = np.add.reduce  # what np.sum calls, without its wrapper
        return float(add(np.array(cl))), float(add(np.array(fl)))

    # ------------------------------------------------------------------ faults
    def set_datacenter_up(self, dc: Scalar, up: Scalar) -> AbortedRequests:
        """Take datacenter ``dc`` down (its queued, running and in-transit requests are aborted,
        their progress lost, and returned so the caller can resubmit them) or bring it back up
        (idle, empty). A datacenter that is down draws no power and refuses submissions."""
        d = _as_int("dc", dc, 0, len(self.datacenters) - 1)
        center = self.datacenters[d]
        now = self.now_s
        reqs = center.set_up(now, bool(up))
        if not up:
            for rid, r in list(self._in_transit.items()):
                if r.dc == d:
                    r.alive = False
                    del self._in_transit[rid]
                    reqs.append(r)
            center.in_transit = 0
        return self._abort(reqs, d)

    def abort_in_transit(self, origin: Scalar, dc: Scalar) -> AbortedRequests:
        """A cut link: the requests from region ``origin`` still travelling to datacenter ``dc``
        (sent, not yet arrived) are lost and returned so the caller can resubmit them (they get
        new ids when it does). They did no work, so their energy and carbon are 0. Requests
        already at the datacenter are unaffected (their responses are assumed to find another
        route: the downlink delay is part of their record)."""
        o = _as_int("origin", origin, 0, self.topology.n_regions - 1)
        d = _as_int("dc", dc, 0, len(self.datacenters) - 1)
        reqs = []
        for rid, r in list(self._in_transit.items()):
            if r.dc == d and r.origin == o:
                r.alive = False
                del self._in_transit[rid]
                reqs.append(r)
        self.datacenters[d].in_transit -= len(reqs)
        return self._abort(reqs, d)

    def _abort(self, reqs: list[RequestState], d: int) -> AbortedRequests:
        """Count ``reqs`` (taken from datacenter ``d``) as aborted; return them by request id."""
        reqs.sort(key=lambda r: r.rid)
        self._aborted += len(reqs)
        return AbortedRequests(
            request_id=np.array([r.rid for r in reqs], dtype=np.int64),
            origin=np.array([r.origin for r in reqs], dtype=np.int64),
            arrival_s=np.array([r.arrival_s for r in reqs], dtype=np.float64),
            prompt_tokens=np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
            output_tokens=np.array([r.output_tokens for r in reqs], dtype=np.int64),
            datacenter=np.full(len(reqs), d, dtype=np.int64),
            preemptions=np.array([r.preemptions for r in reqs], dtype=np.int64),
            energy_j=np.array([r.energy_j for r in reqs], dtype=np.float64),
            carbon_g=np.array([r.carbon_g for r in reqs], dtype=np.float64),
            prefix_hashes=AbortedRequests.hashes_of([r.prefix_hashes for r in reqs]),
        )

    def work_left(self) -> dict[str, np.ndarray]:
        """What every request placed and not finished has not computed yet, an upper count
        (:meth:`Engine.work_left <carbon_gym.sim.engine.Engine.work_left>`; a request still
        travelling to its datacenter: all of it), by request id: ``request_id``, ``prompt_tokens``,
        ``output_tokens``, ``prompt_left`` (prompt positions), ``decode_left``
        (decode iterations after the first token), ``first_token_left`` (1 before the first
        token). A measurement window subtracts it from the bound at its end
        (:meth:`carbon_gym.episode.EpisodeTally.window_left`)."""
        rows: list[tuple[RequestState, int, int]] = []
        for dc in self.datacenters:
            for e in dc.engines:
                rows.extend(e.work_left())
        for r in self._in_transit.values():
            rows.append((r, r.prompt_tokens, max(0, r.output_tokens - 1)))
        rows.sort(key=lambda x: x[0].rid)
        reqs = [x[0] for x in rows]
        return {
            "request_id": np.array([r.rid for r in reqs], dtype=np.int64),
            "prompt_tokens": np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
            "output_tokens": np.array([r.output_tokens for r in reqs], dtype=np.int64),
            "prompt_left": np.array([x[1] for x in rows], dtype=np.int64),
            "decode_left": np.array([x[2] for x in rows], dtype=np.int64),
            "first_token_left": np.array([1 if x[0].generated == 0 else 0 for x in rows], dtype=np.int64),
        }

    def set_link_delay(self, origin: Scalar, dc: Scalar, one_way_s: Scalar) -> None:
        """Set the one-way network delay from region ``origin`` to datacenter ``dc`` (faults:
        link degradation), seconds. Applies to requests submitted from now on (requests already
        sent keep the delays they left with); the estimates use it at once."""
        o = _as_int("origin", origin, 0, self.topology.n_regions - 1)
        d = _as_int("dc", dc, 0, len(self.datacenters) - 1)
        try:
            v = float(one_way_s)
        except (TypeError, ValueError):
            v = math.nan
        if not math.isfinite(v) or v < 0:
            raise ConfigError("one_way_s", f"must be finite and >= 0 seconds, got {one_way_s!r}")
        ow = np.array(self.network.one_way_s, dtype=np.float64)
        ow[o, d] = v
        self.network = dataclasses.replace(self.network, one_way_s=ow)
        self._one_way[o][d] = v

    def set_capacity(self, dc: Scalar, awake_engines: Scalar, servers_on: Scalar | None = None) -> None:
        """Capacity control (:mod:`carbon_gym.sim.capacity`): keep ``awake_engines`` engines of
        datacenter ``dc`` awake and ``servers_on`` of its nodes powered (default: the nodes the
        awake engines need; never fewer), from now on. Engines beyond the target drain and fall
        asleep, nodes beyond it whose engines all sleep power off; engines below it wake and nodes
        boot. Needs the power model's capacity states (``power_states``)."""
        d = _as_int("dc", dc, 0, len(self.datacenters) - 1)
        center = self.datacenters[d]
        a = _as_int("awake_engines", awake_engines, 0, center.n_engines)
        cap = self._capacity(center)
        s = cap.n_nodes if servers_on is None and a == center.n_engines else (
            -(-a // cap.epn) if servers_on is None else _as_int("servers_on", servers_on, 0, cap.n_nodes))
        center.flush(self.now_s)
        cap.set_targets(self.now_s, a, s)

    def capacity_counts(self) -> dict[str, int]:
        """Capacity events so far, summed over datacenters: ``engine_wakes`` (sleeping engines
        woken), ``server_boots``, ``engine_sleeps`` (engines that fell asleep) and
        ``capacity_waits`` (requests that reached a datacenter with no engine taking work and
        waited for one to wake or boot)."""
        out = {"engine_wakes": 0, "server_boots": 0, "engine_sleeps": 0, "capacity_waits": 0}
        for dc in self.datacenters:
            cap = dc.capacity
            if cap is not None:
                out["engine_wakes"] += cap.wakes
                out["server_boots"] += cap.boots
                out["engine_sleeps"] += cap.sleeps
                out["capacity_waits"] += cap.waits
        return out

    def _capacity(self, center: Datacenter) -> Any:
        """The datacenter's CapacityControl (created at its first capacity decision)."""
        if center.capacity is None:
            from .capacity import CapacityControl

            center.flush(self.now_s)  # (every joule so far was an awake engine's or a node on's)

            st = center.models.states  # (its GPU's)
            if st is None:
                raise ConfigError("capacity", f"datacenter {center.name}'s GPU has no power_states (the power file's "
                                  "[states] table): engines cannot sleep",
                                  allowed="Simulator(..., power_states=PowerStates(...)) / GpuModels(states=...)")
            tp = self.engine_config.tp
            gb = self.model.weight_bytes / tp / 1e9  # weights per GPU
            center.capacity = CapacityControl(center, center.spec.gpus_per_node // tp, st.fall_asleep_s(gb, tp),
                                              st.wake_s(gb, tp), st.boot_s(gb))
        return center.capacity

    def set_engines_draining(self, dc: Scalar, n_engines: Scalar, power_off: Scalar = True) -> None:
        """Drain the last ``n_engines`` engines of datacenter ``dc`` for maintenance (0 = none).

        Draining engines take no new requests (their queued requests move to the other engines
        of the datacenter), finish their running batch, then draw 0 W (``power_off``) or idle
        power. Calling it again with another count changes the set (engines leaving the set
        return to service, idle). See :meth:`Datacenter.set_draining`.
        """
        d = _as_int("dc", dc, 0, len(self.datacenters) - 1)
        center = self.datacenters[d]
        n = _as_int("n_engines", n_engines, 0, center.n_engines)
        center.set_draining(self.now_s, n, bool(power_off))

    def energy_attribution(self) -> EnergyAttribution:
        """How the active energy of every datacenter splits at ``now_s`` (arrays of length D).

        ``active_energy_j = (gpu - idle energy) x PUE`` equals, up to rounding, the per-request
        shares of completed requests (popped records) + ``aborted`` requests' shares (returned
        by :meth:`set_datacenter_up`) + ``in_flight_share_j`` + ``in_progress_j`` (iterations
        under way, not yet split) + ``aborted_partial_j`` (iterations cut by outages); the same
        for carbon with ``active_carbon_g``.
        """
        now = self.now_s
        D = len(self.datacenters)
        out = {k: np.zeros(D) for k in ("ae", "ac", "fe", "fc", "pe", "pc", "xe", "xc")}
        n_in = np.zeros(D, dtype=np.int64)
        for i, dc in enumerate(self.datacenters):
            dc.flush(now)
            out["ae"][i] = (dc.gpu_j - dc.idle_j - sum(dc.state_gpu_j)) * dc.pue
            out["ac"][i] = dc.active_carbon_g
            out["xe"][i] = dc.aborted_active_j
            out["xc"][i] = dc.aborted_active_carbon_g
            if not dc.up:
                continue
            for e in dc.engines:
                fe, fc, n = e.request_shares()
                pe, pc = e.in_progress_share(now)
                out["fe"][i] += fe
                out["fc"][i] += fc
                out["pe"][i] += pe
                out["pc"][i] += pc
                n_in[i] += n
        return EnergyAttribution(
            time_s=now, active_energy_j=out["ae"], active_carbon_g=out["ac"], in_flight_share_j=out["fe"],
            in_flight_share_carbon_g=out["fc"], in_progress_j=out["pe"], in_progress_carbon_g=out["pc"],
            aborted_partial_j=out["xe"], aborted_partial_carbon_g=out["xc"], in_engines=n_in,
        )

    # ------------------------------------------------------------------ snapshot / estimates
    def _engine_estimates(self, dc: Datacenter) -> tuple:
        """(queue_wait_s, prefill_per_token_s, tpot_s, slope_s, iteration_s, chunk_tokens,
        deficit_blocks_without_new, release_blocks_per_s) for the engine the dispatcher picks."""
        e = dc.pick()
        cfg = self.engine_config
        n = len(e.running)
        used = e.view_used_blocks
        key = (n, used)
        if key == dc.est_key:  # the latency-model part depends on (n, used) only
            mean_ctx, t_dec_new, t_dec_now, c, f_iter, per_tok, slope_num = dc.est_val
        else:
            models = dc.models
            bt = cfg.block_tokens
            mean_ctx = used * bt / n if n else 0.0
            ctx_sum = n * mean_ctx
            coeff = models.decode_ctx_coeff_s
            t_dec_new = models.decode_fixed_s(n + 1) + coeff * (n + 1) * (mean_ctx + 1.0)
            t_dec_now = models.decode_fixed_s(n) + coeff * ctx_sum if n else 0.0
            c = max(cfg.max_num_batched_tokens - n, 1) if cfg.chunked_prefill else cfg.max_num_batched_tokens
            f_iter = models.iteration_time_s(1, 1.0, n, ctx_sum, n + 1)
            if c > 1:
                full = models.iteration_time_s(c, c * (c + 1) / 2.0, n, ctx_sum, n + 1)
                per_tok = max((full - f_iter) / (c - 1), 0.0)
            else:
                per_tok = f_iter
            slope_num = models.decode_fixed_s(n + 2) - models.decode_fixed_s(n + 1) + coeff * (mean_ctx + 1.0)
            dc.est_key = key
            dc.est_val = (mean_ctx, t_dec_new, t_dec_now, c, f_iter, per_tok, slope_num)
        queued = e.pending_tokens
        if e.prefilling:
            queued += sum(r.prefill_len - r.prefilled for r in e.prefilling)
        wait = queued * per_tok + math.ceil(queued / c) * f_iter
        mean_out = self._out_sum / self._out_n if self._out_n else DEFAULT_MEAN_OUTPUT_TOKENS
        t_dec_ref = t_dec_now if n else t_dec_new
        release = max(used, 1) / (mean_out * t_dec_ref)
        deficit = e.waiting_blocks - e.view_free_blocks
        excess = n + len(e.waiting) + 1 - cfg.max_num_seqs
        seq_wait = excess * mean_out * t_dec_ref / max(n, 1) if excess > 0 else 0.0
        rate = dc.token_rate(self.now_s, RATE_TAU_S) / dc.n_engines
        rho = min(rate * per_tok, 0.9)
        tpot = t_dec_new / (1.0 - rho)
        slope = slope_num / (1.0 - rho)
        return wait, per_tok, tpot, slope, f_iter, c, deficit, release, seq_wait

    def snapshot_array(self) -> np.ndarray:
        """The snapshot as one float64 array of shape (len(SNAPSHOT_ARRAY_ROWS), D): row i holds
        the :class:`ClusterSnapshot` field ``SNAPSHOT_ARRAY_ROWS[i]`` (counts are exact; ``up``
        is 1.0 / 0.0). Cheaper than :meth:`snapshot` when a caller wants the numbers as a block."""
        return np.array(self.snapshot_rows(), dtype=np.float64).T.copy()  # each row contiguous

    def snapshot_rows(self) -> list[tuple]:
        """The snapshot as Python numbers: one tuple per datacenter, in ``SNAPSHOT_ARRAY_ROWS``
        order (the :class:`ClusterSnapshot` field order; counts are ints; ``up`` is 1.0 / 0.0);
        the rows of :meth:`snapshot_array` transposed. A new state field is a new
        ``ClusterSnapshot`` field and its value here, at the same position."""
        now = self.now_s
        rows = []
        inf = math.inf
        tp = self.engine_config.tp
        gb = self.model.weight_bytes / tp / 1e9
        for dc in self.datacenters:
            st = dc.models.states
            wake_s = st.wake_s(gb, tp) if st is not None else 0.0
            kv = dc.engines[0].total_blocks if dc.engines else 0
            dc.flush(now)
            up = dc.up
            ne = dc.n_engines
            cc = dc.cap_counts
            cap = dc.capacity
            if up:
                wait, ppt, tpot, slope, f_iter, c, deficit, release, seq_wait = self._engine_estimates(dc)
                mem = deficit / release if deficit > 0 else 0.0
                wait += max(mem, seq_wait)
                if cap is not None and cc[0] + cc[1] < ne:
                    wait += cap.arrival_delay_s(now)
            else:
                wait = ppt = tpot = slope = f_iter = inf
                c = 0
            servers = dc.spec.nodes if cap is None else cap.n_nodes - cap.node_state.count(2)  # (2: off)
            # one float row per datacenter (the integer columns are exact in float64)
            rows.append((
                dc.intensity(now), dc.pue, dc.waiting + dc.in_transit, dc.running,
                sum(map(_VIEW_FREE, dc.engines)), ne * kv, dc.power_w(), cc[0] + cc[1] - dc.n_idle if up else 0, ne,
                wait, ppt, tpot, slope, 1.0 if up else 0.0, f_iter, c, dc.accepting_engines,
                cc[0], cc[4] + cc[6], cc[1] + cc[2] + cc[3], cc[5], servers, wake_s, dc.request_rate(now, RATE_TAU_S),
            ))
        return rows

    def snapshot(self) -> ClusterSnapshot:
        """Per-datacenter state and estimates now (see :class:`ClusterSnapshot`)."""
        return snapshot_from_array(self.now_s, self.snapshot_array())

    def estimate(self, prompt_tokens: Any, origins: Any) -> LatencyEstimates:
        """Latency estimates for R candidate requests (prompt lengths, origin regions) at every
        datacenter, as if each were sent now to the engine the dispatcher would pick."""
        p = np.asarray(prompt_tokens, dtype=np.float64).reshape(-1)
        o = np.asarray(origins, dtype=np.int64).reshape(-1)
        if p.shape != o.shape:
            raise ConfigError("origins", f"must have the same length as prompt_tokens ({p.shape[0]}), got {o.shape[0]}")
        if p.size and (not np.all(np.isfinite(p)) or np.any(p < 1)):
            raise ConfigError("prompt_tokens", "must be finite and >= 1")
        R = self.topology.n_regions
        if o.size and (np.any(o < 0) or np.any(o >= R)):
            raise ConfigError("origins", "out of range", allowed=f"0..{R - 1}")
        D = len(self.datacenters)
        bt = self.engine_config.block_tokens
        ow = self.network.one_way_s
        net = self.network.uplink_matrix_s(o, p) + ow[o]
        wait = np.full((p.size, D), np.inf)
        pre = np.full((p.size, D), np.inf)
        tpot = np.full((p.size, D), np.inf)
        new_blocks = np.ceil(p / bt)
        for d, dc in enumerate(self.datacenters):
            if not dc.up:
                continue
            w, ppt, tp, _, f_iter, c, deficit, release, seq_wait = self._engine_estimates(dc)
            deficit_r = deficit + new_blocks
            mem = np.maximum(deficit_r, 0.0) / release
            wait[:, d] = w + np.maximum(mem, seq_wait)
            if dc.capacity is not None:
                wait[:, d] += dc.capacity.arrival_delay_s(self.now_s)
            pre[:, d] = np.ceil(p / c) * f_iter + p * ppt
            tpot[:, d] = tp
        return LatencyEstimates(network_s=net, queue_wait_s=wait, prefill_s=pre, tpot_s=tpot, ttft_s=net + wait + pre)
