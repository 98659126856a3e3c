"""The study's experiments (a-f) and RESULTS.md, run end to end on the dev scenario with tiny
settings (the real runs use the paper scenarios; see RESULTS.md)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from eval import cli, experiments, milp_vs_ilp, report, stats

COMMON = ["--scenarios", "dev", "--duration-s", "8", "--seeds", "2", "--workers", "2", "--no-progress", "--no-tensorboard"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    runs = [
        ["experiment", "headline", "--policies", "rr,greedy,ilp,milp"],
        ["experiment", "milp-vs-ilp"],
        ["experiment", "predictor", "--policies", "milp"],
        ["experiment", "polling", "--policies", "milp", "--periods", "0.25,1,4"],
        ["experiment", "tradeoff", "--policies", "milp,greedy-cap,least-loaded"],
        ["experiment", "bound", "--policies", "greedy,milp"],
    ]
    for argv in runs:
        assert cli.main(argv + COMMON + ["--out", str(out)]) == 0, argv
    return out


def test_headline_outputs(results):
    d = results / "headline"
    for f in ("headline.md", "summary.csv", "summary.md", "runs.csv", "config.json", "figures/headline_reduction.png", "figures/dev_latency_cdf.png", "figures/dev_load_by_hour.png"):
        assert (d / f).is_file(), f
    md = (d / "headline.md").read_text()
    assert "| scenario | rr | greedy | ilp | milp |" in md
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["experiment"] == "headline" and cfg["preset"] == "quick"
    assert {r["duration_s"] for r in cfg["runs"]} == {8.0}


def test_milp_vs_ilp_gap_is_paired_difference(results):
    runs = pd.read_csv(results / "milp-vs-ilp" / "runs.csv")
    table = pd.read_csv(results / "milp-vs-ilp" / "milp-vs-ilp.csv")
    r = runs.set_index(["policy", "seed"])["reduction_vs_rr_pct"]
    for ilp in ("ilp", "ilp-state"):
        diff = [r[("milp", s)] - r[(ilp, s)] for s in (0, 1)]
        m, ci = stats.mean_ci95(diff)
        assert table[f"gap_vs_{ilp}_pp"].iloc[0] == pytest.approx(m, abs=1e-9)
        assert table[f"gap_vs_{ilp}_pp_ci95"].iloc[0] == pytest.approx(ci, abs=1e-9)


def test_predictor_variants(results):
    cfg = json.loads((results / "predictor" / "config.json").read_text())
    by_label = {}
    for r in cfg["runs"]:
        by_label.setdefault(r["scenario_label"], set()).add(r["overrides"].get("env.predictor", "scenario default"))
    assert by_label == {"dev[predicted]": {"scenario default"}, "dev[oracle]": {"oracle"}}
    # variants share their episode starts
    starts = {(r["scenario_label"], r["seed"]): r["start_utc"] for r in cfg["runs"]}
    assert starts[("dev[predicted]", 1)] == starts[("dev[oracle]", 1)]
    t = pd.read_csv(results / "predictor" / "predictor.csv")
    assert list(t["policy"]) == ["milp"]
    assert t["reduction_diff_pp"].iloc[0] == pytest.approx(t["reduction_predicted"].iloc[0] - t["reduction_oracle"].iloc[0], abs=1e-9)


def test_polling_sweep(results):
    t = pd.read_csv(results / "polling" / "polling.csv")
    assert sorted(set(t["polling_s"])) == [0.25, 1.0, 4.0]  # --periods (the preset's 0.1-8 s otherwise)
    assert set(t["policy"]) == {"rr", "milp"}
    cfg = json.loads((results / "polling" / "config.json").read_text())
    assert {r["polling_period_s"] for r in cfg["runs"]} == {0.25, 1.0, 4.0}
    assert cfg["preset_values"]["polling_s"] == [0.25, 1.0, 4.0]
    assert (results / "polling" / "figures" / "polling_dev.png").is_file()


def test_tradeoff_frontiers_and_equal_violation(results):
    from eval import frontiers

    t = pd.read_csv(results / "tradeoff" / "tradeoff.csv")
    assert set(t["policy"]) == {"milp", "greedy-cap"}
    for pol in ("milp", "greedy-cap"):
        knob = frontiers.KNOBS[pol]
        sub = t[t["policy"] == pol]
        assert sorted(sub["value"]) == sorted(knob.values) and sub["default"].sum() == 1
        assert float(sub[sub["default"]]["value"].iloc[0]) == knob.default
        assert sub["pareto"].any()
    cfg = json.loads((results / "tradeoff" / "config.json").read_text())
    kw = {r["label"]: r["policy_kwargs"] for r in cfg["runs"] if r["policy"] == "milp"}
    assert kw["milp[max_prefill_share=0.4]"] == {"max_prefill_share": 0.4} and kw[""] == {}  # the default: milp's own row
    # the equal-violation table is the per-seed frontier read at rr's violation, averaged
    runs = pd.read_csv(results / "tradeoff" / "runs.csv")
    eq = pd.read_csv(results / "tradeoff" / "equal_violation.csv").set_index("policy")
    vals = []
    for seed in (0, 1):
        pts = runs[(runs.seed == seed) & runs.policy.str.startswith("milp")]
        rr_v = float(runs[(runs.seed == seed) & (runs.policy == "rr")]["slo_violation_pct"].iloc[0])
        vals.append(frontiers.envelope_at(pts["slo_violation_pct"], pts["reduction_vs_rr_pct"], rr_v))
    vals = [v for v in vals if v == v]
    assert eq.loc["milp", "at_rr_seeds"] == len(vals)
    if vals:
        assert eq.loc["milp", "at_rr_reduction_pct"] == pytest.approx(sum(vals) / len(vals))
    # ... and at the fixed levels (1% and 3%): the same envelope read at that violation
    for lv in frontiers.LEVELS_PCT:
        k = frontiers.level_key(lv)
        vals = []
        for seed in (0, 1):
            pts = runs[(runs.seed == seed) & runs.policy.str.startswith("milp")]
            vals.append(frontiers.envelope_at(pts["slo_violation_pct"], pts["reduction_vs_rr_pct"], lv))
        vals = [v for v in vals if v == v]
        assert eq.loc["milp", f"{k}_seeds"] == len(vals) and eq.loc["milp", f"{k}_violation_pct"] == lv
        if vals:
            assert eq.loc["milp", f"{k}_reduction_pct"] == pytest.approx(sum(vals) / len(vals))
    md = (results / "tradeoff" / "tradeoff.md").read_text()
    assert "At equal violation" in md and "least-loaded" in md and "◆" in md and "at 3% violation: vs rr % (seeds)" in md
    assert (results / "tradeoff" / "figures" / "tradeoff_dev.png").is_file()


@pytest.mark.parametrize("exp, files", [("tradeoff", ("tradeoff.md", "tradeoff.csv", "equal_violation.csv")),
                                        ("milp-vs-ilp", ("milp-vs-ilp.md", "milp-vs-ilp.csv")),
                                        ("headline", ("headline.md", "bounds.csv", "bound_summary.csv"))])
def test_tables_from_the_files_are_the_tables_as_run(results, tmp_path, exp, files, capsys):
    """``python -m eval.retable DIR`` rewrites experiments e's and b's tables, and the headline's
    bounds and table, from runs.csv / summary.csv (and config.json): byte for byte what the run
    wrote (the knobs' values read from the runs, not the registry); another experiment or a
    missing file is refused, naming dir."""
    import shutil

    from eval import retable

    d = tmp_path / exp
    shutil.copytree(results / exp, d)
    for f in files:
        (d / f).unlink()
    assert retable.main([str(d)]) == 0
    for f in files:
        assert (d / f).read_text() == (results / exp / f).read_text(), f
    assert retable.main([str(tmp_path / "nowhere")]) == 2
    assert retable.main([str(results / "polling")]) == 2
    err = capsys.readouterr().err
    assert "dir: " in err and "not found" in err and "allowed: tradeoff, milp-vs-ilp, headline" in err


def test_an_invalid_ilp_gets_no_reduction_and_no_gap():
    """A policy leaving work unfinished in some start (run_valid false) shows 'invalid' in
    experiment b's table: no reduction, no gap to the MILP (its unspent energy would flatter it)."""
    runs = pd.DataFrame({"scenario": ["s"] * 6, "policy": ["milp", "milp", "ilp", "ilp", "ilp-state", "ilp-state"],
                         "seed": [0, 1] * 3, "reduction_vs_rr_pct": [30.0, 32.0, 45.0, 44.0, 20.0, 24.0],
                         "slo_violation_pct": [1.0, 1.2, 99.0, 98.0, 2.0, 2.2], "run_valid": [True, True, True, False, True, True]})
    t = milp_vs_ilp.milp_vs_ilp_table(runs)
    r = t.iloc[0]
    assert bool(r["ilp_invalid"]) and not bool(r["ilp-state_invalid"]) and not bool(r["milp_invalid"])
    assert r["ilp_reduction_pct"] != r["ilp_reduction_pct"] and r["gap_vs_ilp_pp"] != r["gap_vs_ilp_pp"]  # NaN
    assert r["gap_vs_ilp-state_pp"] == pytest.approx(9.0) and r["milp_reduction_pct"] == pytest.approx(31.0)
    md = milp_vs_ilp.milp_vs_ilp_markdown(t)
    assert "| invalid (98.5;" in md and "9.0" in md and md.splitlines()[0].endswith("| MILP - ilp (pp) | MILP - ilp-state (pp) |")


def test_bound_shares(results):
    t = pd.read_csv(results / "bound" / "bound.csv")
    assert "clairvoyant" in set(t["policy"])  # (a heuristic with perfect information, now one more policy)
    for _, r in t.iterrows():
        assert r["below_bound"] == 0
        assert 0 < r["bound_reduction_vs_rr_pct"] < 100
    rr = t[t["policy"] == "rr"].iloc[0]
    assert rr["reduction_vs_rr_pct"] == 0 and rr["share_of_bound_pct"] == 0
    md = (results / "bound" / "bound.md").read_text()
    assert "no run can emit less" in md and "runs below it" in md


@pytest.mark.parametrize("exp", ["headline", "bound"])
def test_every_run_in_a_results_table_is_above_its_bound(results, exp):
    """Each policy's carbon in the experiment's runs table >= the lower bound of its scenario and
    seed (the floor, for a run that left work unfinished)."""
    from eval.bound import runs_below_bound, with_bounds

    runs = pd.read_csv(results / exp / "runs.csv")
    bounds = pd.read_csv(results / exp / "bounds.csv")
    assert set(zip(bounds["scenario"], bounds["seed"])) == set(zip(runs["scenario"], runs["seed"]))
    joined = with_bounds(runs, bounds)
    assert joined["bound_carbon_g"].notna().all()
    assert runs_below_bound(joined).empty
    assert (joined["carbon_g"] > joined["bound_floor_g"]).all()
    if exp == "headline":
        assert "lower bound" in (results / "headline" / "headline.md").read_text()


def test_results_md_from_the_runs(results, tmp_path):
    out = tmp_path / "RESULTS.md"
    figs = tmp_path / "figs"
    assert cli.main(["report", str(results), "--out", str(out), "--figures", str(figs)]) == 0
    text = out.read_text()
    assert "## Comparison with the study" in text and "up to 60%" in text
    assert "carbon-gym experiment headline" in text
    for section in ("Facility MILP vs per-request ILPs", "Predictor vs oracle", "Polling period", "Carbon vs SLO trade-off", "Share of the carbon lower bound"):
        assert f"## {section}" in text
    # experiment f ran greedy and milp, not the headline's ilp: the headline-derived share is kept and points to it
    assert "## Share of the carbon lower bound (from the headline runs)" in text and '`carbon-gym experiment bound`: "Share of the carbon lower bound" below' in text
    assert (figs / "headline_reduction.png").is_file()
    # the per-(scenario, seed) check of the lower bound, as tests/test_results_md.py reads it
    from test_results_md import check_rows

    from eval.bound import parse_bound_check

    rows = parse_bound_check(text)
    assert {(r["scenario"], r["seed"]) for r in rows} == {("dev", 0), ("dev", 1)}
    check_rows(rows)
    # hand-written notes survive regeneration
    text = text.replace("(to be written: where and why these numbers differ from the study's)", "OUR NOTES")
    out.write_text(text)
    assert cli.main(["report", str(results), "--out", str(out), "--figures", str(figs), "--force"]) == 0
    assert "OUR NOTES" in out.read_text()
    # a hand edit that drops the end marker loses nothing: the notes run to the end of the file
    text = out.read_text().replace(report.NOTES_END, "").rstrip("\n") + "\n\n## Added section\n\nMORE NOTES\n"
    out.write_text(text)
    assert cli.main(["report", str(results), "--out", str(out), "--figures", str(figs), "--force"]) == 0
    again = out.read_text()
    assert "OUR NOTES" in again and "MORE NOTES" in again and again.rstrip("\n").endswith(report.NOTES_END)


def test_every_table_has_both_slo_measures(results):
    # per-request violation rate and the MLPerf p99 verdict side by side, with the fail mark explained
    for exp in ("headline", "milp-vs-ilp", "predictor", "polling", "tradeoff", "bound"):
        md = (results / exp / f"{exp}.md").read_text()
        assert "viol" in md and "p99" in md, exp
        assert "✓" in md or "✗" in md, exp
    for exp in ("milp-vs-ilp", "predictor", "polling", "tradeoff", "bound"):
        assert "MLPerf's criterion; ✗ = fails in some seed" in (results / exp / f"{exp}.md").read_text(), exp
    s = pd.read_csv(results / "headline" / "summary.csv")
    assert {"slo_violation_pct", "mlperf_p99_pass_share", "mlperf_ttft_p99_pass_share", "mlperf_tpot_p99_pass_share"} <= set(s.columns)


def test_replot_from_files(results):
    import os

    fig = results / "headline" / "figures" / "headline_reduction.png"
    before = fig.stat().st_mtime_ns
    ex = experiments.load_executed(str(results / "headline"))
    assert [r.spec.run_id for r in ex.results] == [f"dev__{p}__seed{s}" for p in ("rr", "greedy", "ilp", "milp") for s in (0, 1)]
    assert ex.results[0].steps["cumulative_carbon_g"][-1] == pytest.approx(ex.runs["carbon_g"].iloc[0])
    experiments.replot_headline(str(results / "headline"))
    assert fig.stat().st_mtime_ns >= before and os.path.getsize(fig) > 1000


def test_share_of_the_bound_from_the_headline_runs(results, tmp_path):
    """Without experiment f, RESULTS.md derives the share of the bound from the headline's own runs
    and bounds: the same shares as ``bound_share`` of those runs, one row per headline policy."""
    import shutil

    from eval.bound import bound_share, with_bounds

    only = tmp_path / "only_headline"
    shutil.copytree(results / "headline", only / "headline")
    out = tmp_path / "R.md"
    assert cli.main(["report", str(only), "--out", str(out), "--figures", str(tmp_path / "f")]) == 0
    text = out.read_text()
    assert "## Share of the carbon lower bound (from the headline runs)" in text
    runs = pd.read_csv(only / "headline" / "runs.csv")
    table, md = bound_share(with_bounds(runs, pd.read_csv(only / "headline" / "bounds.csv")))
    assert md in text and set(table["policy"]) == {"rr", "greedy", "ilp", "milp"}
    assert (table["below_bound"] == 0).all() and (table.loc[table["policy"] == "rr", "share_of_bound_pct"] == 0).all()
