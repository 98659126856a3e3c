"""Experiment ``learned-capacity`` (k): a learned agent that decides capacity (issue 24, items 1-2)
against the facility MILP deciding capacity and its look-ahead baseline ``milp-mpc``.

On one scenario (default ``llama8b-moderate``) and :data:`STARTS` fresh held-out 2023 days
(:func:`eval.heldout_seeds.fresh_heldout_seeds`: none seen in training, selection or an earlier
test), every run is a steady-state window (the ``full`` preset: :data:`WINDOW_S` after a
:data:`WARMUP_S` burn-in, the policy deciding capacity through the burn-in too):

- ``rr (always on)``: round-robin, every engine awake (``capacity.control = "always_on"``), the
  reference of the reductions;
- with ``capacity.control = "agent"``: ``rr+reactive`` (the fair reference that also powers
  down), ``milp`` (one-period capacity stage), ``milp-mpc`` (a one-hour receding-horizon plan with
  load and carbon forecasts) and the learned policy (default :data:`DEFAULT_LEARNED`: its
  per-datacenter head picks the powered servers every ``capacity.period_s``).

Outputs under ``--out``: ``learned-capacity.csv`` (per policy, :func:`eval.capacity_report.
capacity_table`), ``learned-capacity-vs.csv`` (the agent against each look-ahead-free and
look-ahead expert: share of its reduction, paired violation difference, starts where the agent
emits less and by how much) and ``learned-capacity.md``; ``figures/capacity_decisions`` (PNG,
PDF): on the start where the agent gains most on the MILP, the load, the servers each policy
keeps powered and the grid intensity those servers see, over the episode;
``figures/capacity_decisions_worst``: the same on the start where it loses most.

The policies' runs can come from several matrices (e.g. the references first, the agent once
trained): :func:`learned_capacity_section` merges ``<results>/learned-capacity`` and every
``<results>/learned-capacity-*/learned-capacity`` (a later run of the same policy and seed
replaces an earlier one).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from eval.capacity_report import ALWAYS_ON_LABEL, OVERRIDE_CONTROL, capacity_markdown, capacity_table, merged_runs
from eval.runner import RunSpec, always_on_overrides, make_specs, window_of, window_overrides
from eval.stats import mean_ci95
from eval.tables import fmt_spec_ci
from eval.writers import matrix_dirs, read_configs

__all__ = ["DEFAULT_LEARNED", "DEFAULT_SCENARIO", "STARTS", "WINDOW_S", "WARMUP_S", "learned_capacity_specs", "versus_table",
           "learned_capacity_markdown", "decisions_figure", "learned_capacity_experiment", "learned_capacity_dirs",
           "learned_capacity_section"]

NAME = "learned-capacity"
#: The capacity-aware agent: the DAgger checkpoint of train/configs/llama8b_dagger_capacity.toml (PPO fine-tuning
#: did not improve it; train/RESULTS_TRAIN.md, "Capacity head: a finished run").
DEFAULT_LEARNED = "learned:train/checkpoints/llama8b_capacity_set.npz"
DEFAULT_SCENARIO = "llama8b-moderate"
#: The references run with ``capacity.control = "agent"`` besides the learned policy.
REFERENCES = ("rr+reactive", "milp", "milp-mpc")
#: Experts the agent is compared with (share of their reduction, paired violation difference).
EXPERTS = ("milp", "milp-mpc")
STARTS = 20
WINDOW_S, WARMUP_S = 600.0, 300.0
QUICK_WINDOW_S, QUICK_WARMUP_S = 20.0, 10.0


def learned_capacity_specs(scenario: str, policies: Sequence[str], seeds: Sequence[int], overrides: Mapping[str, Any],
                           policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> list[RunSpec]:
    """The always-on rr reference (when ``rr`` is in ``policies``), then every other policy with
    ``capacity.control = "agent"``, per seed; one scenario label, so the same requests and starts."""
    on, agent = always_on_overrides(overrides), {**overrides, OVERRIDE_CONTROL: "agent"}
    specs = [replace(s, label=ALWAYS_ON_LABEL) for s in make_specs([scenario], ["rr"], seeds, overrides=on)] if "rr" in policies else []
    others = [p for p in policies if p != "rr"]
    return specs + (make_specs([scenario], others, seeds, overrides=agent, policy_kwargs=policy_kwargs) if others else [])


def versus_table(runs: Any, learned: str, experts: Sequence[str] = EXPERTS) -> Any:
    """One row per expert in ``runs``: paired over the starts both ran, the expert's and the
    agent's reductions vs ``rr (always on)`` (mean, 95% CI), the agent's **share of the expert's
    reduction**, the violation difference agent - expert (pp, paired), the starts where the agent
    emits less and its mean gain there (pp of the always-on carbon), and both p99 pass counts."""
    import pandas as pd

    rows = []
    by = {p: g.set_index("seed") for p, g in runs.groupby("policy")}
    if learned not in by or ALWAYS_ON_LABEL not in by:
        return pd.DataFrame(rows)
    ref, lrn = by[ALWAYS_ON_LABEL], by[learned]
    for e in experts:
        if e not in by:
            continue
        ex = by[e]
        seeds = sorted(set(lrn.index) & set(ex.index) & set(ref.index))
        if not seeds:
            continue
        L, E = lrn.loc[seeds], ex.loc[seeds]
        c_ref = ref.loc[seeds, "carbon_g"].to_numpy(np.float64)
        red_l = 100 * (c_ref - L["carbon_g"].to_numpy(np.float64)) / c_ref
        red_e = 100 * (c_ref - E["carbon_g"].to_numpy(np.float64)) / c_ref
        v_l, v_e = L["slo_violation_pct"].to_numpy(np.float64), E["slo_violation_pct"].to_numpy(np.float64)
        p_l, p_e = L["mlperf_p99_pass"].to_numpy(np.float64), E["mlperf_p99_pass"].to_numpy(np.float64)
        ok_l, ok_e = L["run_valid"].to_numpy(np.float64), E["run_valid"].to_numpy(np.float64)
        (me, mec), (ml, mlc), (dv, dvc) = mean_ci95(red_e), mean_ci95(red_l), mean_ci95(v_l - v_e)
        gain = red_l - red_e
        better = gain > 0
        rows.append({"expert": e, "starts": len(seeds), "expert_reduction_pct": me, "expert_reduction_ci95": mec,
                     "learned_reduction_pct": ml, "learned_reduction_ci95": mlc,
                     "share_of_expert": ml / me if abs(me) > 1e-9 else float("nan"),
                     "expert_violation_pct": float(np.mean(v_e)), "learned_violation_pct": float(np.mean(v_l)),
                     "violation_diff_pp": dv, "violation_diff_ci95": dvc,
                     "learned_better_starts": int(better.sum()),
                     "mean_gain_where_better_pp": float(gain[better].mean()) if better.any() else float("nan"),
                     "best_gain_pp": float(gain.max()), "best_gain_seed": int(seeds[int(np.argmax(gain))]),
                     "worst_gain_pp": float(gain.min()), "worst_gain_seed": int(seeds[int(np.argmin(gain))]),
                     "expert_p99_pass": int(np.nansum(p_e)), "learned_p99_pass": int(np.nansum(p_l)),
                     "invalid_starts": int(np.sum((ok_l < 0.5) | (ok_e < 0.5)))})
    return pd.DataFrame(rows)


def learned_capacity_markdown(table: Any, vs: Any, head: str, learned: str) -> str:
    """The per-policy table (:func:`eval.capacity_report.capacity_markdown`) and the agent
    against each expert."""
    lines = [head, "", capacity_markdown(table)]
    if len(vs):
        lines += ["", f"`{learned}` against each expert (paired by start; reductions vs `{ALWAYS_ON_LABEL}`):", "",
                  "| expert | starts | expert vs always-on rr % (viol. %) | agent vs always-on rr % (viol. %) | share of the "
                  "expert's reduction | viol. agent - expert (pp) | starts agent < expert carbon (mean gain, pp) | best / worst "
                  "gain (pp, seed) | p99 pass expert / agent |", "|---|---|---|---|---|---|---|---|---|"]
        for _, r in vs.iterrows():
            n = int(r["starts"])
            bad = f" ({int(r['invalid_starts'])} start(s) with a run leaving > 1% unfinished: invalid)" if r["invalid_starts"] else ""
            gain = "" if not np.isfinite(r["mean_gain_where_better_pp"]) else f" ({r['mean_gain_where_better_pp']:.2f})"
            lines.append(
                f"| {r['expert']}{bad} | {n} | {fmt_spec_ci(r['expert_reduction_pct'], r['expert_reduction_ci95'])} ({r['expert_violation_pct']:.2f}) "
                f"| {fmt_spec_ci(r['learned_reduction_pct'], r['learned_reduction_ci95'])} ({r['learned_violation_pct']:.2f}) "
                f"| {100 * r['share_of_expert']:.0f}% | {fmt_spec_ci(r['violation_diff_pp'], r['violation_diff_ci95'], '+.2f')} "
                f"| {int(r['learned_better_starts'])}/{n}{gain} | {r['best_gain_pp']:+.2f} ({int(r['best_gain_seed'])}) / "
                f"{r['worst_gain_pp']:+.2f} ({int(r['worst_gain_seed'])}) "
                f"| {int(r['expert_p99_pass'])} / {int(r['learned_p99_pass'])} of {n} |")
    return "\n".join(lines) + "\n"


def _run_ids(dirs: Sequence[str], cfgs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], str]:
    """(policy label, seed) -> steps file stem, over ``dirs`` and their configs (a later
    directory's run wins)."""
    return {(r.get("label") or r["policy"], int(r["seed"])): os.path.join(d, "steps", r["run_id"])
            for d, c in zip(dirs, cfgs) for r in c.get("runs", [])}


def _has_steps(stem: str | None) -> bool:
    """Whether a run's steps file (stem, parquet or CSV) is on disk."""
    return stem is not None and (os.path.isfile(stem + ".parquet") or os.path.isfile(stem + ".csv"))


def decisions_figure(dirs: Sequence[str], seed: int, policies: Sequence[str], stem: str, *, title: str = "",
                     warmup_s: float = 0.0, smooth_s: float = 30.0,
                     cfgs: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """The capacity decisions of ``policies`` on start ``seed`` (their steps files under ``dirs``),
    over the episode (the ``warmup_s`` burn-in shaded): requests arriving per second (top; a
    ``smooth_s`` moving mean), servers powered in all
    (middle) and the grid intensity the powered servers see (bottom: the mean over datacenters
    weighted by servers on, gCO2eq/kWh; grey band: the cleanest and dirtiest datacenter). Returns
    the written paths (PNG, PDF). ``cfgs``: the directories' ``config.json`` when already read."""
    from eval.plots import _colors, _plt, save
    from eval.writers import read_table

    ids = _run_ids(dirs, read_configs(dirs) if cfgs is None else cfgs)
    if not any(_has_steps(ids.get((p, int(seed)))) for p in policies):
        return []  # (the steps files are not tracked: a clean checkout has the tables, not the episodes)
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(8.0, 7.5), sharex=True)
    colors = _colors(list(policies))
    band_done = False
    for p in policies:
        stem_p = ids.get((p, int(seed)))
        if stem_p is None or not _has_steps(stem_p):
            continue
        s = read_table(stem_p)
        t = np.asarray(s["time_s"], dtype=np.float64)
        D = sum(1 for c in s.columns if c.startswith("intensity_g_per_kwh_dc"))
        ci = np.column_stack([np.asarray(s[f"intensity_g_per_kwh_dc{d}"], dtype=np.float64) for d in range(D)])
        if not band_done:
            dt = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
            w = max(1, int(round(smooth_s / dt)))
            x = np.asarray(s["arrived"], dtype=np.float64) / dt
            rate = np.convolve(x, np.ones(w), mode="same") / np.convolve(np.ones_like(x), np.ones(w), mode="same")
            axes[0].plot(t, rate, color="0.3", lw=0.8)
            axes[2].fill_between(t, ci.min(axis=1), ci.max(axis=1), color="0.85", label="cleanest-dirtiest datacenter")
            band_done = True
        if "servers_on_dc0" not in s.columns:  # an always-on run: every server on
            continue
        srv = np.column_stack([np.asarray(s[f"servers_on_dc{d}"], dtype=np.float64) for d in range(D)])
        tot = srv.sum(axis=1)
        axes[1].step(t, tot, where="post", color=colors[p], label=p)
        axes[2].plot(t, (srv * ci).sum(axis=1) / np.maximum(tot, 1.0), color=colors[p], label=p)
    for ax in axes if warmup_s > 0 else ():
        ax.axvspan(0.0, warmup_s, color="0.93", zorder=0)
    axes[0].set_ylabel(f"requests/s arriving\n({smooth_s:g} s mean)")
    axes[1].set_ylabel("servers powered")
    axes[2].set_ylabel("gCO2eq/kWh seen by\npowered servers")
    axes[2].set_xlabel("time in episode (s)")
    axes[1].legend(fontsize=7, loc="best")
    axes[2].legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save(fig, stem)


def _head(scenario: str, overrides: Mapping[str, Any], seeds: Sequence[int]) -> str:
    warm, window = window_of(overrides)
    return (f"{scenario}: {warm:g} s burn-in, then {window:g} s measured (steady-state window, no drain); {len(seeds)} fresh "
            f"held-out starts (seeds {', '.join(map(str, seeds))}). `{ALWAYS_ON_LABEL}`: capacity.control = always_on; "
            "every other row: capacity.control = agent (the policy decides the servers powered and engines awake).")


def _tables(runs: Any) -> tuple[Any, Any, str | None]:
    table = capacity_table(runs)
    learned = next((p for p in dict.fromkeys(runs["policy"]) if str(p).startswith("learned")), None)
    vs = versus_table(runs, learned) if learned else table.iloc[0:0]
    return table, vs, learned


def learned_capacity_experiment(ctx: Any) -> str:
    """Run the experiment with ``ctx`` (:class:`eval.experiments.Ctx`; module docstring); the
    quick preset runs one start of a 20 s window (CI); ``--seeds N`` runs the first N fresh
    held-out starts. ``--policies`` runs a subset (rr: the
    always-on reference) whose table :func:`learned_capacity_section` merges with other matrices."""
    quick = ctx.preset_name == "quick"
    scenario = (ctx.scenarios or [DEFAULT_SCENARIO])[0]
    if ctx.scenarios and len(ctx.scenarios) > 1:
        from carbon_gym.errors import ConfigError

        raise ConfigError("--scenarios", f"experiment learned-capacity runs one scenario, got {ctx.scenarios}",
                          allowed="one scenario name or path")
    pols = list(ctx.policies or ["rr", *REFERENCES, DEFAULT_LEARNED])
    ov = dict(ctx.overrides)
    if not ctx.explicit_window:
        ov.update(window_overrides(QUICK_WINDOW_S, QUICK_WARMUP_S) if quick else window_overrides(WINDOW_S, WARMUP_S))
    from eval.heldout_seeds import fresh_heldout_seeds

    # as experiment generalise: --seeds N sets how many fresh held-out starts (a learned agent is
    # never judged on a day it trained on), not which
    seeds = fresh_heldout_seeds(scenario, len(ctx.seeds) if ctx.explicit_seeds else (1 if quick else STARTS))
    ex = ctx.execute(learned_capacity_specs(scenario, pols, seeds, ov, ctx.policy_kwargs))
    table, vs, learned = _tables(ex.runs)
    table.to_csv(os.path.join(ctx.out, f"{NAME}.csv"), index=False)
    vs.to_csv(os.path.join(ctx.out, f"{NAME}-vs.csv"), index=False)
    md = learned_capacity_markdown(table, vs, _head(scenario, ov, seeds), learned or "learned")
    ctx.write_text(f"{NAME}.md", md)
    if ctx.plots and learned and len(vs):
        _figure([ctx.out], vs, learned, ctx.fig_dir, window_of(ov)[0])
    return md


def _figure(dirs: Sequence[str], vs: Any, learned: str, fig_dir: str, warmup_s: float,
            cfgs: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """``capacity_decisions``: the start where the agent gains most on the MILP;
    ``capacity_decisions_worst``: where it loses most."""
    row = vs[vs["expert"] == "milp"]
    row = row.iloc[0] if len(row) else vs.iloc[0]
    pols = ["rr+reactive", *EXPERTS, learned]
    paths = []
    for stem, seed, gain, what in (("capacity_decisions", int(row["best_gain_seed"]), row["best_gain_pp"], "largest gain"),
                                   ("capacity_decisions_worst", int(row["worst_gain_seed"]), row["worst_gain_pp"], "largest loss")):
        title = (f"start {seed}: the agent's {what} against {row['expert']} ({gain:+.2f} pp of the always-on carbon); "
                 f"shaded: the {warmup_s:g} s burn-in")
        paths += decisions_figure(dirs, seed, pols, os.path.join(fig_dir, stem), title=title, warmup_s=warmup_s, cfgs=cfgs)
    return paths


def learned_capacity_dirs(results_dir: str) -> list[str]:
    """The matrices of this experiment under ``results_dir``: ``learned-capacity/`` first, then
    every ``learned-capacity-*/learned-capacity/`` in name order."""
    return matrix_dirs(results_dir, NAME)


def learned_capacity_section(results_dir: str, fig_dir: str | None = None) -> tuple[str, list[str]]:
    """The merged Markdown (commands, window, starts, wall and CPU time, both tables) of every
    matrix of this experiment under ``results_dir``, and the decisions figure's paths (written
    under ``fig_dir``, default ``<results_dir>/learned-capacity/figures``)."""
    dirs = learned_capacity_dirs(results_dir)
    if not dirs:
        raise FileNotFoundError(f"no {NAME} results under {results_dir!r} (carbon-gym experiment {NAME} --out {results_dir})")
    cfgs = read_configs(dirs)
    runs = merged_runs(dirs)
    table, vs, learned = _tables(runs)
    meta = [r for c in cfgs for r in c.get("runs", [])]
    scen = str(runs["scenario"].iloc[0])
    ov = meta[0].get("overrides", {}) if meta else {}
    seeds = sorted({int(s) for s in runs["seed"]})
    lines = ["```bash", *[str(c.get("command") or f"carbon-gym experiment {NAME}") for c in cfgs], "```", ""]
    warm, window = window_of(ov)
    lines.append(f"- measurement window: {window:g} s")
    lines.append(f"- starts: {len(seeds)}")
    for d, c in zip(dirs, cfgs):
        if "elapsed_s" in c:
            lines.append(f"- wall time ({os.path.relpath(d, results_dir)}): {c['elapsed_s'] / 60:.1f} min for "
                         f"{len(c.get('runs', []))} runs on {c.get('workers')} worker process(es), {c.get('cpu_count')} CPU cores; git "
                         f"{c.get('versions', {}).get('git', '?')}")
    lines.append(f"- CPU time of the runs shown: {runs['cpu_s'].sum() / 60:.1f} min\n")
    lines.append(learned_capacity_markdown(table, vs, _head(scen, ov, seeds), learned or "learned"))
    paths = _figure(dirs, vs, learned, fig_dir or os.path.join(dirs[0], "figures"), warm, cfgs) if learned and len(vs) else []
    return "\n".join(lines), paths
