"""Golden results: the pinned metrics of the shipped scenarios are reproduced exactly.

The matrix, the cell contents and how to regenerate them are in :mod:`tests.golden`. CI checks
its subset (every policy on the dev scenarios; round-robin on every paper-scale scenario; every
policy on llama8b-moderate); ``CARBON_GYM_GOLDEN=full`` checks the whole matrix.
"""

from __future__ import annotations

import os
import warnings

import pytest

import golden  # tests/golden.py (pytest puts tests/ on sys.path)

CELLS = golden.all_cells() if os.environ.get("CARBON_GYM_GOLDEN") == "full" else golden.ci_cells()
GOLD = golden.load_golden()


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS, ids=golden.key)
def test_golden_cell(cell: tuple[str, str, int]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = golden.run_cell(cell)
    k = golden.key(cell)
    assert k in GOLD, f"{k} is not in {golden.GOLDEN_PATH}"
    d = golden.diff(GOLD[k], got)
    assert not d, f"{k} differs from the golden results:\n" + "\n".join(d[:20])
