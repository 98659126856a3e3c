"""TOML reading that works on Python 3.10 (tomli) and 3.11+ (tomllib)."""

from __future__ import annotations

import sys
from pathlib import Path
import json
import math
from typing import Any

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from .errors import DataError


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, raising :class:`DataError` naming the file on a syntax error."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise DataError(str(path), f"invalid TOML: {exc}") from None


def loads_toml(text: str, source: str = "<string>") -> dict[str, Any]:
    """Parse TOML text, raising :class:`DataError` naming ``source`` on a syntax error."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DataError(source, f"invalid TOML: {exc}") from None


def data_path(*parts: str) -> Path:
    """Path of a file shipped in ``carbon_gym/data``."""
    return Path(__file__).resolve().parent.joinpath("data", *parts)


def toml_value(v: Any, *, allow_nonfinite: bool = True, source: str = "toml") -> str:
    """TOML text of one value: bool, int, float, str, list/tuple/ndarray, dict (inline table),
    numpy scalar. Non-finite floats are written as ``nan``/``inf`` unless ``allow_nonfinite`` is
    False, then (like an unsupported type) they raise :class:`DataError` naming ``source``."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isfinite(v):
            return repr(v)
        if not allow_nonfinite:
            raise DataError(source, f"cannot write non-finite number {v}")
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple, np.ndarray)):
        return "[" + ", ".join(toml_value(x, allow_nonfinite=allow_nonfinite, source=source) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x, allow_nonfinite=allow_nonfinite, source=source)}" for k, x in v.items()) + "}"
    raise DataError(source, f"cannot write a value of type {type(v).__name__} to TOML")
