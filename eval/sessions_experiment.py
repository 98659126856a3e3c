"""Experiment ``sessions``: multi-turn sessions with prefix caching, where carbon-aware routing
meets cache affinity (issue 23).

Runs, on the study topology (16 datacenters) with ``engine.prefix_caching = true`` and the
cache-aware intra-datacenter dispatcher (``engine.dispatcher = "cache_aware"``) for every row,
so that rows differ only in the routing across datacenters:

* affinity-blind: round-robin (``rr``, the reference), the facility MILP and the planner with
  ``cache_aware = False`` (every request costed with its whole prompt: ``milp (blind)``,
  ``planner (blind)``);
* sticky: ``sticky`` (a session's turn to its previous turn's datacenter while allowed, else
  least-loaded);
* cache-aware carbon routing: ``milp`` and ``planner`` with the cached-prefix-adjusted prefill
  time, energy and TTFT (their defaults);
* the carbon-vs-affinity frontier: the cache-aware MILP over its affinity knob
  ``affinity_g_per_ktok`` (:data:`FRONTIER_AFFINITY`, grams per 1,000 re-prefilled cached tokens).

The learned agent does not apply: the shipped checkpoint was trained on the observation without
the ``cached_prefix`` columns a prefix workload adds (its fingerprint refuses this env).

Scenarios: the Mooncake conversation-trace replay (``llama8b-mooncake-low`` and the same at
moderate load) and the synthetic sessions fitted to it (``llama8b-sessions-low`` /
``-moderate``). Episodes are steady-state windows (a burn-in fills the caches: sessions' later
turns arrive minutes after their first): :data:`FULL_WINDOW_S` after :data:`FULL_WARMUP_S`;
two starts (:data:`FULL_SEEDS`); under ``--preset quick`` a tiny smoke run (one scenario, :data:`QUICK_WINDOW_S` after
:data:`QUICK_WARMUP_S`, two frontier points), for CI.

Writes ``sessions.csv`` (one row per scenario x policy: means over seeds), ``sessions_frontier.csv``
and ``sessions.md`` under ``--out``. Metric definitions: :mod:`carbon_gym.sessions_state`.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from eval.runner import RunSpec, freeze, window_of, window_overrides

__all__ = ["sessions_experiment", "sessions_specs", "sessions_table", "frontier_table", "SESSION_SCENARIOS",
           "FRONTIER_AFFINITY"]

#: Scenario label -> (shipped scenario, extra overrides).
SESSION_SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama8b-mooncake-low": ("llama8b-mooncake-low", {}),
    "llama8b-mooncake-moderate": ("llama8b-mooncake-low", {"workload.load": "moderate"}),
    "llama8b-sessions-low": ("llama8b-sessions-low", {}),
    "llama8b-sessions-moderate": ("llama8b-sessions-moderate", {}),
}
#: Every row: prefix caching on, cache-aware dispatch inside each datacenter.
CACHE_OVERRIDES: dict[str, Any] = {"engine.prefix_caching": True, "engine.dispatcher": "cache_aware"}
#: (label, registered policy, policy kwargs), in table order; ``rr`` first (the reference).
SESSION_POLICIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("rr", "rr", {}),
    ("milp (blind)", "milp", {"cache_aware": False}),
    ("planner (blind)", "planner", {"cache_aware": False}),
    ("sticky", "sticky", {}),
    ("planner", "planner", {}),
    ("milp", "milp", {}),
)
#: The MILP's affinity knob values of the frontier, grams CO2eq per 1,000 re-prefilled cached tokens.
FRONTIER_AFFINITY: tuple[float, ...] = (0.0, 0.003, 0.01, 0.03, 0.1, 1.0)
FULL_WINDOW_S, FULL_WARMUP_S = 300.0, 240.0
QUICK_WINDOW_S, QUICK_WARMUP_S = 20.0, 20.0
QUICK_SCENARIOS = ("llama8b-sessions-low",)
#: Episode starts (seeds) unless ``--seeds`` / ``--seed-list``: the full run is sized for ~15-20
#: CPU-minutes on a 2-core machine (68 runs; a MILP run of a moderate scenario ~21 CPU-s, rr ~5).
QUICK_SEEDS, FULL_SEEDS = (0,), (0, 1)
FULL_SCENARIOS = tuple(SESSION_SCENARIOS)
#: The scenarios whose frontier the full run traces (the quick one: its single scenario).
FULL_FRONTIER_SCENARIOS = ("llama8b-mooncake-moderate", "llama8b-sessions-moderate")


def _affinity_label(a: float) -> str:
    return f"milp (affinity={a:g})"


def sessions_specs(scenarios: Sequence[str], seeds: Sequence[int], overrides: Mapping[str, Any], *,
                   frontier_scenarios: Sequence[str] = (), affinity: Sequence[float] = FRONTIER_AFFINITY,
                   policies: Sequence[str] | None = None) -> list[RunSpec]:
    """The runs: every scenario x :data:`SESSION_POLICIES` (only the labels in ``policies`` when
    given; rr always) x seeds, plus the MILP at each ``affinity`` (other than 0, which is the
    ``milp`` row) on ``frontier_scenarios``. Scenario labels are :data:`SESSION_SCENARIOS` keys
    (or shipped scenario names, run as they are)."""
    specs: list[RunSpec] = []
    rows = [r for r in SESSION_POLICIES if policies is None or r[0] in policies or r[0] == "rr"]
    for label in scenarios:
        scen, extra = SESSION_SCENARIOS.get(label, (label, {}))
        ov = dict(CACHE_OVERRIDES)
        ov.update(extra)
        ov.update(overrides)
        todo = [(name, pol, kw) for name, pol, kw in rows]
        if label in frontier_scenarios:
            todo += [(_affinity_label(a), "milp", {"affinity_g_per_ktok": float(a)}) for a in affinity if a > 0]
        for name, pol, kw in todo:
            for k in seeds:
                specs.append(RunSpec(scenario=scen, policy=pol, seed=int(k), overrides=freeze(ov), policy_kwargs=freeze(kw),
                                     label=name if name != pol else "", scenario_label=label if label != scen else "",
                                     start_key=label))
    return specs


#: (column, runs-table metric) of the experiment's table, means over seeds.
TABLE_COLUMNS = (
    ("carbon_g", "carbon_g"), ("reduction_vs_rr_pct", "reduction_vs_rr_pct"), ("ttft_p99_s", "ttft_p99_s"),
    ("tpot_p99_s", "tpot_p99_s"), ("slo_violation_pct", "slo_violation_pct"), ("prefix_hit_rate", "prefix_hit_rate"),
    ("prefill_tokens_saved", "prefill_tokens_saved"), ("session_turns", "session_turns"), ("session_moves", "session_moves"),
    ("session_move_rate", "session_move_rate"), ("move_reprefill_tokens", "move_reprefill_tokens"),
    ("move_reprefill_carbon_g", "move_reprefill_carbon_g"), ("move_ttft_cost_s_mean", "move_ttft_cost_s_mean"),
    ("unfinished_pct", "unfinished_pct"),
)


def sessions_table(runs: Any) -> Any:
    """One row per (scenario, policy): the means over seeds of :data:`TABLE_COLUMNS` (pandas)."""
    import pandas as pd

    rows = []
    for (scen, pol), g in runs.groupby(["scenario", "policy"], sort=False):
        row: dict[str, Any] = {"scenario": scen, "policy": pol, "seeds": int(len(g))}
        for col, metric in TABLE_COLUMNS:
            row[col] = float(np.nanmean(g[metric].to_numpy(np.float64))) if metric in g and g[metric].notna().any() else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def frontier_table(table: Any) -> Any:
    """The carbon-vs-affinity frontier: the cache-aware MILP's rows (``milp`` = affinity 0 and
    ``milp (affinity=a)``) per scenario, sorted by affinity, with the affinity-blind MILP and
    sticky for reference."""
    import pandas as pd

    out = []
    for _, r in table.iterrows():
        pol = str(r["policy"])
        if pol == "milp":
            a = 0.0
        elif pol.startswith("milp (affinity="):
            a = float(pol.split("=", 1)[1].rstrip(")"))
        else:
            continue
        out.append({**r.to_dict(), "affinity_g_per_ktok": a})
    if not out:
        return pd.DataFrame()
    f = pd.DataFrame(out)
    f = f[f.groupby("scenario")["affinity_g_per_ktok"].transform("count") > 1]
    return f.sort_values(["scenario", "affinity_g_per_ktok"], kind="stable").reset_index(drop=True)


def _fmt(v: Any, fmt: str) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    return "n/a" if not np.isfinite(x) else format(x, fmt)


def sessions_markdown(table: Any, frontier: Any, head: str) -> str:
    """The experiment's Markdown: the main table, then the frontier."""
    lines = [head, "", "| scenario | policy | seeds | carbon (g) | vs rr % | TTFT p99 (ms) | TPOT p99 (ms) | SLO viol. % | "
             "hit rate % | turns | moves | move rate % | re-prefilled tokens | move carbon (g) | move TTFT (ms/move) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(
            f"| {r['scenario']} | {r['policy']} | {int(r['seeds'])} | {_fmt(r['carbon_g'], '.1f')} | "
            f"{_fmt(r['reduction_vs_rr_pct'], '+.1f')} | {_fmt(r['ttft_p99_s'] * 1e3, '.0f')} | "
            f"{_fmt(r['tpot_p99_s'] * 1e3, '.0f')} | {_fmt(r['slo_violation_pct'], '.2f')} | "
            f"{_fmt(r['prefix_hit_rate'] * 100, '.1f')} | {_fmt(r['session_turns'], '.0f')} | {_fmt(r['session_moves'], '.0f')} | "
            f"{_fmt(r['session_move_rate'] * 100, '.1f')} | {_fmt(r['move_reprefill_tokens'], '.0f')} | "
            f"{_fmt(r['move_reprefill_carbon_g'], '.3f')} | {_fmt(r['move_ttft_cost_s_mean'] * 1e3, '.0f')} |")
    if frontier is not None and not frontier.empty:
        lines += ["", "Carbon-vs-affinity frontier (cache-aware MILP, affinity knob `affinity_g_per_ktok`):", "",
                  "| scenario | affinity (g / 1k tokens) | vs rr % | hit rate % | move rate % | TTFT p99 (ms) | SLO viol. % |",
                  "|---|---|---|---|---|---|---|"]
        for _, r in frontier.iterrows():
            lines.append(f"| {r['scenario']} | {r['affinity_g_per_ktok']:g} | {_fmt(r['reduction_vs_rr_pct'], '+.1f')} | "
                         f"{_fmt(r['prefix_hit_rate'] * 100, '.1f')} | {_fmt(r['session_move_rate'] * 100, '.1f')} | "
                         f"{_fmt(r['ttft_p99_s'] * 1e3, '.0f')} | {_fmt(r['slo_violation_pct'], '.2f')} |")
    return "\n".join(lines) + "\n"


def sessions_experiment(ctx: Any) -> str:
    """Run the experiment with ``ctx`` (:class:`eval.experiments.Ctx`; module docstring) and the
    window (:func:`eval.runner.window_overrides`): write ``sessions.csv``,
    ``sessions_frontier.csv`` and ``sessions.md``; return the Markdown."""
    quick = ctx.preset_name == "quick"
    scens = list(ctx.scenarios or (QUICK_SCENARIOS if quick else FULL_SCENARIOS))
    ov = dict(ctx.overrides)
    if not ctx.explicit_window:  # its own steady-state window (the caches need a burn-in)
        ov.update(window_overrides(QUICK_WINDOW_S, QUICK_WARMUP_S) if quick else window_overrides(FULL_WINDOW_S, FULL_WARMUP_S))
    seeds = ctx.seeds if ctx.explicit_seeds else list(QUICK_SEEDS if quick else FULL_SEEDS)
    frontier_scens = scens if quick else [s for s in FULL_FRONTIER_SCENARIOS if s in scens]
    affinity = (0.0, 1.0) if quick else FRONTIER_AFFINITY
    specs = sessions_specs(scens, seeds, ov, frontier_scenarios=frontier_scens, affinity=affinity, policies=ctx.policies)
    ex = ctx.execute(specs)
    table = sessions_table(ex.runs)
    table.to_csv(os.path.join(ctx.out, "sessions.csv"), index=False)
    frontier = frontier_table(table)
    frontier.to_csv(os.path.join(ctx.out, "sessions_frontier.csv"), index=False)
    warm, window = window_of(ov)
    head = (f"Sessions with prefix caching ({', '.join(scens)}): {warm:g} s burn-in, then {window:g} s measured "
            f"(steady-state window, no drain); seeds {', '.join(map(str, seeds))}; every row with engine.prefix_caching = "
            "true and the cache_aware dispatcher inside datacenters. (blind) = cache_aware=False (whole prompts costed). "
            "Hit rate = cached / prompt tokens admitted; a move = a session turn placed at another datacenter than its "
            "previous turn; move carbon / TTFT = of the cached tokens the move re-prefilled (carbon_gym.sessions_state).")
    md = sessions_markdown(table, frontier, head)
    ctx.write_text("sessions.md", md)
    if ctx.plots and not frontier.empty:
        _plot_frontier(frontier, ctx.fig("sessions_frontier"))
    return md


def _plot_frontier(frontier: Any, stem: str) -> None:
    """Carbon reduction vs prefix hit rate along the affinity knob, one line per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(stem), exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    for scen, g in frontier.groupby("scenario", sort=False):
        ax.plot(100 * g["prefix_hit_rate"], g["reduction_vs_rr_pct"], marker="o", label=scen)
        for _, r in g.iterrows():
            ax.annotate(f"{r['affinity_g_per_ktok']:g}", (100 * r["prefix_hit_rate"], r["reduction_vs_rr_pct"]), fontsize=7)
    ax.set_xlabel("prefix hit rate (%)")
    ax.set_ylabel("carbon reduction vs rr (%)")
    ax.set_title("Carbon vs cache affinity (MILP affinity knob, g / 1k tokens)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    for ext in ("png", "pdf"):
        fig.savefig(f"{stem}.{ext}")
    plt.close(fig)
