"""RESULTS.md's "Within the SLO" section (issue 40): operating points chosen on training starts,
then run on held-out starts, and the issue's targets checked on the held-out runs.

Where the runs live (each a matrix of ``carbon-gym experiment``, its ``config.json`` holding the
command, the settings and the seeds):

- ``<results>/selection/capacity-train*/capacity/``: the capacity experiment on each scenario's
  training starts (``--training-seeds``; never a held-out day): where the setting is chosen;
- ``<results>/slo/capacity/``: the same experiment at the chosen setting on fresh held-out
  starts (``--heldout-seeds``): what is reported.

Neither is merged into the "Capacity control" section (whose rows are the scenarios' default
1 s polling): a row's setting is in the header of its table here.

    carbon-gym report results --section slo     # rewrite only this section of RESULTS.md
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Sequence

import numpy as np

from eval.capacity_report import ALWAYS_ON_LABEL, MILP_ALWAYS_ON_LABEL, OLD_CAPACITY_UTIL_CAP
from eval.stats import mean_ci95
from eval.writers import starts_line

__all__ = ["SECTION_BEGIN", "SECTION_END", "SECTION_TITLE", "TARGETS", "slo_rows", "slo_markdown", "target_checks", "slo_section",
           "with_slo_section", "write_slo_section"]

SECTION_BEGIN = "<!-- slo:begin (carbon-gym report --section slo rewrites this section) -->"
SECTION_END = "<!-- slo:end -->"
SECTION_TITLE = "## Within the SLO: operating points chosen on training starts, tested on held-out starts"

#: Issue 40's targets on held-out starts: (scenario, policy) -> (least reduction vs always-on rr %,
#: most per-request violation % or None). Every target also asks MLPerf p99 in every start.
TARGETS: dict[tuple[str, str], tuple[float, float | None]] = {
    ("llama8b-low", "milp"): (80.0, 1.0),
    ("llama8b-moderate", "milp"): (65.0, None),
}
#: The section's opening paragraph: the setting and why.
INTRO = (
    "Every policy at an operating point chosen on training starts and then run on fresh held-out starts "
    "(issue 40). **The setting: 0.1 s polling, every policy at its default.** The routing-only facility MILP's "
    "default is its measured operating point (`FacilityConfig.operating_point`; the `milp` rows of "
    "`results/slo/milp-measured-*`): after each solve every datacenter keeps at most its measured SLO capacity "
    "of the step, its datacenter figure at the polling period over the engine figure (1.205 / 1.204 / 1.036 on "
    "Llama / Qwen / Mixtral at 0.1 s; `carbon_gym/data/load_levels.toml`, measured with the SLO-true bound's own "
    "probe: a measurement, not a knob), with 1 s of carried credit, its prefill-token budget loosened so that "
    "the cap binds (`max_prefill_share` 1.0) and `mix_fill` on: the settings of `milp-op-c1` / `milp-opdc-c1` "
    "below, each chosen or checked on training starts at high load. Its earlier default, the prefill-token "
    "budget alone (`max_prefill_share` 0.5 over `prefill_horizon_s` 0.5 s, the largest prefill horizon passing "
    "MLPerf p99 in every training start, \"Estimate error and the knobs chosen on training starts\"), is "
    "shown as `milp (budget)`: the rows of the matrices run before the change (the capacity matrices' "
    "`milp (always on)` rows are that MILP too). The "
    "study allows any polling period up to 2 s. At the scenarios' 1 s the polling wait alone (uniform over the "
    "period, 0.5 s on average) plus the network takes about half of the 2 s TTFT budget before any queueing: "
    "round-robin's median TTFT is 0.9-1.0 s there against 0.35-0.40 s at 0.1 s, and every carbon-aware default "
    "failed p99 at 1 s (the headline below this section). The polling section shows the MILP at 0.1, 0.25, 0.5, "
    "1, 2 and 4 s: it passes p99 at 0.1-0.5 s and fails from 1 s. The capacity-deciding MILP routes with the prefill-token budget "
    "(under capacity control the measured step cap is off) and keeps engines awake for the arrival rate's 99% upper "
    "confidence bound, each awake engine planned at 0.9 of its datacenter's measured figure at the polling period "
    "(`FacilityConfig.capacity_basis` \"auto\", the datacenter basis, with no further load margin; chosen on two "
    "training starts of each of seven scenarios, `results/selection/tradeoff-capacity-train-dc`), and boots servers "
    "when that load would pass the measured capacity of the engines on powered servers (since 71fa079 / f8db950; "
    "checked on 12 training starts of llama8b-moderate, `results/selection/tradeoff-capacity-train-12-boot`). Its "
    "earlier default, the engine basis (each engine at 0.9 of the engine figure, or of the datacenter figure where "
    "that is lower, for the rate bound + 10%), is shown as `milp (engine basis)` (`milp (capacity, engine basis)` "
    "in the frontiers), and the capacity matrices run before the boot rows, at the untuned 0.7, as "
    "`milp (engine basis)[capacity_util_cap=0.7]`. `greedy-cap` and `ilp-cap` hold each datacenter per step to "
    "its measured SLO operating point (`capacity_cap` \"measured\": the same ratio as the MILP's step cap, 1.205 / "
    "1.204 / 1.036 at 0.1 s) since e139fbb; their earlier default, 0.9 of the engine figure, is shown as "
    "`greedy-cap[capacity_cap=0.9]` / `ilp-cap[capacity_cap=0.9]`. One row is not a default: "
    "`greedy-op` is `greedy-cap` with its per-step cap at the datacenter's measured SLO operating point "
    "(`capacity_cap` 1.2 of the engine figure on Llama / Qwen, 1.0 on Mixtral: of the caps tried, 1.1-1.3 on "
    "llama8b-high and 1.0-1.2 on qwen7b-high and mixtral8x7b-high, the largest passing p99 in both training starts, "
    "`results/selection/headline-train-greedy-op*`; Qwen's 1.3 was not tried), run at high load, where the MILP misses "
    "the bound target, and with the same caps at moderate load (not re-chosen there). `milp-op` is the facility "
    "MILP at the same operating point: its per-step cap (`step_cap`) at greedy-op's caps, its prefill-token budget "
    "loosened so that the cap binds (`max_prefill_share` 1.0), and `mix_fill` on (each datacenter keeps the "
    "solve's request count but is dealt the step's mix, oldest first to the greenest), checked on the same two "
    "training starts (`results/selection/headline-train-milp-op*`), run at high load and on mixtral8x7b-moderate. "
    "`-c1` marks the same with the cap's carried credit at 1 s of budget instead of two steps "
    "(`capacity_credit_s` / `step_cap_credit_s` 1.0: a datacenter not yet full takes a burst from its saved "
    "budget instead of spilling it to the next datacenter; of 1 and 3 s tried on greedy-op's training starts, "
    "`results/selection/headline-train-credit*`, both passed p99 with the same carbon, and the shorter was "
    "kept); `milp-op-c1` ran on all nine scenarios with the caps and credit chosen at high load, not re-chosen at "
    "low or moderate load, so it is one setting per model. `milp-opdc-c1` is `milp-op-c1` with its step cap at the "
    "datacenter's measured SLO operating point itself instead of the best of a coarse grid: `step_cap` = c_d / the "
    "engine figure (`python -m eval.bound_slo mixtral8x7b-high --set polling_period_s=0.1`: 12.75 / 12.31 = 1.0355 "
    "on Mixtral; the same ratio is 1.205 on Llama and 1.204 on Qwen, where the grid's 1.2 already is that point), "
    "checked on the same two training starts (`results/selection/headline-train-milp-opdc-c1`, p99 2/2) and run "
    "on mixtral8x7b-high, also over a 3600 s window on the same held-out starts (the rows marked `(3600 s "
    "window)`, `results/slo/opdc-c1-mixtral-high-1h`: the work still in flight when a window closes, which "
    "the bound must let go undone, is a sixth of an hour's share of what it is of 600 s). `learned-p01` is the class set policy retrained at "
    "0.1 s polling (`train/configs/llama8b_dagger_p01.toml`: the shipped agent's DAgger on the MILP with every "
    "imitation, validation and training episode at 0.1 s, nothing else re-tuned; exported with the shipped "
    "agent's safety knob, not re-chosen), run on the three Llama scenarios; on Qwen and Mixtral the same label is "
    "that recipe on the model's own scenarios (`train/configs/qwen7b_dagger_p01.toml`, "
    "`mixtral8x7b_dagger_p01.toml`), one agent per model.\n")
#: The heading of the section's table of the study's claims (:func:`eval.study.slo_claims`) and its note.
CLAIMS_TITLE = "### The study's claims at the SLO-true point (held-out starts)"
CLAIMS_NOTE = ("The study's figures beside ours, each policy at its default and compared only where it passes MLPerf "
               "p99 TTFT and TPOT in every start (the tables below have every row; gaps are paired by start, ± the 95% "
               "t-interval). The predictor and polling claims are answered at 1 s polling in \"Comparison with the "
               "study\" at the end of the file; the polling section there also runs the MILP at 0.1-0.5 s.\n")
#: The section's closing paragraph.
OBJECTIONS = (
    "**What a reviewer would object to.** The polling period is a property of the deployment, not of the "
    "policy: at 0.1 s the MILP solves ten programs a second (the decision p95 column), which a real controller "
    "must sustain, and the study's own runs may have used a longer period. The MILP's prefill horizon was "
    "chosen on llama8b-moderate's training starts and only checked, not re-chosen, on two training starts of "
    "every other scenario; the other policies' defaults were not tuned at all, so a policy with slack under the "
    "SLO (near-zero violations) is being compared at a point it could move from: the frontiers compare the "
    "knob-driven ones at equal p99 pass and equal violation where they ran. The windows (600-900 s after a 300 s "
    "burn-in) are short against the carbon day. The shipped learned agent was trained at 1 s polling and run at "
    "0.1 s unchanged on training starts (its failures there a distribution shift); `learned-p01`, trained at 0.1 s, "
    "is the learned row at this setting, one agent per model, each imitating that model's MILP: it can only be as "
    "good as its teacher's choices.")
#: The routing-only MILP's target: at most this many percentage points (of rr's carbon) above the
#: SLO-true bound (eval/bound_slo.py) on every headline scenario, passing MLPerf p99.
BOUND_GAP_PP = 3.0
#: The routing-only MILP at its measured operating point (step_cap, max_prefill_share 1.0,
#: mix_fill; ``-c1``: with 1 s of carried credit; ``opdc``: the cap at the measured c_d itself; see INTRO),
#: checked against the same target where it ran.
MILP_OP_LABELS = ("milp-op", "milp-op-c1", "milp-opdc-c1")
#: Each experiment's window under ``--preset full`` (s): a matrix measured over another one is kept apart (:func:`_read`).
STANDARD_WINDOW_S = {"headline": 600.0, "milp-vs-ilp": 600.0, "tradeoff": 600.0, "capacity": 900.0}
HEADLINE_SCENARIOS = tuple(f"{m}-{ld}" for m in ("llama8b", "qwen7b", "mixtral8x7b") for ld in ("low", "moderate", "high"))


#: The routing-only MILP at the prefill budget alone (``operating_point = "budget"``): how the
#: headline names the ``milp`` rows of matrices run before the measured operating point became
#: the default (their runs.csv has no ``policy_operating_point_measured``; :func:`_read`).
MILP_BUDGET_LABEL = "milp (budget)"
#: The same in a capacity matrix's always-on rows.
MILP_BUDGET_ALWAYS_ON_LABEL = "milp (budget, always on)"
#: The per-step capped heuristics whose default is the measured SLO operating point
#: (``capacity_cap="measured"``; 0.9 before): their earlier rows are labelled apart (:func:`_label_cap_defaults`).
CAP_POLICIES = ("greedy-cap", "ilp-cap")
#: The capacity-deciding MILP on the engine basis (``capacity_basis = "engine"``, load margin 0.1,
#: the default before 89a9dcb): how a capacity matrix names its ``milp`` rows run there
#: (:func:`_label_capacity_defaults`); in a trade-off matrix, whose capacity rows carry the suffix
#: ``" (capacity)"``, :data:`MILP_CAPACITY_ENGINE_LABEL`.
MILP_ENGINE_LABEL = "milp (engine basis)"
MILP_CAPACITY_ENGINE_LABEL = "milp (capacity, engine basis)"


#: A matrix's file naming the policies (their labels in its ``runs.csv``) whose runs a later matrix
#: replaces, with why: ``{"policies": [...], "reason": "...", "replaced_by": "slo/<name>"}``.
SUPERSEDED_FILE = "superseded.json"


def superseded(d: str) -> dict[str, Any]:
    """Matrix ``d``'s :data:`SUPERSEDED_FILE` (the policies whose runs a later matrix replaces,
    kept on disk for the record and left out of every table), its ``policies`` as a set; ``{}``
    without one. A file without a non-empty ``policies`` list or a ``reason`` is refused
    (ValueError naming it)."""
    path = os.path.join(d, SUPERSEDED_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        spec = json.load(fh)
    pols = spec.get("policies") if isinstance(spec, dict) else None
    if not isinstance(pols, list) or not pols or not all(isinstance(p, str) for p in pols) or not str(spec.get("reason") or "").strip():
        raise ValueError(f"{path}: needs 'policies' (a non-empty list of the labels in runs.csv) and 'reason' (why a later "
                         "matrix replaces them), e.g. {\"policies\": [\"milp (capacity)\"], \"reason\": \"...\"}")
    return {**spec, "policies": set(pols)}


def _read(d: str, budget_label: bool = False) -> tuple[Any, dict[str, Any]]:
    """A matrix's runs (``runs.csv`` less the policies a later matrix replaces,
    :func:`superseded`; with ``slo_bound_carbon_g`` per run where ``python -m
    eval.bound`` wrote ``bound_check.csv``) and its config. A matrix measured over another window
    than its experiment's (:data:`STANDARD_WINDOW_S`) names its scenarios with the window
    (``mixtral8x7b-high (3600 s window)``), so that its rows are not merged with the standard ones.
    With ``budget_label``, a routing-only matrix's ``milp`` runs at the prefill budget (run before
    the measured operating point was the default, or fallen back to the budget) are labelled
    :data:`MILP_BUDGET_LABEL`, apart from the default's; in a capacity-deciding matrix, the MILP
    rows run before the current defaults are labelled apart (:func:`_label_capacity_defaults`)."""
    import pandas as pd

    with open(os.path.join(d, "config.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    runs = pd.read_csv(os.path.join(d, "runs.csv"))
    gone = superseded(d).get("policies", set())
    if gone:
        missing = sorted(gone - set(runs["policy"].astype(str)))
        if missing:
            raise ValueError(f"{os.path.join(d, SUPERSEDED_FILE)}: policies {missing} are not in its runs.csv "
                             f"(its policies: {sorted(set(runs['policy'].astype(str)))})")
        runs = runs[~runs["policy"].astype(str).isin(gone)].reset_index(drop=True)
        cfg = {**cfg, "runs": [r for r in cfg.get("runs", []) if str(r.get("label") or r.get("policy")) not in gone]}
    check = os.path.join(d, "bound_check.csv")
    if os.path.isfile(check):
        b = pd.read_csv(check)
        if "slo_bound_carbon_g" in b:
            runs = runs.merge(b[["scenario", "policy", "seed", "slo_bound_carbon_g"]], on=["scenario", "policy", "seed"], how="left")
    want = STANDARD_WINDOW_S.get(os.path.basename(os.path.normpath(d)))
    windows = sorted({float(w) for w in runs["window_s"].dropna()}) if "window_s" in runs else []
    if want is not None and len(windows) == 1 and abs(windows[0] - want) > 1e-6:
        tag = f" ({windows[0]:g} s window)"
        runs = runs.assign(scenario=runs["scenario"].astype(str) + tag)
        cfg = {**cfg, "runs": [{**r, "scenario_label": str(r.get("scenario_label") or r.get("scenario")) + tag}
                               for r in cfg.get("runs", [])]}
    if budget_label and _decides_capacity(cfg):
        return _label_capacity_defaults(runs, cfg)
    if budget_label and not _decides_capacity(cfg):
        runs, cfg = _label_cap_defaults(runs, cfg)
        col = "policy_operating_point_measured"
        if col in runs:  # (a run fallen back to the budget, where no figure was measured)
            old = runs["policy"].eq("milp") & ~runs[col].eq(1.0)
            if bool(old.any()):
                runs = runs.assign(policy=runs["policy"].where(~old, MILP_BUDGET_LABEL))
        else:  # (a matrix run before the measured operating point: its milp rows and knob points)
            names = {lab: _budget_name(lab) for lab in set(runs["policy"].astype(str)) | {"milp"}}
            return _relabelled(runs, cfg, {k: v for k, v in names.items() if v != k})
    return runs, cfg


def _label_cap_defaults(runs: Any, cfg: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A routing matrix's ``greedy-cap`` / ``ilp-cap`` rows not at the measured operating point
    (no ``policy_capacity_cap_measured`` 1 in runs.csv: run before it was their default, at 0.9, or
    fallen back to 0.9 where nothing was measured) as that setting, ``greedy-cap[capacity_cap=0.9]``."""
    from eval.frontiers import knob_label
    from solvers.baselines import CAPACITY_CAP_UNMEASURED

    col = "policy_capacity_cap_measured"
    names = {}
    for lab in CAP_POLICIES:
        mine = runs["policy"].astype(str) == lab
        if bool(mine.any()) and not (col in runs and bool(runs.loc[mine, col].eq(1.0).all())):
            names[lab] = knob_label(lab, "capacity_cap", CAPACITY_CAP_UNMEASURED)
    return _relabelled(runs, cfg, names)


def _relabelled(runs: Any, cfg: dict[str, Any], names: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """``runs`` and ``cfg`` with every run named in ``names`` (its label, else its policy) renamed."""
    if not names:
        return runs, cfg
    cfg = {**cfg, "runs": [{**r, "label": names[str(r.get("label") or r.get("policy"))]}
                           if str(r.get("label") or r.get("policy")) in names else r for r in cfg.get("runs", [])]}
    return runs.assign(policy=runs["policy"].map(lambda p: names.get(str(p), p))), cfg


def _budget_name(label: str) -> str:
    """The name of a routing MILP row run at the prefill budget: ``milp`` -> :data:`MILP_BUDGET_LABEL`,
    a knob point ``milp[k=v]`` -> ``milp (budget)[k=v]``; other labels unchanged."""
    from eval.frontiers import parse_knob_label

    if label == "milp":
        return MILP_BUDGET_LABEL
    parsed = parse_knob_label(label)
    return f"{MILP_BUDGET_LABEL}{label[len('milp'):]}" if parsed is not None and parsed[0] == "milp" else label


def _label_capacity_defaults(runs: Any, cfg: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A capacity-deciding matrix's MILP rows run before the current defaults, apart from them:
    the capacity MILP's (``milp``, ``milp (capacity)`` and their aliases) run on the engine basis
    (``policy_capacity_basis_datacenter`` absent or 0 in runs.csv) become
    :data:`MILP_ENGINE_LABEL` / :data:`MILP_CAPACITY_ENGINE_LABEL` (an alias with one argument a
    setting of it, ``milp (engine basis)[capacity_util_cap=0.8]``; those without
    ``policy_capacity_util_cap`` ran at :data:`OLD_CAPACITY_UTIL_CAP`, ``...[capacity_util_cap=0.7]``);
    one run on the datacenter basis with arguments equal to today's defaults (``capacity_basis``
    datacenter, ``capacity_load_margin`` 0) is the default, ``milp`` (its remaining argument, if
    one, a setting of it); the always-on MILP's without ``policy_operating_point_measured`` ran at
    the prefill budget (:data:`MILP_BUDGET_ALWAYS_ON_LABEL`)."""
    from eval.frontiers import CAPACITY_SUFFIX, knob_label, parse_knob_label
    from solvers.facility_model import CAPACITY_LOAD_MARGIN

    at_default = {"capacity_basis": ("datacenter", "auto"), "capacity_load_margin": (CAPACITY_LOAD_MARGIN["datacenter"],)}
    col = "policy_capacity_basis_datacenter"
    names: dict[str, str] = {}
    stripped: dict[str, dict[str, Any]] = {}  # (a default-basis run's arguments less those equal to today's defaults)
    for r in cfg.get("runs", []):
        label = str(r.get("label") or r.get("policy"))
        if r.get("policy") != "milp" or str((r.get("overrides") or {}).get("capacity.control", "always_on")) != "agent" or label in names:
            continue
        suffix = CAPACITY_SUFFIX if label.endswith(CAPACITY_SUFFIX) else ""
        kw = dict(r.get("policy_kwargs") or {})
        mine = runs[runs["policy"].astype(str) == label]
        if col in runs and len(mine) and bool(mine[col].eq(1.0).all()):
            base, tag = "milp" + suffix, ""
            kw = stripped[label] = {k: v for k, v in kw.items() if k not in at_default or v not in at_default[k]}
        else:
            base, tag = (MILP_CAPACITY_ENGINE_LABEL if suffix else MILP_ENGINE_LABEL), " (engine basis)"
            if "policy_capacity_util_cap" not in runs and "capacity_util_cap" not in kw:
                kw = {"capacity_util_cap": OLD_CAPACITY_UTIL_CAP}
        parsed = parse_knob_label(label)
        v = next(iter(kw.values()), None)
        if not kw:
            names[label] = base if parsed is None else base + label[len(parsed[0]):]
        elif len(kw) == 1 and isinstance(v, (int, float)) and not isinstance(v, bool):
            names[label] = knob_label(base, str(next(iter(kw))), float(v))
        else:
            names[label] = label + tag
    cfg = {**cfg, "runs": [{**r, "policy_kwargs": stripped[str(r.get("label") or r.get("policy"))]}
                           if r.get("policy") == "milp" and str(r.get("label") or r.get("policy")) in stripped else r
                           for r in cfg.get("runs", [])]}
    if "policy_operating_point_measured" not in runs:
        names[MILP_ALWAYS_ON_LABEL] = MILP_BUDGET_ALWAYS_ON_LABEL
    return _relabelled(runs, cfg, {k: v for k, v in names.items() if v != k})


def _setting(cfg: dict[str, Any], label: str, scenario: str | None = None) -> str:
    """The polling period and the policy arguments of ``label``'s runs in ``cfg`` (of
    ``scenario`` where given: one label may carry other arguments in another matrix), as text."""
    runs = [r for r in cfg.get("runs", []) if (r.get("label") or r.get("policy")) == label
            and (scenario is None or (r.get("scenario_label") or r.get("scenario")) == scenario)]
    if not runs:
        return "?"
    r = runs[0]
    parts = [f"polling {float(r.get('polling_period_s', r.get('overrides', {}).get('polling_period_s', 1.0))):g} s"]
    parts += [f"{k} {v}" for k, v in sorted((r.get("policy_kwargs") or {}).items())]
    return ", ".join(parts)


def slo_rows(runs: Any, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (scenario, policy) of a capacity matrix's ``runs``: the reduction vs the
    always-on rr of the same seed (%, mean and 95% CI half-width), the per-request violation (%),
    the seeds passing MLPerf p99 (TTFT and TPOT) with their work done (an invalid start, ``run_valid``
    false: more than :data:`eval.runner.VALID_UNFINISHED_PCT` % of its window's work left unfinished,
    does not pass: its late requests never reach the percentiles; ``invalid`` counts them), the worst
    seed's p99 TTFT and TPOT (ms) and the setting (polling period, policy arguments)."""
    rows = []
    ref_label = ALWAYS_ON_LABEL if ALWAYS_ON_LABEL in set(runs["policy"]) else "rr"
    seen = list(dict.fromkeys(runs["scenario"]))  # the headline's scenarios in their order, then any other
    for scen in [s for s in HEADLINE_SCENARIOS if s in seen] + [s for s in seen if s not in HEADLINE_SCENARIOS]:
        sub = runs[runs["scenario"] == scen]
        ref = sub[sub["policy"] == ref_label].set_index("seed")["carbon_g"]
        for pol in dict.fromkeys(sub["policy"]):
            g = sub[sub["policy"] == pol]
            red = [100.0 * (float(ref.loc[s]) - float(c)) / float(ref.loc[s]) for s, c in zip(g["seed"], g["carbon_g"]) if s in ref.index]
            r_m, r_ci = mean_ci95(red)
            gap = [100.0 * (float(c) - float(b)) / float(ref.loc[s]) for s, c, b in
                   zip(g["seed"], g["carbon_g"], g.get("slo_bound_carbon_g", [float("nan")] * len(g))) if s in ref.index]
            g_m, g_ci = mean_ci95(gap) if gap and np.all(np.isfinite(gap)) else (float("nan"), float("nan"))
            v_m, v_ci = mean_ci95(g["slo_violation_pct"].to_numpy(np.float64))
            fails = [w for w, col in (("TTFT", "mlperf_ttft_p99_pass"), ("TPOT", "mlperf_tpot_p99_pass"))
                     if col in g and not bool(g[col].astype(bool).all())]
            valid = g["run_valid"].astype(bool).to_numpy() if "run_valid" in g else np.ones(len(g), dtype=bool)
            rows.append({"scenario": scen, "policy": pol, "seeds": len(g), "seed_list": sorted(int(s) for s in g["seed"]),
                         "reduction_pct": r_m, "reduction_ci95": r_ci, "violation_pct": v_m, "violation_ci95": v_ci,
                         "p99_pass": int((g["mlperf_p99_pass"].astype(bool).to_numpy() & valid).sum()),
                         "p99_fails": "+".join(fails), "invalid": int((~valid).sum()),
                         "ttft_p99_ms": 1e3 * float(g["ttft_p99_s"].max()), "tpot_p99_ms": 1e3 * float(g["tpot_p99_s"].max()),
                         "decision_p95_ms": 1e3 * float(g["decision_p95_s"].max()) if "decision_p95_s" in g else float("nan"),
                         "unfinished_pct": float(g["unfinished_pct"].max()) if "unfinished_pct" in g else 0.0,
                         "cpu_s": float(g["cpu_s"].sum()) if "cpu_s" in g else float("nan"),
                         "bound_gap_pp": g_m, "bound_gap_ci95": g_ci, "reference": ref_label,
                         "setting": _setting(cfg, pol, str(scen))})
    return rows


def _num(v: float, d: int) -> str:
    return f"{v:.{d}f}" if np.isfinite(v) else "–"


def _ci(m: float, ci: float, d: int) -> str:
    return f"{m:.{d}f}" + (f" ± {ci:.{d}f}" if np.isfinite(ci) else "")


def slo_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """:func:`slo_rows` as a Markdown table."""
    gaps = any(np.isfinite(r.get("bound_gap_pp", float("nan"))) for r in rows)
    ref = "always-on rr" if rows and rows[0].get("reference", ALWAYS_ON_LABEL) == ALWAYS_ON_LABEL else "rr"
    head = (f"| scenario | policy | setting | seeds | vs {ref} % | SLO viol. % | MLPerf p99 pass | worst TTFT p99 (ms) "
            "| worst TPOT p99 (ms) | worst decision p95 (ms) |" + (" above the SLO-true bound (pp) |" if gaps else "") + "\n"
            + "|---" * (11 if gaps else 10) + "|\n")
    body = "".join(
        f"| {r['scenario']} | {r['policy']} | {r['setting']} | {r['seeds']} | {_ci(r['reduction_pct'], r['reduction_ci95'], 1)} | "
        f"{_ci(r['violation_pct'], r['violation_ci95'], 2)} | {r['p99_pass']}/{r['seeds']} "
        f"{'✓' if r['p99_pass'] == r['seeds'] else '✗ (' + _fail_text(r) + ')'} | {r['ttft_p99_ms']:.0f} | {r['tpot_p99_ms']:.0f} | {_num(r.get('decision_p95_ms', float('nan')), 1)} |"
        + (f" {_ci(r['bound_gap_pp'], r['bound_gap_ci95'], 1) if np.isfinite(r.get('bound_gap_pp', float('nan'))) else '–'} |" if gaps else "")
        + "\n" for r in rows)
    return head + body


def _fail_text(r: dict[str, Any]) -> str:
    """Why a row fails MLPerf p99 in some start: the percentile(s), and the starts left invalid
    (more than 1% of the window's work unfinished, the worst start's share)."""
    parts = [r["p99_fails"]] if r["p99_fails"] else []
    if r.get("invalid"):
        parts.append(f"{r['invalid']} invalid: {r['unfinished_pct']:.1f}% unfinished")
    return "; ".join(parts) or "?"


def _gap_line(want: str, r: dict[str, Any]) -> str:
    """A bound-gap target line: met when the run is within :data:`BOUND_GAP_PP` of the SLO-true
    bound and passes p99 in every start, with its figures."""
    ok = r["bound_gap_pp"] <= BOUND_GAP_PP and r["p99_pass"] == r["seeds"]
    return (f"- {want}: **{'met' if ok else 'not met'}**: {r['bound_gap_pp']:.1f} pp above it, {r['reduction_pct']:.1f}% below "
            f"rr at {r['violation_pct']:.2f}% violation, p99 {r['p99_pass']}/{r['seeds']} ({r['seeds']} held-out starts).")


def _verdict(r: dict[str, Any], least: float, most: float | None) -> str:
    """A capacity target's verdict on one row: met when its reduction is at least ``least`` %,
    every start passes MLPerf p99 and (``most`` given) its violation is at most ``most`` %."""
    ok = r["reduction_pct"] >= least and r["p99_pass"] == r["seeds"] and (most is None or r["violation_pct"] <= most)
    return (f"**{'met' if ok else 'not met'}**: {r['reduction_pct']:.1f}% at {r['violation_pct']:.2f}% violation, "
            f"p99 {r['p99_pass']}/{r['seeds']}.")


def target_checks(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per :data:`TARGETS` entry: met / not met on ``rows`` (held-out), with the figures
    (and the capacity MILP's targets again at its earlier defaults, the engine basis and the cap
    0.7, where their rows are there)."""
    from eval.frontiers import knob_label

    out = []
    by = {(r["scenario"], r["policy"]): r for r in rows if r.get("reference") == ALWAYS_ON_LABEL}  # (capacity matrices' rows)
    rt: list[str] = []
    routing = {r["scenario"]: r for r in rows if r["policy"] == MILP_ALWAYS_ON_LABEL}
    routing.update({r["scenario"]: r for r in rows if r["policy"] == "milp" and r.get("reference") == "rr"})  # headline runs
    for scen in HEADLINE_SCENARIOS:
        r = routing.get(scen)
        want = f"routing-only MILP within {BOUND_GAP_PP:g} pp of the SLO-true bound on {scen}"
        if r is None or not np.isfinite(r.get("bound_gap_pp", float("nan"))):
            rt.append(f"- {want}: not run" + (" (no bound_check.csv: python -m eval.bound on its matrix)" if r is not None else "") + ".")
            continue
        rt.append(_gap_line(want, r))
    op = {(r["scenario"], r["policy"]): r for r in rows if r["policy"] in MILP_OP_LABELS}
    longer = sorted({str(r["scenario"]) for r in rows if str(r["scenario"]).split(" (")[0] in HEADLINE_SCENARIOS} - set(HEADLINE_SCENARIOS))
    for scen, label in ((s_, lb) for s_ in (*HEADLINE_SCENARIOS, *longer) for lb in MILP_OP_LABELS):
        r = op.get((scen, label))
        if r is not None and np.isfinite(r.get("bound_gap_pp", float("nan"))):
            rt.append(_gap_line(f"the same with the MILP at its operating point ({label}) on {scen}", r))
    for (scen, pol), (least, most) in TARGETS.items():
        r = by.get((scen, pol))
        want = f">= {least:g}% below always-on rr, MLPerf p99 in every start" + (f", <= {most:g}% violation" if most is not None else "")
        if r is None:
            out.append(f"- {pol} deciding capacity on {scen} ({want}): not run.")
            continue
        out.append(f"- {pol} deciding capacity on {scen} ({want}): {_verdict(r, least, most)}")
        if pol != "milp":
            continue
        old = by.get((scen, MILP_ENGINE_LABEL))  # (matrices run before the datacenter basis was the default)
        if old is not None:
            out.append(f"- the same on the engine basis (the default before 89a9dcb) on {scen}: {_verdict(old, least, most)}")
        old = by.get((scen, knob_label(MILP_ENGINE_LABEL, "capacity_util_cap", OLD_CAPACITY_UTIL_CAP)))  # (before the cap's default)
        if old is not None:
            out.append(f"- the same on the engine basis at the capacity stage's earlier cap {OLD_CAPACITY_UTIL_CAP:g} on {scen}: "
                       f"{_verdict(old, least, most)}")
    return out + rt


#: The experiments whose matrices the section reads, in its order.
EXPERIMENTS = ("headline", "milp-vs-ilp", "tradeoff", "capacity")


def _dirs(results_dir: str) -> tuple[list[str], dict[str, list[str]]]:
    """The training selection's matrices (``selection/<exp>-train*/<exp>``) and, per experiment
    of :data:`EXPERIMENTS`, the held-out ones (``slo/<exp>`` and ``slo/<name>/<exp>``)."""
    sel = sorted(os.path.dirname(p) for exp in ("capacity", "headline")
                 for p in glob.glob(os.path.join(results_dir, "selection", f"{exp}-train*", exp, "runs.csv")))
    held = {exp: sorted(os.path.dirname(p) for pat in (os.path.join("slo", exp), os.path.join("slo", "*", exp))
                        for p in glob.glob(os.path.join(results_dir, pat, "runs.csv"))) for exp in EXPERIMENTS}
    return sel, {k: v for k, v in held.items() if v}


def _deciding_capacity(d: str) -> bool:
    """Whether a trade-off matrix has policies deciding capacity (``--set capacity.control=agent``
    or ``POLICY+AUTOSCALER``): its rows go to their own subsection, apart from the always-on ones."""
    with open(os.path.join(d, "config.json"), encoding="utf-8") as fh:
        return _decides_capacity(json.load(fh))


def _decides_capacity(cfg: dict[str, Any]) -> bool:
    """:func:`_deciding_capacity` of a matrix's loaded ``config.json``."""
    return any(str((r.get("overrides") or {}).get("capacity.control", "always_on")) == "agent" for r in cfg.get("runs", []))


def as_settings(runs: Any, cfg: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``runs`` and ``cfg`` with each alias of a policy (``milp-u0.8=milp`` with one policy argument,
    ``capacity_util_cap`` 0.8) labelled as that policy's setting (``milp (capacity)[capacity_util_cap=0.8]``,
    :func:`eval.frontiers.knob_label`, the table suffix kept), so that :func:`eval.slo_compare.best_within_slo`
    reads the aliases as settings of one policy. The label is built from the argument the run
    recorded; an alias with no argument or several keeps its label."""
    from eval.frontiers import CAPACITY_SUFFIX, knob_label, parse_knob_label

    names: dict[str, str] = {}
    for r in cfg.get("runs", []):
        label, pol = str(r.get("label") or r.get("policy")), str(r.get("policy"))
        kw = r.get("policy_kwargs") or {}
        suffix = CAPACITY_SUFFIX if label.endswith(CAPACITY_SUFFIX) else ""
        if label in (pol, pol + suffix) or parse_knob_label(label) is not None or len(kw) != 1:
            continue
        (k, v), = kw.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            names[label] = knob_label(pol + suffix, str(k), float(v))
    return _relabelled(runs, cfg, names)


def _deciding_rows(runs: Any) -> Any:
    """A capacity matrix's runs less the always-on ones other than their reference
    (``rr (always on)``) and less ``rr`` deciding nothing (always on in effect)."""
    return runs[~runs["policy"].isin(["rr", MILP_ALWAYS_ON_LABEL, MILP_BUDGET_ALWAYS_ON_LABEL])].reset_index(drop=True)


def _merged(dirs: Sequence[str], budget_label: bool = False) -> tuple[Any, dict[str, Any]]:
    """The runs of ``dirs`` as one table (a (scenario, policy, seed) run twice: the first kept, so a
    later matrix's rr repeat adds nothing) and their configs' ``runs`` lists joined
    (``budget_label``: :func:`_read`)."""
    import pandas as pd

    parts = [_read(d, budget_label) for d in dirs]
    runs = pd.concat([r for r, _ in parts], ignore_index=True).drop_duplicates(["scenario", "policy", "seed"], keep="first")
    return runs.reset_index(drop=True), {"runs": [m for _, c in parts for m in c.get("runs", [])]}


def _matrix_line(d: str, results_dir: str) -> list[str]:
    """A matrix's size, window, cost and starts (two lines of text)."""
    runs, cfg = _read(d)
    meta = cfg.get("runs", [])
    warm = sorted({float(r.get("overrides", {}).get("env.warmup_s", 0.0)) for r in meta})
    window = sorted({float(w) for w in runs["window_s"].dropna()}) if "window_s" in runs else []
    el = cfg.get("elapsed_s")
    spec = superseded(d)
    if spec:
        el = None  # the wall time was the whole matrix's
        note = (f" (its runs of {', '.join(f'`{p}`' for p in sorted(spec['policies']))} left out: {str(spec['reason']).strip().rstrip('.')}"
                + (f"; replaced by {spec['replaced_by']}" if spec.get("replaced_by") else "") + ")")
    else:
        note = ""
    return [f"- {os.path.relpath(d, results_dir)}{note}: {len(runs)} runs, {', '.join(f'{w:g}' for w in window) or '?'} s measured after "
            f"{', '.join(f'{w:g}' for w in warm)} s of burn-in; {float(runs['cpu_s'].sum()) / 60:.1f} CPU-min"
            + (f", {float(el) / 60:.1f} min wall on {cfg.get('workers')} worker(s), 2 cores shared with other work" if el else ""),
            starts_line(meta) + "\n"]


def _estimate_error_markdown(dirs: Sequence[str], capacity_dirs: Sequence[str] = ()) -> str:
    """The estimate-error table (:func:`eval.estimate_error.error_table`) of the runs in ``dirs``
    and ``capacity_dirs`` that logged estimates, one row per (scenario, policy); "" when none did.
    A capacity matrix's policies deciding capacity under a plain name (``milp``) are shown with
    the capacity suffix (``milp (capacity)``), apart from the routing-only runs of that name."""
    import pandas as pd

    from eval.estimate_error import error_markdown, error_table
    from eval.frontiers import CAPACITY_SUFFIX

    frames = [_merged(dirs, budget_label=True)[0]] if dirs else []
    if capacity_dirs:
        cap = _merged(capacity_dirs, budget_label=True)[0]
        plain = ~cap["policy"].isin([ALWAYS_ON_LABEL, MILP_ALWAYS_ON_LABEL, MILP_BUDGET_ALWAYS_ON_LABEL]) \
            & ~cap["policy"].astype(str).str.contains(r"[(\[+]")
        frames.append(cap.assign(policy=cap["policy"].where(~plain, cap["policy"].astype(str) + CAPACITY_SUFFIX)))
    if not frames:
        return ""
    runs = pd.concat(frames, ignore_index=True).drop_duplicates(["scenario", "policy", "seed"], keep="first")
    return str(error_markdown(error_table(runs)))


def _with_headline_defaults(runs: Any, headline: Any, policies: Sequence[str] = ("milp",)) -> tuple[Any, str]:
    """``runs`` (a matrix whose starts lack some of ``policies`` at their current defaults, e.g. the
    routing MILP's ``milp``, in some or all scenarios) with the held-out headline's runs of those
    labels and (scenario, seed) where the headline's rr run is the matrix's own bit for bit (same
    start, same requests: then the policy's run is too, the simulation being deterministic), and
    the note saying so; ``runs`` unchanged and "" when they are not, or when nothing is missing."""
    import pandas as pd

    from eval.versus import carbon_by_start, first_other_episode

    mine, theirs = carbon_by_start(runs, "rr"), carbon_by_start(headline, "rr")
    if not set(mine) <= set(theirs) or first_other_episode(mine, theirs) is not None:
        return runs, ""
    starts = list(zip(headline["scenario"].astype(str), headline["seed"].astype(int)))
    parts, notes = [runs], []
    for pol in policies:
        own = runs[runs["policy"] == pol]
        have = set(zip(own["scenario"].astype(str), own["seed"].astype(int)))
        take = pd.Series([k in mine and k not in have for k in starts], index=headline.index)
        got = headline[(headline["policy"] == pol) & take]
        if not got.empty:
            parts.append(got)
            notes.append(f"`{pol}` on {', '.join(dict.fromkeys(got['scenario'].astype(str)))}")
    if not notes:
        return runs, ""
    return (pd.concat(parts, ignore_index=True),
            f"; the default rows of {'; '.join(notes)} are the held-out headline's runs of the same starts (its rr "
            "runs equal this matrix's to the last bit, so they were not run twice)")


_TABLE_NOTE = ("vs round-robin of the same start at the same polling period, always on; worst TTFT/TPOT p99 = the "
               "highest start's; above the SLO-true bound = (run - bound) / rr's carbon, pp, paired by start, where "
               "`python -m eval.bound` has checked the matrix")


def _budget_note(dirs: Sequence[str]) -> str:
    """A note for the matrices among ``dirs`` run before the measured operating point was the
    routing MILP's default (no ``policy_operating_point_measured`` in their runs.csv): their
    ``milp`` rows and knob points are the MILP at the prefill budget."""
    import pandas as pd

    old = [os.path.basename(os.path.dirname(os.path.normpath(d))) for d in dirs
           if "policy_operating_point_measured" not in pd.read_csv(os.path.join(d, "runs.csv"), nrows=1).columns]
    if not old:
        return ""
    return ("; in " + ", ".join(old) + " the MILP rows are the MILP at the prefill budget (`operating_point` budget, "
            f"the default when they ran), shown as `{MILP_BUDGET_LABEL}` and its knob points as "
            f"`{MILP_BUDGET_LABEL}[...]`")


def _frontier_body(dirs: Sequence[str], results_dir: str, headline: Any = None) -> list[str]:
    """The frontier subsections of the held-out trade-off matrices ``dirs``: the always-on ones
    (anchor: the routing-only MILP at its current default; where a matrix ran before it, its MILP
    rows are :data:`MILP_BUDGET_LABEL` and its knob points ``milp (budget)[...]``, and the default's
    rows come from the held-out headline's runs ``headline`` of the same starts) and, apart,
    those of policies deciding capacity (anchor: the capacity-deciding MILP)."""
    from eval.slo_compare import best_within_slo, best_within_slo_markdown

    body: list[str] = []
    deciding = [d for d in dirs if _deciding_capacity(d)]
    always_on = [d for d in dirs if d not in deciding]
    if always_on:
        from eval.frontiers import equal_violation, equal_violation_markdown

        runs, cfg = _merged(always_on, budget_label=True)
        borrowed = ""
        if headline is not None:
            runs, borrowed = _with_headline_defaults(runs, headline, ("milp", *CAP_POLICIES))
        body += ["### Frontiers at the SLO-true point (held-out starts)\n",
                 "Each knob-driven policy at several settings; at equal p99 pass, the best setting passing MLPerf p99 "
                 "in every start (chosen on these starts: optimistic by up to the noise between settings), and at "
                 "equal violation, each frontier read per start at rr's and at the MILP default's violation "
                 "(eval/frontiers.py)" + _budget_note(always_on) + borrowed + ":\n"]
        for d in always_on:
            body += _matrix_line(d, results_dir)
        body += [best_within_slo_markdown(best_within_slo(runs)), equal_violation_markdown(equal_violation(runs))]
    if deciding:
        from eval.frontiers import CAPACITY_SUFFIX

        runs, cfg = as_settings(*_merged(deciding, budget_label=True))
        anchor = "milp" + CAPACITY_SUFFIX
        body += ["### Capacity control: frontiers at the SLO-true point (held-out starts)\n",
                 "Policies deciding the engines awake and the servers powered, each at several settings (an alias "
                 "of a policy with one argument is shown as that policy's setting, `milp (capacity)[capacity_util_cap=0.8]`); "
                 f"{_TABLE_NOTE} (the capacity-control bound). Then, at equal p99 pass, each policy's best setting "
                 f"passing MLPerf p99 in every start (chosen on these starts: optimistic by up to the noise between "
                 f"settings) against the capacity-deciding MILP's ({anchor}), paired by start:\n"]
        for d in deciding:
            body += _matrix_line(d, results_dir)
        body += [slo_markdown(slo_rows(runs, cfg)), best_within_slo_markdown(best_within_slo(runs, anchor=anchor), anchor=anchor)]
    return body


def slo_section(results_dir: str) -> str:
    """The section's text (between its markers) from the runs under ``results_dir`` (module doc)."""
    from eval.milp_vs_ilp import milp_vs_ilp_markdown, milp_vs_ilp_table
    from eval.slo_compare import best_within_slo, best_within_slo_markdown
    from eval.study import slo_claims, slo_claims_markdown

    sel, held = _dirs(results_dir)
    if not sel and not held:
        raise FileNotFoundError(f"no SLO runs under {results_dir!r}: {os.path.join(results_dir, 'selection', 'capacity-train-<scenario>')} "
                                f"or {os.path.join(results_dir, 'slo', 'capacity')} (module eval.slo_report)")
    lines = [SECTION_BEGIN, SECTION_TITLE, ""]
    add = lines.append
    add(INTRO)
    claims_at = len(lines)  # (the study's claims go here, ahead of the commands, once the tables are built)
    add("```bash")
    cpu = 0.0
    every = sel + [d for exp in EXPERIMENTS for d in held.get(exp, [])]
    for d in every:
        runs, cfg = _read(d)
        add(str(cfg.get("command") or "carbon-gym experiment"))
        cpu += float(runs["cpu_s"].sum()) if "cpu_s" in runs else 0.0
    add(f"carbon-gym report {results_dir} --section slo")
    add("```\n")
    all_held: list[dict[str, Any]] = []
    body: list[str] = []
    headline = None  # (the held-out headline's runs, read once)
    claims: dict[str, Any] = {"headline_rows": [], "capacity_rows": [], "bound_target_pp": BOUND_GAP_PP}  # (eval.study.slo_claims's inputs)
    if "headline" in held:
        runs, cfg = _merged(held["headline"], budget_label=True)
        headline = runs
        rows = slo_rows(runs, cfg)
        all_held += rows
        claims.update(headline_rows=rows, headline_bws=best_within_slo(runs))
        body += ["### The headline at the SLO-true point (held-out starts)\n", f"({_TABLE_NOTE}.)\n"]
        for d in held["headline"]:
            body += _matrix_line(d, results_dir)
        body += [slo_markdown(rows),
                 "**At equal p99 pass** (each policy's best setting among those passing MLPerf p99 in every start, "
                 "the MILP's minus the policy's reduction paired by start; here every policy ran at one setting, its "
                 "default or, for greedy-op, one chosen on training starts, so nothing was selected on these starts; "
                 "module eval.slo_compare):\n",
                 best_within_slo_markdown(claims["headline_bws"])]
    if "milp-vs-ilp" in held:
        runs, cfg = _merged(held["milp-vs-ilp"], budget_label=True)
        borrowed = ""
        if headline is not None:
            runs, borrowed = _with_headline_defaults(runs, headline, ("milp", "ilp-cap"))
        body += ["### Facility MILP vs per-request ILPs at the SLO-true point (held-out starts)\n",
                 "Reduction vs rr, % (SLO violation %; MLPerf p99 verdict), and the paired gap MILP - ILP in "
                 "percentage points (invalid = more than 1% of the work left unfinished in some start)" + borrowed + ":\n"]
        for d in held["milp-vs-ilp"]:
            body += _matrix_line(d, results_dir)
        claims["milp_ilp_bws"] = best_within_slo(runs)
        body += [milp_vs_ilp_markdown(milp_vs_ilp_table(runs)),
                 "At equal p99 pass (module eval.slo_compare):\n", best_within_slo_markdown(claims["milp_ilp_bws"])]
    body += _frontier_body(held.get("tradeoff", []), results_dir, headline)
    if "capacity" in held:
        runs, cfg = _merged(held["capacity"], budget_label=True)
        rows = slo_rows(runs, cfg)
        all_held += rows
        claims.update(capacity_rows=rows, capacity_bws=best_within_slo(_deciding_rows(runs), anchor="milp"))
        body += ["### Capacity control at the SLO-true point (held-out starts)\n", f"({_TABLE_NOTE}.)\n"]
        for d in held["capacity"]:
            body += _matrix_line(d, results_dir)
        body += [slo_markdown(rows),
                 "**At equal p99 pass** against the capacity MILP at its default (`milp`), paired by start (module "
                 "eval.slo_compare; every policy here ran at its default, so nothing was selected on these starts, "
                 f"except that the MILP's earlier defaults, `{MILP_ENGINE_LABEL}` and its cap 0.7, are one policy whose "
                 "better setting is shown):\n",
                 best_within_slo_markdown(claims["capacity_bws"], anchor="milp")]
    ours = slo_claims_markdown(slo_claims(**claims))
    if ours:
        lines[claims_at:claims_at] = [CLAIMS_TITLE + "\n", CLAIMS_NOTE, ours, "The commands of every matrix below:\n"]
    add("**Issue 40's targets on the held-out starts:**\n")
    lines.extend(target_checks(all_held) if all_held else ["- not run yet."])
    add("")
    lines.extend(body)
    est = _estimate_error_markdown(held.get("headline", []), held.get("capacity", []))
    if est:
        add("### The schedulers' estimates on the held-out starts\n")
        add("Issue 40 item 1: predicted - realised, ms, per request at the datacenter chosen; quantiles over each "
            "run's measured requests, mean over its starts; negative = the scheduler was optimistic. `carbon-gym eval` "
            "prints the same figures per run (`ttft_estimate_error_p90_ms=...`).\n")
        add(est)
    add("### Training starts (where the settings were chosen)\n")
    if not sel:
        add("Not run yet.\n")
    for d in sel:
        runs, cfg = _read(d)
        lines.extend(_matrix_line(d, results_dir))
        add(slo_markdown(slo_rows(runs, cfg)))
    add(f"CPU time of all runs of this section: {cpu / 60:.1f} min.\n")
    add(OBJECTIONS)
    add(SECTION_END)
    return "\n".join(lines) + "\n"


def with_slo_section(old: str, results_dir: str) -> str:
    """``old`` with :func:`slo_section` in place: between its markers when there, else before the
    headline ("## Headline", so that the operating points within the SLO lead), else before
    "## Capacity control"'s marker (or heading), else at the end."""
    from eval.capacity_report import SECTION_BEGIN as CAP_BEGIN

    text = slo_section(results_dir)
    if SECTION_BEGIN in old and SECTION_END in old.split(SECTION_BEGIN, 1)[1]:
        head, rest = old.split(SECTION_BEGIN, 1)
        return head + text.rstrip("\n") + rest.split(SECTION_END, 1)[1]
    for anchor in ("## Headline", CAP_BEGIN, "## Capacity control"):
        if anchor in old:
            head, rest = old.split(anchor, 1)
            return head.rstrip("\n") + "\n\n" + text + "\n" + anchor + rest
    return (old.rstrip("\n") + "\n\n" if old else "") + text


def write_slo_section(results_dir: str = "results", *, out: str = "RESULTS.md") -> str:
    """Write :func:`slo_section` into ``out`` in place (:func:`with_slo_section`); the rest is kept."""
    from eval.writers import write_text

    old = open(out, encoding="utf-8").read() if os.path.isfile(out) else ""
    write_text(out, with_slo_section(old, results_dir))
    return out
