"""Inputs that used to crash or be accepted silently now raise named errors (issue 22, item 4).
Each test failed on the code before the fix."""

from __future__ import annotations

import copy
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError, DataError
from carbon_gym.physics.carbon import load_carbon_trace
from carbon_gym.physics.network import load_zone_rtt_ms
from carbon_gym.scenario import load_scenario
from carbon_gym.workload import TraceReplayArrivals, load_length_table


def _csv(tmp_path: Path, text: str | bytes, name: str = "f.csv") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


# ------------------------------------------------------------------ replay workloads
def test_replay_all_timestamps_equal(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="span > 0") as ei:
        TraceReplayArrivals(np.zeros(5))
    assert ei.value.field == "workload.trace"


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_replay_nonfinite_timestamp(tmp_path: Path, bad: str) -> None:
    p = _csv(tmp_path, f"TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1,10,5\n{bad},10,5\n3,10,5\n")
    with pytest.raises(DataError, match=r"f\.csv:4.*not a finite number"):
        load_length_table(str(p))


def test_replay_final_inf_or_nan(tmp_path: Path) -> None:
    for bad in ("inf", "nan"):
        p = _csv(tmp_path, f"TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1,10,5\n{bad},10,5\n", f"{bad}.csv")
        with pytest.raises(DataError, match=":4"):
            load_length_table(str(p))


def test_replay_mixed_numeric_and_iso(tmp_path: Path) -> None:
    p = _csv(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n5,10,5\n")
    with pytest.raises(DataError, match=r":3.*mixes formats"):
        load_length_table(str(p))


# ------------------------------------------------------------------ carbon CSVs
WIDE = "datetime,DE\n2023-01-01T00:00:00Z,{a}\n2023-01-01T01:00:00Z,{b}\n2023-01-01T02:00:00Z,300\n"


def test_carbon_huge_value(tmp_path: Path) -> None:
    p = _csv(tmp_path, WIDE.format(a="1e308", b="200"))
    with pytest.raises(DataError, match=r":2.*out of range.*100000"):
        load_carbon_trace(p)


def test_carbon_digit_separator(tmp_path: Path) -> None:
    p = _csv(tmp_path, WIDE.format(a="100", b="1_000"))
    with pytest.raises(DataError, match=r":3.*not a number: '1_000'"):
        load_carbon_trace(p)


def test_carbon_bad_utf8_names_its_line(tmp_path: Path) -> None:
    body = WIDE.format(a="100", b="200").encode() + b"2023-01-01T03:00:00Z,1\xff0\n"
    p = _csv(tmp_path, b"".join([body]))
    with pytest.raises(DataError, match=r"f\.csv:5: not valid UTF-8"):
        load_carbon_trace(p)


def test_carbon_inf_timestamp_names_its_own_line(tmp_path: Path) -> None:
    p = _csv(tmp_path, "datetime,DE\n2023-01-01T00:00:00Z,100\ninf,200\n2023-01-01T02:00:00Z,300\n")
    with pytest.raises(DataError, match=r"f\.csv:3"):
        load_carbon_trace(p)


def test_episode_past_a_user_trace_warns(tmp_path: Path) -> None:
    hours = "".join(f"2023-06-15T{h:02d}:00:00Z,{100 + h},{200 + h}\n" for h in range(3))
    p = _csv(tmp_path, "datetime,DE,FR\n" + hours)
    with pytest.warns(UserWarning, match="wrap around"):
        GeoServeEnv("dev", overrides={"carbon.file": str(p), "carbon.start_utc": "2023-06-15T02:30:00Z",
                                      "duration_s": 3600.0, "env.max_pending": 4096})


# ------------------------------------------------------------------ RTT matrices
@pytest.mark.parametrize("cell", ["NaN", "null"])
def test_rtt_text_nan(tmp_path: Path, cell: str) -> None:
    p = _csv(tmp_path, f"from_zone,A,B\nA,0,{cell}\nB,20,0\n")
    with pytest.raises(DataError, match=r":2.*is not a number"):
        load_zone_rtt_ms(p)
    # a blank cell still means the same cloud region
    q = _csv(tmp_path, "from_zone,A,B\nA,0,\nB,20,0\n", "blank.csv")
    assert load_zone_rtt_ms(q)[1][0, 1] == 8.0


def test_rtt_duplicate_columns(tmp_path: Path) -> None:
    p = _csv(tmp_path, "from_zone,A,A\nA,0,5\n")
    with pytest.raises(DataError, match=r":1: duplicate zone columns: A"):
        load_zone_rtt_ms(p)


# ------------------------------------------------------------------ scenarios and env arguments
@pytest.mark.parametrize("field, value", [("workload.block_s", 1e-6), ("slo.ttft_s", 1e-30), ("slo.tpot_s", 1e-30)])
def test_tiny_scenario_values(field: str, value: float) -> None:
    with pytest.raises(ConfigError) as ei:
        load_scenario("dev", overrides={field: value})
    assert ei.value.field == field and ei.value.allowed is not None


@pytest.mark.parametrize("arg", [None, 5])
def test_load_scenario_bad_type(arg: object) -> None:
    with pytest.raises(ConfigError, match="expected a scenario name") as ei:
        load_scenario(arg)  # type: ignore[arg-type]
    assert ei.value.field == "scenario"


@pytest.mark.parametrize("bad", ["5", True, float("inf")])
def test_drain_limit_bad(bad: object) -> None:
    with pytest.raises(ConfigError) as ei:
        GeoServeEnv("dev", drain_limit_s=bad)  # type: ignore[arg-type]
    assert ei.value.field == "drain_limit_s"


def test_weights_do_not_fit_names_the_memory_fraction() -> None:
    with pytest.raises(ConfigError) as ei:
        GeoServeEnv("dev", overrides={"engine.gpu_memory_utilization": 0.1})
    assert ei.value.field == "engine.gpu_memory_utilization"


def test_reset_options_not_a_dict() -> None:
    env = GeoServeEnv("dev", overrides={"duration_s": 3.0})
    with pytest.raises(ConfigError) as ei:
        env.reset(options=5)  # type: ignore[arg-type]
    assert ei.value.field == "options"


def test_env_pickles_and_deepcopies_with_identical_results() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = GeoServeEnv("dev-fault", overrides={"duration_s": 10.0})
    env.reset(seed=3)
    K, D = env.layout.max_pending, env.layout.n_datacenters
    act = [np.arange(K) % D, (np.arange(K) + 1) % D]
    for k in range(3):
        m = env.action_masks().reshape(K, D + 1)
        a = np.where(m[np.arange(K), act[k % 2]], act[k % 2], D)
        env.step(a)
    clones = [pickle.loads(pickle.dumps(env)), copy.deepcopy(env)]
    outs = []
    for e in [env, *clones]:
        rs = []
        done = False
        k = 0
        while not done:
            m = e.action_masks().reshape(K, D + 1)
            a = np.where(m[np.arange(K), act[k % 2]], act[k % 2], D)
            obs, r, _, done, info = e.step(a)
            rs.append(r)
            k += 1
        em = info["episode_metrics"]
        outs.append((rs, em["carbon_g"], em["ttft_p99_s"], em["completed"], obs["slots"].tobytes()))
    assert outs[0] == outs[1] == outs[2]


# ------------------------------------------------------------------ CLI --out
@pytest.mark.parametrize("kind", ["file", "empty", "under-file"])
def test_cli_bad_out(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    from eval.cli import main

    f = tmp_path / "file"
    f.write_text("x")
    out = {"file": str(f), "empty": "", "under-file": str(f / "sub")}[kind]
    rc = main(["eval", "--scenarios", "dev", "--policies", "rr", "--preset", "quick", "--out", out])
    err = capsys.readouterr().err
    assert rc == 2 and "--out" in err and "Traceback" not in err
