"""Files of a finished matrix (under ``out``).

:class:`OutputWriter` (per run, as results arrive) and :func:`write_outputs` (at the end) write:

``summary.csv`` / ``summary.md``
    one row per (scenario, policy): means over seeds with 95% t-intervals (``*_ci95`` = half
    width), carbon reduction vs round-robin computed per seed from the *same seeds'* round-robin
    runs, SLO violation rate (per request), the MLPerf p99 verdict (share of seeds whose p99 TTFT
    and p99 TPOT are within the targets), decision time (:func:`eval.tables.summarise`).
``runs.csv``
    one row per run (the per-seed numbers behind the summary).
``requests/<scenario>__<policy>__seed<k>.parquet`` (``.csv`` if pyarrow is missing)
    one row per completed request (the simulator's ``RequestRecords`` fields).
``steps/<scenario>__<policy>__seed<k>.parquet``
    one row per env step: carbon, energy, completions, violations, latencies, decision time,
    per-datacenter carbon and grid intensity (:class:`eval.runner.EpisodeRecorder`).
``config.json``
    the command, the run specs, episode starts, package versions.
``fault_report.csv`` / ``fault_report.md`` / ``fault_runs.csv`` (:func:`write_fault_report`)
    for scenarios with ``[[faults]]`` run together with their fault-free twins
    (:func:`eval.runner.fault_twin`): per (scenario, policy), requests failed over, SLO
    violations, carbon and p99 TTFT with and without the faults, the differences, ledger
    balanced; per seed in ``fault_runs.csv``. Runs of fault scenarios also carry the fault
    counters (``failed_over``, ``failed_over_completed``, ``wasted_energy_kj``,
    ``wasted_carbon_g``, ``ledger_ok``) in ``runs.csv``, their means in ``summary.csv``/``.md``,
    and ``failed_over`` per step.
``tensorboard/<scenario>/<policy>/seed_<k>/`` (:func:`write_tensorboard`)
    per-step scalars under the tags shared with training (:data:`eval.tb.TAGS`).

Every file is written under a temporary name in its directory and renamed to its own name once
complete (:func:`atomic_path`), so a full disk or a file size limit leaves no half-written file
presented as a result: the write raises :class:`~carbon_gym.errors.OutputWriteError` naming the
file (``carbon-gym`` prints it as one line and exits with status 1).

Everything except the decision (wall-clock) times is a deterministic function of the specs, so
re-running reproduces ``summary.csv`` bit for bit in every column not starting with
``decision_`` (:data:`eval.tables.NONDETERMINISTIC_PREFIXES`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from carbon_gym.errors import OutputWriteError

from eval.runner import RunResult, RunSpec
from eval.tables import fault_markdown, fault_pairs, fault_summary, runs_table, summarise, summary_markdown

__all__ = [
    "OutputWriter", "write_outputs", "write_fault_report", "write_table", "read_table", "write_tensorboard",
    "report_warnings", "versions", "matrix_dirs", "merged_head", "read_configs", "starts_line", "atomic_path",
    "write_text", "write_csv",
]


# ----------------------------------------------------------------------------------------------
# all-or-nothing files


def _reason(e: OSError) -> str:
    """The operating system's words for ``e`` (pyarrow's OSErrors carry an errno but long text)."""
    return os.strerror(e.errno) if e.errno else (e.strerror or str(e))


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    except OSError:
        pass


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary name next to ``path`` (same directory, hidden, same extension) to write to;
    renamed onto ``path`` (``os.replace``) when the block ends without error. On any error the
    temporary file is removed and ``path`` is left as it was (absent, or an earlier complete
    file); an :class:`OSError` (disk full, file size limit) becomes an
    :class:`~carbon_gym.errors.OutputWriteError` naming ``path``."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".tmp-{os.getpid()}-{base}")
    try:
        os.makedirs(d or ".", exist_ok=True)
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise OutputWriteError(path, _reason(e)) from None
    except BaseException:
        _remove(tmp)
        raise


def write_text(path: str, text: str) -> str:
    """Write ``text`` (UTF-8) to ``path`` all or nothing (:func:`atomic_path`); returns ``path``."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def write_csv(df: Any, path: str) -> str:
    """Write DataFrame ``df`` as CSV (no index) to ``path`` all or nothing; returns ``path``."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
    return path


# ----------------------------------------------------------------------------------------------
# finished matrices on disk


def matrix_dirs(results_dir: str, name: str) -> list[str]:
    """The finished matrices of experiment ``name`` under ``results_dir`` (those with a
    ``runs.csv``): ``<name>/`` first, then every ``<name>-*/<name>/`` (later runs written with
    ``--out <results_dir>/<name>-SOMETHING``) in name order."""
    import glob

    first = os.path.join(results_dir, name)
    more = sorted(glob.glob(os.path.join(results_dir, f"{name}-*", name)))
    return [d for d in [first, *more] if os.path.isfile(os.path.join(d, "runs.csv"))]


def merged_head(results_dir: str, dirs: Sequence[str]) -> str:
    """The head of a section merged over the matrices ``dirs`` of one experiment: each matrix's
    command, and which run a row takes where two matrices ran the same one."""
    cmds = [str(c.get("command")) for c in read_configs(dirs)]
    where = ", ".join(os.path.relpath(d, results_dir) for d in dirs)
    return ("```bash\n" + "\n".join(cmds) + "\n```\n\n" + f"{len(dirs)} matrices ({where}); where two ran the same "
            "scenario, policy and seed, the later one's run is the row's.")


def read_configs(dirs: Sequence[str]) -> list[dict[str, Any]]:
    """The ``config.json`` of each matrix directory in ``dirs``, in order."""
    out = []
    for d in dirs:
        with open(os.path.join(d, "config.json"), encoding="utf-8") as fh:
            out.append(json.load(fh))
    return out


# ----------------------------------------------------------------------------------------------
# fault report

def write_fault_report(results: Sequence[RunResult], out: str):
    """Write ``fault_report.csv`` / ``fault_report.md`` (:func:`fault_summary`) and
    ``fault_runs.csv`` (:func:`fault_pairs`) under ``out``; returns the summary, or None (and
    writes nothing) when no run of ``results`` has both faults and its fault-free twin."""
    pairs = fault_pairs(results)
    if pairs.empty:
        return None
    table = fault_summary(pairs)
    write_csv(pairs, os.path.join(out, "fault_runs.csv"))
    write_csv(table, os.path.join(out, "fault_report.csv"))
    write_text(os.path.join(out, "fault_report.md"), fault_markdown(table))
    return table


# ----------------------------------------------------------------------------------------------
# files


def write_table(columns: Mapping[str, np.ndarray] | Any, path_stem: str, fmt: str = "parquet") -> str:
    """Write a column dict or DataFrame as ``path_stem.parquet`` (or ``.csv``); returns the path.

    Parquet needs pyarrow; without it (or with ``fmt="csv"``) the table is written as CSV.
    """
    import pandas as pd

    df = columns if hasattr(columns, "to_parquet") else pd.DataFrame({k: np.asarray(v) for k, v in columns.items()})
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401

            path = path_stem + ".parquet"
            with atomic_path(path) as tmp:
                df.to_parquet(tmp, index=False)
            return path
        except ImportError:
            pass
    return write_csv(df, path_stem + ".csv")


def read_table(path_stem_or_path: str):
    """Read a table written by :func:`write_table` (given the stem or the full path)."""
    import pandas as pd

    p = path_stem_or_path
    if p.endswith(".parquet"):
        return pd.read_parquet(p)
    if p.endswith(".csv"):
        return pd.read_csv(p)
    if os.path.exists(p + ".parquet"):
        return pd.read_parquet(p + ".parquet")
    return pd.read_csv(p + ".csv")


def write_tensorboard(result: RunResult, root: str, reduction_pct: float | None = None) -> str:
    """Write one run's per-step scalars (and the final reduction) under ``root``; returns its dir.
    The event file is written in a hidden temporary folder next to the run's and moved in once
    complete; only then are the event files an earlier run left there removed, so a rerun
    replaces the run rather than merging into it, and a failed write (an
    :class:`~carbon_gym.errors.OutputWriteError` naming the run's folder) leaves the earlier run,
    or nothing, rather than half a run."""
    from eval.tb import ScalarWriter, run_dir

    d = run_dir(root, result.spec.scenario_name, result.spec.policy_name, result.spec.seed)
    parent, leaf = os.path.split(d)
    tmp = os.path.join(parent, f".tmp-{os.getpid()}-{leaf}")
    try:
        _remove(tmp)
        with ScalarWriter(tmp) as w:
            _tensorboard_scalars(w, result.steps, reduction_pct)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.startswith("events.out.tfevents"):
                os.remove(os.path.join(d, f))
        for f in os.listdir(tmp):
            os.replace(os.path.join(tmp, f), os.path.join(d, f))
        os.rmdir(tmp)
    except OSError as e:
        _remove(tmp)
        raise OutputWriteError(d, _reason(e)) from None
    except BaseException:
        _remove(tmp)
        raise
    return d


def _tensorboard_scalars(w: Any, steps: Mapping[str, Any], reduction_pct: float | None) -> None:
    from eval.tb import TAGS

    cols = {
        TAGS.carbon_step_g: "carbon_g",
        TAGS.carbon_cumulative_g: "cumulative_carbon_g",
        TAGS.energy_step_j: "energy_j",
        TAGS.slo_violations: "violations",
        TAGS.slo_violation_rate: "violation_rate",
        TAGS.ttft_p50_s: "ttft_p50_s",
        TAGS.ttft_p99_s: "ttft_p99_s",
        TAGS.tpot_p50_s: "tpot_p50_s",
        TAGS.tpot_p99_s: "tpot_p99_s",
        TAGS.decision_time_s: "decision_s",
    }
    n = len(steps.get("step", ()))
    arrays = {tag: np.asarray(steps[c], dtype=np.float64) for tag, c in cols.items() if c in steps}
    for i in range(n):
        step = int(steps["step"][i])
        for tag, a in arrays.items():
            w.scalar(tag, a[i], step)
    if reduction_pct is not None:
        w.scalar(TAGS.reduction_vs_rr_pct, reduction_pct, max(n - 1, 0))


def report_warnings(results: Sequence[RunResult], stream: Any = None) -> list[str]:
    """Print each distinct warning the runs recorded (env construction) once, as ``note:`` lines."""
    seen = list(dict.fromkeys(w for r in results for w in r.meta.get("warnings", [])))
    for w in seen:
        print(f"carbon-gym: note: {w}", file=stream or sys.stderr)
    return seen


def versions() -> dict[str, str]:
    """Versions of Python and the packages that shape results."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    from importlib import metadata

    try:
        import subprocess

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # (read only: no index refresh, whose index.lock a killed git - a timeout, a file size
        # limit's SIGXFSZ - would leave behind, blocking the user's next git command)
        env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             env=env)
        if rev.returncode == 0:
            dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, timeout=5, env=env)
            out["git"] = rev.stdout.strip() + ("+modified" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    for pkg in ("carbon-gym", "numpy", "gymnasium", "pyomo", "highspy", "pandas", "pyarrow", "matplotlib", "torch", "stable-baselines3", "ray"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


class OutputWriter:
    """Writes each run's records as it arrives and the tables at the end (``on_result`` hook)."""

    def __init__(self, out: str, *, requests: bool = True, steps: bool = True, fmt: str = "parquet"):
        self.out = out
        self.requests = requests
        self.steps = steps
        self.fmt = fmt
        os.makedirs(out, exist_ok=True)
        self.paths: dict[str, dict[str, str]] = {}

    def __call__(self, result: RunResult) -> None:
        paths = {}
        rid = result.spec.run_id
        if self.requests and result.requests:
            paths["requests"] = write_table(result.requests, os.path.join(self.out, "requests", rid), self.fmt)
        if self.steps and result.steps:
            paths["steps"] = write_table(result.steps, os.path.join(self.out, "steps", rid), self.fmt)
        result.requests = {}  # free memory: the records are on disk now
        self.paths[rid] = paths


def write_outputs(
    results: Sequence[RunResult],
    out: str,
    *,
    command: str | None = None,
    tensorboard: str | None = None,
    extra_config: Mapping[str, Any] | None = None,
):
    """Write runs.csv, summary.csv, summary.md, config.json (and TensorBoard runs); return the summary."""
    os.makedirs(out, exist_ok=True)
    runs = runs_table(results)
    summary = summarise(runs)
    write_csv(runs, os.path.join(out, "runs.csv"))
    write_csv(summary, os.path.join(out, "summary.csv"))
    write_text(os.path.join(out, "summary.md"), summary_markdown(summary))
    if tensorboard:
        red = {(r.spec.scenario_name, r.spec.policy_name, r.spec.seed): v for r, v in zip(results, runs["reduction_vs_rr_pct"])}
        for r in results:
            write_tensorboard(r, tensorboard, red.get((r.spec.scenario_name, r.spec.policy_name, r.spec.seed)))
    config = {
        "command": command,
        "versions": versions(),
        "runs": [
            {**_spec_json(r.spec), **{k: v for k, v in r.meta.items() if _jsonable(v)}}
            for r in results
        ],
    }
    if extra_config:
        config.update(extra_config)
    write_text(os.path.join(out, "config.json"), json.dumps(config, indent=1, default=str))
    return summary


def _spec_json(spec: RunSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["overrides"] = dict(spec.overrides)
    d["policy_kwargs"] = dict(spec.policy_kwargs)
    d["run_id"] = spec.run_id
    return d


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def _heldout_day(start_utc: str) -> bool:
    """Whether an episode starting at ``start_utc`` (ISO) starts on a held-out day of the year."""
    from datetime import datetime

    from train.envs import is_heldout_day

    return bool(is_heldout_day(datetime.fromisoformat(start_utc.replace("Z", "+00:00")).timetuple().tm_yday, 4))


def starts_line(runs_meta: Sequence[Mapping[str, Any]]) -> str:
    """The ``- starts: <K>`` line of "How it was produced" from a matrix's config ``runs``: one seed
    list for every scenario, or (``--heldout-seeds``) each scenario's own, with its starts (day x hour)."""
    def _starts(rs: Sequence[Mapping[str, Any]]) -> str:
        st = sorted({str(r["start_utc"])[:13] for r in rs if r.get("start_utc")})
        return ", ".join(st[:12]) + (" ..." if len(st) > 12 else "")

    per: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs_meta:
        per.setdefault(str(r.get("scenario_label") or r.get("scenario")), []).append(r)
    seed_sets = {sc: sorted({int(r["seed"]) for r in rs}) for sc, rs in per.items()}
    if len({tuple(v) for v in seed_sets.values()}) <= 1:
        seeds = next(iter(seed_sets.values()), [])
        return (f"- starts: {len(seeds)} (seeds {', '.join(map(str, seeds))}; episode starts spread over the 2023 carbon year, "
                f"day x hour: {_starts(runs_meta)})")
    counts = sorted({len(v) for v in seed_sets.values()})
    held = [_heldout_day(str(r["start_utc"])) for r in runs_meta if r.get("start_utc")]
    if held and all(held):
        kind = "fresh held-out seeds, `--heldout-seeds`: days the shipped learned agent never saw"
    elif held and not any(held):
        kind = "training seeds, `--training-seeds`: no held-out day, where knobs are chosen"
    else:
        kind = "seeds"
    lines = [f"- starts: {'/'.join(map(str, counts))} per scenario (each scenario its own {kind}; spread over the 2023 carbon year, day x hour):"]
    lines += [f"  - {sc}: seeds {', '.join(map(str, v))} ({_starts(per[sc])})" for sc, v in seed_sets.items()]
    return "\n".join(lines)
