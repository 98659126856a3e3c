"""Experiment b's tables: the facility MILP against the per-request ILPs, paired by seed.

Per scenario, each policy's carbon reduction vs round-robin (with its per-request violation
rate and MLPerf p99 verdict) and the paired gap MILP - ILP in percentage points. A policy with
an invalid run (work left unfinished) gets no reduction and no gap. :func:`milp_vs_ilp_section`
merges every matrix of the experiment under a results directory (``milp-vs-ilp/`` and
``milp-vs-ilp-NAME/milp-vs-ilp/``) for RESULTS.md.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from eval.stats import mean_ci95, paired_difference
from eval.tables import METRICS_NOTE, MLPERF_COLUMNS, fmt_ci, p99_verdict

__all__ = ["ILP_POLICIES", "milp_vs_ilp_table", "milp_vs_ilp_markdown", "milp_vs_ilp_tables", "milp_vs_ilp_figure",
           "merged_experiment_runs", "milp_vs_ilp_runs", "milp_vs_ilp_section", "p99_shares", "prefixed_verdict"]

#: The per-request ILPs experiment b sets against the facility MILP: load-blind, load-blind with the
#: static capacity cap earlier carbon-aware schedulers had, and state-aware.
ILP_POLICIES = ("ilp", "ilp-cap", "ilp-state")


def milp_vs_ilp_table(runs, *, milp: str = "milp", ilps: Sequence[str] | None = None):
    """Per scenario: MILP reduction, each ILP's (``ilps``, default those of :data:`ILP_POLICIES`
    that ran), and the paired gap (pp) MILP - ILP, with CIs.
    A policy with an invalid run in the scenario (work left unfinished, ``run_valid`` false) gets
    no reduction and no gap (NaN; ``<policy>_invalid`` true): its unspent energy would flatter it."""
    import pandas as pd

    if ilps is None:
        ilps = [p for p in ILP_POLICIES if p in set(runs["policy"])]
    rows = []
    for scen in dict.fromkeys(runs["scenario"]):
        sub = runs[runs["scenario"] == scen]
        if milp not in set(sub["policy"]):
            continue

        def bad(pol: str, sub: Any = sub) -> bool:
            r = sub[sub["policy"] == pol]
            return "run_valid" in r and not bool(r["run_valid"].astype(bool).all())

        row: dict[str, Any] = {"scenario": scen, "milp_invalid": bad(milp)}
        m, ci = mean_ci95(sub[sub["policy"] == milp]["reduction_vs_rr_pct"])
        if row["milp_invalid"]:
            m, ci = float("nan"), float("nan")
        row["milp_reduction_pct"], row["milp_reduction_pct_ci95"] = m, ci
        m, ci = mean_ci95(sub[sub["policy"] == milp]["slo_violation_pct"])
        row["milp_violation_pct"], row["milp_violation_pct_ci95"] = m, ci
        row.update(p99_shares(sub[sub["policy"] == milp], "milp_"))
        for ilp in ilps:
            if ilp not in set(sub["policy"]):
                continue
            row[f"{ilp}_invalid"] = bad(ilp)
            m, ci = mean_ci95(sub[sub["policy"] == ilp]["reduction_vs_rr_pct"])
            if row[f"{ilp}_invalid"]:
                m, ci = float("nan"), float("nan")
            row[f"{ilp}_reduction_pct"], row[f"{ilp}_reduction_pct_ci95"] = m, ci
            m, ci = mean_ci95(sub[sub["policy"] == ilp]["slo_violation_pct"])
            row[f"{ilp}_violation_pct"] = m
            row.update(p99_shares(sub[sub["policy"] == ilp], f"{ilp}_"))
            g, gci, n = paired_difference(sub, "scenario", milp, ilp, "reduction_vs_rr_pct")
            if row[f"{ilp}_invalid"] or row["milp_invalid"]:
                g, gci = float("nan"), float("nan")
            row[f"gap_vs_{ilp}_pp"], row[f"gap_vs_{ilp}_pp_ci95"] = g, gci
        rows.append(row)
    return pd.DataFrame(rows)


def p99_shares(runs, prefix: str = "") -> dict[str, float]:
    """``{prefix}seeds`` and the shares of runs passing the MLPerf p99 criteria
    (``{prefix}mlperf_p99_pass_share``, ... for :data:`eval.tables.MLPERF_COLUMNS`)."""
    out: dict[str, float] = {f"{prefix}seeds": float(len(runs))}
    for c in MLPERF_COLUMNS:
        out[f"{prefix}{c}_share"] = float(np.mean(runs[c].astype(float))) if c in runs and len(runs) else float("nan")
    return out


def prefixed_verdict(r: Any, prefix: str) -> str:
    """:func:`eval.tables.p99_verdict` of the columns ``{prefix}mlperf_*_share`` of a row."""
    cols = {c + "_share": r.get(f"{prefix}{c}_share", float("nan")) for c in MLPERF_COLUMNS}
    n = r.get(f"{prefix}seeds", float("nan"))
    return p99_verdict(cols, int(n) if np.isfinite(float(n)) else 0)


def milp_vs_ilp_markdown(table, ilps: Sequence[str] | None = None) -> str:
    """Per scenario: each policy's reduction vs rr (per-request violation %; MLPerf p99 verdict)
    and the paired gaps (``ilps``, default those of :data:`ILP_POLICIES` in ``table``)."""
    if ilps is None:
        ilps = [p for p in ILP_POLICIES if f"{p}_reduction_pct" in table]
    # (invalid = work left unfinished in some seed: no reduction, no gap)
    head = ["scenario", "milp: vs rr % (viol. %; p99)"] + [f"{i}: vs rr % (viol. %; p99)" for i in ilps] + [f"MILP - {i} (pp)" for i in ilps]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for _, r in table.iterrows():
        def red(p: str, r: Any = r) -> str:
            return "invalid" if bool(r.get(f"{p}_invalid", False)) else fmt_ci(r.get(f"{p}_reduction_pct"), r.get(f"{p}_reduction_pct_ci95"))

        cells = [r["scenario"], f"{red('milp')} ({r['milp_violation_pct']:.1f}; {prefixed_verdict(r, 'milp_')})"]
        for i in ilps:
            cells.append(f"{red(i)} ({fmt_ci(r.get(f'{i}_violation_pct'))}; {prefixed_verdict(r, f'{i}_')})" if f"{i}_reduction_pct" in r else "–")
        for i in ilps:
            cells.append(fmt_ci(r.get(f"gap_vs_{i}_pp", float("nan")), r.get(f"gap_vs_{i}_pp_ci95", float("nan"))))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def milp_vs_ilp_tables(runs, out: str) -> tuple[Any, str]:
    """Experiment b's tables from its runs (as run, or read back from ``runs.csv``): writes
    ``milp-vs-ilp.csv`` and ``milp-vs-ilp.md`` into ``out``; returns the table and the Markdown."""
    ilps = [p for p in ILP_POLICIES if p in set(runs["policy"])]
    table = milp_vs_ilp_table(runs, ilps=ilps)
    os.makedirs(out, exist_ok=True)
    table.to_csv(os.path.join(out, "milp-vs-ilp.csv"), index=False)
    md = ("Facility MILP vs per-request ILPs: reduction vs rr, % (SLO violation %; MLPerf p99 verdict), and the paired gap "
          "in percentage points; invalid = more than 1% of the work left unfinished in some start (no reduction, no gap: "
          f"its unspent energy would flatter it). {METRICS_NOTE}\n\n" + milp_vs_ilp_markdown(table, ilps))
    with open(os.path.join(out, "milp-vs-ilp.md"), "w", encoding="utf-8") as f:
        f.write(md)
    return table, md


def milp_vs_ilp_figure(table: Any, stem: str) -> str:
    """Bars of the paired gap MILP - ILP per scenario and ILP (with CIs) at ``stem`` (PNG + PDF);
    the PNG path."""
    import pandas as pd

    from eval import plots

    ilps = [p for p in ILP_POLICIES if f"gap_vs_{p}_pp" in table]
    long = [{"scenario": r["scenario"], "ilp": i, "gap": r.get(f"gap_vs_{i}_pp"), "ci": r.get(f"gap_vs_{i}_pp_ci95")}
            for _, r in table.iterrows() for i in ilps]
    plots.bars(pd.DataFrame(long), x="scenario", hue="ilp", y="gap", yerr="ci", stem=stem,
               ylabel="MILP reduction - ILP reduction (pp)", title="Facility MILP advantage over per-request ILPs (paired by seed)")
    return stem + ".png"


def merged_experiment_runs(results_dir: str, exp: str) -> Any:
    """The runs of every finished matrix of experiment ``exp`` under ``results_dir`` (``<exp>/``,
    then ``<exp>-NAME/<exp>/``), merged (:func:`eval.capacity_report.merged_runs`: a later matrix's
    run of the same scenario label, policy and seed replaces an earlier one's), ordered by model,
    then load (the headline's order; a variant label ``<scenario>[...]`` by its scenario), other
    scenarios after in the order they came, policies and variants kept; None when there is none."""
    from eval.capacity_report import merged_runs
    from eval.polling import variant_base
    from eval.writers import matrix_dirs

    dirs = matrix_dirs(results_dir, exp)
    if not dirs:
        return None
    runs = merged_runs(dirs).drop(columns=["source"])
    base = runs["scenario"].map(variant_base)
    first = {sc: i for i, sc in enumerate(dict.fromkeys(base))}
    models, loads = ("llama8b", "qwen7b", "mixtral8x7b"), ("low", "moderate", "high")

    def rank(sc: str) -> tuple[int, int, int]:
        m, _, ld = str(sc).rpartition("-")
        return (models.index(m), loads.index(ld), 0) if m in models and ld in loads else (len(models), 0, first[sc])

    order = sorted(range(len(runs)), key=lambda i: rank(base.iloc[i]))  # (stable)
    return runs.iloc[order].reset_index(drop=True)


def milp_vs_ilp_runs(results_dir: str) -> Any:
    """The runs of every finished matrix of experiment b under ``results_dir``, merged and ordered
    (:func:`merged_experiment_runs`); None when there is none."""
    return merged_experiment_runs(results_dir, "milp-vs-ilp")


def milp_vs_ilp_section(results_dir: str, fig_dir: str) -> tuple[str, list[str]] | None:
    """The section merged over every matrix of experiment b under ``results_dir``
    (:func:`milp_vs_ilp_runs`): each matrix's command, the table and the gap figure (drawn under
    ``fig_dir``, where the tables are written too); None when there is at most one matrix (its own
    ``milp-vs-ilp.md`` and figure are the section)."""
    from eval.writers import matrix_dirs, merged_head

    dirs = matrix_dirs(results_dir, "milp-vs-ilp")
    if len(dirs) < 2:
        return None
    table, md = milp_vs_ilp_tables(milp_vs_ilp_runs(results_dir), fig_dir)
    return (merged_head(results_dir, dirs) + "\n\n" + md,
            [milp_vs_ilp_figure(table, os.path.join(fig_dir, "milp-vs-ilp_milp_vs_ilp_gap"))])
