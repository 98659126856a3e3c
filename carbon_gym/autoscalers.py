"""Built-in capacity autoscalers: how many engines stay awake and servers on per datacenter.

An autoscaler reads the typed state (:class:`~carbon_gym.state.EnvState`) at each capacity
decision (every ``capacity.period_s``) and returns a :class:`CapacityDecision`: a target number
of awake engines and of powered servers per datacenter. The env applies it through
:meth:`carbon_gym.sim.Simulator.set_capacity` (semantics: :mod:`carbon_gym.sim.capacity`). It
runs either inside the env (``[capacity] control = "reactive"``: the policy only routes) or
composed with a routing policy (``make_policy("rr+reactive", env)`` with ``control = "agent"``,
:class:`CapacityComposedPolicy`); both give the same decisions.

Built-ins (settings in ``[capacity.params]``, checked: unknown keys are refused):

``reactive``
    A serving autoscaler that looks at load, not carbon, in the manner of the Kubernetes HPA with
    hysteresis and a cool-down, sized by profiled per-replica capacity as LLM serving planners
    are (NVIDIA Dynamo's SLA planner). Per datacenter, the *utilisation* of the ``A`` engines
    awake or waking is the largest of (a) the arrival rate (``arrival_rate_per_s``, an EWMA over
    60 s) over ``A`` x the measured requests/s one engine serves within the SLO
    (``EnvState.engine_capacity_per_s``; without a measurement: requests in the datacenter over
    the batch at which the TPOT estimate reaches ``tpot_frac`` x the target), (b) requests queued
    per engine over ``queue_high`` and (c) the KV cache in use over ``kv_high``. Above
    ``up_util`` it scales up at once to ``ceil(A x util / target_util)``; below ``down_util`` for
    ``cooldown_s`` in a row it scales down to that value (at most ``max_step_down_frac`` of its
    engines per decision); never below ``min_engines``. Servers: the nodes the target needs plus
    ``spare_engines`` worth of headroom (whole nodes whose engines all sleep power off; a boot
    takes minutes, a wake about a second).
``carbon-aware``
    The reactive targets, capped in dirty hours as carbon-aware cluster autoscalers do (KEDA's
    carbon-aware scaler: fewer replicas allowed when the grid is dirty): a datacenter whose
    intensity now is above the ``dirty_quantile`` of the fleet's intensities keeps at most
    ``dirty_cap_frac`` of its engines awake (at least ``min_engines``).

Register your own with :func:`register_autoscaler`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from .state import EnvState

__all__ = ["CapacityDecision", "ReactiveSettings", "ReactiveAutoscaler", "CarbonAwareAutoscaler",
           "CapacityComposedPolicy", "register_autoscaler", "make_autoscaler", "available_autoscalers"]


@dataclass(frozen=True)
class CapacityDecision:
    """Targets per datacenter (arrays of length D): ``awake_engines`` engines awake,
    ``servers_on`` servers (nodes) powered (raised by the simulator to what the awake engines need)."""

    awake_engines: np.ndarray
    servers_on: np.ndarray


@dataclass(frozen=True)
class ReactiveSettings:
    """Settings of the reactive autoscaler (``[capacity.params]``; fractions are of 1)."""

    target_util: float = 0.6      # utilisation the targets aim at
    up_util: float = 0.8          # scale up at once above this utilisation
    down_util: float = 0.35       # scale down below this utilisation ...
    cooldown_s: float = 60.0      # ... held this many seconds in a row
    max_step_down_frac: float = 0.5  # at most this share of the awake engines per scale-down
    queue_high: float = 4.0       # requests queued per engine counted as full
    tpot_frac: float = 0.8        # (no measured capacity) n*: the batch at which the TPOT estimate reaches this x the target
    kv_high: float = 0.9          # KV cache in use counted as full
    min_engines: int = 1          # per datacenter
    spare_engines: int = 0        # awake headroom kept on powered servers, engines
    # carbon-aware only
    dirty_quantile: float = 0.5   # a datacenter above this quantile of the fleet's intensity now is dirty
    dirty_cap_frac: float = 0.25  # share of its engines a dirty datacenter may keep awake

    @classmethod
    def from_params(cls, params: dict[str, Any], allowed: tuple[str, ...] | None = None) -> ReactiveSettings:
        """Settings from ``[capacity.params]``, each checked (ConfigError naming the field)."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        allowed = tuple(names) if allowed is None else allowed
        out: dict[str, Any] = {}
        for k, v in params.items():
            if k not in allowed:
                raise ConfigError(f"capacity.params.{k}", "unknown setting of this autoscaler", allowed=sorted(allowed))
            want_int = names[k].type in ("int", int)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (want_int and not isinstance(v, int)):
                raise ConfigError(f"capacity.params.{k}", f"expected {'an integer' if want_int else 'a number'}, got {v!r}")
            if not math.isfinite(float(v)) or v < 0:
                raise ConfigError(f"capacity.params.{k}", f"must be finite and >= 0, got {v!r}")
            out[k] = v
        s = cls(**out)
        for k in ("target_util", "up_util", "tpot_frac", "kv_high", "dirty_cap_frac", "max_step_down_frac"):
            if not 0.0 < getattr(s, k) <= 1.0:
                raise ConfigError(f"capacity.params.{k}", f"must be in (0, 1], got {getattr(s, k)!r}")
        for k in ("down_util", "dirty_quantile"):
            if not 0.0 <= getattr(s, k) <= 1.0:
                raise ConfigError(f"capacity.params.{k}", f"must be in [0, 1], got {getattr(s, k)!r}")
        if not s.down_util < s.target_util < s.up_util:
            raise ConfigError("capacity.params", f"needs down_util < target_util < up_util, got {s.down_util}, "
                              f"{s.target_util}, {s.up_util}")
        return s


class ReactiveAutoscaler:
    """Load-driven targets with hysteresis and a cool-down (see the module docstring)."""

    name = "reactive"
    _PARAMS: tuple[str, ...] = ("target_util", "up_util", "down_util", "cooldown_s", "max_step_down_frac", "queue_high",
                                "tpot_frac",
                                "kv_high", "min_engines", "spare_engines")

    def __init__(self, env: Any = None, **params: Any) -> None:
        self.settings = ReactiveSettings.from_params(params, self._PARAMS)
        self._low_since_s: np.ndarray | None = None

    def reset(self, env: Any = None) -> None:
        """Forget the cool-down timers (a new episode)."""
        self._low_since_s = None

    def utilisation(self, state: EnvState) -> np.ndarray:
        """(D,) utilisation of the engines awake or waking (see the module docstring)."""
        s = self.settings
        dc = state.datacenters
        L = state.layout
        awake = np.maximum(dc.awake_engines + dc.waking_engines, 1).astype(np.float64)
        cap = state.engine_capacity_per_s  # (a float, or (D,) when the datacenters' GPUs differ)
        measured = np.isfinite(cap) & (np.nan_to_num(cap) > 0)  # the measured requests/s one engine serves within the SLO
        if np.all(measured):
            rate = dc.arrival_rate_per_s / (awake * cap)
        elif not np.any(measured):
            rate = self._estimated_rate(state, awake)
        else:  # (some datacenters' GPUs measured, some not)
            rate = np.where(measured, dc.arrival_rate_per_s / (awake * np.where(measured, cap, 1.0)),
                            self._estimated_rate(state, awake))
        queue = dc.queue_len / (awake * s.queue_high)
        kv_used = np.maximum(dc.total_kv_blocks - dc.free_kv_blocks, 0) / np.maximum(awake * L.engine_kv_blocks, 1)
        return np.maximum(np.maximum(rate, queue), kv_used / s.kv_high)

    def _estimated_rate(self, state: EnvState, awake: np.ndarray) -> np.ndarray:
        """No measurement: requests in the datacenter over the batch n* the TPOT target allows."""
        s = self.settings
        dc = state.datacenters
        L = state.layout
        slope = np.where(np.isfinite(dc.tpot_slope_s_per_seq) & (dc.tpot_slope_s_per_seq > 0),
                         dc.tpot_slope_s_per_seq, np.inf)
        tpot_now = np.where(np.isfinite(dc.est_tpot_s), dc.est_tpot_s, 0.0)
        n_star = dc.running / awake + 1.0 + (s.tpot_frac * L.tpot_target_s - tpot_now) / slope
        n_star = np.clip(np.nan_to_num(n_star, nan=1.0, posinf=float(L.max_num_seqs)), 1.0, float(L.max_num_seqs))
        return (dc.running + dc.queue_len) / awake / n_star

    def targets(self, state: EnvState) -> np.ndarray:
        """(D,) awake-engine targets before any cap."""
        s = self.settings
        dc = state.datacenters
        n = np.asarray(state.layout.n_engines, dtype=np.int64)
        awake = (dc.awake_engines + dc.waking_engines).astype(np.int64)
        u = self.utilisation(state)
        want = np.ceil(np.maximum(awake, 1) * u / s.target_util - 1e-9).astype(np.int64)
        if self._low_since_s is None:
            self._low_since_s = np.full(len(n), np.nan)
        low = u < s.down_util
        since = self._low_since_s
        since[~low] = np.nan
        since[low & np.isnan(since)] = state.time_s
        out = awake.copy()
        up = u > s.up_util
        out[up] = np.maximum(want[up], awake[up])
        down = low & (state.time_s - since >= s.cooldown_s)
        floor = np.ceil(awake * (1.0 - s.max_step_down_frac)).astype(np.int64)
        out[down] = np.maximum(want[down], floor[down])
        since[down] = np.nan  # the cool-down starts again after a scale-down
        return np.clip(out, np.minimum(s.min_engines, n), n)

    def servers(self, state: EnvState, awake: np.ndarray) -> np.ndarray:
        """(D,) servers to keep powered for ``awake`` engines plus the headroom."""
        epn = np.maximum(state.engines_per_node, 1)
        need = -(-(awake + self.settings.spare_engines) // epn)
        return np.minimum(need, state.servers)

    def decide(self, state: EnvState) -> CapacityDecision:
        """The targets of this capacity decision."""
        a = self.targets(state)
        up = state.datacenters.up
        a = np.where(up, a, state.capacity_target_engines)  # a datacenter that is down keeps its targets
        return CapacityDecision(awake_engines=a, servers_on=np.where(up, self.servers(state, a), state.capacity_target_servers))


class CarbonAwareAutoscaler(ReactiveAutoscaler):
    """The reactive targets capped in a datacenter's dirty hours (see the module docstring)."""

    name = "carbon-aware"
    _PARAMS = ReactiveAutoscaler._PARAMS + ("dirty_quantile", "dirty_cap_frac")

    def targets(self, state: EnvState) -> np.ndarray:
        s = self.settings
        a = super().targets(state)
        dc = state.datacenters
        n = np.asarray(state.layout.n_engines, dtype=np.int64)
        g = np.where(np.isfinite(dc.carbon_g_per_kwh), dc.carbon_g_per_kwh, np.nan)
        live = dc.up & np.isfinite(g)
        if not live.any():
            return a
        threshold = float(np.quantile(g[live], s.dirty_quantile))
        dirty = live & (g > threshold)
        cap = np.maximum(np.ceil(n * s.dirty_cap_frac).astype(np.int64), np.minimum(s.min_engines, n))
        return np.where(dirty, np.minimum(a, cap), a)


_AUTOSCALERS: dict[str, Callable[..., Any]] = {"reactive": ReactiveAutoscaler, "carbon-aware": CarbonAwareAutoscaler}


def register_autoscaler(name: str, factory: Callable[..., Any]) -> None:
    """Add an autoscaler: ``factory(env, **params)`` returning an object with ``reset(env)`` and
    ``decide(state) -> CapacityDecision``; it becomes usable as ``[capacity] control = name`` and
    as ``POLICY+name``."""
    if not name or "+" in name or name in ("always_on", "agent"):
        raise ConfigError("name", f"{name!r} cannot name an autoscaler (no '+', not 'always_on' or 'agent')")
    _AUTOSCALERS[name] = factory


def available_autoscalers() -> list[str]:
    """Names of the registered autoscalers."""
    return sorted(_AUTOSCALERS)


def make_autoscaler(name: str, env: Any = None, **params: Any) -> Any:
    """Build autoscaler ``name`` with its settings (ConfigError for an unknown name or setting)."""
    if name not in _AUTOSCALERS:
        raise ConfigError("capacity.control", f"unknown autoscaler {name!r}",
                          allowed=["always_on", "agent", *available_autoscalers()])
    return _AUTOSCALERS[name](env, **params)


class CapacityComposedPolicy:
    """A routing policy with an autoscaler deciding capacity (registered names ``POLICY+AUTOSCALER``,
    e.g. ``rr+reactive``). Needs an env with ``[capacity] control = "agent"``; at each capacity
    decision the action is ``{"route": ..., "capacity": ..., "servers": ...}``, else the route alone."""

    def __init__(self, router: Any, autoscaler: Any, env: Any, name: str = "") -> None:
        base = getattr(env, "unwrapped", env)
        control = getattr(getattr(getattr(base, "scenario", None), "capacity", None), "control", None)
        if control != "agent":
            raise ConfigError("capacity.control", f"policy {name or 'POLICY+AUTOSCALER'!r} decides capacity: run it "
                              f"with capacity.control = 'agent' (this env has {control!r})", allowed=["agent"])
        self.router = router
        self.autoscaler = autoscaler
        self.env = base
        self.name = name

    def reset(self, env: Any = None) -> None:
        if hasattr(self.router, "reset"):
            self.router.reset(env) if env is not None else self.router.reset()
        self.autoscaler.reset(env)

    def act(self, observation: Any, info: dict[str, Any]) -> Any:
        route = self.router.act(observation, info)
        state = self.env.state()
        if not state.capacity_decision:
            return route
        d = self.autoscaler.decide(state)
        return {"route": route, "capacity": d.awake_engines, "servers": d.servers_on}

    def __getattr__(self, name: str) -> Any:  # solver statistics etc. of the router
        if name.startswith("_") or name in ("router", "autoscaler", "env", "name"):
            raise AttributeError(name)
        return getattr(self.router, name)
