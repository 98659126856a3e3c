"""``python -m eval.request_mix MATRIX_DIR``: which requests each policy sent where.

For every run of a finished matrix whose per-request records were kept (``requests/*.parquet``,
a run without ``--no-requests``), one row per datacenter: the requests it served that arrived
after the burn-in (``env.warmup_s`` of the run, 0 without one), their share, mean prompt and
output tokens and p99 TPOT (s). It shows a policy's *size mix*: a scheduler that prices each
request by its own energy can sort requests by size across datacenters, which changes the work
(and so the TPOT) a datacenter carries at the same request count (RESULTS.md, "The MILP's gap to
the SLO-true bound at high load").

    python -m eval.request_mix results/selection/headline-train-mix/headline --top 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

import numpy as np

__all__ = ["request_mix", "main"]


def request_mix(matrix_dir: str) -> Any:
    """A table (pandas DataFrame): ``run_id``, ``datacenter``, ``requests``, ``share``,
    ``prompt_tokens_mean``, ``output_tokens_mean``, ``tpot_p99_s``, one row per (run, datacenter
    that served requests), runs in ``config.json`` order. A :class:`ConfigError` (field ``dir``)
    when the matrix has no per-request records."""
    import pandas as pd

    from carbon_gym.errors import ConfigError

    conf = os.path.join(matrix_dir, "config.json")
    if not os.path.isfile(conf):
        raise ConfigError("dir", f"{conf!r} not found (a finished matrix of carbon-gym experiment or eval)")
    with open(conf, encoding="utf-8") as fh:
        metas = json.load(fh).get("runs", [])
    rows = []
    for m in metas:
        path = os.path.join(matrix_dir, "requests", f"{m['run_id']}.parquet")
        if not os.path.isfile(path):
            continue
        r = pd.read_parquet(path, columns=["datacenter", "arrival_s", "prompt_tokens", "output_tokens", "tpot_s"])
        r = r[r["arrival_s"] >= float((m.get("overrides") or {}).get("env.warmup_s", 0.0))]
        n = len(r)
        for dc, g in r.groupby("datacenter", sort=True):
            tpot = g["tpot_s"].to_numpy(np.float64)
            tpot = tpot[np.isfinite(tpot)]
            rows.append({"run_id": m["run_id"], "datacenter": int(dc), "requests": int(len(g)), "share": len(g) / max(n, 1),
                         "prompt_tokens_mean": float(g["prompt_tokens"].mean()), "output_tokens_mean": float(g["output_tokens"].mean()),
                         "tpot_p99_s": float(np.percentile(tpot, 99)) if tpot.size else float("nan")})
    if not rows:
        raise ConfigError("dir", f"no per-request records under {os.path.join(matrix_dir, 'requests')!r} (run the matrix "
                                 "without --no-requests)")
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.request_mix", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="a finished matrix with per-request records")
    ap.add_argument("--top", type=int, default=8, help="datacenters shown per run, the busiest first (default 8)")
    a = ap.parse_args(argv)
    from carbon_gym.errors import ConfigError

    try:
        t = request_mix(a.dir)
    except ConfigError as exc:
        print(f"python -m eval.request_mix: error: {exc}", file=sys.stderr)
        return 2
    for rid, g in t.groupby("run_id", sort=False):
        g = g.sort_values("requests", ascending=False).head(max(1, a.top))
        print(f"{rid}: datacenter requests share prompt_mean output_mean tpot_p99_ms")
        for r in g.itertuples(index=False):
            print(f"  {r.datacenter:3d} {r.requests:8d} {r.share:6.3f} {r.prompt_tokens_mean:8.1f} {r.output_tokens_mean:7.1f} "
                  f"{1e3 * r.tpot_p99_s:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
