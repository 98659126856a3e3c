"""Measure per-engine serving capacity with the simulator and (optionally) write the load levels.

    python eval/measure_capacity.py                 # print capacities of the three study models
    python eval/measure_capacity.py --write         # ... and update carbon_gym/data/load_levels.toml
    python eval/measure_capacity.py --models llama-3.1-8b --duration 300 --seeds 0
    python eval/measure_capacity.py --models llama-3.1-8b --cluster   # + the cluster-level figure
    python eval/measure_capacity.py --cluster --skip-engine --write  # cluster figures beside the file's engine ones
    python eval/measure_capacity.py --datacenter --skip-engine --write  # datacenter figures per polling period

Method (carbon_gym/capacity.py): bisection over the Poisson rate offered to ONE engine for the
highest rate at which p99 TTFT and p99 TPOT stay within the model's MLPerf targets; settings
(engine, lengths, context cap, SLO) from the model's study scenario ``<model>-moderate``.
A model whose latency parameters are missing keeps its previous entry (marked PROVISIONAL).

``--cluster`` also measures the cluster-level capacity (``carbon_gym.capacity.measure_cluster_capacity``:
the whole ``<model>-moderate`` topology under round-robin with its polling period and network) and
prints it next to the engine figure; with ``--write`` it is written beside the engine figure
(``cluster_per_engine_rate_per_s``, ``cluster_to_engine_ratio`` and the probe settings, prefixed
``cluster_``). The load levels are fractions of the cluster figure (the file's ``level_basis =
"cluster"``, kept in its header); the engine figure (``basis = "engine: ..."`` in every entry) is
what one engine serves, used by the schedulers' capacity models.

``--datacenter`` measures the datacenter figures: one datacenter of the study topology's engines
(its GPUs / tp), fed Poisson arrivals placed every polling period (each of ``--periods``) behind its
dispatcher, no network, with the study scenario's engine settings, lengths and SLO
(``eval.bound_slo.measured_capacity``, the SLO-true bound's own probe and settings: the same
figures, rounded to 4 decimals); written as parallel lists ``dc_engines``,
``dc_polling_period_s``, ``dc_per_engine_rate_per_s`` (and ``dc_active_j_per_request``, J above
idle per request there). The facility MILP's default step cap holds each datacenter to this
figure (``solvers.facility_model.FacilityConfig.operating_point``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

#: How ``per_engine_rate_per_s`` (the engine figure) is measured.
ENGINE_BASIS = "engine: one engine fed every request at its arrival (no network, no polling wait)"
#: How ``cluster_per_engine_rate_per_s`` (what the load levels are fractions of) is measured.
CLUSTER_BASIS = ("cluster: the <model>-moderate topology, round-robin over its datacenters, placed every polling "
                 "period, network delays in TTFT")
STUDY = {"llama-3.1-8b": "llama8b", "qwen2.5-7b": "qwen7b", "mixtral-8x7b": "mixtral8x7b"}


def _toml_entry(key: str, fields: dict) -> str:
    from carbon_gym._toml import toml_value

    lines = [f'[capacity."{key}"]']
    lines += [f"{k} = {toml_value(v)}" for k, v in fields.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(STUDY), choices=list(STUDY))
    ap.add_argument("--gpus", nargs="+", default=[None], metavar="GPU",
                    help="GPUs to measure on (packaged names, e.g. h100-80gb a100-40gb h200; default: the scenarios' own)")
    ap.add_argument("--duration", type=float, default=900.0, help="simulated seconds of arrivals per probe")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds of arrivals not counted")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds pooled per probe")
    ap.add_argument("--rel-tol", type=float, default=0.01, help="bisection stops at this relative width")
    ap.add_argument("--write", action="store_true", help="update carbon_gym/data/load_levels.toml")
    ap.add_argument("--cluster", action="store_true",
                    help="also measure the cluster-level capacity (written beside the engine figure with --write)")
    ap.add_argument("--cluster-duration", type=float, default=180.0, help="simulated seconds per cluster probe")
    ap.add_argument("--cluster-warmup", type=float, default=60.0, help="seconds of a cluster probe not counted")
    ap.add_argument("--cluster-seeds", type=int, nargs="+", default=[0], help="seeds pooled per cluster probe")
    ap.add_argument("--skip-engine", action="store_true",
                    help="with --cluster / --datacenter: quote the engine figure from the file")
    ap.add_argument("--datacenter", action="store_true",
                    help="also measure the datacenter figures per polling period (written beside the engine figure with --write)")
    ap.add_argument("--periods", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0, 2.0], metavar="S",
                    help="with --datacenter: polling periods, seconds")
    ap.add_argument("--engines", type=int, nargs="+", default=None, metavar="E",
                    help="with --datacenter: engines per datacenter (default: the study topology's)")
    args = ap.parse_args(argv)

    import warnings

    from carbon_gym.capacity import measure_capacity, measure_cluster_capacity
    from carbon_gym.errors import CarbonGymError
    from carbon_gym.scenario import capacity_key, load_levels_path, load_load_levels, load_scenario

    warnings.simplefilter("ignore", UserWarning)
    old = load_load_levels()
    command = "python eval/measure_capacity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    entries: dict[str, dict] = {}
    for key, cap in old.capacities.items():  # kept unless re-measured below
        entries[key] = {"model": cap.model, "gpu": cap.gpu, "status": "PROVISIONAL" if cap.provisional else
                        cap.conditions.get("status", "MEASURED"), "per_engine_rate_per_s": cap.per_engine_rate_per_s,
                        "tp": cap.tp, "basis": ENGINE_BASIS,
                        **{k: v for k, v in cap.conditions.items() if k not in ("status", "basis")}}
    for model, gpu in [(m, g) for m in args.models for g in args.gpus]:
        over: dict[str, object] = {"workload.rate_per_s": 1.0}
        if gpu is not None:
            over["gpu"] = gpu
        scenario = load_scenario(f"{STUDY[model]}-moderate", overrides=over)
        key = capacity_key(model, scenario.gpu, scenario.tp)
        print(f"{key} (SLO TTFT {scenario.ttft_s} s / TPOT {scenario.tpot_s} s):", flush=True)
        t0 = time.perf_counter()
        if args.skip_engine and (args.cluster or args.datacenter) and old.find(model, scenario.gpu, scenario.tp) is not None:
            if args.cluster:
                entries[key].update(_cluster(scenario, old.find(model, scenario.gpu, scenario.tp).per_engine_rate_per_s, args,
                                             measure_cluster_capacity, command.strip()))
            if args.datacenter:
                entries[key].update(_datacenter(STUDY[model], gpu, args.periods, args.engines, command.strip()))
            continue
        try:
            res = measure_capacity(scenario, rel_tol=args.rel_tol, duration_s=args.duration, warmup_s=args.warmup,
                                   seeds=tuple(args.seeds), log=print)
        except CarbonGymError as exc:
            print(f"  cannot measure: {exc}; keeping the previous (PROVISIONAL) entry")
            continue
        wall = time.perf_counter() - t0
        best = max((p for p in res.probes if p.ok), key=lambda p: p.rate_per_s)
        print(f"  capacity {res.per_engine_rate_per_s:.3f} requests/s per engine ({wall:.1f} s wall)")
        entries[key] = {
            "model": model,
            "gpu": scenario.gpu,
            "status": "MEASURED",
            "per_engine_rate_per_s": round(res.per_engine_rate_per_s, 4),
            "tp": res.tp,
            "basis": ENGINE_BASIS,
            "lengths": res.settings["lengths"],
            "max_context_tokens": res.settings["max_context_tokens"],
            "ttft_s": res.settings["ttft_s"],
            "tpot_s": res.settings["tpot_s"],
            "p99_ttft_s_at_capacity": round(best.p99_ttft_s, 4),
            "p99_tpot_s_at_capacity": round(best.p99_tpot_s, 5),
            "probe_duration_s": args.duration,
            "probe_warmup_s": args.warmup,
            "probe_seeds": list(args.seeds),
            "rel_tol": args.rel_tol,
            "command": command.strip(),
        }
        if args.cluster:
            entries[key].update(_cluster(scenario, res.per_engine_rate_per_s, args, measure_cluster_capacity, command.strip()))
        if args.datacenter:
            entries[key].update(_datacenter(STUDY[model], gpu, args.periods, args.engines, command.strip()))
    if args.write:
        path = load_levels_path()
        text = path.read_text()
        head = text[: text.index("[fractions]")]
        fr = old.fractions
        body = f"[fractions]\nlow = {fr['low']}\nmoderate = {fr['moderate']}\nhigh = {fr['high']}\n"
        for key, fields in entries.items():
            body += "\n" + _toml_entry(key, fields) + "\n"
        Path(path).write_text(head + body)
        print(f"wrote {path}")
    return 0


def _cluster(scenario: object, engine_rate: float, args: argparse.Namespace, measure: object, command: str) -> dict:
    """Measure and print the cluster-level capacity of ``scenario`` next to the engine figure;
    returns the ``cluster_*`` fields of its load-level entry."""
    s: Any = scenario
    print(f"  cluster level: {s.name} ({s.n_engines()} engines, polling {s.polling_period_s} s, round-robin):", flush=True)
    t0 = time.perf_counter()
    res = measure(s, rel_tol=args.rel_tol, duration_s=args.cluster_duration, warmup_s=args.cluster_warmup,  # type: ignore[operator]
                  seeds=tuple(args.cluster_seeds), start_rate_per_s=engine_rate, log=print)
    ratio = res.per_engine_rate_per_s / engine_rate
    print(f"  engine-level {engine_rate:.4f} vs cluster-level {res.per_engine_rate_per_s:.4f} requests/s per engine "
          f"(cluster / engine = {ratio:.3f}; {time.perf_counter() - t0:.1f} s wall)")
    ok = [p for p in res.probes if p.ok]
    best = max(ok, key=lambda p: p.rate_per_s) if ok else None
    return {
        "cluster_per_engine_rate_per_s": round(res.per_engine_rate_per_s, 4),
        "cluster_to_engine_ratio": round(ratio, 4),
        "cluster_basis": CLUSTER_BASIS,
        "cluster_scenario": s.name,
        "cluster_engines": s.n_engines(),
        "cluster_polling_period_s": s.polling_period_s,
        "cluster_p99_ttft_s_at_capacity": round(best.p99_ttft_s, 4) if best else float("nan"),
        "cluster_p99_tpot_s_at_capacity": round(best.p99_tpot_s, 5) if best else float("nan"),
        "cluster_probe_duration_s": args.cluster_duration,
        "cluster_probe_warmup_s": args.cluster_warmup,
        "cluster_probe_seeds": list(args.cluster_seeds),
        "cluster_rel_tol": args.rel_tol,
        "cluster_command": command,
    }


def _datacenter(study: str, gpu: str | None, periods: list[float], engines: list[int] | None, command: str) -> dict:
    """Measure and print the datacenter figures of ``<study>-moderate`` (on ``gpu``; datacenters of
    ``engines`` engines, default its datacenters' counts) at each polling period; returns the
    ``dc_*`` fields of its entry."""
    from carbon_gym.scenario import load_scenario
    from eval.bound_slo import PROBE, measured_capacity

    rows: list[tuple[int, float, float, float]] = []
    for period in periods:
        over: dict[str, object] = {"workload.rate_per_s": 1.0, "polling_period_s": float(period)}
        if gpu is not None:
            over["gpu"] = gpu
        s = load_scenario(f"{study}-moderate", overrides=over)
        counts = sorted(set(engines) if engines else {max(1, d.engines(s.tp)) for d in s.topology_spec().datacenters
                                                       if str(d.gpu or s.gpu) == s.gpu})
        for n in counts:
            t0 = time.perf_counter()
            res = measured_capacity(s, s.gpu, n)
            print(f"  datacenter level: {n} engines, polling {period:g} s: {res.per_engine_rate_per_s:.4g} requests/s per "
                  f"engine, {res.active_j_per_request:.4g} J per request above idle ({time.perf_counter() - t0:.1f} s wall)", flush=True)
            rows.append((n, float(period), float(res.per_engine_rate_per_s), float(res.active_j_per_request)))
    return {
        "dc_engines": [r[0] for r in rows],
        "dc_polling_period_s": [r[1] for r in rows],
        "dc_per_engine_rate_per_s": [round(r[2], 4) for r in rows],
        "dc_active_j_per_request": [round(r[3], 3) for r in rows],
        "dc_basis": "datacenter: one datacenter of dc_engines engines, Poisson arrivals placed every dc_polling_period_s, "
                    "its dispatcher, no network",
        "dc_probe": (f"{PROBE['duration_s']:g} s probes, {PROBE['warmup_s']:g} s warm-up, seeds {list(PROBE['seeds'])}, "
                     f"{PROBE['rel_tol']:g} relative width (eval.bound_slo.PROBE)"),
        "dc_command": command,
    }


if __name__ == "__main__":
    raise SystemExit(main())
