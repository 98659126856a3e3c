"""Per-request results: :class:`RequestRecords`, a struct of numpy arrays (one row per request).

The engines append each completed request's state to a list the simulator holds (nothing is
computed on the hot path); :meth:`Simulator.pop_completed` wraps the list in a
:class:`RequestRecords` whose columns are computed when first read (:meth:`RequestRecords.from_requests`)
and empties it, so memory does not grow with completed requests once their records are dropped. Records can be concatenated, and streamed to / read from ``.npz`` files by the
caller (:class:`RecordWriter`, :func:`load_record_dir`; the simulator itself does no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterable

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
    ("cached_tokens", np.int64),
)

_N_COLUMNS = len(RECORD_COLUMNS)
_COLUMN_INDEX = {name: i for i, (name, _) in enumerate(RECORD_COLUMNS)}
_INT_COLUMNS = np.array([i for i, (_, dt) in enumerate(RECORD_COLUMNS) if dt is np.int64], dtype=np.intp)
# for each column: its row in the int64 block, or -1 for a float64 column
_INT_POS_LIST = [int(np.flatnonzero(_INT_COLUMNS == i)[0]) if dt is np.int64 else -1
                 for i, (_, dt) in enumerate(RECORD_COLUMNS)]


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
    ``cached_tokens`` are the prompt tokens its engine's prefix cache served at its first admission
    (whole prefix blocks; 0 without prefix caching, :mod:`carbon_gym.sim.prefix_cache`).
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
    cached_tokens: np.ndarray

    def __len__(self) -> int:
        return int(self.request_id.shape[0])

    @classmethod
    def empty(cls) -> RequestRecords:
        """Records with zero rows."""
        return cls._from_table(np.zeros((len(RECORD_COLUMNS), 0)))

    @classmethod
    def from_rows(cls, rows: list[tuple]) -> RequestRecords:
        """Build from tuples in :data:`RECORD_COLUMNS` order."""
        if not rows:
            return cls.empty()
        # one conversion to float64 (ids and counts are exact below 2**53), then columns
        n = len(rows)
        flat = np.fromiter(chain.from_iterable(rows), np.float64, n * _N_COLUMNS)
        return cls._from_table(flat.reshape(n, _N_COLUMNS).T.copy())

    @classmethod
    def from_requests(cls, reqs: list[Any], column: Callable[[list[Any], int], list]) -> RequestRecords:
        """Records of the completed requests ``reqs`` (the simulator's request states), whose
        column ``j`` (:data:`RECORD_COLUMNS` order) is ``column(reqs, j)``, computed when first read."""
        if not reqs:
            return cls.empty()
        rec = object.__new__(_RequestListRecords)
        rec.__dict__["_reqs"] = reqs
        rec.__dict__["_column"] = column
        return rec

    @classmethod
    def _from_table(cls, table: np.ndarray) -> RequestRecords:
        """From a contiguous float64 (columns, rows) table: float columns are its rows (views),
        integer columns their int64 conversion - made when first read (see _TableRecords)."""
        rec = object.__new__(_TableRecords)
        rec.__dict__["_table"] = table
        return rec

    @classmethod
    def concat(cls, parts: Iterable[RequestRecords]) -> RequestRecords:
        """Concatenate several record sets (rows in the given order)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        lazy = [p.__dict__ for p in parts if type(p) is _RequestListRecords and "_reqs" in p.__dict__]
        if len(lazy) == len(parts) and all(d["_column"] is lazy[0]["_column"] for d in lazy):
            # request states from pop_completed: one list, columns still made when first read
            return cls.from_requests(list(chain.from_iterable(d["_reqs"] for d in lazy)), lazy[0]["_column"])
        if all(type(p) is _TableRecords and "_table" in p.__dict__ for p in parts):
            # tables from pop_completed: one concatenation instead of one per column
            return cls._from_table(np.concatenate([p.__dict__["_table"] for p in parts], axis=1))
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)})

    def to_dict(self) -> dict[str, np.ndarray]:
        """Column name -> array."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def take(self, index: np.ndarray) -> RequestRecords:
        """Rows selected by an index or boolean mask."""
        return RequestRecords(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def sorted_by_id(self) -> RequestRecords:
        """Rows ordered by ``request_id``."""
        return self.take(np.argsort(self.request_id, kind="stable"))

    @classmethod
    def load_npz(cls, path: str | Path) -> RequestRecords:
        """Read records from an ``.npz`` file holding one array per column (as
        :class:`RecordWriter` writes them)."""
        with np.load(path) as z:
            n = len(z["request_id"])
            # files written before a column existed (cached_tokens) read it as zeros
            return cls(**{name: np.asarray(z[name], dtype=dt) if name in z.files else np.zeros(n, dtype=dt)
                          for name, dt in RECORD_COLUMNS})


class _TableRecords(RequestRecords):
    """:class:`RequestRecords` over a float64 (columns, rows) table whose columns become arrays
    when first read (callers of :meth:`Simulator.pop_completed` typically read a few of the 21):
    a float column is a row of the table (a view), an integer column its int64 conversion. Read
    one way or another, the values are those of a fully built RequestRecords."""

    def __getattr__(self, name: str) -> Any:  # only called for attributes not set yet
        d = self.__dict__
        j = _COLUMN_INDEX.get(name)
        if j is None or "_table" not in d:
            raise AttributeError(name)
        row = d["_table"][j]
        col = row.astype(np.int64) if _INT_POS_LIST[j] >= 0 else row
        d[name] = col
        return col

    def __len__(self) -> int:
        d = self.__dict__
        return int(d["_table"].shape[1]) if "_table" in d else int(self.request_id.shape[0])


class _RequestListRecords(RequestRecords):
    """:class:`RequestRecords` over the completed requests' states (:meth:`RequestRecords.from_requests`):
    a column becomes an array when first read (callers of :meth:`Simulator.pop_completed` typically
    read a few of the 22). Copies and pickles hold the arrays (a plain :class:`RequestRecords`)."""

    def __getattr__(self, name: str) -> Any:  # only called for attributes not set yet
        d = self.__dict__
        j = _COLUMN_INDEX.get(name)
        if j is None or "_reqs" not in d:
            raise AttributeError(name)
        col: np.ndarray = np.array(d["_column"](d["_reqs"], j), dtype=RECORD_COLUMNS[j][1])
        d[name] = col
        return col

    def __len__(self) -> int:
        d = self.__dict__
        return len(d["_reqs"]) if "_reqs" in d else int(self.request_id.shape[0])

    def __reduce__(self) -> tuple[Any, ...]:
        return _plain_records, (self.to_dict(),)


def _plain_records(columns: dict[str, np.ndarray]) -> RequestRecords:
    """A :class:`RequestRecords` of ``columns`` (unpickling of lazy records)."""
    return RequestRecords(**columns)


@dataclass(frozen=True)
class AbortedRequests:
    """Requests dropped when their datacenter went down (their progress is lost).

    Attributes are arrays, one entry per aborted request: ``request_id``, ``origin``,
    ``arrival_s`` (client arrival), ``prompt_tokens``, ``output_tokens``, ``datacenter`` (where
    they were), ``preemptions``, and the wasted work: ``energy_j`` / ``carbon_g``, each request's
    share of the iterations it had completed (facility level, as in :class:`RequestRecords`);
    ``prefix_hashes``: each request's block ids as submitted (a tuple; None for a request
    submitted without), or None when none of them had any. The caller may resubmit them
    elsewhere, with ``submit_batch(..., prefix_hashes=ab.prefix_hashes)`` (they get new ids).
    """

    request_id: np.ndarray
    origin: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    datacenter: np.ndarray
    preemptions: np.ndarray
    energy_j: np.ndarray
    carbon_g: np.ndarray
    prefix_hashes: list[tuple[int, ...] | None] | None = None

    def __len__(self) -> int:
        return int(self.request_id.shape[0])

    @staticmethod
    def hashes_of(per_request: list[Any]) -> list[tuple[int, ...] | None] | None:
        """``prefix_hashes`` from each request's block ids as submitted (None: none)."""
        if all(h is None for h in per_request):
            return None
        return [None if h is None else tuple(h) for h in per_request]


class RecordWriter:
    """Streams :class:`RequestRecords` to numbered ``.npz`` chunk files in a directory, so that a
    long run keeps at most ``chunk_rows`` completed records in memory.

    Files are ``<directory>/part-00000.npz``, ``part-00001.npz``, ... (written when the buffer
    reaches ``chunk_rows`` rows and by :meth:`flush` / :meth:`close`). :meth:`read_all` (or
    :func:`load_record_dir`) reads them back in order; :meth:`percentiles` computes exact
    percentiles of one column with bounded memory (two passes over the files).

    Args:
        directory: created if missing; existing ``part-*.npz`` files in it are refused.
        chunk_rows: rows per file (>= 1; 50,000 rows hold about 8 MB in memory).
    """

    def __init__(self, directory: str | Path, chunk_rows: int = 50_000) -> None:
        from ..errors import ConfigError

        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, (int, np.integer)) or chunk_rows < 1:
            raise ConfigError("record_chunk_rows", f"must be an integer >= 1, got {chunk_rows!r}")
        d = check_record_dir(directory)
        if any(d.glob("part-*.npz")):
            raise ConfigError("record_dir", f"{d} already holds record files (part-*.npz); use an empty directory")
        self.directory = d
        self.chunk_rows = int(chunk_rows)
        self._parts: list[RequestRecords] = []
        self._buffered = 0
        self.files: list[Path] = []
        self.rows_written = 0
        #: the first write failure (:class:`~carbon_gym.errors.RecordWriteError`), or None. After
        #: one, nothing more is written: the unwritten rows stay in memory and are still read.
        self.failed: Exception | None = None

    def __len__(self) -> int:
        """Rows appended so far (written or buffered)."""
        return self.rows_written + self._buffered

    def append(self, records: RequestRecords) -> None:
        """Buffer ``records``; write a chunk file once ``chunk_rows`` rows are buffered."""
        n = len(records)
        if n == 0:
            return
        self._parts.append(records)
        self._buffered += n
        if self._buffered >= self.chunk_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows (if any) to the next chunk file (a compressed ``.npz`` that
        :meth:`RequestRecords.load_npz` reads; written one column at a time, so the extra memory
        is one column, not a copy of the buffer).

        Raises :class:`~carbon_gym.errors.RecordWriteError` naming the directory when the file
        cannot be written (no space left, directory gone): the partial file is removed, the rows
        stay buffered (nothing is lost) and the writer stops writing (:attr:`failed`)."""
        if not self._buffered or self.failed is not None:
            return
        import zipfile

        from ..errors import RecordWriteError

        path = self.directory / f"part-{len(self.files):05d}.npz"
        parts = self._parts
        try:
            with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for name, dt in RECORD_COLUMNS:
                    col: np.ndarray = np.concatenate([getattr(p, name) for p in parts]).astype(dt, copy=False)
                    with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                        np.lib.format.write_array(f, np.ascontiguousarray(col), allow_pickle=False)
                    del col
        except OSError as e:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
            self.failed = RecordWriteError(str(self.directory), f"cannot write {path.name} ({e.strerror or e}); "
                                           f"{self._buffered} unwritten records are kept in memory")
            raise self.failed from e
        self.files.append(path)
        self.rows_written += self._buffered
        self._parts = []
        self._buffered = 0

    def close(self) -> None:
        """Flush; the writer can still be read from afterwards."""
        self.flush()

    def read_all(self) -> RequestRecords:
        """Every row appended so far (flushes first), in order."""
        self._try_flush()
        return RequestRecords.concat([RequestRecords.load_npz(p) for p in self.files] + self._parts)

    def column_chunks(self, column: str, skip_rows: int = 0) -> Iterable[np.ndarray]:
        """One column, file by file (flushes first; after a write failure the unwritten rows
        come last, from memory), leaving out the first ``skip_rows`` rows."""
        self._try_flush()
        left = int(skip_rows)
        sources: list[Path | RequestRecords] = [*self.files, *self._parts]
        for p in sources:
            if isinstance(p, RequestRecords):
                x = np.asarray(getattr(p, column), dtype=np.float64)
            else:
                with np.load(p) as z:
                    x = np.asarray(z[column], dtype=np.float64)
            if left:
                cut = min(left, x.size)
                x, left = x[cut:], left - cut
            yield x

    def _try_flush(self) -> None:
        """Flush before reading; a write failure is kept (:attr:`failed`), the rows read from memory."""
        from ..errors import RecordWriteError

        try:
            self.flush()
        except RecordWriteError:
            pass

    def percentiles(self, column: str, qs: Iterable[float], skip_rows: int = 0) -> list[float]:
        """Exact ``numpy.percentile`` (linear) of ``column`` for each q in ``qs``, reading the
        files twice with memory bounded by one file plus the values in a few histogram bins,
        leaving out the first ``skip_rows`` rows (a measurement window's warm-up). NaN when there
        are no rows."""
        qs = [float(q) for q in qs]
        n = 0
        lo, hi = np.inf, -np.inf
        for x in self.column_chunks(column, skip_rows):
            if x.size:
                n += x.size
                lo = min(lo, float(x.min()))
                hi = max(hi, float(x.max()))
        if n == 0:
            return [float("nan")] * len(qs)
        if lo == hi:
            return [lo] * len(qs)
        n_bins = 4096
        edges = np.linspace(lo, hi, n_bins + 1)
        counts = np.zeros(n_bins, dtype=np.int64)
        for x in self.column_chunks(column, skip_rows):
            counts += np.histogram(x, bins=edges)[0]
        cum = np.cumsum(counts)
        # order statistics (0-based ranks) each percentile interpolates between
        ranks: dict[float, tuple[int, int, float]] = {}
        need: set[int] = set()
        for q in qs:
            pos = (n - 1) * (q / 100.0)  # numpy's "linear" method, same floats
            k0 = int(np.floor(pos))
            k1 = min(k0 + 1, n - 1)
            ranks[q] = (k0, k1, pos - k0)
            need.add(k0)
            need.add(k1)
        bins_of = {k: int(np.searchsorted(cum, k, side="right")) for k in need}
        wanted = sorted(set(bins_of.values()))
        vals: dict[int, list[np.ndarray]] = {b: [] for b in wanted}
        for x in self.column_chunks(column, skip_rows):
            idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, n_bins - 1)
            for b in wanted:
                sel = x[idx == b]
                if sel.size:
                    vals[b].append(sel)
        sorted_vals = {b: np.sort(np.concatenate(v)) if v else np.zeros(0) for b, v in vals.items()}

        def order_stat(k: int) -> float:
            b = bins_of[k]
            before = int(cum[b - 1]) if b > 0 else 0
            return float(sorted_vals[b][k - before])

        out: list[float] = []
        for q in qs:
            k0, k1, frac = ranks[q]
            lo, hi = order_stat(k0), order_stat(k1)
            diff = hi - lo  # numpy's _lerp
            out.append(float(hi - diff * (1.0 - frac)) if frac >= 0.5 else float(lo + diff * frac))
        return out


def check_record_dir(directory: Any) -> Path:
    """``directory`` as a Path, created if missing, or :class:`~carbon_gym.errors.ConfigError`
    (field ``record_dir``) when it is empty, holds a NUL byte, lies under a file, is a file or
    cannot be created or written."""
    import os

    from ..errors import ConfigError

    if not isinstance(directory, (str, bytes)) and not hasattr(directory, "__fspath__"):
        raise ConfigError("record_dir", f"expected a directory path, got {type(directory).__name__}")
    raw = os.fsdecode(os.fspath(directory))
    if raw == "":
        raise ConfigError("record_dir", "empty path (for the working directory say '.')", allowed="a directory path")
    if "\x00" in raw:
        raise ConfigError("record_dir", f"the path holds a NUL byte: {raw!r}", allowed="a directory path")
    d = Path(raw)
    if d.exists() and not d.is_dir():
        raise ConfigError("record_dir", f"{d} exists and is not a directory", allowed="a directory path")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError("record_dir", f"cannot create {d}: {e.strerror or e}", allowed="a writable directory path") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise ConfigError("record_dir", f"{d} is not writable", allowed="a writable directory path")
    return d


def load_record_dir(directory: str | Path) -> RequestRecords:
    """Read back every ``part-*.npz`` chunk written by a :class:`RecordWriter`, in order."""
    from ..errors import DataError

    d = Path(directory)
    files = sorted(d.glob("part-*.npz"))
    if not d.is_dir():
        raise DataError(str(d), "record directory not found")
    return RequestRecords.concat([RequestRecords.load_npz(p) for p in files])
