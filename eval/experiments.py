"""The study's experiments (a-j), the ``carbon-gym eval`` driver and the figures they share.

Each experiment is one command (``carbon-gym experiment <name>``) that runs its matrix
(:func:`eval.backends.run_matrix`) and writes, under ``results/<name>/``: the matrix outputs
(:mod:`eval.writers`: summary.csv/.md,
runs.csv, records, TensorBoard), the experiment's own table ``<name>.md``/``.csv`` and figures
(PNG + PDF).

=====  ============  ==========================================================================
 id    name          what it compares
=====  ============  ==========================================================================
 a     headline      3 models x low/moderate/high load, every policy
 b     milp-vs-ilp   facility MILP vs the per-request ILPs, per model (paired by seed)
 c     predictor     output-length predictor vs oracle lengths (MILP and state-aware ILP)
 d     polling       polling period 0.25-8 s: SLO violations and carbon
 e     tradeoff      carbon-vs-violation frontiers of the knob-driven policies, compared at equal violation
 f     bound         every policy's reduction as a share of the carbon lower bound's (eval/bound.py)
 g     diurnal       one 6 h steady-state window of llama8b-diurnal: rr, the planner, the MILP
 h     capacity      capacity control: always-on rr vs policies deciding awake engines / servers
 i     sessions      multi-turn sessions with prefix caching: affinity-blind vs sticky vs cache-aware
 j     generalise    the learned agent vs the MILP on held-out days, another year, loads, topology, faults
 k     learned-capacity  an agent deciding capacity vs the MILP and its look-ahead MPC, 20 held-out starts
=====  ============  ==========================================================================

Presets: ``quick`` (60 s episodes from an empty cluster with the drain: a smoke test for CI and
laptops, not a result) and ``full`` (steady state: a 600 s measurement window after a 300 s
burn-in, no drain, 8 starts spread over the year); ``--window-s`` / ``--warmup-s`` set any
window. The clairvoyant policy of experiment f is
:mod:`eval.clairvoyant`; RESULTS.md is written by :mod:`eval.report`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence


from carbon_gym.registry import available_policies

from eval import backends, generalise_experiment, learned_capacity_experiment, sessions_experiment, writers
from eval.figures import standard_figures
from eval.milp_vs_ilp import ILP_POLICIES, milp_vs_ilp_figure, milp_vs_ilp_tables
from eval.runner import (
    OVERRIDE_DURATION,
    OVERRIDE_POLLING,
    OVERRIDE_PREDICTOR,
    VALID_UNFINISHED_PCT,
    RunResult,
    RunSpec,
    fault_twin,
    freeze,
    make_specs,
    window_overrides,
)
from eval.tables import (
    P99_FAIL_MARK,
    REFERENCE_POLICY,
    fmt_ci,
    frame_markdown,
    invalid,
    p99_verdict,
    runs_table,
    summary_markdown,
)

MODELS = ("llama8b", "qwen7b", "mixtral8x7b")
LOADS = ("low", "moderate", "high")
#: Experiments that take ``heldout_seeds`` (``--heldout-seeds``): each scenario its own fresh held-out starts.
HELDOUT_EXPERIMENTS = ("headline", "milp-vs-ilp", "tradeoff", "predictor", "capacity")
#: The study's comparison (experiment a's default policy list).
#: (greedy and ilp are the load-blind strawmen; greedy-cap and ilp-cap the same with the capacity cap
#: earlier carbon-aware schedulers had)
STUDY_POLICIES = ("rr", "greedy", "greedy-cap", "least-loaded", "planner", "ilp", "ilp-cap", "ilp-state", "milp")


@dataclass(frozen=True)
class Preset:
    """Episode length, measurement window and default seed count (episode starts) of a run.

    Attributes:
        duration_s: simulated seconds without a window (None: the scenario's own duration).
        seeds: episode starts (seeds), spread over the carbon year (day x hour).
        polling_s: the polling sweep's periods.
        window_s, warmup_s: a steady-state measurement window (``env.measure = "window"``): the
            metrics cover ``window_s`` after a ``warmup_s`` burn-in that is simulated, not counted
            (None: no window).
        note: what the preset is for (said when it runs, and in RESULTS.md).
    """

    duration_s: float | None
    seeds: int
    polling_s: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    window_s: float | None = None
    warmup_s: float | None = None
    note: str = ""


PRESETS: dict[str, Preset] = {
    "quick": Preset(duration_s=60.0, seeds=3, note="a smoke test for CI and laptops, not a result: 60 s from an empty cluster, "
                    "the drain counted (14-21% of the carbon), 3 starts"),
    "full": Preset(duration_s=None, seeds=8, window_s=600.0, warmup_s=300.0,
                   note="steady state: 600 s measured after a 300 s burn-in (not counted), no drain, 8 starts over the year"),
}
#: Burn-in used with ``--window-s`` when ``--warmup-s`` is not given, s.
DEFAULT_WARMUP_S = 300.0


# (scenario override keys: eval.runner's OVERRIDE_*)
ORACLE = "oracle"
LATENCY_WEIGHT_KWARG = "violation_penalty_g"  # facility MILP: grams of CO2 charged per SLO violation


def preset_overrides(preset: str | None, duration_s: float | None, overrides: Mapping[str, Any] | None, *,
                     window_s: float | None = None, warmup_s: float | None = None) -> dict[str, Any]:
    """Scenario overrides of a preset (its duration, or its measurement window), then an explicit
    ``--duration-s`` (an episode without a window) or ``--window-s`` / ``--warmup-s``, then
    ``--set`` (last wins)."""
    out: dict[str, Any] = {}
    p = PRESETS[preset] if preset is not None else None
    if p is not None and p.window_s is not None:
        out.update(window_overrides(p.window_s, p.warmup_s or 0.0))
    elif p is not None and p.duration_s is not None:
        out[OVERRIDE_DURATION] = p.duration_s
    if duration_s is not None:
        out = {OVERRIDE_DURATION: float(duration_s)}
    if window_s is not None or warmup_s is not None:
        w = window_s if window_s is not None else (p.window_s if p is not None and p.window_s else None)
        if w is None:
            raise ValueError("--warmup-s needs a measurement window: --window-s, or the full preset")
        out = window_overrides(w, warmup_s if warmup_s is not None else DEFAULT_WARMUP_S)
    out.update(overrides or {})
    return out


# ----------------------------------------------------------------------------------------------
# running a matrix and writing its outputs


@dataclass
class Executed:
    """A finished matrix: results (records already on disk), the runs and summary tables."""

    results: list[RunResult]
    runs: Any
    summary: Any
    out: str
    paths: dict[str, dict[str, str]]


def execute(
    specs: Sequence[RunSpec],
    out: str,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    tensorboard: str | None = None,
    fmt: str = "parquet",
    requests: bool | Callable[[RunSpec], bool] = True,
    progress: bool = True,
    command: str | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> Executed:
    """Run ``specs`` and write the matrix outputs (:mod:`eval.writers`) under ``out``.

    ``requests``: write per-request records for every run (True), none (False), or the runs a
    callable selects (experiments keep them only where a figure needs them).
    """
    import time

    writer = writers.OutputWriter(out, requests=bool(requests), fmt=fmt)
    versions = writers.versions()  # at the start: the code that runs (git revision included)
    t0 = time.perf_counter()
    results = backends.run_matrix(specs, workers=workers, ray_address=ray_address, progress=progress, keep_requests=requests, on_result=writer)
    elapsed = time.perf_counter() - t0
    writers.report_warnings(results)
    cfg = dict(extra_config or {})
    cfg.update({
        "versions": versions,
        "elapsed_s": elapsed,
        "backend": f"ray:{ray_address}" if ray_address else "local",
        "workers": workers if workers is not None else backends.default_workers(),
        "cpu_count": os.cpu_count(),
    })
    summary = writers.write_outputs(results, out, command=command, tensorboard=tensorboard, extra_config=cfg)
    runs = runs_table(results)
    return Executed(results, runs, summary, out, writer.paths)


def with_carbon_start(specs: Sequence[RunSpec], carbon_start: bool) -> list[RunSpec]:
    return [replace(s, carbon_start=carbon_start) for s in specs]


@dataclass
class EvalResult:
    """What ``carbon-gym eval`` produced: the summary, the fault report (None when no evaluated
    scenario has faults or the fault-free twins were skipped), the twin scenarios that were
    added (fault scenario -> twin label) and the finished matrix."""

    summary: Any
    fault_report: Any
    twins: dict[str, str]
    executed: Executed


def fault_scenarios(scenarios: Sequence[str], overrides: Mapping[str, Any] | None) -> list[str]:
    """The scenarios (names or paths) that have ``[[faults]]`` once ``overrides`` are applied."""
    import warnings

    from carbon_gym.scenario import load_scenario

    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for scen in scenarios:
            if load_scenario(scen, dict(overrides or {})).faults:
                out.append(scen)
    return out


def eval_matrix(
    *,
    scenarios: Sequence[str],
    policies: Sequence[str],
    seeds: Sequence[int],
    preset: str | None = None,
    duration_s: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    out: str = "runs/eval",
    workers: int | None = None,
    ray_address: str | None = None,
    tensorboard: str | None = None,
    fmt: str = "parquet",
    requests: bool = True,
    plots: bool = True,
    progress: bool = True,
    carbon_start: bool = True,
    fault_baseline: bool = True,
    command: str | None = None,
    notes: Any = None,
    window_s: float | None = None,
    warmup_s: float | None = None,
) -> EvalResult:
    """``carbon-gym eval``: the matrix, its tables, the fault report and (optionally) figures.

    With ``fault_baseline`` (default), every scenario with ``[[faults]]`` is also run without
    them (:func:`eval.runner.fault_twin`: same policies, seeds and episode starts, labelled
    ``<scenario>+no-faults``) in the same matrix; the fault runs themselves are the matrix's own.
    The twins' runs appear in runs.csv / summary.csv like any scenario, and
    :func:`eval.writers.write_fault_report` writes fault_report.csv/.md and fault_runs.csv. A line
    saying which twins were added goes to ``notes`` (a text stream; default stderr). Figures are
    drawn for the requested scenarios only.
    """
    ov = preset_overrides(preset, duration_s, overrides, window_s=window_s, warmup_s=warmup_s)
    specs = make_specs(scenarios, policies, seeds, overrides=ov, policy_kwargs=policy_kwargs)
    specs = with_carbon_start(specs, carbon_start)
    shown = {s.scenario_name for s in specs}
    twins: dict[str, str] = {}
    if fault_baseline:
        faulty = set(fault_scenarios(list(dict.fromkeys(scenarios)), ov))
        have = {s.run_id for s in specs}
        extra = []
        for s in specs:
            if s.scenario in faulty:
                t = fault_twin(s)
                if t.run_id not in have:  # a run already in the matrix is shared, not run twice
                    have.add(t.run_id)
                    extra.append(t)
                twins[s.scenario_name] = t.scenario_name
        specs = specs + extra
        if twins:
            print(f"carbon-gym: note: fault scenario(s) {', '.join(twins)}: also running the same episodes without their faults "
                  f"({', '.join(twins.values())}; {len(extra)} more runs, same policies, seeds and episode starts) for the "
                  "fault report; --no-fault-baseline skips this", file=notes or sys.stderr)
    for old in ("fault_report.csv", "fault_report.md", "fault_runs.csv"):  # never leave a stale report next to new tables
        path = os.path.join(out, old)
        if os.path.exists(path):
            os.remove(path)
    ex = execute(specs, out, workers=workers, ray_address=ray_address, tensorboard=tensorboard, fmt=fmt, requests=requests,
                 progress=progress, command=command, extra_config={"fault_twins": twins} if twins else None)
    report = writers.write_fault_report(ex.results, out) if twins else None
    if plots:
        fig_dir = os.path.join(out, "figures")
        scens = [s for s in dict.fromkeys(ex.runs["scenario"]) if s in shown]
        say(f"writing figures to {fig_dir} (per scenario: latency CDFs, load by hour of day, carbon over time; PNG + PDF; "
            "--no-plots skips them)", notes)
        for scen in scens:
            standard_figures(ex, scen, fig_dir, tag=scen)
    return EvalResult(ex.summary, report, twins, ex)


def say(text: str, stream: Any = None) -> None:
    """One ``carbon-gym: note:`` line on stderr (or ``stream``): what a long quiet step is doing."""
    print(f"carbon-gym: note: {text}", file=stream or sys.stderr, flush=True)


def load_executed(out: str) -> Executed:
    """Rebuild an :class:`Executed` from a finished matrix on disk (runs.csv, config.json, steps/,
    requests/), e.g. to redraw its figures without re-running it."""
    import pandas as pd

    runs = pd.read_csv(os.path.join(out, "runs.csv"))
    summary = pd.read_csv(os.path.join(out, "summary.csv"))
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    spec_fields = set(RunSpec.__dataclass_fields__)
    results, paths = [], {}
    for entry, (_, row) in zip(cfg["runs"], runs.iterrows()):
        kw = {k: v for k, v in entry.items() if k in spec_fields}
        kw["overrides"] = freeze(kw.get("overrides"))
        kw["policy_kwargs"] = freeze(kw.get("policy_kwargs"))
        spec = RunSpec(**kw)
        meta = {k: v for k, v in entry.items() if k not in spec_fields}
        p: dict[str, str] = {}
        for kind in ("steps", "requests"):
            for ext in (".parquet", ".csv"):
                path = os.path.join(out, kind, spec.run_id + ext)
                if os.path.isfile(path):
                    p[kind] = path
                    break
        steps = {c: writers.read_table(p["steps"])[c].to_numpy() for c in writers.read_table(p["steps"]).columns} if "steps" in p else {}
        results.append(RunResult(spec=spec, metrics=row.to_dict(), steps=steps, requests={}, meta=meta))
        paths[spec.run_id] = p
    return Executed(results, runs, summary, out, paths)


def replot_headline(out: str) -> None:
    """Redraw the headline experiment's figures from its files."""
    from eval import plots

    ex = load_executed(out)
    fig_dir = os.path.join(out, "figures")
    pol_order = list(dict.fromkeys(ex.summary["policy"]))
    nonref = ex.summary[ex.summary["policy"] != REFERENCE_POLICY]
    plots.bars(nonref, x="scenario", hue="policy", y="reduction_vs_rr_pct", yerr="reduction_vs_rr_pct_ci95", stem=os.path.join(fig_dir, "headline_reduction"), ylabel="carbon reduction vs rr (%)", title="Carbon reduction vs round-robin (mean ± 95% CI)", hue_order=[p for p in pol_order if p != REFERENCE_POLICY])
    plots.bars(ex.summary, x="scenario", hue="policy", y="slo_violation_pct", yerr="slo_violation_pct_ci95", stem=os.path.join(fig_dir, "headline_violations"), ylabel="SLO violations (% of requests)", title="SLO violation rate (mean ± 95% CI)", hue_order=pol_order)
    scens = list(dict.fromkeys(ex.summary["scenario"]))
    focus = next((sc for sc in scens if sc.endswith("-moderate")), scens[0])
    standard_figures(ex, focus, fig_dir, tag=focus)


# ----------------------------------------------------------------------------------------------
# analysis helpers on runs tables


_fmt = fmt_ci
_md = frame_markdown


def headline_table(summary, bounds=None) -> str:
    """Reduction vs rr (%) and SLO violation (%) per scenario (rows) x policy (columns); with
    ``bounds`` (:func:`eval.bound.bound_summary`) a last column: the carbon lower bound's
    reduction vs rr (the most any policy could save), and the SLO-true bound's beside it where
    ``bounds`` has it (:mod:`eval.bound_slo`)."""
    pols = list(dict.fromkeys(summary["policy"]))
    scens = list(dict.fromkeys(summary["scenario"]))
    bsum = bounds.set_index("scenario") if bounds is not None and len(bounds) else None
    slo = bsum is not None and "slo_bound_reduction_vs_rr_pct" in bsum and bool(bsum["slo_bound_reduction_vs_rr_pct"].notna().any())
    head = ["scenario"] + pols + (["lower bound"] if bsum is not None else []) + (["SLO-true bound"] if slo else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for s in scens:
        cells = [s]
        for p in pols:
            sel = summary[(summary["scenario"] == s) & (summary["policy"] == p)]
            if sel.empty:
                cells.append("–")
                continue
            r = sel.iloc[0]
            unf = float(r.get("unfinished_pct", 0.0) or 0.0)
            extra = f"; {unf:.0f}% unfinished" if unf >= 0.5 else ""
            red = "invalid" if invalid(r) else _fmt(r["reduction_vs_rr_pct"], r.get("reduction_vs_rr_pct_ci95"))
            cells.append(f"{red} ({r['slo_violation_pct']:.1f}; p99 {p99_verdict(r)}{extra})")
        if bsum is not None:
            b = bsum.loc[s] if s in bsum.index else None
            cells.append("–" if b is None else _fmt(b["bound_reduction_vs_rr_pct"], b["bound_reduction_vs_rr_pct_ci95"])
                         + ("" if int(b["below"]) == 0 else f" ({int(b['below'])} runs below it!)"))
        if slo:
            b = bsum.loc[s] if s in bsum.index else None
            cells.append("–" if b is None else _fmt(b["slo_bound_reduction_vs_rr_pct"], b["slo_bound_reduction_vs_rr_pct_ci95"])
                         + ("" if int(b["below_slo"]) == 0 else f" ({int(b['below_slo'])} runs below it)"))
        lines.append("| " + " | ".join(cells) + " |")
    return ("Carbon reduction vs round-robin, % (mean ± 95% CI over seeds); in parentheses the SLO violation % of "
            f"completed requests (per request), the MLPerf p99 verdict (seeds whose p99 TTFT and p99 TPOT are within the "
            f"scenario's targets; {P99_FAIL_MARK} = fails in some seed, with the percentile that failed) and, where >= 0.5%, "
            "the share of requests left unfinished (when the drain limit ended the episode; with a measurement window, the "
            "backlog's growth over it, in % of the window's arrivals). A run leaving more than "
            f"{VALID_UNFINISHED_PCT:g}% unfinished is invalid (that work's energy was never spent, which would flatter the "
            "policy): its reduction is not shown." + (" The last column is the carbon lower bound's reduction (eval/bound.py: "
            "no run can emit less; every run of the table was checked against it)." if bsum is not None else "")
            + (" The SLO-true bound (eval/bound_slo.py) also holds each datacenter to its engines' measured p99 capacity: "
               "it bounds only policies that stay within that capacity (a run below it exceeded it somewhere)." if slo else "")
            + "\n\n" + "\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------------------
# experiment definitions


def _scenarios(models: Sequence[str] | None, loads: Sequence[str] | None, default_loads: Sequence[str]) -> list[str]:
    return [f"{m}-{ld}" for m in (models or MODELS) for ld in (loads or default_loads)]


def _variant_specs(
    base_scenarios: Sequence[str],
    policies: Sequence[str],
    seeds: Sequence[int],
    variants: Sequence[tuple[str, Mapping[str, Any]]],
    overrides: Mapping[str, Any],
    policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[RunSpec]:
    """Specs for scenario variants (label suffix, extra overrides), rr included in every variant;
    variants of one scenario share episode starts (``start_key``). Policies as for
    :func:`eval.runner.make_specs` (``NAME=POLICY`` and ``learned:<path>`` labels, their keyword arguments)."""
    from dataclasses import replace

    pols = [REFERENCE_POLICY] + [p for p in policies if p != REFERENCE_POLICY]
    specs = []
    for scen in base_scenarios:
        for suffix, extra in variants:
            ov = dict(overrides)
            ov.update(extra)
            specs.extend(replace(s, scenario_label=f"{scen}[{suffix}]" if suffix else "", start_key=scen)
                         for s in make_specs([scen], pols, seeds, overrides=ov, policy_kwargs=policy_kwargs))
    return specs


def headline_files(out: str, specs: Sequence[RunSpec], runs: Any, summary: Any) -> tuple[str, list[str]]:
    """The headline's tables in ``out`` from its runs and summary: ``bounds.csv`` and
    ``bound_summary.csv`` (the bounds of the episodes of the rr runs among ``specs``; none
    without) and ``headline.md``. Returns (the table, the files written): what
    :func:`exp_headline` writes after its runs, and ``python -m eval.retable`` from the files."""
    from eval.bound import bound_summary, bounds_table, with_bounds

    os.makedirs(out, exist_ok=True)
    rr = [sp for sp in specs if sp.policy == REFERENCE_POLICY]
    bounds = bounds_table(rr, runs=runs) if rr else None
    bsum = None
    written = []
    if bounds is not None and not bounds.empty:
        written = [os.path.join(out, "bounds.csv"), os.path.join(out, "bound_summary.csv")]
        bounds.to_csv(written[0], index=False)
        bsum = bound_summary(with_bounds(runs, bounds))
        bsum.to_csv(written[1], index=False)
    table = headline_table(summary, bsum)
    with open(os.path.join(out, "headline.md"), "w", encoding="utf-8") as fh:
        fh.write(table + "\n" + summary_markdown(summary))
    return table, written + [os.path.join(out, "headline.md")]


def exp_headline(ctx: Ctx) -> str:
    scens = ctx.scenario_list(LOADS)
    pols = ctx.policies or [p for p in STUDY_POLICIES if p in available_policies()]
    specs = ctx.specs(scens, pols)
    focus = next((sc for sc in scens if sc.endswith("-moderate")), scens[0])
    ex = ctx.execute(specs, requests_for=[focus])
    table, _ = headline_files(ctx.out, specs, ex.runs, ex.summary)
    if ctx.plots:
        say(f"{ctx.name}: writing figures to {ctx.fig_dir} (PNG + PDF; --no-plots skips them)")
        from eval import plots

        pol_order = list(dict.fromkeys(ex.summary["policy"]))
        nonref = ex.summary[ex.summary["policy"] != REFERENCE_POLICY]
        plots.bars(nonref, x="scenario", hue="policy", y="reduction_vs_rr_pct", yerr="reduction_vs_rr_pct_ci95", stem=ctx.fig("headline_reduction"), ylabel="carbon reduction vs rr (%)", title="Carbon reduction vs round-robin (mean ± 95% CI)", hue_order=[p for p in pol_order if p != REFERENCE_POLICY])
        plots.bars(ex.summary, x="scenario", hue="policy", y="slo_violation_pct", yerr="slo_violation_pct_ci95", stem=ctx.fig("headline_violations"), ylabel="SLO violations (% of requests)", title="SLO violation rate (mean ± 95% CI)", hue_order=pol_order)
        standard_figures(ex, focus, ctx.fig_dir, tag=focus)
    return table


def exp_milp_vs_ilp(ctx: Ctx) -> str:
    scens = ctx.scenario_list(("moderate", "high"))
    pols = ctx.policies or [REFERENCE_POLICY, *ILP_POLICIES, "milp"]
    ex = ctx.execute(ctx.specs(scens, pols))
    table, md = milp_vs_ilp_tables(ex.runs, ctx.out)
    if ctx.plots and not table.empty:
        say(f"{ctx.name}: writing figures to {ctx.fig_dir} (PNG + PDF; --no-plots skips them)")
        milp_vs_ilp_figure(table, ctx.fig("milp_vs_ilp_gap"))
    return md


def exp_predictor(ctx: Ctx) -> str:
    """Experiment c: the policies with the scenario's predictor and with oracle lengths
    (:mod:`eval.predictor`)."""
    from eval.predictor import PREDICTED, predictor_figure, predictor_markdown, predictor_table

    scens = ctx.scenario_list(("moderate",))
    pols = [p for p in (ctx.policies or ["milp", "ilp-state"]) if p != REFERENCE_POLICY]
    variants = [(PREDICTED, {}), (ORACLE, {OVERRIDE_PREDICTOR: ORACLE})]  # (the variant label is the override's value)
    ex = ctx.execute(ctx.variant_specs(scens, pols, variants))
    table = predictor_table(ex.runs)
    table.to_csv(os.path.join(ctx.out, "predictor.csv"), index=False)
    md = predictor_markdown(table)
    ctx.write_text("predictor.md", md)
    if ctx.plots and not table.empty:
        say(f"{ctx.name}: writing figures to {ctx.fig_dir} (PNG + PDF; --no-plots skips them)")
        predictor_figure(table, ctx.fig("predictor_vs_oracle"))
    return md


def exp_polling(ctx: Ctx) -> str:
    """Experiment d: rr and the policies at each polling period (:mod:`eval.polling`)."""
    from eval.polling import polling_figures, write_polling_tables

    scens = ctx.scenario_list(("moderate",), ("llama8b",))
    pols = [p for p in (ctx.policies or ["milp", "greedy", "least-loaded"]) if p != REFERENCE_POLICY]
    periods = ctx.preset.polling_s
    variants = [(f"poll={p:g}s", {OVERRIDE_POLLING: float(p)}) for p in periods]
    specs = ctx.variant_specs(scens, pols, variants)
    ex = ctx.execute(specs)
    rows, md = write_polling_tables(ex.summary, ctx.out)
    if ctx.plots:
        say(f"{ctx.name}: writing figures to {ctx.fig_dir} (PNG + PDF; --no-plots skips them)")
        os.makedirs(ctx.fig_dir, exist_ok=True)
        polling_figures(rows, ctx.fig_dir)
    return md


def exp_tradeoff(ctx: Ctx) -> str:
    """Experiment e: every knob-driven policy's carbon-vs-violation frontier, and the
    comparison at equal violation (:mod:`eval.frontiers`)."""
    from eval.frontiers import tradeoff_experiment

    return tradeoff_experiment(ctx, ctx.policies or [p for p in STUDY_POLICIES if p in available_policies()])


def exp_bound(ctx: Ctx) -> str:
    """Experiment f: each policy's reduction as a share of the carbon lower bound's
    (:mod:`eval.bound`); the clairvoyant heuristic runs as one more policy."""
    from eval.bound import bound_experiment

    pols = [p for p in (ctx.policies or STUDY_POLICIES) if p != "clairvoyant"] + ["clairvoyant"]
    return bound_experiment(ctx, pols)


#: The long run of experiment g: hours measured (after a burn-in), where the carbon hours and the
#: day's traffic play out.
DIURNAL_WINDOW_S = 6 * 3600.0
DIURNAL_WARMUP_S = 600.0
#: Round-robin always on (the reference), the planner with the reactive autoscaler and the MILP
#: deciding capacity (both with ``capacity.control = "agent"``).
DIURNAL_POLICIES = ("rr", "planner+reactive", "milp")


def diurnal_specs(scenarios: Sequence[str], policies: Sequence[str], seeds: Sequence[int], overrides: Mapping[str, Any],
                  policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> list[RunSpec]:
    """Experiment g's runs: ``rr`` as the scenario has it (always on, the reference); every other
    policy with ``capacity.control = "agent"`` (it decides awake engines / servers on where it
    can: the MILP itself, ``POLICY+AUTOSCALER`` through its autoscaler), unless ``overrides``
    set ``capacity.control`` for all. One scenario label, so rows pair by seed."""
    agent = dict(overrides)
    agent.setdefault("capacity.control", "agent")
    specs: list[RunSpec] = []
    for p in policies:
        ov = overrides if p == REFERENCE_POLICY else agent
        specs.extend(make_specs(scenarios, [p], seeds, overrides=ov, policy_kwargs=policy_kwargs))
    return specs


def exp_diurnal(ctx: Ctx) -> str:
    """Experiment g: one long steady-state run of ``llama8b-diurnal`` (traffic follows the sun):
    round-robin always on vs the planner with the reactive autoscaler and the facility MILP
    deciding capacity (:func:`diurnal_specs`), a 6 h window after a 10 min burn-in
    (``--preset full``; a 60 s smoke window under ``quick``), unless ``--window-s`` /
    ``--warmup-s`` say otherwise; one start (``--seeds`` for more)."""
    scens = list(ctx.scenarios or ["llama8b-diurnal"])
    pols = list(ctx.policies or [p for p in DIURNAL_POLICIES if p.split("+")[0] in available_policies()])
    ov = dict(ctx.overrides)
    if not ctx.explicit_window:  # its own window (a 60 s smoke window under the quick preset)
        ov.update(window_overrides(60.0, 60.0) if ctx.preset_name == "quick" else window_overrides(DIURNAL_WINDOW_S, DIURNAL_WARMUP_S))
    seeds = ctx.seeds if ctx.explicit_seeds else [0]
    specs = diurnal_specs(scens, pols, seeds, ov, ctx.policy_kwargs)
    ex = ctx.execute(specs)
    table = headline_table(ex.summary)
    control = {p: ("always on" if p == REFERENCE_POLICY and "capacity.control" not in ov else str(ov.get("capacity.control", "agent")))
               for p in pols}
    md = (f"{scens[0]}: {float(ov['env.warmup_s']):g} s burn-in, then {float(ov['duration_s']) - float(ov['env.warmup_s']):g} s "
          "measured (steady-state window, no drain); capacity control: "
          + ", ".join(f"{p} {c}" for p, c in control.items()) + ".\n\n" + table + "\n" + summary_markdown(ex.summary))
    ctx.write_text("diurnal.md", md)
    if ctx.plots:
        say(f"{ctx.name}: writing figures to {ctx.fig_dir} (PNG + PDF; --no-plots skips them)")
        for scen in dict.fromkeys(ex.runs["scenario"]):
            standard_figures(ex, scen, ctx.fig_dir, tag=scen)
    return md


def exp_capacity(ctx: Ctx) -> str:
    """Experiment h: capacity control (:mod:`eval.capacity_report`): round-robin always on vs,
    with ``capacity.control = agent``, rr, the autoscalers composed with routing policies and the
    MILP, on a steady-state window of :data:`~eval.capacity_report.CAPACITY_WINDOW_S` after
    :data:`~eval.capacity_report.CAPACITY_WARMUP_S` (a 60 s smoke window under ``quick``) unless
    ``--window-s`` / ``--warmup-s`` say otherwise; one start (``--seeds`` for more; with
    ``--heldout-seeds`` each scenario its own first N fresh held-out starts, as in the headline)."""
    from eval import capacity_report as cr

    scens = list(ctx.scenarios or cr.CAPACITY_SCENARIOS)
    pols = list(ctx.policies or [p for p in cr.CAPACITY_POLICIES if p.split("+")[0] in available_policies()])
    ov = dict(ctx.overrides)
    if not ctx.explicit_window:
        ov.update(window_overrides(60.0, 60.0) if ctx.preset_name == "quick" else window_overrides(cr.CAPACITY_WINDOW_S, cr.CAPACITY_WARMUP_S))
    if ctx.heldout_seeds or ctx.training_seeds:
        seeds: dict[str, list[int]] = {sc: ctx.seeds_for(sc) for sc in scens}
    else:
        seeds = {sc: list(ctx.seeds) if ctx.explicit_seeds else [0] for sc in scens}
    return cr.capacity_experiment(ctx, scens, pols, seeds, ov)


EXPERIMENT_FUNCS: dict[str, Callable[[Ctx], str]] = {
    "headline": exp_headline,
    "milp-vs-ilp": exp_milp_vs_ilp,
    "predictor": exp_predictor,
    "polling": exp_polling,
    "tradeoff": exp_tradeoff,
    "bound": exp_bound,
    "diurnal": exp_diurnal,
    "capacity": exp_capacity,
    "sessions": sessions_experiment.sessions_experiment,
    "generalise": generalise_experiment.generalise_experiment,
    "learned-capacity": learned_capacity_experiment.learned_capacity_experiment,
}


@dataclass
class Ctx:
    """Everything an experiment needs: where to write, what to run, how to run it."""

    name: str
    out: str
    preset: Preset
    preset_name: str
    seeds: list[int]
    models: list[str] | None
    loads: list[str] | None
    policies: list[str] | None
    overrides: dict[str, Any]
    policy_kwargs: dict[str, dict[str, Any]]
    run_kwargs: dict[str, Any]
    scenarios: list[str] | None
    plots: bool
    carbon_start: bool
    command: str | None
    explicit_seeds: bool = False
    explicit_window: bool = False
    heldout_seeds: bool = False
    training_seeds: bool = False

    def seeds_for(self, scenario: str) -> list[int]:
        """The seeds of ``scenario``: ``self.seeds``, or with ``heldout_seeds`` the scenario's own first
        ``len(self.seeds)`` fresh held-out starts (:func:`eval.heldout_seeds.fresh_heldout_seeds`), or
        with ``training_seeds`` its first ``len(self.seeds)`` training starts (where knobs are chosen:
        :func:`eval.heldout_seeds.training_seeds`)."""
        if self.heldout_seeds:
            from eval.heldout_seeds import fresh_heldout_seeds

            return fresh_heldout_seeds(scenario, len(self.seeds))
        if self.training_seeds:
            from eval.heldout_seeds import training_seeds

            return training_seeds(scenario, len(self.seeds))
        return list(self.seeds)

    def specs(self, scenarios: Sequence[str], policies: Sequence[str]) -> list[RunSpec]:
        """Every policy on every scenario at that scenario's seeds (:meth:`seeds_for`), with the
        experiment's overrides and policy arguments."""
        return [s for sc in scenarios for s in make_specs([sc], policies, self.seeds_for(sc), overrides=self.overrides,
                                                          policy_kwargs=self.policy_kwargs)]

    def variant_specs(self, scenarios: Sequence[str], policies: Sequence[str], variants: Sequence[tuple[str, Mapping[str, Any]]]) -> list[RunSpec]:
        """:meth:`specs` for scenario variants (:func:`_variant_specs`: rr in every variant), each
        scenario at its own seeds (:meth:`seeds_for`)."""
        return [s for sc in scenarios for s in _variant_specs([sc], policies, self.seeds_for(sc), variants, self.overrides, self.policy_kwargs)]

    def scenario_list(self, default_loads: Sequence[str], default_models: Sequence[str] = MODELS) -> list[str]:
        """Explicit ``--scenarios``, else models x loads (the experiment's defaults where not given)."""
        if self.scenarios:
            return list(self.scenarios)
        return _scenarios(self.models or default_models, self.loads, default_loads)

    @property
    def fig_dir(self) -> str:
        return os.path.join(self.out, "figures")

    def fig(self, stem: str) -> str:
        return os.path.join(self.fig_dir, stem)

    def execute(self, specs: Sequence[RunSpec], *, requests_for: Sequence[str] | None = ()) -> Executed:
        """Run and write ``specs``; per-request records only for the scenarios in ``requests_for``
        (``None``: all; default none, as experiments other than the headline only need tables),
        unless ``--no-requests`` turned them off or ``--all-requests`` on."""
        specs = with_carbon_start(specs, self.carbon_start)
        kw = dict(self.run_kwargs)
        req = kw.pop("requests")
        if req == "all" or requests_for is None:
            keep: Any = req is not False
        elif req is False:
            keep = False
        else:
            names = set(requests_for)
            keep = lambda spec: spec.scenario_name in names  # noqa: E731
        return execute(specs, self.out, command=self.command, requests=keep, extra_config={"experiment": self.name, "preset": self.preset_name, "preset_values": self.preset.__dict__}, **kw)

    def write_text(self, name: str, text: str) -> str:
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path


def run_experiment(
    name: str,
    *,
    out: str,
    preset: str = "quick",
    seeds: Sequence[int] | None = None,
    models: Sequence[str] | None = None,
    loads: Sequence[str] | None = None,
    policies: Sequence[str] | None = None,
    scenarios: Sequence[str] | None = None,
    duration_s: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
    tensorboard: str | None = None,
    fmt: str = "parquet",
    requests: bool | str = True,
    plots: bool = True,
    progress: bool = True,
    carbon_start: bool = True,
    command: str | None = None,
    window_s: float | None = None,
    warmup_s: float | None = None,
    polling_s: Sequence[float] | None = None,
    heldout_seeds: bool = False,
    training_seeds: bool = False,
) -> str:
    """Run experiment ``name`` (see the module docstring) and return its Markdown table.
    ``polling_s``: the polling sweep's periods, s (default the preset's). ``heldout_seeds``
    (:data:`HELDOUT_EXPERIMENTS` only): each scenario runs its own first ``len(seeds)`` fresh
    held-out starts; ``training_seeds`` (the same experiments): its first ``len(seeds)`` training
    starts, the days knobs are chosen on."""
    for flag, on in (("heldout_seeds", heldout_seeds), ("training_seeds", training_seeds)):
        if on and name not in HELDOUT_EXPERIMENTS:
            raise ValueError(f"{flag} is for experiments {', '.join(HELDOUT_EXPERIMENTS)}, not {name!r}")
    if heldout_seeds and training_seeds:
        raise ValueError("heldout_seeds and training_seeds exclude each other")
    p = PRESETS[preset]
    if polling_s is not None:
        p = replace(p, polling_s=tuple(float(v) for v in polling_s))
    ctx = Ctx(
        name=name,
        out=out,
        preset=p,
        preset_name=preset,
        seeds=list(seeds) if seeds is not None else list(range(p.seeds)),
        models=list(models) if models else None,
        loads=list(loads) if loads else None,
        policies=list(policies) if policies else None,
        overrides=preset_overrides(preset, duration_s, overrides, window_s=window_s, warmup_s=warmup_s),
        policy_kwargs={k: dict(v) for k, v in (policy_kwargs or {}).items()},
        scenarios=list(scenarios) if scenarios else None,
        run_kwargs={"workers": workers, "ray_address": ray_address, "tensorboard": tensorboard, "fmt": fmt, "requests": requests, "progress": progress},
        plots=plots,
        carbon_start=carbon_start,
        command=command,
        explicit_seeds=seeds is not None,
        explicit_window=window_s is not None,
        heldout_seeds=heldout_seeds,
        training_seeds=training_seeds,
    )
    return EXPERIMENT_FUNCS[name](ctx)
