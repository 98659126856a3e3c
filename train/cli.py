"""``carbon-gym train``: config-driven training runs, resume, and checkpoint evaluation.

Usage::

    carbon-gym train --config train/configs/llama8b.toml [--run-dir runs/train/llama8b] [--resume]
                     [--total-timesteps N] [--export agent.npz] [--verbose]
                     [--vec {dummy,subproc,ray}] [--ray-address local|auto|ray://head:10001] [--update-threads N]
    carbon-gym train --config dev_maskable --resume          # continue an interrupted run
    carbon-gym train evaluate --checkpoint PATH --scenarios llama8b-moderate [--days 3] [--policies rr,greedy,milp]
    carbon-gym train export --checkpoint runs/train/llama8b_dagger_h8/best.npz --out train/checkpoints/llama8b_set.npz
    carbon-gym train export --checkpoint runs/train/llama8b/final.npz --out agent.npz --mode argmax
    carbon-gym train decision-time --scenario llama8b-moderate [--checkpoint PATH] [--steps 30]
    carbon-gym train imitate --config llama8b_dagger [--run-dir runs/train/llama8b_dagger] [--export PATH]

A run writes its set policy in the pickle-free format (``<run-dir>/final.npz``, :mod:`train.checkpoint`)
and resumes from pickle-free state (:mod:`train.resume_state`); checkpoints are read in that format, a
stable-baselines3 ``.zip`` (also written, e.g. ``final.zip``, and a routing-weights PPO's only result)
only with ``--trust-checkpoint``.

TensorBoard: ``tensorboard --logdir runs/train``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from carbon_gym.errors import CarbonGymError

PROG = "carbon-gym train"


#: ``carbon-gym train SUBCOMMAND``: what each does (listed by ``carbon-gym train --help``).
SUBCOMMANDS = {
    "evaluate": "compare a checkpoint with the schedulers on held-out days (Markdown table)",
    "export": "write a checkpoint in the pickle-free format, optionally recording safety knobs",
    "decision-time": "paired decision-time benchmark: learned vs a scheduler on the same observations",
    "imitate": "class-level DAgger on the facility MILP (a config with [dagger])",
}


def _train_parser() -> argparse.ArgumentParser:
    epilog = "subcommands (carbon-gym train SUBCOMMAND --help for each):\n" + "\n".join(
        f"  {name:14s} {what}" for name, what in SUBCOMMANDS.items())
    p = argparse.ArgumentParser(prog=PROG, description="Train a learned policy from a TOML config (train/configs/*.toml), "
                                "or run one of the subcommands below.", epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage=f"{PROG} [-h] --config CONFIG [options]  |  {PROG} {{{','.join(SUBCOMMANDS)}}} ...")
    p.add_argument("--config", required=True, help="config file, or the name of one in train/configs/ (e.g. llama8b)")
    p.add_argument("--run-dir", default=None, help="run directory (default: runs/train/<config name>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --run-dir from its latest pickle-free state (checkpoints/step_<t>.state.npz)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="with --resume: admit a run folder that holds only pickled SB3 / VecNormalize files (one written "
                        "before the pickle-free state existed); loading them can run their author's code")
    p.add_argument("--total-timesteps", type=int, default=None, help="override total_timesteps of the config")
    p.add_argument("--export", default=None, help="also export the final model to this path (a set policy in the pickle-free format, e.g. agent.npz)")
    p.add_argument("--verbose", action="store_true", help="print SB3's log tables")
    p.add_argument("--vec", default=None, choices=["dummy", "subproc", "ray"],
                   help="where the config's n_envs training envs run: in this process (dummy), one subprocess each "
                        "(subproc; the default for more than one env) or one Ray actor each (ray; needs Ray, "
                        "pip install 'carbon-gym[ray]')")
    p.add_argument("--update-threads", type=int, default=None,
                   help="torch threads of the PPO update; the rollouts keep the config's torch_threads (the envs are "
                        "idle during the update, so their cores are free; default: torch_threads for both)")
    p.add_argument("--ray-address", default=None,
                   help="run the training envs as Ray actors (implies --vec ray): 'local' starts a local Ray instance, "
                        "or join a cluster ('auto', 'ray://head:10001')")
    return p


def _eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} evaluate", description="Evaluate a checkpoint against the schedulers on held-out days.")
    p.add_argument("--checkpoint", default=None,
                   help="checkpoint .npz, e.g. runs/train/<run>/final.npz (default: the shipped one; an SB3 .zip needs --trust-checkpoint)")
    p.add_argument("--scenarios", default="llama8b-low,llama8b-moderate,llama8b-high")
    p.add_argument("--policies", default="rr,greedy,ilp,milp", help="baselines to compare with (policy registry names, short or long)")
    p.add_argument("--days", type=int, default=3, help="held-out episode starts per scenario")
    p.add_argument("--skip-days", type=int, default=0,
                   help="leave out the first N held-out starts (already used), e.g. --days 5 --skip-days 3 for starts 3-7")
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--max-pending", type=int, default=0, help="env.max_pending override (0: the scenario's own)")
    p.add_argument("--out", default="runs/train/evaluation.md",
                   help="Markdown table to write (default: runs/train/evaluation.md; train/RESULTS_TRAIN.md is hand-written "
                        "around such tables and is not overwritten unless named here)")
    p.add_argument("--json", default=None, help="also write the raw results as JSON")
    p.add_argument("--baselines-only", action="store_true", help="run (and cache) the baselines only")
    p.add_argument("--cache", default="runs/train/eval_cache.json", help="JSON cache of the baselines' episodes ('' = none)")
    p.add_argument("--mode", default=None, choices=["sample", "systematic", "argmax"], help="learned policy's choice mode (default: the checkpoint's)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="admit a stable-baselines3 .zip (loading one unpickles objects, which can run its author's code)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (``eval.cli`` delegates ``carbon-gym train ...`` here). Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "export":
            ap = argparse.ArgumentParser(prog=f"{PROG} export", description="Write a checkpoint for evaluation and sharing: a set policy in the pickle-free format.")
            ap.add_argument("--checkpoint", required=True, help="e.g. runs/train/<run>/final.npz or best.npz, or (with --trust-checkpoint) an SB3 .zip")
            ap.add_argument("--out", required=True, help="e.g. train/checkpoints/llama8b_set.npz")
            ap.add_argument("--trust-checkpoint", action="store_true",
                            help="admit a stable-baselines3 .zip (loading one unpickles objects, which can run its author's code)")
            ap.add_argument("--mode", default=None, choices=["sample", "systematic", "argmax"],
                            help="record this default choice mode in the copy (default: keep the source's)")
            for knob, what in (("load_price", "price per proposed request per engine above the mean"),
                               ("headroom_penalty", "logit per TTFT SLO of headroom shortfall"),
                               ("headroom_margin", "TTFT headroom margin, in SLOs")):
                ap.add_argument("--" + knob.replace("_", "-"), type=float, default=None,
                                help=f"record this safety knob ({what}; default: keep the source's)")
            a = ap.parse_args(argv[1:])
            from .policy import SAFETY_KNOB_NAMES, export_checkpoint

            safety = {k: getattr(a, k) for k in SAFETY_KNOB_NAMES if getattr(a, k) is not None}
            dst = export_checkpoint(a.checkpoint, a.out, mode=a.mode, safety=safety or None, trust=a.trust_checkpoint)
            print(f"exported {dst} ({dst.stat().st_size / 1024:.0f} KiB)")
            return 0
        if argv and argv[0] == "decision-time":
            ap = argparse.ArgumentParser(prog=f"{PROG} decision-time", description="Paired decision-time benchmark: learned vs a scheduler on the same observations.")
            ap.add_argument("--checkpoint", default=None, help="checkpoint .npz (default: the shipped one; an SB3 .zip needs --trust-checkpoint)")
            ap.add_argument("--scenario", default="llama8b-moderate")
            ap.add_argument("--other", default="facility-milp")
            ap.add_argument("--steps", type=int, default=30)
            ap.add_argument("--trust-checkpoint", action="store_true",
                            help="admit a stable-baselines3 .zip (loading one unpickles objects, which can run its author's code)")
            a = ap.parse_args(argv[1:])
            from .evaluate import paired_decision_times

            r = paired_decision_times(a.scenario, checkpoint=a.checkpoint, other=a.other, steps=a.steps, trust=a.trust_checkpoint)
            print(f"{a.scenario}: learned mean {1e3 * r['learned']['mean_s']:.2f} ms (p50 {1e3 * r['learned']['p50_s']:.2f}), "
                  f"{a.other} mean {1e3 * r[a.other]['mean_s']:.1f} ms (p50 {1e3 * r[a.other]['p50_s']:.1f}); "
                  f"ratio of means {r['ratio_mean']:.0f}x, of medians {r['ratio_p50']:.0f}x over {r['steps']} steps; "
                  f"CPU time: learned mean {1e3 * r['cpu']['learned']['mean_s']:.2f} ms, {a.other} {1e3 * r['cpu'][a.other]['mean_s']:.1f} ms, "
                  f"ratio {r['cpu_ratio_mean']:.0f}x")
            return 0
        if argv and argv[0] == "imitate":
            ap = argparse.ArgumentParser(prog=f"{PROG} imitate", description="Class-level imitation of the facility MILP with DAgger (config with [dagger]).")
            ap.add_argument("--config", required=True)
            ap.add_argument("--run-dir", default=None, help="default: runs/train/<config name>")
            ap.add_argument("--export", default=None, help="also export the best round's checkpoint to this path")
            a = ap.parse_args(argv[1:])
            from .config import load_config
            from .imitate import run_dagger

            cfg = load_config(a.config)
            out = run_dagger(cfg, Path(a.run_dir) if a.run_dir else Path("runs") / "train" / cfg.name)
            if a.export:
                from .policy import export_checkpoint

                dst = export_checkpoint(out["best"], a.export)
                print(f"exported {dst} ({dst.stat().st_size / 1024:.0f} KiB)")
            return 0
        if argv and argv[0] == "evaluate":
            args = _eval_parser().parse_args(argv[1:])
            from .evaluate import run_evaluation

            run_evaluation(
                checkpoint=args.checkpoint, scenarios=[s for s in args.scenarios.split(",") if s],
                baselines=[s for s in args.policies.split(",") if s], days=args.days, duration_s=args.duration_s,
                max_pending=args.max_pending, out_md=None if args.baselines_only else args.out, out_json=args.json,
                learned=not args.baselines_only, cache_json=args.cache or None, mode=args.mode,
                skip_days=args.skip_days, trust=args.trust_checkpoint,
            )
            return 0
        args = _train_parser().parse_args(argv)
        from .config import load_config
        from .runner import train

        if args.vec == "ray" or args.ray_address is not None:
            from .ray_vec import import_ray

            try:
                import_ray()
            except RuntimeError as exc:
                print(f"{PROG}: error: {exc}", file=sys.stderr)
                return 2

        over = {"total_timesteps": args.total_timesteps} if args.total_timesteps is not None else None
        cfg = load_config(args.config, over)
        run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / "train" / cfg.name
        summary = train(cfg, run_dir, resume=args.resume, verbose=args.verbose, trust=args.trust_checkpoint,
                        vec_backend=args.vec, ray_address=args.ray_address, update_threads=args.update_threads)
        print(f"final policy: {summary['final']}")
        if summary.get("best"):
            print(f"best p99-passing policy on the held-out episode ([slo_constraint]): {summary['best']}")
        if args.export:
            from .policy import export_checkpoint

            # (the model this run itself just saved, not a file handed over)
            dst = export_checkpoint(summary["final_zip"], args.export, trust=True)
            print(f"exported {dst} ({dst.stat().st_size / 1024:.0f} KiB)")
        ev = summary.get("last_eval") or {}
        if ev:
            print("held-out episode: reduction vs rr {:.1f}%, violation rate {:.4f}".format(
                ev.get("eval/reduction_vs_rr_pct", float("nan")), ev.get("slo/violation_rate", float("nan"))))
        return 0
    except CarbonGymError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
