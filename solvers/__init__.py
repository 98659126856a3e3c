"""Schedulers for carbon_gym: baselines, per-request ILPs and the facility MILP.

Every scheduler is a :class:`carbon_gym.policy.Policy` (``act(observation, info) -> action``)
built on :class:`solvers.base.Scheduler`; the core of each is ``place(PlacementProblem) ->
assignment``, usable without an env (see :mod:`solvers.problem`).

    import gymnasium as gym, carbon_gym
    from carbon_gym.policy import rollout

    env = gym.make("carbon_gym/GeoServe-v0", scenario="dev")
    metrics = rollout(env, carbon_gym.make_policy("milp", env), seed=0)

Names in the one policy registry (:mod:`carbon_gym.registry`; :func:`register_policies` is this
package's entry point in the ``carbon_gym.policies`` group, so ``carbon_gym.make_policy`` finds
them after a plain ``import carbon_gym``); the reference round-robin (``rr``) is carbon_gym's own:

=============  ================  ==============================================================
name           alias             scheduler
=============  ================  ==============================================================
greedy         carbon-greedy     lowest current carbon intensity, load-blind
least-loaded                     lowest estimated latency (state updated per placement), carbon-blind
sticky                           session-sticky: a session's turn to its previous turn's datacenter while allowed, else least-loaded
planner                          "earlier studies": shares re-planned every 15 min from carbon + static latency
planner-1h                       the same, re-planned every hour
ilp            ilp-static        per-request ILP, load-independent latency
ilp-state                        per-request ILP, state-aware latency (estimates updated after each placement)
greedy-cap                       carbon-greedy capped at each datacenter's measured SLO operating point per step
ilp-cap                          load-independent per-request ILP with the same capacity cap
milp           facility-milp     facility MILP (shared per-datacenter engine energy), HiGHS
milp-greedy    facility-greedy   state-aware greedy on the facility objective (the MILP's fallback)
milp-mpc                         facility MILP routing with a receding-horizon capacity plan (1 h, load + carbon forecasts)
=============  ================  ==============================================================
"""

from __future__ import annotations

from typing import Any

from .problem import PlacementProblem, synthetic_problem

__all__ = ["register_policies", "PlacementProblem", "synthetic_problem"]


def _greedy(env: Any = None, **kw: Any) -> Any:
    from .baselines import CarbonGreedy

    return CarbonGreedy(env, **kw)


def _least_loaded(env: Any = None, **kw: Any) -> Any:
    from .baselines import LeastLoaded

    return LeastLoaded(env, **kw)


def _sticky(env: Any = None, **kw: Any) -> Any:
    from .baselines import LeastLoaded

    return LeastLoaded(env, sticky=True, **kw)


def _planner(env: Any = None, **kw: Any) -> Any:
    from .baselines import SharePlanner

    return SharePlanner(env, **kw)


def _planner_1h(env: Any = None, **kw: Any) -> Any:
    from .baselines import SharePlanner

    kw.setdefault("replan_s", 3600.0)
    pol = SharePlanner(env, **kw)
    pol.name = "planner-1h"
    return pol


def _ilp_static(env: Any = None, **kw: Any) -> Any:
    from .per_request import PerRequestILP

    return PerRequestILP(env, state_aware=False, **kw)


def _greedy_cap(env: Any = None, **kw: Any) -> Any:
    from .baselines import CarbonGreedy

    kw.setdefault("capacity_cap", "measured")
    pol = CarbonGreedy(env, **kw)
    pol.name = "greedy-cap"
    return pol


def _ilp_cap(env: Any = None, **kw: Any) -> Any:
    from .per_request import PerRequestILP

    kw.setdefault("capacity_cap", "measured")
    pol = PerRequestILP(env, state_aware=False, **kw)
    pol.name = "ilp-cap"
    return pol


def _ilp_state(env: Any = None, **kw: Any) -> Any:
    from .per_request import PerRequestILP

    return PerRequestILP(env, state_aware=True, **kw)


def _milp(env: Any = None, **kw: Any) -> Any:
    from .facility import FacilityMILP

    return FacilityMILP(env, **kw)


def _milp_greedy(env: Any = None, **kw: Any) -> Any:
    from .facility import FacilityGreedy

    return FacilityGreedy(env, **kw)


def _milp_mpc(env: Any = None, **kw: Any) -> Any:
    from .mpc import MPCFacilityMILP

    return MPCFacilityMILP(env, **kw)


def register_policies() -> None:
    """Register solvers' schedulers in :mod:`carbon_gym.registry` (the ``carbon_gym.policies``
    entry point; idempotent). Nothing heavy is imported here: each factory imports its
    scheduler (and Pyomo / HiGHS) when it is called."""
    from carbon_gym.registry import register_policy

    for name, factory, aliases, doc in (
        ("greedy", _greedy, ("carbon-greedy",), "lowest current carbon intensity, blind to load"),
        ("least-loaded", _least_loaded, (), "lowest estimated latency, blind to carbon"),
        ("planner", _planner, (), "earlier studies: datacenter shares re-planned every 15 min"),
        ("planner-1h", _planner_1h, (), "the same, re-planned every hour"),
        ("ilp", _ilp_static, ("ilp-static",), "per-request ILP, load-independent latency"),
        ("ilp-state", _ilp_state, (), "per-request ILP, state-aware latency"),
        ("greedy-cap", _greedy_cap, (), "carbon-greedy with a static capacity cap (each datacenter's measured SLO operating point per step)"),
        ("ilp-cap", _ilp_cap, (), "load-independent per-request ILP with a static capacity cap (the measured SLO operating point)"),
        ("milp", _milp, ("facility-milp",), "facility MILP (shared engine energy), HiGHS"),
        ("milp-greedy", _milp_greedy, ("facility-greedy",), "greedy on the facility objective (the MILP's fallback)"),
    ):
        register_policy(name, factory, aliases=aliases, doc=doc, replace=True)
    # (named explicitly: with capacity.control other than "agent" it is the facility MILP itself)
    register_policy("milp-mpc", _milp_mpc, doc="facility MILP with model predictive control of capacity (1 h plan, "
                    "load and carbon forecasts, first period executed; needs capacity.control = agent)",
                    in_all=False, replace=True)
    # (named explicitly: without sessions it is least-loaded)
    register_policy("sticky", _sticky, aliases=("session-sticky",), in_all=False, replace=True,
                    doc="session-sticky: each turn to its session's previous datacenter while allowed, else least-loaded "
                    "(prefix workloads)")
