"""``RayVecEnv``: a stable-baselines3 vector env whose sub-envs live in Ray actors.

Design
------
One Ray actor per sub-env (:class:`_EnvWorker`, ``num_cpus_per_env`` CPUs each); each actor builds
its env from a picklable factory (``Callable[[], gym.Env]``, e.g. the ``functools.partial``
factories of :func:`train.envs.make_vec_env`) and keeps it for the life of the vector env. The
semantics are those of SB3's ``SubprocVecEnv``:

* ``step_async`` sends one remote call per actor (``step(action)``); ``step_wait`` gathers them
  with one ``ray.get``. An actor that finishes an episode resets its env itself and returns the
  reset observation, the last one in ``info["terminal_observation"]``, and
  ``info["TimeLimit.truncated"]`` (truncated and not terminated), as ``SubprocVecEnv``'s worker.
* ``reset`` passes the per-env seeds and options set by ``seed()`` / ``set_options()`` (used
  once), and records the envs' reset infos in ``reset_infos``.
* ``get_attr`` / ``set_attr`` / ``env_method`` / ``env_is_wrapped`` run in the actors (a
  ``MaskablePPO`` calls ``env_method("action_masks")`` every step: one more round trip).
* Observations (here a gymnasium ``Dict`` of arrays) travel through Ray's object store (large
  arrays zero-copy in shared memory on one node) and are stacked in the driver, one leading
  axis for the envs.

Actors are placed by Ray's scheduler: on a local instance (``address="local"``) they share
this machine's cores; on a cluster (``address="auto"``, ``"ray://head:10001"``) Ray spreads
them over the nodes with free CPUs (``actor_options={"scheduling_strategy": "SPREAD"}``
spreads them even when one node could take all). The nodes need this package installed (or a
Ray ``runtime_env`` that ships it, passed in ``actor_options``).

Scaling to 100+ workers
-----------------------
What limits this design is the learner's per-step synchronisation: every ``VecEnv.step`` waits
for the slowest of the N actors (a straggler stalls all), the driver issues and gathers 2N remote
calls per step (step and ``action_masks``; roughly 0.1-1 ms each of driver-side overhead, so
tens of milliseconds per step at N = 100) and stacks N observations, and the policy's forward
pass on the batch and the PPO update run in the one learner process. At 100+ workers one would

* run several envs per actor as a local vector env (``DummyVecEnv`` inside the actor, e.g. 8-32
  envs per actor, one actor per core or node), so one round trip steps many envs and returns one
  already-stacked batch, amortising the per-call overhead; and return the action masks with the
  step result instead of a second call;
* decouple collection from learning: asynchronous actors that roll out whole ``n_steps``
  segments with a recent copy of the policy (weights broadcast through the object store) and
  return trajectories, with an off-policy correction (IMPALA / V-trace, or APPO), so no learner
  step waits on the slowest env;
* for several learner processes or nodes (data-parallel updates), use RLlib (its
  ``EnvRunner`` groups and learner groups implement both of the points above) rather than
  extending a single-process SB3 learner.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Callable, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from carbon_gym.errors import ConfigError

__all__ = ["RayVecEnv", "import_ray"]

#: Ray instance started by this module (``address="local"``, or another address when Ray was not
#: initialised yet) and the number of open RayVecEnvs using it: the last one to close shuts it down.
_STARTED: dict[str, int] = {"started": 0, "users": 0}


def import_ray() -> Any:
    """The ``ray`` module, or :class:`RuntimeError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray vector env (--ray-address, --vec ray) needs Ray: pip install 'carbon-gym[ray]'") from None
    return ray


class _EnvWorker:
    """Body of the Ray actor holding one sub-env (the counterpart of ``SubprocVecEnv``'s worker)."""

    def __init__(self, env_fn: Callable[[], gym.Env]) -> None:
        from stable_baselines3.common.vec_env.patch_gym import _patch_env

        self.env = _patch_env(env_fn())

    def spaces(self) -> tuple[spaces.Space, spaces.Space]:
        """(observation space, action space) of the env."""
        return self.env.observation_space, self.env.action_space

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, dict[str, Any], dict[str, Any] | None]:
        """One step, SB3 style: (obs, reward, done, info, reset info or None). At the end of an
        episode the env is reset here: obs is the reset observation, the last one is in
        ``info["terminal_observation"]`` and the reset info is returned (None otherwise)."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        done = bool(terminated or truncated)
        info["TimeLimit.truncated"] = bool(truncated and not terminated)
        reset_info = None
        if done:
            info["terminal_observation"] = obs
            obs, reset_info = self.env.reset()
        return obs, reward, done, info, reset_info

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        """``env.reset(seed=seed[, options=options])`` (options only when not empty)."""
        kwargs = {"options": options} if options else {}
        return self.env.reset(seed=seed, **kwargs)

    def render(self) -> Any:
        return self.env.render()

    def get_attr(self, name: str) -> Any:
        return self.env.get_wrapper_attr(name)

    def has_attr(self, name: str) -> bool:
        try:
            self.env.get_wrapper_attr(name)
        except AttributeError:
            return False
        return True

    def set_attr(self, name: str, value: Any) -> None:
        setattr(self.env, name, value)

    def env_method(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.env.get_wrapper_attr(name)(*args, **kwargs)

    def is_wrapped(self, wrapper_class: type[gym.Wrapper]) -> bool:
        from stable_baselines3.common.env_util import is_wrapped

        return is_wrapped(self.env, wrapper_class)

    def close(self) -> None:
        self.env.close()


class RayVecEnv(VecEnv):
    """``len(env_fns)`` sub-envs, each in its own Ray actor (see the module docstring).

    Args:
        env_fns: picklable factories, one per sub-env (sent to the actors: a ``functools.partial``
            of a module-level function, not a lambda of local state, for a cluster).
        address: ``"local"`` starts a new local Ray instance (CPUs: this machine's count, at
            least ``ceil(len(env_fns) * num_cpus_per_env)``, so all actors fit); any other
            string joins that cluster with ``ray.init(address=...)`` (``"auto"``,
            ``"ray://head:10001"``, ``"head:6379"``). A Ray instance already initialised in this
            process is used as it is, whatever the address. A local instance runs its workers
            at this process's niceness (Ray's default is 15 more, which starves the env actors on
            a busy machine).
        num_cpus_per_env: CPUs (Ray's logical CPUs, may be fractional, e.g. 0.5 for two envs
            per core) each actor reserves.
        actor_options: extra ``.options(...)`` of the actors (``scheduling_strategy``,
            ``runtime_env``, ``resources``, ...).

    A Ray instance that a ``RayVecEnv`` started is shut down when the last ``RayVecEnv`` using
    it is closed; one initialised elsewhere is left running.

    Raises:
        RuntimeError: Ray is not installed.
        ConfigError: no env factories, or a bad ``num_cpus_per_env``.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], *, address: str = "local", num_cpus_per_env: float = 1.0,
                 actor_options: Mapping[str, Any] | None = None) -> None:
        if len(env_fns) == 0:
            raise ConfigError("env_fns", "need at least one env factory")
        ncpu = float(num_cpus_per_env)
        if isinstance(num_cpus_per_env, bool) or not math.isfinite(ncpu) or ncpu < 0:
            raise ConfigError("num_cpus_per_env", f"must be a number >= 0 (Ray logical CPUs), got {num_cpus_per_env!r}")
        if not isinstance(address, str) or not address:
            raise ConfigError("ray_address", f"must be 'local' or a Ray cluster address, got {address!r}")
        ray = import_ray()
        self._ray = ray
        self.waiting = False
        self.closed = False
        self._pending: list[Any] = []
        self._uses_started_ray = False
        n = len(env_fns)
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False}
            if address == "local":
                # a new local instance, even where RAY_ADDRESS names a cluster; its workers at the
                # driver's niceness (Ray's default adds 15: on a shared machine the env actors, the
                # rollout's critical path, would then wait behind every other process)
                kwargs.update(address="local", include_dashboard=False,
                              num_cpus=max(os.cpu_count() or 1, math.ceil(n * ncpu)),
                              _system_config={"worker_niceness": 0})
            else:
                kwargs["address"] = address
            ray.init(**kwargs)
            _STARTED["users"] = 0
            _STARTED["started"] = 1
        else:
            _warn_if_short(ray, n * ncpu)
        if _STARTED.get("started"):
            _STARTED["users"] += 1
            self._uses_started_ray = True
        self._workers: list[Any] = []
        try:
            actor_cls = ray.remote(num_cpus=ncpu)(_EnvWorker)
            if actor_options:
                actor_cls = actor_cls.options(**dict(actor_options))
            self._workers = [actor_cls.remote(fn) for fn in env_fns]
            observation_space, action_space = ray.get(self._workers[0].spaces.remote())
            super().__init__(n, observation_space, action_space)
        except BaseException:
            self.closed = True
            for w in self._workers:
                ray.kill(w)
            self._release()
            raise

    # -- stepping ---------------------------------------------------------------------------------

    def reset(self) -> VecEnvObs:
        """Reset every env with its pending seed and options (then cleared); returns the stacked
        observations and sets ``reset_infos``."""
        if self.waiting:
            self._drain()
        refs = [w.reset.remote(self._seeds[i], self._options[i]) for i, w in enumerate(self._workers)]
        results = self._get(refs)
        self.reset_infos = [info for _, info in results]
        self._reset_seeds()
        self._reset_options()
        return _stack_obs([obs for obs, _ in results], self.observation_space)

    def step_async(self, actions: np.ndarray) -> None:
        """Send each actor its action (one remote call per actor); ``step_wait`` collects them."""
        if self.waiting:
            raise RuntimeError("step_async called while a step is pending: call step_wait first")
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        self._pending = [w.step.remote(a) for w, a in zip(self._workers, actions)]
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        """(stacked observations, rewards (float64, shape ``(n_envs,)``), dones (bool), infos)."""
        try:
            results = self._get(self._pending)
        finally:
            self._pending = []
            self.waiting = False
        obs, rews, dones, infos = [], [], [], []
        for i, (o, r, d, info, reset_info) in enumerate(results):
            if d:
                info["terminal_observation"] = _writable(info["terminal_observation"])
                self.reset_infos[i] = reset_info if reset_info is not None else {}
            obs.append(o)
            rews.append(r)
            dones.append(d)
            infos.append(info)
        return _stack_obs(obs, self.observation_space), np.stack(rews), np.stack(dones), infos

    def close(self) -> None:
        """Close the envs, kill the actors, and shut Ray down if a ``RayVecEnv`` started it and
        no other one still uses it. Idempotent."""
        if self.closed:
            return
        self.closed = True
        ray = self._ray
        try:
            if self.waiting:
                self._drain()
            try:
                self._get([w.close.remote() for w in self._workers], timeout=60)
            except Exception:  # noqa: BLE001 - an env failing to close must not keep its actor alive
                pass
            for w in self._workers:
                try:
                    ray.kill(w)
                except Exception:  # noqa: BLE001 - already dead
                    pass
            self._workers = []
        finally:
            self._release()

    def _get(self, refs: list[Any], timeout: float | None = None) -> list[Any]:
        """``ray.get(refs)``; on an error (raised as the remote one: a ``RayTaskError`` that is
        also an instance of the env's exception class) every other ref is still fetched, so Ray
        does not log their errors as unhandled."""
        try:
            return list(self._ray.get(refs, timeout=timeout))
        except Exception:
            for r in refs:
                try:
                    self._ray.get(r, timeout=0 if timeout is not None else None)
                except Exception:  # noqa: BLE001,S110 - the first error is the one raised
                    pass
            raise

    def _drain(self) -> None:
        try:
            self._get(self._pending)
        except Exception:  # noqa: BLE001 - a pending step's error is moot once the step is abandoned
            pass
        self._pending = []
        self.waiting = False

    def _release(self) -> None:
        """Drop this object's use of a Ray instance the module started; shut it down if last."""
        if not self._uses_started_ray:
            return
        self._uses_started_ray = False
        _STARTED["users"] = max(0, _STARTED["users"] - 1)
        if _STARTED["users"] == 0 and _STARTED.get("started"):
            _STARTED["started"] = 0
            if self._ray.is_initialized():
                self._ray.shutdown()

    # -- attributes and methods of the sub-envs ---------------------------------------------------

    def get_images(self) -> Sequence[np.ndarray | None]:
        """``render()`` of each env (``render_mode`` ``"rgb_array"``; Nones and a warning otherwise)."""
        if self.render_mode != "rgb_array":
            warnings.warn(f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                          stacklevel=2)
            return [None for _ in self._workers]
        return list(self._get([w.render.remote() for w in self._workers]))

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has ``attr_name`` (through its wrappers)."""
        return all(self._get([w.has_attr.remote(attr_name) for w in self._workers]))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """``attr_name`` of the envs at ``indices`` (through their wrappers)."""
        return list(self._get([w.get_attr.remote(attr_name) for w in self._targets(indices)]))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name`` on the outermost wrapper of the envs at ``indices``."""
        self._get([w.set_attr.remote(attr_name, value) for w in self._targets(indices)])

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        """``method_name(*method_args, **method_kwargs)`` of the envs at ``indices``, results in order."""
        refs = [w.env_method.remote(method_name, method_args, method_kwargs) for w in self._targets(indices)]
        return list(self._get(refs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether the envs at ``indices`` are wrapped in ``wrapper_class``."""
        return list(self._get([w.is_wrapped.remote(wrapper_class) for w in self._targets(indices)]))

    def _targets(self, indices: VecEnvIndices) -> list[Any]:
        return [self._workers[i] for i in self._get_indices(indices)]


def _warn_if_short(ray: Any, need: float) -> None:
    """Warn when a running Ray instance has fewer free CPUs than the actors ask for (they would
    wait, and the first ``step`` with them, until CPUs free up or the cluster grows)."""
    try:
        free = float(ray.available_resources().get("CPU", 0.0))
    except Exception:  # noqa: BLE001 - the check is advisory
        return
    if need > free + 1e-9:
        warnings.warn(f"RayVecEnv: the env actors need {need:g} CPUs but the Ray instance has {free:g} free: they "
                      "start only when CPUs free up (lower num_cpus_per_env, or add nodes)", RuntimeWarning, stacklevel=3)


def _writable(obs: Any) -> Any:
    """``obs`` with read-only arrays (zero-copy from Ray's object store) copied."""
    if isinstance(obs, np.ndarray):
        return obs if obs.flags.writeable else obs.copy()
    if isinstance(obs, dict):
        return {k: _writable(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_writable(v) for v in obs)
    return obs


def _stack_obs(obs: Sequence[Any], space: spaces.Space) -> VecEnvObs:
    """Per-env observations -> one batch (envs on the leading axis; per key for a ``Dict`` space,
    per element for a ``Tuple`` space)."""
    if isinstance(space, spaces.Dict):
        return {key: np.stack([o[key] for o in obs]) for key in space.spaces}
    if isinstance(space, spaces.Tuple):
        return tuple(np.stack([o[i] for o in obs]) for i in range(len(space.spaces)))
    return np.stack(obs)
