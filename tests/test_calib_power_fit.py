"""Power fit: recovery of known parameters, energy error against a power log."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from carbon_gym.physics.power import PhasePowerModel, load_power_model
from calibration.io import PowerLog, PowerStates, load_power_intervals, load_power_log
from calibration.power_fit import fit_power_from_log, fit_power_from_samples, interval_energy_j, power_tables

DATA = Path(__file__).parent / "data"
TRUE = PhasePowerModel("true", idle_w=71.0, prefill_w=385.0, decode_min_w=165.0, decode_max_w=318.0,
                       decode_sat_seqs=27.0, prefill_sat_tokens=740.0, host_w=1000.0)
STATES = ([("idle", 0, 0)] + [("decode", 0, n) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
          + [("prefill", p, n) for p in (64, 128, 256, 512, 1024, 2048) for n in (0, 16)])


def _fields(m: PhasePowerModel) -> np.ndarray:
    return np.array([m.idle_w, m.prefill_w, m.decode_min_w, m.decode_max_w, m.decode_sat_seqs, m.prefill_sat_tokens])


def test_recovers_known_parameters_from_samples():
    ph, pt, nd = zip(*STATES)
    pw = [TRUE.gpu_power_w(a, b) for a, b in zip(pt, nd)]
    st = PowerStates("syn", tuple(ph), np.array(pt, float), np.array(nd, float), np.array(pw))
    fit = fit_power_from_samples(st, load_power_model("a100-80gb"), name="fitted")
    assert _fields(fit.model) == pytest.approx(_fields(TRUE), rel=1e-2)
    assert fit.power_mape_pct < 0.1 and abs(fit.energy_error_pct) < 0.1
    assert fit.model.host_w == 1000.0 and fit.model.name == "fitted"
    assert power_tables(fit.model)["power"]["decode_max_w"] == fit.model.decode_max_w


def test_recovers_from_log_and_intervals_with_noise():
    rng = np.random.default_rng(0)
    t, p, iv = [], [], []
    clock = 1000.0
    for ph, a, b in STATES:
        start = clock
        for k in range(40):  # 2 s at 20 Hz
            t.append(start + 0.05 * k)
            p.append(TRUE.gpu_power_w(a, b) + rng.normal(0.0, 0.5))
        clock += 2.0
        iv.append((start, clock - 0.05, ph, a, b))
    log = PowerLog("syn", np.array(t), np.zeros(len(t), dtype=np.int64), np.array(p))
    intervals = PowerStates("iv", tuple(x[2] for x in iv), np.array([x[3] for x in iv], float),
                            np.array([x[4] for x in iv], float), np.full(len(iv), np.nan),
                            np.array([x[0] for x in iv]), np.array([x[1] for x in iv]))
    fit = fit_power_from_log(log, intervals, load_power_model("a100-80gb"))
    assert _fields(fit.model)[:4] == pytest.approx(_fields(TRUE)[:4], rel=1e-2)
    assert abs(fit.energy_error_pct) < 0.5
    assert len(fit.energy_rows) == len(STATES)


def test_hand_written_nvidia_smi_log():
    prior = load_power_model("a100-80gb")
    fit = fit_power_from_log(load_power_log(DATA / "nvidia_smi_power_log.csv"),
                             load_power_intervals(DATA / "power_intervals.csv"), prior)
    assert fit.model.idle_w == pytest.approx(63.025)  # samples 0.5..1.25 s of the idle interval (edges trimmed)
    # two states only: the prior's curve shape is kept and its level scaled to the measured 196.1 W
    assert fit.model.gpu_power_w(0, 8) == pytest.approx(196.1, rel=1e-5)  # 6 significant digits stored
    assert fit.model.decode_sat_seqs == prior.decode_sat_seqs
    assert fit.model.prefill_w == pytest.approx(np.mean([401.2, 399.8, 400.6, 399.1]), rel=1e-5)
    # the edges (ramps) are in the energy but not in the steady-state model: a 2% energy error
    assert 1.0 < fit.energy_error_pct < 3.0


def test_interval_energy_trapezoid():
    log = PowerLog("x", np.array([0.0, 1.0, 2.0]), np.zeros(3, dtype=np.int64), np.array([100.0, 200.0, 100.0]))
    assert interval_energy_j(log, 0.0, 2.0) == pytest.approx(300.0)
    assert interval_energy_j(log, 0.5, 1.5) == pytest.approx(175.0)
