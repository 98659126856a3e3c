"""GeoServeEnv against the ecosystem: both env checkers, Gymnasium and SB3 vector envs, MaskablePPO."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence

import carbon_gym  # noqa: F401  (registers the envs)
from carbon_gym.policy import RoundRobinPolicy

DEV = "carbon_gym/GeoServe-dev-v0"


def make_short(duration_s: float = 5.0):
    return gym.make(DEV, overrides={"duration_s": duration_s})


def test_gymnasium_check_env_passes_without_warnings() -> None:
    from gymnasium.utils.env_checker import check_env

    env = gym.make(DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning is tolerated
        # The unwrapped env is checked (the checker warns on wrappers); gym.make set its spec.
        assert env.unwrapped.spec is not None and env.unwrapped.spec.id == DEV
        check_env(env.unwrapped, skip_render_check=False)


def test_sb3_check_env_passes_without_warnings() -> None:
    from stable_baselines3.common.env_checker import check_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make(DEV), warn=True)


def _rr_actions(policies, masks) -> np.ndarray:
    return np.stack([p.act(None, {"action_mask": m}) for p, m in zip(policies, masks)])


@pytest.mark.parametrize("vector_cls", ["sync", "async"])
def test_gymnasium_vector_envs(vector_cls: str) -> None:
    fns = [make_short, make_short]
    vec = gym.vector.SyncVectorEnv(fns) if vector_cls == "sync" else gym.vector.AsyncVectorEnv(fns)
    try:
        obs, info = vec.reset(seed=[0, 1])
        single, single_info = make_short().reset(seed=1)
        assert data_equivalence({k: v[1] for k, v in obs.items()}, single, exact=True)
        policies = [RoundRobinPolicy(), RoundRobinPolicy()]
        ended = np.zeros(2, dtype=bool)
        for _ in range(5):
            obs, rew, term, trunc, info = vec.step(_rr_actions(policies, info["action_mask"]))
            assert obs["slots"].shape == (2, 64 * (4 + 1 + 2)) and rew.shape == (2,)
            assert not term.any()
            ended |= trunc
        assert ended.all()  # 5 steps of 1 s
        assert info["_episode_metrics"].all()
        assert (info["episode_metrics"]["completed"] == info["episode_metrics"]["arrived"]).all()
        # NEXT_STEP autoreset: the next step starts new episodes
        obs, rew, term, trunc, info = vec.step(np.full((2, 64), 2))
        assert (rew == 0).all() and not trunc.any()
    finally:
        vec.close()


@pytest.mark.parametrize("vec_kind", ["dummy", "subproc"])
def test_sb3_vec_envs(vec_kind: str) -> None:
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    fns = [make_short, make_short]
    vec = DummyVecEnv(fns) if vec_kind == "dummy" else SubprocVecEnv(fns)
    try:
        vec.seed(3)
        obs = vec.reset()
        assert obs["datacenters"].shape[0] == 2
        policies = [RoundRobinPolicy(), RoundRobinPolicy()]
        D = 2
        done_seen = np.zeros(2, dtype=bool)
        for _ in range(5):
            masks = [np.asarray(m).reshape(64, D + 1) for m in vec.env_method("action_masks")]
            obs, rew, done, infos = vec.step(_rr_actions(policies, masks))
            done_seen |= done
        assert done_seen.all()
        for info in infos:
            assert "terminal_observation" in info and "episode_metrics" in info
            assert info["episode_metrics"]["in_flight_at_truncation"] == 0
    finally:
        vec.close()


def test_maskable_ppo_learns_a_few_steps() -> None:
    pytest.importorskip("sb3_contrib")
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    vec = DummyVecEnv([make_short])
    model = MaskablePPO("MultiInputPolicy", vec, n_steps=16, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=32)
    obs = vec.reset()
    masks = np.stack(vec.env_method("action_masks"))
    action, _ = model.predict(obs, action_masks=masks, deterministic=True)
    assert action.shape == (1, 64)
    allowed = masks.reshape(1, 64, 3)
    assert allowed[0, np.arange(64), action[0]].all()


def test_max_episode_steps_is_the_episode_length_for_every_id() -> None:
    """Issue 39 item 10: Gymnasium tools read ``spec.max_episode_steps``. Each shipped scenario's
    id registers its length (read fast from the TOML; here checked against the full loader),
    the any-scenario id none, and a made env's spec states its own length."""
    from carbon_gym import env_id_for_scenario, registered_env_ids
    from carbon_gym.numeric import episode_steps
    from carbon_gym.scenario import load_scenario

    assert gym.spec("carbon_gym/GeoServe-v0").max_episode_steps is None
    ids = registered_env_ids()[1:]
    assert len(ids) == 16
    for env_id in ids:
        name = gym.spec(env_id).kwargs["scenario"]
        assert env_id == env_id_for_scenario(name)
        sc = load_scenario(name)
        assert gym.spec(env_id).max_episode_steps == episode_steps(sc.duration_s, sc.polling_period_s)
    assert gym.spec(DEV).max_episode_steps == 60
    assert gym.spec("carbon_gym/GeoServe-llama8b-diurnal-v0").max_episode_steps == 86400
    assert gym.make("carbon_gym/GeoServe-v0", scenario="llama8b-moderate").spec.max_episode_steps == 600
    assert episode_steps(60.0, 0.25) == 240 and episode_steps(1.0, 0.3) == 4 and episode_steps(0.6000000001, 0.2) == 3


def test_made_env_ends_by_itself_at_its_max_episode_steps() -> None:
    """The env truncates at its own last step (after its drain: the ledger is in that step's
    info), which is where ``TimeLimit`` stands; a lengthened episode warns about the limit."""
    env = make_short(5.0)
    assert env.unwrapped.spec.max_episode_steps == 5 == env.unwrapped.max_episode_steps
    _obs, info = env.reset(seed=0)
    pol, steps = RoundRobinPolicy(), 0
    while True:
        _obs, _r, term, trunc, info = env.step(pol.act(None, info))
        steps += 1
        if term or trunc:
            break
    m = info["episode_metrics"]
    assert steps == 5 and trunc and not term and m["ledger"]["ok"] and m["ledger"]["completed"] == m["ledger"]["arrived"] > 0
    with pytest.warns(UserWarning, match="pass max_episode_steps=100 to gymnasium.make"):
        env = gym.make(DEV, overrides={"duration_s": 100.0})
    assert env.unwrapped.spec.max_episode_steps == 100 and env.spec.max_episode_steps == 60
