"""The facility MILP's model: its configuration, the coefficients compiled from a
:class:`~solvers.problem.PlacementProblem` (:class:`FacilityData`), the objective of an
assignment, the greedy placements (the incumbent and the fallback) and the translation of pair
counts back to requests. The formulation is in :mod:`solvers.facility`; the solvers in
:mod:`solvers.facility_solve`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from carbon_gym.errors import ConfigError

from .problem import PlacementProblem

#: ``FacilityConfig.operating_point``'s values.
OPERATING_POINTS = ("auto", "measured", "budget")
#: The capacity stage's utilisation cap at the measured operating point, share of the datacenter
#: figure where that is below the engine figure (``FacilityConfig.capacity_util_cap``).
CAPACITY_UTIL_CAP = 0.9
#: The cap where the env's datacenter figure was not measured (the default before issue 40).
CAPACITY_UTIL_CAP_UNMEASURED = 0.7
#: What the capacity stage plans one awake engine to carry (``FacilityConfig.capacity_basis``).
CAPACITY_BASES = ("auto", "engine", "datacenter")
#: The capacity stage's load margin on each basis when ``FacilityConfig.capacity_load_margin`` is
#: None: the setting each was chosen with on training starts (RESULTS.md, "Why the capacity MILP
#: stayed far from the bound at high load").
CAPACITY_LOAD_MARGIN = {"engine": 0.1, "datacenter": 0.0}

__all__ = [
    "OPERATING_POINTS", "CAPACITY_UTIL_CAP", "CAPACITY_UTIL_CAP_UNMEASURED", "CAPACITY_BASES", "CAPACITY_LOAD_MARGIN", "FacilityConfig", "FacilityData", "compile_facility", "facility_objective", "facility_greedy", "marginal_energy_j",
    "assignment_from_counts", "pair_counts", "class_greedy",
]


@dataclass(frozen=True)
class FacilityConfig:
    """Settings of the facility MILP (see the module docstring).

    Attributes:
        violation_penalty_g: lambda, grams charged per counted SLO violation.
        defer_penalty_g: base grams charged per deferred request (plus lambda x (1 + the
            request's prompt and KV footprint in mean requests), see the module docstring).
        engine_model: ``"spread"`` (woken engines = min(added, idle)) or ``"pack"``.
        ttft_budget_quantile: q of the added-wait budget theta_d (0..1).
        class_budget_margin: the class form plans with token budgets ``(1 - margin) T_d``, as
            a split class's members carry a slightly different prompt total than count x mean
            (0 in the binary form).
        max_prefill_share: cap on the share of iteration time prefill may take at a datacenter
            (rho in Q_d), a utilisation cap that leaves room for the randomness of arrivals;
            ``None`` (default): the operating point's (0.5 under ``"budget"``, 1.0 under
            ``"measured"``, where the step cap holds the datacenter instead; :attr:`prefill_share`).
        prefill_horizon_s: H, seconds: ``Q0_d`` holds ``max(poll_s, H)`` seconds of prefill at
            share rho, so the backlog a datacenter may hold (queued and in transit, subtracted
            from ``Q0_d``) is the same in seconds at every period up to H; at periods >= H the
            program is the one-period program, coefficient for coefficient. ``None``: one polling
            period whatever the period. At a period near the network delay the prompts still in
            transit take much of one period's ``Q0_d`` (llama8b-moderate at 0.1 s: half of it at
            the cleanest datacenters; ``python -m eval.polling_probe``), so ``None`` caps a clean
            datacenter's usable prefill rate lower the shorter the period (31.8% below rr at 0.1
            s against 38.7% with 0.5). The default 0.5 s was chosen on training starts only: the
            largest horizon passing MLPerf p99 in every training start at 0.1 s polling (1 s fails
            TPOT p99; RESULTS.md, "Estimate error and the knobs chosen on training starts"), then
            checked on two training starts of each of the nine headline scenarios
            (``results/selection/headline-train``).
        overload_spread: when the fleet's prompt-token budget cannot hold the backlog plus the
            pending prompts, every datacenter's budget is raised to its share of that demand in
            proportion to its capacity ``Q0_d`` (x ``1 + overload_slack``): overload is spread like
            round-robin instead of being priced uniformly (which piled it on the cleanest grids).
        overload_slack: headroom of that proportional share (0.05 = 5% above the demand; on
            llama8b-high, seed 0, 60 s: 0.05 -> 6.2% SLO violations and 2.5% less carbon than
            round-robin (6.4%), 0.07 -> 6.6% and 2.2%).
        prompt_ratio, output_ratio: geometric bin ratios of prompt / predicted output length in
            the class form (> 1; ``None`` = do not bin on it).
        headroom_bin_s: width of the bins of ``waited + prompt x mean prefill s/token`` (the
            datacenter-independent part of the TTFT), seconds (``None`` = do not bin on it).
        binary: per-request binary form (every request its own class) instead of classes.
        mip_gap: relative MIP gap.
        lp_iteration_limit: simplex iterations allowed to the LP relaxation (a deterministic work
            limit: the LP stops at the same point on any machine, however loaded).
        bb_node_limit: branch-and-bound nodes allowed to HiGHS (``mip_max_nodes``; deterministic).
        bb_work_limit: work allowed to branch-and-bound, in HiGHS's interrupt check points:
            HiGHS calls the interrupt callback at fixed points of its algorithm (every 0.5-5 ms
            of work here, root node included), the same points on every run of a problem, so
            stopping after this many is deterministic where a time limit is not. (HiGHS reports
            no simplex iteration count to the MIP callback, and its own options bound nodes,
            not the root node's cut loop, which is most of the work on these programs.)
        bb_work_poll_s: ``bb_work_limit`` is the budget of a decision at a polling period of this
            many seconds; at a shorter period the solve gets the proportional share of it (at least
            one check point; :meth:`work_limit_at`), so a decision's work stays within the same share
            of its period: 40 check points took ~0.2-0.4 s here, more than a 0.1 or 0.25 s poll, on
            the small programs of short polls that branch-and-bound runs on (measured with
            llama8b-moderate at 0.1 s: 0.21 s per decision with the full budget). Longer periods
            keep ``bb_work_limit``. ``None``: ``bb_work_limit`` at every period.
        time_limit_s: ``None`` (default): no wall-clock limit; the solve is bounded by the
            work limits above only, so the same problem gives the same decision on any machine
            and every run of a seed gives the same row. A number: the real-time budget of the
            earlier default (0.2 s inside a 1 s poll), build included: the LP and
            branch-and-bound also stop at that deadline, and branch-and-bound is skipped when
            less than 20 ms remain; the decisions then depend on the machine's speed and load.
        backend: ``"highspy"`` (direct arrays) or ``"pyomo"`` (reference model via appsi_highs).
        warm_start: hand the greedy placement to HiGHS as the starting incumbent.
        threads: HiGHS threads.
        bb_max_columns: run HiGHS branch-and-bound only on programs with at most this many x
            columns (pairs); larger ones return the LP-rounding incumbent with its certified gap
            (HiGHS's root cut separation alone took 0.3-0.75 s at ~1,600 columns here and does
            not honour the interrupt callback, so it cannot fit a 0.25 s decision).
        capacity_util_cap: with ``[capacity] control = "agent"`` (:mod:`solvers.facility_capacity`):
            the utilisation cap u, the share of what one awake engine is planned to carry
            (``capacity_basis``) that the awake engines are planned to carry (0..1]. ``None``
            (default): :data:`CAPACITY_UTIL_CAP` (0.9) of the datacenter figure on the datacenter
            basis; on the engine basis 0.9 x min(1, r) of the engine figure
            (``EnvState.engine_capacity_per_s``), r the datacenter figure at the env's polling
            period over the engine figure, lowest over the datacenters (0.9 at 0.1 s polling on the
            three study models, r 1.205 / 1.204 / 1.036; 0.68 at 1 s, r 0.76): either way the awake
            engines are never planned past 90% of what they serve within p99 at that polling
            period. 0.9 is the largest cap tried (0.7 / 0.8 / 0.9) passing MLPerf p99 in every
            training start of llama8b-moderate on the engine basis, then checked on two training
            starts of each other headline scenario (RESULTS.md, "The capacity-control frontier"),
            and kept on the datacenter basis. Without a datacenter figure for the env:
            :data:`CAPACITY_UTIL_CAP_UNMEASURED` (0.7, the default before).
        capacity_basis: what one awake engine is planned to carry in the capacity stage, before
            the cap u: ``"datacenter"`` the datacenter figure r x c at the env's polling period
            (what a datacenter of those engines serves within p99 per engine, r 1.205 / 1.204 /
            1.036 at 0.1 s on the three study models, 0.76 at 1 s), each datacenter its own, for
            both the period's capacity rows and the later rows, with the default cap
            :data:`CAPACITY_UTIL_CAP` (0.9) x 1; ``"engine"`` the engine figure c (the load-level
            file's ``per_engine_rate_per_s``, one engine at its p99 capacity), the default cap then
            0.9 x min(1, lowest r); ``"auto"`` (default) ``"datacenter"`` where the env's datacenter
            figure is measured, else ``"engine"`` (``"datacenter"`` asked for explicitly falls back
            the same way, with a warning). (Why the datacenter basis: the router under the stage
            loads the cleanest datacenters to about the datacenter figure, so a plan at 0.9 c keeps
            the engines of 2-3 more datacenters awake that then serve under 1% of the requests;
            chosen on training starts with the load margin 0 and held on the held-out starts: 7-13 pp
            more reduction at high load, 3.5-5.4 at moderate, 0.7-0.9 at low, p99 8/8 everywhere;
            RESULTS.md, Discussion, "Why the capacity MILP stayed far from the bound at high load".
            The engine basis was the default before 89a9dcb.)
        capacity_load_margin: the planned load is the observed fleet arrival rate's 99% upper
            bound x (1 + this). ``None`` (default): :data:`CAPACITY_LOAD_MARGIN` of the basis in
            force, 0 on the datacenter basis (the rate bound is the only load margin), 0.1 on the
            engine basis (the default before 89a9dcb).
        capacity_lookahead_s: lookahead of the capacity decision, seconds (at least one
            ``capacity.period_s``: a smaller value means the period).
        affinity_g_per_ktok: the cache-affinity knob (prefix workloads), grams CO2eq charged per
            1,000 prompt tokens a placement re-prefills that another datacenter holds cached:
            ``kappa_cd += affinity x (max_d' cached_rd' - cached_rd) / 1000`` (0, the default: the
            cached prefixes count only through the prefill time, energy and TTFT they save). Its
            sweep traces the carbon-vs-affinity frontier (``carbon-gym experiment sessions``).
        operating_point: how each datacenter is held to what it serves within p99 TTFT / TPOT:
            ``"measured"``: after each solve a datacenter keeps at most its measured SLO
            capacity's share of the step (``step_cap``, by default the datacenter figure of the
            load-level file at the env's polling period over the engine figure:
            ``carbon_gym/data/load_levels.toml`` ``dc_*``, ``python eval/measure_capacity.py
            --datacenter``; 1.205 / 1.204 / 1.036 on Llama / Qwen / Mixtral at 0.1 s polling, 0.76 /
            0.77 / 0.75 at 1 s), with 1 s of carried credit (``step_cap_credit_s``), the prefill-token
            budget loosened so that the cap binds (``max_prefill_share`` 1.0) and ``mix_fill`` on.
            ``"budget"``: the prefill-token budget alone (``max_prefill_share`` 0.5 over
            ``prefill_horizon_s``), the default before issue 40's operating point: it holds p99
            but leaves 5-7 pp to the SLO-true bound at high load (RESULTS.md, "The MILP's gap to the
            SLO-true bound"). ``"auto"`` (default): ``"measured"`` when the env routes only,
            ``"budget"`` under ``[capacity] control = "agent"`` (the capacity stage's
            ``capacity_util_cap`` is that MILP's operating point). Where the datacenter figure was
            not measured for the env's (model, GPU, TP, engines, polling period), or no rate passes
            p99 there (2 s polling), ``"measured"`` falls back to ``"budget"`` for the episode with a
            warning (``episode_stats()["operating_point_measured"]`` 0).
        step_cap: ``None`` (default: the operating point's; none under ``"budget"``) or a share of
            the engine figure, the per-engine capacity of the load-level file (0..2]: after each
            solve, a datacenter keeps at most ``step_cap x engines x capacity x poll_s`` of the step's
            requests (:class:`solvers.baselines.CapacityBudget`, the longest waiting first), the
            rest going to the greenest allowed datacenters with budget left (the ``greedy-cap``
            rule). With the token budget at 0.5 it binds first and the cap changes little; with
            ``max_prefill_share`` 1.0 and ``mix_fill`` the MILP matches ``greedy-cap`` at the same
            cap (RESULTS.md, "The MILP at the operating point").
        step_cap_credit_s: the step cap's carried credit (:class:`solvers.baselines.CapacityBudget`
            ``credit_s``), seconds of budget; ``None``: the operating point's (1 s under
            ``"measured"``, chosen on greedy-op's training starts; two steps under ``"budget"``).
        mix_fill: after the solve (and the step cap), keep the number of requests each datacenter
            gets but not which ones: the placed requests are dealt again, longest waiting first,
            each to the greenest allowed datacenter with some of its count left
            (:func:`solvers.facility.mix_preserving`), so every datacenter serves the step's
            request mix. The program prices a request's energy, which grows with its size, under
            budgets (prompt tokens, sequences) that do not grow the same way, so it sends the
            requests of one size to the cleanest datacenters (short prompts under the token
            budget, long ones under a count cap, ``python -m eval.request_mix``), and a
            datacenter's p99 capacity holds for the mix, not for one end of it. ``None``: the
            operating point's (on under ``"measured"``, off under ``"budget"``).
    """

    violation_penalty_g: float = 1.0
    defer_penalty_g: float = 2.0
    engine_model: str = "spread"
    ttft_budget_quantile: float = 0.02
    max_prefill_share: float | None = None
    overload_spread: bool = True
    overload_slack: float = 0.05
    class_budget_margin: float = 0.03
    prompt_ratio: float | None = None
    output_ratio: float | None = 2.0
    headroom_bin_s: float | None = 0.25
    binary: bool = False
    mip_gap: float = 0.01
    lp_iteration_limit: int = 50_000
    bb_node_limit: int = 50
    bb_work_limit: int = 40
    bb_work_poll_s: float | None = 1.0
    time_limit_s: float | None = None
    backend: str = "highspy"
    warm_start: bool = True
    threads: int = 1
    bb_max_columns: int = 600
    capacity_util_cap: float | None = None
    capacity_basis: str = "auto"
    capacity_load_margin: float | None = None
    capacity_lookahead_s: float = 0.0
    affinity_g_per_ktok: float = 0.0
    prefill_horizon_s: float | None = 0.5
    step_cap: float | None = None
    step_cap_credit_s: float | None = None
    mix_fill: bool | None = None
    operating_point: str = "auto"

    @property
    def prefill_share(self) -> float:
        """``max_prefill_share``, or the operating point's where it is None: 1.0 under
        ``"measured"``, 0.5 otherwise (``"budget"``, or ``"auto"`` not yet resolved)."""
        if self.max_prefill_share is not None:
            return float(self.max_prefill_share)
        return 1.0 if self.operating_point == "measured" else 0.5

    def at_operating_point(self, mode: str) -> FacilityConfig:
        """This config with ``operating_point`` = ``mode`` (``"measured"`` or ``"budget"``) and the
        settings left None filled with that operating point's (``max_prefill_share``, ``mix_fill``,
        ``step_cap_credit_s``; ``step_cap`` stays: the measured cap is the solver's to look up)."""
        if mode not in ("measured", "budget"):
            raise ConfigError("facility.operating_point", f"cannot resolve to {mode!r}", allowed=["measured", "budget"])
        m = mode == "measured"
        at = replace(self, operating_point=mode)
        return replace(at, max_prefill_share=at.prefill_share, mix_fill=bool(self.mix_fill) if self.mix_fill is not None else m,
                       step_cap_credit_s=self.step_cap_credit_s if self.step_cap_credit_s is not None or not m else 1.0)

    def __post_init__(self) -> None:
        if self.engine_model not in ("spread", "pack"):
            raise ConfigError("facility.engine_model", f"unknown value {self.engine_model!r}", allowed=["spread", "pack"])
        if self.backend not in ("highspy", "pyomo"):
            raise ConfigError("facility.backend", f"unknown value {self.backend!r}", allowed=["highspy", "pyomo"])
        for name in ("prompt_ratio", "output_ratio"):
            v = getattr(self, name)
            if v is not None and not v > 1:
                raise ConfigError(f"facility.{name}", f"must be > 1 or None, got {v}")
        if self.headroom_bin_s is not None and not self.headroom_bin_s > 0:
            raise ConfigError("facility.headroom_bin_s", f"must be > 0 or None, got {self.headroom_bin_s}")
        if not 0.0 <= self.class_budget_margin < 1.0:
            raise ConfigError("facility.class_budget_margin", "must be in [0, 1)")
        if self.max_prefill_share is not None and not 0.0 < self.max_prefill_share <= 1.0:
            raise ConfigError("facility.max_prefill_share", f"must be in (0, 1] or None (the operating point's), got {self.max_prefill_share!r}")
        if self.operating_point not in OPERATING_POINTS:
            raise ConfigError("facility.operating_point", f"unknown value {self.operating_point!r}", allowed=list(OPERATING_POINTS))
        if self.prefill_horizon_s is not None and not (math.isfinite(self.prefill_horizon_s) and self.prefill_horizon_s > 0):
            raise ConfigError("facility.prefill_horizon_s", f"must be > 0 seconds or None (one polling period), got {self.prefill_horizon_s!r}")
        if not 0.0 <= self.overload_slack <= 1.0:
            raise ConfigError("facility.overload_slack", "must be in [0, 1]")
        if not 0.0 <= self.ttft_budget_quantile <= 1.0:
            raise ConfigError("facility.ttft_budget_quantile", "must be in [0, 1]")
        if self.violation_penalty_g < 0 or self.defer_penalty_g < 0:
            raise ConfigError("facility.violation_penalty_g", "penalties must be >= 0")
        if self.mip_gap < 0:
            raise ConfigError("facility.mip_gap", f"must be >= 0, got {self.mip_gap}")
        self._check_limits()
        self._check_capacity()

    def _check_limits(self) -> None:
        """Check the solve's work and time limits (ConfigError naming the field)."""
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ConfigError("facility.time_limit_s", f"must be >= 0 seconds or None (no wall-clock limit), got {self.time_limit_s}")
        if self.bb_work_poll_s is not None and not self.bb_work_poll_s > 0:
            raise ConfigError("facility.bb_work_poll_s", f"must be > 0 seconds or None (the same budget at every period), got {self.bb_work_poll_s}")
        for name in ("lp_iteration_limit", "bb_node_limit", "bb_work_limit"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ConfigError(f"facility.{name}", f"must be an integer >= 0, got {v!r}")

    def work_limit_at(self, poll_s: float) -> int:
        """The branch-and-bound work budget (check points) of a decision at polling period
        ``poll_s`` seconds: ``bb_work_limit`` x min(1, poll_s / bb_work_poll_s), rounded, at least 1
        (``bb_work_limit`` itself when that is 0 or ``bb_work_poll_s`` is None)."""
        if self.bb_work_poll_s is None or self.bb_work_limit == 0 or poll_s >= self.bb_work_poll_s:
            return int(self.bb_work_limit)
        return max(1, int(round(self.bb_work_limit * poll_s / self.bb_work_poll_s)))

    def _check_capacity(self) -> None:
        """Check the capacity stage's settings (ConfigError naming the field)."""
        if self.step_cap is not None and not (isinstance(self.step_cap, (int, float)) and 0.0 < float(self.step_cap) <= 2.0):
            raise ConfigError("facility.step_cap", f"must be None or in (0, 2] (share of the measured capacity), got {self.step_cap!r}")
        c = self.step_cap_credit_s
        if c is not None and (isinstance(c, bool) or not (isinstance(c, (int, float)) and 0.0 < float(c) <= 60.0)):
            raise ConfigError("facility.step_cap_credit_s", f"must be None (two steps) or in (0, 60] seconds, got {c!r}")
        if self.mix_fill is not None and not isinstance(self.mix_fill, (bool, np.bool_)):
            raise ConfigError("facility.mix_fill", f"must be true or false (or None: the operating point's), got {self.mix_fill!r}",
                              allowed=[True, False])
        u = self.capacity_util_cap
        if u is not None and (isinstance(u, bool) or not (isinstance(u, (int, float)) and 0.0 < float(u) <= 1.0)):
            raise ConfigError("facility.capacity_util_cap", f"must be in (0, 1] or None (the measured operating point's), got {u!r}")
        if self.capacity_basis not in CAPACITY_BASES:
            raise ConfigError("facility.capacity_basis", f"unknown basis {self.capacity_basis!r}", allowed=list(CAPACITY_BASES))
        for name in ("capacity_load_margin", "capacity_lookahead_s", "affinity_g_per_ktok"):
            v = getattr(self, name)
            if v is None and name == "capacity_load_margin":
                continue
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                what = " (or None: the basis's own)" if name == "capacity_load_margin" else ""
                raise ConfigError(f"facility.{name}", f"must be finite and >= 0{what}, got {v!r}")


# ---------------------------------------------------------------------------------- coefficients
def marginal_energy_j(problem: PlacementProblem) -> tuple[np.ndarray, np.ndarray]:
    """Marginal energy of each request at each datacenter, and the fixed energy per woken engine.

    Returns:
        ``e`` (R, D) joules: prefill above the decode base power plus output tokens x the
        decode increment of joining a batch of ``n_d`` (module docstring);
        ``fixed`` (D,) joules: ``tp (P_dec(1) - P_idle) H_d`` per engine woken.
    """
    p = problem
    n = np.maximum(p.batch_per_busy_engine, 1.0)
    d_inc = p.engine_increment_j(n + 1.0) - p.engine_increment_j(n)
    pre = p.tp * (p.gpu_prefill_w - p.decode_power_w(n))[None, :] * p.prefill_compute_s
    e = pre + p.output_tokens[:, None] * d_inc[None, :]
    if p.n_requests:
        hold = (p.prefill_compute_s + p.output_tokens[:, None] * p.tpot_idle_s[None, :]).mean(axis=0)
    else:
        hold = np.zeros(p.n_datacenters)
    fixed = p.tp * (p.decode_power_w(1.0) - p.gpu_idle_w) * hold
    return e, fixed


def headroom_s(problem: PlacementProblem) -> np.ndarray:
    """(R, D) TTFT headroom before any added wait: slo - waited - net - W0 - prefill, seconds."""
    return problem.ttft_slo_s - problem.ttft_estimate_s()


def age_rank(problem: PlacementProblem) -> np.ndarray:
    """(R,) u_r in (0, 1]: share of the pending requests at least as old as r (oldest first)."""
    r_n = problem.n_requests
    order = np.argsort(-problem.waited_s, kind="stable")
    u = np.empty(r_n)
    u[order] = (np.arange(r_n) + 1.0) / max(r_n, 1)
    return u


def effective_headroom_s(problem: PlacementProblem) -> np.ndarray:
    """(R, D) ``h_rd / u_r``: the added wait at d (all prompt tokens placed there, beta_d Pr_d)
    request r tolerates, as requests are sent oldest first and r waits behind only the older
    share u_r of the tokens placed at its datacenter. Negative where h_rd < 0."""
    h = headroom_s(problem)
    return np.where(h < 0, h, h / age_rank(problem)[:, None])


def allowed_pairs(problem: PlacementProblem) -> np.ndarray:
    """(R, D) bool: allowed by the env's mask and the datacenter is up."""
    return problem.allowed & problem.up[None, :]


def ttft_budget_s(problem: PlacementProblem, cfg: FacilityConfig, h: np.ndarray | None = None) -> np.ndarray:
    """(D,) added-wait budget theta_d, seconds (see the module docstring)."""
    p = problem
    h = effective_headroom_s(p) if h is None else h
    allowed = allowed_pairs(p)
    beta = p.prefill_s_per_token / p.n_engines
    theta = np.zeros(p.n_datacenters)
    tokens = p.prefill_tokens if p.cached_prompt_tokens is not None else None
    for d in range(p.n_datacenters):
        col = h[allowed[:, d], d]
        col = col[col >= 0]
        wmax = beta[d] * float((p.prompt_tokens if tokens is None else tokens[:, d])[allowed[:, d]].sum())
        q = float(np.quantile(col, cfg.ttft_budget_quantile, method="lower")) if col.size else 0.0
        theta[d] = min(q, wmax)
    return theta


@dataclass
class FacilityData:
    """Compiled coefficients of one facility program (class or binary form).

    Attributes (C classes, D datacenters, P allowed pairs):
        class_of: (R,) class of each request; count, prompt, kv: (C,) size, mean prompt tokens,
            mean prompt + predicted output tokens. pair_prompt: (P,) mean prefill tokens of the
            pair's class at its datacenter (= prompt of the class without cached prefixes).
        pc, pd: (P,) class and datacenter of each pair; cost: (P,) grams per request
            (kappa + lambda x miss fraction); kappa, miss: its two parts.
        cap_seq, spe, idle, fixed_g, free_kv, beta, theta, prefill_cap, floor_tok, big_m: (D,)
            per-datacenter figures (module docstring); budget_scale: factor on the token budget
            (class form); defer_cost: (C,) grams per deferred request of each class.
        lam, lam_tok, lam_kv, lam_defer: penalties (grams per violation / prompt token over
            budget / KV token over capacity / deferral).
        engine_model: ``"spread"`` or ``"pack"``.
    """

    class_of: np.ndarray
    count: np.ndarray
    prompt: np.ndarray
    kv: np.ndarray
    pc: np.ndarray
    pd: np.ndarray
    kappa: np.ndarray
    miss: np.ndarray
    cap_seq: np.ndarray
    spe: np.ndarray
    idle: np.ndarray
    fixed_g: np.ndarray
    free_kv: np.ndarray
    beta: np.ndarray
    theta: np.ndarray
    prefill_cap: np.ndarray
    floor_tok: np.ndarray
    defer_cost: np.ndarray
    pair_prompt: np.ndarray
    budget_scale: float
    big_m: np.ndarray
    lam: float
    lam_tok: float
    lam_kv: float
    lam_defer: float
    engine_model: str
    n_datacenters: int

    @property
    def n_classes(self) -> int:
        """Number of classes C."""
        return int(self.count.shape[0])

    @property
    def cost(self) -> np.ndarray:
        """(P,) objective coefficient of x: kappa + lambda x miss fraction."""
        return self.kappa + self.lam * self.miss

    @property
    def tok_cap(self) -> np.ndarray:
        """(D,) prompt-token budget: max(min(theta_d / beta_d, prefill_cap_d), floor_tok_d)."""
        own = np.minimum(self.theta / np.maximum(self.beta, 1e-300), self.prefill_cap)
        return self.budget_scale * np.maximum(own, self.floor_tok)


def _class_keys(problem: PlacementProblem, allowed: np.ndarray, cfg: FacilityConfig) -> np.ndarray:
    """Class index of every request (see :class:`FacilityConfig` for the binning)."""
    r = problem.n_requests
    if cfg.binary or r == 0:
        return np.arange(r, dtype=np.int64)
    packed = np.packbits(allowed, axis=1)
    _, mask_id = np.unique(packed, axis=0, return_inverse=True)
    parts = [mask_id.reshape(-1).astype(np.int64), problem.origin.astype(np.int64)]
    if cfg.prompt_ratio is not None:
        parts.append(np.floor(np.log(np.maximum(problem.prompt_tokens, 1.0)) / np.log(cfg.prompt_ratio)).astype(np.int64))
    if cfg.output_ratio is not None:
        parts.append(np.floor(np.log(np.maximum(problem.output_tokens, 1.0)) / np.log(cfg.output_ratio)).astype(np.int64))
    if cfg.headroom_bin_s is not None:
        used = problem.waited_s + problem.prompt_tokens * float(np.mean(problem.prefill_s_per_token))
        parts.append(np.floor(used / cfg.headroom_bin_s).astype(np.int64))
    if problem.cached_prompt_tokens is not None:  # the datacenter holding most of its prefix, and the share in quarters
        c = problem.cached_prompt_tokens
        best = c.max(axis=1)
        parts.append(np.where(best > 0, np.argmax(c, axis=1), -1).astype(np.int64))
        parts.append(np.floor(4.0 * best / np.maximum(problem.prompt_tokens, 1.0)).astype(np.int64))
    key = np.zeros(r, dtype=np.int64)
    for v in parts:
        v = v - v.min()
        key = key * (int(v.max()) + 1) + v
    _, inv = np.unique(key, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


def compile_facility(problem: PlacementProblem, cfg: FacilityConfig = FacilityConfig()) -> FacilityData:
    """Compute every coefficient of the facility program for ``problem`` (module docstring)."""
    p = problem
    d_n = p.n_datacenters
    allowed = allowed_pairs(p)
    class_of = _class_keys(p, allowed, cfg)
    n_cls = int(class_of.max()) + 1 if p.n_requests else 0
    order = np.argsort(class_of, kind="stable")
    starts = np.searchsorted(class_of[order], np.arange(n_cls))
    count = np.bincount(class_of, minlength=n_cls).astype(np.float64)
    e, fixed = marginal_energy_j(p)
    g = p.grams_per_joule
    h = effective_headroom_s(p)
    theta = ttft_budget_s(p, cfg, h)
    miss_r = (h < theta[None, :] - 1e-12).astype(np.float64)
    kappa_r = e * g[None, :]
    if p.cached_prompt_tokens is not None and cfg.affinity_g_per_ktok > 0:  # the affinity knob
        c = p.cached_prompt_tokens
        kappa_r = kappa_r + cfg.affinity_g_per_ktok * (c.max(axis=1, keepdims=True) - c) / 1000.0
    if n_cls:
        kappa_c = np.add.reduceat(kappa_r[order], starts, axis=0) / count[:, None]
        miss_c = np.add.reduceat(miss_r[order], starts, axis=0) / count[:, None]
        prompt_c = np.add.reduceat(p.prompt_tokens[order], starts) / count
        kv_c = np.add.reduceat((p.prompt_tokens + p.output_tokens)[order], starts) / count
        allowed_c = allowed[order][starts]
        prefill_c = (np.add.reduceat(p.prefill_tokens[order], starts, axis=0) / count[:, None]
                     if p.cached_prompt_tokens is not None else None)
    else:
        kappa_c = miss_c = np.zeros((0, d_n))
        prompt_c = kv_c = np.zeros(0)
        allowed_c = np.zeros((0, d_n), bool)
        prefill_c = None
    pc, pd = np.nonzero(allowed_c)
    pair_prompt = prompt_c[pc] if prefill_c is None else prefill_c[pc, pd]
    spe = p.seqs_per_engine
    load = p.running + p.queue_len
    busy = np.minimum(p.busy_engines, p.n_engines)
    idle = (p.n_engines - busy).astype(np.float64)
    cap_seq = np.maximum(0.0, (p.n_engines if cfg.engine_model == "spread" else busy) * spe - load)
    big_m = np.bincount(pd, weights=count[pc], minlength=d_n) if pc.size else np.zeros(d_n)
    pbar = float(np.mean(p.prompt_tokens)) if p.n_requests else 1.0
    kvbar = float(np.mean(p.prompt_tokens + p.output_tokens)) if p.n_requests else 1.0
    lam = float(cfg.violation_penalty_g)
    q_raw = p.prefill_rate_cap_tokens(cfg.prefill_share)
    if cfg.prefill_horizon_s is not None and p.poll_s < cfg.prefill_horizon_s:  # Q0_d over the horizon
        q_raw = q_raw * (cfg.prefill_horizon_s / p.poll_s)
    backlog = p.backlog_prompt_tokens
    prefill_cap = np.maximum(q_raw - backlog, 0.0)
    floor_tok = np.zeros(d_n)
    if cfg.overload_spread and p.n_requests:
        w = np.where(p.up, q_raw, 0.0)
        new = float(p.prompt_tokens[allowed.any(axis=1)].sum())
        own = np.minimum(theta / np.maximum(p.prefill_s_per_token / p.n_engines, 1e-300), prefill_cap)
        if w.sum() > 0 and new > 0 and float(own[p.up].sum()) < new * (1.0 + cfg.overload_slack):
            demand = new + float(backlog[p.up].sum())
            floor_tok = np.maximum(w / w.sum() * demand * (1.0 + cfg.overload_slack) - backlog, 0.0)
    # deferring costs more than any overflow its placement could cause (a deferred request only
    # waits longer, so deferral must not become the way out of an overloaded step)
    defer_cost = float(cfg.defer_penalty_g) + lam * (1.0 + prompt_c / max(pbar, 1.0) + kv_c / max(kvbar, 1.0))
    return FacilityData(
        class_of=class_of, count=count, prompt=prompt_c, kv=kv_c, pc=pc.astype(np.int64), pd=pd.astype(np.int64),
        kappa=kappa_c[pc, pd], miss=miss_c[pc, pd], cap_seq=cap_seq, spe=spe, idle=idle, fixed_g=g * fixed,
        free_kv=np.maximum(p.free_kv_tokens, 0.0), beta=p.prefill_s_per_token / p.n_engines, theta=theta,
        prefill_cap=prefill_cap, floor_tok=floor_tok, defer_cost=defer_cost, pair_prompt=pair_prompt,
        budget_scale=1.0 if cfg.binary else 1.0 - cfg.class_budget_margin,
        big_m=big_m, lam=lam, lam_tok=lam / max(pbar, 1.0), lam_kv=lam / max(kvbar, 1.0),
        lam_defer=float(cfg.defer_penalty_g), engine_model=cfg.engine_model, n_datacenters=d_n,
    )


# ---------------------------------------------------------------------------------- evaluation
def engine_terms(data: FacilityData, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Optimal woken engines, their grams and the sequence overflow for added sequences ``k``."""
    if data.engine_model == "spread":
        y = np.minimum(k, data.idle)
        return y, data.fixed_g * y, np.maximum(0.0, k - data.cap_seq)
    y = np.zeros_like(k)
    over = np.zeros_like(k)
    for d in range(k.size):
        ys = np.arange(int(data.idle[d]) + 1, dtype=np.float64)
        ov = np.maximum(0.0, k[d] - data.cap_seq[d] - data.spe[d] * ys)
        j = int(np.argmin(data.fixed_g[d] * ys + data.lam * ov))
        y[d], over[d] = ys[j], ov[j]
    return y, data.fixed_g * y, over


def facility_objective(
    problem: PlacementProblem, assignment: np.ndarray, cfg: FacilityConfig = FacilityConfig()
) -> dict[str, float]:
    """Facility objective of a per-request ``assignment`` (the per-request binary form).

    The placement is fixed; woken engines and overflows take their optimal values.

    Returns:
        dict with ``objective_g`` and its parts: ``marginal_g``, ``fixed_g``, ``ttft_misses``,
        ``seq_overflow``, ``tok_overflow``, ``kv_overflow_tokens``, ``deferred``, and
        ``violations`` (counted: misses + seq overflow + tok overflow / pbar + kv / kvbar).
    """
    p = problem
    a = np.asarray(assignment, dtype=np.int64)
    d_n = p.n_datacenters
    if a.shape != (p.n_requests,) or np.any(a < 0) or np.any(a > d_n):
        raise ConfigError("assignment", f"must be ({p.n_requests},) ints in [0, {d_n}]")
    placed = np.flatnonzero(a < d_n)
    if np.any(~allowed_pairs(p)[placed, a[placed]]):
        raise ConfigError("assignment", "places a request on a datacenter it is not allowed on")
    data = compile_facility(p, replace(cfg, binary=True))
    dcs = a[placed]
    cls = data.class_of[placed]
    # in the binary form class == request and the pair (r, d) exists for every allowed pair
    pair_index = {(int(c), int(d)): i for i, (c, d) in enumerate(zip(data.pc, data.pd))}
    idx = np.array([pair_index[(int(c), int(d))] for c, d in zip(cls, dcs)], dtype=np.int64)
    marginal = float(data.kappa[idx].sum())
    misses = float(data.miss[idx].sum())
    k = np.bincount(dcs, minlength=d_n).astype(np.float64)
    pre = p.prompt_tokens[placed] if p.cached_prompt_tokens is None else p.prefill_tokens[placed, dcs]
    pr = np.bincount(dcs, weights=pre, minlength=d_n)
    kvt = np.bincount(dcs, weights=(p.prompt_tokens + p.output_tokens)[placed], minlength=d_n)
    _, fixed_g, seq_over = engine_terms(data, k)
    tok_over = np.maximum(0.0, pr - data.tok_cap)
    kv_over = np.maximum(0.0, kvt - data.free_kv)
    deferred = float(p.n_requests - placed.size)
    defer_g = float(data.defer_cost[np.flatnonzero(a == d_n)].sum())  # binary form: class == request
    viol = misses + float(seq_over.sum()) + float(tok_over.sum()) * data.lam_tok / max(data.lam, 1e-300) \
        + float(kv_over.sum()) * data.lam_kv / max(data.lam, 1e-300)
    obj = (marginal + float(fixed_g.sum()) + data.lam * (misses + float(seq_over.sum())) + data.lam_tok * float(tok_over.sum())
           + data.lam_kv * float(kv_over.sum()) + defer_g)
    return {
        "objective_g": obj, "marginal_g": marginal, "fixed_g": float(fixed_g.sum()), "ttft_misses": misses,
        "seq_overflow": float(seq_over.sum()), "tok_overflow": float(tok_over.sum()),
        "kv_overflow_tokens": float(kv_over.sum()), "deferred": deferred, "violations": viol,
    }


# ---------------------------------------------------------------------------------- greedy
def facility_greedy(problem: PlacementProblem, cfg: FacilityConfig = FacilityConfig()) -> np.ndarray:
    """State-aware greedy: requests in arrival order (longest waited first), each to the
    datacenter with the least increase of the facility objective given the placements made so
    far. The MILP's warm start and fallback. Requests with no allowed datacenter are deferred."""
    p = problem
    d_n = p.n_datacenters
    out = np.full(p.n_requests, d_n, dtype=np.int64)
    if p.n_requests == 0:
        return out
    data = compile_facility(p, replace(cfg, binary=True))
    cost_pair = data.cost
    # dense (R, D) cost with inf where not allowed (binary form: class r == request r)
    cost = np.full((p.n_requests, d_n), np.inf)
    cost[data.pc, data.pd] = cost_pair
    tok_cap = data.tok_cap
    spread = data.engine_model == "spread"
    k = np.zeros(d_n)
    pr = np.zeros(d_n)
    kv_used = np.zeros(d_n)
    woken = np.zeros(d_n)
    kvr = p.prompt_tokens + p.output_tokens
    lam = data.lam
    for r in np.argsort(-p.waited_s, kind="stable"):
        row = cost[r]
        if not np.isfinite(row).any():
            continue
        pt = p.prefill_tokens_of(int(r))  # (the prompt, or (D,) prompt - cached)
        tok_inc = np.maximum(0.0, pr + pt - tok_cap) - np.maximum(0.0, pr - tok_cap)
        kv_inc = np.maximum(0.0, kv_used + kvr[r] - data.free_kv) - np.maximum(0.0, kv_used - data.free_kv)
        c = row + data.lam_tok * tok_inc + data.lam_kv * kv_inc
        if spread:
            c = c + data.fixed_g * (k < data.idle) + lam * (k + 1 > data.cap_seq)
        else:
            need = data.cap_seq + data.spe * woken - k < 1
            can_wake = woken < data.idle
            c = c + np.where(need & can_wake, data.fixed_g, 0.0) + lam * (need & ~can_wake)
        d = int(np.argmin(c))
        out[r] = d
        if not spread and data.cap_seq[d] + data.spe[d] * woken[d] - k[d] < 1 and woken[d] < data.idle[d]:
            woken[d] += 1
        k[d] += 1
        pr[d] += pt if np.ndim(pt) == 0 else np.asarray(pt)[d]
        kv_used[d] += kvr[r]
    return out


def class_greedy(data: FacilityData, x0: np.ndarray | None = None, defer0: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A fast incumbent for the class program: classes in order, each split over the datacenters
    in segments of constant marginal cost (cheapest first, until the next capacity breakpoint:
    TPOT room, TTFT token budget, free KV, idle engines). Starting from the integer counts
    ``x0``/``defer0`` (default none placed), it places the requests they leave. Returns
    (pair counts, defer counts)."""
    d_n = data.n_datacenters
    x = np.zeros(data.pc.size) if x0 is None else np.array(x0, dtype=np.float64)
    defer = np.zeros(data.n_classes) if defer0 is None else np.array(defer0, dtype=np.float64)
    k = np.bincount(data.pd, weights=x, minlength=d_n)
    pr = np.bincount(data.pd, weights=x * data.pair_prompt, minlength=d_n)
    kv = np.bincount(data.pd, weights=x * data.kv[data.pc], minlength=d_n)
    done = np.bincount(data.pc, weights=x, minlength=data.n_classes) + defer
    tok_cap = data.tok_cap
    spread = data.engine_model == "spread"
    spe = np.maximum(data.spe, 1.0)
    pair_start = np.searchsorted(data.pc, np.arange(data.n_classes + 1))
    big = 1e18
    for c in range(data.n_classes):
        sl = slice(pair_start[c], pair_start[c + 1])
        dcs = data.pd[sl]
        base = data.cost[sl]
        left = int(round(data.count[c] - done[c]))
        if left <= 0:
            continue
        if dcs.size == 0:
            defer[c] = left
            continue
        pc_, kc_ = data.pair_prompt[sl], data.kv[c]  # (prefill tokens of the class at each of its datacenters)
        while left > 0:
            kd, prd, kvd = k[dcs], pr[dcs], kv[dcs]
            seq_room = data.cap_seq[dcs] - kd
            tok_room = (tok_cap[dcs] - prd) / np.maximum(pc_, 1e-9)
            kv_room = (data.free_kv[dcs] - kvd) / max(kc_, 1e-9)
            unit = base + data.lam * (seq_room < 1) + data.lam_tok * pc_ * (tok_room < 1) + data.lam_kv * kc_ * (kv_room < 1)
            if spread:
                idle_room = data.idle[dcs] - kd
                unit = unit + data.fixed_g[dcs] * (idle_room >= 1)
            else:
                idle_room = np.full(dcs.size, big)
                unit = unit + (data.fixed_g[dcs] / spe[dcs]) * (seq_room < 1) * (data.idle[dcs] > 0)
            j = int(np.argmin(unit))
            if unit[j] >= data.defer_cost[c]:
                defer[c] += left
                break
            rooms = np.array([seq_room[j], tok_room[j], kv_room[j], idle_room[j]])
            rooms = rooms[rooms >= 1]
            n = int(min(left, np.floor(rooms.min()))) if rooms.size else left
            n = max(n, 1)
            x[pair_start[c] + j] += n
            d = dcs[j]
            k[d] += n
            pr[d] += n * pc_[j]
            kv[d] += n * kc_
            left -= n
    return x, defer




def pair_counts(data: FacilityData, assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P,) pair counts and (C,) defer counts of a per-request assignment."""
    d_n = data.n_datacenters
    table = np.zeros((data.n_classes, d_n + 1))
    np.add.at(table, (data.class_of, np.asarray(assignment, dtype=np.int64)), 1.0)
    return table[data.pc, data.pd], table[:, d_n]



def assignment_from_counts(problem: PlacementProblem, data: FacilityData, x: np.ndarray, defer: np.ndarray) -> np.ndarray:
    """Turn pair counts into a per-request assignment (deterministic).

    Deferred requests of a class are its most recent arrivals. A class placed on one datacenter
    goes there whole. The members of a class split over several datacenters are placed longest
    prompt first, each on the datacenter of its class (with quota left) where it does not miss
    TTFT and, among those, with the most prompt-token budget left, so that no datacenter's
    prompt-token total drifts past the budget the program planned with.
    """
    d_n = data.n_datacenters
    out = np.full(problem.n_requests, d_n, dtype=np.int64)
    xi = np.asarray(x, dtype=np.int64)
    di = np.asarray(defer, dtype=np.int64)
    order = np.lexsort((np.arange(problem.n_requests), -problem.waited_s, data.class_of))
    starts = np.searchsorted(data.class_of[order], np.arange(data.n_classes + 1))
    pair_start = np.searchsorted(data.pc, np.arange(data.n_classes + 1))  # pc is sorted (np.nonzero order)
    budget = data.tok_cap.copy()
    tokens = problem.prefill_tokens if problem.cached_prompt_tokens is not None else None
    split: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for c in range(data.n_classes):
        members = order[starts[c]:starts[c + 1]]
        members = members[:max(members.size - int(di[c]), 0)]  # the oldest are placed, the newest deferred
        sl = slice(pair_start[c], pair_start[c + 1])
        counts = xi[sl]
        dcs = data.pd[sl][counts > 0]
        counts = counts[counts > 0]
        if dcs.size == 0 or members.size == 0:
            continue
        if dcs.size == 1:
            out[members[: counts[0]]] = dcs[0]
            budget[dcs[0]] -= (problem.prompt_tokens[members[: counts[0]]] if tokens is None
                               else tokens[members[: counts[0]], dcs[0]]).sum()
        else:
            split.append((members, dcs, counts.copy()))
    if split:
        theta = data.theta
        h = effective_headroom_s(problem)
        # slack_d = budget left - prompt tokens still planned at d by the split classes
        slack = budget.copy()
        pair_of = {(int(c), int(d)): i for i, (c, d) in enumerate(zip(data.pc, data.pd))} if tokens is not None else None
        for members, dcs, quota in split:
            c = int(data.class_of[members[0]])
            if pair_of is None:
                slack[dcs] -= quota * data.prompt[c]
            else:
                slack[dcs] -= quota * data.pair_prompt[[pair_of[(c, int(d))] for d in dcs]]
        prompt = problem.prompt_tokens
        for members, dcs, quota in split:
            c = int(data.class_of[members[0]])
            mean_p = float(data.prompt[c])
            if pair_of is not None:  # per datacenter: the class's mean and each member's prefill tokens there
                mean_pd = {int(d): float(data.pair_prompt[pair_of[(c, int(d))]]) for d in dcs}
            dl = [int(d) for d in dcs]
            q = [int(v) for v in quota]
            th = [float(theta[d]) for d in dl]
            for r in members[np.argsort(-prompt[members], kind="stable")].tolist():
                hr = h[r]
                best, best_key = -1, None
                for j, d in enumerate(dl):  # a few datacenters per class: plain Python is fastest
                    if q[j] <= 0:
                        continue
                    key = (hr[d] < th[j] - 1e-12, -slack[d])
                    if best_key is None or key < best_key:
                        best, best_key = j, key
                if best < 0:
                    break
                d = dl[best]
                out[r] = d
                q[best] -= 1
                slack[d] += mean_p - prompt[r] if tokens is None else mean_pd[d] - tokens[r, d]
    return out


