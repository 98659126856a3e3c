"""eval/boot_lag.py: the datacenters still booting servers when a run's TTFT first goes over."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from eval import boot_lag


def _steps(n: int = 100, dt: float = 1.0) -> pd.DataFrame:
    t = np.arange(n) * dt
    ttft = np.full(n, 0.9)
    ttft[42:80] = 30.0  # late from 42 s
    sv0 = np.where(t >= 40.0, 4, 1)  # dc0 powers 3 servers on at 40 s ...
    aw0 = np.where(t >= 41.0, 8, 1)  # ... wakes its sleeping engines in a second ...
    aw0 = np.where(t >= 75.0, 32, aw0)  # ... and the booted servers' engines join at 75 s
    return pd.DataFrame({"time_s": t, "ttft_p99_s": ttft, "servers_on_dc0": sv0, "awake_engines_dc0": aw0,
                         "servers_on_dc1": np.full(n, 4), "awake_engines_dc1": np.full(n, 32),
                         "servers_on_dc2": np.where(t >= 5.0, 2, 1), "awake_engines_dc2": np.where(t >= 5.0, 16, 8)})


def test_the_booting_datacenter_and_how_long_it_waited():
    lag = boot_lag.boot_lags(_steps(), ttft_target_s=2.0, lookback_s=30.0)
    assert lag is not None and lag["first_over_s"] == 42.0
    # dc2's power-on (5 s) is outside the 30 s look-back; dc1 never powered anything on
    assert lag["datacenters"] == [{"dc": 0, "powered_at_s": 40.0, "servers": (1, 4), "awake_before": 1, "awake_woken": 8, "boot_s": 35.0}]
    wide = boot_lag.boot_lags(_steps(), ttft_target_s=2.0, lookback_s=60.0)
    assert [x["dc"] for x in wide["datacenters"]] == [0, 2]
    assert boot_lag.boot_lags(_steps(), ttft_target_s=40.0) is None  # never over the target


def test_a_boot_unfinished_at_the_end_and_the_matrix_reader(tmp_path, capsys):
    s = _steps(70)  # ends at 69 s, before the boot's engines join
    (tmp_path / "steps").mkdir()
    s.to_parquet(tmp_path / "steps" / "x__planner+reactive__seed3.parquet")
    pd.DataFrame([{"scenario": "x", "policy": "planner+reactive", "seed": 3, "mlperf_p99_pass": False, "ttft_p99_s": 30.0},
                  {"scenario": "x", "policy": "rr", "seed": 3, "mlperf_p99_pass": True, "ttft_p99_s": 0.9}]).to_csv(tmp_path / "runs.csv", index=False)
    (tmp_path / "config.json").write_text(json.dumps({"runs": [
        {"scenario": "x", "policy": "planner+reactive", "label": "", "seed": 3, "run_id": "x__planner+reactive__seed3",
         "datacenters": ["no", "fr", "de"], "ttft_target_s": 2.0}]}))
    rows = boot_lag.matrix_boot_lags(str(tmp_path), lookback_s=10.0)
    assert len(rows) == 1 and rows[0]["lags"]["datacenters"][0]["boot_s"] is None
    assert boot_lag.main([str(tmp_path), "--lookback-s", "10", "--write"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "boot_lag.md").read_text() == f"# python -m eval.boot_lag {tmp_path} --lookback-s 10 --write\n" + out
    assert ("x planner+reactive seed 3 (TTFT p99 30.0 s): first step over the target at 42.0 s; no powered 1 -> 4 servers at 40.0 s "
            "with 1 engines awake, 8 after waking its sleeping ones, no more before the run's end (29 s later).") in out
