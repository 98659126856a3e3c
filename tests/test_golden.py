"""Golden results: the pinned metrics of the shipped scenarios are reproduced exactly.

The matrix, the cell contents and how to regenerate them are in :mod:`tests.golden`. CI checks
its subset (every policy on the dev scenarios; round-robin on every paper-scale scenario; every
policy on llama8b-moderate); ``CARBON_GYM_GOLDEN=full`` checks the whole matrix.
"""

from __future__ import annotations

import copy
import json
import os
import warnings

import numpy as np
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


def _nudge(text: str, ulps: int = 1) -> str:
    """A pinned float (its repr) moved by ``ulps`` units in the last place."""
    x = float(text)
    for _ in range(abs(ulps)):
        x = float(np.nextafter(x, np.inf if ulps > 0 else -np.inf))
    return repr(x)


def test_golden_diff_tolerates_the_last_bits_of_a_solver_diagnostic():
    """The MILP's certified gap moved by a few ulps (what another HiGHS build or CPU may give):
    no difference; moved beyond the relative 1e-9: a difference."""
    cell = copy.deepcopy(GOLD["dev|milp|1"])
    for name in ("policy_mip_gap_mean", "policy_mip_gap_p95"):
        cell["metrics"][name] = _nudge(cell["metrics"][name], 3)
    assert golden.diff(GOLD["dev|milp|1"], cell) == []
    cell["metrics"]["policy_mip_gap_mean"] = repr(float(cell["metrics"]["policy_mip_gap_mean"]) * (1 + 1e-8))
    d = golden.diff(GOLD["dev|milp|1"], cell)
    assert len(d) == 1 and d[0].startswith("/metrics/policy_mip_gap_mean") and "tolerance" in d[0]


@pytest.mark.parametrize("path", [("metrics", "carbon_g"), ("episode_metrics", "carbon_g"),
                                  ("episode_metrics", "ledger", "energy_j"), ("metrics", "ttft_p99_s")])
def test_golden_diff_catches_one_ulp_of_a_simulated_figure(path):
    """A carbon, energy or latency figure one ulp off is a difference: those compare exactly."""
    cell = copy.deepcopy(GOLD["dev|milp|1"])
    node = cell
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = _nudge(node[path[-1]])
    assert golden.diff(GOLD["dev|milp|1"], cell) == [f"/{'/'.join(path)}: {_get(GOLD['dev|milp|1'], path)!r} != {node[path[-1]]!r}"]


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def test_golden_file_states_how_fields_are_compared():
    with open(golden.GOLDEN_PATH) as f:
        header = json.load(f)[golden.HEADER_KEY]
    assert header == json.loads(json.dumps(golden.RULES))
    assert set(header["relative_tolerance"]) == set(golden.TOLERANT)
