"""Discrete-event simulator of vLLM-like engines in geo-distributed datacenters.

Public API: :class:`Simulator`, :class:`EngineConfig`, the result types
(:class:`ClusterSnapshot`, :class:`LatencyEstimates`, :class:`RequestRecords`, :class:`SimTotals`,
:class:`AbortedRequests`) and the dispatcher registry. :data:`IMPLEMENTATION` says whether the
engine, datacenter and simulator modules run compiled (mypyc) or as pure Python (:mod:`carbon_gym.sim._native`).
"""

from ._native import select as _select_implementation

#: ``{"engine": "compiled" | "python", "datacenter": ..., "simulator": ..., "reason": ...}`` (see :mod:`._native`).
IMPLEMENTATION = _select_implementation(__name__)


from .config import EngineConfig, GpuModels  # noqa: E402 (after the implementation is chosen)
from .dispatch import available_dispatchers, get_dispatcher, register_dispatcher  # noqa: E402
from .records import RECORD_COLUMNS, AbortedRequests, RecordWriter, RequestRecords, load_record_dir  # noqa: E402
from .results import SNAPSHOT_ARRAY_ROWS, ClusterSnapshot, EnergyAttribution, LatencyEstimates, SimTotals  # noqa: E402
from .simulator import Simulator  # noqa: E402

__all__ = [
    "GpuModels",
    "Simulator",
    "EngineConfig",
    "ClusterSnapshot",
    "LatencyEstimates",
    "SimTotals",
    "RequestRecords",
    "AbortedRequests",
    "EnergyAttribution",
    "RecordWriter",
    "load_record_dir",
    "RECORD_COLUMNS",
    "SNAPSHOT_ARRAY_ROWS",
    "available_dispatchers",
    "get_dispatcher",
    "register_dispatcher",
    "IMPLEMENTATION",
]
