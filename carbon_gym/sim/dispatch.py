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
``"cache_aware"``
    Prefix-cache affinity against load (like SGLang's cache-aware router or llm-d's weighted
    prefix-cache and load scorers): for a request with prefix keys, the engine minimising
    ``least_work - cached`` where ``cached`` is the request's prefix tokens already in that
    engine's prefix cache (:mod:`carbon_gym.sim.prefix_cache`). In tokens, that is the engine's
    outstanding work after taking the request (``least_work + prompt - cached``, the prompt being
    the same everywhere): a cached token saves one token of prefill, so affinity wins until the
    load gap exceeds the tokens it saves. Requests without prefix keys, or whose first block no
    engine holds, go by ``least_work`` alone (ties: lowest engine index).

A dispatcher's ``prefix_weight`` (:func:`register_dispatcher`; 0 for the score-only ones) is the
load tokens one cached prompt token is worth; the cache part is evaluated per request at
dispatch (one walk of its prefix blocks per engine, only when some engine of the datacenter holds
its first block), from the cache as last settled (module docstring of the prefix cache).

Add your own with :func:`register_dispatcher`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..errors import ConfigError
from .engine import least_work_score, most_free_kv_score  # (compiled with the engine: called at every queue change)

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine

__all__ = ["ScoreFn", "least_work_score", "most_free_kv_score", "register_dispatcher", "get_prefix_weight",
           "available_dispatchers", "get_dispatcher"]

ScoreFn = Callable[["Engine"], float]


_DISPATCHERS: dict[str, ScoreFn] = {
    "least_work": least_work_score,
    "most_free_kv": most_free_kv_score,
    "cache_aware": least_work_score,
}
_PREFIX_WEIGHTS: dict[str, float] = {"cache_aware": 1.0}


def register_dispatcher(name: str, score: ScoreFn, prefix_weight: float = 0.0) -> None:
    """Register a dispatcher ``score(engine) -> float`` (lowest score wins) under ``name``; with
    ``prefix_weight > 0`` a request's cached prefix tokens at an engine, times that weight, are
    subtracted from the engine's score (cache-aware dispatch)."""
    if not callable(score):
        raise ConfigError("dispatcher", f"score for {name!r} must be callable")
    w = float(prefix_weight)
    if not (w >= 0.0) or w == float("inf"):
        raise ConfigError("prefix_weight", f"must be finite and >= 0, got {prefix_weight!r}")
    _DISPATCHERS[name] = score
    _PREFIX_WEIGHTS[name] = w


def get_prefix_weight(name: str) -> float:
    """Load tokens one cached prompt token is worth for dispatcher ``name`` (0: not cache-aware)."""
    get_dispatcher(name)
    return _PREFIX_WEIGHTS.get(name, 0.0)


def available_dispatchers() -> list[str]:
    """Names of the registered dispatchers."""
    return sorted(_DISPATCHERS)


def get_dispatcher(name: str) -> ScoreFn:
    """The score function registered as ``name``; :class:`ConfigError` listing them if unknown."""
    try:
        return _DISPATCHERS[name]
    except (KeyError, TypeError):
        raise ConfigError("dispatcher", f"unknown dispatcher {name!r}", allowed=available_dispatchers()) from None
