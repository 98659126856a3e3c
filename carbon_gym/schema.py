"""Declarative validation of TOML tables into frozen dataclasses (scenarios, faults, configs).

A dataclass field made with :func:`spec` carries its validator (a :data:`Check`) and a one-line
doc; :func:`parse_table` checks a raw table against the dataclass (unknown keys are refused with a
suggestion, required fields named) and builds it. Every error is a
:class:`~carbon_gym.errors.ConfigError` naming the dotted field and, where known, the allowed
values and the source file (:class:`Ctx`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .errors import ConfigError

__all__ = ["Ctx", "Check", "num", "integer", "string", "boolean", "list_of", "table_of", "tables_of", "raw_tables",
           "spec", "parse_table", "suggest_field", "unit_of"]

_UNIT_WORDS = {"_s": "seconds", "_h": "hours", "_ms": "milliseconds", "_tokens": "tokens", "_per_s": "per second",
               "_frac": "a fraction", "_g_per_kwh": "gCO2eq/kWh", "_w": "watts", "_bytes": "bytes",
               "_bytes_per_s": "bytes per second", "_flops": "FLOP/s"}


def unit_of(name: str) -> str:
    for suf in sorted(_UNIT_WORDS, key=len, reverse=True):
        if name.endswith(suf):
            return _UNIT_WORDS[suf]
    return ""


@dataclass(frozen=True)
class Ctx:
    """Where a table comes from (``source``: a file path or None), for error messages."""

    source: str | None

    def err(self, path: str, msg: str, allowed: Any = None) -> ConfigError:
        return ConfigError(path, msg, allowed=allowed, source=self.source)


Check = Callable[[Any, str, Ctx], Any]


def num(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Check:
    """A real number in a range (ints accepted; bools and strings refused)."""

    def check(v: Any, path: str, ctx: Ctx) -> float:
        unit = unit_of(path)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            hint = f" in {unit}" if unit else ""
            if isinstance(v, str) and re.match(r"^\s*[-+0-9.eE]+\s*[a-zA-Z%/]+\s*$", v):
                hint += " (write a plain number; the unit is in the field name)"
            raise ctx.err(path, f"expected a number{hint}, got {v!r}")
        x = float(v)
        if not math.isfinite(x):
            raise ctx.err(path, f"must be finite, got {v!r}")
        bad_lo = lo is not None and (x <= lo if lo_open else x < lo)
        bad_hi = hi is not None and (x >= hi if hi_open else x > hi)
        if bad_lo or bad_hi:
            rng = f"{'(' if lo_open else '['}{_bound(lo, '-inf')}, {_bound(hi, 'inf')}{')' if hi_open else ']'}"
            hint = ""
            if bad_hi and path.endswith("_s") and not path.endswith("_per_s") and hi is not None and x / 1000 <= hi:
                hint = " (is it in milliseconds? this field is in seconds)"
            raise ctx.err(path, f"{x} is out of range{hint}", allowed=f"{rng}{' ' + unit if unit else ''}")
        return x

    return check


def _bound(b: float | None, none: str) -> str:
    """A range bound as written in errors (``1e+14``, not fifteen digits)."""
    return none if b is None else str(b) if abs(b) < 1e9 else f"{b:g}"


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    """An integer in ``[lo, hi]``."""

    def check(v: Any, path: str, ctx: Ctx) -> int:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):  # (numpy integers too)
            raise ctx.err(path, f"expected an integer, got {v!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ctx.err(path, f"{v} is out of range", allowed=f"[{lo}, {hi if hi is not None else 'inf'}]")
        return int(v)

    return check


def string(choices: Sequence[str] | None = None, *, pattern: str | None = None) -> Check:
    """A string, optionally one of ``choices``."""

    def check(v: Any, path: str, ctx: Ctx) -> str:
        if not isinstance(v, str):
            raise ctx.err(path, f"expected a string, got {v!r}")
        if choices is not None and v not in choices:
            raise ctx.err(path, f"unknown value {v!r}", allowed=list(choices))
        if pattern is not None and not re.fullmatch(pattern, v):
            raise ctx.err(path, f"{v!r} does not match {pattern}")
        return v

    return check


def boolean() -> Check:
    """``true`` or ``false``."""

    def check(v: Any, path: str, ctx: Ctx) -> bool:
        if not isinstance(v, bool):
            raise ctx.err(path, f"expected true or false, got {v!r}")
        return v

    return check


def list_of(item: Check, *, min_len: int = 0) -> Check:
    """A TOML array whose items pass ``item``; returned as a tuple."""

    def check(v: Any, path: str, ctx: Ctx) -> tuple:
        if not isinstance(v, (list, tuple)):
            raise ctx.err(path, f"expected an array, got {v!r}")
        if len(v) < min_len:
            raise ctx.err(path, f"needs at least {min_len} item(s)")
        return tuple(item(x, f"{path}[{i}]", ctx) for i, x in enumerate(v))

    return check


def table_of(cls: type) -> Check:
    """A TOML table parsed as dataclass ``cls``."""

    def check(v: Any, path: str, ctx: Ctx) -> Any:
        return parse_table(cls, v, path, ctx)

    return check


def tables_of(cls: type) -> Check:
    """An array of TOML tables, each parsed as ``cls``; returned as a tuple."""

    def check(v: Any, path: str, ctx: Ctx) -> tuple:
        if not isinstance(v, (list, tuple)):
            raise ctx.err(path, f"expected an array of tables ([[{path}]]), got {v!r}")
        return tuple(parse_table(cls, x, f"{path}[{i}]", ctx) for i, x in enumerate(v))

    return check


def raw_tables() -> Check:
    """An array of tables kept as plain dicts (for sections validated elsewhere)."""

    def check(v: Any, path: str, ctx: Ctx) -> tuple:
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, dict) for x in v):
            raise ctx.err(path, f"expected an array of tables, got {v!r}")
        return tuple(dict(x) for x in v)

    return check


def spec(check: Check, doc: str = "", default: Any = dataclasses.MISSING) -> Any:
    """Dataclass field carrying its validator and a one-line doc."""
    if default is dataclasses.MISSING:
        return field(metadata={"check": check, "doc": doc})
    if isinstance(default, (list, dict, set)):
        raise TypeError("use tuples for defaults")
    return field(default=default, metadata={"check": check, "doc": doc})


def parse_table(cls: type, raw: Any, path: str, ctx: Ctx, fixed: Mapping[str, Any] | None = None) -> Any:
    """``raw`` checked against dataclass ``cls`` (its :func:`spec` fields; ``fixed``: values of its
    other fields, e.g. a table's name) and built; a :class:`ConfigError` naming the dotted field."""
    where = path or "scenario"
    if not isinstance(raw, Mapping):
        raise ctx.err(where, f"expected a table, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if "check" in f.metadata}
    for key in raw:
        if key not in fields:
            dotted = f"{path}.{key}" if path else key
            hint = suggest_field(key, list(fields))
            raise ctx.err(dotted, f"unknown field{hint}", allowed=sorted(fields))
    kwargs = dict(fixed or {})
    for name, f in fields.items():
        dotted = f"{path}.{name}" if path else name
        if name in raw:
            kwargs[name] = f.metadata["check"](raw[name], dotted, ctx)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ctx.err(dotted, "required field is missing")
    return cls(**kwargs)


def suggest_field(key: str, names: list[str]) -> str:
    stem = re.sub(r"_(ms|s|sec|secs|seconds|min|mins|minutes|h|hr|hours|us)$", "", key)
    same_stem = [n for n in names if re.sub(r"_(ms|s|h)$", "", n) == stem and n != key]
    if same_stem:
        return f"; did you mean {same_stem[0]!r}? (its unit is {unit_of(same_stem[0]) or 'in its name'})"
    close = difflib.get_close_matches(key, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
