"""Awake engines the router leaves idle: where a capacity-deciding run's carbon goes that the
SLO-true bound does not spend.

``python -m eval.idle_capacity MATRIX_DIR [MATRIX_DIR ...] [--policy milp[,NAME...]] [--share 0.01] [--write]``

For every run of each ``--policy`` that decides capacity (``capacity.control`` not ``always_on``) in
each finished matrix (``config.json``, ``runs.csv`` and the runs' ``steps/<run id>.parquet``,
which git does not track: run it where the matrix ran), over its measurement window (the steps
after ``runs.csv``'s ``window_start_s``, as :func:`eval.dc_carbon.dc_carbon` reads them):

- ``idle_dcs``: datacenters whose engines are awake (mean awake engines over the window >= 0.5)
  while they receive under ``--share`` (1%) of the window's requests (``dc_placed``);
- ``idle_engines``: their mean awake engines, summed;
- ``idle_carbon_pp``: their carbon over the window (idle and host power, PUE, whatever they
  served), as percentage points of the same start's always-on round-robin carbon;
- ``gap_pp``: the run above its SLO-true bound, pp of the same rr carbon, where ``python -m
  eval.bound`` has checked the matrix (``bound_check.csv``; NaN otherwise).

Printed per scenario and policy (means over the starts), then ``idle_awake_carbon_pp=<mean over every
run>``; ``--write`` keeps each matrix's rows in its ``idle_capacity.csv`` (tracked, beside
``bound_check.csv``). A datacenter kept awake with nothing to do costs its engines' idle power and its
servers' host power for the whole window; the bound (which powers a datacenter only for work it
places there) spends none of it, so ``idle_carbon_pp`` is a part of ``gap_pp`` the bound's
placement does not share.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["idle_capacity_runs", "idle_capacity_markdown", "main"]

#: How a tradeoff matrix names a capacity-deciding run (``milp (capacity)``); a capacity matrix's is the policy's own.
CAPACITY_SUFFIX = " (capacity)"


def _name(m: dict[str, Any]) -> str:
    """A run's name in ``runs.csv`` (its label, else its policy)."""
    return str(m.get("label") or m["policy"])


def _row(runs: Any, m: dict[str, Any]) -> Any:
    """The run's row of ``runs.csv`` (KeyError if it is not there)."""
    row = runs[(runs["scenario"] == m["scenario"]) & (runs["seed"] == m["seed"]) & (runs["policy"] == _name(m))]
    if row.empty:
        raise KeyError(f"run {m['run_id']} ({_name(m)}) is not in runs.csv")
    return row.iloc[0]


def idle_capacity_runs(matrix_dir: str, policies: str | Sequence[str] = "milp", share: float = 0.01) -> Any:
    """One row per capacity-deciding run of ``policies`` (names in ``runs.csv``, `` (capacity)``
    implied) in ``matrix_dir`` (module docstring): ``scenario``, ``policy``, ``seed``,
    ``idle_dcs``, ``idle_engines``, ``idle_carbon_pp``, ``gap_pp``."""
    import pandas as pd

    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1), got {share!r}")
    names = [policies] if isinstance(policies, str) else list(policies)
    wanted = {n for p in names for n in (p, p + CAPACITY_SUFFIX)}
    with open(os.path.join(matrix_dir, "config.json"), encoding="utf-8") as f:
        specs = {m["run_id"]: m for m in json.load(f)["runs"]}
    runs = pd.read_csv(os.path.join(matrix_dir, "runs.csv"))
    rr = {(str(m["scenario"]), int(m["seed"])): float(_row(runs, m)["carbon_g"]) for m in specs.values()
          if m["policy"] == "rr" and dict(m.get("overrides", {})).get("capacity.control", "always_on") == "always_on"}
    check_path = os.path.join(matrix_dir, "bound_check.csv")
    check = pd.read_csv(check_path) if os.path.exists(check_path) else None
    rows = []
    for rid, m in specs.items():
        over = dict(m.get("overrides", {}))
        name = _name(m)
        if name not in wanted or over.get("capacity.control", "always_on") == "always_on":
            continue
        key = (str(m["scenario"]), int(m["seed"]))
        if key not in rr:
            raise KeyError(f"{matrix_dir}: no always-on rr run of {key[0]} seed {key[1]} to scale {rid} by")
        path = os.path.join(matrix_dir, "steps", f"{rid}.parquet")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: the run's steps are not here (git does not track steps/: run this where the matrix ran)")
        t0 = float(_row(runs, m).get("window_start_s", float("nan")))
        steps = pd.read_parquet(path)
        w = steps[steps["time_s"] > (t0 if np.isfinite(t0) else 0.0) + 1e-9]
        placed = np.asarray(m["dc_placed"], dtype=np.float64)
        n = placed.size
        awake = np.array([w[f"awake_engines_dc{d}"].mean() for d in range(n)])
        carbon = np.array([w[f"carbon_g_dc{d}"].sum() for d in range(n)])
        idle = (awake >= 0.5) & (placed < share * max(placed.sum(), 1.0))
        gap = float("nan")
        if check is not None:
            c = check[(check["scenario"] == key[0]) & (check["seed"] == key[1]) & (check["policy"] == name)]
            if not c.empty:
                gap = 100.0 * float(c["carbon_g"].iloc[0] - c["slo_bound_carbon_g"].iloc[0]) / rr[key]
        rows.append({"scenario": key[0], "policy": name, "seed": key[1], "idle_dcs": int(idle.sum()), "idle_engines": float(awake[idle].sum()),
                     "idle_carbon_pp": 100.0 * float(carbon[idle].sum()) / rr[key], "gap_pp": gap})
    return pd.DataFrame(rows, columns=["scenario", "policy", "seed", "idle_dcs", "idle_engines", "idle_carbon_pp", "gap_pp"])


def idle_capacity_markdown(table: Any) -> str:
    """A markdown table of :func:`idle_capacity_runs`' rows, means per scenario and policy."""
    lines = ["| scenario | policy | starts | idle datacenters | idle engines | idle carbon (pp of rr) | above the SLO-true bound (pp) |",
             "|---|---|---|---|---|---|---|"]
    for (scen, pol), g in table.groupby(["scenario", "policy"], sort=False):
        lines.append(f"| {scen} | {pol} | {len(g)} | {g['idle_dcs'].mean():.1f} | {g['idle_engines'].mean():.1f} | "
                     f"{g['idle_carbon_pp'].mean():.1f} | {g['gap_pp'].mean():.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eval.idle_capacity MATRIX_DIR ...`` (module docstring)."""
    import pandas as pd

    ap = argparse.ArgumentParser(prog="python -m eval.idle_capacity", description=__doc__.split("\n\n")[0])
    ap.add_argument("matrix", nargs="+", help="finished matrix directories (config.json, runs.csv, steps/)")
    ap.add_argument("--policy", default="milp", help="the capacity-deciding policies' names in the matrix's runs.csv, "
                    "comma-separated, ' (capacity)' implied (default: milp)")
    ap.add_argument("--share", type=float, default=0.01, help="a datacenter is idle below this share of the requests (default: 0.01)")
    ap.add_argument("--write", action="store_true", help="write each matrix's rows to its idle_capacity.csv")
    args = ap.parse_args(argv)
    tables = []
    for d in args.matrix:
        t = idle_capacity_runs(d, [p.strip() for p in args.policy.split(",") if p.strip()], args.share)
        if args.write:
            t.to_csv(os.path.join(d, "idle_capacity.csv"), index=False)
        print(f"{d}:\n{idle_capacity_markdown(t)}")
        tables.append(t)
    every = pd.concat(tables, ignore_index=True)
    print(f"idle_awake_carbon_pp={every['idle_carbon_pp'].mean():.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
