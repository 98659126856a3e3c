"""Policies compared at equal p99 pass (eval/slo_compare.py): the best setting passing MLPerf p99
in every start, invalid and failing settings left out, the MILP's point minus each policy's
paired by start."""

from __future__ import annotations

import pandas as pd
import pytest

from eval.slo_compare import best_within_slo, best_within_slo_markdown


def _runs() -> pd.DataFrame:
    rows = []

    def add(label: str, carbon: list[float], passes: list[bool], valid: list[bool] | None = None, viol: float = 0.1) -> None:
        for i, seed in enumerate((1, 2)):
            rows.append({"scenario": "s", "policy": label, "seed": seed, "carbon_g": carbon[i], "mlperf_p99_pass": passes[i],
                         "run_valid": True if valid is None else valid[i], "slo_violation_pct": viol,
                         "ttft_p99_s": 1.5 + 0.1 * i, "tpot_p99_s": 0.05})

    add("rr", [100.0, 200.0], [True, True])
    add("milp", [60.0, 120.0], [True, True], viol=0.4)                                   # 40%, 40%
    add("milp[max_prefill_share=0.6]", [50.0, 100.0], [True, False])                     # fails one start
    add("greedy-cap", [70.0, 130.0], [True, True])                                       # 30%, 35%
    add("greedy-cap[capacity_cap=1]", [65.0, 126.0], [True, True], valid=[True, False])  # invalid in one start
    add("greedy-cap[capacity_cap=0.8]", [75.0, 150.0], [True, True])                     # 25%, 25%: passes, not best
    add("planner", [55.0, 110.0], [False, False])                                        # never passes
    return pd.DataFrame(rows)


def test_best_setting_within_the_slo_and_paired_gap():
    t = best_within_slo(_runs()).set_index("policy")
    assert list(t.index) == ["milp", "greedy-cap", "planner"]
    m = t.loc["milp"]
    assert m["best"] == "milp" and m["passing"] == 1 and m["settings"] == 2
    assert m["reduction_pct"] == pytest.approx(40.0) and m["violation_pct"] == pytest.approx(0.4)
    assert m["ttft_p99_ms"] == pytest.approx(1600.0)
    g = t.loc["greedy-cap"]
    assert g["best"] == "greedy-cap" and g["passing"] == 2 and g["settings"] == 3
    assert g["reduction_pct"] == pytest.approx(32.5)
    assert g["anchor_minus_pp"] == pytest.approx(7.5) and g["anchor_minus_n"] == 2  # (10 + 5) / 2
    p = t.loc["planner"]
    assert p["best"] == "" and p["passing"] == 0 and pd.isna(p["reduction_pct"])
    md = best_within_slo_markdown(best_within_slo(_runs()))
    assert "| s | planner | 0/1 | cannot pass | – | – | – | – | – |" in md
    assert "| s | greedy-cap | 2/3 | greedy-cap | 32.5 ± 31.8 | 0.10 | 1600 | 50 | 7.5 ± 31.8 (2) |" in md


def test_reference_is_always_on_rr_where_the_matrix_has_it():
    r = _runs()
    on = r[r["policy"] == "rr"].assign(policy="rr (always on)", carbon_g=[200.0, 400.0])
    t = best_within_slo(pd.concat([r, on], ignore_index=True)).set_index("policy")
    assert "rr" in t.index and t.loc["milp", "reduction_pct"] == pytest.approx(70.0)  # vs always-on rr


def test_matrices_merged_only_where_round_robin_agrees_and_the_cli_anchor(tmp_path, capsys):
    from eval import slo_compare

    r = _runs()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    r[r["policy"].isin(["rr", "milp"])].to_csv(a / "runs.csv", index=False)
    r[~r["policy"].isin(["milp"])].to_csv(b / "runs.csv", index=False)  # rr again, bit for bit
    assert slo_compare.main([str(a), str(b), "--anchor", "greedy-cap"]) == 0
    out = capsys.readouterr().out
    assert "| s | milp | 1/2 | milp | 40.0 ± 0.0 | 0.40 | 1600 | 50 | -7.5 ± 31.8 (2) |" in out  # greedy-cap's 32.5 - 40
    assert "greedy-cap - policy (pp, paired)" in out
    other = r.copy()
    other.loc[(other["policy"] == "rr") & (other["seed"] == 2), "carbon_g"] = 200.5  # another episode
    other.to_csv(b / "runs.csv", index=False)
    assert slo_compare.main([str(a), str(b)]) == 2
    assert "s seed 2: rr emitted 200.0 g" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        slo_compare.main([str(a), "--anchor", "nope"])
    assert "--anchor 'nope': no such policy" in capsys.readouterr().err
