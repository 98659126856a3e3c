"""Discrete-event simulator of vLLM-like engines in geo-distributed datacenters.

Public API: :class:`Simulator`, :class:`EngineConfig`, the result types
(:class:`ClusterSnapshot`, :class:`LatencyEstimates`, :class:`RequestRecords`, :class:`SimTotals`,
:class:`AbortedRequests`) and the dispatcher registry.
"""

from .dispatch import available_dispatchers, get_dispatcher, register_dispatcher
from .engine import EngineConfig
from .records import RECORD_COLUMNS, AbortedRequests, RecordWriter, RequestRecords, load_record_dir
from .simulator import (
    SNAPSHOT_ARRAY_ROWS, ClusterSnapshot, EnergyAttribution, LatencyEstimates, SimTotals, Simulator,
)

__all__ = [
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
]
