"""Decision time of the learned policy at paper scale, inside episodes.

Usage::

    python -m train.bench_decision [--checkpoint PATH [--trust-checkpoint]] [--backend numpy|torch]
        [--scenarios llama8b-low,llama8b-moderate,llama8b-high] [--days 2] [--duration-s 60]
        [--set capacity.control=agent ...]

The policy drives whole episodes (16 datacenters; ~800 / 1,600 / 2,400 pending requests per step
at low / moderate / high load) on held-out starts of the carbon year (world seed 1000 + i), and
every ``act()`` call is timed between env steps, as the evaluation harness times it (an env step
between two decisions leaves the caches cold). One torch thread. Prints, per scenario, the
pending requests per step and the wall-clock mean / p50 / p95 / max of a decision, and its CPU
time (process time: steadier than wall time on a shared machine); the last line is
``learned_decision_p95_ms=<the largest per-scenario wall-clock p95>``. ``--set KEY=VALUE``
overrides scenario settings (e.g. ``capacity.control=agent`` for a policy with a capacity head:
its capacity decisions, every ``capacity.period_s``, are timed with the routing; their share of
the steps and their own p95 are printed as ``capacity decisions``).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Sequence

import numpy as np

SCENARIOS = ("llama8b-low", "llama8b-moderate", "llama8b-high")


def run(scenarios: Sequence[str], *, checkpoint: str | None = None, backend: str = "auto", days: int = 2,
        duration_s: float = 60.0, trust: bool = False,
        overrides: dict[str, object] | None = None) -> dict[str, dict[str, float]]:
    """Per scenario: ``steps``, ``pending_mean``, and ``{mean,p50,p95,max}_ms`` (wall) and
    ``cpu_{mean,p95}_ms`` of the learned policy's decisions."""
    import torch as th

    from .envs import heldout_starts, make_episode_env
    from .policy import SHIPPED_CHECKPOINT, LearnedPolicy

    th.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    kw = {} if backend == "auto" else {"backend": backend}
    if backend == "torch":
        kw.update(mode="sample", headroom_penalty=0.0, load_price=0.0)  # (the numpy path's mode and knobs only)
    pol = LearnedPolicy.load(checkpoint or SHIPPED_CHECKPOINT, seed=0, trust=trust, **kw)
    out = {}
    for scen in scenarios:
        wall, cpu, pending, cap = [], [], [], []
        for i, start in enumerate(heldout_starts(int(days))):
            env = make_episode_env(scen, {**dict(overrides or {}), "duration_s": float(duration_s)}, start)
            obs, info = env.reset(seed=1000 + i)
            pol.reset(env)
            while True:
                c0, t0 = time.process_time(), time.perf_counter()
                action = pol.act(obs, info)
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                cap.append(isinstance(action, dict))
                pending.append(int(info.get("pending", 0)))
                obs, _, term, trunc, info = env.step(action)
                if term or trunc:
                    break
            env.close()
        w, c = 1e3 * np.asarray(wall), 1e3 * np.asarray(cpu)
        out[scen] = {"steps": len(w), "pending_mean": float(np.mean(pending)), "mean_ms": float(w.mean()),
                     "p50_ms": float(np.median(w)), "p95_ms": float(np.percentile(w, 95)), "max_ms": float(w.max()),
                     "cpu_mean_ms": float(c.mean()), "cpu_p95_ms": float(np.percentile(c, 95)),
                     "capacity_steps": int(np.sum(cap)),
                     "capacity_p95_ms": float(np.percentile(w[np.asarray(cap)], 95)) if any(cap) else float("nan")}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.bench_decision", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=None, help="default: the shipped agent")
    ap.add_argument("--trust-checkpoint", action="store_true", help="admit a stable-baselines3 .zip (pickled: can run code)")
    ap.add_argument("--backend", default="auto", choices=["auto", "numpy", "torch"])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--days", type=int, default=2, help="held-out episode starts per scenario")
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="scenario override, e.g. capacity.control=agent (repeatable)")
    a = ap.parse_args(argv)
    over: dict[str, object] = {}
    for item in a.set:
        k, sep, v = item.partition("=")
        if not sep or not k:
            print(f"bench_decision: error: --set expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        v = v.strip()
        try:  # numbers as numbers, anything else as text
            over[k.strip()] = int(v) if v.lstrip("-").isdigit() else float(v)
        except ValueError:
            over[k.strip()] = v
    from carbon_gym.errors import CarbonGymError

    try:
        res = run([s for s in a.scenarios.split(",") if s], checkpoint=a.checkpoint, backend=a.backend, days=a.days,
                  duration_s=a.duration_s, trust=a.trust_checkpoint, overrides=over)
    except CarbonGymError as exc:
        print(f"bench_decision: error: {exc}", file=sys.stderr)
        return 2
    for scen, r in res.items():
        print(f"{scen}: {r['steps']} steps, {r['pending_mean']:.0f} pending requests per step; decision wall "
              f"mean {r['mean_ms']:.3f} / p50 {r['p50_ms']:.3f} / p95 {r['p95_ms']:.3f} / max {r['max_ms']:.3f} ms; "
              f"CPU mean {r['cpu_mean_ms']:.3f} / p95 {r['cpu_p95_ms']:.3f} ms"
              + (f"; capacity decisions {r['capacity_steps']} (wall p95 {r['capacity_p95_ms']:.3f} ms)" if r["capacity_steps"] else ""))
    print(f"learned_decision_p95_ms={max(r['p95_ms'] for r in res.values()):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
