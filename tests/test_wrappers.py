"""RoutingWeightsWrapper: apportionment, interleaving, credits, masks, invalid weights."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import carbon_gym  # noqa: F401  (registers the envs)
from carbon_gym.errors import ActionError
from carbon_gym.wrappers import RoutingWeightsWrapper, apportion


def test_apportion_largest_remainder() -> None:
    np.testing.assert_array_equal(apportion(np.array([0.5, 0.3, 0.2]), 10), [5, 3, 2])
    # 7 x (0.5, 0.3, 0.2) = 3.5, 2.1, 1.4 -> floors 3, 2, 1, one left -> largest remainder 0.5
    np.testing.assert_array_equal(apportion(np.array([3.5, 2.1, 1.4]), 7), [4, 2, 1])
    # ties go to the lowest index
    np.testing.assert_array_equal(apportion(np.array([1.0, 1.0, 1.0]), 1), [1, 0, 0])
    np.testing.assert_array_equal(apportion(np.array([1.0, 1.0, 1.0]), 2), [1, 1, 0])
    # negatives count as zero; all-zero means uniform
    np.testing.assert_array_equal(apportion(np.array([-1.0, 2.0]), 3), [0, 3])
    np.testing.assert_array_equal(apportion(np.zeros(4), 6), [2, 2, 1, 1])


def test_apportion_sums_and_is_proportional() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        d = int(rng.integers(1, 8))
        e = rng.random(d) * rng.integers(0, 3)
        n = int(rng.integers(0, 500))
        q = apportion(e, n)
        assert q.sum() == n and np.all(q >= 0)
        if e.sum() > 0:
            exact = e / e.sum() * n
            assert np.all(np.abs(q - exact) < 1.0 + 1e-9)


def make_env(**overrides) -> RoutingWeightsWrapper:
    base = {"duration_s": 20.0}
    base.update(overrides)
    return RoutingWeightsWrapper(gym.make("carbon_gym/GeoServe-dev-v0", overrides=base))


def test_one_hot_weights_send_everything_to_one_datacenter() -> None:
    env = make_env()
    env.reset(seed=1)
    D = env.unwrapped.layout.n_datacenters
    total = np.zeros(D, dtype=np.int64)
    while True:
        w = np.zeros(D, np.float32)
        w[1] = 1.0
        _, _, _, trunc, info = env.step(w)
        total += info["routing_counts"]
        if trunc:
            break
    m = info["episode_metrics"]
    assert total[1] == m["placed"] == m["arrived"] > 0
    assert total[0] == 0 and m["dc_placed"][0] == 0


def test_weights_split_counts_and_interleave() -> None:
    env = make_env(**{"workload.rate_per_s": 40.0, "env.max_pending": 128})
    env.reset(seed=2)
    w = np.array([0.75, 0.25], np.float32)
    counts = np.zeros(2, dtype=np.int64)
    for _ in range(10):
        n = env.unwrapped._n_visible
        action = env.action(w)
        placed = action[:n]
        # counts within one of the exact share (credits carry the fraction)
        share = np.bincount(placed, minlength=2)
        counts += share
        # interleaved: no run of more than 4 consecutive requests to datacenter 0 at 3:1
        runs = np.diff(np.flatnonzero(np.diff(np.r_[-1, placed, -1]) != 0))
        assert runs.max(initial=0) <= 4
        env.unwrapped.step(action)
    total = counts.sum()
    assert abs(counts[0] - 0.75 * total) <= 1.0 + 1e-9


def test_uniform_weights_alternate_across_steps_with_one_request() -> None:
    """With one request per step, the carried credit alternates datacenters (no bias to index 0)."""
    env = make_env(**{"duration_s": 60.0, "workload.rate_per_s": 1.0})
    env.reset(seed=0)
    wrapper = env
    picks = []
    for _ in range(30):
        n = env.unwrapped._n_visible
        a = wrapper.action(np.array([0.5, 0.5], np.float32))
        picks.extend(a[:n].tolist())
        env.unwrapped.step(a)
    picks = np.array(picks)
    assert abs(int((picks == 0).sum()) - int((picks == 1).sum())) <= 1


def test_invalid_weights_raise() -> None:
    env = make_env()
    env.reset(seed=0)
    with pytest.raises(ActionError, match="shape"):
        env.step(np.zeros(3, np.float32))
    with pytest.raises(ActionError, match="finite"):
        env.step(np.array([np.nan, 1.0]))
    with pytest.raises(ActionError, match=r"\[0, 1\]"):
        env.step(np.array([1.5, 0.0]))
    # zero weights are allowed: uniform over the allowed datacenters
    env.step(np.zeros(2, np.float32))


def test_masked_datacenter_never_chosen() -> None:
    env = make_env(**{"workload.rate_per_s": 30.0})
    env.reset(seed=0)
    base = env.unwrapped
    base.set_datacenter_up(0, False)
    for _ in range(5):
        n = base._n_visible
        a = env.action(np.array([1.0, 0.0], np.float32))  # all weight on the down datacenter
        assert np.all(a[:n] == 1)
        base.step(a)
