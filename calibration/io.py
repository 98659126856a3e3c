"""Readers and writers of calibration inputs and outputs.

Formats (all plain text):

* **Operator profile** (``*_mlp.csv``, Vidur format): one row per (num_tokens, TP degree) with
  columns ``time_stats.<op>.{min,max,mean,median,std}`` (per-layer milliseconds), the model shape
  columns ``n_head, n_kv_head, n_embd, n_expanded_embd, vocab_size, use_gated_mlp`` and
  ``num_tokens, num_tensor_parallel_workers``.
* **Attention anchors** (``*_attention_anchors.txt``): whitespace-separated rows under a
  ``# prefill: chunk, kv, attn_prefill_median_ms, kv_cache_save_median_ms`` comment and a
  ``# decode: batch, kv, attn_decode_median_ms, kv_cache_save_median_ms`` comment; ``NA`` marks a
  missing value; an optional ``# tp: <k>`` line gives the TP degree (default 1).
* **Serving benchmark** (vLLM ``benchmark_serving.py`` / ``vllm bench serve --save-result
  [--save-detailed]`` JSON): ``request_rate``, ``duration``, ``completed``, ``input_lens``,
  ``output_lens``, ``ttfts`` (s), ``itls`` (list of lists, s), optional ``errors``; carbon_gym
  also reads an optional ``gpu_energy_j`` (GPU energy of the run, e.g. from NVML counters).
* **Power log**: ``nvidia-smi --query-gpu=timestamp,index,power.draw --format=csv[,nounits] -lms
  100`` output, or the profiler's NVML log with columns ``time_s,gpu,power_w``.
* **Power intervals** (``start_s,end_s,phase,prefill_tokens,n_decode``): when the GPU ran which
  steady batch state, on the power log's clock (seconds since the epoch, or timestamps written
  like nvidia-smi's, e.g. ``2025/03/12 10:20:00.000``, local time).
* **Power samples** (``phase,prefill_tokens,n_decode,power_w``): power at known batch states.
* **Parameter files**: TOML tables written by :func:`dump_params_toml`.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from carbon_gym._toml import toml_value
from carbon_gym.errors import DataError

SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
STAT_NAMES = ("min", "max", "mean", "median", "std")

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
SHIPPED_MLP_CSV = PROFILES_DIR / "vidur_a100_meta-llama-3-8b_mlp.csv"
SHIPPED_ATTENTION = PROFILES_DIR / "vidur_a100_meta-llama-3-8b_attention_anchors.txt"


# --------------------------------------------------------------------------- operator profile


@dataclass(frozen=True)
class OperatorProfile:
    """Per-layer median operator times of one model at one TP degree.

    Attributes:
        source: file the data came from.
        tp: tensor-parallel degree.
        tokens: increasing token counts (duplicates in the file are merged by their median).
        ops_ms: operator name -> per-layer median milliseconds at each of ``tokens``.
        shape: model shape columns of the file (``n_head`` ... ``use_gated_mlp``).
    """

    source: str
    tp: int
    tokens: np.ndarray
    ops_ms: dict[str, np.ndarray]
    shape: dict[str, Any] = field(default_factory=dict)

    def op_at(self, op: str, num_tokens: float | np.ndarray) -> np.ndarray:
        """Measured per-layer ms of ``op`` at ``num_tokens`` (linear interpolation between rows)."""
        return np.interp(np.asarray(num_tokens, dtype=np.float64), self.tokens, self.ops_ms[op])


def _num(text: str, source: str, column: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise DataError(source, f"column {column!r}: not a number: {text!r}") from None
    return v


def _open_text(path: Path):
    """Open a CSV for reading, or raise :class:`DataError` naming it if it does not exist."""
    try:
        return open(path, newline="")
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None


def load_operator_profile(path: str | Path) -> dict[int, OperatorProfile]:
    """Read a Vidur-format operator CSV; returns one :class:`OperatorProfile` per TP degree."""
    path = Path(path)
    src = str(path)
    fh = _open_text(path)
    with fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        for c in ("num_tokens", "num_tensor_parallel_workers"):
            if c not in cols:
                raise DataError(src, f"missing column {c!r}")
        ops = sorted({c.split(".")[1] for c in cols if c.startswith("time_stats.") and c.endswith(".median")})
        if not ops:
            raise DataError(src, "no time_stats.<op>.median columns")
        per_tp: dict[int, dict[int, list[list[float]]]] = {}
        shapes: dict[int, dict[str, Any]] = {}
        for line, row in enumerate(reader, start=2):
            where = f"{src}:{line}"
            tokens = _num(row["num_tokens"], where, "num_tokens")
            tp = _num(row["num_tensor_parallel_workers"], where, "num_tensor_parallel_workers")
            if tokens < 1 or tokens != int(tokens) or tp < 1 or tp != int(tp):
                raise DataError(where, "num_tokens and num_tensor_parallel_workers must be integers >= 1")
            vals = []
            for op in ops:
                v = _num(row[f"time_stats.{op}.median"], where, f"time_stats.{op}.median")
                if not math.isfinite(v) or v < 0:
                    raise DataError(where, f"time_stats.{op}.median must be finite and >= 0, got {v}")
                vals.append(v)
            per_tp.setdefault(int(tp), {}).setdefault(int(tokens), []).append(vals)
            if int(tp) not in shapes:
                shapes[int(tp)] = {c: row[c] for c in SHAPE_COLUMNS if c in row}
    if not per_tp:
        raise DataError(src, "no data rows")
    out: dict[int, OperatorProfile] = {}
    for tp, by_tokens in sorted(per_tp.items()):
        toks = np.array(sorted(by_tokens), dtype=np.float64)
        mat = np.array([np.median(np.array(by_tokens[int(t)]), axis=0) for t in toks])
        shape: dict[str, Any] = {}
        for k, v in shapes[tp].items():
            if k == "use_gated_mlp":
                shape[k] = str(v).strip().lower() in ("true", "1")
            else:
                shape[k] = int(float(v))
        out[tp] = OperatorProfile(src, tp, toks, {op: mat[:, i] for i, op in enumerate(ops)}, shape)
    return out


def write_operator_profile(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write rows in the Vidur operator CSV format.

    Each row maps ``num_tokens``, ``num_tensor_parallel_workers``, the shape columns and
    ``ops`` -> {op name: list of per-layer sample times in ms}; the statistics columns are
    computed from the samples.
    """
    rows = list(rows)
    if not rows:
        raise DataError(str(path), "nothing to write")
    ops = list(rows[0]["ops"])
    header = [f"time_stats.{op}.{s}" for op in ops for s in STAT_NAMES]
    header += list(SHAPE_COLUMNS) + ["num_tokens", "num_tensor_parallel_workers"]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for r in rows:
            line: list[Any] = []
            for op in ops:
                a = np.asarray(r["ops"][op], dtype=np.float64)
                line += [float(a.min()), float(a.max()), float(a.mean()), float(np.median(a)), float(a.std())]
            line += [r[c] for c in SHAPE_COLUMNS] + [int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])]
            w.writerow(line)


# --------------------------------------------------------------------------- attention anchors


@dataclass(frozen=True)
class AttentionAnchors:
    """Measured per-layer attention times (ms) at a few batch shapes (NaN = not measured).

    Attributes:
        prefill_chunk, prefill_kv: query tokens of the chunk and tokens already in the KV cache.
        prefill_attn_ms, prefill_save_ms: prefill attention and KV-cache save, per layer.
        decode_batch, decode_kv: decoding sequences and each one's context length.
        decode_attn_ms, decode_save_ms: decode attention and KV-cache save, per layer.
        tp: tensor-parallel degree of the measurement.
    """

    source: str
    prefill_chunk: np.ndarray
    prefill_kv: np.ndarray
    prefill_attn_ms: np.ndarray
    prefill_save_ms: np.ndarray
    decode_batch: np.ndarray
    decode_kv: np.ndarray
    decode_attn_ms: np.ndarray
    decode_save_ms: np.ndarray
    tp: int = 1


def load_attention_anchors(path: str | Path) -> AttentionAnchors:
    """Read an attention-anchors text file (see the module docstring)."""
    path = Path(path)
    src = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise DataError(src, "file not found") from None
    section = None
    tp = 1
    rows: dict[str, list[list[float]]] = {"prefill": [], "decode": []}
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip().lower()
            if body.startswith("prefill:"):
                section = "prefill"
            elif body.startswith("decode:"):
                section = "decode"
            elif body.startswith("tp:"):
                tp = int(body.split(":", 1)[1])
            continue
        if section is None:
            raise DataError(f"{src}:{line_no}", "data row before a '# prefill:' or '# decode:' header")
        parts = line.split()
        if len(parts) != 4:
            raise DataError(f"{src}:{line_no}", f"expected 4 columns, got {len(parts)}")
        vals = []
        for p in parts:
            if p.upper() == "NA":
                vals.append(float("nan"))
                continue
            try:
                vals.append(float(p))
            except ValueError:
                raise DataError(f"{src}:{line_no}", f"not a number: {p!r}") from None
        if vals[0] < 1 or vals[1] < 0 or not math.isfinite(vals[2]) or vals[2] < 0:
            raise DataError(f"{src}:{line_no}", "need size >= 1, kv >= 0 and a finite attention time >= 0")
        rows[section].append(vals)
    if not rows["prefill"] or not rows["decode"]:
        raise DataError(src, "needs both a prefill and a decode section")
    p = np.array(rows["prefill"])
    d = np.array(rows["decode"])
    return AttentionAnchors(src, p[:, 0], p[:, 1], p[:, 2], p[:, 3], d[:, 0], d[:, 1], d[:, 2], d[:, 3], tp)


def write_attention_anchors(path: str | Path, prefill: Iterable[tuple], decode: Iterable[tuple],
                            tp: int = 1, comment: str = "") -> None:
    """Write anchors: ``prefill`` rows (chunk, kv, attn_ms, save_ms); ``decode`` rows (batch, kv, attn_ms, save_ms)."""

    def fmt(v: float) -> str:
        return "NA" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.6g}"

    lines = [f"# {comment}" if comment else "# attention anchors", f"# tp: {tp}",
             "# prefill: chunk, kv, attn_prefill_median_ms, kv_cache_save_median_ms"]
    lines += [f"{int(c)} {int(k)} {fmt(a)} {fmt(s)}" for c, k, a, s in prefill]
    lines.append("# decode: batch, kv, attn_decode_median_ms, kv_cache_save_median_ms")
    lines += [f"{int(b)} {int(k)} {fmt(a)} {fmt(s)}" for b, k, a, s in decode]
    Path(path).write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- serving benchmark


@dataclass(frozen=True)
class BenchResult:
    """Per-request results of one vLLM serving benchmark run (successful requests only).

    Attributes:
        source: file name.
        request_rate: requests per second the client offered (``inf`` = all at once).
        duration_s: wall time of the run, seconds.
        completed: successful requests.
        input_lens, output_lens: prompt and generated tokens per request.
        ttfts_s: time to first token per request, seconds.
        itls_s: inter-token latencies per request, seconds.
        gpu_energy_j: GPU energy of the run if recorded (carbon_gym extension), else None.
        burstiness: gamma shape of the arrival process (1.0 = Poisson).
    """

    source: str
    request_rate: float
    duration_s: float
    completed: int
    input_lens: np.ndarray
    output_lens: np.ndarray
    ttfts_s: np.ndarray
    itls_s: tuple[np.ndarray, ...]
    gpu_energy_j: float | None = None
    burstiness: float = 1.0

    @property
    def tpots_s(self) -> np.ndarray:
        """MLPerf TPOT per request: (sum of inter-token latencies) / (output tokens - 1); 0 for 1 token."""
        out = np.zeros(len(self.output_lens))
        for i, (itl, n) in enumerate(zip(self.itls_s, self.output_lens)):
            if n > 1:
                out[i] = float(np.sum(itl)) / (n - 1)
        return out


def _float_field(data: Mapping[str, Any], key: str, src: str) -> float:
    v = data[key]
    if isinstance(v, str) and v.lower() in ("inf", "infinity"):
        return float("inf")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise DataError(src, f"field {key!r} is not a number: {v!r}") from None


def load_bench_result(path: str | Path) -> BenchResult:
    """Read a vLLM ``--save-result`` JSON; failed requests (non-empty error) are left out and counted."""
    path = Path(path)
    src = str(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(src, "file not found") from None
    except json.JSONDecodeError as exc:
        raise DataError(src, f"invalid JSON: {exc}") from None
    need = ("request_rate", "input_lens", "output_lens", "ttfts", "itls")
    missing = [k for k in need if k not in data]
    if missing:
        raise DataError(src, f"missing fields {', '.join(missing)} (run the benchmark with --save-result "
                             "and, on recent vLLM, --save-detailed)")
    n = len(data["input_lens"])
    for k in ("output_lens", "ttfts", "itls"):
        if len(data[k]) != n:
            raise DataError(src, f"field {k!r} has {len(data[k])} entries, input_lens has {n}")
    errors = data.get("errors") or [""] * n
    if len(errors) != n:
        raise DataError(src, f"field 'errors' has {len(errors)} entries, input_lens has {n}")
    keep = [i for i in range(n) if not errors[i] and int(data["output_lens"][i]) > 0]
    inp = np.array([int(data["input_lens"][i]) for i in keep], dtype=np.int64)
    outp = np.array([int(data["output_lens"][i]) for i in keep], dtype=np.int64)
    ttft = np.array([float(data["ttfts"][i]) for i in keep], dtype=np.float64)
    itls = tuple(np.asarray(data["itls"][i], dtype=np.float64) for i in keep)
    if np.any(inp < 1) or np.any(~np.isfinite(ttft)) or np.any(ttft < 0):
        raise DataError(src, "input_lens must be >= 1 and ttfts finite and >= 0")
    energy = data.get("gpu_energy_j")
    return BenchResult(
        source=src,
        request_rate=_float_field(data, "request_rate", src),
        duration_s=float(data.get("duration", float("nan"))),
        completed=int(data.get("completed", len(keep))),
        input_lens=inp, output_lens=outp, ttfts_s=ttft, itls_s=itls,
        gpu_energy_j=None if energy is None else float(energy),
        burstiness=float(data.get("burstiness", 1.0) or 1.0),
    )


def write_bench_result(path: str | Path, result: BenchResult, extra: Mapping[str, Any] | None = None) -> None:
    """Write a :class:`BenchResult` in the vLLM ``--save-result`` JSON layout (plus summary means in ms)."""
    tpot = result.tpots_s
    data: dict[str, Any] = {
        "backend": "vllm", "request_rate": result.request_rate, "burstiness": result.burstiness,
        "duration": result.duration_s, "completed": result.completed,
        "total_input_tokens": int(result.input_lens.sum()), "total_output_tokens": int(result.output_lens.sum()),
        "mean_ttft_ms": float(result.ttfts_s.mean() * 1e3) if len(result.ttfts_s) else 0.0,
        "mean_tpot_ms": float(tpot[result.output_lens > 1].mean() * 1e3) if np.any(result.output_lens > 1) else 0.0,
        "input_lens": result.input_lens.tolist(), "output_lens": result.output_lens.tolist(),
        "ttfts": result.ttfts_s.tolist(), "itls": [a.tolist() for a in result.itls_s],
        "errors": [""] * len(result.input_lens),
    }
    if result.gpu_energy_j is not None:
        data["gpu_energy_j"] = result.gpu_energy_j
    if extra:
        data.update(extra)
    Path(path).write_text(json.dumps(data))


# --------------------------------------------------------------------------- power


@dataclass(frozen=True)
class PowerLog:
    """GPU power samples: times (s, on the log's clock), GPU index, watts."""

    source: str
    time_s: np.ndarray
    gpu: np.ndarray
    power_w: np.ndarray

    def for_gpu(self, gpu: int) -> PowerLog:
        """Samples of one GPU only."""
        m = self.gpu == gpu
        return PowerLog(self.source, self.time_s[m], self.gpu[m], self.power_w[m])


_SMI_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S.%f")


def _parse_smi_time(text: str, where: str) -> float:
    text = text.strip()
    for fmt in _SMI_TIME_FORMATS:
        try:
            return datetime.strptime(text, fmt).timestamp()
        except ValueError:
            continue
    raise DataError(where, f"unreadable timestamp {text!r} (expected e.g. 2024/05/01 12:00:00.123)")


def load_power_log(path: str | Path) -> PowerLog:
    """Read an nvidia-smi ``timestamp,[index,]power.draw`` CSV or an NVML ``time_s,gpu,power_w`` CSV.

    nvidia-smi timestamps (local wall clock, no zone) are converted to seconds since the epoch in
    this machine's time zone, like the interval files' timestamps, so the two stay on one clock
    (the profiler writes both as ``time.time()`` seconds instead).
    """
    path = Path(path)
    src = str(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise DataError(src, "file not found") from None
    rows = list(csv.reader([ln for ln in lines if ln.strip()]))
    if len(rows) < 2:
        raise DataError(src, "no samples")
    header = [h.strip().lower() for h in rows[0]]
    t_col = g_col = p_col = None
    nvml = "power_w" in header
    for i, h in enumerate(header):
        if h in ("timestamp", "time_s"):
            t_col = i
        elif h in ("index", "gpu"):
            g_col = i
        elif h.startswith("power.draw") or h == "power_w":
            p_col = i
    if t_col is None or p_col is None:
        raise DataError(src, f"need a timestamp/time_s and a power.draw/power_w column, got {rows[0]}")
    t, g, p = [], [], []
    for line_no, r in enumerate(rows[1:], start=2):
        where = f"{src}:{line_no}"
        if len(r) != len(header):
            raise DataError(where, f"expected {len(header)} columns, got {len(r)}")
        t.append(_num(r[t_col], where, "time_s") if nvml else _parse_smi_time(r[t_col], where))
        g.append(int(float(r[g_col])) if g_col is not None else 0)
        pw = r[p_col].strip()
        if pw.upper().endswith("W"):
            pw = pw[:-1].strip()
        if pw in ("[N/A]", "N/A", "[Not Supported]"):
            raise DataError(where, "power.draw not available on this GPU")
        v = _num(pw, where, "power")
        if not math.isfinite(v) or v < 0:
            raise DataError(where, f"power must be finite and >= 0, got {v}")
        p.append(v)
    return PowerLog(src, np.array(t), np.array(g, dtype=np.int64), np.array(p))


def write_power_log(path: str | Path, time_s: Iterable[float], gpu: Iterable[int], power_w: Iterable[float]) -> None:
    """Write an NVML-style power log ``time_s,gpu,power_w``."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time_s", "gpu", "power_w"])
        for a, b, c in zip(time_s, gpu, power_w):
            w.writerow([repr(float(a)), int(b), repr(float(c))])


@dataclass(frozen=True)
class PowerStates:
    """Known batch states: phase name, prefill tokens and decoding sequences per iteration.

    ``power_w`` holds measured watts for sample files; for interval files ``start_s``/``end_s``
    give when the state ran (``power_w`` is NaN until joined with a power log).
    """

    source: str
    phase: tuple[str, ...]
    prefill_tokens: np.ndarray
    n_decode: np.ndarray
    power_w: np.ndarray
    start_s: np.ndarray | None = None
    end_s: np.ndarray | None = None


def _time_value(text: str, where: str, column: str) -> float:
    try:
        return float(text)
    except ValueError:
        return _parse_smi_time(text, f"{where} ({column})")


def _load_states(path: str | Path, cols: tuple[str, ...]) -> dict[str, list]:
    path = Path(path)
    src = str(path)
    fh = _open_text(path)
    out: dict[str, list] = {c: [] for c in cols}
    with fh:
        reader = csv.DictReader(fh)
        missing = [c for c in cols if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(src, f"missing columns {', '.join(missing)} (need {', '.join(cols)})")
        for line_no, row in enumerate(reader, start=2):
            where = f"{src}:{line_no}"
            for c in cols:
                if c == "phase":
                    out[c].append(row[c].strip())
                    continue
                v = _time_value(row[c], where, c) if c in ("start_s", "end_s") else _num(row[c], where, c)
                if not math.isfinite(v) or v < 0:
                    raise DataError(where, f"{c} must be finite and >= 0, got {v}")
                out[c].append(v)
    if not out[cols[0]]:
        raise DataError(src, "no rows")
    return out


def load_power_samples(path: str | Path) -> PowerStates:
    """Read ``phase,prefill_tokens,n_decode,power_w`` samples at known batch states."""
    d = _load_states(path, ("phase", "prefill_tokens", "n_decode", "power_w"))
    return PowerStates(str(path), tuple(d["phase"]), np.array(d["prefill_tokens"]), np.array(d["n_decode"]),
                       np.array(d["power_w"]))


def load_power_intervals(path: str | Path) -> PowerStates:
    """Read ``start_s,end_s,phase,prefill_tokens,n_decode`` intervals of steady batch states."""
    d = _load_states(path, ("start_s", "end_s", "phase", "prefill_tokens", "n_decode"))
    start, end = np.array(d["start_s"]), np.array(d["end_s"])
    if np.any(end <= start):
        raise DataError(str(path), "every interval needs end_s > start_s")
    n = len(start)
    return PowerStates(str(path), tuple(d["phase"]), np.array(d["prefill_tokens"]), np.array(d["n_decode"]),
                       np.full(n, np.nan), start, end)


def write_power_intervals(path: str | Path, rows: Iterable[tuple[float, float, str, int, int]]) -> None:
    """Write intervals ``(start_s, end_s, phase, prefill_tokens, n_decode)``."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["start_s", "end_s", "phase", "prefill_tokens", "n_decode"])
        for a, b, ph, pt, nd in rows:
            w.writerow([repr(float(a)), repr(float(b)), ph, int(pt), int(nd)])


def write_power_samples(path: str | Path, states: PowerStates) -> None:
    """Write ``phase,prefill_tokens,n_decode,power_w`` samples."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["phase", "prefill_tokens", "n_decode", "power_w"])
        for ph, pt, nd, pw in zip(states.phase, states.prefill_tokens, states.n_decode, states.power_w):
            w.writerow([ph, int(pt), int(nd), repr(float(pw))])


# --------------------------------------------------------------------------- parameter files


def _toml_value(v: Any) -> str:
    return toml_value(v, allow_nonfinite=False, source="params")


def dumps_params_toml(tables: Mapping[str, Mapping[str, Any]], header: Iterable[str] = ()) -> str:
    """TOML text of flat ``tables`` (numbers, strings, lists), ``header`` lines as ``#`` comments."""
    out = [f"# {h}" if h else "#" for h in header]
    for name, table in tables.items():
        out.append(f"[{name}]")
        for k, v in table.items():
            out.append(f"{k} = {_toml_value(v)}")
        out.append("")
    return "\n".join(out)


def dump_params_toml(path: str | Path, tables: Mapping[str, Mapping[str, Any]], header: Iterable[str] = ()) -> None:
    """Write :func:`dumps_params_toml` to ``path`` (parent directories created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_params_toml(tables, header))
