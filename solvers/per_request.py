r"""Per-request ILPs: one small integer program per request, in arrival order.

For request r (the oldest first) and the allowed datacenters d:

.. code-block:: text

    min   sum_d x_d [ g_d E_rd + lambda (v^ttft_rd + v^tpot_rd) + lambda (s^ttft_rd / TTFT_slo + s^tpot_rd / TPOT_slo) ]
    s.t.  sum_d x_d = 1,   x_d in {0, 1}
          TTFT_rd = waited_r + net_rd + W_d + f_d + alpha_d p_r <= TTFT_slo + s^ttft_rd   (slack s >= 0; f_d fixed prefill latency)
          TPOT_d <= TPOT_slo + s^tpot_rd
    E_rd = tp [ (P_prefill - P_idle) alpha_d p_r + (P_dec(1) - P_idle) o_r TPOT_d ]     joules

``E_rd`` is the independent-cost assumption: the request pays the *whole* engine active-power
increment over its service time, as if it ran alone, so two requests batched on one engine are
each charged the full increment (the fixed energy is double-counted; the facility MILP charges
it once). ``v`` are the violation indicators (slack > 0) and ``s`` the slacks; with x binary and
one request per program both are constants per datacenter, so the program is solved exactly by
enumerating the datacenters (:func:`per_request_costs` + argmin; ``solver="highs"`` solves the
same program with HiGHS instead, used by the tests to check the two agree).

Variants (``state_aware``):

* load-independent: ``W_d = 0``, ``TPOT_d = tpot_idle_d`` (the lone-request latency); nothing
  changes between requests. With ``capacity_cap`` (registered as ``ilp-cap``: ``"measured"``,
  each datacenter's measured SLO operating point) each datacenter also takes at most that share
  of its measured capacity per step
  (:class:`solvers.baselines.CapacityBudget`): requests, oldest first, each to its cheapest
  datacenter with capacity left, as earlier carbon-aware schedulers were capped.
* state-aware: ``W_d`` starts at the queue-wait estimate (from an env: the larger of the
  simulator's and the backlog's, see :mod:`solvers.envadapter`) and ``TPOT_d`` at its TPOT
  estimate; after each placement at d, ``W_d += alpha_d p_r / E_d`` (the prompt spread over the
  engines), the decode iteration grows by ``slope_d / E_d`` (one more sequence in the batch) and
  the prefill share of iteration time becomes ``rho_d = max(rho_now_d, alpha_d P_d / (E_d poll_s))``
  (``P_d`` prompt tokens placed at d in this step), so ``TPOT_d = t_dec_d / (1 - rho_d)``; the
  prefill share this step's placements add, ``alpha_d P_d / (E_d poll_s)``, is kept within
  ``max_prefill_share`` (the facility MILP's utilisation cap) by one more penalised slack.

Prefix caches (``problem.cached_prompt_tokens``): ``p_r`` above is the request's prefill tokens at
d, ``prompt - cached_rd`` (:attr:`~solvers.problem.PlacementProblem.prefill_tokens`), in the
energy, the TTFT and the state updates; without cached tokens it is the prompt.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError

from ._highs import new_highs
from ._highs import run as run_highs
from .base import Scheduler, first_allowed
from .problem import PlacementProblem

__all__ = ["PerRequestILP", "per_request_costs"]


def per_request_costs(
    problem: PlacementProblem,
    r: int,
    queue_wait_s: np.ndarray,
    tpot_s: np.ndarray,
    violation_penalty_g: float,
) -> np.ndarray:
    """(D,) objective coefficient of each datacenter for request ``r`` (inf where not allowed).

    Args:
        queue_wait_s, tpot_s: the variant's current estimates W_d and TPOT_d (D,).
        violation_penalty_g: lambda.
    """
    p = problem
    pre = p.prefill_tokens_of(r) * p.prefill_s_per_token
    energy = p.tp * ((p.gpu_prefill_w - p.gpu_idle_w) * pre
                     + (p.decode_power_w(1.0) - p.gpu_idle_w) * p.output_tokens[r] * tpot_s)
    ttft = p.waited_s[r] + p.network_s[r] + queue_wait_s + p.prefill_fixed_s + pre
    s_ttft = np.maximum(0.0, ttft - p.ttft_slo_s)
    s_tpot = np.maximum(0.0, tpot_s - p.tpot_slo_s)
    lam = violation_penalty_g
    cost = p.grams_per_joule * energy + lam * ((s_ttft > 0).astype(float) + (s_tpot > 0))
    cost = cost + lam * (s_ttft / p.ttft_slo_s + s_tpot / p.tpot_slo_s)
    ok = p.allowed[r] & p.up
    return np.where(ok, cost, np.inf)


def _solve_with_highs(cost: np.ndarray) -> int:
    """The one-request ILP (binary x_d, sum = 1) solved by HiGHS; returns the chosen d."""
    import highspy

    ok = np.flatnonzero(np.isfinite(cost))
    h = new_highs(1)
    n = ok.size
    h.passModel(
        n, 1, n, int(highspy.MatrixFormat.kRowwise), int(highspy.ObjSense.kMinimize), 0.0,
        cost[ok].astype(np.float64), np.zeros(n), np.ones(n), np.ones(1), np.ones(1),
        np.array([0, n], dtype=np.int32), np.arange(n, dtype=np.int32), np.ones(n), np.ones(n, dtype=np.int32),
    )
    h.setOptionValue("mip_rel_gap", 0.0)
    run_highs(h)
    x = np.asarray(h.getSolution().col_value)
    return int(ok[int(np.argmax(x))])


class PerRequestILP(Scheduler):
    """Per-request ILP scheduler (see the module docstring).

    Args:
        env: the env (optional until :meth:`reset`).
        state_aware: update the latency estimates after each placement (else load-independent).
        violation_penalty_g: lambda, grams per planned SLO violation.
        solver: ``"enumerate"`` (exact, fast) or ``"highs"`` (the same ILP through HiGHS).

    ``stats["planned_violations"]`` counts requests placed with positive slack.
    """

    def __init__(self, env: Any = None, *, state_aware: bool = True, violation_penalty_g: float = 1.0,
                 solver: str = "enumerate", max_prefill_share: float = 0.5, capacity_cap: float | str | None = None,
                 **kwargs: Any) -> None:
        if solver not in ("enumerate", "highs"):
            raise ConfigError("solver", f"unknown value {solver!r}", allowed=["enumerate", "highs"])
        self.state_aware = bool(state_aware)
        self.violation_penalty_g = float(violation_penalty_g)
        self.solver = solver
        if not 0.0 < max_prefill_share <= 1.0:
            raise ConfigError("max_prefill_share", f"must be in (0, 1], got {max_prefill_share}")
        self.max_prefill_share = float(max_prefill_share)
        self.name = "ilp-state" if self.state_aware else "ilp-static"
        if capacity_cap is not None and self.state_aware:
            raise ConfigError("capacity_cap", "only the load-independent ILP (ilp, ilp-cap) takes a static capacity cap")
        from .baselines import CapacityBudget

        self.capacity = CapacityBudget(capacity_cap) if capacity_cap is not None else None
        super().__init__(env, **kwargs)

    def reset_state(self) -> None:
        """Forget the carried capacity credit (and a measured cap: read again from the env)."""
        capacity = getattr(self, "capacity", None)
        if capacity is not None:
            capacity.reset()

    def episode_stats(self) -> dict[str, float]:
        """With a capacity cap: the cap in force (:meth:`solvers.baselines.CapacityBudget.stats`)."""
        return self.capacity.stats() if self.capacity is not None else {}

    def reset_stats(self) -> None:
        """Clear the statistics."""
        self.stats = {"decision_s": [], "planned_violations": 0}

    def place(self, problem: PlacementProblem) -> np.ndarray:
        """Assignment of each request, oldest first, each by its own ILP."""
        p = problem
        d_n = p.n_datacenters
        out = np.full(p.n_requests, d_n, dtype=np.int64)
        if p.n_requests == 0:
            return out
        allowed = first_allowed(p)
        if self.state_aware:
            wait = p.est_queue_wait_s.copy()
            tpot = p.tpot_now_s.copy()
            t_dec = p.decode_iter_s.copy()
            rho0 = p.prefill_share_now
            placed_tokens = np.zeros(d_n)
            rho_per_token = p.prefill_s_per_token / (p.n_engines * p.poll_s)
        else:
            wait = np.zeros(d_n)
            tpot = p.tpot_idle_s.copy()
        order = np.argsort(-p.waited_s, kind="stable")
        if not self.state_aware and self.solver == "enumerate":
            return self._place_static(p, order, allowed)
        wait_inc = p.prefill_s_per_token / p.n_engines
        tpot_inc = p.tpot_slope_s_per_seq / p.n_engines
        planned = 0
        for r in order:
            if not allowed[r].any():
                continue
            cost = per_request_costs(p, int(r), wait, tpot, self.violation_penalty_g)
            pt = p.prefill_tokens_of(int(r))  # (the prompt, or (D,) prompt - cached)
            if self.state_aware:  # utilisation cap: prefill share after adding r (penalised slack)
                rho_new = rho_per_token * (placed_tokens + pt)
                over = np.maximum(0.0, rho_new - self.max_prefill_share)
                cost = cost + self.violation_penalty_g * ((over > 0) + over / self.max_prefill_share)
            d = _solve_with_highs(cost) if self.solver == "highs" else int(np.argmin(cost))
            out[r] = d
            ptd = pt if np.ndim(pt) == 0 else np.asarray(pt)[d]
            ttft = p.waited_s[r] + p.network_s[r, d] + wait[d] + p.prefill_fixed_s[d] + ptd * p.prefill_s_per_token[d]
            planned += int(ttft > p.ttft_slo_s or tpot[d] > p.tpot_slo_s)
            if self.state_aware:
                wait[d] += wait_inc[d] * ptd
                t_dec[d] += tpot_inc[d]
                placed_tokens[d] += ptd
                rho = min(max(rho0[d], rho_per_token[d] * placed_tokens[d]), 0.95)
                tpot[d] = max(tpot[d], t_dec[d] / (1.0 - rho))
        self.stats["planned_violations"] += planned
        return out

    def _place_static(self, p: PlacementProblem, order: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        """Load-independent variant, vectorised (the requests do not interact)."""
        d_n = p.n_datacenters
        pre = p.prefill_compute_s
        tpot = p.tpot_idle_s[None, :]
        energy = p.tp * ((p.gpu_prefill_w - p.gpu_idle_w) * pre
                         + (p.decode_power_w(1.0) - p.gpu_idle_w) * p.output_tokens[:, None] * tpot)
        ttft = p.waited_s[:, None] + p.network_s + p.prefill_fixed_s[None, :] + pre
        s_ttft = np.maximum(0.0, ttft - p.ttft_slo_s)
        s_tpot = np.maximum(0.0, tpot - p.tpot_slo_s)
        lam = self.violation_penalty_g
        cost = p.grams_per_joule[None, :] * energy + lam * ((s_ttft > 0) + (s_tpot > 0))
        cost = cost + lam * (s_ttft / p.ttft_slo_s + s_tpot / p.tpot_slo_s)
        cost = np.where(allowed, cost, np.inf)
        if self.capacity is not None:  # each request its cheapest datacenter with capacity left this step
            from .baselines import capped_choice

            budget = self.capacity.budget(p, self.env)
            out, used = capped_choice(order, allowed, cost, budget)
            self.capacity.spend(used)
        else:
            out = np.where(allowed.any(axis=1), np.argmin(cost, axis=1), d_n).astype(np.int64)
        planned = (s_ttft > 0) | (s_tpot > 0)
        self.stats["planned_violations"] += int(planned[np.arange(p.n_requests), np.minimum(out, d_n - 1)][out < d_n].sum())
        return out
