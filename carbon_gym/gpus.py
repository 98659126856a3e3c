"""A scenario's GPUs as data files: ``[gpu_files.<gpu name>]`` (spec / latency / power files by
path, relative to the scenario file) and the GPU spec of a name under them.

::

    gpu = "my-gpu"
    [gpu_files.my-gpu]
    spec = "gpus/my_gpu.toml"          # a gpus.toml-format file holding a [my-gpu] table
    latency = "gpus/my_gpu__llama-3.1-8b__tp1.toml"
    power = "gpus/my_gpu_power.toml"   # its [states] table enables capacity control

A file not given is the packaged one of that GPU name. ``carbon_gym.world.build_gpu_models``
loads the models; datacenters name their GPU with ``[[topology.datacenters]] gpu = ...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .schema import Ctx, parse_table, string
from .schema import spec as spec_field

__all__ = ["GpuFilesConfig", "gpu_files_table", "gpu_spec_of", "resolve_gpu_files"]


@dataclass(frozen=True)
class GpuFilesConfig:
    """A GPU's parameter files by path (relative to the scenario file); a file not given is the
    packaged one of that GPU name (``data/gpus.toml``, ``params/latency``, ``params/power``)."""

    spec: str | None = spec_field(string(), "a gpus.toml-format file holding a [<gpu name>] table", None)
    latency: str | None = spec_field(string(), "latency parameter file for this scenario's model and engine.tp", None)
    power: str | None = spec_field(string(), "power parameter file (its [states] table enables capacity control)", None)


def gpu_files_table(v: Any, path: str, ctx: Ctx) -> tuple[tuple[str, GpuFilesConfig], ...]:
    """``[gpu_files.<gpu name>]`` tables, kept as sorted (name, GpuFilesConfig) pairs."""
    if not isinstance(v, Mapping):
        raise ctx.err(path, f"expected a table of [{path}.<gpu name>] tables, got {v!r}")
    out = []
    for name, t in v.items():
        string(pattern=r"[A-Za-z0-9_.+-]+")(name, f"{path}.{name}", ctx)
        out.append((name, parse_table(GpuFilesConfig, t, f"{path}.{name}", ctx)))
    return tuple(sorted(out, key=lambda x: x[0]))


def gpu_spec_of(gpu: str, gpu_files: tuple[tuple[str, GpuFilesConfig], ...], field_name: str = "gpu",
                source: str | None = None) -> Any:
    """:class:`~carbon_gym.specs.GpuSpec` of ``gpu``: from its ``[gpu_files]`` spec file if the
    scenario names one (resolved paths), else from the packaged ``gpus.toml``.

    Raises:
        ConfigError: ``field_name`` (``source``: the scenario) if the file has no ``[gpu]`` table;
            ``<gpu>.<field>`` (``source``: the spec file) if that table is malformed (the ranges
            are :class:`~carbon_gym.specs.GpuSpec`'s).
    """
    from .specs import available_gpus, load_gpu_spec

    path = dict(gpu_files).get(gpu, GpuFilesConfig()).spec
    names = available_gpus(path)
    if gpu not in names:
        where = f" in {path} ([gpu_files.{gpu}] spec)" if path else " (give its files in [gpu_files.<name>])"
        raise ConfigError(field_name, f"unknown GPU {gpu!r}{where}", allowed=names, source=source)
    return load_gpu_spec(gpu, path)


def resolve_gpu_files(files: tuple[tuple[str, GpuFilesConfig], ...], base_dir: Path | None,
                       ctx: Ctx) -> tuple[tuple[str, GpuFilesConfig], ...]:
    """``[gpu_files]`` with every path resolved against the scenario's directory and checked to exist."""
    out = []
    for name, f in files:
        paths = {}
        for kind in ("spec", "latency", "power"):
            v = getattr(f, kind)
            if v is None:
                continue
            p = Path(v)
            if not p.is_absolute() and base_dir is not None:
                p = base_dir / p
            if p.suffix.lower() != ".toml":
                raise ctx.err(f"gpu_files.{name}.{kind}", f"expected a .toml parameter file, got {v!r}", allowed="<path>.toml")
            if not p.is_file():
                raise ctx.err(f"gpu_files.{name}.{kind}", f"file not found: {p}")
            paths[kind] = str(p)
        out.append((name, GpuFilesConfig(**paths)))
    return tuple(out)
