"""Benchmark: how much of a PPO training run's wall time the environment takes (dev scenario).

Issue #4 asks that the env never be the bottleneck of PPO training. ``eval/bench_env.py``
measures the env alone; this script measures it inside training: it trains stable-baselines3
agents on the ``dev`` scenario for ``--steps`` timesteps with a wrapper that times every
``env.step`` / ``env.reset``, and prints per agent

* the training throughput (timesteps per wall second, rollouts and gradient updates included);
* the env's share of the wall time, and the env's own rate inside training (steps per second
  of env time);
* the learner's rate: timesteps per second of everything else (policy forward passes during
  rollouts, advantage computation, gradient epochs).

The env is the bottleneck when its share is above 50%, i.e. when its rate is below the learner's.
Agents: PPO (``MultiInputPolicy``) on :class:`~carbon_gym.wrappers.RoutingWeightsWrapper` (the
small fixed action) and MaskablePPO (``MultiInputPolicy``) on the per-request action with its
masks; SB3's default hyper-parameters (``n_steps=2048``, 10 epochs of minibatches of 64), one
torch thread, one env.

Usage::

    python eval/bench_ppo_share.py [--steps 4096]

The last line is ``ppo_env_share=<largest env share over the agents>``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import gymnasium as gym

import carbon_gym  # noqa: F401  (registers the envs)
from carbon_gym.wrappers import RoutingWeightsWrapper


class _StepTimer(gym.Wrapper):
    """Accumulates the wall time of ``step`` and ``reset`` (bench only)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.env_s = 0.0
        self.steps = 0

    def step(self, action: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.env.step(action)
        finally:
            self.env_s += time.perf_counter() - t0
            self.steps += 1

    def reset(self, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.env.reset(**kwargs)
        finally:
            self.env_s += time.perf_counter() - t0

    def action_masks(self) -> Any:
        """The inner env's masks (MaskablePPO looks them up on the wrapper)."""
        return self.env.unwrapped.action_masks()


def run(agent: str, steps: int, seed: int = 0) -> dict[str, float]:
    """Train ``agent`` (``"ppo-routing"`` or ``"maskable-ppo"``) for ``steps`` timesteps on dev."""
    import torch as th

    th.set_num_threads(1)
    base = gym.make("carbon_gym/GeoServe-dev-v0")
    if agent == "ppo-routing":
        from stable_baselines3 import PPO

        env = _StepTimer(RoutingWeightsWrapper(base))
        model: Any = PPO("MultiInputPolicy", env, seed=seed, verbose=0, device="cpu")
    elif agent == "maskable-ppo":
        from sb3_contrib import MaskablePPO

        env = _StepTimer(base)
        model = MaskablePPO("MultiInputPolicy", env, seed=seed, verbose=0, device="cpu")
    else:
        raise ValueError(f"unknown agent {agent!r}; allowed: ppo-routing, maskable-ppo")
    t0 = time.perf_counter()
    model.learn(total_timesteps=int(steps))
    wall = time.perf_counter() - t0
    env.close()
    learner_s = max(wall - env.env_s, 1e-9)
    return {"wall_s": wall, "timesteps": float(model.num_timesteps), "env_steps": float(env.steps),
            "train_steps_per_s": model.num_timesteps / wall, "env_share": env.env_s / wall,
            "env_steps_per_s": env.steps / max(env.env_s, 1e-9), "learner_steps_per_s": model.num_timesteps / learner_s}


def main(argv: list[str] | None = None) -> None:
    """Run both agents and print their figures (last line: ``ppo_env_share=<max>``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4096, help="timesteps per agent (multiple of 2048 for whole updates)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", UserWarning)
    shares = []
    for agent in ("ppo-routing", "maskable-ppo"):
        r = run(agent, args.steps)
        shares.append(r["env_share"])
        print(f"{agent}: {r['timesteps']:.0f} timesteps in {r['wall_s']:.1f} s -> {r['train_steps_per_s']:.0f} timesteps/s; "
              f"env {r['env_share']:.0%} of the wall time ({r['env_steps_per_s']:.0f} env steps/s inside training), "
              f"learner {r['learner_steps_per_s']:.0f} timesteps/s of its own time", flush=True)
    print(f"ppo_env_share={max(shares):.2f}")


if __name__ == "__main__":
    main()
