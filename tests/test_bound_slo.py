"""The SLO-true carbon bound (eval/bound_slo.py, issue 40 item 4): where each datacenter's p99
capacity binds, the bound puts exactly that capacity on the clean datacenter and the rest on
the dirty one (grams by hand, with a given operating point); where it does not bind it equals
the physical bound times the operating point's energy factor; it is never below the physical
bound; the measured operating point is the knee of the datacenter's p99 (a probe 2% above it
fails) and moves with the polling period; the tables report runs below it without calling them
errors."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from eval.bound import bound_for_spec, carbon_lower_bound
from eval.bound_slo import SloPoint
from eval.runner import RunSpec, resolve_run_scenario

# dev: two datacenters (DE dirty, FR clean), one server of 8 A100-80GB each, Llama-3.1-8B tp 1;
# a given operating point (no energy measured: factor 1) of 5.1875 req/s per engine, so each
# datacenter serves C_D = 8 x 5.1875 = 41.5 req/s within p99
C_ENG = 5.1875
C_D = 8 * C_ENG
POINT = SloPoint((C_ENG, C_ENG), (float("nan"), float("nan")), "given")
EPISODE = (("duration_s", 20.0),)
WINDOW = (("duration_s", 240.0), ("env.measure", "window"), ("env.warmup_s", 60.0), ("workload.lengths", "fixed"),
          ("workload.output_tokens", 128), ("workload.prompt_tokens", 512))


def _spec(overrides: tuple, rate: float) -> RunSpec:
    # carbon_start off: the TOML's 12:00 UTC start, every window inside one (step) hour of the trace
    return RunSpec("dev", "rr", 0, overrides=tuple(sorted(overrides + (("workload.rate_per_s", rate),))), carbon_start=False)


def _scenario(spec: RunSpec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return resolve_run_scenario(spec)[0]


def _dc_prices(sc):
    """(FR index, DE index, PUE x intensity per datacenter at the episode's start (g/kWh), parts)."""
    from carbon_gym.world import build_parts

    parts = build_parts(sc)
    tr, off = parts.carbon, parts.carbon_offset_s
    dcs = list(parts.topology.datacenters)
    names = [d.name for d in dcs]
    ci = tr.intensity_all(off)
    price = np.array([d.pue * ci[tr.zone_index(d.zone)] for d in dcs])
    return names.index("fr"), names.index("de"), price, parts


def test_slo_bound_binds_in_the_episode_program():
    """60 req/s for 20 s: the physical bound does all the work at FR; the SLO-true one exactly
    C_FR x 20 s of requests at FR and the rest at DE. The program is homogeneous in each
    datacenter's share, so its active grams are the physical ones x (phi + (1 - phi) x DE's
    grams per engine-second over FR's), phi = C_FR x 20 s / requests."""
    sc = _scenario(_spec(EPISODE, 60.0))
    b = carbon_lower_bound(sc, 0, point=POINT)
    fr, de, price, _ = _dc_prices(sc)
    assert price[fr] < price[de] and b.status == b.slo_status == "Optimal"
    assert b.slo_capacity_per_s == pytest.approx([C_D, C_D])
    assert b.requests > C_D * 20.0
    assert b.slo_placed[fr] == pytest.approx(C_D * 20.0, rel=1e-6)
    assert b.slo_placed[de] == pytest.approx(b.requests - C_D * 20.0, rel=1e-6)
    phi = C_D * 20.0 / b.requests
    want = b.active_g * (phi + (1.0 - phi) * price[de] / price[fr])
    assert b.slo_active_g == pytest.approx(want, rel=1e-6)
    assert b.slo_carbon_g == pytest.approx(b.floor_g + want, rel=1e-6) and b.carbon_g == pytest.approx(b.floor_g + b.active_g)


def test_slo_bound_binds_in_a_measurement_window_by_hand():
    """A 180 s window, 60 req/s of one fixed size (512 + 128 tokens): each request needs the same
    least engine-seconds s (the physical bound's active grams over FR's grams per engine-second);
    always on, the SLO-true grams are s x (C_FR L x FR's + (n - C_FR L) x DE's grams per
    engine-second); with capacity control each request also keeps 1 / c engine-seconds awake
    (c = 5.1875 req/s), at the GPU's idle power plus the engine's share of its server's host
    power above the least server power."""
    from eval.bound import _least_node_w

    on = _spec(WINDOW, 60.0)
    sc = _scenario(on)
    fr, de, price, parts = _dc_prices(sc)
    m = parts.datacenter_gpus()[0]
    p_lo = min(m.power.decode_min_w, m.power.prefill_w)
    b = bound_for_spec(on, point=POINT)
    L, n = 180.0, b.requests
    n_fr, n_de = C_D * L, n - C_D * L
    assert n_de > 0 and b.slo_placed[fr] == pytest.approx(n_fr) and b.slo_placed[de] == pytest.approx(n_de)
    active_w = p_lo - m.power.idle_w                              # tp = 1
    s = b.active_g * 3.6e6 / (n * active_w * price[fr]) / (1.0 - 1e-9)
    want = s * active_w * (n_fr * price[fr] + n_de * price[de]) / 3.6e6
    assert b.slo_active_g == pytest.approx(want, rel=1e-6)
    assert b.slo_carbon_g == pytest.approx(b.floor_g + want, rel=1e-6)

    cap = bound_for_spec(_spec(WINDOW + (("capacity.control", "agent"),), 60.0), point=POINT)
    host = (m.power.host_w - _least_node_w(m)) / 8.0              # 8 engines share a server
    c = 5.1875
    awake = {d: max(nd / c, nd * s) for d, nd in ((fr, n_fr), (de, n_de))}
    want_cap = sum((awake[d] * (m.power.idle_w + host) + nd * s * active_w) * price[d] for d, nd in ((fr, n_fr), (de, n_de))) / 3.6e6
    assert cap.slo_status == "Optimal" and cap.slo_active_g == pytest.approx(want_cap, rel=1e-6)
    assert cap.slo_placed[fr] == pytest.approx(n_fr)
    assert cap.slo_carbon_g > 2.0 * cap.carbon_g                  # (the awake engines dominate the capacity-control bound)


@pytest.mark.parametrize("overrides", [EPISODE, WINDOW], ids=["episode", "window"])
def test_slo_bound_equals_the_physical_one_where_it_does_not_bind(overrides):
    """8 req/s: all of it fits at FR within p99, so the SLO-true bound is the physical bound (no
    energy measured), or its active grams x the energy factor (every request one size, so the
    factor is exact: e / the physical bound's active joules per request)."""
    b = bound_for_spec(_spec(overrides, 8.0), point=POINT)
    fr = 1
    assert b.slo_status == "Optimal" and b.slo_placed[fr] == pytest.approx(b.requests, rel=1e-6)
    assert b.slo_carbon_g == pytest.approx(b.carbon_g, rel=1e-9)
    sp = _spec(overrides, 8.0)
    fr_, _, price, parts = _dc_prices(_scenario(sp))
    # the physical bound's active joules per request at FR (IT level): grams / (PUE x g/kWh) x 3.6e6 / n
    ideal_j = b.active_g * 3.6e6 / (price[fr_] * b.requests)
    heavy = bound_for_spec(sp, point=SloPoint((C_ENG, C_ENG), (2.5 * ideal_j, 2.5 * ideal_j), "given"))
    if overrides is WINDOW:  # (fixed sizes: the factor is exactly 2.5)
        assert heavy.slo_active_g == pytest.approx(2.5 * b.active_g, rel=1e-4)
    else:  # (the episode program's active grams include per-iteration terms beyond the per-request ideal)
        assert heavy.slo_active_g > 1.5 * b.active_g
    assert heavy.slo_placed[fr] == pytest.approx(b.requests, rel=1e-6)


def test_slo_bound_is_never_below_the_physical_one():
    specs = [
        _spec(EPISODE, 55.0), _spec(EPISODE, 8.0), _spec(WINDOW, 55.0), _spec(WINDOW, 8.0),
        _spec(WINDOW + (("capacity.control", "agent"),), 8.0),
        _spec(tuple(x for x in WINDOW if not x[0].startswith("workload.")), 55.0),  # azure-conv lengths
    ]
    for sp in specs:
        b = bound_for_spec(sp)
        assert b.slo_carbon_g >= b.carbon_g, sp.overrides
        assert sum(b.slo_placed) == pytest.approx(b.requests, rel=1e-6)
        assert all(p <= c * 240.0 for p, c in zip(b.slo_placed, b.slo_capacity_per_s))
    sc = _scenario(_spec(EPISODE, 60.0))
    for sleep_w in (20.0, None):  # capacity states: awake engine-seconds >= requests / c
        b = carbon_lower_bound(sc, 0, sleep_w=sleep_w)
        assert b.slo_carbon_g >= b.carbon_g
    asleep = carbon_lower_bound(sc, 0, sleep_w=20.0)
    full = carbon_lower_bound(sc, 0)
    assert asleep.slo_active_g - asleep.active_g > full.slo_active_g - full.active_g  # (the awake engines' idle power)


def test_measured_operating_point_is_the_datacenters_p99_knee():
    """The measured point (eval.bound_slo.slo_operating_point) of dev's 8-engine datacenters:
    every probe at or below c_d meets p99 and one at most 2% above it does not; energy per
    request falls with the rate; shorter polling serves more per engine at less energy per
    request; both datacenters (same GPU and size) share the measurement."""
    from carbon_gym.world import build_parts
    from eval.bound_slo import _MEASURED, _probe_key, slo_operating_point

    pts = {}
    for period in (0.1, 1.0):
        sc = _scenario(_spec(EPISODE + (("polling_period_s", period),), 8.0))
        pt = slo_operating_point(sc, build_parts(sc))
        pts[period] = pt
        assert pt.capacity_per_engine_per_s[0] == pt.capacity_per_engine_per_s[1]
        res = _MEASURED[_probe_key(sc, "a100-80gb", 8)]
        c = res.per_engine_rate_per_s
        assert c == pt.capacity_per_engine_per_s[0] and res.settings["polling_period_s"] == period
        assert all(p.ok for p in res.probes if p.rate_per_s <= c)
        assert any(not p.ok and p.rate_per_s <= c * 1.0201 for p in res.probes)
        ok = [p for p in res.probes if p.ok]
        assert all(a.active_j_per_request > b.active_j_per_request for a, b in zip(ok, ok[1:]))  # (sorted by rate)
        assert pt.active_j_per_request[0] == pytest.approx(ok[-1].active_j_per_request)
    assert pts[0.1].capacity_per_engine_per_s[0] > 1.2 * pts[1.0].capacity_per_engine_per_s[0]
    assert pts[0.1].active_j_per_request[0] < pts[1.0].active_j_per_request[0]


def test_measured_energy_is_the_integral_of_power_above_idle():
    """A probe's active_j_per_request (carbon_gym.capacity.probe_slo) is the GPU energy above
    idle over the counted span divided by its arrivals: with almost no load (one tiny request in
    the span) it is that request's share, and it grows linearly when every GPU draws more
    (a power file with the busy powers raised by a constant)."""
    from carbon_gym.capacity import probe_slo

    sc = _scenario(_spec(WINDOW, 8.0))
    lo = probe_slo(sc, 0.5, duration_s=120.0, warmup_s=30.0, seeds=(0,), n_engines=1)
    hi = probe_slo(sc, 4.0, duration_s=120.0, warmup_s=30.0, seeds=(0,), n_engines=1)
    assert lo.ok and hi.ok and 0.0 < hi.active_j_per_request < lo.active_j_per_request
    polled = probe_slo(sc, 4.0, duration_s=120.0, warmup_s=30.0, seeds=(0,), n_engines=1, polling_period_s=0.5)
    assert polled.p99_ttft_s > hi.p99_ttft_s  # (the wait for the next placement counts)


def _tables():
    """A runs table of two seeds (rr and one policy 'x') and its bounds, x's seed 1 below the
    SLO-true bound (above the physical one)."""
    rr = {0: 100.0, 1: 110.0}
    rows = []
    for seed in (0, 1):
        for pol, g in (("rr", rr[seed]), ("x", 60.0 if seed == 0 else 66.0)):
            rows.append({"scenario": "s", "policy": pol, "seed": seed, "carbon_g": g, "rr_carbon_g": rr[seed],
                         "reduction_vs_rr_pct": 100.0 * (rr[seed] - g) / rr[seed], "unfinished_pct": 0.0, "slo_violation_pct": 1.0,
                         "mlperf_p99_pass": True})
    bounds = pd.DataFrame([{"scenario": "s", "seed": s, "bound_carbon_g": 50.0, "bound_floor_g": 45.0, "bound_active_g": 5.0,
                            "bound_status": "Optimal", "slo_bound_carbon_g": 55.0 if s == 0 else 70.0, "slo_bound_active_g": 1.0,
                            "slo_bound_status": "Optimal"} for s in (0, 1)])
    return pd.DataFrame(rows), bounds


def test_tables_report_the_slo_bound_and_the_runs_below_it():
    from eval.bound import bound_check_markdown, bound_share, bound_summary, runs_below_bound, runs_below_slo_bound, with_bounds
    from eval.experiments import headline_table

    runs, bounds = _tables()
    j = with_bounds(runs, bounds)
    assert j["slo_bound_reduction_vs_rr_pct"].tolist() == pytest.approx([45.0, 45.0, 100 * 40 / 110, 100 * 40 / 110])
    assert runs_below_bound(j).empty
    below = runs_below_slo_bound(j)
    assert list(zip(below["policy"], below["seed"])) == [("x", 1)]
    summ = bound_summary(j)
    assert int(summ["below"].iloc[0]) == 0 and int(summ["below_slo"].iloc[0]) == 1 and summ["below_slo_runs"].iloc[0] == "x/1"
    table, md = bound_share(j)
    x = table[table["policy"] == "x"].iloc[0]
    assert x["share_of_slo_bound_pct"] == pytest.approx(np.mean([100 * 40 / 45, 100 * (44 / 110) / (40 / 110)]))
    assert x["below_slo_bound"] == 1 and x["below_bound"] == 0
    assert "SLO-true bound vs rr %" in md and "share of the SLO-true bound's reduction %" in md
    assert "1 run(s) below the SLO-true bound" in md and "s / x / seed 1" in md
    assert "SLO-true bound" in headline_table(pd.DataFrame([{"scenario": "s", "policy": "x", "reduction_vs_rr_pct": 40.0,
                                                             "slo_violation_pct": 1.0, "seeds": 2, "mlperf_p99_pass_share": 1.0}]), summ)
    assert "s / x / seed 1" in bound_check_markdown(j)
    # tables written before the SLO-true bound (no column): as they were
    old = bounds.drop(columns=["slo_bound_carbon_g", "slo_bound_active_g", "slo_bound_status"])
    j0 = with_bounds(runs, old)
    assert "slo_bound_reduction_vs_rr_pct" not in j0 and runs_below_slo_bound(j0).empty
    assert "SLO-true" not in bound_share(j0)[1] and "below_slo" not in bound_summary(j0)
    assert "SLO-true" not in bound_check_markdown(j0)


def test_operating_point_cli_prints_each_distinct_datacenter_and_the_ratio(monkeypatch, capsys):
    """``python -m eval.bound_slo SCENARIO``: one line per distinct (GPU, engines) with c_d, the
    load-level file's engine figure and their ratio (the step cap that admits exactly c_d)."""
    import eval.bound_slo as bs
    from carbon_gym.scenario import load_load_levels

    monkeypatch.setattr(bs, "slo_operating_point", lambda sc, parts, log=None: SloPoint((6.0, 6.0), (30.0, 30.0)))
    assert bs.main(["dev", "--set", "polling_period_s=0.5"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    eng = float(load_load_levels().find("llama-3.1-8b", "a100-80gb", 1).per_engine_rate_per_s)
    assert lines == [f"dev: a100-80gb x 8 engines, polling 0.5 s: c_d_per_engine_per_s=6 engine_figure_per_s={eng:.4g} "
                     f"ratio={6.0 / eng:.4f} e_d_j_per_request=30"]


def test_window_end_ages_restrict_what_the_allowance_leaves_undone():
    """backlog_ages {e: n}: at most n of the requests left undone arrived more than e s before the
    window's end. With every n at the backlog itself nothing changes (but the finer bins: the
    program bins request sizes within each age segment, a slightly different relaxation); with
    none older than 1 s only
    the last second's arrivals (60 of them at 60 req/s) may go undone, so the figure lies between
    the plain allowance's and the one without any (every arrival served); the physical bound keeps
    its plain allowance."""
    from eval.runner import BACKLOG_AGE_EDGES_S

    spec = _spec(tuple(x for x in WINDOW if not x[0].startswith("workload.")), 60.0)  # azure-conv lengths
    plain = bound_for_spec(spec, point=POINT, backlog_end=600)
    loose = bound_for_spec(spec, point=POINT, backlog_end=600, backlog_ages={e: 600.0 for e in BACKLOG_AGE_EDGES_S})
    tight = bound_for_spec(spec, point=POINT, backlog_end=600, backlog_ages={e: 0.0 for e in BACKLOG_AGE_EDGES_S})
    none = bound_for_spec(spec, point=POINT, backlog_end=0)
    assert loose.slo_carbon_g == pytest.approx(plain.slo_carbon_g, rel=1e-4)
    assert plain.slo_carbon_g < tight.slo_carbon_g <= none.slo_carbon_g + 1e-9
    # 60 of 600 may go: the tight figure recovers most of what the allowance gave away
    assert (none.slo_carbon_g - tight.slo_carbon_g) < 0.3 * (none.slo_carbon_g - plain.slo_carbon_g)
    assert tight.carbon_g == plain.carbon_g


def test_recorded_backlog_ages_bound_the_true_ages():
    """A windowed run's backlog_end_age_gt_<e>s (eval.runner.EpisodeRecorder.backlog_ages) counts
    every request it left undone that arrived more than e s before the end, and none that arrived
    less than e - one polling period before it (from the workload's arrivals and the run's records)."""
    from carbon_gym.world import build_workload
    from eval.runner import BACKLOG_AGE_EDGES_S, run_one

    spec = _spec(tuple(x for x in WINDOW if not x[0].startswith("workload.")) + (("polling_period_s", 0.5),), 60.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_one(spec, keep_requests=True)
    m = res.metrics
    sc = _scenario(spec)
    arr = np.asarray(build_workload(sc, 0).arrivals_between(0.0, float(sc.duration_s)).arrival_s)
    done = np.zeros(arr.size, dtype=bool)
    done[np.asarray(res.requests["request_id"], dtype=np.int64)] = True
    age = float(sc.duration_s) - arr[~done]
    assert age.size == m["backlog_end"] > 0
    for e in BACKLOG_AGE_EDGES_S:
        got = m[f"backlog_end_age_gt_{e:g}s"]
        assert np.sum(age > e) <= got <= np.sum(age > e - 0.5)
    assert m["backlog_end_age_gt_1s"] < m["backlog_end"]  # (most of what is in flight is young)
