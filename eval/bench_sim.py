"""Simulator throughput benchmark (issue 2).

Prints simulated requests per wall-clock second, engine iterations per second and peak memory for

(a) one engine (one A100, Llama-3.1-8B, TP1) at 5 req/s of Azure-conversation lengths;
(b) the full 512-GPU topology (4 regions x 4 datacenters x 4 nodes x 8 A100, Llama-3.1-8B TP1,
    512 engines, 16 hand-made hourly carbon zones) at a load that keeps the engines busy, with
    round-robin placement over the datacenters.

Requests are submitted the way the environment does: every ``--tick-s`` of simulated time the
simulator is advanced and the requests that arrived during the tick are placed in one
``submit_batch`` (their wait for placement counts in their TTFT); completed records are popped
every tick and reduced to running sums, so memory does not grow with finished requests.

(m) with ``--mooncake [PATH]`` or ``--only m``: a replay of the Mooncake conversation trace
(FAST'25; timestamps, lengths and 512-token ``hash_ids``; 12,031 requests) on one datacenter of
``--mooncake-engines`` A100 engines (Llama-3.1-8B TP1, 128k context) with automatic prefix caching
(``--mooncake-no-cache``: without) and the ``cache_aware`` dispatcher (``--mooncake-dispatcher``),
arrivals ``--mooncake-speedup`` times faster than recorded; it also prints the prefix hit rate
(cached / prompt tokens) and the prefill tokens saved. Measured on the 2-core shared host, compiled,
loaded (git 1c85452 alternating with 14e1d00, 2026-12-02; README "Benchmarks"): 11,458 simulated
requests per CPU second with the cache, median of 9 pairs (10,026-14,154; 14e1d00: 5,675), 17,693
without (5 pairs; 14e1d00: 11,568).

Usage: ``python -m eval.bench_sim [--requests-a N] [--requests-b N] [--only a|b|m] [--mooncake [PATH]]
[--mooncake-no-cache] [--profile]``. With no arguments it runs (a) and (b) in well under a minute;
the last line is ``requests_per_s=<lowest of the cases run>``. ``--profile`` prints each case's top
cProfile entries (``CARBON_GYM_PURE_PYTHON=1`` for a profile of the simulator's own functions).
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import pstats
import resource
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from carbon_gym.physics.carbon import CarbonTrace
from carbon_gym.physics.latency import load_latency_model
from carbon_gym.physics.network import Network
from carbon_gym.physics.power import load_power_model
from carbon_gym.sim import EngineConfig, Simulator
from carbon_gym.specs import load_gpu_spec, load_model_spec
from carbon_gym.topology import DatacenterSpec, Topology

AZURE_CONV = "AzureLLMInferenceTrace_conv_2023.csv"
MOONCAKE_CONV = Path("workload") / "mooncake" / "conversation_trace.jsonl"


def mooncake_trace(path: str | None) -> tuple[list[dict], str]:
    """Rows of a Mooncake-format jsonl trace (``timestamp`` ms, ``input_length``,
    ``output_length``, ``hash_ids``): ``path``, else the packaged or shared conversation trace."""
    import json

    here = Path(__file__).resolve().parents[1]
    cands = [Path(path)] if path else [here / "carbon_gym" / "data" / MOONCAKE_CONV, Path("/work/shared/data") / MOONCAKE_CONV]
    for p in cands:
        if p.exists():
            with open(p) as f:
                return [json.loads(line) for line in f if line.strip()], str(p)
    raise SystemExit(f"Mooncake trace not found (looked for {', '.join(map(str, cands))}); pass --mooncake PATH")


def run_mooncake(rows: list[dict], n_engines: int, dispatcher: str, speedup: float, tick_s: float,
                 prefix_caching: bool = True) -> dict:
    """Replay ``rows`` (Mooncake format) on one datacenter of ``n_engines`` A100 engines with prefix
    caching (or without: ``prefix_caching``); return measured figures (as :func:`run_case`, plus
    the prefix-cache totals)."""
    topo = Topology(("r",), (DatacenterSpec("dc", "r", "Z", 1.1, -(-n_engines // 8), min(n_engines, 8)),))
    net = Network(np.array([[0.005]]))
    ct = CarbonTrace(("Z",), datetime(2023, 1, 1), np.linspace(100, 400, 24)[:, None], "step")
    gpu = load_gpu_spec("a100-80gb")
    eng = EngineConfig(max_model_len=131072, prefix_caching=prefix_caching, prefix_block_tokens=512)
    sim = Simulator(topo, load_model_spec("llama-3.1-8b"), gpu, load_latency_model("a100-80gb", "llama-3.1-8b", 1),
                    load_power_model("a100-80gb"), net, ct, engine=eng, dispatcher=dispatcher)
    arrival = np.array([r["timestamp"] for r in rows], dtype=np.float64) / 1e3 / speedup
    prompt = np.array([r["input_length"] for r in rows], dtype=np.int64)
    output = np.array([r["output_length"] for r in rows], dtype=np.int64)
    hashes = [r["hash_ids"] for r in rows]
    n = len(rows)
    zeros = np.zeros(n, dtype=np.int64)
    done = 0
    ttft_sum = 0.0
    t0 = time.perf_counter()
    c0 = time.process_time()
    i = 0
    t = 0.0
    while i < n or done < n:
        t += tick_s if i < n else 10.0
        sim.advance_to(t)
        j = int(np.searchsorted(arrival, t, side="right"))
        if j > i:
            sim.submit_batch(zeros[i:j], arrival[i:j], prompt[i:j], output[i:j], zeros[i:j], prefix_hashes=hashes[i:j])
            i = j
        r = sim.pop_completed()
        done += len(r)
        ttft_sum += float(r.ttft_s.sum())
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    tot = sim.totals()
    return dict(
        name=f"m: Mooncake replay, {n_engines} engines, {dispatcher}, x{speedup:g}{'' if prefix_caching else ', no cache'}",
        requests=done, simulated_s=t,
        wall_s=wall, requests_per_s=done / wall, cpu_s=cpu, requests_per_cpu_s=done / cpu, iterations=tot.iterations,
        events=sim.events_processed, preemptions=tot.preemptions, mean_ttft_s=ttft_sum / max(done, 1),
        hit_rate=tot.overall_prefix_hit_rate, prompt_tokens=int(tot.prompt_tokens.sum()),
        saved_tokens=int(tot.prefill_saved_tokens.sum()), evictions=int(tot.prefix_evictions.sum()),
        facility_kwh=float(tot.facility_energy_j.sum()) / 3.6e6,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    )


def report_mooncake(res: dict) -> None:
    print(f"({res['name']}) requests={res['requests']} simulated_s={res['simulated_s']:.0f} wall_s={res['wall_s']:.2f} "
          f"requests_per_s={res['requests_per_s']:.0f} cpu_s={res['cpu_s']:.2f} "
          f"requests_per_cpu_s={res['requests_per_cpu_s']:.0f} iterations={res['iterations']} events={res['events']} "
          f"preemptions={res['preemptions']} mean_ttft_s={res['mean_ttft_s']:.3f} hit_rate={res['hit_rate']:.3f} "
          f"prompt_tokens={res['prompt_tokens']} prefill_saved_tokens={res['saved_tokens']} "
          f"prefix_evictions={res['evictions']} facility_kwh={res['facility_kwh']:.2f} "
          f"peak_rss_mb={res['peak_rss_mb']:.0f}", flush=True)


def azure_conv_lengths() -> tuple[np.ndarray, np.ndarray, str]:
    """(prompt tokens, output tokens, source) of the Azure 2023 conversation trace."""
    here = Path(__file__).resolve().parents[1]
    for p in (here / "carbon_gym" / "data" / "workload" / AZURE_CONV, Path("/work/shared/data/workload") / AZURE_CONV):
        if p.exists():
            with open(p, newline="") as f:
                rows = list(csv.DictReader(f))
            prompt = np.array([int(r["ContextTokens"]) for r in rows], dtype=np.int64)
            output = np.array([int(r["GeneratedTokens"]) for r in rows], dtype=np.int64)
            return prompt, output, str(p)
    print("note: Azure conversation trace not found; sampling lognormal lengths "
          "(median prompt 1020, output 129) instead", file=sys.stderr)
    rng = np.random.default_rng(0)
    prompt = np.clip(rng.lognormal(np.log(1020), 0.8, 20000), 2, 14000).astype(np.int64)
    output = np.clip(rng.lognormal(np.log(129), 0.9, 20000), 7, 1000).astype(np.int64)
    return prompt, output, "lognormal fallback"


def one_engine_world():
    topo = Topology(("r",), (DatacenterSpec("dc", "r", "Z", 1.1, 1, 1),))
    net = Network(np.array([[0.005]]))
    ct = CarbonTrace(("Z",), datetime(2023, 1, 1), np.linspace(100, 400, 24)[:, None], "step")
    return topo, net, ct


def full_world(seed: int = 0):
    """4 regions x 4 datacenters x 4 nodes x 8 A100; hand-made RTTs and 16 carbon zones."""
    rng = np.random.default_rng(seed)
    regions = ("us", "eu", "asia", "oce")
    dcs = []
    for r, reg in enumerate(regions):
        for k in range(4):
            dcs.append(DatacenterSpec(f"{reg}-{k}", reg, f"Z{r}{k}", float(rng.uniform(1.08, 1.4)), 4, 8))
    topo = Topology(regions, tuple(dcs))
    inter = np.array([[0.0, 0.04, 0.09, 0.08], [0.04, 0.0, 0.12, 0.14], [0.09, 0.12, 0.0, 0.05],
                      [0.08, 0.14, 0.05, 0.0]])
    ow = np.repeat(inter, 4, axis=1) + rng.uniform(0.002, 0.006, (4, 16))
    net = Network(ow)
    hours = 24 * 14
    h = np.arange(hours)[:, None]
    base = rng.uniform(30, 700, (1, 16))
    ci = base * (1 + 0.3 * np.sin(2 * np.pi * (h / 24 + rng.uniform(0, 1, (1, 16))))) + rng.uniform(0, 20, (hours, 16))
    ct = CarbonTrace(tuple(d.zone for d in dcs), datetime(2023, 6, 1), ci, "step")
    return topo, net, ct


def make_simulator(world, engine: EngineConfig = EngineConfig()) -> Simulator:
    topo, net, ct = world
    gpu = load_gpu_spec("a100-80gb")
    return Simulator(topo, load_model_spec("llama-3.1-8b"), gpu, load_latency_model("a100-80gb", "llama-3.1-8b", 1),
                     load_power_model("a100-80gb"), net, ct, engine=engine)


def run_case(name: str, sim: Simulator, n_requests: int, rate_per_s: float, lengths, tick_s: float,
             seed: int, placement: str = "round_robin") -> dict:
    """Drive ``sim`` with ``n_requests`` Poisson arrivals; return measured figures."""
    rng = np.random.default_rng(seed)
    prompt_all, output_all, _ = lengths
    idx = rng.integers(0, prompt_all.size, n_requests)
    mml = sim.engine_config.max_model_len
    prompt = np.minimum(prompt_all[idx], mml // 2)
    output = np.minimum(output_all[idx], mml - prompt)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, n_requests))
    R, D = sim.n_regions, sim.n_datacenters
    origin = rng.integers(0, R, n_requests)
    dc = np.arange(n_requests) % D
    done = 0
    ttft_sum = tpot_sum = 0.0
    t0 = time.perf_counter()
    c0 = time.process_time()
    i = 0
    t = 0.0
    end_arrival = float(arrival[-1])
    while i < n_requests:
        t += tick_s
        sim.advance_to(t)
        j = int(np.searchsorted(arrival, t, side="right"))
        if j > i:
            sim.submit_batch(origin[i:j], arrival[i:j], prompt[i:j], output[i:j], dc[i:j])
            i = j
        r = sim.pop_completed()
        done += len(r)
        ttft_sum += float(r.ttft_s.sum())
        tpot_sum += float(r.tpot_s.sum())
    # drain
    while sim.totals().in_flight:
        t += 10.0
        sim.advance_to(t)
        r = sim.pop_completed()
        done += len(r)
        ttft_sum += float(r.ttft_s.sum())
        tpot_sum += float(r.tpot_s.sum())
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    tot = sim.totals()
    n_eng = sum(d.n_engines for d in sim.datacenters)
    idle_w = sim._models.idle_engine_w
    busy = 1.0 - float(tot.idle_energy_j.sum()) / (n_eng * idle_w * t) if idle_w > 0 else float("nan")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return dict(
        name=name, requests=done, simulated_s=t, arrivals_span_s=end_arrival, wall_s=wall,
        requests_per_s=done / wall, cpu_s=cpu, requests_per_cpu_s=done / cpu, iterations=tot.iterations, iterations_per_s=tot.iterations / wall,
        busy_frac=busy, events=sim.events_processed, preemptions=tot.preemptions, mean_ttft_s=ttft_sum / max(done, 1),
        mean_tpot_s=tpot_sum / max(done, 1), peak_rss_mb=rss_mb,
        carbon_kg=float(tot.carbon_g.sum()) / 1e3, facility_kwh=float(tot.facility_energy_j.sum()) / 3.6e6,
    )


def report(res: dict) -> None:
    print(f"({res['name']}) requests={res['requests']} simulated_s={res['simulated_s']:.0f} wall_s={res['wall_s']:.2f} "
          f"requests_per_s={res['requests_per_s']:.0f} cpu_s={res['cpu_s']:.2f} "
          f"requests_per_cpu_s={res['requests_per_cpu_s']:.0f} iterations={res['iterations']} "
          f"iterations_per_s={res['iterations_per_s']:.0f} busy_frac={res['busy_frac']:.2f} events={res['events']} preemptions={res['preemptions']} "
          f"mean_ttft_s={res['mean_ttft_s']:.3f} mean_tpot_s={res['mean_tpot_s']:.4f} "
          f"facility_kwh={res['facility_kwh']:.1f} carbon_kg={res['carbon_kg']:.1f} "
          f"peak_rss_mb={res['peak_rss_mb']:.0f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests-a", type=int, default=20000, help="requests for case (a), one engine")
    ap.add_argument("--rate-a", type=float, default=5.0, help="arrival rate of case (a), req/s")
    ap.add_argument("--requests-b", type=int, default=200000, help="requests for case (b), 512 GPUs (>= 200000)")
    ap.add_argument("--rate-per-engine-b", type=float, default=5.0, help="arrivals per engine per second in (b)")
    ap.add_argument("--tick-s", type=float, default=0.5, help="placement period, simulated seconds")
    ap.add_argument("--only", choices=["a", "b", "m"], help="run one case only")
    ap.add_argument("--mooncake", nargs="?", const="", default=None, metavar="PATH",
                    help="also run case (m): replay a Mooncake trace with prefix caching (default: the conversation trace)")
    ap.add_argument("--mooncake-engines", type=int, default=32,
                    help="engines of case (m)'s datacenter (32: 4 nodes x 8 A100, a datacenter of the default topology)")
    ap.add_argument("--mooncake-dispatcher", default="cache_aware", help="dispatcher of case (m)")
    ap.add_argument("--mooncake-speedup", type=float, default=1.0, help="case (m): arrivals this many times faster")
    ap.add_argument("--mooncake-no-cache", action="store_true", help="case (m) without prefix caching (for comparison)")
    ap.add_argument("--profile", action="store_true", help="print the top cProfile entries of each case")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    results = []
    if args.only == "m" or args.mooncake is not None:
        rows, src = mooncake_trace(args.mooncake or None)
        print(f"Mooncake trace: {src} ({len(rows)} requests)")
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
        res = run_mooncake(rows, args.mooncake_engines, args.mooncake_dispatcher, args.mooncake_speedup, args.tick_s,
                           not args.mooncake_no_cache)
        if args.profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        report_mooncake(res)
        results.append(res)
        if args.only == "m":
            print(f"requests_per_s={res['requests_per_s']:.0f}")
            return 0
    lengths = azure_conv_lengths()
    print(f"workload lengths: {lengths[2]} (mean prompt {lengths[0].mean():.0f}, mean output {lengths[1].mean():.0f})")
    cases = []
    if args.only in (None, "a"):
        cases.append((f"a: 1 engine, {args.rate_a:.0f} req/s", lambda: make_simulator(one_engine_world()),
                      args.requests_a, args.rate_a))
    if args.only in (None, "b"):
        sim_b_rate = args.rate_per_engine_b * 512
        cases.append((f"b: 512 GPUs, {sim_b_rate:.0f} req/s round-robin", lambda: make_simulator(full_world(args.seed)),
                      args.requests_b, sim_b_rate))
    for name, build, n, rate in cases:
        sim = build()
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
        res = run_case(name, sim, n, rate, lengths, args.tick_s, args.seed)
        if args.profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        report(res)
        results.append(res)
        del sim
    print(f"requests_per_s={min(r['requests_per_s'] for r in results):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
