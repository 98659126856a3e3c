"""Tables of a finished matrix: per-run rows, summaries over seeds, Markdown, the fault report.

* :func:`runs_table` — one row per run, with ``reduction_vs_rr_pct`` paired by seed against the
  same scenario's round-robin run (:data:`REFERENCE_POLICY`);
* :func:`summarise` / :func:`summary_markdown` — one row per (scenario, policy): means over
  seeds with 95% t-intervals (``*_ci95`` = half width), the MLPerf p99 verdict, decision time;
* :func:`fault_pairs` / :func:`fault_summary` / :func:`fault_markdown` — each run of a scenario
  with ``[[faults]]`` against its fault-free twin (:func:`eval.runner.fault_twin`).

Files: :mod:`eval.writers`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from eval.runner import RunResult, fault_twin
from eval.stats import mean_ci95

__all__ = [
    "REFERENCE_POLICY", "SUMMARY_METRICS", "NONDETERMINISTIC_PREFIXES", "MLPERF_COLUMNS", "P99_FAIL_MARK", "METRICS_NOTE", "runs_table",
    "summarise", "summary_markdown", "p99_verdict", "p99_fails", "invalid", "INVALID_MARK", "fmt_ci", "frame_markdown", "fault_pairs", "fault_summary", "fault_markdown",
]

#: The reference of every "vs rr" column: round-robin's table name.
REFERENCE_POLICY = "rr"

# per-run metrics summarised across seeds (mean and 95% CI), in table order
SUMMARY_METRICS = (
    "carbon_g",
    "reduction_vs_rr_pct",
    "energy_kwh",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "slo_violation_pct",
    "unfinished_pct",
)
TIMING_COLUMNS = ("decision_mean_s", "decision_p95_s")
#: Per-run MLPerf verdicts (p99 TTFT and p99 TPOT within the scenario's targets; each alone);
#: the summary has the share of seeds passing each (``<column>_share``).
MLPERF_COLUMNS = ("mlperf_p99_pass", "mlperf_ttft_p99_pass", "mlperf_tpot_p99_pass")
#: Mark of a policy that fails the MLPerf p99 criterion in at least one seed (every table).
P99_FAIL_MARK = "✗"
P99_PASS_MARK = "✓"
#: Mark of an invalid run (work left unfinished, its energy never spent): no reduction is shown.
INVALID_MARK = "(invalid: work left unfinished)"
#: The sentence every table's caption carries about its two SLO measures.
METRICS_NOTE = ("SLO viol. = per-request violation rate (% of completed requests whose TTFT or TPOT exceeds its "
                "target); MLPerf p99 = seeds whose p99 TTFT and p99 TPOT are both within the scenario's targets "
                f"(MLPerf's criterion; {P99_FAIL_MARK} = fails in some seed, with the percentile that failed).")
# per-run fault counters averaged over seeds in the summary (only when a scenario has faults)
FAULT_SUMMARY_COLUMNS = ("failed_over", "failed_over_completed", "wasted_carbon_g")
NONDETERMINISTIC_PREFIXES = ("decision_", "wall_", "cpu_")  # wall-clock columns, excluded from reproducibility checks


def runs_table(results: Sequence[RunResult], reference: str = REFERENCE_POLICY):
    """One row per run (pandas DataFrame) with ``reduction_vs_rr_pct`` from the same seed's rr run.

    Reduction = 100 x (carbon_rr - carbon) / carbon_rr for the round-robin run with the same
    scenario (label) and seed; NaN when that run is not in ``results``.
    """
    import pandas as pd

    rows = []
    for r in results:
        row = {"scenario": r.spec.scenario_name, "policy": r.spec.policy_name, "seed": int(r.spec.seed)}
        row.update({k: v for k, v in r.metrics.items() if np.isscalar(v) or v is None})
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    ref = df[df["policy"] == reference].set_index(["scenario", "seed"])["carbon_g"]
    keys = list(zip(df["scenario"], df["seed"]))
    ref_carbon = np.array([ref.get(k, np.nan) for k in keys], dtype=np.float64)
    df["rr_carbon_g"] = ref_carbon
    df["reduction_vs_rr_pct"] = 100.0 * (ref_carbon - df["carbon_g"].to_numpy(np.float64)) / ref_carbon
    return df


def summarise(runs, *, reference: str = REFERENCE_POLICY):
    """Summary DataFrame: one row per (scenario, policy), in first-appearance order.

    ``runs`` is the output of :func:`runs_table` (or a list of :class:`RunResult`). When any
    run's scenario has faults, every row also gets the mean fault counters
    (:data:`FAULT_SUMMARY_COLUMNS`) and ``ledger_ok_share`` (share of seeds whose end-of-episode
    ledger balanced).
    """
    import pandas as pd

    if not hasattr(runs, "columns"):
        runs = runs_table(runs, reference)
    faults = "scenario_faults" in runs and bool((runs["scenario_faults"].fillna(0) > 0).any())
    out = []
    for (scen, pol), g in runs.groupby(["scenario", "policy"], sort=False):
        row: dict[str, Any] = {"scenario": scen, "policy": pol, "seeds": int(len(g))}
        for m in SUMMARY_METRICS:
            if m not in g:
                continue
            mean, ci = mean_ci95(g[m].to_numpy(np.float64))
            row[m] = mean
            row[m + "_ci95"] = ci
        for c, name in [(c, c + "_share") for c in MLPERF_COLUMNS] + [("run_valid", "valid_share")]:
            if c in g:
                row[name] = float(np.mean(g[c].astype(float)))
        for c in ("requests_completed", "requests_in_flight", "requests_failed"):
            if c in g:
                row[c] = float(g[c].mean())
        if faults:
            for c in FAULT_SUMMARY_COLUMNS:
                if c in g:
                    row[c] = float(g[c].mean())
            if "ledger_ok" in g:
                row["ledger_ok_share"] = float(np.mean(g["ledger_ok"].astype(float)))
        for c in TIMING_COLUMNS:
            if c in g:
                row[c] = float(g[c].mean())
        out.append(row)
    return pd.DataFrame(out)


def p99_verdict(row: Mapping[str, Any] | Any, seeds: int | None = None) -> str:
    """The MLPerf p99 verdict of a summary row as table text: ``"3/3 ✓"`` when every seed's p99
    TTFT and p99 TPOT are within the targets, else ``"1/3 ✗"`` followed by which percentile
    failed in some seed (``TTFT``, ``TPOT`` or both); ``"–"`` without a verdict.

    ``row`` holds ``mlperf_p99_pass_share`` (and optionally the TTFT / TPOT shares, see
    :data:`MLPERF_COLUMNS`) and ``seeds`` (or pass ``seeds``)."""
    def get(k: str) -> float:
        v = row.get(k, float("nan")) if hasattr(row, "get") else float("nan")
        try:
            return float(v)
        except (TypeError, ValueError):
            return float("nan")

    share = get("mlperf_p99_pass_share")
    n = int(seeds if seeds is not None else get("seeds"))
    if not np.isfinite(share) or n <= 0:
        return "–"
    k = int(round(share * n))
    if k == n:
        return f"{k}/{n} {P99_PASS_MARK}"
    which = [name for name, c in (("TTFT", "mlperf_ttft_p99_pass_share"), ("TPOT", "mlperf_tpot_p99_pass_share"))
             if np.isfinite(get(c)) and get(c) < 1.0]
    return f"{k}/{n} {P99_FAIL_MARK}" + (f" ({'+'.join(which)})" if which else "")


def invalid(row: Mapping[str, Any] | Any) -> bool:
    """Whether some seed of a summary row is an invalid run (more than
    :data:`eval.runner.VALID_UNFINISHED_PCT` of its requests left unfinished)."""
    v = row.get("valid_share", float("nan")) if hasattr(row, "get") else float("nan")
    try:
        return bool(np.isfinite(float(v)) and float(v) < 1.0)
    except (TypeError, ValueError):
        return False


def p99_fails(row: Mapping[str, Any] | Any) -> bool:
    """Whether a summary row fails the MLPerf p99 criterion in at least one seed."""
    v = row.get("mlperf_p99_pass_share", float("nan")) if hasattr(row, "get") else float("nan")
    return bool(np.isfinite(float(v)) and float(v) < 1.0)


def fmt_ci(m: float, ci: float = float("nan"), d: int = 1) -> str:
    """``"12.3 ± 0.4"`` (``d`` decimals; the ± part only with a finite CI; ``–`` without a mean)."""
    if m is None or not np.isfinite(m):
        return "–"
    return f"{m:.{d}f}" + (f" ± {ci:.{d}f}" if ci is not None and np.isfinite(ci) else "")


def fmt_spec_ci(v: float, ci: float, fmt: str = ".1f") -> str:
    """``"+1.23 ± 0.45"``: ``v`` in the format spec ``fmt`` (a sign allowed), the ± part (unsigned)
    only with a finite CI; ``n/a`` without a finite value."""
    if not np.isfinite(v):
        return "n/a"
    return f"{v:{fmt}}" + (f" ± {ci:{fmt.lstrip('+')}}" if np.isfinite(ci) else "")


def frame_markdown(df, columns: Sequence[str] | None = None) -> str:
    """A DataFrame of display strings as a Markdown table."""
    cols = list(columns or df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _sig(x: float, digits: int = 3) -> str:
    if x is None or not np.isfinite(x):
        return "–"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:,.{decimals}f}"


def _pm(mean: float, ci: float, digits: int = 3, scale: float = 1.0) -> str:
    if mean is None or not np.isfinite(mean):
        return "–"
    text = _sig(mean * scale, digits)
    if ci is not None and np.isfinite(ci):
        text += f" ± {_sig(ci * scale, 2)}"
    return text


def _fixed(mean: float, ci: float, decimals: int = 1) -> str:
    if mean is None or not np.isfinite(mean):
        return "–"
    text = f"{mean:.{decimals}f}"
    if ci is not None and np.isfinite(ci):
        text += f" ± {ci:.{decimals}f}"
    return text


def summary_markdown(summary, *, timing: bool = True) -> str:
    """The summary as a Markdown table (means ± 95% CI half-widths; latencies in ms): the
    per-request SLO violation rate beside the MLPerf p99 verdict (:func:`p99_verdict`; ✗ marks a
    policy failing it in some seed); a row with an invalid run (:func:`invalid`) shows no
    reduction ("invalid") and is marked in its unfinished column; with a ``failed over`` column (mean requests failed over per
    episode) when the summary has one."""
    faults = "failed_over" in getattr(summary, "columns", ())
    head = [
        "scenario", "policy", "seeds", "carbon (kg)", "vs rr (%)", "energy (kWh)",
        "TTFT p50/p90/p99 (ms)", "TPOT p50/p90/p99 (ms)", "SLO viol. (%)", "unfinished (%)", "MLPerf p99 pass (seeds)",
    ]
    if faults:
        head.append("failed over")
    if timing:
        head.append("decision mean/p95 (ms)")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for _, r in summary.iterrows():
        def g(k: str, r: Any = r) -> float:
            v = r.get(k, float("nan"))
            return float(v) if v is not None else float("nan")

        lat = lambda p: "/".join(_sig(g(f"{p}_{q}_s") * 1e3, 3) for q in ("p50", "p90", "p99"))  # noqa: E731
        seeds = int(r["seeds"])
        bad = invalid(r)
        cells = [
            str(r["scenario"]), str(r["policy"]), str(seeds),
            _pm(g("carbon_g"), g("carbon_g_ci95"), 3, 1e-3),
            "invalid" if bad else _fixed(g("reduction_vs_rr_pct"), g("reduction_vs_rr_pct_ci95"), 1),
            _pm(g("energy_kwh"), g("energy_kwh_ci95"), 3),
            lat("ttft"), lat("tpot"),
            _fixed(g("slo_violation_pct"), g("slo_violation_pct_ci95"), 2),
            _fixed(g("unfinished_pct"), float("nan"), 1) + (f" {INVALID_MARK}" if bad else ""),
            p99_verdict(r, seeds),
        ]
        if faults:
            cells.append(_sig(g("failed_over"), 3))
        if timing:
            cells.append(f"{_sig(g('decision_mean_s') * 1e3, 2)}/{_sig(g('decision_p95_s') * 1e3, 2)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# fault report: each run of a fault scenario against the same run without its faults


def fault_pairs(results: Sequence[RunResult]):
    """One row per run of a scenario with faults whose fault-free twin (:func:`fault_twin`) is
    also in ``results`` (pandas DataFrame, in the order of ``results``).

    Columns: ``scenario``, ``policy``, ``seed``, ``arrived``; the fault counters of the fault
    run: ``failed_over`` (requests aborted by an outage and placed again; a request in transit
    to, queued at or running in a datacenter that goes down counts once per abort),
    ``failed_over_completed``, ``wasted_energy_kj`` / ``wasted_carbon_g`` (work lost to
    aborts), ``invalid_actions``; then each metric with and without the faults (``*_base``):
    ``slo_violations``, ``slo_violation_pct`` (per completed request), ``carbon_g``,
    ``ttft_p99_s``, ``unfinished`` (in flight at truncation + never placed); the differences
    ``slo_violation_pp`` (percentage points), ``extra_carbon_g`` (= ``carbon_g - carbon_g_base``
    exactly) and ``extra_carbon_pct`` (of the fault-free run); ``ledger_ok`` (both runs'
    end-of-episode ledgers balanced).
    """
    import pandas as pd

    by_id = {r.spec.run_id: r for r in results}
    rows = []
    for r in results:
        if not r.spec.faults or not r.metrics.get("scenario_faults"):
            continue
        twin = by_id.get(fault_twin(r.spec).run_id)
        if twin is None:
            continue
        m, b = r.metrics, twin.metrics

        def unfinished(x: Mapping[str, Any]) -> int:
            return int(x.get("requests_in_flight", 0)) + int(x.get("requests_unplaced", 0))

        extra = float(m["carbon_g"]) - float(b["carbon_g"])
        rows.append({
            "scenario": r.spec.scenario_name,
            "policy": r.spec.policy_name,
            "seed": int(r.spec.seed),
            "arrived": int(m["requests_arrived"]),
            "failed_over": int(m["failed_over"]),
            "failed_over_completed": int(m["failed_over_completed"]),
            "failed_over_base": int(b["failed_over"]),
            "wasted_energy_kj": float(m["wasted_energy_kj"]),
            "wasted_carbon_g": float(m["wasted_carbon_g"]),
            "invalid_actions": int(m.get("invalid_actions", 0)),
            "slo_violations": int(m["slo_violations"]),
            "slo_violations_base": int(b["slo_violations"]),
            "slo_violation_pct": float(m["slo_violation_pct"]),
            "slo_violation_pct_base": float(b["slo_violation_pct"]),
            "slo_violation_pp": float(m["slo_violation_pct"]) - float(b["slo_violation_pct"]),
            "carbon_g": float(m["carbon_g"]),
            "carbon_g_base": float(b["carbon_g"]),
            "extra_carbon_g": extra,
            "extra_carbon_pct": 100.0 * extra / float(b["carbon_g"]) if b["carbon_g"] else float("nan"),
            "ttft_p99_s": float(m["ttft_p99_s"]),
            "ttft_p99_s_base": float(b["ttft_p99_s"]),
            "mlperf_p99_pass": bool(m.get("mlperf_p99_pass", False)),
            "mlperf_p99_pass_base": bool(b.get("mlperf_p99_pass", False)),
            "unfinished": unfinished(m),
            "unfinished_base": unfinished(b),
            "ledger_ok": bool(m["ledger_ok"]) and bool(b["ledger_ok"]),
        })
    return pd.DataFrame(rows)


# fault_pairs columns averaged over seeds by fault_summary (the differences are recomputed from
# the means, so extra_carbon_g = carbon_g - carbon_g_base holds in the summary too)
_FAULT_MEANS = (
    "arrived", "failed_over", "failed_over_completed", "failed_over_base", "wasted_energy_kj", "wasted_carbon_g",
    "invalid_actions", "slo_violations", "slo_violations_base", "slo_violation_pct", "slo_violation_pct_base",
    "carbon_g", "carbon_g_base", "ttft_p99_s", "ttft_p99_s_base", "unfinished", "unfinished_base",
)


def fault_summary(pairs):
    """Per (scenario, policy) of :func:`fault_pairs`: ``seeds``, the mean of each column over
    seeds, ``slo_violation_pp`` = ``slo_violation_pct - slo_violation_pct_base``,
    ``extra_carbon_g`` = ``carbon_g - carbon_g_base`` and ``extra_carbon_pct`` (of
    ``carbon_g_base``) from those means, 95% t-interval half-widths ``*_ci95`` of the two
    differences over the per-seed pairs, and ``ledger_ok`` (every run balanced)."""
    import pandas as pd

    out = []
    if len(pairs) == 0:
        return pd.DataFrame(out)
    for (scen, pol), g in pairs.groupby(["scenario", "policy"], sort=False):
        row: dict[str, Any] = {"scenario": scen, "policy": pol, "seeds": int(len(g))}
        for c in _FAULT_MEANS:
            row[c] = mean_ci95(g[c].to_numpy(np.float64))[0]
        row["slo_violation_pp"] = row["slo_violation_pct"] - row["slo_violation_pct_base"]
        row["slo_violation_pp_ci95"] = mean_ci95(g["slo_violation_pp"].to_numpy(np.float64))[1]
        row["extra_carbon_g"] = row["carbon_g"] - row["carbon_g_base"]
        row["extra_carbon_g_ci95"] = mean_ci95(g["extra_carbon_g"].to_numpy(np.float64))[1]
        row["extra_carbon_pct"] = 100.0 * row["extra_carbon_g"] / row["carbon_g_base"] if row["carbon_g_base"] else float("nan")
        row["ledger_ok"] = bool(g["ledger_ok"].astype(bool).all())
        for c in ("mlperf_p99_pass", "mlperf_p99_pass_base"):
            row[c + "_share"] = float(np.mean(g[c].astype(float))) if c in g else float("nan")
        out.append(row)
    return pd.DataFrame(out)


def _pair_verdict(r: Any, suffix: str) -> str:
    """:func:`p99_verdict` of the fault run (``suffix=""``) or of its twin (``"_base"``), from a
    :func:`fault_summary` row (shares) or a :func:`fault_pairs` row (one seed's bool)."""
    seeds = int(r.get("seeds", 1))
    share = r.get(f"mlperf_p99_pass{suffix}_share", r.get(f"mlperf_p99_pass{suffix}", float("nan")))
    return p99_verdict({"mlperf_p99_pass_share": float(share)}, seeds)


def fault_markdown(table) -> str:
    """:func:`fault_summary` (or :func:`fault_pairs`) as a Markdown table: means over seeds;
    ``w/o`` = the same run without the faults; ± = 95% CI half-width over seeds; the MLPerf p99
    verdict (seeds passing, ✗ = some seed fails) beside the per-request violation rate."""
    head = ["scenario", "policy", "seeds", "failed over", "f.o. completed", "wasted (kJ)", "SLO viol. (%)", "w/o (%)",
            "Δ (pp)", "MLPerf p99 pass", "w/o", "carbon (g)", "w/o (g)", "extra (g)", "extra (%)", "TTFT p99 (ms)",
            "w/o (ms)", "unfinished", "ledger balanced"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for _, r in table.iterrows():
        def g(k: str, r: Any = r) -> float:
            v = r.get(k, float("nan"))
            return float(v) if v is not None else float("nan")

        def num(k: str) -> str:  # counts: integers when they are
            v = g(k)
            return str(int(v)) if np.isfinite(v) and v == int(v) else _sig(v, 3)

        cells = [
            str(r["scenario"]), str(r["policy"]), str(int(r.get("seeds", 1))),
            num("failed_over"), num("failed_over_completed"), f"{g('wasted_energy_kj'):.2f}",
            f"{g('slo_violation_pct'):.2f}", f"{g('slo_violation_pct_base'):.2f}",
            _fixed(g("slo_violation_pp"), g("slo_violation_pp_ci95"), 2),
            _pair_verdict(r, ""), _pair_verdict(r, "_base"),
            f"{g('carbon_g'):.3f}", f"{g('carbon_g_base'):.3f}",
            _fixed(g("extra_carbon_g"), g("extra_carbon_g_ci95"), 3), f"{g('extra_carbon_pct'):+.1f}",
            _sig(g("ttft_p99_s") * 1e3, 3), _sig(g("ttft_p99_s_base") * 1e3, 3), num("unfinished"),
            "yes" if bool(r["ledger_ok"]) else "NO",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

