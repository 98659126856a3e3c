"""Faults as part of the world: outages, degraded links, carbon-feed gaps, engine drains.

A scenario lists its faults as ``[[faults]]`` tables; times are seconds of simulated time since
the episode start, ``end_s`` is optional (default: the fault lasts to the end of the episode)::

    [[faults]]
    kind = "datacenter_outage"      # the datacenter goes down, then comes back (idle, empty)
    datacenter = "de"
    start_s = 20.0
    end_s = 40.0

    [[faults]]
    kind = "region_outage"          # every datacenter located in the region goes down
    region = "europe"
    start_s = 20.0

    [[faults]]
    kind = "link_degradation"       # region's clients -> datacenters: RTT x factor, or cut
    region = "europe"
    datacenters = ["fr"]            # default: every datacenter
    rtt_factor = 5.0                # or: cut = true (unreachable: masked for that region)
    start_s = 10.0
    end_s = 30.0

    [[faults]]
    kind = "carbon_feed_gap"        # schedulers see stale or missing intensity
    mode = "stale"                  # "stale": last values before the gap; "missing": NaN + flag
    datacenters = ["de"]            # default: every datacenter
    start_s = 0.0
    end_s = 30.0

    [[faults]]
    kind = "engine_drain"           # maintenance: engines stop taking work, finish, power off
    datacenter = "fr"
    engines = 4
    power_off = true                # false: drained engines idle at idle power
    start_s = 10.0
    end_s = 50.0

**Semantics.**

* *Outage* (datacenter or region): at ``start_s`` every request queued, running or in transit
  to the datacenter is aborted, its progress lost (its energy so far stays accounted as wasted
  work); the env puts it back in the pending queue with its original arrival time (its wait
  keeps counting in its TTFT) and the policy places it again: it is *failed over*. While down
  the datacenter draws nothing, refuses submissions and is masked. Overlapping outages of the
  same datacenter (e.g. its own and its region's) keep it down until the last one ends.
* *Link degradation*: the one-way delay from the region's clients to each listed datacenter is
  multiplied by ``rtt_factor`` (several active factors multiply) for requests sent from
  ``start_s``; requests already sent keep their delays. A cut link masks the datacenter for
  requests from that region; requests still travelling over it when it is cut are lost and
  failed over like an outage's (they had done no work, so none is wasted); requests already at
  the datacenter complete normally.
* *Carbon-feed gap*: the observation's carbon columns (now and forecast) for the listed
  datacenters freeze at their values at ``start_s`` ("stale") or are unknown ("missing": 0 in
  the raw observation, NaN in the typed state and from :func:`carbon_gym.observation.decode_observation`);
  the env adds two flag columns (``carbon_stale``, ``carbon_missing``) to the datacenter rows of
  scenarios that have a gap (the env builds that view from :meth:`FaultRuntime.feed_state`). The simulator still accounts the real emissions.
* *Engine drain*: the last ``engines`` engines (by index) of the datacenter take no new
  requests (their queued ones move to the other engines), finish their running batches, then
  draw 0 W (``power_off``) until ``end_s``. A datacenter whose engines all drain is masked
  ("no capacity"); requests already on their way there are still served by them.

**Resolution.** The env applies each fault at its exact time: it advances the simulator in
sub-steps to the fault's time, applies it, and continues (:meth:`FaultRuntime.advance`). At
equal times, fault ends are applied before starts. Requests a fault aborts between two
decisions are seen by the policy at the next decision. Faults keep applying during the
end-of-episode drain.

Fail-over is implemented in the env (not the simulator) because re-placing a request is a
scheduling decision: the simulator only aborts and reports (see
:meth:`carbon_gym.sim.Simulator.set_datacenter_up`).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .scenario import Scenario
    from .sim import Simulator
    from .sim.records import AbortedRequests
    from .topology import Topology

from .schema import Ctx, boolean, integer, list_of, num, parse_table, spec, string

__all__ = [
    "FAULT_KINDS",
    "DatacenterOutage",
    "RegionOutage",
    "LinkDegradation",
    "CarbonFeedGap",
    "EngineDrain",
    "parse_faults",
    "scenario_faults",
    "has_carbon_feed_gap",
    "FaultRuntime",
    "FaultEvent",
]

_T = num(0, 366 * 86400)


@dataclass(frozen=True)
class DatacenterOutage:
    """One datacenter is down from ``start_s`` to ``end_s`` (seconds; None = to the end)."""

    kind: str = spec(string(("datacenter_outage",)), "fault kind")
    datacenter: str = spec(string(), "datacenter name")
    start_s: float = spec(_T, "start, s since the episode start")
    end_s: float | None = spec(_T, "end, s (default: never)", None)


@dataclass(frozen=True)
class RegionOutage:
    """Every datacenter located in ``region`` is down from ``start_s`` to ``end_s``."""

    kind: str = spec(string(("region_outage",)), "fault kind")
    region: str = spec(string(), "region name")
    start_s: float = spec(_T, "start, s since the episode start")
    end_s: float | None = spec(_T, "end, s (default: never)", None)


@dataclass(frozen=True)
class LinkDegradation:
    """RTT from ``region``'s clients to ``datacenters`` multiplied by ``rtt_factor``, or cut."""

    kind: str = spec(string(("link_degradation",)), "fault kind")
    region: str = spec(string(), "origin region name")
    start_s: float = spec(_T, "start, s since the episode start")
    end_s: float | None = spec(_T, "end, s (default: never)", None)
    datacenters: tuple[str, ...] | None = spec(list_of(string(), min_len=1), "datacenter names (default: all)", None)
    rtt_factor: float | None = spec(num(1.0, 1e4), "RTT multiplier (>= 1)", None)
    cut: bool = spec(boolean(), "true: the link is unreachable", False)


@dataclass(frozen=True)
class CarbonFeedGap:
    """The carbon-intensity feed of ``datacenters`` stops from ``start_s`` to ``end_s``."""

    kind: str = spec(string(("carbon_feed_gap",)), "fault kind")
    start_s: float = spec(_T, "start, s since the episode start")
    end_s: float | None = spec(_T, "end, s (default: never)", None)
    mode: str = spec(string(("stale", "missing")), "stale: last values; missing: unknown (NaN + flag)", "stale")
    datacenters: tuple[str, ...] | None = spec(list_of(string(), min_len=1), "datacenter names (default: all)", None)


@dataclass(frozen=True)
class EngineDrain:
    """``engines`` engines of ``datacenter`` drained for maintenance from ``start_s`` to ``end_s``."""

    kind: str = spec(string(("engine_drain",)), "fault kind")
    datacenter: str = spec(string(), "datacenter name")
    engines: int = spec(integer(1, 1_000_000), "number of engines drained (the last ones by index)")
    start_s: float = spec(_T, "start, s since the episode start")
    end_s: float | None = spec(_T, "end, s (default: never)", None)
    power_off: bool = spec(boolean(), "drained engines draw 0 W once empty (false: idle power)", True)


FAULT_KINDS: dict[str, type] = {
    "datacenter_outage": DatacenterOutage,
    "region_outage": RegionOutage,
    "link_degradation": LinkDegradation,
    "carbon_feed_gap": CarbonFeedGap,
    "engine_drain": EngineDrain,
}
"""Fault kind (the ``kind`` field) -> its dataclass."""

Fault = Any  # one of the dataclasses above


def parse_faults(raw: Sequence[Any], topology: Topology, *, duration_s: float, tp: int = 1,  # noqa: C901
                 source: str | None = None, warn: bool = True) -> tuple[Fault, ...]:
    """Validate ``[[faults]]`` tables against a topology; return the fault dataclasses.

    A fault starting at or after ``duration_s`` is allowed (it can only act during the
    end-of-episode drain) with a ``UserWarning`` when ``warn``.

    Errors are :class:`~carbon_gym.errors.ConfigError` naming the field (``faults[i].name``),
    with the allowed values (fault kinds, datacenter or region names, ranges).
    """
    ctx = Ctx(source)
    dc_names = [d.name for d in topology.datacenters]
    regions = list(topology.regions)
    if not isinstance(raw, (list, tuple)):
        raise ctx.err("faults", f"expected an array of tables ([[faults]]), got {raw!r}")
    out = []
    for i, item in enumerate(raw):
        path = f"faults[{i}]"
        if not isinstance(item, dict):
            raise ctx.err(path, f"expected a table, got {item!r}")
        kind = item.get("kind")
        if kind is None:
            raise ctx.err(f"{path}.kind", "required field is missing", allowed=list(FAULT_KINDS))
        if not isinstance(kind, str) or kind not in FAULT_KINDS:
            raise ctx.err(f"{path}.kind", f"unknown fault kind {kind!r}", allowed=list(FAULT_KINDS))
        f = parse_table(FAULT_KINDS[kind], item, path, ctx)
        if f.end_s is not None and f.end_s <= f.start_s:
            raise ctx.err(f"{path}.end_s", f"must be after start_s = {f.start_s}, got {f.end_s}", allowed=f"> {f.start_s}")
        if f.start_s >= duration_s and warn:
            warnings.warn(f"{source + ': ' if source else ''}{path}.start_s = {f.start_s} s is not within the episode "
                          f"(duration_s = {duration_s}): the fault applies only during the end-of-episode drain, "
                          "if at all", UserWarning, stacklevel=4)
        if hasattr(f, "datacenter") and f.datacenter not in dc_names:
            raise ctx.err(f"{path}.datacenter", f"unknown datacenter {f.datacenter!r}", allowed=dc_names)
        if hasattr(f, "region") and f.region not in regions:
            raise ctx.err(f"{path}.region", f"unknown region {f.region!r}", allowed=regions)
        for j, name in enumerate(getattr(f, "datacenters", None) or ()):
            if name not in dc_names:
                raise ctx.err(f"{path}.datacenters[{j}]", f"unknown datacenter {name!r}", allowed=dc_names)
        if isinstance(f, LinkDegradation):
            if f.cut == (f.rtt_factor is not None):
                raise ctx.err(f"{path}.rtt_factor", "give either rtt_factor (RTT multiplier) or cut = true, not both"
                              if f.cut else "give rtt_factor (RTT multiplier >= 1) or cut = true")
        if isinstance(f, EngineDrain):
            d = topology.datacenters[dc_names.index(f.datacenter)]
            n_eng = d.engines(tp)
            if f.engines > n_eng:
                raise ctx.err(f"{path}.engines", f"datacenter {f.datacenter!r} has {n_eng} engines, got {f.engines}",
                              allowed=f"[1, {n_eng}]")
        out.append(f)
    return tuple(out)


def scenario_faults(scenario: Scenario) -> tuple[Fault, ...]:
    """The validated faults of a scenario (empty tuple when it has none)."""
    if not scenario.faults:
        return ()
    return parse_faults(scenario.faults, scenario.topology_spec(), duration_s=scenario.duration_s, tp=scenario.tp,
                        source=scenario.source or None, warn=False)  # warned at load time


def has_carbon_feed_gap(scenario: Scenario) -> bool:
    """Whether the scenario has a carbon-feed gap (its observation then has the two flag columns)."""
    return any(isinstance(x, dict) and x.get("kind") == "carbon_feed_gap" for x in (scenario.faults or ()))


@dataclass(frozen=True)
class FaultEvent:
    """A fault starting or ending: ``time_s``, ``index`` (into the scenario's faults), ``start``."""

    time_s: float
    index: int
    start: bool
    kind: str


class FaultRuntime:
    """Applies a scenario's faults to one simulator as simulated time passes (one per episode).

    Args:
        faults: validated faults (:func:`parse_faults`).
        sim: the episode's :class:`~carbon_gym.sim.Simulator`.

    Attributes: ``failed_over`` (requests aborted by outages so far), ``applied`` (list of
    :class:`FaultEvent` applied so far), ``events`` (all of them, in order).
    """

    def __init__(self, faults: Sequence[Fault], sim: Simulator) -> None:
        self.faults = tuple(faults)
        self.sim = sim
        topo = sim.topology
        self._dc_index = {d.name: i for i, d in enumerate(topo.datacenters)}
        self._region_index = {r: i for i, r in enumerate(topo.regions)}
        self._dc_region = [d.region for d in topo.datacenters]
        D, R = len(topo.datacenters), len(topo.regions)
        self.D, self.R = D, R
        events = []
        for i, f in enumerate(self.faults):
            events.append(FaultEvent(float(f.start_s), i, True, f.kind))
            if f.end_s is not None:
                events.append(FaultEvent(float(f.end_s), i, False, f.kind))
        # ends before starts at equal times; then scenario order
        self.events = sorted(events, key=lambda e: (e.time_s, e.start, e.index))
        self._pos = 0
        self.applied: list[FaultEvent] = []
        self.failed_over = 0
        self._down = np.zeros(D, dtype=np.int64)
        self._base_one_way = np.array(sim.network.one_way_s, dtype=np.float64)
        self._factors: dict[int, tuple[list[tuple[int, int]], float]] = {}
        self._cut = np.zeros((R, D), dtype=np.int64)
        self._drains: dict[int, dict[int, tuple[int, bool]]] = {}
        self._gaps: dict[int, tuple[tuple[int, ...], str]] = {}
        self._frozen: dict[float, tuple[np.ndarray, np.ndarray]] = {}  # carbon at a gap start: (now (D,), forecast (D, H))

    # ------------------------------------------------------------------ time
    def advance(self, t_s: float) -> list[AbortedRequests]:
        """Advance the simulator to ``t_s``, applying every fault event with time <= ``t_s`` at
        its time; return the :class:`~carbon_gym.sim.AbortedRequests` of the outages that began."""
        sim = self.sim
        aborted = []
        while self._pos < len(self.events) and self.events[self._pos].time_s <= t_s:
            ev = self.events[self._pos]
            self._pos += 1
            if ev.time_s > sim.now_s:
                sim.advance_to(ev.time_s)
            ab = self._apply(ev)
            self.applied.append(ev)
            if ab:
                aborted.extend(ab)
        sim.advance_to(t_s)
        return aborted

    # ------------------------------------------------------------------ applying
    def _dcs(self, names: Sequence[str] | None) -> list[int]:
        return list(range(self.D)) if names is None else [self._dc_index[n] for n in names]

    def _apply(self, ev: FaultEvent) -> list[AbortedRequests]:  # noqa: C901
        f = self.faults[ev.index]
        sim = self.sim
        out = []
        if isinstance(f, (DatacenterOutage, RegionOutage)):
            if isinstance(f, DatacenterOutage):
                dcs = [self._dc_index[f.datacenter]]
            else:
                dcs = [i for i, r in enumerate(self._dc_region) if r == f.region]
            for d in dcs:
                if ev.start:
                    self._down[d] += 1
                    if self._down[d] == 1:
                        ab = sim.set_datacenter_up(d, False)
                        self.failed_over += len(ab)
                        if len(ab):
                            out.append(ab)
                else:
                    self._down[d] -= 1
                    if self._down[d] == 0:
                        sim.set_datacenter_up(d, True)
        elif isinstance(f, LinkDegradation):
            r = self._region_index[f.region]
            pairs = [(r, d) for d in self._dcs(f.datacenters)]
            if f.cut:
                for rr, d in pairs:
                    self._cut[rr, d] += 1 if ev.start else -1
                    if ev.start and self._cut[rr, d] == 1 and self._down[d] == 0:
                        # requests on their way over the link are lost: fail-over
                        ab = sim.abort_in_transit(rr, d)
                        self.failed_over += len(ab)
                        if len(ab):
                            out.append(ab)
            else:
                if ev.start:
                    assert f.rtt_factor is not None  # (parse_faults: rtt_factor or cut)
                    self._factors[ev.index] = (pairs, float(f.rtt_factor))
                else:
                    self._factors.pop(ev.index, None)
                for rr, d in pairs:
                    fac = 1.0
                    for ps, x in self._factors.values():
                        if (rr, d) in ps:
                            fac *= x
                    sim.set_link_delay(rr, d, self._base_one_way[rr, d] * fac)
        elif isinstance(f, CarbonFeedGap):
            if ev.start:
                self._gaps[ev.index] = (tuple(self._dcs(f.datacenters)), f.mode)
            else:
                self._gaps.pop(ev.index, None)
        elif isinstance(f, EngineDrain):
            d = self._dc_index[f.datacenter]
            active = self._drains.setdefault(d, {})
            if ev.start:
                active[ev.index] = (int(f.engines), bool(f.power_off))
            else:
                active.pop(ev.index, None)
            n = sum(x[0] for x in active.values())
            power_off = all(x[1] for x in active.values()) if active else True
            sim.set_engines_draining(d, min(n, sim.datacenters[d].n_engines), power_off)
        return out

    # ------------------------------------------------------------------ views for the env
    @property
    def link_cut(self) -> np.ndarray:
        """(R, D) bool: links cut now (region's clients cannot reach the datacenter)."""
        return self._cut > 0

    def one_way_delta_s(self) -> np.ndarray:
        """(R, D) current one-way delay minus the scenario's, seconds (link degradation)."""
        return np.asarray(self.sim.network.one_way_s, dtype=np.float64) - self._base_one_way

    def accepting(self) -> np.ndarray:
        """(D,) bool: datacenters that take new requests now (up, with an engine not draining)."""
        return np.array([dc.accepting_engines > 0 for dc in self.sim.datacenters], dtype=bool)

    def feed_state(self) -> tuple[np.ndarray, np.ndarray]:
        """``(stale_since_s, missing)``: per datacenter (D,), the start of the active feed gap
        (NaN when the feed is live) and whether any active gap there is "missing"."""
        since = np.full(self.D, np.nan)
        missing = np.zeros(self.D, dtype=bool)
        for i, (dcs, mode) in self._gaps.items():
            t0 = float(self.faults[i].start_s)
            for d in dcs:
                if not (since[d] <= t0):
                    since[d] = t0
                if mode == "missing":
                    missing[d] = True
        return since, missing

    def carbon_view(self, now_g_per_kwh: np.ndarray, forecast_g_per_kwh: np.ndarray,
                    forecast_at: Callable[[float], np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """Carbon as the feed reports it during a carbon-feed gap: ``(now_g_per_kwh (D,),
        forecast_g_per_kwh (D, H), stale, missing)`` from the true values given; a stale feed
        holds the values at the gap's start (``forecast_at(t_s)`` gives the (D, H) forecast
        issued at t_s), a missing one NaN. None when no gap is active."""
        since, missing = self.feed_state()
        stale = ~np.isnan(since)
        if not stale.any():
            return None
        now_g = now_g_per_kwh.copy()
        fc_g = forecast_g_per_kwh.copy()
        for d in np.flatnonzero(stale):
            if missing[d]:
                now_g[d] = np.nan
                fc_g[d] = np.nan
                continue
            t0 = float(since[d])
            frozen = self._frozen.get(t0)
            if frozen is None:
                vals = np.array([x.intensity(t0) for x in self.sim.datacenters])
                frozen = self._frozen[t0] = (vals, forecast_at(t0))
            now_g[d] = frozen[0][d]
            fc_g[d] = frozen[1][d]
        return now_g, fc_g, stale, missing

    def masked_reason(self, origin: int, d: int) -> str | None:
        """Why the fault state masks datacenter ``d`` for a request from ``origin`` (None if not)."""
        dc = self.sim.datacenters[d]
        if not dc.up:
            return "the datacenter is down (outage)"
        if self._cut[origin, d] > 0:
            return f"the link from region {origin} is cut"
        if dc.accepting_engines == 0:
            return "all its engines are drained for maintenance"
        return None


def without_faults(scenario: Scenario) -> Scenario:
    """The same scenario with its ``[[faults]]`` removed (for paired fault / no-fault runs)."""
    return dataclasses.replace(scenario, faults=())
