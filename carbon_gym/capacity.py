"""Serving capacity measured with the simulator: what the load levels are fractions of.

Capacity of one engine (per model) = the highest Poisson request rate at which one engine that
receives every request keeps the p99 TTFT and the p99 TPOT within the scenario's SLO targets.
It is found by bisection over the rate with short simulations that share their random numbers
(same seeds at every rate, so the p99s move smoothly with the rate):

* one engine (``tp`` GPUs, one datacenter, no network delay), the scenario's engine settings,
  length dataset and context cap, Poisson arrivals;
* each request is submitted at its arrival instant; arrivals stop at ``duration_s`` and the
  engine drains; requests arriving during the first ``warmup_s`` are not counted;
* TPOT percentiles use requests with more than one output token (TPOT is undefined otherwise).

Cluster capacity = per-engine capacity x number of engines. ``eval/measure_capacity.py`` runs
this for the study's models and writes ``carbon_gym/data/load_levels.toml``.

**Cluster level** (:func:`measure_cluster_capacity`, ``eval/measure_capacity.py --cluster``): the
same bisection, over the per-engine rate of the *whole scenario* (its topology, network delays
and PUEs, every engine) under round-robin placement over the datacenters with the env's
polling: every ``polling_period_s`` the requests that arrived during the period are placed, so
each waits for the next decision and then crosses the network, and both count in its TTFT
(:func:`round_robin_slo`). The arrivals follow the scenario's region shares (no diurnal profile,
Poisson); probes are shorter (default 180 s, 60 s warm-up) because a probe simulates every
engine. It is the rate at which the simplest placement meets the p99 targets: with ~0.3 s of RTT
and up to one polling period of wait inside the 2 s TTFT budget it sits below the engine figure.
``eval/measure_capacity.py --cluster --write`` writes it beside the engine figure in
``load_levels.toml`` (``cluster_per_engine_rate_per_s``, ``cluster_to_engine_ratio``, the probe
settings as ``cluster_*``); the load levels (``workload.load``) are fractions of it (the file's
``level_basis = "cluster"``, :mod:`carbon_gym.load_levels`). The engine figure beside it is what one
engine serves, a property of the model, GPU and engine settings alone: the schedulers' capacity
models (planner, capacity control) use it.

**Datacenter level** (:func:`measure_datacenter_capacity`): the bisection over the per-engine
rate offered to ONE datacenter of the scenario's size, its dispatcher spreading the requests
over the engines, the requests submitted every polling period (the wait counting in TTFT), no
network delay. At short periods it sits above the engine figure (the dispatcher pools the
engines: each sees a smoother stream than Poisson), at 1 s below it. Each probe also measures
the GPU energy above idle per request (``SloProbe.active_j_per_request``), which falls as the
rate rises (larger batches); the SLO-true bound (``eval/bound_slo.py``) uses both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .scenario import Scenario
from .topology import DatacenterSpec, Topology


@dataclass(frozen=True)
class SloProbe:
    """Result of one simulation at a fixed rate.

    Attributes:
        rate_per_s: offered rate per engine, requests/s.
        n: requests counted (after warm-up).
        p99_ttft_s, p99_tpot_s: 99th percentiles, seconds.
        violation_frac: share of counted requests violating TTFT or TPOT.
        ok: both p99s within the targets.
        active_j_per_request: GPU energy above idle (IT level, no PUE) per request arriving
            between the warm-up and the end of arrivals, J: the engines' energy over that span
            minus every GPU at idle power, over its arrivals (NaN where not measured).
    """

    rate_per_s: float
    n: int
    p99_ttft_s: float
    p99_tpot_s: float
    violation_frac: float
    ok: bool
    active_j_per_request: float = float("nan")


@dataclass(frozen=True)
class CapacityResult:
    """Per-engine capacity of a scenario's model and the probes that found it."""

    model: str
    tp: int
    per_engine_rate_per_s: float
    probes: tuple[SloProbe, ...] = field(default_factory=tuple)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def active_j_per_request(self) -> float:
        """The least GPU energy above idle per request (J, IT level) of the probes that met the
        SLO (NaN when none measured it): the cheapest operating point within p99."""
        vals = [p.active_j_per_request for p in self.probes if p.ok and p.n > 0 and not np.isnan(p.active_j_per_request)]
        return float(min(vals)) if vals else float("nan")


def _single_engine_parts(scenario: Scenario, n_engines: int = 1) -> tuple[Any, Topology, Any, Any]:
    from .physics.carbon import load_carbon_trace
    from .physics.network import Network
    from .world import build_parts

    parts = build_parts(scenario)
    tp = scenario.tp
    gpn = parts.gpu.gpus_per_node
    if n_engines * tp <= gpn:
        dc = DatacenterSpec(name="probe", region="probe", zone="FR", pue=1.1, nodes=1, gpus_per_node=n_engines * tp)
    else:
        if (n_engines * tp) % gpn:
            raise ValueError("n_engines x tp must fill whole nodes")
        dc = DatacenterSpec(name="probe", region="probe", zone="FR", pue=1.1, nodes=n_engines * tp // gpn, gpus_per_node=gpn)
    topo = Topology(regions=("probe",), datacenters=(dc,), gpu=scenario.gpu)
    carbon = load_carbon_trace(zones=["FR"])
    return parts, topo, Network(one_way_s=np.zeros((1, 1))), carbon


def probe_slo(scenario: Scenario, rate_per_s: float, *, duration_s: float = 600.0, warmup_s: float = 60.0,
              seeds: tuple[int, ...] = (0, 1), n_engines: int = 1, polling_period_s: float | None = None) -> SloProbe:
    """Simulate ``n_engines`` engines (one datacenter, dispatcher from the scenario) fed Poisson
    arrivals at ``rate_per_s`` per engine; return the p99 TTFT/TPOT after warm-up and the GPU
    energy above idle per request (``active_j_per_request``, J) between the warm-up and the end
    of arrivals, pooled over ``seeds``.

    ``polling_period_s``: None submits each request at its arrival instant; a period (s) submits
    the requests that arrived during each period at its end, as the env's scheduler does, the
    wait counting in their TTFT (no network delay either way)."""
    from .sim.simulator import Simulator
    from .world import build_workload

    if polling_period_s is not None and not float(polling_period_s) > 0.0:
        raise ValueError(f"polling_period_s must be > 0 s or None, got {polling_period_s!r}")
    parts, topo, net, carbon = _single_engine_parts(scenario, n_engines)
    n_gpus = float(sum(dc.gpus for dc in topo.datacenters))
    idle_w = float(parts.power.idle_w)
    sc = dataclasses.replace(scenario, resolved_rate_per_s=rate_per_s * n_engines,
                             workload=dataclasses.replace(scenario.workload, region_shares=None, diurnal_amplitude=0.0, arrival="poisson"),
                             topology=dataclasses.replace(scenario.topology, preset="custom", only_regions=None,
                                                          regions=(_probe_region(),), datacenters=(_probe_dc(),)))
    records = []
    active_j, counted = 0.0, 0
    for seed in seeds:
        sim = Simulator(topo, parts.model, parts.gpu, parts.latency, parts.power, net, carbon, engine=parts.engine,
                        dispatcher=scenario.engine.dispatcher)
        batch = build_workload(sc, seed=seed).arrivals_between(0.0, duration_s)
        a = np.asarray(batch.arrival_s, dtype=np.float64)
        if polling_period_s is None:  # every request at its arrival instant
            at = a
        else:  # at the end of its polling period (a period boundary: k x period, k >= 1)
            per = float(polling_period_s)
            at = np.maximum(a, np.minimum(np.floor(a / per + 1.0) * per, max(float(duration_s), float(a[-1])) if a.size else 0.0))
        gpu_j = _busy_gpu_j(sim, at, batch, float(warmup_s), float(duration_s))
        active_j += gpu_j - idle_w * n_gpus * max(0.0, float(duration_s) - float(warmup_s))
        counted += int(np.count_nonzero((a >= warmup_s) & (a < duration_s)))
        sim.run_until_idle()
        rec = sim.pop_completed()
        assert len(rec) == len(batch), "every submitted request must complete"
        records.append(rec)
    pr = _slo_probe(scenario, rate_per_s, records, warmup_s)
    return dataclasses.replace(pr, active_j_per_request=active_j / counted if counted else float("nan"))


def _busy_gpu_j(sim: Any, at: np.ndarray, batch: Any, warmup_s: float, duration_s: float) -> float:
    """Submit ``batch`` to datacenter 0 of ``sim``, request ``i`` at instant ``at[i]`` (>= its
    arrival; equal instants together), and return the GPU energy (J, IT level) spent between
    ``warmup_s`` and ``duration_s``."""
    marks = {}
    pending = sorted(m for m in (warmup_s, duration_s) if m >= 0.0)
    n = int(at.size)
    i = 0
    while i < n:
        t = float(at[i])
        j = i + 1
        while j < n and float(at[j]) == t:
            j += 1
        while pending and pending[0] <= t:
            m = pending.pop(0)
            sim.advance_to(m)
            marks[m] = float(np.sum(sim.totals().gpu_energy_j))
        sim.advance_to(t)
        sim.submit_batch(np.zeros(j - i, dtype=np.int64), batch.arrival_s[i:j], batch.prompt_tokens[i:j],
                         batch.output_tokens[i:j], np.zeros(j - i, dtype=np.int64))
        i = j
    for m in pending:
        sim.advance_to(max(m, float(sim.now_s)))
        marks[m] = float(np.sum(sim.totals().gpu_energy_j))
    return marks.get(duration_s, 0.0) - marks.get(warmup_s, 0.0)


def _probe_region() -> Any:
    from .scenario import RegionConfig

    return RegionConfig(name="probe", client_zone="FR")


def _probe_dc() -> Any:
    from .scenario import DatacenterConfig

    return DatacenterConfig(name="probe", region="probe", zone="FR", nodes=1)


def measure_capacity(scenario: Scenario, *, rel_tol: float = 0.02, start_rate_per_s: float = 1.0,
                     duration_s: float = 600.0, warmup_s: float = 60.0, seeds: tuple[int, ...] = (0, 1),
                     max_rate_per_s: float = 1000.0, log: Any = None) -> CapacityResult:
    """Bisection for the highest per-engine rate whose probe meets the SLO (see module docstring)."""
    lo, probes = _bisect(lambda rate: probe_slo(scenario, rate, duration_s=duration_s, warmup_s=warmup_s, seeds=seeds),
                         rel_tol, start_rate_per_s, max_rate_per_s, log)
    return CapacityResult(scenario.model, scenario.tp, lo, probes, _settings(scenario, duration_s, warmup_s, seeds, rel_tol))


def measure_cluster_capacity(scenario: Scenario, *, rel_tol: float = 0.02, start_rate_per_s: float = 1.0,
                             duration_s: float = 180.0, warmup_s: float = 60.0, seeds: tuple[int, ...] = (0,),
                             max_rate_per_s: float = 1000.0, log: Any = None) -> CapacityResult:
    """Cluster-level capacity (module docstring): bisection over the per-engine rate of the whole
    scenario under round-robin with its polling period and network; the p99s pool ``seeds``."""
    n = scenario.n_engines()
    lo, probes = _bisect(lambda rate: cluster_probe(scenario, rate, duration_s=duration_s, warmup_s=warmup_s, seeds=seeds),
                         rel_tol, start_rate_per_s, max_rate_per_s, log)
    settings = _settings(scenario, duration_s, warmup_s, seeds, rel_tol)
    settings.update(level="cluster", polling_period_s=scenario.polling_period_s, engines=n,
                    datacenters=len(scenario.topology_spec().datacenters), placement="round-robin over datacenters")
    return CapacityResult(scenario.model, scenario.tp, lo, probes, settings)


def measure_datacenter_capacity(scenario: Scenario, *, n_engines: int, polling_period_s: float | None,
                                rel_tol: float = 0.02, start_rate_per_s: float = 1.0, duration_s: float = 300.0,
                                warmup_s: float = 60.0, seeds: tuple[int, ...] = (0, 1), max_rate_per_s: float = 1000.0,
                                log: Any = None) -> CapacityResult:
    """Datacenter-level capacity (module docstring): bisection over the per-engine Poisson rate
    offered to one datacenter of ``n_engines`` engines (the scenario's dispatcher spreads the
    requests over them), the requests submitted every ``polling_period_s`` (None: at arrival), no
    network delay. The result's ``active_j_per_request`` is the least GPU energy above idle per
    request (J) of the probes within p99: the datacenter's cheapest operating point."""
    if int(n_engines) < 1:
        raise ValueError(f"n_engines must be >= 1, got {n_engines!r}")
    lo, probes = _bisect(lambda rate: probe_slo(scenario, rate, duration_s=duration_s, warmup_s=warmup_s, seeds=seeds,
                                                n_engines=int(n_engines), polling_period_s=polling_period_s),
                         rel_tol, start_rate_per_s, max_rate_per_s, log)
    settings = _settings(scenario, duration_s, warmup_s, seeds, rel_tol)
    settings.update(level="datacenter", polling_period_s=polling_period_s, engines=int(n_engines), gpu=scenario.gpu,
                    placement=f"one datacenter, its {scenario.engine.dispatcher} dispatcher, no network")
    return CapacityResult(scenario.model, scenario.tp, lo, probes, settings)


def _settings(scenario: Scenario, duration_s: float, warmup_s: float, seeds: tuple[int, ...], rel_tol: float) -> dict:
    return dict(duration_s=duration_s, warmup_s=warmup_s, seeds=list(seeds), rel_tol=rel_tol,
                lengths=scenario.workload.lengths, max_context_tokens=scenario.workload.max_context_tokens,
                ttft_s=scenario.ttft_s, tpot_s=scenario.tpot_s, dispatcher=scenario.engine.dispatcher,
                max_num_seqs=scenario.engine.max_num_seqs, max_num_batched_tokens=scenario.engine.max_num_batched_tokens,
                chunked_prefill=scenario.engine.chunked_prefill)


def _bisect(probe: Any, rel_tol: float, start_rate_per_s: float, max_rate_per_s: float,
            log: Any) -> tuple[float, tuple[SloProbe, ...]]:
    """(highest rate found whose ``probe(rate).ok``, the probes sorted by rate): doubling from
    ``start_rate_per_s`` (halving if it already fails), then bisection to ``rel_tol``."""
    probes: list[SloProbe] = []

    def run(rate: float) -> bool:
        pr = probe(rate)
        probes.append(pr)
        if log:
            log(f"  rate {rate:8.3f}/s  n={pr.n:6d}  p99 TTFT {pr.p99_ttft_s:7.3f} s  p99 TPOT {pr.p99_tpot_s * 1000:7.1f} ms  "
                f"violations {pr.violation_frac * 100:5.2f}%  {'ok' if pr.ok else 'VIOLATES'}")
        return pr.ok

    lo, hi = 0.0, float(start_rate_per_s)
    while run(hi):
        lo, hi = hi, hi * 2
        if hi > max_rate_per_s:
            raise RuntimeError(f"capacity above {max_rate_per_s} requests/s per engine; raise max_rate_per_s")
    if lo == 0.0:  # start rate already violates: search downwards
        while hi > 1e-3:
            hi_new = hi / 2
            if run(hi_new):
                lo = hi_new
                break
            hi = hi_new
    while (hi - lo) > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if run(mid):
            lo = mid
        else:
            hi = mid
    return lo, tuple(sorted(probes, key=lambda p: p.rate_per_s))


def round_robin_slo(scenario: Scenario, *, duration_s: float = 300.0, warmup_s: float = 60.0, seed: int = 0,
                    polling_period_s: float | None = None) -> SloProbe:
    """Run the scenario with round-robin placement over its datacenters and report the SLO probe.

    Requests are placed every ``polling_period_s`` (default: the scenario's) in arrival order,
    request ``i`` going to datacenter ``i mod D``; the network delays of the topology apply.
    """
    rec = _round_robin_records(scenario, duration_s, seed, polling_period_s)
    rate = scenario.rate_per_s / max(1, scenario.n_engines())
    return _slo_probe(scenario, rate, [rec], warmup_s)


def cluster_probe(scenario: Scenario, rate_per_s: float, *, duration_s: float = 180.0, warmup_s: float = 60.0,
                  seeds: tuple[int, ...] = (0,)) -> SloProbe:
    """:func:`round_robin_slo` of the whole scenario at ``rate_per_s`` per engine (Poisson, no
    diurnal profile), the p99s pooled over ``seeds``."""
    n = scenario.n_engines()
    sc = dataclasses.replace(scenario, resolved_rate_per_s=rate_per_s * n,
                             workload=dataclasses.replace(scenario.workload, diurnal_amplitude=0.0, arrival="poisson"))
    return _slo_probe(sc, rate_per_s, [_round_robin_records(sc, duration_s, s, None) for s in seeds], warmup_s)


def _round_robin_records(scenario: Scenario, duration_s: float, seed: int, polling_period_s: float | None) -> Any:
    from .world import build_world

    period = scenario.polling_period_s if polling_period_s is None else polling_period_s
    sim, workload = build_world(scenario, seed)
    D = sim.n_datacenters
    k = 0
    t = 0.0
    while t < duration_s - 1e-12:
        t1 = min(duration_s, t + period)
        b = workload.arrivals_between(t, t1)
        sim.advance_to(t1)
        if len(b):
            sim.submit_batch(b.origin, b.arrival_s, b.prompt_tokens, b.output_tokens, (k + np.arange(len(b))) % D)
            k += len(b)
        t = t1
    sim.run_until_idle()
    return sim.pop_completed()


def _slo_probe(scenario: Scenario, rate: float, records: list, warmup_s: float) -> SloProbe:
    ttft, tpot, bad = [], [], []
    for rec in records:
        keep = rec.arrival_s >= warmup_s
        multi = keep & (rec.output_tokens > 1)
        ttft.append(rec.ttft_s[keep])
        tpot.append(rec.tpot_s[multi])
        bad.append((rec.ttft_s[keep] > scenario.ttft_s) | ((rec.output_tokens[keep] > 1) & (rec.tpot_s[keep] > scenario.tpot_s)))
    t1, t2, v = np.concatenate(ttft), np.concatenate(tpot), np.concatenate(bad)
    n = int(t1.size)
    p_ttft = float(np.percentile(t1, 99)) if n else 0.0
    p_tpot = float(np.percentile(t2, 99)) if t2.size else 0.0
    viol = float(np.mean(v)) if n else 0.0
    return SloProbe(rate, n, p_ttft, p_tpot, viol, p_ttft <= scenario.ttft_s and p_tpot <= scenario.tpot_s)
