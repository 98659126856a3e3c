"""Network model: one-way delay between a request's origin region and a datacenter.

Delay of a message of ``b`` bytes = RTT/2 + b / bandwidth. Prompts are sent uplink when the
scheduler places a request; generated tokens stream back downlink (each token is a few bytes,
so the downlink delay is RTT/2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


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
