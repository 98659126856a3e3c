"""Experiment d's tables: carbon and SLO violations against the scheduler's polling period.

Each period is a variant of its scenario (labelled ``<scenario>[poll=<s>s]``) with round-robin
at that period as its reference. The sweep can come in several matrices (``<results>/polling/``
and later ``<results>/polling-NAME/polling/``, e.g. the short periods run apart because a MILP
run at 0.1 s costs minutes): :func:`polling_section` merges them, a later matrix's run of the same
(period, policy, seed) replacing an earlier one's.
"""

from __future__ import annotations

import os
from typing import Any

from eval.tables import METRICS_NOTE, fmt_ci, frame_markdown, p99_verdict
from eval.writers import matrix_dirs, merged_head

__all__ = ["variant_base", "variant_of", "polling_rows", "polling_markdown", "write_polling_tables", "polling_dirs", "merged_polling", "polling_section",
           "polling_figures"]


def variant_base(label: str) -> str:
    """The scenario of a variant label ``<scenario>[<variant>]`` (the label itself without one)."""
    return str(label).split("[", 1)[0]


def variant_of(label: str) -> str:
    """The variant of a label ``<scenario>[<variant>]`` ("" without one)."""
    return str(label).split("[", 1)[1].rstrip("]") if "[" in str(label) else ""


def _period_s(label: str) -> float:
    """The polling period of a ``<scenario>[poll=<s>s]`` label, seconds."""
    return float(variant_of(label).split("=")[1].rstrip("s"))


def polling_rows(summary: Any) -> Any:
    """The summary rows (:func:`eval.tables.summarise`) with ``base`` (the scenario) and
    ``polling_s`` columns, ordered by scenario, policy and period."""
    s = summary.copy()
    s["base"] = s["scenario"].map(variant_base)
    s["polling_s"] = s["scenario"].map(_period_s)
    return s.sort_values(["base", "policy", "polling_s"], kind="stable").reset_index(drop=True)


def polling_markdown(rows: Any) -> str:
    """The sweep's table: per scenario, policy and period the reduction vs rr at that period, the
    per-request violation rate, the MLPerf p99 verdict and the p99 latencies."""
    import pandas as pd

    disp = pd.DataFrame({
        "scenario": rows["base"], "policy": rows["policy"], "polling (s)": rows["polling_s"].map(lambda v: f"{v:g}"),
        "vs rr %": [fmt_ci(a, b) for a, b in zip(rows["reduction_vs_rr_pct"], rows["reduction_vs_rr_pct_ci95"])],
        "SLO viol. %": [fmt_ci(a, b, 2) for a, b in zip(rows["slo_violation_pct"], rows["slo_violation_pct_ci95"])],
        "MLPerf p99 pass": [p99_verdict(r) for _, r in rows.iterrows()],
        "TTFT p99 (ms)": (rows["ttft_p99_s"] * 1e3).map(lambda v: f"{v:.0f}"),
        "TPOT p99 (ms)": (rows["tpot_p99_s"] * 1e3).map(lambda v: f"{v:.0f}"),
    })
    return f"Polling-period sweep (rr at each period is the reference). {METRICS_NOTE}\n\n" + frame_markdown(disp)


def write_polling_tables(summary: Any, out: str) -> tuple[Any, str]:
    """Write ``polling.csv`` and ``polling.md`` of one matrix into ``out``; returns the rows and
    the Markdown."""
    rows = polling_rows(summary)
    os.makedirs(out, exist_ok=True)
    rows.to_csv(os.path.join(out, "polling.csv"), index=False)
    md = polling_markdown(rows)
    with open(os.path.join(out, "polling.md"), "w", encoding="utf-8") as f:
        f.write(md)
    return rows, md


def polling_dirs(results_dir: str) -> list[str]:
    """The finished polling matrices under ``results_dir`` (:func:`eval.writers.matrix_dirs`)."""
    return matrix_dirs(results_dir, "polling")


def merged_polling(results_dir: str) -> Any | None:
    """The sweep's rows: one matrix's ``polling.csv``, or over every matrix of :func:`polling_dirs`
    their runs merged (a later matrix's run of the same period, policy and seed replaces an earlier
    one's) and summarised again; None without one."""
    import pandas as pd

    from eval.capacity_report import merged_runs
    from eval.tables import summarise

    dirs = polling_dirs(results_dir)
    if len(dirs) < 2:
        one = os.path.join(results_dir, "polling", "polling.csv")
        return pd.read_csv(one) if os.path.isfile(one) else None
    return polling_rows(summarise(merged_runs(dirs).drop(columns=["source"])))


def polling_figures(rows: Any, stem_dir: str) -> list[str]:
    """One figure per scenario of ``rows`` (:func:`eval.plots.polling_curve`) under ``stem_dir``;
    returns the PNG paths."""
    from eval import plots

    out = []
    for base in dict.fromkeys(rows["base"]):
        stem = os.path.join(stem_dir, f"polling_{base}")
        plots.polling_curve(rows[rows["base"] == base], stem, title=f"{base}: polling period")
        out.append(stem + ".png")
    return out


def polling_section(results_dir: str, fig_dir: str) -> tuple[str, list[str]] | None:
    """The merged sweep's text (each matrix's command, then the table) and its figures (PNG paths,
    drawn under ``fig_dir``), or None when there is at most one matrix (its own ``polling.md`` and
    figures are the section)."""
    dirs = polling_dirs(results_dir)
    if len(dirs) < 2:
        return None
    rows = merged_polling(results_dir)
    assert rows is not None
    text = merged_head(results_dir, dirs) + " " + polling_markdown(rows)
    pngs = polling_figures(rows, fig_dir)
    return text, pngs
