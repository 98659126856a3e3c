"""Topology: regions, datacenters, nodes and GPUs, and the grid zone each datacenter draws from."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class DatacenterSpec:
    """One datacenter.

    Attributes:
        name: unique name, e.g. ``"eu-fr"``.
        region: name of the region it belongs to (must be in ``Topology.regions``).
        zone: Electricity Maps grid zone it draws power from, e.g. ``"FR"``.
        pue: power usage effectiveness (facility power / IT power), >= 1.
        nodes: servers serving the model.
        gpus_per_node: GPUs per server.
        gpu: GPU type of its nodes when it differs from the topology's (``""``: ``Topology.gpu``).
    """

    name: str
    region: str
    zone: str
    pue: float = 1.1
    nodes: int = 4
    gpus_per_node: int = 8
    gpu: str = ""

    @property
    def gpus(self) -> int:
        """Total GPUs in this datacenter."""
        return self.nodes * self.gpus_per_node

    def engines(self, tp: int) -> int:
        """Serving engines of ``tp`` GPUs each (the simulator's count: whole engines only)."""
        return self.gpus // int(tp)


@dataclass(frozen=True)
class Topology:
    """Regions (where traffic originates) and datacenters (where it is served).

    Attributes:
        regions: region names; requests originate in one of them.
        datacenters: the datacenters, in index order (datacenter ``i`` is action ``i``).
        gpu: GPU type name (key of ``gpus.toml``) of every datacenter that names no other.
    """

    regions: tuple[str, ...]
    datacenters: tuple[DatacenterSpec, ...]
    gpu: str = "a100-80gb"

    def __post_init__(self) -> None:
        object.__setattr__(self, "regions", tuple(self.regions))
        object.__setattr__(self, "datacenters", tuple(self.datacenters))
        if not self.regions:
            raise ConfigError("topology.regions", "needs at least one region")
        if not self.datacenters:
            raise ConfigError("topology.datacenters", "needs at least one datacenter")
        names = [d.name for d in self.datacenters]
        if len(set(names)) != len(names):
            raise ConfigError("topology.datacenters", f"duplicate datacenter names in {names}")
        for i, d in enumerate(self.datacenters):
            if d.region not in self.regions:
                raise ConfigError(f"topology.datacenters[{i}].region", f"unknown region {d.region!r}", allowed=self.regions)
            if d.nodes < 1 or d.gpus_per_node < 1:
                raise ConfigError(f"topology.datacenters[{i}]", "nodes and gpus_per_node must be >= 1")
            if not (d.pue >= 1.0):
                raise ConfigError(f"topology.datacenters[{i}].pue", f"must be >= 1, got {d.pue}")

    @property
    def n_datacenters(self) -> int:
        """Number of datacenters."""
        return len(self.datacenters)

    @property
    def n_regions(self) -> int:
        """Number of regions."""
        return len(self.regions)

    def datacenter_gpu(self, i: int) -> str:
        """GPU type of datacenter ``i``'s nodes."""
        return self.datacenters[i].gpu or self.gpu

    def gpu_types(self) -> tuple[str, ...]:
        """The distinct GPU types of the datacenters, in first-use order."""
        return tuple(dict.fromkeys(self.datacenter_gpu(i) for i in range(len(self.datacenters))))

    def region_index(self, region: str) -> int:
        """Index of ``region``; :class:`ConfigError` if unknown."""
        try:
            return self.regions.index(region)
        except ValueError:
            raise ConfigError("region", f"unknown region {region!r}", allowed=self.regions) from None
