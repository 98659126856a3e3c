"""Experiment ``generalise`` (j): the learned agent on data never used for its training or
selection (issue 24, item 3), beside the facility MILP it imitates.

Every test runs round-robin (the reference), the facility MILP and the learned agent (default:
the shipped checkpoint ``train/checkpoints/llama8b_set.npz``; ``--policies`` names others) on the
same episodes (common random numbers), as steady-state windows (the ``full`` preset: 600 s after
a 300 s burn-in):

================  =========================================================================
test              what differs from the agent's training
================  =========================================================================
held-out days     nothing but the days: llama8b-moderate on the first :data:`MAIN_STARTS`
                  fresh held-out 2023 days (:func:`eval.heldout_seeds.fresh_heldout_seeds`)
other year        the 2022 carbon year (``carbon.file`` = the packaged 2022 table, built by
                  ``eval/build_carbon_year.py``): starts spread over 2022, none seen
lower load        llama8b-low (fresh held-out days)
higher load       llama8b-high (fresh held-out days)
fewer DCs         2 datacenters per region (8 of the 16; ``topology.datacenters_per_region``)
region outage     llama8b-moderate with Europe's 4 datacenters down for 300 s inside the window
more DCs          18 datacenters: the 16 and the two zones of the packaged tables and RTT matrix
                  that training never saw (US-NY-NYIS, ES; :data:`UNSEEN_ZONES`), a custom topology
other zones       16 datacenters, two of them in those zones instead of US-MIDA-PJM and FR
                  (their grids, PUEs and RTTs)
three regions     the southern region dropped (its clients and its 4 datacenters;
                  ``topology.only_regions``): 12 datacenters, three regions' traffic
================  =========================================================================

The shipped agent was trained on llama8b-moderate at the former load level (3.11 req/s per
engine; the cluster-basis moderate level is 1.78), so every test is also at another load than
its training; the request rate is the scenario's, so 8 datacenters run hotter and 18 cooler than
16. Per test the table gives the MILP's and the agent's reduction vs rr (means over
starts with 95% intervals), the agent's **share of the MILP's reduction** (mean of the agent's
paired reductions / mean of the MILP's), the **violation difference** (agent - MILP, percentage
points, paired), MLPerf p99 passes and the agent's decision time. Writes ``generalise.csv`` and
``generalise.md`` under ``--out``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Mapping, Sequence

import numpy as np

from eval.runner import RunSpec, make_specs, window_of, window_overrides
from eval.stats import mean_ci95
from eval.tables import fmt_spec_ci
from eval.writers import matrix_dirs, read_configs

__all__ = ["GenTest", "TESTS", "generalise_specs", "generalise_table", "generalise_markdown", "generalise_experiment",
           "carbon_2022_file"]

#: The shipped agent, when ``--policies`` names no learned policy.
DEFAULT_LEARNED = "learned:train/checkpoints/llama8b_set.npz"
#: Starts of the held-out-days test (issue 24: >= 20) and of every other test (``--seeds`` sets both).
MAIN_STARTS, OTHER_STARTS = 20, 2
QUICK_WINDOW_S, QUICK_WARMUP_S = 20.0, 10.0


def carbon_2022_file() -> str:
    """Path of the packaged 2022 LCA carbon table (the other-year test's ``carbon.file``)."""
    return str(resources.files("carbon_gym").joinpath("data", "carbon", "electricitymaps_ci_lca_hourly_2022.csv"))


@dataclass(frozen=True)
class GenTest:
    """One test: its name, scenario label (its own episode-start key), shipped scenario, overrides,
    and whether its starts must be fresh held-out 2023 days (False: every start is unseen)."""

    name: str
    label: str
    scenario: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    heldout_days: bool = True
    main: bool = False


#: Zones of the packaged carbon tables and the RTT matrix that the default topology (and so the
#: agent's training) never uses, per region of :data:`carbon_gym.scenario.DEFAULT_REGIONS` (the
#: tables' BR and ZA have no RTT data).
UNSEEN_ZONES: dict[str, tuple[str, ...]] = {"north_america": ("US-NY-NYIS",), "europe": ("ES",)}
CLIENT_ZONES = {"north_america": "US-CAL-CISO", "europe": "DE", "asia_pacific": "JP-TK", "southern": "AU-NSW"}


def custom_topology(zones: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Overrides of a custom topology: the study's four regions (clients at their usual zones)
    with the datacenters ``zones`` lists per region (PUE from the zone table)."""
    return {"topology.preset": "custom",
            "topology.regions": [{"name": r, "client_zone": CLIENT_ZONES[r]} for r in zones],
            "topology.datacenters": [{"name": z.lower(), "region": r, "zone": z} for r, zs in zones.items() for z in zs]}


def _more_dcs() -> dict[str, Any]:
    """18 datacenters: the default 16 and the two unseen zones."""
    from carbon_gym.scenario import DEFAULT_REGIONS

    return custom_topology({r: (*DEFAULT_REGIONS[r], *UNSEEN_ZONES.get(r, ())) for r in DEFAULT_REGIONS})


def _other_zones() -> dict[str, Any]:
    """16 datacenters of which two are in unseen zones: US-NY-NYIS for US-MIDA-PJM, ES for FR."""
    from carbon_gym.scenario import DEFAULT_REGIONS

    swap = {"US-MIDA-PJM": "US-NY-NYIS", "FR": "ES"}
    return custom_topology({r: tuple(swap.get(z, z) for z in DEFAULT_REGIONS[r]) for r in DEFAULT_REGIONS})


def _tests() -> tuple[GenTest, ...]:
    outage = [{"kind": "region_outage", "region": "europe", "start_s": 420.0, "end_s": 720.0}]
    return (
        GenTest("held-out days", "llama8b-moderate", "llama8b-moderate", main=True),
        GenTest("other year (2022)", "llama8b-moderate-2022", "llama8b-moderate", {"carbon.file": carbon_2022_file()},
                heldout_days=False),
        GenTest("lower load", "llama8b-low", "llama8b-low"),
        GenTest("higher load", "llama8b-high", "llama8b-high"),
        GenTest("fewer DCs (8)", "llama8b-moderate-8dc", "llama8b-moderate", {"topology.datacenters_per_region": 2}),
        GenTest("region outage", "llama8b-moderate-outage", "llama8b-moderate", {"faults": outage}),
        GenTest("more DCs (18)", "llama8b-moderate-18dc", "llama8b-moderate", _more_dcs()),
        GenTest("other zones (2 of 16 unseen)", "llama8b-moderate-otherzones", "llama8b-moderate", _other_zones()),
        GenTest("three regions (no southern)", "llama8b-moderate-3regions", "llama8b-moderate",
                {"topology.only_regions": ["north_america", "europe", "asia_pacific"]}),
    )


TESTS: tuple[GenTest, ...] = _tests()


def _seeds(t: GenTest, n: int) -> list[int]:
    if not t.heldout_days:
        return list(range(n))
    from eval.heldout_seeds import fresh_heldout_seeds

    return fresh_heldout_seeds(t.label, n)


def generalise_specs(tests: Sequence[GenTest], policies: Sequence[str], overrides: Mapping[str, Any], *,
                     main_starts: int = MAIN_STARTS, other_starts: int = OTHER_STARTS,
                     policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> list[RunSpec]:
    """The runs: per test, ``policies`` (rr first) x its starts, labelled by the test's scenario
    label (which also keys its episode starts)."""
    specs: list[RunSpec] = []
    for t in tests:
        ov = {**overrides, **t.overrides}
        seeds = _seeds(t, main_starts if t.main else other_starts)
        for s in make_specs([t.scenario], list(policies), seeds, overrides=ov, policy_kwargs=policy_kwargs):
            specs.append(replace(s, scenario_label=t.label if t.label != t.scenario else "", start_key=t.label))
    return specs


def generalise_table(runs: Any, tests: Sequence[GenTest], learned: str, milp: str = "milp") -> Any:
    """One row per test (pandas): starts, reductions with 95% intervals, share of the MILP's
    reduction, paired violation difference, p99 passes, the agent's decision time."""
    import pandas as pd

    rows = []
    for t in tests:
        g = runs[runs["scenario"] == t.label]
        m = g[g["policy"] == milp].set_index("seed")
        lr = g[g["policy"] == learned].set_index("seed")
        seeds = sorted(set(m.index) & set(lr.index))
        if not seeds:
            continue
        m, lr = m.loc[seeds], lr.loc[seeds]
        red_m = m["reduction_vs_rr_pct"].to_numpy(np.float64)
        red_l = lr["reduction_vs_rr_pct"].to_numpy(np.float64)
        dv = lr["slo_violation_pct"].to_numpy(np.float64) - m["slo_violation_pct"].to_numpy(np.float64)
        rr = g[g["policy"] == "rr"]
        (mm, mci), (lm, lci), (vm, vci) = mean_ci95(red_m), mean_ci95(red_l), mean_ci95(dv)
        rows.append({
            "test": t.name, "scenario": t.label, "starts": len(seeds),
            "milp_reduction_pct": mm, "milp_reduction_ci95": mci, "learned_reduction_pct": lm, "learned_reduction_ci95": lci,
            "share_of_milp": lm / mm if abs(mm) > 1e-9 else float("nan"),
            "violation_diff_pp": vm, "violation_diff_ci95": vci,
            "rr_violation_pct": float(rr["slo_violation_pct"].mean()), "milp_violation_pct": float(m["slo_violation_pct"].mean()),
            "learned_violation_pct": float(lr["slo_violation_pct"].mean()),
            "rr_p99_pass": int(rr["mlperf_p99_pass"].astype(bool).sum()), "milp_p99_pass": int(m["mlperf_p99_pass"].astype(bool).sum()),
            "learned_p99_pass": int(lr["mlperf_p99_pass"].astype(bool).sum()),
            "learned_better_starts": int((red_l > red_m).sum()),
            "learned_decision_p95_ms": 1e3 * float(lr["decision_p95_s"].max()),
            "milp_decision_p95_ms": 1e3 * float(m["decision_p95_s"].max()),
            "valid": bool(g["run_valid"].astype(bool).all()) if "run_valid" in g else True,
        })
    return pd.DataFrame(rows)


def generalise_markdown(table: Any, head: str, learned: str) -> str:
    """The experiment's Markdown table."""
    lines = [head, "", f"| test | scenario | starts | MILP vs rr % (viol. %) | {learned} vs rr % (viol. %) | share of the "
             "MILP's reduction | viol. agent - MILP (pp) | starts agent > MILP | p99 pass rr / MILP / agent | agent decision "
             "p95 (ms, worst start) | MILP decision p95 (ms) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        n = int(r["starts"])
        mark = "" if bool(r["valid"]) else " (a run left > 1% unfinished: invalid)"
        lines.append(
            f"| {r['test']}{mark} | {r['scenario']} | {n} | {fmt_spec_ci(r['milp_reduction_pct'], r['milp_reduction_ci95'])} "
            f"({r['milp_violation_pct']:.2f}) | {fmt_spec_ci(r['learned_reduction_pct'], r['learned_reduction_ci95'])} "
            f"({r['learned_violation_pct']:.2f}) | {100 * r['share_of_milp']:.0f}% | "
            f"{fmt_spec_ci(r['violation_diff_pp'], r['violation_diff_ci95'], '+.2f')} | {int(r['learned_better_starts'])}/{n} | "
            f"{int(r['rr_p99_pass'])}/{int(r['milp_p99_pass'])}/{int(r['learned_p99_pass'])} of {n} | "
            f"{r['learned_decision_p95_ms']:.1f} | {r['milp_decision_p95_ms']:.0f} |")
    return "\n".join(lines) + "\n"


def _head(overrides: Mapping[str, Any]) -> str:
    warm, window = window_of(overrides)
    return (f"Steady-state windows of {window:g} s after a {warm:g} s burn-in; the same episodes for every policy. "
            "Share of the MILP's reduction = the agent's mean paired reduction / the MILP's; violation difference "
            "paired per start (per-request SLO violation %, completed requests).")


def generalise_experiment(ctx: Any) -> str:
    """Run the experiment with ``ctx`` (:class:`eval.experiments.Ctx`; module docstring): write
    ``generalise.csv`` and ``generalise.md``; return the Markdown. ``--seeds N`` runs N starts
    per test (the quick preset: one start of two tests, a 20 s window, for CI)."""
    quick = ctx.preset_name == "quick"
    pols = list(ctx.policies or ["rr", "milp", DEFAULT_LEARNED])
    if "rr" not in pols:
        pols.insert(0, "rr")
    learned_specs = [p for p in pols if p.startswith("learned")]
    if len(learned_specs) != 1 or "milp" not in pols:
        from carbon_gym.errors import ConfigError

        raise ConfigError("--policies", f"experiment generalise compares one learned policy with the MILP, got {pols}",
                          allowed="rr, milp and one learned:<checkpoint>")
    tests = [t for t in TESTS if ctx.scenarios is None or t.label in ctx.scenarios]
    if quick and ctx.scenarios is None:
        tests = [TESTS[0], TESTS[1]]
    ov = dict(ctx.overrides)
    if not ctx.explicit_window and quick:
        ov.update(window_overrides(QUICK_WINDOW_S, QUICK_WARMUP_S))
    n_main = len(ctx.seeds) if ctx.explicit_seeds else (1 if quick else MAIN_STARTS)
    n_other = len(ctx.seeds) if ctx.explicit_seeds else (1 if quick else OTHER_STARTS)
    specs = generalise_specs(tests, pols, ov, main_starts=n_main, other_starts=n_other, policy_kwargs=ctx.policy_kwargs)
    ex = ctx.execute(specs)
    learned = next(s.policy_name for s in specs if s.policy_name.startswith("learned"))
    table = generalise_table(ex.runs, tests, learned)
    table.to_csv(os.path.join(ctx.out, "generalise.csv"), index=False)
    md = generalise_markdown(table, _head(ov), learned)
    ctx.write_text("generalise.md", md)
    return md


def generalise_dirs(results_dir: str) -> list[str]:
    """This experiment's matrices under ``results_dir``: ``generalise/`` first, then every
    ``generalise-*/generalise/`` (e.g. tests added later) in name order."""
    return matrix_dirs(results_dir, "generalise")


def generalise_section(results_dir: str) -> str | None:
    """The table over every matrix of :func:`generalise_dirs` (a later run of the same test label,
    policy and seed replaces an earlier one), with each matrix's command; None when there is
    at most one matrix (its own ``generalise.md`` is the section)."""
    from eval.capacity_report import merged_runs

    dirs = generalise_dirs(results_dir)
    if len(dirs) < 2:
        return None
    runs = merged_runs(dirs)
    learned = next(p for p in dict.fromkeys(runs["policy"]) if str(p).startswith("learned"))
    cfgs = read_configs(dirs)
    cmds = [str(c.get("command")) for c in cfgs]
    ov = dict(cfgs[0].get("runs", [{}])[0].get("overrides", {}))
    table = generalise_table(runs, TESTS, learned)
    return "```bash\n" + "\n".join(cmds) + "\n```\n\n" + generalise_markdown(table, _head(ov), learned)
