"""Figures shared by ``carbon-gym eval`` and the experiments: latency CDFs, load by hour of day and
carbon over time of one scenario of a finished matrix (``eval.experiments.Executed``)."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from eval import writers


def _meta(ex: Any, scenario: str) -> dict[str, Any]:
    for r in ex.results:
        if r.spec.scenario_name == scenario:
            return r.meta
    return {}


def _load(ex: Any, spec: Any, kind: str):
    path = ex.paths.get(spec.run_id, {}).get(kind)
    if path is None:
        return None
    return writers.read_table(path)


TIME_PLOT_POLICIES = ("rr", "greedy", "planner", "ilp-state", "milp", "clairvoyant")


def standard_figures(ex: Any, scenario: str, fig_dir: str, *, tag: str, policies: Sequence[str] | None = None, seed: int | None = None) -> dict[str, list[str]]:
    """Latency CDFs, load by hour of day and carbon over time (one seed) for one scenario.

    The carbon-over-time panels show at most the policies in :data:`TIME_PLOT_POLICIES` (when
    more than four ran) to stay readable."""
    from eval import plots

    meta = _meta(ex, scenario)
    dc_names = list(meta.get("datacenters", []))
    results = [r for r in ex.results if r.spec.scenario_name == scenario and (policies is None or r.spec.policy_name in policies)]
    if not results:
        return {}
    figs: dict[str, list[str]] = {}
    by_pol_req: dict[str, list] = {}
    pooled: dict[str, Any] = {}
    import pandas as pd

    for r in results:
        frame = _load(ex, r.spec, "requests")
        if frame is None:
            continue
        frame = _figure_sample(frame[["arrival_s", "datacenter", "ttft_s", "tpot_s", "output_tokens"]], r.spec.seed)
        by_pol_req.setdefault(r.spec.policy_name, []).append((frame[["arrival_s", "datacenter"]], r.meta.get("start_offset_s", 0.0)))
        pooled.setdefault(r.spec.policy_name, []).append(frame[["ttft_s", "tpot_s", "output_tokens"]])
    if pooled:
        pooled_df = {k: pd.concat(v, ignore_index=True) for k, v in pooled.items()}
        figs["latency_cdf"] = plots.latency_cdfs(
            pooled_df, os.path.join(fig_dir, f"{tag}_latency_cdf"),
            ttft_target_s=meta.get("ttft_target_s"), tpot_target_s=meta.get("tpot_target_s"),
            title=f"{scenario}: latency CDFs (seeds pooled)",
        )
    if by_pol_req and dc_names:
        figs["load_by_hour"] = plots.load_by_hour(by_pol_req, dc_names, os.path.join(fig_dir, f"{tag}_load_by_hour"), title=f"{scenario}: share of requests per datacenter by hour of day")
    seed = min(r.spec.seed for r in results) if seed is None else seed
    steps = {r.spec.policy_name: r.steps for r in results if r.spec.seed == seed and r.steps}
    if len(steps) > 4:
        steps = {k: v for k, v in steps.items() if k in TIME_PLOT_POLICIES} or steps
    if steps and dc_names:
        figs["carbon_over_time"] = plots.carbon_over_time(
            steps, dc_names, os.path.join(fig_dir, f"{tag}_carbon_over_time_seed{seed}"),
            title=f"{scenario}, seed {seed}: carbon per datacenter (lines) and grid intensity (shaded)",
            arrivals_end_s=meta.get("duration_s"),
        )
    return figs


#: At most this many request records per run go into the per-request figures (a uniform sample
#: without replacement, seeded by the run's seed): the CDFs and load shares of 200k requests per run
#: are as smooth as of all of them, and pooling every record of a long matrix (10 M in the
#: headline) does not fit in memory.
FIGURE_SAMPLE_PER_RUN = 200_000


def _figure_sample(frame: Any, seed: int) -> Any:
    """``frame`` itself if it has at most :data:`FIGURE_SAMPLE_PER_RUN` rows, else a uniform
    sample of that many rows (in their original order; deterministic in ``seed``)."""
    n = len(frame)
    if n <= FIGURE_SAMPLE_PER_RUN:
        return frame
    keep = np.sort(np.random.default_rng(seed).choice(n, FIGURE_SAMPLE_PER_RUN, replace=False))
    return frame.iloc[keep].reset_index(drop=True)
