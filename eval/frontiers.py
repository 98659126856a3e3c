"""Carbon-vs-violation frontiers of the knob-driven policies, and comparisons at equal violation.

A knob-driven policy trades carbon for SLO violations through one setting (:data:`KNOBS`: the
planner's utilisation, the facility MILP's utilisation cap (``max_prefill_share``; its violation
penalty hardly moves its violations), the learned agent's safety knob (any ``learned:<checkpoint>``),
the capacity caps of ``greedy-cap`` / ``ilp-cap``, the reactive autoscaler's target utilisation
(any ``POLICY+reactive``, a scenario setting: ``capacity.params.target_util``) and the carbon-aware one's
cap in dirty hours (``POLICY+carbon-aware``: ``capacity.params.dirty_cap_frac``); more join with
:func:`register_knob`). Reporting it at its default alone compares one
point of its trade-off with one point of another's: a policy can look better only because it
violates more. So each is run at every value of its knob (:func:`frontier_specs`), and

* :func:`frontier_points` gives its points (reduction vs rr and violation, means over seeds);
* :func:`envelope_at` reads a frontier at a violation level: the Pareto-efficient points
  (no other point has both less violation and more reduction) joined by straight lines (a
  policy can reach any mix of two settings by switching between them), undefined below the
  least violation the knob reaches, flat above the most;
* :func:`equal_violation` compares the policies per seed at equal violation: each frontier read
  at the violation of round-robin in that seed (the reference's SLO) and at the facility MILP's
  default's, then mean ± 95% CI over the seeds where it is reached.

Invalid runs (work left unfinished, :data:`eval.runner.VALID_UNFINISHED_PCT`) are no points.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from eval.runner import RunSpec, always_on_overrides, freeze, make_specs
from eval.stats import mean_ci95

__all__ = ["Knob", "KNOBS", "CAPACITY_SUFFIX", "register_knob", "knob_for", "knob_policies", "knob_values_from_cli", "set_knob_values", "knob_label", "frontier_specs", "frontier_points", "envelope_at",
           "equal_violation", "parse_knob_label", "tradeoff_tables", "tradeoff_section"]


@dataclass(frozen=True)
class Knob:
    """The setting a policy's trade-off runs along.

    Attributes:
        policy: whom it drives: a registry name (``planner``), a prefix (``learned``: every
            ``learned:<checkpoint>``) or ``+AUTOSCALER`` (``+reactive``: every ``POLICY+reactive``);
            :func:`knob_for`.
        kwarg: its name in tables and labels; the policy's keyword argument swept, unless ``override``.
        values: the values run (the default among them).
        default: the policy's default value (its run is the policy's own row).
        doc: what the knob does, one line.
        override: when set, the knob is this scenario setting (a dotted override key, e.g.
            ``capacity.params.target_util``) rather than a keyword argument of the policy.
    """

    policy: str
    kwarg: str
    values: tuple[float, ...]
    default: float
    doc: str = ""
    override: str | None = None


KNOBS: dict[str, Knob] = {}

#: Table-name suffix of a policy run with ``capacity.control = "agent"`` by a trade-off matrix given
#: ``--set capacity.control=agent`` (:func:`_control_groups`): it decides the engines awake and
#: servers powered itself (the facility MILP's capacity stage), e.g. ``milp (capacity)``; it is
#: driven by its policy's knob (:func:`knob_for`) and kept apart from the always-on rows.
CAPACITY_SUFFIX = " (capacity)"


def register_knob(knob: Knob) -> None:
    """Add (or replace) a knob-driven policy's frontier (e.g. the autoscaler's thresholds)."""
    if knob.default not in knob.values:
        raise ValueError(f"{knob.policy}: the default {knob.default!r} must be one of the values {knob.values}")
    KNOBS[knob.policy] = knob


for _k in (
    Knob("planner", "utilisation", (0.5, 0.6, 0.7, 0.8, 0.9, 1.0), 0.9, "share of the static capacity the plan may use"),
    # the MILP's violations move with its utilisation cap, not with its violation penalty: 1 -> 10 g gave 5.22 -> 5.18%
    # violation over the 8 headline starts, 1 -> 100 -> 1,000 g 5.14 / 5.08 / 5.16% on one start (0 g leaves work
    # unfinished), while max_prefill_share 0.3 / 0.4 / 0.5 gives 0.78 / 2.59 / 5.22% over the 8 starts (RESULTS.md,
    # "Carbon vs SLO trade-off")
    Knob("milp", "max_prefill_share", (0.3, 0.35, 0.4, 0.45, 0.5, 0.6), 0.5,
         "cap on the share of iteration time prefill may take at a datacenter (its utilisation cap)"),
    Knob("learned", "headroom_penalty", (0.0, 5.0, 10.0, 20.0, 40.0), 20.0,
         "safety knob: logit per TTFT SLO of headroom shortfall (the shipped checkpoint records 20)"),
    Knob("greedy-cap", "capacity_cap", (0.5, 0.6, 0.7, 0.8, 0.9, 1.0), 0.9, "share of the measured capacity per step"),
    Knob("ilp-cap", "capacity_cap", (0.5, 0.6, 0.7, 0.8, 0.9, 1.0), 0.9, "share of the measured capacity per step"),
    # (carbon_gym.autoscalers.ReactiveSettings: down_util 0.35 < target_util < up_util 0.8)
    Knob("+reactive", "target_util", (0.4, 0.5, 0.6, 0.7, 0.75), 0.6,
         "the reactive autoscaler's target utilisation of the engines it keeps awake", override="capacity.params.target_util"),
    Knob("+carbon-aware", "dirty_cap_frac", (0.1, 0.25, 0.5, 0.75, 1.0), 0.25,
         "share of its engines a datacenter in a dirty hour may keep awake (1 = the reactive targets)",
         override="capacity.params.dirty_cap_frac"),
):
    register_knob(_k)


def knob_for(policy: str) -> Knob | None:
    """The knob driving ``policy`` (a policy name or table label): its own entry of :data:`KNOBS`,
    else its autoscaler's (``rr+reactive`` -> ``+reactive``), else its prefix's
    (``learned:llama8b_set`` -> ``learned``); None for a policy without a knob. A policy deciding
    capacity itself (``milp (capacity)``, :data:`CAPACITY_SUFFIX`) has its policy's knob."""
    p = str(policy)
    if p.endswith(CAPACITY_SUFFIX):
        p = p[: -len(CAPACITY_SUFFIX)]
    if p in KNOBS:
        return KNOBS[p]
    head, sep, tail = p.rpartition("+")
    if sep and head and f"+{tail}" in KNOBS:
        return KNOBS[f"+{tail}"]
    pre, sep, rest = p.partition(":")
    if sep and rest and pre in KNOBS:
        return KNOBS[pre]
    return None


def knob_policies(runs: Any) -> dict[str, Knob]:
    """The knob-driven policies among ``runs``' labels (a frontier point's label counts for its
    policy), each with its knob, in the order of :data:`KNOBS` (then of appearance)."""
    out: dict[str, Knob] = {}
    for p in dict.fromkeys(map(str, runs["policy"])):
        parsed = parse_knob_label(p)
        base = parsed[0] if parsed is not None else p
        knob = knob_for(base)
        if knob is not None and (parsed is None or parsed[1] == knob.kwarg):
            out.setdefault(base, knob)
    rank = {k: i for i, k in enumerate(KNOBS)}
    return dict(sorted(out.items(), key=lambda kv: rank.get(kv[1].policy, len(rank))))


def knob_values_from_cli(items: Sequence[str] | None) -> dict[str, tuple[float, ...]]:
    """Parse ``--knob POLICY=V1,V2,...`` items into ``{policy: values}`` (:func:`set_knob_values`
    adds each policy's default: its run is the policy's own row; the keys are :data:`KNOBS`' keys, so
    ``rr+reactive=...`` sizes the ``+reactive`` knob). A ConfigError names ``--knob`` and the
    knob-driven policies for an unknown policy, a malformed item or a value that is not a number."""
    from carbon_gym.errors import ConfigError

    out: dict[str, tuple[float, ...]] = {}
    for item in items or ():
        pol, sep, vals = item.partition("=")
        knob = knob_for(pol) if sep else None
        if knob is None:
            raise ConfigError("--knob", f"expected POLICY=V1,V2,... with a knob-driven policy, got {item!r}",
                              allowed=sorted(f"POLICY{k}" if k.startswith("+") else k for k in KNOBS))
        try:
            values = {float(v) for v in vals.split(",") if v.strip()}
        except ValueError:
            raise ConfigError("--knob", f"{item!r}: the values must be numbers ({knob.kwarg})") from None
        out[knob.policy] = tuple(sorted(values))
    return out


def set_knob_values(values: Mapping[str, Sequence[float]]) -> None:
    """Run each named policy's frontier at these knob values instead of its registered ones (the
    default included); e.g. a frontier sized for a small machine. Replaces the entries of
    :data:`KNOBS` in this process (the matrix is built here, so workers need not know)."""
    from dataclasses import replace

    for pol, vals in values.items():
        knob = knob_for(pol)
        if knob is None:
            raise KeyError(f"{pol!r} has no knob (eval.frontiers.KNOBS: {', '.join(sorted(KNOBS))})")
        register_knob(replace(knob, values=tuple(sorted(set(map(float, vals)) | {knob.default}))))


def knob_label(policy: str, kwarg: str, value: float) -> str:
    """Table name of one frontier point: ``milp[max_prefill_share=0.4]``."""
    return f"{policy}[{kwarg}={value:g}]"


def parse_knob_label(label: str) -> tuple[str, str, float] | None:
    """``"milp[max_prefill_share=0.4]"`` -> ``("milp", "max_prefill_share", 0.4)``; None otherwise."""
    if "[" not in label or not label.endswith("]"):
        return None
    pol, _, rest = label[:-1].partition("[")
    kw, sep, v = rest.partition("=")
    if not sep:
        return None
    try:
        return pol, kw, float(v)
    except ValueError:
        return None


def frontier_specs(scenarios: Sequence[str], policies: Sequence[str], seeds: Sequence[int], *,
                   overrides: Mapping[str, Any] | None = None,
                   policy_kwargs: Mapping[str, Mapping[str, Any]] | None = None, label_suffix: str = "") -> list[RunSpec]:
    """Every policy at its defaults (labelled by its name, plus ``label_suffix``) and every
    knob-driven one (:func:`knob_for` of its table name) also at each other value of its knob
    (labelled :func:`knob_label`: a keyword argument of the policy, or the scenario setting of
    ``Knob.override``), same seeds and starts."""
    from dataclasses import replace

    base = make_specs(scenarios, policies, seeds, overrides=overrides, policy_kwargs=policy_kwargs)
    if label_suffix:
        base = [replace(s, label=(s.label or s.policy) + label_suffix) for s in base]
    groups: dict[tuple[str, str], list[RunSpec]] = {}  # (scenario, table name) -> its runs, one per seed
    for spec in base:
        groups.setdefault((spec.scenario_label or spec.scenario, spec.label or spec.policy), []).append(spec)
    specs = list(base)
    for (_, name), runs in groups.items():
        knob = knob_for(name)
        if knob is None:
            continue
        for v in knob.values:
            if v == knob.default:
                continue
            for spec in runs:
                if knob.override is not None:
                    ov = dict(spec.overrides)
                    ov[knob.override] = float(v)
                    specs.append(replace(spec, overrides=freeze(ov), label=knob_label(name, knob.kwarg, v)))
                else:
                    kw = dict(spec.policy_kwargs)
                    kw[knob.kwarg] = float(v)
                    specs.append(replace(spec, policy_kwargs=freeze(kw), label=knob_label(name, knob.kwarg, v)))
    return specs


def _points_of(runs, scenario: str, policy: str) -> Any:
    """The runs of ``policy``'s frontier on ``scenario`` with their knob value (``knob_value``)."""
    knob = knob_for(policy)
    assert knob is not None, policy
    sub = runs[runs["scenario"] == scenario]
    own = sub["policy"] == policy
    lab = sub["policy"].map(lambda p: parse_knob_label(str(p)))
    is_pt = lab.map(lambda t: t is not None and t[0] == policy and t[1] == knob.kwarg)
    pts = sub[own | is_pt].copy()
    pts["knob_value"] = [knob.default if p == policy else parse_knob_label(str(p))[2] for p in pts["policy"]]
    return pts


def frontier_points(runs) -> Any:
    """Per (scenario, knob-driven policy, knob value): means and 95% CIs over seeds of the
    reduction vs rr and the SLO violation %, the MLPerf p99 pass share, the valid share, and
    whether the point is Pareto-efficient (``pareto``) among the policy's points (means)."""
    import pandas as pd

    rows = []
    knobs = knob_policies(runs)
    for scen in dict.fromkeys(runs["scenario"]):
        for pol, knob in knobs.items():
            pts = _points_of(runs, scen, pol)
            if pts.empty:
                continue
            for v, g in pts.groupby("knob_value", sort=True):
                ok = g[g["run_valid"].astype(bool)] if "run_valid" in g else g
                r, rci = mean_ci95(ok["reduction_vs_rr_pct"])
                vv, vci = mean_ci95(ok["slo_violation_pct"])
                rows.append({"scenario": scen, "policy": pol, "knob": knob.kwarg, "value": float(v),
                             "default": bool(v == knob.default), "seeds": int(len(g)), "valid_seeds": int(len(ok)),
                             "reduction_vs_rr_pct": r, "reduction_vs_rr_pct_ci95": rci,
                             "slo_violation_pct": vv, "slo_violation_pct_ci95": vci,
                             "mlperf_p99_pass_share": float(np.mean(g["mlperf_p99_pass"].astype(float))) if "mlperf_p99_pass" in g else np.nan})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["pareto"] = False
    for (_, _), g in out.groupby(["scenario", "policy"], sort=False):
        eff = _pareto_mask(g["slo_violation_pct"].to_numpy(float), g["reduction_vs_rr_pct"].to_numpy(float))
        out.loc[g.index, "pareto"] = eff
    return out


def _pareto_mask(viol: np.ndarray, red: np.ndarray) -> np.ndarray:
    """Points no other point beats on both (less or equal violation and more reduction)."""
    ok = np.isfinite(viol) & np.isfinite(red)
    eff = np.zeros(viol.size, dtype=bool)
    for i in np.flatnonzero(ok):
        dominated = ok & (viol <= viol[i]) & (red >= red[i]) & ((viol < viol[i]) | (red > red[i]))
        eff[i] = not dominated.any()
    return eff


def envelope_at(viol: Sequence[float], red: Sequence[float], target: float) -> float:
    """The frontier of the points ``(viol[k], red[k])`` read at violation ``target`` (%): the
    Pareto-efficient points joined by straight lines; NaN below the least violation reached (the
    policy cannot get there), the best reduction above the most."""
    v = np.asarray(viol, dtype=np.float64)
    r = np.asarray(red, dtype=np.float64)
    if not np.isfinite(target):
        return float("nan")
    eff = _pareto_mask(v, r)
    if not eff.any():
        return float("nan")
    v, r = v[eff], r[eff]
    order = np.argsort(v, kind="stable")
    v, r = v[order], r[order]
    if target < v[0] - 1e-12:
        return float("nan")
    if target >= v[-1]:
        return float(r[-1])
    return float(np.interp(target, v, r))


#: Fixed violation levels (%) every frontier is also read at: 1% and the study's operating point, ~3%.
LEVELS_PCT: tuple[float, ...] = (1.0, 3.0)


def level_key(level_pct: float) -> str:
    """Column prefix of a fixed level in :func:`equal_violation`: ``at_1pct``, ``at_2.5pct``."""
    return f"at_{level_pct:g}pct"


def equal_violation(runs, *, reference: str = "rr", anchor: str = "milp", levels_pct: Sequence[float] = LEVELS_PCT) -> Any:
    """Per (scenario, knob-driven policy): the default point, and the frontier read per seed at
    round-robin's violation in that seed (``at_rr_*``), at ``anchor``'s default violation
    (``at_anchor_*``) and at each fixed level of ``levels_pct`` (``at_<v>pct_*``,
    :func:`level_key`): mean ± 95% CI over the seeds where the frontier reaches that level
    (``*_seeds``). Reductions are vs rr, as everywhere."""
    import pandas as pd

    rows = []
    for scen in dict.fromkeys(runs["scenario"]):
        sub = runs[runs["scenario"] == scen]
        ref = sub[sub["policy"] == reference].set_index("seed")["slo_violation_pct"]
        anc = sub[sub["policy"] == anchor].set_index("seed")["slo_violation_pct"]
        for pol, knob in knob_policies(runs).items():
            pts = _points_of(runs, scen, pol)
            if pts.empty:
                continue
            if "run_valid" in pts:
                pts = pts[pts["run_valid"].astype(bool)]
            row: dict[str, Any] = {"scenario": scen, "policy": pol, "knob": knob.kwarg}
            d = pts[pts["policy"] == pol]
            row["default_reduction_pct"], row["default_reduction_pct_ci95"] = mean_ci95(d["reduction_vs_rr_pct"])
            row["default_violation_pct"] = mean_ci95(d["slo_violation_pct"])[0]
            seeds = sorted(set(pts["seed"]))
            levels = [(level_key(lv), pd.Series(float(lv), index=seeds)) for lv in levels_pct]
            for name, target in [("at_rr", ref), ("at_anchor", anc), *levels]:
                vals = []
                for seed, g in pts.groupby("seed"):
                    if seed in target.index:
                        vals.append(envelope_at(g["slo_violation_pct"], g["reduction_vs_rr_pct"], float(target[seed])))
                vals = [x for x in vals if np.isfinite(x)]
                m, ci = mean_ci95(vals)
                row[f"{name}_reduction_pct"], row[f"{name}_reduction_pct_ci95"], row[f"{name}_seeds"] = m, ci, len(vals)
                row[f"{name}_violation_pct"] = float(target.mean()) if len(target) else np.nan
            rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# experiment e (run through eval.experiments: ``ctx`` is its Ctx)


def frontier_markdown(points) -> str:
    """The frontier points: per policy and knob value, reduction and violation (mean ± CI),
    MLPerf p99 verdict; ``*`` = the policy's default, ``◆`` = Pareto-efficient."""
    import pandas as pd

    from eval.tables import fmt_ci, frame_markdown, p99_verdict

    if points.empty:
        return "(no knob-driven policy ran)\n"
    disp = pd.DataFrame({
        "scenario": points["scenario"], "policy": points["policy"],
        "knob": [f"{k}={v:g}" + (" *" if d else "") for k, v, d in zip(points["knob"], points["value"], points["default"])],
        "vs rr %": [fmt_ci(a, b) for a, b in zip(points["reduction_vs_rr_pct"], points["reduction_vs_rr_pct_ci95"])],
        "SLO viol. %": [fmt_ci(a, b, 2) for a, b in zip(points["slo_violation_pct"], points["slo_violation_pct_ci95"])],
        "MLPerf p99 pass": [p99_verdict(r) for _, r in points.iterrows()],
        "valid seeds": [f"{a}/{b}" for a, b in zip(points["valid_seeds"], points["seeds"])],
        "frontier": ["◆" if p else "" for p in points["pareto"]],
    })
    return frame_markdown(disp)


def equal_violation_markdown(table, anchor: str = "milp") -> str:
    """:func:`equal_violation` as a Markdown table."""
    import pandas as pd

    from eval.tables import fmt_ci, frame_markdown

    if table.empty:
        return "(no knob-driven policy ran)\n"

    def read_at(k: str) -> list[str]:  # the frontier read at level ``k``: reduction ± CI (seeds reaching it)
        return [f"{fmt_ci(a, b)} ({n})" for a, b, n in zip(table[f"{k}_reduction_pct"], table[f"{k}_reduction_pct_ci95"], table[f"{k}_seeds"])]

    disp = pd.DataFrame({
        "scenario": table["scenario"], "policy": table["policy"], "knob": table["knob"],
        "at default: vs rr % (viol. %)": [f"{fmt_ci(a, b)} ({c:.2f})" for a, b, c in
                                          zip(table["default_reduction_pct"], table["default_reduction_pct_ci95"], table["default_violation_pct"])],
        "at rr's violation: vs rr % (seeds)": read_at("at_rr"),
        f"at {anchor}'s violation: vs rr % (seeds)": read_at("at_anchor"),
    })
    for lv in LEVELS_PCT:
        if f"{level_key(lv)}_reduction_pct" in table:
            disp[f"at {lv:g}% violation: vs rr % (seeds)"] = read_at(level_key(lv))
    return frame_markdown(disp)


def tradeoff_tables(runs, summary, out: str) -> tuple[Any, Any, str]:
    """Experiment e's tables from its runs and summary (as run, or read back from ``runs.csv`` /
    ``summary.csv``): writes ``tradeoff.csv`` (the frontier points), ``equal_violation.csv`` and
    ``tradeoff.md`` into ``out``; returns the points, the policies without a knob and the Markdown.
    The knobs described are those of :data:`KNOBS` that the runs used, with the values they ran."""
    import os

    from eval.tables import METRICS_NOTE, summary_markdown

    points = frontier_points(runs)
    eq = equal_violation(runs)
    os.makedirs(out, exist_ok=True)
    points.to_csv(os.path.join(out, "tradeoff.csv"), index=False)
    eq.to_csv(os.path.join(out, "equal_violation.csv"), index=False)
    driven = knob_policies(runs)
    singles = summary[~summary["policy"].map(lambda p: str(p) in driven or parse_knob_label(str(p)) is not None)]
    values = {pol: sorted(set(points[points["policy"] == pol]["value"])) for pol in driven} if not points.empty else {}
    knobs = "; ".join(f"{pol}: `{k.override or k.kwarg}` in {', '.join(f'{v:g}' for v in values.get(pol) or k.values)} "
                      f"(default {k.default:g}; {k.doc})" for pol, k in driven.items())
    levels = " and ".join(f"{lv:g}%" for lv in LEVELS_PCT)
    from carbon_gym.registry import split_autoscaler

    scaled = [p for p in driven if split_autoscaler(p) is not None]
    own = [p for p in driven if p.endswith(CAPACITY_SUFFIX)]
    control = ((f"{', '.join(scaled)}: capacity.control = agent (the autoscaler puts engines to sleep and powers servers "
                "off); " if scaled else "")
               + (f"{', '.join(own)}: capacity.control = agent (the policy itself decides the engines awake and the servers "
                  "powered per datacenter); " if own else "")
               + "every other row keeps every engine awake; all reductions are vs round-robin always on. ") if scaled or own else ""
    md = ("Carbon vs SLO frontiers of the knob-driven policies, each run at every value of its knob (" + knobs + "). "
          + control + "◆ = on the policy's frontier (Pareto-efficient), * = its default. " + METRICS_NOTE + "\n\n"
          + frontier_markdown(points)
          + "\nAt equal violation: each frontier read per seed at round-robin's violation in that seed, at the facility "
          f"MILP's default's and at {levels} (straight lines between the Pareto points; not reached = the knob cannot get that "
          "low), mean ± 95% CI over the seeds where it is reached.\n\n" + equal_violation_markdown(eq)
          + "\nPolicies without a knob, at their defaults:\n\n"
          + (summary_markdown(singles, timing=False) if not singles.empty else "(none)\n"))
    with open(os.path.join(out, "tradeoff.md"), "w", encoding="utf-8") as f:
        f.write(md)
    return points, singles, md


def tradeoff_section(results_dir: str, fig_dir: str) -> tuple[str, list[str]] | None:
    """The trade-off section merged over every matrix of experiment e under ``results_dir``
    (``tradeoff/`` and ``tradeoff-NAME/tradeoff/``; a later matrix's run of the same scenario,
    policy label and seed replaces an earlier one's): each matrix's command, the tables and a
    figure per scenario (PNG paths, drawn under ``fig_dir``; its tables are written there too);
    None when there is at most one matrix (its own ``tradeoff.md`` and figures are the section)."""
    from eval.capacity_report import merged_runs
    from eval.tables import summarise
    from eval.writers import matrix_dirs, merged_head

    dirs = matrix_dirs(results_dir, "tradeoff")
    if len(dirs) < 2:
        return None
    runs = merged_runs(dirs).drop(columns=["source"])
    points, singles, md = tradeoff_tables(runs, summarise(runs), fig_dir)
    return merged_head(results_dir, dirs) + "\n\n" + md, _frontier_figures(points, singles, fig_dir)


def _frontier_figures(points: Any, singles: Any, fig_dir: str) -> list[str]:
    """One frontier figure per scenario (:func:`eval.plots.frontiers`) under ``fig_dir``; the PNG paths."""
    from eval import plots

    out = []
    for scen in dict.fromkeys(points["scenario"]):
        stem = os.path.join(fig_dir, f"tradeoff_{scen}")
        plots.frontiers(points[points["scenario"] == scen], singles[singles["scenario"] == scen], stem,
                        title=f"{scen}: carbon vs SLO frontiers")
        out.append(stem + ".png")
    return out


def _control_groups(policies: Sequence[str], overrides: Mapping[str, Any],
                    reference: str = "rr") -> list[tuple[list[str], dict[str, Any], str]]:
    """``policies`` split by the overrides they run under, each group with its table-name suffix:
    ``POLICY+AUTOSCALER`` with ``capacity.control = "agent"`` (its autoscaler decides capacity;
    unless ``overrides`` set ``capacity.control``), every other policy with ``overrides`` as given.
    When ``overrides`` set ``capacity.control = "agent"`` the plain policies decide capacity
    themselves and are labelled ``POLICY (capacity)`` (:data:`CAPACITY_SUFFIX`), while the
    ``reference`` stays round-robin always on (every reduction is against it)."""
    from carbon_gym.registry import split_autoscaler

    plain = [p for p in policies if split_autoscaler(p) is None]
    composed = [p for p in policies if split_autoscaler(p) is not None]
    agent = dict(overrides)
    agent.setdefault("capacity.control", "agent")
    if str(overrides.get("capacity.control", "always_on")) != "agent":
        groups = [(plain, dict(overrides), ""), (composed, agent, "")]
    else:
        on = always_on_overrides(overrides)
        deciding = [p for p in plain if p != reference]
        groups = [([p for p in plain if p == reference], on, ""), (deciding, agent, CAPACITY_SUFFIX), (composed, agent, "")]
    return [g for g in groups if g[0]]


def tradeoff_experiment(ctx: Any, policies: Sequence[str]) -> str:
    """Run ``policies`` (every knob-driven one at each value of its knob, the others at their
    defaults; ``POLICY+AUTOSCALER`` with ``capacity.control = "agent"``, :func:`_control_groups`) on ``ctx``'s matrix (an :class:`eval.experiments.Ctx`) and write ``tradeoff.md`` /
    ``tradeoff.csv`` (the frontier points), ``equal_violation.csv`` and a figure per scenario."""
    import sys

    from eval.tables import REFERENCE_POLICY

    scens = ctx.scenario_list(("moderate",), ("llama8b",))
    pols = list(dict.fromkeys([REFERENCE_POLICY] + list(policies)))
    specs = [s for sc in scens for pp, ov, suffix in _control_groups(pols, ctx.overrides, REFERENCE_POLICY)
             for s in frontier_specs([sc], pp, ctx.seeds_for(sc), overrides=ov, policy_kwargs=ctx.policy_kwargs, label_suffix=suffix)]
    ex = ctx.execute(specs)
    points, singles, md = tradeoff_tables(ex.runs, ex.summary, ctx.out)
    if ctx.plots and not points.empty:
        print(f"carbon-gym: note: {ctx.name}: writing figures to {ctx.fig_dir} (PNG + PDF; --no-plots skips them)", file=sys.stderr)
        _frontier_figures(points, singles, ctx.fig_dir)
    return md
