"""``python -m eval.transfer DIR``: the per-model transfer matrix of learned agents (issue 41
item 4) from a finished headline matrix that ran round-robin, the facility MILP and several
agents on the same starts, e.g.::

    carbon-gym experiment headline --preset full --models llama8b,qwen7b,mixtral8x7b --loads moderate,high \\
        --policies rr,milp,learned-llama8b=learned:train/checkpoints/llama8b_set.npz,... --heldout-seeds --seeds 4 \\
        --out results/transfer

Per scenario and agent, paired by start: the agent's carbon reduction vs round-robin (%, mean and
95% interval), its **share of the MILP's reduction** (the agent's mean paired reduction / the
MILP's), the violation difference agent - MILP (pp of completed requests, paired) and the
MLPerf p99 passes. Then the matrix: one row per agent, one column per model (the scenarios of a
model averaged with equal weight), each cell the share of the MILP's reduction; the agent
trained on that model is the diagonal.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

import numpy as np

from eval.stats import mean_ci95
from eval.tables import fmt_spec_ci

__all__ = ["transfer_rows", "transfer_markdown", "main"]


def _model_of(scenario: str) -> str:
    return scenario.rsplit("-", 1)[0]


def transfer_rows(runs: Any, agents: Sequence[str], milp: str = "milp", rr: str = "rr") -> list[dict[str, Any]]:
    """One row per (scenario, agent) of ``runs`` (a headline ``runs.csv`` as a DataFrame), paired
    over the starts where rr, the MILP and the agent all ran."""
    rows: list[dict[str, Any]] = []
    for scen in sorted(runs["scenario"].unique()):
        g = runs[runs["scenario"] == scen]
        by = {p: x.set_index("seed") for p, x in g.groupby("policy")}
        if rr not in by or milp not in by:
            continue
        for a in agents:
            if a not in by:
                continue
            seeds = sorted(set(by[rr].index) & set(by[milp].index) & set(by[a].index))
            if not seeds:
                continue
            c_rr = by[rr].loc[seeds, "carbon_g"].to_numpy(np.float64)
            red_m = 100.0 * (c_rr - by[milp].loc[seeds, "carbon_g"].to_numpy(np.float64)) / c_rr
            red_a = 100.0 * (c_rr - by[a].loc[seeds, "carbon_g"].to_numpy(np.float64)) / c_rr
            v_m = by[milp].loc[seeds, "slo_violation_pct"].to_numpy(np.float64)
            v_a = by[a].loc[seeds, "slo_violation_pct"].to_numpy(np.float64)
            (mm, mci), (am, aci), (dv, dvci) = mean_ci95(red_m), mean_ci95(red_a), mean_ci95(v_a - v_m)
            rows.append({
                "scenario": scen, "model": _model_of(scen), "agent": a, "starts": len(seeds),
                "milp_reduction_pct": mm, "milp_reduction_ci95": mci, "milp_violation_pct": float(v_m.mean()),
                "agent_reduction_pct": am, "agent_reduction_ci95": aci, "agent_violation_pct": float(v_a.mean()),
                "share_of_milp": am / mm if abs(mm) > 1e-9 else float("nan"),
                "violation_diff_pp": dv, "violation_diff_ci95": dvci,
                "milp_p99_pass": int(by[milp].loc[seeds, "mlperf_p99_pass"].sum()),
                "agent_p99_pass": int(by[a].loc[seeds, "mlperf_p99_pass"].sum()),
                "agent_invalid": int((by[a].loc[seeds, "run_valid"] < 0.5).sum()),
            })
    return rows


def transfer_markdown(rows: Sequence[dict[str, Any]], agents: Sequence[str]) -> str:
    """The per-scenario table and the agent x model matrix (module docstring)."""
    out = ["| scenario | agent | starts | MILP vs rr % (viol. %; p99) | agent vs rr % (viol. %; p99) | share of the MILP's "
           "reduction | viol. agent - MILP (pp) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["starts"]
        bad = f", {r['agent_invalid']} invalid" if r["agent_invalid"] else ""
        out.append(f"| {r['scenario']} | {r['agent']} | {n} | {fmt_spec_ci(r['milp_reduction_pct'], r['milp_reduction_ci95'])} "
                   f"({r['milp_violation_pct']:.2f}; {r['milp_p99_pass']}/{n}) | {fmt_spec_ci(r['agent_reduction_pct'], r['agent_reduction_ci95'])} "
                   f"({r['agent_violation_pct']:.2f}; {r['agent_p99_pass']}/{n}{bad}) | {100 * r['share_of_milp']:.0f}% "
                   f"| {r['violation_diff_pp']:+.2f} |")
    models = sorted({r["model"] for r in rows})
    out += ["", "Share of the MILP's reduction (mean over the model's scenarios; in parentheses the mean violation "
            "difference agent - MILP, pp):", "", "| agent | " + " | ".join(models) + " |",
            "|---|" + "---|" * len(models)]
    for a in agents:
        cells = []
        for m in models:
            sel = [r for r in rows if r["agent"] == a and r["model"] == m]
            if not sel:
                cells.append("–")
                continue
            share = float(np.mean([r["share_of_milp"] for r in sel]))
            dv = float(np.mean([r["violation_diff_pp"] for r in sel]))
            cells.append(f"{100 * share:.0f}% ({dv:+.2f})")
        out.append(f"| {a} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.transfer", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="a finished headline matrix (its runs.csv)")
    ap.add_argument("--agents", default=None, help="comma list of agent policy labels (default: every label starting with 'learned')")
    ap.add_argument("--milp", default="milp", help="the MILP's policy label (default milp)")
    a = ap.parse_args(argv)
    import pandas as pd

    from carbon_gym.errors import ConfigError

    path = os.path.join(a.dir, "runs.csv")
    try:
        if not os.path.isfile(path):
            raise ConfigError("dir", f"{path!r} not found (a finished carbon-gym experiment headline matrix)")
        runs = pd.read_csv(path)
        labels = sorted(runs["policy"].unique())
        agents = [s for s in a.agents.split(",") if s] if a.agents else [p for p in labels if str(p).startswith("learned")]
        missing = [x for x in [*agents, a.milp, "rr"] if x not in labels]
        if missing or not agents:
            raise ConfigError("--agents", f"policies {missing or agents} are not in {path!r}", allowed=labels)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(transfer_markdown(transfer_rows(runs, agents, milp=a.milp), agents))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
