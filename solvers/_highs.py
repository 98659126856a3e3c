"""Small helpers around highspy shared by the schedulers."""

from __future__ import annotations

from typing import Any


def new_highs(threads: int = 1) -> Any:
    """A silent ``highspy.Highs`` on ``threads`` threads with a fixed random seed."""
    import highspy

    h = highspy.Highs()
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
