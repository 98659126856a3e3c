"""Grid carbon intensity: zone x time -> gCO2eq/kWh, and its exact time integral.

:class:`CarbonTrace` holds an hourly series per zone (values stamped at the start of each hour,
UTC, as Electricity Maps publishes them). Time inside carbon_gym is seconds since the trace's
first hour; a trace wraps around cyclically past its end (so an episode that starts on
31 December 23:00 continues into the trace's first hours), which is documented in every
scenario that uses it.

Within an hour the intensity is either held (``"step"``) or linearly interpolated towards the
next hour's value (``"linear"``). :meth:`CarbonTrace.integral` returns the exact integral of the
chosen interpolant, so carbon = (power x PUE) x integral / 3.6e6 is exact for piecewise-constant
power.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .._csv import is_missing, norm_name, parse_float, parse_utc, read_rows
from .._toml import data_path
from ..errors import ConfigError, DataError, check_choice, check_finite_nonneg

SECONDS_PER_HOUR = 3600.0
J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class CarbonTrace:
    """Hourly carbon intensity of several grid zones.

    Attributes:
        zones: zone names, column order of ``hourly_g_per_kwh``.
        start_utc: timestamp (naive, UTC) of the first hour.
        hourly_g_per_kwh: array (hours, zones) of gCO2eq/kWh, finite and >= 0.
        interpolation: ``"step"`` or ``"linear"`` within the hour.
        kind: ``"lca"`` (life-cycle) or ``"direct"`` (operational) or free text for user data.
        source: where the numbers come from (file path or description).
        filled_values: number of (hour, zone) values the loader filled because the user asked
            for it (``fill=...`` in :func:`load_carbon_trace`); 0 means every value is measured data.
    """

    zones: tuple[str, ...]
    start_utc: datetime
    hourly_g_per_kwh: np.ndarray
    interpolation: str = "step"
    kind: str = "lca"
    source: str = ""
    filled_values: int = 0
    _cum: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        values = np.ascontiguousarray(self.hourly_g_per_kwh, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != len(self.zones) or values.shape[0] < 1:
            raise ConfigError("carbon.hourly_g_per_kwh", f"must have shape (hours, {len(self.zones)}), got {values.shape}")
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ConfigError("carbon.hourly_g_per_kwh", "values must be finite and >= 0")
        if self.interpolation not in ("step", "linear"):
            raise ConfigError("carbon.interpolation", f"unknown value {self.interpolation!r}", allowed=["step", "linear"])
        object.__setattr__(self, "zones", tuple(self.zones))
        object.__setattr__(self, "hourly_g_per_kwh", values)
        nxt = np.roll(values, -1, axis=0)
        if self.interpolation == "step":
            per_hour = values * SECONDS_PER_HOUR
        else:
            per_hour = 0.5 * (values + nxt) * SECONDS_PER_HOUR
        cum = np.zeros((values.shape[0] + 1, values.shape[1]))
        np.cumsum(per_hour, axis=0, out=cum[1:])
        object.__setattr__(self, "_cum", cum)

    @property
    def hours(self) -> int:
        """Number of hourly samples."""
        return int(self.hourly_g_per_kwh.shape[0])

    @property
    def period_s(self) -> float:
        """Length of the trace in seconds (it repeats after this)."""
        return self.hours * SECONDS_PER_HOUR

    def zone_index(self, zone: str) -> int:
        """Column index of ``zone``; :class:`ConfigError` listing the zones if unknown."""
        try:
            return self.zones.index(zone)
        except ValueError:
            raise ConfigError("zone", f"unknown grid zone {zone!r}", allowed=self.zones) from None

    def intensity(self, zone: int, t_s: float) -> float:
        """gCO2eq/kWh of zone (column index) at ``t_s`` seconds after the trace start."""
        h_float = (t_s % self.period_s) / SECONDS_PER_HOUR
        h = int(h_float)
        v = self.hourly_g_per_kwh
        if self.interpolation == "step":
            return float(v[h, zone])
        f = h_float - h
        return float(v[h, zone] + (v[(h + 1) % self.hours, zone] - v[h, zone]) * f)

    def intensity_all(self, t_s: float) -> np.ndarray:
        """gCO2eq/kWh of every zone at ``t_s`` (array of length ``len(zones)``)."""
        h_float = (t_s % self.period_s) / SECONDS_PER_HOUR
        h = int(h_float)
        v = self.hourly_g_per_kwh
        if self.interpolation == "step":
            return v[h].copy()
        f = h_float - h
        return v[h] + (v[(h + 1) % self.hours] - v[h]) * f

    def _cumulative(self, zone: int, t_s: float) -> float:
        """Integral of intensity from 0 to ``t_s`` (gCO2eq/kWh x s), cyclic."""
        periods, rem = divmod(t_s, self.period_s)
        h_float = rem / SECONDS_PER_HOUR
        h = min(int(h_float), self.hours - 1)
        dt = rem - h * SECONDS_PER_HOUR
        v = self.hourly_g_per_kwh
        base = periods * self._cum[-1, zone] + self._cum[h, zone]
        if self.interpolation == "step":
            return float(base + v[h, zone] * dt)
        slope = (v[(h + 1) % self.hours, zone] - v[h, zone]) / SECONDS_PER_HOUR
        return float(base + v[h, zone] * dt + 0.5 * slope * dt * dt)

    def integral(self, zone: int, t0_s: float, t1_s: float) -> float:
        """Exact integral of intensity over [t0_s, t1_s] in (gCO2eq/kWh) x seconds."""
        if t1_s <= t0_s:
            return 0.0
        return self._cumulative(zone, t1_s) - self._cumulative(zone, t0_s)

    def mean_intensity(self, zone: int, t0_s: float, t1_s: float) -> float:
        """Time-average gCO2eq/kWh over [t0_s, t1_s] (the point value if the interval is empty)."""
        if t1_s <= t0_s:
            return self.intensity(zone, t0_s)
        return self.integral(zone, t0_s, t1_s) / (t1_s - t0_s)

    # ------------------------------------------------------------------ additions (loaders era)

    @property
    def end_utc(self) -> datetime:
        """Timestamp (naive, UTC) just past the trace's last hour (= start + hours)."""
        return self.start_utc + timedelta(hours=self.hours)

    def time_utc(self, t_s: float) -> datetime:
        """Wall-clock UTC time of carbon time ``t_s`` (no wrap-around applied)."""
        return self.start_utc + timedelta(seconds=float(t_s))

    def series(self, zone: str) -> np.ndarray:
        """The hourly gCO2eq/kWh of ``zone`` (a read-only view, length :attr:`hours`)."""
        col = self.hourly_g_per_kwh[:, self.zone_index(zone)]
        col.flags.writeable = False
        return col

    def select(self, zones: Sequence[str]) -> CarbonTrace:
        """A trace with only ``zones`` (in that order); :class:`ConfigError` for an unknown zone."""
        idx = []
        for z in zones:
            if z not in self.zones:
                raise ConfigError("carbon.zones", f"zone {z!r} is not in the trace", allowed=self.zones, source=self.source or None)
            idx.append(self.zones.index(z))
        return CarbonTrace(
            zones=tuple(zones), start_utc=self.start_utc, hourly_g_per_kwh=self.hourly_g_per_kwh[:, idx],
            interpolation=self.interpolation, kind=self.kind, source=self.source, filled_values=self.filled_values,
        )


# ====================================================================================== loaders

CARBON_KINDS = ("lca", "direct")
FILL_METHODS = ("none", "ffill", "linear")

_TIME_NAMES = ("datetimeutc", "datetime", "timestamp", "timeutc", "time", "date", "hour", "hourutc")
_ZONE_NAMES = ("zoneid", "zone", "zonekey", "zonecode", "region")
_VALUE_NAMES = ("value", "carbonintensity", "intensity", "gco2eqkwh", "gco2kwh", "ci")


def packaged_carbon_path(kind: str = "lca") -> Path:
    """Path of the packaged Electricity Maps 2023 hourly file for ``kind`` ("lca" or "direct")."""
    check_choice("carbon.kind", kind, CARBON_KINDS)
    return data_path("carbon", f"electricitymaps_ci_{kind}_hourly_2023.csv")


def packaged_carbon_zones() -> tuple[str, ...]:
    """Zones available in the packaged carbon files."""
    with open(packaged_carbon_path("lca"), encoding="utf-8") as fh:
        header = fh.readline().strip().split(",")
    return tuple(h.strip() for h in header[1:])


def _pick_value_column(header: list[str], skip: set[int], kind: str, value_column: str | None, src: str) -> int:
    if value_column is not None:
        if value_column not in header:
            raise ConfigError("carbon.value_column", f"column {value_column!r} not in {src}", allowed=header)
        return header.index(value_column)
    cands = [i for i in range(len(header)) if i not in skip]
    normed = {i: norm_name(header[i]) for i in cands}
    kind_hits = [i for i in cands if kind in normed[i] and ("intensity" in normed[i] or "ci" in normed[i] or normed[i] == kind)]
    if len(kind_hits) == 1:
        return kind_hits[0]
    other_kinds = [k for k in CARBON_KINDS if k != kind]
    generic = [
        i for i in cands
        if any(n in normed[i] for n in _VALUE_NAMES) and not any(k in normed[i] for k in other_kinds)
        and "percentage" not in normed[i]
    ]
    if len(generic) == 1:
        return generic[0]
    raise DataError(
        src,
        f"cannot tell which column holds the {kind} carbon intensity (columns: {', '.join(header)}); "
        "pass value_column=...",
    )


#: Largest carbon intensity a trace may hold, gCO2eq/kWh (real grids stay below ~1,500; a larger
#: value is a unit or parsing mistake, and values near the float limit overflow the emissions).
MAX_INTENSITY_G_PER_KWH = 1e5

_Series = tuple  # (lines: list[int], times: list[datetime], cells: list[str])


def _parse_time(cell: str, where: str, column: str) -> datetime:
    try:
        return parse_utc(cell)
    except ValueError:
        raise DataError(where, f"cannot parse timestamp {cell.strip()!r} in column {column!r}") from None


def _read_long(path: Path, header: list[str], rows: Iterator[tuple[int, list[str]]], zone_col: int, kind: str, value_column: str | None,
               zones: Sequence[str] | None) -> tuple[dict[str, _Series], bool]:
    src = str(path)
    time_col = next((i for i, h in enumerate(header) if norm_name(h) in _TIME_NAMES), None)
    if time_col is None:
        raise DataError(src, f"long-format file has no time column (looked for {', '.join(_TIME_NAMES)}; header: {', '.join(header)})")
    val_col = _pick_value_column(header, {time_col, zone_col}, kind, value_column, src)
    wanted = None if zones is None else set(zones)
    series: dict[str, _Series] = {}
    need = max(time_col, zone_col, val_col) + 1
    for line, row in rows:
        if len(row) < need:
            raise DataError(f"{src}:{line}", f"expected {len(header)} columns, got {len(row)}")
        zone = row[zone_col].strip()
        s = series.get(zone)
        if s is None:
            s = series[zone] = ([], [], [])
        if wanted is not None and zone not in wanted:
            continue
        s[0].append(line)
        s[1].append(_parse_time(row[time_col], f"{src}:{line}", header[time_col]))
        s[2].append(row[val_col])
    return series, False


def _read_wide(path: Path, header: list[str], rows: Iterator[tuple[int, list[str]]], zones: Sequence[str] | None) -> tuple[dict[str, _Series], bool]:
    src = str(path)
    if len(header) < 2:
        raise DataError(f"{src}:1", "wide format needs a time column and at least one zone column")
    names = header[1:]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise DataError(f"{src}:1", f"duplicate zone columns: {', '.join(dup)}")
    selected = list(names) if zones is None else [z for z in zones if z in names]
    cols = [header.index(z) for z in selected]
    lines: list[int] = []
    times: list[datetime] = []
    cells: list[list[str]] = [[] for _ in cols]
    ncol = len(header)
    for line, row in rows:
        if len(row) != ncol:
            raise DataError(f"{src}:{line}", f"expected {ncol} columns, got {len(row)}")
        lines.append(line)
        times.append(_parse_time(row[0], f"{src}:{line}", header[0]))
        for lst, c in zip(cells, cols):
            lst.append(row[c])
    series: dict[str, _Series] = {z: ([], [], []) for z in names}
    for z, vals in zip(selected, cells):
        series[z] = (lines, times, vals)
    return series, True


def _grid_index(src: str, what: str, lines: list[int], times: list[datetime], start: datetime, fill: str) -> np.ndarray:
    """Hour index of each entry; DataError on unsorted, duplicate, off-grid or (unless filling) missing hours."""
    idx = np.empty(len(times), dtype=np.int64)
    prev_t = None
    for k, t in enumerate(times):
        off = (t - start).total_seconds()
        if prev_t is not None and t <= prev_t:
            where = f"{src}:{lines[k]}"
            if t == prev_t:
                raise DataError(where, f"duplicate timestamp {t}{what} (also on line {lines[k - 1]})")
            raise DataError(where, f"timestamps not sorted: {t} comes after {prev_t} (line {lines[k - 1]}){what}")
        if off % SECONDS_PER_HOUR != 0:
            raise DataError(f"{src}:{lines[k]}", f"timestamp {t} is not on the hourly grid that starts at {start}")
        h = int(off // SECONDS_PER_HOUR)
        if prev_t is not None and fill == "none" and h != idx[k - 1] + 1:
            raise DataError(
                f"{src}:{lines[k]}",
                f"{h - idx[k - 1] - 1} missing hour(s){what} between {prev_t} (line {lines[k - 1]}) and {t}; "
                "fix the file or pass fill='ffill' or 'linear'",
            )
        idx[k] = h
        prev_t = t
    return idx


def _zone_values(src: str, zone: str, lines: list[int], times: list[datetime], cells: list[str], idx: np.ndarray,
                 hours: int, fill: str) -> tuple[np.ndarray, int]:
    """Hourly values of one zone on the grid; DataError naming the line of a bad value."""
    values = np.full(hours, np.nan)
    try:
        arr = np.asarray(cells, dtype=np.float64)
        fast = bool(np.all(np.isfinite(arr)) and np.all(arr >= 0) and np.all(arr <= MAX_INTENSITY_G_PER_KWH)
                    and not any("_" in c for c in cells))
    except ValueError:
        fast = False
    if fast:
        values[idx] = arr
    else:
        for k, cell in enumerate(cells):
            where = f"{src}:{lines[k]}"
            if is_missing(cell):
                if fill == "none":
                    raise DataError(where, f"missing value for zone {zone} at {times[k]}; fix the file or pass fill='ffill' or 'linear'")
                continue
            v = parse_float(cell, where, f"zone {zone} at {times[k]}", max_abs=MAX_INTENSITY_G_PER_KWH)
            if v < 0:
                raise DataError(where, f"negative carbon intensity {v} for zone {zone} at {times[k]}")
            values[idx[k]] = v
    missing = np.isnan(values)
    n_missing = int(missing.sum())
    if n_missing == 0:
        return values, 0
    if fill == "none":  # leading / trailing hours absent for this zone but present for others
        first = start_plus(times, idx, int(np.argmax(missing)))
        raise DataError(src, f"zone {zone} has no value for {n_missing} hour(s) the other zones cover (first: {first}); pass fill=... to fill them")
    known = np.flatnonzero(~missing)
    if known.size == 0:
        raise DataError(src, f"zone {zone} has no values at all")
    if fill == "ffill":
        pos = np.where(missing, 0, np.arange(hours))
        np.maximum.accumulate(pos, out=pos)
        pos[: known[0]] = known[0]  # leading gap: take the first measured value
        values = values[pos]
    else:  # linear
        values = np.interp(np.arange(hours), known, values[known])
    return values, n_missing


def start_plus(times: list[datetime], idx: np.ndarray, hour: int) -> datetime:
    """Timestamp of grid hour ``hour`` given one known (time, index) pair."""
    return times[0] + timedelta(hours=hour - int(idx[0]))


def load_carbon_trace(
    path: str | Path | None = None,
    *,
    kind: str = "lca",
    zones: Sequence[str] | None = None,
    interpolation: str = "step",
    fill: str | None = None,
    value_column: str | None = None,
) -> CarbonTrace:
    """Load hourly carbon intensity from an Electricity Maps-style CSV file.

    Two layouts are recognised from the header:

    * **wide**: a time column first (``datetime_utc``, ``Datetime (UTC)``, ...) and one column
      per zone (the packaged files);
    * **long**: a zone column (``zone``, ``Zone Id``, ...), a time column and a value column. The
      value column is found by name: one mentioning ``kind`` (e.g. Electricity Maps'
      ``Carbon Intensity gCO₂eq/kWh (LCA)``) or a generic ``value``/``carbon_intensity``;
      ``value_column`` names it explicitly.

    Timestamps are ISO-8601 (UTC if no offset is given; offsets are converted to UTC) and must
    form an hourly sequence, sorted, without duplicates; any year and any zones work.

    Args:
        path: CSV file; ``None`` = the packaged Electricity Maps 2023 file for ``kind``.
        kind: ``"lca"`` (life-cycle) or ``"direct"``; picks the packaged file or the value column.
        zones: zones to keep, in this order (default: every zone in the file).
        interpolation: ``"step"`` (hold the hourly value) or ``"linear"`` within each hour.
        fill: ``None``/``"none"`` (default: any missing hour or empty value is an error),
            ``"ffill"`` (repeat the previous hour) or ``"linear"`` (interpolate between the
            neighbouring hours). Filled values are counted in ``CarbonTrace.filled_values`` and
            reported with a :class:`UserWarning`.
        value_column: name of the value column of a long-format file.

    Raises:
        DataError: naming the file and line of a missing hour, a duplicate or unsorted
            timestamp, a negative, non-numeric or empty value.
        ConfigError: a requested zone is not in the file (listing the zones that are).
    """
    check_choice("carbon.kind", kind, CARBON_KINDS)
    check_choice("carbon.interpolation", interpolation, ("step", "linear"))
    fill = "none" if fill is None else fill
    check_choice("carbon.fill", fill, FILL_METHODS)
    packaged = path is None
    p = packaged_carbon_path(kind) if path is None else Path(path)
    if zones is not None:
        zones = [zones] if isinstance(zones, str) else list(zones)
        if len(set(zones)) != len(zones):
            raise ConfigError("carbon.zones", f"duplicate zones in {zones}")
    key = (str(p.resolve()) if p.exists() else str(p), _mtime(p), kind, tuple(zones) if zones is not None else None, fill, value_column)
    zone_names, start, values, n_filled = _load_cached(key) if packaged else _load_uncached(p, kind, zones, fill, value_column)
    if n_filled:
        warnings.warn(f"{p}: filled {n_filled} missing hourly value(s) with fill={fill!r}", UserWarning, stacklevel=2)
    return CarbonTrace(
        zones=zone_names, start_utc=start, hourly_g_per_kwh=values, interpolation=interpolation, kind=kind,
        source=str(p), filled_values=n_filled,
    )


def _mtime(p: Path) -> int:
    try:
        return p.stat().st_mtime_ns
    except OSError:
        return -1


@lru_cache(maxsize=16)
def _load_cached(key: tuple) -> tuple[tuple[str, ...], datetime, np.ndarray, int]:
    path, _, kind, zones, fill, value_column = key
    zone_names, start, values, n_filled = _load_uncached(Path(path), kind, zones, fill, value_column)
    values.flags.writeable = False
    return zone_names, start, values, n_filled


def _load_uncached(p: Path, kind: str, zones: Sequence[str] | None, fill: str,
                   value_column: str | None) -> tuple[tuple[str, ...], datetime, np.ndarray, int]:
    src = str(p)
    header, rows = read_rows(p)
    normed = [norm_name(h) for h in header]
    zone_col = next((normed.index(n) for n in _ZONE_NAMES if n in normed), None)
    if zone_col is not None:
        series, shared_time = _read_long(p, header, rows, zone_col, kind, value_column, zones)
    else:
        series, shared_time = _read_wide(p, header, rows, zones)
    available = tuple(series)
    if zones is None:
        zones = [z for z in available if series[z][0]]
    for z in zones:
        if z not in series:
            raise ConfigError("carbon.zones", f"zone {z!r} is not in {src}", allowed=available, source=src)
    zones = list(zones)
    if not zones or not any(series[z][0] for z in zones):
        raise DataError(src, "no data rows")
    for z in zones:
        if not series[z][0]:
            raise DataError(src, f"zone {z} has no rows")
    start = min(series[z][1][0] for z in zones)
    # validate each distinct time column once (wide files share one), then the values
    grid: dict[int, np.ndarray] = {}
    for z in zones:
        lines, times, _ = series[z]
        if id(times) not in grid:
            grid[id(times)] = _grid_index(src, "" if shared_time else f" for zone {z}", lines, times, start, fill)
    hours = int(max(g[-1] for g in grid.values())) + 1
    values = np.empty((hours, len(zones)))
    n_filled = 0
    for j, z in enumerate(zones):
        lines, times, cells = series[z]
        values[:, j], nf = _zone_values(src, z, lines, times, cells, grid[id(times)], hours, fill)
        n_filled += nf
    return tuple(zones), start, values, n_filled


def parse_start_utc(start: str | datetime, field_name: str = "carbon.start_utc") -> datetime:
    """Parse an ISO-8601 start time (``"2023-06-01T00:00:00Z"``) into a naive UTC datetime."""
    if isinstance(start, datetime):
        return start if start.tzinfo is None else start.astimezone(timezone.utc).replace(tzinfo=None)
    try:
        return parse_utc(str(start))
    except ValueError:
        raise ConfigError(field_name, f"cannot parse {start!r} as an ISO-8601 date-time", allowed="e.g. '2023-06-01T00:00:00Z'") from None


def carbon_offset_s(trace: CarbonTrace, start: str | datetime, field_name: str = "carbon.start_utc") -> float:
    """Seconds from the trace's first hour to an episode start (ISO string or datetime, UTC).

    Raises :class:`ConfigError` naming ``field_name`` if the start lies outside the trace.
    """
    t = parse_start_utc(start, field_name)
    off = (t - trace.start_utc).total_seconds()
    if not (0.0 <= off < trace.period_s):
        raise ConfigError(
            field_name, f"{t.isoformat()} is outside the carbon trace",
            allowed=f"{trace.start_utc.isoformat()} <= start < {trace.end_utc.isoformat()}", source=trace.source or None,
        )
    return off


class CarbonForecaster:
    """Imperfect forecasts of the next hours' carbon intensity, for forecast-aware policies.

    At time ``t_s`` (carbon time, seconds since the trace start) the forecast covers the
    ``horizon_h`` hourly values that follow the current hour, i.e. hours ``h+1 .. h+horizon_h``
    with ``h = floor(t_s / 3600)`` (wrapping around the trace like :class:`CarbonTrace`).

    Error model: multiplicative log-normal noise whose log is a random walk over lead time,
    ``forecast_k = actual_k * exp(e_k - var_k / 2)``, ``e_k = sigma * (eps_1 + ... + eps_k)``,
    ``eps ~ N(0, 1)`` i.i.d. per zone, so the relative error has standard deviation about
    ``sigma * sqrt(k)`` at lead ``k`` hours, the forecast is unbiased in the mean, never negative,
    and errors at neighbouring leads are correlated as in real forecasts. ``sigma = 0`` gives
    the exact future values. The noise of a forecast issued in hour ``h`` depends only on
    ``(seed, h)``: deterministic, whatever the order of calls.

    Args:
        trace: the actual intensities.
        horizon_h: number of future hours, >= 1.
        error_std_frac: ``sigma``, the relative error at a lead of one hour (e.g. 0.05), >= 0.
        seed: seed of the forecast noise.
    """

    def __init__(self, trace: CarbonTrace, horizon_h: int = 24, error_std_frac: float = 0.0, seed: int = 0):
        if isinstance(horizon_h, bool) or not isinstance(horizon_h, (int, np.integer)) or horizon_h < 1:
            raise ConfigError("carbon.forecast_horizon_h", f"must be an integer >= 1, got {horizon_h!r}")
        self.trace = trace
        self.horizon_h = int(horizon_h)
        self.error_std_frac = check_finite_nonneg("carbon.forecast_error_std_frac", error_std_frac)
        self.seed = int(seed)
        self._cache: tuple[int, np.ndarray] | None = None

    def issue_hour(self, t_s: float) -> int:
        """Index of the hour (since the trace start, not wrapped) in which a forecast at ``t_s`` is issued."""
        return int(np.floor(t_s / SECONDS_PER_HOUR))

    def forecast_times_s(self, t_s: float) -> np.ndarray:
        """Carbon times (s) of the starts of the forecast hours at ``t_s``, shape (horizon_h,)."""
        h = self.issue_hour(t_s)
        return (h + 1 + np.arange(self.horizon_h)) * SECONDS_PER_HOUR

    def actual(self, t_s: float) -> np.ndarray:
        """The true hourly values the forecast at ``t_s`` estimates, shape (horizon_h, zones)."""
        h = self.issue_hour(t_s)
        rows = (h + 1 + np.arange(self.horizon_h)) % self.trace.hours
        return self.trace.hourly_g_per_kwh[rows]

    def forecast(self, t_s: float) -> np.ndarray:
        """Forecast gCO2eq/kWh for the next ``horizon_h`` hours, shape (horizon_h, zones)."""
        h = self.issue_hour(t_s)
        if self._cache is not None and self._cache[0] == h:
            return self._cache[1].copy()
        truth = self.actual(t_s)
        if self.error_std_frac == 0.0:
            out = truth.copy()
        else:
            if h < 0:
                raise ConfigError("t_s", f"forecast time must be >= 0, got {t_s}")
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, h])))
            eps = rng.standard_normal(truth.shape)
            sigma = self.error_std_frac
            e = sigma * np.cumsum(eps, axis=0)
            var = sigma * sigma * np.arange(1, self.horizon_h + 1)[:, None]
            # math.exp (the C library's, element by element), not np.exp: numpy's AVX-512 exp differs from
            # its AVX2 / scalar one in the last bit of ~5% of values, so forecasts (and the decisions
            # read from them) would depend on the CPU (tests/test_reproducible.py)
            factor = np.array([math.exp(v) for v in (e - 0.5 * var).ravel().tolist()]).reshape(truth.shape)
            out = truth * factor
        self._cache = (h, out)
        return out.copy()
