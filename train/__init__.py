"""Learned policies for carbon_gym: SB3 PPO / MaskablePPO agents, the set policy, behaviour cloning.

``carbon-gym train --config train/configs/<name>.toml`` runs a config-driven training run
(:mod:`train.cli`); :class:`train.policy.LearnedPolicy` loads a checkpoint as a
:class:`carbon_gym.policy.Policy`. Importing ``train`` is light: torch and SB3 load with the
submodules that need them.
"""

from __future__ import annotations

__all__ = ["config", "envs", "set_policy", "bc", "callbacks", "runner", "policy", "curves", "evaluate", "cli"]
