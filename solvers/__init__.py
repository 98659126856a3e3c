"""Schedulers for carbon_gym: baselines, per-request ILPs and the facility MILP.

Every scheduler is a :class:`carbon_gym.policy.Policy` (``act(observation, info) -> action``)
built on :class:`solvers.base.Scheduler`; the core of each is ``place(PlacementProblem) ->
assignment``, usable without an env (see :mod:`solvers.problem`).

    import gymnasium as gym, carbon_gym
    from carbon_gym.policy import rollout
    from solvers import make_policy

    env = gym.make("carbon_gym/GeoServe-v0", scenario="dev")
    metrics = rollout(env, make_policy("facility-milp", env), seed=0)

Registered names (:func:`available_policies`):

================  ==========================================================================
round-robin       reference: cycle over the allowed datacenters
carbon-greedy     lowest current carbon intensity, load-blind
least-loaded      lowest estimated latency (state updated per placement), carbon-blind
planner           "earlier studies": shares re-planned every 15 min from carbon + static latency
planner-1h        the same, re-planned every hour
ilp-static        per-request ILP, load-independent latency
ilp-state         per-request ILP, state-aware latency (estimates updated after each placement)
facility-milp     facility MILP (shared per-datacenter engine energy), HiGHS
facility-greedy   state-aware greedy on the facility objective (the MILP's fallback)
================  ==========================================================================
"""

from __future__ import annotations

from typing import Any, Callable

from carbon_gym.errors import ConfigError

from .problem import PlacementProblem, synthetic_problem

__all__ = ["make_policy", "available_policies", "POLICY_ALIASES", "PlacementProblem", "synthetic_problem"]


def _factories() -> dict[str, Callable[..., Any]]:
    from .baselines import CarbonGreedy, LeastLoaded, RoundRobin, SharePlanner
    from .facility import FacilityGreedy, FacilityMILP
    from .per_request import PerRequestILP

    def planner(env: Any = None, **kw: Any) -> Any:
        return SharePlanner(env, **kw)

    def planner_1h(env: Any = None, **kw: Any) -> Any:
        kw.setdefault("replan_s", 3600.0)
        pol = SharePlanner(env, **kw)
        pol.name = "planner-1h"
        return pol

    return {
        "round-robin": RoundRobin,
        "carbon-greedy": CarbonGreedy,
        "least-loaded": LeastLoaded,
        "planner": planner,
        "planner-1h": planner_1h,
        "ilp-static": lambda env=None, **kw: PerRequestILP(env, state_aware=False, **kw),
        "ilp-state": lambda env=None, **kw: PerRequestILP(env, state_aware=True, **kw),
        "facility-milp": FacilityMILP,
        "facility-greedy": FacilityGreedy,
    }


POLICY_ALIASES: dict[str, str] = {
    "rr": "round-robin",
    "greedy": "carbon-greedy",
    "ilp": "ilp-static",
    "milp": "facility-milp",
    "milp-greedy": "facility-greedy",
}
"""Short names (used in result tables and on command lines) -> registry names; the one table
that ``make_policy``, the evaluation harness and the training evaluation all resolve with."""


def available_policies() -> list[str]:
    """Names accepted by :func:`make_policy`, in the order of the comparison table."""
    return list(_factories())


def make_policy(name: str, env: Any = None, **kwargs: Any) -> Any:
    """Build the scheduler registered as ``name`` for ``env`` (keyword arguments go to its
    constructor, e.g. ``make_policy("facility-milp", env, time_limit_s=0.1)``)."""
    factories = _factories()
    name = POLICY_ALIASES.get(name, name)
    if name not in factories:
        raise ConfigError("policy", f"unknown policy {name!r}",
                          allowed=list(factories) + [f"{k} (= {v})" for k, v in POLICY_ALIASES.items()])
    try:
        return factories[name](env, **kwargs)
    except TypeError as exc:
        raise ConfigError("policy", f"bad arguments for {name!r}: {exc}") from None
