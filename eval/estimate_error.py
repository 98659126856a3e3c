"""The schedulers' latency estimates against what the simulator produced (issue 40, item 1).

:func:`estimate_errors` joins a scheduler's :class:`solvers.estimates.EstimateLog` (what it
predicted for each request it placed, at the datacenter it chose) with the simulator's request
records on (arrival time, origin): both carry the very same float arrival time, so the join is
exact; a request placed twice (re-queued after an outage) keeps its last estimate. The error is
*predicted minus realised* (seconds): negative = the scheduler was optimistic, which is what
breaks the SLO. :func:`error_metrics` summarises it as run metrics (milliseconds):

    ttft_estimate_error_p1_ms ... _p99_ms   quantiles 1, 10, 50, 90, 99 of predicted - realised TTFT
    tpot_estimate_error_p1_ms ... _p99_ms   the same for TPOT
    estimate_matched_pct                    % of the measured completions with an estimate

Only completions that arrived inside the measurement window are counted (all of them without a
window). Percentiles are numpy's linear interpolation.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["QUANTILES", "estimate_errors", "error_metrics", "ERROR_METRICS", "error_line"]

#: The quantiles (percent) of the error reported.
QUANTILES = (1, 10, 50, 90, 99)
#: The run metrics :func:`error_metrics` returns.
ERROR_METRICS = tuple(f"{k}_estimate_error_p{q}_ms" for k in ("ttft", "tpot") for q in QUANTILES) + ("estimate_matched_pct",)


def estimate_errors(estimates: Mapping[str, np.ndarray], records: Mapping[str, np.ndarray],
                    window_start_s: float = -np.inf) -> dict[str, np.ndarray]:
    """Per matched completion: ``ttft_error_s``, ``tpot_error_s`` (predicted - realised, s),
    ``ttft_estimate_s``, ``ttft_s``, ``tpot_estimate_s``, ``tpot_s``; plus ``n_records`` (the
    completions that arrived at or after ``window_start_s``, as a 0-d array)."""
    arr = np.asarray(records.get("arrival_s", np.zeros(0)), dtype=np.float64)
    org = np.asarray(records.get("origin", np.zeros(0)), dtype=np.int64)
    keep = arr >= window_start_s
    arr, org = arr[keep], org[keep]
    ttft = np.asarray(records.get("ttft_s", np.zeros(0)), dtype=np.float64)[keep]
    tpot = np.asarray(records.get("tpot_s", np.zeros(0)), dtype=np.float64)[keep]
    e_arr = np.asarray(estimates.get("arrival_s", np.zeros(0)), dtype=np.float64)
    e_org = np.asarray(estimates.get("origin", np.zeros(0)), dtype=np.int64)
    empty = np.zeros(0)
    out = {"ttft_error_s": empty, "tpot_error_s": empty, "ttft_estimate_s": empty, "ttft_s": empty,
           "tpot_estimate_s": empty, "tpot_s": empty, "n_records": np.asarray(arr.size)}
    if e_arr.size == 0 or arr.size == 0:
        return out
    # the last estimate of each (arrival, origin): sort by key, decision order kept (stable)
    order = np.lexsort((np.arange(e_arr.size), e_org, e_arr))
    ka, ko = e_arr[order], e_org[order]
    last = np.ones(order.size, dtype=bool)
    last[:-1] = (ka[1:] != ka[:-1]) | (ko[1:] != ko[:-1])
    order, ka, ko = order[last], ka[last], ko[last]
    # find each record's key among the sorted estimate keys (vectorised; the rare ties in
    # arrival time between origins are resolved by a short scan)
    n = ka.size
    pos = np.searchsorted(ka, arr, side="left")
    hit = np.full(arr.size, -1, dtype=np.int64)
    p = np.minimum(pos, n - 1)
    direct = (pos < n) & (ka[p] == arr) & (ko[p] == org)
    hit[direct] = order[p[direct]]
    for r in np.flatnonzero(~direct & (pos < n) & (ka[p] == arr)):
        i = int(pos[r])
        while i < n and ka[i] == arr[r]:
            if ko[i] == org[r]:
                hit[r] = order[i]
                break
            i += 1
    m = hit >= 0
    te = np.asarray(estimates["ttft_estimate_s"], dtype=np.float64)[hit[m]]
    pe = np.asarray(estimates["tpot_estimate_s"], dtype=np.float64)[hit[m]]
    out.update(ttft_estimate_s=te, ttft_s=ttft[m], tpot_estimate_s=pe, tpot_s=tpot[m],
               ttft_error_s=te - ttft[m], tpot_error_s=pe - tpot[m])
    return out


def error_metrics(errors: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The run metrics of :data:`ERROR_METRICS` from :func:`estimate_errors`' output (NaN when
    nothing matched). TPOT errors count requests with more than one output token only."""
    out: dict[str, float] = {}
    for k in ("ttft", "tpot"):
        e = np.asarray(errors[f"{k}_error_s"], dtype=np.float64)
        e = e[np.isfinite(e)]
        for q in QUANTILES:
            out[f"{k}_estimate_error_p{q}_ms"] = float(np.percentile(e, q)) * 1e3 if e.size else float("nan")
    n = int(np.asarray(errors["n_records"]))
    out["estimate_matched_pct"] = 100.0 * np.asarray(errors["ttft_error_s"]).size / n if n else float("nan")
    return out


def error_line(label: str, metrics: Mapping[str, float]) -> str:
    """One printable line: ``<label>: ttft_estimate_error_p1_ms=... ... estimate_matched_pct=...``."""
    parts = [f"{k}={float(metrics[k]):.1f}" for k in ERROR_METRICS if k in metrics]
    return f"{label}: " + " ".join(parts)


def error_table(runs: object) -> object:
    """One row per (scenario, policy) of a runs table (:func:`eval.experiments.runs_table`) whose
    runs logged estimates: the mean over its seeds of each :data:`ERROR_METRICS` figure, and
    ``seeds``. None when no run logged estimates."""
    import pandas as pd

    df = runs if isinstance(runs, pd.DataFrame) else pd.DataFrame(runs)
    cols = [c for c in ERROR_METRICS if c in df.columns]
    if not cols or "ttft_estimate_error_p90_ms" not in df.columns:
        return None
    df = df[df["ttft_estimate_error_p90_ms"].notna()]
    if df.empty:
        return None
    g = df.groupby(["scenario", "policy"], sort=False)
    out = g[cols].mean()
    out.insert(0, "seeds", g.size())
    return out.reset_index()


def error_lines(table: object) -> list[str]:
    """``<scenario> <policy> (n seeds): ttft_estimate_error_p1_ms=... ...`` per row of
    :func:`error_table` (means over seeds)."""
    if table is None:
        return []
    rows = table.to_dict("records")  # type: ignore[attr-defined]
    return [error_line(f"{r['scenario']} {r['policy']} ({int(r['seeds'])} seeds)", r) for r in rows]


def error_markdown(table: object) -> str:
    """:func:`error_table` as a markdown table (milliseconds; predicted - realised)."""
    if table is None:
        return ""
    head = ["scenario", "policy", "seeds"] + [f"TTFT p{q}" for q in QUANTILES] + [f"TPOT p{q}" for q in QUANTILES] + ["matched %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table.to_dict("records"):  # type: ignore[attr-defined]
        vals = [f"{r[f'ttft_estimate_error_p{q}_ms']:.0f}" for q in QUANTILES]
        vals += [f"{r[f'tpot_estimate_error_p{q}_ms']:.1f}" for q in QUANTILES]
        lines.append("| " + " | ".join([str(r["scenario"]), str(r["policy"]), str(int(r["seeds"]))] + vals
                                       + [f"{r['estimate_matched_pct']:.1f}"]) + " |")
    return "\n".join(lines) + "\n"
