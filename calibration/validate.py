"""``calibrate validate``: the shipped parameter files against every bundled measured point.

Groups (each row: measured, model, signed error):

* **iteration** - every attention anchor of the shipped A100 profile as a whole iteration
  (token-level operators from the profile + attention + KV save, x layers), against the shipped
  ``a100-80gb__llama-3.1-8b__tp1`` file's kernel time;
* **token-level** - the shipped Llama-3.1-8B TP1/2/4 files' token-level time at every measured
  profile row (one row per TP degree: the largest error);
* **power** - every published serving point (``measurements/serving_power.csv``) against the
  shipped power file of its GPU at its mean running batch;
* **serving** - the published median inter-token latencies (ML.ENERGY v3, H100, vLLM 0.11.1)
  against the shipped ``h100-80gb__llama-3.1-8b__tp1`` step time at that batch with
  ``CONTEXT_TOKENS`` of context per sequence (the published runs mix chunked prefill into some
  steps and their prompt lengths are not published: an approximate comparison).

The last line is ``max_abs_error_pct=<x>`` over every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from carbon_gym.physics.latency import load_latency_model
from carbon_gym.physics.power import load_power_model
from carbon_gym.specs import load_model_spec

from .io import SHIPPED_ATTENTION, SHIPPED_MLP_CSV, load_attention_anchors, load_operator_profile
from .overhead import CONTEXT_TOKENS
from .power_fit import load_serving_points
from .profile_fit import evaluate_iterations, measured_linear_s


@dataclass(frozen=True)
class ValidationRow:
    """One comparison."""

    group: str
    what: str
    measured: float
    model: float
    unit: str

    @property
    def error_pct(self) -> float:
        """Signed error of the model, percent of the measurement."""
        return (self.model - self.measured) / self.measured * 100.0


def validation_rows() -> list[ValidationRow]:
    """Every comparison (see the module docstring)."""
    rows: list[ValidationRow] = []
    spec = load_model_spec("llama-3.1-8b")
    profiles = load_operator_profile(SHIPPED_MLP_CSV)
    anchors = load_attention_anchors(SHIPPED_ATTENTION)
    lat = load_latency_model("a100-80gb", "llama-3.1-8b", 1)
    for c in evaluate_iterations(lat, profiles[1], anchors, spec.layers):
        rows.append(ValidationRow("iteration", f"a100-80gb {c.kind} {c.size} kv {c.kv}", c.measured_s * 1e3,
                                  c.model_s * 1e3, "ms"))
    for tp in (1, 2, 4):
        m, prof = load_latency_model("a100-80gb", "llama-3.1-8b", tp), profiles[tp]
        pred = np.array([m.linear_time_s(float(t)) for t in prof.tokens])
        meas = measured_linear_s(prof, spec.layers, prof.tokens)
        i = int(np.argmax(np.abs(pred - meas) / meas))
        rows.append(ValidationRow("token-level", f"a100-80gb tp{tp}, worst of {prof.tokens.size} rows ({int(prof.tokens[i])} "
                                  f"tokens)", meas[i] * 1e3, pred[i] * 1e3, "ms"))
    for p in load_serving_points():
        pm = load_power_model(p.gpu)
        n = max(1, int(round(p.mean_batch)))
        rows.append(ValidationRow("power", f"{p.gpu} {p.source} {p.label} (batch {n})", p.avg_gpu_power_w,
                                  pm.gpu_power_w(0, n), "W"))
        if np.isfinite(p.median_itl_s):
            m = load_latency_model(p.gpu, "llama-3.1-8b", 1)
            rows.append(ValidationRow("serving", f"{p.gpu} {p.source} median ITL, batch {n}", p.median_itl_s * 1e3,
                                      m.iteration_time_s(0, 0.0, n, n * CONTEXT_TOKENS, n) * 1e3, "ms"))
    return rows


def validation_lines(rows: list[ValidationRow]) -> list[str]:
    """The table, a summary per group and the last line ``max_abs_error_pct=<x>``."""
    lines = [f"  {'group':<12s}{'point':<58s}{'measured':>11s}{'model':>11s}{'unit':>5s}{'err_%':>8s}"]
    for r in rows:
        lines.append(f"  {r.group:<12s}{r.what:<58s}{r.measured:>11.3f}{r.model:>11.3f}{r.unit:>5s}{r.error_pct:>8.2f}")
    lines.append("summary (MAPE / max |error| per group):")
    for g in dict.fromkeys(r.group for r in rows):
        e = np.abs([r.error_pct for r in rows if r.group == g])
        lines.append(f"  {g:<12s} {len(e):>3d} points  MAPE {e.mean():6.2f}%  max {e.max():6.2f}%")
    lines.append("not compared: ML.ENERGY v1 end-to-end latency per request (A100-40GB, vLLM 0.4.2): the runs' "
                 "request lengths are not published")
    lines.append(f"max_abs_error_pct={max(abs(r.error_pct) for r in rows):.2f}")
    return lines
