"""Intra-datacenter dispatchers: which engine of a datacenter receives an arriving request.

A dispatcher is a *score* function ``engine -> float``; the datacenter sends each arriving
request to the engine with the lowest score (ties: lowest engine index). Scores are recomputed
only when an engine's queue or its published state changes, so dispatch costs O(engines) list
scanning in C, not Python calls per engine.

Scores read only state that changes at the same moments whether the engine steps one iteration
at a time or jumps over decode runs in closed form (queued prompt tokens, running sequences, and
the KV occupancy *published* at the end of every iteration that admitted, prefilled, completed
or preempted something; see :class:`carbon_gym.sim.engine.Engine`), so dispatch decisions are
identical in both modes.

Registered dispatchers:

``"least_work"``
    Outstanding tokens: prompt tokens waiting in the engine queue plus the KV-cache tokens held
    by its running sequences (published blocks x block size). Balances both queued prefill work
    and the decode load (attention cost grows with resident context).
``"most_free_kv"``
    Most free KV blocks after the queued requests are admitted: published free blocks minus the
    blocks the waiting requests' prompts need (score = its negative).

Add your own with :func:`register_dispatcher`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine

ScoreFn = Callable[["Engine"], float]


def least_work_score(engine: Engine) -> float:
    """Queued prompt tokens + tokens resident in the engine's KV cache (lower is better)."""
    return engine.pending_tokens + engine.view_used_blocks * engine.block_tokens


def most_free_kv_score(engine: Engine) -> float:
    """Minus (published free KV blocks - blocks needed by the waiting prompts)."""
    return -(engine.view_free_blocks - engine.waiting_blocks)


_DISPATCHERS: dict[str, ScoreFn] = {
    "least_work": least_work_score,
    "most_free_kv": most_free_kv_score,
}


def register_dispatcher(name: str, score: ScoreFn) -> None:
    """Register a dispatcher ``score(engine) -> float`` (lowest score wins) under ``name``."""
    if not callable(score):
        raise ConfigError("dispatcher", f"score for {name!r} must be callable")
    _DISPATCHERS[name] = score


def available_dispatchers() -> list[str]:
    """Names of the registered dispatchers."""
    return sorted(_DISPATCHERS)


def get_dispatcher(name: str) -> ScoreFn:
    """The score function registered as ``name``; :class:`ConfigError` listing them if unknown."""
    try:
        return _DISPATCHERS[name]
    except (KeyError, TypeError):
        raise ConfigError("dispatcher", f"unknown dispatcher {name!r}", allowed=available_dispatchers()) from None
