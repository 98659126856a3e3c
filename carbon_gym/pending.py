"""The env's store of pending requests: arrived at their origin, not yet placed (oldest first).

One float64 matrix, one row per request (integers are exact in float64), columns
:data:`COLUMNS`. Nothing in it is ever dropped: placed rows leave it, deferred and overflowing
rows stay, and requests an outage aborts come back with their original arrival time (and their
prefix hashes, session and turn: :meth:`PendingStore.requeue`).

:meth:`PendingStore.offer` picks the rows the K slots show: the oldest K that have an allowed
datacenter. Rows with none (every link from their region cut, every datacenter down or
drained, a prompt no engine can hold) are *blocked*: they stay pending, in order, and take no
slot, so they cannot starve the placeable requests behind them.

Requests of a prefix workload (:mod:`carbon_gym.sessions`) also carry their prefix hashes,
session id and turn, kept beside the matrix in a dict keyed by the row's sequence number (empty,
and free, for every other workload): :meth:`PendingStore.prefix_of` reads them for given rows,
:meth:`PendingStore.take` hands the placed rows' hashes to the env for ``Simulator.submit_batch``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PendingStore", "submit_placed", "COLUMNS", "ORIGIN", "ARRIVAL", "PROMPT", "OUTPUT", "PRED", "SEQ", "FAILED"]

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
        self._visible: np.ndarray | None = None  # row indices the slots show (None: the first n)
        self.n_visible = 0
        self.n_blocked = 0
        #: seq -> (prefix hashes, session id, turn) of rows from a prefix workload
        self.prefix: dict[int, tuple[tuple[int, ...], int, int]] = {}
        self.placed_hashes: list[tuple[int, ...] | None] | None = None  # of the last take(), None: no prefix rows

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

    def _remember(self, first_seq: int, hashes: Any, session_id: Any, turn: Any) -> None:
        """Keep the prefix hashes, sessions and turns of rows ``first_seq, first_seq + 1, ...``."""
        if hashes is None:
            return
        sid = session_id.tolist() if session_id is not None else [-1] * len(hashes)
        tn = turn.tolist() if turn is not None else [0] * len(hashes)
        for i, (h, s, t) in enumerate(zip(hashes, sid, tn)):
            if h is not None:
                self.prefix[first_seq + i] = (h, s, t)

    def append_batch(self, batch: Any) -> None:
        """Add a :class:`~carbon_gym.workload.RequestBatch` of new arrivals (with its prefix hashes)."""
        seq = self._seq
        self.append(batch.origin, batch.arrival_s, batch.prompt_tokens, batch.output_tokens)
        self._remember(seq, batch.prefix_hashes, batch.session_id, batch.turn)

    def prefix_of(self, rows: np.ndarray) -> tuple[list[tuple[int, ...] | None], np.ndarray, np.ndarray] | None:
        """``(prefix hashes, session id (int64, -1: none), turn (int32))`` of ``rows`` (pending
        rows, e.g. :meth:`visible_rows`), or None when no pending request has prefix hashes."""
        if not self.prefix:
            return None
        got = [self.prefix.get(int(q)) for q in rows[:, SEQ].tolist()]
        hashes = [g[0] if g is not None else None for g in got]
        sid = np.array([g[1] if g is not None else -1 for g in got], dtype=np.int64)
        turn = np.array([g[2] if g is not None else 0 for g in got], dtype=np.int32)
        return hashes, sid, turn

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
                output_tokens: np.ndarray, prefix_hashes: Any = None, session_id: np.ndarray | None = None,
                turn: np.ndarray | None = None) -> None:
        """Put failed-over requests back, merged in arrival order (stable: ties keep the older rows
        first), with their prefix hashes, sessions and turns where known (``prefix_hashes``: a
        sequence, one per request, or None, as ``AbortedRequests.prefix_hashes``; ``session_id``
        (-1: none) and ``turn``: arrays, or None)."""
        n = int(np.shape(origin)[0])
        rows = np.empty((n, len(COLUMNS)), dtype=np.float64)
        seq = self._seq
        self._fill(rows, origin, arrival_s, prompt_tokens, output_tokens, 1.0)
        self._remember(seq, prefix_hashes, session_id, turn)
        merged = np.concatenate([self.rows, rows])
        self.rows = merged[np.argsort(merged[:, ARRIVAL], kind="stable")]

    def offer(self, k: int, region_ok: np.ndarray, engine_kv_blocks: np.ndarray, block_tokens: int,
              min_engine_kv_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Choose the rows the ``k`` slots show: the oldest ``k`` with an allowed datacenter.

        Args:
            region_ok: (R, D) bool, datacenter d takes requests from region r now (up, accepting,
                link not cut).
            engine_kv_blocks: (D,) KV blocks of one engine (0: no engine).
            block_tokens: tokens per KV block.
            min_engine_kv_tokens: the smallest engine's KV tokens (a prompt below it fits any).

        Returns ``(rows, allowed)``: the visible rows (oldest first) and their (n, D) allowed
        datacenters (a request fits d when ``ceil((prompt + 1) / block_tokens)`` blocks fit one of
        d's engines). Sets :attr:`n_visible` and :attr:`n_blocked` (rows with no allowed datacenter).
        """
        rows = self.rows
        n_all = rows.shape[0]
        prompt = rows[:, PROMPT]
        region_any = bool(region_ok.any(axis=1).all())
        kv_binds = bool(n_all) and float(prompt.max()) >= min_engine_kv_tokens
        if region_any and not kv_binds:  # every pending request has an allowed datacenter
            n = n_all if n_all < k else k
            self._visible, self.n_visible, self.n_blocked = None, n, 0
            return rows[:n], region_ok[rows[:n, ORIGIN].astype(np.intp)]
        allowed = region_ok[rows[:, ORIGIN].astype(np.intp)]
        if kv_binds:
            need = np.ceil((prompt + 1.0) / block_tokens)
            allowed = (need[:, None] <= engine_kv_blocks[None, :]) & allowed
        placeable = allowed.any(axis=1)
        n_ok = int(np.count_nonzero(placeable))
        self.n_blocked = n_all - n_ok
        if n_ok == n_all:
            n = n_all if n_all < k else k
            self._visible, self.n_visible = None, n
            return rows[:n], allowed[:n]
        idx = np.flatnonzero(placeable)[:k]
        self._visible, self.n_visible = idx, int(idx.shape[0])
        return rows[idx], allowed[idx]

    def visible_rows(self, n: int | None = None) -> np.ndarray:
        """The rows the slots show (the last :meth:`offer`'s), or with ``n`` > :attr:`n_visible`
        every pending row in arrival order (blocked ones included)."""
        if n is not None and n != self.n_visible:
            return self.rows[:n]
        if self._visible is None:
            return self.rows[: self.n_visible]
        return self.rows[self._visible]

    def take(self, n_visible: int, place: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Remove the visible rows (the last :meth:`offer`'s, ``n_visible`` of them) where
        ``place`` is True; return them as ``(rows, ints)``: the float rows and their (origin,
        prompt, output) columns as int64."""
        n_place = int(np.count_nonzero(place))
        idx = self._visible
        if idx is not None:
            chosen = idx[place]
            rows = self.rows[chosen]
            keep = np.ones(self.rows.shape[0], dtype=bool)
            keep[chosen] = False
            self.rows = self.rows[keep]
        elif n_place == n_visible:
            rows = self.rows[:n_visible]
            self.rows = self.rows[n_visible:]
        else:
            rows = self.rows[:n_visible][place]
            keep = np.ones(self.rows.shape[0], dtype=bool)
            keep[:n_visible][place] = False
            self.rows = self.rows[keep]
        self._visible, self.n_visible = None, 0  # (the next offer chooses again)
        if self.prefix:
            pop = self.prefix.pop
            got = [pop(int(q), None) for q in rows[:, SEQ].tolist()]
            self.placed_hashes = [g[0] if g is not None else None for g in got]
        else:
            self.placed_hashes = None
        return rows, rows[:, _INT_COLS].astype(np.int64)


def submit_placed(sim: Any, origins: np.ndarray, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
                  output_tokens: np.ndarray, datacenters: np.ndarray, prefix_hashes: Any) -> np.ndarray:
    """``sim.submit_batch`` of placed rows, with ``prefix_hashes=`` only when there are any (a
    workload without prefix structure submits exactly as before). A simulator without the
    keyword (no prefix cache) gets the requests without their hashes, with a warning."""
    if prefix_hashes is None:
        return sim.submit_batch(origins, arrival_s, prompt_tokens, output_tokens, datacenters)
    try:
        return sim.submit_batch(origins, arrival_s, prompt_tokens, output_tokens, datacenters, prefix_hashes=prefix_hashes)
    except TypeError as e:
        if "prefix_hashes" not in str(e) and "argument" not in str(e):  # (compiled: "takes at most 5 arguments")
            raise
    import warnings

    warnings.warn("this simulator's submit_batch takes no prefix_hashes (no prefix cache): requests are submitted "
                  "without them", RuntimeWarning, stacklevel=3)
    return sim.submit_batch(origins, arrival_s, prompt_tokens, output_tokens, datacenters)
