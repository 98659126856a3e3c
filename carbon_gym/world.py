"""Scenario -> (Simulator, Workload): the only place that wires data files to models.

::

    from carbon_gym.scenario import load_scenario
    from carbon_gym.world import build_world

    scenario = load_scenario("llama8b-moderate", overrides={"duration_s": 600})
    sim, workload = build_world(scenario, seed=0)
    batch = workload.arrivals_between(0.0, 1.0)

Seeds: ``seed`` (default: ``scenario.seed``) drives the workload directly; the carbon forecast
noise uses an independent stream derived from it (:func:`derive_seed`).
"""

from __future__ import annotations

import functools

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ConfigError, DataError
from .physics.carbon import CarbonForecaster, CarbonTrace, carbon_offset_s, load_carbon_trace
from .physics.network import Network, network_from_zones
from .predict import OutputLengthPredictor, make_predictor
from .scenario import Scenario, default_topology, resolve_topology
from .sessions import build_prefix_workload, is_prefix_workload, prefix_length_pairs
from .topology import Topology

if TYPE_CHECKING:  # pragma: no cover
    from .faults import FaultRuntime
    from .sim import EngineConfig, Simulator
from .workload import (
    EmpiricalLengthSampler,
    DiurnalProfile,
    GammaArrivals,
    PoissonArrivals,
    Workload,
    load_length_table,
    make_length_sampler,
    make_trace_replay,
)

__all__ = [
    "build_world", "build_topology", "build_network", "build_carbon", "carbon_trace_of", "build_workload", "build_forecaster",
    "build_predictor", "build_engine_config", "default_topology", "derive_seed", "WorldParts", "build_parts",
    "reseed_workload",
    "build_fault_runtime", "build_gpu_models",
]


@functools.lru_cache(maxsize=4096)  # (a pure function of its arguments, called at every env reset)
def derive_seed(seed: int, stream: str) -> int:
    """An independent 63-bit seed for a named random stream (``"workload"``, ``"forecast"``, ...)."""
    tag = [ord(c) for c in stream]
    return int(np.random.SeedSequence([int(seed), *tag]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def build_topology(scenario: Scenario) -> Topology:
    """The scenario's :class:`Topology`."""
    return resolve_topology(scenario)[0]


def build_network(scenario: Scenario) -> Network:
    """One-way delays from each region's clients to each datacenter (RTT / 2)."""
    topo, regions = resolve_topology(scenario)
    overrides = {i: r.rtt_ms for i, r in enumerate(regions) if r.rtt_ms is not None}
    try:
        return network_from_zones(
            [r.client_zone for r in regions], [d.zone for d in topo.datacenters],
            metro_rtt_ms=scenario.topology.metro_rtt_ms, rtt_overrides_ms=overrides,
        )
    except ConfigError as e:
        raise ConfigError("topology", f"{e} (give [[topology.regions]] rtt_ms for zones outside the RTT matrix)",
                          source=scenario.source or None) from None


def carbon_trace_of(scenario: Scenario) -> CarbonTrace:
    """The scenario's carbon trace (columns = the datacenters' distinct zones), whatever its
    ``carbon.start_utc`` (which :func:`build_carbon` checks against it)."""
    topo = build_topology(scenario)
    zones = list(dict.fromkeys(d.zone for d in topo.datacenters))
    c = scenario.carbon
    path = None if c.file == "packaged" else c.file
    return load_carbon_trace(path, kind=c.kind, zones=zones, interpolation=c.interpolation, fill=c.fill)


def build_carbon(scenario: Scenario) -> tuple[CarbonTrace, float]:
    """The carbon trace (columns = the datacenters' distinct zones) and the episode's offset in it, s."""
    trace = carbon_trace_of(scenario)
    c = scenario.carbon
    path = None if c.file == "packaged" else c.file
    offset = carbon_offset_s(trace, c.start_utc)
    if path is not None and offset + float(scenario.duration_s) > trace.period_s:
        import warnings

        warnings.warn(f"carbon.file {path}: the episode (start {c.start_utc}, {float(scenario.duration_s):g} s) runs "
                      f"past the trace's end ({trace.end_utc}); the intensities wrap around to the trace's start",
                      stacklevel=2)
    return trace, offset


def build_forecaster(scenario: Scenario, trace: CarbonTrace | None = None, seed: int | None = None) -> CarbonForecaster:
    """Carbon forecasts for the scenario (horizon and error from ``[carbon]``)."""
    if trace is None:
        trace = build_carbon(scenario)[0]
    seed = scenario.seed if seed is None else seed
    c = scenario.carbon
    return CarbonForecaster(trace, c.forecast_horizon_h, c.forecast_error_std_frac, derive_seed(seed, "forecast"))


def build_workload(scenario: Scenario, seed: int | None = None) -> Any:
    """The scenario's request generator (see :mod:`carbon_gym.workload`)."""
    from .physics.carbon import parse_start_utc

    seed = scenario.seed if seed is None else seed
    w = scenario.workload
    _, regions = resolve_topology(scenario)
    diurnal = None
    if w.diurnal_amplitude > 0:
        diurnal = DiurnalProfile(w.diurnal_amplitude, w.diurnal_peak_hour, tuple(r.utc_offset_h for r in regions),
                                 parse_start_utc(scenario.carbon.start_utc))
    if is_prefix_workload(w):  # multi-turn sessions or a Mooncake replay, with prefix hashes
        return build_prefix_workload(w, rate_per_s=scenario.rate_per_s, n_regions=len(regions), diurnal=diurnal,
                                     seed=derive_seed(seed, "workload"))
    replay_lengths = w.lengths == "trace"
    if replay_lengths:
        sampler = make_length_sampler(w.trace, max_context_tokens=w.max_context_tokens, cap_policy="resample")
    else:
        sampler = make_length_sampler(w.lengths, max_context_tokens=w.max_context_tokens, cap_policy=w.cap_policy,
                                      prompt_tokens=w.prompt_tokens, output_tokens=w.output_tokens)
    if w.arrival == "poisson":
        arrivals: Any = PoissonArrivals()
    elif w.arrival == "gamma":
        arrivals = GammaArrivals(w.cv)
    else:
        peak = 1.0 + w.diurnal_amplitude
        if w.time_scale is not None:
            arrivals = make_trace_replay(w.trace, time_scale=w.time_scale)
        else:
            arrivals = make_trace_replay(w.trace, rate_per_s=scenario.rate_per_s * peak)
    return Workload(
        arrivals, sampler, rate_per_s=scenario.rate_per_s, n_regions=len(regions), region_shares=w.region_shares,
        diurnal=diurnal, seed=derive_seed(seed, "workload"), block_s=w.block_s, replay_lengths=replay_lengths,
        max_context_tokens=w.max_context_tokens, cap_policy=w.cap_policy,
        replay_table=load_length_table(w.trace, "workload.trace") if replay_lengths else None,
    )


def reseed_workload(workload: Any, seed: int) -> Any:
    """What ``build_workload(scenario, seed)`` returns, from a ``workload`` built for the same
    scenario with another seed (no data reloaded: for episode resets)."""
    return workload.with_seed(derive_seed(seed, "workload"))


def build_predictor(scenario: Scenario) -> OutputLengthPredictor:
    """The output-length predictor named by ``env.predictor``, fitted on the scenario's length data.

    The binned predictor is fitted on the whole dataset the workload samples from (after the
    context cap); held-out accuracy is documented in :mod:`carbon_gym.predict`.
    """
    w = scenario.workload
    name = scenario.env.predictor
    if name == "oracle":
        return make_predictor("oracle")
    if is_prefix_workload(w):
        p, o = prefix_length_pairs(w)
        return make_predictor(name, prompt_tokens=p, output_tokens=o)
    if w.lengths == "fixed":
        return make_predictor(name, prompt_tokens=np.array([w.prompt_tokens]), output_tokens=np.array([w.output_tokens]), min_count=1)
    dataset = w.trace if w.lengths == "trace" else w.lengths
    sampler = make_length_sampler(dataset, max_context_tokens=w.max_context_tokens, cap_policy="resample")
    assert isinstance(sampler, EmpiricalLengthSampler)  # (a dataset: "fixed" is handled above)
    return make_predictor(name, prompt_tokens=sampler.prompt_tokens, output_tokens=sampler.output_tokens)


def build_engine_config(scenario: Scenario) -> EngineConfig:
    """``carbon_gym.sim.EngineConfig`` from ``[engine]`` (fields the simulator does not know are refused)."""
    from .sim import EngineConfig  # lazy: the simulator is optional for data-only use

    e = scenario.engine
    values: dict[str, Any] = {
        "tp": scenario.tp, "block_tokens": e.block_tokens, "gpu_memory_utilization": e.gpu_memory_utilization,
        "max_num_seqs": e.max_num_seqs, "max_num_batched_tokens": e.max_num_batched_tokens,
        "chunked_prefill": e.chunked_prefill, "max_model_len": e.max_model_len,
    }
    if e.prefix_caching:  # (passed only when on: a scenario without it builds the same EngineConfig as before)
        values["prefix_caching"] = True
    known = {f.name for f in fields(EngineConfig)}
    if is_prefix_workload(scenario.workload) and "prefix_block_tokens" in known:  # the prefix cache's block = the workload's
        values["prefix_block_tokens"] = scenario.workload.sessions.prefix_block_tokens
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"engine.{unknown[0]}", "not supported by this simulator's EngineConfig", allowed=sorted(known))
    return EngineConfig(**values)


@dataclass(frozen=True)
class WorldParts:
    """Everything :func:`build_world` wires, for callers that need more than (sim, workload)."""

    topology: Topology
    model: Any
    gpu: Any
    latency: Any
    power: Any
    network: Network
    carbon: CarbonTrace
    carbon_offset_s: float
    engine: Any
    power_states: Any = None  # PowerStates (the power file's [states]), or None when it has none
    gpus: Any = None  # {GPU name: carbon_gym.sim.GpuModels} of every GPU type in the topology (the first: ``gpu``'s)

    def datacenter_gpus(self) -> list[Any]:
        """The :class:`~carbon_gym.sim.GpuModels` of each datacenter's GPU, in topology order."""
        return [self.gpus[self.topology.datacenter_gpu(i)] for i in range(self.topology.n_datacenters)]


def build_gpu_models(scenario: Scenario, gpu: str) -> Any:
    """:class:`~carbon_gym.sim.GpuModels` of ``gpu`` for the scenario's model and TP: each file from
    the scenario's ``[gpu_files.<gpu>]`` where it names one, else the packaged one."""
    from .physics.latency import load_latency_model
    from .physics.power import load_power_model, load_power_states
    from .gpus import gpu_spec_of
    from .sim.config import GpuModels

    where = f"gpu_files.{gpu}"
    power_path = scenario.gpu_file(gpu, "power")
    try:  # (a named file that is malformed raises a DataError naming it)
        latency = load_latency_model(gpu, scenario.model, scenario.tp, scenario.gpu_file(gpu, "latency"))
        power = load_power_model(gpu, power_path)
    except ConfigError as e:  # no packaged file of that name
        msg = str(e).split(": ", 1)[-1].split(" (allowed")[0]
        raise ConfigError(f"{where}.{e.field}", f"{msg}: none is packaged; give the file in [{where}] {e.field} = "
                          "'<path>.toml'", allowed=e.allowed, source=scenario.source or None) from None
    try:
        states = load_power_states(gpu, power_path)
    except DataError:  # a power file without capacity states: engines cannot sleep
        states = None
    return GpuModels(gpu_spec_of(gpu, scenario.gpu_files, "gpu", scenario.source or None), latency, power, states)


def build_parts(scenario: Scenario) -> WorldParts:
    """Load every model and data file the simulator needs (no simulator constructed)."""
    from .specs import load_model_spec

    topo = build_topology(scenario)
    carbon, offset = build_carbon(scenario)
    gpus = {g: build_gpu_models(scenario, g) for g in dict.fromkeys((scenario.gpu, *topo.gpu_types()))}
    main = gpus[scenario.gpu]
    return WorldParts(
        topology=topo, model=load_model_spec(scenario.model), gpu=main.spec, latency=main.latency, power=main.power,
        network=build_network(scenario), carbon=carbon, carbon_offset_s=offset, engine=build_engine_config(scenario),
        power_states=main.states, gpus=gpus,
    )


def build_world(scenario: Scenario, seed: int | None = None, *, step_mode: bool = False,
                parts: WorldParts | None = None) -> tuple[Simulator, Workload]:
    """Build the simulator and the workload of a scenario.

    Args:
        scenario: a validated :class:`~carbon_gym.scenario.Scenario`.
        seed: seed of this episode (default ``scenario.seed``).
        step_mode: pass-through to the simulator (one iteration at a time; for equivalence tests).
        parts: ``build_parts(scenario)`` when the caller already has them (the files are not
            read again).

    Returns:
        ``(Simulator, Workload)``. The scenario's ``[[faults]]`` are not applied here: they act
        as time passes, through :func:`build_fault_runtime` (the env does this).
    """
    from .sim.simulator import Simulator  # lazy: written concurrently, heavy-ish

    if parts is None:
        parts = build_parts(scenario)
    kwargs: dict[str, Any] = dict(engine=parts.engine, carbon_offset_s=parts.carbon_offset_s,
                                  dispatcher=scenario.engine.dispatcher, step_mode=step_mode,
                                  power_states=parts.power_states)
    if len(parts.gpus) > 1:  # datacenters of other GPU types (a homogeneous topology passes none)
        kwargs["gpus"] = {g: m for g, m in parts.gpus.items() if g != scenario.gpu}
    sim = Simulator(parts.topology, parts.model, parts.gpu, parts.latency, parts.power, parts.network, parts.carbon, **kwargs)
    return sim, build_workload(scenario, seed)


def build_fault_runtime(scenario: Scenario, sim: Simulator) -> FaultRuntime | None:
    """A :class:`~carbon_gym.faults.FaultRuntime` applying the scenario's faults to ``sim``
    (None when the scenario has no faults)."""
    from .faults import FaultRuntime, scenario_faults

    faults = scenario_faults(scenario)
    return FaultRuntime(faults, sim) if faults else None
