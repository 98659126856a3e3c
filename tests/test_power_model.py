"""PhasePowerModel values and the shipped power parameter files."""

from __future__ import annotations

import math

import pytest

from carbon_gym.errors import ConfigError
from carbon_gym.physics.power import PhasePowerModel, load_power_model


def test_phase_power_analytic():
    m = PhasePowerModel("t", idle_w=60.0, prefill_w=400.0, decode_min_w=200.0, decode_max_w=300.0,
                        decode_sat_seqs=10.0, prefill_sat_tokens=1000.0, host_w=900.0)
    assert m.gpu_power_w(0, 0) == 60.0
    assert m.gpu_power_w(0, 1) == pytest.approx(200.0)
    assert m.gpu_power_w(0, 11) == pytest.approx(300.0 - 100.0 * math.exp(-1.0))
    base = 300.0 - 100.0 * math.exp(-0.9)
    assert m.gpu_power_w(250, 10) == pytest.approx(base + (400.0 - base) * 0.25)
    assert m.gpu_power_w(5000, 0) == pytest.approx(400.0)


@pytest.mark.parametrize("gpu,idle,prefill,decode", [("a100-80gb", 63.0, 400.0, 250.0), ("h100-80gb", 75.0, 700.0, 380.0)])
def test_shipped_power_matches_reference(gpu, idle, prefill, decode):
    m = load_power_model(gpu)
    assert m.idle_w == idle and m.prefill_w == prefill  # Splitwise characterisation (REFERENCE.md)
    # decode power is ~the Splitwise figure at a moderate batch (~43 sequences) and grows with batch
    assert m.gpu_power_w(0, 43) == pytest.approx(decode, rel=0.01)
    assert m.gpu_power_w(0, 8) < m.gpu_power_w(0, 64) < m.gpu_power_w(0, 256) <= m.decode_max_w
    assert m.host_w > 0


def test_unknown_gpu():
    with pytest.raises(ConfigError, match="no power parameters"):
        load_power_model("tpu-v5")
