"""``python -m eval.dc_carbon MATRIX_DIR --scenario S --seed N``: where each policy's carbon went.

For one start of a finished matrix (its per-step files, ``steps/*.parquet``), one row per
datacenter, greenest first (mean intensity over the measured window): the grams each policy's
run emitted there in the window, and the *active* grams, those above the datacenter's floor
(every GPU at idle power and every node at host power, times PUE and the step's intensity: what
the datacenter emits serving nothing, always on). A datacenter a policy leaves empty shows ~0
active grams; one that serves any load shows nearly its full active grams, since an engine with
any batch draws nearly its full power (``--probe`` prints a datacenter's measured active power
per engine at each rate of its SLO probe, :func:`carbon_gym.capacity.measure_datacenter_capacity`;
``--bound`` the start's SLO-true bound with and without its window-end allowance).
It locates the gap between a run and the SLO-true bound (RESULTS.md, "The MILP's gap to the
SLO-true bound at high load").

    python -m eval.dc_carbon results/slo/greedy-op-mixtral/headline --scenario mixtral8x7b-high --seed 2 --probe
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

import numpy as np

__all__ = ["dc_carbon", "probe_power", "window_allowance", "main"]


def _specs(matrix_dir: str, scenario: str, seed: int) -> dict[str, Any]:
    """The matrix's run specs of (``scenario``, ``seed``) by run id; a :class:`ConfigError` (field
    ``scenario``) when it has none."""
    from carbon_gym.errors import ConfigError
    from eval.bound import matrix_specs

    specs = {k: s for k, s in matrix_specs(matrix_dir).items() if s.scenario == scenario and int(s.seed) == int(seed)}
    if not specs:
        raise ConfigError("scenario", f"no run of {scenario!r} with seed {seed} in {matrix_dir!r}")
    return specs


def _parts(spec: Any) -> tuple[Any, Any]:
    """(scenario, built parts) of a run spec (its overrides and episode start applied)."""
    import warnings

    from carbon_gym.world import build_parts
    from eval.runner import resolve_run_scenario

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scenario, _ = resolve_run_scenario(spec)
    return scenario, build_parts(scenario)


def dc_carbon(matrix_dir: str, scenario: str, seed: int) -> Any:
    """A table (pandas DataFrame), one row per datacenter, greenest first: ``datacenter``,
    ``intensity_g_per_kwh`` (window mean), ``floor_g`` and, per policy P with a run of
    (``scenario``, ``seed``) in the matrix, ``P_g`` and ``P_active_g`` (grams above the floor), in
    the run's measured window (``window_start_s`` of ``runs.csv``). A :class:`ConfigError` (field
    ``scenario`` / ``seed``) when the matrix has no such run."""
    import pandas as pd

    from carbon_gym.errors import ConfigError
    from eval.bound import floor_power_w
    from eval.runner import policy_label

    specs = _specs(matrix_dir, scenario, seed)
    runs = pd.read_csv(os.path.join(matrix_dir, "runs.csv"))
    sc, parts = _parts(next(iter(specs.values())))  # (every policy of a start runs the same episode)
    floor_w, poll = floor_power_w(parts), float(sc.polling_period_s)
    out: pd.DataFrame | None = None
    for run_id, spec in specs.items():
        label = spec.label or policy_label(spec.policy)
        path = os.path.join(matrix_dir, "steps", f"{run_id}.parquet")
        if not os.path.isfile(path):
            raise ConfigError("seed", f"{path!r} not found (per-step files are written by every matrix)")
        row = runs[(runs["scenario"] == scenario) & (runs["seed"] == int(seed)) & (runs["policy"] == label)]
        t0 = float(row["window_start_s"].iloc[0]) if len(row) and np.isfinite(row["window_start_s"].iloc[0]) else 0.0
        st = pd.read_parquet(path)
        st = st[st["time_s"] > t0 + 1e-9]
        n_d = sum(1 for c in st.columns if c.startswith("carbon_g_dc"))
        inten = np.stack([st[f"intensity_g_per_kwh_dc{d}"].to_numpy(np.float64) for d in range(n_d)])
        if out is None:
            out = pd.DataFrame({"datacenter": np.arange(n_d), "intensity_g_per_kwh": inten.mean(axis=1),
                                "floor_g": floor_w * inten.sum(axis=1) * poll / 3.6e6})
        g = np.array([st[f"carbon_g_dc{d}"].sum() for d in range(n_d)])
        out[f"{label}_g"] = g
        out[f"{label}_active_g"] = g - out["floor_g"].to_numpy()
    assert out is not None
    return out.sort_values("intensity_g_per_kwh", kind="stable").reset_index(drop=True)


def window_allowance(matrix_dir: str, scenario: str, seed: int) -> dict[str, float]:
    """The start's SLO-true bound (:mod:`eval.bound_slo`) as the matrix computes it, with the
    window-end allowance (``backlog_end``: the most requests any of its runs left in flight at the
    window's end, which the bound lets drop out entirely), and without it (``backlog_end`` 0);
    grams, and the allowance in requests. Takes tens of seconds (a probe per datacenter type)."""
    import pandas as pd

    from eval.bound import bound_for_spec, largest_backlog_end

    spec = next(iter(_specs(matrix_dir, scenario, seed).values()))
    runs = pd.read_csv(os.path.join(matrix_dir, "runs.csv"))
    end = largest_backlog_end(runs[(runs["scenario"] == scenario) & (runs["seed"] == int(seed))])
    with_end = bound_for_spec(spec, backlog_end=end)
    without = bound_for_spec(spec, backlog_end=0)
    return {"backlog_end": float(end), "slo_bound_g": float(with_end.slo_carbon_g), "slo_bound_no_allowance_g": float(without.slo_carbon_g),
            "floor_g": float(with_end.floor_g)}


def probe_power(matrix_dir: str, scenario: str, seed: int) -> Any:
    """The SLO probe of the scenario's first datacenter (the operating point the SLO-true bound
    uses, :func:`eval.bound_slo.slo_operating_point`, measured here): per probe rate (requests/s
    per engine), p99 TTFT / TPOT (s), within p99, active J per request and active W per engine
    (rate x J). Takes tens of seconds."""
    import pandas as pd

    from eval.bound_slo import measured_capacity

    sc, parts = _parts(next(iter(_specs(matrix_dir, scenario, seed).values())))
    n = max(1, parts.topology.datacenters[0].engines(parts.engine.tp))
    res = measured_capacity(sc, str(parts.topology.datacenter_gpu(0)), n)
    return pd.DataFrame([{"rate_per_engine_per_s": p.rate_per_s, "p99_ttft_s": p.p99_ttft_s, "p99_tpot_s": p.p99_tpot_s,
                          "within_p99": p.ok, "active_j_per_request": p.active_j_per_request,
                          "active_w_per_engine": p.rate_per_s * p.active_j_per_request} for p in res.probes])


def main(argv: Sequence[str] | None = None) -> int:
    """Print :func:`dc_carbon` (and with ``--probe`` :func:`probe_power`) as Markdown."""
    from carbon_gym.errors import ConfigError

    ap = argparse.ArgumentParser(prog="python -m eval.dc_carbon", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="a finished matrix directory (e.g. results/slo/greedy-op-mixtral/headline)")
    ap.add_argument("--scenario", required=True, help="scenario name, e.g. mixtral8x7b-high")
    ap.add_argument("--seed", type=int, required=True, help="the start's seed")
    ap.add_argument("--probe", action="store_true", help="also measure and print the datacenter's SLO probe")
    ap.add_argument("--bound", action="store_true", help="also print the start's SLO-true bound with and without "
                    "its window-end allowance")
    args = ap.parse_args(argv)
    from eval.tables import frame_markdown

    def show(df: Any, fmt: str) -> str:
        return frame_markdown(df.apply(lambda col: [x if isinstance(x, (bool, np.bool_, str)) else format(x, fmt) for x in col]))

    try:
        print(show(dc_carbon(args.dir, args.scenario, args.seed), ".0f"))
        if args.probe:
            print(show(probe_power(args.dir, args.scenario, args.seed), ".4g"))
        if args.bound:
            w = window_allowance(args.dir, args.scenario, args.seed)
            print(f"SLO-true bound: {w['slo_bound_g']:.1f} g with the window-end allowance ({w['backlog_end']:.0f} requests "
                  f"may drop out), {w['slo_bound_no_allowance_g']:.1f} g without it; floor {w['floor_g']:.1f} g")
    except ConfigError as exc:
        print(f"python -m eval.dc_carbon: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
