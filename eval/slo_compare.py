"""Policies compared at equal SLO (issue 40, item 3): each policy's best operating point among
those that pass MLPerf p99 in every start.

A knob-driven policy was run at several settings (its default, labelled by its name, and
``policy[knob=value]`` points, :func:`eval.frontiers.knob_label`); a policy without a knob at one.
For each (scenario, policy), :func:`best_within_slo` keeps the settings whose runs pass MLPerf
p99 TTFT *and* TPOT in every start and are valid in every start (no more than 1% of the work left
unfinished), and takes the one with the largest mean carbon reduction vs the reference
(round-robin of the same start, always on where the matrix has ``rr (always on)``). Two policies
are then compared at equal p99 pass: the anchor's (the facility MILP's) best point minus the
policy's, paired by start (mean ± 95% CI, percentage points of the reference's carbon). A policy
whose every setting fails p99 in some start has no point: "cannot pass" is the finding.

Caveat, stated in the tables: the best point is chosen on the same starts it is reported on (a
max over a policy's settings is optimistic by up to the spread of its settings' noise); with one
setting per policy (defaults chosen on training starts) there is no such selection.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from eval.frontiers import parse_knob_label
from eval.stats import mean_ci95

__all__ = ["best_within_slo", "best_within_slo_markdown"]


def _reductions(runs: Any, reference: str) -> Any:
    """``runs`` with ``reduction_pct``: 100 x (reference's carbon - carbon) / reference's, same
    scenario and seed."""
    ref = runs[runs["policy"] == reference].set_index(["scenario", "seed"])["carbon_g"]
    out = runs.copy()
    keys = list(zip(out["scenario"], out["seed"]))
    base = np.array([float(ref.get(k, np.nan)) for k in keys])
    out["reduction_pct"] = 100.0 * (base - out["carbon_g"].to_numpy(np.float64)) / base
    return out


def best_within_slo(runs: Any, *, anchor: str = "milp", reference: str | None = None) -> Any:
    """One row per (scenario, policy) other than the reference (module docstring): ``settings``
    run, ``passing`` (settings passing p99 in every start, valid), ``best`` (its label, or "" when
    none passes), ``reduction_pct`` / ``_ci95``, ``violation_pct``, ``ttft_p99_ms`` /
    ``tpot_p99_ms`` (the worst start's), ``seeds``, and ``anchor_minus_pp`` / ``_ci95`` /
    ``_n`` (the anchor's best point minus this one, paired by start; NaN for the anchor itself or
    when either has no point)."""
    import pandas as pd

    if reference is None:
        reference = "rr (always on)" if "rr (always on)" in set(runs["policy"]) else "rr"
    runs = _reductions(runs, reference)
    rows: list[dict[str, Any]] = []
    for scen in dict.fromkeys(runs["scenario"]):
        sub = runs[runs["scenario"] == scen]
        groups: dict[str, list[str]] = {}
        for lab in dict.fromkeys(sub["policy"]):
            parsed = parse_knob_label(str(lab))
            base = parsed[0] if parsed is not None else str(lab)
            if base != reference:
                groups.setdefault(base, []).append(str(lab))
        best: dict[str, tuple[float, str] | None] = {}
        passing: dict[str, int] = {}
        for base, labels in groups.items():
            cands = []
            for lab in labels:
                g = sub[sub["policy"] == lab]
                ok = bool(g["mlperf_p99_pass"].astype(bool).all())
                if "run_valid" in g:
                    ok = ok and bool(g["run_valid"].astype(bool).all())
                if ok:
                    cands.append((float(g["reduction_pct"].mean()), lab))
            passing[base] = len(cands)
            best[base] = max(cands) if cands else None
        a = best.get(anchor)
        a_red = sub[sub["policy"] == a[1]].set_index("seed")["reduction_pct"] if a else None
        for base, labels in groups.items():
            row: dict[str, Any] = {"scenario": scen, "policy": base, "settings": len(labels), "passing": passing[base],
                                   "best": "", "seeds": 0}
            b = best[base]
            nan = float("nan")
            row.update(reduction_pct=nan, reduction_pct_ci95=nan, violation_pct=nan, ttft_p99_ms=nan, tpot_p99_ms=nan,
                       anchor_minus_pp=nan, anchor_minus_pp_ci95=nan, anchor_minus_n=0)
            if b is not None:
                g = sub[sub["policy"] == b[1]]
                m, ci = mean_ci95(g["reduction_pct"].to_numpy(np.float64))
                row.update(best=b[1], seeds=len(g), reduction_pct=m, reduction_pct_ci95=ci,
                           violation_pct=float(g["slo_violation_pct"].mean()),
                           ttft_p99_ms=1e3 * float(g["ttft_p99_s"].max()), tpot_p99_ms=1e3 * float(g["tpot_p99_s"].max()))
                if a_red is not None and base != anchor:
                    mine = g.set_index("seed")["reduction_pct"]
                    common = a_red.index.intersection(mine.index)
                    d = (a_red.loc[common] - mine.loc[common]).to_numpy(np.float64)
                    dm, dci = mean_ci95(d)
                    row.update(anchor_minus_pp=dm, anchor_minus_pp_ci95=dci, anchor_minus_n=int(d.size))
            rows.append(row)
    return pd.DataFrame(rows)


def best_within_slo_markdown(table: Any, *, anchor: str = "milp") -> str:
    """:func:`best_within_slo` as a Markdown table."""
    from eval.tables import fmt_ci

    head = ("| scenario | policy | settings passing p99 in every start | best of them | vs rr % | SLO viol. % "
            f"| worst TTFT p99 (ms) | worst TPOT p99 (ms) | {anchor} - policy (pp, paired) |\n" + "|---" * 9 + "|\n")
    body = []
    for _, r in table.iterrows():
        if not r["best"]:
            body.append(f"| {r['scenario']} | {r['policy']} | 0/{r['settings']} | cannot pass | – | – | – | – | – |")
            continue
        gap = (f"{fmt_ci(r['anchor_minus_pp'], r['anchor_minus_pp_ci95'])} ({int(r['anchor_minus_n'])})"
               if np.isfinite(r["anchor_minus_pp"]) else "–")
        body.append(f"| {r['scenario']} | {r['policy']} | {r['passing']}/{r['settings']} | {r['best']} | "
                    f"{fmt_ci(r['reduction_pct'], r['reduction_pct_ci95'])} | {r['violation_pct']:.2f} | {r['ttft_p99_ms']:.0f} | "
                    f"{r['tpot_p99_ms']:.0f} | {gap} |")
    return head + "\n".join(body) + "\n"


def merged_matrices(dirs: Sequence[str], reference: str = "rr") -> Any:
    """The runs of the matrices ``dirs`` (each a directory with ``runs.csv``) as one table, each
    (scenario, policy, seed) once (the first matrix's). Pairing across matrices needs the same
    episodes: every (scenario, seed) the matrices share must have the same ``reference`` carbon
    to the last bit (the simulation is deterministic), else a ValueError names the first that
    differs."""
    import os

    import pandas as pd

    from eval.versus import carbon_by_start, first_other_episode

    parts = [pd.read_csv(os.path.join(d, "runs.csv")) for d in dirs]
    seen: dict[tuple[str, int], float] = {}
    where: dict[tuple[str, int], str] = {}
    for d, runs in zip(dirs, parts):
        mine = carbon_by_start(runs, reference)
        other = first_other_episode(mine, seen)
        if other is not None:
            key, here, there = other
            raise ValueError(f"{key[0]} seed {key[1]}: {reference} emitted {there!r} g in {where[key]} but "
                             f"{here!r} g in {d}: not the same episode, cannot pair")
        for key, c in mine.items():
            seen.setdefault(key, c)
            where.setdefault(key, d)
    runs = pd.concat(parts, ignore_index=True).drop_duplicates(["scenario", "policy", "seed"], keep="first")
    return runs.reset_index(drop=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eval.slo_compare MATRIX_DIR [MATRIX_DIR ...] --anchor LABEL``: each policy's
    best setting passing MLPerf p99 in every start, against ``LABEL``'s, paired by start, over the
    merged matrices (:func:`merged_matrices`: their round-robin runs must agree to the bit)."""
    import argparse
    import os
    import sys

    ap = argparse.ArgumentParser(prog="python -m eval.slo_compare", description=main.__doc__.split("\n\n")[0] if main.__doc__ else None)
    ap.add_argument("matrices", nargs="+", help="matrix directories (each with runs.csv)")
    ap.add_argument("--anchor", default="milp", help="the table label every policy is compared with (default milp)")
    ap.add_argument("--scenario", action="append", help="only these scenarios (repeatable; default all)")
    a = ap.parse_args(argv)
    for d in a.matrices:
        if not os.path.isfile(os.path.join(d, "runs.csv")):
            ap.error(f"{d!r}: no runs.csv there (a matrix directory, e.g. results/slo/mixtral8x7b/headline)")
    try:
        runs = merged_matrices(a.matrices)
    except ValueError as e:
        print(f"python -m eval.slo_compare: {e}", file=sys.stderr)
        return 2
    if a.scenario:
        runs = runs[runs["scenario"].isin(a.scenario)]
    if a.anchor not in set(runs["policy"]):
        ap.error(f"--anchor {a.anchor!r}: no such policy in the matrices (they have: {', '.join(sorted(set(map(str, runs['policy']))))})")
    print(best_within_slo_markdown(best_within_slo(runs, anchor=a.anchor), anchor=a.anchor))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
