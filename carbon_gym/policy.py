"""The policy interface every scheduler implements, a rollout helper, and round-robin.

Every scheduler in this project — baselines, per-request ILPs, the facility MILP and learned
agents — is a :class:`Policy`: it maps the observation (and the ``info`` dict) that
:class:`carbon_gym.env.GeoServeEnv` returns to an action for ``env.step``. That is the only way
a scheduler touches the simulation, so all of them are compared on equal terms.

``info["action_mask"]`` (shape ``(K, D + 1)``, bool) says which choices are allowed for each
pending-request slot; :func:`carbon_gym.env.decode_observation` turns the observation back into
physical units.

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
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Policy", "RoundRobinPolicy", "rollout"]


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
    """Reference scheduler: cycles over the datacenters, one request at a time.

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


def rollout(
    env: Any,
    policy: Policy,
    seed: int | None = None,
    max_steps: int | None = None,
    progress: bool = False,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one episode of ``policy`` on ``env`` and return the episode metrics.

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
    obs, info = env.reset(seed=seed, options=options)
    reset_fn = getattr(policy, "reset", None)
    if callable(reset_fn):
        reset_fn(env)
    total_steps = getattr(env.unwrapped, "max_episode_steps", None)
    if max_steps is not None:
        total_steps = max_steps if total_steps is None else min(total_steps, max_steps)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, unit="step")
    decision_s: list[float] = []
    total_reward = 0.0
    steps = 0
    ended = False
    try:
        while max_steps is None or steps < max_steps:
            t0 = time.perf_counter()
            action = policy.act(obs, info)
            decision_s.append(time.perf_counter() - t0)
            obs, reward, terminated, truncated, info = env.step(action)
            total_reward += float(reward)
            steps += 1
            if bar is not None:
                bar.update(1)
            if terminated or truncated:
                ended = True
                break
    finally:
        if bar is not None:
            bar.close()
    if ended and "episode_metrics" in info:
        metrics = dict(info["episode_metrics"])
    else:
        metrics = dict(env.unwrapped.episode_metrics())
    dec = np.asarray(decision_s, dtype=np.float64)
    metrics.update(
        {
            "return": total_reward,
            "steps": steps,
            "truncated": ended,
            "decision_s": dec,
            "decision_s_mean": float(dec.mean()) if dec.size else 0.0,
            "decision_s_p95": float(np.percentile(dec, 95)) if dec.size else 0.0,
            "decision_s_max": float(dec.max()) if dec.size else 0.0,
        }
    )
    return metrics
