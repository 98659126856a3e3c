"""Golden results: every metric of every shipped scenario (quick preset), pinned.

``python -m tests.golden --write`` runs the matrix (shipped scenarios x deterministic policies x
seeds 0-2, 60 simulated seconds, the evaluation's episode starts) and writes
``tests/data/golden_quick.json``; ``python -m tests.golden`` reruns it and lists every cell that
differs (exit status 1). ``tests/test_golden.py`` checks a CI-sized subset the same way, and the
whole matrix when ``CARBON_GYM_GOLDEN=full``.

A cell is the episode's ``episode_metrics`` (every key) plus SHA-256 digests of the per-request
records and of the per-step columns (decision times left out: wall clock). How each field is
compared (:data:`RULES`, also written into the file's ``_header``):

* **exact**, every field but the ones below: what the simulation computes (carbon, energy,
  counts, latencies, the decisions behind the record digests) and the solver's work counts
  (solves, fallbacks, limits, branch-and-bound nodes). The simulation is deterministic under a
  seed, and the facility MILP runs on one HiGHS thread with a fixed random seed and
  deterministic work limits (no wall clock), so these are the same bits on any machine; the
  sums that decide between the MILP's incumbents are BLAS-independent
  (:func:`carbon_gym.numeric.exact_dot`; ``tests/test_reproducible.py`` says why).
* **relative 1e-9** (:data:`TOLERANT`): the MILP's certified gap (``policy_mip_gap_mean``,
  ``_p95``), a ratio of the incumbent's objective and the LP bound that HiGHS reports. The bound
  comes out of HiGHS's floating-point internals (its simplex, compiled per platform), which no
  project code controls; its last bits may differ on another build or CPU without any simulated
  figure moving (the gap decides only whether branch-and-bound runs, at ``mip_gap`` = 0.01, a
  threshold a last-bit change would have to straddle; then the exact fields would differ too).
* **left out**: wall-clock figures (``decision_*``, ``wall_*``, ``cpu_*``, the per-step
  ``decision_s``) and the metrics in :data:`UNPINNED_METRICS`.

The facility MILP runs with its defaults: its solves are bounded by deterministic work limits,
not the wall clock, so its cells do not depend on the machine's load (until the milp cells were
regenerated it ran with ``time_limit_s=60``, as the earlier 0.2 s default did).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN_PATH = os.path.join(HERE, "data", "golden_quick.json")

SCENARIOS = (
    "dev", "dev-fault", "dev-fault-region",
    "llama8b-low", "llama8b-moderate", "llama8b-high",
    "qwen7b-low", "qwen7b-moderate", "qwen7b-high",
    "mixtral8x7b-low", "mixtral8x7b-moderate", "mixtral8x7b-high",
    "llama8b-diurnal",
)
POLICIES = ("rr", "greedy", "least-loaded", "planner", "planner-1h", "ilp", "ilp-state", "milp", "milp-greedy",
            "clairvoyant", "learned")
SEEDS = (0, 1, 2)
DURATION_S = 60.0
POLICY_KWARGS: dict[str, dict[str, Any]] = {}
#: Run metrics added after the cells were pinned, left out of a cell: each is computed from
#: pinned values (the MLPerf verdicts from the pinned p99 latencies and the scenario's targets, the
#: run's validity from its pinned unfinished share) or
#: is wall clock. A regenerated cell leaves them out too, so old and new cells compare alike.
UNPINNED_METRICS = frozenset({"mlperf_ttft_p99_pass", "mlperf_tpot_p99_pass", "run_valid"})
#: Episode metrics added after the cells were pinned, left out of a cell while they are 0 (their
#: value in every episode before they existed): a cell where one is not 0 shows it as "new".
ZERO_UNTIL_PINNED = frozenset({"blocked", "blocked_at_end", "context_truncated", "context_truncated_tokens"})


#: Fields compared with a relative tolerance instead of exactly: path in a cell -> tolerance.
TOLERANT: dict[str, float] = {"/metrics/policy_mip_gap_mean": 1e-9, "/metrics/policy_mip_gap_p95": 1e-9}
#: How the fields are compared, as written into the golden file's ``_header`` (see the docstring).
RULES = {
    "exact": "every field not named below, floats by their repr: the simulation (carbon, energy, counts, latencies, "
             "the decisions behind the record digests) and the solvers' work counts are the same bits on any machine",
    "relative_tolerance": dict(TOLERANT),
    "why_tolerant": "the MILP's certified gap is a ratio of its objective and the LP bound HiGHS reports; the bound's "
                    "last bits come from HiGHS's floating-point internals (compiled per platform); the gap decides only whether branch-and-bound runs (at mip_gap 0.01), so a change that moved a decision would show in the exact fields too",
    "left_out": "wall-clock figures (decision_*, wall_*, cpu_*, per-step decision_s) and " + ", ".join(sorted(UNPINNED_METRICS)),
}
HEADER_KEY = "_header"


def _pinned_episode_metrics(em: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in em.items() if not (k in ZERO_UNTIL_PINNED and v == 0)}


#: The subset tests/test_golden.py checks in CI: every policy on the dev scenarios (three seeds),
#: round-robin on every paper-scale scenario and every policy on llama8b-moderate (seed 0).
def ci_cells() -> list[tuple[str, str, int]]:
    cells = [(s, p, k) for s in SCENARIOS[:3] for p in POLICIES for k in SEEDS]
    cells += [(s, "rr", 0) for s in SCENARIOS[3:]]
    cells += [("llama8b-moderate", p, 0) for p in POLICIES if p != "rr"]
    return cells


def all_cells() -> list[tuple[str, str, int]]:
    return [(s, p, k) for s in SCENARIOS for p in POLICIES for k in SEEDS]


def key(cell: tuple[str, str, int]) -> str:
    return f"{cell[0]}|{cell[1]}|{cell[2]}"


def _plain(v: Any) -> Any:
    """JSON form that keeps every float exactly (repr), NaN/inf included."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if v is None or isinstance(v, str):
        return v
    return repr(v)


def _digest(columns: dict[str, np.ndarray], skip: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256()
    for name in sorted(columns):
        if name in skip:
            continue
        a = np.ascontiguousarray(np.asarray(columns[name]))
        if a.dtype.kind == "f":
            a = a.astype(np.float64)
        elif a.dtype.kind in "iub":
            a = a.astype(np.int64)
        h.update(name.encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _zero_columns(columns: dict[str, np.ndarray], names: tuple[str, ...]) -> tuple[str, ...]:
    """The columns among ``names`` that are all zero: record columns added after the golden cells
    were written (prefix caching's ``cached_tokens``) are left out of the digest while they carry
    nothing, so the pinned digests of the other columns stay valid; a run that uses them pins them."""
    return tuple(n for n in names if n in columns and not np.any(np.asarray(columns[n])))


def run_cell(cell: tuple[str, str, int]) -> dict[str, Any]:
    """One episode through the evaluation runner (as ``carbon-gym eval`` runs it)."""
    from carbon_gym.policy import EpisodeObserver
    from eval.runner import RunSpec, run_one

    final: dict[str, Any] = {}

    class Capture(EpisodeObserver):
        """Keeps the final step's ``episode_metrics`` (the runner reports only some of them)."""

        def after_step(self, env: Any, step: int, action: Any, reward: float, terminated: bool, truncated: bool,
                       info: dict[str, Any], decision_s: float) -> None:
            if "episode_metrics" in info:
                final["em"] = info["episode_metrics"]

    scenario, policy, seed = cell
    spec = RunSpec(scenario=scenario, policy=policy, seed=seed, overrides=(("duration_s", DURATION_S),),
                   policy_kwargs=tuple(sorted(POLICY_KWARGS.get(policy, {}).items())))
    res = run_one(spec, keep_requests=True, observers=[Capture()])
    em = final.get("em")
    metrics = {k: v for k, v in res.metrics.items()
               if not k.startswith(("decision_", "wall_", "cpu_")) and k not in UNPINNED_METRICS}
    return {
        "metrics": _plain(metrics),
        "episode_metrics": _plain(_pinned_episode_metrics(em)) if em is not None else None,
        "meta": _plain({k: v for k, v in res.meta.items() if k not in ("warnings", "episode_metrics")}),
        "requests_sha256": _digest(res.requests, skip=_zero_columns(res.requests, ("cached_tokens",))),
        "steps_sha256": _digest(res.steps, skip=("decision_s",)),
        "n_requests": int(len(next(iter(res.requests.values())))) if res.requests else 0,
    }


def _worker(cell: tuple[str, str, int]) -> tuple[str, dict[str, Any]]:
    import warnings

    warnings.simplefilter("ignore")
    return key(cell), run_cell(cell)


def run_cells(cells: list[tuple[str, str, int]], workers: int = 2) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if workers <= 1:
        for c in cells:
            k, v = _worker(c)
            out[k] = v
        return out
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        for i, (k, v) in enumerate(pool.imap_unordered(_worker, cells)):
            out[k] = v
            print(f"[{i + 1}/{len(cells)}] {k}", file=sys.stderr, flush=True)
    return out


def _close(expected: Any, got: Any, rel: float) -> bool:
    """Whether two pinned floats (their repr strings) agree within ``rel`` (NaN equals NaN)."""
    try:
        e, g = float(expected), float(got)
    except (TypeError, ValueError):
        return bool(expected == got)
    if np.isnan(e) or np.isnan(g):
        return bool(np.isnan(e) and np.isnan(g))
    return abs(e - g) <= rel * max(abs(e), abs(g))


def diff(expected: dict[str, Any], got: dict[str, Any], path: str = "") -> list[str]:
    """Entries that differ, as ``path: expected != got``: exact except the :data:`TOLERANT` paths."""
    out: list[str] = []
    if isinstance(expected, dict) and isinstance(got, dict):
        for k in sorted(set(expected) | set(got)):
            if k not in got:
                out.append(f"{path}/{k}: missing")
            elif k not in expected:
                out.append(f"{path}/{k}: new")
            else:
                out += diff(expected[k], got[k], f"{path}/{k}")
        return out
    rel = TOLERANT.get(path)
    if rel is not None and _close(expected, got, rel):
        return out
    if expected != got:
        out.append(f"{path}: {expected!r} != {got!r}" + (f" (beyond the relative tolerance {rel:g})" if rel is not None else ""))
    return out


def load_golden() -> dict[str, Any]:
    """The pinned cells by key (the file's ``_header`` left out)."""
    with open(GOLDEN_PATH) as f:
        cells = json.load(f)
    cells.pop(HEADER_KEY, None)
    return cells


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write tests/data/golden_quick.json")
    ap.add_argument("--ci", action="store_true", help="only the CI subset")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--policies", default="", help="comma-separated policy names")
    a = ap.parse_args(argv)
    cells = ci_cells() if a.ci else all_cells()
    if a.only:
        keep = set(a.only.split(","))
        cells = [c for c in cells if c[0] in keep]
    if a.policies:
        keep_p = set(a.policies.split(","))
        cells = [c for c in cells if c[1] in keep_p]
    got = run_cells(cells, a.workers)
    if a.write:
        old = load_golden() if os.path.exists(GOLDEN_PATH) else {}
        old.update(got)
        with open(GOLDEN_PATH, "w") as f:
            json.dump({HEADER_KEY: RULES, **{k: old[k] for k in sorted(old)}}, f, indent=0, sort_keys=True)
            f.write("\n")
        print(f"wrote {len(got)} cells to {GOLDEN_PATH}")
        return 0
    gold = load_golden()
    bad = 0
    for k in sorted(got):
        d = diff(gold.get(k, {}), got[k]) if k in gold else ["not in the golden file"]
        if d:
            bad += 1
            print(f"{k}:\n  " + "\n  ".join(d[:12]))
    print(f"golden_cells={len(got)} differing={bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
