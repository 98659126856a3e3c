r"""The SLO-true carbon bound (issue 40, item 4): the lower bound of :mod:`eval.bound` with every
datacenter held to its measured SLO operating point: the load it serves within the MLPerf p99
targets, at the energy per request it then spends.

**The operating point** (:func:`slo_operating_point`, measured with the simulator for the
scenario being bounded: :func:`carbon_gym.capacity.measure_datacenter_capacity`). One datacenter
of ``E_d`` engines (its GPUs / tp, its GPU type), the scenario's engine settings, dispatcher,
request lengths and SLO, is offered Poisson arrivals placed every polling period of the scenario
(the wait counts in TTFT; no network delay, the least restrictive case); bisection over the
per-engine rate finds ``c_d``, the highest rate at which p99 TTFT and p99 TPOT stay within the
targets (300 s probes, 60 s warm-up, seeds 0-1, 2% width: :data:`PROBE`). Each probe also
measures the GPU energy above idle per request; it falls as the rate rises (bigger batches), and
``e_d`` is the least of it over the probes within p99 (in practice the one nearest ``c_d``).

Why measured per datacenter and polling period: the engine figure of the load-level file (one
engine, every request at its arrival) is NOT the least restrictive capacity. With 0.1 s polling
a 32-engine datacenter behind its least-work dispatcher serves about 6.2 requests/s per engine
within p99 on Llama-3.1-8B (the engine figure: 5.19), since the dispatcher hands each engine a
smoother stream than Poisson; with 1 s polling it serves about 3.9. And the physical bound's
energy (every engine-second at the most efficient batch, ``max_num_batched_tokens`` tokens per
iteration) is 1.6-1.7x below what a request costs at ``c_d`` (bigger batches miss p99 TPOT).

**The program.** Datacenter ``d`` may be offered at most ``C_d = E_d x c_d`` requests/s of the
episode's request mix: in every window of the program (the carbon trace's hours), the work
(engine-seconds at the most efficient batch) of the requests *arriving* in the window that are
routed to ``d`` is at most ``C_d x`` the window's length (s) x the mix's mean request's (a cap
on the count instead would let the program send the largest requests to the cleanest
datacenters and the smallest elsewhere, more work per second than any datacenter does within
p99; the whole-episode program splits each window's work in proportion, where the two agree).
Every active engine-second at ``d`` costs the physical bound's ``tp (P_lo - P_idle)`` times
``d``'s energy factor ``max(1, e_d / ideal_d)`` (:func:`energy_factor`; ``ideal_d``: the
physical bound's mean active energy per request at ``d``, the same request mix), so a request
routed to ``d`` costs on average what it costs at ``d``'s operating point. Energy per request
falls with the per-engine rate, so no rate within ``c_d`` (nor any mix of such rates over time)
does a request for less.

**The window's end.** Of the requests arriving in a measurement window, all but ``backlog_end``
(the most any run compared with the figure left in flight or pending at its end) must be done in
it; without more knowledge the program may leave the largest that many undone. A windowed run
also records how many of those it left may have arrived more than e seconds before the end
(``backlog_end_age_gt_<e>s``, e = 1 ... 320 s): the program then bins request sizes within the age
segments between those instants and leaves at most that many older than each e undone, so the
allowance can no longer drop large requests that arrived long before the end (the requests in
flight are mostly recent ones). Still a bound: every run it is compared with left no more than
that undone in each age range. Most of what is in flight at the end has computed most of its
work (its prompt, in the bound's unit the larger part), so a windowed run also records what it
had not computed yet (``left_*``, :meth:`carbon_gym.sim.Simulator.work_left`, an upper count:
the iteration in progress as not done) and how many requests it had not placed
(``requests_unplaced``); with those (the largest of each over the runs compared) only the
unplaced may be left undone whole, and of the placed work the program may leave at most the
uncomputed engine-seconds undone (:func:`eval.bound.left_engine_s`), in any bin and datacenter,
the work a request routed to ``d`` brings still counting against ``d``'s capacity. Still a
bound: every window arrival the run placed had every position computed in the window but those
counted as left. The work a run carried into its window and finished in it, which its window
carbon includes, is not credited: it is mostly decode tails, 0.2-0.6% of the window's work in
the bound's unit on mixtral8x7b-high, and crediting it moved the gap by 0.003 pp (RESULTS.md;
``python -m eval.window_end`` measures both ends from a run's request records).

**Capacity control.** An engine serves at most ``c_d`` requests/s of the mix within p99, so the
awake engine-seconds at ``d`` are at least the requests it serves over ``c_d`` (in work: its work
over ``c_d`` x the mean request's; as well as its active engine-seconds); each awake
engine-second pays at least its GPUs' idle power above the floor's (sleep power, or 0 W for a
server that is off) and, when servers may be powered off, its share of a powered server's host
power (``(host_w - least) / engines per server``).

**What it bounds, honestly.** It is a lower bound on the carbon of any policy that keeps every
datacenter's offered load (and, under capacity control, every awake engine's) within the
measured p99 capacity in every window, with request streams like the probe's (Poisson, placed
every polling period) and requests whose mix at each datacenter is the episode's (the energy
factor is a mean: a policy that sends every large request to the cleanest datacenter is charged
the mean factor on them). It is *not* a bound on every policy that passes p99 over
the run: a policy may burst above a datacenter's capacity for a while (a queue builds, a few
percent of the requests are late) and still pass p99 over the whole run, and such a run can emit
less than this figure. A run below it is therefore not an accounting error (unlike a run below
the physical bound of :mod:`eval.bound`) but a sign that it exceeded the SLO capacity somewhere;
the tables count and name such runs. The capacity is a Poisson average measured on long probes:
over a short window a policy within it on average can still see more arrivals than ``C_d x``
the window by chance (a few standard deviations of ``sqrt(C_d x window)``), another reason to
read it as the bound of capacity-respecting policies rather than of every SLO-passing run.
Under capacity control the probe's datacenter had all its engines awake; fewer awake engines
pool less, so their per-engine capacity can only be lower (a looser bound, not an invalid one).
The figure is never below the physical bound (same program, more constraints; the larger of the
two is kept against round-off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SloResult", "SloPoint", "measured_capacity", "slo_operating_point", "energy_factor", "slo_window_bound", "NOT_COMPUTED"]

#: ``slo_status`` of a bound computed without the SLO-true figure.
NOT_COMPUTED = "not computed"

#: Quantile bins of request sizes per window in the measurement-window program (more: tighter,
#: larger LP). Within a bin the program may split a bin's engine-seconds between datacenters
#: anywhere between its smallest and largest request, a relaxation of the requests themselves.
_BINS = 32

#: Probe settings of the measured operating point (:func:`slo_operating_point`): simulated seconds
#: of arrivals per probe, seconds not counted, seeds pooled, relative width of the bisection.
PROBE = {"duration_s": 300.0, "warmup_s": 60.0, "seeds": (0, 1), "rel_tol": 0.02}


@dataclass
class SloResult:
    """The SLO-true part of a bound.

    Attributes:
        active_g: least active (and, under capacity control, awake) grams above the floor.
        status: HiGHS's model status (``Optimal``) or why there is no figure (NaN ``active_g``).
        placed: requests placed at each datacenter in the optimum (the program's fluid figure).
        capacity_per_s: ``C_d``, requests/s each datacenter serves within p99.
    """

    active_g: float
    status: str
    placed: list[float]
    capacity_per_s: list[float]


@dataclass(frozen=True)
class SloPoint:
    """Each datacenter's SLO operating point (module docstring), in topology order.

    Attributes:
        capacity_per_engine_per_s: ``c_d``, the highest per-engine rate (requests/s) its
            datacenter serves within p99 TTFT and p99 TPOT.
        active_j_per_request: ``e_d``, the least GPU energy above idle per request (J, IT level)
            at a rate within p99; NaN where not measured (the energy factor is then 1).
        basis: how the figures were obtained (for the tables).
    """

    capacity_per_engine_per_s: tuple[float, ...]
    active_j_per_request: tuple[float, ...]
    basis: str = "given"


#: Measured operating points by probe key (:func:`slo_operating_point`): a datacenter probe takes
#: seconds, and every start of a matrix shares its scenario's (model, GPU, engines, period).
_MEASURED: dict[str, Any] = {}


def _probe_key(scenario: Any, gpu: str, n_engines: int) -> str:
    w = scenario.workload
    return repr((scenario.model, gpu, scenario.gpu_files, scenario.tp, int(n_engines), float(scenario.polling_period_s),
                 scenario.slo, scenario.engine, w.lengths, w.prompt_tokens, w.output_tokens, w.max_context_tokens,
                 w.cap_policy, w.sessions, w.block_s, sorted(PROBE.items())))


def measured_capacity(scenario: Any, gpu: str, n_engines: int, log: Any = None) -> Any:
    """The SLO probe (:func:`carbon_gym.capacity.measure_datacenter_capacity`, :data:`PROBE`
    settings) of one datacenter of ``n_engines`` engines of ``gpu`` under ``scenario``'s engine
    settings, lengths, SLO and polling period, no network; cached per process."""
    import dataclasses

    from carbon_gym.capacity import measure_datacenter_capacity

    key = _probe_key(scenario, gpu, n_engines)
    if key not in _MEASURED:
        sc = scenario if gpu == scenario.gpu else dataclasses.replace(scenario, gpu=gpu)
        _MEASURED[key] = measure_datacenter_capacity(
            sc, n_engines=int(n_engines), polling_period_s=float(scenario.polling_period_s), duration_s=PROBE["duration_s"],
            warmup_s=PROBE["warmup_s"], seeds=tuple(PROBE["seeds"]), rel_tol=PROBE["rel_tol"], log=log)
    return _MEASURED[key]


def slo_operating_point(scenario: Any, parts: Any, log: Any = None) -> SloPoint:
    """Measure each datacenter's SLO operating point with the simulator
    (:func:`carbon_gym.capacity.measure_datacenter_capacity`): one datacenter of its engines
    (GPUs / tp) and GPU, the scenario's engine settings, dispatcher, lengths and SLO, Poisson
    arrivals placed every ``polling_period_s`` of the scenario, no network delay (:data:`PROBE`
    settings). Datacenters of the same (GPU, engines) share one measurement (cached per process)."""
    topo = parts.topology
    tp = int(parts.engine.tp)
    caps, joules = [], []
    for d, dc in enumerate(topo.datacenters):
        gpu = str(topo.datacenter_gpu(d))
        n = max(1, dc.engines(tp))
        res = measured_capacity(scenario, gpu, n, log=log)
        caps.append(float(res.per_engine_rate_per_s))
        joules.append(float(res.active_j_per_request))
    basis = (f"measured: one datacenter of its engines, requests placed every {float(scenario.polling_period_s):g} s, "
             "its dispatcher, no network")
    return SloPoint(tuple(caps), tuple(joules), basis)


def energy_factor(point: SloPoint, ideal_j_per_request: np.ndarray) -> np.ndarray:
    """Per datacenter, ``max(1, e_d / ideal_d)``: how much more active energy a request takes at
    the datacenter's SLO operating point than at the physical bound's most efficient batch
    (``ideal_j_per_request``: the bound's mean active energy per request there, J, IT level,
    from the same request mix); 1 where ``e_d`` is not measured."""
    e = np.asarray(point.active_j_per_request, dtype=np.float64)
    ideal = np.asarray(ideal_j_per_request, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(np.isfinite(e) & (ideal > 0.0), e / ideal, 1.0)
    return np.maximum(1.0, r)


def _lowest_from(ci: np.ndarray) -> np.ndarray:
    """``out[h, d] = min(ci[h:, d])``: the lowest intensity at or after window ``h`` (work is done
    no earlier than it arrives)."""
    return np.minimum.accumulate(ci[::-1], axis=0)[::-1]


def slo_window_bound(scenario: Any, parts: Any, zones: np.ndarray, arrival: np.ndarray, secs: dict[str, np.ndarray],  # noqa: C901
                     least_node_w: dict[str, float], wins: list[tuple[float, float]], backlog_end: int, *,
                     capacity: bool, point: SloPoint | None = None, backlog_ages: dict[float, float] | None = None,
                     left_s: dict[str, float] | None = None) -> SloResult:
    """The SLO-true active grams of a measurement window (``env.measure = "window"``; the
    physical version is :func:`eval.bound._window_bound`). Of the requests arriving in the window
    all but ``backlog_end`` are done entirely in it (``backlog_ages``: {e: n}, at most n of those
    left undone arrived more than e seconds before the window's end, the runs'
    ``backlog_end_age_gt_<e>s``: the allowance then cannot leave the largest old requests undone;
    ``left_s``: {gpu: engine-seconds}, at most that much of the work of the requests placed was
    not computed by the window's end (:func:`eval.bound.left_engine_s`; ``backlog_end`` then
    counts only the requests not yet placed): the program may leave that much of the placed work
    undone, ``z[b, d]`` in any bin, the whole of it a convex combination over the GPU types);
    request sizes (engine-seconds at the most
    efficient batch, per GPU type: ``secs[gpu]``, one per request arriving in the window, from
    :func:`eval.bound._engine_seconds`) are binned by quantile per
    arrival window; an LP places each bin's requests (counts and engine-seconds, between the bin's
    smallest and largest request each) on the datacenters, the work (engine-seconds) arriving in
    window ``h`` at ``d`` at most ``C_d x len_h`` times the window's mean request's, the
    engine-seconds at ``d`` at most its engines x the window,
    each engine-second at ``d``'s PUE and lowest intensity at or after its arrival window.

    Always on (``capacity`` False): an engine-second costs ``tp (P_lo - P_idle)`` (the floor has
    every GPU at idle) times ``d``'s energy factor at its operating point (:func:`energy_factor`;
    ``point``: measured by :func:`slo_operating_point` when None). Capacity control: the same per
    active engine-second plus, per awake engine-second, ``tp P_idle`` and the engine's share of its
    server's host power above the least power (the floor has every server at its least power);
    awake engine-seconds at ``d`` are at least its active ones and its work / (``c_d`` x the mean
    request's), at most its engines x the window.
    ``least_node_w[gpu]``: a server's least power in any capacity state (W). ``arrival``: the
    arrival instants (s) of the requests arriving in the window. Grams are ``W x g/kWh x s / 3.6e6``."""
    import highspy

    from solvers._highs import new_highs

    eng, trace, off = parts.engine, parts.carbon, parts.carbon_offset_s
    dcs = list(parts.topology.datacenters)
    n_d = len(dcs)
    gpu_of = [parts.topology.datacenter_gpu(d) for d in range(n_d)]
    models = dict(zip(gpu_of, parts.datacenter_gpus()))
    types = list(models)
    tp = int(eng.tp)
    point = point if point is not None else slo_operating_point(scenario, parts)
    c_eng = np.asarray(point.capacity_per_engine_per_s, dtype=np.float64)
    engines = np.array([float(dc.gpus) / tp for dc in dcs])
    cap_rate = c_eng * engines
    w0 = wins[0][0]
    length = wins[-1][1] - w0
    lens = np.array([b - a for a, b in wins])
    t = np.asarray(arrival, dtype=np.float64)
    if t.size == 0:
        return SloResult(0.0, "no requests", [0.0] * n_d, cap_rate.tolist())
    h_of = np.clip(np.searchsorted(np.array([a for a, _ in wins]), t, side="right") - 1, 0, len(wins) - 1)
    ci = np.array([np.minimum(trace.intensity_all(off + a), trace.intensity_all(off + b - 1e-9))[zones] for a, b in wins])
    ci_from = _lowest_from(ci)                                    # (window, datacenter), g/kWh
    pue = np.array([float(dc.pue) for dc in dcs])
    idle = np.array([float(models[g].power.idle_w) for g in gpu_of])
    p_lo = np.array([min(float(models[g].power.decode_min_w), float(models[g].power.prefill_w)) for g in gpu_of])
    # per active engine-second above idle, at the datacenter's SLO operating point (energy_factor)
    mean_s = np.array([float(np.mean(secs[g])) for g in gpu_of])  # the mix's mean engine-seconds per request at d
    ideal_j = mean_s * tp * (p_lo - idle)
    active_w = pue * tp * (p_lo - idle) * energy_factor(point, ideal_j)
    if capacity:
        epn = np.array([max(1.0, float(dc.gpus_per_node) / tp) for dc in dcs])
        host = np.array([(float(models[g].power.host_w) - float(least_node_w[g])) / epn[d] for d, g in enumerate(gpu_of)])
        awake_w = pue * (tp * idle + host)                        # per awake engine-second, above the least power
    # ---- bins: per arrival window, quantiles of the (smallest over the types) request size
    ref = np.min(np.stack([secs[g] for g in types]), axis=0)
    # (with backlog_ages) arrival segments between the instants age e before the window's end, so
    # that no bin mixes requests on both sides of one
    ages = sorted((float(e), float(n)) for e, n in (backlog_ages or {}).items() if np.isfinite(n))
    cuts = np.array(sorted(wins[-1][1] - e for e, _ in ages))
    seg = np.searchsorted(cuts, t, side="right") if cuts.size else np.zeros(t.size, dtype=np.int64)
    bins: list[tuple[int, np.ndarray]] = []                       # (window, request indices)
    bin_seg: list[int] = []
    for h in range(len(wins)):
        for j in range(cuts.size + 1):
            idx = np.flatnonzero((h_of == h) & (seg == j))
            if idx.size:
                idx = idx[np.argsort(ref[idx], kind="stable")]
                parts_ = [part for part in np.array_split(idx, min(_BINS, idx.size)) if part.size]
                bins.extend((h, part) for part in parts_)
                bin_seg.extend([j] * len(parts_))
    n_b = len(bins)
    single = len(types) == 1
    # ---- columns: x[b, d] requests, s[b, d] engine-seconds, y[b] dropped requests, ys[b] their
    # engine-seconds (one GPU type), u[d] awake engine-seconds (capacity control)
    col_x, col_s = 0, n_b * n_d
    col_y = 2 * n_b * n_d
    col_ys = col_y + n_b
    col_u = col_ys + (n_b if single else 0)
    col_z = col_u + (n_d if capacity else 0)                      # z[b, d]: placed work left uncomputed (left_s)
    n_cols = col_z + (n_b * n_d if left_s is not None else 0)
    cost = np.zeros(n_cols)
    hi = np.full(n_cols, np.inf)
    rows: list[tuple[list[tuple[int, float]], float, float]] = []

    def placed(b: int, d: int) -> list[tuple[int, float]]:  # the work placed at d of bin b: s (+ z)
        return [(col_s + b * n_d + d, 1.0)] + ([(col_z + b * n_d + d, 1.0)] if left_s is not None else [])

    for b, (h, idx) in enumerate(bins):
        rows.append(([(col_x + b * n_d + d, 1.0) for d in range(n_d)] + [(col_y + b, 1.0)], float(idx.size), float(idx.size)))
        for d in range(n_d):
            sd = secs[gpu_of[d]][idx]
            xs, ss = col_x + b * n_d + d, col_s + b * n_d + d
            cost[ss] = active_w[d] * ci_from[h, d]
            rows.append((placed(b, d) + [(xs, -float(sd.min()))], 0.0, np.inf))   # s (+ z) >= x x smallest
            rows.append((placed(b, d) + [(xs, -float(sd.max()))], -np.inf, 0.0))  # s (+ z) <= x x largest
        if single:
            s0 = secs[types[0]][idx]
            rows.append(([e for d in range(n_d) for e in placed(b, d)] + [(col_ys + b, 1.0)], float(s0.sum()), float(s0.sum())))
            rows.append(([(col_ys + b, 1.0), (col_y + b, -float(s0.min()))], 0.0, np.inf))
            rows.append(([(col_ys + b, 1.0), (col_y + b, -float(s0.max()))], -np.inf, 0.0))
    rows.append(([(col_y + b, 1.0) for b in range(n_b)], 0.0, float(max(0, backlog_end))))  # the backlog left undone
    for k, (_e, n_old) in enumerate(sorted(ages, reverse=True)):  # cuts[k] = end - _e: at most n_old undone before it
        old = [(col_y + b, 1.0) for b in range(n_b) if bin_seg[b] <= k]
        if old:
            rows.append((old, 0.0, float(max(0.0, n_old))))
    # the capacity in work: a datacenter at its operating point serves C_d requests/s of the
    # episode's mix, i.e. C_d x (the mix's mean engine-seconds) engine-seconds of work per second
    # (a count would let the program send the largest requests to the cleanest datacenters and
    # the smallest elsewhere, more work per second than any datacenter does within p99)
    for h in range(len(wins)):                                    # work arriving at d in window h <= C_d x len_h x mean
        bs = [b for b, (hb, _) in enumerate(bins) if hb == h]
        for d in range(n_d):
            if bs:
                rows.append(([e for b in bs for e in placed(b, d)], -np.inf, float(cap_rate[d] * lens[h] * mean_s[d])))
    for d in range(n_d):
        s_cols = [(col_s + b * n_d + d, 1.0) for b in range(n_b)]
        if capacity:                                              # awake >= active, >= work / (c_d x mean)
            u = col_u + d
            cost[u] = awake_w[d] * float(ci.min(axis=0)[d])
            hi[u] = engines[d] * length
            rows.append(([(u, 1.0)] + [(j, -1.0) for j, _ in s_cols], 0.0, np.inf))
            rows.append(([(u, 1.0)] + [(j, -1.0 / (c_eng[d] * mean_s[d])) for j, _ in s_cols], 0.0, np.inf))
        else:                                                     # active engine-seconds <= engines x window
            rows.append((s_cols, -np.inf, float(engines[d] * length)))
    if left_s is not None:  # sum over (b, d) of z / left_s[d's type] <= 1
        zs = [(col_z + b * n_d + d, 1.0 / left_s[gpu_of[d]]) for b in range(n_b) for d in range(n_d) if left_s[gpu_of[d]] > 0.0]
        hi[col_z:col_z + n_b * n_d] = [np.inf if left_s[gpu_of[d]] > 0.0 else 0.0 for b in range(n_b) for d in range(n_d)]
        if zs:
            rows.append((zs, 0.0, 1.0))
    starts, idx_, vals = [0], [], []
    for ent, _, _ in rows:
        for j, v in ent:
            idx_.append(j)
            vals.append(v)
        starts.append(len(idx_))
    h_ = new_highs(1)
    h_.passModel(n_cols, len(rows), len(vals), int(highspy.MatrixFormat.kRowwise), int(highspy.ObjSense.kMinimize), 0.0,
                 cost, np.zeros(n_cols), hi, np.array([r[1] for r in rows]), np.array([r[2] for r in rows]),
                 np.array(starts, dtype=np.int32), np.array(idx_, dtype=np.int32), np.array(vals), np.zeros(n_cols, dtype=np.int32))
    h_.run()
    status = h_.modelStatusToString(h_.getModelStatus())
    if h_.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        why = " (arrivals above the datacenters' SLO capacity)" if h_.getModelStatus() == highspy.HighsModelStatus.kInfeasible else ""
        return SloResult(float("nan"), status + why, [float("nan")] * n_d, cap_rate.tolist())
    x = np.asarray(h_.getSolution().col_value)[col_x:col_s].reshape(n_b, n_d)
    active = max(0.0, float(h_.getInfo().objective_function_value)) / 3.6e6 * (1.0 - 1e-7)
    return SloResult(active, status, x.sum(axis=0).tolist(), cap_rate.tolist())


def episode_slo_rows(f_cols: list[tuple[int, int, int]], n_arr: np.ndarray, lens: np.ndarray, c_eng: np.ndarray,
                     engines: np.ndarray, u_col: Any = None) -> list[tuple[list[tuple[int, float]], float, float]]:
    """The SLO rows of the whole-episode fluid program (:func:`eval.bound.carbon_lower_bound`):
    per arrival window ``a`` and datacenter ``d``, ``sum_h f[a, h, d] n_a <= C_d len_a``
    (``n_a`` requests arrive in window ``a``, ``len_a`` its seconds, ``C_d = c_d x engines``);
    with capacity states (``u_col(h, d)``: the awake engine-seconds' column), ``U[h, d] >= sum_a
    f[a, h, d] n_a / c_d``. Rows as ``(entries, low, high)``."""
    by_ad: dict[tuple[int, int], list[tuple[int, float]]] = {}
    by_hd: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for j, (a, h, d) in enumerate(f_cols):
        by_ad.setdefault((a, d), []).append((j, float(n_arr[a])))
        by_hd.setdefault((h, d), []).append((j, -float(n_arr[a]) / float(c_eng[d])))
    rows = [(ent, -np.inf, float(c_eng[d] * engines[d] * lens[a])) for (a, d), ent in by_ad.items()]
    if u_col is not None:
        rows.extend(([(int(u_col(h, d)), 1.0)] + ent, 0.0, np.inf) for (h, d), ent in by_hd.items())
    return rows


# ---------------------------------------------------------------------------------------------
# tables: runs against the SLO-true bound (columns of eval.bound.bounds_table / with_bounds)

#: The SLO-true bound's column in a bounds table (grams CO2eq per (scenario, seed)).
SLO_COLUMN = "slo_bound_carbon_g"


def has_slo(runs: Any) -> bool:
    """Whether a runs or bounds table carries the SLO-true bound (tables written before it don't)."""
    return runs is not None and SLO_COLUMN in runs and bool(runs[SLO_COLUMN].notna().any())


def runs_below_slo_bound(runs: Any) -> Any:
    """The runs of a :func:`eval.bound.with_bounds` table whose carbon is below their episode's
    SLO-true bound: runs that completed their work (or measured in a window, whose bound allows
    for the backlog), carbon < ``slo_bound_carbon_g``. Not an accounting error (unlike a run below
    the physical bound): such a run offered some datacenter more than its engines' measured p99
    capacity somewhere (module docstring). Empty without the column."""
    if not has_slo(runs):
        return runs.iloc[0:0]
    complete = runs["unfinished_pct"].fillna(0.0) <= 0.0 if "unfinished_pct" in runs else np.ones(len(runs), dtype=bool)
    if "window_s" in runs:
        complete = complete | runs["window_s"].notna()
    lim = runs[SLO_COLUMN].to_numpy(float)
    below = complete & ~np.isnan(lim) & (runs["carbon_g"].to_numpy(float) < lim - 1e-9)
    return runs[np.asarray(below, dtype=bool)]


def below_slo_note(runs: Any) -> str:
    """One sentence: how many runs of a :func:`eval.bound.with_bounds` table are below the
    SLO-true bound and which (``scenario / policy / seed``), or "" without the column."""
    if not has_slo(runs):
        return ""
    below = runs_below_slo_bound(runs)
    if below.empty:
        return "No run is below its SLO-true bound."
    names = ", ".join(f"{r.scenario} / {r.policy} / seed {int(r.seed)}" for r in below.itertuples(index=False))
    return (f"{len(below)} run(s) below the SLO-true bound (not an error: each offered some datacenter more than its engines' "
            f"measured p99 capacity somewhere, which the SLO-true bound rules out): {names}.")


def main(argv: Any = None) -> int:
    """``python -m eval.bound_slo SCENARIO [--set KEY=VALUE ...]``: each distinct datacenter's
    measured SLO operating point (:func:`slo_operating_point`): ``c_d`` (requests/s per engine),
    the load-level file's engine figure and their ratio (the share of the engine figure a
    per-step capacity cap, ``step_cap`` / ``capacity_cap``, must be to admit exactly ``c_d``),
    and ``e_d`` (J per request above idle, IT level)."""
    import argparse

    from carbon_gym.scenario import load_load_levels, load_scenario, parse_overrides
    from carbon_gym.world import build_parts

    ap = argparse.ArgumentParser(prog="python -m eval.bound_slo", description=main.__doc__)
    ap.add_argument("scenario", help="scenario name or TOML path")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="scenario override (repeatable)")
    args = ap.parse_args(argv)
    sc = load_scenario(args.scenario, parse_overrides(args.set))
    parts = build_parts(sc)
    point = slo_operating_point(sc, parts)
    levels = load_load_levels()
    seen: set[tuple[str, int]] = set()
    for d, (c, e) in enumerate(zip(point.capacity_per_engine_per_s, point.active_j_per_request)):
        gpu = str(parts.topology.datacenter_gpu(d))
        engines = max(1, parts.topology.datacenters[d].engines(parts.engine.tp))
        if (gpu, engines) in seen:
            continue
        seen.add((gpu, engines))
        m = levels.find(sc.model, gpu, sc.tp)
        eng = float("nan") if m is None else float(m.per_engine_rate_per_s)
        print(f"{sc.name}: {gpu} x {engines} engines, polling {float(sc.polling_period_s):g} s: "
              f"c_d_per_engine_per_s={c:.4g} engine_figure_per_s={eng:.4g} ratio={c / eng:.4f} e_d_j_per_request={e:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
