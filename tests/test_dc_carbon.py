"""eval.dc_carbon: per-datacenter grams of a run and those above the datacenter's floor, on a
hand-built matrix of the dev scenario (2 datacenters, 8 A100 + 1 node each, PUE 1.08, 1 s steps)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from eval.dc_carbon import dc_carbon, main


def _matrix(tmp_path):
    m = tmp_path / "m"
    (m / "steps").mkdir(parents=True)
    runs = []
    metas = []
    for pol, g0, g1 in (("rr", [1.0, 2.0, 3.0], [5.0, 5.0, 5.0]), ("greedy", [1.5, 2.5, 3.5], [0.1, 0.1, 0.1])):
        rid = f"dev__{pol}__seed0"
        metas.append({"scenario": "dev", "policy": pol, "seed": 0, "overrides": {}, "policy_kwargs": {}, "label": "",
                      "scenario_label": "", "start_key": "", "carbon_start": False, "faults": True, "run_id": rid})
        # step 1 is in the burn-in (window_start_s = 1): only steps at 2 and 3 s count
        pd.DataFrame({"time_s": [1.0, 2.0, 3.0], "carbon_g_dc0": g0, "intensity_g_per_kwh_dc0": [100.0, 300.0, 300.0],
                      "carbon_g_dc1": g1, "intensity_g_per_kwh_dc1": [50.0, 50.0, 70.0]}).to_parquet(m / "steps" / f"{rid}.parquet")
        runs.append({"scenario": "dev", "policy": pol, "seed": 0, "window_start_s": 1.0})
    pd.DataFrame(runs).to_csv(m / "runs.csv", index=False)
    (m / "config.json").write_text(json.dumps({"runs": metas}))
    return m


def test_dc_carbon_by_hand(tmp_path, capsys):
    t = dc_carbon(str(_matrix(tmp_path)), "dev", 0)
    # greenest first: dc1 (mean 60 g/kWh over the window) before dc0 (300)
    assert t["datacenter"].tolist() == [1, 0]
    np.testing.assert_allclose(t["intensity_g_per_kwh"], [60.0, 300.0])
    # floor: PUE 1.08 x (8 GPUs x 63 W idle + 1 node x 1000 W host) = 1624.32 W, x intensity x 1 s / 3.6e6
    floor_w = 1.08 * (8 * 63.0 + 1000.0)
    np.testing.assert_allclose(t["floor_g"], [floor_w * 120.0 / 3.6e6, floor_w * 600.0 / 3.6e6])
    np.testing.assert_allclose(t["rr_g"], [10.0, 5.0])
    np.testing.assert_allclose(t["greedy_g"], [0.2, 6.0])
    np.testing.assert_allclose(t["greedy_active_g"], t["greedy_g"] - t["floor_g"])
    assert main([str(tmp_path / "m"), "--scenario", "dev", "--seed", "0"]) == 0
    assert "greedy_active_g" in capsys.readouterr().out


def test_dc_carbon_names_a_missing_run(tmp_path, capsys):
    m = _matrix(tmp_path)
    assert main([str(m), "--scenario", "dev", "--seed", "7"]) == 2
    assert "scenario: " in capsys.readouterr().err
    with pytest.raises(Exception, match="no run of 'nope'"):
        dc_carbon(str(m), "nope", 0)


def test_window_allowance_bounds_with_and_without_the_backlog(tmp_path, monkeypatch):
    """--bound: the start's bound with the largest backlog any of its runs left at the window's
    end (what the matrix's bound allows), then with none."""
    import types

    import eval.bound as bound
    from eval.dc_carbon import window_allowance

    m = _matrix(tmp_path)
    runs = pd.read_csv(m / "runs.csv").assign(backlog_end=[12, 40])
    runs.to_csv(m / "runs.csv", index=False)
    seen = []

    def fake(spec, *, backlog_end=0, **_):
        seen.append(backlog_end)
        return types.SimpleNamespace(slo_carbon_g=100.0 - backlog_end, floor_g=50.0)

    monkeypatch.setattr(bound, "bound_for_spec", fake)
    w = window_allowance(str(m), "dev", 0)
    assert seen == [40, 0]
    assert w == {"backlog_end": 40.0, "slo_bound_g": 60.0, "slo_bound_no_allowance_g": 100.0, "floor_g": 50.0}
