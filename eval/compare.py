"""First comparison: every scheduler on one scenario, same seed, one Markdown table.

Each scheduler runs one episode of the scenario (default ``llama8b-moderate``: Llama-3.1-8B on
the 512-GPU paper topology at moderate load, ~1,230 requests/s) through ``env.step`` with the
same seed (same arrivals, lengths and carbon trace), via :func:`carbon_gym.policy.rollout`.
Columns: facility carbon (g, and % vs round-robin), facility energy (kWh), TTFT / TPOT p50 and
p99 (s) of completed requests, SLO violation rate (TTFT > target or TPOT > target), requests
completed, and the scheduler's decision time p95 (wall clock, measured outside the env).

Usage::

    python eval/compare.py [--scenario llama8b-moderate] [--duration-s 300] [--seed 0] [--jobs 2]
                           [--policies all] [--out results/compare.md]

The default (5 simulated minutes, two processes) finishes in about 10 minutes on two cores;
``--duration-s 10800`` runs three simulated hours.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REFERENCE = "rr"


def run_policy(name: str, scenario: str, duration_s: float, seed: int, max_pending: int) -> dict[str, Any]:
    """One episode of ``name``; returns the episode metrics (scalars) plus timing."""
    import logging

    import gymnasium as gym

    import carbon_gym  # noqa: F401
    from carbon_gym.policy import rollout
    from carbon_gym.registry import make_policy

    logging.getLogger("solvers").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make("carbon_gym/GeoServe-v0", scenario=scenario,
                       overrides={"duration_s": float(duration_s), "env.max_pending": int(max_pending)})
    policy = make_policy(name, env)
    t0 = time.perf_counter()
    m = rollout(env, policy, seed=seed)
    wall = time.perf_counter() - t0
    out = {k: v for k, v in m.items() if np.isscalar(v)}
    out["wall_s"] = wall
    out["fallbacks"] = int(getattr(policy, "stats", {}).get("fallbacks", 0) or 0)
    env.close()
    return out


def table(results: dict[str, dict[str, Any]], reference: str = REFERENCE) -> str:
    """The Markdown table of the comparison."""
    ref = results.get(reference, {}).get("carbon_g", float("nan"))
    head = ("| scheduler | carbon (g) | vs RR | energy (kWh) | TTFT p50 (s) | TTFT p99 (s) | TPOT p50 (s) "
            "| TPOT p99 (s) | SLO viol. | completed | decision p95 (ms) |")
    lines = [head, "|" + "---|" * 11]
    for name, m in results.items():
        pct = 100.0 * (m["carbon_g"] - ref) / ref if ref == ref and ref > 0 else float("nan")
        lines.append(
            f"| {name} | {m['carbon_g']:.0f} | {pct:+.1f}% | {m['energy_kwh']:.2f} | {m['ttft_p50_s']:.2f} | "
            f"{m['ttft_p99_s']:.2f} | {m['tpot_p50_s']:.3f} | {m['tpot_p99_s']:.3f} | {100 * m['violation_rate']:.1f}% | "
            f"{m['completed']} | {1e3 * m['decision_s_p95']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, print and save the table; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="llama8b-moderate")
    ap.add_argument("--duration-s", type=float, default=300.0, help="simulated seconds per episode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default="all", help="comma-separated scheduler names, or 'all'")
    ap.add_argument("--jobs", type=int, default=2, help="episodes run in parallel (processes)")
    ap.add_argument("--max-pending", type=int, default=4096, help="env.max_pending (K)")
    ap.add_argument("--out", default="results/compare.md", help="where to save the Markdown table")
    args = ap.parse_args(argv)
    from carbon_gym.registry import canonical_policy_name, default_policies

    names = default_policies() if args.policies == "all" else [canonical_policy_name(s.strip()) for s in args.policies.split(",")]
    if REFERENCE in names:
        names.remove(REFERENCE)
    names.insert(0, REFERENCE)
    t0 = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    jobs = max(1, int(args.jobs))
    call = (args.scenario, args.duration_s, args.seed, args.max_pending)
    if jobs == 1:
        for n in names:
            results[n] = run_policy(n, *call)
            print(f"  {n}: done in {results[n]['wall_s']:.0f} s", flush=True)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {n: pool.submit(run_policy, n, *call) for n in names}
            for n in names:
                results[n] = futures[n].result()
                print(f"  {n}: done in {results[n]['wall_s']:.0f} s", flush=True)
    cmd = "python eval/compare.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = (f"Scenario `{args.scenario}`, {args.duration_s:.0f} simulated s, seed {args.seed} "
          f"(command: `{cmd.strip()}`; {time.perf_counter() - t0:.0f} s wall)\n\n" + table(results))
    fallbacks = {n: m["fallbacks"] for n, m in results.items() if m.get("fallbacks")}
    if fallbacks:
        md += f"\n\nSolver fallbacks: {fallbacks}"
    print(md)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(md + "\n")
        print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
