"""Generalisation-test infrastructure (issue 24 item 3): a carbon CSV of another year loads by path
and drives an episode (named errors for a start outside it), evaluation starts in another year. The
generalisation table itself is experiment j (tests/test_generalise_experiment.py)."""

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
