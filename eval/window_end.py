"""What a measurement window carries out and in, from a matrix run with per-request records.

    python -m eval.window_end MATRIX_DIR

The bound of a window (:mod:`eval.bound`, :mod:`eval.bound_slo`) lets the largest ``backlog_end``
window arrivals go undone (the window-end allowance: it cannot know which were in flight; runs
that record ``left_*`` narrow it to the unplaced whole and the placed by their work not
computed), and does not credit the work on requests that arrived before the window and were
finished in it, which the run's window carbon includes. For each run of ``MATRIX_DIR`` that kept
its requests (``requests/<scenario>__<policy>__seed<k>.parquet``: a matrix run without
``--no-requests``),
this prints, in the bound's unit of work (engine-seconds at the most efficient batch,
:func:`eval.bound._engine_seconds`, of the first datacenter's GPU) and as shares of the work of
the window's arrivals:

- ``largest_n``: the largest ``backlog_end`` window arrivals, what the allowance may leave undone;
- ``in_flight``: the window arrivals actually unfinished at its end (their whole work; they had
  done part of it), with their ages at the end (s: median, 99th percentile, largest);
- ``carry_in``: the requests arriving before the window and finished in it (their whole work; the
  part done in the window is less), and ``carry_in_full``: those of them whose first token came
  inside the window, whose decode was done in it entirely (a credit a bound could take).
"""

from __future__ import annotations

import argparse
import glob
import os
from typing import Any, Sequence

import numpy as np


def window_end_shares(arrival_s: np.ndarray, work: np.ndarray, decode_work: np.ndarray, done_index: np.ndarray,
                      done_s: np.ndarray, first_token_s: np.ndarray, window: tuple[float, float], backlog_end: int) -> dict[str, float]:
    """The figures of the module docstring for one run: ``arrival_s`` / ``work`` /
    ``decode_work`` per request of the episode's workload (in arrival order), ``done_index`` the
    indices of the completed requests with their ``done_s`` and ``first_token_s``, ``window`` =
    (start, end) in s, ``backlog_end`` the run's count left at the end."""
    w0, w1 = window
    n = len(arrival_s)
    done = np.zeros(n, dtype=bool)
    end = np.full(n, np.inf)
    first = np.full(n, np.inf)
    done[done_index] = True
    end[done_index] = done_s
    first[done_index] = first_token_s
    inside = (arrival_s >= w0) & (arrival_s < w1)
    fly = inside & ~done  # (a run's records are the requests it completed; done_s may include the reply's trip)
    carry = (arrival_s < w0) & done & (end > w0)
    full = carry & (first >= w0)
    total = float(work[inside].sum())
    k = max(0, min(int(backlog_end), int(inside.sum())))
    largest = float(np.sort(work[inside])[::-1][:k].sum())
    ages = w1 - arrival_s[fly]
    q = np.quantile(ages, [0.5, 0.99, 1.0]) if ages.size else np.full(3, np.nan)
    return {"window_arrivals": int(inside.sum()), "backlog_end": int(backlog_end), "in_flight": int(fly.sum()),
            "largest_n_share": largest / total, "in_flight_share": float(work[fly].sum()) / total,
            "in_flight_age_p50_s": float(q[0]), "in_flight_age_p99_s": float(q[1]), "in_flight_age_max_s": float(q[2]),
            "carry_in": int(carry.sum()), "carry_in_share": float(work[carry].sum()) / total,
            "carry_in_full": int(full.sum()), "carry_in_full_decode_share": float(decode_work[full].sum()) / total}


def matrix_window_ends(matrix_dir: str) -> list[dict[str, Any]]:
    """:func:`window_end_shares` of every run of ``matrix_dir`` with a requests file and a window."""
    import pandas as pd

    from carbon_gym.world import build_parts, build_workload
    from eval.bound import _engine_seconds, iteration_k_max, matrix_specs
    from eval.runner import resolve_run_scenario

    runs = pd.read_csv(os.path.join(matrix_dir, "runs.csv"))
    specs = {(sp.scenario_label or sp.scenario_name, sp.label or sp.policy, int(sp.seed)): sp for sp in matrix_specs(matrix_dir).values()}
    out = []
    for r in runs.itertuples(index=False):
        files = glob.glob(os.path.join(matrix_dir, "requests", f"{r.scenario}__{r.policy}__seed{int(r.seed)}.*"))
        sp = specs.get((str(r.scenario), str(r.policy), int(r.seed)))
        if not files or sp is None or not np.isfinite(getattr(r, "window_s", np.nan)):
            continue
        sc = resolve_run_scenario(sp)[0]
        parts = build_parts(sc)
        batch = build_workload(sc, int(sp.seed)).arrivals_between(0.0, float(sc.duration_s))
        p = np.asarray(batch.prompt_tokens, dtype=np.float64)
        o = np.asarray(batch.output_tokens, dtype=np.float64)
        eng = parts.engine
        k_max = iteration_k_max(sc, eng, p)
        lat = parts.datacenter_gpus()[0].latency
        work = _engine_seconds(lat, eng, p, o, k_max)[0]
        decode_work = work - _engine_seconds(lat, eng, p, np.minimum(o, 1.0), k_max)[0]
        req = pd.read_parquet(files[0]) if files[0].endswith(".parquet") else pd.read_csv(files[0])
        w0 = float(r.window_start_s)
        res = window_end_shares(np.asarray(batch.arrival_s, dtype=np.float64), work, decode_work, req["request_id"].to_numpy(),
                                req["done_s"].to_numpy(float), req["first_token_s"].to_numpy(float), (w0, w0 + float(r.window_s)),
                                int(r.backlog_end))
        out.append({"scenario": r.scenario, "policy": r.policy, "seed": int(r.seed), **res})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print one line per run (module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m eval.window_end", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("matrix_dir")
    a = ap.parse_args(argv)
    rows = matrix_window_ends(a.matrix_dir)
    if not rows:
        raise SystemExit(f"{a.matrix_dir}: no run with a requests file and a measurement window (run the matrix without --no-requests)")
    for x in rows:
        print(f"{x['scenario']} {x['policy']} seed {x['seed']}: {x['window_arrivals']} window arrivals; backlog_end "
              f"{x['backlog_end']}: largest_n {100 * x['largest_n_share']:.1f}% of the window's work; in_flight {x['in_flight']} "
              f"({100 * x['in_flight_share']:.1f}%, ages p50 / p99 / max {x['in_flight_age_p50_s']:.1f} / "
              f"{x['in_flight_age_p99_s']:.1f} / {x['in_flight_age_max_s']:.1f} s); carry_in {x['carry_in']} "
              f"({100 * x['carry_in_share']:.1f}%), of which {x['carry_in_full']} decoded wholly in the window "
              f"({100 * x['carry_in_full_decode_share']:.2f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
