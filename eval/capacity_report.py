"""Experiment h (capacity): capacity control on steady-state windows, its table and RESULTS.md section.

The matrix (:func:`capacity_specs`): on each scenario, round-robin with every engine always on
(``capacity.control = "always_on"``, the label :data:`ALWAYS_ON_LABEL`: the reference), and with
``capacity.control = "agent"`` the policies of :data:`CAPACITY_POLICIES` (``POLICY+AUTOSCALER``
composes a routing policy with an autoscaler of :mod:`carbon_gym.autoscalers`; a policy that
only routes, e.g. plain ``rr``, keeps every engine awake). All runs of a scenario and seed share
the requests and the episode start.

:func:`capacity_table` has one row per (scenario, policy): carbon, the reduction paired by seed
vs the always-on rr and vs ``rr+reactive``, violations, the MLPerf p99 verdict, unfinished
work, mean servers on and awake engines, facility energy by power state and the run's wall
time. :func:`capacity_markdown` renders it; :func:`capacity_section` is RESULTS.md's "Capacity
control" section, written in place between :data:`SECTION_BEGIN` / :data:`SECTION_END` by
:func:`write_capacity_section` (``carbon-gym report --section capacity``) without touching the
rest of the file.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from eval.runner import VALID_UNFINISHED_PCT, RunSpec, always_on_overrides, freeze, window_of
from eval.stats import mean_ci95
from eval.writers import matrix_dirs, read_configs, starts_line

__all__ = ["CAPACITY_SCENARIOS", "CAPACITY_POLICIES", "ALWAYS_ON_LABEL", "MILP_ALWAYS_ON_LABEL", "OLD_CAPACITY_UTIL_CAP", "REACTIVE_REFERENCE", "CAPACITY_WINDOW_S",
           "CAPACITY_WARMUP_S", "ENERGY_GROUPS", "capacity_specs", "capacity_table", "capacity_markdown",
           "capacity_experiment", "capacity_section", "with_capacity_section", "write_capacity_section", "SECTION_BEGIN", "SECTION_END"]

CAPACITY_SCENARIOS = ("llama8b-low", "llama8b-moderate", "mixtral8x7b-low")
#: Policies run with ``capacity.control = "agent"`` (the always-on rr reference is added).
CAPACITY_POLICIES = ("rr", "rr+reactive", "planner+reactive", "ilp-state+reactive", "rr+carbon-aware", "milp")
#: Table name of round-robin run with ``capacity.control = "always_on"``.
ALWAYS_ON_LABEL = "rr (always on)"
#: The routing-only MILP (capacity.control = always_on), run when ``milp`` is in the matrix: whether
#: deciding capacity costs the MILP violations against its own always-on run.
MILP_ALWAYS_ON_LABEL = "milp (always on)"
#: The second reference: round-robin with the reactive autoscaler.
REACTIVE_REFERENCE = "rr+reactive"
OVERRIDE_CONTROL = "capacity.control"
#: The experiment's measurement window and burn-in, s. A server boot to serving takes 345-354 s
#: (``python -m eval.capacity_report``); the reactive autoscaler halves the awake engines at most
#: once per 60 s cool-down, and at low load (utilisation 0.3 of the measured capacity, its target
#: 0.6) it settles after one halving (512 -> 256 engines within 240 s in a trial run): the 300 s
#: burn-in holds that settling from the always-on start; the 900 s window holds 30 capacity
#: decisions (30 s period) and 2.5 boot times, so a boot started in it is mostly paid in it.
#: Sized to what a 2-core machine shared with other work runs in about an hour; on a cluster use
#: ``--window-s 3600 --warmup-s 600`` and more seeds.
CAPACITY_WINDOW_S = 900.0
CAPACITY_WARMUP_S = 300.0
#: Energy-by-state columns of the table: display name -> the run's energy_kwh_<state> metrics summed.
ENERGY_GROUPS: dict[str, tuple[str, ...]] = {
    "GPU active": ("gpu_active",),
    "GPU idle": ("gpu_idle",),
    "GPU asleep": ("gpu_falling_asleep", "gpu_asleep", "gpu_waking"),
    "host on": ("host_on",),
    "host standby": ("host_standby",),
    "host off": ("host_off",),
    "boot": ("gpu_booting", "host_booting"),
}
#: Seconds from power-on to serving of an 8B engine's node (A100: boot 300 s + cold start; states table).
BOOT_S = 345.0
SECTION_BEGIN = "<!-- capacity:begin (carbon-gym report --section capacity rewrites this section) -->"
SECTION_END = "<!-- capacity:end -->"
SECTION_TITLE = "## Capacity control"


def _capacity_only(kwargs: tuple[tuple[str, Any], ...]) -> bool:
    """Whether a MILP's settings (``RunSpec.policy_kwargs``, frozen pairs) are all its capacity
    stage's (``capacity_*``), which do nothing with capacity always on."""
    return bool(kwargs) and all(str(k).startswith("capacity_") for k, _ in kwargs)


def capacity_specs(scenarios: Sequence[str], policies: Sequence[str], seeds: Sequence[int], overrides: Mapping[str, Any],
                   policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> list[RunSpec]:
    """The always-on rr reference (when ``rr`` is in ``policies``: a matrix of more policies run
    later leaves it out and is merged with the first, :func:`merged_runs`), the routing-only MILP
    (:data:`MILP_ALWAYS_ON_LABEL`, when ``milp`` is; an aliased MILP ``NAME=milp`` as ``NAME (always
    on)``, unless its settings are all the capacity stage's, ``capacity_*``: always on it is then
    ``milp (always on)`` to the bit, the stage never running), then ``policies`` with
    ``capacity.control = "agent"``, per scenario and seed (one
    scenario label: the same requests and episode start). Policies are named as everywhere
    (:func:`eval.runner.make_specs`): registry names, ``learned:<checkpoint>``, ``NAME=POLICY``,
    with ``policy_kwargs`` per name."""
    from eval.runner import canonical_policy_name, make_specs

    on = always_on_overrides(overrides)  # (autoscaler settings are for the rows deciding capacity)
    agent = dict(overrides)
    agent[OVERRIDE_CONTROL] = "agent"
    milp = canonical_policy_name("milp")
    routed = make_specs(scenarios, list(policies), seeds, overrides=agent, policy_kwargs=policy_kwargs)
    specs = []
    for scen in scenarios:
        for k in seeds if "rr" in policies else ():
            specs.append(RunSpec(scenario=scen, policy="rr", seed=int(k), overrides=freeze(on), label=ALWAYS_ON_LABEL))
        for s in routed:
            if s.scenario != scen:
                continue
            if s.policy == milp and not (s.label and _capacity_only(s.policy_kwargs)):
                specs.append(replace(s, overrides=freeze(on), label=f"{s.label} (always on)" if s.label else MILP_ALWAYS_ON_LABEL))
            specs.append(s)
    return specs


def _paired_reduction(sub, ref: str) -> dict[tuple[str, int], float]:
    """(policy, seed) -> 100 x (carbon_ref - carbon) / carbon_ref, paired by seed."""
    r = sub[sub["policy"] == ref].set_index("seed")["carbon_g"]
    out = {}
    for pol, seed, c in zip(sub["policy"], sub["seed"], sub["carbon_g"]):
        if seed in r.index and float(r.loc[seed]) > 0:
            out[(pol, int(seed))] = 100.0 * (float(r.loc[seed]) - float(c)) / float(r.loc[seed])
    return out


def _col(g, name: str) -> np.ndarray:
    return g[name].to_numpy(np.float64) if name in g else np.full(len(g), np.nan)


def capacity_table(runs):
    """One row per (scenario, policy) of a capacity matrix's runs (``runs.csv``): means and 95%
    CI half-widths (``*_ci95``) over seeds of carbon (kg), the reductions (%) vs the always-on
    rr and vs ``rr+reactive`` (paired by seed), SLO violation %, unfinished %, mean servers on,
    mean awake engines, energy per :data:`ENERGY_GROUPS` group and in total (facility kWh),
    capacity events (wakes, boots, requests that waited) and the run's wall time (s); the shares
    of seeds passing MLPerf p99 (``mlperf_*_share``) and valid (``valid_share``)."""
    import pandas as pd

    from eval.tables import MLPERF_COLUMNS

    rows = []
    for scen in dict.fromkeys(runs["scenario"]):
        sub = runs[runs["scenario"] == scen]
        red_on = _paired_reduction(sub, ALWAYS_ON_LABEL)
        red_re = _paired_reduction(sub, REACTIVE_REFERENCE)
        for pol in dict.fromkeys(sub["policy"]):
            g = sub[sub["policy"] == pol]
            seeds = [int(s) for s in g["seed"]]
            row: dict[str, Any] = {"scenario": scen, "policy": pol, "seeds": len(g)}

            def put(name: str, values: Any, row: dict[str, Any] = row) -> None:
                row[name], row[name + "_ci95"] = mean_ci95(values)

            put("carbon_kg", _col(g, "carbon_g") / 1e3)
            put("reduction_vs_always_on_pct", [red_on.get((pol, s), np.nan) for s in seeds])
            put("reduction_vs_reactive_pct", [red_re.get((pol, s), np.nan) for s in seeds])
            for m in ("slo_violation_pct", "unfinished_pct", "mean_servers_on", "mean_awake_engines", "energy_kwh",
                      "engine_wakes", "server_boots", "capacity_waits", "wall_s", "decision_p95_s"):
                put(m, _col(g, m))
            for name, states in ENERGY_GROUPS.items():
                cols = [f"energy_kwh_{s}" for s in states]
                if all(c in g for c in cols):
                    put(f"energy_kwh[{name}]", g[cols].to_numpy(np.float64).sum(axis=1))
                else:  # an always-on run has no ledger of states: all of it is "on"
                    put(f"energy_kwh[{name}]", np.full(len(g), np.nan))
            for c in MLPERF_COLUMNS:
                if c in g:
                    row[c + "_share"] = float(np.mean(g[c].astype(float)))
            if "run_valid" in g:
                row["valid_share"] = float(np.mean(g["run_valid"].astype(float)))
            rows.append(row)
    return pd.DataFrame(rows)


def capacity_markdown(table) -> str:
    """:func:`capacity_table` as two Markdown tables: the outcome, and the energy by state."""
    from eval.tables import METRICS_NOTE, fmt_ci, frame_markdown, invalid, p99_verdict

    import pandas as pd

    if table.empty:
        return "(no runs)\n"

    def f(r: Any, m: str, d: int = 1) -> str:
        return fmt_ci(r.get(m, float("nan")), r.get(m + "_ci95", float("nan")), d)

    bad_ref = {sc for sc, p, v in zip(table["scenario"], table["policy"], table.get("valid_share", [1.0] * len(table)))
               if p == REACTIVE_REFERENCE and float(v) < 1.0}
    main, energy = [], []
    for _, r in table.iterrows():
        bad = invalid(r)
        main.append({
            "scenario": r["scenario"], "policy": r["policy"], "seeds": int(r["seeds"]),
            "carbon (kg)": f(r, "carbon_kg", 2),
            "vs always-on rr %": "invalid" if bad else f(r, "reduction_vs_always_on_pct"),
            "vs rr+reactive %": "invalid" if bad else ("(ref. invalid)" if r["scenario"] in bad_ref else f(r, "reduction_vs_reactive_pct")),
            "SLO viol. %": f(r, "slo_violation_pct", 2),
            "MLPerf p99 pass": p99_verdict(r),
            "unfinished %": f(r, "unfinished_pct", 2),
            "servers on": f(r, "mean_servers_on"),
            "awake engines": f(r, "mean_awake_engines"),
            "wakes / boots / waits": "/".join(fmt_ci(r.get(m, float("nan")), d=0) for m in ("engine_wakes", "server_boots", "capacity_waits")),
            "decision p95 (ms)": fmt_ci(1e3 * r.get("decision_p95_s", float("nan")), d=1),
            "run wall (s)": fmt_ci(r.get("wall_s", float("nan")), d=0),
        })
        e = {"scenario": r["scenario"], "policy": r["policy"], "total": f(r, "energy_kwh")}
        for name in ENERGY_GROUPS:
            e[name] = f(r, f"energy_kwh[{name}]")
        energy.append(e)
    return ("Carbon and the reductions paired by seed (mean ± 95% CI over seeds where more than one); servers on and "
            "awake engines are step averages over the window (the always-on run has no ledger of states: control = "
            "always_on leaves the simulator untouched; rr under control = agent, routing only, is the same run with one); "
            f"invalid = more than {VALID_UNFINISHED_PCT:g}% of the window's arrivals left as backlog; wakes / boots / waits: engine wakes, server boots and "
            "requests that waited for a wake or a boot in the window; run wall = the whole episode (burn-in "
            f"included) on one core. {METRICS_NOTE}\n\n" + frame_markdown(pd.DataFrame(main))
            + "\nFacility energy (kWh, PUE included) by power state over the window (GPU asleep = falling asleep + "
            "asleep + waking; boot = GPUs and host while a server boots).\n\n" + frame_markdown(pd.DataFrame(energy)))


def capacity_experiment(ctx: Any, scenarios: Sequence[str], policies: Sequence[str],
                        seeds: Mapping[str, Sequence[int]], overrides: Mapping[str, Any]) -> str:
    """Run the capacity matrix with ``ctx`` (:class:`eval.experiments.Ctx`), write
    ``capacity.csv`` / ``capacity.md`` under ``ctx.out`` and return the Markdown. ``seeds``: each
    scenario's (the same list for all, or with ``--heldout-seeds`` each its own)."""
    specs = [s for sc in scenarios for s in capacity_specs([sc], policies, seeds[sc], overrides, ctx.policy_kwargs)]
    ex = ctx.execute(specs)
    table = capacity_table(ex.runs)
    table.to_csv(os.path.join(ctx.out, "capacity.csv"), index=False)
    warm, window = window_of(overrides)
    head = (f"{', '.join(scenarios)}: {warm:g} s burn-in, then {window:g} s measured (steady-state window, no drain); "
            f"seeds {_seed_text(seeds)}. `{ALWAYS_ON_LABEL}`, `{MILP_ALWAYS_ON_LABEL}`: capacity.control = "
            "always_on; every other row: "
            "capacity.control = agent.\n\n")
    md = head + capacity_markdown(table)
    ctx.write_text("capacity.md", md)
    return md


def _seed_text(per: Mapping[str, Sequence[int]]) -> str:
    """``0, 1`` when every scenario ran the same seeds, else ``a: 1, 4; b: 23, 46`` (each its own)."""
    lists = {tuple(v) for v in per.values()}
    if len(lists) <= 1:
        return ", ".join(map(str, next(iter(lists), ())))
    return "; ".join(f"{sc}: {', '.join(map(str, v))}" for sc, v in per.items())


# ----------------------------------------------------------------------------------------------
# RESULTS.md section


def _reading(table) -> list[str]:
    """Bullet points computed from the table: the always-on check, the best row per scenario,
    and where the savings come from (host vs GPU energy)."""
    out = []
    for scen in dict.fromkeys(table["scenario"]):
        sub = table[table["scenario"] == scen].set_index("policy")
        if ALWAYS_ON_LABEL not in sub.index:
            continue
        ref = sub.loc[ALWAYS_ON_LABEL]
        parts = []
        if "rr" in sub.index:
            d = float(sub.loc["rr", "reduction_vs_always_on_pct"])
            parts.append(f"rr under control = agent (routing only) is {d:+.2f}% vs always-on (the check that a policy "
                         "that only routes keeps every engine awake)")
            if abs(d) < 1e-9:  # the same run: its ledger of states is the always-on one's
                ref = sub.loc["rr"]
        if MILP_ALWAYS_ON_LABEL in sub.index and "milp" in sub.index:
            m0, m1 = sub.loc[MILP_ALWAYS_ON_LABEL], sub.loc["milp"]
            parts.append(f"the MILP deciding capacity: {float(m1['reduction_vs_always_on_pct']):.1f}% at "
                         f"{float(m1['slo_violation_pct']):.2f}% violation against its routing-only run's "
                         f"{float(m0['reduction_vs_always_on_pct']):.1f}% at {float(m0['slo_violation_pct']):.2f}%")
        ok = sub.drop(index=[ALWAYS_ON_LABEL, MILP_ALWAYS_ON_LABEL, "rr"], errors="ignore")
        ok = ok[(ok.get("valid_share", 1.0) >= 1.0)] if "valid_share" in ok else ok
        if not ok.empty and np.isfinite(ok["reduction_vs_always_on_pct"]).any():
            best = ok["reduction_vs_always_on_pct"].astype(float).idxmax()
            b = ok.loc[best]
            parts.append(f"largest reduction: {best} {b['reduction_vs_always_on_pct']:.1f}% at {b['slo_violation_pct']:.2f}% "
                         f"violation (always-on rr {ref['slo_violation_pct']:.2f}%), {b['mean_servers_on']:.1f} of "
                         f"{ref['mean_servers_on']:.0f} servers on, {b['mean_awake_engines']:.0f} of {ref['mean_awake_engines']:.0f} engines awake")
            passing = ok[ok.get("mlperf_p99_pass_share", 0.0) >= 1.0] if "mlperf_p99_pass_share" in ok else ok.iloc[:0]
            if passing.empty:
                parts.append("no capacity-controlling row passes MLPerf p99")
            else:
                bp = passing["reduction_vs_always_on_pct"].astype(float).idxmax()
                parts.append(f"largest passing MLPerf p99: {bp} {passing.loc[bp, 'reduction_vs_always_on_pct']:.1f}% at "
                             f"{passing.loc[bp, 'slo_violation_pct']:.2f}%")
            if REACTIVE_REFERENCE in sub.index:
                r = sub.loc[REACTIVE_REFERENCE]
                host = [f"energy_kwh[{n}]" for n in ("host on", "host standby", "host off")]
                gpu_floor = [f"energy_kwh[{n}]" for n in ("GPU idle", "GPU asleep")]
                saved = float(ref["energy_kwh"]) - float(r["energy_kwh"])
                host_ref = float(ref["energy_kwh"]) - float(ref["energy_kwh[GPU active]"]) - float(ref["energy_kwh[GPU idle]"])
                host_saved = host_ref - float(np.nansum([r[c] for c in host]))
                gpu_saved = float(ref["energy_kwh[GPU idle]"]) - float(np.nansum([r[c] for c in gpu_floor]))
                act_saved = float(ref["energy_kwh[GPU active]"]) - float(r["energy_kwh[GPU active]"])
                if np.isfinite(saved) and saved != 0:
                    parts.append(f"rr+reactive saves {saved:.1f} kWh of {float(ref['energy_kwh']):.1f}: host power "
                                 f"{host_saved:.1f} kWh, GPU idle/asleep floor {gpu_saved:.1f} kWh, GPU active "
                                 f"{act_saved:.1f} kWh, boots cost {float(np.nan_to_num(r['energy_kwh[boot]'])):.1f} kWh")
        out.append(f"- **{scen}**: " + "; ".join(parts) + ".")
    return out


def capacity_dirs(results_dir: str) -> list[str]:
    """The capacity matrices under ``results_dir``: ``capacity/`` first, then every
    ``capacity-*/capacity/`` (later runs, e.g. rows rerun on newer code), in name order."""
    return matrix_dirs(results_dir, "capacity")


def merged_runs(dirs: Sequence[str]):
    """The runs of ``dirs`` (``runs.csv``) merged: a (scenario, policy, seed) run of a later
    directory replaces an earlier one's; rows ordered by scenario (:data:`CAPACITY_SCENARIOS`
    first), policy (the always-on reference, then :data:`CAPACITY_POLICIES`, then any other) and
    first appearance. Also a ``source`` column (the directory)."""
    import pandas as pd

    frames = []
    for d in dirs:
        r = pd.read_csv(os.path.join(d, "runs.csv"))
        r["source"] = d
        frames.append(r)
    runs = pd.concat(frames, ignore_index=True)
    latest: dict[tuple[Any, Any, Any], int] = {}
    for i, k in enumerate(zip(runs["scenario"], runs["policy"], runs["seed"])):
        latest.setdefault(k, i)  # the key's place: its first appearance ...
    rows = {k: i for i, k in enumerate(zip(runs["scenario"], runs["policy"], runs["seed"]))}  # ... its row: the latest
    scens = list(dict.fromkeys([*(sc for sc in CAPACITY_SCENARIOS if sc in set(runs["scenario"])), *runs["scenario"]]))
    pols = [ALWAYS_ON_LABEL, MILP_ALWAYS_ON_LABEL, *CAPACITY_POLICIES]

    def rank(k: tuple[Any, Any, Any]) -> tuple[int, int, int]:
        return scens.index(k[0]), pols.index(k[1]) if k[1] in pols else len(pols), latest[k]

    keep = [rows[k] for k in sorted(latest, key=rank)]
    return runs.loc[keep].reset_index(drop=True)


#: The capacity MILP's utilisation cap before the measured one became its default: the
#: ``milp`` rows of capacity matrices whose runs.csv has no ``policy_capacity_util_cap`` ran at it.
OLD_CAPACITY_UTIL_CAP = 0.7


def _milp_util_cap(runs) -> str:
    """The capacity MILP's utilisation cap in ``runs`` as text: the recorded
    ``policy_capacity_util_cap`` values, or :data:`OLD_CAPACITY_UTIL_CAP` (the default before
    runs recorded it)."""
    col = runs.loc[runs["policy"] == "milp", "policy_capacity_util_cap"] if "policy_capacity_util_cap" in runs else None
    vals = sorted({round(float(v), 3) for v in col.dropna()}) if col is not None else []
    return " / ".join(f"{v:g}" for v in vals) if vals else f"{OLD_CAPACITY_UTIL_CAP:g}"


def capacity_section(results_dir: str) -> str:
    """RESULTS.md's "Capacity control" section (between the markers) from the capacity
    matrices under ``results_dir`` (:func:`capacity_dirs`, merged by :func:`merged_runs`)."""
    dirs = capacity_dirs(results_dir)
    if not dirs:
        raise FileNotFoundError(f"no capacity results under {results_dir!r} (carbon-gym experiment capacity --out {results_dir})")
    cfgs = read_configs(dirs)
    runs = merged_runs(dirs)
    table = capacity_table(runs)
    first = open(os.path.join(dirs[0], "capacity.md"), encoding="utf-8").read()
    md = first.split("\n\n", 1)[0] + "\n\n" + capacity_markdown(table)
    cfg = cfgs[-1]
    meta = [r for c in cfgs for r in c.get("runs", [])]
    windows = sorted({float(w) for w in runs["window_s"].dropna()}) if "window_s" in runs else []
    warm = sorted({float(r.get("overrides", {}).get("env.warmup_s", 0.0)) for r in meta})
    per_scenario = runs.groupby("scenario", sort=False)["seed"].nunique()
    kept = set(zip(runs["scenario"], runs["policy"], runs["seed"]))  # the runs shown (a later matrix's replace an earlier's)
    shown = [r for r in meta if (r.get("scenario_label") or r.get("scenario"), r.get("label") or r.get("policy"), r.get("seed")) in kept]
    starts_meta = shown or [{"scenario": sc, "seed": int(k)} for sc, _, k in sorted(kept, key=str)]  # (a config without its runs' seeds)
    v = cfg.get("versions", {})
    milp = runs[runs["policy"] == "milp"]
    milp_cap = "engine_sleeps" in milp and bool((milp["engine_sleeps"].fillna(0) > 0).any())  # it put engines to sleep
    lines = [SECTION_BEGIN, SECTION_TITLE, ""]
    add = lines.append
    add("Engines that sleep and wake and servers that power off (issue 19): round-robin with every engine always on "
        "against policies that also decide how many engines stay awake and servers powered per datacenter "
        "(README, \"Capacity control\").\n")
    add("```bash")
    for c in cfgs:
        add(str(c.get("command") or "carbon-gym experiment capacity"))
    add(f"carbon-gym report {results_dir} --section capacity")
    add("```\n")
    if len(dirs) > 1:
        add("(" + "; ".join(f"{os.path.relpath(d, results_dir)}: {', '.join(dict.fromkeys(runs[runs['source'] == d]['policy']))}"
                            for d in dirs) + ": a run of a later command replaces the same scenario, policy and seed of an "
            "earlier one.)\n")
    add(f"- measurement window: {', '.join(f'{w:g}' for w in windows) or '?'} s after a {', '.join(f'{w:g}' for w in warm)} s "
        "burn-in (simulated, not counted; no drain)")
    add(starts_line(starts_meta))
    for d, c in zip(dirs, cfgs):
        if "elapsed_s" in c:
            add(f"- wall time ({os.path.relpath(d, results_dir)}): {c['elapsed_s'] / 60:.1f} min for {len(c.get('runs', []))} runs "
                f"on {c.get('workers')} worker process(es), {c.get('cpu_count')} CPU cores shared with other work; versions: "
                + ", ".join(f"{k} {val}" for k, val in c.get("versions", {}).items() if k in ("git", "carbon-gym", "python", "highspy")))
    add(f"- CPU time of the runs shown: {runs['cpu_s'].sum() / 60:.1f} min; platform: {v.get('platform', '?')}\n")
    add(md)
    add("**Reading** (figures from the table above):\n")
    lines.extend(_reading(table))
    add("")
    add("**What saves, and what does not.** On this hardware a sleeping engine draws its idle power (vLLM level-1 "
        "sleep keeps the CUDA context; calibration/measurements/capacity_states.md, sleep_w = idle_w in "
        "carbon_gym/data/params/power/*.toml), so an engine put to sleep on a server that stays on saves nothing; what "
        "saves is servers powered off (their host power, and their GPUs, against 40 W off), paid for by boots of minutes "
        "when capacity is needed back and by requests waiting for a wake. Under always-on round-robin almost every "
        "engine has a few requests running, so its floor is booked as GPU active: consolidating the same work on fewer "
        "engines shows up as lower GPU active energy as well as lower host energy, not as lower GPU idle.\n")
    bound = _bound_reading(results_dir, dirs)
    if bound:
        add(bound + "\n")
    add("**What a reviewer would object to.**\n")
    if int(per_scenario.min()) < 2:
        add("- One start (seed) per cell: no confidence intervals, one day and hour of the carbon year (which "
            "datacenters are dirty, and by how much, is that hour's).")
    w = min(windows) if windows else float("nan")
    add(f"- The window ({', '.join(f'{x:g}' for x in windows)} s) is {w / BOOT_S:.1f} boots (~{BOOT_S:g} s to serving) and "
        f"{w / 30.0:.0f} capacity periods (30 s) long: enough for boots caused in it to be paid in it, "
        + ("but too short for a result; " if w < 2 * BOOT_S else "but ")
        + "short against the carbon day and the traffic's daily cycle: scale-up through boots when load rises is barely "
        "exercised (the load is stationary within the window), and the carbon-aware cap meets one or two carbon hours "
        "(the 6 h `llama8b-diurnal` run of `carbon-gym experiment diurnal` has capacity control through a daily cycle, "
        "one start).")
    ctl = table[~table["policy"].isin([ALWAYS_ON_LABEL, "rr"])]
    if len(ctl):
        add(f"- The reductions come at very different violation levels ({ctl['slo_violation_pct'].min():.2f}-"
            f"{ctl['slo_violation_pct'].max():.2f}% per request against {table[table['policy'] == ALWAYS_ON_LABEL]['slo_violation_pct'].min():.2f}-"
            f"{table[table['policy'] == ALWAYS_ON_LABEL]['slo_violation_pct'].max():.2f}% always on) and most fail MLPerf p99: "
            "they are not comparable as they stand. Frontiers over the autoscaler thresholds, compared at equal "
            "violation, come from `carbon-gym experiment tradeoff --policies rr+reactive,rr+carbon-aware` (eval/frontiers.py "
            "knobs `+reactive`, `+carbon-aware`), and the MILP deciding capacity has its own frontier there (`--set "
            "capacity.control=agent`: `milp (capacity)` over its `max_prefill_share`), not from these runs"
            + ("; the capacity-control bound above is loose (the work at the most efficient batch in the cleanest "
               "datacenters, every other server off, no SLO, no boots): it bounds these runs, it does not say how far "
               "from the best schedule they are." if bound else "; none of these runs is checked against the carbon lower "
               "bound (`python -m eval.bound` on each capacity matrix does it)."))
    slow = table[table["decision_p95_s"] > 0.25]
    if len(slow):
        add("- Decision time p95 above the MILP's 0.25 s real-time budget: " + ", ".join(
            f"{r.policy} on {r.scenario} {1e3 * r.decision_p95_s:.0f} ms" for r in slow.itertuples())
            + " (wall clock on a 2-core machine shared with other work: two to four runs at once).")
    if len(milp) and milp_cap and MILP_ALWAYS_ON_LABEL not in set(table["policy"]):
        add("- The routing-only MILP (capacity.control = always_on) was not run on these windows, so whether capacity "
            "control costs the MILP violations against its own always-on run is not shown here.")
    both = table[table["policy"].isin([MILP_ALWAYS_ON_LABEL, "milp"])].pivot_table(
        index="scenario", columns="policy", values="slo_violation_pct") if MILP_ALWAYS_ON_LABEL in set(table["policy"]) else None
    if both is not None and {"milp", MILP_ALWAYS_ON_LABEL} <= set(both.columns):
        worse = [f"{sc} {both.loc[sc, MILP_ALWAYS_ON_LABEL]:.2f}% -> {both.loc[sc, 'milp']:.2f}%" for sc in both.index
                 if both.loc[sc, "milp"] > both.loc[sc, MILP_ALWAYS_ON_LABEL] + 0.05]
        if worse:
            add("- Deciding capacity costs the MILP violations against its routing-only run in " + ", ".join(worse)
                + f" (per request): its capacity stage keeps awake what the arrival rate needs at a {_milp_util_cap(runs)} "
                "utilisation cap (solvers FacilityConfig.capacity_util_cap), not tuned on these cases (lower caps with `max_prefill_share` 0.3, "
                "`--policy-arg milp.capacity_util_cap=U`, trade carbon for violations: the `milp-s0.3-u*` points of "
                "\"Carbon vs SLO trade-off\" where run).")
    missing = [sc for sc in CAPACITY_SCENARIOS if sc not in set(runs["scenario"])]
    if missing:
        add(f"- Not run (machine time): {', '.join(missing)}; `carbon-gym experiment capacity --preset full --scenarios "
            f"{','.join(missing)} --out {results_dir}/capacity-more` adds them to this section.")
    add("- The autoscalers run at their defaults (carbon_gym/autoscalers.py ReactiveSettings: target_util 0.6, "
        "up 0.8, down 0.35, cool-down 60 s, dirty cap 25%), not tuned on these cases (their frontiers over target_util "
        "and the dirty cap: experiment tradeoff, above).")
    add("- Parameters marked *chosen* in capacity_states.md (boot 300 s + cold start, host standby = host idle, off "
        "40 W, power while booting) have no primary measurement; a deeper host standby would change the "
        "standby-vs-off trade-off.")
    if len(milp):
        add("- milp: " + ("decides capacity jointly with routing (the MILP's capacity decisions)." if milp_cap else
                          "routes only under control = agent, i.e. every engine stays awake (the MILP's capacity "
                          "decisions were not available for this run): its row is the routing-only MILP, not the joint "
                          "decision issue 19 asks for."))
    add(SECTION_END)
    return "\n".join(lines) + "\n"


def _bound_reading(results_dir: str, dirs: Sequence[str]) -> str:
    """The capacity matrices' runs against their episodes' lower bounds (each matrix's
    ``bound_check.csv``, written by ``python -m eval.bound DIR``): a paragraph, or "" when some
    matrix was not checked."""
    import pandas as pd

    paths = [os.path.join(d, "bound_check.csv") for d in dirs]
    if not paths or not all(os.path.isfile(p) for p in paths):
        return ""
    t = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    parts = []
    for scen, g in t.groupby("scenario", sort=False):
        ref = g[(g["policy"] == ALWAYS_ON_LABEL) & ~g["capacity"].astype(bool)]
        cap = g[g["capacity"].astype(bool)]
        if ref.empty or cap.empty:
            continue
        rr_g, b_g = float(ref["carbon_g"].mean()), float(cap["bound_carbon_g"].mean())
        best = cap.loc[cap["carbon_g"].idxmin()]
        share = 100.0 * (rr_g - float(best["carbon_g"])) / (rr_g - float(best["bound_carbon_g"]))
        text = (f"{scen}: the bound {100.0 * (1.0 - b_g / rr_g):.1f}% below always-on rr, the lowest run ({best['policy']}) "
                f"{share:.0f}% of the way to it")
        if "slo_bound_carbon_g" in cap and cap["slo_bound_carbon_g"].notna().all():  # (bound_check.csv written with the SLO-true bound)
            s_g = float(cap["slo_bound_carbon_g"].mean())
            s_share = 100.0 * (rr_g - float(best["carbon_g"])) / (rr_g - float(best["slo_bound_carbon_g"]))
            text += f", the SLO-true bound {100.0 * (1.0 - s_g / rr_g):.1f}% below it ({s_share:.0f}% of the way)"
        parts.append(text)
    cmd = "python -m eval.bound " + " ".join(os.path.relpath(d, os.path.dirname(os.path.abspath(results_dir)) or ".") for d in dirs)
    return (f"**Against the lower bound** (`{cmd}`; eval/bound.py, the capacity-control bound for the runs that decide "
            "capacity: every server at its off power over the window, each engine-second of work at its GPUs' least "
            "active power plus its share of a powered server's host power, in the cheapest datacenters first; the "
            f"always-on bound for the others): {len(t)} runs, {int(t['below'].astype(bool).sum())} below their bound"
            + (f", {int(t['slo_below'].astype(bool).sum())} below their SLO-true bound (eval/bound_slo.py: each datacenter "
               "within its engines' measured p99 capacity, awake engines at least its requests over that capacity; a run "
               "below it exceeded that capacity somewhere, not an error)" if "slo_below" in t else "")
            + ". " + "; ".join(parts) + ".")


def with_capacity_section(old: str, results_dir: str) -> str:
    """``old`` (a RESULTS.md's text, or "") with :func:`capacity_section` in place: between the
    markers when they are there, else before "## Comparison with the study" (or at the end)."""
    text = capacity_section(results_dir)
    if SECTION_BEGIN in old and SECTION_END in old.split(SECTION_BEGIN, 1)[1]:
        head, rest = old.split(SECTION_BEGIN, 1)
        new = head + text.rstrip("\n") + rest.split(SECTION_END, 1)[1]
    elif "\n## Comparison with the study" in old:
        head, rest = old.split("\n## Comparison with the study", 1)
        new = head.rstrip("\n") + "\n\n" + text + "\n## Comparison with the study" + rest
    else:
        new = (old.rstrip("\n") + "\n\n" if old else "") + text
    return new


def write_capacity_section(results_dir: str = "results", *, out: str = "RESULTS.md") -> str:
    """Write :func:`capacity_section` into ``out`` in place (:func:`with_capacity_section`); the
    rest is unchanged."""
    old = open(out, encoding="utf-8").read() if os.path.isfile(out) else ""
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(with_capacity_section(old, results_dir))
    return out


# ----------------------------------------------------------------------------------------------
# the power states' parameters of the scenarios (README's table)


def states_markdown(scenarios: Sequence[str] = CAPACITY_SCENARIOS) -> str:
    """Per scenario: the power file's capacity states (carbon_gym/data/params/power/<gpu>.toml
    ``[states]``) and the durations they give for its model (weights per GPU, TP)."""
    import warnings

    from carbon_gym.physics.power import load_power_model, load_power_states
    from carbon_gym.scenario import load_scenario
    from carbon_gym.specs import load_model_spec

    head = ["scenario", "GPU (TP)", "weights/GPU (GB)", "GPU idle / asleep (W)", "GPU falling asleep / waking (W)",
            "fall asleep (s)", "wake (s)", "host on / standby / off (W per node)", "boot to serving (s)", "booting host / GPU (W)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name in scenarios:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sc = load_scenario(name)
        st, pm = load_power_states(sc.gpu), load_power_model(sc.gpu)
        gb = load_model_spec(sc.model).weight_bytes / sc.tp / 1e9
        lines.append("| " + " | ".join([
            name, f"{sc.gpu} ({sc.tp})", f"{gb:.1f}", f"{pm.idle_w:g} / {st.sleep_w:g}", f"{st.transition_w:g}",
            f"{st.fall_asleep_s(gb, sc.tp):.2f}", f"{st.wake_s(gb, sc.tp):.2f}",
            f"{pm.host_w:g} / {st.host_standby_w:g} / {st.host_off_w:g}", f"{st.boot_s(gb):.0f}",
            f"{st.boot_host_w:g} / {st.boot_gpu_w:g}"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eval.capacity_report [SCENARIO ...]``: print :func:`states_markdown`."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    print(states_markdown(args or CAPACITY_SCENARIOS), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
