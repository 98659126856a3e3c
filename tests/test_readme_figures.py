"""Issue 39 item 8: the README's simulated figures (the simulator snippet's printed values, the
dev sample and the fault table) are what their commands print now (``eval.readme_figures``)."""

from __future__ import annotations

from pathlib import Path

from eval import readme_figures


def test_readme_figures_match_their_commands() -> None:
    diff = readme_figures.check()
    assert diff == [], "\n".join(diff) + "\n(python -m eval.readme_figures --write if intended)"


def test_check_catches_a_changed_figure_and_ignores_wall_clock(tmp_path: Path) -> None:
    text = readme_figures.README.read_text(encoding="utf-8")
    # the dev sample's last column is the decision time (wall clock): another value passes
    lines = text.splitlines(keepends=True)
    row = next(i for i, ln in enumerate(lines) if ln.startswith("| dev | milp | 3 |"))
    cells = lines[row].rstrip("\n").split(" | ")
    cells[-1] = "999/999 |"
    lines[row] = " | ".join(cells) + "\n"
    wall = tmp_path / "wall.md"
    wall.write_text("".join(lines), encoding="utf-8")
    assert readme_figures.check(wall) == []
    # its carbon cell, changed, fails
    assert " ± " in cells[3]
    cells[3] = "0.0999" + cells[3][cells[3].index(" ± "):]
    lines[row] = " | ".join(cells) + "\n"
    off = tmp_path / "off.md"
    off.write_text("".join(lines), encoding="utf-8")
    diff = readme_figures.check(off)
    assert any(d.startswith("-| dev | milp | 3 |") for d in diff)
    # so does the snippet's printed TTFT
    snippet = tmp_path / "snippet.md"
    snippet.write_text(text.replace("# [0.106]", "# [0.107]", 1), encoding="utf-8")
    assert "# [0.106]" in text and any("# [0.107]" in d for d in readme_figures.check(snippet))
