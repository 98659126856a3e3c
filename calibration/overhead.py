"""Calibrate the per-iteration framework overhead ``overhead_s`` from published vLLM step times.

The one latency term a kernel profile cannot see is the engine's CPU work on the critical path
of each step (scheduler, input preparation, sampler synchronisation, output processing). Source:
the median inter-token latency (ITL) that ML.ENERGY benchmark v3 publishes for vLLM 0.11.1
serving Llama-3.1-8B on one H100 at fixed batch sizes (``measurements/serving_power.csv``).
At small batches (<= ``MAX_BATCH``) a decode step is the weight read plus little attention, so

    overhead = median ITL - model step time without overhead

with the model the H100 set derived from the A100 profile (:func:`calibration.derive.derive_for_gpu`),
at ``CONTEXT_TOKENS`` tokens of context per sequence (LM-Arena prompts plus half of the ~390-token
mean output; the attention at these batches is < 5% of the step, so the assumption moves the
result by < 0.1 ms). The estimate is the mean over those batches, clamped at 0. Its uncertainty
is the derivation's own error at decode sizes (A100 -> H100 roofline scaling checked against
Vidur's measured H100 Llama-2-7B profile: within +-4% up to 96 tokens, i.e. +-0.3 ms here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_BATCH = 32
CONTEXT_TOKENS = 1000.0
ITL_GPU = "h100-80gb"


@dataclass(frozen=True)
class OverheadFit:
    """Per-batch estimates (batch, measured ITL s, model step without overhead s) and their mean."""

    rows: tuple[tuple[int, float, float], ...]
    overhead_s: float

    def report_lines(self) -> list[str]:
        """Table of the estimate."""
        lines = [f"framework overhead from published vLLM step times ({ITL_GPU}, batches <= {MAX_BATCH}, "
                 f"{CONTEXT_TOKENS:g} context tokens per sequence):",
                 f"  {'batch':>6s}{'median_ITL_ms':>15s}{'model_ms':>10s}{'residual_ms':>13s}"]
        for b, itl, m in self.rows:
            lines.append(f"  {b:>6d}{itl * 1e3:>15.3f}{m * 1e3:>10.3f}{(itl - m) * 1e3:>13.3f}")
        lines.append(f"  overhead_s = max(0, mean residual) = {self.overhead_s * 1e3:.3f} ms")
        return lines


def fit_overhead_from_itl() -> OverheadFit:
    """Estimate ``overhead_s`` (see the module docstring)."""
    from .derive import derive_for_gpu
    from .power_fit import load_serving_points

    model = derive_for_gpu("llama-3.1-8b", 1, ITL_GPU, overhead_s=0.0).model()
    rows = []
    for p in load_serving_points():
        if p.gpu != ITL_GPU or not np.isfinite(p.median_itl_s) or p.mean_batch > MAX_BATCH:
            continue
        b = int(round(p.mean_batch))
        rows.append((b, p.median_itl_s, model.iteration_time_s(0, 0.0, b, b * CONTEXT_TOKENS, b)))
    resid = float(np.mean([itl - m for _, itl, m in rows]))
    return OverheadFit(tuple(rows), max(0.0, resid))
