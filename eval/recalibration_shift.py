"""How the pinned quick-preset results moved with a physics change (issue 20: "how each result
moved after recalibration").

Reads two versions of the golden results file (``tests/data/golden_quick.json``: every shipped
scenario, 60 s quick preset from an empty cluster, seeds 0-2, every deterministic policy) and
prints, per scenario, round-robin's facility energy and carbon before and after, and each policy's
carbon reduction vs round-robin before and after (means over the seeds). The quick preset is a
smoke test, not a result (60 s episodes with their drain): this shows the direction and size of
the change, not a headline.

Usage::

    git show af1d3ec:tests/data/golden_quick.json > /tmp/old.json   # before the recalibration
    python -m eval.recalibration_shift /tmp/old.json tests/data/golden_quick.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def _load(path: str) -> dict[tuple[str, str], list[dict]]:
    with open(path) as f:
        raw = json.load(f)
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for key, cell in raw.items():
        scenario, policy, _seed = key.split("|")
        out[(scenario, policy)].append(cell["episode_metrics"])
    return out


def _mean(cells: list[dict], key: str) -> float:
    return sum(float(c[key]) for c in cells) / len(cells)


def main(argv: list[str] | None = None) -> None:
    """Print the markdown table (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--policies", default="milp,planner,ilp-state", help="comma list of policies to show")
    args = ap.parse_args(argv)
    old, new = _load(args.before), _load(args.after)
    policies = [p for p in args.policies.split(",") if p]
    scenarios = sorted({s for s, _ in new} & {s for s, _ in old})
    head = "| scenario | rr energy kWh before / after | rr carbon g before / after | " + " | ".join(
        f"{p} vs rr % before / after" for p in policies) + " |"
    print(head)
    print("|" + "---|" * (3 + len(policies)))
    for s in scenarios:
        if (s, "rr") not in old or (s, "rr") not in new:
            continue
        e0, e1 = _mean(old[(s, "rr")], "energy_kwh"), _mean(new[(s, "rr")], "energy_kwh")
        c0, c1 = _mean(old[(s, "rr")], "carbon_g"), _mean(new[(s, "rr")], "carbon_g")
        cells = []
        for p in policies:
            if (s, p) in old and (s, p) in new:
                r0 = 100.0 * (1.0 - _mean(old[(s, p)], "carbon_g") / c0)
                r1 = 100.0 * (1.0 - _mean(new[(s, p)], "carbon_g") / c1)
                cells.append(f"{r0:.1f} / {r1:.1f}")
            else:
                cells.append("-")
        print(f"| {s} | {e0:.3f} / {e1:.3f} | {c0:.1f} / {c1:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
