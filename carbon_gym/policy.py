"""The policy interface every scheduler implements, the one rollout loop, and round-robin.

Every scheduler in this project — baselines, per-request ILPs, the facility MILP and learned
agents — is a :class:`Policy`: it maps the observation (and the ``info`` dict) that
:class:`carbon_gym.env.GeoServeEnv` returns to an action for ``env.step``. That is the only way
a scheduler touches the simulation, so all of them are compared on equal terms.

``info["action_mask"]`` (shape ``(K, D + 1)``, bool) says which choices are allowed for each
pending-request slot; :func:`carbon_gym.env.decode_observation` turns the observation back into
physical units. :func:`run_episode` is the one rollout loop of the project (:func:`rollout`, the
evaluation harness and training evaluation all run it); :class:`RoundRobinPolicy` is the
reference scheduler, registered as ``rr`` / ``round-robin`` in :mod:`carbon_gym.registry`.

Example::

    import gymnasium as gym
    import carbon_gym
    from carbon_gym.policy import RoundRobinPolicy, rollout

    env = gym.make("carbon_gym/GeoServe-dev-v0")
    metrics = rollout(env, RoundRobinPolicy(), seed=0)
    print(metrics["carbon_g"], metrics["violation_rate"])
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["Policy", "RoundRobinPolicy", "EpisodeObserver", "Episode", "run_episode", "rollout"]


@runtime_checkable
class Policy(Protocol):
    """A scheduler: observation + info -> action.

    ``act`` receives exactly what ``env.reset`` / ``env.step`` returned and must return an
    action valid for the env's ``action_space`` (for :class:`~carbon_gym.env.GeoServeEnv`, an
    integer array of length K: a datacenter index per slot, or D to defer). An optional
    ``reset(env)`` method, called by :func:`rollout` after ``env.reset``, lets a policy read
    static facts (``env.unwrapped.scenario``) and clear its per-episode state.
    """

    def act(self, observation: Any, info: dict[str, Any]) -> Any:
        """Return the action for this step."""
        ...


class RoundRobinPolicy:
    """Reference scheduler (``rr``): cycles over the datacenters, one request at a time.

    Slots are taken in order (oldest request first). Request ``i`` goes to the first datacenter
    at or after the cursor that its row of ``info["action_mask"]`` allows; the cursor then moves
    one past it. A slot with no allowed datacenter is deferred (it stays pending). The cursor
    persists across steps and is cleared by :meth:`reset`. Padded slots get the defer value.
    """

    def __init__(self) -> None:
        self._cursor = 0
        self._shape: tuple[int, int] = (0, 0)
        self._defer = np.empty(0, dtype=np.int64)  # template action: every slot deferred
        self._arange = np.empty(0, dtype=np.int64)

    def reset(self, env: Any = None) -> None:
        """Restart the cycle at datacenter 0."""
        self._cursor = 0

    def act(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        """Return the MultiDiscrete action (length K, value D = defer)."""
        mask = info["action_mask"]
        if type(mask) is not np.ndarray or mask.dtype != np.bool_:
            mask = np.asarray(mask, dtype=bool)
        if mask.shape != self._shape:  # templates for this (K, D + 1)
            k, choices = mask.shape
            self._shape = mask.shape
            self._defer = np.full(k, choices - 1, dtype=np.int64)
            self._arange = np.arange(k, dtype=np.int64)
        k, choices = self._shape
        d = choices - 1
        action = self._defer.copy()
        if d == 0:
            return action
        allowed = mask[:, :d]
        # (ufunc reductions called directly: ndarray.any adds a Python-level wrapper; this runs
        # once per env step)
        rows = np.logical_or.reduce(allowed, axis=1).nonzero()[0]
        n = rows.size
        if n == 0:
            return action
        if np.count_nonzero(allowed) == n * d:
            # Fastest path: every datacenter allowed for every pending request
            picks = (self._arange[:n] + self._cursor) % d
            action[rows] = picks
            self._cursor = (self._cursor + n) % d
            return action
        sub = allowed[rows]
        if (sub == sub[0]).all():
            # Fast path: the same datacenters allowed for every pending request (all up, or
            # some down): cycle over the allowed ones starting at the first >= cursor.
            allowed_dcs = np.flatnonzero(sub[0])
            start = int(np.searchsorted(allowed_dcs, self._cursor) % allowed_dcs.size)
            picks = allowed_dcs[(start + np.arange(n)) % allowed_dcs.size]
            action[rows] = picks
            self._cursor = int((picks[-1] + 1) % d)
            return action
        cursor = self._cursor
        order = np.arange(d)
        for i, r in enumerate(rows):
            row = sub[i]
            cand = (cursor + order) % d
            pick = int(cand[np.argmax(row[cand])])
            action[r] = pick
            cursor = (pick + 1) % d
        self._cursor = cursor
        return action


class EpisodeObserver:
    """Hooks into :func:`run_episode` (subclass and override what you need; all are no-ops).

    Observers only read: they must not step the env or change the policy, so an episode run
    with observers is the same episode as one without.
    """

    def on_reset(self, env: Any, observation: Any, info: dict[str, Any]) -> None:
        """After ``env.reset`` and the policy's ``reset(env)``."""

    def before_step(self, env: Any, step: int) -> None:
        """Before the policy decides step ``step`` (0-based); the env is at the step's start."""

    def after_step(self, env: Any, step: int, action: Any, reward: float, terminated: bool, truncated: bool,
                   info: dict[str, Any], decision_s: float) -> None:
        """After ``env.step(action)``; ``decision_s`` is the wall time of ``policy.act`` (s)."""


@dataclass
class Episode:
    """What :func:`run_episode` returns.

    Attributes:
        steps: env steps taken.
        ended: whether the episode terminated or was truncated (False: stopped by ``max_steps``).
        total_reward: sum of the step rewards.
        decision_s: wall-clock seconds of each ``policy.act`` call (measured outside the env).
        info: the ``info`` dict of the last step (of the reset when no step was taken).
    """

    steps: int
    ended: bool
    total_reward: float
    decision_s: np.ndarray
    info: dict[str, Any]


def run_episode(
    env: Any,
    policy: Policy,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    max_steps: int | None = None,
    observers: Sequence[EpisodeObserver] = (),
    progress: bool = False,
) -> Episode:
    """The one rollout loop: ``env.reset``, the policy's ``reset(env)`` (if it has one), then
    ``policy.act`` / ``env.step`` until the episode ends or ``max_steps`` steps were taken.

    ``policy.act`` is timed here, outside the env (wall-clock values never enter the env's
    ``info``). ``observers`` (:class:`EpisodeObserver`) see the reset and every step, e.g. the
    evaluation harness's per-step and per-request recording. ``progress`` shows a tqdm bar.
    """
    obs, info = env.reset(seed=seed, options=options)
    reset_fn = getattr(policy, "reset", None)
    if callable(reset_fn):
        reset_fn(env)
    for o in observers:
        o.on_reset(env, obs, info)
    before = [o.before_step for o in observers if type(o).before_step is not EpisodeObserver.before_step]
    after = [o.after_step for o in observers]
    bar = None
    if progress:
        from tqdm import tqdm

        total_steps = getattr(env.unwrapped, "max_episode_steps", None)
        if max_steps is not None:
            total_steps = max_steps if total_steps is None else min(total_steps, max_steps)
        bar = tqdm(total=total_steps, unit="step")
    act = policy.act
    decision_s: list[float] = []
    total_reward = 0.0
    steps = 0
    ended = False
    try:
        while max_steps is None or steps < max_steps:
            for hook in before:
                hook(env, steps)
            t0 = time.perf_counter()
            action = act(obs, info)
            dt = time.perf_counter() - t0
            decision_s.append(dt)
            obs, reward, terminated, truncated, info = env.step(action)
            total_reward += float(reward)
            for after_hook in after:
                after_hook(env, steps, action, float(reward), terminated, truncated, info, dt)
            steps += 1
            if bar is not None:
                bar.update(1)
            if terminated or truncated:
                ended = True
                break
    finally:
        if bar is not None:
            bar.close()
    return Episode(steps=steps, ended=ended, total_reward=total_reward,
                   decision_s=np.asarray(decision_s, dtype=np.float64), info=info)


def rollout(
    env: Any,
    policy: Policy,
    seed: int | None = None,
    max_steps: int | None = None,
    progress: bool = False,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one episode of ``policy`` on ``env`` (:func:`run_episode`) and return the episode metrics.

    Args:
        env: a :class:`~carbon_gym.env.GeoServeEnv`, possibly wrapped (e.g. by ``gymnasium.make``).
        policy: any object with ``act(observation, info)``; its ``reset(env)`` is called if present.
        seed: passed to ``env.reset(seed=...)``.
        max_steps: stop after this many steps even if the episode has not ended (the metrics are
            then those of the partial episode, without the end-of-episode drain).
        progress: show a tqdm progress bar.
        options: passed to ``env.reset``.

    Returns:
        ``info["episode_metrics"]`` of the final step (see :class:`~carbon_gym.env.GeoServeEnv`),
        plus ``return`` (sum of rewards), ``steps``, ``truncated`` (whether the episode ended), and
        the policy's wall-clock decision time per step measured here, outside the env:
        ``decision_s`` (array, seconds), ``decision_s_mean``, ``decision_s_p95``,
        ``decision_s_max``. Wall-clock values never enter the env's ``info``.
    """
    ep = run_episode(env, policy, seed=seed, options=options, max_steps=max_steps, progress=progress)
    if ep.ended and "episode_metrics" in ep.info:
        metrics = dict(ep.info["episode_metrics"])
    else:
        metrics = dict(env.unwrapped.episode_metrics())
    dec = ep.decision_s
    metrics.update(
        {
            "return": ep.total_reward,
            "steps": ep.steps,
            "truncated": ep.ended,
            "decision_s": dec,
            "decision_s_mean": float(dec.mean()) if dec.size else 0.0,
            "decision_s_p95": float(np.percentile(dec, 95)) if dec.size else 0.0,
            "decision_s_max": float(dec.max()) if dec.size else 0.0,
        }
    )
    return metrics
