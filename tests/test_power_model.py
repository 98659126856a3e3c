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


@pytest.mark.parametrize("gpu,batch,watts", [("a100-40gb", 12, 201.0), ("a100-40gb", 149, 208.1),
                                              ("h100-80gb", 8, 486.4), ("h100-80gb", 255, 690.5)])
def test_shipped_power_matches_published_serving_points(gpu, batch, watts):
    """ML.ENERGY v1 (A100-40GB, vLLM 0.4.2) and v3 (H100, vLLM 0.11.1) average GPU power serving an 8B model."""
    m = load_power_model(gpu)
    assert m.gpu_power_w(0, batch) == pytest.approx(watts, rel=0.05)
    assert m.gpu_power_w(0, 8) < m.gpu_power_w(0, 64) < m.gpu_power_w(0, 256) <= m.decode_max_w
    assert m.idle_w < m.decode_min_w and m.prefill_w <= 1.0001 * m.decode_max_w  # prefill_w chosen = decode_max_w
    assert m.host_w > 0


@pytest.mark.parametrize("gpu,src", [("a100-80gb", "a100-40gb"), ("h200", "h100-80gb")])
def test_transferred_power_sets(gpu, src):
    a, b = load_power_model(gpu), load_power_model(src)
    assert (a.decode_min_w, a.decode_max_w, a.decode_sat_seqs) == (b.decode_min_w, b.decode_max_w, b.decode_sat_seqs)
    assert "transferred" in a.source


def test_unknown_gpu():
    with pytest.raises(ConfigError, match="no power parameters"):
        load_power_model("tpu-v5")
