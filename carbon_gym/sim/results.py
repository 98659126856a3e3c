"""Result types of :class:`~carbon_gym.sim.simulator.Simulator` (frozen dataclasses of numpy arrays).

Kept out of :mod:`carbon_gym.sim.simulator`, which may be compiled (mypyc, ``setup.py``): results
stay plain dataclasses (copyable, picklable, ``dataclasses.replace``-able) whatever the build.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
import numpy as np

__all__ = ["ClusterSnapshot", "LatencyEstimates", "EnergyAttribution", "SimTotals", "SNAPSHOT_ARRAY_ROWS",
           "snapshot_from_array"]


def _state(unit: str, doc: str, kind: str = "float") -> dict[str, str]:
    """Metadata of a per-datacenter state field (array of length D): its unit, one-line doc and
    decoded type."""
    return {"unit": unit, "doc": doc, "kind": kind}


@dataclass(frozen=True)
class ClusterSnapshot:
    """State of every datacenter at ``time_s`` (arrays of length D unless noted).

    Engine-level quantities (``free_kv_blocks``, the estimates) use the state each engine
    *published* at the end of its last iteration that admitted, prefilled, preempted or
    completed something. Estimates describe a NEW request sent to the engine the dispatcher
    would pick now:

    - ``est_queue_wait_s``: prompt tokens queued ahead on that engine x ``est_prefill_s_per_token``
      + one ``est_iteration_s`` per chunk of ``est_prefill_chunk_tokens`` they need, plus, when
      the queued prompts' blocks exceed the free KV blocks (or the sequence limit is reached),
      the time for running requests to release enough: deficit / (blocks in use / (mean output
      tokens x decode iteration time)).
    - ``est_prefill_s_per_token``: added iteration time per prompt token in a chunk mixed with
      the running decodes; ``est_iteration_s``: time of an iteration with the running decodes and
      a 1-token chunk (the fixed cost per chunk); ``est_prefill_chunk_tokens``: tokens per chunk
      (budget minus running sequences).
    - ``est_tpot_s``: decode iteration time with the running batch + 1 at the batch's mean
      context, divided by ``1 - rho`` where ``rho`` = (prompt tokens per second arriving per
      engine, exponentially averaged over 60 s) x ``est_prefill_s_per_token`` (the share of time
      prefill chunks add to each iteration; capped at 0.9).
    - ``tpot_slope_s_per_seq``: added decode iteration time per extra sequence, same scaling.

    A datacenter that is down has ``up=False`` and infinite estimates. ``accepting_engines``
    (int): engines that take new requests (0 when down; engines drained for maintenance
    excluded). Field units and docs: ``dataclasses.fields(ClusterSnapshot)[i].metadata``.
    """

    time_s: float = field(metadata={"unit": "s", "doc": "simulated time of the snapshot"})
    carbon_g_per_kwh: np.ndarray = field(metadata=_state("g/kWh", "grid carbon intensity now"))
    pue: np.ndarray = field(metadata=_state("-", "power usage effectiveness (facility / IT power)"))
    queue_len: np.ndarray = field(metadata=_state("requests", "requests waiting in engine queues + in transit to the datacenter", "int"))
    running: np.ndarray = field(metadata=_state("sequences", "sequences in running batches", "int"))
    free_kv_blocks: np.ndarray = field(metadata=_state("blocks", "free KV blocks (published)", "int"))
    total_kv_blocks: np.ndarray = field(metadata=_state("blocks", "KV blocks of all engines", "int"))
    power_w: np.ndarray = field(metadata=_state("W", "facility power now"))
    busy_engines: np.ndarray = field(metadata=_state("engines", "engines with work", "int"))
    n_engines: np.ndarray = field(metadata=_state("engines", "engines serving the model", "int"))
    est_queue_wait_s: np.ndarray = field(metadata=_state("s", "estimated queueing wait of a new request"))
    est_prefill_s_per_token: np.ndarray = field(metadata=_state("s/token", "estimated marginal prefill time per prompt token"))
    est_tpot_s: np.ndarray = field(metadata=_state("s", "estimated per-token decode time of a new request"))
    tpot_slope_s_per_seq: np.ndarray = field(metadata=_state("s/sequence", "decode time added per extra sequence"))
    up: np.ndarray = field(metadata=_state("flag", "datacenter up", "bool"))
    est_iteration_s: np.ndarray = field(metadata=_state("s", "estimated fixed time of one prefill-chunk iteration"))
    est_prefill_chunk_tokens: np.ndarray = field(metadata=_state("tokens", "prompt tokens per prefill chunk", "int"))
    accepting_engines: np.ndarray = field(metadata=_state("engines", "engines taking new requests", "int"))
    awake_engines: np.ndarray = field(metadata=_state("engines", "engines awake and serving (capacity control)", "int"))
    waking_engines: np.ndarray = field(metadata=_state("engines", "engines waking or booting", "int"))
    sleeping_engines: np.ndarray = field(metadata=_state("engines", "engines draining to sleep, falling asleep or asleep", "int"))
    off_engines: np.ndarray = field(metadata=_state("engines", "engines on nodes that are off", "int"))
    servers_on: np.ndarray = field(metadata=_state("servers", "nodes powered (on, standby or booting)", "int"))
    wake_latency_s: np.ndarray = field(metadata=_state("s", "time a sleeping engine takes to wake"))
    arrival_rate_per_s: np.ndarray = field(metadata=_state("requests/s", "requests arriving at the datacenter per second (EWMA, 60 s)"))


#: Row names of ``Simulator.snapshot_array()``: the per-datacenter :class:`ClusterSnapshot` fields
#: in declaration order (the order ``Simulator.snapshot_rows`` produces them in).
SNAPSHOT_ARRAY_ROWS: tuple[str, ...] = tuple(f.name for f in fields(ClusterSnapshot) if f.name != "time_s")
#: Decoded type of each snapshot row ("float", "int" or "bool").
SNAPSHOT_ROW_KINDS: tuple[str, ...] = tuple(f.metadata["kind"] for f in fields(ClusterSnapshot) if f.name != "time_s")


def snapshot_from_array(time_s: float, m: np.ndarray) -> ClusterSnapshot:
    """The :class:`ClusterSnapshot` of a ``(len(SNAPSHOT_ARRAY_ROWS), D)`` float64 array."""
    kw: dict[str, np.ndarray] = {}
    for i, (name, kind) in enumerate(zip(SNAPSHOT_ARRAY_ROWS, SNAPSHOT_ROW_KINDS)):
        row = m[i]
        kw[name] = row.astype(np.int64) if kind == "int" else (row > 0.5 if kind == "bool" else row)
    return ClusterSnapshot(time_s=time_s, **kw)


@dataclass(frozen=True)
class LatencyEstimates:
    """Estimates for R candidate requests x D datacenters (arrays of shape (R, D), seconds).

    ``ttft_s = network up + queue_wait_s + prefill_s + network down`` (the wait before the
    request is placed is excluded); ``network_s`` = uplink + downlink; ``prefill_s`` =
    ceil(prompt / chunk) x est_iteration_s + prompt x est_prefill_s_per_token.
    """

    network_s: np.ndarray
    queue_wait_s: np.ndarray
    prefill_s: np.ndarray
    tpot_s: np.ndarray
    ttft_s: np.ndarray


@dataclass(frozen=True)
class EnergyAttribution:
    """Split of each datacenter's active energy at ``time_s`` (arrays of length D; see
    :meth:`Simulator.energy_attribution`). Energies in J (facility level), carbon in g.
    ``in_engines``: requests queued or running on the engines (in transit excluded)."""

    time_s: float
    active_energy_j: np.ndarray
    active_carbon_g: np.ndarray
    in_flight_share_j: np.ndarray
    in_flight_share_carbon_g: np.ndarray
    in_progress_j: np.ndarray
    in_progress_carbon_g: np.ndarray
    aborted_partial_j: np.ndarray
    aborted_partial_carbon_g: np.ndarray
    in_engines: np.ndarray


@dataclass(frozen=True)
class SimTotals:
    """Cumulative accounting since time 0 up to ``time_s`` (arrays of length D).

    ``it_energy_j = gpu_energy_j + host_energy_j`` (IT level); ``idle_energy_j`` is the part of
    ``gpu_energy_j`` drawn by idle engines; ``facility_energy_j = it_energy_j x PUE``;
    ``carbon_g`` is facility energy x grid intensity. Counts: requests ``submitted``,
    ``completed``, ``aborted`` (datacenter outages), ``in_flight`` (= submitted - completed -
    aborted); ``preemptions``; ``iterations`` (engine forward passes completed by ``time_s``).

    Capacity states (:mod:`carbon_gym.sim.capacity`; all zero without capacity control), IT
    level, J: ``gpu_state_energy_j`` (5, D), the GPU energy of engines falling asleep, asleep,
    waking, booting and off (0 W), in that order; ``host_state_energy_j`` (4, D), the host energy
    of nodes on, in standby, off and booting (each integrated from its own power: they sum to
    ``host_energy_j``, which the ledger checks). :meth:`energy_by_state`
    names them all, with ``active`` (GPU energy of engines with work) and ``idle`` (awake
    engines without work).

    Prefix caching (:mod:`carbon_gym.sim.prefix_cache`; int64 (D,), tokens): ``prompt_tokens``
    of the requests admitted by ``time_s`` (counted at their first admission),
    ``cached_prompt_tokens`` (of those, served from the prefix cache at that admission; hit rate
    = cached / prompt, :attr:`prefix_hit_rate`), ``prefill_saved_tokens`` (prompt tokens not
    computed thanks to the cache, re-admissions after a preemption included: >= cached) and
    ``prefix_evictions`` (cache entries evicted for room, prefix blocks). Zero cached, saved and
    evicted without prefix caching.
    """

    time_s: float
    it_energy_j: np.ndarray
    facility_energy_j: np.ndarray
    carbon_g: np.ndarray
    idle_energy_j: np.ndarray
    host_energy_j: np.ndarray
    gpu_energy_j: np.ndarray
    submitted: int
    completed: int
    in_flight: int
    preemptions: int
    aborted: int
    iterations: int
    gpu_state_energy_j: np.ndarray
    host_state_energy_j: np.ndarray
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cached_prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prefill_saved_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prefix_evictions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def prefix_hit_rate(self) -> np.ndarray:
        """Per datacenter (D,): cached prompt tokens / prompt tokens (NaN where none was admitted)."""
        p = np.asarray(self.prompt_tokens, dtype=np.float64)
        c = np.asarray(self.cached_prompt_tokens, dtype=np.float64)
        return np.divide(c, p, out=np.full(p.shape, np.nan), where=p > 0)

    @property
    def overall_prefix_hit_rate(self) -> float:
        """All datacenters: cached prompt tokens / prompt tokens (NaN when none was admitted)."""
        p = int(np.sum(self.prompt_tokens))
        return float(np.sum(self.cached_prompt_tokens)) / p if p else float("nan")

    def energy_by_state(self) -> dict[str, np.ndarray]:
        """IT energy per datacenter (D,) by power state, J: ``gpu_active``, ``gpu_idle``,
        ``gpu_falling_asleep``, ``gpu_asleep``, ``gpu_waking``, ``gpu_booting``, ``host_on``,
        ``host_standby``, ``host_off``, ``host_booting``; they sum to ``it_energy_j``."""
        g, h = self.gpu_state_energy_j, self.host_state_energy_j
        return {
            "gpu_active": self.gpu_energy_j - self.idle_energy_j - g.sum(axis=0), "gpu_idle": self.idle_energy_j,
            "gpu_falling_asleep": g[0], "gpu_asleep": g[1], "gpu_waking": g[2], "gpu_booting": g[3],
            "host_on": h[0], "host_standby": h[1], "host_off": h[2], "host_booting": h[3],
        }
