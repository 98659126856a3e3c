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
