"""TensorBoard tag names of the domain scalars, identical to ``eval.tb.TAGS``.

``train`` sits below ``eval`` in the dependency order (eval imports train, not the reverse), so
the names are repeated here; ``tests/test_train.py`` checks they equal ``eval.tb.TAGS`` one by one.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Iterator

__all__ = ["TAGS"]


@dataclass(frozen=True)
class _Tags:
    carbon_step_g: str = "carbon/step_g"                 # gCO2eq emitted in the step (all DCs)
    carbon_cumulative_g: str = "carbon/cumulative_g"     # gCO2eq of the whole evaluation episode
    energy_step_j: str = "energy/step_j"                 # facility energy of the step, J
    slo_violations: str = "slo/violations"               # requests completed in the step that violated
    slo_violation_rate: str = "slo/violation_rate"       # violating / completed (0..1)
    ttft_p50_s: str = "latency/ttft_p50_s"
    ttft_p99_s: str = "latency/ttft_p99_s"
    tpot_p50_s: str = "latency/tpot_p50_s"
    tpot_p99_s: str = "latency/tpot_p99_s"
    decision_time_s: str = "decision/time_s"             # wall time of policy.act, s
    reduction_vs_rr_pct: str = "eval/reduction_vs_rr_pct"

    def __iter__(self) -> Iterator[str]:
        return iter(astuple(self))


TAGS = _Tags()
