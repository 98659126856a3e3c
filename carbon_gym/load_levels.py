"""Load levels: what ``workload.load = "low" | "moderate" | "high"`` is a fraction of.

The packaged ``carbon_gym/data/load_levels.toml`` holds, per (model, GPU, TP), the serving
capacity measured with the simulator (``carbon_gym.capacity``; ``eval/measure_capacity.py``):
the engine figure (one engine fed every request at its arrival), the cluster figure (the study
topology under round-robin, placed every polling period, network delays in TTFT) and the
datacenter figures (one datacenter of E engines, placed every polling period, no network: the
SLO operating point the facility MILP's step cap holds each datacenter to, per (E, period)). The file's
``level_basis`` says which one the fractions apply to (``cluster`` in the packaged file).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ._toml import data_path, load_toml
from .errors import ConfigError, DataError

__all__ = ["DC_FIELDS", "LEVEL_BASES", "Capacity", "LoadLevels", "capacity_key", "load_levels_path", "load_load_levels", "load_rate_per_s"]

#: What a load level is a fraction of (``level_basis`` of a load-level file): ``cluster`` = the
#: whole study topology under round-robin with its polling period and network (the packaged
#: file); ``engine`` = one engine fed every request at its arrival.
LEVEL_BASES = ("cluster", "engine")
#: The datacenter figures of an entry (:meth:`Capacity.datacenter_rate_per_s`): parallel lists.
DC_FIELDS = ("dc_engines", "dc_polling_period_s", "dc_per_engine_rate_per_s")


def capacity_key(model: str, gpu: str, tp: int) -> str:
    """Key of a measured capacity in ``load_levels.toml``: ``"<model>/<gpu>/tp<k>"``."""
    return f"{model}/{gpu}/tp{int(tp)}"


@dataclass(frozen=True)
class Capacity:
    """Measured serving capacity of one engine of ``model`` on ``gpu`` with tensor parallelism ``tp``.

    Attributes:
        per_engine_rate_per_s: requests/s one engine serves within the SLO targets.
        provisional: True while the figure is a placeholder, not a simulator measurement.
        conditions: the measurement's settings (lengths, SLO, probes, command...).
    """

    model: str
    gpu: str
    tp: int
    per_engine_rate_per_s: float
    provisional: bool
    conditions: dict[str, Any]

    @property
    def key(self) -> str:
        """``"<model>/<gpu>/tp<k>"``."""
        return capacity_key(self.model, self.gpu, self.tp)

    @property
    def basis(self) -> str:
        """How ``per_engine_rate_per_s`` (the engine figure) was measured: the entry's ``basis``
        ("engine: one engine fed every request ...")."""
        return str(self.conditions.get("basis", "engine"))

    def level_rate_per_s(self, level_basis: str) -> float:
        """Requests/s per engine that the load levels are fractions of: the cluster figure
        (``level_basis = "cluster"``) or the engine figure (``"engine"``). A
        :class:`ConfigError` naming ``workload.load`` if the cluster figure was not measured."""
        if level_basis == "engine":
            return self.per_engine_rate_per_s
        c = self.cluster_per_engine_rate_per_s
        if c is None:
            raise ConfigError("workload.load", f"no cluster-level capacity measured for {self.key}: give workload.rate_per_s, "
                              "or measure it (python eval/measure_capacity.py --cluster --write)")
        return c

    @property
    def cluster_per_engine_rate_per_s(self) -> float | None:
        """The cluster-level figure measured beside it (the whole study topology under round-robin
        with its polling period and network, requests/s per engine), or None if not measured."""
        v = self.conditions.get("cluster_per_engine_rate_per_s")
        return None if v is None else float(v)

    def datacenter_rate_per_s(self, n_engines: int, polling_period_s: float) -> float | None:
        """The datacenter figure (``dc_*`` fields, ``eval/measure_capacity.py --datacenter``):
        requests/s per engine that one datacenter of ``n_engines`` engines, fed Poisson arrivals
        placed every ``polling_period_s`` seconds behind its dispatcher (no network), serves within
        the p99 targets; None where that (engines, period) was not measured. Near 0 where no rate
        passes (at 2 s polling the wait alone takes the 2 s TTFT target)."""
        c = self.conditions
        engines, periods, rates = c.get("dc_engines"), c.get("dc_polling_period_s"), c.get("dc_per_engine_rate_per_s")
        if engines is None or periods is None or rates is None:
            return None
        for e, p, r in zip(engines, periods, rates):
            if int(e) == int(n_engines) and abs(float(p) - float(polling_period_s)) <= 1e-9 * max(1.0, float(p)):
                return float(r)
        return None


@dataclass(frozen=True)
class LoadLevels:
    """Measured capacities and the load fractions (``carbon_gym/data/load_levels.toml``).

    Attributes:
        fractions: {"low": f, "moderate": f, "high": f} of capacity.
        capacities: {"<model>/<gpu>/tp<k>": :class:`Capacity`}.
        basis: which figure the fractions apply to: ``"cluster"`` (the file's ``level_basis``;
            the packaged file's) or ``"engine"`` (a file without ``level_basis``).
    """

    fractions: dict[str, float]
    capacities: dict[str, Capacity]
    basis: str = "engine"

    def find(self, model: str, gpu: str, tp: int) -> Capacity | None:
        """The capacity measured for (model, GPU, TP), or None."""
        return self.capacities.get(capacity_key(model, gpu, tp))

    def capacity(self, model: str, gpu: str, tp: int) -> Capacity:
        """The capacity measured for (model, GPU, TP); a :class:`ConfigError` naming
        ``workload.load`` and listing the measured ones if there is none."""
        cap = self.find(model, gpu, tp)
        if cap is None:
            raise ConfigError(
                "workload.load",
                f"no measured capacity for {capacity_key(model, gpu, tp)} (model / gpu / engine.tp): give "
                "workload.rate_per_s, or measure it (python eval/measure_capacity.py --write)", allowed=sorted(self.capacities))
        return cap


def load_levels_path() -> Path:
    """Path of the packaged load-level file."""
    return data_path("load_levels.toml")


def load_load_levels(path: str | Path | None = None) -> LoadLevels:
    """Read the load-level file (capacities measured by ``eval/measure_capacity.py``).

    The packaged file (``path`` None) is read once per version of it: cached by its path,
    modification time and size, so an edited file is read again; the object returned is shared
    (its mappings are read-only). A file given by path is read on every call.
    """
    if path:
        return _read_load_levels(Path(path))
    p = load_levels_path()
    try:
        st = p.stat()
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:  # (missing: read it, for the error naming it)
        return _read_load_levels(p)
    return _packaged_load_levels(str(p), stamp)


@lru_cache(maxsize=4)
def _packaged_load_levels(path: str, stamp: tuple[int, int]) -> LoadLevels:
    levels = _read_load_levels(Path(path))
    caps = {k: dataclasses.replace(c, conditions=MappingProxyType(dict(c.conditions))) for k, c in levels.capacities.items()}  # type: ignore[arg-type]
    return LoadLevels(MappingProxyType(dict(levels.fractions)), MappingProxyType(caps), levels.basis)  # type: ignore[arg-type]


def _read_load_levels(p: Path) -> LoadLevels:
    raw = load_toml(p)
    try:
        fractions = {k: float(v) for k, v in raw["fractions"].items()}
        caps = {}
        for key, t in raw["capacity"].items():
            cap = Capacity(
                model=str(t["model"]), gpu=str(t["gpu"]), tp=int(t["tp"]),
                per_engine_rate_per_s=float(t["per_engine_rate_per_s"]),
                provisional=str(t.get("status", "")).upper() == "PROVISIONAL",
                conditions={k: v for k, v in t.items() if k not in ("per_engine_rate_per_s", "model", "gpu", "tp")},
            )
            if cap.key != key:
                raise ValueError(f"section [capacity.{key!r}] holds {cap.key!r}")
            dc = [t.get(f) for f in DC_FIELDS]
            if any(v is not None for v in dc):
                if any(not isinstance(v, list) for v in dc) or len({len(v) for v in dc}) != 1:
                    raise ValueError(f"[capacity.{key!r}]: {', '.join(DC_FIELDS)} must be lists of one length")
                if any(not (int(e) >= 1 and float(p) > 0 and float(r) >= 0) for e, p, r in zip(*dc)):
                    raise ValueError(f"[capacity.{key!r}]: dc_engines >= 1, dc_polling_period_s > 0, dc_per_engine_rate_per_s >= 0")
            caps[key] = cap
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(str(p), f"malformed load-level file: {exc!r}") from None
    for k in ("low", "moderate", "high"):
        if not (0 < fractions.get(k, -1) <= 2):
            raise DataError(str(p), f"fractions.{k} missing or out of (0, 2]")
    basis = str(raw.get("level_basis", "engine"))
    if basis not in LEVEL_BASES:
        raise DataError(str(p), f"level_basis = {basis!r}: allowed {list(LEVEL_BASES)}")
    return LoadLevels(fractions, caps, basis)


def load_rate_per_s(model: str, gpu: str, tp: int, level: str, n_engines: int,
                    levels: LoadLevels | None = None) -> tuple[float, str]:
    """Total request rate (requests/s) for ``level`` of ``model`` on ``n_engines`` engines of
    ``gpu`` with tensor parallelism ``tp``, and a sentence saying where it comes from."""
    levels = levels or load_load_levels()
    if level not in levels.fractions:
        raise ConfigError("workload.load", f"unknown load level {level!r}", allowed=sorted(levels.fractions))
    cap = levels.capacity(model, gpu, tp)
    f = levels.fractions[level]
    per_engine = cap.level_rate_per_s(levels.basis)
    status = "PROVISIONAL" if cap.provisional else "measured"
    text = (f"workload.load = {level!r}: {f} x {per_engine} requests/s per engine ({status} {levels.basis}-level "
            f"capacity of {cap.key}, carbon_gym/data/load_levels.toml) x {n_engines} engines")
    return f * per_engine * n_engines, text
