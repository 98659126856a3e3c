"""Discrete-event simulator of vLLM-like engines in geo-distributed datacenters.

Public API: :class:`Simulator`, :class:`EngineConfig`, the result types
(:class:`ClusterSnapshot`, :class:`LatencyEstimates`, :class:`RequestRecords`, :class:`SimTotals`,
:class:`AbortedRequests`) and the dispatcher registry.
"""

from .dispatch import available_dispatchers, get_dispatcher, register_dispatcher
from .engine import EngineConfig
from .records import RECORD_COLUMNS, AbortedRequests, RequestRecords
from .simulator import ClusterSnapshot, LatencyEstimates, SimTotals, Simulator

__all__ = [
    "Simulator",
    "EngineConfig",
    "ClusterSnapshot",
    "LatencyEstimates",
    "SimTotals",
    "RequestRecords",
    "AbortedRequests",
    "RECORD_COLUMNS",
    "available_dispatchers",
    "get_dispatcher",
    "register_dispatcher",
]
