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

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from ..errors import ConfigError

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
    """

    zones: tuple[str, ...]
    start_utc: datetime
    hourly_g_per_kwh: np.ndarray
    interpolation: str = "step"
    kind: str = "lca"
    source: str = ""
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
