"""Result types of :class:`~carbon_gym.sim.simulator.Simulator` (frozen dataclasses of numpy arrays).

Kept out of :mod:`carbon_gym.sim.simulator`, which may be compiled (mypyc, ``setup.py``): results
stay plain dataclasses (copyable, picklable, ``dataclasses.replace``-able) whatever the build.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ClusterSnapshot", "LatencyEstimates", "EnergyAttribution", "SimTotals"]


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
    excluded).
    """

    time_s: float
    carbon_g_per_kwh: np.ndarray
    pue: np.ndarray
    queue_len: np.ndarray
    running: np.ndarray
    free_kv_blocks: np.ndarray
    total_kv_blocks: np.ndarray
    power_w: np.ndarray
    busy_engines: np.ndarray
    n_engines: np.ndarray
    est_queue_wait_s: np.ndarray
    est_prefill_s_per_token: np.ndarray
    est_tpot_s: np.ndarray
    tpot_slope_s_per_seq: np.ndarray
    up: np.ndarray
    est_iteration_s: np.ndarray
    est_prefill_chunk_tokens: np.ndarray
    accepting_engines: np.ndarray


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
