"""``carbon-gym calibrate ...`` / ``python -m calibration ...``: fit, derive, power, serving, profile, validate, report.

Run ``python -m calibration <command> --help`` for the options of each command.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from carbon_gym.errors import CarbonGymError

PROG = "carbon-gym calibrate"


def _common_model_args(p: argparse.ArgumentParser, engines: int, tp_default: int | None = 1) -> None:
    p.add_argument("--model", default="llama-3.1-8b", help="model name (carbon_gym/data/models.toml)")
    p.add_argument("--gpu", default="a100-80gb", help="GPU name (carbon_gym/data/gpus.toml)")
    p.add_argument("--tp", type=int, default=tp_default, help="tensor-parallel degree (default: the model's)")
    p.add_argument("--engines", type=int, default=engines, help=f"engines on the node (default {engines})")
    p.add_argument("--latency", default=None, help="latency parameter file (default: the packaged one)")
    p.add_argument("--power-params", default=None, help="power parameter file (default: the packaged one)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="engine token budget per iteration")
    p.add_argument("--max-num-seqs", type=int, default=None, help="engine max running sequences")
    p.add_argument("--seed", type=int, default=0, help="seed of the regenerated arrivals (default 0)")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Calibrate carbon_gym's latency and power models.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fit", help="fit latency parameters from a kernel profile (default: the shipped A100 one)")
    p.add_argument("--profile", default=None, help="operator CSV (Vidur mlp.csv format); default: shipped A100 profile")
    p.add_argument("--attention", default=None, help="attention anchors file; default: shipped A100 anchors")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpu", default="a100-80gb")
    p.add_argument("--model-spec", default=None, help="TOML with the model's table if it is not shipped")
    p.add_argument("--gpu-spec", default=None, help="TOML with the GPU's table if it is not shipped")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--overhead-ms", type=float, default=None,
                   help="framework overhead per iteration (default: calibrated, see calibration/overhead.py)")
    p.add_argument("--no-power", action="store_true", help="skip the power fit to the bundled serving points")
    p.add_argument("--write", action="store_true", help="write the parameter file (default: print only)")
    p.add_argument("--out", default=None, help="where to write (default: carbon_gym/data/params/latency/...)")

    p = sub.add_parser("derive", help="derive other models / TP degrees from the profile, and other GPUs by roofline")
    p.add_argument("--target", action="append", default=None, metavar="[GPU/]MODEL:TP",
                   help="derive only these (repeatable), e.g. qwen2.5-7b:1 or h200/llama-3.1-8b:1; default: all shipped")
    p.add_argument("--gpu", default="a100-80gb", help="GPU of the profiled sets (source of the GPU derivations)")
    p.add_argument("--check-profiles", nargs=2, default=None, metavar=("SOURCE_CSV", "TARGET_CSV"),
                   help="check the GPU derivation: two measured mlp.csv profiles of one model on two GPUs")
    p.add_argument("--check-gpus", default="a100-80gb:h100-80gb", metavar="SOURCE:TARGET",
                   help="GPUs of --check-profiles (default a100-80gb:h100-80gb)")
    p.add_argument("--check-model", default="llama-3.1-8b", help="model of --check-profiles")
    p.add_argument("--check-model-spec", default=None, help="TOML with that model's table if it is not shipped")
    p.add_argument("--write", action="store_true", help="write the parameter files into the package")

    p = sub.add_parser("power", help="fit power parameters from GPU power samples")
    p.add_argument("--samples", default=None, help="CSV phase,prefill_tokens,n_decode,power_w")
    p.add_argument("--log", default=None, help="power log (nvidia-smi CSV or profiler power_log.csv)")
    p.add_argument("--intervals", default=None, help="CSV start_s,end_s,phase,prefill_tokens,n_decode (with --log)")
    p.add_argument("--gpu", default="a100-80gb", help="GPU whose packaged parameters are the prior")
    p.add_argument("--gpu-index", type=int, default=None, help="GPU index in a multi-GPU log")
    p.add_argument("--trim-s", type=float, default=0.5, help="seconds left out at both ends of each interval")
    p.add_argument("--name", default=None, help="name of the fitted parameter set (default: --gpu)")
    p.add_argument("--write", action="store_true", help="write the parameter file")
    p.add_argument("--out", default=None, help="where to write (default: carbon_gym/data/params/power/<name>.toml)")

    p = sub.add_parser("serving", help="correct overhead_s end to end from vLLM benchmark results")
    p.add_argument("results", nargs="+", help="vLLM --save-result JSON files or directories of them")
    _common_model_args(p, engines=1)
    p.add_argument("--metric", default="both", choices=["both", "ttft", "tpot"])
    p.add_argument("--max-overhead-ms", type=float, default=20.0)
    p.add_argument("--write", action="store_true", help="write the latency file with the corrected overhead_s")
    p.add_argument("--out", default=None, help="where to write (default: the packaged latency file)")

    p = sub.add_parser("profile", help="time the model's operators on this GPU and sample its power")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--tp", type=int, default=None, help="TP degree whose per-GPU shapes to profile (default: model's)")
    p.add_argument("--out", default=None, help="output directory (default: calibration/measurements/<gpu>/<model>__tp<k>)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:1, ... or cpu (with --tiny: a dry run)")
    p.add_argument("--tiny", action="store_true", help="toy shapes and grids (seconds; for testing the script)")
    p.add_argument("--quick", action="store_true", help="half the grid points")
    p.add_argument("--no-power", action="store_true", help="skip the power phases")

    sub.add_parser("validate", help="the shipped parameter files against every bundled measured point")

    p = sub.add_parser("report", help="validation protocol: 19 rates 2-50 req/s on one node vs reference runs")
    p.add_argument("--reference", default=None, help="directory of vLLM --save-result JSONs, one per rate")
    _common_model_args(p, engines=8)
    p.add_argument("--requests-per-rate", type=int, default=None, help="requests per rate (default 2200)")
    p.add_argument("--rates", default=None, help="comma-separated rates for the no-reference mode")
    p.add_argument("--plot", default=None, help="PNG path (default: calibration_report.png with --reference)")
    p.add_argument("--write-predictions", default=None, help="write the simulated runs as vLLM-style JSONs here")
    return ap


def _setup(args: argparse.Namespace):
    from carbon_gym.physics.latency import load_latency_model
    from carbon_gym.physics.power import load_power_model
    from carbon_gym.specs import load_gpu_spec, load_model_spec

    from .replay import ReplaySetup

    model, gpu = load_model_spec(args.model), load_gpu_spec(args.gpu)
    tp = args.tp or model.default_tp
    opts = {}
    if args.max_num_batched_tokens is not None:
        opts["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.max_num_seqs is not None:
        opts["max_num_seqs"] = args.max_num_seqs
    return ReplaySetup(model, gpu, load_latency_model(args.gpu, args.model, tp, args.latency),
                       load_power_model(args.gpu, args.power_params), engines=args.engines, tp=tp, engine_options=opts)


def _cmd_fit(args: argparse.Namespace) -> int:
    from .derive import write_fit
    from .io import SHIPPED_ATTENTION, SHIPPED_MLP_CSV
    from .profile_fit import FRAMEWORK_OVERHEAD_S, fit_profile

    command = f"python -m calibration {args.argv_text}"
    fit = fit_profile(args.profile or SHIPPED_MLP_CSV, args.attention or SHIPPED_ATTENTION, args.model, args.gpu, args.tp,
                      overhead_s=FRAMEWORK_OVERHEAD_S if args.overhead_ms is None else args.overhead_ms * 1e-3,
                      command=command, model_spec_path=args.model_spec, gpu_spec_path=args.gpu_spec)
    for line in fit.report_lines():
        print(line)
    if args.overhead_ms is None:
        from .overhead import fit_overhead_from_itl

        for line in fit_overhead_from_itl().report_lines():
            print(line)
    if args.write:
        print(f"wrote {write_fit(fit, args.out)}")
    if not args.no_power:  # power files go to the package; not with --out (which names the latency file)
        _fit_serving_power(args.write and args.out is None)
    if not args.write:
        print("(nothing written; pass --write to write the parameter files)")
    mape = fit.iteration_mape_pct
    print(f"iteration_mape_pct={mape:.2f}" if not math.isnan(mape) else "iteration_mape_pct=nan")
    return 0


def _fit_serving_power(write: bool) -> None:
    """Fit and print (and with ``write`` write) the shipped power files from the bundled serving points."""
    from carbon_gym._toml import data_path
    from carbon_gym.physics.power import load_power_model

    from .io import dump_params_toml
    from .power_fit import POWER_SOURCES, fit_serving_power, load_serving_points, power_tables

    points = load_serving_points()
    fits = {}
    for gpu, src in POWER_SOURCES.items():
        if src not in fits:
            fits[src] = fit_serving_power(points, src, load_power_model(src if src != "a100-40gb" else "a100-80gb"), src)
            for line in fits[src].report_lines():
                print(line)
        if write:
            from dataclasses import replace

            prior = load_power_model(gpu) if data_path("params", "power", f"{gpu}.toml").exists() else fits[src].model
            m = replace(fits[src].model, name=gpu, idle_w=prior.idle_w, host_w=prior.host_w,
                        prefill_sat_tokens=prior.prefill_sat_tokens,
                        source=fits[src].model.source + ("" if gpu == src else f"; transferred from {src} (no "
                                                         f"published serving power of {gpu} found)"))
            out = data_path("params", "power", f"{gpu}.toml")
            tables = power_tables(m)
            if out.exists():  # the capacity states are not fitted here: keep them (sources in measurements/)
                from carbon_gym._toml import load_toml

                states = load_toml(out).get("states")
                if states is not None:
                    tables["states"] = dict(states)
            dump_params_toml(out, tables, ["GENERATED by `python -m calibration fit --write` -- do not edit by hand.",
                                                    "Provenance of every number: calibration/measurements/README.md."])
            print(f"wrote {out}")


def _cmd_derive(args: argparse.Namespace) -> int:
    from .derive import (
        SHIPPED_GPU_TARGETS, SHIPPED_TARGETS, derive_for_gpu, gpu_scaling_check, shipped_fit, tp_scaling_check, write_fit,
    )

    targets: list[tuple[str, str, int]] = [(args.gpu, m, tp) for m, tp in SHIPPED_TARGETS]
    if args.gpu == "a100-80gb":
        targets += list(SHIPPED_GPU_TARGETS)
    if args.target:
        targets = []
        for t in args.target:
            g, _, rest = t.rpartition("/")
            m, _, k = rest.partition(":")
            targets.append((g or args.gpu, m, int(k or 1)))
    check = tp_scaling_check(args.gpu)
    print("check of the roofline-ratio method: Llama token-level time derived from TP1 vs measured, MAPE %: "
          + ", ".join(f"TP{k}={v:.2f}" for k, v in check.items()))
    if args.check_profiles:
        sg, _, tg = args.check_gpus.partition(":")
        res = gpu_scaling_check(args.check_profiles[0], args.check_profiles[1], sg, tg, args.check_model,
                                args.check_model_spec)
        print(f"check of the GPU derivation {sg} -> {tg} ({args.check_model}, {int(res['points'])} token counts), MAPE %: "
              f"all {res['all']:.2f}, <=128 tokens {res['tokens<=128']:.2f}, >128 tokens {res['tokens>128']:.2f}")
    print(f"  {'parameters':<34s}{'decode b1 ms':>13s}{'b64 ctx1k ms':>14s}{'prefill 2048 ms':>17s}")
    for g, m, tp in targets:
        if g == args.gpu:
            fit = shipped_fit(m, tp, gpu=args.gpu, command="python -m calibration derive --write")
        else:
            fit = derive_for_gpu(m, tp, g, source_gpu=args.gpu)
        lm = fit.model()
        print(f"  {fit.name:<34s}{lm.iteration_time_s(0, 0, 1, 1000, 1) * 1e3:>13.2f}"
              f"{lm.iteration_time_s(0, 0, 64, 64000, 64) * 1e3:>14.2f}{lm.prefill_time_s(2048) * 1e3:>17.1f}")
        if args.write:
            print(f"    wrote {write_fit(fit)}")
    if not args.write:
        print("(nothing written; pass --write to write the parameter files)")
    return 0


def _cmd_power(args: argparse.Namespace) -> int:
    from carbon_gym._toml import data_path
    from carbon_gym.physics.power import load_power_model

    from .io import dump_params_toml, load_power_intervals, load_power_log, load_power_samples
    from .power_fit import fit_power_from_log, fit_power_from_samples, power_tables

    prior = load_power_model(args.gpu)
    if args.samples:
        fit = fit_power_from_samples(load_power_samples(args.samples), prior, args.name)
    elif args.log and args.intervals:
        fit = fit_power_from_log(load_power_log(args.log), load_power_intervals(args.intervals), prior, args.trim_s,
                                 args.gpu_index, args.name)
    else:
        print("calibrate power: give --samples CSV, or --log CSV with --intervals CSV", file=sys.stderr)
        return 2
    for line in fit.report_lines():
        print(line)
    if args.write:
        out = Path(args.out) if args.out else data_path("params", "power", f"{fit.model.name}.toml")
        dump_params_toml(out, power_tables(fit.model),
                         [f"GENERATED by `python -m calibration {args.argv_text}`"])
        print(f"wrote {out}")
    print(f"energy_error_pct={fit.energy_error_pct:.2f}")
    return 0


def _collect_results(paths: Sequence[str]):
    from .io import load_bench_result

    files: list[Path] = []
    for p in paths:
        q = Path(p)
        files.extend(sorted(q.glob("*.json")) if q.is_dir() else [q])
    return sorted((load_bench_result(f) for f in files), key=lambda r: r.request_rate)


def _cmd_serving(args: argparse.Namespace) -> int:
    from carbon_gym.physics.latency import latency_params_path

    from .io import dump_params_toml
    from .serving_fit import comparison_lines, fit_overhead

    setup = _setup(args)
    results = _collect_results(args.results)
    fit = fit_overhead(setup, results, args.seed, 0.0, args.max_overhead_ms * 1e-3, args.metric)
    for line in comparison_lines(fit.before, f"before (overhead_s={setup.latency.overhead_s}):"):
        print(line)
    for line in comparison_lines(fit.after, f"after (overhead_s={fit.overhead_s}):"):
        print(line)
    if args.write:
        from carbon_gym._toml import load_toml

        src = Path(args.latency) if args.latency else latency_params_path(args.gpu, args.model, setup.tp)
        tables = load_toml(src)
        tables["latency"] = dict(tables["latency"], overhead_s=fit.overhead_s)
        tables["latency"]["source"] += (f" overhead_s refitted to {fit.overhead_s} s end to end from "
                                        f"{len(results)} vLLM benchmark runs (calibration/serving_fit.py).")
        out = Path(args.out) if args.out else src
        dump_params_toml(out, tables, [f"GENERATED by `python -m calibration {args.argv_text}`"])
        print(f"wrote {out}")
    print(f"overhead_s={fit.overhead_s}")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from carbon_gym.specs import load_model_spec

    from .profiler import profile_main

    tp = args.tp or load_model_spec(args.model).default_tp
    return profile_main(args.model, tp, args.out, args.device, args.tiny, not args.no_power, args.quick)


def _cmd_validate(args: argparse.Namespace) -> int:
    from .validate import validation_lines, validation_rows

    for line in validation_lines(validation_rows()):
        print(line)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import PROTOCOL_RATES, REQUESTS_PER_RATE, run_report

    setup = _setup(args)
    rates = PROTOCOL_RATES if not args.rates else tuple(float(x) for x in args.rates.split(","))
    plot = args.plot or ("calibration_report.png" if args.reference else None)
    lines = run_report(setup, args.reference, rates=rates, requests_per_rate=args.requests_per_rate or REQUESTS_PER_RATE,
                       seed=args.seed, plot_path=plot, write_predictions=args.write_predictions)
    for line in lines:
        print(line)
    return 0


COMMANDS = {"fit": _cmd_fit, "derive": _cmd_derive, "power": _cmd_power, "serving": _cmd_serving,
            "profile": _cmd_profile, "report": _cmd_report,
            "validate": _cmd_validate}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``carbon-gym calibrate`` with ``argv`` (without the program name); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv_text = " ".join(argv)
    try:
        return COMMANDS[args.command](args)
    except CarbonGymError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
