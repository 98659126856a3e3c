"""Generalisation-test infrastructure (issue 24 item 3): a carbon CSV of another year loads by path
and drives an episode (named errors for a start outside it), evaluation starts in another year,
and the per-test table (share of the MILP's reduction, violation difference)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError


def _csv_2022(path) -> list[tuple[float, float]]:
    """72 hours of DE and FR from 2022-03-01 00:00 UTC (made-up values), wide format."""
    vals = [(300.0 + 10 * h, 40.0 + h) for h in range(72)]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["datetime_utc", "DE", "FR"])
        for h, (de, fr) in enumerate(vals):
            w.writerow([f"2022-03-{1 + h // 24:02d} {h % 24:02d}:00:00", de, fr])
    return vals


def test_a_carbon_csv_of_another_year_drives_an_episode(tmp_path):
    path = tmp_path / "ci_2022.csv"
    vals = _csv_2022(path)
    env = GeoServeEnv("dev", overrides={"duration_s": 3.0, "carbon.file": str(path), "carbon.start_utc": "2022-03-02T05:00:00Z"})
    env.reset(seed=0)
    st = env.unwrapped.state()
    np.testing.assert_allclose(st.datacenters.carbon_g_per_kwh, vals[29])  # hour 24 + 5
    np.testing.assert_allclose(st.datacenters.carbon_forecast_g_per_kwh[:, 0], vals[30])
    env.close()
    with pytest.raises(ConfigError, match="carbon.start_utc"):
        GeoServeEnv("dev", overrides={"duration_s": 3.0, "carbon.file": str(path), "carbon.start_utc": "2023-06-01T00:00:00Z"})


def test_evaluation_starts_in_another_year():
    from train.envs import heldout_starts

    starts = heldout_starts(5, every=1, year=2022)
    assert len(set(starts)) == 5 and all(s.startswith("2022-") for s in starts)
    assert heldout_starts(3) == heldout_starts(3, year=2023)  # the default year is unchanged
    with pytest.raises(ConfigError, match="year"):
        heldout_starts(2, year=20222)


def test_generalisation_table_on_dev(tmp_path):
    import torch as th

    from train.checkpoint import save_set_checkpoint
    from train.generalise import GenTest, markdown, parse_test, run_tests
    from train.set_policy import SetNetwork, layout_spec

    env = GeoServeEnv("dev", overrides={"duration_s": 3.0})
    th.manual_seed(0)
    ck = save_set_checkpoint(tmp_path / "dev.npz", SetNetwork(layout_spec(env), hidden=4, classes=True))
    env.close()
    path = tmp_path / "ci_2022.csv"
    _csv_2022(path)
    tests = [parse_test("base=dev"), GenTest("other-year", "dev", {"carbon.file": str(path)}, ["2022-03-01T10:00:00Z"])]
    res = run_tests(tests, checkpoint=str(ck), days=1, duration_s=5.0)
    for name in ("base", "other-year"):
        r = res[name]
        assert r["episodes"] == 1
        rr, milp, learned = r["rr"]["carbon_g"], r["milp"]["carbon_g"], r["learned"]["carbon_g"]
        assert r["reduction_milp_pct"] == pytest.approx(100 * (1 - milp / rr))
        assert r["share_of_milp"] == pytest.approx((1 - learned / rr) / (1 - milp / rr))
        assert r["violation_diff_pp"] == pytest.approx(100 * (r["learned"]["violation_rate"] - r["milp"]["violation_rate"]))
    assert "| other-year | dev | 1 |" in markdown(res)
    with pytest.raises(ConfigError, match="--test"):
        parse_test("nameonly")
    with pytest.raises(ConfigError, match="--test"):
        parse_test("x=dev,novalue")
