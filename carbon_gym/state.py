"""The typed state a scheduler decides from, in physical units (:meth:`GeoServeEnv.state`).

The observation (:mod:`carbon_gym.observation`) is this state scaled, capped and rounded to
float32 for learning agents; schedulers read the state itself: exact float64 values, the true
latency estimates (``inf`` for a datacenter that is down, no cap), NaN carbon while a feed is
missing. What a scheduler may not know stays out: the true output lengths of pending requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .sim.results import ClusterSnapshot

if TYPE_CHECKING:  # pragma: no cover
    from .observation import ObservationLayout

__all__ = ["DatacenterState", "PendingRequests", "EnvState"]


@dataclass(frozen=True)
class DatacenterState(ClusterSnapshot):
    """Every datacenter as a scheduler sees it at a decision (arrays of length D): the simulator's
    :class:`~carbon_gym.sim.results.ClusterSnapshot` fields, with ``carbon_g_per_kwh`` as the
    carbon feed reports it (during a feed gap: the value at the gap's start, or NaN when
    missing), plus the forecast and the feed flags."""

    carbon_forecast_g_per_kwh: np.ndarray = field(metadata={
        "unit": "g/kWh", "doc": "(D, H) forecast intensity of the H whole hours after the current one", "kind": "float"})
    carbon_stale: np.ndarray = field(metadata={"unit": "flag", "doc": "carbon feed stale", "kind": "bool"})
    carbon_missing: np.ndarray = field(metadata={"unit": "flag", "doc": "carbon feed missing", "kind": "bool"})


@dataclass(frozen=True)
class PendingRequests:
    """Requests waiting for a decision, in slot order (oldest first; arrays of length n).

    Attributes:
        seq: arrival order in the episode. origin: origin region index.
        arrival_s: when the client issued it, s. prompt_tokens: prompt length, tokens.
        predicted_output_tokens: the scenario's predictor's output length, tokens (the true
            length only under ``env.predictor = "oracle"``).
        waited_s: time since arrival, s. network_s: (n, D) uplink + downlink delay to each
            datacenter now (link degradation included), s.
        failed_over: the request was aborted by an outage and re-queued.
        cached_prefix_tokens: (n, D) prompt tokens of the request the prefix cache of the best
            engine of each datacenter holds now (``Simulator.cached_prefix_tokens``; whole prefix
            blocks), tokens; zeros without prefix caching or prefix hashes.
        session_id: the request's session (-1: none). session_dc: the datacenter that served
            the session's previous turn (-1: none, or a first turn); see
            :mod:`carbon_gym.sessions_state`.
    """

    seq: np.ndarray
    origin: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    predicted_output_tokens: np.ndarray
    waited_s: np.ndarray
    network_s: np.ndarray
    failed_over: np.ndarray
    cached_prefix_tokens: np.ndarray | None = None
    session_id: np.ndarray | None = None
    session_dc: np.ndarray | None = None

    def __post_init__(self) -> None:  # (None: no prefix workload; zeros / -1 of the right shapes)
        n = int(self.seq.shape[0])
        if self.cached_prefix_tokens is None:
            d = int(self.network_s.shape[1]) if self.network_s.ndim == 2 else 0
            object.__setattr__(self, "cached_prefix_tokens", np.zeros((n, d), dtype=np.int64))
        for name in ("session_id", "session_dc"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.full(n, -1, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.seq.shape[0])


@dataclass(frozen=True)
class EnvState:
    """The decision state of :class:`~carbon_gym.env.GeoServeEnv` at one step.

    Attributes:
        time_s: simulated time of the decision, s. hour_utc: UTC hour of day on the carbon
            clock, in [0, 24). elapsed_s: = time_s (seconds since the episode start).
        datacenters: :class:`DatacenterState`.
        pending: the visible pending requests (the K slots), :class:`PendingRequests`.
        pending_total: pending requests in total (visible + overflow beyond the K slots + blocked).
        pending_blocked: pending requests with no allowed datacenter now (they take no slot).
        action_mask: (n, D + 1) bool, allowed choices of each visible request (column D = defer).
        layout: the static facts (:class:`~carbon_gym.observation.ObservationLayout`: engines, KV
            blocks per engine, block size, max_num_seqs, nameplate power, SLO targets, names).
        capacity_control: the scenario's ``[capacity] control`` (``"always_on"``, ``"agent"`` or
            an autoscaler's name). capacity_decision: this step takes a capacity decision (the
            first step and every ``capacity.period_s`` after it; always False with
            ``always_on``). capacity_period_s: seconds between capacity decisions.
        engines_per_node: (D,) engines per server. servers: (D,) servers (nodes) per datacenter.
        capacity_target_engines, capacity_target_servers: (D,) the targets in force (awake
            engines, servers powered; all of them with ``always_on``).
        engine_capacity_per_s: requests/s one engine serves within the SLO targets, as measured
            for this model, GPU and TP (``carbon_gym/data/load_levels.toml``; NaN if unmeasured); a
            (D,) array, per datacenter, when the datacenters' GPUs differ.
    """

    time_s: float
    hour_utc: float
    elapsed_s: float
    datacenters: DatacenterState
    pending: PendingRequests
    pending_total: int
    action_mask: np.ndarray
    layout: ObservationLayout
    capacity_control: str = "always_on"
    capacity_decision: bool = False
    capacity_period_s: float = 0.0
    engines_per_node: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    servers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    capacity_target_engines: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    capacity_target_servers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    engine_capacity_per_s: float | np.ndarray = float("nan")
    pending_blocked: int = 0
