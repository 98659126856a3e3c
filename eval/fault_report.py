"""Fault report: what each scheduler does when the world breaks (standalone wrapper).

For every scheduler, runs the fault scenario and the same scenario without its ``[[faults]]``
(same seed, so the same arrivals, and the same episode start) and reports: requests failed over
(aborted by an outage and placed again) and how many of them completed, the energy wasted on
aborted work, SLO violations with and without the faults (and the difference in percentage
points), the extra carbon the faults cost (g and % of the fault-free run), p99 TTFT with and
without, requests left unfinished at the end, and whether both runs' ledgers balanced. Extra
carbon can be negative: a datacenter that is down draws nothing, not even idle and host power.

``carbon-gym eval --scenarios <fault scenario>`` produces the same report (fault_report.md /
.csv next to its summary) for a whole policy x seed matrix; this script is the one-seed form,
built on the same code (:func:`eval.runner.fault_twin`, :func:`eval.tables.fault_pairs`,
:func:`eval.tables.fault_markdown`). Unlike ``eval`` it keeps
the scenario's own carbon start (``carbon.start_utc``) instead of sampling one.

Usage::

    python eval/fault_report.py [--scenario dev-fault] [--policies all | name,name] [--seed 0]
                                [--override key=value ...] [--json out.json]

Library use::

    from eval.fault_report import fault_report, format_fault_report
    rows = fault_report("dev-fault", policies=["rr", "milp"], seed=0)
    print(format_fault_report(rows))

The default ``dev-fault`` scenario (2 regions x 2 datacenters, 60 s) runs every scheduler in
well under a minute here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from typing import Any, Sequence

if __package__ in (None, ""):  # `python eval/fault_report.py`: make `eval` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fault_report(scenario: str = "dev-fault", policies: Sequence[str] | None = None, seed: int = 0,
                 overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run each scheduler with and without the scenario's faults; one row (dict) per scheduler.

    Args:
        scenario: a scenario name or TOML path with ``[[faults]]``.
        policies: policy names, short or long (default: :func:`carbon_gym.registry.default_policies`).
        seed: episode seed of both runs.
        overrides: scenario overrides (dotted keys) applied to both runs.

    Returns:
        the rows of :func:`eval.tables.fault_pairs` (``policy`` is the table's short name),
        plus the wall time ``wall_s`` of the pair of runs.

    Raises:
        ConfigError: the scenario has no faults (or an unknown scenario / policy / override).
    """
    from carbon_gym.errors import ConfigError
    from carbon_gym import registry

    from eval.backends import run_matrix
    from eval.experiments import fault_scenarios
    from eval.runner import fault_twin, make_specs
    from eval.tables import fault_pairs

    if not fault_scenarios([scenario], overrides):
        raise ConfigError("scenario", f"{scenario!r} has no [[faults]]: nothing to report",
                          allowed="a scenario with faults, e.g. dev-fault, dev-fault-region")
    names = list(policies) if policies else registry.default_policies()
    for n in names:
        try:
            registry.check_policy_name(n)
        except ConfigError as exc:
            raise ConfigError("policies", str(exc).removeprefix(f"{exc.field}: ")) from None
    specs = make_specs([scenario], names, [seed], overrides=overrides)
    specs = [replace(s, carbon_start=False) for s in specs]
    results = []
    wall: dict[str, float] = {}
    for s in specs:
        pair = run_matrix([s, fault_twin(s)], workers=1, progress=False, keep_requests=False)
        wall[s.policy_name] = sum(r.metrics["wall_s"] for r in pair)
        results.extend(pair)
    rows = fault_pairs(results).to_dict("records")
    for r in rows:
        r["wall_s"] = wall[r["policy"]]
    return rows


def format_fault_report(rows: Sequence[dict[str, Any]], title: str = "") -> str:
    """The rows as a Markdown table (one line per scheduler), optionally under a title line."""
    import pandas as pd

    from eval.tables import fault_markdown

    text = fault_markdown(pd.DataFrame(list(rows)))
    return (title + "\n\n" + text if title else text).rstrip("\n")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description="Per scheduler: failed-over requests, SLO violations and extra carbon "
                                             "of a fault scenario against the same run without its faults.")
    ap.add_argument("--scenario", default="dev-fault", help="scenario with [[faults]] (name or path)")
    ap.add_argument("--policies", default="all", help="'all' or comma-separated scheduler names")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="scenario override for both runs (repeatable)")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    from carbon_gym.errors import CarbonGymError
    from carbon_gym.scenario import parse_overrides

    from eval.backends import RunFailed

    try:
        overrides = parse_overrides(args.override)
        policies = None if args.policies == "all" else [p.strip() for p in args.policies.split(",") if p.strip()]
        t0 = time.perf_counter()
        rows = fault_report(args.scenario, policies, args.seed, overrides)
    except (CarbonGymError, RunFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    arrived = rows[0]["arrived"] if rows else 0
    print(format_fault_report(rows, title=f"fault report: scenario {args.scenario}, seed {args.seed}, {arrived} requests "
                                          f"(with faults vs 'w/o' the same run without them)"))
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
