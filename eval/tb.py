"""TensorBoard scalars shared by the evaluation harness and training.

Every evaluation run (one scenario x policy x seed) and every training run writes its domain
scalars under the same tag names, so one TensorBoard overlays MILP, baselines and learned agents.
Import :data:`TAGS` rather than spelling tags by hand::

    from eval.tb import TAGS, ScalarWriter
    with ScalarWriter("runs/eval/llama8b-moderate/milp/seed_0") as w:
        w.scalar(TAGS.carbon_step_g, 12.5, step=0)

The writer uses TensorBoard's own record format and protos (imported lazily: ``import eval.tb``
does not import tensorboard or torch), which is much lighter than ``torch.utils.tensorboard``.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import socket
import time
from dataclasses import astuple, dataclass, fields
from typing import Any, Iterator, Mapping


@dataclass(frozen=True)
class _Tags:
    """TensorBoard tag names of the domain scalars (units in the tag or below)."""

    carbon_step_g: str = "carbon/step_g"                 # gCO2eq emitted in the step (all DCs)
    carbon_cumulative_g: str = "carbon/cumulative_g"     # gCO2eq since the episode start
    energy_step_j: str = "energy/step_j"                 # facility energy of the step, J
    slo_violations: str = "slo/violations"               # requests completed in the step that violated
    slo_violation_rate: str = "slo/violation_rate"       # cumulative violating / completed (0..1)
    ttft_p50_s: str = "latency/ttft_p50_s"               # over requests completed in the step, s
    ttft_p99_s: str = "latency/ttft_p99_s"
    tpot_p50_s: str = "latency/tpot_p50_s"
    tpot_p99_s: str = "latency/tpot_p99_s"
    decision_time_s: str = "decision/time_s"             # wall time of policy.act, s
    reduction_vs_rr_pct: str = "eval/reduction_vs_rr_pct"  # written once at the end of a run

    def __iter__(self) -> Iterator[str]:
        return iter(astuple(self))

    def names(self) -> tuple[str, ...]:
        """Field names (``carbon_step_g``, ...) in the same order as iteration yields tags."""
        return tuple(f.name for f in fields(self))


TAGS = _Tags()
"""The tag names. ``TAGS.carbon_step_g == "carbon/step_g"``; ``list(TAGS)`` lists them all."""

_SAFE = re.compile(r"[^A-Za-z0-9_.=+-]+")


def run_dir(root: str | os.PathLike, scenario: str, policy: str, seed: int) -> str:
    """Directory of one run under a TensorBoard root: ``root/<scenario>/<policy>/seed_<seed>``.

    Names are sanitised (path separators and spaces become ``_``) so a scenario given as a
    file path still yields one directory level.
    """
    scen = _SAFE.sub("_", os.path.splitext(os.path.basename(str(scenario)))[0]) or "scenario"
    pol = _SAFE.sub("_", str(policy)) or "policy"
    return os.path.join(os.fspath(root), scen, pol, f"seed_{int(seed)}")


_FILE_IDS = itertools.count()


class ScalarWriter:
    """Append scalar summaries to a TensorBoard event file in ``logdir``.

    Non-finite values (NaN, inf) and ``None`` are skipped, never written, so that a step with
    no completed request simply has no latency point. ``wall_time`` defaults to the current
    time (TensorBoard's "relative" axis); ``step`` orders the points.

    Records go through an ordinary buffered file in the calling thread (TensorBoard's record
    format and protos, not its background-thread writer), so a failed write (a full disk, a
    file size limit) raises its ``OSError`` here, from :meth:`scalar`, :meth:`flush` or
    :meth:`close`, rather than in a thread that prints a traceback and drops it.
    """

    def __init__(self, logdir: str | os.PathLike, *, filename_suffix: str = ""):
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.record_writer import RecordWriter
        except ImportError as exc:  # pragma: no cover - tensorboard is in the [train] extra
            raise ImportError(
                "TensorBoard logging needs the 'tensorboard' package: pip install 'carbon-gym[train]'"
            ) from exc
        self._Event = Event
        self._Summary = Summary
        os.makedirs(logdir, exist_ok=True)
        self.logdir = os.fspath(logdir)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILE_IDS)}"
        self.path = os.path.join(self.logdir, name + filename_suffix)
        self._file = open(self.path, "wb")
        self._writer = RecordWriter(self._file)
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def _write(self, event: Any) -> None:
        try:
            self._writer.write(event.SerializeToString())
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Close the file after a failed write without flushing it again (its error is raised)."""
        try:
            self._file.close()
        except OSError:
            pass

    def scalar(self, tag: str, value: Any, step: int, wall_time: float | None = None) -> bool:
        """Write one scalar; returns False (and writes nothing) for None/NaN/inf."""
        if value is None:
            return False
        v = float(value)
        if not math.isfinite(v):
            return False
        summary = self._Summary(value=[self._Summary.Value(tag=tag, simple_value=v)])
        self._write(self._Event(wall_time=time.time() if wall_time is None else wall_time, step=int(step), summary=summary))
        return True

    def scalars(self, values: Mapping[str, Any], step: int) -> int:
        """Write several ``{tag: value}`` scalars at one step; returns how many were written."""
        return sum(self.scalar(tag, v, step) for tag, v in values.items())

    def flush(self) -> None:
        try:
            self._file.flush()
        except BaseException:
            self._abandon()
            raise

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> ScalarWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:  # (already failing: do not flush again, keep that error)
            self._abandon()
        else:
            self.close()


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Read every scalar under one run directory: ``{tag: [(step, value), ...]}`` sorted by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.fspath(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    out: dict[str, list[tuple[int, float]]] = {}
    for tag in acc.Tags().get("scalars", []):
        out[tag] = sorted((e.step, float(e.value)) for e in acc.Scalars(tag))
    return out
