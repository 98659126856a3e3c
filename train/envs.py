"""Training environments: a mixture of scenarios on training days, vectorised for SB3.

Held-out split of the carbon year: day-of-year ``n`` (1-based, of the carbon trace's year) is a
**held-out** day when ``n % heldout_every_days == 0`` (default every 4th day); training episodes
start only on the other days, at a random hour. Evaluation (:mod:`train.evaluate`, the
TensorBoard evaluation episode) starts on held-out days only, so the agent is judged on grid
conditions it never trained on.
"""

from __future__ import annotations

import functools
import warnings
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError, check_seed

__all__ = [
    "CARBON_YEAR",
    "is_heldout_day",
    "training_start",
    "heldout_starts",
    "training_episode",
    "make_episode_env",
    "ScenarioMixEnv",
    "make_vec_env",
    "make_env_fns",
    "vec_backend",
    "VEC_BACKENDS",
]

#: Year of the packaged hourly carbon traces (episode start dates are drawn in it).
CARBON_YEAR = 2023
_DAYS = 365


def is_heldout_day(day_of_year: int, every: int = 4) -> bool:
    """Whether 1-based ``day_of_year`` is held out from training (``day % every == 0``)."""
    return int(day_of_year) % int(every) == 0


def _iso(day_of_year: int, hour: float, year: int = CARBON_YEAR) -> str:
    t = datetime(int(year), 1, 1, tzinfo=timezone.utc) + timedelta(days=int(day_of_year) - 1, hours=float(hour))
    t = t.replace(second=0, microsecond=0)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def training_start(rng: np.random.Generator, every: int = 4) -> str:
    """A random episode start (ISO UTC, whole minutes) on a training day (not held out)."""
    days = np.array([d for d in range(1, _DAYS + 1) if not is_heldout_day(d, every)])
    day = int(rng.choice(days))
    minute = int(rng.integers(0, 24 * 60))
    return _iso(day, minute / 60.0)


def training_episode(scenarios: Sequence[str], ep: int, rng: np.random.Generator, overrides: dict[str, Any] | None,
                     every: int = 4) -> tuple[str, str, int, GeoServeEnv]:
    """Episode ``ep`` of a training-data collection: (scenario ``scenarios[ep mod len]``, a random
    training-day start, a world seed, its env). Draws the start, then the seed, from ``rng``."""
    scenario = scenarios[ep % len(scenarios)]
    start = training_start(rng, every)
    seed = int(rng.integers(0, 2**31 - 1))
    return scenario, start, seed, make_episode_env(scenario, overrides, start)


def heldout_starts(n: int, every: int = 4, seed: int = 0, year: int = CARBON_YEAR) -> list[str]:
    """``n`` evaluation starts on held-out days, spread over the year and the hours of the day
    (deterministic: golden-ratio sequence over the held-out days and hours, offset by ``seed``).
    ``year``: another carbon year (a user's ``carbon.file``; ``every = 1`` spreads the starts over
    all its days, none of which training saw); the last day of a leap year is never drawn."""
    if isinstance(year, bool) or not isinstance(year, int) or not 1900 <= year <= 2200:
        raise ConfigError("year", f"must be a calendar year (an integer 1900..2200), got {year!r}")
    if int(every) < 1:
        raise ConfigError("every", f"must be an integer >= 1, got {every!r}")
    days = [d for d in range(1, _DAYS + 1) if is_heldout_day(d, every)]
    phi = 0.6180339887498949
    out = []
    for i in range(int(n)):
        u = (0.5 + (i + seed) * phi) % 1.0
        v = (0.25 + (i + seed) * phi * phi) % 1.0
        out.append(_iso(days[int(u * len(days))], round(v * 24 * 60) / 60.0, year))
    return out


def make_episode_env(scenario: str, overrides: dict[str, Any] | None, start_utc: str | None) -> GeoServeEnv:
    """A :class:`GeoServeEnv` for ``scenario`` with ``overrides`` and the carbon start ``start_utc``."""
    ov = dict(overrides or {})
    if start_utc is not None:
        ov["carbon.start_utc"] = start_utc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # provisional load levels, K hints: reported by the CLI once
        return GeoServeEnv(scenario=scenario, overrides=ov, invalid_action="raise")


class ScenarioMixEnv(gym.Env):
    """Each episode: one of ``scenarios`` and a training-day start, drawn from the env's RNG.

    All scenarios must have the same observation and action spaces (same topology size D and
    slot count K; set ``env.max_pending`` in the overrides). ``routing=True`` exposes the
    :class:`~carbon_gym.wrappers.RoutingWeightsWrapper` action instead of the per-request one.
    ``action_masks()`` (per-request action only) is the inner env's.

    With ``capacity.control = "agent"`` the action is the flattened capacity action
    (:class:`~carbon_gym.wrappers.FlattenCapacityAction`: route | capacity | servers) and
    ``action_masks()`` the env's flat mask, except that between capacity decisions (whose
    capacity entries the env ignores) only the servers in force are allowed: a policy's
    servers entries then carry no choice, and no log-probability
    (:class:`~train.slot_dist.RouteCapacityDistribution`).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        scenarios: Sequence[str],
        overrides: dict[str, Any] | None = None,
        *,
        heldout_every_days: int = 4,
        routing: bool = False,
    ) -> None:
        if not scenarios:
            raise ConfigError("scenarios", "need at least one scenario")
        self._scenarios = list(scenarios)
        self._overrides = dict(overrides or {})
        self._every = int(heldout_every_days)
        self._routing = bool(routing)
        self._inner: gym.Env | None = None
        first = self._build(self._scenarios[0], None)
        self.observation_space = first.observation_space
        self.action_space = first.action_space
        self.layout = first.unwrapped.layout
        for s in self._scenarios[1:]:
            other = self._build(s, None)
            if other.observation_space != self.observation_space or other.action_space != self.action_space:
                raise ConfigError(
                    "scenarios",
                    f"scenario {s!r} has other observation/action spaces than {self._scenarios[0]!r} "
                    "(same topology size and env.max_pending needed)",
                )
            other.close()
        first.close()
        self.current_scenario: str | None = None
        self.current_start_utc: str | None = None

    def _build(self, scenario: str, start: str | None) -> gym.Env:
        env: gym.Env = make_episode_env(scenario, self._overrides, start)
        if self._routing:
            from carbon_gym.wrappers import RoutingWeightsWrapper

            env = RoutingWeightsWrapper(env)
        elif bool(getattr(env.unwrapped.layout, "capacity_agent", False)):
            from carbon_gym.wrappers import FlattenCapacityAction

            env = FlattenCapacityAction(env)
        return env

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=check_seed(seed))
        rng = self.np_random
        scenario = self._scenarios[int(rng.integers(len(self._scenarios)))]
        start = training_start(rng, self._every)
        if self._inner is not None:
            self._inner.close()
        self._inner = self._build(scenario, start)
        self.layout = self._inner.unwrapped.layout
        self.current_scenario, self.current_start_utc = scenario, start
        return self._inner.reset(seed=int(rng.integers(0, 2**31 - 1)), options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self._inner is None:
            raise RuntimeError("call reset() first")
        obs, reward, terminated, truncated, info = self._inner.step(action)
        info = {k: v for k, v in info.items() if k != "action_mask"}  # large; masks come from action_masks()
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """The inner env's masks (flat: K x (D + 1), then with capacity control the capacity and
        servers parts; see the class docstring)."""
        if self._inner is None:
            raise RuntimeError("call reset() first")
        base = self._inner.unwrapped
        m = base.action_masks()
        if bool(getattr(base.layout, "capacity_agent", False)):
            st = base.state()
            if not st.capacity_decision:
                size = np.asarray(base.layout.n_servers, dtype=np.int64) + 1
                srv = np.zeros(int(size.sum()), dtype=bool)
                srv[np.cumsum(size) - size + np.asarray(st.capacity_target_servers, dtype=np.int64)] = True
                m[m.size - srv.size:] = srv
        return m

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
            self._inner = None


def _make_one(scenarios: Sequence[str], overrides: dict[str, Any], every: int, routing: bool, seed: int, threads: int) -> gym.Env:
    from stable_baselines3.common.monitor import Monitor

    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:  # pragma: no cover
        pass
    env = ScenarioMixEnv(scenarios, overrides, heldout_every_days=every, routing=routing)
    env.reset(seed=seed)
    return Monitor(env)


#: Vector-env backends of :func:`make_vec_env` (``backend=``).
VEC_BACKENDS = ("dummy", "subproc", "ray")


def make_vec_env(
    scenarios: Sequence[str],
    overrides: dict[str, Any] | None,
    *,
    n_envs: int,
    seed: int,
    routing: bool,
    heldout_every_days: int = 4,
    subprocess: bool | None = None,
    backend: str | None = None,
    ray_address: str | None = None,
) -> Any:
    """``n_envs`` :class:`ScenarioMixEnv` (each in a ``Monitor``) in a vector env; env i is seeded
    ``seed + i``.

    ``backend``: ``"dummy"`` (``DummyVecEnv``, all envs in this process), ``"subproc"``
    (``SubprocVecEnv``, one process each) or ``"ray"`` (:class:`train.ray_vec.RayVecEnv`, one Ray
    actor each, on ``ray_address``: ``"local"`` starts a local instance, default; ``"auto"`` /
    ``"ray://head:10001"`` join a cluster). ``ray_address`` alone implies ``"ray"``. None (and
    no ``ray_address``): ``SubprocVecEnv`` when ``n_envs > 1``, else ``DummyVecEnv``;
    ``subprocess`` (older switch) forces ``SubprocVecEnv`` (True) or ``DummyVecEnv`` (False).
    :class:`ConfigError` (field ``vec_backend``) for an unknown backend or a conflicting choice.
    """
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    kind = vec_backend(n_envs, backend=backend, ray_address=ray_address, subprocess=subprocess)
    fns = make_env_fns(scenarios, overrides, n_envs=n_envs, seed=seed, routing=routing, heldout_every_days=heldout_every_days)
    venv: Any
    if kind == "ray":
        from .ray_vec import RayVecEnv

        venv = RayVecEnv(fns, address=ray_address or "local")
    elif kind == "subproc":
        venv = SubprocVecEnv(fns, start_method="spawn" if _fork_unsafe() else None)
    else:
        venv = DummyVecEnv(fns)
    venv.seed(seed)
    return venv


def make_env_fns(scenarios: Sequence[str], overrides: dict[str, Any] | None, *, n_envs: int, seed: int, routing: bool,
                 heldout_every_days: int = 4) -> list[Callable[[], gym.Env]]:
    """The picklable env factories :func:`make_vec_env` vectorises (env i: a ``Monitor``-wrapped
    :class:`ScenarioMixEnv` reset with seed ``seed + i``, one torch thread), e.g. for a
    :class:`train.ray_vec.RayVecEnv` with other options."""
    return [
        functools.partial(_make_one, list(scenarios), dict(overrides or {}), heldout_every_days, routing, seed + i, 1)
        for i in range(n_envs)
    ]


def vec_backend(n_envs: int, *, backend: str | None = None, ray_address: str | None = None,
                subprocess: bool | None = None) -> str:
    """The backend :func:`make_vec_env` uses for these arguments (one of :data:`VEC_BACKENDS`);
    :class:`ConfigError` (field ``vec_backend``) for an unknown or conflicting choice."""
    if backend is not None and backend not in VEC_BACKENDS:
        raise ConfigError("vec_backend", f"unknown vector-env backend {backend!r}", allowed=list(VEC_BACKENDS))
    if ray_address is not None:
        if not isinstance(ray_address, str) or not ray_address:
            raise ConfigError("ray_address", f"must be 'local' or a Ray cluster address, got {ray_address!r}")
        if backend not in (None, "ray"):
            raise ConfigError("vec_backend", f"a Ray address ({ray_address!r}) runs the envs on Ray, not backend {backend!r}",
                              allowed=["ray"])
        backend = "ray"
    if backend is not None:
        if subprocess is not None and (backend == "subproc") != bool(subprocess):
            raise ConfigError("vec_backend", f"backend {backend!r} conflicts with subprocess={subprocess!r}",
                              allowed=list(VEC_BACKENDS))
        return backend
    use_sub = (n_envs > 1) if subprocess is None else bool(subprocess)
    return "subproc" if use_sub else "dummy"


def _fork_unsafe() -> bool:
    import sys

    return sys.platform == "darwin"
