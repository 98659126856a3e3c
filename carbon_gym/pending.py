"""The env's store of pending requests: arrived at their origin, not yet placed (oldest first).

One float64 matrix, one row per request (integers are exact in float64), columns
:data:`COLUMNS`. Nothing in it is ever dropped: placed rows leave it, deferred and overflowing
rows stay, and requests an outage aborts come back with their original arrival time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PendingStore", "COLUMNS", "ORIGIN", "ARRIVAL", "PROMPT", "OUTPUT", "PRED", "SEQ", "FAILED"]

#: Column names, in order: origin region, arrival at the origin (s), prompt tokens, true output
#: tokens (hidden from policies), predicted output tokens, arrival sequence number in the
#: episode, times failed over (aborted by an outage and re-queued; 0 or 1).
COLUMNS = ("origin", "arrival_s", "prompt_tokens", "output_tokens", "predicted_output_tokens", "seq", "failed_over")
ORIGIN, ARRIVAL, PROMPT, OUTPUT, PRED, SEQ, FAILED = range(len(COLUMNS))
_INT_COLS = np.array([ORIGIN, PROMPT, OUTPUT], dtype=np.intp)


class PendingStore:
    """Pending requests in arrival order (see the module docstring).

    Args:
        predictor: output-length predictor (``predict(prompt_tokens, output_tokens) -> tokens``).
    """

    def __init__(self, predictor: Any) -> None:
        self.predictor = predictor
        self.rows = np.empty((0, len(COLUMNS)), dtype=np.float64)
        self._seq = 0

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def _fill(self, out: np.ndarray, origin: np.ndarray, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
              output_tokens: np.ndarray, failed_over: float) -> None:
        """Write rows for the ``len(out)`` requests given, with their predicted output and the
        next sequence numbers."""
        n = out.shape[0]
        out[:, ORIGIN] = origin
        out[:, ARRIVAL] = arrival_s
        out[:, PROMPT] = prompt_tokens
        out[:, OUTPUT] = output_tokens
        out[:, PRED] = self.predictor.predict(prompt_tokens, output_tokens)
        out[:, SEQ] = np.arange(self._seq, self._seq + n)
        out[:, FAILED] = failed_over
        self._seq += n

    def append(self, origin: np.ndarray, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
               output_tokens: np.ndarray) -> None:
        """Add new arrivals (later than every pending row) at the end (one allocation)."""
        n = int(np.shape(origin)[0])
        old = self.rows
        m = old.shape[0]
        table = np.empty((m + n, len(COLUMNS)), dtype=np.float64)
        if m:
            table[:m] = old
        self._fill(table[m:], origin, arrival_s, prompt_tokens, output_tokens, 0.0)
        self.rows = table

    def requeue(self, origin: np.ndarray, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
                output_tokens: np.ndarray) -> None:
        """Put failed-over requests back, merged in arrival order (stable: ties keep the older rows first)."""
        n = int(np.shape(origin)[0])
        rows = np.empty((n, len(COLUMNS)), dtype=np.float64)
        self._fill(rows, origin, arrival_s, prompt_tokens, output_tokens, 1.0)
        merged = np.concatenate([self.rows, rows])
        self.rows = merged[np.argsort(merged[:, ARRIVAL], kind="stable")]

    def take(self, n_visible: int, place: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Remove the visible rows (the first ``n_visible``) where ``place`` is True; return them as
        ``(rows, ints)``: the float rows and their (origin, prompt, output) columns as int64."""
        n_place = int(np.count_nonzero(place))
        if n_place == n_visible:
            rows = self.rows[:n_visible]
            self.rows = self.rows[n_visible:]
        else:
            rows = self.rows[:n_visible][place]
            keep = np.ones(self.rows.shape[0], dtype=bool)
            keep[:n_visible][place] = False
            self.rows = self.rows[keep]
        return rows, rows[:, _INT_COLS].astype(np.int64)
