"""Small CSV helpers shared by the data loaders (stdlib ``csv`` + numpy; no pandas).

Every helper reports problems as :class:`~carbon_gym.errors.DataError` naming the file and the
1-based line number, so a user can open the file at the bad line.
"""

from __future__ import annotations

import csv
import io
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
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None
    except IsADirectoryError:
        raise DataError(str(path), "is a directory, expected a CSV file") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:  # name the line of the bad byte, not the first line
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}", f"not valid UTF-8 text (byte {raw[exc.start]:#04x}); save the file as UTF-8") from None
    fh = io.StringIO(text, newline="")
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


def to_float(cell: str) -> float:
    """``float(cell)`` for a plain decimal number: ``ValueError`` also for Python's digit
    separators (``1_000``), which no data file means as a thousand."""
    if "_" in cell:
        raise ValueError(f"digit separator in {cell.strip()!r}")
    return float(cell)


def parse_float(cell: str, where: str, what: str, max_abs: float = float("inf")) -> float:
    """Parse a finite float (``|v| <= max_abs``); :class:`DataError` at ``where`` (``file:line``) otherwise."""
    try:
        v = to_float(cell)
    except ValueError:
        raise DataError(where, f"{what}: not a number: {cell.strip()!r}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise DataError(where, f"{what}: not a finite number: {cell.strip()!r}")
    if abs(v) > max_abs:
        raise DataError(where, f"{what}: {cell.strip()!r} is out of range (allowed: |value| <= {max_abs:g})")
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
