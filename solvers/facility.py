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
        rho_max = ``max_prefill_share`` caps the utilisation (queueing grows as rho -> 1)
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

Real time (:func:`solve_highspy`): a MIP gap (default 1%) and a time limit (default 0.2 s, inside
a 1 s poll). The LP relaxation (a few ms) gives a bound; its counts rounded down and completed
by :func:`class_greedy`, or :func:`class_greedy` alone, give the incumbent; when that is not
within the gap, HiGHS branch-and-bound continues from it (warm start) on programs of at most
``bb_max_columns`` pairs, under an interrupt-callback deadline. The certified gap of every
decision is recorded (``stats["mip_gap"]``). When the solver fails or has no incumbent, the
request-level state-aware greedy (:func:`facility_greedy`, same objective) decides instead:
counted in ``stats["fallbacks"]`` and logged, never silent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError

from ._highs import new_highs
from ._highs import run as run_highs
from .base import Scheduler
from .problem import PlacementProblem

log = logging.getLogger(__name__)

__all__ = [
    "FacilityConfig", "FacilityData", "SolveResult", "FacilityMILP", "compile_facility", "solve_highspy",
    "solve_pyomo", "facility_objective", "facility_greedy", "marginal_energy_j", "assignment_from_counts",
    "pair_counts", "class_greedy", "FacilityGreedy",
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
            (rho in Q_d), a utilisation cap that leaves room for the randomness of arrivals.
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
        time_limit_s: solver time limit, seconds.
        backend: ``"highspy"`` (direct arrays) or ``"pyomo"`` (reference model via appsi_highs).
        warm_start: hand the greedy placement to HiGHS as the starting incumbent.
        threads: HiGHS threads.
        bb_max_columns: run HiGHS branch-and-bound only on programs with at most this many x
            columns (pairs); larger ones return the LP-rounding incumbent with its certified gap
            (HiGHS's root cut separation alone took 0.3-0.75 s at ~1,600 columns here and does
            not honour the interrupt callback, so it cannot fit a 0.25 s decision).
    """

    violation_penalty_g: float = 1.0
    defer_penalty_g: float = 2.0
    engine_model: str = "spread"
    ttft_budget_quantile: float = 0.02
    max_prefill_share: float = 0.5
    overload_spread: bool = True
    overload_slack: float = 0.05
    class_budget_margin: float = 0.03
    prompt_ratio: float | None = None
    output_ratio: float | None = 2.0
    headroom_bin_s: float | None = 0.25
    binary: bool = False
    mip_gap: float = 0.01
    time_limit_s: float = 0.2
    backend: str = "highspy"
    warm_start: bool = True
    threads: int = 1
    bb_max_columns: int = 600

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
        if not 0.0 < self.max_prefill_share <= 1.0:
            raise ConfigError("facility.max_prefill_share", "must be in (0, 1]")
        if not 0.0 <= self.overload_slack <= 1.0:
            raise ConfigError("facility.overload_slack", "must be in [0, 1]")
        if not 0.0 <= self.ttft_budget_quantile <= 1.0:
            raise ConfigError("facility.ttft_budget_quantile", "must be in [0, 1]")
        if self.violation_penalty_g < 0 or self.defer_penalty_g < 0:
            raise ConfigError("facility.violation_penalty_g", "penalties must be >= 0")
        if self.mip_gap < 0 or self.time_limit_s < 0:
            raise ConfigError("facility.mip_gap", "mip_gap and time_limit_s must be >= 0")


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
    for d in range(p.n_datacenters):
        col = h[allowed[:, d], d]
        col = col[col >= 0]
        wmax = beta[d] * float(p.prompt_tokens[allowed[:, d]].sum())
        q = float(np.quantile(col, cfg.ttft_budget_quantile, method="lower")) if col.size else 0.0
        theta[d] = min(q, wmax)
    return theta


@dataclass
class FacilityData:
    """Compiled coefficients of one facility program (class or binary form).

    Attributes (C classes, D datacenters, P allowed pairs):
        class_of: (R,) class of each request; count, prompt, kv: (C,) size, mean prompt tokens,
            mean prompt + predicted output tokens.
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
    if n_cls:
        kappa_c = np.add.reduceat((e * g[None, :])[order], starts, axis=0) / count[:, None]
        miss_c = np.add.reduceat(miss_r[order], starts, axis=0) / count[:, None]
        prompt_c = np.add.reduceat(p.prompt_tokens[order], starts) / count
        kv_c = np.add.reduceat((p.prompt_tokens + p.output_tokens)[order], starts) / count
        allowed_c = allowed[order][starts]
    else:
        kappa_c = miss_c = np.zeros((0, d_n))
        prompt_c = kv_c = np.zeros(0)
        allowed_c = np.zeros((0, d_n), bool)
    pc, pd = np.nonzero(allowed_c)
    spe = p.seqs_per_engine
    load = p.running + p.queue_len
    busy = np.minimum(p.busy_engines, p.n_engines)
    idle = (p.n_engines - busy).astype(np.float64)
    cap_seq = np.maximum(0.0, (p.n_engines if cfg.engine_model == "spread" else busy) * spe - load)
    big_m = np.bincount(pd, weights=count[pc], minlength=d_n) if pc.size else np.zeros(d_n)
    pbar = float(np.mean(p.prompt_tokens)) if p.n_requests else 1.0
    kvbar = float(np.mean(p.prompt_tokens + p.output_tokens)) if p.n_requests else 1.0
    lam = float(cfg.violation_penalty_g)
    q_raw = p.prefill_rate_cap_tokens(cfg.max_prefill_share)
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
        prefill_cap=prefill_cap, floor_tok=floor_tok, defer_cost=defer_cost,
        budget_scale=1.0 if cfg.binary else 1.0 - cfg.class_budget_margin,
        big_m=big_m, lam=lam, lam_tok=lam / max(pbar, 1.0), lam_kv=lam / max(kvbar, 1.0),
        lam_defer=float(cfg.defer_penalty_g), engine_model=cfg.engine_model, n_datacenters=d_n,
    )


# ---------------------------------------------------------------------------------- evaluation
def _engine_terms(data: FacilityData, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    pr = np.bincount(dcs, weights=p.prompt_tokens[placed], minlength=d_n)
    kvt = np.bincount(dcs, weights=(p.prompt_tokens + p.output_tokens)[placed], minlength=d_n)
    _, fixed_g, seq_over = _engine_terms(data, k)
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
        pt = p.prompt_tokens[r]
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
        pr[d] += pt
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
    pr = np.bincount(data.pd, weights=x * data.prompt[data.pc], minlength=d_n)
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
        pc_, kc_ = data.prompt[c], data.kv[c]
        while left > 0:
            kd, prd, kvd = k[dcs], pr[dcs], kv[dcs]
            seq_room = data.cap_seq[dcs] - kd
            tok_room = (tok_cap[dcs] - prd) / max(pc_, 1e-9)
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
            pr[d] += n * pc_
            kv[d] += n * kc_
            left -= n
    return x, defer


# ---------------------------------------------------------------------------------- MILP arrays
@dataclass
class _Layout:
    """Column layout: x (P), defer (C), y, s, o_seq (D), o_tok (D), o_kv (D)."""

    n_x: int
    defer0: int
    y0: int
    y_dc: np.ndarray
    s0: int
    oseq0: int
    otok0: int
    okv0: int
    n_cols: int


def _layout(data: FacilityData) -> _Layout:
    d_n = data.n_datacenters
    n_x = int(data.pc.size)
    y_dc = np.flatnonzero(data.idle > 0)
    n_s = y_dc.size if data.engine_model == "spread" else 0
    defer0 = n_x
    y0 = defer0 + data.n_classes
    s0 = y0 + y_dc.size
    oseq0 = s0 + n_s
    otok0 = oseq0 + d_n
    okv0 = otok0 + d_n
    return _Layout(n_x, defer0, y0, y_dc, s0, oseq0, otok0, okv0, okv0 + d_n)


def _build_arrays(data: FacilityData, integer_x: bool = True) -> tuple[_Layout, dict[str, np.ndarray]]:
    """Column bounds/costs/integrality and the row-wise constraint matrix of the program."""
    lay = _layout(data)
    d_n = data.n_datacenters
    c_n = data.n_classes
    n_x = lay.n_x
    inf = np.inf
    cost = np.zeros(lay.n_cols)
    lo = np.zeros(lay.n_cols)
    hi = np.full(lay.n_cols, inf)
    integ = np.zeros(lay.n_cols, dtype=np.int32)
    cost[:n_x] = data.cost
    hi[:n_x] = data.count[data.pc]
    cost[lay.defer0:lay.y0] = data.defer_cost
    hi[lay.defer0:lay.y0] = data.count
    if integer_x:
        integ[:lay.y0] = 1
    cost[lay.y0:lay.s0] = data.fixed_g[lay.y_dc]
    hi[lay.y0:lay.s0] = data.idle[lay.y_dc]
    if data.engine_model == "pack":
        integ[lay.y0:lay.s0] = 1
    hi[lay.s0:lay.oseq0] = 1.0
    integ[lay.s0:lay.oseq0] = 1
    cost[lay.oseq0:lay.otok0] = data.lam
    cost[lay.otok0:lay.okv0] = data.lam_tok
    cost[lay.okv0:] = data.lam_kv

    rr: list[np.ndarray] = []
    cc: list[np.ndarray] = []
    vv: list[np.ndarray] = []
    rlo: list[np.ndarray] = []
    rhi: list[np.ndarray] = []
    nrow = 0

    def add(r: np.ndarray, c: np.ndarray, v: Any) -> None:
        r = np.asarray(r, np.int64)
        rr.append(r)
        cc.append(np.asarray(c, np.int64))
        vv.append(np.broadcast_to(np.asarray(v, np.float64), r.shape))

    xi = np.arange(n_x)
    ar = np.arange(d_n)
    # assignment
    add(data.pc, xi, 1.0)
    add(np.arange(c_n), lay.defer0 + np.arange(c_n), 1.0)
    rlo.append(data.count)
    rhi.append(data.count)
    nrow += c_n
    # TPOT / batch
    add(nrow + data.pd, xi, 1.0)
    add(nrow + ar, lay.oseq0 + ar, -1.0)
    if data.engine_model == "pack" and lay.y_dc.size:
        add(nrow + lay.y_dc, lay.y0 + np.arange(lay.y_dc.size), -data.spe[lay.y_dc])
    rlo.append(np.full(d_n, -inf))
    rhi.append(data.cap_seq)
    nrow += d_n
    # TTFT / prefill, in mean prompts: (Pr_d - o_tok_d) / pbar <= T_d / pbar   (rows scaled)
    ps = data.lam / data.lam_tok
    add(nrow + data.pd, xi, data.prompt[data.pc] / ps)
    add(nrow + ar, lay.otok0 + ar, -1.0 / ps)
    rlo.append(np.full(d_n, -inf))
    rhi.append(data.tok_cap / ps)
    nrow += d_n
    # KV, in mean request footprints (rows scaled)
    ks = data.lam / data.lam_kv
    add(nrow + data.pd, xi, data.kv[data.pc] / ks)
    add(nrow + ar, lay.okv0 + ar, -1.0 / ks)
    rlo.append(np.full(d_n, -inf))
    rhi.append(np.minimum(data.free_kv / ks, 1e7))
    nrow += d_n
    # spread: y = min(K, I)
    if data.engine_model == "spread" and lay.y_dc.size:
        ny = lay.y_dc.size
        pos = np.full(d_n, -1)
        pos[lay.y_dc] = np.arange(ny)
        sel = pos[data.pd] >= 0
        add(nrow + pos[data.pd[sel]], xi[sel], 1.0)
        add(nrow + np.arange(ny), lay.y0 + np.arange(ny), -1.0)
        add(nrow + np.arange(ny), lay.s0 + np.arange(ny), -data.big_m[lay.y_dc])
        rlo.append(np.full(ny, -inf))
        rhi.append(np.zeros(ny))
        nrow += ny
        add(nrow + np.arange(ny), lay.y0 + np.arange(ny), 1.0)
        add(nrow + np.arange(ny), lay.s0 + np.arange(ny), -data.idle[lay.y_dc])
        rlo.append(np.zeros(ny))
        rhi.append(np.full(ny, inf))
        nrow += ny
        # valid inequalities (tighten the LP): y_d >= min(1, I_d / N_c) x_cd, since
        # min(K_d, I_d) >= min(x_cd, I_d) >= x_cd min(1, I_d / N_c) for 0 <= x_cd <= N_c
        cut = np.flatnonzero(sel) if _CUTS else np.zeros(0, np.int64)
        nc = cut.size
        if nc:
            coef = np.minimum(1.0, data.idle[data.pd[cut]] / np.maximum(data.count[data.pc[cut]], 1.0))
            add(nrow + np.arange(nc), cut, coef)
            add(nrow + np.arange(nc), lay.y0 + pos[data.pd[cut]], -1.0)
            rlo.append(np.full(nc, -inf))
            rhi.append(np.zeros(nc))
            nrow += nc
    r = np.concatenate(rr)
    c = np.concatenate(cc)
    v = np.concatenate(vv)
    o = np.lexsort((c, r))
    r, c, v = r[o], c[o], v[o]
    start = np.zeros(nrow + 1, dtype=np.int32)
    np.cumsum(np.bincount(r, minlength=nrow), out=start[1:])
    arrays = dict(cost=cost, lo=lo, hi=hi, integ=integ, rlo=np.concatenate(rlo), rhi=np.concatenate(rhi),
                  start=start, index=c.astype(np.int32), value=v, nrow=np.array(nrow))
    return lay, arrays


def _complete_solution(data: FacilityData, lay: _Layout, x: np.ndarray, defer: np.ndarray) -> np.ndarray:
    """The full column vector (optimal y, s, overflows) for pair counts ``x`` and ``defer``."""
    d_n = data.n_datacenters
    col = np.zeros(lay.n_cols)
    col[:lay.n_x] = x
    col[lay.defer0:lay.y0] = defer
    k = np.bincount(data.pd, weights=x, minlength=d_n)
    pr = np.bincount(data.pd, weights=x * data.prompt[data.pc], minlength=d_n)
    kv = np.bincount(data.pd, weights=x * data.kv[data.pc], minlength=d_n)
    y, _, over = _engine_terms(data, k)
    col[lay.y0:lay.s0] = y[lay.y_dc]
    if data.engine_model == "spread":
        col[lay.s0:lay.oseq0] = (k[lay.y_dc] > data.idle[lay.y_dc]).astype(float)
    col[lay.oseq0:lay.otok0] = over
    col[lay.otok0:lay.okv0] = np.maximum(0.0, pr - data.tok_cap)
    col[lay.okv0:] = np.maximum(0.0, kv - data.free_kv)
    return col


def pair_counts(data: FacilityData, assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P,) pair counts and (C,) defer counts of a per-request assignment."""
    d_n = data.n_datacenters
    table = np.zeros((data.n_classes, d_n + 1))
    np.add.at(table, (data.class_of, np.asarray(assignment, dtype=np.int64)), 1.0)
    return table[data.pc, data.pd], table[:, d_n]


@dataclass
class SolveResult:
    """One MILP solve: ``x`` (P,) pair counts and ``defer`` (C,) (None without an incumbent),
    ``status`` text, ``objective`` (grams + penalties), ``mip_gap``, timings in seconds."""

    x: np.ndarray | None
    defer: np.ndarray | None
    status: str
    objective: float
    build_s: float
    solve_s: float
    mip_gap: float = float("nan")


#: HiGHS options of the hot path: the greedy incumbent is handed over, so the expensive sub-MIP
#: heuristics (RINS / RENS) are off; they cost 0.1-0.3 s per solve at 1,000 requests and rarely
#: beat the incumbent by more than the MIP gap (measured with eval/bench_solvers.py).
#: The feasibility-jump heuristic is off too: it does not check HiGHS's interrupt callback and
#: ran for 0.3-0.5 s at 1,000 requests, blowing the deadline.
#: Per-pair valid inequalities y_d >= min(1, I_d / N_c) x_cd (spread engine model). On the
#: problems of eval/bench_solvers.py they cut the certified gap (p50) from 39% to 12% at low load
#: and from 9% to 0.4% at moderate load for a few ms; on synthetic problems with many partly
#: idle datacenters they made the LP 5-10x slower.
_CUTS = True
_HIGHS_OPTIONS: dict[str, Any] = {"mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False,
                                  "mip_heuristic_run_feasibility_jump": False}


def solve_highspy(
    data: FacilityData, cfg: FacilityConfig = FacilityConfig(), warm: tuple[np.ndarray, np.ndarray] | None = None
) -> SolveResult:
    """Solve the program with highspy arrays, within ``cfg.time_limit_s`` (build included).

    1. LP relaxation (dual simplex, no presolve: a few ms at 2,000 requests) -> lower bound.
    2. Rounding: the LP counts rounded down, the requests left placed by :func:`class_greedy`;
       the better of this and ``warm`` (pair counts, defer counts) is the incumbent.
    3. If the incumbent is within ``cfg.mip_gap`` of the LP bound, it is returned (the gap is
       certified by the bound). Otherwise, on programs with at most ``cfg.bb_max_columns`` x
       columns, the MILP is solved by HiGHS branch-and-bound from that incumbent until the gap
       or the deadline (enforced by an interrupt callback too, as HiGHS's own time limit is only
       checked between root-node phases and overran it by up to 1 s here); larger programs
       return the incumbent and its certified gap.

    ``status`` says which step produced the answer; ``mip_gap`` is the certified relative gap.
    """
    import highspy

    t0 = time.perf_counter()
    deadline = t0 + float(cfg.time_limit_s)
    lay, arr = _build_arrays(data)
    integ = arr["integ"].copy()
    h = new_highs(cfg.threads)
    h.setOptionValue("presolve", "off")
    status = h.passModel(
        lay.n_cols, int(arr["nrow"]), int(arr["value"].size), int(highspy.MatrixFormat.kRowwise),
        int(highspy.ObjSense.kMinimize), 0.0, arr["cost"], arr["lo"], arr["hi"], arr["rlo"], arr["rhi"],
        arr["start"], arr["index"], arr["value"], np.zeros_like(integ),
    )
    if status == highspy.HighsStatus.kError:
        return SolveResult(None, None, "model_error", float("nan"), time.perf_counter() - t0, 0.0)
    t1 = time.perf_counter()
    h.setOptionValue("time_limit", max(deadline - t1, 1e-3))
    run_highs(h)
    lp_ok = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    bound = float(h.getInfo().objective_function_value) if lp_ok else -np.inf
    cost = arr["cost"]
    candidates: list[tuple[float, np.ndarray, np.ndarray, str]] = []
    if lp_ok:
        col = np.asarray(h.getSolution().col_value)
        xf = np.floor(col[:lay.n_x] + 1e-6)
        df = np.floor(col[lay.defer0:lay.y0] + 1e-6)
        xr, dr = class_greedy(data, xf, df)
        candidates.append((float(cost @ _complete_solution(data, lay, xr, dr)), xr, dr, "lp-rounding"))
    if warm is not None:
        candidates.append((float(cost @ _complete_solution(data, lay, warm[0], warm[1])), warm[0], warm[1], "greedy"))
    best = min(candidates, key=lambda t: t[0]) if candidates else None

    def gap_of(obj: float) -> float:
        return (obj - bound) / max(abs(obj), 1e-12) if np.isfinite(bound) else float("inf")

    skip_bb = lay.n_x > cfg.bb_max_columns or deadline - time.perf_counter() < 0.02
    if best is not None and (gap_of(best[0]) <= cfg.mip_gap or skip_bb):
        return SolveResult(best[1], best[2], best[3], best[0], t1 - t0, time.perf_counter() - t1, gap_of(best[0]))
    if best is None and skip_bb:
        return SolveResult(None, None, "no incumbent (LP relaxation unsolved in time)", float("nan"), t1 - t0,
                           time.perf_counter() - t1)
    # branch-and-bound from the incumbent
    h.setOptionValue("presolve", "choose")
    h.setOptionValue("mip_rel_gap", float(cfg.mip_gap))
    for key, value in _HIGHS_OPTIONS.items():
        h.setOptionValue(key, value)
    h.changeColsIntegrality(lay.n_cols, np.arange(lay.n_cols, dtype=np.int32), integ)
    if best is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(_complete_solution(data, lay, best[1], best[2]))
        sol.value_valid = True
        h.setSolution(sol)
    remaining = deadline - time.perf_counter()
    h.setOptionValue("time_limit", max(remaining, 1e-3))

    def interrupt(event: Any) -> None:
        if time.perf_counter() >= deadline:
            event.interrupt()

    h.cbMipInterrupt.subscribe(interrupt)
    run_highs(h)
    t2 = time.perf_counter()
    info = h.getInfo()
    text = h.modelStatusToString(h.getModelStatus())
    if info.primal_solution_status == 2:
        col = np.asarray(h.getSolution().col_value)
        obj = float(info.objective_function_value)
        if best is None or obj < best[0] - 1e-12:
            bnd = max(bound, float(info.mip_dual_bound)) if np.isfinite(info.mip_dual_bound) else bound
            g = (obj - bnd) / max(abs(obj), 1e-12)
            return SolveResult(np.rint(col[:lay.n_x]), np.rint(col[lay.defer0:lay.y0]), f"milp: {text}", obj,
                               t1 - t0, t2 - t1, g)
    if best is None:
        return SolveResult(None, None, f"milp: {text}", float("nan"), t1 - t0, t2 - t1)
    bnd = max(bound, float(info.mip_dual_bound)) if np.isfinite(info.mip_dual_bound) else bound
    return SolveResult(best[1], best[2], f"{best[3]} (milp: {text})", best[0], t1 - t0, t2 - t1,
                       (best[0] - bnd) / max(abs(best[0]), 1e-12))


def solve_pyomo(data: FacilityData, cfg: FacilityConfig = FacilityConfig()) -> SolveResult:
    """Reference formulation in Pyomo (the same program as :func:`solve_highspy`), solved by
    HiGHS through ``appsi_highs``. Written to be read against the module docstring."""
    import pyomo.environ as pyo
    from pyomo.contrib.appsi.base import TerminationCondition

    t0 = time.perf_counter()
    d_n = data.n_datacenters
    pc, pd, count = data.pc, data.pd, data.count
    at_d = [np.flatnonzero(pd == d).tolist() for d in range(d_n)]
    of_c = [np.flatnonzero(pc == c).tolist() for c in range(data.n_classes)]
    m = pyo.ConcreteModel()
    m.C = pyo.Set(initialize=range(data.n_classes))
    m.D = pyo.Set(initialize=range(d_n))
    m.P = pyo.Set(initialize=range(pc.size))
    m.Y = pyo.Set(initialize=[int(d) for d in np.flatnonzero(data.idle > 0)])
    m.x = pyo.Var(m.P, domain=pyo.NonNegativeIntegers, bounds=lambda m, i: (0, count[pc[i]]))
    m.defer = pyo.Var(m.C, domain=pyo.NonNegativeIntegers, bounds=lambda m, c: (0, count[c]))
    if data.engine_model == "pack":
        m.y = pyo.Var(m.Y, domain=pyo.NonNegativeIntegers, bounds=lambda m, d: (0, data.idle[d]))
    else:
        m.y = pyo.Var(m.Y, domain=pyo.NonNegativeReals, bounds=lambda m, d: (0, data.idle[d]))
        m.s = pyo.Var(m.Y, domain=pyo.Binary)
    m.oseq = pyo.Var(m.D, domain=pyo.NonNegativeReals)
    m.otok = pyo.Var(m.D, domain=pyo.NonNegativeReals)
    m.okv = pyo.Var(m.D, domain=pyo.NonNegativeReals)

    def added(m: Any, d: int) -> Any:
        return sum(m.x[i] for i in at_d[d])

    m.obj = pyo.Objective(
        expr=sum((data.kappa[i] + data.lam * data.miss[i]) * m.x[i] for i in m.P)
        + sum(data.fixed_g[d] * m.y[d] for d in m.Y)
        + sum(data.lam * m.oseq[d] + data.lam_tok * m.otok[d] + data.lam_kv * m.okv[d] for d in m.D)
        + sum(data.defer_cost[c] * m.defer[c] for c in m.C),
        sense=pyo.minimize,
    )
    m.assign = pyo.Constraint(m.C, rule=lambda m, c: sum(m.x[i] for i in of_c[c]) + m.defer[c] == count[c])

    def tpot_rule(m: Any, d: int) -> Any:
        lhs = added(m, d) - m.oseq[d]
        if data.engine_model == "pack" and d in m.Y:
            lhs = lhs - data.spe[d] * m.y[d]
        return lhs <= data.cap_seq[d]

    m.tpot = pyo.Constraint(m.D, rule=tpot_rule)
    tok_cap = data.tok_cap
    m.ttft = pyo.Constraint(m.D, rule=lambda m, d: sum(data.prompt[pc[i]] * m.x[i] for i in at_d[d]) - m.otok[d]
                            <= tok_cap[d])
    m.kv = pyo.Constraint(m.D, rule=lambda m, d: sum(data.kv[pc[i]] * m.x[i] for i in at_d[d]) - m.okv[d] <= data.free_kv[d])
    if data.engine_model == "spread":
        m.wake_a = pyo.Constraint(m.Y, rule=lambda m, d: added(m, d) - m.y[d] - data.big_m[d] * m.s[d] <= 0)
        m.wake_b = pyo.Constraint(m.Y, rule=lambda m, d: m.y[d] - data.idle[d] * m.s[d] >= 0)
    t1 = time.perf_counter()
    from pyomo.contrib.appsi.solvers import Highs  # the APPSI interface behind SolverFactory("appsi_highs")

    solver = Highs()
    solver.config.time_limit = float(cfg.time_limit_s)
    solver.config.mip_gap = float(cfg.mip_gap)
    solver.config.load_solution = False
    solver.highs_options = {"threads": int(cfg.threads), "random_seed": 0}
    res = solver.solve(m)
    t2 = time.perf_counter()
    if res.best_feasible_objective is None or res.termination_condition == TerminationCondition.error:
        return SolveResult(None, None, str(res.termination_condition), float("nan"), t1 - t0, t2 - t1)
    res.solution_loader.load_vars()
    x = np.array([round(pyo.value(m.x[i])) for i in range(pc.size)], dtype=np.float64)
    defer = np.array([round(pyo.value(m.defer[c])) for c in range(data.n_classes)], dtype=np.float64)
    return SolveResult(x, defer, str(res.termination_condition), float(res.best_feasible_objective), t1 - t0, t2 - t1)


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
            budget[dcs[0]] -= problem.prompt_tokens[members[: counts[0]]].sum()
        else:
            split.append((members, dcs, counts.copy()))
    if split:
        theta = data.theta
        h = effective_headroom_s(problem)
        # slack_d = budget left - prompt tokens still planned at d by the split classes
        slack = budget.copy()
        for members, dcs, quota in split:
            c = int(data.class_of[members[0]])
            slack[dcs] -= quota * data.prompt[c]
        prompt = problem.prompt_tokens
        for members, dcs, quota in split:
            c = int(data.class_of[members[0]])
            mean_p = float(data.prompt[c])
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
                slack[d] += mean_p - prompt[r]
    return out


class FacilityMILP(Scheduler):
    """The facility MILP scheduler (``name = "facility-milp"``).

    Args:
        env: the env (optional until :meth:`reset`).
        config: a :class:`FacilityConfig`; keyword arguments override its fields.

    ``stats`` holds per decision ``decision_s`` (wall time of :meth:`act`, problem building
    included), ``place_s`` (wall time of :meth:`place`), ``build_s``, ``solve_s``,
    ``n_classes``, ``status``, ``objective_g``, ``mip_gap``; and the counters ``solves`` and
    ``fallbacks`` (with ``fallback_reasons``). Wall-clock figures live here only, never in the
    env's ``info``.
    """

    name = "facility-milp"

    def __init__(self, env: Any = None, config: FacilityConfig | None = None, **overrides: Any) -> None:
        base_kw = {k: overrides.pop(k) for k in ("ttft_margin", "tpot_margin") if k in overrides}
        cfg = config if config is not None else FacilityConfig()
        if overrides:
            unknown = sorted(set(overrides) - set(FacilityConfig.__dataclass_fields__))
            if unknown:
                raise ConfigError(f"facility.{unknown[0]}", "unknown setting", allowed=sorted(FacilityConfig.__dataclass_fields__))
            cfg = replace(cfg, **overrides)
        self.config = cfg
        super().__init__(env, **base_kw)

    def reset_stats(self) -> None:
        """Clear the statistics."""
        self.stats = {"decision_s": [], "place_s": [], "build_s": [], "solve_s": [], "n_classes": [], "status": [],
                      "objective_g": [], "mip_gap": [], "fallbacks": 0, "solves": 0, "fallback_reasons": []}

    def _solve(self, data: FacilityData, warm: tuple[np.ndarray, np.ndarray] | None) -> SolveResult:
        if self.config.backend == "pyomo":
            return solve_pyomo(data, self.config)
        return solve_highspy(data, self.config, warm)

    def place(self, problem: PlacementProblem) -> np.ndarray:
        """Assignment (R,) of the pending requests: datacenter index, or D to defer."""
        t0 = time.perf_counter()
        if problem.n_requests == 0:
            self.stats["place_s"].append(time.perf_counter() - t0)
            return np.zeros(0, dtype=np.int64)
        data = compile_facility(problem, self.config)
        warm = class_greedy(data) if self.config.warm_start else None
        try:
            res = self._solve(data, warm)
        except Exception as exc:  # noqa: BLE001 - any solver failure falls back, counted and logged
            res = SolveResult(None, None, f"error: {type(exc).__name__}: {exc}", float("nan"), 0.0, 0.0)
        self.stats["solves"] += 1
        self.stats["status"].append(res.status)
        self.stats["build_s"].append(res.build_s)
        self.stats["solve_s"].append(res.solve_s)
        self.stats["n_classes"].append(data.n_classes)
        self.stats["objective_g"].append(res.objective)
        self.stats["mip_gap"].append(res.mip_gap)
        assignment = None
        reason = ""
        if res.x is None:
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
        self.stats["place_s"].append(time.perf_counter() - t0)
        return assignment


class FacilityGreedy(Scheduler):
    """The state-aware greedy on the facility objective alone (``name = "facility-greedy"``;
    the MILP's fallback, exposed as a scheduler for comparison)."""

    name = "facility-greedy"

    def __init__(self, env: Any = None, config: FacilityConfig | None = None, **overrides: Any) -> None:
        base_kw = {k: overrides.pop(k) for k in ("ttft_margin", "tpot_margin") if k in overrides}
        cfg = config if config is not None else FacilityConfig()
        self.config = replace(cfg, **overrides) if overrides else cfg
        super().__init__(env, **base_kw)

    def place(self, problem: PlacementProblem) -> np.ndarray:
        """Greedy assignment (see :func:`facility_greedy`)."""
        return facility_greedy(problem, self.config)
