"""The evaluation's steady-state windows (issue 21, items 1 and 7): presets, --window-s /
--warmup-s, windowed rows checked against the lower bound, and RESULTS.md saying what was
measured (``measurement window: <N> s``, ``starts: <K>``)."""

from __future__ import annotations

import json
import pandas as pd
import pytest

from eval import cli, experiments


def test_presets_and_window_arguments():
    full = experiments.preset_overrides("full", None, None)
    assert full == {"duration_s": 900.0, "env.measure": "window", "env.warmup_s": 300.0}
    assert experiments.PRESETS["full"].seeds >= 8 and "not a result" in experiments.PRESETS["quick"].note
    assert experiments.preset_overrides("quick", None, None) == {"duration_s": 60.0}
    assert experiments.preset_overrides("quick", None, None, window_s=600.0) == {
        "duration_s": 900.0, "env.measure": "window", "env.warmup_s": 300.0}
    assert experiments.preset_overrides("full", None, None, window_s=3600.0, warmup_s=600.0)["duration_s"] == 4200.0
    assert experiments.preset_overrides("full", 30.0, None) == {"duration_s": 30.0}  # an explicit episode, no window
    assert min(experiments.PRESETS["full"].polling_s) <= 0.1  # the polling sweep covers 0.1-0.5 s


@pytest.mark.parametrize("argv,needle", [
    (["eval", "--policies", "rr", "--window-s", "0"], "--window-s: must be > 0"),
    (["eval", "--policies", "rr", "--duration-s", "10", "--window-s", "10"], "--duration-s: is an episode without a window"),
    (["eval", "--policies", "rr", "--warmup-s", "10"], "--warmup-s: needs a measurement window"),
    (["eval", "--policies", "rr", "--scenarios", "dev", "--window-s", "10", "--warmup-s", "2.5", "--set", "polling_period_s=2"],
     "env.warmup_s: must be a multiple of polling_period_s=2"),
])
def test_window_argument_errors(argv, needle, capsys, tmp_path):
    assert cli.main(argv + ["--out", str(tmp_path), "--no-progress"]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.slow
def test_windowed_headline_bound_and_results_md(tmp_path):
    from eval.bound import runs_below_bound, with_bounds

    out = tmp_path / "res"
    argv = ["experiment", "headline", "--scenarios", "dev", "--policies", "rr,greedy,milp", "--window-s", "12", "--warmup-s", "6",
            "--seeds", "2", "--workers", "2", "--no-progress", "--no-tensorboard", "--out", str(out)]
    assert cli.main(argv) == 0
    runs = pd.read_csv(out / "headline" / "runs.csv")
    assert set(runs["window_s"]) == {12.0} and set(runs["window_start_s"]) == {6.0}
    assert (runs["backlog_end"] >= 0).all()
    joined = with_bounds(runs, pd.read_csv(out / "headline" / "bounds.csv"))
    assert runs_below_bound(joined).empty and (joined["carbon_g"] > joined["bound_floor_g"]).all()
    md = tmp_path / "R.md"
    assert cli.main(["report", str(out), "--out", str(md), "--figures", str(tmp_path / "figs")]) == 0
    text = md.read_text()
    assert "- measurement window: 12 s (steady state: after a 6 s burn-in" in text
    assert "- starts: 2 (seeds 0, 1;" in text
    assert "lower bound" in text


def test_heldout_seeds_argument_errors(capsys, tmp_path):
    assert cli.main(["experiment", "polling", "--heldout-seeds", "--out", str(tmp_path / "a"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--heldout-seeds: gives each scenario of experiments headline, milp-vs-ilp, tradeoff, predictor, capacity its own held-out starts" in err
    assert "allowed: headline, milp-vs-ilp, tradeoff, predictor" in err
    assert cli.main(["experiment", "headline", "--heldout-seeds", "--seed-list", "1,2", "--out", str(tmp_path / "b"), "--no-progress"]) == 2
    assert "--heldout-seeds: chooses the seeds itself" in capsys.readouterr().err


def _heldout_run(tmp_path, exp: str, scens: list[str], extra: list[str]):
    """Run experiment ``exp`` on ``scens`` with ``--heldout-seeds`` (2 starts, a 4 s window after 2 s):
    its output directory, its runs and each scenario's fresh held-out seeds (checked to differ
    between the first two scenarios: the tests mean something only if they do)."""
    from eval.heldout_seeds import fresh_heldout_seeds

    out = tmp_path / "res"
    argv = ["experiment", exp, "--scenarios", ",".join(scens), *extra, "--preset", "full", "--window-s", "4", "--warmup-s", "2",
            "--seeds", "2", "--heldout-seeds", "--workers", "1", "--no-progress", "--no-tensorboard", "--no-plots", "--out", str(out)]
    assert cli.main(argv) == 0
    want = {sc: fresh_heldout_seeds(sc, 2) for sc in scens}
    assert want[scens[0]] != want[scens[1]]
    return out, pd.read_csv(out / exp / "runs.csv"), want


def _assert_own_seeds(runs, want: dict) -> None:
    """Every (scenario, policy) of ``runs`` ran exactly its scenario's seeds of ``want``."""
    for (sc, pol), g in runs.groupby(["scenario", "policy"]):
        assert sorted(g["seed"]) == want[sc], (sc, pol)


@pytest.mark.slow
def test_headline_heldout_seeds_per_scenario(tmp_path):
    """--heldout-seeds: each scenario runs its own fresh held-out starts (a learned agent's unseen days),
    every policy of a scenario the same ones, and RESULTS.md lists them per scenario."""
    scens = ["llama8b-low", "qwen7b-low"]
    out, runs, want = _heldout_run(tmp_path, "headline", scens, ["--policies", "rr,greedy-cap"])
    _assert_own_seeds(runs, want)
    md = tmp_path / "R.md"
    assert cli.main(["report", str(out), "--out", str(md), "--figures", str(tmp_path / "figs")]) == 0
    text = md.read_text()
    assert "- starts: 2 per scenario (each scenario its own fresh held-out seeds" in text
    for sc in scens:
        assert f"  - {sc}: seeds {', '.join(map(str, want[sc]))} (2023-" in text


@pytest.mark.slow
@pytest.mark.parametrize("exp, extra, policies", [
    ("milp-vs-ilp", ["--policies", "rr,ilp-cap,milp"], {"rr", "ilp-cap", "milp"}),
    ("tradeoff", ["--policies", "planner", "--knob", "planner=0.8"], {"rr", "planner", "planner[utilisation=0.8]"}),
])
def test_heldout_seeds_per_scenario_in_experiments_b_and_e(tmp_path, exp, extra, policies):
    """Experiments b and e take --heldout-seeds too: every policy (and knob value) of a scenario runs
    that scenario's own fresh held-out starts."""
    scens = ["llama8b-low", "mixtral8x7b-low"]
    out, runs, want = _heldout_run(tmp_path, exp, scens, extra)
    assert set(runs["policy"]) == policies
    _assert_own_seeds(runs, want)
    if exp == "milp-vs-ilp":  # the capped ILP has its own columns: reduction, violation and the paired gap
        table = pd.read_csv(out / exp / "milp-vs-ilp.csv")
        assert list(table["scenario"]) == scens and "gap_vs_ilp-cap_pp" in table
        assert "ilp-cap: vs rr % (viol. %; p99)" in (out / exp / "milp-vs-ilp.md").read_text()


@pytest.mark.slow
def test_heldout_seeds_per_scenario_in_experiment_c(tmp_path):
    """Experiment c (predictor vs oracle) takes --heldout-seeds: both variants of a scenario run that
    scenario's own fresh held-out starts, paired by seed in its table."""
    scens = ["llama8b-low", "mixtral8x7b-low"]
    out, runs, want = _heldout_run(tmp_path, "predictor", scens, ["--policies", "greedy-cap"])
    labels = {f"{sc}[{v}]": sc for sc in scens for v in ("predicted", "oracle")}
    assert set(runs["scenario"]) == set(labels) and set(runs["policy"]) == {"rr", "greedy-cap"}
    for (label, pol), g in runs.groupby(["scenario", "policy"]):
        assert sorted(g["seed"]) == want[labels[label]], (label, pol)
    table = pd.read_csv(out / "predictor" / "predictor.csv")
    assert list(table["scenario"]) == scens and list(table["seeds"]) == [2, 2]


@pytest.mark.slow
def test_heldout_seeds_per_scenario_in_experiment_h(tmp_path):
    """Experiment h (capacity control) takes --heldout-seeds: the always-on reference and every
    policy deciding capacity run the scenario's own fresh held-out starts, and the section lists
    them per scenario (no 'one start' objection)."""
    from eval import capacity_report as cr

    scens = ["llama8b-low", "mixtral8x7b-low"]
    out, runs, want = _heldout_run(tmp_path, "capacity", scens, ["--policies", "rr,rr+reactive"])
    assert set(runs["policy"]) == {cr.ALWAYS_ON_LABEL, "rr", "rr+reactive"}
    _assert_own_seeds(runs, want)
    assert f"seeds llama8b-low: {', '.join(map(str, want['llama8b-low']))}; mixtral8x7b-low: " in (out / "capacity" / "capacity.md").read_text()
    text = cr.capacity_section(str(out))
    assert "- starts: 2 per scenario (each scenario its own fresh held-out seeds" in text and "One start (seed)" not in text
    for sc in scens:
        assert f"  - {sc}: seeds {', '.join(map(str, want[sc]))} (2023-" in text


def test_training_seeds_argument_errors(capsys, tmp_path):
    assert cli.main(["experiment", "headline", "--training-seeds", "--heldout-seeds", "--out", str(tmp_path / "a"), "--no-progress"]) == 2
    assert "--training-seeds: and --heldout-seeds exclude each other" in capsys.readouterr().err
    assert cli.main(["experiment", "polling", "--training-seeds", "--out", str(tmp_path / "b"), "--no-progress"]) == 2
    assert "--training-seeds: gives each scenario of experiments headline" in capsys.readouterr().err
    assert cli.main(["experiment", "capacity", "--training-seeds", "--seed-list", "1,2", "--out", str(tmp_path / "c"), "--no-progress"]) == 2
    assert "--training-seeds: chooses the seeds itself" in capsys.readouterr().err


@pytest.mark.slow
def test_capacity_training_seeds_per_scenario(tmp_path):
    """--training-seeds: each scenario runs its own first training starts (no held-out day; where
    knobs are chosen), every policy the same ones, and RESULTS.md says they are training starts."""
    from eval.heldout_seeds import training_seeds
    from eval.writers import starts_line
    from train.envs import is_heldout_day

    scens = ["llama8b-low", "mixtral8x7b-low"]
    out = tmp_path / "res"
    argv = ["experiment", "capacity", "--scenarios", ",".join(scens), "--policies", "rr", "--preset", "full", "--window-s", "4",
            "--warmup-s", "2", "--seeds", "2", "--training-seeds", "--workers", "1", "--no-progress", "--no-tensorboard", "--no-plots",
            "--out", str(out)]
    assert cli.main(argv) == 0
    want = {sc: training_seeds(sc, 2) for sc in scens}
    assert want[scens[0]] != want[scens[1]]
    runs = pd.read_csv(out / "capacity" / "runs.csv")
    _assert_own_seeds(runs, want)
    meta = json.loads((out / "capacity" / "config.json").read_text())["runs"]
    assert meta and all(not is_heldout_day(pd.Timestamp(r["start_utc"]).day_of_year) for r in meta)
    line = starts_line(meta)
    assert "(each scenario its own training seeds, `--training-seeds`: no held-out day" in line
    for sc in scens:
        assert f"  - {sc}: seeds {', '.join(map(str, want[sc]))} (2023-" in line
