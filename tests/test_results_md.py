"""RESULTS.md: every policy's carbon in it is at least the lower bound of its scenario and seed
(the per-(scenario, seed) check table that ``carbon-gym report`` writes from the headline runs;
the lowest complete run of each row above the bound covers every policy)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from eval.bound import CHECK_TITLE, parse_bound_check

RESULTS = Path(__file__).resolve().parent.parent / "RESULTS.md"


def check_rows(rows: list[dict]) -> None:
    assert rows, "no rows in the lower bound check"
    for r in rows:
        assert r["ok"] == "yes", r
        assert 0.0 <= r["floor_g"] <= r["bound_g"], r
        if not math.isnan(r["lowest_g"]):
            assert r["lowest_g"] >= r["bound_g"], r


def test_committed_results_md_respects_the_bound():
    text = RESULTS.read_text(encoding="utf-8")
    rows = parse_bound_check(text)
    if not rows:
        pytest.skip(f"RESULTS.md predates its '{CHECK_TITLE}' section (regenerate: carbon-gym report results --force)")
    check_rows(rows)


def test_the_check_table_is_parsed_and_fails_below_the_bound():
    text = (f"# R\n\n{CHECK_TITLE}\n\nx\n\n| scenario | seed | bound (g) | floor (g) | lowest complete run (g) | its policy | every run "
            "above the bound |\n|---|---|---|---|---|---|---|\n| dev | 0 | 10.000 | 9.000 | 12.000 | milp | yes |\n"
            "| dev | 1 | 10.000 | 9.000 | 9.500 | greedy | NO |\n\n## Next\n")
    rows = parse_bound_check(text)
    assert [(r["seed"], r["lowest_g"], r["ok"]) for r in rows] == [(0, 12.0, "yes"), (1, 9.5, "NO")]
    check_rows(rows[:1])
    with pytest.raises(AssertionError):
        check_rows(rows)


def _without_figures(text: str) -> str:
    """``text`` without its figure lines and the italic caption under a figure (the figures are not tracked)."""
    kept: list[str] = []
    after_figure = False
    for ln in text.rstrip("\n").splitlines():
        if ln.startswith("![") or (after_figure and ln.startswith("*")):
            after_figure = ln.startswith("![")
            continue
        after_figure = after_figure and not ln.strip()
        kept.append(ln)
    return "\n".join(kept).rstrip("\n")


def test_results_md_sections_are_their_committed_tables():
    """Each experiment section of RESULTS.md is what its tracked tables under results/ give
    (eval.report.table_section; figure links aside, as the figures themselves are not tracked):
    the numbers shown are the numbers on record."""
    from eval.report import TABLE_SECTIONS, Figures, _split_sections, table_section

    root = RESULTS.parent
    _, sections = _split_sections(RESULTS.read_text(encoding="utf-8"))
    checked = []
    for exp, title in TABLE_SECTIONS.items():
        if not (root / "results" / exp / f"{exp}.md").is_file():
            continue
        shown = [s for s in sections if s.startswith(f"## {title}\n")]
        assert len(shown) == 1, f"RESULTS.md has {len(shown)} '{title}' sections, its tables are in results/{exp}"
        want = table_section(str(root / "results"), exp, Figures(str(root / "results"), str(root / "docs" / "figures"), str(RESULTS)))
        assert want is not None
        assert _without_figures(shown[0]) == _without_figures(want), f"RESULTS.md's '{title}' differs from results/{exp} (carbon-gym report results --section {exp})"
        checked.append(exp)
    assert checked, "no experiment's tables are tracked under results/"


def test_results_md_headline_is_its_committed_tables():
    """The headline section's tables (the reduction table and the full table) are those of the
    tracked results/headline/headline.md, row for row, and every start's bound row says yes."""
    md = RESULTS.parent / "results" / "headline" / "headline.md"
    if not md.is_file():
        pytest.skip("no tracked headline tables (results/headline)")
    from eval.report import _split_sections

    _, sections = _split_sections(RESULTS.read_text(encoding="utf-8"))
    head = next(s for s in sections if s.startswith("## Headline:"))
    rows = [ln for ln in md.read_text(encoding="utf-8").splitlines() if ln.startswith("| ")]
    assert len(rows) > 4
    missing = [r for r in rows if r not in head.splitlines()]
    assert not missing, f"RESULTS.md's headline lacks {len(missing)} rows of results/headline/headline.md, e.g. {missing[0]!r}"
    checks = [ln for ln in head.split("### Lower bound check", 1)[1].splitlines() if ln.startswith("| ") and not ln.startswith(("| scenario", "|---"))]
    assert checks and all(ln.rstrip().endswith("| yes |") for ln in checks)
