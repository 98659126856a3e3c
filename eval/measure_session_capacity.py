"""Per-engine capacity of the synthetic session workload (heavy prompts), for its load levels.

    python eval/measure_session_capacity.py                # print
    python eval/measure_session_capacity.py --write        # ... and write it into the parameter file

The study's load levels (``carbon_gym/data/load_levels.toml``) are measured with Azure
conversation lengths (prompt mean ~1k tokens); the session workload's prompts average ~12k
tokens (p99 85k), so its capacity is measured separately, on the same footing: ONE engine of the
scenario (``llama8b-sessions-moderate``: Llama-3.1-8B, A100-80GB, TP 1, max_model_len 131072) fed
the session workload of one region (no network, every request placed on arrival), bisection over
the request rate (:func:`carbon_gym.capacity._bisect`), p99s pooled over the seeds after warm-up
(each probe long enough for 3,000 counted requests: the prompt tail makes a p99 of fewer noisy).

Criterion: a 2 s p99 TTFT cannot be met even by an idle engine (a 85k-token prompt takes longer
to prefill), so the capacity is the highest rate at which **queueing adds at most the MLPerf TTFT
target to the idle engine's p99 TTFT** (p99 TTFT <= p99 TTFT at a near-zero rate + 2 s) and the
p99 TPOT stays within the MLPerf 0.1 s. Measured without a prefix cache (a conservative figure;
with caching an engine serves more). Written to ``[capacity."<model>/<gpu>/tp<k>"]`` of the
generator's parameter file; ``workload.load`` = fraction x that x engines.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def _records(scenario, rate_per_s: float, duration_s: float, seed: int):
    from carbon_gym.capacity import _single_engine_parts
    from carbon_gym.sessions import SessionWorkload, load_session_params
    from carbon_gym.sim.simulator import Simulator

    parts, topo, net, carbon = _single_engine_parts(scenario, 1)
    w = scenario.workload
    wl = SessionWorkload(load_session_params(w.sessions.generator), rate_per_s=rate_per_s, seed=seed, block_s=w.block_s,
                         max_context_tokens=w.max_context_tokens, block_tokens=w.sessions.prefix_block_tokens,
                         max_session_span_s=w.sessions.max_session_span_s)
    sim = Simulator(topo, parts.model, parts.gpu, parts.latency, parts.power, net, carbon, engine=parts.engine,
                    dispatcher=scenario.engine.dispatcher)
    b = wl.arrivals_between(0.0, duration_s)
    for a, p, o in zip(b.arrival_s.tolist(), b.prompt_tokens.tolist(), b.output_tokens.tolist()):
        sim.advance_to(a)
        sim.submit(0, a, p, o, 0)
    sim.run_until_idle()
    return sim.pop_completed()


def probe(scenario, rate: float, duration_s: float, warmup_s: float, seeds, ttft_limit_s: float, min_requests: int = 3000):
    from carbon_gym.capacity import SloProbe

    ttft, tpot = [], []
    # long enough for >= min_requests counted requests in all: a p99 of a few hundred is the max
    duration_s = max(duration_s, warmup_s + min_requests / (rate * len(seeds)))
    for s in seeds:
        rec = _records(scenario, rate, duration_s, s)
        keep = rec.arrival_s >= warmup_s
        ttft.append(rec.ttft_s[keep])
        tpot.append(rec.tpot_s[keep & (rec.output_tokens > 1)])
    t1, t2 = np.concatenate(ttft), np.concatenate(tpot)
    p1 = float(np.percentile(t1, 99)) if t1.size else 0.0
    p2 = float(np.percentile(t2, 99)) if t2.size else 0.0
    viol = float(np.mean(t1 > scenario.ttft_s)) if t1.size else 0.0
    return SloProbe(rate, int(t1.size), p1, p2, viol, p1 <= ttft_limit_s and p2 <= scenario.tpot_s)


def main(argv: list[str] | None = None) -> int:
    from carbon_gym.capacity import _bisect
    from carbon_gym.scenario import capacity_key, load_scenario

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="llama8b-sessions-moderate")
    ap.add_argument("--duration", type=float, default=1800.0, help="simulated s per probe and seed (at least enough "
                    "for 3,000 counted requests)")
    ap.add_argument("--warmup", type=float, default=300.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--idle-rate", type=float, default=0.01, help="per-engine rate of the idle-engine reference, requests/s")
    ap.add_argument("--rel-tol", type=float, default=0.02)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    sc = load_scenario(args.scenario, overrides={"workload.rate_per_s": 1.0})  # (the rate is the probe's)
    t0 = time.perf_counter()
    idle = probe(sc, args.idle_rate, args.duration, args.warmup, args.seeds, float("inf"))
    limit = idle.p99_ttft_s + sc.ttft_s
    print(f"idle engine ({args.idle_rate}/s, n={idle.n}): p99 TTFT {idle.p99_ttft_s:.3f} s, p99 TPOT {idle.p99_tpot_s * 1e3:.1f} ms "
          f"-> TTFT limit {limit:.3f} s")
    cap, probes = _bisect(lambda r: probe(sc, r, args.duration, args.warmup, args.seeds, limit), args.rel_tol, 0.5, 100.0, print)
    key = capacity_key(sc.model, sc.gpu, sc.tp)
    print(f"capacity {key}: {cap:.4f} requests/s per engine ({time.perf_counter() - t0:.0f} s)")
    if args.write:
        from carbon_gym.sessions import load_session_params

        path = Path(load_session_params(sc.workload.sessions.generator).source)
        text = path.read_text()
        i = text.find(f'\n[capacity."{key}"]')
        if i >= 0:
            j = text.find("\n[", i + 1)
            text = text[:i] + (text[j:] if j >= 0 else "\n")
        text = text.rstrip("\n") + "\n\n" + "\n".join([
            f'[capacity."{key}"]',
            f"per_engine_rate_per_s = {cap:.4f}",
            f"idle_p99_ttft_s = {idle.p99_ttft_s:.4f}",
            f"ttft_limit_s = {limit:.4f}",
            f"tpot_s = {sc.tpot_s}",
            f"probe_duration_s = {args.duration}",
            f"probe_warmup_s = {args.warmup}",
            f"probe_seeds = {list(args.seeds)}",
            f"rel_tol = {args.rel_tol}",
            "prefix_cache = false",
            'command = "python eval/measure_session_capacity.py --write"',
        ]) + "\n"
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
