"""Fault report: what each scheduler does when the world breaks.

For every scheduler, runs the fault scenario and the same scenario without its ``[[faults]]``
(same seed, so the same arrivals) and reports: requests failed over (aborted by an outage and
placed again) and how many of them completed, SLO violations with and without the faults, the
extra carbon the faults cost (g and % of the fault-free run), the energy wasted on aborted work,
p99 TTFT with and without, and requests left unfinished at the end. Extra carbon can be
negative: a datacenter that is down draws nothing, not even its idle and host power.

Usage::

    python eval/fault_report.py [--scenario dev-fault] [--policies all | name,name] [--seed 0]
                                [--override key=value ...] [--json out.json]

Library use (e.g. from ``carbon-gym eval``)::

    from eval.fault_report import fault_report, format_fault_report
    rows = fault_report("dev-fault", policies=["round-robin", "facility-milp"], seed=0)
    print(format_fault_report(rows))

The default ``dev-fault`` scenario (2 regions x 2 datacenters, 60 s) runs every scheduler in
well under a minute here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from typing import Any, Sequence

#: Columns of the report, in order: (key, header, format).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "{:<16}"),
    ("failed_over", "failed over", "{:>11d}"),
    ("failed_over_completed", "fo done", "{:>7d}"),
    ("violations", "SLO viol", "{:>8d}"),
    ("violations_base", "viol w/o", "{:>8d}"),
    ("violation_rate", "viol %", "{:>6.1%}"),
    ("violation_rate_base", "w/o %", "{:>6.1%}"),
    ("carbon_g", "carbon g", "{:>9.2f}"),
    ("carbon_g_base", "w/o g", "{:>9.2f}"),
    ("extra_carbon_g", "extra g", "{:>8.2f}"),
    ("extra_carbon_pct", "extra %", "{:>7.1f}"),
    ("wasted_energy_kj", "wasted kJ", "{:>9.1f}"),
    ("ttft_p99_s", "p99 TTFT", "{:>8.2f}"),
    ("ttft_p99_s_base", "w/o", "{:>5.2f}"),
    ("unfinished", "unfinished", "{:>10d}"),
)


def _run(scenario: Any, name: str, seed: int) -> dict[str, Any]:
    from carbon_gym.env import GeoServeEnv
    from carbon_gym.policy import rollout
    from solvers import make_policy

    env = GeoServeEnv(scenario)
    try:
        return rollout(env, make_policy(name, env), seed=seed)
    finally:
        env.close()


def fault_report(scenario: Any = "dev-fault", policies: Sequence[str] | None = None, seed: int = 0,
                 overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run each scheduler with and without the scenario's faults; one row (dict) per scheduler.

    Args:
        scenario: a scenario name, path or :class:`~carbon_gym.scenario.Scenario` with ``[[faults]]``.
        policies: scheduler names (default: every one in :func:`solvers.available_policies`).
        seed: episode seed of both runs.
        overrides: scenario overrides (dotted keys) applied to both runs.

    Returns:
        rows with the keys of :data:`COLUMNS` plus ``completed``, ``arrived`` and the wall time
        ``wall_s`` of the pair of runs.
    """
    from carbon_gym.env import _resolve_scenario
    from carbon_gym.errors import ConfigError
    from carbon_gym.faults import without_faults
    from solvers import available_policies

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        faulty = _resolve_scenario(scenario, overrides)
    if not faulty.faults:
        raise ConfigError("scenario", f"{faulty.name!r} has no [[faults]]: nothing to report",
                          allowed="a scenario with faults, e.g. dev-fault, dev-fault-region")
    clean = without_faults(faulty)
    names = list(policies) if policies else available_policies()
    rows = []
    for name in names:
        t0 = time.perf_counter()
        m = _run(faulty, name, seed)
        b = _run(clean, name, seed)
        extra = m["carbon_g"] - b["carbon_g"]
        rows.append({
            "policy": name,
            "failed_over": int(m["failed_over"]),
            "failed_over_completed": int(m["failed_over_completed"]),
            "violations": int(m["violations"]),
            "violations_base": int(b["violations"]),
            "violation_rate": float(m["violation_rate"]),
            "violation_rate_base": float(b["violation_rate"]),
            "carbon_g": float(m["carbon_g"]),
            "carbon_g_base": float(b["carbon_g"]),
            "extra_carbon_g": float(extra),
            "extra_carbon_pct": float(100.0 * extra / b["carbon_g"]) if b["carbon_g"] else math.nan,
            "wasted_energy_kj": float(m["ledger"]["wasted_energy_j"] / 1e3),
            "ttft_p99_s": float(m["ttft_p99_s"]),
            "ttft_p99_s_base": float(b["ttft_p99_s"]),
            "unfinished": int(m["in_flight_at_truncation"] + m["unplaced_at_end"]),
            "completed": int(m["completed"]),
            "arrived": int(m["arrived"]),
            "wall_s": time.perf_counter() - t0,
        })
    return rows


def format_fault_report(rows: Sequence[dict[str, Any]], title: str = "") -> str:
    """The rows as a fixed-width text table (one line per scheduler)."""
    widths = [len(f.format(0 if "d}" in f else (0.0 if "f}" in f or "%}" in f else ""))) for _, _, f in COLUMNS]
    head = " ".join(h.rjust(w) if i else h.ljust(w) for i, ((_, h, _), w) in enumerate(zip(COLUMNS, widths)))
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    for r in rows:
        lines.append(" ".join(f.format(r[k]) for k, _, f in COLUMNS))
    return "\n".join(lines)


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

    try:
        overrides = parse_overrides(args.override)
        policies = None if args.policies == "all" else [p.strip() for p in args.policies.split(",") if p.strip()]
        t0 = time.perf_counter()
        rows = fault_report(args.scenario, policies, args.seed, overrides)
    except CarbonGymError as e:
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
