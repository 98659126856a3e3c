"""Energy is the exact integral of piecewise-constant power; carbon is facility energy x the
grid intensity while it was drawn."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest

from carbon_gym.physics.carbon import CarbonTrace
from carbon_gym.physics.network import Network
from carbon_gym.sim import Simulator
from carbon_gym.sim.engine import ITER, RUN
from carbon_gym.topology import DatacenterSpec, Topology
from test_sim_fixtures import GPU, LAT, MODEL, POW, make_sim, random_workload


def idle_world(offset_s: float, interpolation: str = "step"):
    topo = Topology(("r",), (DatacenterSpec("a", "r", "Z", 1.3, 2, 8),))
    ct = CarbonTrace(("Z",), datetime(2023, 1, 1), np.array([[100.0], [300.0], [50.0]]), interpolation)
    return Simulator(topo, MODEL, GPU, LAT, POW, Network(np.array([[0.01]])), ct, carbon_offset_s=offset_s)


@pytest.mark.parametrize("offset_s", [0.0, 1800.0])
def test_idle_datacenter_energy_and_carbon_are_analytic(offset_s):
    sim = idle_world(offset_s)
    sim.advance_to(1000.0)
    sim.advance_to(5400.0)
    tot = sim.totals()
    it_w = 16 * POW.idle_w + 2 * POW.host_w
    assert tot.it_energy_j[0] == pytest.approx(it_w * 5400.0, rel=1e-12)
    assert tot.idle_energy_j[0] == pytest.approx(16 * POW.idle_w * 5400.0, rel=1e-12)
    assert tot.host_energy_j[0] == pytest.approx(2 * POW.host_w * 5400.0, rel=1e-12)
    assert tot.facility_energy_j[0] == pytest.approx(1.3 * it_w * 5400.0, rel=1e-12)
    # step trace: 100 g/kWh in hour 0, 300 in hour 1, 50 in hour 2
    if offset_s == 0.0:
        integral = 100.0 * 3600 + 300.0 * 1800
    else:
        integral = 100.0 * 1800 + 300.0 * 3600
    assert tot.carbon_g[0] == pytest.approx(1.3 * it_w * integral / 3.6e6, rel=1e-12)
    snap = sim.snapshot()
    assert snap.power_w[0] == pytest.approx(1.3 * it_w, rel=1e-12)
    assert snap.carbon_g_per_kwh[0] == (300.0 if offset_s == 0.0 else 50.0)
    assert snap.busy_engines[0] == 0 and snap.n_engines[0] == 16


def _model_power_w(sim) -> np.ndarray:
    """IT power of every datacenter recomputed from the power model and each engine's batch."""
    out = []
    for dc in sim.datacenters:
        p = dc.spec.nodes * POW.host_w
        for e in dc.engines:
            if e.state == ITER:
                p += POW.gpu_power_w(e.iter_prefill_tokens, e.iter_decodes)
            elif e.state == RUN:
                p += POW.gpu_power_w(0, e.n_decoding)
            else:
                p += POW.idle_w
        out.append(p)
    return np.array(out)


@pytest.mark.parametrize("step_mode", [False, True])
@pytest.mark.parametrize("interpolation", ["step", "linear"])
def test_energy_and_carbon_equal_event_by_event_integral_of_power(step_mode, interpolation):
    """Integrate the model power between consecutive events by hand (carbon with the trace's own
    integral), across an hour boundary of the carbon trace."""
    sim = make_sim(n_dc=2, gpus_per_node=2, step_mode=step_mode, carbon_offset_s=3590.0, interpolation=interpolation)
    rng = np.random.default_rng(2)
    wl = random_workload(rng, 80, 2, rate_per_s=8.0, max_prompt=2000, max_output=300)
    energy = np.zeros(2)
    carbon = np.zeros(2)
    pue = np.array([d.pue for d in sim.topology.datacenters])
    zones = [sim.carbon.zone_index(d.zone) for d in sim.topology.datacenters]
    t_prev = 0.0
    power = _model_power_w(sim)

    def integrate_to(t):
        nonlocal t_prev
        energy[:] += power * (t - t_prev)
        for d in range(2):
            carbon[d] += power[d] * pue[d] * sim.carbon.integral(zones[d], 3590.0 + t_prev, 3590.0 + t) / 3.6e6
        t_prev = t

    i = 0
    end = 60.0
    while True:
        t_next = min(sim.next_event_s(), float(wl["send_s"][i]) if i < 80 else np.inf, end)
        integrate_to(t_next)
        sim.advance_to(t_next)
        if i < 80 and t_next == wl["send_s"][i]:
            sim.submit(int(wl["origin"][i]), t_next, int(wl["prompt"][i]), int(wl["output"][i]), int(wl["dc"][i]))
            i += 1
        power = _model_power_w(sim)
        if t_next >= end:
            break
    tot = sim.totals()
    assert tot.completed > 40
    np.testing.assert_allclose(tot.it_energy_j, energy, rtol=1e-10)
    np.testing.assert_allclose(tot.facility_energy_j, energy * pue, rtol=1e-10)
    np.testing.assert_allclose(tot.carbon_g, carbon, rtol=1e-9)
    # snapshot power is the same piecewise-constant function
    np.testing.assert_allclose(sim.snapshot().power_w, power * pue, rtol=1e-12)


def test_request_energy_shares_sum_to_active_energy():
    sim = make_sim(n_dc=2, gpus_per_node=2, carbon_offset_s=7000.0)
    rng = np.random.default_rng(9)
    wl = random_workload(rng, 200, 2, rate_per_s=20.0, max_prompt=1500, max_output=400)
    from test_sim_fixtures import drive

    drive(sim, wl)
    r = sim.pop_completed()
    tot = sim.totals()
    assert tot.completed == 200
    active_fac = (tot.gpu_energy_j - tot.idle_energy_j) * np.array([d.pue for d in sim.topology.datacenters])
    for d in range(2):
        assert r.energy_j[r.datacenter == d].sum() == pytest.approx(active_fac[d], rel=1e-9)
    # attributed carbon <= total carbon, and the rest is idle + host
    assert r.carbon_g.sum() < tot.carbon_g.sum()
    # per-request carbon / energy lies within the zone's intensity range over the run
    ratio = r.carbon_g / r.energy_j * 3.6e6
    lo = sim.carbon.hourly_g_per_kwh.min()
    hi = sim.carbon.hourly_g_per_kwh.max()
    assert np.all(ratio >= lo - 1e-6) and np.all(ratio <= hi + 1e-6)
