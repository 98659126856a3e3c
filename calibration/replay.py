"""Replay a serving benchmark through a one-node carbon_gym simulation.

One datacenter with one node of ``engines`` engines of ``tp`` GPUs each, no network delay, PUE 1
and zero carbon: what a client of a single vLLM deployment measures. The simulator
(:class:`carbon_gym.sim.Simulator`) is imported lazily.

Arrival times are not in vLLM's result files, so they are regenerated: Poisson at the run's
``request_rate`` (gamma with shape ``burstiness`` when it is not 1, as vLLM draws them), seeded,
in the order of the recorded requests; ``inf`` sends every request at time 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Callable

import numpy as np

from carbon_gym.errors import ConfigError
from carbon_gym.physics.latency import TableLatencyModel
from carbon_gym.physics.power import PhasePowerModel
from carbon_gym.specs import GpuSpec, ModelSpec


@dataclass(frozen=True)
class ReplaySetup:
    """What to simulate: model, GPU, latency and power models, engines, engine options."""

    model: ModelSpec
    gpu: GpuSpec
    latency: TableLatencyModel
    power: PhasePowerModel
    engines: int = 1
    tp: int = 1
    engine_options: dict[str, Any] = field(default_factory=dict)

    def with_latency(self, latency: TableLatencyModel) -> ReplaySetup:
        """Same setup with another latency model."""
        return replace(self, latency=latency)


@dataclass(frozen=True)
class ReplayResult:
    """Per-request client metrics of one replay (same order as the requests) and GPU energy."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    output_tokens: np.ndarray
    gpu_energy_j: float
    makespan_s: float

    def mean_ttft_s(self) -> float:
        """Mean TTFT, seconds."""
        return float(np.mean(self.ttft_s))

    def mean_tpot_s(self) -> float:
        """Mean TPOT over requests with more than one output token, seconds."""
        m = self.output_tokens > 1
        return float(np.mean(self.tpot_s[m])) if np.any(m) else 0.0


ReplayFn = Callable[[ReplaySetup, np.ndarray, np.ndarray, np.ndarray], ReplayResult]


def arrival_times(n: int, rate_per_s: float, rng: np.random.Generator, burstiness: float = 1.0) -> np.ndarray:
    """``n`` arrival times (s) of a renewal process at ``rate_per_s``: gamma(shape=burstiness) gaps, first at 0."""
    if not (rate_per_s > 0):
        raise ConfigError("request_rate", f"must be > 0 (or inf), got {rate_per_s}")
    if np.isinf(rate_per_s):
        return np.zeros(n)
    if not (burstiness > 0):
        raise ConfigError("burstiness", f"must be > 0, got {burstiness}")
    gaps = rng.gamma(burstiness, 1.0 / (rate_per_s * burstiness), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def simulate(setup: ReplaySetup, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
             output_tokens: np.ndarray) -> ReplayResult:
    """Run the requests through a one-node :class:`carbon_gym.sim.Simulator`; return client metrics."""
    try:
        from carbon_gym.physics.carbon import CarbonTrace
        from carbon_gym.physics.network import Network
        from carbon_gym.sim import EngineConfig, Simulator
        from carbon_gym.topology import DatacenterSpec, Topology
    except ImportError as exc:  # the simulator is a separate part of carbon_gym
        raise ConfigError("simulator", f"carbon_gym.sim.Simulator is not available ({exc})") from None
    n = len(arrival_s)
    gpus = setup.engines * setup.tp
    topo = Topology(regions=("local",),
                    datacenters=(DatacenterSpec(name="node", region="local", zone="LOCAL", pue=1.0, nodes=1,
                                                gpus_per_node=gpus),),
                    gpu=setup.gpu.name)
    net = Network(one_way_s=np.zeros((1, 1)), bandwidth_bytes_per_s=1e30)
    carbon = CarbonTrace(zones=("LOCAL",), start_utc=datetime(2023, 1, 1), hourly_g_per_kwh=np.zeros((1, 1)))
    engine = EngineConfig(tp=setup.tp, **setup.engine_options)
    sim = Simulator(topo, setup.model, setup.gpu, setup.latency, setup.power, net, carbon, engine=engine)
    arr = np.asarray(arrival_s, dtype=np.float64)
    prompts = np.asarray(prompt_tokens, dtype=np.int64)
    outputs = np.asarray(output_tokens, dtype=np.int64)
    order = np.argsort(arr, kind="stable")
    ttft, tpot, done = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    pos: dict[int, int] = {}

    def collect() -> None:
        rec = sim.pop_completed()
        for rid, a, b, d in zip(rec.request_id.tolist(), rec.ttft_s.tolist(), rec.tpot_s.tolist(), rec.done_s.tolist()):
            i = pos[rid]
            ttft[i], tpot[i], done[i] = a, b, d

    for i in order.tolist():  # each request is sent when the client issues it
        t = float(arr[i])
        if t > sim.now_s:
            sim.advance_to(t)
        pos[int(sim.submit(0, t, int(prompts[i]), int(outputs[i]), 0))] = i
    collect()
    sim.run_until_idle()
    collect()
    if np.any(np.isnan(done)):
        raise ConfigError("replay", f"{int(np.isnan(done).sum())} of {n} requests did not complete")
    totals = sim.totals()
    end = float(np.max(done)) if n else 0.0
    # Energy up to the last completion: remove the idle tail the simulation ran past it.
    it = float(np.sum(totals.gpu_energy_j))
    tail = setup.power.idle_w * gpus * max(sim.now_s - end, 0.0)
    return ReplayResult(ttft, tpot, np.asarray(output_tokens), it - tail, end - float(np.min(arrival_s)) if n else 0.0)
