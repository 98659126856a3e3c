"""Rank candidate checkpoints by the selection rule of the learned-policy checks.

Usage::

    python -m train.rank_candidates [--incumbent NAME] [--rule targets|margin] RESULTS.json [...]

Each file is the ``--json`` output of ``carbon-gym train evaluate --checkpoint CANDIDATE.npz``
on the selection days. The candidate's name is the file's stem minus a ``sel_`` prefix (or
``selN_`` / ``selN-M_``, N and M digits, for runs over further days); files of the same name are
merged (their episodes united and summarised again; an episode in two files is an error).
Per load (scenario) it prints the share of the facility MILP's carbon reduction (mean reduction
vs round-robin over the days / the MILP's mean) and the violation rate minus the MILP's (pp),
with ``*`` where both targets hold (share >= 80%, difference <= 0).

Rules: ``targets`` (the default; the first to fifth checks'): the chosen candidate meets both
targets at the most loads; ties go to the higher minimum share over the loads, then to
``--incumbent``. ``margin`` (the sixth check's): among the candidates whose share is at least
``--min-share`` at every load, the one with the largest smallest violation margin over the
loads (the MILP's rate minus the candidate's, pp); ties go to the higher minimum share, then to
``--incumbent``; if no candidate reaches ``--min-share`` at every load, the ``targets`` rule.
The last line is ``chosen: NAME``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

SHARE_TARGET = 0.8
_PREFIX = re.compile(r"^sel(\d+(-\d+)?)?_")


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


def candidate_name(path: str | Path) -> str:
    """The candidate a results file belongs to: its stem minus a ``sel_`` / ``selN_`` /
    ``selN-M_`` prefix."""
    return _PREFIX.sub("", Path(path).stem, count=1)


def merged_summary(paths: list[str]) -> dict[str, dict[str, Any]]:
    """The summary of one candidate's results files: the file's own ``summary`` for one file;
    for several, their per-episode ``results`` united and summarised again
    (``train.evaluate.summarise``; :class:`ValueError` if an episode is in two files)."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    if len(docs) == 1:
        return docs[0]["summary"]
    from .evaluate import summarise

    results: dict[str, dict[str, Any]] = {}
    policies: list[str] = []
    for p, doc in zip(paths, docs):
        for scen, eps in doc["results"].items():
            into = results.setdefault(scen, {})
            for key, per in eps.items():
                if key in into:
                    raise ValueError(f"episode {key!r} of {scen!r} is in two results files of one candidate ({p})")
                into[key] = per
                policies += [q for q in per if q not in policies]
    return summarise(results, policies)


def main(argv: list[str] | None = None) -> str:
    """Print the ranking table; return the chosen candidate's name."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="train evaluate --json files, one or more per candidate")
    ap.add_argument("--incumbent", default=None, help="candidate that wins remaining ties (the shipped one)")
    ap.add_argument("--rule", choices=["targets", "margin"], default="targets", help="selection rule (see above)")
    ap.add_argument("--min-share", type=float, default=0.85,
                    help="rule 'margin': smallest share of the MILP's reduction allowed at any load (fraction)")
    args = ap.parse_args(argv)
    files: dict[str, list[str]] = {}
    for f in args.results:
        files.setdefault(candidate_name(f), []).append(f)
    ranked = []
    for name, paths in files.items():
        met, low, rows = score(merged_summary(paths))
        margin = min(-dv for _, _, dv, _ in rows)
        ranked.append((met, low, name == args.incumbent, name, rows, margin))
    loads = [r[0] for r in ranked[0][4]]
    print("| candidate | " + " | ".join(loads) + " | loads meeting both | minimum share | smallest margin (pp) |")
    print("|---" * (len(loads) + 4) + "|")
    for met, low, _, name, rows, margin in ranked:
        cells = [f"{100 * s:.0f}% / {dv:+.2f} pp{' *' if meets_targets(s, dv) else ''} ({n})" for _, s, dv, n in rows]
        print(f"| {name} | " + " | ".join(cells) + f" | {met} | {100 * low:.1f}% | {margin:+.2f} |")
    eligible = [r for r in ranked if r[1] >= args.min_share] if args.rule == "margin" else []
    if eligible:
        best = max(eligible, key=lambda r: (r[5], r[1], r[2]))
    else:
        if args.rule == "margin":
            print(f"no candidate reaches a share of {100 * args.min_share:.0f}% at every load: rule 'targets'")
        best = max(ranked, key=lambda r: (r[0], r[1], r[2]))
    print(f"chosen: {best[3]}")
    return best[3]


if __name__ == "__main__":  # pragma: no cover
    main()
