"""Soak benchmark: one long episode (24 simulated hours by default) with round-robin, checking that
memory stays flat.

Completed-request records are streamed to ``.npz`` chunk files (``GeoServeEnv(record_dir=...)``)
instead of being kept in memory; everything else the env and the simulator hold is bounded by
the requests in flight. The script prints, at 1, 6 and 24 simulated hours: the process's peak
resident memory (``ru_maxrss``), its current RSS, Python's allocated blocks, the simulator's
event-heap and in-transit sizes, requests completed and records written, and wall time. The
last line is ``memory_growth_ratio=<peak RSS at 24 h / peak RSS at 1 h>`` (target <= 1.2).

The full moderate paper scenario (512 GPUs, ~1,600 req/s, ~138 million requests a day) takes
about 2.3 hours here (``--full``; measured on 2026-11-29: peak RSS 117.8 MB at 1 h, 117.8 MB at
6 h, 133.0 MB at 24 h with the end-of-episode percentile pass over the 11 GB of record files,
ratio 1.129; 137,689,997 requests arrived and completed, ledger balanced), so by default the run
uses a lighter variant of it: the same model, load level
(moderate = 0.6 x measured capacity per engine), lengths and carbon data on ONE datacenter of
ONE region with one node (8 engines, ~25 req/s, ~2.2 million requests in 24 h, a few minutes);
the output says so. ``--regions / --datacenters-per-region / --nodes`` scale it up, ``--full``
runs the scenario as shipped, ``--hours`` shortens it, ``--no-stream`` keeps records in memory
(to see the growth streaming avoids).

Usage::

    python eval/bench_soak.py [--hours 24] [--scenario llama8b-moderate] [--regions 1]
                              [--datacenters-per-region 1] [--nodes 1] [--full] [--no-stream]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np

from carbon_gym.env import GeoServeEnv
from carbon_gym.policy import RoundRobinPolicy
from carbon_gym.scenario import DEFAULT_REGIONS

CHECKPOINT_HOURS = (1.0, 6.0, 24.0)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Current resident set size, MB (from /proc; NaN elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def build_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Scenario overrides for the run and a one-line description of the variant."""
    ov: dict[str, Any] = {"duration_s": args.hours * 3600.0}
    if args.full:
        return ov, "the scenario as shipped (full topology)"
    regions = list(DEFAULT_REGIONS)[: args.regions]
    ov.update({
        "topology.only_regions": regions,
        "topology.datacenters_per_region": args.datacenters_per_region,
        "topology.nodes_per_datacenter": args.nodes,
    })
    what = (f"LIGHTER VARIANT: {len(regions)} region(s) ({', '.join(regions)}) x {args.datacenters_per_region} "
            f"datacenter(s) x {args.nodes} node(s), same model / load level / lengths / carbon data")
    return ov, what


def snapshot(env: GeoServeEnv, t0: float) -> dict[str, float]:
    """Memory and size figures now."""
    gc.collect()
    base = env.unwrapped
    sim = base.simulator
    writer = getattr(base, "_writer", None)
    return {
        "sim_h": sim.now_s / 3600.0,
        "peak_rss_mb": peak_rss_mb(),
        "rss_mb": current_rss_mb(),
        "py_blocks": float(sys.getallocatedblocks()),
        "heap": float(len(sim._heap)),
        "in_transit": float(len(sim._in_transit)),
        "pending": float(base.pending_requests(include_overflow=True)["seq"].size),
        "completed": float(base._completed),
        "records_in_memory": float(sum(len(x) for x in base._ttft_parts)),
        "records_on_disk": float(len(writer)) if writer is not None else 0.0,
        "wall_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="llama8b-moderate")
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours (checkpoints at 1, 6, 24 h when reached)")
    ap.add_argument("--regions", type=int, default=1, help="lighter variant: first k default regions")
    ap.add_argument("--datacenters-per-region", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=1, help="lighter variant: nodes per datacenter")
    ap.add_argument("--full", action="store_true", help="run the scenario's own topology (hours of wall time)")
    ap.add_argument("--no-stream", action="store_true", help="keep per-request latencies in memory (no record_dir)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.hours <= 0:
        ap.error("--hours must be > 0")
    if not 1 <= args.regions <= len(DEFAULT_REGIONS):
        ap.error(f"--regions must be in 1..{len(DEFAULT_REGIONS)}")

    overrides, what = build_overrides(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = GeoServeEnv(args.scenario, overrides=overrides)
    rate = probe.scenario.rate_per_s
    per_step = rate * probe.scenario.polling_period_s
    overrides["env.max_pending"] = int(2 ** np.ceil(np.log2(1.25 * per_step + 4 * np.sqrt(per_step) + 16)))
    del probe
    tmp = None if args.no_stream else tempfile.TemporaryDirectory(prefix="carbon_gym_soak_")
    env = GeoServeEnv(args.scenario, overrides=overrides, record_dir=None if tmp is None else tmp.name)
    print(f"scenario {args.scenario}: {what}")
    print(f"  {env.layout.n_datacenters} datacenters, {int(env.layout.n_engines.sum())} engines, "
          f"{rate:.1f} req/s, {args.hours:g} simulated hours (~{rate * args.hours * 3600 / 1e6:.2f} M requests), "
          f"records {'streamed to ' + tmp.name if tmp else 'kept in memory (--no-stream)'}")
    print(f"{'sim_h':>6} {'peak_rss_MB':>11} {'rss_MB':>8} {'py_blocks':>10} {'heap':>7} {'in_transit':>10} "
          f"{'pending':>7} {'completed':>10} {'recs_mem':>9} {'recs_disk':>10} {'wall_s':>7}")

    policy = RoundRobinPolicy()
    t0 = time.perf_counter()
    obs, info = env.reset(seed=args.seed)
    policy.reset(env)
    marks = [h for h in CHECKPOINT_HOURS if h <= args.hours + 1e-9]
    if not marks or marks[-1] < args.hours:
        marks.append(args.hours)
    rows: dict[float, dict[str, float]] = {}
    mi = 0
    while True:
        obs, reward, term, trunc, info = env.step(policy.act(obs, info))
        if trunc:
            break
        if mi < len(marks) - 1 and env.simulator.now_s >= marks[mi] * 3600.0:
            rows[marks[mi]] = s = snapshot(env, t0)
            _print_row(s)
            mi += 1
    metrics = info["episode_metrics"]  # includes the exact percentiles read back from disk
    rows[marks[-1]] = s = snapshot(env, t0)
    _print_row(s)
    led = metrics["ledger"]
    print(f"episode: arrived {metrics['arrived']}, completed {metrics['completed']}, in flight at the end "
          f"{metrics['in_flight_at_truncation']}, ledger ok {led['ok']}, ttft p99 {metrics['ttft_p99_s']:.3f} s, "
          f"carbon {metrics['carbon_g'] / 1000:.2f} kg, simulated {metrics['completed'] / s['wall_s']:.0f} req/s wall")
    env.close()
    if tmp is not None:
        tmp.cleanup()
    first = rows[marks[0]]["peak_rss_mb"]
    last = rows[marks[-1]]["peak_rss_mb"]
    ratio = last / first
    print(f"peak RSS: {first:.1f} MB at {marks[0]:g} h -> {last:.1f} MB at {marks[-1]:g} h; "
          f"CPU time {time.process_time():.0f} s")
    print(f"memory_growth_ratio={ratio:.3f}")
    return ratio


def _print_row(s: dict[str, float]) -> None:
    print(f"{s['sim_h']:6.2f} {s['peak_rss_mb']:11.1f} {s['rss_mb']:8.1f} {s['py_blocks']:10.0f} {s['heap']:7.0f} "
          f"{s['in_transit']:10.0f} {s['pending']:7.0f} {s['completed']:10.0f} {s['records_in_memory']:9.0f} "
          f"{s['records_on_disk']:10.0f} {s['wall_s']:7.1f}", flush=True)


if __name__ == "__main__":
    main()
