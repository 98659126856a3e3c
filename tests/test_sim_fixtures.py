"""Hand-built worlds for the simulator tests (imported by the other tests/test_sim_*.py files)."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import numpy as np

from carbon_gym.physics.carbon import CarbonTrace
from carbon_gym.physics.latency import load_latency_model
from carbon_gym.physics.network import Network
from carbon_gym.physics.power import load_power_model
from carbon_gym.sim import EngineConfig, Simulator
from carbon_gym.specs import load_gpu_spec, load_model_spec
from carbon_gym.topology import DatacenterSpec, Topology

LAT = load_latency_model("a100-80gb", "llama-3.1-8b", 1)
POW = load_power_model("a100-80gb")
MODEL = load_model_spec("llama-3.1-8b")
GPU = load_gpu_spec("a100-80gb")
BLOCK_BYTES = 16 * MODEL.kv_bytes_per_token


def starved_gpu(blocks: int, util: float = 0.9):
    """An A100 spec with just enough memory for ``blocks`` KV blocks of Llama-3.1-8B at TP1."""
    mem = (MODEL.weight_bytes + (blocks + 0.5) * BLOCK_BYTES) / util
    return dataclasses.replace(GPU, memory_bytes=mem)


def world(n_dc: int = 2, nodes: int = 1, gpus_per_node: int = 2, pue: float = 1.2, hours: int = 48,
          seed: int = 0, interpolation: str = "step"):
    """(topology, network, carbon) with ``n_dc`` datacenters, one region per datacenter."""
    rng = np.random.default_rng(seed)
    regions = tuple(f"r{i}" for i in range(n_dc))
    dcs = tuple(
        DatacenterSpec(f"dc{i}", regions[i], f"Z{i}", pue + 0.05 * i, nodes, gpus_per_node) for i in range(n_dc)
    )
    topo = Topology(regions, dcs)
    ow = np.full((n_dc, n_dc), 0.04) + rng.uniform(0, 0.02, (n_dc, n_dc))
    np.fill_diagonal(ow, 0.004)
    net = Network(ow)
    ct = CarbonTrace(tuple(f"Z{i}" for i in range(n_dc)), datetime(2023, 1, 1),
                     rng.uniform(20, 600, (hours, n_dc)), interpolation)
    return topo, net, ct


def make_sim(n_dc: int = 2, nodes: int = 1, gpus_per_node: int = 2, *, gpu=None, engine: EngineConfig | None = None,
             step_mode: bool = False, dispatcher: str = "least_work", carbon_offset_s: float = 0.0, seed: int = 0,
             pue: float = 1.2, interpolation: str = "step") -> Simulator:
    """A small simulator with Llama-3.1-8B on A100s (optionally a memory-starved GPU)."""
    topo, net, ct = world(n_dc, nodes, gpus_per_node, pue=pue, seed=seed, interpolation=interpolation)
    return Simulator(topo, MODEL, gpu or GPU, LAT, POW, net, ct, engine=engine or EngineConfig(),
                     carbon_offset_s=carbon_offset_s, dispatcher=dispatcher, step_mode=step_mode)


def random_workload(rng: np.random.Generator, n: int, n_dc: int, rate_per_s: float, max_prompt: int,
                    max_output: int, place_delay_s: float = 0.0):
    """Sorted Poisson arrivals with uniform lengths and random origins/datacenters."""
    t = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    return dict(
        arrival_s=t,
        origin=rng.integers(0, n_dc, n),
        prompt=rng.integers(1, max_prompt + 1, n),
        output=rng.integers(1, max_output + 1, n),
        dc=rng.integers(0, n_dc, n),
        send_s=t + place_delay_s,
    )


def drive(sim: Simulator, wl: dict, until_s: float | None = None, check=None) -> None:
    """Submit the workload at its send times (advancing in between) and run until ``until_s``.

    ``check(sim)`` (optional) is called after every single event.
    """
    n = len(wl["arrival_s"])
    for i in range(n):
        ts = float(wl["send_s"][i])
        if check is None:
            sim.advance_to(ts)
        else:
            while sim.next_event_s() <= ts:
                sim.advance_to(sim.next_event_s())
                check(sim)
            sim.advance_to(ts)
        sim.submit(int(wl["origin"][i]), float(wl["arrival_s"][i]), int(wl["prompt"][i]), int(wl["output"][i]),
                   int(wl["dc"][i]))
    end = until_s if until_s is not None else float(wl["send_s"][-1]) + 1e5
    if check is None:
        sim.advance_to(end)
    else:
        while sim.next_event_s() <= end:
            sim.advance_to(sim.next_event_s())
            check(sim)
        sim.advance_to(end)


def test_fixtures_build_a_working_world():
    sim = make_sim()
    assert sim.n_datacenters == 2 and sim.kv_blocks_per_engine > 20000
    starved = make_sim(gpu=starved_gpu(40), engine=EngineConfig(max_model_len=640))
    assert starved.kv_blocks_per_engine == 40
