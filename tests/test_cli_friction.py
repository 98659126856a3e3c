"""Users' friction found trying the evaluation (issue 21, item 8), one test per point: learned
checkpoints with the same file name, the scenario's carbon start, outputs never overwritten
silently, TensorBoard beside training, a progress bar in steps, notes for the slow quiet steps,
``eval --help``'s example, ``train --help``'s subcommands, and tables named by the scenario's
``name``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from eval import backends, cli, runner

QUIET = ["--no-progress", "--no-plots", "--no-tensorboard", "--no-requests", "--workers", "1"]


def _eval(args: list[str]) -> int:
    return cli.main(["eval", *args])


# ------------------------------------------------------------------ learned checkpoints, labels


@pytest.mark.slow
def test_checkpoints_with_the_same_file_name_are_not_merged(tmp_path, capsys):
    from train.policy import SHIPPED_CHECKPOINT

    a, b = tmp_path / "a" / "best.npz", tmp_path / "b" / "best.npz"
    for p in (a, b):
        p.parent.mkdir()
        shutil.copyfile(SHIPPED_CHECKPOINT, p)
    out = tmp_path / "out"
    assert _eval(["--policies", f"rr,learned:{a},learned:{b},mine=learned:{a}", "--scenarios", "dev", "--seeds", "1",
                  "--duration-s", "3", "--out", str(out), *QUIET]) == 0
    err = capsys.readouterr().err
    assert "told apart by their paths" in err
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["policy"]) == ["rr", "learned:a/best", "learned:b/best", "mine"]
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["seeds"]) == [1, 1, 1, 1]  # never two checkpoints averaged as seeds of one
    # the same name given twice is a usage error naming it
    assert _eval(["--policies", f"rr,x=learned:{a},x=learned:{b}", "--scenarios", "dev", "--out", str(tmp_path / "o2"), *QUIET]) == 2
    assert "two policies are named 'x'" in capsys.readouterr().err


def test_policy_labels_by_path_and_given_names():
    labels = runner.policy_labels(["rr", "learned:runs/x/a/best.npz", "learned:runs/y/a/best.npz", "learned:z/other.npz",
                                   "milp", "fast=milp"])
    assert labels == {"rr": "rr", "learned:runs/x/a/best.npz": "learned:x/a/best", "learned:runs/y/a/best.npz": "learned:y/a/best",
                      "learned:z/other.npz": "learned:other", "milp": "milp", "fast=milp": "fast"}
    specs = runner.make_specs(["dev"], ["rr", "fast=milp"], [0], policy_kwargs={"fast": {"violation_penalty_g": 5.0}})
    assert [(s.policy, s.policy_name, dict(s.policy_kwargs)) for s in specs] == [
        ("rr", "rr", {}), ("milp", "fast", {"violation_penalty_g": 5.0})]


# ------------------------------------------------------------------ the scenario's carbon start


def test_eval_keeps_the_scenarios_carbon_start_and_says_so(tmp_path, capsys):
    base = ["--policies", "rr", "--scenarios", "dev", "--seeds", "2", "--duration-s", "2", *QUIET]
    assert _eval(base + ["--out", str(tmp_path / "kept")]) == 0
    err = capsys.readouterr().err
    assert "episodes start at the scenario's carbon.start_utc (dev: 2023-06-15T12:00:00Z)" in err and "--spread-starts" in err
    starts = {r["start_utc"] for r in json.loads((tmp_path / "kept" / "config.json").read_text())["runs"]}
    assert starts == {"2023-06-15T12:00:00Z"}
    assert _eval(base + ["--out", str(tmp_path / "spread"), "--spread-starts"]) == 0
    err = capsys.readouterr().err
    assert "--spread-starts: each seed starts at its own day and hour of the carbon year, replacing" in err
    runs = json.loads((tmp_path / "spread" / "config.json").read_text())["runs"]
    assert len({r["start_utc"] for r in runs}) == 2 and "2023-06-15T12:00:00Z" not in {r["start_utc"] for r in runs}


# ------------------------------------------------------------------ outputs never overwritten silently


def test_results_are_versioned_or_refused_never_overwritten(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = ["--policies", "rr", "--scenarios", "dev", "--seeds", "1", "--duration-s", "2", *QUIET]
    assert _eval(base) == 0 and (tmp_path / "runs" / "eval" / "config.json").is_file()
    first = (tmp_path / "runs" / "eval" / "config.json").read_text()
    assert _eval(base) == 0  # the default --out holds results: the next version, said
    assert "writing to 'runs/eval-2'" in capsys.readouterr().err
    assert (tmp_path / "runs" / "eval-2" / "config.json").is_file()
    assert (tmp_path / "runs" / "eval" / "config.json").read_text() == first
    # an explicit --out holding results: refused, unless --overwrite
    assert _eval(base + ["--out", "runs/eval"]) == 2
    assert "--out: 'runs/eval' already holds results" in capsys.readouterr().err
    assert _eval(base + ["--out", "runs/eval", "--overwrite"]) == 0
    # experiments: the same, per experiment directory
    assert cli.main(["experiment", "headline", "--scenarios", "dev", "--policies", "rr", "--seeds", "1", "--duration-s", "2",
                     *QUIET, "--out", "runs/eval"]) == 0  # (runs/eval/headline is free)
    assert cli.main(["experiment", "headline", "--scenarios", "dev", "--policies", "rr", "--seeds", "1", "--duration-s", "2",
                     *QUIET, "--out", "runs/eval"]) == 2


def test_default_outputs_are_ignored_by_git(tmp_path, monkeypatch):
    """The quick-start's default --out (runs/eval, with its records and TensorBoard files) is
    where the repository's .gitignore ignores everything: ``git add -A`` commits no scratch."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = Path(__file__).resolve().parents[1]
    shutil.copy(repo / ".gitignore", tmp_path / ".gitignore")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    assert _eval(["--policies", "rr", "--scenarios", "dev", "--seeds", "1", "--duration-s", "2", "--no-progress", "--no-plots",
                  "--workers", "1"]) == 0
    written = [p for p in (tmp_path / "runs" / "eval").rglob("*") if p.is_file()]
    assert any(p.name.startswith("events.out.tfevents") for p in written) and any(p.name == "summary.csv" for p in written)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path, check=True,
                            capture_output=True, text=True).stdout.split("\n")
    assert [line for line in status if line] == ["?? .gitignore"]


def test_tensorboard_runs_follow_out_and_never_merge(tmp_path, monkeypatch, capsys):
    """Two --out directories with the same name get two TensorBoard roots (under each --out);
    a --tensorboard DIR holding an earlier run's events is refused, and --overwrite replaces the
    run's event file instead of adding a second one beside it."""
    monkeypatch.chdir(tmp_path)
    base = ["--policies", "rr", "--scenarios", "dev", "--seeds", "1", "--duration-s", "2", "--no-progress", "--no-plots",
            "--no-requests", "--workers", "1"]

    def events(root: Path) -> list[Path]:
        return sorted(root.rglob("events.out.tfevents*"))

    assert _eval(base + ["--out", "a/same"]) == 0 and _eval(base + ["--out", "b/same"]) == 0
    assert len(events(tmp_path / "a" / "same" / "tensorboard")) == 1
    assert len(events(tmp_path / "b" / "same" / "tensorboard")) == 1
    assert not (tmp_path / "runs").exists()
    capsys.readouterr()
    assert _eval(base + ["--out", "c", "--tensorboard", "tb"]) == 0 and len(events(tmp_path / "tb")) == 1
    assert _eval(base + ["--out", "d", "--tensorboard", "tb"]) == 2
    assert "--tensorboard: 'tb' already holds TensorBoard event files" in capsys.readouterr().err
    assert not (tmp_path / "d" / "config.json").exists()  # refused before anything ran
    assert _eval(base + ["--out", "d", "--tensorboard", "tb", "--overwrite"]) == 0
    assert len(events(tmp_path / "tb")) == 1


def test_report_refuses_to_replace_results_md_and_figures(tmp_path, capsys):
    from eval import report

    head = tmp_path / "res" / "headline"
    assert cli.main(["experiment", "headline", "--scenarios", "dev", "--policies", "rr,greedy", "--seeds", "1", "--duration-s", "4",
                     "--no-progress", "--no-tensorboard", "--workers", "1", "--out", str(tmp_path / "res")]) == 0
    assert (head / "figures" / "headline_reduction.png").is_file()
    md, figs = tmp_path / "R.md", tmp_path / "figs"
    md.write_text("# hand-kept\n")
    assert cli.main(["report", str(tmp_path / "res"), "--out", str(md), "--figures", str(figs)]) == 2
    assert "--out: " in capsys.readouterr().err and md.read_text() == "# hand-kept\n"
    assert not figs.exists() or not any(figs.iterdir())  # nothing copied either
    md.unlink()
    assert cli.main(["report", str(tmp_path / "res"), "--out", str(md), "--figures", str(figs)]) == 0
    assert cli.main(["report", str(tmp_path / "res"), "--out", str(tmp_path / "R2.md"), "--figures", str(figs)]) == 2
    assert "--figures: " in capsys.readouterr().err and not (tmp_path / "R2.md").exists()
    assert cli.main(["report", str(tmp_path / "res"), "--out", str(md), "--figures", str(figs), "--force"]) == 0
    with pytest.raises(Exception, match="exists"):
        report.write_results_md(str(tmp_path / "res"), out=str(md), figures_dir=str(figs), overwrite=False)


# ------------------------------------------------------------------ TensorBoard beside training


def test_eval_tensorboard_goes_under_out_and_the_default_beside_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    quiet = ["--policies", "rr", "--scenarios", "dev", "--seeds", "1", "--duration-s", "2", "--no-progress", "--no-plots",
             "--no-requests", "--workers", "1"]
    assert _eval([*quiet, "--out", "results/mine"]) == 0
    run = tmp_path / "results" / "mine" / "tensorboard" / "dev" / "rr" / "seed_0"
    assert run.is_dir() and any(p.name.startswith("events.out.tfevents") for p in run.iterdir())
    assert not (tmp_path / "runs").exists()
    # the default --out is runs/eval: `tensorboard --logdir runs/` (the README's line) reads
    # runs/train/<run>/tb and runs/eval/tensorboard alike
    assert _eval(quiet) == 0
    run = tmp_path / "runs" / "eval" / "tensorboard" / "dev" / "rr" / "seed_0"
    assert run.is_dir() and any(p.name.startswith("events.out.tfevents") for p in run.iterdir())


# ------------------------------------------------------------------ progress in steps, notes


def test_progress_bar_counts_steps_inside_runs(capsys):
    specs = [runner.RunSpec("dev", "rr", s, overrides=(("duration_s", 7.0),)) for s in (0, 1)]
    backends.run_matrix(specs, workers=1, progress=True, keep_requests=False)
    err = capsys.readouterr().err
    assert "14/14" in err and "step" in err and "runs 2/2" in err
    bar = backends._Progress(specs, True)
    assert bar.totals == [7, 7]
    bar.steps(0, 3)  # what a worker's report does, mid-run
    assert bar.bar.n == 3
    bar.finished(0, specs[0].run_id)
    assert bar.bar.n == 7
    bar.close()
    # the observer a worker runs reports the steps done while the episode runs
    seen: list[int] = []
    obs = runner.StepProgress(seen.append, every_s=0.0)
    runner.run_one(specs[0], keep_requests=False, observers=[obs])
    assert seen == list(range(1, 8))


@pytest.mark.slow
def test_slow_quiet_steps_say_what_they_do(tmp_path, capfd):
    assert _eval(["--policies", "rr,learned", "--scenarios", "dev", "--seeds", "1", "--duration-s", "2", "--no-progress",
                  "--no-tensorboard", "--no-requests", "--workers", "2", "--out", str(tmp_path)]) == 0
    err = capfd.readouterr().err  # (from the spawned worker too)
    assert "loading the learned policy" in err and "importing torch" in err and "learned policy loaded in" in err
    assert f"writing figures to {tmp_path / 'figures'}" in err


# ------------------------------------------------------------------ help texts


def test_eval_help_examples_are_real_fields(capsys):
    from carbon_gym.registry import make_policy
    from carbon_gym.scenario import load_scenario

    with pytest.raises(SystemExit):
        cli.main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    sets = re.findall(r"e\.g\. --set (\S+?)=(\S+)", text)
    args = re.findall(r"e\.g\. --policy-arg (\S+?)\.(\S+?)=(\S+)", text)
    assert sets and args
    for key, value in sets:
        load_scenario("dev", {key: cli.parse_value(value)})  # raises on an unknown field
    from carbon_gym.env import GeoServeEnv

    env = GeoServeEnv("dev")
    for pol, key, value in args:
        make_policy(pol, env, **{key: cli.parse_value(value)})  # raises on an unknown keyword


def test_train_help_lists_its_subcommands(capsys):
    from train import cli as train_cli

    with pytest.raises(SystemExit):
        train_cli.main(["--help"])
    out = capsys.readouterr().out
    for name in ("evaluate", "export", "decision-time", "imitate"):
        assert re.search(rf"^\s+{name}\s+\S", out, re.M), name
        assert name in train_cli.SUBCOMMANDS


# ------------------------------------------------------------------ the scenario's name in tables


def test_tables_use_the_scenarios_name(tmp_path):
    from carbon_gym.scenario import scenario_path

    text = scenario_path("dev").read_text().replace('name = "dev"', 'name = "eu-pair"', 1)
    f = tmp_path / "test3.toml"
    f.write_text(text)
    out = tmp_path / "out"
    assert _eval(["--policies", "rr", "--scenarios", str(f), "--seeds", "1", "--duration-s", "2", "--out", str(out), *QUIET]) == 0
    assert list(pd.read_csv(out / "runs.csv")["scenario"]) == ["eu-pair"]
    assert "| eu-pair | rr |" in (out / "summary.md").read_text()
    # two files with the same name keep their file names (no merging)
    g = tmp_path / "other.toml"
    g.write_text(text)
    assert runner.scenario_labels([str(f), str(g)]) == {}


def test_polling_periods_are_checked(capsys):
    """``--periods`` chooses the polling sweep's periods: numbers > 0, no repeats, and only for
    experiment polling; a bad one names --periods."""
    assert cli.parse_periods("0.1, 0.5,2") == (0.1, 0.5, 2.0) and cli.parse_periods(None) is None
    for bad, why in (("0", "> 0"), ("-1", "> 0"), ("fast", "not a number"), ("1,1", "twice"), ("inf", "finite"), (",", "at least one")):
        with pytest.raises(cli.UsageError, match=why) as e:
            cli.parse_periods(bad)
        assert str(e.value).startswith("--periods: ")
    assert cli.main(["experiment", "headline", "--periods", "1", *QUIET]) == 2
    assert "--periods: sets the polling sweep's periods: use it with experiment polling" in capsys.readouterr().err
