"""Wrappers around :class:`carbon_gym.env.GeoServeEnv`.

:class:`RoutingWeightsWrapper` replaces the per-request ``MultiDiscrete`` action by a small fixed
one — a routing weight per datacenter — for agents that cannot produce per-request actions
(plain PPO/SAC with a ``Box`` action, tabular agents, hand-written share policies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .errors import ActionError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from .env import GeoServeEnv

__all__ = ["RoutingWeightsWrapper", "FlattenCapacityAction", "apportion"]

#: Weights may exceed [0, 1] by this much (float rounding) and are then clipped.
WEIGHT_TOLERANCE = 1e-6


def apportion(expected: np.ndarray, n: int) -> np.ndarray:
    """Split ``n`` items into integer counts proportional to ``expected`` (largest remainder).

    Negative entries count as 0; if all are <= 0 the split is uniform. Counts sum to ``n``;
    ties in the remainders go to the lowest index. Deterministic.
    """
    e = np.maximum(np.asarray(expected, dtype=np.float64), 0.0)
    if e.size == 0:
        return np.zeros(0, dtype=np.int64)
    total = e.sum()
    if not total > 0:
        e = np.ones_like(e)
        total = float(e.size)
    share = e * (n / total)
    q = np.floor(share).astype(np.int64)
    rest = int(n - q.sum())
    if rest > 0:
        order = np.argsort(-(share - q), kind="stable")
        q[order[:rest]] += 1
    elif rest < 0:  # float rounding pushed the floors over n: take back from the smallest remainders
        order = np.argsort(share - q, kind="stable")
        q[order[:-rest]] -= 1
    return q


def _geoserve(env: gym.Env) -> GeoServeEnv:
    """The :class:`~carbon_gym.env.GeoServeEnv` under ``env``'s wrappers (a ConfigError otherwise)."""
    from .env import GeoServeEnv

    base = env.unwrapped
    if not isinstance(base, GeoServeEnv):
        raise ConfigError("env", f"expected a GeoServeEnv (possibly wrapped), got {type(base).__name__}")
    return base


class RoutingWeightsWrapper(gym.ActionWrapper):
    """Action = routing weights per datacenter: ``Box(0, 1, (D,), float32)``.

    At each step the visible pending requests (oldest first) are split over the datacenters in
    proportion to the weights, deterministically:

    1. Requests are grouped by their set of allowed datacenters (the env's action mask; usually
       one group). A request with no allowed datacenter is deferred.
    2. For a group of n requests over allowed set A, the expected counts are
       ``e_a = n x w_a / sum_{b in A} w_b + c_a`` (uniform weights over A if they sum to 0),
       where ``c_a`` is the fractional credit carried over from earlier steps (so that a weight
       of 1/3 sends every third request when one request arrives per step). Integer counts
       ``q_a`` are the largest-remainder apportionment of n by ``e_a`` (ties to the lowest
       index); then ``c_a = e_a - q_a``. Credits are cleared at reset.
    3. The group's requests are interleaved over A: datacenter a's j-th request is placed at
       position ``(j + 0.5) / q_a`` and requests are dealt out in order of position (ties to the
       lowest datacenter index), like a smooth weighted round-robin.

    Every visible request is placed (none is deferred unless no datacenter is allowed for it);
    requests beyond the K slots stay pending as in the base env. Weights outside [0, 1] (beyond a 1e-6
    tolerance), NaN or a wrong shape raise :class:`~carbon_gym.errors.ActionError`.
    ``info["routing_counts"]`` (D,) gives the requests sent to each datacenter in the step.

    Note: SB3's env checker recommends a symmetric [-1, 1] Box; SB3 rescales policy outputs to
    the declared bounds, so [0, 1] works as is.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._base = _geoserve(env)
        self._D = int(self._base.layout.n_datacenters)
        self._K = int(self._base.layout.max_pending)
        self.action_space = spaces.Box(0.0, 1.0, shape=(self._D,), dtype=np.float32)
        self._credit = np.zeros(self._D, dtype=np.float64)
        self._last_counts = np.zeros(self._D, dtype=np.int64)

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        """Reset the env and clear the carried-over credits."""
        self._credit[:] = 0.0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        """Route by weights, then step the wrapped env."""
        obs, reward, terminated, truncated, info = self.env.step(self.action(action))
        info["routing_counts"] = self._last_counts.copy()
        return obs, float(reward), terminated, truncated, info

    def action(self, action: Any) -> np.ndarray:
        """Turn weights (D,) into the env's MultiDiscrete action (K,)."""
        D, K = self._D, self._K
        w = np.asarray(action, dtype=np.float64)
        if w.shape != (D,):
            raise ActionError(f"routing weights must have shape ({D},), one per datacenter; got shape {w.shape}")
        if not np.all(np.isfinite(w)):
            raise ActionError(f"routing weights must be finite, got {w.tolist()}")
        if np.any(w < -WEIGHT_TOLERANCE) or np.any(w > 1.0 + WEIGHT_TOLERANCE):
            raise ActionError(f"routing weights must lie in [0, 1], got {w.tolist()}")
        w = np.clip(w, 0.0, 1.0)
        mask = self._base.action_masks().reshape(K, D + 1)[:, :D]
        out = np.full(K, D, dtype=np.int64)
        counts = np.zeros(D, dtype=np.int64)
        rows = np.flatnonzero(mask.any(axis=1))
        if rows.size:
            sub = mask[rows]
            if (sub == sub[0]).all():
                groups = [(sub[0], rows)]
            else:
                patterns, inverse = np.unique(sub, axis=0, return_inverse=True)
                inverse = inverse.reshape(-1)
                first = np.array([np.flatnonzero(inverse == g)[0] for g in range(len(patterns))])
                groups = [(patterns[g], rows[inverse == g]) for g in np.argsort(first, kind="stable")]
            for allowed, grp in groups:
                dcs = self._route_group(w, np.flatnonzero(allowed), grp.size)
                out[grp] = dcs
                counts += np.bincount(dcs, minlength=D)
        self._last_counts = counts
        return out

    def _route_group(self, w: np.ndarray, allowed: np.ndarray, n: int) -> np.ndarray:
        wa = w[allowed]
        total = wa.sum()
        share = wa / total if total > 0 else np.full(allowed.size, 1.0 / allowed.size)
        expected = n * share + self._credit[allowed]
        q = apportion(expected, n)
        self._credit[allowed] = expected - q
        dc_of = np.repeat(allowed, q)
        j = np.concatenate([np.arange(c) for c in q]) if q.size else np.zeros(0)
        pos = (j + 0.5) / np.repeat(np.maximum(q, 1), q)
        order = np.lexsort((dc_of, pos))
        return dc_of[order]


class FlattenCapacityAction(gym.ActionWrapper):
    """One ``MultiDiscrete`` for the capacity ``Dict`` action (``[capacity] control = "agent"``):
    ``concat(route nvec, capacity nvec, servers nvec)``, for agents that take no ``Dict`` actions
    (stable-baselines3, sb3-contrib's MaskablePPO). :meth:`action_masks` is the env's flat mask in
    the same order (route K x (D + 1) slot-major, then one block per datacenter of its capacity
    values, then of its servers values). Example::

        env = FlattenCapacityAction(GeoServeEnv("dev", {"capacity.control": "agent"}))
        a = env.action_space.sample(mask=...)   # or MaskablePPO("MultiInputPolicy", env)
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, spaces.Dict) or set(space.spaces) != {"route", "capacity", "servers"}:
            raise ConfigError("env", "FlattenCapacityAction needs a capacity action (capacity.control = 'agent'), got "
                              f"{space}", allowed=["capacity.control = 'agent'"])
        vecs = [np.asarray(getattr(space[k], "nvec"), dtype=np.int64) for k in ("route", "capacity", "servers")]  # noqa: B009
        self._parts = [(k, int(v.shape[0])) for k, v in zip(("route", "capacity", "servers"), vecs)]
        self.action_space = spaces.MultiDiscrete(np.concatenate(vecs))

    def action(self, action: Any) -> dict[str, np.ndarray]:
        """Split the flat action into the env's ``{"route", "capacity", "servers"}``."""
        a = np.asarray(action)
        n = sum(w for _, w in self._parts)
        if a.shape != (n,):
            raise ActionError(f"action must have shape ({n},): route, capacity and servers entries; got shape {a.shape}")
        out: dict[str, np.ndarray] = {}
        i = 0
        for k, w in self._parts:
            out[k] = a[i:i + w]
            i += w
        return out

    def action_masks(self) -> np.ndarray:
        """The flat mask (see the class docstring)."""
        return _geoserve(self.env).action_masks()
