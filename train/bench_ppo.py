"""Benchmark: MaskablePPO training throughput with the set policy, split into env and learner time.

Builds the env and the model of a training config exactly as ``carbon-gym train`` does
(:func:`train.envs.make_vec_env`, :func:`train.runner.build_model`, reward ``VecNormalize`` when
the config asks for it) but without the warm start, the evaluation episodes and the checkpoints,
then runs ``model.learn`` for ``--timesteps`` timesteps and times, in the main process,

* **env**: waiting on the vector env (``step``, ``reset``, the ``action_masks`` calls),
* **rollout policy**: the rest of ``collect_rollouts`` (the policy's forward passes on every
  step, sampling, the rollout buffer),
* **update**: ``train()``, the PPO update (``evaluate_actions``: forward and backward over the
  minibatches, ``n_epochs`` passes; the "learner" proper).

Per repeat it prints timesteps/s of the wall time, the three shares and the main process's CPU
seconds (``resource.getrusage``; the subprocess envs' CPU is not in it: run the script under
``/usr/bin/time -v`` for the total). ``--set-policy-from`` takes the ``[set_policy]`` table of
another config (e.g. the shipped class agent's ``llama8b_dagger``) and ``--per-slot`` forces the
per-slot network evaluation (``SetNetwork.per_slot``, the reference the class path replaces).

Usage::

    python -m train.bench_ppo --config llama8b --set-policy-from llama8b_dagger --timesteps 512 --repeats 3
    python -m train.bench_ppo --config llama8b --set-policy-from llama8b_dagger --timesteps 512 --n-envs 2 --vec ray

``--n-envs`` replaces the config's env count, ``--vec {dummy,subproc,ray}`` / ``--ray-address``
choose the vector env (:func:`train.envs.make_vec_env`; Ray: :class:`train.ray_vec.RayVecEnv`,
``--ray-address local`` by default). With ``--vec ray`` the "env" share includes the Ray round
trips (and the envs' CPU time is in the actors, not in the main-process CPU figure).

The last line is ``ppo_timesteps_per_s=<median over repeats>``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
import warnings
from typing import Any, Callable

__all__ = ["bench", "main"]


def _timed(fn: Callable[..., Any], acc: dict[str, float], key: str) -> Callable[..., Any]:
    """``fn`` adding its wall seconds to ``acc[key]`` and its main-process CPU seconds to
    ``acc[key + "_cpu"]``."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
            acc[key + "_cpu"] = acc.get(key + "_cpu", 0.0) + time.process_time() - c0
    return wrapper


def bench(config: str, timesteps: int, *, set_policy_from: str | None = None, per_slot: bool = False,
          seed: int | None = None, n_envs: int | None = None, vec: str | None = None,
          ray_address: str | None = None, update_threads: int | None = None) -> dict[str, Any]:
    """One timed ``model.learn(timesteps)`` of ``config`` (a name in ``train/configs`` or a path).

    ``n_envs`` replaces the config's ``n_envs``; ``vec`` (``"dummy"``, ``"subproc"``, ``"ray"``)
    and ``ray_address`` choose the vector env as :func:`train.envs.make_vec_env` does (default:
    the training run's choice, ``SubprocVecEnv`` for more than one env). ``update_threads``: torch
    threads of the update, the rollouts keeping the config's ``torch_threads``
    (:class:`train.callbacks.UpdateThreadsCallback`; None: the config's for both).

    Returns wall seconds (``wall_s``; model and env construction excluded), ``timesteps``,
    ``timesteps_per_s``, ``env_s``, ``rollout_policy_s``, ``update_s``, ``updates`` and
    ``cpu_s`` (main process, user + system, during ``learn``), the main process's CPU
    seconds of the update and of the rollout policy (``update_cpu_s``, ``rollout_policy_cpu_s``),
    and the vector env used: ``backend`` (``"dummy"``, ``"subproc"``, ``"ray"``) and ``n_envs``.
    """
    import torch as th
    from stable_baselines3.common.vec_env import VecNormalize

    from .config import load_config
    from .callbacks import UpdateThreadsCallback
    from .envs import make_vec_env, vec_backend
    from .runner import _gamma, build_model

    over: dict[str, Any] = {"total_timesteps": int(timesteps)}
    if set_policy_from is not None:
        over["set_policy"] = dict(load_config(set_policy_from).set_policy)
    if seed is not None:
        over["seed"] = int(seed)
    if n_envs is not None:
        over["n_envs"] = int(n_envs)
    cfg = load_config(config, over)
    if cfg.algorithm != "maskable_ppo":
        raise SystemExit(f"{config}: algorithm {cfg.algorithm!r}; this benchmark runs maskable_ppo configs")
    th.set_num_threads(cfg.torch_threads)
    backend = vec_backend(cfg.n_envs, backend=vec, ray_address=ray_address)
    venv = make_vec_env(cfg.scenarios, cfg.overrides, n_envs=cfg.n_envs, seed=cfg.seed, routing=False,
                        heldout_every_days=cfg.heldout_every_days, backend=backend, ray_address=ray_address)
    if cfg.vec_normalize.get("reward", False):
        venv = VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=_gamma(cfg),
                            clip_reward=float(cfg.vec_normalize.get("clip_reward", 10.0)))
    model = build_model(cfg, venv)
    if per_slot:
        model.policy.net.per_slot = True
    acc: dict[str, float] = {}
    n_updates = [0]
    env = model.env
    for name in ("step", "reset", "env_method"):
        setattr(env, name, _timed(getattr(env, name), acc, "env"))
    model.collect_rollouts = _timed(model.collect_rollouts, acc, "rollout")
    train_fn = model.train

    def counted_train() -> None:
        n_updates[0] += 1
        train_fn()
    model.train = _timed(counted_train, acc, "update")
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    cb = [UpdateThreadsCallback(int(update_threads))] if update_threads is not None else []
    model.learn(total_timesteps=int(timesteps), progress_bar=False, callback=cb)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    venv.close()
    env_s = acc.get("env", 0.0)
    return {"wall_s": wall, "timesteps": float(model.num_timesteps), "timesteps_per_s": model.num_timesteps / wall,
            "env_s": env_s, "rollout_policy_s": acc.get("rollout", 0.0) - env_s, "update_s": acc.get("update", 0.0),
            "update_cpu_s": acc.get("update_cpu", 0.0),
            "rollout_policy_cpu_s": acc.get("rollout_cpu", 0.0) - acc.get("env_cpu", 0.0),
            "updates": float(n_updates[0]),
            "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
            "backend": backend, "n_envs": cfg.n_envs, "update_threads": update_threads}


def main(argv: list[str] | None = None) -> None:
    """Run ``--repeats`` timed trainings and print their figures (last line: the median rate)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="llama8b", help="training config (name in train/configs or path)")
    ap.add_argument("--set-policy-from", default=None, help="take [set_policy] from this config (e.g. llama8b_dagger)")
    ap.add_argument("--timesteps", type=int, default=512, help="timesteps per repeat (a multiple of n_steps x n_envs)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--per-slot", action="store_true", help="evaluate the network per slot (the reference path)")
    ap.add_argument("--n-envs", type=int, default=None, help="number of envs (default: the config's n_envs)")
    ap.add_argument("--vec", default=None, choices=["dummy", "subproc", "ray"],
                    help="vector env (default: subproc for more than one env, else dummy; ray with --ray-address)")
    ap.add_argument("--ray-address", default=None,
                    help="run the envs as Ray actors: 'local' starts a local instance, or a cluster address ('auto', "
                         "'ray://head:10001')")
    ap.add_argument("--update-threads", type=int, default=None,
                    help="torch threads of the PPO update (the rollouts keep the config's torch_threads; default: the same)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", UserWarning)
    rates = []
    for i in range(int(args.repeats)):
        r = bench(args.config, args.timesteps, set_policy_from=args.set_policy_from, per_slot=args.per_slot,
                  n_envs=args.n_envs, vec=args.vec, ray_address=args.ray_address, update_threads=args.update_threads)
        rates.append(r["timesteps_per_s"])
        w = r["wall_s"]
        thr = f", update on {r['update_threads']} threads" if r["update_threads"] is not None else ""
        print(f"repeat {i} ({r['backend']}, {r['n_envs']} envs{thr}): {r['timesteps']:.0f} timesteps in {w:.1f} s -> {r['timesteps_per_s']:.1f} timesteps/s; "
              f"env {r['env_s']:.1f} s ({r['env_s'] / w:.0%}), rollout policy {r['rollout_policy_s']:.1f} s "
              f"({r['rollout_policy_s'] / w:.0%}), update {r['update_s']:.1f} s ({r['update_s'] / w:.0%}, "
              f"{r['updates']:.0f} updates, {r['timesteps'] / max(r['update_s'], 1e-9):.1f} timesteps/s of update time); "
              f"main-process CPU {r['cpu_s']:.1f} s (update {r['update_cpu_s']:.1f} s, "
              f"rollout policy {r['rollout_policy_cpu_s']:.1f} s)", flush=True)
    print(f"ppo_timesteps_per_s={statistics.median(rates):.1f}")


if __name__ == "__main__":
    main()
