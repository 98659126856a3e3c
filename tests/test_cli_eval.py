"""The ``carbon-gym`` command line: the eval command end to end on the dev scenario, argument
errors, delegation, and the Ray backend (a real local Ray instance)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from carbon_gym import registry

from eval import cli, stats, tables

POLICIES = "rr,clairvoyant"


def _second_policy() -> str:
    """A scheduler from solvers when they are installed (greedy), else the clairvoyant policy."""
    return "greedy" if "greedy" in registry.available_policies() else "clairvoyant"


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    pol = f"rr,{_second_policy()}"
    t0 = time.perf_counter()
    rc = cli.main(["eval", "--policies", pol, "--scenarios", "dev", "--seeds", "2", "--out", str(out), "--workers", "2", "--no-progress",
                   "--tensorboard", str(out / "tensorboard")])
    wall = time.perf_counter() - t0
    assert rc == 0
    return out, pol.split(","), wall


def test_eval_writes_every_output(eval_run):
    out, pols, wall = eval_run
    assert wall < 60, f"dev eval took {wall:.1f} s"
    for f in ("summary.csv", "summary.md", "runs.csv", "config.json"):
        assert (out / f).is_file(), f
    for p in pols:
        for s in (0, 1):
            rid = f"dev__{p}__seed{s}"
            assert (out / "requests" / f"{rid}.parquet").is_file()
            assert (out / "steps" / f"{rid}.parquet").is_file()
            assert (out / "tensorboard" / "dev" / p / f"seed_{s}").is_dir()
    for fig in ("dev_latency_cdf", "dev_load_by_hour", "dev_carbon_over_time_seed0"):
        assert (out / "figures" / f"{fig}.png").is_file() and (out / "figures" / f"{fig}.pdf").is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["command"].startswith("carbon-gym eval") and "numpy" in cfg["versions"]
    assert len(cfg["runs"]) == 4


def test_reduction_is_computed_from_the_same_runs(eval_run):
    out, pols, _ = eval_run
    runs = pd.read_csv(out / "runs.csv")
    summary = pd.read_csv(out / "summary.csv")
    rr = runs[runs.policy == "rr"].set_index("seed")["carbon_g"]
    for p in pols:
        sub = runs[runs.policy == p].set_index("seed")
        expected = 100.0 * (rr - sub["carbon_g"]) / rr
        np.testing.assert_allclose(sub["reduction_vs_rr_pct"], expected, rtol=1e-12)
        row = summary[summary.policy == p].iloc[0]
        m, ci = stats.mean_ci95(expected.to_numpy())
        assert row["reduction_vs_rr_pct"] == pytest.approx(m, rel=1e-12, abs=1e-12)
        assert row["carbon_g"] == pytest.approx(sub["carbon_g"].mean(), rel=1e-12)
        # per-request records agree with the per-run numbers
        for s in (0, 1):
            req = pd.read_parquet(out / "requests" / f"dev__{p}__seed{s}.parquet")
            assert len(req) == sub.loc[s, "requests_completed"]
            assert np.percentile(req["tpot_s"], 50) == pytest.approx(sub.loc[s, "tpot_p50_s"], rel=1e-12)
    rr_row = summary[summary.policy == "rr"].iloc[0]
    assert rr_row["reduction_vs_rr_pct"] == 0.0
    md = (out / "summary.md").read_text()
    assert md.startswith("| scenario | policy |") and "| dev | rr | 2 |" in md


def test_tensorboard_scalars_use_the_shared_tags(eval_run):
    from eval.tb import TAGS, read_scalars

    out, pols, _ = eval_run
    sc = read_scalars(out / "tensorboard" / "dev" / pols[1] / "seed_0")
    assert set(sc) == set(TAGS)
    steps = pd.read_parquet(out / "steps" / f"dev__{pols[1]}__seed0.parquet")
    assert [v for _, v in sc[TAGS.carbon_cumulative_g]] == pytest.approx(list(steps["cumulative_carbon_g"]), rel=1e-6)
    runs = pd.read_csv(out / "runs.csv")
    red = runs[(runs.policy == pols[1]) & (runs.seed == 0)]["reduction_vs_rr_pct"].iloc[0]
    assert sc[TAGS.reduction_vs_rr_pct][0][1] == pytest.approx(red, rel=1e-6)


def test_rerun_reproduces_the_table_exactly(eval_run, tmp_path):
    out, pols, _ = eval_run
    # second run in this process (no pool): same table, bit for bit, except wall-clock columns
    rc = cli.main(["eval", "--policies", ",".join(pols), "--scenarios", "dev", "--seeds", "2", "--out", str(tmp_path), "--workers", "1", "--no-progress", "--no-plots", "--no-tensorboard"])
    assert rc == 0
    for name in ("summary.csv", "runs.csv"):
        a = pd.read_csv(out / name)
        b = pd.read_csv(tmp_path / name)
        keep = [c for c in a.columns if not c.startswith(tables.NONDETERMINISTIC_PREFIXES)]
        pd.testing.assert_frame_equal(a[keep], b[keep], check_exact=True)
    ra = pd.read_parquet(out / "requests" / f"dev__{pols[1]}__seed1.parquet")
    rb = pd.read_parquet(tmp_path / "requests" / f"dev__{pols[1]}__seed1.parquet")
    pd.testing.assert_frame_equal(ra, rb, check_exact=True)


# ------------------------------------------------------------------------------ argument errors


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["eval", "--policies", "rr,nosuch", "--scenarios", "dev"], "--policies: unknown policy 'nosuch' (allowed: rr"),
        (["eval", "--policies", "rr", "--scenarios", "nowhere"], "--scenarios: unknown scenario 'nowhere' (allowed: "),
        (["eval", "--policies", "rr", "--scenarios", "missing/file.toml"], "--scenarios: no such scenario file"),
        (["eval", "--policies", "rr", "--seeds", "0"], "--seeds: must be >= 1, got 0"),
        (["eval", "--policies", "rr", "--seeds", "-2"], "--seeds: must be >= 1, got -2"),
        (["experiment", "headline", "--seeds", "0"], "--seeds: must be >= 1, got 0"),  # (was silently the preset's)
        (["eval", "--policies", "rr", "--seed-start", "-1"], "--seed-start: must be >= 0, got -1"),
        (["eval", "--policies", "rr", "--workers", "-3"], "--workers: must be >= 1, got -3"),
        (["eval", "--policies", "learned:/no/such/agent.zip"], "--policies: no checkpoint at '/no/such/agent.zip'"),
        (["eval", "--policies", "no_such_module_x:MyPolicy"], "--policies: 'no_such_module_x:MyPolicy': no module 'no_such_module_x'"),
        (["eval", "--policies", "json:dumps_nothing"], "--policies: 'json:dumps_nothing': module 'json' has no attribute 'dumps_nothing'"),
        (["eval", "--policies", "rr", "--seeds", "two"], "--seeds: expected an integer, got 'two'"),
        (["eval", "--policies", "rr", "--seed-list", "1,x"], "--seed-list: expected comma-separated integers, got 'x'"),
        (["eval", "--policies", "rr", "--set", "duration_s"], "--set: expected KEY=VALUE, got 'duration_s'"),
        (["eval", "--policies", "rr", "--preset", "huge"], "--preset: unknown preset 'huge' (allowed: quick, full)"),
        (["eval", "--policies", "rr", "--workers", "0"], "--workers: must be >= 1, got 0"),
        (["eval", "--policies", "rr", "--policy-arg", "milp.w=1"], "--policy-arg: policy 'milp' is not in --policies"),
        (["eval", "--policies", "rr", "--set", "workload.nonsense=3"], "workload.nonsense"),
        (["eval", "--policies", "rr", "--set", "duration_s=-5"], "duration_s"),
        (["experiment", "zz"], "experiment: unknown experiment 'zz' (allowed: headline"),
        (["experiment", "headline", "--models", "gpt"], "--models: unknown model 'gpt' (allowed: llama8b"),
        (["bench", "nosuch"], "bench: unknown benchmark 'nosuch' (allowed: env"),
        (["frobnicate"], "COMMAND: invalid choice: 'frobnicate'"),
        (["eval", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_argument_errors_are_one_line_exit_2(argv, needle, capsys):
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("carbon-gym") and "error" in lines[0]
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err


def test_help_is_fast_and_light():
    code = (
        "import sys, eval.cli as c; c.build_parser().format_help();"
        "heavy = [m for m in ('pandas', 'matplotlib', 'torch', 'pyomo', 'tensorboard', 'gymnasium') if m in sys.modules];"
        "print(heavy)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"
    res = subprocess.run([sys.executable, "-m", "eval", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "experiment" in res.stdout and "calibrate" in res.stdout


def test_scenarios_and_policies_listing(capsys):
    assert cli.main(["scenarios"]) == 0
    out = capsys.readouterr().out
    assert "dev" in out and "llama8b-moderate" in out
    assert cli.main(["policies"]) == 0
    out = capsys.readouterr().out.split()
    assert out[0] == "rr" and "clairvoyant" in out


def test_delegation_to_missing_module(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "train.cli", None)  # import of train.cli fails as if absent
    rc = cli.main(["train", "--help"])
    err = capsys.readouterr().err
    assert rc == 2 and "training is not available" in err


def test_delegation_passes_argv(monkeypatch):
    import types

    seen = {}
    fake = types.ModuleType("calibration.cli")
    fake.main = lambda argv: seen.setdefault("argv", argv) and 0
    monkeypatch.setitem(sys.modules, "calibration.cli", fake)
    assert cli.main(["calibrate", "fit", "--gpu", "a100"]) == 0
    assert seen["argv"] == ["fit", "--gpu", "a100"]


# ------------------------------------------------------------------------------ Ray backend


def test_ray_backend_equals_the_process_pool(tmp_path):
    """``carbon-gym eval --ray-address local`` on a real local Ray instance (Ray is in the test
    extra: this runs in CI, never skipped) writes the same rows as the process pool."""
    import ray  # noqa: F401 - a hard requirement of the test extra

    argv = ["eval", "--policies", "rr,milp,clairvoyant", "--scenarios", "dev", "--seeds", "2", "--duration-s", "10",
            "--no-progress", "--no-plots", "--no-tensorboard", "--no-requests"]
    assert cli.main(argv + ["--workers", "2", "--out", str(tmp_path / "pool")]) == 0
    assert cli.main(argv + ["--ray-address", "local", "--workers", "2", "--out", str(tmp_path / "ray")]) == 0
    assert not ray.is_initialized()  # the local instance it started is stopped again
    pool = pd.read_csv(tmp_path / "pool" / "runs.csv")
    remote = pd.read_csv(tmp_path / "ray" / "runs.csv")
    assert len(pool) == 6 and list(pool["policy"]) == list(remote["policy"])
    keep = [c for c in pool.columns if not c.startswith(tables.NONDETERMINISTIC_PREFIXES)]
    pd.testing.assert_frame_equal(pool[keep], remote[keep], check_exact=True)
    cfg = json.loads((tmp_path / "ray" / "config.json").read_text())
    assert cfg["backend"] == "ray:local" and "ray" in cfg["versions"]


def test_errors_inside_worker_processes_are_reported(capsys, tmp_path, monkeypatch):
    # a ConfigError raised by a policy inside a pool worker: one line naming the run, exit 2
    argv = ["eval", "--scenarios", "dev", "--seeds", "1", "--duration-s", "5",
            "--workers", "2", "--no-progress", "--no-plots", "--no-tensorboard", "--no-requests", "--out", str(tmp_path)]
    rc = cli.main(argv + ["--policies", "rr,clairvoyant", "--policy-arg", "clairvoyant.utilisation=50"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "dev__clairvoyant__seed0: clairvoyant.utilisation: must be in (0, 10]" in err
    # an unknown keyword is bad input too (the registry names the policy), for every policy alike
    rc = cli.main(argv + ["--policies", "rr,clairvoyant", "--policy-arg", "clairvoyant.bogus=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "dev__clairvoyant__seed0: policy: bad arguments for 'clairvoyant': " in err and "'bogus'" in err
    # an unexpected error (a bug in a policy): exit 1 with the worker's traceback
    (tmp_path / "buggy_policy_mod.py").write_text("class Buggy:\n    def act(self, observation, info):\n        return 1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # (spawned workers inherit sys.path)
    rc = cli.main(argv + ["--policies", "rr,buggy_policy_mod:Buggy"])
    err = capsys.readouterr().err
    assert rc == 1 and "ZeroDivisionError" in err and "Traceback" in err and "buggy_policy_mod.py" in err


@pytest.mark.slow
def test_learned_checkpoint_runs_through_the_harness(tmp_path):
    pytest.importorskip("sb3_contrib", reason="learned policies need the [train] extra")
    from train.cli import main as train_main

    model = tmp_path / "agent.zip"
    assert train_main(["--config", "dev_maskable", "--run-dir", str(tmp_path / "run"), "--total-timesteps", "64", "--export", str(model)]) == 0
    out = tmp_path / "eval"
    rc = cli.main(["eval", "--policies", f"rr,learned:{model}", "--scenarios", "dev", "--seeds", "1", "--duration-s", "10",
                   "--out", str(out), "--workers", "1", "--no-progress", "--no-plots", "--tensorboard", str(out / "tensorboard")])
    assert rc == 0
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["policy"]) == ["rr", "learned:agent"]
    assert runs["requests_arrived"].iloc[1] == runs["requests_arrived"].iloc[0]  # same workload
    assert (out / "tensorboard" / "dev" / "learned_agent" / "seed_0").is_dir()
