"""Experiment generalise (issue 24 item 3): its runs, its table, the 2022 carbon year it judges on."""

from __future__ import annotations

import csv
from datetime import datetime

import numpy as np
import pandas as pd
import pytest

from carbon_gym.physics.carbon import load_carbon_trace
from eval.generalise_experiment import TESTS, carbon_2022_file, generalise_markdown, generalise_specs, generalise_table
from eval.heldout_seeds import fresh_heldout_seeds
from eval.runner import resolve_run_scenario


def test_packaged_2022_year_is_complete_and_matches_its_provenance():
    trace = load_carbon_trace(carbon_2022_file())
    assert trace.hours == 8760 and trace.start_utc == datetime(2022, 1, 1) and trace.end_utc == datetime(2023, 1, 1)
    assert len(trace.zones) == 20
    with open(carbon_2022_file().replace("electricitymaps_ci_lca_hourly_2022.csv", "provenance_2022.csv")) as f:
        prov = {r["zone"]: r for r in csv.DictReader(f)}
    assert set(prov) == set(trace.zones)
    for z in trace.zones:
        col = trace.series(z)
        assert col.mean() == pytest.approx(float(prov[z]["ci_lca_mean"]), abs=0.06), z
        assert col.min() == pytest.approx(float(prov[z]["ci_lca_min"]), abs=0.006), z
        assert int(prov[z]["rows"]) == 8760


def test_a_run_on_another_years_file_starts_in_that_year():
    """The scenario's own start (2023) lies outside the 2022 file: the sampled start replaces it
    instead of failing (a user's carbon CSV of another year must load)."""
    spec = generalise_specs([TESTS[1]], ["rr"], {"duration_s": 10.0}, other_starts=3)
    starts = []
    for s in spec:
        sc, ov = resolve_run_scenario(s)
        starts.append(ov["carbon.start_utc"])
        assert sc.carbon.file == carbon_2022_file()
    assert all(s.startswith("2022-") for s in starts) and len(set(starts)) == 3


def test_specs_pair_policies_on_fresh_heldout_starts_per_test():
    tests = [TESTS[0], TESTS[4]]
    specs = generalise_specs(tests, ["rr", "milp"], {"duration_s": 900.0}, main_starts=3, other_starts=2)
    main = [s for s in specs if s.scenario_name == "llama8b-moderate"]
    dc8 = [s for s in specs if s.scenario_name == "llama8b-moderate-8dc"]
    assert sorted({s.seed for s in main}) == fresh_heldout_seeds("llama8b-moderate", 3)
    assert sorted({s.seed for s in dc8}) == fresh_heldout_seeds("llama8b-moderate-8dc", 2)
    assert [s.policy for s in main] == ["rr"] * 3 + ["milp"] * 3 and len(dc8) == 4
    assert all(dict(s.overrides)["topology.datacenters_per_region"] == 2 and s.start_key == "llama8b-moderate-8dc" for s in dc8)
    assert all("topology.datacenters_per_region" not in dict(s.overrides) for s in main)


def _runs() -> pd.DataFrame:
    rows = []
    # two starts: MILP 30 and 40% below rr, the agent 27 and 38% (share 65 / 70), violations +1 and -0.5 pp
    for seed, (rm, rl, vm, vl) in enumerate(((30.0, 27.0, 5.0, 6.0), (40.0, 38.0, 4.0, 3.5))):
        for pol, red, viol, dec in (("rr", 0.0, 0.2, 3e-4), ("milp", rm, vm, 0.1), ("learned:x", rl, vl, 1.5e-3)):
            rows.append({"scenario": "llama8b-moderate", "policy": pol, "seed": seed, "reduction_vs_rr_pct": red,
                         "slo_violation_pct": viol, "mlperf_p99_pass": pol == "rr", "decision_p95_s": dec, "run_valid": True})
    return pd.DataFrame(rows)


def test_table_share_and_paired_violation_difference():
    t = generalise_table(_runs(), [TESTS[0]], "learned:x")
    r = t.iloc[0]
    assert r["starts"] == 2 and r["milp_reduction_pct"] == pytest.approx(35.0)
    assert r["learned_reduction_pct"] == pytest.approx(32.5)
    assert r["share_of_milp"] == pytest.approx(32.5 / 35.0)
    assert r["violation_diff_pp"] == pytest.approx(0.25)
    assert r["learned_better_starts"] == 0 and (r["rr_p99_pass"], r["milp_p99_pass"], r["learned_p99_pass"]) == (2, 0, 0)
    assert r["learned_decision_p95_ms"] == pytest.approx(1.5)
    md = generalise_markdown(t, "head", "learned:x")
    assert "| held-out days | llama8b-moderate | 2 |" in md and "93%" in md and np.isfinite(r["milp_reduction_ci95"])


def test_progress_bar_counts_steps_of_runs_with_a_faults_override():
    """A ``faults`` override is a list of tables (not hashable): the driver's progress bar still
    sizes every run (it failed before it started)."""
    from eval.backends import _Progress

    specs = generalise_specs([TESTS[5]], ["rr", "milp"], {"duration_s": 30.0}, other_starts=1)
    assert isinstance(dict(specs[0].overrides)["faults"], list)
    bar = _Progress(specs, True)
    assert bar.totals == [30, 30]
    bar.bar.close()


def test_topology_tests_add_and_swap_in_zones_training_never_saw():
    """More DCs: the 16 default zones plus US-NY-NYIS and ES; other zones: those two replace
    US-MIDA-PJM and FR; both keep the study's four regions and their client zones."""
    from carbon_gym.scenario import DEFAULT_REGIONS

    by_label = {t.label: t for t in TESTS}
    default = [z for zs in DEFAULT_REGIONS.values() for z in zs]
    for label, want in (("llama8b-moderate-18dc", default + ["US-NY-NYIS", "ES"]),
                        ("llama8b-moderate-otherzones", [{"US-MIDA-PJM": "US-NY-NYIS", "FR": "ES"}.get(z, z) for z in default])):
        spec = generalise_specs([by_label[label]], ["rr"], {"duration_s": 10.0}, other_starts=1)[0]
        sc, _ = resolve_run_scenario(spec)
        zones = [d.zone for d in sc.topology.datacenters]
        assert sorted(zones) == sorted(want) and len(zones) == len(want)
        assert [r.name for r in sc.topology.regions] == list(DEFAULT_REGIONS)
        assert [r.client_zone for r in sc.topology.regions] == [zs[0] for zs in DEFAULT_REGIONS.values()]
        assert {d.region for d in sc.topology.datacenters if d.zone in ("US-NY-NYIS", "ES")} == {"north_america", "europe"}


def test_cli_selects_tests_by_label_and_names_the_allowed_ones(capsys, tmp_path):
    from eval import cli

    assert cli.main(["experiment", "generalise", "--scenarios", "llama8b-moderate-9dc", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--scenarios: experiment generalise has no test 'llama8b-moderate-9dc'" in err and "llama8b-moderate-18dc" in err


def test_three_region_test_drops_the_southern_region_and_its_traffic():
    from carbon_gym.env import GeoServeEnv

    by_label = {t.label: t for t in TESTS}
    specs = generalise_specs([by_label["llama8b-moderate-3regions"], TESTS[0]], ["rr"], {"duration_s": 10.0}, main_starts=1,
                             other_starts=1)
    envs = [GeoServeEnv(resolve_run_scenario(s)[0]) for s in specs]
    for e in envs:
        e.reset(seed=0)
    three, full = (e.simulator.topology for e in envs)
    assert len(three.datacenters) == 12 and len(full.datacenters) == 16
    assert {d.region for d in three.datacenters} == {"north_america", "europe", "asia_pacific"}
