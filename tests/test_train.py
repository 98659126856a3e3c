"""Training workflow: PPO / MaskablePPO runs write the domain TensorBoard tags, checkpoints
save/load/resume to the same state, configs are validated, BC fits an expert, LearnedPolicy runs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")
pytest.importorskip("tensorboard")

import torch as th  # noqa: E402

from carbon_gym.errors import ConfigError  # noqa: E402
from train.config import config_from_dict  # noqa: E402
from train.curves import read_scalars  # noqa: E402
from train.tags import TAGS  # noqa: E402

DEV = {"duration_s": 16}


def _cfg(algorithm: str, **kw):
    raw = {
        "name": f"test_{algorithm}",
        "algorithm": algorithm,
        "scenarios": ["dev"],
        "overrides": DEV,
        "seed": 3,
        "n_envs": 1,
        "total_timesteps": 256,
        "ppo": {"n_steps": 64, "batch_size": 32, "n_epochs": 2},
        "vec_normalize": {"reward": True},
        "eval": {"scenario": "dev", "every_timesteps": 128, "seed": 5},
        "checkpoint": {"every_timesteps": 128},
    }
    if algorithm == "maskable_ppo":
        raw["set_policy"] = {"hidden": 16}
    raw.update(kw)
    return config_from_dict(raw, source="test")


def _quiet(*_a, **_k):
    return None


@pytest.fixture(autouse=True)
def _threads():
    prev = th.get_num_threads()
    th.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    yield
    th.set_num_threads(prev)


def test_tags_are_the_eval_harness_tags():
    from eval.tb import TAGS as EVAL_TAGS

    assert list(TAGS) == list(EVAL_TAGS)
    assert TAGS.carbon_step_g == "carbon/step_g"


@pytest.fixture(scope="module")
def maskable_run(tmp_path_factory):
    """A MaskablePPO (set policy) run on dev, interrupted at 128 timesteps, then resumed to 256."""
    from sb3_contrib import MaskablePPO

    from train.callbacks import latest_checkpoint
    from train.runner import train

    th.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    run = tmp_path_factory.mktemp("maskable")
    cfg = _cfg("maskable_ppo", bc={"expert": "rr", "episodes": 2, "epochs": 2, "batch_steps": 8})
    first = train(cfg, run, log=_quiet, stop_after_timesteps=128)
    state1 = latest_checkpoint(run)
    m1 = MaskablePPO.load(state1["checkpoint_path"], device="cpu")
    params1 = {k: v.clone() for k, v in m1.policy.state_dict().items()}
    # A resume that trains nothing more: load -> save must give back the same state.
    again = train(cfg, run, resume=True, log=_quiet, stop_after_timesteps=0)
    state2 = latest_checkpoint(run)
    m2 = MaskablePPO.load(state2["checkpoint_path"], device="cpu")
    vn1 = _load_vecnorm(state1["vecnormalize_path"])
    vn2 = _load_vecnorm(state2["vecnormalize_path"])
    final = train(cfg, run, resume=True, log=_quiet)
    return {
        "run": run, "cfg": cfg, "first": first, "again": again, "final": final, "state1": state1, "state2": state2,
        "params1": params1, "params2": m2.policy.state_dict(), "t2": m2.num_timesteps, "vn": (vn1, vn2),
    }


def _load_vecnorm(path):
    import pickle

    with open(path, "rb") as fh:
        vn = pickle.load(fh)
    return float(vn.ret_rms.var), float(vn.ret_rms.count)


def test_maskable_set_policy_logs_domain_tags(maskable_run):
    scalars = read_scalars(Path(maskable_run["run"]) / "tb")
    missing = [t for t in TAGS if t not in scalars]
    assert not missing, f"domain tags missing from TensorBoard: {missing}"
    for t in ("train/value_loss", "train/approx_kl", "bc/ce", "rollout/ep_rew_mean"):
        assert t in scalars, t
    # Held-out evaluations at 0 (after BC), 128 and 256 timesteps; round-robin's own reduction
    # would be 0, ours is a finite percentage.
    steps = [s for s, _ in scalars[TAGS.reduction_vs_rr_pct]]
    assert steps[0] == 0 and steps[-1] == 256 and 128 in steps
    assert all(np.isfinite(v) for _, v in scalars[TAGS.reduction_vs_rr_pct])
    assert all(0.0 <= v <= 1.0 for _, v in scalars[TAGS.slo_violation_rate])
    assert all(v > 0 for _, v in scalars[TAGS.carbon_step_g])


def test_checkpoint_resume_restores_the_same_state(maskable_run):
    r = maskable_run
    assert r["first"]["num_timesteps"] == 128
    assert r["state1"]["num_timesteps"] == 128
    assert r["t2"] == 128 and r["again"]["num_timesteps"] == 128
    p1, p2 = r["params1"], r["params2"]
    assert set(p1) == set(p2)
    for k in p1:
        assert th.equal(p1[k], p2[k]), k
    assert r["vn"][0] == r["vn"][1]  # VecNormalize statistics restored exactly
    assert r["final"]["num_timesteps"] == 256
    # One TensorBoard run continues across the resume: SB3 scalars before and after 128 timesteps.
    tb = Path(r["run"]) / "tb"
    scalars = read_scalars(tb)
    steps = [s for s, _ in scalars["train/value_loss"]]
    assert min(steps) <= 128 < max(steps) and max(steps) == 256
    assert json.loads((Path(r["run"]) / "state.json").read_text())["phase"] == "done"
    # The CSV rows written before each resume are kept, not truncated.
    assert len(list(tb.glob("progress.before_*.csv"))) == 2


def test_resume_refuses_another_config(maskable_run):
    from train.runner import train

    other = _cfg("maskable_ppo", seed=99)
    with pytest.raises(ConfigError, match="another config"):
        train(other, maskable_run["run"], resume=True, log=_quiet)
    with pytest.raises(ConfigError, match="--resume"):
        train(maskable_run["cfg"], maskable_run["run"], log=_quiet)


def test_learned_policy_runs_in_rollout_and_is_seeded(maskable_run):
    import gymnasium as gym

    import carbon_gym  # noqa: F401
    from carbon_gym.policy import rollout
    from carbon_gym.registry import make_policy
    from train.policy import LearnedPolicy

    path = Path(maskable_run["run"]) / "final.zip"
    env = gym.make("carbon_gym/GeoServe-v0", scenario="dev", overrides=DEV)
    with pytest.raises(ConfigError, match="trust"):  # an SB3 zip (pickled objects) needs trust
        LearnedPolicy.load(path, seed=1)
    a = rollout(env, LearnedPolicy.load(path, seed=1, trust=True), seed=2)
    b = rollout(env, make_policy(f"learned:{path}", env, seed=1, trust=True), seed=2)
    assert a["carbon_g"] == b["carbon_g"] and a["violations"] == b["violations"]
    assert a["invalid_actions"] == 0 and a["placed"] > 0
    assert a["decision_s_mean"] < 0.05
    assert type(make_policy(f"ppo:{path}", env, seed=1, trust=True)) is LearnedPolicy
    # The exported (shipped-style, pickle-free) checkpoint is smaller, loads without trust and
    # acts the same; it records the run's config.
    from train.checkpoint import checkpoint_format, read_set_checkpoint
    from train.policy import export_checkpoint

    small = export_checkpoint(path, Path(maskable_run["run"]) / "export.npz", trust=True)
    assert checkpoint_format(small) == "set" and small.stat().st_size < path.stat().st_size
    assert read_set_checkpoint(small).training["config"]["name"] == maskable_run["cfg"].name
    c = rollout(env, LearnedPolicy.load(small, seed=1), seed=2)
    assert c["carbon_g"] == a["carbon_g"] and c["violations"] == a["violations"]


def test_ppo_routing_weights_logs_domain_tags(tmp_path):
    from carbon_gym.policy import rollout
    from train.envs import make_episode_env
    from train.policy import LearnedPolicy
    from train.runner import train

    cfg = _cfg("ppo", n_envs=2, total_timesteps=256, eval={"scenario": "dev", "every_timesteps": 256, "seed": 5, "final": False})
    out = train(cfg, tmp_path, log=_quiet)
    assert out["num_timesteps"] == 256
    scalars = read_scalars(tmp_path / "tb")
    missing = [t for t in TAGS if t not in scalars]
    assert not missing, missing
    assert "train/value_loss" in scalars
    # The routing-weights agent is a Policy too: weights -> per-request action through the wrapper.
    env = make_episode_env("dev", DEV, "2023-01-04T06:00:00Z")
    m = rollout(env, LearnedPolicy.load(tmp_path / "final.zip", trust=True), seed=0)
    assert m["placed"] == m["arrived"] - m["unplaced_at_end"] and m["invalid_actions"] == 0
    # no pickle-free format for routing weights: the export is a compact SB3 zip, still under the trust rule
    from train.policy import export_checkpoint

    small = export_checkpoint(tmp_path / "final.zip", tmp_path / "routing.zip", trust=True)
    with pytest.raises(ConfigError, match="trust"):
        LearnedPolicy.load(small)
    m2 = rollout(make_episode_env("dev", DEV, "2023-01-04T06:00:00Z"), LearnedPolicy.load(small, trust=True), seed=0)
    assert m2["carbon_g"] == m["carbon_g"]


def test_config_validation_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="algorithm"):
        config_from_dict({"algorithm": "dqn"})
    with pytest.raises(ConfigError, match="bc.nope"):
        config_from_dict({"bc": {"nope": 1}})
    with pytest.raises(ConfigError, match="ppo.env"):
        config_from_dict({"ppo": {"env": "x"}})
    with pytest.raises(ConfigError, match="bc"):
        config_from_dict({"algorithm": "ppo", "bc": {}})
    from train.config import load_config

    cfg = load_config("llama8b")
    assert cfg.algorithm == "maskable_ppo" and cfg.bc is not None and cfg.bc.expert == "facility-milp"
    with pytest.raises(ConfigError, match="no such config"):
        load_config(tmp_path / "missing.toml")


def test_cli_reports_config_errors(tmp_path, capsys):
    from train.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text('algorithm = "a2c"\n')
    assert main(["--config", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    assert "algorithm" in capsys.readouterr().err


def test_heldout_split():
    from train.envs import heldout_starts, is_heldout_day, training_start

    rng = np.random.default_rng(0)
    from datetime import datetime

    for _ in range(200):
        d = datetime.strptime(training_start(rng), "%Y-%m-%dT%H:%M:%SZ")
        assert not is_heldout_day(d.timetuple().tm_yday)
    starts = heldout_starts(12)
    assert len(set(starts)) == 12
    for s in starts:
        assert is_heldout_day(datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").timetuple().tm_yday)


def test_behaviour_cloning_fits_the_expert():
    from train.bc import behaviour_clone, collect_expert
    from train.envs import make_episode_env
    from train.set_policy import SetNetwork, layout_spec

    data = collect_expert("rr", ["dev"], DEV, episodes=2, seed=0)
    assert len(data) == 2 * 16
    th.manual_seed(0)
    net = SetNetwork(layout_spec(make_episode_env("dev", DEV, None)), hidden=16)
    out = behaviour_clone(net, data, epochs=15, batch_steps=4, learning_rate=1e-2, value_weight=0.5,
                          gamma=0.9, reward_std=1.0)
    h = out["history"]
    assert h[-1]["ce"] < 0.8 * h[0]["ce"]
    assert out["val_steps"] == 16 and out["train_steps"] == 16


def test_checkpoint_records_env_and_rejects_another_env_version(tmp_path):
    import json
    import zipfile

    from carbon_gym.errors import ConfigError
    from train.checkpoint import META_NAME
    from train.policy import SHIPPED_CHECKPOINT, LearnedPolicy, checkpoint_env_meta

    with zipfile.ZipFile(SHIPPED_CHECKPOINT) as zf:  # the shipped agent records its env
        meta = json.loads(zf.read(META_NAME))
    assert meta["env"] == checkpoint_env_meta()
    bad = tmp_path / "old.npz"
    meta["env"]["env_version"] = "geoserve-0.0"
    with zipfile.ZipFile(SHIPPED_CHECKPOINT) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.namelist():
            dst.writestr(item, json.dumps(meta) if item == META_NAME else src.read(item))
    with pytest.raises(ConfigError, match="env_version.*geoserve-0.0"):
        LearnedPolicy.load(bad)
    junk = tmp_path / "junk.zip"
    junk.write_text("not a zip")
    with pytest.raises(ConfigError, match="not a carbon-gym checkpoint"):
        LearnedPolicy.load(junk)


def test_every_shipped_config_loads_and_the_capacity_p01_recipe_differs_only_in_polling():
    """Each ``train/configs/*.toml`` passes validation; the 0.1 s capacity agent's recipe is the
    1 s one's with only the polling period (and the pending cap sized for it) changed."""
    import dataclasses
    from pathlib import Path

    from train.config import load_config

    configs = sorted(Path("train/configs").glob("*.toml"))
    assert len(configs) >= 20
    for p in configs:
        load_config(p)
    a, b = (dataclasses.asdict(load_config(n)) for n in ("llama8b_dagger_capacity", "llama8b_dagger_capacity_p01"))
    assert b["overrides"].pop("polling_period_s") == 0.1 and b["dagger"]["overrides"].pop("polling_period_s") == 0.1
    assert (a["overrides"].pop("env.max_pending"), b["overrides"].pop("env.max_pending")) == (2048, 1024)
    assert (a.pop("name"), b.pop("name")) == ("llama8b_dagger_capacity", "llama8b_dagger_capacity_p01")
    assert Path(a.pop("source")).name == "llama8b_dagger_capacity.toml" and Path(b.pop("source")).name.endswith("_p01.toml")
    assert a == b
