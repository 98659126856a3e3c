"""Where a scheduler's TTFT estimate errs, per request (issue 40, item 1).

Runs one episode of a scheduler, joins its estimate log with the simulator's request records
(:func:`eval.estimate_error.estimate_errors`' join, kept per request here) and splits each
request's TTFT into what the scheduler knew exactly at its decision (the wait since arrival and
the network, up- and downlink) and the engine part (the queue wait at the engine the
datacenter's dispatcher chose, plus the prefill), then prints, per datacenter and in total:
the estimated and the realised engine part (mean and standard deviation, s), their correlation,
the least-squares line realised = a + b x estimated, and the correlation of the error with each
realised component. Seconds throughout; only requests arriving in the measurement window.

    python -m eval.estimate_components --scenario llama8b-moderate --policy milp --seed 1 \\
        --set polling_period_s=0.1 --duration-s 240 --warmup-s 120

The last line is ``engine_part_corr=<correlation of estimated and realised engine parts>``.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

__all__ = ["joined", "components", "main"]


def joined(estimates: dict[str, np.ndarray], records: dict[str, np.ndarray], window_start_s: float) -> dict[str, np.ndarray]:
    """Per completed request that arrived at or after ``window_start_s`` and has an estimate (its
    last one): the record's columns plus ``ttft_estimate_s`` and ``decided_s``."""
    key = {(float(a), int(o)): i for i, (a, o) in enumerate(zip(estimates["arrival_s"], estimates["origin"]))}  # last wins
    idx = np.array([key.get((float(a), int(o)), -1) for a, o in zip(records["arrival_s"], records["origin"])], dtype=np.int64)
    keep = (idx >= 0) & (np.asarray(records["arrival_s"]) >= window_start_s)
    out = {k: np.asarray(v)[keep] for k, v in records.items()}
    out["ttft_estimate_s"] = np.asarray(estimates["ttft_estimate_s"])[idx[keep]]
    out["decided_s"] = np.asarray(estimates["decided_s"])[idx[keep]]
    return out


def components(j: dict[str, np.ndarray]) -> dict[str, Any]:
    """The split of :func:`joined`'s requests (module docstring): ``known_s`` (wait to the
    decision + network), ``est_engine_s`` / ``real_engine_s`` (estimate / realised TTFT minus the
    known part), ``error_s`` (estimated - realised TTFT) and the summary figures."""
    known = (j["decided_s"] - j["arrival_s"]) + j["network_s"]
    est = j["ttft_estimate_s"] - known
    real = j["ttft_s"] - known
    err = j["ttft_estimate_s"] - j["ttft_s"]
    slope, icpt = np.polyfit(est, real, 1) if est.size > 1 else (float("nan"), float("nan"))
    corr = {c: float(np.corrcoef(j[c], err)[0, 1]) for c in ("queue_wait_s", "prefill_s", "network_s", "prompt_tokens")} if err.size > 1 else {}
    return {"known_s": known, "est_engine_s": est, "real_engine_s": real, "error_s": err,
            "engine_part_corr": float(np.corrcoef(est, real)[0, 1]) if est.size > 1 else float("nan"),
            "line": (float(icpt), float(slope)), "error_corr": corr}


def main(argv: list[str] | None = None) -> int:
    """Run the episode and print the split (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="llama8b-moderate")
    ap.add_argument("--policy", default="milp")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration-s", type=float, default=240.0, help="simulated seconds, burn-in included")
    ap.add_argument("--warmup-s", type=float, default=120.0, help="burn-in not counted, s")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="scenario override (repeatable)")
    a = ap.parse_args(argv)
    from carbon_gym.policy import run_episode
    from carbon_gym.registry import make_policy
    from eval.cli import UsageError, parse_assignments
    from eval.runner import EpisodeRecorder, make_env, resolve_run_scenario, RunSpec

    ov: dict[str, Any] = {"duration_s": a.duration_s, "env.measure": "window", "env.warmup_s": a.warmup_s}
    try:
        ov.update(parse_assignments(a.set, "--set"))  # (read as `carbon-gym experiment --set` reads them)
    except UsageError as e:
        ap.error(str(e))
    spec = RunSpec(scenario=a.scenario, policy=a.policy, seed=a.seed, overrides=tuple(sorted(ov.items())))
    scenario, _ = resolve_run_scenario(spec)
    env = make_env(scenario)
    try:
        policy = make_policy(a.policy, env)
        if not callable(getattr(policy, "episode_estimates", None)):
            ap.error(f"--policy {a.policy!r} logs no estimates (a solvers.base.Scheduler does)")
        rec = EpisodeRecorder(True)
        run_episode(env, policy, seed=a.seed, max_steps=10**9, observers=[rec])
        j = joined(policy.episode_estimates(), rec.requests(), a.warmup_s)
    finally:
        env.close()
    c = components(j)
    print(f"{a.scenario} {a.policy} seed {a.seed} ({', '.join(a.set) or 'scenario defaults'}): {j['ttft_s'].size} requests in the window")
    print("datacenter  requests  estimated engine part mean/sd (s)  realised mean/sd (s)  correlation")
    for d in np.unique(j["datacenter"]):
        s = j["datacenter"] == d
        if s.sum() < 2:
            continue
        e, r = c["est_engine_s"][s], c["real_engine_s"][s]
        print(f"{int(d):>10}  {int(s.sum()):>8}  {e.mean():.3f} / {e.std():.3f}  {r.mean():.3f} / {r.std():.3f}  {np.corrcoef(e, r)[0, 1]:.2f}")
    e, r = c["est_engine_s"], c["real_engine_s"]
    print(f"all: estimated engine part {e.mean():.3f} / {e.std():.3f} s, realised {r.mean():.3f} / {r.std():.3f} s; "
          f"realised = {c['line'][0]:.3f} + {c['line'][1]:.3f} x estimated")
    q = np.percentile(c["error_s"], [1, 10, 50, 90, 99]) * 1e3
    print("TTFT error (estimated - realised) p1/p10/p50/p90/p99 ms: " + " / ".join(f"{v:.0f}" for v in q))
    print("correlation of the error with the realised " + ", ".join(f"{k} {v:.2f}" for k, v in c["error_corr"].items()))
    print(f"engine_part_corr={c['engine_part_corr']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
