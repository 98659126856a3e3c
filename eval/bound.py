r"""A true lower bound on an episode's carbon: a fluid relaxation over the whole episode, solved
with HiGHS, that no policy can beat (issue 21, item 3).

What any run of the episode must emit, as the env accounts it (facility carbon of every
datacenter from t = 0 to the end of the drain):

1. **The floor** no routing avoids: every GPU draws at least its idle power and every node its
   host power whenever the datacenter is up, for at least ``N x P`` seconds (the last decision;
   the drain only adds). Exactly ``sum_d PUE_d (G_d P_idle + M_d P_host) \int CI_d dt`` over
   ``[0, N P]`` (``CarbonTrace.integral``). Capacity states (engines that sleep with a lower
   floor, the capacity-control issue) enter through ``sleep_w``: the floor is then at the sleep
   power, and each engine-second awake pays ``P_idle - P_sleep`` on top, in the program below.
2. **The active energy** of the work: an iteration of ``k = p + n`` tokens (``p`` prefill, ``n``
   decode) on an engine of ``tp`` GPUs costs ``tp (P(p, n) - P_idle) T(p, n, ...)`` above idle
   (x PUE), with ``P(p, n) >= P_lo = min(decode_min_w, prefill_w)`` (the power model) and
   ``T >= g(k) + (terms of the requests in it)`` with ``g(k) = overhead + allreduce_fixed +
   linear(k) + allreduce_per_token k`` (the latency model). With ``ĝ`` the convex minorant of
   ``g`` on ``[1, K]`` (``K`` >= any iteration's tokens), ``N`` iterations processing ``X``
   tokens take at least ``N ĝ(X / N) = max_j (a_j N + b_j X)`` engine-seconds (Jensen; ``a_j +
   b_j k`` the hull's lines), and ``N >= D / S`` (at most ``S = max_num_seqs`` decodes per
   iteration: the most efficient batch), ``N >= X / K``, ``N <= X``. Each request adds what the
   latency model charges it however it is batched: per decode step ``attn_decode_per_seq`` and
   ``attn_decode_per_ctx`` x its context (>= prompt + tokens generated before), its prompt's
   ``attn_prefill_per_token`` and ``attn_prefill_per_pair`` x ``p (p + 1) / 2`` (the pairs of
   any chunking), ``per_sampled_seq`` per output token; the ``D / S`` decode iterations at least
   add ``lm_head_fixed + attn_decode_fixed`` each. Every request needs its ``p`` prompt tokens
   prefilled and ``o - 1`` decode iterations (its first token comes with the prefill);
   preemption and failed-over work only add.
3. **Capacity and carbon hours**: the episode is cut at the carbon trace's hour boundaries (plus
   ``N P`` and the end of the longest drain the env allows); an engine is active at most the
   whole window (engine-seconds <= engines x window), work is done no earlier than the window
   it arrives in, and it costs at least the window's lowest intensity (constant within an hour
   for step traces; linear ones are at their lowest at an end).

The program: variables ``f[a, h, d]`` (share of window ``a``'s arrivals done at datacenter
``d`` in window ``h >= a``), ``N[h, d]`` iterations and ``T[h, d]`` active engine-seconds;
minimise ``sum PUE_d tp (P_lo - P_idle) CImin[h, d] T[h, d] / 3.6e6`` (grams) subject to the
rules above. It relaxes every policy (fractional, pre-emptive, latency-blind, clairvoyant,
no network, no SLO), so its optimum plus the floor is below the carbon of every run that
completes the work. A run that leaves work unfinished is held to the floor only (its unfinished
work's energy was never spent; such runs are invalid anyway). Scenarios with outages or engine
drains (datacenters drawing 0 W while down) keep no floor for any datacenter (weaker, still
valid).

Heterogeneous topologies (datacenters of different GPUs): every datacenter's floor, power
figures (``P_idle``, ``P_lo``, host) and latency terms (``ĝ``, the requests' own terms) are its own
GPU's models, so work done at a datacenter costs what it would cost on that datacenter's engines.

Capacity here is physical (an engine cannot be active more than 100% of the time), not "at the
SLO": a policy that violates its SLOs can push an engine past its SLO capacity, and a bound it
could beat would be no bound.

**The SLO-true bound** (``slo_carbon_g``, ``slo_status``; :mod:`eval.bound_slo`, issue 40 item 4)
is a second figure beside it, from the same program: each datacenter is offered, in every
window, at most its engines x their measured per-engine p99 capacity (the load-level file's
engine figure ``per_engine_rate_per_s`` for its (model, GPU, tp)) x the window's length; under
capacity states (``sleep_w``) or capacity control its awake engine-seconds are at least its
requests over that per-engine capacity, each paying the idle power above the floor's (and, when
servers may be off, its share of a powered server's host power). It bounds only the policies
that keep every datacenter within that capacity: a policy that bursts above it for a while and
still passes p99 over the run can beat it, so a run below it is reported, not an error. The
physical figures (``carbon_g`` ...) are unchanged by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eval.bound_slo import (NOT_COMPUTED, SloPoint, SloResult, below_slo_note, energy_factor, episode_slo_rows, has_slo,
                             runs_below_slo_bound, slo_operating_point, slo_window_bound)

__all__ = ["CarbonBound", "carbon_lower_bound", "bound_for_spec", "iteration_time_minorant", "bounds_table", "with_bounds",
           "runs_below_bound", "runs_below_slo_bound", "bound_summary", "bound_experiment", "bound_check_markdown", "parse_bound_check", "CHECK_TITLE",
           "matrix_specs", "floor_power_w", "largest_backlog_end"]


@dataclass
class CarbonBound:
    """A lower bound on an episode's carbon (grams CO2eq).

    Attributes:
        carbon_g: the bound, ``floor_g + active_g``.
        floor_g: idle and host power over ``[0, N P]`` (at the sleep power with capacity states).
        active_g: the program's optimum (active energy of the work; awake engine-seconds above
            the sleep power with capacity states).
        status: HiGHS's model status (``Optimal``), or why only the floor is given.
        windows: the windows' ``(start_s, end_s)`` in simulated seconds.
        work_tokens: prefill + decode tokens of the episode's requests.
        requests: requests in the episode.
        seconds_per_token: the least engine-seconds per token (``min_k g(k) / k``), for reference.
        slo_carbon_g: the SLO-true bound (:mod:`eval.bound_slo`), ``floor_g + slo_active_g``: a
            bound only for policies that keep each datacenter's offered load within its engines'
            measured p99 capacity (NaN when not computed or infeasible: ``slo_status``).
        slo_active_g: the SLO-true program's optimum (grams above the floor).
        slo_status: HiGHS's status of the SLO-true program, or why there is no figure.
        slo_placed: requests at each datacenter in the SLO-true optimum (fluid).
        slo_capacity_per_s: each datacenter's SLO capacity ``C_d`` (requests/s).
    """

    carbon_g: float
    floor_g: float
    active_g: float
    status: str
    windows: list[tuple[float, float]] = field(default_factory=list)
    work_tokens: float = 0.0
    requests: int = 0
    seconds_per_token: float = float("nan")
    slo_carbon_g: float = float("nan")
    slo_active_g: float = float("nan")
    slo_status: str = NOT_COMPUTED
    slo_placed: list[float] = field(default_factory=list)
    slo_capacity_per_s: list[float] = field(default_factory=list)


def iteration_time_minorant(latency: Any, k_max: float) -> list[tuple[float, float]]:
    """Lines ``(a, b)`` with ``a + b k <= g(k)`` on ``[1, k_max]`` whose maximum is the convex
    minorant of ``g(k) = overhead + allreduce_fixed + linear(k) + allreduce_per_token k``, a lower
    bound of any iteration's time with ``k`` tokens (seconds). ``g`` is piecewise linear with
    breakpoints at the latency table's grid, so the lower convex hull of its values at the
    breakpoints in ``[1, k_max]`` and at both ends is its convex minorant there."""
    grid = np.asarray(latency.tokens_grid, dtype=np.float64)
    ks = np.unique(np.concatenate([[1.0, float(k_max)], grid[(grid > 1.0) & (grid < k_max)]]))
    fixed = float(latency.overhead_s) + float(latency.allreduce_fixed_s)
    per = float(latency.allreduce_per_token_s)
    g = np.array([fixed + latency.linear_time_s(float(k)) + per * k for k in ks])
    hull: list[int] = []  # lower convex hull (monotone chain)
    for i in range(ks.size):
        while len(hull) >= 2:
            i0, i1 = hull[-2], hull[-1]
            cross = (ks[i1] - ks[i0]) * (g[i] - g[i0]) - (g[i1] - g[i0]) * (ks[i] - ks[i0])
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    lines = []
    for i0, i1 in zip(hull[:-1], hull[1:]):
        b = (g[i1] - g[i0]) / (ks[i1] - ks[i0])
        lines.append((float(g[i0] - b * ks[i0]), float(b)))
    if not lines:
        lines.append((float(g[0]), 0.0))
    return lines


def _windows(offset_s: float, t_floor_s: float, t_max_s: float) -> list[tuple[float, float]]:
    """``[0, t_max]`` cut at the carbon trace's hours (carbon time = offset + t) and at ``t_floor``."""
    cuts = {0.0, float(t_floor_s), float(t_max_s)}
    h = math.floor(offset_s / 3600.0) + 1
    while h * 3600.0 - offset_s < t_max_s:
        cuts.add(h * 3600.0 - offset_s)
        h += 1
    pts = sorted(c for c in cuts if 0.0 <= c <= t_max_s)
    return [(a, b) for a, b in zip(pts[:-1], pts[1:]) if b > a]


_POWERLESS_FAULTS = ("datacenter_outage", "region_outage", "engine_drain")  # a datacenter or its engines draw 0 W


def floor_power_w(parts: Any, sleep_w: float | None = None) -> np.ndarray:
    """Per datacenter, the power it draws serving nothing, always on (W, PUE included): every GPU
    at its idle power (or ``sleep_w``, when lower) and every node at its host power; each
    datacenter's own GPU model."""
    topo = parts.topology
    dcs = list(topo.datacenters)
    gpu_of = [topo.datacenter_gpu(d) for d in range(len(dcs))]
    models = dict(zip(gpu_of, parts.datacenter_gpus()))
    idle_w = np.array([float(models[g].power.idle_w) for g in gpu_of])
    gpu_w = idle_w if sleep_w is None else np.minimum(float(sleep_w), idle_w)
    host_w = np.array([float(models[g].power.host_w) for g in gpu_of])
    return np.array([float(d.pue) for d in dcs]) * (np.array([float(d.gpus) for d in dcs]) * gpu_w
                                                    + np.array([float(d.nodes) for d in dcs]) * host_w)


def largest_backlog_end(runs: Any) -> int:
    """The most requests any of ``runs`` (rows of a runs table) left in flight at its window's
    end (``backlog_end``), 0 without the column or a figure: the window-end allowance of their
    bound (:func:`carbon_lower_bound`)."""
    if "backlog_end" not in runs or not runs["backlog_end"].notna().any():
        return 0
    return int(np.nanmax(runs["backlog_end"].to_numpy(float)))


def carbon_lower_bound(scenario: Any, seed: int, *, sleep_w: float | None = None, backlog_end: int = 0,  # noqa: C901
                       capacity: bool | None = None, slo: bool = True, point: SloPoint | None = None,
                       backlog_ages: dict[float, float] | None = None, window_left: dict[str, float] | None = None) -> CarbonBound:
    """The lower bound of the episode of ``scenario`` (with its episode start already in
    ``carbon.start_utc``) under world seed ``seed``: see the module docstring.

    Args:
        sleep_w: per-GPU power of a sleeping engine (capacity states), or None (engines are idle
            at least: the floor is at ``idle_w``).
        backlog_end: with a measurement window (``env.measure = "window"``), the most requests
            the runs compared with it leave in flight or pending at the window's end: of the
            requests arriving in the window, all but that many were done entirely in it.
        backlog_ages: {e: n}: of those left undone, at most n arrived more than e seconds before the
            window's end (the runs' ``backlog_end_age_gt_<e>s``, :func:`eval.runner.largest_backlog_ages`);
            used by the SLO-true figure only (the physical one keeps the plain allowance).
        window_left: with a measurement window, what the runs left at its end
            (:func:`eval.runner.largest_window_left`): only the requests not yet placed may be
            left undone whole, and the work not yet computed of those placed is subtracted
            (:func:`_window_bound`). None: the whole-request allowance of ``backlog_end``.
        capacity: bound runs that may power servers off (capacity control, :func:`_window_bound`);
            None: when the scenario's ``capacity.control`` is not ``always_on``. Measurement
            windows only (a ConfigError otherwise).
        slo: also compute the SLO-true bound (``slo_carbon_g``, :mod:`eval.bound_slo`): the
            same program with each datacenter held to its measured SLO operating point (its p99
            capacity and the energy per request it then spends).
        point: that operating point (:class:`eval.bound_slo.SloPoint`); None: measured with the
            simulator for this scenario (:func:`eval.bound_slo.slo_operating_point`, seconds per
            (GPU, datacenter size, polling period), cached).
    """
    import highspy

    from carbon_gym.env import DRAIN_TPOT_MULTIPLE, DRAIN_TTFT_MULTIPLE
    from carbon_gym.world import build_parts, build_workload

    from solvers._highs import new_highs

    parts = build_parts(scenario)
    topo, eng, trace, off = parts.topology, parts.engine, parts.carbon, parts.carbon_offset_s
    dcs = list(topo.datacenters)
    # each datacenter's own GPU (heterogeneous topologies): its latency and power models
    gpu_of = [topo.datacenter_gpu(d) for d in range(len(dcs))]
    models = dict(zip(gpu_of, parts.datacenter_gpus()))
    n_d = len(dcs)
    tp = int(eng.tp)
    P = float(scenario.polling_period_s)
    duration = float(scenario.duration_s)
    n_steps = max(1, int(math.ceil(duration / P - 1e-9)))
    t_floor = n_steps * P
    batch = build_workload(scenario, int(seed)).arrivals_between(0.0, duration)
    prompt = np.asarray(batch.prompt_tokens, dtype=np.float64)
    output = np.asarray(batch.output_tokens, dtype=np.float64)
    arrival = np.asarray(batch.arrival_s, dtype=np.float64)
    max_out = float(output.max()) if output.size else 0.0
    t_max = t_floor + DRAIN_TTFT_MULTIPLE * float(scenario.ttft_s) + DRAIN_TPOT_MULTIPLE * float(scenario.tpot_s) * max_out
    zones = np.array([trace.zone_index(d.zone) for d in dcs])
    pue = np.array([float(d.pue) for d in dcs])
    gpus = np.array([float(d.gpus) for d in dcs])
    nodes = np.array([float(d.nodes) for d in dcs])
    engines = gpus / tp
    idle_w = np.array([float(models[g].power.idle_w) for g in gpu_of])
    floor_gpu_w = idle_w if sleep_w is None else np.minimum(float(sleep_w), idle_w)
    powerless = any(isinstance(f, dict) and f.get("kind") in _POWERLESS_FAULTS for f in (getattr(scenario, "faults", None) or ()))
    floor_w = np.zeros(n_d) if powerless else floor_power_w(parts, sleep_w)
    if capacity is None:
        capacity = str(getattr(getattr(scenario, "capacity", None), "control", "always_on")) != "always_on"
    if getattr(scenario.env, "measure", "episode") == "window":
        if capacity and not powerless:  # every server at its least power state; the rest per engine-second
            floor_w = pue * nodes * np.array([_least_node_w(models[g]) for g in gpu_of])
        return _window_bound(scenario, parts, floor_w, zones, prompt, output, arrival, t_floor, int(backlog_end),
                             capacity=bool(capacity), slo=slo, point=point, backlog_ages=backlog_ages,
                             window_left=window_left)
    if capacity:
        from carbon_gym.errors import ConfigError

        raise ConfigError("env.measure", "the lower bound of runs that power servers off (capacity.control other than "
                          "always_on) is built for measurement windows only", allowed=["window"])
    floor_g = float(sum(floor_w[d] * trace.integral(int(zones[d]), off, off + t_floor) for d in range(n_d)) / 3.6e6)
    wins = _windows(off, t_floor, t_max)
    n_w = len(wins)
    decode = np.maximum(output - 1.0, 0.0)
    if prompt.size == 0:
        c_rate = (np.asarray((point or slo_operating_point(scenario, parts)).capacity_per_engine_per_s) * engines).tolist() if slo else []
        return CarbonBound(floor_g, floor_g, 0.0, "no requests", wins, 0.0, 0, slo_carbon_g=floor_g if slo else float("nan"),
                           slo_active_g=0.0 if slo else float("nan"), slo_status="no requests" if slo else NOT_COMPUTED,
                           slo_placed=[0.0] * n_d if slo else [], slo_capacity_per_s=c_rate)
    # work per arrival window (arrivals stop at the duration, inside the windows)
    starts = np.array([w[0] for w in wins])
    a_idx = np.searchsorted(starts, arrival, side="right") - 1
    work_x = np.bincount(a_idx, weights=prompt + decode, minlength=n_w)  # tokens
    work_dec = np.bincount(a_idx, weights=decode, minlength=n_w)
    # engine-seconds each request needs whatever the batching (_own_seconds), the iteration-time
    # minorant and the decode iterations' fixed cost, per GPU type: each datacenter's own GPU's
    S = float(eng.max_num_seqs)
    K = iteration_k_max(scenario, eng, prompt)
    work_by_gpu: dict[str, np.ndarray] = {}
    lines_by_gpu: dict[str, list[tuple[float, float]]] = {}
    for g, m in models.items():
        lat = m.latency
        work_s = np.bincount(a_idx, weights=_own_seconds(lat, prompt, output), minlength=n_w)
        lines_by_gpu[g] = iteration_time_minorant(lat, K)
        # fixed cost of every iteration that decodes (LM-head read, decode attention kernels): at
        # least D / S such iterations
        work_by_gpu[g] = work_s + (float(lat.lm_head_fixed_s) + float(lat.attn_decode_fixed_s)) * work_dec / S
    sec_per_token = min(_per_token_s(m.latency, K) for m in models.values())
    p_lo = np.array([min(float(models[g].power.decode_min_w), float(models[g].power.prefill_w)) for g in gpu_of])
    ci_min = np.zeros((n_w, n_d))
    for h, (t0, t1) in enumerate(wins):
        a, b = trace.intensity_all(off + t0), trace.intensity_all(off + t1 - 1e-9 if trace.interpolation == "step" else off + t1)
        ci_min[h] = np.minimum(a, b)[zones]
    lens = np.array([t1 - t0 for t0, t1 in wins])
    # ---- columns: f[a,h,d] (h >= a, work_x[a] > 0), N[h,d], T[h,d] (, U[h,d] awake engine-seconds)
    scale = 1e6  # tokens in millions in the rows (well-scaled coefficients)
    f_cols = [(a, h, d) for a in range(n_w) if work_x[a] > 0 for h in range(a, n_w) for d in range(n_d)]
    n_f = len(f_cols)
    hd = [(h, d) for h in range(n_w) for d in range(n_d)]
    n_hd = len(hd)
    col_n0, col_t0 = n_f, n_f + n_hd
    with_states = sleep_w is not None and bool(np.any(float(sleep_w) < idle_w))
    col_u0 = col_t0 + n_hd
    n_cols = col_u0 + (n_hd if with_states else 0)
    cost = np.zeros(n_cols)
    lo = np.zeros(n_cols)
    hi = np.full(n_cols, np.inf)
    hi[:n_f] = 1.0
    for i, (h, d) in enumerate(hd):
        grams_per_engine_s = pue[d] * tp * (p_lo[d] - idle_w[d]) * ci_min[h, d] / 3.6e6
        cost[col_t0 + i] = grams_per_engine_s
        cap = engines[d] * lens[h]
        if with_states:
            cost[col_u0 + i] = pue[d] * tp * (idle_w[d] - floor_gpu_w[d]) * ci_min[h, d] / 3.6e6
            hi[col_u0 + i] = cap
        else:
            hi[col_t0 + i] = cap
    rows_i: list[int] = []
    rows_j: list[int] = []
    vals: list[float] = []
    rlo: list[float] = []
    rhi: list[float] = []

    def row(entries: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(rlo)
        for j, v in entries:
            rows_i.append(r)
            rows_j.append(j)
            vals.append(v)
        rlo.append(low)
        rhi.append(high)

    by_a: dict[int, list[int]] = {}
    by_hd: dict[tuple[int, int], list[int]] = {}
    for j, (a, h, d) in enumerate(f_cols):
        by_a.setdefault(a, []).append(j)
        by_hd.setdefault((h, d), []).append(j)
    for js in by_a.values():  # all of window a's work is done somewhere, no earlier than window a
        row([(j, 1.0) for j in js], 1.0, 1.0)
    for i, (h, d) in enumerate(hd):
        js = by_hd.get((h, d), [])
        x = [(j, work_x[f_cols[j][0]] / scale) for j in js]
        dec = [(j, work_dec[f_cols[j][0]] / scale) for j in js]
        n_col, t_col = col_n0 + i, col_t0 + i
        row([(n_col, 1.0 / scale)] + [(j, -v / S) for j, v in dec], 0.0, np.inf)  # N >= D / S
        row([(n_col, 1.0 / scale)] + [(j, -v / K) for j, v in x], 0.0, np.inf)    # N >= X / K
        row([(j, v) for j, v in x] + [(n_col, -1.0 / scale)], 0.0, np.inf)        # N <= X
        work_s, lines = work_by_gpu[gpu_of[d]], lines_by_gpu[gpu_of[d]]
        per = [(j, work_s[f_cols[j][0]]) for j in js]
        for a_line, b_line in lines:                                              # T >= a N + b X + the requests' own terms
            row([(t_col, 1.0), (n_col, -a_line)] + [(j, -b_line * v * scale - w) for (j, v), (_, w) in zip(x, per)], 0.0, np.inf)
        if with_states:
            row([(col_u0 + i, 1.0), (t_col, -1.0)], 0.0, np.inf)                  # awake >= active
    h_ = new_highs(1)
    nrow = len(rlo)
    order = np.lexsort((np.asarray(rows_j), np.asarray(rows_i)))
    ri, cj, vv = np.asarray(rows_i)[order], np.asarray(rows_j, dtype=np.int32)[order], np.asarray(vals)[order]
    start = np.zeros(nrow + 1, dtype=np.int32)
    np.cumsum(np.bincount(ri, minlength=nrow), out=start[1:])
    h_.passModel(n_cols, nrow, int(vv.size), int(highspy.MatrixFormat.kRowwise), int(highspy.ObjSense.kMinimize), 0.0,
                 cost, lo, hi, np.asarray(rlo), np.asarray(rhi), start, cj, vv, np.zeros(n_cols, dtype=np.int32))
    h_.run()
    status = h_.modelStatusToString(h_.getModelStatus())
    tokens = float(work_x.sum())
    if h_.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return CarbonBound(floor_g, floor_g, 0.0, f"{status}: the floor only", wins, tokens, int(prompt.size), sec_per_token)
    # HiGHS's optimum is a float; a hair below it is still a bound on the true optimum
    active = max(0.0, float(h_.getInfo().objective_function_value) * (1.0 - 1e-7))
    out = CarbonBound(floor_g + active, floor_g, active, status, wins, tokens, int(prompt.size), sec_per_token)
    if slo:  # the same program, each datacenter held to its engines' p99 capacity (eval/bound_slo.py)
        point = point if point is not None else slo_operating_point(scenario, parts)
        c_eng = np.asarray(point.capacity_per_engine_per_s, dtype=np.float64)
        # every active engine-second at d at its operating point's energy (eval.bound_slo.energy_factor)
        mean_s = {g: float(np.mean(_engine_seconds(m.latency, eng, prompt, output, K)[0])) for g, m in models.items()}  # per GPU type
        ideal_j = np.array([mean_s[g] * tp * (p_lo[d] - idle_w[d]) for d, g in enumerate(gpu_of)])
        factor = energy_factor(point, ideal_j)
        t_cols = np.arange(col_t0, col_t0 + n_hd, dtype=np.int32)
        h_.changeColsCost(n_hd, t_cols, cost[col_t0:col_t0 + n_hd] * np.array([factor[d] for _, d in hd]))
        n_arr = np.bincount(a_idx, minlength=n_w).astype(np.float64)
        extra = episode_slo_rows(f_cols, n_arr, lens, c_eng, engines, (lambda h, d: col_u0 + h * n_d + d) if with_states else None)
        r_lo, r_hi = np.array([r[1] for r in extra]), np.array([r[2] for r in extra])
        r_start = np.cumsum([0] + [len(r[0]) for r in extra[:-1]]).astype(np.int32)
        r_idx = np.array([j for r in extra for j, _ in r[0]], dtype=np.int32)
        r_val = np.array([v for r in extra for _, v in r[0]])
        h_.addRows(len(extra), r_lo, r_hi, int(r_idx.size), r_start, r_idx, r_val)
        h_.run()
        res = _slo_result(h_, highspy, f_cols, n_arr, n_d, c_eng * engines)
        _attach_slo(out, res)
    return out


def _slo_result(h_: Any, highspy: Any, f_cols: list[tuple[int, int, int]], n_arr: np.ndarray, n_d: int, cap_rate: np.ndarray) -> SloResult:
    """The SLO-true part from a solved episode program (its first ``len(f_cols)`` columns the
    shares ``f[a, h, d]``)."""
    st = h_.getModelStatus()
    status = h_.modelStatusToString(st)
    if st != highspy.HighsModelStatus.kOptimal:
        why = " (arrivals above the datacenters' SLO capacity)" if st == highspy.HighsModelStatus.kInfeasible else ""
        return SloResult(float("nan"), status + why, [float("nan")] * n_d, cap_rate.tolist())
    f = np.asarray(h_.getSolution().col_value)[:len(f_cols)]
    placed = np.zeros(n_d)
    for v, (a, _, d) in zip(f, f_cols):
        placed[d] += v * n_arr[a]
    return SloResult(max(0.0, float(h_.getInfo().objective_function_value) * (1.0 - 1e-7)), status, placed.tolist(), cap_rate.tolist())


def _attach_slo(b: CarbonBound, res: SloResult) -> None:
    """Set ``b``'s SLO-true fields from ``res``: the figure is never below the physical bound
    (same program, more constraints; the larger is kept against round-off)."""
    b.slo_status, b.slo_placed, b.slo_capacity_per_s = res.status, res.placed, res.capacity_per_s
    if math.isnan(res.active_g):
        b.slo_active_g = b.slo_carbon_g = float("nan")
        return
    b.slo_active_g = max(res.active_g, b.active_g)
    b.slo_carbon_g = b.floor_g + b.slo_active_g


def _per_token_s(lat: Any, k_max: float) -> float:
    """Seconds per token of the most efficient iteration, ``min_k g(k) / k`` on ``[1, k_max]``."""
    grid = np.asarray(lat.tokens_grid, float)
    ks = np.unique(np.concatenate([[1.0, k_max], grid[(grid > 1) & (grid < k_max)]]))
    return float(min((float(lat.overhead_s) + float(lat.allreduce_fixed_s) + lat.linear_time_s(k)
                      + float(lat.allreduce_per_token_s) * k) / k for k in ks))


def _own_seconds(lat: Any, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Engine-seconds each request adds whatever the batching (the latency model's per-token,
    per-sequence and per-context terms): attention over its own context at every decode step
    (context >= prompt + tokens generated before), its prompt's (query, key) pairs (p (p + 1) / 2
    however it is chunked), one LM-head sample per output token."""
    decode = np.maximum(output - 1.0, 0.0)
    ctx = decode * prompt + decode * np.maximum(decode - 1.0, 0.0) / 2.0
    return (float(lat.attn_decode_per_seq_s) * decode + float(lat.attn_decode_per_ctx_s) * ctx
            + float(lat.attn_prefill_per_token_s) * prompt + float(lat.attn_prefill_per_pair_s) * prompt * (prompt + 1.0) / 2.0
            + float(lat.per_sampled_seq_s) * output)


def iteration_k_max(scenario: Any, eng: Any, prompt: np.ndarray) -> float:
    """The most tokens one iteration can hold (the iteration-time minorant's range): the largest
    of the engine's token budget, the longest prompt and the context limit, plus one decode token
    per sequence."""
    longest = float(prompt.max()) if prompt.size else 1.0
    return float(max(eng.max_num_batched_tokens, longest, float(scenario.workload.max_context_tokens))) + float(eng.max_num_seqs)


def _engine_seconds(lat: Any, eng: Any, prompt: np.ndarray, output: np.ndarray, k_max: float) -> tuple[np.ndarray, float]:
    """(engine-seconds each request needs at least, seconds per token of the most efficient
    iteration): ``min_k g(k) / k`` per token plus the request's own latency-model terms."""
    decode = np.maximum(output - 1.0, 0.0)
    per_token = _per_token_s(lat, k_max)
    return per_token * (prompt + decode) + _own_seconds(lat, prompt, output), per_token


def left_engine_s(lat: Any, k_max: float, left: dict[str, float]) -> float:
    """The share of the window arrivals' least engine-seconds (:func:`_engine_seconds`, summed)
    that the work left at a window's end accounts for at most (``left``: the sums of
    :meth:`carbon_gym.episode.EpisodeTally.window_left`, positions counted as in
    :func:`_own_seconds`): ``min_k g(k) / k`` per prompt and decode token plus the latency
    model's own terms of those positions (prompt tokens, their (query, key) pairs, decode
    iterations and the contexts they read, LM-head samples)."""
    prompt, decode = float(left["left_prompt_tokens"]), float(left["left_decode_tokens"])
    return (_per_token_s(lat, k_max) * (prompt + decode) + float(lat.attn_prefill_per_token_s) * prompt
            + float(lat.attn_prefill_per_pair_s) * float(left["left_prompt_positions"])
            + float(lat.attn_decode_per_seq_s) * decode + float(lat.attn_decode_per_ctx_s) * float(left["left_decode_ctx"])
            + float(lat.per_sampled_seq_s) * float(left["left_samples"]))


def _least_node_w(m: Any) -> float:
    """The least power of a server in any capacity state (W): off (host at ``host_off_w``, GPUs at
    0 W), standby, booting or on (their host powers; GPUs draw >= 0 in each)."""
    st = m.states
    return float(min(st.host_off_w, st.host_standby_w, st.boot_host_w, m.power.host_w))


def _window_bound(scenario: Any, parts: Any, floor_w: np.ndarray, zones: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                  arrival: np.ndarray, t_end: float, backlog_end: int, *, capacity: bool = False, slo: bool = False,
                  point: SloPoint | None = None, backlog_ages: dict[float, float] | None = None,
                  window_left: dict[str, float] | None = None) -> CarbonBound:
    """The bound of a measurement window ``[W, t_end]`` (``env.measure = "window"``): the floor
    over the window (exact), plus the least active energy of the requests the window must have
    done entirely: of those arriving in it, all but ``backlog_end`` (the smallest ones, by their
    least cost), each engine-second at the lowest grams per engine-second of any datacenter and
    hour of the window (no capacity limit: weaker, valid whatever the burn-in left in flight).
    With several GPU types, each request costs the least over the types of its engine-seconds
    there times the type's lowest grams per engine-second (its datacenters' lowest PUE and
    intensity).

    With ``capacity`` (servers may be powered off), ``floor_w`` is every server at its least
    power (:func:`_least_node_w`), and an engine-second of work costs ``tp P_lo`` (its GPUs
    active) plus its share of a powered server's host power above that least power,
    ``(host_w - least) / engines_per_node`` (the node must be on while any of its engines works,
    and at most all of them share it): valid for any capacity schedule, boots and waits only add.

    With ``window_left`` (:func:`eval.runner.largest_window_left`: what the runs left at the
    window's end), the allowance is tighter: only the requests not yet placed
    (``requests_unplaced``) may be left undone whole; of those placed, the work not yet
    computed (:func:`left_engine_s`, an upper count) is subtracted from the engine-seconds (all
    of every window arrival's positions but those were computed in the window).

    With ``slo``, also the SLO-true figure (:func:`eval.bound_slo.slo_window_bound`; ``point``
    the datacenters' SLO operating point, measured when None)."""
    eng, trace, off = parts.engine, parts.carbon, parts.carbon_offset_s
    dcs = list(parts.topology.datacenters)
    gpu_of = [parts.topology.datacenter_gpu(d) for d in range(len(dcs))]
    models = dict(zip(gpu_of, parts.datacenter_gpus()))
    w0 = float(scenario.env.warmup_s)
    floor_g = float(sum(floor_w[d] * trace.integral(int(zones[d]), off + w0, off + t_end) for d in range(len(dcs))) / 3.6e6)
    wins = _windows(off + w0, t_end - w0, t_end - w0)
    wins = [(a + w0, b + w0) for a, b in wins]
    inside = arrival >= w0
    k_max = iteration_k_max(scenario, eng, prompt)
    n_drop = int(backlog_end) if window_left is None else int(window_left["requests_unplaced"])
    keep = max(0, int(inside.sum()) - n_drop)
    left_s = {g: (left_engine_s(m.latency, k_max, window_left) if window_left is not None else 0.0) for g, m in models.items()}
    tp = int(eng.tp)
    costs, per_tokens, secs = [], [], {}
    for g, m in models.items():
        ds = [d for d in range(len(dcs)) if gpu_of[d] == g]
        z = zones[ds]
        sec, per_token = _engine_seconds(m.latency, eng, prompt[inside], output[inside], k_max)
        secs[g] = sec
        ci_lo = min(float(min(trace.intensity_all(off + a)[z].min(), trace.intensity_all(off + b - 1e-9)[z].min()))
                    for a, b in wins)
        pue_lo = min(float(dcs[d].pue) for d in ds)
        p_lo = min(float(m.power.decode_min_w), float(m.power.prefill_w))
        if capacity:
            epn = max(1.0, min(float(dcs[d].gpus_per_node) for d in ds) / tp)
            watts = tp * p_lo + (float(m.power.host_w) - _least_node_w(m)) / epn
        else:
            watts = tp * (p_lo - float(m.power.idle_w))
        costs.append((pue_lo * watts * ci_lo, sec))
        per_tokens.append(per_token)
    if capacity and len(costs) == 1:  # engine-seconds go to the cheapest datacenters first, each at most its engines x window
        sec = costs[0][1]
        done_s = max(0.0, float(np.sort(sec)[:keep].sum()) - left_s[gpu_of[0]])
        active = _fill_cheapest(parts, models, gpu_of, zones, wins, done_s, t_end - w0) / 3.6e6 * (1.0 - 1e-9)
    elif len(costs) == 1:
        grams_per_engine_s, sec = costs[0]
        active = grams_per_engine_s * max(0.0, float(np.sort(sec)[:keep].sum()) - left_s[gpu_of[0]]) / 3.6e6 * (1.0 - 1e-9)
    else:  # (the work left costs at most the dearest type's price of it)
        least = np.min(np.stack([c * sec for c, sec in costs]), axis=0)
        left_g = max(c * left_s[g] for (c, _), g in zip(costs, models))
        active = max(0.0, float(np.sort(least)[:keep].sum()) - left_g) / 3.6e6 * (1.0 - 1e-9)
    out = CarbonBound(floor_g + active, floor_g, active, "window", wins, float((prompt[inside] + np.maximum(output[inside] - 1, 0)).sum()),
                      int(inside.sum()), min(per_tokens))
    if slo:
        res = slo_window_bound(scenario, parts, zones, arrival[inside], secs, {g: _least_node_w(m) for g, m in models.items()}, wins,
                               n_drop, capacity=capacity, point=point, backlog_ages=backlog_ages,
                               left_s=left_s if window_left is not None else None)
        _attach_slo(out, res)
    return out


def _fill_cheapest(parts: Any, models: Any, gpu_of: list[str], zones: np.ndarray, wins: list[tuple[float, float]],
                   engine_s: float, window_s: float) -> float:
    """Least grams x 3.6e6 (W x g/kWh x s) of ``engine_s`` engine-seconds of work under capacity
    control (one GPU type): each datacenter's engine-second at its own PUE and lowest intensity
    over the window's hours, at most engines x ``window_s`` of them per datacenter (an engine is
    active at most the whole window); the cheapest first (the fluid optimum)."""
    trace, off, tp = parts.carbon, parts.carbon_offset_s, int(parts.engine.tp)
    dcs = list(parts.topology.datacenters)
    m = models[gpu_of[0]]
    p_lo = min(float(m.power.decode_min_w), float(m.power.prefill_w))
    price, room = [], []
    for d, dc in enumerate(dcs):
        z = int(zones[d])
        ci = min(min(float(trace.intensity_all(off + a)[z]), float(trace.intensity_all(off + b - 1e-9)[z])) for a, b in wins)
        epn = max(1.0, float(dc.gpus_per_node) / tp)
        price.append(float(dc.pue) * (tp * p_lo + (float(m.power.host_w) - _least_node_w(m)) / epn) * ci)
        room.append(float(dc.gpus) / tp * window_s)
    left, total = float(engine_s), 0.0
    for d in np.argsort(price, kind="stable"):
        take = min(left, room[d])
        total += take * price[d]
        left -= take
        if left <= 0.0:
            break
    return total + max(left, 0.0) * max(price)  # (more work than engine-seconds: none of it is free)


def bound_for_spec(spec: Any, *, sleep_w: float | None = None, backlog_end: int = 0, slo: bool = True,
                   point: SloPoint | None = None, backlog_ages: dict[float, float] | None = None,
                   window_left: dict[str, float] | None = None) -> CarbonBound:
    """:func:`carbon_lower_bound` of a run's episode (its scenario with the overrides and the
    episode start :func:`eval.runner.resolve_run_scenario` gives it, world seed = its seed; the
    capacity-control bound when its ``capacity.control`` is not ``always_on``; with ``slo`` the
    SLO-true figure too, ``point``, ``backlog_ages`` and ``window_left`` as for
    :func:`carbon_lower_bound`)."""
    import warnings

    from eval.runner import resolve_run_scenario

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scenario, _ = resolve_run_scenario(spec)
    return carbon_lower_bound(scenario, int(spec.seed), sleep_w=sleep_w, backlog_end=backlog_end, slo=slo, point=point,
                              backlog_ages=backlog_ages, window_left=window_left)


def bounds_table(specs: Any, *, sleep_w: float | None = None, runs: Any = None, slo: bool = True) -> Any:
    """One row per (scenario label, seed) of ``specs``: the bound of that episode (the policy
    does not matter: every policy of a (scenario, seed) runs the same episode). Columns
    ``scenario``, ``seed``, ``bound_carbon_g``, ``bound_floor_g``, ``bound_active_g``,
    ``bound_status``, and the SLO-true bound (:mod:`eval.bound_slo`) ``slo_bound_carbon_g``,
    ``slo_bound_active_g``, ``slo_bound_status`` (with ``slo``). With measurement windows, ``runs``
    (their runs table) gives each (scenario, seed) the largest backlog its runs left at the
    window's end (``backlog_end``, and its ages and the work not computed where recorded:
    :func:`eval.runner.largest_window_left`)."""
    import pandas as pd

    from eval.runner import largest_backlog_ages, largest_window_left

    backlog: dict[tuple[str, int], int] = {}
    ages: dict[tuple[str, int], Any] = {}
    left: dict[tuple[str, int], Any] = {}
    if runs is not None and "backlog_end" in runs:
        for (scen, seed), g in runs.groupby(["scenario", "seed"]):
            backlog[(str(scen), int(seed))] = largest_backlog_end(g)
            ages[(str(scen), int(seed))] = largest_backlog_ages(g)
            left[(str(scen), int(seed))] = largest_window_left(g)

    seen: dict[tuple[str, int], Any] = {}
    for sp in specs:
        key = (sp.scenario_name, int(sp.seed))
        if key not in seen:
            seen[key] = sp
    rows = []
    for (scen, seed), sp in seen.items():
        b = bound_for_spec(sp, sleep_w=sleep_w, backlog_end=backlog.get((scen, seed), 0), slo=slo, backlog_ages=ages.get((scen, seed)),
                           window_left=left.get((scen, seed)))
        row = {"scenario": scen, "seed": seed, "bound_carbon_g": b.carbon_g, "bound_floor_g": b.floor_g,
               "bound_active_g": b.active_g, "bound_status": b.status}
        if slo:
            row.update(slo_bound_carbon_g=b.slo_carbon_g, slo_bound_active_g=b.slo_active_g, slo_bound_status=b.slo_status)
        rows.append(row)
    return pd.DataFrame(rows)


def with_bounds(runs: Any, bounds: Any) -> Any:
    """``runs`` (a runs table) with each run's ``bound_carbon_g`` / ``bound_floor_g`` and the
    bound's reduction vs the same seed's rr run (``bound_reduction_vs_rr_pct``); where ``bounds``
    has the SLO-true bound, ``slo_bound_carbon_g`` and ``slo_bound_reduction_vs_rr_pct`` too."""
    out = runs.merge(bounds, on=["scenario", "seed"], how="left")
    out["bound_reduction_vs_rr_pct"] = 100.0 * (out["rr_carbon_g"] - out["bound_carbon_g"]) / out["rr_carbon_g"]
    if has_slo(out):
        out["slo_bound_reduction_vs_rr_pct"] = 100.0 * (out["rr_carbon_g"] - out["slo_bound_carbon_g"]) / out["rr_carbon_g"]
    return out


def runs_below_bound(runs: Any) -> Any:
    """The runs of a table from :func:`with_bounds` whose carbon is below what the bound allows:
    the bound for runs that completed every request, the floor for the others (their unfinished
    work's energy was never spent). Empty when the bound holds."""
    complete = runs["unfinished_pct"].fillna(0.0) <= 0.0
    if "window_s" in runs:  # (a window's bound already allows for the backlog its runs left)
        complete = complete | runs["window_s"].notna()
    limit = np.where(complete, runs["bound_carbon_g"], runs["bound_floor_g"])
    return runs[runs["carbon_g"].to_numpy(float) < limit - 1e-9]


def bound_summary(runs: Any) -> Any:
    """Per scenario of a :func:`with_bounds` table: the bound's carbon and its reduction vs rr
    (mean ± 95% CI over seeds), the floor's share of it, and how many runs fall below it
    (``below``: 0 when the bound holds); with the SLO-true bound, its carbon and reduction
    (``slo_bound_*``) and the runs below it (``below_slo``, ``below_slo_runs``: ``policy/seed``;
    not an error, :mod:`eval.bound_slo`)."""
    import pandas as pd

    from eval.stats import mean_ci95

    rows = []
    bad = runs_below_bound(runs)
    slo = has_slo(runs)
    bad_slo = runs_below_slo_bound(runs)
    for scen, g in runs.groupby("scenario", sort=False):
        per_seed = g.drop_duplicates("seed")
        m, ci = mean_ci95(per_seed["bound_reduction_vs_rr_pct"])
        c, cci = mean_ci95(per_seed["bound_carbon_g"])
        row = {"scenario": scen, "seeds": int(len(per_seed)), "bound_carbon_g": c, "bound_carbon_g_ci95": cci,
               "bound_reduction_vs_rr_pct": m, "bound_reduction_vs_rr_pct_ci95": ci,
               "floor_share_pct": float(100.0 * per_seed["bound_floor_g"].sum() / per_seed["bound_carbon_g"].sum()),
               "below": int((bad["scenario"] == scen).sum())}
        if slo:
            sm, sci = mean_ci95(per_seed["slo_bound_reduction_vs_rr_pct"])
            sc, scci = mean_ci95(per_seed["slo_bound_carbon_g"])
            mine = bad_slo[bad_slo["scenario"] == scen]
            row.update(slo_bound_carbon_g=sc, slo_bound_carbon_g_ci95=scci, slo_bound_reduction_vs_rr_pct=sm,
                       slo_bound_reduction_vs_rr_pct_ci95=sci, below_slo=int(len(mine)),
                       below_slo_runs=" ".join(f"{p}/{int(sd)}" for p, sd in zip(mine["policy"], mine["seed"])))
        rows.append(row)
    return pd.DataFrame(rows)


def bound_share(runs: Any) -> tuple[Any, str]:
    """Every policy's reduction vs rr as a share of the lower bound's, per (scenario, policy) of a
    :func:`with_bounds` runs table (per seed, then averaged): ``(table, Markdown)`` with the
    bound row and the runs below it (none, unless the bound or the accounting is wrong)."""
    import pandas as pd

    from eval.stats import mean_ci95
    from eval.tables import METRICS_NOTE, MLPERF_COLUMNS, fmt_ci, frame_markdown, p99_verdict

    below = runs_below_bound(runs)
    slo = has_slo(runs)
    below_slo = runs_below_slo_bound(runs)
    rows = []
    for (scen, pol), g in runs.groupby(["scenario", "policy"], sort=False):
        red, rci = mean_ci95(g["reduction_vs_rr_pct"])
        bred = float(g["bound_reduction_vs_rr_pct"].mean())
        share, sci = mean_ci95(100.0 * g["reduction_vs_rr_pct"] / g["bound_reduction_vs_rr_pct"])
        row = {"scenario": scen, "policy": pol, "seeds": int(len(g)), "reduction_vs_rr_pct": red, "reduction_vs_rr_pct_ci95": rci,
               "bound_reduction_vs_rr_pct": bred, "share_of_bound_pct": share, "share_of_bound_pct_ci95": sci,
               "slo_violation_pct": float(g["slo_violation_pct"].mean()), "below_bound": int(g.index.isin(below.index).sum()),
               "valid_share": float(g["run_valid"].astype(float).mean()) if "run_valid" in g else np.nan}
        if slo:
            s_share, s_ci = mean_ci95(100.0 * g["reduction_vs_rr_pct"] / g["slo_bound_reduction_vs_rr_pct"])
            row.update(slo_bound_reduction_vs_rr_pct=float(g["slo_bound_reduction_vs_rr_pct"].mean()), share_of_slo_bound_pct=s_share,
                       share_of_slo_bound_pct_ci95=s_ci, below_slo_bound=int(g.index.isin(below_slo.index).sum()))
        for c in MLPERF_COLUMNS:
            row[c + "_share"] = float(g[c].astype(float).mean()) if c in g else np.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    summ = bound_summary(runs)
    disp = pd.DataFrame({
        "scenario": table["scenario"], "policy": table["policy"],
        "vs rr %": [fmt_ci(a, b) for a, b in zip(table["reduction_vs_rr_pct"], table["reduction_vs_rr_pct_ci95"])],
        "share of the bound's reduction %": [fmt_ci(a, b, 0) for a, b in zip(table["share_of_bound_pct"], table["share_of_bound_pct_ci95"])],
        "SLO viol. %": table["slo_violation_pct"].map(lambda v: fmt_ci(v, d=2)),
        "MLPerf p99 pass": [p99_verdict(r) for _, r in table.iterrows()],
        "below the bound": table["below_bound"].map(lambda n: "none" if n == 0 else f"{n} run(s)!"),
    })
    if slo:
        disp.insert(4, "share of the SLO-true bound's reduction %",
                    [fmt_ci(a, b, 0) for a, b in zip(table["share_of_slo_bound_pct"], table["share_of_slo_bound_pct_ci95"])])
        disp["below the SLO-true bound"] = table["below_slo_bound"].map(lambda n: "none" if n == 0 else f"{n} run(s)")
    bdisp = pd.DataFrame({
        "scenario": summ["scenario"], "seeds": summ["seeds"],
        "bound (g)": [fmt_ci(a, b, 1) for a, b in zip(summ["bound_carbon_g"], summ["bound_carbon_g_ci95"])],
        "bound vs rr %": [fmt_ci(a, b) for a, b in zip(summ["bound_reduction_vs_rr_pct"], summ["bound_reduction_vs_rr_pct_ci95"])],
        "of which idle/host floor %": summ["floor_share_pct"].map(lambda v: f"{v:.0f}"),
        "runs below it": summ["below"],
    })
    if slo:
        bdisp["SLO-true bound vs rr %"] = [fmt_ci(a, b) for a, b in zip(summ["slo_bound_reduction_vs_rr_pct"],
                                                                         summ["slo_bound_reduction_vs_rr_pct_ci95"])]
        bdisp["runs below the SLO-true bound"] = summ["below_slo"]
    md = ("The carbon lower bound (eval/bound.py: a fluid relaxation of the whole episode solved with HiGHS: the idle and "
          "host power no routing avoids, the least active energy of the episode's work from the power and latency models "
          "at the most efficient batch, engines at most 100% busy, work no earlier than it arrives, each hour at its "
          "carbon): no run can emit less. Each policy's reduction vs rr is shown as a share of the bound's reduction in "
          "the same seed. " + (SLO_NOTE + " " + below_slo_note(runs) + " " if slo else "") + METRICS_NOTE + "\n\n"
          + frame_markdown(bdisp) + "\n" + frame_markdown(disp))
    return table, md


#: What the SLO-true bound is, for the tables that show it.
SLO_NOTE = ("The SLO-true bound (eval/bound_slo.py) is the same program with each datacenter held to its SLO operating point, "
            "measured with the simulator at the scenario's polling period (one datacenter of its engines and dispatcher, Poisson "
            "arrivals, no network): in every hour at most its engines x the highest per-engine rate within p99 (in work, of the "
            "episode's request mix), each request at the energy it takes there: a bound only for policies that keep every "
            "datacenter within that capacity; a run below it exceeded it somewhere (not an error), and a policy that bursts above "
            "it and still passes p99 over the run can beat it.")


def bound_experiment(ctx: Any, policies: Any) -> str:
    """Experiment f (an :class:`eval.experiments.Ctx`): every policy's reduction vs rr as a
    share of the lower bound's (per seed, the most any policy could save), with the bound row
    and a check that no run is below it (:func:`bound_share`). Writes ``bound.md``, ``bound.csv``
    (per policy), ``bounds.csv`` (per scenario and seed) and a figure."""
    import os
    import sys

    from eval.runner import make_specs
    from eval.tables import REFERENCE_POLICY

    scens = ctx.scenario_list(("moderate",))
    specs = make_specs(scens, list(dict.fromkeys([REFERENCE_POLICY] + list(policies))), ctx.seeds, overrides=ctx.overrides,
                       policy_kwargs=ctx.policy_kwargs)
    ex = ctx.execute(specs)
    bounds = bounds_table([s for s in specs if s.policy == REFERENCE_POLICY], runs=ex.runs)
    bounds.to_csv(os.path.join(ctx.out, "bounds.csv"), index=False)
    runs = with_bounds(ex.runs, bounds)
    below = runs_below_bound(runs)
    if not below.empty:  # a bug in the bound or the accounting: say it loudly, keep the evidence
        print(f"carbon-gym: warning: {len(below)} run(s) below the carbon lower bound: {', '.join(below['policy'] + '/' + below['scenario'])}",
              file=sys.stderr)
    if not runs_below_slo_bound(runs).empty:  # (not an error: those runs exceeded some datacenter's p99 capacity)
        print(f"carbon-gym: note: {below_slo_note(runs)}", file=sys.stderr)
    table, md = bound_share(runs)
    table.to_csv(os.path.join(ctx.out, "bound.csv"), index=False)
    ctx.write_text("bound.md", md)
    if ctx.plots:
        from eval import plots

        print(f"carbon-gym: note: {ctx.name}: writing figures to {ctx.fig_dir} (PNG + PDF; --no-plots skips them)", file=sys.stderr)
        plots.bars(table[table["policy"] != REFERENCE_POLICY], x="scenario", hue="policy", y="share_of_bound_pct",
                   yerr="share_of_bound_pct_ci95", stem=ctx.fig("bound_share"), ylabel="share of the bound's reduction (%)",
                   title="Reduction vs rr as a share of the lower bound's")
    return md


#: Title of RESULTS.md's per-(scenario, seed) check of the bound (parsed by the tests).
CHECK_TITLE = "### Lower bound check"


def bound_check_markdown(runs: Any) -> str:
    """Per (scenario, seed) of a :func:`with_bounds` table: the bound, its floor, the lowest
    carbon of a run that completed its work (and its policy), and whether every run of the
    table is above the bound (the floor, for runs that left work unfinished)."""
    below = runs_below_bound(runs)
    lines = [CHECK_TITLE, "",
             "Every run of the table against the lower bound of its episode (the floor, for a run that left work unfinished).", "",
             "| scenario | seed | bound (g) | floor (g) | lowest complete run (g) | its policy | every run above the bound |",
             "|---|---|---|---|---|---|---|"]
    for (scen, seed), g in runs.groupby(["scenario", "seed"], sort=False):
        done = g[g["unfinished_pct"].fillna(0.0) <= 0.0] if "window_s" not in g else g
        low = done.loc[done["carbon_g"].idxmin()] if len(done) else None
        ok = not ((below["scenario"] == scen) & (below["seed"] == seed)).any()
        lines.append(f"| {scen} | {int(seed)} | {float(g['bound_carbon_g'].iloc[0]):.3f} | {float(g['bound_floor_g'].iloc[0]):.3f} | "
                     + (f"{float(low['carbon_g']):.3f} | {low['policy']}" if low is not None else "– | –") + f" | {'yes' if ok else 'NO'} |")
    note = below_slo_note(runs)
    return "\n".join(lines) + "\n" + (f"\nAgainst the SLO-true bound (eval/bound_slo.py): {note}\n" if note else "")


def parse_bound_check(text: str) -> list[dict[str, Any]]:
    """The rows of the :data:`CHECK_TITLE` section of a RESULTS.md (empty when it has none)."""
    if CHECK_TITLE not in text:
        return []
    rows = []
    for line in text.split(CHECK_TITLE, 1)[1].splitlines():
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] not in ("scenario", "---") and not cells[0].startswith("-"):
            rows.append({"scenario": cells[0], "seed": int(cells[1]), "bound_g": float(cells[2]), "floor_g": float(cells[3]),
                         "lowest_g": float(cells[4]) if cells[4] != "–" else float("nan"), "policy": cells[5], "ok": cells[6]})
    return rows


def matrix_specs(matrix_dir: str) -> dict[str, Any]:
    """The :class:`eval.runner.RunSpec` of every run of a finished matrix, by run id (from its
    ``config.json``)."""
    import dataclasses
    import json
    import os

    from eval.runner import RunSpec, freeze

    with open(os.path.join(matrix_dir, "config.json"), encoding="utf-8") as f:
        metas = json.load(f)["runs"]
    names = {f.name for f in dataclasses.fields(RunSpec)}
    specs: dict[str, Any] = {}
    for m in metas:
        kw = {k: v for k, v in m.items() if k in names}
        kw["overrides"], kw["policy_kwargs"] = freeze(kw.get("overrides")), freeze(kw.get("policy_kwargs"))
        specs[m["run_id"]] = RunSpec(**kw)
    return specs


def check_matrix(matrix_dir: str, *, allowance: bool = True) -> Any:
    """Every run of a finished matrix (``config.json`` and ``runs.csv`` in ``matrix_dir``)
    against the lower bound of its episode: the capacity-control bound for runs whose
    ``capacity.control`` is not ``always_on``, the always-on one otherwise, with the largest
    backlog that (scenario, seed)'s always-on runs left (for the capacity-control bound each run's
    own backlog, so that a run leaving much work undone does not weaken the others'). One row per run: ``scenario``,
    ``policy``, ``seed``, ``capacity`` (bool), ``carbon_g``, ``bound_carbon_g``,
    ``bound_floor_g``, ``below`` (carbon below what the bound allows: the bound, or the floor for
    a run that left work unfinished outside a window), ``rr_carbon_g`` (the same scenario and
    seed's always-on rr run, NaN without one), and the SLO-true bound (:mod:`eval.bound_slo`; of
    the same kind as the run's bound) ``slo_bound_carbon_g`` and ``slo_below`` (a complete run
    below it: not an error, it exceeded some datacenter's p99 capacity). ``allowance=False``: a
    diagnostic, not a bound: every window arrival must be done in the window (``backlog_end`` 0),
    the steady-state reading in which the work a run carries out of its window equals the work it
    carried in (which the run's window carbon includes and the bound does not credit). With the
    allowance, what the group's runs left at the window's end where recorded
    (:func:`eval.runner.largest_window_left`: the unplaced whole, the placed by their work not
    computed)."""
    import os

    import pandas as pd

    from eval.runner import largest_backlog_ages, largest_window_left

    runs = pd.read_csv(os.path.join(matrix_dir, "runs.csv"))
    specs = matrix_specs(matrix_dir)
    label = {rid: (sp.scenario_label or sp.scenario_name, sp.label or sp.policy, int(sp.seed)) for rid, sp in specs.items()}
    by_key = {v: rid for rid, v in label.items()}
    rows, bounds = [], {}
    group_rr: dict[tuple[str, int], float] = {}  # the always-on rr run of each (scenario, seed)
    rids = []
    for r in runs.itertuples(index=False):
        rid = by_key.get((str(r.scenario), str(r.policy), int(r.seed)))
        if rid is None:
            raise KeyError(f"{matrix_dir}: run {r.scenario} / {r.policy} / seed {r.seed} is not in config.json")
        rids.append(rid)
    deciding = pd.Series([str(dict(specs[rid].overrides).get("capacity.control", "always_on")) != "always_on" for rid in rids],
                         index=runs.index)
    for r, rid, cap in zip(runs.itertuples(index=False), rids, deciding):
        if specs[rid].policy == "rr" and not cap:
            group_rr[(str(r.scenario), int(r.seed))] = float(r.carbon_g)
    for r, rid, cap in zip(runs.itertuples(index=False), rids, deciding):
        sp = specs[rid]
        group = runs[(runs["scenario"] == r.scenario) & (runs["seed"] == r.seed)]
        # the allowance of an always-on run: what that start's always-on runs left (not a
        # capacity-deciding run's backlog, which its own bound takes); of a deciding run: its own
        group = group[group["policy"] == r.policy] if cap else group[~deciding.loc[group.index]]
        backlog = largest_backlog_end(group) if allowance else 0
        ages = largest_backlog_ages(group) if allowance else None
        left = largest_window_left(group) if allowance else None
        key = (str(r.scenario), int(r.seed), cap, backlog, tuple(sorted(ages.items())) if ages else None,
               tuple(sorted(left.items())) if left else None)
        if key not in bounds:
            bounds[key] = bound_for_spec(sp, backlog_end=backlog, backlog_ages=ages, window_left=left)
        b = bounds[key]
        in_window = "window_s" in runs and pd.notna(getattr(r, "window_s", float("nan")))
        complete = in_window or float(getattr(r, "unfinished_pct", 0.0) or 0.0) <= 0.0
        limit = b.carbon_g if complete else b.floor_g
        rr = group_rr.get((str(r.scenario), int(r.seed)), float("nan"))
        rows.append({"scenario": r.scenario, "policy": r.policy, "seed": int(r.seed), "capacity": cap, "carbon_g": float(r.carbon_g),
                     "bound_carbon_g": b.carbon_g, "bound_floor_g": b.floor_g, "below": bool(float(r.carbon_g) < limit - 1e-9),
                     "rr_carbon_g": rr, "slo_bound_carbon_g": b.slo_carbon_g,
                     "slo_below": bool(complete and float(r.carbon_g) < b.slo_carbon_g - 1e-9)})
    return pd.DataFrame(rows)


def main(argv: Any = None) -> int:
    """``python -m eval.bound MATRIX_DIR ...``: check every run of each finished matrix against its
    bound (:func:`check_matrix`); writes ``bound_check.csv`` there, prints a summary per policy
    (with an always-on rr run in the matrix: the bound's and the SLO-true bound's reduction vs rr,
    %, and the run's share of each) and the runs below the SLO-true bound (reported, not an
    error); exit status 1 if any run is below its (physical) bound."""
    import argparse
    import os

    ap = argparse.ArgumentParser(prog="python -m eval.bound", description=main.__doc__)
    ap.add_argument("matrices", nargs="+", help="matrix directories (config.json + runs.csv), e.g. results/tradeoff-capacity/tradeoff")
    ap.add_argument("--no-window-end-allowance", action="store_true", help="diagnostic, not a bound: every window "
                    "arrival done in the window (check_matrix's allowance=False); writes nothing")
    args = ap.parse_args(argv)
    bad = 0
    for d in args.matrices:
        t = check_matrix(d, allowance=not args.no_window_end_allowance)
        if args.no_window_end_allowance:
            print(f"{d}: WITHOUT the window-end allowance (a diagnostic, not a bound)")
        else:
            t.to_csv(os.path.join(d, "bound_check.csv"), index=False)
        rr = t["rr_carbon_g"]
        t = t.assign(run_red=100.0 * (rr - t["carbon_g"]) / rr, bound_red=100.0 * (rr - t["bound_carbon_g"]) / rr,
                     slo_red=100.0 * (rr - t["slo_bound_carbon_g"]) / rr)
        t = t.assign(share=100.0 * t["run_red"] / t["bound_red"], slo_share=100.0 * t["run_red"] / t["slo_red"])
        print(f"{d}: {len(t)} runs, {int(t['below'].sum())} below their bound, {int(t['slo_below'].sum())} below their SLO-true bound")
        gap = 100.0 * (t["carbon_g"] - t["slo_bound_carbon_g"]) / rr
        for (scen, pol, cap), x in t.groupby(["scenario", "policy", "capacity"], sort=False):
            print(f"  {scen} {pol}{' (capacity bound)' if cap else ''}: bound {x['bound_carbon_g'].mean():.1f} g, "
                  f"SLO-true bound {x['slo_bound_carbon_g'].mean():.1f} g, run {x['carbon_g'].mean():.1f} g, "
                  f"{int(x['below'].sum())} below, {int(x['slo_below'].sum())} below the SLO-true bound"
                  + (f"; vs rr %: run {x['run_red'].mean():.1f}, bound {x['bound_red'].mean():.1f}, SLO-true bound "
                     f"{x['slo_red'].mean():.1f}; share of the bound's {x['share'].mean():.0f}%, of the SLO-true bound's "
                     f"{x['slo_share'].mean():.0f}%; above the SLO-true bound {gap[x.index].mean():.2f} pp"
                     if x["rr_carbon_g"].notna().all() else ""))
        slo_bad = t[t["slo_below"]]
        if len(slo_bad):
            print("  below the SLO-true bound (not an error: each exceeded some datacenter's p99 capacity): "
                  + ", ".join(f"{r.scenario} / {r.policy} / seed {r.seed}" for r in slo_bad.itertuples(index=False)))
        bad += 0 if args.no_window_end_allowance else int(t["below"].sum())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
