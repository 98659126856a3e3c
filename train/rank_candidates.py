"""Rank candidate checkpoints by the selection rule of the learned-policy checks.

Usage::

    python -m train.rank_candidates [--incumbent NAME] RESULTS.json [RESULTS.json ...]

Each file is the ``--json`` output of ``carbon-gym train evaluate --checkpoint CANDIDATE.zip``
on the same selection days (the candidate's name is the file's stem, minus a ``sel_`` prefix).
Per load (scenario) it prints the share of the facility MILP's carbon reduction (mean reduction
vs round-robin over the days / the MILP's mean) and the violation rate minus the MILP's (pp),
with ``*`` where both targets hold (share >= 80%, difference <= 0). The chosen candidate meets
both at the most loads; ties go to the higher minimum share over the loads, then to
``--incumbent``. The last line is ``chosen: NAME``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SHARE_TARGET = 0.8


def meets_targets(share: float, violation_diff_pp: float) -> bool:
    """Whether one load meets both targets: share of the MILP's reduction >= 80% and violations
    no higher than the MILP's."""
    return share >= SHARE_TARGET and violation_diff_pp <= 0.0


def score(summary: dict[str, dict[str, Any]]) -> tuple[int, float, list[tuple[str, float, float, int]]]:
    """(loads meeting both targets, minimum share, per load (scenario, share, violation
    difference in pp, episodes)) for one candidate's ``summary`` (``train.evaluate.summarise``)."""
    met, shares, rows = 0, [], []
    for scen, pols in summary.items():
        a, b = pols["learned"], pols["facility-milp"]
        share = a["reduction_pct"] / b["reduction_pct"] if b["reduction_pct"] else float("nan")
        dv = 100.0 * (a["violation_rate"] - b["violation_rate"])
        met += int(meets_targets(share, dv))
        shares.append(share)
        rows.append((scen, share, dv, int(a["episodes"])))
    return met, min(shares), rows


def main(argv: list[str] | None = None) -> str:
    """Print the ranking table; return the chosen candidate's name."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="train evaluate --json files, one per candidate")
    ap.add_argument("--incumbent", default=None, help="candidate that wins remaining ties (the shipped one)")
    args = ap.parse_args(argv)
    ranked = []
    for f in args.results:
        name = Path(f).stem.removeprefix("sel_")
        met, low, rows = score(json.loads(Path(f).read_text())["summary"])
        ranked.append((met, low, name == args.incumbent, name, rows))
    loads = [r[0] for r in ranked[0][4]]
    print("| candidate | " + " | ".join(loads) + " | loads meeting both | minimum share |")
    print("|---" * (len(loads) + 3) + "|")
    for met, low, _, name, rows in ranked:
        cells = [f"{100 * s:.0f}% / {dv:+.2f} pp{' *' if meets_targets(s, dv) else ''} ({n})" for _, s, dv, n in rows]
        print(f"| {name} | " + " | ".join(cells) + f" | {met} | {100 * low:.1f}% |")
    best = max(ranked, key=lambda r: (r[0], r[1], r[2]))
    print(f"chosen: {best[3]}")
    return best[3]


if __name__ == "__main__":  # pragma: no cover
    main()
