"""Per-request results: :class:`RequestRecords`, a struct of numpy arrays (one row per request).

The simulator appends one tuple per completed request to a :class:`RecordBuffer` (cheap on the
hot path) and turns the buffer into a :class:`RequestRecords` when the caller pops it, so memory
does not grow with completed requests once they have been popped. Records can be concatenated
and written to / read from ``.npz`` files by the caller (the simulator itself does no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable

import numpy as np

#: Column names and dtypes, in the order of the tuples the simulator appends.
RECORD_COLUMNS: tuple[tuple[str, type], ...] = (
    ("request_id", np.int64),
    ("origin", np.int64),
    ("datacenter", np.int64),
    ("engine", np.int64),
    ("arrival_s", np.float64),
    ("sent_s", np.float64),
    ("dc_arrival_s", np.float64),
    ("first_scheduled_s", np.float64),
    ("first_token_s", np.float64),
    ("done_s", np.float64),
    ("prompt_tokens", np.int64),
    ("output_tokens", np.int64),
    ("ttft_s", np.float64),
    ("tpot_s", np.float64),
    ("e2e_s", np.float64),
    ("queue_wait_s", np.float64),
    ("prefill_s", np.float64),
    ("network_s", np.float64),
    ("preemptions", np.int64),
    ("energy_j", np.float64),
    ("carbon_g", np.float64),
)


@dataclass(frozen=True)
class RequestRecords:
    """Completed requests, one row per request (all arrays have the same length).

    Times are seconds of simulated time. ``arrival_s`` is when the client issued the request,
    ``sent_s`` when the scheduler placed it (the prompt leaves the origin), ``dc_arrival_s`` when
    it reached the datacenter, ``first_scheduled_s`` when an engine started its first prefill
    iteration (engine time), ``first_token_s`` / ``done_s`` when the first / last token reached
    the client (network included).

    Derived: ``ttft_s = first_token_s - arrival_s``; ``e2e_s = done_s - arrival_s``;
    ``tpot_s = (e2e_s - ttft_s) / (output_tokens - 1)`` (MLPerf; 0 for one output token);
    ``queue_wait_s = first_scheduled_s - dc_arrival_s`` (wait in the engine queue);
    ``prefill_s`` = engine time from first scheduled to the first token (chunks and the
    iterations shared with other work included); ``network_s`` = uplink + downlink one-way delays.
    ``engine`` is the engine's index inside its datacenter. ``energy_j`` is the request's share of
    its engine's active energy at facility level (GPU energy of the iterations it took part in,
    split in proportion to the tokens it computed, times PUE; idle and host energy are not
    attributed); ``carbon_g`` is that energy times the grid intensity while it was drawn.
    """

    request_id: np.ndarray
    origin: np.ndarray
    datacenter: np.ndarray
    engine: np.ndarray
    arrival_s: np.ndarray
    sent_s: np.ndarray
    dc_arrival_s: np.ndarray
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    done_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    queue_wait_s: np.ndarray
    prefill_s: np.ndarray
    network_s: np.ndarray
    preemptions: np.ndarray
    energy_j: np.ndarray
    carbon_g: np.ndarray

    def __len__(self) -> int:
        return int(self.request_id.shape[0])

    @classmethod
    def empty(cls) -> "RequestRecords":
        """Records with zero rows."""
        return cls(**{name: np.zeros(0, dtype=dt) for name, dt in RECORD_COLUMNS})

    @classmethod
    def from_rows(cls, rows: list[tuple]) -> "RequestRecords":
        """Build from tuples in :data:`RECORD_COLUMNS` order."""
        if not rows:
            return cls.empty()
        # one conversion to float64 (ids and counts are exact below 2**53), then columns
        table = np.ascontiguousarray(np.array(rows, dtype=np.float64).T)
        return cls(**{name: (table[i] if dt is np.float64 else table[i].astype(np.int64))
                      for i, (name, dt) in enumerate(RECORD_COLUMNS)})

    @classmethod
    def concat(cls, parts: Iterable["RequestRecords"]) -> "RequestRecords":
        """Concatenate several record sets (rows in the given order)."""
        parts = list(parts)
        if not parts:
            return cls.empty()
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)})

    def to_dict(self) -> dict[str, np.ndarray]:
        """Column name -> array."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def take(self, index: np.ndarray) -> "RequestRecords":
        """Rows selected by an index or boolean mask."""
        return RequestRecords(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def sorted_by_id(self) -> "RequestRecords":
        """Rows ordered by ``request_id``."""
        return self.take(np.argsort(self.request_id, kind="stable"))

    def save_npz(self, path: str | Path) -> None:
        """Write the records to a compressed ``.npz`` file."""
        np.savez_compressed(path, **self.to_dict())

    @classmethod
    def load_npz(cls, path: str | Path) -> "RequestRecords":
        """Read records written by :meth:`save_npz`."""
        with np.load(path) as z:
            return cls(**{name: np.asarray(z[name], dtype=dt) for name, dt in RECORD_COLUMNS})


class RecordBuffer:
    """Append-only list of record tuples; :meth:`pop` returns and clears them as records."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def __len__(self) -> int:
        return len(self.rows)

    def pop(self) -> RequestRecords:
        """Return the buffered rows as :class:`RequestRecords` and empty the buffer."""
        rows, self.rows = self.rows, []
        return RequestRecords.from_rows(rows)


@dataclass(frozen=True)
class AbortedRequests:
    """Requests dropped when their datacenter went down (their progress is lost).

    Attributes are arrays, one entry per aborted request: ``request_id``, ``origin``,
    ``arrival_s`` (client arrival), ``prompt_tokens``, ``output_tokens``, ``datacenter`` (where
    they were), ``preemptions``. The caller may resubmit them elsewhere (they get new ids).
    """

    request_id: np.ndarray
    origin: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    datacenter: np.ndarray
    preemptions: np.ndarray

    def __len__(self) -> int:
        return int(self.request_id.shape[0])
