"""Learned policies for carbon_gym: SB3 PPO / MaskablePPO agents, the set policy, behaviour cloning.

``carbon-gym train --config train/configs/<name>.toml`` runs a config-driven training run
(:mod:`train.cli`); :class:`train.policy.LearnedPolicy` loads a checkpoint as a
:class:`carbon_gym.policy.Policy`. Importing ``train`` is light: torch and SB3 load with the
submodules that need them. :func:`register_policies` (this package's entry point in the
``carbon_gym.policies`` group) puts the learned agents in the policy registry.
"""

from __future__ import annotations

from typing import Any

__all__ = ["config", "envs", "set_policy", "bc", "callbacks", "runner", "policy", "curves", "evaluate", "cli",
           "register_policies"]


def _learned(env: Any = None, *, path: str | None = None, **kw: Any) -> Any:
    from .policy import make_learned_policy

    return make_learned_policy(path, env, **kw)


def _learned_path(argument: str, env: Any = None, *, path: str | None = None, **kw: Any) -> Any:
    from .policy import make_learned_policy

    return make_learned_policy(path or argument, env, **kw)


def _check(argument: str) -> None:
    """The checkpoint exists and the training extra (torch, SB3) is installed."""
    import importlib.util
    import os

    from carbon_gym.errors import ConfigError

    for module in ("torch", "stable_baselines3"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError("policy", f"learned policies need the training extra ({module} is missing): "
                              "pip install 'carbon-gym[train]'")
    if argument:
        path = argument
    else:
        from .policy import SHIPPED_CHECKPOINT

        path = str(SHIPPED_CHECKPOINT)
    if not os.path.isfile(path):
        raise ConfigError("policy", f"no checkpoint at {path!r}")


def register_policies() -> None:
    """Register ``learned`` (the shipped checkpoint) and the prefixes ``learned:<path>`` /
    ``ppo:<path>`` (a pickle-free ``.npz`` checkpoint, or an SB3 ``.zip`` with ``trust=True``) in :mod:`carbon_gym.registry` (idempotent; imports no torch)."""
    from carbon_gym.registry import register_policy, register_policy_prefix

    register_policy("learned", _learned, in_all=False, check=_check, replace=True,
                    doc="the shipped trained agent (train/checkpoints/llama8b_set.npz)")
    for prefix in ("learned", "ppo"):
        register_policy_prefix(prefix, _learned_path, check=_check, replace=True,
                               doc="a trained agent: checkpoint (.npz; an SB3 .zip needs --trust-checkpoint) written by carbon-gym train")
