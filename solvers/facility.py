r"""Facility MILP: place all pending requests of a polling step jointly (Pyomo + HiGHS).

The batch's energy is priced as a shared per-datacenter cost: the fixed energy of keeping an
engine active is paid once per engine woken at a datacenter and shared by every request batched
on it; each request adds only its marginal prefill and decode energy at the datacenter's current
batch. Two implementations build the same program from the same compiled coefficients
(:class:`FacilityData`): :func:`solve_pyomo` (the readable reference, Pyomo -> ``appsi_highs``)
and :func:`solve_highspy` (direct highspy arrays, the hot path). A test checks they reach the
same objective.

Formulation
-----------
Sets
    C   request classes: pending requests with the same allowed-datacenter set and origin, and the
        same bins of predicted output length (geometric, ratio ``output_ratio``), optionally prompt
        length (``prompt_ratio``), and TTFT time already used (``waited + prompt x mean prefill
        s/token``, bins ``headroom_bin_s`` wide). ``N_c`` requests in class c. In the
        *per-request binary form* every request is its own class (``N_c = 1``, x binary).
    D   datacenters; ``P = {(c, d)}`` the allowed pairs (every member of c may go to d, d is up).

Parameters (per request r; a class uses its members' mean, which is exact for every term below
that is linear in the lengths as long as the class is not split across datacenters)
    g_d = CI_d PUE_d / 3.6e6                      gCO2eq per IT joule at d (CI in g/kWh)
    n_d = running_d / busy_engines_d              current batch per busy engine (>= 1 used)
    dE_d(n) = tp (P_dec(n) - P_idle) t_d(n),  t_d(n) = tpot_idle_d + slope_d (n - 1)  J/iteration
    e_rd = tp (P_prefill - P_dec(n_d)) alpha_d p_r + o_r [dE_d(n_d + 1) - dE_d(n_d)]    J, marginal
        (p_r prompt and o_r predicted output tokens; alpha_d prefill seconds per token)
    kappa_cd = g_d mean_{r in c} e_rd             grams per request of c at d
    F_d = tp (P_dec(1) - P_idle) H_d,  H_d = mean_r (alpha_d p_r + o_r tpot_idle_d)    J per woken engine
    h_rd = (TTFT_slo - waited_r - net_rd - W0_d - f_d - alpha_d p_r) / u_r   effective TTFT headroom, s
        (net = uplink + downlink, W0_d = the queue-wait estimate: from an env, the larger of the
        simulator's (one engine) and the backlog's B_d alpha_d / E_d; f_d the fixed
        latency of the prefill iteration a prompt joins; u_r in (0, 1] the
        share of pending requests at least as old as r: requests are sent oldest first, so r
        waits behind about u_r of the prompt tokens placed at its datacenter; h_rd is the total
        added wait beta_d Pr_d that r tolerates)
    beta_d = alpha_d / E_d                        queue wait added at d per prompt token placed there, s
    theta_d = min(q-quantile of {h_rd >= 0: r allowed at d}, beta_d sum_{r allowed at d} p_r)
        the added-wait budget of d, s (``ttft_budget_quantile`` q; never above the wait that
        placing every allowed request at d would add)
    m_cd = fraction of the members of c with h_rd < theta_d       (they count as TTFT misses at d)
    B_d = backlog prompt tokens at d (queued or in transit; queue_len_d x mean pending prompt)
    Q0_d = min(1 - t_dec_d / TPOT_slo, rho_max)^+ E_d poll_s / alpha_d   prompt tokens per poll d can
        prefill while its decodes keep TPOT: prefill chunks take a share rho of every iteration and
        stretch TPOT to t_dec_d / (1 - rho) (t_dec_d = decode iteration of the current batch);
        rho_max = ``max_prefill_share`` caps the utilisation (queueing grows as rho -> 1); with
        ``prefill_horizon_s`` H (default 0.5 s), poll_s is max(poll_s, H) here (the backlog allowed in seconds
        does not shrink with the period)
    Q_d = (Q0_d - B_d)^+                                      what is left for this poll's prompts
    F_d = floor of the budget when the fleet is overloaded (``overload_spread``): if
        sum_{d up} min(theta_d / beta_d, Q_d) < (1 + s) Pnew (Pnew = pending prompt tokens with an
        allowed datacenter, s = ``overload_slack``), F_d = (Q0_d / sum_{d' up} Q0_d') (1 + s)
        (Pnew + sum_{d' up} B_d') - B_d, each datacenter's capacity share of the whole demand
        (round-robin-like spreading; a linear overflow penalty alone is the same everywhere and
        piled the overload on the cleanest grids); else F_d = 0
    T_d = max(min(theta_d / beta_d, Q_d), F_d)                   prompt-token budget of d
        (the class form plans with (1 - ``class_budget_margin``) T_d: a split class's members
        carry a slightly different prompt total than its count x mean)
    spe_d = TPOT-feasible sequences per engine: tpot_base_d + slope_d (spe_d - 1) <= TPOT_slo,
        capped at max_num_seqs (tpot_base_d = the simulator's TPOT estimate minus its batch term)
    L_d = running_d + queue_len_d;  E_d engines, A_d busy, I_d = E_d - A_d idle
    lambda grams per counted SLO violation; pbar, kvbar = mean prompt and mean prompt + output
    tokens of the pending requests; delta_c = lambda_defer + lambda (1 + p_c / pbar + kv_c / kvbar)
    grams per deferred request of c (more than any overflow its placement could cause: deferring
    only adds wait, so it must not be the way out of an overloaded step; it starved long prompts).

Variables
    x_cd in Z+ (0..N_c)     requests of class c placed at d;  x_c^defer in Z+ deferred
    y_d                     engines woken at d. ``spread`` (default, as the simulator's
                            dispatchers send work to idle engines first): y_d in [0, I_d] and
                            s_d in {0, 1} ("every idle engine woken"), so y_d = min(K_d, I_d) at
                            the optimum; ``pack``: y_d in {0..I_d}, engines that must become active
                            to hold the batch
    o_seq_d >= 0            sequences beyond the TPOT-feasible batch
    o_tok_d >= 0            prompt tokens beyond the token budget T_d
    o_kv_d  >= 0            KV tokens beyond the free KV cache

Objective (grams CO2eq + penalties, minimised)
    sum_{(c,d)} (kappa_cd + lambda m_cd) x_cd + sum_d g_d F_d y_d
    + lambda sum_d (o_seq_d + o_tok_d / pbar + o_kv_d / kvbar) + sum_c delta_c x_c^defer

Constraints (K_d = sum_c x_cd, added sequences; Pr_d = sum_c p_c x_cd, added prompt tokens)
    assignment     sum_d x_cd + x_c^defer = N_c                                      all c
    TPOT           spread: K_d - o_seq_d <= max(0, E_d spe_d - L_d)
                   pack:   K_d - spe_d y_d - o_seq_d <= max(0, A_d spe_d - L_d)       all d
        (the linear form of tpot_base_d + slope_d (n - 1) <= TPOT_slo at n sequences/engine)
    woken engines  spread: K_d - y_d - M_d s_d <= 0,  y_d - I_d s_d >= 0  (M_d = sum N_c at d),
                   plus the valid inequalities y_d >= min(1, I_d / N_c) x_cd that tighten the LP
    TTFT / prefill Pr_d - o_tok_d <= T_d                                             all d
        (within theta_d / beta_d: waited + net + W0_d + u_r beta_d Pr_d + prefill <= TTFT_slo
         for every request at d whose headroom is at least theta_d, the others being the m_cd
         misses; within Q_d: the prefill load keeps TPOT within its target)
    KV             sum_c (p_c + o_c) x_cd - o_kv_d <= max(0, free_kv_d)               all d

Units: seconds, joules, grams, tokens. Overflows are penalised as counted violations (o_seq one
per sequence, o_tok one per mean prompt, o_kv one per mean request footprint), never hidden;
existing overload (negative room) is clipped to zero room, as it is not this decision's doing.

Class form vs per-request form: the class form charges a class's mean energy, prompt and KV and
its fraction of TTFT misses; it equals the per-request objective whenever no class is split, and
``tests/test_solvers_facility.py`` measures the gap on instances small enough for both.

Capacity control (``[capacity] control = "agent"``; :mod:`solvers.facility_capacity`)
------------------------------------------------------------------------------------
At each capacity decision (``EnvState.capacity_decision``, every ``capacity.period_s``) a capacity
stage decides integer awake engines a_d in [0, E_d] and servers powered n_d (k_d n_d >= a_d) per
datacenter together with the period's routed arrival rate l_d (requests/s), minimising over a
lookahead T >= period (the carbon forecast, g/kWh x PUE) the floor energy of powered servers
(host + idle GPUs, W x s; servers off at ``host_off_w``), the boot energy of servers and the wake
energy of engines it turns on (J), and the routed work's energy (J per request x l_d x T), with
the period's expected fleet arrivals within a_d x ``engine_capacity_per_s`` x
``capacity_util_cap`` (servers off now cannot serve within the period: a boot takes ~345 s; by
default 0.9, or 0.9 of the datacenter figure where that is below the engine figure: 1 s polling),
and the same load within the awake engines once the servers it boots are up (a shortfall the
powered servers cannot hold is charged until a boot covers it, so the fleet grows back).
The placement program above then runs on the capacity in force: ``E_d`` = the serving engines,
datacenters with none masked where a request has another choice, the wake latency added to
``W0_d`` where no engine is awake. The action is then ``{"route", "capacity", "servers"}`` at a
decision and the route alone between decisions. With ``always_on`` nothing changes.

Work limits (:func:`solve_highspy`): a MIP gap (default 1%) and deterministic work limits, no
wall clock by default. The LP relaxation (a few ms; at most ``lp_iteration_limit`` simplex
iterations) gives a bound; its counts rounded down and completed by :func:`class_greedy`, or
:func:`class_greedy` alone, give the incumbent; when that is not within the gap, HiGHS
branch-and-bound continues from it (warm start) on programs of at most ``bb_max_columns`` pairs,
for at most ``bb_node_limit`` nodes and ``bb_work_limit`` of HiGHS's interrupt check points (the
same points on every run; at polling periods under ``bb_work_poll_s`` = 1 s the proportional share
of them, so a decision's work stays within the same share of its period). So a seed gives the same decisions, and the same row, on a loaded
machine as on an idle one; the wall time is measured and reported (``stats``,
:meth:`FacilityMILP.episode_stats`, ``eval/bench_solvers.py``), not obeyed. ``time_limit_s``
(e.g. 0.2 s inside a 1 s poll, the earlier default) adds the real-time deadline for users who
want it, at the price of machine-dependent decisions. The certified gap of every decision is
recorded (``stats["mip_gap"]``). When the solver fails or has no incumbent, the
request-level state-aware greedy (:func:`facility_greedy`, same objective) decides instead:
counted in ``stats["fallbacks"]`` and logged, never silent.
"""


from __future__ import annotations

import logging
from dataclasses import replace
import time
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError

from .base import Scheduler
from .baselines import CapacityBudget, capped_choice, greenest_rank, measured_step_cap
from .facility_model import (
    CAPACITY_LOAD_MARGIN,
    CAPACITY_UTIL_CAP,
    CAPACITY_UTIL_CAP_UNMEASURED,
    FacilityConfig,
    FacilityData,
    assignment_from_counts,
    class_greedy,
    compile_facility,
    facility_greedy,
    facility_objective,
    marginal_energy_j,
    pair_counts,
)
from .envadapter import action_from_assignment
from .facility_capacity import (
    CapacityFacts,
    CapacityResult,
    capacity_greedy,
    capacity_problem,
    capacity_view,
    solve_capacity,
)
from .facility_solve import SolveResult, solve_highspy, solve_pyomo
from .problem import PlacementProblem

log = logging.getLogger(__name__)

__all__ = [
    "FacilityConfig", "FacilityData", "SolveResult", "FacilityMILP", "compile_facility", "solve_highspy",
    "solve_pyomo", "facility_objective", "facility_greedy", "marginal_energy_j", "assignment_from_counts",
    "pair_counts", "class_greedy", "FacilityGreedy", "mix_preserving",
]


class FacilityMILP(Scheduler):
    """The facility MILP scheduler (``name = "facility-milp"``).

    Args:
        env: the env (optional until :meth:`reset`).
        config: a :class:`FacilityConfig`; keyword arguments override its fields.

    ``requested_config`` is the config as given; ``config`` the one in force this episode, its
    ``operating_point`` resolved at each :meth:`reset` from the env (``"auto"``: ``"measured"``
    when it routes only, ``"budget"`` under capacity control; ``"budget"`` without an env) and the
    operating point's settings filled in (:meth:`FacilityConfig.at_operating_point`); ``step_cap``
    (the share of the engine figure each datacenter keeps per step, a float or (D,)) is the
    measured one unless given.

    ``stats`` holds per decision ``decision_s`` (wall time of :meth:`act`, problem building
    included), ``place_s`` (wall time of :meth:`place`), ``build_s``, ``solve_s``,
    ``n_classes``, ``status``, ``objective_g``, ``mip_gap``, ``limit`` (the work or time limit
    that stopped the solve, ``""`` none; see :class:`SolveResult`), ``lp_iterations``,
    ``bb_nodes``, ``bb_work``; and the counters ``solves`` and ``fallbacks`` (with
    ``fallback_reasons``); :meth:`episode_stats` sums them up. Wall-clock figures live here
    only, never in the env's ``info``. With the default ``time_limit_s=None`` every decision is
    a deterministic function of the state (work limits only): the same seed gives the same
    episode on any machine, however loaded.
    """

    name = "facility-milp"

    def __init__(self, env: Any = None, config: FacilityConfig | None = None, **overrides: Any) -> None:
        base_kw = {k: overrides.pop(k) for k in ("ttft_margin", "tpot_margin", "cache_aware") if k in overrides}
        cfg = config if config is not None else FacilityConfig()
        if overrides:
            unknown = sorted(set(overrides) - set(FacilityConfig.__dataclass_fields__))
            if unknown:
                raise ConfigError(f"facility.{unknown[0]}", "unknown setting", allowed=sorted(FacilityConfig.__dataclass_fields__))
            cfg = replace(cfg, **overrides)
        self.requested_config = cfg
        self.operating_point_note = ""
        self._util_cap_note = ""
        self._basis_note = ""
        super().__init__(env, **base_kw)  # (its reset_state resolves config, step_cap and the budget)

    def reset_stats(self) -> None:
        """Clear the statistics."""
        self.stats = {"decision_s": [], "place_s": [], "build_s": [], "solve_s": [], "n_classes": [], "status": [],
                      "objective_g": [], "mip_gap": [], "limit": [], "lp_iterations": [], "bb_nodes": [], "bb_work": [],
                      "fallbacks": 0, "solves": 0, "fallback_reasons": [], "capacity_s": [], "capacity_status": [],
                      "capacity_fallbacks": 0}

    def episode_stats(self) -> dict[str, float]:
        """The episode's solver figures, for the evaluation's run rows (:func:`eval.runner.run_one`):
        solves, fallbacks to the greedy, solves stopped by a work limit (``work_limited``:
        LP iterations, branch-and-bound nodes or check points) or by the wall-clock deadline
        (``time_limited``, only with ``time_limit_s``), the certified gap (mean, p95), the
        branch-and-bound nodes; and ``wall_solve_s``, the wall time spent in :meth:`place`
        (reported, never used: every other figure is a deterministic function of the episode
        unless ``time_limit_s`` is set)."""
        st = self.stats
        limits = st["limit"]
        gaps = np.asarray([g for g in st["mip_gap"] if np.isfinite(g)], dtype=np.float64)
        return {
            "solves": float(st["solves"]),
            "fallbacks": float(st["fallbacks"]),
            "work_limited": float(sum(1 for x in limits if x in ("lp_iterations", "bb_nodes", "bb_work"))),
            "time_limited": float(sum(1 for x in limits if x == "time")),
            "mip_gap_mean": float(gaps.mean()) if gaps.size else float("nan"),
            "mip_gap_p95": float(np.percentile(gaps, 95)) if gaps.size else float("nan"),
            "bb_nodes": float(sum(st["bb_nodes"])),
            "wall_solve_s": float(sum(st["place_s"])),
            # (ttft_margin="auto" only: the measured TTFT margin, s, over the decisions)
            **({"ttft_margin_mean_s": float(np.mean(st["ttft_margin_s"])), "ttft_margin_max_s": float(np.max(st["ttft_margin_s"]))}
               if st.get("ttft_margin_s") else {}),
            # (capacity control only: the capacity stage's decisions and fallbacks to its greedy,
            # its utilisation cap: share of the engine figure, or of the datacenter figure where
            # capacity_basis_datacenter is 1, and its load margin)
            **({"capacity_solves": float(len(st["capacity_s"])), "capacity_fallbacks": float(st["capacity_fallbacks"]),
                "capacity_util_cap": self.util_cap, "capacity_basis_datacenter": float(self.capacity_basis == "datacenter"),
                "capacity_load_margin": self.load_margin}
               if st["capacity_s"] else {}),
            # (the operating point in force: 1 = "measured", 0 = "budget"; the mean step cap, share of the engine figure)
            "operating_point_measured": float(self.config.operating_point == "measured"),
            "step_cap_mean": float(np.mean(self.step_cap)) if self.step_cap is not None else float("nan"),
        }

    def reset_state(self) -> None:
        """Forget the capacity stage's memory (per-request work energy, static facts), resolve the
        operating point for the env (class docstring) and start the step cap's credit afresh."""
        self._cap_facts: CapacityFacts | None = None
        self._work_j: np.ndarray | None = None
        self._resolve_operating_point()

    def _resolve_operating_point(self) -> None:
        """``config`` and the step cap for this episode (class docstring); a ``"measured"``
        operating point without a measurement falls back to ``"budget"`` with a warning."""
        req = self.requested_config
        mode = req.operating_point
        u = getattr(self.env, "unwrapped", None) if self.env is not None else None
        sc = getattr(u, "scenario", None)
        if mode == "auto":
            mode = "measured" if sc is not None and sc.capacity.control != "agent" else "budget"
        cap: float | np.ndarray | None = None if req.step_cap is None else float(req.step_cap)
        note = ""
        if mode == "measured" and cap is None:
            if sc is None:
                cap, note = None, "no env to look the datacenter figure up in"
            else:
                cap, note = measured_step_cap(self.env)
            if cap is None:
                if note != self.operating_point_note:
                    log.warning("facility MILP: operating point 'measured' falls back to 'budget' (the prefill-token budget "
                                "alone): %s", note)
                mode = "budget"
        self.operating_point_note = note
        self.config = req.at_operating_point(mode)
        self.capacity_basis, self.capacity_scale = self._capacity_basis(sc)
        if req.capacity_util_cap is not None:
            self.util_cap = float(req.capacity_util_cap)
        else:
            self.util_cap = CAPACITY_UTIL_CAP if self.capacity_basis == "datacenter" else self._default_util_cap(sc)
        margin = req.capacity_load_margin
        self.load_margin = CAPACITY_LOAD_MARGIN[self.capacity_basis] if margin is None else float(margin)
        # (the capacity stage's cap and load margin, resolved)
        self.config = replace(self.config, capacity_util_cap=self.util_cap, capacity_load_margin=self.load_margin)
        self.step_cap: float | np.ndarray | None = cap  # (None: no step cap)
        self._budget: CapacityBudget | None = None if cap is None else CapacityBudget(cap, credit_s=self.config.step_cap_credit_s)

    def _capacity_basis(self, sc: Any) -> tuple[str, float | np.ndarray]:
        """The capacity stage's basis in force and its per-engine figure over the engine figure: 1
        on the engine basis; on the datacenter basis (``"datacenter"``, or ``"auto"`` under
        capacity control) each datacenter's figure at the env's polling period over the engine
        figure (:func:`solvers.baselines.measured_step_cap`), or ``("engine", 1)`` where it was not
        measured (with a warning when ``"datacenter"`` was asked for; under ``"auto"`` the
        utilisation cap's own warning says so)."""
        basis = self.requested_config.capacity_basis
        if basis == "engine" or sc is None or sc.capacity.control != "agent":
            return "engine", 1.0
        ratio, why = measured_step_cap(self.env)
        if ratio is None:
            if basis == "datacenter" and why != self._basis_note:
                log.warning("facility MILP: capacity_basis 'datacenter' falls back to 'engine': %s", why)
            self._basis_note = why
            return "engine", 1.0
        return "datacenter", ratio

    def _default_util_cap(self, sc: Any) -> float:
        """The capacity stage's utilisation cap when ``capacity_util_cap`` is None:
        :data:`CAPACITY_UTIL_CAP` x min(1, the lowest datacenter figure / engine figure at the env's
        polling period), or :data:`CAPACITY_UTIL_CAP_UNMEASURED` (with a warning under capacity
        control) where the env has no datacenter figure."""
        if sc is None:
            return CAPACITY_UTIL_CAP_UNMEASURED
        ratio, why = measured_step_cap(self.env)
        if ratio is None:
            if sc.capacity.control == "agent" and why != self._util_cap_note:
                log.warning("facility MILP: capacity_util_cap falls back to %g: %s", CAPACITY_UTIL_CAP_UNMEASURED, why)
            self._util_cap_note = why
            return CAPACITY_UTIL_CAP_UNMEASURED
        return CAPACITY_UTIL_CAP * min(1.0, float(np.min(ratio)))

    def act(self, observation: Any, info: dict[str, Any]) -> Any:
        """The env action: the routing array, or with ``[capacity] control = "agent"`` at a capacity
        decision ``{"route", "capacity", "servers"}`` (:mod:`solvers.facility_capacity`)."""
        if self.env is None:
            raise RuntimeError(f"{self.name}: no env; pass env= or call reset(env)")
        state = self.env.unwrapped.state()
        if state.capacity_control != "agent":
            return super().act(observation, info)
        t0 = time.perf_counter()
        problem = self.problem_of(state)
        self._remember_work_j(problem)
        decision = None
        targets = np.asarray(state.capacity_target_engines, dtype=np.int64)
        if state.capacity_decision:
            decision = self.decide_capacity(state, problem)
            targets = decision.awake
        view = capacity_view(problem, state, targets)
        assignment = self.place(view)
        assert self._facts is not None  # (set by problem_of())
        route = action_from_assignment(view, assignment, self._facts.layout.max_pending)
        self.stats["decision_s"].append(time.perf_counter() - t0)
        self.log_estimates(state, view, assignment)
        if decision is None:
            return route
        return {"route": route, "capacity": decision.awake, "servers": decision.servers}

    def _remember_work_j(self, problem: PlacementProblem) -> None:
        """Update the per-request work energy at each datacenter (J): the marginal energy of this
        step's pending requests plus the fixed energy of an engine over the current batch."""
        if problem.n_requests == 0:
            return
        e, fixed = marginal_energy_j(problem)
        w = e.mean(axis=0) + fixed / np.maximum(problem.batch_per_busy_engine, 1.0)
        self._work_j = w if self._work_j is None else 0.9 * self._work_j + 0.1 * w

    def decide_capacity(self, state: Any, problem: PlacementProblem) -> CapacityResult:
        """The capacity stage at a decision: awake engines and servers per datacenter."""
        t0 = time.perf_counter()
        if self._cap_facts is None:
            self._cap_facts = CapacityFacts.from_env(self.env)
        cfg = self.config
        work = self._work_j if self._work_j is not None else np.zeros(problem.n_datacenters)
        cp = capacity_problem(state, problem, self._cap_facts, work, self.util_cap, self.load_margin,
                              cfg.capacity_lookahead_s, cfg.violation_penalty_g, capacity_scale=self.capacity_scale)
        try:
            res = solve_capacity(cp, cfg.threads)
        except Exception as exc:  # noqa: BLE001 - any solver failure falls back, counted and logged
            res = capacity_greedy(cp)
            res = replace(res, status=f"greedy (error: {type(exc).__name__}: {exc})", fallback=True)
        st = self.stats
        st["capacity_s"].append(time.perf_counter() - t0)
        st["capacity_status"].append(res.status)
        if res.fallback:
            st["capacity_fallbacks"] += 1
            log.warning("facility MILP capacity stage falls back to the greedy at t=%.1f s: %s", state.time_s, res.status)
        return res

    def _solve(self, data: FacilityData, warm: tuple[np.ndarray, np.ndarray] | None, poll_s: float) -> SolveResult:
        if self.config.backend == "pyomo":
            return solve_pyomo(data, self.config)
        work = self.config.work_limit_at(poll_s)
        cfg = self.config if work == self.config.bb_work_limit else replace(self.config, bb_work_limit=work)
        return solve_highspy(data, cfg, warm)

    def place(self, problem: PlacementProblem) -> np.ndarray:
        """Assignment (R,) of the pending requests: datacenter index, or D to defer."""
        t0 = time.perf_counter()
        if problem.n_requests == 0:
            self.stats["place_s"].append(time.perf_counter() - t0)
            return np.zeros(0, dtype=np.int64)
        data = compile_facility(problem, self.config)
        warm = class_greedy(data) if self.config.warm_start else None
        try:
            res = self._solve(data, warm, problem.poll_s)
        except Exception as exc:  # noqa: BLE001 - any solver failure falls back, counted and logged
            res = SolveResult(None, None, f"error: {type(exc).__name__}: {exc}", float("nan"), 0.0, 0.0)
        self.stats["solves"] += 1
        self.stats["status"].append(res.status)
        self.stats["build_s"].append(res.build_s)
        self.stats["solve_s"].append(res.solve_s)
        self.stats["n_classes"].append(data.n_classes)
        self.stats["objective_g"].append(res.objective)
        self.stats["mip_gap"].append(res.mip_gap)
        self.stats["limit"].append(res.limit)
        self.stats["lp_iterations"].append(res.lp_iterations)
        self.stats["bb_nodes"].append(res.bb_nodes)
        self.stats["bb_work"].append(res.bb_work)
        assignment = None
        reason = ""
        if res.x is None or res.defer is None:
            reason = f"no incumbent ({res.status})"
        elif not np.allclose(np.bincount(data.pc, weights=res.x, minlength=data.n_classes) + res.defer, data.count):
            reason = "solution does not place every request exactly once"
        else:
            assignment = assignment_from_counts(problem, data, res.x, res.defer)
        if assignment is None:
            self.stats["fallbacks"] += 1
            self.stats["fallback_reasons"].append(reason)
            log.warning("facility MILP falls back to the state-aware greedy at t=%.1f s: %s", problem.time_s, reason)
            assignment = facility_greedy(problem, self.config)
        if self._budget is not None:
            assignment = self._apply_step_cap(problem, assignment)
        if self.config.mix_fill:
            assignment = mix_preserving(problem, assignment)
        self.stats["place_s"].append(time.perf_counter() - t0)
        return assignment

    def _apply_step_cap(self, problem: PlacementProblem, assignment: np.ndarray) -> np.ndarray:
        """``config.step_cap``: each datacenter keeps at most its step budget of the requests the
        solve gave it (the longest waiting first); the others go, longest waiting first, to the
        greenest allowed datacenter with budget left (ties: lower PUE, then index), or when none
        has any, to the allowed one with the most budget left relative to its whole step budget
        (:func:`solvers.baselines.capped_choice`: the excess in proportion to the budgets, as
        ``greedy-cap`` spreads it). Deferred requests stay deferred."""
        assert self._budget is not None
        p = problem
        d_n = p.n_datacenters
        budget = self._budget.budget(p, self.env)
        out = np.asarray(assignment, dtype=np.int64).copy()
        order = np.argsort(-p.waited_s, kind="stable")
        kept = np.zeros(d_n)
        moved: list[int] = []
        for r in order:
            d = int(out[r])
            if d >= d_n:
                continue
            if kept[d] + 1.0 <= budget[d]:
                kept[d] += 1.0
            else:
                moved.append(int(r))
        if moved:
            allowed, s = greenest_rank(p)
            idx = np.asarray(moved, dtype=np.int64)
            # (when every allowed one is full, the excess in proportion to the whole step budgets, as greedy-cap)
            sub, _ = capped_choice(np.arange(idx.size), allowed[idx], s[idx], np.maximum(budget - kept, 0.0), cap=budget)
            out[idx] = np.where(sub < d_n, sub, out[idx])
        placed = out < d_n
        self._budget.spend(np.bincount(out[placed], minlength=d_n).astype(np.float64))
        return out


def mix_preserving(p: PlacementProblem, assignment: np.ndarray) -> np.ndarray:
    """``FacilityConfig.mix_fill``: the same number of requests at each datacenter as
    ``assignment`` (R,) (datacenter index, ``D`` = deferred), but dealt again: the placed requests,
    longest waiting first, each to the greenest allowed datacenter with some of its count left
    (ties: lower PUE, then index; :func:`solvers.baselines.greenest_rank`); a request allowed at
    no datacenter with count left goes to the allowed one with the most count left relative to
    its count (:func:`solvers.baselines.capped_choice`). Deferred requests stay deferred. With
    every datacenter allowed to every request, the counts are kept exactly and which request
    goes where no longer depends on its size."""
    d_n = p.n_datacenters
    out = np.asarray(assignment, dtype=np.int64).copy()
    idx = np.flatnonzero(out < d_n)
    if idx.size == 0:
        return out
    counts = np.bincount(out[idx], minlength=d_n).astype(np.float64)
    allowed, rank = greenest_rank(p)
    order = np.argsort(-p.waited_s[idx], kind="stable")
    sub, _ = capped_choice(order, allowed[idx], rank[idx], counts)
    out[idx] = np.where(sub < d_n, sub, out[idx])
    return out


class FacilityGreedy(Scheduler):
    """The state-aware greedy on the facility objective alone (``name = "facility-greedy"``;
    the MILP's fallback, exposed as a scheduler for comparison)."""

    name = "facility-greedy"

    def __init__(self, env: Any = None, config: FacilityConfig | None = None, **overrides: Any) -> None:
        base_kw = {k: overrides.pop(k) for k in ("ttft_margin", "tpot_margin", "cache_aware") if k in overrides}
        cfg = config if config is not None else FacilityConfig()
        self.config = replace(cfg, **overrides) if overrides else cfg
        super().__init__(env, **base_kw)

    def place(self, problem: PlacementProblem) -> np.ndarray:
        """Greedy assignment (see :func:`facility_greedy`)."""
        return facility_greedy(problem, self.config)

