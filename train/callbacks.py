"""SB3 callbacks: domain scalars in TensorBoard and periodic, resumable checkpoints."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from .tags import TAGS

__all__ = ["DomainMetricsCallback", "CheckpointCallback", "UpdateThreadsCallback", "evaluate_model", "save_checkpoint",
           "latest_checkpoint"]


def evaluate_model(model: Any, make_env: Callable[[], Any], seed: int) -> dict[str, Any]:
    """One episode of the current model (as a :class:`~train.policy.LearnedPolicy`) on a fresh env."""
    from carbon_gym.policy import rollout

    from .policy import LearnedPolicy

    env = make_env()
    try:
        was_training = model.policy.training
        policy = LearnedPolicy(model, seed=seed)
        metrics = rollout(env, policy, seed=seed)
        model.policy.train(was_training)
    finally:
        env.close()
    return metrics


class DomainMetricsCallback(BaseCallback):
    """Record the domain scalars under the evaluation harness's tags (``train.tags.TAGS``).

    Every rollout: means over the rollout's env steps of ``carbon/step_g``, ``energy/step_j``,
    ``slo/violations``. Every ``eval_every`` timesteps (and at the end if ``final``): one
    held-out evaluation episode of the current policy and (once, cached) of round-robin on the
    same scenario, start and seed, giving ``carbon/cumulative_g`` (the episode's total),
    ``slo/violation_rate``, ``latency/ttft_p50_s`` ... ``tpot_p99_s``, ``decision/time_s``
    (mean per step) and ``eval/reduction_vs_rr_pct``; ``on_eval(metrics, reduction_pct)`` is called
    after each evaluation (the runner keeps the best SLO-passing policy). Values go through ``self.logger.record``,
    so they land in the same TensorBoard run as SB3's losses, at the same timestep axis.
    """

    def __init__(self, make_eval_env: Callable[[], Any] | None, eval_every: int, eval_seed: int = 0, final: bool = True,
                 on_eval: Callable[[dict[str, Any], float], None] | None = None):
        super().__init__()
        self._on_eval = on_eval
        self._make_eval_env = make_eval_env
        self._every = int(eval_every)
        self._seed = int(eval_seed)
        self._final = bool(final)
        self._last_eval = 0
        self._rr: dict[str, Any] | None = None
        self._acc: dict[str, float] = {}
        self._n = 0
        self.history: list[dict[str, Any]] = []

    def _on_training_start(self) -> None:
        self._last_eval = int(self.num_timesteps)

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", []):
            self._n += 1
            for key in ("carbon_g", "energy_j", "violations", "completed"):
                self._acc[key] = self._acc.get(key, 0.0) + float(info.get(key, 0.0))
        return True

    def _on_rollout_end(self) -> None:
        if self._n:
            self.logger.record(TAGS.carbon_step_g, self._acc.get("carbon_g", 0.0) / self._n)
            self.logger.record(TAGS.energy_step_j, self._acc.get("energy_j", 0.0) / self._n)
            self.logger.record(TAGS.slo_violations, self._acc.get("violations", 0.0) / self._n)
            done = self._acc.get("completed", 0.0)
            if done:
                self.logger.record("rollout/violation_rate", self._acc.get("violations", 0.0) / done)
        self._acc, self._n = {}, 0
        if self._make_eval_env is not None and self._every > 0 and self.num_timesteps - self._last_eval >= self._every:
            self.evaluate()

    def _on_training_end(self) -> None:
        if self._make_eval_env is not None and self._final and self._last_eval != self.num_timesteps:
            self.evaluate()
            self.logger.dump(self.num_timesteps)

    def rr_metrics(self) -> dict[str, Any]:
        """Round-robin on the evaluation episode (computed once)."""
        if self._rr is None:
            from carbon_gym.policy import RoundRobinPolicy, rollout

            env = self._make_eval_env()
            try:
                self._rr = rollout(env, RoundRobinPolicy(), seed=self._seed)
            finally:
                env.close()
        return self._rr

    def evaluate(self) -> dict[str, Any]:
        """Run the evaluation episode now and record its scalars."""
        t0 = time.perf_counter()
        m = evaluate_model(self.model, self._make_eval_env, self._seed)
        rr = self.rr_metrics()
        red = 100.0 * (1.0 - m["carbon_g"] / rr["carbon_g"]) if rr["carbon_g"] > 0 else float("nan")
        values = {
            TAGS.carbon_cumulative_g: m["carbon_g"],
            TAGS.slo_violation_rate: m["violation_rate"],
            TAGS.ttft_p50_s: m["ttft_p50_s"],
            TAGS.ttft_p99_s: m["ttft_p99_s"],
            TAGS.tpot_p50_s: m["tpot_p50_s"],
            TAGS.tpot_p99_s: m["tpot_p99_s"],
            TAGS.decision_time_s: m["decision_s_mean"],
            TAGS.reduction_vs_rr_pct: red,
            "eval/rr_violation_rate": rr["violation_rate"],
            "eval/return": m["return"],
        }
        for k, v in values.items():
            if v is not None and np.isfinite(v):
                self.logger.record(k, float(v))
        self._last_eval = int(self.num_timesteps)
        if self._on_eval is not None:
            self._on_eval(m, red)
        row = {"timesteps": int(self.num_timesteps), "wall_s": time.perf_counter() - t0}
        row.update({k: float(v) for k, v in values.items()})
        self.history.append(row)
        return values


# ------------------------------------------------------------------------------ checkpoints
def save_checkpoint(run_dir: Path, model: Any, *, phase: str, keep: int = 2, extra: dict[str, Any] | None = None) -> Path:
    """Write ``checkpoints/step_<t>.zip`` (+ ``.vecnormalize.pkl`` when the env is a VecNormalize)
    and ``state.json`` (atomically, last), then prune to the ``keep`` newest checkpoints."""
    from stable_baselines3.common.vec_env import VecNormalize

    ck = Path(run_dir) / "checkpoints"
    ck.mkdir(parents=True, exist_ok=True)
    t = int(model.num_timesteps)
    path = ck / f"step_{t:09d}.zip"
    model.save(path)
    from .policy import write_checkpoint_env

    write_checkpoint_env(path)
    env = model.get_env()
    vn = None
    if isinstance(env, VecNormalize):
        vn = ck / f"step_{t:09d}.vecnormalize.pkl"
        env.save(str(vn))
    from .resume_state import save_resume_state, state_path_for

    safe = save_resume_state(state_path_for(path), model, env if isinstance(env, VecNormalize) else None)
    state = {
        "num_timesteps": t,
        "phase": phase,
        "checkpoint": path.name,
        "vecnormalize": vn.name if vn else None,
        "resume_state": safe.name,
        "saved_at": time.time(),
    }
    state.update(extra or {})
    tmp = Path(run_dir) / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, Path(run_dir) / "state.json")
    zips = sorted(ck.glob("step_*.zip"))
    for old in zips[: max(0, len(zips) - keep)]:
        old.unlink(missing_ok=True)
        Path(str(old).replace(".zip", ".vecnormalize.pkl")).unlink(missing_ok=True)
        state_path_for(old).unlink(missing_ok=True)
    return path


def latest_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    """``state.json`` of a run directory (with absolute paths), or None when there is none.

    The files it names must be plain names inside ``checkpoints/`` (:class:`ConfigError`, field
    ``state.json``, otherwise); ``resume_state_path`` is the pickle-free resumption state
    (:mod:`train.resume_state`), None in runs written before it existed."""
    from carbon_gym.errors import ConfigError

    p = Path(run_dir) / "state.json"
    if not p.exists():
        return None
    try:
        state = json.loads(p.read_text())
    except (ValueError, OSError) as exc:
        raise ConfigError("state.json", f"{str(p)!r} is not readable JSON: {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get("checkpoint"), str) or not isinstance(state.get("num_timesteps"), int):
        raise ConfigError("state.json", f"{str(p)!r} needs 'checkpoint' (a file name) and 'num_timesteps' (an integer)")
    ck = Path(run_dir) / "checkpoints"
    for key in ("checkpoint", "vecnormalize", "resume_state"):
        name = state.get(key)
        if name is not None and (not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..")):
            raise ConfigError("state.json", f"{str(p)!r}: {key} = {name!r} is not a file name inside {str(ck)!r}")
    state["checkpoint_path"] = str(ck / state["checkpoint"])
    state["vecnormalize_path"] = str(ck / state["vecnormalize"]) if state.get("vecnormalize") else None
    state["resume_state_path"] = str(ck / state["resume_state"]) if state.get("resume_state") else None
    return state


class CheckpointCallback(BaseCallback):
    """Save a resumable checkpoint every ``every`` timesteps.

    Checked when a rollout starts, i.e. right after a policy update: the saved parameters are
    those trained on every timestep counted in ``num_timesteps`` (nothing collected-but-unused
    is lost on resume). Scalars reach TensorBoard at SB3's dumps (after every rollout); only the
    losses of the update just before an interruption are not written.
    """

    def __init__(self, run_dir: Path, every: int, keep: int = 2, extra: Callable[[], dict[str, Any]] | None = None):
        super().__init__()
        self._dir = Path(run_dir)
        self._every = int(every)
        self._keep = int(keep)
        self._extra = extra
        self._last = 0

    def _on_training_start(self) -> None:
        self._last = int(self.num_timesteps)

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        if self._every > 0 and self.num_timesteps - self._last >= self._every:
            save_checkpoint(self._dir, self.model, phase="ppo", keep=self._keep, extra=self._extra() if self._extra else None)
            self._last = int(self.num_timesteps)


class UpdateThreadsCallback(BaseCallback):
    """Run the policy update on ``update_threads`` torch threads and the rollouts on the threads
    set when training starts (the config's ``torch_threads``): while the learner updates, the
    envs wait, so their cores are free; while they step, the learner's threads would compete
    with them. Only the thread count changes, not what is computed (a different count may change
    the floating-point order of reductions, so a run is reproducible at a given setting).

    Args:
        update_threads: torch threads of the update (>= 1).
    """

    def __init__(self, update_threads: int) -> None:
        super().__init__(verbose=0)
        if isinstance(update_threads, bool) or not isinstance(update_threads, int) or update_threads < 1:
            from carbon_gym.errors import ConfigError

            raise ConfigError("update_threads", f"must be an integer >= 1 (torch threads of the PPO update), got {update_threads!r}")
        self.update_threads = int(update_threads)
        self.rollout_threads = 1

    def _on_training_start(self) -> None:
        import torch as th

        self.rollout_threads = th.get_num_threads()

    def _on_rollout_start(self) -> None:
        import torch as th

        th.set_num_threads(self.rollout_threads)

    def _on_rollout_end(self) -> None:  # (the update follows)
        import torch as th

        th.set_num_threads(self.update_threads)

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        import torch as th

        th.set_num_threads(self.rollout_threads)
