"""The "Within the SLO" section (eval/slo_report.py): rows, the issue's targets met or not, the
section placed before "Capacity control" and rewritten in place between its markers."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from eval import slo_report
from eval.cli import main


def _matrix(d, scen: str, seeds, milp_carbon, milp_viol, passes, ttft_p99=1.5, measured=True) -> None:
    """A matrix of rr and milp runs; ``measured``: the milp runs record the measured operating point
    (``policy_operating_point_measured`` 1), as runs since it became the default do; else no column."""
    rows, meta = [], []
    for i, s in enumerate(seeds):
        for label, pol, c, v, ok in (("rr (always on)", "rr", 100.0, 0.0, True), ("milp", "milp", milp_carbon[i], milp_viol[i], passes[i])):
            rows.append({"scenario": scen, "policy": label, "seed": s, "carbon_g": c, "slo_violation_pct": v, "mlperf_p99_pass": ok,
                         "mlperf_ttft_p99_pass": ok, "mlperf_tpot_p99_pass": True, "ttft_p99_s": ttft_p99 if ok else 2.2,
                         "tpot_p99_s": 0.05, "unfinished_pct": 0.0, "cpu_s": 60.0, "decision_p95_s": 0.012,
                         **({"policy_operating_point_measured": 1.0 if pol == "milp" else float("nan")} if measured else {})})
            meta.append({"scenario": scen, "policy": pol, "label": label, "seed": s, "polling_period_s": 0.1,
                         "policy_kwargs": {"prefill_horizon_s": 0.5} if pol == "milp" else {}, "start_utc": "2023-01-12T17:00:00Z"})
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "runs.csv", index=False)
    (d / "config.json").write_text(json.dumps({"command": f"carbon-gym experiment capacity --scenarios {scen}", "runs": meta,
                                               "elapsed_s": 120.0, "workers": 2}))


def test_rows_pair_by_seed_and_targets_are_checked(tmp_path):
    _matrix(tmp_path / "slo" / "capacity", "llama8b-low", [1, 4], [15.0, 25.0], [0.5, 0.7], [True, True])
    runs, cfg = slo_report._read(str(tmp_path / "slo" / "capacity"))
    rows = slo_report.slo_rows(runs, cfg)
    milp = next(r for r in rows if r["policy"] == "milp")
    assert milp["reduction_pct"] == pytest.approx(80.0) and milp["violation_pct"] == pytest.approx(0.6)
    assert milp["p99_pass"] == 2 and milp["setting"] == "polling 0.1 s, prefill_horizon_s 0.5"
    lines = slo_report.target_checks(rows)
    assert lines[0].startswith("- milp deciding capacity on llama8b-low (>= 80% below always-on rr") and "**met**: 80.0% at 0.60%" in lines[0]
    assert lines[1] == "- milp deciding capacity on llama8b-moderate (>= 65% below always-on rr, MLPerf p99 in every start): not run."
    # one start failing p99, or the violation over 1%, is not met
    rows[1] = dict(milp, p99_pass=1)
    assert "**not met**" in slo_report.target_checks(rows)[0]
    rows[1] = dict(milp, violation_pct=1.2)
    assert "**not met**" in slo_report.target_checks(rows)[0]


def test_section_written_before_the_headline_and_rewritten_in_place(tmp_path):
    res = tmp_path / "results"
    _matrix(res / "selection" / "capacity-train-llama8b-low" / "capacity", "llama8b-low", [2, 3], [30.0, 30.0], [2.0, 2.0], [False, True])
    out = tmp_path / "R.md"
    out.write_text("# Results\n\n## Headline\n\nx\n\n## Capacity control\n\ny\n")
    assert main(["report", str(res), "--section", "slo", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.index("# Results") < text.index(slo_report.SECTION_TITLE) < text.index("## Headline") < text.index("## Capacity control")
    assert "| llama8b-low | milp | polling 0.1 s, prefill_horizon_s 0.5 | 2 | 70.0 ± 0.0 | 2.00 ± 0.00 | 1/2 ✗ (TTFT) | 2200 | 50 | 12.0 |" in text
    assert "**Issue 40's targets on the held-out starts:**\n\n- not run yet." in text
    _matrix(res / "slo" / "capacity", "llama8b-low", [1, 4], [15.0, 15.0], [0.5, 0.5], [True, True])
    assert main(["report", str(res), "--section", "slo", "--out", str(out)]) == 0
    again = out.read_text()
    assert again.count(slo_report.SECTION_TITLE) == 1 and again.endswith("## Capacity control\n\ny\n")
    assert "on llama8b-low (>= 80% below always-on rr, MLPerf p99 in every start, <= 1% violation): **met**: 85.0% at 0.50%" in again


def test_no_runs_is_one_line_naming_the_directories(tmp_path, capsys):
    out = tmp_path / "R.md"
    out.write_text("# Results\n")
    assert main(["report", str(tmp_path), "--section", "slo", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no SLO runs under" in err and "capacity-train-<scenario>" in err and len(err.strip().splitlines()) == 1


def test_routing_milp_is_held_to_the_slo_true_bound(tmp_path):
    """The routing-only MILP's target reads the bound check: (run - SLO-true bound) / rr in pp."""
    d = tmp_path / "slo" / "headline"
    _matrix(d, "qwen7b-low", [1, 4], [62.0, 62.0], [0.2, 0.2], [True, True])
    runs = pd.read_csv(d / "runs.csv")
    runs.loc[runs["policy"] == "rr (always on)", "policy"] = "rr"
    runs.to_csv(d / "runs.csv", index=False)
    pd.DataFrame({"scenario": "qwen7b-low", "policy": ["rr", "rr", "milp", "milp"], "seed": [1, 4, 1, 4],
                  "slo_bound_carbon_g": [59.0, 59.0, 59.0, 60.0]}).to_csv(d / "bound_check.csv", index=False)
    runs, cfg = slo_report._read(str(d))
    rows = slo_report.slo_rows(runs, cfg)
    milp = next(r for r in rows if r["policy"] == "milp")
    assert milp["reference"] == "rr" and milp["bound_gap_pp"] == pytest.approx(2.5)
    line = next(ln for ln in slo_report.target_checks(rows) if "on qwen7b-low" in ln)
    assert "**met**: 2.5 pp above it, 38.0% below rr at 0.20% violation, p99 2/2" in line
    assert "| qwen7b-low | milp | polling 0.1 s, prefill_horizon_s 0.5 | 2 | 38.0 ± 0.0 | 0.20 ± 0.00 | 2/2 ✓ | 1500 | 50 | 12.0 | 2.5 ± 6.4 |" in slo_report.slo_markdown(rows)
    assert "on llama8b-high: not run." in "\n".join(slo_report.target_checks(rows))


def test_split_sections_keeps_the_begin_marker_with_its_section():
    """RESULTS.md's other sections are rewritten by splitting at headings: the SLO section's begin
    marker (above its heading) must travel with it, not stay with the section before."""
    from eval.report import _split_sections

    text = f"# Results\n\n## How it was produced\n\nx\n\n{slo_report.SECTION_BEGIN}\n{slo_report.SECTION_TITLE}\n\ny\n{slo_report.SECTION_END}\n\n## Headline\n"
    head, sections = _split_sections(text)
    assert slo_report.SECTION_BEGIN not in sections[0] and sections[1].startswith(slo_report.SECTION_BEGIN + "\n" + slo_report.SECTION_TITLE)


def test_held_out_matrices_of_each_experiment_are_merged_into_their_subsections(tmp_path):
    """slo/headline and slo/<name>/headline are one table (rr once); slo/<name>/milp-vs-ilp gets the
    MILP-vs-ILP gaps; both get the equal-p99-pass comparison (eval/slo_compare.py)."""
    res = tmp_path / "results"
    for d, scen in ((res / "slo" / "headline", "qwen7b-low"), (res / "slo" / "more" / "headline", "qwen7b-low")):
        _matrix(d, scen, [1, 4], [62.0, 62.0], [0.2, 0.2], [True, True])
        runs = pd.read_csv(d / "runs.csv")
        runs.loc[runs["policy"] == "rr (always on)", "policy"] = "rr"
        if "more" in str(d):
            runs.loc[runs["policy"] == "milp", "policy"] = "greedy-cap"
            runs.loc[runs["policy"] == "greedy-cap", "carbon_g"] = [70.0, 66.0]
            runs["policy_capacity_cap_measured"] = np.where(runs["policy"] == "greedy-cap", 1.0, np.nan)  # (today's default)
        runs.to_csv(d / "runs.csv", index=False)
    d = res / "slo" / "mixtral" / "milp-vs-ilp"
    _matrix(d, "mixtral8x7b-moderate", [7, 13], [60.0, 60.0], [0.0, 0.0], [True, True])
    runs = pd.read_csv(d / "runs.csv")
    runs.loc[runs["policy"] == "rr (always on)", "policy"] = "rr"
    ilp = runs[runs["policy"] == "milp"].assign(policy="ilp-state", carbon_g=[64.0, 68.0])
    runs = pd.concat([runs, ilp], ignore_index=True)
    runs["reduction_vs_rr_pct"] = 100.0 - runs["carbon_g"]
    runs.to_csv(d / "runs.csv", index=False)
    text = slo_report.slo_section(str(res))
    head = text.split("### The headline at the SLO-true point", 1)[1].split("###", 1)[0]
    assert head.count("| qwen7b-low | rr |") == 1 and "| qwen7b-low | greedy-cap |" in head and "| qwen7b-low | milp |" in head
    assert "| qwen7b-low | greedy-cap | 1/1 | greedy-cap | 32.0 ± 25.4 | 0.20 | 1500 | 50 | 6.0 ± 25.4 (2) |" in head
    fac = text.split("### Facility MILP vs per-request ILPs", 1)[1].split("###", 1)[0]
    assert "| mixtral8x7b-moderate | 40.0 ± 0.0 (0.0; 2/2 ✓) | 34.0 ± 25.4 (0.0; 2/2 ✓) | 6.0 ± 25.4 |" in fac


def test_headline_milp_runs_before_the_measured_default_are_labelled_apart(tmp_path):
    """A held-out headline matrix whose milp runs predate the measured operating point (no
    ``policy_operating_point_measured``) shows them as ``milp (budget)``, beside (not replaced by,
    nor replacing) a newer matrix's ``milp`` runs of the same starts; the bound-gap target reads
    the new ones; the frontier subsection says which matrices ran the budget MILP."""
    res = tmp_path / "results"
    for name, carbon, measured in (("llama8b", [66.0, 66.0], False), ("milp-measured-llama8b", [62.0, 62.0], True)):
        d = res / "slo" / name / "headline"
        _matrix(d, "llama8b-high", [1, 24], carbon, [0.5, 0.5], [True, True], measured=measured)
        runs = pd.read_csv(d / "runs.csv")
        runs.loc[runs["policy"] == "rr (always on)", "policy"] = "rr"
        runs.to_csv(d / "runs.csv", index=False)
    text = slo_report.slo_section(str(res))
    head = text.split("### The headline at the SLO-true point", 1)[1].split("###", 1)[0]
    assert "| llama8b-high | milp (budget) | polling 0.1 s, prefill_horizon_s 0.5 | 2 | 34.0 ± 0.0 |" in head
    assert "| llama8b-high | milp | polling 0.1 s, prefill_horizon_s 0.5 | 2 | 38.0 ± 0.0 |" in head
    assert head.count("| llama8b-high | rr |") == 1
    runs, _ = slo_report._read(str(res / "slo" / "llama8b" / "headline"))
    assert set(runs["policy"]) == {"rr", "milp"}  # (only the SLO section's headline relabels)
    assert slo_report._budget_note([str(res / "slo" / "llama8b" / "headline")]).startswith("; in llama8b the MILP rows")
    assert slo_report._budget_note([str(res / "slo" / "milp-measured-llama8b" / "headline")]) == ""


def test_milp_vs_ilp_matrix_without_the_milp_borrows_the_headline_runs_only_when_rr_matches(tmp_path):
    res = tmp_path / "results"
    _matrix(res / "slo" / "headline", "mixtral8x7b-high", [2, 22], [70.0, 74.0], [0.0, 0.0], [True, True])
    h = pd.read_csv(res / "slo" / "headline" / "runs.csv")
    h.loc[h["policy"] == "rr (always on)", "policy"] = "rr"
    h["reduction_vs_rr_pct"] = 100.0 - h["carbon_g"]
    h.to_csv(res / "slo" / "headline" / "runs.csv", index=False)
    d = res / "slo" / "mixtral" / "milp-vs-ilp"
    _matrix(d, "mixtral8x7b-high", [2, 22], [80.0, 80.0], [0.0, 0.0], [True, True])
    m = pd.read_csv(d / "runs.csv")
    m.loc[m["policy"] == "rr (always on)", "policy"] = "rr"
    m.loc[m["policy"] == "milp", "policy"] = "ilp-state"
    m["reduction_vs_rr_pct"] = 100.0 - m["carbon_g"]
    m.to_csv(d / "runs.csv", index=False)
    fac = slo_report.slo_section(str(res)).split("### Facility MILP", 1)[1].split("###", 1)[0]
    assert "the default rows of `milp` on mixtral8x7b-high are the held-out headline's runs" in fac
    assert "| mixtral8x7b-high | 28.0 ± 25.4 (0.0; 2/2 ✓) | 20.0 ± 0.0 (0.0; 2/2 ✓) | 8.0 ± 25.4 |" in fac
    m.loc[(m["policy"] == "rr") & (m["seed"] == 22), "carbon_g"] = 100.5  # another start: nothing borrowed
    m.to_csv(d / "runs.csv", index=False)
    fac = slo_report.slo_section(str(res)).split("### Facility MILP", 1)[1].split("###", 1)[0]
    assert "headline's runs" not in fac and "| mixtral8x7b-high |" not in fac.split("At equal p99 pass")[0].split("|---|")[-1]


def test_capped_heuristics_before_the_measured_default_are_labelled_apart_and_the_default_borrowed(tmp_path):
    """``greedy-cap`` / ``ilp-cap`` rows not at the measured operating point (no
    ``policy_capacity_cap_measured`` 1: run at 0.9 before it was the default) show as
    ``greedy-cap[capacity_cap=0.9]``; a matrix lacking the default's rows (the Mixtral milp-vs-ilp
    matrix's ``ilp-cap``) takes the held-out headline's of the same starts, where rr agrees."""
    res = tmp_path / "results"
    h = res / "slo" / "cap-measured" / "headline"
    _matrix(h, "mixtral8x7b-high", [2, 22], [70.0, 72.0], [0.0, 0.0], [True, True])
    hr = pd.read_csv(h / "runs.csv")
    hr.loc[hr["policy"] == "rr (always on)", "policy"] = "rr"
    cap = hr[hr["policy"] == "milp"].assign(policy="ilp-cap", carbon_g=[71.0, 73.0], policy_capacity_cap_measured=1.0)
    greedy = hr[hr["policy"] == "milp"].assign(policy="greedy-cap", carbon_g=[72.0, 74.0], policy_capacity_cap_measured=1.0)
    pd.concat([hr, cap, greedy], ignore_index=True).assign(reduction_vs_rr_pct=lambda r: 100.0 - r["carbon_g"]).to_csv(
        h / "runs.csv", index=False)
    d = res / "slo" / "mixtral" / "milp-vs-ilp"
    _matrix(d, "mixtral8x7b-high", [2, 22], [76.0, 76.0], [0.0, 0.0], [True, True])
    m = pd.read_csv(d / "runs.csv")
    m.loc[m["policy"] == "rr (always on)", "policy"] = "rr"
    m.loc[m["policy"] == "milp", "policy"] = "ilp-cap"
    m.assign(reduction_vs_rr_pct=100.0 - m["carbon_g"]).to_csv(d / "runs.csv", index=False)
    text = slo_report.slo_section(str(res))
    fac = text.split("### Facility MILP", 1)[1].split("###", 1)[0]
    assert "the default rows of `milp` on mixtral8x7b-high; `ilp-cap` on mixtral8x7b-high are the held-out headline's runs" in fac
    # MILP 29.0, ilp-cap (measured, borrowed) 28.0: 1.0 pp paired; the 0.9 rows (24.0) are a setting of ilp-cap
    assert "| mixtral8x7b-high | 29.0 ± 12.7 (0.0; 2/2 ✓) | 28.0 ± 12.7 (0.0; 2/2 ✓) | 1.0 ± 0.0 |" in fac
    assert "| mixtral8x7b-high | ilp-cap | 2/2 | ilp-cap | 28.0 ± 12.7 |" in fac
    head = text.split("### The headline at the SLO-true point", 1)[1].split("###", 1)[0]
    assert "| mixtral8x7b-high | greedy-cap | 1/1 | greedy-cap | 27.0 ± 12.7 |" in head
    # the study's claims, ahead of the commands, read from the same tables
    claims = text.split("### The study's claims at the SLO-true point", 1)[1].split("```bash", 1)[0]
    assert "| Facility MILP minus best per-request ILP, Mixtral-8x7B | up to 8.6 pp, at 1.3% violation | mixtral8x7b-high: +1.0 ± 0.0 pp vs ilp-cap" in claims
    assert "MILP +2.0 ± 0.0 pp ahead of the best heuristic passing p99 (mixtral8x7b-high, vs greedy-cap), paired over 2 starts" in claims
    m = pd.read_csv(d / "runs.csv")
    m["policy_capacity_cap_measured"] = 0.0  # (fallen back to 0.9 where nothing was measured)
    m.to_csv(d / "runs.csv", index=False)
    runs, _ = slo_report._read(str(d), budget_label=True)
    assert set(runs["policy"]) == {"rr", "ilp-cap[capacity_cap=0.9]"}


def test_frontier_is_anchored_at_the_current_milp_default_borrowed_from_the_headline(tmp_path):
    """A frontier matrix run before the measured operating point shows its MILP rows as ``milp
    (budget)`` and its knob points as ``milp (budget)[...]``; ``milp`` (the anchor of the equal-p99
    comparison) is the held-out headline's current default of the same starts, borrowed only
    where the rr runs agree to the bit."""
    res = tmp_path / "results"
    h = res / "slo" / "milp-measured-qwen7b" / "headline"
    _matrix(h, "qwen7b-moderate", [7, 28], [60.0, 62.0], [0.5, 0.5], [True, True])
    d = res / "slo" / "tradeoff-qwen7b-moderate" / "tradeoff"
    _matrix(d, "qwen7b-moderate", [7, 28], [63.0, 63.0], [0.2, 0.2], [True, True], measured=False)

    def rewrite(path, extra=()):
        runs = pd.read_csv(path)
        runs.loc[runs["policy"] == "rr (always on)", "policy"] = "rr"
        runs = pd.concat([runs, *[f(runs) for f in extra]], ignore_index=True)
        runs.assign(reduction_vs_rr_pct=100.0 - runs["carbon_g"]).to_csv(path, index=False)

    rewrite(h / "runs.csv")
    rewrite(d / "runs.csv", (
        lambda r: r[r["policy"] == "milp"].assign(policy="milp[max_prefill_share=1]", carbon_g=[59.0, 59.0], mlperf_p99_pass=False),
        lambda r: r[r["policy"] == "milp"].assign(policy="greedy-cap[capacity_cap=1.2]", carbon_g=[61.0, 61.0])))
    cfg = json.loads((d / "config.json").read_text())
    cfg["runs"] = [{**r, "label": "rr"} if r["label"] == "rr (always on)" else r for r in cfg["runs"]]
    cfg["runs"] += [{**r, "label": lab} for r in cfg["runs"] if r["label"] == "milp"
                    for lab in ("milp[max_prefill_share=1]", "greedy-cap[capacity_cap=1.2]")]
    (d / "config.json").write_text(json.dumps(cfg))
    front = slo_report.slo_section(str(res)).split("### Frontiers at the SLO-true point", 1)[1].split("###", 1)[0]
    assert "the default rows of `milp` on qwen7b-moderate are the held-out headline's runs" in front
    assert "shown as `milp (budget)` and its knob points as `milp (budget)[...]`" in front
    rows = {line.split("|")[2].strip(): line for line in front.splitlines() if line.startswith("| qwen7b-moderate |")
            and "settings" not in line and line.count("|") == 10}
    assert "| 1/1 | milp | 39.0 ± 12.7 | 0.50 |" in rows["milp"] and rows["milp"].endswith("| – |")
    # the budget MILP's family (its knob point fails p99) and greedy-cap, each against the current default
    assert "| 1/2 | milp (budget) | 37.0 ± 0.0 | 0.20 |" in rows["milp (budget)"] and rows["milp (budget)"].endswith("| 2.0 ± 12.7 (2) |")
    assert "| 1/1 | greedy-cap[capacity_cap=1.2] | 39.0 ± 0.0 |" in rows["greedy-cap"] and rows["greedy-cap"].endswith("| 0.0 ± 12.7 (2) |")
    # another start in the headline: nothing is borrowed, the budget MILP's family stays apart
    hr = pd.read_csv(h / "runs.csv")
    hr.loc[(hr["policy"] == "rr") & (hr["seed"] == 28), "carbon_g"] = 100.5
    hr.to_csv(h / "runs.csv", index=False)
    front = slo_report.slo_section(str(res)).split("### Frontiers at the SLO-true point", 1)[1].split("###", 1)[0]
    assert "headline's runs" not in front and "| qwen7b-moderate | milp |" not in front


def test_a_matrix_over_another_window_is_kept_apart_and_checked_on_its_own(tmp_path):
    """A headline matrix measured over 3600 s instead of 600 s names its scenario with the window, so
    its rows are not merged with (or dropped as duplicates of) the standard ones, and its MILP at
    the operating point gets its own bound-gap line."""
    d = tmp_path / "slo" / "headline"
    _matrix(d, "mixtral8x7b-high", [1, 4], [70.0, 70.0], [0.0, 0.0], [True, True])
    runs = pd.read_csv(d / "runs.csv")
    runs["window_s"] = 3600.0
    runs.loc[runs["policy"] == "rr (always on)", "policy"] = "rr"
    runs.loc[runs["policy"] == "milp", "policy"] = "milp-opdc-c1"
    runs.to_csv(d / "runs.csv", index=False)
    cfg = json.loads((d / "config.json").read_text())
    for r in cfg["runs"]:
        r["label"] = {"milp": "milp-opdc-c1", "rr (always on)": "rr"}[r["label"]]
    (d / "config.json").write_text(json.dumps(cfg))
    pd.DataFrame({"scenario": "mixtral8x7b-high", "policy": ["rr", "rr", "milp-opdc-c1", "milp-opdc-c1"], "seed": [1, 4, 1, 4],
                  "slo_bound_carbon_g": [68.0] * 4}).to_csv(d / "bound_check.csv", index=False)
    runs, cfg = slo_report._read(str(d))
    assert set(runs["scenario"]) == {"mixtral8x7b-high (3600 s window)"}
    rows = slo_report.slo_rows(runs, cfg)
    line = next(ln for ln in slo_report.target_checks(rows) if "milp-opdc-c1" in ln)
    assert line.startswith("- the same with the MILP at its operating point (milp-opdc-c1) on mixtral8x7b-high (3600 s window): "
                           "**met**: 2.0 pp above it")
    runs.loc[:, "window_s"] = 600.0  # the standard window: names unchanged
    runs.assign(scenario="mixtral8x7b-high").to_csv(d / "runs.csv", index=False)
    assert set(slo_report._read(str(d))[0]["scenario"]) == {"mixtral8x7b-high"}


def test_a_capacity_frontier_gets_its_own_subsection_with_aliases_read_as_settings(tmp_path):
    """A trade-off matrix run with ``--set capacity.control=agent`` is kept out of the always-on
    frontiers; ``milp-u0.8=milp`` (one argument, capacity_util_cap 0.8) is a setting of ``milp
    (capacity)``, and the best setting passing p99 is compared with the default paired by start."""
    res = tmp_path / "results"
    d = res / "slo" / "capfront" / "tradeoff"
    _matrix(d, "llama8b-moderate", [23, 46], [20.0, 22.0], [0.3, 0.4], [True, True])
    runs = pd.read_csv(d / "runs.csv")
    runs.loc[runs["policy"] == "rr (always on)", "policy"] = "rr"
    runs.loc[runs["policy"] == "milp", "policy"] = "milp (capacity)"
    runs["policy_capacity_basis_datacenter"] = np.where(runs["policy"] == "rr", np.nan, 1.0)  # (the datacenter basis, the default)
    alias = runs[runs["policy"] == "milp (capacity)"].assign(policy="milp-u0.8 (capacity)", carbon_g=[17.0, 20.0])
    failing = runs[runs["policy"] == "milp (capacity)"].assign(policy="milp-u0.9 (capacity)", carbon_g=[10.0, 12.0],
                                                                mlperf_p99_pass=[True, False], mlperf_ttft_p99_pass=[True, False])
    pd.concat([runs, alias, failing], ignore_index=True).to_csv(d / "runs.csv", index=False)
    cfg = json.loads((d / "config.json").read_text())
    meta = []
    for r in cfg["runs"]:
        if r["policy"] == "milp":
            r = {**r, "label": "milp (capacity)", "overrides": {"capacity.control": "agent"}}
            meta += [{**r, "label": f"milp-u{u} (capacity)", "policy_kwargs": {"capacity_util_cap": u}} for u in (0.8, 0.9)]
        meta.append({**r, "label": "rr"} if r["policy"] == "rr" else r)
    cfg["runs"] = meta
    (d / "config.json").write_text(json.dumps(cfg))
    text = slo_report.slo_section(str(res))
    assert "### Frontiers at the SLO-true point" not in text
    cap = text.split("### Capacity control: frontiers at the SLO-true point", 1)[1].split("###", 1)[0]
    assert "| llama8b-moderate | milp (capacity)[capacity_util_cap=0.8] | polling 0.1 s, capacity_util_cap 0.8 | 2 | 81.5 ± 19.1 |" in cap
    assert "| llama8b-moderate | milp (capacity)[capacity_util_cap=0.9] |" in cap and "1/2 ✗ (TTFT)" in cap
    # of three settings two pass p99 in both starts; the best of them is u=0.8, 2.5 pp below the default's carbon
    assert "| llama8b-moderate | milp (capacity) | 2/3 | milp (capacity)[capacity_util_cap=0.8] | 81.5 ± 19.1 |" in cap


def _capacity_matrix(d, seeds, milp_carbon, current: bool | str, milp_label: str = "milp", milp_kwargs=None) -> None:
    """A capacity matrix of ``experiment capacity``: rr and the MILP, each always on and deciding
    capacity; ``current``: the MILP runs record ``policy_capacity_util_cap`` and
    ``policy_operating_point_measured``, as runs since the measured defaults do, and
    ``policy_capacity_basis_datacenter`` 1 (``current="engine"``: 0, as runs on the engine basis
    since that column was recorded)."""
    rows, meta = [], []
    for s in seeds:
        for label, pol, control, c in (("rr (always on)", "rr", "always_on", 100.0), ("rr", "rr", "agent", 100.0),
                                       ("milp (always on)", "milp", "always_on", 60.0), (milp_label, "milp", "agent", milp_carbon)):
            extra = {}
            if current and pol == "milp":
                extra = {"policy_operating_point_measured": float(control == "always_on"),
                         "policy_capacity_util_cap": 0.9 if control == "agent" else float("nan"),
                         "policy_capacity_basis_datacenter": float(current != "engine") if control == "agent" else float("nan")}
            rows.append({"scenario": "llama8b-low", "policy": label, "seed": s, "carbon_g": c, "slo_violation_pct": 0.2,
                         "mlperf_p99_pass": True, "mlperf_ttft_p99_pass": True, "mlperf_tpot_p99_pass": True, "ttft_p99_s": 1.4,
                         "tpot_p99_s": 0.08, "unfinished_pct": 0.0, "cpu_s": 60.0, "decision_p95_s": 0.01, **extra})
            meta.append({"scenario": "llama8b-low", "policy": pol, "label": "" if label == pol else label, "seed": s,
                         "polling_period_s": 0.1, "overrides": {"capacity.control": control, "polling_period_s": 0.1},
                         "policy_kwargs": dict(milp_kwargs or {}) if label == milp_label else {}, "start_utc": "2023-01-12T17:00:00Z"})
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "runs.csv", index=False)
    (d / "config.json").write_text(json.dumps({"command": "carbon-gym experiment capacity", "runs": meta, "elapsed_s": 60.0, "workers": 2}))


def test_capacity_milp_runs_before_the_measured_defaults_are_labelled_apart(tmp_path):
    """A capacity matrix run before the capacity MILP's cap and the routing MILP's operating point
    were measured (no ``policy_capacity_util_cap`` / ``policy_operating_point_measured``) shows its
    MILP rows as ``milp (engine basis)[capacity_util_cap=0.7]`` and ``milp (budget, always on)``; one
    run on the engine basis since (``policy_capacity_basis_datacenter`` 0) as ``milp (engine basis)``;
    an alias run on the datacenter basis with today's default arguments (``milp-dc``,
    ``capacity_basis`` datacenter, ``capacity_load_margin`` 0) is the default ``milp``, its setting
    shown without them; the capacity target reads the default and repeats itself for the earlier ones."""
    res = tmp_path / "results"
    _capacity_matrix(res / "slo" / "capacity", [1, 4], 6.0, current=False)
    _capacity_matrix(res / "slo" / "capacity-u09" / "capacity", [1, 4], 5.0, current="engine")
    _capacity_matrix(res / "slo" / "capacity-dc" / "capacity", [1, 4], 4.0, current=True, milp_label="milp-dc",
                     milp_kwargs={"capacity_basis": "datacenter", "capacity_load_margin": 0})
    text = slo_report.slo_section(str(res))
    cap = text.split("### Capacity control at the SLO-true point", 1)[1].split("###", 1)[0]
    for label, red in (("milp (engine basis)[capacity_util_cap=0.7]", "94.0"), ("milp (budget, always on)", "40.0"),
                       ("milp (engine basis)", "95.0"), ("milp", "96.0"), ("milp (always on)", "40.0")):
        assert f"| llama8b-low | {label} | polling 0.1 s | 2 | {red} ± 0.0 |" in cap
    assert cap.count("| llama8b-low | rr (always on) |") == 1 and "milp-dc" not in cap
    assert "- milp deciding capacity on llama8b-low (>= 80% below always-on rr, MLPerf p99 in every start, <= 1% violation): " \
           "**met**: 96.0% at 0.20% violation, p99 2/2." in text
    assert "- the same on the engine basis (the default before 89a9dcb) on llama8b-low: **met**: 95.0% at " in text
    assert "- the same on the engine basis at the capacity stage's earlier cap 0.7 on llama8b-low: **met**: 94.0% at " in text
    # at equal p99 pass against the default, paired by start: the engine basis (its better setting) 1.0 pp behind
    eq = cap.split("**At equal p99 pass**", 1)[1]
    assert "| llama8b-low | milp (engine basis) | 2/2 | milp (engine basis) | 95.0 ± 0.0 | 0.20 | 1400 | 80 | 1.0 ± 0.0 (2) |" in eq
    assert "| llama8b-low | rr |" not in eq and "milp (always on)" not in eq
    runs, _ = slo_report._read(str(res / "slo" / "capacity"))
    assert set(runs["policy"]) == {"rr", "rr (always on)", "milp", "milp (always on)"}  # (only the section relabels)


def test_estimate_table_shows_the_capacity_milp_apart_from_the_routing_milp(tmp_path):
    """The held-out estimate table keeps a capacity matrix's capacity-deciding ``milp`` as
    ``milp (capacity)`` beside a headline matrix's routing-only ``milp`` of the same scenario."""
    cap = tmp_path / "slo" / "capacity-u09" / "capacity"
    _capacity_matrix(cap, [1, 4], 4.0, current=True)
    from eval.estimate_error import ERROR_METRICS

    runs = pd.read_csv(cap / "runs.csv")
    for m in ERROR_METRICS:
        runs[m] = [float("nan") if p.startswith("rr") else (300.0 if p == "milp" else 200.0) for p in runs["policy"]]
    runs.to_csv(cap / "runs.csv", index=False)
    head = tmp_path / "slo" / "headline"
    head.mkdir(parents=True)
    pd.DataFrame([{"scenario": "llama8b-low", "policy": "milp", "seed": s, "carbon_g": 60.0, "window_s": 600.0,
                   "policy_operating_point_measured": 1.0, **{m: 100.0 for m in ERROR_METRICS}} for s in (1, 4)]).to_csv(
        head / "runs.csv", index=False)
    (head / "config.json").write_text(json.dumps({"command": "carbon-gym experiment headline", "runs": []}))
    table = slo_report._estimate_error_markdown([str(head)], [str(cap)])
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in table.splitlines() if line.startswith("| llama8b-low")}
    assert set(rows) == {("llama8b-low", "milp"), ("llama8b-low", "milp (always on)"), ("llama8b-low", "milp (capacity)")}
    assert "| 100 |" in rows[("llama8b-low", "milp")] and "| 300 |" in rows[("llama8b-low", "milp (capacity)")]


def test_runs_a_later_matrix_replaces_are_left_out_and_named(tmp_path):
    """``superseded.json`` in a matrix drops its runs of the named policies from every table (the
    later matrix's rows of the same label are the only ones left) and says so in the matrix line;
    a name not in its runs.csv, or a file without a reason, is refused."""
    res = tmp_path / "results"
    old = res / "slo" / "capacity"
    _capacity_matrix(old, [1, 4], 6.0, current=True)
    _capacity_matrix(res / "slo" / "capacity-b09" / "capacity", [1, 4], 4.0, current=True)
    # without the file the first matrix in name order wins: the old milp rows (94%)
    assert "| llama8b-low | milp | polling 0.1 s | 2 | 94.0 ± 0.0 |" in slo_report.slo_section(str(res))
    (old / "superseded.json").write_text(json.dumps({"policies": ["milp"], "reason": "run before the boot rows.",
                                                     "replaced_by": "slo/capacity-b09"}))
    text = slo_report.slo_section(str(res))
    assert "| llama8b-low | milp | polling 0.1 s | 2 | 96.0 ± 0.0 |" in text and "94.0 ± 0.0" not in text
    assert "- slo/capacity (its runs of `milp` left out: run before the boot rows; replaced by slo/capacity-b09): 6 runs," in text
    runs, cfg = slo_report._read(str(old))
    assert "milp" not in set(runs["policy"]) and "milp (always on)" in set(runs["policy"])
    assert sorted({r["label"] or r["policy"] for r in cfg["runs"]}) == ["milp (always on)", "rr", "rr (always on)"]
    (old / "superseded.json").write_text(json.dumps({"policies": ["milp-u0.5"], "reason": "x"}))
    with pytest.raises(ValueError, match=r"\['milp-u0.5'\] are not in its runs.csv"):
        slo_report._read(str(old))
    (old / "superseded.json").write_text(json.dumps({"policies": ["milp"]}))
    with pytest.raises(ValueError, match="needs 'policies'.*and 'reason'"):
        slo_report._read(str(old))


def test_superseded_files_are_tracked_by_git():
    """A matrix's ``superseded.json`` changes the tables RESULTS.md is written from, so git must
    track it like the matrix's csv files (the results/ ignore rules let it through)."""
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    probe = "results/slo/some-matrix/tradeoff/" + slo_report.SUPERSEDED_FILE
    out = subprocess.run(["git", "check-ignore", "--no-index", "-q", probe], cwd=root, capture_output=True)
    assert out.returncode == 1, f"{probe} is ignored by git: its matrix's tables would differ on a clean checkout"
    assert subprocess.run(["git", "check-ignore", "--no-index", "-q", "results/slo/some-matrix/tradeoff/steps/x.csv"],
                          cwd=root, capture_output=True).returncode == 0  # (the rules do ignore per-step records)


def test_a_start_leaving_work_undone_does_not_pass_p99():
    """A start with more than 1% of its window's work unfinished (``run_valid`` False) passes no
    MLPerf p99 check, whatever the percentiles of the requests it completed say, and the table
    says why."""
    rows = []
    for seed, valid, unfinished in ((1, True, 0.0), (4, False, 1.15)):
        for pol, c in (("rr (always on)", 100.0), ("planner+reactive", 50.0)):
            rows.append({"scenario": "qwen7b-high", "policy": pol, "seed": seed, "carbon_g": c, "slo_violation_pct": 0.1,
                         "mlperf_p99_pass": True, "mlperf_ttft_p99_pass": True, "mlperf_tpot_p99_pass": True,
                         "ttft_p99_s": 1.1, "tpot_p99_s": 0.05, "unfinished_pct": unfinished if pol != "rr (always on)" else 0.0,
                         "run_valid": valid or pol == "rr (always on)", "cpu_s": 10.0})
    out = {r["policy"]: r for r in slo_report.slo_rows(pd.DataFrame(rows), {"runs": []})}
    r = out["planner+reactive"]
    assert (r["p99_pass"], r["invalid"], r["seeds"]) == (1, 1, 2)
    assert out["rr (always on)"]["p99_pass"] == 2
    assert "| 1/2 ✗ (1 invalid: 1.1% unfinished) |" in slo_report.slo_markdown([r])
