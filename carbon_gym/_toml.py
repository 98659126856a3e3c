"""TOML reading that works on Python 3.10 (tomli) and 3.11+ (tomllib)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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
