"""Functions that the simulator builds per simulation (closures over a model's parameters), and
the copy / pickle helpers of its classes (:func:`slot_state`).

A closure cannot be pickled, so each one built here carries its recipe (``_rebuild``: the
factory and its arguments): :func:`slot_state` stores it as a :class:`Rebuild`, which pickles
as "call the factory again" (the same floats: the closures are pure functions of their
arguments) and deep-copies as the closure itself (shared, as before). Calls stay plain
closure calls: nothing changes on the simulator's hot path.

They live here, outside the modules that ``setup.py`` may compile (:mod:`carbon_gym.sim._native`),
so that they are ordinary Python functions whatever the build: a compiled closure would be an
object that ``copy.deepcopy`` (of an env, say) tries to rebuild instead of sharing.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any, Callable

from ..physics.latency import TableLatencyModel, prefill_table_s
from ..physics.power import PhasePowerModel

__all__ = ["iteration_time_fn", "prefill_power_fn", "draining_score_fn", "blank_instance", "slot_state", "Rebuild"]


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


def iteration_time_fn(latency: Any) -> Callable[[int, float, int, float, int], float]:
    """``iteration_time_s(prefill_tokens, pairs, n_decode, ctx_sum, n_sampled) -> float`` (seconds)
    of the latency model: :func:`_table_time_fn`'s pure-Python copy for the table model, else the
    model's own method."""
    fn = _table_time_fn(latency)
    if fn is not None:
        return _with_recipe(fn, iteration_time_fn, latency)

    def iteration_time_s(pt: int, pairs: float, nd: int, ctx: float, ns: int) -> float:
        return float(latency.iteration_time_s(pt, pairs, nd, ctx, ns))

    return _with_recipe(iteration_time_s, iteration_time_fn, latency)


def prefill_power_fn(power: Any, tp: int) -> Callable[[int, int], float]:
    """``prefill_engine_w(prefill_tokens > 0, n_decode) -> float``: the engine's watts (all ``tp``
    GPUs) during an iteration with prefill work."""
    fn = _phase_prefill_power_fn(power, tp)
    if fn is not None:
        return _with_recipe(fn, prefill_power_fn, power, tp)

    def prefill_engine_w(pt: int, nd: int) -> float:
        return tp * float(power.gpu_power_w(pt, nd))

    return _with_recipe(prefill_engine_w, prefill_power_fn, power, tp)


def draining_score_fn(base: Callable[[Any], float]) -> Callable[[Any], float]:
    """Dispatch score that sends nothing (``inf``) to an engine drained by a fault or not awake
    (capacity control: told to sleep, asleep, waking...), else ``base``'s."""

    def score(engine: Any) -> float:
        return math.inf if engine.draining or engine.cap_state else base(engine)

    return _with_recipe(score, draining_score_fn, base)


def _table_time_fn(latency: Any) -> Callable[[int, float, int, float, int], float] | None:
    """For a :class:`~carbon_gym.physics.latency.TableLatencyModel` (exactly that class), a
    pure-Python ``iteration_time_s`` that performs the same floating-point operations in the same
    order (so it returns the same floats) without numpy's per-call overhead; None otherwise."""
    if type(latency) is not TableLatencyModel:
        return None
    grid = [float(x) for x in latency.tokens_grid]
    lin = [float(x) for x in latency.linear_s]
    slopes = [float(x) for x in latency._slopes]
    last = len(grid) - 2
    dec_fixed, dec_seq, dec_ctx = latency.attn_decode_fixed_s, latency.attn_decode_per_seq_s, latency.attn_decode_per_ctx_s
    pre_fixed, pre_tok, pre_pair = (latency.attn_prefill_fixed_s, latency.attn_prefill_per_token_s,
                                    latency.attn_prefill_per_pair_s)
    overhead, ar_fixed, ar_tok = latency.overhead_s, latency.allreduce_fixed_s, latency.allreduce_per_token_s
    lm_fixed, per_sampled = latency.lm_head_fixed_s, latency.per_sampled_seq_s
    table = latency._prefill_table

    def iteration_time_s(pt: int, pairs: float, nd: int, ctx_sum: float, n_sampled: int) -> float:
        tokens = pt + nd
        if tokens <= 0:
            return 0.0
        x = float(tokens)  # (exact: the same floats, with float-float comparisons in the bisections)
        i = bisect_right(grid, x) - 1
        if i < 0:
            i = 0
        elif i > last:
            i = last
        t = lin[i] + slopes[i] * (x - grid[i])
        if nd > 0:
            t += dec_fixed + dec_seq * nd
            t += dec_ctx * ctx_sum
        if pt > 0:
            t += pre_fixed + pre_tok * pt
            t += pre_pair * pairs
            if table is not None:
                t += prefill_table_s(table, float(pt), pairs)
        t += overhead + ar_fixed + ar_tok * tokens
        if n_sampled > 0:
            t += lm_fixed + per_sampled * n_sampled
        return t

    return iteration_time_s


def _phase_prefill_power_fn(power: Any, tp: int) -> Callable[[int, int], float] | None:
    """For a :class:`~carbon_gym.physics.power.PhasePowerModel` (exactly that class), the engine
    watts of an iteration with ``prefill_tokens > 0`` - ``tp * gpu_power_w(pt, nd)`` - with the
    same floating-point operations, the per-GPU decode power cached per ``nd``; None otherwise."""

    if type(power) is not PhasePowerModel:
        return None
    base_of: dict[int, float] = {}
    prefill_w = power.prefill_w
    sat = power.prefill_sat_tokens
    decode_power_w = power.decode_power_w

    def prefill_engine_w(pt: int, nd: int) -> float:
        base = base_of.get(nd)
        if base is None:
            base = base_of[nd] = decode_power_w(nd)
        frac = min(1.0, pt / sat)
        return tp * float(base + (prefill_w - base) * frac)

    return prefill_engine_w


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
