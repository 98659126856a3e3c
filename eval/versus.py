"""Every row of some capacity matrices against one policy of another matrix, paired by start.

    python -m eval.versus REFERENCE_DIR POLICY MATRIX_DIR [MATRIX_DIR ...]

A capacity matrix's "vs rr+reactive %" column compares with the ``rr+reactive`` run of the same
matrix. When the reference was run in another matrix (another autoscaler setting, e.g.
``--set capacity.params.down_util=0.54``), this prints, per matrix and (scenario, policy) of the
``MATRIX_DIR`` matrices, the reduction of carbon against ``POLICY`` of ``REFERENCE_DIR``
(``100 x (reference - run) / reference`` per start, mean ± 95% t-interval over the starts both
ran), beside the run's violation and MLPerf p99 pass. Starts are paired only where both matrices
ran the same episode: their always-on round-robin runs (``rr (always on)``) must have the same
carbon to the last bit for every (scenario, seed) they share, else it stops and names the first
that differs (the simulation is deterministic, so a difference means another start, scenario or
code). Each directory holds a ``runs.csv``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Sequence

import numpy as np

from eval.capacity_report import ALWAYS_ON_LABEL
from eval.stats import mean_ci95


def _runs(d: str) -> Any:
    import pandas as pd

    path = os.path.join(d, "runs.csv")
    if not os.path.isfile(path):
        raise SystemExit(f"{d}: no runs.csv (a matrix directory, e.g. results/slo/capacity-qwen-mixtral/capacity)")
    return pd.read_csv(path)


def carbon_by_start(runs: Any, policy: str) -> dict[tuple[str, int], float]:
    """{(scenario, seed): carbon_g} of ``policy``'s runs in ``runs`` (a runs table; the first of a
    start run twice)."""
    sub = runs[runs["policy"] == policy].drop_duplicates(["scenario", "seed"], keep="first")
    return {(str(s), int(k)): float(c) for s, k, c in zip(sub["scenario"], sub["seed"], sub["carbon_g"])}


def first_other_episode(mine: dict[tuple[str, int], float],
                        theirs: dict[tuple[str, int], float]) -> tuple[tuple[str, int], float, float] | None:
    """The first start (sorted) both :func:`carbon_by_start` tables have whose carbon differs,
    with both figures (``mine``'s, ``theirs``), or None. The simulation is deterministic, so the
    same policy's carbon differing to the last bit means another episode (start, scenario or
    code), and runs of the two matrices cannot be paired there."""
    for key in sorted(set(mine) & set(theirs)):
        if mine[key] != theirs[key]:
            return key, mine[key], theirs[key]
    return None


def versus_table(reference: Any, policy: str, matrices: Sequence[Any], names: Sequence[str] | None = None) -> Any:
    """One row per (matrix, scenario, policy) of ``matrices`` (runs tables; ``names``: what the
    ``matrix`` column calls each, default its index): its reduction vs ``policy`` of ``reference``
    paired by start (module docstring); ValueError when a shared start's always-on rr differs, or
    the reference has no ``policy``."""
    import pandas as pd

    ref = carbon_by_start(reference, policy)
    if not ref:
        raise ValueError(f"the reference matrix has no {policy!r} run (it has: {sorted(set(reference['policy']))})")
    ref_on = carbon_by_start(reference, ALWAYS_ON_LABEL)
    rows = []
    for j, runs in enumerate(matrices):
        on = carbon_by_start(runs, ALWAYS_ON_LABEL)
        other = first_other_episode(on, ref_on)
        if other is not None:
            (scen, seed), here, there = other
            raise ValueError(f"{scen} seed {seed}: always-on rr {here!r} g here, {there!r} g in the "
                             "reference: not the same episode")
        for (scen, pol), sub in runs.groupby(["scenario", "policy"], sort=False):
            sub = sub.drop_duplicates("seed", keep="first")
            keys = [(str(scen), int(k)) for k in sub["seed"]]
            both = [i for i, k in enumerate(keys) if k in ref and k in on and k in ref_on]  # (rr checked above)
            if not both:
                continue
            part = sub.iloc[both]
            red = [100.0 * (ref[keys[i]] - c) / ref[keys[i]] for i, c in zip(both, part["carbon_g"])]
            m, ci = mean_ci95(red)
            rows.append({"matrix": names[j] if names is not None else str(j), "scenario": scen, "policy": pol,
                         "seeds": len(both), "reduction_pct": m, "reduction_ci95": ci,
                         "violation_pct": float(np.mean(part["slo_violation_pct"])),
                         "p99_pass": int(np.sum(part["mlperf_p99_pass"].astype(bool))),
                         "unfinished_pct": float(np.mean(part["unfinished_pct"])) if "unfinished_pct" in part else float("nan")})
    return pd.DataFrame(rows)


def versus_markdown(table: Any, reference_label: str) -> str:
    """The table as Markdown (one row per (matrix, scenario, policy))."""
    out = [f"| matrix | scenario | policy | seeds | vs {reference_label} % | SLO viol. % | MLPerf p99 pass | unfinished % |",
           "|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples(index=False):
        ci = "" if not np.isfinite(r.reduction_ci95) else f" ± {r.reduction_ci95:.1f}"
        out.append(f"| {r.matrix} | {r.scenario} | {r.policy} | {r.seeds} | {r.reduction_pct:.1f}{ci} | {r.violation_pct:.2f} | "
                   f"{r.p99_pass}/{r.seeds} | {r.unfinished_pct:.2f} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print :func:`versus_markdown` of the directories given (module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m eval.versus", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reference_dir")
    ap.add_argument("policy", help="the reference policy's label in REFERENCE_DIR's runs.csv, e.g. rr+reactive")
    ap.add_argument("matrix_dirs", nargs="+")
    a = ap.parse_args(argv)
    try:
        table = versus_table(_runs(a.reference_dir), a.policy, [_runs(d) for d in a.matrix_dirs],
                             [os.path.normpath(d) for d in a.matrix_dirs])
    except ValueError as exc:
        raise SystemExit(f"eval.versus: {exc}") from None
    print(versus_markdown(table, f"{a.policy} of {os.path.normpath(a.reference_dir)}"), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
