"""Capacity control in the env (``[capacity]``): the action's capacity part, the decision
schedule, the built-in autoscalers' drive and the capacity metrics (:class:`EnvCapacity`).

``control = "always_on"`` (default): nothing here touches the simulator (results unchanged bit
for bit) and the action is the routing ``MultiDiscrete``. ``control = "agent"``: the action is
a ``Dict``::

    {"route":    MultiDiscrete([D + 1] * K),     # as always: datacenter or defer per slot
     "capacity": MultiDiscrete(engines_d + 1),   # awake engines per datacenter
     "servers":  MultiDiscrete(servers_d + 1)}   # servers powered per datacenter

taken at each *capacity decision* (the first step and every ``capacity.period_s`` after it;
``EnvState.capacity_decision``); between decisions the capacity entries are ignored. A bare
route array, or a dict without ``"capacity"``, keeps the targets in force (routing-only policies
run as always-on); a dict without ``"servers"`` powers the servers the awake engines need.
The servers target is raised to what the awake target needs. Any other control is an
autoscaler's name (:mod:`carbon_gym.autoscalers`): the env asks it at each decision and the
policy only routes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from gymnasium import spaces

from .errors import ActionError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from .scenario import Scenario
    from .sim import Simulator

__all__ = ["EnvCapacity", "CAPACITY_MODES"]

CAPACITY_MODES = ("always_on", "agent")
#: Engine states of the energy-by-state metrics, in SimTotals.energy_by_state order.
STATE_KEYS = ("gpu_active", "gpu_idle", "gpu_falling_asleep", "gpu_asleep", "gpu_waking", "gpu_booting",
              "host_on", "host_standby", "host_off", "host_booting")


class EnvCapacity:
    """The capacity side of one :class:`~carbon_gym.env.GeoServeEnv` (see the module docstring).

    Args:
        scenario: the scenario (its ``capacity`` section).
        power_states: the power file's capacity states (None: the GPU's file has none).
        engines, servers, engines_per_node: (D,) per datacenter.
        polling_period_s: the env's step, s.
    """

    def __init__(self, scenario: Scenario, power_states: Any, engines: np.ndarray, servers: np.ndarray,
                 engines_per_node: np.ndarray, polling_period_s: float) -> None:
        from .autoscalers import available_autoscalers, make_autoscaler

        c = scenario.capacity
        self.control = c.control
        if c.control not in CAPACITY_MODES and c.control not in available_autoscalers():
            raise ConfigError("capacity.control", f"unknown value {c.control!r}",
                              allowed=[*CAPACITY_MODES, *available_autoscalers()], source=scenario.source or None)
        ratio = c.period_s / polling_period_s
        if c.control != "always_on" and (abs(ratio - round(ratio)) > 1e-9 or round(ratio) < 1):
            raise ConfigError("capacity.period_s", f"must be a positive multiple of polling_period_s="
                              f"{polling_period_s:g}, got {c.period_s:g}", source=scenario.source or None)
        if c.params and c.control == "always_on":
            raise ConfigError("capacity.params", "settings are for an autoscaler (control = its name, or 'agent' with "
                              "a POLICY+AUTOSCALER policy); control = 'always_on' takes none", allowed=[])
        self.active = c.control != "always_on"
        if self.active and power_states is None:
            raise ConfigError("capacity.control", f"{c.control!r} needs the capacity states of the GPU's power file "
                              f"([states] of power/{scenario.gpu}.toml), which it lacks", allowed=["always_on"])
        self.every = max(int(round(ratio)), 1)
        self.period_s = float(c.period_s)
        self.engines = np.asarray(engines, dtype=np.int64)
        self.servers = np.asarray(servers, dtype=np.int64)
        self.engines_per_node = np.asarray(engines_per_node, dtype=np.int64)
        from .scenario import load_load_levels

        measured = load_load_levels().find(scenario.model, scenario.gpu, scenario.tp)
        self.engine_capacity_per_s = float("nan") if measured is None else float(measured.per_engine_rate_per_s)
        self.autoscaler = make_autoscaler(c.control, None, **c.params_dict()) if self.active and c.control != "agent" else None
        self.reset()

    # ------------------------------------------------------------------ episode
    def reset(self) -> None:
        """A new episode: every engine awake, every server on."""
        self.target_engines = self.engines.copy()
        self.target_servers = self.servers.copy()
        self.decisions = 0
        self._awake_sum = np.zeros(len(self.engines))
        self._servers_sum = np.zeros(len(self.engines))
        self._samples = 0
        self._window_base: dict[str, np.ndarray] | None = None
        if self.autoscaler is not None:
            self.autoscaler.reset(None)

    def is_decision(self, step_index: int) -> bool:
        """Whether the step with this index (0 = the first) takes a capacity decision."""
        return self.active and step_index % self.every == 0

    # ------------------------------------------------------------------ action
    def action_space(self, route: spaces.MultiDiscrete) -> spaces.Space:
        """The env's action space: ``route`` alone, or the agent's ``Dict``."""
        if self.control != "agent":
            return route
        return spaces.Dict({"route": route, "capacity": spaces.MultiDiscrete(self.engines + 1),
                            "servers": spaces.MultiDiscrete(self.servers + 1)})

    def split(self, action: Any) -> tuple[Any, tuple[np.ndarray, np.ndarray] | None]:
        """(route part, checked capacity targets or None) of an action (agent mode); a bare
        route array gives no targets. Raises :class:`ActionError` naming the entry."""
        if self.control != "agent" or not isinstance(action, dict):
            return action, None
        unknown = set(action) - {"route", "capacity", "servers"}
        if unknown or "route" not in action:
            raise ActionError(f"a capacity action is a dict with keys 'route' (required), 'capacity', 'servers'; "
                              f"got keys {sorted(action)}")
        if "capacity" not in action:
            if "servers" in action:
                raise ActionError("action['servers'] needs action['capacity'] (the awake engines) with it")
            return action["route"], None
        awake = self._ints(action["capacity"], "capacity", self.engines)
        if "servers" in action and action["servers"] is not None:
            servers = self._ints(action["servers"], "servers", self.servers)
        else:
            servers = -(-awake // np.maximum(self.engines_per_node, 1))
        return action["route"], (awake, servers)

    def _ints(self, value: Any, key: str, high: np.ndarray) -> np.ndarray:
        a = np.asarray(value)
        D = len(high)
        if a.shape != (D,):
            raise ActionError(f"action[{key!r}] must have shape ({D},): one entry per datacenter; got shape {a.shape}")
        if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        if a.dtype.kind not in "iu":
            raise ActionError(f"action[{key!r}] must hold integers, got dtype {a.dtype}")
        bad = np.flatnonzero((a < 0) | (a > high))
        if bad.size:
            d = int(bad[0])
            raise ActionError(f"action[{key!r}][{d}] = {int(a[d])} is out of range for datacenter {d}: "
                              f"expected 0..{int(high[d])}")
        return a.astype(np.int64)

    def masks(self, route_mask: np.ndarray) -> dict[str, np.ndarray]:
        """Flat masks of each part (agent mode): the route mask, and every capacity value allowed."""
        return {"route": route_mask, "capacity": np.ones(int((self.engines + 1).sum()), dtype=bool),
                "servers": np.ones(int((self.servers + 1).sum()), dtype=bool)}

    # ------------------------------------------------------------------ decisions
    def decide(self, step_index: int, targets: tuple[np.ndarray, np.ndarray] | None, state: Callable[[], Any],
               sim: Simulator) -> None:
        """Apply this step's capacity decision: the agent's ``targets`` or, with an autoscaler, its
        decision on ``state()`` (at a decision step; nothing otherwise)."""
        if not self.is_decision(step_index):
            return
        if self.autoscaler is not None:
            d = self.autoscaler.decide(state())
            targets = (np.asarray(d.awake_engines, dtype=np.int64), np.asarray(d.servers_on, dtype=np.int64))
        if targets is None:
            return
        awake, servers = targets
        awake = np.clip(awake, 0, self.engines)
        servers = np.clip(np.maximum(servers, -(-awake // np.maximum(self.engines_per_node, 1))), 0, self.servers)
        self.decisions += 1
        for d in range(len(self.engines)):
            sim.set_capacity(d, int(awake[d]), int(servers[d]))
        self.target_engines = awake
        self.target_servers = servers

    def start_window(self, sim: Simulator) -> None:
        """The measurement window opens: the energy by state and the step averages count from now."""
        if self.active:
            self._window_base = sim.totals().energy_by_state()
            self._awake_sum[:] = 0.0
            self._servers_sum[:] = 0.0
            self._samples = 0

    def sample(self, snap_awake: np.ndarray, snap_servers: np.ndarray) -> None:
        """Count one step's awake engines and servers on (for the step-averaged metrics)."""
        self._awake_sum += snap_awake
        self._servers_sum += snap_servers
        self._samples += 1

    def state_fields(self, step_index: int) -> dict[str, Any]:
        """The capacity fields of :class:`~carbon_gym.state.EnvState`."""
        return {"capacity_control": self.control, "capacity_decision": self.is_decision(step_index),
                "capacity_period_s": self.period_s, "engines_per_node": self.engines_per_node.copy(),
                "servers": self.servers.copy(), "capacity_target_engines": np.asarray(self.target_engines).copy(),
                "capacity_target_servers": np.asarray(self.target_servers).copy(),
                "engine_capacity_per_s": self.engine_capacity_per_s}

    def metrics(self, sim: Simulator, pue: np.ndarray) -> dict[str, Any]:
        """Capacity metrics of the episode (only when capacity control is on): facility energy by
        power state (``energy_kwh_<state>``, kWh, summed over datacenters), step-averaged awake
        engines and servers on, wakes / boots / sleeps, requests that waited for a wake or boot.
        With a measurement window the energies and averages cover the window (the counts the
        whole episode)."""
        if not self.active:
            return {}
        by = sim.totals().energy_by_state()
        if self._window_base is not None:
            by = {k: v - self._window_base[k] for k, v in by.items()}
        out: dict[str, Any] = {f"energy_kwh_{k}": float((by[k] * pue).sum() / 3.6e6) for k in STATE_KEYS}
        n = max(self._samples, 1)
        out["mean_awake_engines"] = float(self._awake_sum.sum() / n)
        out["mean_servers_on"] = float(self._servers_sum.sum() / n)
        out["capacity_decisions"] = self.decisions
        counts = sim.capacity_counts()
        out.update({k: int(v) for k, v in counts.items()})
        return out
