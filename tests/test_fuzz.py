"""Standing fuzz suite (issue 22, item 5): hypothesis strategies over scenario overrides, data
files (carbon traces, RTT matrices, workload traces) and actions. Only documented errors
(:class:`~carbon_gym.errors.CarbonGymError` subclasses) may come out; what is accepted must be
sound (finite data, observations inside the observation space, the ledger balanced, the slots
showing only placeable requests). Each test has a timeout and a few seconds of examples
(``CARBON_GYM_FUZZ_EXAMPLES`` raises the count for a deeper search)."""

from __future__ import annotations

import itertools
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import CarbonGymError
from carbon_gym.physics.carbon import load_carbon_trace
from carbon_gym.physics.network import load_zone_rtt_ms
from carbon_gym.scenario import load_scenario
from carbon_gym.workload import load_length_table

N = int(os.environ.get("CARBON_GYM_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=N, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_n = itertools.count()

CELL = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10, 10**6).map(str),
    st.sampled_from(["", "nan", "NaN", "null", "inf", "1_000", "1e308", "-0", "abc", "1e-320", " 5 "]),
)
TIME = st.one_of(
    st.integers(0, 30).map(lambda h: f"2023-01-01T{h % 24:02d}:00:00Z"),
    st.sampled_from(["inf", "nan", "", "2023-13-01T00:00:00Z", "0", "1.5"]),
)


def _write(tmp_path: Path, data: str | bytes) -> Path:
    p = tmp_path / f"fuzz-{next(_n)}.csv"
    p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    return p


@pytest.mark.timeout(60)
@FUZZ
@given(rows=st.lists(st.tuples(TIME, CELL, CELL), min_size=0, max_size=8), junk=st.binary(max_size=4))
def test_fuzz_carbon_csv(tmp_path: Path, rows: list, junk: bytes) -> None:
    text = "datetime,DE,FR\n" + "".join(f"{t},{a},{b}\n" for t, a, b in rows)
    try:
        trace = load_carbon_trace(_write(tmp_path, text.encode() + junk))
    except CarbonGymError:
        return
    v = np.asarray(trace.hourly_g_per_kwh)
    assert np.all(np.isfinite(v)) and np.all(v >= 0) and np.all(v <= 1e5)


@pytest.mark.timeout(60)
@FUZZ
@given(cells=st.lists(CELL, min_size=4, max_size=4), cols=st.sampled_from(["A,B", "A,A", "B,A", "A"]))
def test_fuzz_rtt_matrix(tmp_path: Path, cells: list, cols: str) -> None:
    text = f"from_zone,{cols}\nA,{cells[0]},{cells[1]}\nB,{cells[2]},{cells[3]}\n"
    try:
        zones, rtt = load_zone_rtt_ms(_write(tmp_path, text))
    except CarbonGymError:
        return
    assert len(set(zones)) == len(zones) and np.all(np.isfinite(rtt)) and np.all(rtt >= 0)


@pytest.mark.timeout(60)
@FUZZ
@given(rows=st.lists(st.tuples(st.one_of(CELL, TIME), st.integers(-1, 5000), st.integers(-1, 5000)), max_size=8))
def test_fuzz_workload_trace(tmp_path: Path, rows: list) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},{p},{o}\n" for t, p, o in rows)
    try:
        table = load_length_table(str(_write(tmp_path, text)))
    except CarbonGymError:
        return
    assert table.arrival_s is not None and np.all(np.isfinite(table.arrival_s))
    assert np.all(np.diff(table.arrival_s) >= 0) and np.all(table.prompt_tokens >= 1)


OVERRIDE_VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**9), st.booleans(),
                            st.sampled_from(["5", "", None, [], {}, "poisson", "x"]))
FIELDS = ("duration_s", "polling_period_s", "slo.ttft_s", "slo.tpot_s", "workload.rate_per_s", "workload.block_s",
          "workload.max_context_tokens", "env.max_pending", "engine.gpu_memory_utilization", "engine.max_num_seqs",
          "env.carbon_weight", "carbon.forecast_horizon_h", "workload.diurnal_amplitude", "seed")


@pytest.mark.timeout(120)
@FUZZ
@given(over=st.dictionaries(st.sampled_from(FIELDS), OVERRIDE_VALUES, max_size=3))
def test_fuzz_scenario_overrides(over: dict) -> None:
    try:
        sc = load_scenario("dev", overrides={"duration_s": 3.0, **over})
    except CarbonGymError:
        return
    if sc.duration_s > 30 or sc.rate_per_s * sc.duration_s > 2000 or sc.duration_s / sc.polling_period_s > 60:
        return  # valid but too long for a unit test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            env = GeoServeEnv(sc)
        except CarbonGymError:
            return
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    done = False
    while not done:
        obs, r, _, done, info = env.step(_masked(env))
        assert env.observation_space.contains(obs) and math.isfinite(r)
    assert info["episode_metrics"]["ledger"]["ok"]


def _masked(env: GeoServeEnv) -> np.ndarray:
    """A valid action: the lowest allowed datacenter per slot (defer where none)."""
    K, D = env.layout.max_pending, env.layout.n_datacenters
    m = env.action_masks()[: K * (D + 1)].reshape(K, D + 1)
    return np.argmax(m, axis=1).astype(np.int64)


ACTIONS = st.one_of(
    st.lists(st.integers(-3, 8), min_size=0, max_size=70).map(np.array),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=64, max_size=64).map(np.array),
    st.sampled_from([None, "0", 3, [[0]], np.zeros(64, dtype=bool), np.zeros(64, dtype=object)]),
)


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@FUZZ
@given(actions=st.lists(ACTIONS, min_size=1, max_size=6), downs=st.lists(st.tuples(st.integers(0, 3), st.booleans()),
                                                                          max_size=4))
def test_fuzz_actions_and_outages(actions: list, downs: list) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = GeoServeEnv("dev-fault", overrides={"duration_s": 8.0}, invalid_action="defer")
    env.reset(seed=0)
    K = env.layout.max_pending
    for i, a in enumerate(actions):
        if i < len(downs):
            env.set_datacenter_up(*downs[i])
        st_ = env.state()
        assert st_.action_mask[:, :-1].any(axis=1).all()  # the slots hold only placeable requests
        if len(st_.pending) < K:
            assert st_.pending_total - len(st_.pending) == st_.pending_blocked
        try:
            env.step(a)
        except CarbonGymError:
            env.step(_masked(env))
    while not env._done:
        env.step(_masked(env))
    assert env.episode_metrics()["ledger"]["ok"]
