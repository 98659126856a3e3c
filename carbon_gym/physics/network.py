"""Network model: one-way delay between a request's origin region and a datacenter.

Delay of a message of ``b`` bytes = RTT/2 + b / bandwidth. Prompts are sent uplink when the
scheduler places a request; generated tokens stream back downlink (each token is a few bytes,
so the downlink delay is RTT/2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .._csv import is_missing, parse_float, read_rows
from .._toml import data_path
from ..errors import ConfigError, DataError, check_finite_nonneg


@dataclass(frozen=True)
class Network:
    """One-way delays from origin regions to datacenters.

    Attributes:
        one_way_s: array (regions, datacenters) of RTT/2 in seconds.
        bandwidth_bytes_per_s: per-request transfer bandwidth in bytes/s (default 10 Gb/s).
        bytes_per_token: bytes of prompt text per token (UTF-8 text is ~4 bytes per token).
    """

    one_way_s: np.ndarray
    bandwidth_bytes_per_s: float = 1.25e9
    bytes_per_token: float = 4.0

    def __post_init__(self) -> None:
        a = np.asarray(self.one_way_s, dtype=np.float64)
        if a.ndim != 2 or not np.all(np.isfinite(a)) or np.any(a < 0):
            raise ConfigError("network.one_way_s", "must be a 2-D array of finite delays >= 0 seconds")
        if not (self.bandwidth_bytes_per_s > 0):
            raise ConfigError("network.bandwidth_bytes_per_s", "must be > 0")
        object.__setattr__(self, "one_way_s", a)

    @property
    def n_regions(self) -> int:
        """Number of origin regions."""
        return int(self.one_way_s.shape[0])

    @property
    def n_datacenters(self) -> int:
        """Number of datacenters."""
        return int(self.one_way_s.shape[1])

    def uplink_s(self, origin: int, datacenter: int, prompt_tokens: int) -> float:
        """Seconds for a prompt of ``prompt_tokens`` to reach ``datacenter`` from ``origin``."""
        return float(self.one_way_s[origin, datacenter] + prompt_tokens * self.bytes_per_token / self.bandwidth_bytes_per_s)

    def downlink_s(self, origin: int, datacenter: int) -> float:
        """Seconds for a generated token to reach the client in ``origin`` from ``datacenter``."""
        return float(self.one_way_s[origin, datacenter])

    def uplink_matrix_s(self, origins: np.ndarray, prompt_tokens: np.ndarray) -> np.ndarray:
        """Uplink delays (requests x datacenters) for vectors of origins and prompt lengths."""
        o = np.asarray(origins, dtype=np.int64)
        p = np.asarray(prompt_tokens, dtype=np.float64)
        return self.one_way_s[o] + (p * self.bytes_per_token / self.bandwidth_bytes_per_s)[:, None]


# ===================================================================================== builders

METRO_RTT_MS = 8.0
"""RTT used inside one metro / GCP region (the shared data's guidance is 5-10 ms)."""


def packaged_rtt_path() -> Path:
    """Path of the packaged zone-to-zone RTT matrix (ms, via each zone's nearest GCP region)."""
    return data_path("network", "zone_rtt_matrix_ms_via_gcp.csv")


def load_zone_rtt_ms(path: str | Path | None = None, *, metro_rtt_ms: float = METRO_RTT_MS) -> tuple[tuple[str, ...], np.ndarray]:
    """Read a square zone RTT matrix in milliseconds.

    Format: header ``from_zone,<zone 1>,...,<zone n>``, then one row per zone in the same order.
    A blank cell means "same cloud region" and a 0 on the diagonal means "same place": both
    become ``metro_rtt_ms`` (a metro round trip, 8 ms by default). Asymmetric entries are kept.

    Returns:
        (zones, rtt_ms) with ``rtt_ms`` of shape (n, n).
    """
    p = Path(path) if path is not None else packaged_rtt_path()
    metro = check_finite_nonneg("network.metro_rtt_ms", metro_rtt_ms)
    header, rows = read_rows(p)
    zones = tuple(h.strip() for h in header[1:])
    if not zones:
        raise DataError(f"{p}:1", "no zone columns")
    dup = sorted({z for z in zones if zones.count(z) > 1})
    if dup:
        raise DataError(f"{p}:1", f"duplicate zone columns: {', '.join(dup)} (allowed: each zone once)")
    mat = np.full((len(zones), len(zones)), np.nan)
    seen: list[str] = []
    for line, row in rows:
        where = f"{p}:{line}"
        if len(row) != len(zones) + 1:
            raise DataError(where, f"expected {len(zones) + 1} columns, got {len(row)}")
        z = row[0].strip()
        if z not in zones:
            raise DataError(where, f"row zone {z!r} is not among the column zones")
        if z in seen:
            raise DataError(where, f"duplicate row for zone {z!r}")
        i = zones.index(z)
        seen.append(z)
        for j, cell in enumerate(row[1:]):
            if not cell.strip():  # blank: same cloud region
                mat[i, j] = metro
                continue
            if is_missing(cell):
                raise DataError(where, f"RTT {z} -> {zones[j]}: {cell.strip()!r} is not a number (allowed: milliseconds "
                                ">= 0, or a blank cell for the same cloud region)")
            v = parse_float(cell, where, f"RTT {z} -> {zones[j]}")
            if v < 0:
                raise DataError(where, f"negative RTT {v} ms for {z} -> {zones[j]}")
            mat[i, j] = metro if (i == j and v == 0) else v
    missing = [z for z in zones if z not in seen]
    if missing:
        raise DataError(str(p), f"no row for zone(s) {', '.join(missing)}")
    return zones, mat


def network_from_zones(
    client_zones: Sequence[str],
    datacenter_zones: Sequence[str],
    *,
    rtt_path: str | Path | None = None,
    metro_rtt_ms: float = METRO_RTT_MS,
    rtt_overrides_ms: Mapping[int, Sequence[float]] | None = None,
    **network_kwargs: float,
) -> Network:
    """Build a :class:`Network` with ``one_way_s[r, d] = RTT(client_zones[r], datacenter_zones[d]) / 2``.

    Args:
        client_zones: zone where each region's clients sit (one per region).
        datacenter_zones: grid zone of each datacenter.
        rtt_path: RTT matrix file (default: the packaged GCP-derived matrix).
        metro_rtt_ms: RTT for blank (same cloud region) and diagonal entries, ms.
        rtt_overrides_ms: optional ``{region index: [rtt_ms per datacenter]}`` replacing that
            region's row (for zones the matrix does not cover).
        network_kwargs: ``bandwidth_bytes_per_s`` / ``bytes_per_token`` passed to :class:`Network`.
    """
    zones, mat = load_zone_rtt_ms(rtt_path, metro_rtt_ms=metro_rtt_ms)
    overrides = dict(rtt_overrides_ms or {})
    out = np.empty((len(client_zones), len(datacenter_zones)))
    for r, cz in enumerate(client_zones):
        if r in overrides:
            row = np.asarray(overrides[r], dtype=np.float64)
            if row.shape != (len(datacenter_zones),) or not np.all(np.isfinite(row)) or np.any(row < 0):
                raise ConfigError(f"network.rtt_ms[{r}]", f"needs {len(datacenter_zones)} finite RTTs >= 0 in ms, got {overrides[r]!r}")
            out[r] = row
            continue
        if cz not in zones:
            raise ConfigError(f"network.client_zones[{r}]", f"zone {cz!r} has no RTT data", allowed=zones)
        i = zones.index(cz)
        for d, dz in enumerate(datacenter_zones):
            if dz not in zones:
                raise ConfigError(f"network.datacenter_zones[{d}]", f"zone {dz!r} has no RTT data", allowed=zones)
            out[r, d] = mat[i, zones.index(dz)]
    return Network(one_way_s=out / 2000.0, **network_kwargs)
