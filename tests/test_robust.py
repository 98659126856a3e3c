"""Bad input everywhere: random and malformed carbon / workload CSV files, scenario TOML files and
overrides, and env actions get a documented error (a CarbonGymError subclass naming the
problem) or a valid result - never another exception, never silently bad data. Also: the env
fingerprint that checkpoints store."""

from __future__ import annotations

import itertools
import math
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carbon_gym.env import (
    ENV_VERSION,
    GeoServeEnv,
    check_env_compatible,
    env_fingerprint,
    observation_signature,
)
from carbon_gym.errors import ActionError, CarbonGymError, ConfigError
from carbon_gym.physics.carbon import load_carbon_trace
from carbon_gym.scenario import SCENARIO_DIR, load_scenario, parse_override, scenario_from_dict
from carbon_gym.workload import load_length_table, make_trace_replay

_counter = itertools.count()
#: examples per property (raise it for a deeper search: CARBON_GYM_HYPOTHESIS_EXAMPLES=2000)
N_EXAMPLES = int(os.environ.get("CARBON_GYM_HYPOTHESIS_EXAMPLES", "60"))
SETTINGS = dict(max_examples=N_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])

# ----------------------------------------------------------------------------- cells
NUMBERS = st.one_of(
    st.integers(-5, 2000).map(str),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(repr),
    st.sampled_from(["", " ", "nan", "NaN", "inf", "-inf", "1e400", "-0", "0", "1.5", "12abc", "\"3\"", "None",
                     "1,000", "7 ", "\t9"]),
)
TIMES = st.one_of(
    st.sampled_from(["2023-01-01 00:00:00", "2023-01-01 01:00:00", "2023-01-01T02:00:00Z",
                     "2023-01-01 03:00:00+01:00", "2023-13-01 00:00:00", "yesterday", "", "2023-01-01", "0", "1.5"]),
    st.datetimes().map(lambda d: d.isoformat()),
)


def _write(tmp_path, text: str | bytes, suffix: str = ".csv"):
    p = tmp_path / f"f{next(_counter)}{suffix}"  # unique: loaders cache by path and mtime
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8", errors="surrogatepass")
    return p


def _rows(header: list[str], cells: st.SearchStrategy, time_first: bool = True) -> st.SearchStrategy:
    n = len(header)
    row = st.tuples(TIMES, *[cells] * (n - 1)) if time_first else st.tuples(*[cells] * n)
    return st.lists(row, min_size=0, max_size=8).map(
        lambda rows: ",".join(header) + "\n" + "\n".join(",".join(r) for r in rows) + "\n")


def _hourly_rows(draw, n: int) -> list[str]:
    start = draw(st.integers(0, 20))
    order = list(range(start, start + n))
    if draw(st.booleans()):
        order = draw(st.permutations(order))
    if n and draw(st.booleans()):
        order[draw(st.integers(0, n - 1))] = order[0]
    return [f"2023-01-{1 + h // 24:02d} {h % 24:02d}:00:00" for h in order]


@st.composite
def carbon_csv(draw) -> str:
    kind = draw(st.sampled_from(["wide", "long", "random"]))
    if kind == "random":
        return draw(st.text(max_size=200))
    n = draw(st.integers(0, 6))
    times = _hourly_rows(draw, n)
    if kind == "wide":
        zones = draw(st.lists(st.sampled_from(["DE", "FR", "NO", "", "DE "]), min_size=1, max_size=3))
        head = draw(st.sampled_from(["datetime_utc", "Datetime (UTC)", "time", "zone"]))
        lines = [",".join([head, *zones])]
        for t in times:
            vals = [draw(NUMBERS) for _ in zones]
            if draw(st.integers(0, 9)) == 0:
                vals = vals[:-1]  # short row
            lines.append(",".join([t, *vals]))
    else:
        lines = ["zone,datetime,carbon_intensity"]
        for t in times:
            lines.append(f"{draw(st.sampled_from(['DE', 'FR', '']))},{t},{draw(NUMBERS)}")
    return "\n".join(lines) + "\n"


@settings(**SETTINGS)
@given(text=carbon_csv(), fill=st.sampled_from([None, "ffill", "linear"]),
       interpolation=st.sampled_from(["step", "linear"]))
def test_load_carbon_trace_on_random_csv(tmp_path, text, fill, interpolation):
    p = _write(tmp_path, text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tr = load_carbon_trace(p, fill=fill, interpolation=interpolation)
    except CarbonGymError as e:
        assert str(e)  # a message naming the problem
        return
    v = np.asarray(tr.hourly_g_per_kwh)
    assert v.ndim == 2 and v.shape[0] >= 1 and v.shape[1] == len(tr.zones) >= 1
    assert np.all(np.isfinite(v)) and np.all(v >= 0)  # never silently bad numbers
    assert math.isfinite(tr.integral(0, 0.0, 7200.0))


@settings(**SETTINGS)
@given(data=st.binary(max_size=300))
def test_load_carbon_trace_on_random_bytes(tmp_path, data):
    p = _write(tmp_path, data)
    try:
        load_carbon_trace(p)
    except CarbonGymError:
        pass


@st.composite
def workload_csv(draw) -> str:
    if draw(st.integers(0, 5)) == 0:
        return draw(st.text(max_size=200))
    header = draw(st.sampled_from([
        ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], ["ContextTokens", "GeneratedTokens"],
        ["prompt_tokens", "output_tokens"], ["TIMESTAMP", "ContextTokens"], ["a", "b", "c"],
    ]))
    n = draw(st.integers(0, 6))
    lines = [",".join(header)]
    t = 0.0
    for _ in range(n):
        row = []
        for h in header:
            if h == "TIMESTAMP":
                t += draw(st.sampled_from([0.0, 0.5, 3.0, -1.0]))
                row.append(draw(st.one_of(st.just(repr(t)), TIMES)))
            else:
                row.append(draw(NUMBERS))
        lines.append(",".join(row))
    return "\n".join(lines) + "\n"


@settings(**SETTINGS)
@given(text=workload_csv())
def test_workload_files_on_random_csv(tmp_path, text):
    p = _write(tmp_path, text)
    try:
        table = load_length_table(str(p))
    except CarbonGymError as e:
        assert str(e)
    else:
        assert table.prompt_tokens.size >= 1 and table.prompt_tokens.size == table.output_tokens.size
        assert (table.prompt_tokens >= 1).all() and (table.output_tokens >= 1).all()
        if table.arrival_s is not None:
            assert np.all(np.isfinite(table.arrival_s)) and np.all(np.diff(table.arrival_s) >= 0)
    try:
        rep = make_trace_replay(str(p), rate_per_s=2.0)
    except CarbonGymError:
        return
    t, _ = rep.events(0.0, 100.0)
    assert np.all(np.isfinite(t))


# ----------------------------------------------------------------------------- scenarios
DEV_TEXT = (SCENARIO_DIR / "dev.toml").read_text()
FIELDS = [
    "name", "model", "gpu", "duration_s", "polling_period_s", "seed", "description",
    "topology.preset", "topology.nodes_per_datacenter", "topology.metro_rtt_ms", "topology.only_regions",
    "topology.datacenters_per_region", "topology.regions", "topology.datacenters", "topology.regions.0.client_zone",
    "topology.datacenters.1.zone", "topology.datacenters.0.nodes", "topology.datacenters.0.pue",
    "slo.ttft_s", "slo.tpot_s", "workload.arrival", "workload.load", "workload.rate_per_s", "workload.cv",
    "workload.lengths", "workload.trace", "workload.max_context_tokens", "workload.region_shares",
    "workload.diurnal_amplitude", "workload.block_s", "workload.prompt_tokens", "workload.time_scale",
    "carbon.file", "carbon.kind", "carbon.start_utc", "carbon.fill", "carbon.forecast_horizon_h",
    "carbon.interpolation", "carbon.forecast_error_std_frac",
    "engine.tp", "engine.max_num_seqs", "engine.max_num_batched_tokens", "engine.block_tokens",
    "engine.gpu_memory_utilization", "engine.max_model_len", "engine.dispatcher", "engine.chunked_prefill",
    "env.max_pending", "env.predictor", "env.slo_weight", "faults", "faults.0", "faults.0.start_s",
    "nonsense", "workload.nonsense", "slo", "topology.regions.5.name", ".", "a..b",
]
VALUES = st.one_of(
    st.integers(-10, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text(max_size=12),
    st.sampled_from(["default", "custom", "poisson", "replay", "fixed", "trace", "oracle", "DE", "FR", "moderate",
                     "2023-06-01T00:00:00Z", "azure-code", "x.csv", "packaged", "linear"]),
    st.lists(st.one_of(st.floats(0, 1), st.text(max_size=5)), max_size=3),
    st.fixed_dictionaries({"kind": st.sampled_from(["datacenter_outage", "region_outage", "engine_drain", "carbon_feed_gap",
                                                     "link_degradation", "?"]),
                           "start_s": st.floats(-1, 100), "datacenter": st.sampled_from(["de", "fr", "zz"])}),
    st.lists(st.fixed_dictionaries({"kind": st.just("region_outage"), "region": st.sampled_from(["europe", "x"]),
                                    "start_s": st.floats(0, 100), "end_s": st.floats(0, 100)}), max_size=2),
)


@settings(**SETTINGS)
@given(overrides=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=3))
def test_load_scenario_with_random_overrides(overrides):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = load_scenario("dev", overrides=overrides)
    except CarbonGymError as e:
        assert str(e)
        return
    assert s.duration_s > 0 and s.rate_per_s > 0 and s.polling_period_s > 0


@pytest.mark.parametrize("overrides, where", [
    ({"topology.regions": [0.0], "topology.regions.0.client_zone": 0}, "topology.regions.0 is not a table (it is float 0.0)"),
    ({"topology.regions": [[1], "x"], "topology.regions.1.client_zone": "DE"}, "topology.regions.1 is not a table (it is str 'x')"),
])
def test_override_into_a_list_item_that_is_not_a_table_names_the_field(overrides, where):
    """Found by the fuzz case above (a TypeError before): a dotted override reaching through a
    list item that is a number or a string is a ConfigError naming the key."""
    with pytest.raises(ConfigError, match="topology.regions") as e:
        load_scenario("dev", overrides=overrides)
    assert where in str(e.value)


@settings(**SETTINGS)
@given(lines=st.lists(st.integers(0, 200), max_size=4), junk=st.text(max_size=40), where=st.integers(0, 10_000))
def test_load_scenario_on_corrupted_toml(tmp_path, lines, junk, where):
    text = DEV_TEXT
    for i in lines:  # drop some lines, then splice junk in somewhere
        ls = text.splitlines()
        if ls:
            del ls[i % len(ls)]
        text = "\n".join(ls)
    k = where % (len(text) + 1)
    text = text[:k] + junk + text[k:]
    p = _write(tmp_path, text, ".toml")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_scenario(p)
    except CarbonGymError as e:
        assert str(e)


@settings(**SETTINGS)
@given(text=st.text(max_size=60))
def test_parse_override_never_crashes(text):
    try:
        k, v = parse_override(text)
    except CarbonGymError:
        return
    assert isinstance(k, str) and k


def test_scenario_from_dict_rejects_non_tables():
    for raw in ([], "x", {"name": "a", "model": "llama-3.1-8b", "topology": []}, {"model": 3}):
        with pytest.raises(CarbonGymError):
            scenario_from_dict(raw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- env.step
@pytest.fixture(scope="module")
def env():
    e = GeoServeEnv("dev-fault", overrides={"duration_s": 40.0})
    e.reset(seed=0)
    return e


K = 64
ACTIONS = st.one_of(
    st.lists(st.integers(-3, 8), min_size=0, max_size=70).map(np.asarray),
    st.lists(st.integers(0, 4), min_size=K, max_size=K).map(np.asarray),
    st.lists(st.integers(0, 4), min_size=K, max_size=K),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=K, max_size=K).map(np.asarray),
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0, 4.5]), min_size=K, max_size=K).map(np.asarray),
    st.lists(st.booleans(), min_size=K, max_size=K).map(np.asarray),
    st.lists(st.text(max_size=2), min_size=K, max_size=K).map(np.asarray),
    st.lists(st.integers(0, 4), min_size=K, max_size=K).map(lambda x: np.asarray(x, dtype=object)),
    st.lists(st.integers(0, 4), min_size=K, max_size=K).map(lambda x: np.asarray(x).reshape(8, 8)),
    st.lists(st.integers(0, 4), min_size=K, max_size=K).map(lambda x: np.asarray(x, dtype=np.uint8)),
    st.lists(st.integers(0, 4), min_size=K, max_size=K).map(lambda x: np.asarray(x, dtype=np.complex64)),
    st.sampled_from([None, 3, "0", {"a": 1}, [[1, 2], [3]], np.int64(2), b"\x00" * K, object()]),
)


@settings(**{**SETTINGS, "max_examples": 2 * N_EXAMPLES})
@given(action=ACTIONS, mode=st.sampled_from(["raise", "defer"]))
def test_env_step_with_random_actions(env, action, mode):
    env._invalid_action = mode
    if env._done:
        env.reset(seed=1)
    before = (env._tally.placed, env._step_index, len(env._pending))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs, r, term, trunc, info = env.step(action)
    except ActionError as e:
        assert "action" in str(e)
        # a refused action changes nothing
        assert (env._tally.placed, env._step_index, len(env._pending)) == before
        return
    assert env.observation_space.contains(obs) and np.isfinite(r)
    assert info["placed"] + info["deferred"] <= before[2]
    led = env.ledger(strict=True)
    assert led["ok"]


def test_invalid_actions_name_the_slot_and_allowed_values(env):
    env._invalid_action = "raise"
    env.reset(seed=0)
    a = np.full(K, 99)
    with pytest.raises(ActionError, match=r"action\[0\] = 99 .*allowed now"):
        env.step(a)
    with pytest.raises(ActionError, match=r"shape \(64,\)"):
        env.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ActionError, match="dtype"):
        env.step(np.zeros(K, dtype=bool))


# ----------------------------------------------------------------------------- checkpoints
def test_env_fingerprint_tells_layouts_apart_and_explains_differences():
    a = GeoServeEnv("dev")
    b = GeoServeEnv("dev", overrides={"env.max_pending": 128})
    c = GeoServeEnv("dev-fault")  # carbon-feed-gap columns, 4 datacenters
    fa, fb = env_fingerprint(a), env_fingerprint(b)
    assert fa.startswith(ENV_VERSION + ":") and fa == env_fingerprint(GeoServeEnv("dev", overrides={"duration_s": 5.0}))
    assert len({fa, fb, env_fingerprint(c)}) == 3
    check_env_compatible(fa, a)
    check_env_compatible(observation_signature(a), a.layout)
    with pytest.raises(ConfigError, match="checkpoint") as e:
        check_env_compatible(fa, b)
    assert fb in str(e.value)
    with pytest.raises(ConfigError, match="max_pending: stored 64, env 128"):
        check_env_compatible(observation_signature(a), b)
    with pytest.raises(ConfigError, match="dc_columns"):
        check_env_compatible(observation_signature(a), c)
    old = dict(observation_signature(a), env_version="geoserve-0.1")
    with pytest.raises(ConfigError, match="env_version: stored 'geoserve-0.1'"):
        check_env_compatible(old, a)
    with pytest.raises(ConfigError, match="fingerprint string or a signature dict"):
        check_env_compatible(3, a)
