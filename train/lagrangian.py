"""A p99-aware SLO constraint for PPO from reward: Lagrangian relaxation with dual ascent.

MLPerf's criterion is on percentiles: p99 TTFT <= T_ttft and p99 TPOT <= T_tpot over the
completed requests. Each holds exactly when at most 1% of the completions are over that target,
so the constraint PPO is held to is, for k in (TTFT, TPOT)::

    rate_k = (completions with k over its target) / completions <= budget   (default 0.005)

(half of MLPerf's 1%: a rollout's rate is noisier than a long run's). A request the episode
leaves unfinished counts as over both targets, charged at the episode's last step
(:func:`unfinished_at_end`): counted at completion only, a violation is never charged for a request
that never completes, and a run without this charge learned exactly that (it powered
servers off until queues grew without bound: its held-out p99 TTFT reached 397 s while the
rollouts' rates stayed finite; train/RESULTS_TRAIN.md). A per-request penalty
with a fixed weight (the env's ``env.slo_weight``) prices every late request alike however many
there are; this constraint instead costs nothing while the rate is within the budget and grows
its price until it is.

**The reward PPO sees** (:class:`VecSloLagrangian`, a wrapper of the vector env, in the learner's
process, so every vector-env backend works) is, per env and step::

    r = r_env - sum_k lambda_k x (v_k - budget x n) / (budget x n_ref)

with ``v_k`` the step's completions over target k (``info["ttft_violations"]``,
``info["tpot_violations"]``; at an episode's last step plus its unfinished requests), ``n`` its
completions (plus the same unfinished requests) and ``n_ref`` the mean completions per
step of the previous rollout (fixed within a rollout): at twice the budget a step costs
``lambda_k`` reward units, within it the term is a bonus. Set ``env.slo_weight = 0`` in the
overrides so that the constraint is the only SLO term.

**Dual ascent** (:meth:`VecSloLagrangian.update`, once per rollout, by
:class:`LagrangianCallback`)::

    lambda_k <- clip(lambda_k + lr x (rate_k / budget - 1), 0, max_lambda)

with ``rate_k`` over all the rollout's steps and envs. The callback logs ``slo/lambda_ttft``,
``slo/lambda_tpot``, ``rollout/ttft_violation_rate``, ``rollout/tpot_violation_rate`` and
``rollout/slo_penalty`` (mean per step) to TensorBoard; the multipliers are saved in every
checkpoint's ``state.json`` (``slo_lagrangian``) and restored on resume.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnvWrapper

from carbon_gym.episode import unfinished_requests

from .config import SloConstraintConfig

__all__ = ["VecSloLagrangian", "LagrangianCallback", "find_lagrangian", "unfinished_at_end"]

_KINDS = ("ttft", "tpot")


class VecSloLagrangian(VecEnvWrapper):
    """Subtract the Lagrangian SLO penalty (module docstring) from every env's reward.

    Args:
        venv: the vector env (its infos must carry ``completed``, ``ttft_violations`` and
            ``tpot_violations``: :class:`carbon_gym.env.GeoServeEnv`'s do).
        cfg: budget, dual step and multiplier bounds.
        state: ``state_dict()`` of an earlier run to resume from (multipliers and ``n_ref``).
    """

    def __init__(self, venv: Any, cfg: SloConstraintConfig, state: dict[str, Any] | None = None) -> None:
        super().__init__(venv)
        self.cfg = cfg
        self.lambdas = np.full(len(_KINDS), float(cfg.init_lambda))
        self.n_ref: float | None = None
        if state:
            self.lambdas = np.asarray(state["lambdas"], dtype=np.float64).reshape(len(_KINDS))
            self.n_ref = None if state.get("n_ref") is None else float(state["n_ref"])
        self._reset_acc()

    def _reset_acc(self) -> None:
        self._viol = np.zeros(len(_KINDS))
        self._done = 0.0
        self._steps = 0
        self._penalty = 0.0

    def reset(self) -> Any:
        return self.venv.reset()

    def step_wait(self) -> Any:
        obs, rewards, dones, infos = self.venv.step_wait()
        try:
            v = np.array([[info["ttft_violations"], info["tpot_violations"]] for info in infos], dtype=np.float64)
            n = np.array([info["completed"] for info in infos], dtype=np.float64)
        except KeyError as e:
            raise KeyError(f"VecSloLagrangian needs info[{e.args[0]!r}] from every env step (carbon_gym's GeoServeEnv "
                           "gives completed, ttft_violations and tpot_violations)") from None
        for i, done in enumerate(dones):
            if done:  # the episode's unfinished work: late requests that never completed
                u = unfinished_at_end(infos[i])
                v[i] += u
                n[i] += u
                infos[i]["slo_unfinished"] = u
        if self.n_ref is None:
            self.n_ref = max(1.0, float(n.mean()))
        b = self.cfg.budget
        penalty = ((v - b * n[:, None]) / (b * self.n_ref)) @ self.lambdas
        self._viol += v.sum(axis=0)
        self._done += float(n.sum())
        self._steps += len(infos)
        self._penalty += float(penalty.sum())
        for info, p in zip(infos, penalty):
            info["slo_penalty"] = float(p)
        return obs, (np.asarray(rewards, dtype=np.float64) - penalty).astype(np.asarray(rewards).dtype), dones, infos

    def update(self) -> dict[str, float]:
        """One dual step from the steps since the last update; returns what was measured and the
        new multipliers (empty when no step was taken since)."""
        if self._steps == 0:
            return {}
        out: dict[str, float] = {"steps": float(self._steps), "completed": self._done,
                                 "slo_penalty": self._penalty / self._steps}
        if self._done > 0:
            rates = self._viol / self._done
            step = self.cfg.lr * (rates / self.cfg.budget - 1.0)
            self.lambdas = np.clip(self.lambdas + step, 0.0, self.cfg.max_lambda)
            for kind, rate in zip(_KINDS, rates):
                out[f"{kind}_violation_rate"] = float(rate)
            self.n_ref = max(1.0, self._done / self._steps)
        for kind, lam in zip(_KINDS, self.lambdas):
            out[f"lambda_{kind}"] = float(lam)
        self._reset_acc()
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready multipliers and ``n_ref`` (for ``state.json``)."""
        return {"lambdas": [float(x) for x in self.lambdas], "n_ref": self.n_ref}


def unfinished_at_end(info: dict[str, Any]) -> int:
    """Requests an episode leaves unfinished, from its last step's ``episode_metrics``
    (:func:`carbon_gym.episode.unfinished_requests`: with a measurement window the backlog's
    growth over it, ~0 for a policy that keeps up); 0 when the info has no episode metrics."""
    m = info.get("episode_metrics")
    return unfinished_requests(m) if isinstance(m, dict) else 0


def find_lagrangian(venv: Any) -> VecSloLagrangian | None:
    """The :class:`VecSloLagrangian` in a stack of vector-env wrappers, or None."""
    while venv is not None:
        if isinstance(venv, VecSloLagrangian):
            return venv
        venv = getattr(venv, "venv", None)
    return None


class LagrangianCallback(BaseCallback):
    """Take the dual step at the end of every rollout (before the PPO update that uses it: SB3
    computes advantages from the rewards already collected, so the new multipliers price the next
    rollout) and log the constraint's scalars (module docstring)."""

    def __init__(self, lagrangian: VecSloLagrangian) -> None:
        super().__init__()
        self.lagrangian = lagrangian
        self.history: list[dict[str, float]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        row = self.lagrangian.update()
        if not row:
            return
        for key in ("lambda_ttft", "lambda_tpot"):
            self.logger.record(f"slo/{key}", row[key])
        for key in ("ttft_violation_rate", "tpot_violation_rate", "slo_penalty"):
            if key in row:
                self.logger.record(f"rollout/{key}", row[key])
        self.history.append({"timesteps": float(self.num_timesteps), **row})
