"""A plain loop of round-robin episodes on ``dev`` (no timers inside): time it as a whole process.

    python eval/bench_dev_loop.py 100     # 100 episodes (6,000 steps); prints the step count

For paired before/after comparisons of the env's per-step cost: the process CPU time of N episodes
minus that of 1 episode (imports and set-up) is the cost of N - 1 episodes.
"""

from __future__ import annotations

import sys
import warnings


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    episodes = int(args[0]) if args else 30
    warnings.simplefilter("ignore")
    import gymnasium as gym

    import carbon_gym  # noqa: F401  (registers the envs)
    from carbon_gym.policy import RoundRobinPolicy

    env = gym.make("carbon_gym/GeoServe-dev-v0", disable_env_checker=True)
    policy = RoundRobinPolicy()
    steps = 0
    for ep in range(episodes):
        obs, info = env.reset(seed=ep)
        policy.reset(env)
        while True:
            obs, _, _, truncated, info = env.step(policy.act(obs, info))
            steps += 1
            if truncated:
                break
    print(f"steps={steps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
