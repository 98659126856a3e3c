"""``carbon-gym eval`` on a fault scenario: the fault-free twin runs in the same matrix and the
fault report (fault_report.csv/.md, fault_runs.csv) compares each scheduler with and without
the faults; fault counters appear in runs.csv, summary.csv/.md and the per-step records."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pandas as pd
import pytest

from eval import cli, runner, tables

pytest.importorskip("solvers")

SCEN = "dev-fault-region"
TWIN = SCEN + runner.FAULT_TWIN_SUFFIX
# --no-carbon-start: the scenario's own start (June, noon UTC), when Europe is clean enough that
# every scheduler sends work there, so the European outage fails some over under each of them
ARGS = ["--policies", "rr,greedy", "--scenarios", SCEN, "--seeds", "2", "--duration-s", "30", "--workers", "1",
        "--no-progress", "--no-tensorboard", "--no-plots", "--format", "csv", "--no-carbon-start"]


@pytest.fixture(scope="module")
def fault_eval(tmp_path_factory):
    out = tmp_path_factory.mktemp("fault_eval")
    (out / "fault_report.md").write_text("stale")  # a report left by an earlier run is replaced
    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        rc = cli.main(["eval", *ARGS, "--out", str(out)])
    assert rc == 0, se.getvalue()
    return out, so.getvalue(), se.getvalue()


def test_fault_table_per_scheduler(fault_eval):
    out, stdout, stderr = fault_eval
    table = pd.read_csv(out / "fault_report.csv")
    assert list(table["policy"]) == ["rr", "greedy"] and set(table["scenario"]) == {SCEN}
    assert (table["seeds"] == 2).all()
    assert (table["failed_over"] > 0).all() and (table["failed_over_base"] == 0).all()
    assert (table["failed_over_completed"] <= table["failed_over"]).all()
    assert (table["wasted_energy_kj"] > 0).all()
    # the differences are exactly fault minus twin
    assert (table["extra_carbon_g"] == table["carbon_g"] - table["carbon_g_base"]).all()
    assert np.allclose(table["extra_carbon_pct"], 100 * table["extra_carbon_g"] / table["carbon_g_base"], rtol=1e-12)
    assert (table["slo_violation_pp"] == table["slo_violation_pct"] - table["slo_violation_pct_base"]).all()
    # an outage of the whole European region costs SLOs under both schedulers
    assert (table["slo_violation_pp"] > 0).all()
    assert table["ledger_ok"].all()
    md = (out / "fault_report.md").read_text()
    assert md != "stale" and md.count("\n") == 4 and "| yes |" in md and "extra (g)" in md
    assert "fault report" in stdout and f"{SCEN} vs {TWIN}" in stdout and "| greedy |" in stdout
    assert "--no-fault-baseline" in stderr and TWIN in stderr


def test_fault_table_is_built_from_the_matrix_runs(fault_eval):
    out, _, _ = fault_eval
    runs = pd.read_csv(out / "runs.csv")
    pairs = pd.read_csv(out / "fault_runs.csv")
    assert len(pairs) == 4 and len(runs) == 8  # 2 policies x 2 seeds, each with its twin, nothing run twice
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["fault_twins"] == {SCEN: TWIN}
    assert sorted(r["faults"] for r in cfg["runs"]) == [False] * 4 + [True] * 4
    f = runs[runs.scenario == SCEN].set_index(["policy", "seed"])
    b = runs[runs.scenario == TWIN].set_index(["policy", "seed"])
    assert (b["failed_over"] == 0).all() and (b["scenario_faults"] == 0).all() and (f["scenario_faults"] == 3).all()
    for _, p in pairs.iterrows():
        k = (p["policy"], p["seed"])
        assert p["carbon_g"] == f.loc[k, "carbon_g"] and p["carbon_g_base"] == b.loc[k, "carbon_g"]
        assert p["extra_carbon_g"] == f.loc[k, "carbon_g"] - b.loc[k, "carbon_g"]
        assert p["failed_over"] == f.loc[k, "failed_over"] > 0
        assert p["arrived"] == f.loc[k, "requests_arrived"] == b.loc[k, "requests_arrived"]  # same arrivals
        assert p["slo_violations"] == f.loc[k, "slo_violations"]
        # per-step failed_over columns add up to the episode's count
        steps = pd.read_csv(out / "steps" / f"{SCEN}__{p['policy']}__seed{p['seed']}.csv")
        assert int(steps["failed_over"].sum()) == p["failed_over"]
    table = pd.read_csv(out / "fault_report.csv").set_index("policy")
    for pol, g in pairs.groupby("policy"):
        assert table.loc[pol, "carbon_g"] == pytest.approx(g["carbon_g"].mean(), rel=1e-15)
        assert table.loc[pol, "failed_over"] == g["failed_over"].mean()


def test_twin_has_the_same_episode_without_faults():
    spec = runner.RunSpec(SCEN, "rr", 1, overrides=(("duration_s", 30.0),))
    twin = runner.fault_twin(spec)
    assert twin.run_id == f"{TWIN}__rr__seed1" and twin.start_offset_s() == spec.start_offset_s()
    sc, ov = runner.resolve_run_scenario(spec)
    sc_twin, ov_twin = runner.resolve_run_scenario(twin)
    assert len(sc.faults) == 3 and sc_twin.faults == ()
    assert ov == ov_twin and sc_twin.carbon.start_utc == sc.carbon.start_utc


def test_summary_has_fault_columns(fault_eval):
    out, _, _ = fault_eval
    summary = pd.read_csv(out / "summary.csv").set_index(["scenario", "policy"])
    assert (summary.loc[SCEN, "failed_over"] > 0).all() and (summary.loc[TWIN, "failed_over"] == 0).all()
    assert (summary["ledger_ok_share"] == 1.0).all()
    assert "failed over" in (out / "summary.md").read_text().splitlines()[0]
    # a summary of runs without faults has no fault columns
    plain = pd.DataFrame({"scenario": ["dev"] * 2, "policy": ["rr"] * 2, "seed": [0, 1], "carbon_g": [1.0, 2.0],
                          "scenario_faults": [0, 0], "failed_over": [0, 0], "ledger_ok": [True, True]})
    s = tables.summarise(plain)
    assert "failed_over" not in s and "failed over" not in tables.summary_markdown(s)


def test_no_fault_baseline_skips_the_twin(tmp_path, capsys):
    assert cli.main(["eval", *ARGS, "--seeds", "1", "--policies", "rr", "--no-fault-baseline", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "fault report" not in captured.out and not (tmp_path / "fault_report.csv").exists()
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert list(runs["scenario"]) == [SCEN] and runs["failed_over"].iloc[0] > 0
