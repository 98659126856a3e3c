"""eval/fault_report.py: paired runs with and without the faults, per scheduler (one seed)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("solvers")

from carbon_gym.env import GeoServeEnv  # noqa: E402
from carbon_gym.faults import without_faults  # noqa: E402
from carbon_gym.policy import RoundRobinPolicy, rollout  # noqa: E402
from carbon_gym.scenario import load_scenario  # noqa: E402
from eval.fault_report import fault_report, format_fault_report, main  # noqa: E402


def test_fault_report_rows_match_the_paired_runs():
    ov = {"duration_s": 40.0}
    rows = fault_report("dev-fault-region", policies=["round-robin", "carbon-greedy"], seed=1, overrides=ov)
    assert [r["policy"] for r in rows] == ["rr", "greedy"]
    # the report keeps the scenario's own carbon start: the same runs as a plain rollout
    sc = load_scenario("dev-fault-region", overrides=ov)
    m = rollout(GeoServeEnv(sc), RoundRobinPolicy(), seed=1)
    b = rollout(GeoServeEnv(without_faults(sc)), RoundRobinPolicy(), seed=1)
    r = rows[0]
    assert r["failed_over"] == m["failed_over"] > 0 and r["failed_over_completed"] == m["failed_over_completed"]
    assert r["failed_over_base"] == b["failed_over"] == 0
    assert r["slo_violations"] == m["violations"] and r["slo_violations_base"] == b["violations"]
    assert r["slo_violation_pct"] == pytest.approx(100 * m["violation_rate"])
    assert r["slo_violation_pp"] == pytest.approx(100 * (m["violation_rate"] - b["violation_rate"]))
    assert r["carbon_g"] == m["carbon_g"] and r["carbon_g_base"] == b["carbon_g"]
    assert r["extra_carbon_g"] == m["carbon_g"] - b["carbon_g"]
    assert r["extra_carbon_pct"] == pytest.approx(100 * (m["carbon_g"] - b["carbon_g"]) / b["carbon_g"])
    assert r["wasted_energy_kj"] == pytest.approx(m["ledger"]["wasted_energy_j"] / 1e3) and r["wasted_energy_kj"] > 0
    assert r["ledger_ok"] is True and m["ledger"]["ok"] and b["ledger"]["ok"]
    # the fault-free twin has the same arrivals
    assert r["arrived"] == b["arrived"] == m["arrived"]
    text = format_fault_report(rows)
    assert "failed over" in text and "extra (%)" in text and len(text.splitlines()) == 4


def test_fault_report_cli(tmp_path, capsys):
    out = tmp_path / "r.json"
    main(["--scenario", "dev-fault", "--policies", "round-robin", "--override", "duration_s=30", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "fault report: scenario dev-fault" in printed and "| rr |" in printed
    assert json.loads(out.read_text())[0]["policy"] == "rr"
    with pytest.raises(SystemExit) as e:
        main(["--scenario", "dev"])
    assert e.value.code == 2 and "has no [[faults]]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--scenario", "dev-fault", "--policies", "nope"])
    assert e.value.code == 2 and "unknown policy 'nope'" in capsys.readouterr().err
