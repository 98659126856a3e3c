"""Small helpers around highspy shared by the schedulers."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

_banner_shown = [False]  # HiGHS prints its banner when the process's first instance is made


def _without_stdout(make: Callable[[], Any]) -> Any:
    """Call ``make()`` with the process's file descriptor 1 sent to /dev/null (the banner is
    written by C code, below ``sys.stdout``); falls back to a plain call where fd 1 cannot be
    redirected."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (AttributeError, OSError, ValueError):
        return make()
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            try:
                return make()
            finally:
                os.dup2(saved, 1)
    finally:
        os.close(saved)


def new_highs(threads: int = 1) -> Any:
    """A silent ``highspy.Highs`` on ``threads`` threads with a fixed random seed (not even the
    copyright banner HiGHS prints when a process makes its first instance)."""
    import highspy

    if _banner_shown[0]:
        h = highspy.Highs()
    else:
        h = _without_stdout(highspy.Highs)
        _banner_shown[0] = True
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("random_seed", 0)
    return h


def run(h: Any) -> Any:
    """``h.run()``, once more after resetting HiGHS's global thread pool if the first run is
    refused: HiGHS sizes one process-wide scheduler at its first run, and a later instance asking
    for another ``threads`` value is refused with ``kError`` (model status "Not Set")."""
    import highspy

    status = h.run()
    if status == highspy.HighsStatus.kError and h.getModelStatus() == highspy.HighsModelStatus.kNotset:
        h.resetGlobalScheduler(True)
        status = h.run()
    return status


def rowwise_model(threads: int, cost: Any, lo: Any, hi: Any, integrality: Any,
                  rows: list[tuple[dict[int, float], float, float]]) -> Any:
    """A silent ``highspy.Highs`` (:func:`new_highs`) holding the minimisation of ``cost @ x``
    over ``lo <= x <= hi`` (``integrality``: HiGHS variable types) subject to each row
    ``(coefficients {column: value}, row lower, row upper)``, passed row-wise with the
    coefficients of each row in column order."""
    import highspy
    import numpy as np

    start = [0]
    index: list[int] = []
    value: list[float] = []
    for coefs, _, _ in rows:
        for k in sorted(coefs):
            index.append(k)
            value.append(coefs[k])
        start.append(len(index))
    h = new_highs(threads)
    h.passModel(len(cost), len(rows), len(index), int(highspy.MatrixFormat.kRowwise), int(highspy.ObjSense.kMinimize), 0.0,
                cost, lo, hi, np.array([r[1] for r in rows]), np.array([r[2] for r in rows]),
                np.array(start, dtype=np.int32), np.array(index, dtype=np.int32), np.array(value), integrality)
    return h
