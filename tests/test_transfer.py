"""``eval.transfer``: the per-model transfer matrix from a headline matrix's runs (hand-made runs
with known reductions)."""

from __future__ import annotations

import pandas as pd
import pytest

from eval.transfer import main, transfer_markdown, transfer_rows


def _runs() -> pd.DataFrame:
    rows = []
    for scen, milp_c, agents in [("llama8b-moderate", 60.0, {"learned-a": 64.0, "learned-b": 80.0}),
                                 ("mixtral8x7b-high", 70.0, {"learned-a": 85.0, "learned-b": 73.0})]:
        for seed in (1, 2):
            rows.append({"scenario": scen, "policy": "rr", "seed": seed, "carbon_g": 100.0, "slo_violation_pct": 0.0,
                         "mlperf_p99_pass": 1, "run_valid": 1})
            rows.append({"scenario": scen, "policy": "milp", "seed": seed, "carbon_g": milp_c, "slo_violation_pct": 1.0,
                         "mlperf_p99_pass": 1, "run_valid": 1})
            for a, c in agents.items():
                rows.append({"scenario": scen, "policy": a, "seed": seed, "carbon_g": c + seed - 1.5,
                             "slo_violation_pct": 1.0 + seed, "mlperf_p99_pass": seed % 2, "run_valid": 1})
    return pd.DataFrame(rows)


def test_shares_and_matrix():
    rows = transfer_rows(_runs(), ["learned-a", "learned-b"])
    by = {(r["scenario"], r["agent"]): r for r in rows}
    r = by[("llama8b-moderate", "learned-a")]
    assert r["milp_reduction_pct"] == pytest.approx(40.0) and r["agent_reduction_pct"] == pytest.approx(36.0)
    assert r["share_of_milp"] == pytest.approx(0.9) and r["violation_diff_pp"] == pytest.approx(1.5)
    assert r["agent_p99_pass"] == 1 and r["starts"] == 2
    assert by[("mixtral8x7b-high", "learned-b")]["share_of_milp"] == pytest.approx(27.0 / 30.0)
    md = transfer_markdown(rows, ["learned-a", "learned-b"])
    assert "| learned-a | 90% (+1.50) | 50% (+1.50) |" in md
    assert "| learned-b | 50% (+1.50) | 90% (+1.50) |" in md


def test_cli(tmp_path, capsys):
    _runs().to_csv(tmp_path / "runs.csv", index=False)
    assert main([str(tmp_path)]) == 0
    assert "| llama8b | mixtral8x7b |" in capsys.readouterr().out
    assert main([str(tmp_path), "--agents", "learned-z"]) == 2
    assert "learned-z" in capsys.readouterr().err
    assert main([str(tmp_path / "nowhere")]) == 2
