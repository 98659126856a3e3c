#!/usr/bin/env python3
"""Write ``constraints.txt``: the versions of the test environment, for every supported Python.

usage (in the project root, inside the venv that `.ci/run` built and that passed)::

    python .ci/lock.py [--python /path/to/python3.10 ...] [--out constraints.txt]

The versions of this interpreter's environment (``pip freeze``; the project itself left out,
``torch`` written without its ``+cpu`` label so that both the CPU build and PyPI's satisfy it,
torch's CUDA-only dependencies left out) are pinned for this Python's minor version and up.
Each ``--python`` (an older interpreter, e.g. 3.10) resolves ``.[test]`` afresh with
``pip install --dry-run --report`` (nothing installed; the newest releases that interpreter
supports) and its versions that differ are pinned under a ``python_version`` marker. pip reads
the file with ``-c constraints.txt``: it pins what is installed, installs nothing by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: torch's CUDA dependencies (absent with the CPU build) and the installers themselves: not pinned
SKIP = re.compile(r"^(nvidia-.*|triton|cuda-.*|pip|setuptools|wheel)$")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def frozen(python: str) -> dict[str, str]:
    """name -> version of what ``python``'s environment holds (editable installs left out)."""
    out = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable"], check=True, capture_output=True, text=True).stdout
    pins = {}
    for line in out.splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[norm(name)] = version.strip()
    return pins


def resolved(python: str) -> dict[str, str]:
    """name -> version that ``python`` would install for ``.[test]`` (a dry run)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--report", str(report),
                        f"{ROOT}[test]"], check=True, env={**os.environ, "CARBON_GYM_NO_COMPILE": "1"})
        items = json.loads(report.read_text())["install"]
    return {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


def minor(python: str) -> tuple[int, int]:
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], check=True, capture_output=True, text=True).stdout
    major, mnr = out.split()
    return int(major), int(mnr)


def lock(base: dict[str, str], base_py: tuple[int, int], older: list[tuple[tuple[int, int], dict[str, str]]]) -> list[str]:
    """Constraint lines: one pin per package where every Python takes one version, else one pin
    per run of Pythons that take the same version, under a ``python_version`` marker."""
    older = sorted(older)
    pythons = [py for py, _ in older] + [base_py]
    tables = [pins for _, pins in older] + [base]
    lines = []
    for name in sorted({n for pins in tables for n in pins}):
        if SKIP.match(name) or name == "carbon-gym":
            continue
        versions = [t.get(name) for t in tables]
        if name == "torch":
            versions = [v.split("+", 1)[0] if v else v for v in versions]
        i = 0
        while i < len(pythons):
            j = i
            while j + 1 < len(pythons) and versions[j + 1] == versions[i]:
                j += 1
            if versions[i] is not None:
                lo = f'python_version >= "{pythons[i][0]}.{pythons[i][1]}"' if i > 0 else ""
                hi = f'python_version < "{pythons[j + 1][0]}.{pythons[j + 1][1]}"' if j + 1 < len(pythons) else ""
                marker = " and ".join(x for x in (lo, hi) if x)
                lines.append(f"{name}=={versions[i]}" + (f" ; {marker}" if marker else ""))
            i = j + 1
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", default=[], help="an older interpreter to resolve for (repeatable)")
    ap.add_argument("--out", default=str(ROOT / "constraints.txt"))
    a = ap.parse_args(argv)
    base_py = sys.version_info[:2]
    older = [(minor(p), resolved(p)) for p in a.python]
    lines = lock(frozen(sys.executable), (base_py[0], base_py[1]), older)
    pys = ", ".join(f"{m[0]}.{m[1]}" for m, _ in sorted(older))
    head = [
        "# The test environment's versions (pip constraints: `pip install -c constraints.txt -e \".[test]\"`, as .ci/run",
        "# and the README's commands do). Written by `python .ci/lock.py` from the venv of a passing .ci/run on Python "
        f"{base_py[0]}.{base_py[1]}" + (f", with a fresh resolution for Python {pys} where its releases differ." if pys else "."),
        "# torch is pinned without its +cpu label: the CPU build (PyTorch's index) and PyPI's both satisfy it.",
    ]
    Path(a.out).write_text("\n".join(head + lines) + "\n")
    print(f"wrote {len(lines)} pins to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
