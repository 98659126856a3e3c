"""train.callbacks.UpdateThreadsCallback: the PPO update on its own torch thread count, the
rollouts on the count set when training starts; a bad count is a ConfigError naming the field;
in a real MaskablePPO run the update sees the update count and the rollout the other."""

from __future__ import annotations

import pytest
import torch as th

from carbon_gym.errors import ConfigError
from train.callbacks import UpdateThreadsCallback


@pytest.fixture
def one_thread():
    before = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(before)


def test_hooks_switch_the_thread_count(one_thread):
    cb = UpdateThreadsCallback(2)
    cb._on_training_start()
    cb._on_rollout_start()
    assert th.get_num_threads() == 1
    cb._on_rollout_end()
    assert th.get_num_threads() == 2
    cb._on_rollout_start()
    assert th.get_num_threads() == 1
    cb._on_rollout_end()
    cb._on_training_end()
    assert th.get_num_threads() == 1
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="update_threads"):
            UpdateThreadsCallback(bad)  # type: ignore[arg-type]


def test_update_runs_on_its_threads_in_a_real_run(one_thread):
    """PPO on a gymnasium toy env: the thread count seen inside ``model.train`` (the update) is
    the update count, the one seen in ``collect_rollouts`` the rollout count."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    seen: dict[str, set[int]] = {"update": set(), "rollout": set()}

    class Probe(BaseCallback):  # (called at every env step of a rollout)
        def _on_step(self) -> bool:
            seen["rollout"].add(th.get_num_threads())
            return True

    model = PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=32, batch_size=16, n_epochs=1, seed=0, device="cpu")
    train_fn = model.train

    def train() -> None:
        seen["update"].add(th.get_num_threads())
        train_fn()

    model.train = train
    model.learn(total_timesteps=96, callback=[UpdateThreadsCallback(2), Probe()])
    assert seen["update"] == {2} and seen["rollout"] == {1} and th.get_num_threads() == 1
