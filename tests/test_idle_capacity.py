"""eval.idle_capacity: the awake-but-idle datacenters of a capacity-deciding run, on a small
hand-made matrix whose figures are known."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from eval.idle_capacity import idle_capacity_markdown, idle_capacity_runs, main


def _matrix(tmp_path, name: str = "milp (capacity)", check: bool = True):
    runs = [
        {"run_id": "s__rr__seed1", "scenario": "s", "policy": "rr", "label": "", "seed": 1,
         "overrides": {"capacity.control": "always_on", "env.warmup_s": 1.0}, "dc_placed": [400, 400, 400]},
        {"run_id": "s__milp__seed1", "scenario": "s", "policy": "milp", "label": name, "seed": 1,
         "overrides": {"capacity.control": "agent", "env.warmup_s": 1.0}, "dc_placed": [1190, 5, 0]},
        {"run_id": "s__milp_on__seed1", "scenario": "s", "policy": "milp", "label": "milp (always on)", "seed": 1,
         "overrides": {"capacity.control": "always_on", "env.warmup_s": 1.0}, "dc_placed": [1000, 195, 0]},
    ]
    (tmp_path / "config.json").write_text(json.dumps({"runs": runs}))
    pd.DataFrame({"scenario": ["s"] * 3, "policy": ["rr", name, "milp (always on)"], "seed": [1, 1, 1],
                  "carbon_g": [1000.0, 300.0, 600.0], "window_start_s": [1.0] * 3}).to_csv(tmp_path / "runs.csv", index=False)
    (tmp_path / "steps").mkdir()
    # burn-in step at 0.5 and 1.0 s (not counted), window steps at 1.5 and 2.0 s
    pd.DataFrame({"time_s": [0.5, 1.0, 1.5, 2.0],
                  "awake_engines_dc0": [8, 8, 8, 8], "carbon_g_dc0": [99.0, 99.0, 100.0, 120.0],
                  "awake_engines_dc1": [8, 8, 4, 4], "carbon_g_dc1": [99.0, 99.0, 30.0, 20.0],
                  "awake_engines_dc2": [8, 0, 0, 0.4], "carbon_g_dc2": [99.0, 99.0, 10.0, 20.0]}).to_parquet(
        tmp_path / "steps" / "s__milp__seed1.parquet")
    if check:
        pd.DataFrame({"scenario": ["s"], "policy": [name], "seed": [1], "carbon_g": [300.0],
                      "slo_bound_carbon_g": [220.0]}).to_csv(tmp_path / "bound_check.csv", index=False)
    return tmp_path


def test_idle_datacenters_and_their_carbon(tmp_path, capsys) -> None:
    """dc1 is awake (4 engines over the window) with 5 of 1,195 requests (0.4% < 1%): idle, its
    window carbon 50 g = 5 pp of rr's 1,000 g; dc2 (0.2 engines awake on average) and dc0 are not;
    the gap to the SLO-true bound is (300 - 220) / 1,000 = 8 pp; the always-on MILP is not a
    capacity-deciding run and is left out."""
    t = idle_capacity_runs(str(_matrix(tmp_path)))
    assert len(t) == 1
    r = t.iloc[0]
    assert (r.scenario, r.policy, r.seed, r.idle_dcs) == ("s", "milp (capacity)", 1, 1)
    assert r.idle_engines == pytest.approx(4.0) and r.idle_carbon_pp == pytest.approx(5.0) and r.gap_pp == pytest.approx(8.0)
    # a threshold below dc1's share (0.42%) finds nothing idle
    assert idle_capacity_runs(str(tmp_path), share=0.004).iloc[0].idle_dcs == 0
    assert "| s | milp (capacity) | 1 | 1.0 | 4.0 | 5.0 | 8.0 |" in idle_capacity_markdown(t)
    assert idle_capacity_runs(str(tmp_path), ["other", "milp"]).equals(t)
    assert main([str(tmp_path), "--write"]) == 0
    assert capsys.readouterr().out.strip().endswith("idle_awake_carbon_pp=5.00")
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "idle_capacity.csv"), t, check_dtype=False)


def test_capacity_matrix_names_and_missing_inputs(tmp_path) -> None:
    """A capacity matrix names the run by its policy (``milp``); without bound_check.csv the gap
    is NaN; a bad share or missing steps say what is wrong."""
    d = _matrix(tmp_path, name="milp", check=False)
    t = idle_capacity_runs(str(d))
    assert t.iloc[0].idle_carbon_pp == pytest.approx(5.0) and pd.isna(t.iloc[0].gap_pp)
    with pytest.raises(ValueError, match="share"):
        idle_capacity_runs(str(d), share=1.5)
    (d / "steps" / "s__milp__seed1.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="git does not track steps"):
        idle_capacity_runs(str(d))
