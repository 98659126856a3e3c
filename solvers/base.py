"""Common base of every scheduler in :mod:`solvers`: a :class:`carbon_gym.policy.Policy`.

A scheduler implements :meth:`Scheduler.place` (``PlacementProblem -> assignment``) and inherits
:meth:`Scheduler.act`, which builds the problem from the env's typed state (``env.unwrapped.state()``,
physical units; never the scaled observation), calls ``place``,
times it, and turns the assignment into the env's action. ``stats["decision_s"]`` holds the
wall time of every ``act`` call (problem building included); it is kept on the policy, never in
the env's ``info``. Schedulers draw no random numbers; they are deterministic functions of the
state sequence (the facility MILP too: its solves are bounded by work limits, not the wall clock,
unless a ``time_limit_s`` is given). A scheduler may expose ``episode_stats() -> dict`` (the
facility MILP does): figures of its episode the evaluation adds to the run's row.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError

from .envadapter import EnvFacts, action_from_assignment, problem_from_state
from .problem import PlacementProblem


#: Default planning margins (fractions of the TTFT / TPOT targets kept as headroom).
DEFAULT_TTFT_MARGIN = 0.25
DEFAULT_TPOT_MARGIN = 0.2


class Scheduler:
    """Base scheduler. Subclasses set ``name`` and implement :meth:`place`.

    Args:
        env: the env it will act on (optional here; :meth:`reset` or the first :meth:`act`
            with an env set provides it).
        ttft_margin, tpot_margin: planning margins: problems built from the env carry targets
            ``(1 - margin) x`` the scenario's SLO, so that the schedulers' estimates (which
            ignore the randomness of arrivals and lengths) keep some headroom. 0 = plan to the
            target itself. Problems passed to :meth:`place` directly are used as they are.
        cache_aware: use the cached prefix tokens of the state (prefix workloads): prefill time,
            energy and TTFT of the cached-prefix-adjusted prompt (default). False: affinity-blind,
            every request costed with its whole prompt (problems built from the env carry no
            ``cached_prompt_tokens``).
    """

    name = "scheduler"

    def __init__(self, env: Any = None, *, ttft_margin: float = DEFAULT_TTFT_MARGIN,
                 tpot_margin: float = DEFAULT_TPOT_MARGIN, cache_aware: bool = True) -> None:
        for field, v in (("ttft_margin", ttft_margin), ("tpot_margin", tpot_margin)):
            if not 0.0 <= float(v) < 1.0:
                raise ConfigError(field, f"must be in [0, 1), got {v}")
        self.ttft_margin = float(ttft_margin)
        self.tpot_margin = float(tpot_margin)
        self.cache_aware = bool(cache_aware)
        self.env = env
        self._facts: EnvFacts | None = None
        self.stats: dict[str, Any] = {}
        self.reset_state()
        self.reset_stats()

    # ------------------------------------------------------------------ state
    def reset_stats(self) -> None:
        """Clear the statistics (``decision_s``: seconds per ``act``)."""
        self.stats = {"decision_s": []}

    def reset_state(self) -> None:
        """Clear per-episode state (override in stateful schedulers)."""

    def reset(self, env: Any = None) -> None:
        """Start an episode (called by :func:`carbon_gym.policy.rollout` after ``env.reset``)."""
        if env is not None:
            self.env = env
        self._facts = None
        self.reset_state()
        self.reset_stats()

    # ------------------------------------------------------------------ acting
    def place(self, problem: PlacementProblem) -> np.ndarray:
        """Assignment (R,) of ``problem``'s requests: datacenter index, or D to defer."""
        raise NotImplementedError

    def problem(self, observation: Any = None, info: dict | None = None) -> PlacementProblem:
        """The :class:`PlacementProblem` of ``self.env``'s current step, built from its typed state
        (:meth:`carbon_gym.env.GeoServeEnv.state`; ``observation`` and ``info`` are not read)."""
        if self.env is None:
            raise RuntimeError(f"{self.name}: no env; pass env= or call reset(env)")
        return self.problem_of(self.env.unwrapped.state())

    def problem_of(self, state: Any) -> PlacementProblem:
        """The :class:`PlacementProblem` of a typed ``state`` of ``self.env`` (with the margins)."""
        if self._facts is None:
            self._facts = EnvFacts(self.env)
        p = problem_from_state(state, self._facts)
        p.ttft_slo_s *= 1.0 - self.ttft_margin
        p.tpot_slo_s *= 1.0 - self.tpot_margin
        if not self.cache_aware:
            p.cached_prompt_tokens = None
        return p

    def act(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        """The env action for this step (a datacenter or D = defer per slot)."""
        t0 = time.perf_counter()
        problem = self.problem(observation, info)
        assignment = self.place(problem)
        assert self._facts is not None  # (set by problem())
        action = action_from_assignment(problem, assignment, self._facts.layout.max_pending)
        self.stats["decision_s"].append(time.perf_counter() - t0)
        return action


def first_allowed(problem: PlacementProblem) -> np.ndarray:
    """(R, D) bool of allowed pairs (mask and up)."""
    return problem.allowed & problem.up[None, :]
