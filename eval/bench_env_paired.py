"""Paired env benchmark against an older commit (issue 41 item 1: "a paired ratio against main in one run").

    python eval/bench_env_paired.py [--baseline 2095c77] [--pairs 3] [--steps 30] [--repeats 5]

Checks the baseline commit out into a temporary git worktree, compiles its simulator in place
(``setup.py build_ext --inplace``, as ``pip install`` does; the pure-Python modules when that
fails, which the baseline's ``_native`` says on import), then alternates the two trees, each in a
fresh process with ``PYTHONPATH`` set to its tree: llama8b-moderate with round-robin, one
warm-up episode, then ``--repeats`` fresh-env episodes of ``--steps`` one-second steps timed by
``eval.bench_env.bench`` of *that* tree (reset included, as ``eval/bench_env.py --paper-only``
times them). Each process prints its median steps per CPU second; the last lines are both
trees' figures per pair, ``paper_env_speedup=<median over pairs of current / baseline>`` and its
range. CPU seconds, not wall: the host is shared, and alternating cancels its drift.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Run in each tree's process: the same protocol on any commit whose ``eval/bench_env.py`` has
#: ``bench(env_id, steps, overrides, profile=)`` returning ``steps_per_cpu_s`` (2095c77 on).
PROBE = """
import statistics, carbon_gym
from eval.bench_env import bench
env_id = carbon_gym.env_id_for_scenario("llama8b-moderate")
ov = {{"duration_s": float({steps})}}
bench(env_id, 1, ov, profile=False)
runs = [bench(env_id, {steps}, ov, profile=False) for _ in range({repeats})]
cpu = statistics.median(r["steps_per_cpu_s"] for r in runs)
req = statistics.median(r["requests_per_step"] for r in runs)
print(f"steps_per_cpu_s={{cpu:.2f}} requests_per_step={{req:.0f}} us_per_request={{1e6 / cpu / req:.2f}}")
"""


def _run(tree: str, steps: int, repeats: int) -> tuple[float, str]:
    """One process on ``tree``: (median steps per CPU second, its printed line)."""
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-c", PROBE.format(steps=steps, repeats=repeats)], cwd=tempfile.gettempdir(),
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"bench on {tree} failed:\n{out.stderr[-2000:]}")
    line = out.stdout.strip().splitlines()[-1]
    m = re.search(r"steps_per_cpu_s=([0-9.]+)", line)
    if m is None:
        raise SystemExit(f"bench on {tree}: no steps_per_cpu_s in {line!r}")
    return float(m.group(1)), line


def main(argv: list[str] | None = None) -> None:
    """Build the baseline, alternate the trees, print the paired ratios (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="2095c77", help="commit to compare with (issue 41's reference)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30, help="one-second steps per timed episode")
    ap.add_argument("--repeats", type=int, default=5, help="timed episodes per process (their median is its figure)")
    args = ap.parse_args(argv)
    for name in ("pairs", "steps", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp:
        tree = os.path.join(tmp, "tree")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", tree, args.baseline], check=True)
        try:
            built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                                   capture_output=True, text=True, check=False)
            print(f"baseline {args.baseline}: simulator {'compiled' if built.returncode == 0 else 'NOT compiled (pure Python)'}",
                  flush=True)
            ratios = []
            for i in range(args.pairs):
                base, bl = _run(tree, args.steps, args.repeats)
                cur, cl = _run(ROOT, args.steps, args.repeats)
                ratios.append(cur / base)
                print(f"pair {i + 1}: baseline {bl}; current {cl}; ratio {cur / base:.2f}", flush=True)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=False)
    print(f"paper_env_speedup={statistics.median(ratios):.2f} (pairs: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
