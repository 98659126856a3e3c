"""Experiment learned-capacity (issue 24 items 1-2): its runs, the agent-vs-expert table, the
capacity columns of the step records and the merged section with its figure."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pandas as pd
import pytest

from eval.capacity_report import ALWAYS_ON_LABEL
from eval.heldout_seeds import fresh_heldout_seeds
from eval.learned_capacity_experiment import (DEFAULT_LEARNED, learned_capacity_dirs, learned_capacity_section,
                                              learned_capacity_specs, versus_table)
from eval.writers import read_table

CHECKPOINT = DEFAULT_LEARNED.split(":", 1)[1]


def test_specs_put_rr_always_on_and_every_other_policy_under_agent_control():
    specs = learned_capacity_specs("llama8b-moderate", ["rr", "milp", "learned:a/best.npz"], [3, 5], {"duration_s": 900.0})
    assert [(s.policy, s.seed) for s in specs] == [("rr", 3), ("rr", 5), ("milp", 3), ("milp", 5), ("learned:a/best.npz", 3),
                                                   ("learned:a/best.npz", 5)]
    ctl = [dict(s.overrides)["capacity.control"] for s in specs]
    assert ctl == ["always_on"] * 2 + ["agent"] * 4
    assert specs[0].label == ALWAYS_ON_LABEL and all(dict(s.overrides)["duration_s"] == 900.0 for s in specs)


def _runs() -> pd.DataFrame:
    """Two starts: always-on rr 100 and 200 g; the MILP 40 and 60% below, the agent 50 and 55%."""
    rows = []
    for seed, ref, (m, lrn), (vm, vl) in ((7, 100.0, (60.0, 50.0), (4.0, 5.0)), (9, 200.0, (80.0, 90.0), (3.0, 2.0))):
        for pol, c, v, ok in ((ALWAYS_ON_LABEL, ref, 0.2, True), ("milp", m, vm, True), ("learned:x", lrn, vl, seed == 7)):
            rows.append({"scenario": "s", "policy": pol, "seed": seed, "carbon_g": c, "slo_violation_pct": v,
                         "mlperf_p99_pass": pol == ALWAYS_ON_LABEL or (pol == "learned:x" and seed == 9), "run_valid": ok})
    return pd.DataFrame(rows)


def test_versus_table_pairs_the_agent_with_each_expert_by_start():
    vs = versus_table(_runs(), "learned:x", experts=("milp", "milp-mpc"))
    assert list(vs["expert"]) == ["milp"]  # milp-mpc did not run: no row
    r = vs.iloc[0]
    # reductions: MILP 40, 60 (mean 50); agent 50, 55 (mean 52.5); share 105%
    assert r["expert_reduction_pct"] == pytest.approx(50.0) and r["learned_reduction_pct"] == pytest.approx(52.5)
    assert r["share_of_expert"] == pytest.approx(1.05)
    assert r["violation_diff_pp"] == pytest.approx(0.0)  # +1 and -1
    assert r["learned_better_starts"] == 1 and r["mean_gain_where_better_pp"] == pytest.approx(10.0)
    assert r["best_gain_seed"] == 7 and r["best_gain_pp"] == pytest.approx(10.0)
    assert (r["expert_p99_pass"], r["learned_p99_pass"], r["invalid_starts"]) == (0, 1, 1)


@pytest.mark.skipif(not os.path.isfile(CHECKPOINT), reason="the capacity checkpoint is not in this checkout")
def test_quick_run_records_capacity_decisions_and_merges_matrices(tmp_path):
    """The quick preset end to end in two matrices (the references, then the agent), merged by the
    section: one fresh held-out start, the steps' servers and engines per datacenter matching the
    run's own capacity metrics, and the decisions figure written."""
    from eval.experiments import run_experiment

    kw = dict(preset="quick", workers=1, progress=False, requests=False, plots=True)
    run_experiment("learned-capacity", out=str(tmp_path / "learned-capacity"), policies=["rr", "milp"], **kw)
    run_experiment("learned-capacity", out=str(tmp_path / "learned-capacity-agent" / "learned-capacity"),
                   policies=[DEFAULT_LEARNED], **kw)
    dirs = learned_capacity_dirs(str(tmp_path))
    assert [os.path.relpath(d, tmp_path) for d in dirs] == ["learned-capacity", os.path.join("learned-capacity-agent", "learned-capacity")]
    first = pd.read_csv(os.path.join(dirs[0], "runs.csv"))
    assert list(first["policy"]) == [ALWAYS_ON_LABEL, "milp"]
    assert list(first["seed"]) == fresh_heldout_seeds("llama8b-moderate", 1) * 2
    agent = pd.read_csv(os.path.join(dirs[1], "runs.csv")).iloc[0]
    steps = read_table(os.path.join(dirs[1], "steps", f"llama8b-moderate__learned_llama8b_capacity_set__seed{int(agent['seed'])}"))
    srv = np.column_stack([steps[f"servers_on_dc{d}"] for d in range(16)]).sum(axis=1)
    awake = np.column_stack([steps[f"awake_engines_dc{d}"] for d in range(16)]).sum(axis=1)
    assert (awake <= 8 * srv).all() and srv.max() <= 64
    window = np.asarray(steps["time_s"]) > 10.0  # after the quick preset's 10 s burn-in
    assert srv[window].mean() == pytest.approx(agent["mean_servers_on"], rel=1e-9)
    assert awake[window].mean() == pytest.approx(agent["mean_awake_engines"], rel=1e-9)
    always_on = read_table(os.path.join(dirs[0], "steps", f"llama8b-moderate__rr_always_on___seed{int(agent['seed'])}"))
    assert "servers_on_dc0" not in always_on.columns
    md, figs = learned_capacity_section(str(tmp_path), fig_dir=str(tmp_path / "figs"))
    assert "- measurement window: 20 s" in md and "- starts: 1" in md
    assert "\n| milp" in md and "\n| milp-mpc" not in md  # the agent against the MILP (milp-mpc did not run)
    assert len(figs) == 4 and all(os.path.isfile(p) for p in figs)  # the best and the worst start, PNG and PDF
    # `carbon-gym report --section learned-capacity`: the section written in place, its figures copied, the claim set
    from eval.report import STUDY_CLAIMS, TABLE_SECTIONS, Figures, table_section, write_section

    label = next(c for k, c, _ in STUDY_CLAIMS if k == "capacity")
    out = tmp_path / "RESULTS.md"
    out.write_text(f"# R\n\n## Comparison with the study\n\n| claim | study | this run |\n|---|---|---|\n| {label} | up to 60% | not run |\n",
                   encoding="utf-8")
    write_section(str(tmp_path), "learned-capacity", out=str(out), figures_dir=str(tmp_path / "docs"))
    text = out.read_text(encoding="utf-8")
    title = f"## {TABLE_SECTIONS['learned-capacity']}\n"
    assert text.index(title) < text.index("## Comparison with the study") and md in text
    assert "![learned-capacity: capacity_decisions](docs/learned-capacity_capacity_decisions.png)" in text
    assert (tmp_path / "docs" / "learned-capacity_capacity_decisions_worst.png").is_file()
    assert f"| {label} | up to 60% | " in text and "% vs always-on rr" in text and "not run" not in text
    # without the steps files (a clean checkout tracks the tables only) the same section, without its figures
    for d in dirs:
        shutil.rmtree(os.path.join(d, "steps"))
    bare = table_section(str(tmp_path), "learned-capacity", Figures(str(tmp_path), str(tmp_path / "docs2"), str(out)))
    assert bare is not None and "![" not in bare and bare == title + "\n" + md
    shutil.rmtree(tmp_path)
