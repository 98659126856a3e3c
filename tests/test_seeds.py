"""``env.reset(seed=...)`` and the scenario's ``seed`` field: numpy integers accepted, the rest a
named ConfigError (issue 42, item 4; formerly Gymnasium's bare ``Error``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError
from carbon_gym.scenario import load_scenario


@pytest.fixture(scope="module")
def env() -> GeoServeEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GeoServeEnv("dev", overrides={"duration_s": 4.0})


@pytest.mark.parametrize("bad", [-1, 1.5, "abc", [1, 2], float("nan"), True], ids=repr)
def test_bad_seed_is_a_named_error(env: GeoServeEnv, bad: object) -> None:
    with pytest.raises(ConfigError) as ei:
        env.reset(seed=bad)
    assert ei.value.field == "seed" and str(ei.value).startswith("seed: ")


@pytest.mark.parametrize("seed", [np.int64(5), np.uint8(5), np.int32(5)], ids=repr)
def test_numpy_integer_seed_equals_the_int(env: GeoServeEnv, seed: object) -> None:
    a, _ = env.reset(seed=seed)
    ws = env._world_seed
    b, _ = env.reset(seed=5)
    assert ws == 5 and type(ws) is int and all(np.array_equal(a[k], b[k]) for k in a)


def test_scenario_seed_field_takes_a_numpy_integer() -> None:
    assert load_scenario("dev", overrides={"seed": np.int64(7)}).seed == 7
    with pytest.raises(ConfigError, match="seed"):
        load_scenario("dev", overrides={"seed": 7.0})
