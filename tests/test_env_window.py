"""Steady-state measurement windows (issue 21, item 1): opt-in (``[env] measure = "window"``,
``warmup_s``), the burn-in not counted, no drain, in-flight work's energy counted as far as it
was run in the window; without them the env is unchanged (the golden results pin that)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError
from carbon_gym.policy import RoundRobinPolicy, run_episode

WINDOW = {"duration_s": 30.0, "env.measure": "window", "env.warmup_s": 10.0}


def _episode(overrides, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = GeoServeEnv("dev", overrides=overrides, **kw)
    infos = []

    class Keep:
        def after_step(self, env, step, action, reward, terminated, truncated, info, decision_s):
            infos.append((float(env.unwrapped.simulator.now_s), info))

        def on_reset(self, *a):
            pass

        def before_step(self, *a):
            pass

    ep = run_episode(env, RoundRobinPolicy(), seed=0, observers=[Keep()])
    return env, ep.info["episode_metrics"], infos


def test_window_counts_only_the_window_and_has_no_drain():
    env, em, infos = _episode(WINDOW)
    assert em["measure"] == "window" and em["window_start_s"] == 10.0 and em["window_s"] == 20.0
    assert em["sim_time_s"] == 30.0 and em["drain_s"] == 0.0  # truncated at the window's end
    # carbon: the steps ending after the window opened (their time integral), nothing of the burn-in
    in_window = [i for t, i in infos if t > 10.0 + 1e-9]
    assert em["carbon_g"] == pytest.approx(sum(i["carbon_g"] for i in in_window), rel=1e-12)
    assert em["completed"] == sum(i["completed"] for i in in_window)
    assert em["violations"] == sum(i["violations"] for i in in_window)
    # arrivals: those collected once the window is open ([10, 30): the steps ending at 11 .. 30)
    assert em["arrived"] == sum(i["arrived"] for i in in_window)
    # backlog: in flight + pending at the window's start and end; what it took in and did not do
    assert em["backlog_end"] == em["in_flight_at_truncation"] + em["unplaced_at_end"]
    assert em["unfinished_window"] == max(0, em["backlog_end"] - em["backlog_start"])
    assert em["ledger"]["ok"]  # the ledger covers the whole episode, burn-in included
    full_env, full, _ = _episode({"duration_s": 30.0})
    assert "measure" not in full and full["sim_time_s"] > 30.0  # the default: from 0, then the drain
    assert em["carbon_g"] < full["carbon_g"]


def test_window_without_work_is_the_floor_over_the_window_exactly():
    env, em, _ = _episode({**WINDOW, "workload.rate_per_s": 1e-9})
    parts = env.unwrapped.world_parts
    tr, off = parts.carbon, parts.carbon_offset_s
    want = sum(d.pue * (d.gpus * parts.power.idle_w + d.nodes * parts.power.host_w) * tr.integral(tr.zone_index(d.zone), off + 10.0, off + 30.0)
               for d in parts.topology.datacenters) / 3.6e6
    assert em["arrived"] == 0 and em["carbon_g"] == pytest.approx(want, rel=1e-9)


def test_window_percentiles_from_streamed_records_match(tmp_path):
    _, mem, _ = _episode(WINDOW)
    _, disk, _ = _episode(WINDOW, record_dir=tmp_path)
    for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p90_s", "ttft_mean_s", "carbon_g", "completed"):
        assert disk[k] == pytest.approx(mem[k], rel=1e-12), k


def test_window_settings_are_checked():
    with pytest.raises(ConfigError, match="env.warmup_s"):
        GeoServeEnv("dev", overrides={"env.warmup_s": 10.0})  # a warm-up needs a window
    with pytest.raises(ConfigError, match="multiple of polling_period_s"):
        GeoServeEnv("dev", overrides={**WINDOW, "env.warmup_s": 10.5})
    with pytest.raises(ConfigError, match="below duration_s"):
        GeoServeEnv("dev", overrides={**WINDOW, "env.warmup_s": 30.0})
    with pytest.raises(ConfigError, match="env.measure"):
        GeoServeEnv("dev", overrides={"env.measure": "sometimes"})
    env, em, _ = _episode({"duration_s": 12.0, "env.measure": "window"})  # no warm-up: from t = 0, no drain
    assert em["window_start_s"] == 0.0 and em["sim_time_s"] == 12.0 and np.isfinite(em["carbon_g"])
