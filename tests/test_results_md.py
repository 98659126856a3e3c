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
