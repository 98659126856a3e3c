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
from .estimates import EstimateLog
from .problem import PlacementProblem


#: Default planning margins (fractions of the TTFT / TPOT targets kept as headroom).
DEFAULT_TTFT_MARGIN = 0.25
DEFAULT_TPOT_MARGIN = 0.2
#: ``ttft_margin="auto"``: the margin is the ``margin_quantile`` (default MLPerf's p99) of the
#: scheduler's own TTFT residuals (realised - estimated, s) over its most recent
#: ``MARGIN_WINDOW`` completions, once it has ``MARGIN_MIN_SAMPLES`` of them (before: the
#: fractional default); never below 0 nor above ``MARGIN_MAX_SHARE`` of the target.
AUTO_MARGIN = "auto"
MARGIN_QUANTILE = 0.99
MARGIN_WINDOW = 20_000
MARGIN_MIN_SAMPLES = 500
MARGIN_MAX_SHARE = 0.9


class Scheduler:
    """Base scheduler. Subclasses set ``name`` and implement :meth:`place`.

    Args:
        env: the env it will act on (optional here; :meth:`reset` or the first :meth:`act`
            with an env set provides it).
        ttft_margin, tpot_margin: planning margins: problems built from the env carry targets
            ``(1 - margin) x`` the scenario's SLO, so that the schedulers' estimates (which
            ignore the randomness of arrivals and lengths) keep some headroom. 0 = plan to the
            target itself. Problems passed to :meth:`place` directly are used as they are.
            ``ttft_margin="auto"``: a margin in seconds measured, not chosen: the
            ``margin_quantile`` of the realised minus estimated TTFT of the scheduler's own recent
            completions (:data:`AUTO_MARGIN`; the estimates of :mod:`solvers.estimates`, the
            completions of ``env.unwrapped.last_completed``, what an operator observes), so
            the p99 the scheduler plans to is the one its estimates' error allows.
        margin_quantile: the residual quantile of the auto margin, in (0, 1) (default 0.99).
        cache_aware: use the cached prefix tokens of the state (prefix workloads): prefill time,
            energy and TTFT of the cached-prefix-adjusted prompt (default). False: affinity-blind,
            every request costed with its whole prompt (problems built from the env carry no
            ``cached_prompt_tokens``).
    """

    name = "scheduler"

    def __init__(self, env: Any = None, *, ttft_margin: float | str = DEFAULT_TTFT_MARGIN,
                 tpot_margin: float = DEFAULT_TPOT_MARGIN, cache_aware: bool = True,
                 margin_quantile: float = MARGIN_QUANTILE) -> None:
        self.auto_margin = isinstance(ttft_margin, str) and ttft_margin.strip().lower() == AUTO_MARGIN
        for field, v in (("ttft_margin", DEFAULT_TTFT_MARGIN if self.auto_margin else ttft_margin), ("tpot_margin", tpot_margin)):
            try:
                ok = 0.0 <= float(v) < 1.0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                allowed = "in [0, 1) or 'auto'" if field == "ttft_margin" else "in [0, 1)"
                raise ConfigError(field, f"must be {allowed}, got {v!r}")
        try:
            q_ok = 0.0 < float(margin_quantile) < 1.0
        except (TypeError, ValueError):
            q_ok = False
        if not q_ok:
            raise ConfigError("margin_quantile", f"must be in (0, 1), got {margin_quantile!r}")
        self.ttft_margin: float | str = AUTO_MARGIN if self.auto_margin else float(ttft_margin)
        self.margin_quantile = float(margin_quantile)
        self.tpot_margin = float(tpot_margin)
        self.cache_aware = bool(cache_aware)
        self.env = env
        self._facts: EnvFacts | None = None
        self.stats: dict[str, Any] = {}
        #: the episode's per-request TTFT / TPOT estimates (:mod:`solvers.estimates`)
        self.estimate_log = EstimateLog(track_open=self.auto_margin)
        self._residuals = np.zeros(MARGIN_WINDOW)
        self._n_residuals = 0
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
        self.estimate_log.clear()
        self._n_residuals = 0
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
        if self.auto_margin:
            self._observe_completions()
            margin = self.ttft_margin_s(p.ttft_slo_s)
            self.stats.setdefault("ttft_margin_s", []).append(margin)
            p.ttft_slo_s -= margin
        else:
            p.ttft_slo_s *= 1.0 - float(self.ttft_margin)
        p.tpot_slo_s *= 1.0 - self.tpot_margin
        if not self.cache_aware:
            p.cached_prompt_tokens = None
        return p

    def _observe_completions(self) -> None:
        """Take the residuals of the last step's completions into the auto margin's window."""
        recs = getattr(self.env.unwrapped, "last_completed", None) if self.env is not None else None
        if recs is None or not len(recs):
            return
        res = self.estimate_log.observe(recs.arrival_s, recs.origin, recs.ttft_s)
        w = self._residuals.size
        for x in np.array_split(res, max(1, -(-res.size // w))):
            i = self._n_residuals % w
            n = min(x.size, w - i)
            self._residuals[i:i + n] = x[:n]
            self._residuals[:x.size - n] = x[n:]
            self._n_residuals += x.size

    def ttft_margin_s(self, target_s: float) -> float:
        """The TTFT margin now, seconds: the auto margin (the residual quantile, clipped to
        [0, MARGIN_MAX_SHARE x target]) once enough completions were seen, else the fractional
        default x ``target_s``; the fixed fraction x ``target_s`` without ``"auto"``."""
        if not self.auto_margin:
            return float(self.ttft_margin) * target_s
        n = min(self._n_residuals, self._residuals.size)
        if n < MARGIN_MIN_SAMPLES:
            return DEFAULT_TTFT_MARGIN * target_s
        q = float(np.quantile(self._residuals[:n], self.margin_quantile))
        return min(max(q, 0.0), MARGIN_MAX_SHARE * target_s)

    def act(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        """The env action for this step (a datacenter or D = defer per slot)."""
        if self.env is None:
            raise RuntimeError(f"{self.name}: no env; pass env= or call reset(env)")
        t0 = time.perf_counter()
        state = self.env.unwrapped.state()
        problem = self.problem_of(state)
        assignment = self.place(problem)
        assert self._facts is not None  # (set by problem_of())
        action = action_from_assignment(problem, assignment, self._facts.layout.max_pending)
        self.stats["decision_s"].append(time.perf_counter() - t0)
        self.log_estimates(state, problem, assignment)
        return action

    def log_estimates(self, state: Any, problem: PlacementProblem, assignment: np.ndarray) -> None:
        """Append the step's placed requests' TTFT / TPOT estimates to :attr:`estimate_log`
        (outside the timed decision)."""
        slot = np.asarray(problem.slot, dtype=np.int64)
        self.estimate_log.record(problem, assignment, np.asarray(state.pending.arrival_s)[slot],
                                 np.asarray(state.pending.origin)[slot])

    def episode_estimates(self) -> dict[str, np.ndarray]:
        """The episode's estimates as columns (:data:`solvers.estimates.ESTIMATE_COLUMNS`)."""
        return self.estimate_log.to_dict()


def first_allowed(problem: PlacementProblem) -> np.ndarray:
    """(R, D) bool of allowed pairs (mask and up)."""
    return problem.allowed & problem.up[None, :]
