"""eval.versus: rows of capacity matrices against a policy of another matrix, paired by start."""

from __future__ import annotations

import pandas as pd
import pytest

from eval.capacity_report import ALWAYS_ON_LABEL
from eval.stats import mean_ci95
from eval.versus import main, versus_table


def _run(policy: str, seed: int, carbon: float, viol: float = 0.0, ok: bool = True) -> dict:
    return {"scenario": "s", "policy": policy, "seed": seed, "carbon_g": carbon, "slo_violation_pct": viol,
            "mlperf_p99_pass": ok, "unfinished_pct": 0.0}


def _tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    ref = pd.DataFrame([_run(ALWAYS_ON_LABEL, 0, 100.0), _run(ALWAYS_ON_LABEL, 1, 200.0),
                        _run("rr+reactive", 0, 80.0), _run("rr+reactive", 1, 150.0)])
    other = pd.DataFrame([_run(ALWAYS_ON_LABEL, 0, 100.0), _run(ALWAYS_ON_LABEL, 1, 200.0), _run(ALWAYS_ON_LABEL, 2, 300.0),
                          _run("milp", 0, 40.0, 0.5), _run("milp", 1, 60.0, 1.5, ok=False), _run("milp", 2, 1.0)])
    return ref, other


def test_paired_reduction_only_on_starts_both_ran():
    ref, other = _tables()
    t = versus_table(ref, "rr+reactive", [other], ["m"]).set_index("policy")
    m, ci = mean_ci95([50.0, 60.0])  # (80 - 40) / 80, (150 - 60) / 150; seed 2 is not in the reference
    assert t.loc["milp", "reduction_pct"] == pytest.approx(m) and t.loc["milp", "reduction_ci95"] == pytest.approx(ci)
    assert t.loc["milp", "seeds"] == 2 and t.loc["milp", "p99_pass"] == 1 and t.loc["milp", "violation_pct"] == pytest.approx(1.0)
    assert t.loc[ALWAYS_ON_LABEL, "reduction_pct"] == pytest.approx(mean_ci95([-25.0, -100.0 / 3.0])[0])
    assert set(t["matrix"]) == {"m"}


def test_a_different_episode_is_refused_naming_the_start():
    ref, other = _tables()
    other.loc[1, "carbon_g"] = 200.0 + 1e-9  # seed 1's always-on rr is not the reference's
    with pytest.raises(ValueError, match="s seed 1"):
        versus_table(ref, "rr+reactive", [other])
    with pytest.raises(ValueError, match="no 'nope' run"):
        versus_table(ref, "nope", [other])


def test_cli_prints_the_table_and_names_bad_input(tmp_path, capsys):
    ref, other = _tables()
    (tmp_path / "r").mkdir()
    (tmp_path / "o").mkdir()
    ref.to_csv(tmp_path / "r" / "runs.csv", index=False)
    other.to_csv(tmp_path / "o" / "runs.csv", index=False)
    assert main([str(tmp_path / "r"), "rr+reactive", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "| milp | 2 | 55.0 ± " in out and "| 1/2 |" in out
    with pytest.raises(SystemExit, match="no runs.csv"):
        main([str(tmp_path / "r"), "rr+reactive", str(tmp_path / "missing")])
