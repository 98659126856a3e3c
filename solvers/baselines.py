"""Baseline schedulers: carbon-greedy, least-loaded, and the "earlier studies" planner.

(The reference round-robin is :class:`carbon_gym.policy.RoundRobinPolicy`, registered as ``rr``.)

* :class:`CarbonGreedy` — every request to the allowed datacenter with the lowest grid carbon
  intensity now (ties: lower PUE, then lower index). Blind to load; with ``capacity_cap``
  (registered as ``greedy-cap``) each datacenter takes at most that share of its measured
  capacity per step (:class:`CapacityBudget`), as earlier carbon-aware schedulers had.
* :class:`LeastLoaded` — every request (oldest first) to the allowed datacenter with the lowest
  estimated end-to-end latency ``waited + net + W_d + alpha_d p + o x TPOT_d``, updating
  ``W_d`` and ``TPOT_d`` after each placement as the state-aware per-request ILP does. Blind to
  carbon. With ``sticky`` (registered as ``sticky``, the session-sticky baseline of prefix
  workloads): a turn of a session goes to the datacenter that served its previous turn
  (``PlacementProblem.session_dc``) while the env allows it there, else least-loaded.
* :class:`SharePlanner` — earlier carbon-aware schedulers (placement re-planned on 15-minute to
  1-hour intervals, latency assumed independent of load): every ``replan_s`` seconds of
  simulated time (default 900 s, up to 3,600 s) it solves a small LP for the share of each
  origin's traffic each datacenter takes::

      min  sum_{o,d} f_od g_d E_d          (E_d: energy of a mean request served alone at d, J)
      s.t. sum_d f_od = rate_o             (requests/s from origin o, measured since the last plan)
           sum_o f_od <= cap_d             (static capacity: engines x per-engine rate x utilisation)
           f_od = 0 unless net_od + lone prefill <= TTFT target and lone TPOT <= TPOT target
           f_od >= 0

  (capacities are scaled up together if the traffic exceeds them), then routes each request by
  a smooth weighted round-robin over its origin's shares until the next plan. Its first plans
  come sooner: until the time since its first plan reaches ``replan_s`` it replans whenever that
  time has doubled (one polling period after the first plan, then two, four, ...), each plan
  from the traffic seen since the one before, so that no plan held for ``replan_s`` rests on a
  few requests. (A first plan from one polling period's traffic, held for 900 s, was the
  earlier rule: at 0.1 s polling on mixtral8x7b-low it measured the rates from about 30
  requests and put 36% more than the measured capacity on the cleanest datacenter, 30%
  violations; at 1 s it measured from one second.) The per-engine
  rate is the measured serving capacity of the model on each datacenter's GPU
  (``carbon_gym/data/load_levels.toml``) where it is there, else ``capacity_per_engine_rps``.

  Prefix caches (``PlacementProblem.cached_prompt_tokens``, a cache-aware planner): the lone
  prefill of a datacenter is that of the mean prefill tokens there (prompt - cached), and a
  request with a cached prefix at datacenters its origin's plan uses goes to the one holding the
  most of it (its share's credit charged as usual, so the plan's shares still hold on average).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError

from ._highs import new_highs
from ._highs import run as run_highs
from .base import Scheduler, first_allowed
from .problem import PlacementProblem

log = logging.getLogger(__name__)

__all__ = ["CarbonGreedy", "LeastLoaded", "SharePlanner", "CapacityBudget", "MEASURED_CAP", "CAPACITY_CAP_UNMEASURED", "capped_choice", "greenest_rank", "measured_step_cap"]


#: ``capacity_cap`` for the measured SLO operating point (:func:`measured_step_cap`), resolved
#: from the env at an episode's first step.
MEASURED_CAP = "measured"
#: The cap ``"measured"`` falls back to where the env's datacenter figure is not measured
#: (``greedy-cap`` / ``ilp-cap``'s default before the measured operating point, 0.9).
CAPACITY_CAP_UNMEASURED = 0.9


class CapacityBudget:
    """A static per-step capacity cap, as earlier carbon-aware schedulers had (the planner's
    capacity, per polling step): datacenter d takes at most ``cap x E_d x r x poll_s`` requests
    per step (E_d engines, r the model's measured per-engine serving rate in requests/s,
    ``carbon_gym/data/load_levels.toml``, else ``default_rps``), the fractional part carried to
    the next step. Load-blind like the scheduler it caps: it counts placements, never reads the
    backlog. Datacenters that are down get no budget.

    Args:
        cap: share of the measured capacity (0 < cap <= 2); or (D,), one per datacenter; or
            :data:`MEASURED_CAP` (``"measured"``): each datacenter's measured SLO operating point
            at the env's polling period (:func:`measured_step_cap`: its datacenter figure over the
            engine figure, 1.205 / 1.204 / 1.036 on Llama / Qwen / Mixtral at 0.1 s, 0.76 at 1 s),
            resolved at the first step of each episode; :data:`CAPACITY_CAP_UNMEASURED` (0.9)
            where it is not measured (with a warning) or without an env. ``measured`` says which.
        default_rps: per-engine rate when the model's is not measured.
        credit_s: unspent budget a datacenter may carry, in seconds of its budget; ``None``
            (default): two steps' budget plus one request. A longer credit lets a datacenter
            that is not full (the marginal one, under a greenest-first fill) take a burst of
            arrivals out of its saved budget instead of spilling it to the next datacenter,
            where a few requests keep otherwise idle engines active.
    """

    def __init__(self, cap: float | np.ndarray | str, default_rps: float = 4.0, credit_s: float | None = None) -> None:
        self.requested: float | np.ndarray | str = cap
        if isinstance(cap, str):
            if cap != MEASURED_CAP:
                raise ConfigError("capacity_cap", f"must be a share in (0, 2], {MEASURED_CAP!r} or None, got {cap!r}",
                                  allowed=[MEASURED_CAP, "a share in (0, 2]", None])
            cap = CAPACITY_CAP_UNMEASURED  # (until resolved from the env)
        caps = np.asarray(cap, dtype=np.float64)
        if caps.ndim > 1 or caps.size == 0 or not bool(np.all((caps > 0.0) & (caps <= 2.0))):
            raise ConfigError("capacity_cap", f"must be in (0, 2] (share of the measured capacity), {MEASURED_CAP!r} or None, got {cap!r}")
        if credit_s is not None and (isinstance(credit_s, bool) or not (isinstance(credit_s, (int, float)) and 0.0 < float(credit_s) <= 60.0)):
            raise ConfigError("capacity_credit_s", f"must be None or in (0, 60] seconds, got {credit_s!r}")
        self.cap: float | np.ndarray = float(caps) if caps.ndim == 0 else caps  # (D,): one per datacenter
        self.measured = False
        self.default_rps = float(default_rps)
        self.credit_s = None if credit_s is None else float(credit_s)
        self._note = ""
        self.reset()

    def reset(self) -> None:
        """Forget the carried credit (and, with ``"measured"``, the cap read from the env)."""
        self._credit: np.ndarray = np.zeros(0)  # (empty: no step yet)
        self._resolved = not isinstance(self.requested, str)

    def _resolve(self, env: Any) -> None:
        """``cap`` and ``measured`` from the env's measured operating point (``"measured"``)."""
        ratio, why = measured_step_cap(env) if env is not None else (None, "")
        if ratio is None and why and why != self._note:
            log.warning("capacity_cap 'measured' falls back to %g: %s", CAPACITY_CAP_UNMEASURED, why)
        self._note = why
        self.cap, self.measured = (CAPACITY_CAP_UNMEASURED, False) if ratio is None else (ratio, True)
        self._resolved = True

    def budget(self, p: PlacementProblem, env: Any) -> np.ndarray:
        """Requests each datacenter may take this step (integers; the remainder carried)."""
        if not self._resolved:
            self._resolve(env)
        rate = _per_engine_capacity_rps(env, self.default_rps)
        per_step = np.where(p.up, self.cap * p.n_engines * rate * p.poll_s, 0.0)
        if self._credit.shape != per_step.shape:
            self._credit = np.zeros_like(per_step)
        most = 2.0 * per_step + 1.0 if self.credit_s is None else np.maximum(per_step * self.credit_s / max(p.poll_s, 1e-9), per_step)
        self._credit = np.minimum(self._credit + per_step, most)  # (no hoarding beyond the credit)
        return np.floor(self._credit + 1e-9)

    def stats(self) -> dict[str, float]:
        """The cap in force (mean over the datacenters, share of the engine figure) and whether it
        is the measured operating point (1) or a given share / the fallback (0)."""
        return {"capacity_cap_mean": float(np.mean(self.cap)), "capacity_cap_measured": float(self.measured)}

    def spend(self, used: np.ndarray) -> None:
        """Charge the requests placed this step."""
        self._credit = np.maximum(self._credit - used, 0.0)


def greenest_rank(p: PlacementProblem) -> tuple[np.ndarray, np.ndarray]:
    """(allowed (R, D) bool, rank (R, D)): each datacenter's place in the order of current
    intensity (ties: lower PUE, then lower index), 0 the greenest, inf where a request may not go
    (:func:`first_allowed`); the ``rank`` that :func:`capped_choice` takes."""
    d_n = p.n_datacenters
    order = np.lexsort((np.arange(d_n), p.pue, p.carbon_g_per_kwh))
    score = np.empty(d_n)
    score[order] = np.arange(d_n)
    allowed = first_allowed(p)
    return allowed, np.where(allowed, score[None, :], np.inf)


def capped_choice(order: np.ndarray, allowed: np.ndarray, rank: np.ndarray, budget: np.ndarray,
                  cap: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each request (in ``order``) to its best-ranked allowed datacenter with budget left
    (``rank`` (R, D): lower is better, inf = not allowed); when every allowed one is full, to the
    allowed one with the most budget left relative to its cap (``cap`` (D,), default ``budget``:
    the excess spread in proportion to the caps, each datacenter over by the same share). Returns
    (assignment with D = defer for requests with no allowed datacenter, requests per datacenter)."""
    r_n, d_n = allowed.shape
    out = np.full(r_n, d_n, dtype=np.int64)
    left = budget.astype(np.float64).copy()
    cap = np.maximum((budget if cap is None else cap).astype(np.float64), 1.0)
    used = np.zeros(d_n)
    for r in order:
        ok = allowed[r]
        if not ok.any():
            continue
        free = ok & (left >= 1.0)
        if free.any():
            d = int(np.argmin(np.where(free, rank[r], np.inf)))
        else:
            d = int(np.argmax(np.where(ok, left / cap, -np.inf)))
        out[r] = d
        left[d] -= 1.0
        used[d] += 1.0
    return out, used


class CarbonGreedy(Scheduler):
    """Lowest current carbon intensity among the allowed datacenters (load-blind).

    Args:
        capacity_cap: ``None`` (default, the load-blind strawman: every request to the greenest
            datacenter), a share of the measured capacity or ``"measured"`` (:class:`CapacityBudget`):
            each request to the greenest datacenter with budget left this step (``greedy-cap``:
            ``"measured"``, each datacenter's measured SLO operating point).
        capacity_credit_s: the budget's ``credit_s`` (:class:`CapacityBudget`; None: two steps).
    """

    name = "carbon-greedy"

    def __init__(self, env: Any = None, *, capacity_cap: float | str | None = None, capacity_credit_s: float | None = None,
                 **kwargs: Any) -> None:
        self.capacity = CapacityBudget(capacity_cap, credit_s=capacity_credit_s) if capacity_cap is not None else None
        super().__init__(env, **kwargs)

    def reset_state(self) -> None:
        """Forget the carried capacity credit (and a measured cap: read again from the env)."""
        capacity: CapacityBudget | None = getattr(self, "capacity", None)
        if capacity is not None:
            capacity.reset()

    def episode_stats(self) -> dict[str, float]:
        """With a capacity cap: the cap in force (:meth:`CapacityBudget.stats`)."""
        return self.capacity.stats() if self.capacity is not None else {}

    def place(self, problem: PlacementProblem) -> np.ndarray:
        """Each request to its greenest allowed datacenter (with budget left, when capped)."""
        p = problem
        d_n = p.n_datacenters
        allowed, s = greenest_rank(p)
        if self.capacity is None:
            return np.where(allowed.any(axis=1), np.argmin(s, axis=1), d_n).astype(np.int64)
        budget = self.capacity.budget(p, self.env)
        out, used = capped_choice(np.argsort(-p.waited_s, kind="stable"), allowed, s, budget)
        self.capacity.spend(used)
        return out


class LeastLoaded(Scheduler):
    """Lowest estimated end-to-end latency, updated after each placement (carbon-blind).

    Args:
        sticky: a session's turn goes to the datacenter of its previous turn while allowed there
            (the session-sticky baseline, ``sticky``); least-loaded otherwise and for first turns.
    """

    name = "least-loaded"

    def __init__(self, env: Any = None, *, sticky: bool = False, **kwargs: Any) -> None:
        self.sticky = bool(sticky)
        if self.sticky:
            self.name = "sticky"
        super().__init__(env, **kwargs)

    def place(self, problem: PlacementProblem) -> np.ndarray:
        """Oldest first, each to the datacenter with the lowest latency estimate."""
        p = problem
        d_n = p.n_datacenters
        out = np.full(p.n_requests, d_n, dtype=np.int64)
        allowed = first_allowed(p)
        wait = p.est_queue_wait_s.copy()
        tpot = p.tpot_now_s.copy()
        wait_inc = p.prefill_s_per_token / p.n_engines
        tpot_inc = p.tpot_slope_s_per_seq / p.n_engines
        home = p.session_dc if self.sticky and p.session_dc is not None else None
        for r in np.argsort(-p.waited_s, kind="stable"):
            ok = allowed[r]
            if not ok.any():
                continue
            pt = p.prefill_tokens_of(int(r))  # (the prompt, or (D,) prompt - cached)
            if home is not None and home[r] >= 0 and ok[home[r]]:
                d = int(home[r])
            else:
                pre = p.prefill_fixed_s + pt * p.prefill_s_per_token
                e2e = p.network_s[r] + wait + pre + p.output_tokens[r] * tpot
                d = int(np.argmin(np.where(ok, e2e, np.inf)))
            out[r] = d
            wait[d] += wait_inc[d] * (pt if np.ndim(pt) == 0 else np.asarray(pt)[d])
            tpot[d] += tpot_inc[d]
        return out


def _per_engine_capacity_rps(env: Any, default: float) -> float | np.ndarray:
    """Measured per-engine serving capacity of the env's (model, GPU, TP), requests/s (or
    ``default`` without an env or a measurement): a float when every datacenter has the same
    GPU, else (D,) per datacenter (each its own GPU's measurement, ``default`` where none)."""
    if env is None:
        return float(default)
    from carbon_gym.scenario import load_load_levels

    u = env.unwrapped
    sc = u.scenario
    levels = load_load_levels()
    topo = u.world_parts.topology
    gpus = [topo.datacenter_gpu(i) for i in range(topo.n_datacenters)]
    rates: dict[str, float] = {}
    for g in dict.fromkeys(gpus):
        cap = levels.find(sc.model, g, sc.tp)
        rates[g] = float(cap.per_engine_rate_per_s) if cap is not None else float(default)
    if len(set(gpus)) == 1:
        return rates[gpus[0]]
    return np.array([rates[g] for g in gpus], dtype=np.float64)


def measured_step_cap(env: Any) -> tuple[float | np.ndarray | None, str]:
    """The step cap at each datacenter's measured SLO operating point: its datacenter figure
    (:meth:`carbon_gym.load_levels.Capacity.datacenter_rate_per_s`: one datacenter of its engines,
    arrivals placed every polling period of the env) over the engine figure, as a share for
    :class:`CapacityBudget` (a float when every datacenter has the same one, else (D,)); and
    ``(None, why)`` where some datacenter's figure is not measured, or no rate passes p99 there
    (below 1% of the engine figure)."""
    from carbon_gym.scenario import load_load_levels

    u = env.unwrapped
    sc = u.scenario
    topo = u.world_parts.topology
    levels = load_load_levels()
    poll_s = float(sc.polling_period_s)
    ratios: list[float] = []
    for d in range(topo.n_datacenters):
        gpu = str(topo.datacenter_gpu(d))
        engines = topo.datacenters[d].engines(sc.tp)
        cap = levels.find(sc.model, gpu, sc.tp)
        c_d = None if cap is None else cap.datacenter_rate_per_s(engines, poll_s)
        where = f"{sc.model} / {gpu} / tp{sc.tp}, {engines} engines, polling {poll_s:g} s"
        if cap is None or c_d is None:
            return None, f"no datacenter figure measured for {where} (python eval/measure_capacity.py --datacenter --write)"
        r = c_d / float(cap.per_engine_rate_per_s)
        if not 0.01 <= r <= 2.0:
            return None, f"the datacenter figure for {where} is {r:.3g} x the engine figure, outside [0.01, 2]"
        ratios.append(r)
    if len(set(ratios)) == 1:
        return ratios[0], ""
    return np.array(ratios, dtype=np.float64), ""


class SharePlanner(Scheduler):
    """The "earlier studies" planner (see the module docstring).

    Args:
        env: the env (optional until :meth:`reset`).
        replan_s: planning interval, simulated seconds (900 to 3,600 in the studies; any > 0 accepted).
        utilisation: fraction of the static capacity the plan may use.
        capacity_per_engine_rps: per-engine capacity used when the model's measured one is unknown.

    ``stats["plans"]`` counts the plans made.
    """

    name = "planner"

    def __init__(self, env: Any = None, *, replan_s: float = 900.0, utilisation: float = 0.9,
                 capacity_per_engine_rps: float = 4.0, **kwargs: Any) -> None:
        if not replan_s > 0:
            raise ConfigError("replan_s", f"must be > 0 seconds, got {replan_s}")
        if not 0 < utilisation <= 1:
            raise ConfigError("utilisation", f"must be in (0, 1], got {utilisation}")
        self.replan_s = float(replan_s)
        self.utilisation = float(utilisation)
        self.capacity_per_engine_rps = float(capacity_per_engine_rps)
        super().__init__(env, **kwargs)

    def reset_stats(self) -> None:
        """Clear the statistics."""
        self.stats = {"decision_s": [], "plans": 0}

    def reset_state(self) -> None:
        """Forget the plan and the traffic history."""
        # (empty arrays until the first step: no plan, no traffic seen)
        self._shares = np.zeros((0, 0))  # (origins, D) planned shares
        self._credit = np.zeros((0, 0))  # (origins, D) interleaving credit of the shares
        self._next_plan_s = -np.inf
        self._first_plan_s: float | None = None  # simulated time of the first plan, s
        self._since_s = 0.0
        self._counts: np.ndarray = np.zeros(0)  # (origins,) requests seen since the last plan
        self._net: np.ndarray = np.zeros((0, 0))  # (origins, D) mean network delay seen, s

    def _observe(self, p: PlacementProblem) -> None:
        n_o = max(int(p.origin.max()) + 1 if p.n_requests else 1, 1, self._counts.size)
        if self._counts.size < n_o:
            old = self._counts
            self._counts = np.zeros(n_o)
            self._counts[:old.size] = old
        if self._net.shape[0] < n_o:
            old = self._net
            net = np.full((n_o, p.n_datacenters), np.nan)
            if old.size:
                net[:old.shape[0]] = old
            self._net = net
        new = p.waited_s < p.poll_s
        self._counts += np.bincount(p.origin[new], minlength=self._counts.size)
        for o in np.unique(p.origin):
            self._net[o] = p.network_s[p.origin == o].mean(axis=0)

    def plan(self, p: PlacementProblem) -> np.ndarray:
        """Solve the share LP for the current traffic; returns shares (origins, D)."""
        import highspy

        d_n = p.n_datacenters
        elapsed = max(p.time_s - self._since_s, p.poll_s)
        rate = self._counts / elapsed
        n_o = rate.size
        per_engine = _per_engine_capacity_rps(self.env, self.capacity_per_engine_rps)
        cap = np.where(p.up, self.utilisation * p.n_engines * per_engine, 0.0)
        mean_p = float(p.prompt_tokens.mean()) if p.n_requests else 1000.0
        mean_o = float(p.output_tokens.mean()) if p.n_requests else 200.0
        if p.cached_prompt_tokens is not None and p.n_requests:  # (D,) mean prefill tokens: prompt - cached
            lone_prefill = p.prefill_tokens.mean(axis=0) * p.prefill_s_per_token
        else:
            lone_prefill = mean_p * p.prefill_s_per_token
        energy = p.tp * ((p.gpu_prefill_w - p.gpu_idle_w) * lone_prefill
                         + (p.decode_power_w(1.0) - p.gpu_idle_w) * mean_o * p.tpot_idle_s)
        cost = p.grams_per_joule * energy
        net = np.where(np.isnan(self._net), 0.0, self._net)
        feas = (net + lone_prefill[None, :] <= p.ttft_slo_s) & (p.tpot_idle_s <= p.tpot_slo_s)[None, :] & p.up[None, :]
        for o in range(n_o):  # an origin with no latency-feasible datacenter may use any that is up
            if not feas[o].any():
                feas[o] = p.up
        total = rate.sum()
        if total > cap.sum() > 0:
            cap = cap * (total / cap.sum()) * 1.000001
        shares = np.zeros((n_o, d_n))
        pairs = np.argwhere(feas)
        if total <= 0 or pairs.size == 0:
            best = np.argmin(np.where(p.up, cost, np.inf))
            shares[:, best] = 1.0
            return shares
        n = pairs.shape[0]
        rows_o = pairs[:, 0]
        rows_d = n_o + pairs[:, 1]
        r_idx = np.concatenate([rows_o, rows_d])
        c_idx = np.concatenate([np.arange(n), np.arange(n)])
        order = np.lexsort((c_idx, r_idx))
        r_idx, c_idx = r_idx[order], c_idx[order]
        n_rows = n_o + d_n
        start = np.zeros(n_rows + 1, dtype=np.int32)
        np.cumsum(np.bincount(r_idx, minlength=n_rows), out=start[1:])
        h = new_highs(1)
        # scale rates to O(1)
        scale = max(total, 1e-9)
        lo = np.concatenate([rate / scale, np.full(d_n, -np.inf)])
        hi = np.concatenate([rate / scale, cap / scale])
        h.passModel(n, n_rows, 2 * n, int(highspy.MatrixFormat.kRowwise), int(highspy.ObjSense.kMinimize), 0.0,
                    cost[pairs[:, 1]] / max(cost.max(), 1e-300), np.zeros(n), np.full(n, np.inf), lo, hi, start,
                    c_idx.astype(np.int32), np.ones(2 * n), np.zeros(n, dtype=np.int32))
        run_highs(h)
        if h.getInfo().primal_solution_status != 2:
            log.warning("planner LP failed (%s); sending everything to the greenest datacenter",
                        h.modelStatusToString(h.getModelStatus()))
            shares[:, np.argmin(np.where(p.up, cost, np.inf))] = 1.0
            return shares
        f = np.maximum(np.asarray(h.getSolution().col_value), 0.0) * scale
        np.add.at(shares, (pairs[:, 0], pairs[:, 1]), f)
        for o in range(n_o):
            s = shares[o].sum()
            if s > 0:
                shares[o] /= s
            else:
                shares[o, np.argmin(np.where(feas[o], cost, np.inf))] = 1.0
        return shares

    def place(self, problem: PlacementProblem) -> np.ndarray:
        """Route by the current plan (re-planning first when the interval has passed)."""
        p = problem
        d_n = p.n_datacenters
        self._observe(p)
        if p.time_s >= self._next_plan_s or self._shares.shape[0] < self._counts.size:
            self._shares = self.plan(p)
            self._credit = np.zeros_like(self._shares)
            self.stats["plans"] += 1
            if self._first_plan_s is None:
                self._first_plan_s = p.time_s
            # doubling intervals from one polling period until replan_s (module docstring)
            self._next_plan_s = p.time_s + min(self.replan_s, max(p.time_s - self._first_plan_s, p.poll_s))
            self._since_s = p.time_s
            self._counts = np.zeros_like(self._counts)
        out = np.full(p.n_requests, d_n, dtype=np.int64)
        allowed = first_allowed(p)
        greenest = np.lexsort((np.arange(d_n), p.carbon_g_per_kwh * p.pue))
        cached = p.cached_prompt_tokens
        for r in range(p.n_requests):
            ok = allowed[r]
            if not ok.any():
                continue
            o = int(p.origin[r])
            w = self._shares[o] * ok
            if w.sum() <= 0:  # every planned datacenter masked: greenest allowed one
                d = int(greenest[np.argmax(ok[greenest])])
            else:
                self._credit[o] += w / w.sum()
                hit = np.where(w > 0, cached[r], 0.0) if cached is not None else None
                if hit is not None and hit.max() > 0:  # the planned datacenter holding most of its prefix
                    d = int(np.argmax(hit))
                else:
                    d = int(np.argmax(np.where(ok, self._credit[o], -np.inf)))
                self._credit[o, d] -= 1.0
            out[r] = d
        return out
