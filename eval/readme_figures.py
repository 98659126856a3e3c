"""The README's simulated figures, regenerated from their own commands and checked in CI.

Each generated block of ``README.md`` sits between two HTML comments::

    <!-- figures: NAME[: carbon-gym eval ARGS] -->
    ...
    <!-- /figures -->

* a block holding a fenced ``python`` snippet is executed as written (in a fresh namespace, its
  ``print`` captured); every ``print(...)`` line with a trailing ``# ...`` comment gets that
  call's output as its comment, each number to 3 significant digits;
* a block naming a ``carbon-gym eval`` command is replaced by the Markdown table that command
  writes (``summary.md``, or ``fault_report.md`` for a block named ``faults``), run in a
  temporary directory with one worker and no plots, records or TensorBoard (which change no
  figure).

``python -m eval.readme_figures --check`` (what ``tests/test_readme_figures.py`` runs) exits 1
with a diff when a figure differs, so a newcomer can tell drift (this fails on a clean checkout)
from a broken install (this passes, their own run does not); wall-clock columns (``decision``)
are not compared. ``--write`` rewrites the blocks in place, for a change that moves the
figures on purpose (say why in the commit). About 10 s on one core.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["README", "check", "generate", "main"]

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"(<!-- figures: (?P<head>[^>]*?) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
_PRINT = re.compile(r"^(?P<code>\s*print\(.*\))(?P<pad>\s*)# .*$")
#: Table columns that are wall-clock measurements, left out of ``--check``.
WALL_CLOCK_COLUMNS = ("decision",)


def _number(v: Any) -> str:
    return np.format_float_positional(float(v), precision=3, fractional=False, trim=".")


def _shown(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return "[" + " ".join(_number(x) for x in v.ravel()) + "]"
    if isinstance(v, (float, np.floating)):
        return _number(v)
    return str(v)


def _snippet(body: str) -> str:
    """Run the fenced python snippet in ``body``; return ``body`` with each commented
    ``print`` line's comment set to what it printed."""
    m = re.search(r"```python\n(?P<code>.*?)```", body, re.S)
    if m is None:
        raise ValueError("a snippet block holds no ```python fence")
    code = m.group("code")
    printed: list[str] = []
    namespace: dict[str, Any] = {"__name__": "__readme__",
                                 "print": lambda *a, **_k: printed.append(" ".join(_shown(x) for x in a))}
    exec(compile(code, "README.md snippet", "exec"), namespace)  # noqa: S102 - our own README's code
    out, k = [], 0
    for line in code.splitlines(keepends=True):
        if line.lstrip().startswith("print("):
            pm = _PRINT.match(line.rstrip("\n"))
            if pm is not None:
                line = f"{pm.group('code')}{pm.group('pad')}# {printed[k]}\n"
            k += 1
        out.append(line)
    return body[: m.start("code")] + "".join(out) + body[m.end("code"):]


def _eval_table(name: str, command: str) -> str:
    """The Markdown table that ``command`` (``carbon-gym eval ...``) writes."""
    from eval import cli

    argv = shlex.split(command)
    if argv[:2] != ["carbon-gym", "eval"]:
        raise ValueError(f"block {name!r}: only `carbon-gym eval ...` commands are run, got {command!r}")
    with tempfile.TemporaryDirectory(prefix="readme-figures-") as tmp:
        out = os.path.join(tmp, "out")
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            rc = cli.main([*argv[1:], "--out", out, "--workers", "1", "--no-plots", "--no-requests", "--no-tensorboard",
                           "--no-progress"])
        if rc != 0:
            raise RuntimeError(f"block {name!r}: {command!r} exited {rc}:\n{sink.getvalue()[-2000:]}")
        return Path(out, "fault_report.md" if name == "faults" else "summary.md").read_text(encoding="utf-8")


def generate(text: str) -> str:
    """``text`` (a README) with every figures block regenerated."""
    def one(m: re.Match[str]) -> str:
        name, _, command = m.group("head").partition(":")
        body = m.group("body")
        new = _eval_table(name.strip(), command.strip()) if command.strip() else _snippet(body)
        return m.group(1) + new + m.group(4)

    if not _BLOCK.search(text):
        raise ValueError("no <!-- figures: ... --> block found")
    return _BLOCK.sub(one, text)


def _comparable(text: str) -> list[str]:
    """Lines of ``text`` with the wall-clock table columns blanked."""
    lines, blank = [], set()
    for line in text.splitlines():
        if line.startswith("| ") and "---" not in line:
            cells = line.split(" | ")
            if any(c in line for c in WALL_CLOCK_COLUMNS) and not blank:
                blank = {i for i, c in enumerate(cells) if any(w in c for w in WALL_CLOCK_COLUMNS)}
            line = " | ".join("*" if i in blank else c for i, c in enumerate(cells))
        elif not line.startswith("|"):
            blank = set()
        lines.append(line)
    return lines


def check(path: Path = README) -> list[str]:
    """Diff lines between the README at ``path`` and its regenerated figures (empty: they
    agree, wall-clock columns aside)."""
    text = path.read_text(encoding="utf-8")
    return list(difflib.unified_diff(_comparable(text), _comparable(generate(text)), "README.md", "regenerated", lineterm=""))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.readme_figures", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="exit 1 with a diff when a README figure differs from its command's")
    g.add_argument("--write", action="store_true", help="rewrite the README's figures blocks in place")
    p.add_argument("--readme", type=Path, default=README, help="the README to check or rewrite (default: the repository's)")
    args = p.parse_args(argv)
    if args.write:
        text = args.readme.read_text(encoding="utf-8")
        args.readme.write_text(generate(text), encoding="utf-8")
        print(f"wrote {args.readme}")
        return 0
    diff = check(args.readme)
    if diff:
        print("\n".join(diff))
        print(f"{args.readme}: figures differ from their commands' (above); if the change is intended, "
              "python -m eval.readme_figures --write", file=sys.stderr)
        return 1
    print(f"{args.readme}: every figures block matches its command")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
