"""carbon_gym: a discrete-event simulator and Gymnasium environment for carbon-aware,
geo-distributed LLM serving.

Importing the package registers the environments with Gymnasium (no data is loaded until an
environment is made):

* ``carbon_gym/GeoServe-v0`` — any scenario: ``gymnasium.make("carbon_gym/GeoServe-v0",
  scenario="llama8b-moderate", overrides={"duration_s": 600})`` (default scenario: ``"dev"``);
* ``carbon_gym/GeoServe-<scenario>-v0`` — one id per shipped scenario, e.g.
  ``carbon_gym/GeoServe-dev-v0``, ``carbon_gym/GeoServe-llama8b-moderate-v0``.

A made env's ``spec.max_episode_steps`` is always its own episode length in steps (the env
truncates itself there, after its drain). ``GeoServe-v0`` registers none (its scenario is an
argument), so ``gymnasium.make`` adds no ``TimeLimit``; each ``GeoServe-<scenario>-v0`` registers its
scenario's length (a ``TimeLimit`` at the env's own last step, a no-op), and arguments that lengthen
that episode (``overrides={"duration_s": ...}``) warn to pass ``max_episode_steps`` to ``make``.

Public names (imported lazily): :class:`GeoServeEnv`, :func:`decode_observation`,
:class:`RoutingWeightsWrapper`, :class:`Policy`, :class:`RoundRobinPolicy`, :func:`rollout`,
:func:`run_episode`, :func:`load_scenario`, :func:`build_world`, :func:`registered_env_ids`, and
the policy registry (:mod:`carbon_gym.registry`): :func:`make_policy` (every layer's policies by
name, e.g. ``carbon_gym.make_policy("milp", env)``), :func:`register_policy`,
:func:`register_policy_prefix`, :func:`available_policies`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__version__ = "0.1.0"

ENV_NAMESPACE = "carbon_gym"
ENTRY_POINT = "carbon_gym.env:GeoServeEnv"
_SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

_LAZY = {
    "GeoServeEnv": "carbon_gym.env",
    "decode_observation": "carbon_gym.env",
    "ObservationLayout": "carbon_gym.env",
    "RoutingWeightsWrapper": "carbon_gym.wrappers",
    "Policy": "carbon_gym.policy",
    "RoundRobinPolicy": "carbon_gym.policy",
    "rollout": "carbon_gym.policy",
    "run_episode": "carbon_gym.policy",
    "make_policy": "carbon_gym.registry",
    "register_policy": "carbon_gym.registry",
    "register_policy_prefix": "carbon_gym.registry",
    "available_policies": "carbon_gym.registry",
    "load_scenario": "carbon_gym.scenario",
    "build_world": "carbon_gym.world",
}

__all__ = sorted([*_LAZY, "registered_env_ids", "env_id_for_scenario", "__version__"])


def env_id_for_scenario(name: str) -> str:
    """Gymnasium id of a shipped scenario, e.g. ``"dev"`` -> ``"carbon_gym/GeoServe-dev-v0"``."""
    return f"{ENV_NAMESPACE}/GeoServe-{name}-v0"


def _shipped_scenarios() -> list[str]:
    return sorted(p.stem for p in _SCENARIO_DIR.glob("*.toml"))


def _scenario_steps(name: str) -> int:
    """Steps in an episode of shipped scenario ``name`` (its Gymnasium ``max_episode_steps``),
    from the file's ``duration_s`` and ``polling_period_s`` (the full scenario loader only for a
    file that leaves one to its default: importing the package stays light)."""
    from ._toml import load_toml
    from .numeric import episode_steps

    raw = load_toml(_SCENARIO_DIR / f"{name}.toml")
    if isinstance(raw.get("duration_s"), (int, float)) and isinstance(raw.get("polling_period_s"), (int, float)):
        return episode_steps(raw["duration_s"], raw["polling_period_s"])
    from .scenario import load_scenario

    sc = load_scenario(name)
    return episode_steps(sc.duration_s, sc.polling_period_s)


def _register() -> list[str]:
    import gymnasium as gym

    ids = [f"{ENV_NAMESPACE}/GeoServe-v0"]
    specs: list[tuple[str, str | None]] = [(ids[0], None)]  # (any scenario: no TimeLimit; its env's spec says its length)
    for name in _shipped_scenarios():
        env_id = env_id_for_scenario(name)
        ids.append(env_id)
        specs.append((env_id, name))
    for env_id, scenario in specs:
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"scenario": scenario or "dev"}, disable_env_checker=False,
                         max_episode_steps=_scenario_steps(scenario) if scenario else None)
    return ids


_REGISTERED = _register()


def registered_env_ids() -> list[str]:
    """Ids registered by this package (``GeoServe-v0`` first, then one per shipped scenario)."""
    return list(_REGISTERED)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'carbon_gym' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
