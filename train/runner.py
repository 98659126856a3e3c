"""One training run from a :class:`~train.config.TrainConfig`: build, warm-start, learn, checkpoint, resume.

Run directory layout (``runs/train/<name>`` by default)::

    config.json            the validated config (a resumed run must match it)
    state.json             latest checkpoint: timesteps, phase, file names
    checkpoints/           step_<t>.zip (+ step_<t>.vecnormalize.pkl)
    tb/                    the TensorBoard run (SB3 losses, domain scalars, bc/*); a resumed run
                           appends to it, continuing the timestep axis
    tb/progress.csv        the same scalars as CSV (rows from before a resume: progress.before_<t>_<k>.csv)
    checkpoints/           step_<t>.state.npz: the pickle-free resumption state --resume reads
    final.npz              the final set policy, pickle-free (learned:<run>/final.npz loads it
                           without --trust-checkpoint); none for a routing-weights PPO
    final.zip              the final SB3 model (pickled: loading it needs --trust-checkpoint)
    eval_history.json      the held-out evaluation episodes (timesteps, reduction vs rr, ...)
    bc.json                behaviour-cloning statistics (when a warm start ran)
    curves.png             learning curves (train.curves.plot_run)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from carbon_gym.errors import ConfigError

from .config import TrainConfig
from .checkpoint import write_checkpoint_env

__all__ = ["train", "build_model", "init_from_checkpoint", "DEFAULT_PPO", "DEFAULT_MASKABLE_PPO"]

#: Defaults for the routing-weights PPO (overridden by ``[ppo]``).
DEFAULT_PPO: dict[str, Any] = {"n_steps": 128, "batch_size": 64, "n_epochs": 4, "learning_rate": 3e-4, "gamma": 0.95}
#: Defaults for MaskablePPO with the set policy (overridden by ``[ppo]``).
DEFAULT_MASKABLE_PPO: dict[str, Any] = {
    "n_steps": 64, "batch_size": 32, "n_epochs": 4, "learning_rate": 1e-4, "gamma": 0.95,
    "clip_range": 0.1, "ent_coef": 0.0, "target_kl": 0.05,
}


def _vec_env_layout(venv: Any) -> Any:
    return venv.get_attr("layout")[0]


def build_model(cfg: TrainConfig, venv: Any, *, verbose: int = 0) -> Any:
    """A fresh SB3 model for ``cfg`` on ``venv`` (seeded with ``cfg.seed``)."""
    if cfg.algorithm == "ppo":
        from stable_baselines3 import PPO

        kw = {**DEFAULT_PPO, **cfg.ppo}
        return PPO("MultiInputPolicy", venv, seed=cfg.seed, device="cpu", verbose=verbose, **kw)
    from sb3_contrib import MaskablePPO

    from .set_policy import SetActorCriticPolicy, layout_spec

    kw = {**DEFAULT_MASKABLE_PPO, **cfg.ppo}
    pk = dict(kw.pop("policy_kwargs", {}) or {})
    pk.update(layout=layout_spec(_vec_env_layout(venv)), **cfg.set_policy)
    return MaskablePPO(SetActorCriticPolicy, venv, seed=cfg.seed, device="cpu", verbose=verbose, policy_kwargs=pk, **kw)


def _algo_class(cfg: TrainConfig) -> Any:
    if cfg.algorithm == "ppo":
        from stable_baselines3 import PPO

        return PPO
    from sb3_contrib import MaskablePPO

    return MaskablePPO


def _gamma(cfg: TrainConfig) -> float:
    base = DEFAULT_PPO if cfg.algorithm == "ppo" else DEFAULT_MASKABLE_PPO
    return float(cfg.ppo.get("gamma", base["gamma"]))


def _eval_env_factory(cfg: TrainConfig) -> Callable[[], Any]:
    from .envs import heldout_starts, make_episode_env

    scenario = cfg.eval.scenario or cfg.scenarios[0]
    # A held-out start outside the first ones that `carbon-gym train evaluate` uses for its table
    # (heldout_starts(n) from index 0), so the training-time curve does not peek at the test days.
    start = cfg.eval.start_utc or heldout_starts(1, cfg.heldout_every_days, seed=cfg.seed + 97)[0]
    overrides = dict(cfg.overrides)
    return lambda: make_episode_env(scenario, overrides, start)


def train(  # noqa: C901
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    verbose: bool = False,
    log: Callable[[str], None] = print,
    stop_after_timesteps: int | None = None,
    trust: bool = False,
    vec_backend: str | None = None,
    ray_address: str | None = None,
    update_threads: int | None = None,
) -> dict[str, Any]:
    """Run (or resume) training. Returns a summary dict (timesteps, wall time, paths, last evaluation).

    A resume reads the run's pickle-free state (``checkpoints/step_<t>.state.npz``,
    :mod:`train.resume_state`); a run folder with only pickled SB3 / VecNormalize files resumes
    only with ``trust`` (``--trust-checkpoint``), :class:`ConfigError` otherwise.
    ``stop_after_timesteps`` ends this invocation early (as an interruption would) after the
    given number of timesteps, leaving a checkpoint to resume from (used by tests).

    ``vec_backend`` (``"dummy"``, ``"subproc"``, ``"ray"``) and ``ray_address`` (``"local"``, or
    a cluster address: the envs run as Ray actors, :class:`train.ray_vec.RayVecEnv`) choose where
    the ``cfg.n_envs`` training envs run (:func:`train.envs.make_vec_env`; default: subprocesses
    for more than one env). They are not part of the config (nor of its digest): the envs are
    seeded alike on every backend, and a run may resume on another one. ``update_threads``: torch
    threads of the PPO update, the rollouts keeping ``cfg.torch_threads``
    (:class:`train.callbacks.UpdateThreadsCallback`; None: ``cfg.torch_threads`` for both).
    """
    import torch as th
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.vec_env import VecNormalize

    from .callbacks import CheckpointCallback, DomainMetricsCallback, UpdateThreadsCallback, latest_checkpoint, save_checkpoint
    from .envs import make_vec_env
    from .envs import vec_backend as _vec_backend

    backend = _vec_backend(cfg.n_envs, backend=vec_backend, ray_address=ray_address)  # a bad choice fails first
    threads_cb = [UpdateThreadsCallback(update_threads)] if update_threads is not None else []
    t_start = time.perf_counter()
    th.set_num_threads(cfg.torch_threads)
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    cfg_path = run / "config.json"
    state = latest_checkpoint(run) if resume else None
    if resume and cfg_path.exists():
        old = json.loads(cfg_path.read_text())
        if old.get("digest") != cfg.digest():
            raise ConfigError("config", f"--resume: {run} was trained with another config (digest {old.get('digest')} != {cfg.digest()})")
    if state is not None and not state.get("resume_state_path") and not trust:
        # A run folder without a pickle-free state (written before it existed, or by hand): its
        # SB3 .zip and VecNormalize .pkl unpickle objects, which can run their author's code.
        pickled = ", ".join(str(state[k]) for k in ("checkpoint", "vecnormalize") if state.get(k))
        raise ConfigError("--trust-checkpoint", f"--resume: {str(run / 'state.json')!r} names only pickled files "
                          f"({pickled}) and no pickle-free resume_state; loading them can run their author's code: "
                          "refused without trust", allowed=["--trust-checkpoint (only for a run folder you made)"])
    if not resume and (run / "state.json").exists():
        raise ConfigError("run_dir", f"{run} already holds a run: pass --resume to continue it, or another --run-dir")
    if resume and state is None:
        log(f"resume: no checkpoint in {run}; starting a new run")
    cfg_path.write_text(json.dumps({"digest": cfg.digest(), "config": cfg.to_dict()}, indent=2, default=str))

    routing = cfg.algorithm == "ppo"
    venv = make_vec_env(cfg.scenarios, cfg.overrides, n_envs=cfg.n_envs, seed=cfg.seed + (int(state["num_timesteps"]) if state else 0),
                        routing=routing, heldout_every_days=cfg.heldout_every_days, backend=backend, ray_address=ray_address)
    lag = None
    if cfg.slo_constraint is not None:  # under VecNormalize: the penalty is normalised with the carbon term
        from .lagrangian import VecSloLagrangian

        venv = lag = VecSloLagrangian(venv, cfg.slo_constraint, state=(state or {}).get("slo_lagrangian"))

    def lag_extra() -> dict[str, Any]:  # the multipliers, saved with every checkpoint
        return {} if lag is None else {"slo_lagrangian": lag.state_dict()}

    use_vn = bool(cfg.vec_normalize.get("reward", False))
    gamma = _gamma(cfg)
    formats = ["csv", "tensorboard"] + (["stdout"] if verbose else [])
    csv_path = run / "tb" / "progress.csv"
    if state is not None and csv_path.exists():
        # SB3's CSV writer truncates progress.csv; keep the rows written before the interruption.
        k = 0
        while (kept := run / "tb" / f"progress.before_{int(state['num_timesteps']):09d}_{k}.csv").exists():
            k += 1
        csv_path.rename(kept)
    logger = configure(str(run / "tb"), formats)
    # configure() writes progress.csv inside tb/; TensorBoard ignores it.
    algo = _algo_class(cfg)
    bc_stats = None
    if state is not None and state.get("resume_state_path"):
        # The pickle-free state (train.resume_state): the model is built from the config, its
        # tensors and counters copied in; nothing in the run folder is unpickled.
        from .resume_state import load_resume_state

        if use_vn:
            venv = VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=gamma,
                                clip_reward=float(cfg.vec_normalize.get("clip_reward", 10.0)))
        model = build_model(cfg, venv, verbose=0)
        load_resume_state(state["resume_state_path"], model, venv if use_vn else None)
        model.set_logger(logger)
        log(f"resume: {state['resume_state']} at {model.num_timesteps} timesteps (phase {state['phase']})")
    elif state is not None:
        if use_vn:
            if not state.get("vecnormalize_path"):
                raise ConfigError("vec_normalize", "checkpoint has no VecNormalize statistics but the config uses them")
            venv = VecNormalize.load(state["vecnormalize_path"], venv)
            venv.training = True
        model = algo.load(state["checkpoint_path"], env=venv, device="cpu")
        model.set_logger(logger)
        log(f"resume: {state['checkpoint']} at {model.num_timesteps} timesteps (phase {state['phase']})")
    else:
        if use_vn:
            venv = VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=gamma,
                                clip_reward=float(cfg.vec_normalize.get("clip_reward", 10.0)))
        model = build_model(cfg, venv, verbose=0)
        model.set_logger(logger)
        if cfg.init_checkpoint is not None:
            init_from_checkpoint(model, cfg.init_checkpoint, log)
        if cfg.bc is not None:
            bc_stats = _warm_start(cfg, model, venv if use_vn else None, gamma, logger, log)
            (run / "bc.json").write_text(json.dumps(bc_stats, indent=2, default=float))
        save_checkpoint(run, model, phase="bc" if cfg.bc else "init", keep=cfg.keep_checkpoints, extra=lag_extra())

    keeper = _best_keeper(run, log) if cfg.slo_constraint is not None else None
    domain = DomainMetricsCallback(_eval_env_factory(cfg), cfg.eval.every_timesteps, eval_seed=cfg.eval.seed, final=cfg.eval.final,
                                   on_eval=None if keeper is None else (lambda m, red: keeper(model, m, red)))
    hist_path = run / "eval_history.json"
    if hist_path.exists():
        domain.history = json.loads(hist_path.read_text())
    if state is None and cfg.eval.every_timesteps > 0:
        # The starting point (after the warm start, if any) on the held-out episode, at timestep 0.
        domain.init_callback(model)
        domain.evaluate()
        logger.dump(int(model.num_timesteps))
        if cfg.bc is not None:
            model.save(run / "bc.zip")
            write_checkpoint_env(run / "bc.zip")
        hist_path.write_text(json.dumps(domain.history, indent=2))
        log(f"held-out episode at {model.num_timesteps} timesteps: " + _fmt_eval(domain.history[-1]))
    lag_cb: list[Any] = []
    if lag is not None:
        from .lagrangian import LagrangianCallback

        lag_cb = [LagrangianCallback(lag)]
    ckpt = CheckpointCallback(run, cfg.checkpoint_every_timesteps, keep=cfg.keep_checkpoints, extra=lag_extra)
    target = int(cfg.total_timesteps)
    if stop_after_timesteps is not None:
        target = min(target, int(model.num_timesteps) + int(stop_after_timesteps))
    warm = min(int(cfg.critic_warmup_timesteps), target) - int(model.num_timesteps)
    if warm > 0:  # the critic alone (a resumed run finishes what is left of it)
        full = model.policy.optimizer
        model.policy.optimizer = type(full)(model.policy.net.value_head.parameters(), **full.defaults)
        log(f"critic warm-up: {warm} timesteps, the actor frozen")
        model.learn(total_timesteps=warm, callback=[domain, *lag_cb, *threads_cb], reset_num_timesteps=False, progress_bar=False)  # no checkpoint: its optimizer is partial
        model.policy.optimizer = full
    remaining = target - int(model.num_timesteps)
    if remaining > 0:
        model.learn(total_timesteps=remaining, callback=[domain, ckpt, *lag_cb, *threads_cb], reset_num_timesteps=False, progress_bar=False)
    save_checkpoint(run, model, phase="done" if model.num_timesteps >= cfg.total_timesteps else "ppo", keep=cfg.keep_checkpoints,
                    extra=lag_extra())
    if lag_cb:
        lag_path = run / "lagrangian_history.json"
        old_rows = json.loads(lag_path.read_text()) if lag_path.exists() else []
        lag_path.write_text(json.dumps(old_rows + lag_cb[0].history, indent=2))
    model.save(run / "final.zip")
    write_checkpoint_env(run / "final.zip")
    final_npz = _export_final(model, run)
    hist_path.write_text(json.dumps(domain.history, indent=2))
    venv.close()
    last = domain.history[-1] if domain.history else {}
    summary = {
        "num_timesteps": int(model.num_timesteps),
        "wall_s": time.perf_counter() - t_start,
        "run_dir": str(run),
        "final": str(final_npz or run / "final.zip"),
        "final_zip": str(run / "final.zip"),
        "last_eval": last,
        "bc": None if bc_stats is None else {k: v for k, v in bc_stats.items() if k != "history"},
        "best": str(run / "best.npz") if (run / "best.npz").is_file() else None,  # [slo_constraint]: the best p99-passing evaluation
    }
    try:
        from .curves import plot_run

        plot_run(run, run / "curves.png")
    except ImportError:  # matplotlib is in the [eval] extra
        pass
    log(f"trained {summary['num_timesteps']} timesteps in {summary['wall_s']:.0f} s -> {summary['final']}")
    return summary


def _export_final(model: Any, run: Path, name: str = "final") -> Path | None:
    """``run/<name>.npz``: the trained set policy in the pickle-free format (what ``learned:<path>``
    loads without ``--trust-checkpoint``), written from the model in memory; None for a
    routing-weights PPO (no pickle-free format: its ``final.zip`` is the result)."""
    from .checkpoint import save_set_checkpoint
    from .policy import LearnedPolicy, _training_record, run_config_record

    pol = LearnedPolicy(model)
    if pol.kind != "set":
        return None
    # the record of the run: its config.json, read beside final.zip (a best.npz is written before final.zip exists)
    final = run / "final.zip"
    training = _training_record(final) if final.is_file() else run_config_record(run / "config.json", f"{name}.npz (during training)")
    return save_set_checkpoint(run / f"{name}.npz", pol.net, policy={"mode": pol.mode, **pol.safety},
                               training=training, fingerprint=pol.fingerprint)


def _best_keeper(run: Path, log: Callable[[str], None]) -> Callable[[Any, dict[str, Any], float], None]:
    """After each held-out evaluation: when its episode passes MLPerf's p99 criterion (at most 1%
    of the completions over the TTFT target and at most 1% over the TPOT target) with a larger
    reduction vs round-robin than every earlier passing one, export the policy to
    ``run/best.npz`` and record it in ``run/best.json`` (kept across ``--resume``). The
    evaluation episode is a held-out validation day, not a test start."""
    path = run / "best.json"
    best: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def keep(model: Any, m: dict[str, Any], red: float) -> None:
        rates = (float(m.get("ttft_violation_rate", np.nan)), float(m.get("tpot_violation_rate", np.nan)))
        if not all(r <= 0.01 for r in rates) or not np.isfinite(red) or red <= best.get("reduction_vs_rr_pct", -np.inf):
            return
        _export_final(model, run, "best")
        best.update({"timesteps": int(model.num_timesteps), "reduction_vs_rr_pct": float(red),
                     "ttft_violation_rate": rates[0], "tpot_violation_rate": rates[1],
                     "ttft_p99_s": float(m.get("ttft_p99_s", np.nan)), "tpot_p99_s": float(m.get("tpot_p99_s", np.nan))})
        path.write_text(json.dumps(best, indent=2))
        log(f"best SLO-passing policy so far at {best['timesteps']} timesteps: reduction vs rr {red:.1f}% -> {run / 'best.npz'}")

    return keep


def init_from_checkpoint(model: Any, path: str | Path, log: Callable[[str], None] = print) -> None:
    """Load the weights of the set-policy checkpoint ``path`` (pickle-free ``.npz``, e.g. the
    best round of ``carbon-gym train imitate``) into ``model``'s :class:`~train.set_policy.SetNetwork`.
    The checkpoint's network settings (hidden, classes, demand features, load feedback,
    capacity head) must be the model's: :class:`ConfigError` naming the differences otherwise.
    Weights do not depend on the topology, so the checkpoint's training layout may differ."""
    from .checkpoint import checkpoint_format, network_from_checkpoint, read_set_checkpoint

    src = Path(path)
    if not src.exists():
        raise ConfigError("init_checkpoint", f"no such file {str(src)!r}")
    if checkpoint_format(src) != "set":
        raise ConfigError("init_checkpoint", f"{str(src)!r} is not a set-policy checkpoint (.npz of carbon-gym train "
                          "imitate / export); stable-baselines3 .zip runs resume with --resume instead")
    ck = read_set_checkpoint(src)
    net = model.policy.net
    mine = {"hidden": net.hidden, "classes": net.classes, "demand_features": net.demand_features,
            "load_feedback": net.load_feedback, "capacity_head": net.capacity_head}
    theirs = {"hidden": int(ck.network["hidden"]), "classes": ck.network.get("classes"),
              "demand_features": bool(ck.network.get("demand_features", False)),
              "load_feedback": int(ck.network.get("load_feedback", 0)),
              "capacity_head": bool(ck.network.get("capacity_head", False))}
    diff = {k: (theirs[k], mine[k]) for k in mine if theirs[k] != mine[k]}
    if diff:
        raise ConfigError("init_checkpoint", f"{str(src)!r}: network settings differ from [set_policy] "
                          f"(checkpoint, config): {diff}")
    net.load_state_dict(network_from_checkpoint(ck).state_dict())
    log(f"init: weights from {src} ({sum(int(a.size) for a in ck.tensors.values())} parameters)")


def _fmt_eval(row: dict[str, Any]) -> str:
    return "reduction vs rr {:.1f}%, violation rate {:.4f}, decision {:.2f} ms".format(
        row.get("eval/reduction_vs_rr_pct", float("nan")), row.get("slo/violation_rate", float("nan")),
        1e3 * row.get("decision/time_s", float("nan")))


def _warm_start(cfg: TrainConfig, model: Any, vecnorm: Any, gamma: float, logger: Any, log: Callable[[str], None]) -> dict[str, Any]:
    from .bc import behaviour_clone, collect_expert, reward_scale_stats

    bc = cfg.bc
    assert bc is not None
    t0 = time.perf_counter()
    data = collect_expert(bc.expert, cfg.scenarios, cfg.overrides, episodes=bc.episodes, seed=cfg.seed + 7919,
                          heldout_every_days=cfg.heldout_every_days, log=log)
    collect_s = time.perf_counter() - t0
    mean, var, count = reward_scale_stats(data.rewards, data.episode, gamma)
    reward_std = 1.0
    if vecnorm is not None:
        vecnorm.ret_rms.mean = np.float64(mean)
        vecnorm.ret_rms.var = np.float64(var)
        vecnorm.ret_rms.count = float(count)
        reward_std = float(np.sqrt(var + vecnorm.epsilon))
    stats = behaviour_clone(
        model.policy.net, data, epochs=bc.epochs, batch_steps=bc.batch_steps, learning_rate=bc.learning_rate,
        value_weight=bc.value_weight, gamma=gamma, reward_std=reward_std, seed=cfg.seed, logger=logger, log=log,
    )
    stats.update(expert=bc.expert, collect_s=collect_s, episodes=data.meta,
                 expert_decision_s_mean=float(data.decision_s.mean()), reward_std=reward_std)
    return stats
