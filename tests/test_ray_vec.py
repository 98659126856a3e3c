"""``RayVecEnv`` (train.ray_vec): the training envs as Ray actors on a real local Ray instance.

Stepped like a ``DummyVecEnv`` of the same factories it gives the same observations, rewards,
dones and terminal observations across episode ends; the VecEnv attribute and method calls work;
MaskablePPO learns on it; ``carbon-gym train --ray-address local`` runs; bad backends are
refused. Ray starts once for the module (a ``RayVecEnv`` with ``address="local"`` starts it) and
is shut down when that env closes.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")
ray = pytest.importorskip("ray")

from carbon_gym.errors import ConfigError  # noqa: E402
from train.envs import make_env_fns, make_vec_env  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

#: dev scenario (1 s steps): 6-step episodes, so a short run crosses episode ends
OVER = {"duration_s": 6}
SEED = 11
N_ENVS = 2


@pytest.fixture(scope="module")
def ray_venv():
    """2 dev envs as Ray actors (half a CPU each, so a 2-core machine has room for one more
    actor); this RayVecEnv starts the local Ray instance and its close stops it."""
    from train.ray_vec import RayVecEnv

    warnings.simplefilter("ignore", UserWarning)
    already = ray.is_initialized()
    venv = RayVecEnv(make_env_fns(["dev"], OVER, n_envs=N_ENVS, seed=SEED, routing=False), address="local",
                     num_cpus_per_env=0.5)
    assert ray.is_initialized()
    yield venv
    venv.close()
    venv.close()  # idempotent
    leaked = ray.is_initialized() and not already
    if leaked:
        ray.shutdown()
    assert not leaked, "the local Ray instance a RayVecEnv started must stop when the last one closes"


def _actions(masks: list[np.ndarray], nvec: np.ndarray, t: int) -> np.ndarray:
    """A deterministic valid action per env: for dimension j the ((t + j) mod n)-th allowed value."""
    out = np.zeros((len(masks), len(nvec)), dtype=np.int64)
    cuts = np.cumsum(nvec)[:-1]
    for e, m in enumerate(masks):
        for j, part in enumerate(np.split(np.asarray(m, dtype=bool), cuts)):
            ok = np.flatnonzero(part)
            out[e, j] = ok[(t + j) % len(ok)]
    return out


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    else:
        assert a == b


def test_ray_steps_like_dummy_across_episode_ends(ray_venv):
    from stable_baselines3.common.vec_env import DummyVecEnv

    dummy = DummyVecEnv(make_env_fns(["dev"], OVER, n_envs=N_ENVS, seed=SEED, routing=False))
    try:
        for v in (dummy, ray_venv):
            v.seed(SEED)
            v.set_options({})
        obs_d, obs_r = dummy.reset(), ray_venv.reset()
        _same(obs_d, obs_r)
        assert len(ray_venv.reset_infos) == N_ENVS
        nvec = np.asarray(dummy.action_space.nvec)
        ends = 0
        for t in range(14):
            masks_d, masks_r = dummy.env_method("action_masks"), ray_venv.env_method("action_masks")
            for md, mr in zip(masks_d, masks_r):
                np.testing.assert_array_equal(md, mr)
            act = _actions(masks_d, nvec, t)
            od, rd, dd, infd = dummy.step(act)
            orr, rr, dr, infr = ray_venv.step(act)
            _same(od, orr)
            assert isinstance(orr, dict) and all(orr[k].shape[0] == N_ENVS for k in orr)
            np.testing.assert_array_equal(rr.astype(np.float32), rd)  # SubprocVecEnv's float64; DummyVecEnv's float32
            np.testing.assert_array_equal(dr, dd)
            assert dr.dtype == bool and rr.shape == (N_ENVS,)
            for i_d, i_r, done in zip(infd, infr, dd):
                assert i_d["TimeLimit.truncated"] == i_r["TimeLimit.truncated"]
                assert ("terminal_observation" in i_r) == bool(done)
                if done:
                    ends += 1
                    _same(i_d["terminal_observation"], i_r["terminal_observation"])
                    assert all(a.flags.writeable for a in i_r["terminal_observation"].values())
                    assert i_r["episode"]["l"] == i_d["episode"]["l"] == 6
                    assert i_r["episode"]["r"] == pytest.approx(i_d["episode"]["r"], abs=0)
                for k in ("carbon_g", "violations", "completed"):
                    if k in i_d:
                        _same(i_d[k], i_r[k])
        assert ends == 2 * N_ENVS  # both envs ended episodes at steps 6 and 12
    finally:
        dummy.close()


def test_attributes_and_methods(ray_venv):
    from stable_baselines3.common.monitor import Monitor

    ray_venv.reset()
    masks = ray_venv.env_method("action_masks")
    assert len(masks) == N_ENVS and masks[0].dtype == bool and masks[0].size == int(np.sum(ray_venv.action_space.nvec))
    assert len(ray_venv.env_method("action_masks", indices=[1])) == 1
    layouts = ray_venv.get_attr("layout")
    assert len(layouts) == N_ENVS and type(layouts[0]).__name__ == "ObservationLayout"
    ray_venv.set_attr("probe_value", 7, indices=1)
    assert ray_venv.get_attr("probe_value", indices=[1]) == [7]
    assert ray_venv.has_attr("layout") and not ray_venv.has_attr("probe_value")  # set on env 1 only
    with pytest.raises(AttributeError):
        ray_venv.get_attr("no_such_attribute")
    assert ray_venv.env_is_wrapped(Monitor) == [True] * N_ENVS
    assert ray_venv.render_mode is None


def test_maskable_ppo_learns_on_ray(ray_venv):
    from train.config import config_from_dict
    from train.runner import build_model

    cfg = config_from_dict({"algorithm": "maskable_ppo", "scenarios": ["dev"], "overrides": OVER, "seed": 1,
                            "n_envs": N_ENVS, "ppo": {"n_steps": 8, "batch_size": 8, "n_epochs": 1},
                            "set_policy": {"hidden": 8}}, source="test")
    model = build_model(cfg, ray_venv)
    model.learn(total_timesteps=2 * 8 * N_ENVS, progress_bar=False)
    assert model.num_timesteps == 2 * 8 * N_ENVS


def test_train_cli_with_ray_address_local(ray_venv, tmp_path):
    """``carbon-gym train --ray-address local`` (one env; Ray is already up, so it is used as it is)."""
    from train import cli

    cfg = tmp_path / "ray_dev.toml"
    cfg.write_text('name = "ray_dev"\nalgorithm = "maskable_ppo"\nscenarios = ["dev"]\noverrides = { duration_s = 6 }\n'
                   "n_envs = 1\ntotal_timesteps = 16\n[ppo]\nn_steps = 8\nbatch_size = 8\nn_epochs = 1\n"
                   "[set_policy]\nhidden = 8\n[eval]\nfinal = false\n")
    run = tmp_path / "run"
    assert cli.main(["--config", str(cfg), "--run-dir", str(run), "--ray-address", "local"]) == 0
    assert (run / "final.npz").exists()
    assert ray.is_initialized()  # the module's instance: still used by ray_venv


def test_bad_backend_is_a_config_error(capsys):
    with pytest.raises(ConfigError, match="vec_backend") as exc:
        make_vec_env(["dev"], OVER, n_envs=1, seed=0, routing=False, backend="threads")
    assert exc.value.field == "vec_backend" and exc.value.allowed == ["dummy", "subproc", "ray"]
    with pytest.raises(ConfigError, match="vec_backend"):
        make_vec_env(["dev"], OVER, n_envs=1, seed=0, routing=False, backend="subproc", ray_address="local")
    with pytest.raises(ConfigError, match="vec_backend"):
        make_vec_env(["dev"], OVER, n_envs=2, seed=0, routing=False, backend="dummy", subprocess=True)
    from train import cli

    assert cli.main(["--config", "dev_maskable", "--vec", "dummy", "--ray-address", "local"]) == 2
    assert "vec_backend" in capsys.readouterr().err


def test_default_backend_is_unchanged():
    from train.envs import vec_backend

    assert vec_backend(1) == "dummy" and vec_backend(2) == "subproc"
    assert vec_backend(2, subprocess=False) == "dummy" and vec_backend(1, subprocess=True) == "subproc"
    assert vec_backend(1, ray_address="auto") == "ray"
