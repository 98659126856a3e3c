"""Experiment c's tables: the output-length predictor against oracle lengths, paired by seed.

Each scenario runs in two variants, ``<scenario>[predicted]`` (the scenario's predictor) and
``<scenario>[oracle]`` (every request's true output length), with rr in each. The experiment can
come in several matrices (``<results>/predictor/`` and later ``<results>/predictor-NAME/predictor/``,
e.g. low load or the ILPs run apart): :func:`predictor_section` merges them, a later matrix's run
of the same (variant, policy, seed) replacing an earlier one's.
"""

from __future__ import annotations

import os
from typing import Any

from eval.milp_vs_ilp import merged_experiment_runs, p99_shares, prefixed_verdict
from eval.polling import variant_base, variant_of
from eval.stats import mean_ci95
from eval.tables import METRICS_NOTE, REFERENCE_POLICY, fmt_ci, frame_markdown

__all__ = ["ORACLE", "PREDICTED", "predictor_table", "predictor_markdown", "predictor_figure", "predictor_runs", "predictor_section"]

ORACLE = "oracle"
PREDICTED = "predicted"


def predictor_table(runs: Any) -> Any:
    """One row per (scenario, policy): reduction vs rr and violation with predicted and oracle
    lengths over the seeds both ran (mean ± 95% CI), their paired gaps (predicted - oracle, pp)
    and the MLPerf p99 shares of each."""
    import pandas as pd

    runs = runs.copy()
    runs["base"] = runs["scenario"].map(variant_base)
    runs["variant"] = runs["scenario"].map(variant_of)
    rows = []
    for scen in dict.fromkeys(runs["base"]):
        for p in dict.fromkeys(runs.loc[runs["base"] == scen, "policy"]):
            if p == REFERENCE_POLICY:
                continue
            a = runs[(runs["base"] == scen) & (runs["policy"] == p)]
            pr = a[a["variant"] == PREDICTED].set_index("seed")
            orc = a[a["variant"] == ORACLE].set_index("seed")
            common = pr.index.intersection(orc.index)
            row: dict[str, Any] = {"scenario": scen, "policy": p, "seeds": len(common)}
            for metric, short in (("reduction_vs_rr_pct", "reduction"), ("slo_violation_pct", "violation")):
                mp, cp = mean_ci95(pr.loc[common, metric])
                mo, co = mean_ci95(orc.loc[common, metric])
                md_, cd = mean_ci95((pr.loc[common, metric] - orc.loc[common, metric]).to_numpy(float))
                row.update({f"{short}_predicted": mp, f"{short}_predicted_ci95": cp, f"{short}_oracle": mo, f"{short}_oracle_ci95": co,
                            f"{short}_diff_pp": md_, f"{short}_diff_pp_ci95": cd})
            row.update(p99_shares(pr.loc[common], "predicted_"))
            row.update(p99_shares(orc.loc[common], "oracle_"))
            rows.append(row)
    return pd.DataFrame(rows)


def predictor_markdown(table: Any) -> str:
    """The experiment's table (:func:`predictor_table`) as Markdown, with its note."""
    import pandas as pd

    head = f"Output-length predictor vs oracle lengths (paired by seed; gap = predicted - oracle). {METRICS_NOTE}\n\n"
    if table.empty:
        return head + "(no runs)\n"
    disp = pd.DataFrame({
        "scenario": table["scenario"], "policy": table["policy"], "seeds": table["seeds"],
        "vs rr %, predicted": [fmt_ci(a, b) for a, b in zip(table["reduction_predicted"], table["reduction_predicted_ci95"])],
        "vs rr %, oracle": [fmt_ci(a, b) for a, b in zip(table["reduction_oracle"], table["reduction_oracle_ci95"])],
        "carbon gap (pp, pred - oracle)": [fmt_ci(a, b) for a, b in zip(table["reduction_diff_pp"], table["reduction_diff_pp_ci95"])],
        "viol. %, predicted": [fmt_ci(a, b, 2) for a, b in zip(table["violation_predicted"], table["violation_predicted_ci95"])],
        "viol. %, oracle": [fmt_ci(a, b, 2) for a, b in zip(table["violation_oracle"], table["violation_oracle_ci95"])],
        "violation gap (pp)": [fmt_ci(a, b, 2) for a, b in zip(table["violation_diff_pp"], table["violation_diff_pp_ci95"])],
        "MLPerf p99, predicted": [prefixed_verdict(r, "predicted_") for _, r in table.iterrows()],
        "MLPerf p99, oracle": [prefixed_verdict(r, "oracle_") for _, r in table.iterrows()],
    })
    return head + frame_markdown(disp)


def predictor_figure(table: Any, stem: str) -> str:
    """Bars of the reduction with predicted and oracle lengths per scenario and policy; the PNG path."""
    import pandas as pd

    from eval import plots

    long = [{"case": f"{r['scenario']}\n{r['policy']}", "lengths": v, "reduction": r[f"reduction_{v}"], "ci": r[f"reduction_{v}_ci95"]}
            for _, r in table.iterrows() for v in (PREDICTED, ORACLE)]
    plots.bars(pd.DataFrame(long), x="case", hue="lengths", y="reduction", yerr="ci", stem=stem, ylabel="carbon reduction vs rr (%)",
               title="Predicted vs true output lengths")
    return stem + ".png"


def predictor_runs(results_dir: str) -> Any:
    """The runs of every finished matrix of experiment c under ``results_dir``, merged (a later
    matrix's run of the same variant, policy and seed replaces an earlier one's) and ordered by
    model and load (:func:`eval.milp_vs_ilp.merged_experiment_runs`); None when there is none."""
    return merged_experiment_runs(results_dir, "predictor")


def predictor_section(results_dir: str, fig_dir: str) -> tuple[str, list[str]] | None:
    """The section merged over every matrix of experiment c under ``results_dir``: each matrix's
    command, the table and its figure (drawn under ``fig_dir``, where ``predictor.csv`` is written
    too); None when there is at most one matrix (its own ``predictor.md`` and figure are the section)."""
    from eval.writers import matrix_dirs, merged_head

    dirs = matrix_dirs(results_dir, "predictor")
    if len(dirs) < 2:
        return None
    table = predictor_table(predictor_runs(results_dir))
    os.makedirs(fig_dir, exist_ok=True)
    table.to_csv(os.path.join(fig_dir, "predictor.csv"), index=False)
    md = merged_head(results_dir, dirs) + "\n\n" + predictor_markdown(table)
    return md, ([predictor_figure(table, os.path.join(fig_dir, "predictor_vs_oracle"))] if not table.empty else [])
