"""``carbon-gym train`` writes and resumes from pickle-free files (issues 43.1 and 39.9).

A run writes ``final.npz`` (the set policy, pickle-free) and names it in its summary; ``--resume``
reads ``checkpoints/step_<t>.state.npz`` (no trust flag); a run folder whose ``state.json`` names
planted pickles (VecNormalize ``.pkl``, SB3 ``.zip``) is refused with one line and exit status 2
before anything is unpickled: the planted payload writes a marker file, which must not appear.
"""

from __future__ import annotations

import json
import pathlib
import pickle
import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

from train.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

CONFIG = """
name = "tiny_safe"
algorithm = "maskable_ppo"
scenarios = ["dev"]
seed = 3
n_envs = 1
total_timesteps = 128
[overrides]
duration_s = 16
[ppo]
n_steps = 64
batch_size = 32
n_epochs = 1
[set_policy]
hidden = 8
[vec_normalize]
reward = true
[eval]
every_timesteps = 0
final = false
[checkpoint]
every_timesteps = 64
"""


class Payload:
    """Unpickles as ``Path(marker).touch()``: what a planted pickle could run instead."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run interrupted at 64 of its 128 timesteps (as an interruption would leave it), then
    ``carbon-gym train --resume`` (the CLI) to 128 without a trust flag."""
    import contextlib
    import io

    from train.config import load_config
    from train.runner import train

    warnings.simplefilter("ignore", UserWarning)
    d = tmp_path_factory.mktemp("safe")
    cfg = d / "tiny.toml"
    cfg.write_text(CONFIG)
    run = d / "run"
    train(load_config(str(cfg)), run, log=lambda _: None, stop_after_timesteps=64)
    state1 = json.loads((run / "state.json").read_text())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["--config", str(cfg), "--run-dir", str(run), "--resume"])
    return {"cfg": cfg, "run": run, "rc": rc, "out": out.getvalue(), "state1": state1}


def test_training_writes_a_pickle_free_npz_that_learned_loads_without_trust(tiny_run):
    import gymnasium as gym

    import carbon_gym  # noqa: F401
    from carbon_gym.policy import rollout
    from carbon_gym.registry import make_policy
    from eval.cli import resolve_policies
    from train.checkpoint import checkpoint_format
    from train.policy import LearnedPolicy

    assert tiny_run["rc"] == 0
    final = tiny_run["run"] / "final.npz"
    # the printed summary names the .npz
    assert f"final policy: {final}" in tiny_run["out"]
    assert checkpoint_format(final) == "set"
    # the CLI's policy check admits it without --trust-checkpoint (an SB3 zip it refuses)
    assert resolve_policies(f"learned:{final}") == ["rr", f"learned:{final}"]
    env = gym.make("carbon_gym/GeoServe-v0", scenario="dev", overrides={"duration_s": 16})
    a = rollout(env, make_policy(f"learned:{final}", env, seed=1), seed=2)
    b = rollout(env, LearnedPolicy.load(tiny_run["run"] / "final.zip", seed=1, trust=True), seed=2)
    assert a["placed"] > 0 and a["invalid_actions"] == 0
    assert a["carbon_g"] == b["carbon_g"] and a["violations"] == b["violations"]


def test_resume_reads_the_pickle_free_state_without_trust(tiny_run):
    from train.resume_state import load_resume_state  # noqa: F401  (the module the resume reads)

    s1 = tiny_run["state1"]
    assert s1["num_timesteps"] == 64 and s1["resume_state"] == "step_000000064.state.npz"
    assert "resume: step_000000064.state.npz at 64 timesteps" in tiny_run["out"]
    s2 = json.loads((tiny_run["run"] / "state.json").read_text())
    assert s2["num_timesteps"] == 128 and s2["phase"] == "done"
    assert (tiny_run["run"] / "checkpoints" / "step_000000128.state.npz").is_file()


def _plant(run: pathlib.Path, marker: pathlib.Path, **state) -> None:
    ck = run / "checkpoints"
    (ck / "evil.vecnormalize.pkl").write_bytes(pickle.dumps(Payload(marker)))
    (ck / "evil.zip").write_bytes((ck / "step_000000128.zip").read_bytes())
    (run / "state.json").write_text(json.dumps({"num_timesteps": 64, "phase": "ppo", **state}))


def test_planted_pickles_do_not_run_on_resume_without_trust(tiny_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run["run"], run)
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(Payload(marker)))  # (the payload is real)
    assert marker.exists()
    marker.unlink()
    _plant(run, marker, checkpoint="evil.zip", vecnormalize="evil.vecnormalize.pkl")
    argv = ["--config", str(tiny_run["cfg"]), "--run-dir", str(run), "--resume"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--trust-checkpoint" in err and "evil.zip" in err and "refused" in err
    assert not marker.exists()
    # a resume_state that is in fact a pickle is read with allow_pickle=False: refused, nothing runs
    _plant(run, marker, checkpoint="evil.zip", resume_state="evil.vecnormalize.pkl")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "resume:" in err and "evil.vecnormalize.pkl" in err
    assert not marker.exists()
    # a file name outside checkpoints/ is refused too
    _plant(run, marker, checkpoint="../../evil.zip")
    assert main(argv) == 2
    assert "state.json" in capsys.readouterr().err and not marker.exists()


def test_policy_arg_cannot_bypass_the_trust_flag():
    from eval.cli import UsageError, parse_policy_args

    with pytest.raises(UsageError, match=r"^--policy-arg: 'learned.trust': trust is not a policy argument.*--trust-checkpoint"):
        parse_policy_args(["learned.trust=true"])
    assert parse_policy_args(["learned.mode=argmax"]) == {"learned": {"mode": "argmax"}}
