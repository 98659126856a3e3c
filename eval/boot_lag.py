"""Why a run deciding capacity failed MLPerf p99: the datacenters waiting for servers to boot.

    python -m eval.boot_lag MATRIX_DIR [POLICY ...]

For each run of ``MATRIX_DIR`` (a matrix run with step records, ``steps/<run_id>.parquet``) that
failed MLPerf p99 (its ``runs.csv`` row), of the policies named (all when none), this finds the
first step whose TTFT p99 (over the requests completing in that step) exceeds the target, and the
datacenters that powered servers on in the ``lookback_s`` before it: for each, when its powered
servers rose (s, episode time), its awake engines then and how long they stayed below the most it
woke (the server boot, ``server_boot_s`` of the GPU's power file, plus the wake), and the run's
TTFT p99. A router whose plan moves load to a datacenter the autoscaler had powered down sends
it its planned share at once while its engines are still booting: the queue grows for the boot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

import numpy as np

__all__ = ["boot_lags", "matrix_boot_lags"]


def boot_lags(steps: Any, ttft_target_s: float, lookback_s: float = 600.0, after_s: float = 60.0,
              wake_s: float = 10.0) -> dict[str, Any] | None:
    """The first step of ``steps`` (a run's step records: ``time_s``, ``ttft_p99_s``,
    ``servers_on_dc<d>``, ``awake_engines_dc<d>``) whose TTFT p99 exceeds ``ttft_target_s`` (s),
    and each datacenter whose powered servers rose from ``lookback_s`` before it to ``after_s``
    after it (s; an autoscaler reacts to the queue it sees): ``dc``, ``powered_at_s`` (the rise
    nearest the first late step), ``servers`` (before, after), ``awake_before``, ``awake_woken``
    (``wake_s`` after the rise: the sleeping engines of servers already on, woken in about a
    second) and ``boot_s``: from the rise until more engines than that were awake (the booted
    servers' engines joining), None when not before the run's end (``end_s``). None when no step
    exceeds the target."""
    t = steps["time_s"].to_numpy(np.float64)
    over = np.flatnonzero(np.nan_to_num(steps["ttft_p99_s"].to_numpy(np.float64)) > float(ttft_target_s))
    if over.size == 0:
        return None
    t0 = float(t[int(over[0])])
    out: dict[str, Any] = {"first_over_s": t0, "end_s": float(t[-1]), "datacenters": []}
    d = 0
    while f"servers_on_dc{d}" in steps:
        sv = steps[f"servers_on_dc{d}"].to_numpy(np.int64)
        aw = steps[f"awake_engines_dc{d}"].to_numpy(np.int64)
        rises = np.flatnonzero((sv[1:] > sv[:-1]) & (t[1:] >= t0 - float(lookback_s)) & (t[1:] <= t0 + float(after_s))) + 1
        if rises.size:
            k = int(rises[np.argmin(np.abs(t[rises] - t0))])
            woken = int(aw[min(int(np.searchsorted(t, t[k] + float(wake_s))), len(t) - 1)])
            more = np.flatnonzero(aw[k:] > woken)
            out["datacenters"].append({"dc": d, "powered_at_s": float(t[k]), "servers": (int(sv[k - 1]), int(sv[k])),
                                       "awake_before": int(aw[k - 1]), "awake_woken": woken,
                                       "boot_s": float(t[k + int(more[0])] - t[k]) if more.size else None})
        d += 1
    return out


def matrix_boot_lags(matrix_dir: str, policies: Sequence[str] = (), lookback_s: float = 600.0,
                     after_s: float = 60.0) -> list[dict[str, Any]]:
    """:func:`boot_lags` of every run of ``matrix_dir`` failing MLPerf p99 (of ``policies``, all
    when empty), each with ``scenario``, ``policy``, ``seed``, ``ttft_p99_s`` and the datacenters'
    names (``names``). A failing run without step records is reported with ``steps`` False."""
    import pandas as pd

    runs = pd.read_csv(os.path.join(matrix_dir, "runs.csv"))
    with open(os.path.join(matrix_dir, "config.json"), encoding="utf-8") as fh:
        meta = {(str(r.get("scenario_label") or r["scenario"]), str(r.get("label") or r["policy"]), int(r["seed"])): r
                for r in json.load(fh).get("runs", [])}
    rows = []
    for _, r in runs.iterrows():
        if bool(r["mlperf_p99_pass"]) or (policies and str(r["policy"]) not in policies):
            continue
        m = meta.get((str(r["scenario"]), str(r["policy"]), int(r["seed"])), {})
        row = {"scenario": str(r["scenario"]), "policy": str(r["policy"]), "seed": int(r["seed"]),
               "ttft_p99_s": float(r["ttft_p99_s"]), "names": list(m.get("datacenters", [])), "steps": False, "lags": None}
        path = os.path.join(matrix_dir, "steps", f"{m.get('run_id', '')}.parquet")
        if m and os.path.isfile(path):
            row.update(steps=True, lags=boot_lags(pd.read_parquet(path), float(m.get("ttft_target_s", 2.0)), lookback_s, after_s))
        rows.append(row)
    return rows


def _text(row: dict[str, Any]) -> str:
    head = f"{row['scenario']} {row['policy']} seed {row['seed']} (TTFT p99 {row['ttft_p99_s']:.1f} s): "
    if not row["steps"]:
        return head + "no step records."
    lag = row["lags"]
    if lag is None:
        return head + "no step over the TTFT target (it failed on TPOT or on the run's whole distribution)."
    names = row["names"]
    parts = []
    for x in lag["datacenters"]:
        name = names[x["dc"]] if x["dc"] < len(names) else f"dc{x['dc']}"
        boot = (f"more engines awake {x['boot_s']:.0f} s later" if x["boot_s"] is not None
                else f"no more before the run's end ({lag['end_s'] - x['powered_at_s']:.0f} s later)")
        parts.append(f"{name} powered {x['servers'][0]} -> {x['servers'][1]} servers at {x['powered_at_s']:.1f} s with "
                     f"{x['awake_before']} engines awake, {x['awake_woken']} after waking its sleeping ones, {boot}")
    return head + f"first step over the target at {lag['first_over_s']:.1f} s; " + ("; ".join(parts) or "no datacenter powered servers on near it") + "."


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.boot_lag", description=__doc__.split("\n\n")[0])
    ap.add_argument("matrix", help="a matrix directory with runs.csv, config.json and steps/")
    ap.add_argument("policies", nargs="*", help="table labels of the policies to explain (default: every failing run)")
    ap.add_argument("--lookback-s", type=float, default=600.0, help="how far before the first late step to look for server power-ons (s)")
    ap.add_argument("--after-s", type=float, default=60.0, help="and how far after it (s)")
    ap.add_argument("--write", action="store_true", help="also write the lines to MATRIX_DIR/boot_lag.md (the step records "
                    "are not committed: results/**/steps/ is ignored, 250 MB a matrix)")
    a = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(a.matrix, "runs.csv")):
        ap.error(f"{a.matrix!r}: no runs.csv there (a matrix directory, e.g. results/slo/autoscaled/capacity)")
    rows = matrix_boot_lags(a.matrix, a.policies, a.lookback_s, a.after_s)
    lines = [_text(row) for row in rows] or ["no run failing MLPerf p99" + (f" among {', '.join(a.policies)}" if a.policies else "") + "."]
    print("\n".join(lines))
    if a.write:
        with open(os.path.join(a.matrix, "boot_lag.md"), "w", encoding="utf-8") as fh:
            fh.write(f"# python -m eval.boot_lag {' '.join(argv if argv is not None else sys.argv[1:])}\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
