"""Benchmark: decision wall time per step of every scheduler at low / moderate / high load.

Realistic placement problems are taken from running simulations of the paper topology
(``llama8b-low`` / ``-moderate`` / ``-high``: 16 datacenters, 512 A100, ~600 / ~1,200 / ~1,800
requests per 1 s poll): the env is driven by the state-aware greedy (``facility-greedy``) for a
warm-up, then the problem of every ``--stride``-th step is recorded, exactly as a scheduler would
build it from the observation. Each scheduler then decides every recorded problem; its decision
time = building the problem from the observation (measured on the same step) + ``place``. One
core (HiGHS ``threads=1``). ``--synthetic`` uses :func:`solvers.problem.synthetic_problem`
instead of simulations.

Also reported for the facility MILP: requests and classes per problem, which step of the solver
produced the answer, the certified gap, fallbacks, the limit that stopped each solve (its
deterministic work limits by default; ``--time-limit-s 0.2`` measures the wall-clock budget
instead); and, once, the Pyomo reference model's build
and solve times on a moderate-load problem (``--no-pyomo`` to skip), to show why the hot path
bypasses Pyomo.

Usage::

    python eval/bench_solvers.py [--levels low,moderate,high] [--samples 8] [--stride 3] [--warmup 20]

The last line is ``milp_p95_decision_s=<p95 of the facility MILP's decision time at the highest
load level run>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections import Counter
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LEVEL_SCENARIOS = {"low": "llama8b-low", "moderate": "llama8b-moderate", "high": "llama8b-high"}


def collect_problems(scenario: str, warmup: int, samples: int, stride: int, max_pending: int,
                     seed: int = 0) -> tuple[list[Any], list[float], Any]:
    """Run the env with the state-aware greedy; return (problems, build seconds, env)."""
    import gymnasium as gym

    import carbon_gym  # noqa: F401
    from carbon_gym.registry import make_policy

    steps = warmup + samples * stride
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make("carbon_gym/GeoServe-v0", scenario=scenario,
                       overrides={"duration_s": float(steps + 2), "env.max_pending": max_pending})
    driver = make_policy("facility-greedy", env)
    obs, info = env.reset(seed=seed)
    driver.reset(env)
    problems, build_s = [], []
    for t in range(steps):
        t0 = time.perf_counter()
        p = driver.problem(obs, info)
        dt = time.perf_counter() - t0
        if t >= warmup and (t - warmup) % stride == stride - 1:
            problems.append(p)
            build_s.append(dt)
        action = driver.act(obs, info)
        obs, _, term, trunc, info = env.step(action)
        if term or trunc:
            break
    return problems, build_s, env


def synthetic_problems(level: str, samples: int, seed: int = 0) -> tuple[list[Any], list[float], None]:
    """Synthetic stand-ins (no simulation)."""
    from solvers.problem import synthetic_problem

    n, load = {"low": (600, 0.3), "moderate": (1200, 0.6), "high": (1850, 0.9)}[level]
    rng = np.random.default_rng(seed)
    return [synthetic_problem(rng, n, load=load) for _ in range(samples)], [0.0] * samples, None


def time_schedulers(problems: list[Any], build_s: list[float], env: Any, names: list[str],
                    milp_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Decision times (build + place) of each scheduler on the problems, and MILP statistics
    (``milp_kwargs``: settings of the facility MILP, e.g. ``time_limit_s``)."""
    from carbon_gym.registry import make_policy

    out: dict[str, Any] = {}
    for name in names:
        pol = make_policy(name, env, **(milp_kwargs or {})) if name == "facility-milp" else make_policy(name, env)
        pol.reset(env)
        times = []
        for p, b in zip(problems, build_s):
            t0 = time.perf_counter()
            pol.place(p)
            times.append(b + time.perf_counter() - t0)
        out[name] = {"decision_s": np.array(times), "stats": pol.stats}
    return out


def pyomo_reference(problem: Any) -> tuple[float, float, float, int]:
    """(build_s, solve_s, highspy total_s, classes) of the Pyomo reference vs the hot path."""
    from solvers.facility import FacilityConfig, compile_facility, solve_highspy, solve_pyomo

    cfg = FacilityConfig(time_limit_s=5.0)
    data = compile_facility(problem, cfg)
    res = solve_pyomo(data, cfg)
    t0 = time.perf_counter()
    solve_highspy(data, FacilityConfig())
    return res.build_s, res.solve_s, time.perf_counter() - t0, data.n_classes


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="low,moderate,high", help="comma-separated load levels")
    ap.add_argument("--samples", type=int, default=8, help="problems recorded per level")
    ap.add_argument("--stride", type=int, default=3, help="record every n-th step after the warm-up")
    ap.add_argument("--warmup", type=int, default=20, help="steps before recording")
    ap.add_argument("--max-pending", type=int, default=4096, help="env.max_pending (K)")
    ap.add_argument("--policies", default="all", help="comma-separated scheduler names, or 'all'")
    ap.add_argument("--synthetic", action="store_true", help="synthetic problems instead of simulations")
    ap.add_argument("--no-pyomo", action="store_true", help="skip the Pyomo reference timing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit-s", type=float, default=None,
                    help="give the facility MILP this wall-clock budget (default: none, its deterministic work limits only)")
    args = ap.parse_args(argv)

    import logging

    logging.getLogger("solvers").setLevel(logging.ERROR)
    from carbon_gym import registry

    # 'all': solvers' schedulers (the ones with place(problem); round-robin is carbon_gym's own),
    # under their long names (``facility-milp``: the first alias)
    infos = [registry.policy_info(n) for n in registry.default_policies()]
    names = ([(i.aliases[0] if i.aliases else i.name) for i in infos if i.source == "solvers"]
             if args.policies == "all" else [s.strip() for s in args.policies.split(",")])
    levels = [s.strip() for s in args.levels.split(",") if s.strip()]
    for lv in levels:
        if lv not in LEVEL_SCENARIOS:
            ap.error(f"unknown level {lv!r} (allowed: {', '.join(LEVEL_SCENARIOS)})")
    print(f"# decision wall time per step (problem building + place), one core; "
          f"{'synthetic' if args.synthetic else 'problems from simulations driven by facility-greedy'}")
    milp_p95 = float("nan")
    pyomo_problem = None
    for lv in levels:
        t0 = time.perf_counter()
        if args.synthetic:
            problems, build_s, env = synthetic_problems(lv, args.samples, args.seed)
        else:
            problems, build_s, env = collect_problems(LEVEL_SCENARIOS[lv], args.warmup, args.samples, args.stride,
                                                      args.max_pending, args.seed)
        n_req = np.array([p.n_requests for p in problems])
        print(f"\n## {lv} ({LEVEL_SCENARIOS[lv]}): {len(problems)} problems, requests/problem "
              f"mean {n_req.mean():.0f} max {n_req.max()}, building a problem from the observation "
              f"p50 {np.median(build_s) * 1e3:.1f} ms (collected in {time.perf_counter() - t0:.1f} s)")
        res = time_schedulers(problems, build_s, env, names, milp_kwargs={"time_limit_s": args.time_limit_s})
        print(f"{'scheduler':18s} {'p50_ms':>8s} {'p95_ms':>8s} {'max_ms':>8s}")
        for name in names:
            d = res[name]["decision_s"] * 1e3
            print(f"{name:18s} {np.percentile(d, 50):8.1f} {np.percentile(d, 95):8.1f} {d.max():8.1f}")
        if "facility-milp" in res:
            st = res["facility-milp"]["stats"]
            gaps = np.array(st["mip_gap"], dtype=float)
            status = Counter(s.split(" (")[0] for s in st["status"])
            limits = Counter(x or "none (gap reached)" for x in st["limit"])
            print(f"facility-milp: classes/problem mean {np.mean(st['n_classes']):.0f}, answers from {dict(status)}, "
                  f"certified gap p50 {np.nanpercentile(gaps, 50) * 100:.1f}% p95 {np.nanpercentile(gaps, 95) * 100:.1f}%, "
                  f"fallbacks {st['fallbacks']}, stopped by {dict(limits)}")
            milp_p95 = float(np.percentile(res["facility-milp"]["decision_s"], 95))
        if lv == "moderate" or pyomo_problem is None:
            pyomo_problem = problems[-1]
    if not args.no_pyomo and pyomo_problem is not None:
        b, s, hs, c = pyomo_reference(pyomo_problem)
        print(f"\nPyomo reference model ({pyomo_problem.n_requests} requests, {c} classes): build {b:.2f} s, "
              f"solve {s:.2f} s; direct highspy path (build + LP + rounding): {hs * 1e3:.0f} ms")
    print(f"milp_p95_decision_s={milp_p95:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
