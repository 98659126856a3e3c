"""Functions that the simulator builds per simulation (closures: the draining dispatch score), the
plain parameters of the latency and power models that the compiled
:class:`~carbon_gym.sim.request.EngineModels` evaluates (:func:`table_latency_params`,
:func:`phase_power_params`), and the copy / pickle helpers of its classes (:func:`slot_state`).

A closure cannot be pickled, so each one built here carries its recipe (``_rebuild``: the
factory and its arguments): :func:`slot_state` stores it as a :class:`Rebuild`, which pickles
as "call the factory again" (closures are pure functions of their arguments) and deep-copies
as the closure itself (shared, as before). Calls stay plain closure calls.

They live here, outside the modules that ``setup.py`` may compile (:mod:`carbon_gym.sim._native`),
so that they are ordinary Python functions whatever the build: a compiled closure would be an
object that ``copy.deepcopy`` (of an env, say) tries to rebuild instead of sharing.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..physics.latency import TableLatencyModel
from ..physics.power import PhasePowerModel

__all__ = ["table_latency_params", "phase_power_params", "draining_score_fn", "blank_instance", "slot_state", "Rebuild"]


class Rebuild:
    """A closure built by a factory of this module, in a pickle: unpickles as ``factory(*args)``;
    ``copy.deepcopy`` gives the original closure (closures are immutable: sharing is safe)."""

    __slots__ = ("fn", "factory", "args")

    def __init__(self, fn: Callable[..., Any], factory: Callable[..., Any], args: tuple) -> None:
        self.fn, self.factory, self.args = fn, factory, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.factory, self.args

    def __deepcopy__(self, memo: dict) -> Any:
        return self.fn

    def __copy__(self) -> Any:
        return self.fn


def _with_recipe(fn: Any, factory: Callable[..., Any], *args: Any) -> Any:
    """``fn`` with its recipe attached (see the module docstring)."""
    fn._rebuild = (factory, args)
    return fn


def draining_score_fn(base: Callable[[Any], float]) -> Callable[[Any], float]:
    """Dispatch score that sends nothing (``inf``) to an engine drained by a fault or not awake
    (capacity control: told to sleep, asleep, waking...), else ``base``'s."""

    def score(engine: Any) -> float:
        return math.inf if engine.draining or engine.cap_state else base(engine)

    return _with_recipe(score, draining_score_fn, base)


def table_latency_params(latency: Any) -> tuple | None:
    """For a :class:`~carbon_gym.physics.latency.TableLatencyModel` (exactly that class), its
    coefficients and tables as plain Python floats and lists, in the order
    :class:`~carbon_gym.sim.request.EngineModels` takes them (it evaluates the model's formula
    with the same floating-point operations in the same order, compiled: the same floats without
    numpy's per-call overhead); None for any other latency model (whose own method is called)."""
    if type(latency) is not TableLatencyModel:
        return None
    grid = [float(x) for x in latency.tokens_grid]
    table = latency._prefill_table
    return (
        grid, [float(x) for x in latency.linear_s], [float(x) for x in latency._slopes],
        float(latency.attn_decode_fixed_s), float(latency.attn_decode_per_seq_s), float(latency.attn_decode_per_ctx_s),
        float(latency.attn_prefill_fixed_s), float(latency.attn_prefill_per_token_s),
        float(latency.attn_prefill_per_pair_s), float(latency.overhead_s), float(latency.allreduce_fixed_s),
        float(latency.allreduce_per_token_s), float(latency.lm_head_fixed_s), float(latency.per_sampled_seq_s),
        table,  # PrefillTable (grid, A, slopes of A, B, slopes of B) or None
    )


def phase_power_params(power: Any) -> tuple[float, float] | None:
    """For a :class:`~carbon_gym.physics.power.PhasePowerModel` (exactly that class), ``(prefill_w,
    prefill_sat_tokens)``: with them :class:`~carbon_gym.sim.request.EngineModels` computes the
    watts of an iteration with prefill work, ``tp * gpu_power_w(pt, nd)``, with the same
    floating-point operations (compiled), the model's per-GPU ``decode_power_w(nd)`` cached per
    ``nd``; None for any other power model (whose ``gpu_power_w`` is called)."""
    if type(power) is not PhasePowerModel:
        return None
    return float(power.prefill_w), float(power.prefill_sat_tokens)


def blank_instance(cls: Any) -> Any:
    """An instance of ``cls`` whose ``__init__`` has not run (copy / pickle support)."""
    return cls.__new__(cls)


def slot_state(obj: Any) -> dict[str, Any]:
    """The attributes set on ``obj``, an instance of a class of the simulator, compiled (mypyc
    lists them in ``__mypyc_attrs__``) or not (the ``__slots__`` along its classes, and its
    ``__dict__`` if it has one), for copy / pickle (``engine.CopyableState.__reduce__``)."""
    cls = type(obj)
    names = getattr(cls, "__mypyc_attrs__", None)
    if names is None:
        names = [n for k in cls.__mro__ for n in k.__dict__.get("__slots__", ())]
    state: dict[str, Any] = {}
    for name in names:
        try:
            state[name] = getattr(obj, name)
        except AttributeError:  # never set
            pass
    if hasattr(obj, "__dict__"):
        state.update(vars(obj))
    for name, value in state.items():
        recipe = getattr(value, "_rebuild", None)
        if recipe is not None and isinstance(recipe, tuple):
            state[name] = Rebuild(value, *recipe)
    return state
