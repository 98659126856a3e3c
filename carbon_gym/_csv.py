"""Small CSV helpers shared by the data loaders (stdlib ``csv`` + numpy; no pandas).

Every helper reports problems as :class:`~carbon_gym.errors.DataError` naming the file and the
1-based line number, so a user can open the file at the bad line.
"""

from __future__ import annotations

import csv
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

from .errors import DataError

_MISSING = frozenset({"", "nan", "na", "n/a", "null", "none"})
_FRACTION = re.compile(r"^(.*?[T ]\d{1,2}:\d{2}:\d{2})\.(\d+)(.*)$")


def norm_name(name: str) -> str:
    """Lower-case ASCII letters and digits of a column name (``"Datetime (UTC)"`` -> ``"datetimeutc"``)."""
    return "".join(c for c in name.lower() if c.isascii() and c.isalnum())


def read_rows(path: str | Path) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """Open a CSV file; return its header and an iterator of ``(line_number, row)``.

    Blank lines are skipped. Raises :class:`DataError` if the file is missing or empty.
    """
    path = Path(path)
    try:
        fh = open(path, newline="", encoding="utf-8-sig")
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None
    except IsADirectoryError:
        raise DataError(str(path), "is a directory, expected a CSV file") from None
    reader = csv.reader(fh)
    try:
        header = next(reader)
    except StopIteration:
        fh.close()
        raise DataError(str(path), "empty file (no header line)") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        fh.close()
        raise DataError(f"{path}:1", f"not a readable CSV file: {exc}") from None
    header = [h.strip() for h in header]

    def rows() -> Iterator[tuple[int, list[str]]]:
        try:
            for row in reader:
                if not row or all(not c.strip() for c in row):
                    continue
                yield reader.line_num, row
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{path}:{reader.line_num}", f"not a readable CSV line: {exc}") from None
        finally:
            fh.close()

    return header, rows()


def is_missing(cell: str) -> bool:
    """True for an empty cell or a textual NaN/NA/null."""
    return cell.strip().lower() in _MISSING


def parse_float(cell: str, where: str, what: str) -> float:
    """Parse a finite float; :class:`DataError` at ``where`` (``file:line``) otherwise."""
    try:
        v = float(cell)
    except ValueError:
        raise DataError(where, f"{what}: not a number: {cell.strip()!r}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise DataError(where, f"{what}: not a finite number: {cell.strip()!r}")
    return v


def parse_utc(text: str) -> datetime:
    """Parse an ISO-8601 timestamp into a naive UTC :class:`datetime`.

    Accepts a space or ``T`` separator, any number of fractional-second digits, and an optional
    ``Z`` or ``+hh:mm`` offset (converted to UTC). A timestamp without an offset is taken as UTC.
    Raises ``ValueError`` if it cannot be parsed.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty timestamp")
    if s[-1] in "zZ":
        s = s[:-1] + "+00:00"
    m = _FRACTION.match(s)
    frac_us = 0
    if m:
        digits = m.group(2)
        frac_us = int(round(int(digits) * 10 ** (6 - len(digits)))) if len(digits) <= 6 else int(round(int(digits) / 10 ** (len(digits) - 6)))
        s = m.group(1) + m.group(3)
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return dt + timedelta(microseconds=frac_us)
