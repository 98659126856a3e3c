"""eval.polling_probe: the probe only reads (same episode with and without it), records from its
window on, and its table pairs the reduction by seed against rr at the same period."""

from __future__ import annotations

import warnings

import pytest

from eval.polling_probe import ProgramProbe, probe_table
from eval.runner import RunSpec, run_one


def test_probe_reads_only_and_records_from_the_window_on() -> None:
    spec = RunSpec("dev", "milp", 0, overrides=(("duration_s", 12.0),))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = run_one(spec, keep_requests=False)
        early, late = ProgramProbe(0.0), ProgramProbe(6.0)
        probed = run_one(spec, keep_requests=False, observers=[early, late])
    assert probed.metrics["carbon_g"] == plain.metrics["carbon_g"]
    assert probed.metrics["slo_violation_pct"] == plain.metrics["slo_violation_pct"]
    n_early, n_late = len(early.rows["floor"]), len(late.rows["floor"])
    assert 0 < n_late < n_early <= plain.metrics["steps"]
    for rows in (early.rows, late.rows):
        assert {len(v) for v in rows.values()} == {len(rows["floor"])}
        assert all(0.0 <= v <= 1.0 for k in ("floor", "theta_binds") for v in rows[k])
        assert all(v >= 0.0 for k in ("clean_left", "clean_backlog") for v in rows[k])


def test_probe_table_pairs_the_reduction_by_seed() -> None:
    base = dict(viol_pct=1.0, floor_pct=0.0, theta_binds_pct=0.0, clean_left_pct=50.0, clean_backlog_pct=10.0,
                uplink_ms=70.0, queue_ms=100.0, active_g_per_kwh=300.0, cpu_s=1.0)
    rows = [
        {**base, "period_s": 1.0, "policy": "rr", "seed": 1, "carbon_g": 100.0},
        {**base, "period_s": 1.0, "policy": "rr", "seed": 2, "carbon_g": 200.0},
        {**base, "period_s": 1.0, "policy": "milp", "seed": 1, "carbon_g": 80.0},   # 20% below rr
        {**base, "period_s": 1.0, "policy": "milp", "seed": 2, "carbon_g": 120.0},  # 40% below rr
    ]
    lines = probe_table(rows).splitlines()
    milp = next(x for x in lines if "| milp |" in x).split("|")
    assert float(milp[3]) == pytest.approx(30.0)  # the mean of the paired reductions, not 1 - 200/300
    assert float(milp[7]) == pytest.approx(50.0) and float(milp[11]) == pytest.approx(300.0)
