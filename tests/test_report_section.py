"""``carbon-gym report --section <exp>``: one experiment's section of RESULTS.md rewritten in place
(eval.report.write_section), with its cost-table row, the totals and its study claim; the rest of
the file byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from carbon_gym.errors import ConfigError
from eval.capacity_report import SECTION_BEGIN
from eval.cli import SECTIONS, main
from eval.report import TABLE_SECTIONS, _split_sections, write_section

ROOT = Path(__file__).resolve().parent.parent

BASE = f"""# Results

## How it was produced

Every matrix in this file, its command and cost:

| results | runs | workers | wall (min) | CPU of the runs (min) | command |
|---|---|---|---|---|---|
| headline | 48 | 2 | 35.6 | 43.0 | `carbon-gym experiment headline` |
| tradeoff | 40 | 2 | 19.5 | 37.0 | `carbon-gym experiment tradeoff` |

Whole run: 88 runs, 55.1 min of wall time summed over the commands (some ran at the same time), 80.0 CPU-minutes (40.0 min on 2 dedicated cores).

## Headline: carbon reduction vs round-robin (SLO violation %)

headline table

## Predictor vs oracle

predictor table

## Carbon vs SLO trade-off

tradeoff table

{SECTION_BEGIN}
## Capacity control

capacity table
<!-- capacity:end -->

## Comparison with the study

| claim | study | this run |
|---|---|---|
| SLO violation vs polling period | rises noticeably past 2 s | not run |

## Discussion

notes
"""


def _matrix(root: Path, exp: str, *, cpu_s: list[float], elapsed_s: float, table: str, extra: dict[str, str] | None = None) -> Path:
    d = root / exp
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"command": f"carbon-gym experiment {exp} --preset full", "elapsed_s": elapsed_s,
                                               "workers": 2, "runs": [{} for _ in cpu_s]}), encoding="utf-8")
    (d / "runs.csv").write_text("cpu_s\n" + "".join(f"{c}\n" for c in cpu_s), encoding="utf-8")
    (d / f"{exp}.md").write_text(table, encoding="utf-8")
    for name, text in (extra or {}).items():
        (d / name).write_text(text, encoding="utf-8")
    return d


POLL_CSV = "policy,polling_s,slo_violation_pct\nmilp,0.1,1.25\nmilp,2,6.5\nrr,0.1,0.5\n"


def test_sections_choices_match_the_report():
    assert SECTIONS == ("headline", "capacity", "slo") + tuple(TABLE_SECTIONS)


def test_the_committed_results_md_splits_and_joins_byte_for_byte():
    text = (ROOT / "RESULTS.md").read_text(encoding="utf-8")
    head, sections = _split_sections(text)
    assert head + "".join("\n" + s for s in sections) == text
    # (the section headed "## Capacity control", not "### Capacity control at the SLO-true point" inside "Within the SLO")
    cap = [s for s in sections if any(line.startswith("## Capacity control") for line in s.splitlines())]
    assert len(cap) == 1
    assert all(s.startswith(SECTION_BEGIN) for s in cap)  # the marker travels with its heading


def test_a_new_section_goes_where_the_full_report_puts_it(tmp_path):
    out = tmp_path / "RESULTS.md"
    out.write_text(BASE, encoding="utf-8")
    _matrix(tmp_path / "res", "polling", cpu_s=[60.0, 120.0, 180.0], elapsed_s=240.0, table="| polling table |\n",
            extra={"polling.csv": POLL_CSV})
    write_section(str(tmp_path / "res"), "polling", out=str(out), figures_dir=str(tmp_path / "figs"))
    text = out.read_text(encoding="utf-8")
    # between the predictor and the trade-off (TABLE_SECTIONS order), with its command
    assert "predictor table\n\n## Polling period\n\n`carbon-gym experiment polling --preset full`\n\n| polling table |\n\n## Carbon vs SLO trade-off" in text
    # its cost row in order, the totals summed over the rows: 88 + 3 runs, 55.1 + 4.0 min wall, 80.0 + 6.0 CPU-min
    assert ("| headline | 48 | 2 | 35.6 | 43.0 | `carbon-gym experiment headline` |\n"
            "| polling | 3 | 2 | 4.0 | 6.0 | `carbon-gym experiment polling --preset full` |\n"
            "| tradeoff | 40 | 2 | 19.5 | 37.0 |") in text
    assert "Whole run: 91 runs, 59.1 min of wall time summed over the commands (some ran at the same time), 86.0 CPU-minutes (43.0 min on 2 dedicated cores)." in text
    assert "| SLO violation vs polling period | rises noticeably past 2 s | MILP violation %: 0.1 s: 1.25, 2 s: 6.50; rr: 0.1 s: 0.50 |" in text
    # nothing else moved
    rest = text.replace("## Polling period\n\n`carbon-gym experiment polling --preset full`\n\n| polling table |\n\n", "")
    rest = rest.replace("| polling | 3 | 2 | 4.0 | 6.0 | `carbon-gym experiment polling --preset full` |\n", "")
    rest = rest.replace("Whole run: 91 runs, 59.1 min", "Whole run: 88 runs, 55.1 min").replace("86.0 CPU-minutes (43.0 min", "80.0 CPU-minutes (40.0 min")
    rest = rest.replace("MILP violation %: 0.1 s: 1.25, 2 s: 6.50; rr: 0.1 s: 0.50", "not run")
    assert rest == BASE


def test_a_rerun_replaces_its_section_and_row_and_is_idempotent(tmp_path):
    out = tmp_path / "RESULTS.md"
    out.write_text(BASE, encoding="utf-8")
    _matrix(tmp_path / "res", "tradeoff", cpu_s=[600.0], elapsed_s=300.0, table="new tradeoff table\n")
    for _ in range(2):
        write_section(str(tmp_path / "res"), "tradeoff", out=str(out), figures_dir=str(tmp_path / "figs"))
        text = out.read_text(encoding="utf-8")
        assert "tradeoff table\n\n" + SECTION_BEGIN not in text.replace("new tradeoff table", "")
        assert "## Carbon vs SLO trade-off\n\n`carbon-gym experiment tradeoff --preset full`\n\nnew tradeoff table\n\n" + SECTION_BEGIN + "\n## Capacity control" in text
        assert "| tradeoff | 1 | 2 | 5.0 | 10.0 | `carbon-gym experiment tradeoff --preset full` |" in text
        assert "| tradeoff | 40 |" not in text
        assert "Whole run: 49 runs, 40.6 min" in text and "53.0 CPU-minutes (26.5 min on 2 dedicated cores)" in text
        assert text.count("## Carbon vs SLO trade-off") == 1


def test_a_section_before_the_capacity_marker_keeps_the_marker_above_its_heading(tmp_path):
    out = tmp_path / "RESULTS.md"
    out.write_text(BASE, encoding="utf-8")
    _matrix(tmp_path / "res", "sessions", cpu_s=[30.0], elapsed_s=30.0, table="sessions table\n")
    write_section(str(tmp_path / "res"), "sessions", out=str(out), figures_dir=str(tmp_path / "figs"))
    text = out.read_text(encoding="utf-8")
    assert "tradeoff table\n\n## Multi-turn sessions and prefix caching\n" in text
    assert "sessions table\n\n" + SECTION_BEGIN + "\n## Capacity control\n" in text


def test_bad_requests_name_the_field(tmp_path, capsys):
    with pytest.raises(ConfigError, match="section.*allowed: milp-vs-ilp"):
        write_section(str(tmp_path), "headline", out=str(tmp_path / "R.md"))
    with pytest.raises(ConfigError, match="out.*not found"):
        write_section(str(tmp_path), "polling", out=str(tmp_path / "R.md"))
    (tmp_path / "R.md").write_text(BASE, encoding="utf-8")
    with pytest.raises(ConfigError, match="polling.md.*not found.*experiment polling"):
        write_section(str(tmp_path), "polling", out=str(tmp_path / "R.md"))
    assert main(["report", str(tmp_path), "--section", "polling", "--out", str(tmp_path / "R.md")]) == 2
    assert "polling.md" in capsys.readouterr().err
    assert (tmp_path / "R.md").read_text(encoding="utf-8") == BASE


@pytest.mark.slow
def test_headline_section_rewrites_only_the_headline(tmp_path):
    """--section headline: a rerun headline replaces the preamble, how it was produced (its cost row; the rows of
    matrices not at hand kept and summed again), the headline and the headline's claims; other sections byte for byte."""
    res = tmp_path / "res"
    argv = ["experiment", "headline", "--scenarios", "dev", "--policies", "rr,greedy-cap", "--window-s", "12", "--warmup-s", "6",
            "--seed-list", "3", "--workers", "1", "--no-progress", "--no-tensorboard", "--no-plots", "--out", str(res)]
    assert main(argv) == 0
    md = tmp_path / "R.md"
    md.write_text(BASE)
    assert main(["report", str(res), "--section", "headline", "--out", str(md), "--figures", str(tmp_path / "figs")]) == 0
    text = md.read_text()
    _, secs = _split_sections(text)
    _, base_secs = _split_sections(BASE)
    kept = [s for s in base_secs if not s.startswith(("## How it was produced", "## Headline:", "## Comparison"))]
    assert [s for s in secs if s in kept] == kept  # the other sections, byte for byte and in order
    assert "headline table" not in text and "\n| dev | " in text and "- starts: 1 (seeds 3;" in text
    cfg = json.loads((res / "headline" / "config.json").read_text())
    rows = [ln for ln in text.splitlines() if ln.startswith("| headline |") or ln.startswith("| tradeoff |")]
    assert len(rows) == 2 and rows[0].startswith("| headline | 2 | 1 |") and cfg["command"] in rows[0]
    assert rows[1] == "| tradeoff | 40 | 2 | 19.5 | 37.0 | `carbon-gym experiment tradeoff` |"
    total = next(ln for ln in text.splitlines() if ln.startswith("Whole run: "))
    assert total.startswith("Whole run: 42 runs, ")
    assert "| SLO violation vs polling period | rises noticeably past 2 s | not run |" in text  # a claim it does not own
    assert "\nnotes\n" in text
    assert main(["report", str(tmp_path / "nothing"), "--section", "headline", "--out", str(md)]) == 2


def _later_matrix(src: Path, dst: Path, command: str, edit) -> None:
    """A second matrix of the same experiment (``dst``): ``src``'s runs changed by ``edit``, its own command."""
    import pandas as pd

    dst.mkdir(parents=True)
    edit(pd.read_csv(src / "runs.csv")).to_csv(dst / "runs.csv", index=False)
    (dst / "config.json").write_text(json.dumps({"command": command}))


def test_polling_section_merges_its_matrices(tmp_path):
    """Polling periods run in two matrices (results/polling, results/polling-short/polling): the section
    lists both commands, a period both ran takes the later matrix's runs, the others are kept, and the
    report draws the merged figure."""
    import shutil

    from eval.polling import merged_polling, polling_section

    res = tmp_path / "res"
    shutil.copytree(ROOT / "results" / "polling", res / "polling")
    before = merged_polling(str(res)).set_index(["policy", "polling_s"])

    def short(r):
        r = r[r["scenario"].str.endswith("[poll=0.5s]")].copy()
        r.loc[r["policy"] == "milp", "reduction_vs_rr_pct"] = 50.0
        return r

    _later_matrix(res / "polling", res / "polling-short" / "polling", "carbon-gym experiment polling --periods 0.5", short)
    after = merged_polling(str(res)).set_index(["policy", "polling_s"])
    assert after.loc[("milp", 0.5), "reduction_vs_rr_pct"] == pytest.approx(50.0)
    assert after.loc[("milp", 0.5), "reduction_vs_rr_pct_ci95"] == pytest.approx(0.0)
    for key in [("milp", 1.0), ("milp", 4.0), ("rr", 0.5)]:
        assert after.loc[key, "slo_violation_pct"] == pytest.approx(before.loc[key, "slo_violation_pct"]), key
    text, pngs = polling_section(str(res), str(tmp_path / "drawn"))
    assert "--periods 0.5,1,2,4" in text and "carbon-gym experiment polling --periods 0.5\n" in text
    assert "2 matrices (polling, polling-short/polling)" in text and "| llama8b-moderate | milp | 0.5 | 50.0 ± 0.0 |" in text
    assert [Path(p).name for p in pngs] == ["polling_llama8b-moderate.png"] and all(Path(p).is_file() for p in pngs)


def test_tradeoff_section_merges_its_matrices(tmp_path):
    """A second trade-off matrix on another scenario: the merged section holds both scenarios'
    frontiers and equal-violation rows, and a figure for each."""
    import shutil

    from eval.frontiers import tradeoff_section

    res = tmp_path / "res"
    shutil.copytree(ROOT / "results" / "tradeoff", res / "tradeoff")
    assert tradeoff_section(str(res), str(tmp_path / "drawn")) is None  # (one matrix: its own tradeoff.md is the section)

    def other(r):
        r = r.copy()
        r["scenario"] = "llama8b-high"
        return r

    _later_matrix(res / "tradeoff", res / "tradeoff-more" / "tradeoff", "carbon-gym experiment tradeoff --scenarios llama8b-high", other)
    text, pngs = tradeoff_section(str(res), str(tmp_path / "drawn"))
    own = (res / "tradeoff" / "tradeoff.md").read_text()
    row = next(line for line in own.splitlines() if line.startswith("| llama8b-moderate | milp | max_prefill_share=0.3 |"))
    assert row in text and row.replace("llama8b-moderate", "llama8b-high") in text
    assert "--scenarios llama8b-high" in text and "2 matrices (tradeoff, tradeoff-more/tradeoff)" in text
    assert sorted(Path(p).name for p in pngs) == ["tradeoff_llama8b-high.png", "tradeoff_llama8b-moderate.png"]


def test_milp_vs_ilp_section_merges_its_matrices(tmp_path):
    """A second milp-vs-ilp matrix on another scenario (the ILPs at high load): the merged
    section holds every scenario's row with the gaps of the one matrix's table, and the gap figure."""
    import shutil

    from eval.milp_vs_ilp import milp_vs_ilp_runs, milp_vs_ilp_section

    res = tmp_path / "res"
    shutil.copytree(ROOT / "results" / "milp-vs-ilp", res / "milp-vs-ilp")
    assert milp_vs_ilp_section(str(res), str(tmp_path / "drawn")) is None  # (one matrix: its own table is the section)

    def high(r):
        r = r[r["scenario"] == "llama8b-moderate"].copy()
        r["scenario"] = "llama8b-high"
        r.loc[r["policy"] == "ilp-state", "reduction_vs_rr_pct"] -= 10.0
        return r

    _later_matrix(res / "milp-vs-ilp", res / "milp-vs-ilp-high" / "milp-vs-ilp", "carbon-gym experiment milp-vs-ilp --loads high", high)
    assert len(milp_vs_ilp_runs(str(res))) == 240 + 40
    text, pngs = milp_vs_ilp_section(str(res), str(tmp_path / "drawn"))
    own = (res / "milp-vs-ilp" / "milp-vs-ilp.md").read_text()
    row = next(line for line in own.splitlines() if line.startswith("| llama8b-moderate |"))
    assert row in text and "2 matrices (milp-vs-ilp, milp-vs-ilp-high/milp-vs-ilp)" in text and "--loads high" in text
    hi = next(line for line in text.splitlines() if line.startswith("| llama8b-high |")).split(" | ")
    # the moderate row's gap to ilp-state (0.8 ± 2.8 pp) moved by the 10 pp taken off ilp-state
    assert row.split(" | ")[-1] == "0.8 ± 2.8 |" and hi[-1] == "10.8 ± 2.8 |"
    assert [Path(p).name for p in pngs] == ["milp-vs-ilp_milp_vs_ilp_gap.png"] and Path(pngs[0]).is_file()


def test_predictor_section_merges_its_matrices(tmp_path):
    """A second predictor matrix on another scenario (low load run apart): the merged section holds
    every scenario's row, in the headline's order (low before moderate), the one matrix's rows as
    they were, and the figure."""
    import shutil

    from eval.predictor import predictor_runs, predictor_section

    res = tmp_path / "res"
    shutil.copytree(ROOT / "results" / "predictor", res / "predictor")
    assert predictor_section(str(res), str(tmp_path / "drawn")) is None  # (one matrix: its own table is the section)

    def low(r):
        r = r[r["scenario"].str.startswith("llama8b-moderate[")].copy()
        r["scenario"] = r["scenario"].str.replace("llama8b-moderate", "llama8b-low")
        r.loc[(r["policy"] == "milp") & r["scenario"].str.endswith("[oracle]"), "reduction_vs_rr_pct"] -= 2.0
        return r

    _later_matrix(res / "predictor", res / "predictor-low" / "predictor", "carbon-gym experiment predictor --scenarios llama8b-low", low)
    runs = predictor_runs(str(res))
    assert len(runs) == 128 + 32 and str(runs["scenario"].iloc[0]).startswith("llama8b-low[")
    text, pngs = predictor_section(str(res), str(tmp_path / "drawn"))
    own = (res / "predictor" / "predictor.md").read_text()
    rows = [line for line in own.splitlines() if line.startswith("| ") and "| milp |" in line]
    assert len(rows) == 4 and all(row in text for row in rows)
    assert "2 matrices (predictor, predictor-low/predictor)" in text and "--scenarios llama8b-low" in text
    lo = next(line for line in text.splitlines() if line.startswith("| llama8b-low |")).split(" | ")
    mod = next(line for line in text.splitlines() if line.startswith("| llama8b-moderate |")).split(" | ")
    assert text.index("| llama8b-low |") < text.index("| llama8b-moderate |")
    assert mod[5] == "0.8 ± 0.3" and lo[5] == "2.8 ± 0.3"  # the carbon gap moved by the 2 pp taken off the oracle runs
    assert [Path(p).name for p in pngs] == ["predictor_vs_oracle.png"] and Path(pngs[0]).is_file()
