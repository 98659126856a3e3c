"""Scenarios: topology + model + SLO + workload + carbon + timing + seed, in a TOML file.

``load_scenario("llama8b-moderate")`` reads ``carbon_gym/scenarios/llama8b-moderate.toml``;
``load_scenario("path/to/my.toml", overrides={"workload.rate_per_s": 50})`` reads a user file
and replaces fields by dotted name. The schema is strict: an unknown key, a value of the wrong
type or out of range raises :class:`~carbon_gym.errors.ConfigError` naming the dotted field and
the file. See ``carbon_gym/scenarios/README.md`` for an annotated example.

Load levels: ``workload.load = "low" | "moderate" | "high"`` sets the total request rate to a
fraction of the cluster's measured capacity (``carbon_gym/data/load_levels.toml``): the
per-engine rate at which one engine keeps p99 TTFT and TPOT within the SLO, times the number of
engines. ``workload.rate_per_s`` sets the rate directly; an override of one clears the other.

The default topology (``topology.preset = "default"``) is the study's 4 regions x 4 datacenters
x 4 nodes x 8 A100-80GB, on these Electricity Maps grid zones (2023 LCA means, gCO2eq/kWh):

==============  ==============================================================
north_america   US-CAL-CISO 261, US-TEX-ERCO 381, US-MIDA-PJM 392, CA-ON 73
europe          DE 367, GB 188, FR 49, NO 34
asia_pacific    JP-TK 540, KR 440, SG 488, IN-WE 749
southern        AU-NSW 554, AU-VIC 504, BR-CS 90, CL-SEN 276
==============  ==============================================================

Why these 16: every one has measured RTTs in the packaged GCP-derived matrix; together they
span a 22x range of carbon intensity (NO 34 to IN-WE 749), every region mixes green and dirty
grids so that shifting load inside a region matters as well as across regions, and the
solar-heavy zones (CISO, DE, AU-NSW/VIC, CL-SEN) give a strong diurnal pattern whose minimum
moves with the sun. JP-TK and IN-WE are Electricity Maps model estimates (not measured).
Each region's clients sit at its first zone (Los Angeles, Frankfurt, Tokyo, Sydney).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from ._csv import parse_float, read_rows
from ._toml import data_path, load_toml, loads_toml, toml_value
from .errors import ConfigError, DataError
from .load_levels import (  # noqa: F401  (re-exported: the load levels used to live here)
    LEVEL_BASES, Capacity, LoadLevels, capacity_key, load_levels_path, load_load_levels, load_rate_per_s,
)
from .schema import Ctx, boolean, integer, list_of, num, parse_table, raw_tables, spec, string, table_of, tables_of
from .gpus import GpuFilesConfig, gpu_files_table, gpu_spec_of, resolve_gpu_files
from .topology import DatacenterSpec, Topology
from .sessions import SessionsConfig, is_prefix_workload, resolve_prefix_workload

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

# ----------------------------------------------------------------------------- geography


@dataclass(frozen=True)
class ZoneInfo:
    """Facts about one grid zone (``carbon_gym/data/zones/zones.csv``).

    Attributes:
        zone: Electricity Maps zone id.
        city: where a datacenter / client in this zone is assumed to be.
        utc_offset_h: standard-time UTC offset of that city, hours.
        pue: PUE assigned to a datacenter in this zone (see the data README for the mapping).
        pue_basis: how that PUE was chosen.
    """

    zone: str
    city: str
    utc_offset_h: float
    pue: float
    pue_basis: str


@lru_cache(maxsize=1)
def zone_table() -> dict[str, ZoneInfo]:
    """Zone facts for every zone in the packaged data."""
    path = data_path("zones", "zones.csv")
    header, rows = read_rows(path)
    col = {h: i for i, h in enumerate(header)}
    out: dict[str, ZoneInfo] = {}
    for line, row in rows:
        where = f"{path}:{line}"
        out[row[col["zone"]]] = ZoneInfo(
            zone=row[col["zone"]], city=row[col["city"]],
            utc_offset_h=parse_float(row[col["utc_offset_h"]], where, "utc_offset_h"),
            pue=parse_float(row[col["pue"]], where, "pue"), pue_basis=row[col["pue_basis"]],
        )
    return out


def zone_info(zone: str, field_name: str = "zone") -> ZoneInfo:
    """:class:`ZoneInfo` of ``zone``; :class:`ConfigError` listing the known zones otherwise."""
    table = zone_table()
    if zone not in table:
        raise ConfigError(field_name, f"no packaged facts (PUE, UTC offset) for zone {zone!r}; give them explicitly", allowed=sorted(table))
    return table[zone]


DEFAULT_REGIONS: dict[str, tuple[str, ...]] = {
    "north_america": ("US-CAL-CISO", "US-TEX-ERCO", "US-MIDA-PJM", "CA-ON"),
    "europe": ("DE", "GB", "FR", "NO"),
    "asia_pacific": ("JP-TK", "KR", "SG", "IN-WE"),
    "southern": ("AU-NSW", "AU-VIC", "BR-CS", "CL-SEN"),
}
"""The study's regions and their datacenters' zones; clients sit at each region's first zone."""


@dataclass(frozen=True)
class RegionSpec:
    """Where a region's clients are.

    Attributes:
        name: region name.
        client_zone: zone whose location the clients share (for RTTs).
        utc_offset_h: clients' UTC offset, hours (for the diurnal profile).
        rtt_ms: optional RTT from the clients to each datacenter, ms (overrides the matrix).
    """

    name: str
    client_zone: str
    utc_offset_h: float
    rtt_ms: tuple[float, ...] | None = None


def datacenter_name(zone: str) -> str:
    """Default datacenter name for a zone: lower-case zone id (``"US-CAL-CISO"`` -> ``"us-cal-ciso"``)."""
    return zone.lower()


def default_topology(nodes_per_datacenter: int = 4, gpus_per_node: int = 8, gpu: str = "a100-80gb",
                     regions: Sequence[str] | None = None, datacenters_per_region: int = 4) -> Topology:
    """The study topology (4 regions x 4 datacenters x ``nodes_per_datacenter`` x ``gpus_per_node``).

    ``regions`` keeps a subset of :data:`DEFAULT_REGIONS` (in their standard order) and
    ``datacenters_per_region`` keeps the first k zones of each; PUE per datacenter from the
    zone table.
    """
    names = list(DEFAULT_REGIONS) if regions is None else list(regions)
    for i, r in enumerate(names):
        if r not in DEFAULT_REGIONS:
            raise ConfigError(f"topology.only_regions[{i}]", f"unknown default region {r!r}", allowed=list(DEFAULT_REGIONS))
    if not 1 <= datacenters_per_region <= 4:
        raise ConfigError("topology.datacenters_per_region", f"must be 1..4, got {datacenters_per_region}")
    names = [r for r in DEFAULT_REGIONS if r in names]
    dcs = [
        DatacenterSpec(name=datacenter_name(z), region=r, zone=z, pue=zone_info(z).pue, nodes=nodes_per_datacenter, gpus_per_node=gpus_per_node)
        for r in names for z in DEFAULT_REGIONS[r][:datacenters_per_region]
    ]
    return Topology(regions=tuple(names), datacenters=tuple(dcs), gpu=gpu)


def default_region_specs(regions: Sequence[str] | None = None) -> tuple[RegionSpec, ...]:
    """Client locations of the default regions (first zone of each region)."""
    names = [r for r in DEFAULT_REGIONS if regions is None or r in regions]
    return tuple(RegionSpec(r, DEFAULT_REGIONS[r][0], zone_info(DEFAULT_REGIONS[r][0]).utc_offset_h) for r in names)


# ----------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class RegionConfig:
    """A custom region: where its clients sit."""

    name: str = spec(string(pattern=r"[A-Za-z0-9_.-]+"), "region name")
    client_zone: str = spec(string(), "grid zone whose location the clients share (for RTTs)")
    utc_offset_h: float | None = spec(num(-12, 14), "clients' UTC offset in hours (default: from the zone table)", None)
    rtt_ms: tuple[float, ...] | None = spec(list_of(num(0, 2000)), "RTT to each datacenter in ms (default: zone RTT matrix)", None)


@dataclass(frozen=True)
class DatacenterConfig:
    """A custom datacenter."""

    name: str = spec(string(pattern=r"[A-Za-z0-9_.-]+"), "unique datacenter name")
    region: str = spec(string(), "region it belongs to")
    zone: str = spec(string(), "Electricity Maps grid zone it draws power from")
    nodes: int | None = spec(integer(1, 10_000), "servers (default: topology.nodes_per_datacenter)", None)
    pue: float | None = spec(num(1.0, 3.0), "power usage effectiveness (default: from the zone table)", None)
    gpu: str | None = spec(string(), "GPU of this datacenter's nodes: a key of data/gpus.toml or of [gpu_files] "
                           "(default: the scenario's gpu)", None)


@dataclass(frozen=True)
class TopologyConfig:
    """Which datacenters serve, and where clients are."""

    preset: str = spec(string(("default", "custom")), "'default' = study topology, 'custom' = the tables below", "default")
    only_regions: tuple[str, ...] | None = spec(list_of(string(tuple(DEFAULT_REGIONS)), min_len=1), "default preset: keep these regions", None)
    datacenters_per_region: int = spec(integer(1, 4), "default preset: first k zones of each region", 4)
    nodes_per_datacenter: int = spec(integer(1, 10_000), "servers per datacenter", 4)
    metro_rtt_ms: float = spec(num(0, 100), "RTT inside one metro / cloud region, ms", 8.0)
    regions: tuple[RegionConfig, ...] = spec(tables_of(RegionConfig), "custom preset: [[topology.regions]]", ())
    datacenters: tuple[DatacenterConfig, ...] = spec(tables_of(DatacenterConfig), "custom preset: [[topology.datacenters]]", ())


@dataclass(frozen=True)
class SloConfig:
    """Latency targets, checked per request (MLPerf Server: p99)."""

    ttft_s: float | None = spec(num(1e-3, 600), "time to first token target, s (default: MLPerf for the model)", None)
    tpot_s: float | None = spec(num(1e-5, 10), "time per output token target, s (default: MLPerf for the model)", None)


@dataclass(frozen=True)
class WorkloadConfig:
    """Arrivals, lengths and regional traffic."""

    arrival: str = spec(string(("poisson", "gamma", "replay", "sessions")), "arrival process ('sessions': multi-turn, "
                        "carbon_gym.sessions)", "poisson")
    load: str | None = spec(string(("low", "moderate", "high")), "load level; sets rate_per_s from data/load_levels.toml", None)
    rate_per_s: float | None = spec(num(0, 1e7, lo_open=True), "mean total request rate over all regions, requests/s", None)
    cv: float = spec(num(0, 100, lo_open=True), "gamma: coefficient of variation of inter-arrival times", 2.0)
    trace: str = spec(string(), "replay: azure-conv | azure-code | mooncake-conv | mooncake-synth | a CSV with TIMESTAMP "
                      "| a Mooncake .jsonl[.gz]", "azure-conv")
    time_scale: float | None = spec(num(0, 1e6, lo_open=True), "replay: factor on inter-arrival times (default: from rate_per_s)", None)
    lengths: str = spec(string(), "azure-conv | azure-code | sharegpt | arxiv | fixed | trace (replay) | CSV path", "azure-conv")
    prompt_tokens: int = spec(integer(1, 10_000_000), "lengths = 'fixed': prompt tokens", 512)
    output_tokens: int = spec(integer(1, 10_000_000), "lengths = 'fixed': output tokens", 128)
    max_context_tokens: int = spec(integer(2, 10_000_000), "cap on prompt + output tokens", 8192)
    cap_policy: str = spec(string(("resample", "clip")), "how the cap is enforced", "resample")
    region_shares: tuple[float, ...] | None = spec(list_of(num(0, 1), min_len=1), "share of traffic per region (default: equal)", None)
    diurnal_amplitude: float = spec(num(0, 1), "0 = flat; A in rate x (1 + A cos(2 pi (local hour - peak) / 24))", 0.0)
    diurnal_peak_hour: float = spec(num(0, 24), "local hour of the daily peak", 14.0)
    block_s: float = spec(num(1, 86400), "generation block length, s (determinism unit; each block costs a draw)", 60.0)
    sessions: SessionsConfig = spec(table_of(SessionsConfig), "[workload.sessions]: prefix workloads (carbon_gym.sessions)",
                                    SessionsConfig())


@dataclass(frozen=True)
class CarbonConfig:
    """Carbon-intensity trace and forecasts."""

    file: str = spec(string(), "'packaged' (Electricity Maps 2023) or a CSV path (relative to this file)", "packaged")
    kind: str = spec(string(("lca", "direct")), "life-cycle or direct (operational) intensity", "lca")
    interpolation: str = spec(string(("step", "linear")), "within each hour", "step")
    start_utc: str = spec(string(), "episode start, ISO-8601 UTC (e.g. 2023-06-01T00:00:00Z)", "2023-06-01T00:00:00Z")
    fill: str = spec(string(("none", "ffill", "linear")), "fill missing hours (reported) instead of failing", "none")
    forecast_horizon_h: int = spec(integer(1, 24 * 14), "hours of forecast offered to policies", 24)
    forecast_error_std_frac: float = spec(num(0, 5), "relative forecast error at 1 h lead (grows as sqrt(lead))", 0.0)


@dataclass(frozen=True)
class EngineSection:
    """vLLM-like engine settings (carbon_gym.sim.EngineConfig) and the dispatcher."""

    tp: int | None = spec(integer(1, 64), "GPUs per engine (default: the model's default_tp)", None)
    block_tokens: int = spec(integer(1, 1024), "paged KV block size, tokens", 16)
    gpu_memory_utilization: float = spec(num(0, 1, lo_open=True), "fraction of GPU memory for weights + KV", 0.9)
    max_num_seqs: int = spec(integer(1, 65536), "max running sequences per engine", 256)
    max_num_batched_tokens: int = spec(integer(1, 1_000_000), "per-iteration token budget", 2048)
    chunked_prefill: bool = spec(boolean(), "mix prefill chunks with decodes", True)
    max_model_len: int = spec(integer(2, 10_000_000), "prompt + output cap of the engine, tokens", 32768)
    prefix_caching: bool = spec(boolean(), "automatic prefix caching per engine (carbon_gym.sim.prefix_cache; requests of a "
                                "prefix workload reuse cached prompt blocks; prefix block = workload.sessions.prefix_block_tokens)",
                                False)
    dispatcher: str = spec(string(), "engine choice inside a datacenter: a registered dispatcher "
                           "(carbon_gym.sim.dispatch: least_work, most_free_kv, or one added with register_dispatcher)",
                           "least_work")


@dataclass(frozen=True)
class EnvConfig:
    """Gymnasium environment settings."""

    max_pending: int = spec(integer(1, 100_000), "K: requests shown to the agent per step", 64)
    carbon_weight: float = spec(num(0, 1e6), "reward weight of carbon (per kg CO2eq)", 1.0)
    slo_weight: float = spec(num(0, 1e6), "lambda: reward weight of SLO violations", 1.0)
    predictor: str = spec(string(("oracle", "binned")), "output-length predictor", "binned")
    measure: str = spec(string(("episode", "window")), "what the episode metrics cover: 'episode' (from t = 0 through the "
                        "drain) or 'window' (from warmup_s to duration_s, no drain)", "episode")
    warmup_s: float = spec(num(0, 366 * 86400), "measure = 'window': simulated burn-in before the window, not counted, s "
                           "(a multiple of polling_period_s)", 0.0)


def _scalar_table(v: Any, path: str, ctx: Ctx) -> tuple[tuple[str, Any], ...]:
    """A table of scalar settings (numbers, strings, booleans), kept as sorted (key, value) pairs."""
    if not isinstance(v, Mapping):
        raise ctx.err(path, f"expected a table of settings, got {v!r}")
    for k, x in v.items():
        if not isinstance(x, (int, float, str, bool)):
            raise ctx.err(f"{path}.{k}", f"expected a number, string or boolean, got {x!r}")
    return tuple(sorted(v.items()))


@dataclass(frozen=True)
class CapacitySection:
    """Capacity control: how many engines are awake and servers on per datacenter
    (:mod:`carbon_gym.sim.capacity`, :mod:`carbon_gym.autoscalers`)."""

    control: str = spec(string(pattern=r"[A-Za-z0-9_.:-]+"), "who decides the awake engines and servers: 'always_on' "
                        "(every engine awake, the default), 'agent' (the policy: the env's action gains capacity "
                        "targets) or a built-in autoscaler ('reactive', 'carbon-aware'; carbon_gym.autoscalers)",
                        "always_on")
    period_s: float = spec(num(0, 86400, lo_open=True), "seconds between capacity decisions (a multiple of "
                           "polling_period_s)", 30.0)
    params: tuple[tuple[str, Any], ...] = spec(_scalar_table, "[capacity.params]: the autoscaler's settings "
                                               "(see carbon_gym.autoscalers)", ())

    def params_dict(self) -> dict[str, Any]:
        """The autoscaler's settings as a dict."""
        return dict(self.params)


MLPERF_SLO: dict[str, tuple[float, float]] = {
    "llama-3.1-8b": (2.0, 0.1),
    "qwen2.5-7b": (2.0, 0.1),  # no MLPerf benchmark: Llama-3.1-8B targets
    "mixtral-8x7b": (2.0, 0.2),
}
"""(TTFT s, TPOT s) MLPerf Inference Server targets per model (p99)."""


@dataclass(frozen=True)
class Scenario:
    """A complete, validated experiment description (see module docstring)."""

    name: str = spec(string(pattern=r"[A-Za-z0-9_.+-]+"), "scenario name")
    model: str = spec(string(), "model (key of data/models.toml)")
    description: str = spec(string(), "free text", "")
    gpu: str = spec(string(), "GPU (key of data/gpus.toml or of [gpu_files])", "a100-80gb")
    gpu_files: tuple[tuple[str, GpuFilesConfig], ...] = spec(
        gpu_files_table, "[gpu_files.<gpu name>]: a GPU's spec / latency / power files by path (relative to this file)", ())
    duration_s: float = spec(num(0, 366 * 86400, lo_open=True), "episode length, s", 3600.0)
    polling_period_s: float = spec(num(0, 3600, lo_open=True), "scheduler decision interval, s", 1.0)
    seed: int = spec(integer(0, 2**63 - 1), "base seed", 0)
    topology: TopologyConfig = spec(table_of(TopologyConfig), "[topology]", TopologyConfig())
    slo: SloConfig = spec(table_of(SloConfig), "[slo]", SloConfig())
    workload: WorkloadConfig = spec(table_of(WorkloadConfig), "[workload]", WorkloadConfig())
    carbon: CarbonConfig = spec(table_of(CarbonConfig), "[carbon]", CarbonConfig())
    engine: EngineSection = spec(table_of(EngineSection), "[engine]", EngineSection())
    env: EnvConfig = spec(table_of(EnvConfig), "[env]", EnvConfig())
    capacity: CapacitySection = spec(table_of(CapacitySection), "[capacity]: engines and servers that sleep and wake",
                                     CapacitySection())
    faults: tuple[dict, ...] = spec(raw_tables(), "[[faults]]: outages, links, carbon-feed gaps, drains (see carbon_gym.faults)", ())
    source: str = ""
    resolved_rate_per_s: float = 0.0
    rate_source: str = ""

    @property
    def tp(self) -> int:
        """Tensor-parallel degree (resolved)."""
        assert self.engine.tp is not None
        return self.engine.tp

    @property
    def ttft_s(self) -> float:
        """TTFT target, s (resolved)."""
        assert self.slo.ttft_s is not None
        return self.slo.ttft_s

    @property
    def tpot_s(self) -> float:
        """TPOT target, s (resolved)."""
        assert self.slo.tpot_s is not None
        return self.slo.tpot_s

    @property
    def rate_per_s(self) -> float:
        """Mean total request rate, requests/s: ``workload.rate_per_s``, or the rate ``workload.load``
        gives on this cluster (the capacity measured for this model, GPU and TP), or the replayed
        trace's rate; :attr:`rate_source` says which, with the numbers."""
        return self.resolved_rate_per_s

    def replace(self, **changes: Any) -> Scenario:
        """A copy with top-level fields replaced (no re-validation; prefer ``overrides``)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (TOML-compatible: ``None`` fields are omitted)."""
        return _to_plain(self)

    def to_toml(self) -> str:
        """TOML text that :func:`load_scenario` reads back into an equal scenario."""
        head = f"# resolved: rate_per_s = {self.rate_per_s!r}, engines = {self.n_engines()}\n"
        return head + dumps_toml(self.to_dict())

    # ---- resolved geography --------------------------------------------------------------

    def regions(self) -> tuple[RegionSpec, ...]:
        """Client locations per region, in topology order."""
        return resolve_topology(self)[1]

    def topology_spec(self) -> Topology:
        """The :class:`~carbon_gym.topology.Topology` this scenario describes."""
        return resolve_topology(self)[0]

    def n_engines(self) -> int:
        """Engines in the cluster (GPUs / TP)."""
        topo = self.topology_spec()
        return sum(d.engines(self.tp) for d in topo.datacenters)

    # ---- GPUs ------------------------------------------------------------------------------

    def gpu_file(self, gpu: str, kind: str) -> str | None:
        """Path of ``gpu``'s ``kind`` file (``"spec"``, ``"latency"``, ``"power"``) named in
        ``[gpu_files]`` (resolved), or None: the packaged one."""
        return getattr(dict(self.gpu_files).get(gpu, GpuFilesConfig()), kind)

    def datacenter_gpus(self) -> tuple[str, ...]:
        """GPU name of each datacenter, in topology order."""
        topo = self.topology_spec()
        return tuple(d.gpu or topo.gpu for d in topo.datacenters)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            if "check" not in f.metadata:
                continue
            x = getattr(obj, f.name)
            v = dict(x) if f.name == "params" else {k: _to_plain(c) for k, c in x} if f.name == "gpu_files" else _to_plain(x)
            if v is None or (not v and f.name in ("regions", "datacenters", "faults", "gpu_files")):
                continue
            out[f.name] = v
        return out
    if isinstance(obj, (list, tuple)):
        return [_to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


def dumps_toml(data: Mapping[str, Any]) -> str:
    """Write a nested dict (tables, arrays of tables, scalars, arrays) as TOML text."""
    lines: list[str] = []

    def is_table_array(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

    def emit(table: Mapping[str, Any], prefix: str) -> None:
        for k, v in table.items():
            if not isinstance(v, dict) and not is_table_array(v):
                lines.append(f"{k} = {toml_value(v)}")
        for k, v in table.items():
            name = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict):
                lines.append("")
                lines.append(f"[{name}]")
                emit(v, name)
            elif is_table_array(v):
                for item in v:
                    lines.append("")
                    lines.append(f"[[{name}]]")
                    emit(item, name)

    emit(data, "")
    return "\n".join(lines).lstrip("\n") + "\n"


# ----------------------------------------------------------------------------- topology


def resolve_topology(s: Scenario) -> tuple[Topology, tuple[RegionSpec, ...]]:
    """Concrete :class:`Topology` and client locations of a scenario (validated)."""
    return _resolve_topology(s.topology, s.gpu, s.gpu_files, s.source or None)


@lru_cache(maxsize=64)
def _resolve_topology(t: TopologyConfig, gpu: str, gpu_files: tuple[tuple[str, GpuFilesConfig], ...],
                      source: str | None) -> tuple[Topology, tuple[RegionSpec, ...]]:
    ctx = Ctx(source)
    gpus_per_node = gpu_spec_of(gpu, gpu_files, "gpu", source).gpus_per_node
    if t.preset == "default":
        if t.regions or t.datacenters:
            raise ctx.err("topology.regions" if t.regions else "topology.datacenters", "only with topology.preset = 'custom'")
        topo = default_topology(t.nodes_per_datacenter, gpus_per_node, gpu, t.only_regions, t.datacenters_per_region)
        return topo, default_region_specs(t.only_regions)
    if t.only_regions is not None:
        raise ctx.err("topology.only_regions", "only with topology.preset = 'default'")
    if not t.regions:
        raise ctx.err("topology.regions", "a custom topology needs at least one [[topology.regions]]")
    if not t.datacenters:
        raise ctx.err("topology.datacenters", "a custom topology needs at least one [[topology.datacenters]]")
    region_names = [r.name for r in t.regions]
    if len(set(region_names)) != len(region_names):
        raise ctx.err("topology.regions", f"duplicate region names {region_names}")
    dc_names = [d.name for d in t.datacenters]
    if len(set(dc_names)) != len(dc_names):
        raise ctx.err("topology.datacenters", f"duplicate datacenter names {dc_names}")
    dcs = []
    for i, d in enumerate(t.datacenters):
        if d.region not in region_names:
            raise ctx.err(f"topology.datacenters[{i}].region", f"unknown region {d.region!r}", allowed=region_names)
        pue = d.pue if d.pue is not None else _zone_fact(d.zone, f"topology.datacenters[{i}].zone", ctx).pue
        own = d.gpu if d.gpu is not None and d.gpu != gpu else ""  # "": the scenario's gpu
        gpn = gpu_spec_of(own, gpu_files, f"topology.datacenters[{i}].gpu", source).gpus_per_node if own else gpus_per_node
        dcs.append(DatacenterSpec(name=d.name, region=d.region, zone=d.zone, pue=pue,
                                  nodes=d.nodes if d.nodes is not None else t.nodes_per_datacenter, gpus_per_node=gpn,
                                  gpu=own))
    regions = []
    for i, r in enumerate(t.regions):
        off = r.utc_offset_h if r.utc_offset_h is not None else _zone_fact(r.client_zone, f"topology.regions[{i}].client_zone", ctx).utc_offset_h
        if r.rtt_ms is not None and len(r.rtt_ms) != len(dcs):
            raise ctx.err(f"topology.regions[{i}].rtt_ms", f"needs one RTT per datacenter ({len(dcs)}), got {len(r.rtt_ms)}")
        regions.append(RegionSpec(r.name, r.client_zone, off, r.rtt_ms))
    return Topology(regions=tuple(region_names), datacenters=tuple(dcs), gpu=gpu), tuple(regions)


def _zone_fact(zone: str, path: str, ctx: Ctx) -> ZoneInfo:
    table = zone_table()
    if zone not in table:
        raise ctx.err(path, f"zone {zone!r} has no packaged PUE / UTC offset; set them explicitly (pue, utc_offset_h)", allowed=sorted(table))
    return table[zone]


# ----------------------------------------------------------------------------- loading


def list_scenarios() -> list[str]:
    """Names of the shipped scenarios."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def scenario_path(name_or_path: str | Path) -> Path:
    """Path of a shipped scenario by name, or the given path; :class:`ConfigError` if neither.

    A ``.toml`` suffix or a path separator means a path. Otherwise a shipped scenario's name wins
    over a file or directory of that name in the working directory (``"dev"`` is the shipped
    scenario even where ``./dev`` exists); any other existing file is read as a TOML path.
    """
    p = Path(name_or_path)
    text = str(name_or_path)
    if p.suffix == ".toml" or "/" in text or "\\" in text:
        if not p.is_file():
            raise DataError(str(p), "scenario file not found")
        return p
    shipped = SCENARIO_DIR / f"{text}.toml"
    if shipped.exists():
        return shipped
    if p.is_file():
        return p
    raise ConfigError("scenario", f"unknown scenario {text!r}", allowed=list_scenarios())


def _set_dotted(raw: dict[str, Any], key: str, value: Any, source: str | None) -> None:
    parts = key.split(".")
    cur: Any = raw
    for i, part in enumerate(parts[:-1]):
        here = ".".join(parts[: i + 1])
        if isinstance(cur, list):
            if not part.isdigit() or int(part) >= len(cur):
                raise ConfigError(key, f"no item {part!r} in {here.rsplit('.', 1)[0]}", source=source)
            cur = cur[int(part)]
            if not isinstance(cur, (dict, list)):
                raise ConfigError(key, f"{here} is not a table (it is {type(cur).__name__} {cur!r})", source=source)
            continue
        nxt = cur.get(part)
        if nxt is None:
            nxt = cur[part] = {}
        elif not isinstance(nxt, (dict, list)):
            raise ConfigError(key, f"{here} is not a table", source=source)
        cur = nxt
    last = parts[-1]
    if isinstance(cur, list):
        if not last.isdigit() or int(last) >= len(cur):
            raise ConfigError(key, f"no item {last!r}", source=source)
        cur[int(last)] = value
    else:
        cur[last] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a CLI override ``"workload.rate_per_s=50"`` into ``("workload.rate_per_s", 50)``.

    The value is read as a TOML value (numbers, booleans, quoted strings, arrays); anything that
    is not valid TOML is taken as a bare string.
    """
    if "=" not in text:
        raise ConfigError("override", f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    key, value = key.strip(), value.strip()
    if not key:
        raise ConfigError("override", f"empty key in {text!r}")
    try:
        parsed = loads_toml(f"v = {value}", source="override")["v"]
    except DataError:
        parsed = value
    return key, parsed


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Parse several ``key=value`` strings (see :func:`parse_override`)."""
    return dict(parse_override(x) for x in items)


def _deep_copy(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _deep_copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_deep_copy(v) for v in x]
    return x


def scenario_from_dict(raw: Mapping[str, Any], *, source: str | None = None, base_dir: Path | None = None,
                       overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Validate a raw dict (as read from TOML) into a resolved :class:`Scenario`."""
    if not isinstance(raw, Mapping):
        raise ConfigError("scenario", f"expected a table (dict), got {type(raw).__name__}", source=source)
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError("overrides", f"expected a dict of dotted field names to values, got {type(overrides).__name__}",
                          source=source)
    raw_d: dict[str, Any] = _deep_copy(dict(raw))
    ctx = Ctx(source)
    for key, value in (overrides or {}).items():
        if not isinstance(key, str) or not key:
            raise ConfigError("overrides", f"override keys must be dotted field names, got {key!r}")
        _set_dotted(raw_d, key, value, source)
        wl = raw_d.get("workload")
        if isinstance(wl, dict):  # the override decides how the rate is set
            if key == "workload.rate_per_s":
                wl.pop("load", None)
            elif key == "workload.load":
                wl.pop("rate_per_s", None)
    s: Scenario = parse_table(Scenario, raw_d, "", ctx)
    return _resolve(s, ctx, base_dir)


def load_scenario(name_or_path: str | Path, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Load a shipped scenario by name or a TOML file by path, apply dotted-key overrides, validate.

    Example::

        s = load_scenario("llama8b-moderate", overrides={"duration_s": 600, "workload.rate_per_s": 50})
    """
    if not isinstance(name_or_path, (str, Path)):
        raise ConfigError("scenario", f"expected a scenario name or a path, got {type(name_or_path).__name__}",
                          allowed="a shipped scenario name, a .toml path")
    path = scenario_path(name_or_path)
    raw = load_toml(path)
    if "name" not in raw:
        raw["name"] = path.stem
    return scenario_from_dict(raw, source=str(path), base_dir=path.resolve().parent, overrides=overrides)


def resolve_scenario(scenario: Any, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """A :class:`Scenario` from a shipped name, a TOML path or a ``Scenario`` (with ``overrides``
    applied); :class:`ConfigError` for anything else."""
    if isinstance(scenario, Scenario):
        if not overrides:
            return scenario
        base = Path(scenario.source).resolve().parent if scenario.source else None
        return scenario_from_dict(scenario.to_dict(), source=scenario.source or None, base_dir=base, overrides=overrides)
    if isinstance(scenario, (str, Path)):
        return load_scenario(scenario, overrides=overrides)
    raise ConfigError("scenario", f"expected a scenario name, a path or a Scenario, got {type(scenario).__name__}")


def _resolve(s: Scenario, ctx: Ctx, base_dir: Path | None) -> Scenario:  # noqa: C901
    """Cross-field checks; fill model-dependent defaults; resolve relative paths and the rate."""
    from .specs import load_model_spec

    try:
        model = load_model_spec(s.model)
    except ConfigError as e:
        raise ctx.err("model", f"unknown model {s.model!r}", allowed=e.allowed) from None
    s = dataclasses.replace(s, source=ctx.source or "", gpu_files=resolve_gpu_files(s.gpu_files, base_dir, ctx))
    gpu = gpu_spec_of(s.gpu, s.gpu_files, "gpu", ctx.source)

    # engine
    eng = s.engine
    tp = eng.tp if eng.tp is not None else model.default_tp
    if gpu.gpus_per_node % tp != 0:
        raise ctx.err("engine.tp", f"tp={tp} does not divide the {gpu.gpus_per_node} GPUs of a {s.gpu} node",
                      allowed=[k for k in range(1, gpu.gpus_per_node + 1) if gpu.gpus_per_node % k == 0])
    eng = dataclasses.replace(eng, tp=tp)
    from .sim.dispatch import available_dispatchers

    if eng.dispatcher not in available_dispatchers():
        raise ctx.err("engine.dispatcher", f"unknown dispatcher {eng.dispatcher!r} (register your own with "
                      "carbon_gym.sim.register_dispatcher before loading the scenario)", allowed=available_dispatchers())

    # slo
    slo = s.slo
    if slo.ttft_s is None or slo.tpot_s is None:
        if s.model not in MLPERF_SLO:
            missing = "slo.ttft_s" if slo.ttft_s is None else "slo.tpot_s"
            raise ctx.err(missing, f"no MLPerf default for model {s.model!r}; set it explicitly")
        d_ttft, d_tpot = MLPERF_SLO[s.model]
        slo = SloConfig(ttft_s=slo.ttft_s if slo.ttft_s is not None else d_ttft, tpot_s=slo.tpot_s if slo.tpot_s is not None else d_tpot)

    if s.polling_period_s > s.duration_s:
        raise ctx.err("polling_period_s", f"{s.polling_period_s} s is longer than duration_s = {s.duration_s} s")

    # carbon
    c = s.carbon
    if c.file != "packaged":
        fp = Path(c.file)
        if not fp.is_absolute() and base_dir is not None:
            fp = base_dir / fp
        if not fp.exists():
            raise ctx.err("carbon.file", f"file not found: {fp}")
        c = dataclasses.replace(c, file=str(fp))
    from .physics.carbon import carbon_offset_s, load_carbon_trace, parse_start_utc

    try:
        parse_start_utc(c.start_utc, "carbon.start_utc")
    except ConfigError as e:
        raise ctx.err("carbon.start_utc", str(e).split(": ", 1)[-1].split(" (allowed")[0], allowed=e.allowed) from None
    if c.file == "packaged":
        try:
            carbon_offset_s(load_carbon_trace(kind=c.kind), c.start_utc)
        except ConfigError as e:
            raise ctx.err("carbon.start_utc", str(e).split(": ", 1)[-1]) from None

    s = dataclasses.replace(s, engine=eng, slo=slo, carbon=c)

    # topology (validated here so errors surface at load time)
    topo, regions = resolve_topology(s)
    for i, d in enumerate(topo.datacenters):
        if d.gpu and d.gpus_per_node % tp:
            raise ctx.err(f"topology.datacenters[{i}].gpu", f"engine.tp={tp} does not divide the {d.gpus_per_node} "
                          f"GPUs of a {d.gpu} node", allowed=[k for k in range(1, d.gpus_per_node + 1) if d.gpus_per_node % k == 0])
    n_engines = sum(d.engines(tp) for d in topo.datacenters)
    if n_engines < 1:
        raise ctx.err("topology", f"no engine fits: datacenters have fewer GPUs than tp={tp}")
    if s.faults:  # [[faults]]: validated against the topology (carbon_gym.faults)
        from .faults import parse_faults

        parse_faults(s.faults, topo, duration_s=s.duration_s, tp=tp, source=ctx.source)

    # workload
    w = s.workload
    if w.max_context_tokens > eng.max_model_len:
        raise ctx.err("workload.max_context_tokens", f"{w.max_context_tokens} exceeds engine.max_model_len = {eng.max_model_len}")
    if w.region_shares is not None:
        if len(w.region_shares) != len(regions):
            raise ctx.err("workload.region_shares", f"needs one share per region ({len(regions)}: {', '.join(r.name for r in regions)}), got {len(w.region_shares)}")
        if abs(sum(w.region_shares) - 1.0) > 1e-6:
            raise ctx.err("workload.region_shares", f"must sum to 1, got {sum(w.region_shares)}")
    if w.lengths == "trace" and w.arrival != "replay":
        raise ctx.err("workload.lengths", "'trace' lengths need workload.arrival = 'replay'")
    if w.lengths == "fixed" and w.prompt_tokens + w.output_tokens > w.max_context_tokens:
        raise ctx.err("workload.prompt_tokens", f"fixed lengths {w.prompt_tokens}+{w.output_tokens} exceed max_context_tokens = {w.max_context_tokens}")
    groups: dict[str, int] = {}  # engines per GPU type, in datacenter order
    for d in topo.datacenters:
        groups[d.gpu or s.gpu] = groups.get(d.gpu or s.gpu, 0) + d.engines(tp)
    prefix = None if not is_prefix_workload(w) else resolve_prefix_workload(
        w, model=s.model, tp=tp, engine_groups=groups, base_dir=base_dir, ctx=ctx,
        fractions=load_load_levels().fractions if w.load else None)
    if prefix is not None:  # synthetic sessions or a Mooncake replay
        return dataclasses.replace(s, workload=prefix[0], resolved_rate_per_s=prefix[1], rate_source=prefix[2])
    from .workload import LENGTH_DATASETS, TRACES

    w = dataclasses.replace(
        w, lengths=_resolve_data_path(w.lengths, "workload.lengths", [*LENGTH_DATASETS, "fixed", "trace"], base_dir, ctx),
        trace=_resolve_data_path(w.trace, "workload.trace", list(TRACES), base_dir, ctx),
    )
    if w.arrival == "replay":
        if w.load is not None and w.time_scale is not None:
            raise ctx.err("workload.time_scale", "give either workload.load or workload.time_scale for replay, not both")
        if w.rate_per_s is not None and w.time_scale is not None:
            raise ctx.err("workload.time_scale", "give either workload.rate_per_s or workload.time_scale for replay, not both")
    if w.load is not None and w.rate_per_s is not None:
        raise ctx.err("workload.rate_per_s", "give either workload.load or workload.rate_per_s, not both")
    if w.load is not None:
        levels = load_load_levels()
        rate, texts = 0.0, list[str]()
        for g, n in groups.items():
            try:
                r, t = load_rate_per_s(s.model, g, tp, w.load, n, levels)
            except ConfigError as e:
                raise ctx.err("workload.load", str(e).split(": ", 1)[-1].split(" (allowed")[0], allowed=e.allowed) from None
            rate, texts = (r if not texts else rate + r), [*texts, t]
            cap = levels.capacity(s.model, g, tp)
            if cap.provisional:
                warnings.warn(f"load level {w.load!r} for {cap.key} uses a PROVISIONAL capacity (not yet measured with the simulator)", UserWarning, stacklevel=3)
        rate_source = " + ".join(texts)
    elif w.rate_per_s is not None:
        rate, rate_source = w.rate_per_s, "workload.rate_per_s"
    elif w.arrival == "replay":
        from .workload import make_trace_replay

        rate = make_trace_replay(w.trace, time_scale=w.time_scale or 1.0).rate_per_s / (1.0 + w.diurnal_amplitude)
        rate_source = f"the replayed trace {w.trace!r} (time_scale {w.time_scale or 1.0})"
    else:
        raise ctx.err("workload.rate_per_s", "set workload.rate_per_s or workload.load")
    return dataclasses.replace(s, workload=w, resolved_rate_per_s=float(rate), rate_source=rate_source)


def _resolve_data_path(value: str, field_name: str, names: list[str], base_dir: Path | None, ctx: Ctx) -> str:
    if value in names:
        return value
    p = Path(value)
    if p.suffix.lower() != ".csv":
        raise ctx.err(field_name, f"unknown dataset {value!r}", allowed=[*names, "<path>.csv"])
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    if not p.exists():
        raise ctx.err(field_name, f"file not found: {p}")
    return str(p)
