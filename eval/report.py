"""RESULTS.md: written by ``carbon-gym report`` from a finished headline run and the other
experiments found next to it (:func:`write_results_md`).

The headline tables come from :mod:`eval.experiments` and :mod:`eval.tables`; figures are
copied next to RESULTS.md; hand-written notes between :data:`NOTES_BEGIN` and :data:`NOTES_END`
survive a regeneration. :data:`STUDY_CLAIMS` lists the study's figures compared with ours.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Callable

from eval.capacity_report import SECTION_BEGIN as CAPACITY_BEGIN
from eval.slo_report import SECTION_BEGIN as SLO_BEGIN
from eval.slo_report import slo_section
from eval.experiments import PRESETS, headline_table
from eval.predictor import predictor_section
from eval.milp_vs_ilp import ILP_POLICIES, milp_vs_ilp_markdown, milp_vs_ilp_runs, milp_vs_ilp_section, milp_vs_ilp_table
from eval.frontiers import tradeoff_section
from eval.generalise_experiment import generalise_section
from eval.learned_capacity_experiment import learned_capacity_dirs, learned_capacity_section
from eval.polling import merged_polling, polling_section
from eval.study import STUDY_CLAIMS
from eval.tables import METRICS_NOTE, summary_markdown
from eval.writers import starts_line

__all__ = ["write_results_md", "write_section", "write_capacity_costs", "write_headline_section", "table_section", "TABLE_SECTIONS", "STUDY_CLAIMS", "COMPARISON_TITLE", "NOTES_BEGIN", "NOTES_END"]

NOTES_BEGIN = "<!-- notes:begin (kept when RESULTS.md is regenerated) -->"
NOTES_END = "<!-- notes:end -->"
#: The heading of the study comparison at 1 s polling (the SLO section has its own, at the SLO-true point).
COMPARISON_TITLE = "## Comparison with the study"
COMPARISON_NOTE = ("From the headline and the other experiments below the SLO section, at their polling period (the "
                   "scenarios' default is 1 s). Where the SLO section ran, the same claims at the SLO-true point (0.1 s "
                   "polling, every policy at its default, compared where it passes MLPerf p99 in every start) head the "
                   "file: \"The study's claims at the SLO-true point\".\n")


def _read_csv(path: str):
    import pandas as pd

    return pd.read_csv(path) if os.path.isfile(path) else None


def _own_runs(results_dir: str, exp: str):
    """The runs of experiment ``exp``'s own matrix under ``results_dir`` (None unless it wrote its
    table ``<exp>/<exp>.md``)."""
    if not os.path.isfile(os.path.join(results_dir, exp, f"{exp}.md")):
        return None
    return _read_csv(os.path.join(results_dir, exp, "runs.csv"))


def _claims(results_dir: str) -> dict[str, str]:
    """Our numbers for each study claim, computed from the result tables that exist."""
    out: dict[str, str] = {}
    h_runs = _read_csv(os.path.join(results_dir, "headline", "runs.csv"))
    h_sum = _read_csv(os.path.join(results_dir, "headline", "summary.csv"))
    if h_sum is not None and "milp" in set(h_sum["policy"]):
        m = h_sum[h_sum["policy"] == "milp"]
        ok = m[m.get("unfinished_pct", 0 * m["carbon_g"]).fillna(0) < 1.0]
        bad = [s for s in m["scenario"] if s not in set(ok["scenario"])]
        note = f" (excluding {', '.join(bad)}, where the MILP left >= 1% of requests unfinished)" if bad else ""
        if not ok.empty:
            best = ok.loc[ok["reduction_vs_rr_pct"].idxmax()]
            out["carbon"] = (f"up to {best['reduction_vs_rr_pct']:.1f}% ({best['scenario']}, {best['slo_violation_pct']:.1f}% violation); "
                             f"range {ok['reduction_vs_rr_pct'].min():.1f}–{ok['reduction_vs_rr_pct'].max():.1f}%{note}")
            out["violation"] = (f"{ok['slo_violation_pct'].mean():.2f}% on average over {len(ok)} scenarios (range "
                                f"{ok['slo_violation_pct'].min():.2f}–{ok['slo_violation_pct'].max():.2f}%){note}"
                                + (f"; {m['slo_violation_pct'].mean():.2f}% over all {len(m)}" if bad else ""))
    gap_src = milp_vs_ilp_runs(results_dir)
    src = gap_src if gap_src is not None else h_runs
    if src is not None and "milp" in set(src["policy"]):
        ilps = [p for p in ILP_POLICIES if p in set(src["policy"])]
        t = milp_vs_ilp_table(src, ilps=ilps)
        t = t[t["scenario"].str.startswith("mixtral")]
        if "unfinished_pct" in src:
            unf = src[src["policy"] == "milp"].groupby("scenario")["unfinished_pct"].mean()
            t = t[t["scenario"].map(lambda sc: float(unf.get(sc, 0.0)) < 1.0)]
        if not t.empty and ilps:
            parts = []
            for _, r in t.iterrows():
                gaps = ", ".join(f"{i} invalid (work left unfinished)" if bool(r.get(f"{i}_invalid", False))
                                 else f"{r[f'gap_vs_{i}_pp']:+.1f} pp vs {i}" for i in ilps)
                parts.append(f"{r['scenario']}: {gaps} (MILP violation {r['milp_violation_pct']:.2f}%)")
            out["milp_ilp"] = "; ".join(parts)
    lc = learned_capacity_dirs(results_dir)
    if lc:
        from eval.capacity_report import capacity_table, merged_runs

        t = capacity_table(merged_runs(lc)).set_index("policy")
        if "milp" in t.index:
            m = t.loc["milp"]
            out["capacity"] = (f"{m['reduction_vs_always_on_pct']:.1f}% vs always-on rr, {m['reduction_vs_reactive_pct']:.1f}% vs "
                               f"rr+reactive ({m['scenario']}, {int(m['seeds'])} starts, {m['slo_violation_pct']:.1f}% violation)")
    pred = _read_csv(os.path.join(results_dir, "predictor", "predictor.csv"))
    if pred is not None and not pred.empty:
        out["predictor"] = f"within {pred['reduction_diff_pp'].abs().max():.1f} pp / {pred['violation_diff_pp'].abs().max():.2f} pp (max over {len(pred)} scenario x policy cases)"
    poll = merged_polling(results_dir)
    if poll is not None and "milp" in set(poll["policy"]):
        def viol(pol: str) -> str:
            p = poll[poll["policy"] == pol].sort_values("polling_s")
            return ", ".join(f"{r.polling_s:g} s: {r.slo_violation_pct:.2f}" for r in p.itertuples())

        out["polling"] = "MILP violation %: " + viol("milp") + (f"; rr: {viol('rr')}" if "rr" in set(poll["policy"]) else "")
    return out



def run_costs(results_dir: str) -> list[dict]:
    """Every experiment matrix under ``results_dir`` (``<exp>/config.json`` with its runs.csv,
    also ``capacity-*/capacity``): its command, runs, wall time (s, of the whole command) and
    CPU time of its runs (s, ``cpu_s`` summed), in directory order."""
    import glob

    rows = []
    for conf in sorted(glob.glob(os.path.join(results_dir, "*", "config.json")) + glob.glob(os.path.join(results_dir, "*", "*", "config.json"))):
        d = os.path.dirname(conf)
        with open(conf, encoding="utf-8") as f:
            c = json.load(f)
        runs = _read_csv(os.path.join(d, "runs.csv"))
        cpu = float(runs["cpu_s"].sum()) if runs is not None and "cpu_s" in runs else float("nan")
        rows.append({"dir": os.path.relpath(d, results_dir), "command": c.get("command", "?"), "runs": len(c.get("runs", [])),
                     "elapsed_s": float(c.get("elapsed_s", float("nan"))), "cpu_s": cpu, "workers": c.get("workers")})
    return rows


def run_costs_markdown(results_dir: str) -> str:
    """The table of :func:`run_costs` and the whole run's totals (Markdown)."""
    rows = run_costs(results_dir)
    if not rows:
        return ""
    out = ["| results | runs | workers | wall (min) | CPU of the runs (min) | command |", "|---|---|---|---|---|---|"]
    out += [_cost_row(r) for r in rows]
    out.append("")
    out.append(_whole_run(sum(r["runs"] for r in rows), sum(r["elapsed_s"] for r in rows) / 60, sum(r["cpu_s"] for r in rows) / 60) + "\n")
    return "\n".join(out)


def _cost_row(r: dict) -> str:
    """One row of the cost table (a :func:`run_costs` row)."""
    return f"| {r['dir']} | {r['runs']} | {r['workers']} | {r['elapsed_s'] / 60:.1f} | {r['cpu_s'] / 60:.1f} | `{r['command']}` |"


def _whole_run(runs: int, wall_min: float, cpu_min: float) -> str:
    """The cost table's "Whole run" line."""
    return (f"Whole run: {runs} runs, {wall_min:.1f} min of wall time summed over the commands (some ran at the same time), "
            f"{cpu_min:.1f} CPU-minutes ({cpu_min / 2:.1f} min on 2 dedicated cores).")


#: The sections written from one experiment's own table (``<exp>/<exp>.md``), in file order: title.
TABLE_SECTIONS: dict[str, str] = {
    "milp-vs-ilp": "Facility MILP vs per-request ILPs",
    "predictor": "Predictor vs oracle",
    "polling": "Polling period",
    "tradeoff": "Carbon vs SLO trade-off",
    "bound": "Share of the carbon lower bound",
    "diurnal": "A long run: llama8b-diurnal",
    "sessions": "Multi-turn sessions and prefix caching",
    "generalise": "The learned agent on unseen data (held-out days, another year, loads, topology, faults)",
    "learned-capacity": "A learned agent deciding capacity (20 held-out starts)",
}
#: The study claim (:data:`STUDY_CLAIMS` key) each table section's experiment answers.
SECTION_CLAIMS = {"milp-vs-ilp": "milp_ilp", "predictor": "predictor", "polling": "polling", "learned-capacity": "capacity"}
#: The captions of experiment learned-capacity's figures (stem: which start it shows).
LEARNED_CAPACITY_FIGURES = (("capacity_decisions", "gains most on"), ("capacity_decisions_worst", "loses most against"))


class Figures:
    """The figures RESULTS.md links (PNG under ``<results_dir>/<exp>/figures``), copied into
    ``figures_dir`` only once the text is complete (:meth:`copy`)."""

    def __init__(self, results_dir: str, figures_dir: str, out: str) -> None:
        self.results_dir, self.figures_dir = results_dir, figures_dir
        self.rel = os.path.relpath(figures_dir, os.path.dirname(os.path.abspath(out)) or ".")
        self.copies: list[tuple[str, str]] = []  # (source, destination)
        self._scratch: str | None = None  # where the report draws figures of its own (removed by copy())

    def scratch(self) -> str:
        """A temporary directory for the figures the report draws itself (:meth:`drawn`); removed
        by :meth:`copy` once they are copied."""
        if self._scratch is None:
            import tempfile

            self._scratch = tempfile.mkdtemp(prefix="carbon-gym-report-")
        return self._scratch

    def link(self, exp: str, stem: str) -> str | None:
        """The Markdown path of figure ``stem`` of ``exp`` (None when it was not drawn)."""
        src = os.path.join(self.results_dir, exp, "figures", stem + ".png")
        if not os.path.isfile(src):
            return None
        dst_name = f"{exp}_{stem}.png" if not stem.startswith(exp) else stem + ".png"
        self.copies.append((src, os.path.join(self.figures_dir, dst_name)))
        return f"{self.rel}/{dst_name}".replace(os.sep, "/")

    def drawn(self, src: str, name: str | None = None) -> str:
        """The Markdown path of a figure the report drew itself (PNG ``src``, copied under ``name``,
        default its own)."""
        name = name or os.path.basename(src)
        self.copies.append((src, os.path.join(self.figures_dir, name)))
        return f"{self.rel}/{name}".replace(os.sep, "/")

    def copy(self) -> None:
        os.makedirs(self.figures_dir, exist_ok=True)
        for src, dst in self.copies:
            shutil.copyfile(src, dst)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


#: Sections merged over an experiment's matrices (``<exp>/`` and ``<exp>-NAME/<exp>/``) when there are
#: several: called with the results directory and a directory to draw into, they give the text and the
#: figures drawn (None: one matrix, whose own files are the section).
MERGED_SECTIONS: dict[str, Callable[[str, str], tuple[str, list[str]] | None]] = {"polling": polling_section, "tradeoff": tradeoff_section,
                                                                                   "milp-vs-ilp": milp_vs_ilp_section,
                                                                                   "predictor": predictor_section}


def table_section(results_dir: str, exp: str, figs: Figures) -> str | None:
    """The RESULTS.md section of experiment ``exp`` (a :data:`TABLE_SECTIONS` key): its title,
    command, table and figures; None when ``<results_dir>/<exp>/<exp>.md`` is absent."""
    md_path = os.path.join(results_dir, exp, f"{exp}.md")
    if not os.path.isfile(md_path):
        return None
    parts = [f"## {TABLE_SECTIONS[exp]}\n"]
    if exp == "learned-capacity":  # (merged over its matrices; its figures redrawn where the steps files are on disk)
        lc_md, pngs = learned_capacity_section(results_dir, figs.scratch())
        parts.append(lc_md)
        drawn_at = {os.path.basename(p)[:-4]: p for p in pngs if p.endswith(".png")}
        for stem, what in LEARNED_CAPACITY_FIGURES:
            if stem in drawn_at:
                parts.append(f"![learned-capacity: {stem}]({figs.drawn(drawn_at[stem], f'learned-capacity_{stem}.png')})\n\n*The capacity "
                             f"decisions on the start where the agent {what} the MILP: the load, the servers each policy keeps powered, "
                             "and the grid intensity those servers see.*\n")
        return "\n".join(parts)
    merged = generalise_section(results_dir) if exp == "generalise" else None
    drawn = MERGED_SECTIONS[exp](results_dir, figs.scratch()) if exp in MERGED_SECTIONS else None
    econf = os.path.join(results_dir, exp, "config.json")
    if drawn is not None:  # (merged over its matrices, with the merged figures)
        parts.append(drawn[0])
        for png in drawn[1]:
            parts.append(f"![{exp}: {os.path.basename(png)[:-4]}]({figs.drawn(png)})\n")
        return "\n".join(parts)
    if merged is not None:
        parts.append(merged)
    else:
        if os.path.isfile(econf):
            with open(econf, encoding="utf-8") as f:
                parts.append(f"`{json.load(f).get('command')}`\n")
        parts.append(open(md_path, encoding="utf-8").read())
    fdir = os.path.join(results_dir, exp, "figures")
    for name in sorted(os.listdir(fdir)) if os.path.isdir(fdir) else []:
        if name.endswith(".png"):
            p = figs.link(exp, name[:-4])
            if p:
                parts.append(f"![{exp}: {name[:-4]}]({p})\n")
    return "\n".join(parts)


def _split_sections(text: str) -> tuple[str, list[str]]:
    """``text`` as its preamble and its ``## `` sections (each from its heading to the next)."""
    pieces = text.split("\n## ")
    sections = ["## " + p for p in pieces[1:]]
    for i in range(len(sections) - 1):  # a marked section's begin line, above its heading, goes with it
        for marker in (CAPACITY_BEGIN, SLO_BEGIN):
            pos = sections[i].rfind("\n" + marker)
            if pos >= 0:
                sections[i], sections[i + 1] = sections[i][:pos], sections[i][pos + 1:] + "\n" + sections[i + 1]
    return pieces[0], sections


def _costs_rows(text: str) -> list[str]:
    """The rows of the "Every matrix in this file" table of an existing RESULTS.md."""
    if "Every matrix in this file" not in text:
        return []
    body = text.split("Every matrix in this file", 1)[1].split("\n\n", 2)[1]
    return [ln for ln in body.splitlines() if ln.startswith("| ") and not ln.startswith("| results |")]


def _costs_total(rows: list[str]) -> str:
    """The "Whole run" line summed over cost-table rows (as shown, to 0.1 min)."""
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    return _whole_run(sum(int(c[1]) for c in cells), sum(float(c[3]) for c in cells), sum(float(c[4]) for c in cells))


def _cost_dir(row: str) -> str:
    """The results directory (first cell) of a cost-table row."""
    return row.split("|")[1].strip()


def _with_cost_rows(text: str, shown: list[str], rows: list[str]) -> str:
    """``text`` with the cost-table rows ``shown`` replaced by ``rows`` (in directory order; nothing
    replaced when none were shown) and the "Whole run" line summed again over ``rows``."""
    merged = sorted(rows, key=lambda r: _cost_dir(r) + "/config.json")
    if shown:
        text = text.replace("\n".join(shown), "\n".join(merged), 1)
    total = next((ln for ln in text.splitlines() if ln.startswith("Whole run: ")), None)
    return text.replace(total, _costs_total(merged), 1) if total is not None else text


def _with_claim(text: str, key: str, claim: str) -> str:
    """``text`` with our figure for study claim ``key`` (a :data:`STUDY_CLAIMS` key) set to ``claim``
    in the comparison table (the study's column kept); unchanged when the table lacks its row."""
    label = next(c for k, c, _ in STUDY_CLAIMS if k == key)
    if COMPARISON_TITLE not in text:
        return text
    head, table = text.split(COMPARISON_TITLE, 1)  # (the SLO section's table of the same claims comes earlier)
    line = next((ln for ln in table.splitlines() if ln.startswith(f"| {label} |")), None)
    if line is None:
        return text
    study = line.strip("|").split("|")[1].strip()
    return head + COMPARISON_TITLE + table.replace(line, f"| {label} | {study} | {claim} |", 1)


def _with_costs_of(text: str, results_dir: str, exp: str) -> str:
    """``text`` with experiment ``exp``'s rows of the cost table (``<exp>``, and ``<exp>-NAME/<exp>``
    merged into its section) replaced or added from ``results_dir``, then the totals."""
    def mine(rel: str) -> bool:
        top = rel.split("/")[0]
        return top == exp or top.startswith(exp + "-")

    old_rows = _costs_rows(text)
    rows = [r for r in old_rows if not mine(_cost_dir(r))]
    new_rows = [_cost_row(r) for r in run_costs(results_dir) if mine(r["dir"])]
    return _with_cost_rows(text, old_rows, rows + new_rows) if rows or new_rows else text


def write_capacity_costs(results_dir: str, *, out: str = "RESULTS.md") -> str:
    """Rewrite the "Capacity control" section of ``out`` in place
    (:func:`eval.capacity_report.with_capacity_section`) and the capacity matrices' rows of the
    cost table with the whole run's totals; the rest is kept."""
    from eval.capacity_report import with_capacity_section

    old = open(out, encoding="utf-8").read() if os.path.isfile(out) else ""
    text = _with_costs_of(with_capacity_section(old, results_dir), results_dir, "capacity")
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    return out


def write_section(results_dir: str, exp: str, *, out: str = "RESULTS.md", figures_dir: str = "docs/figures") -> str:
    """Rewrite experiment ``exp``'s section of an existing ``out`` in place (a :data:`TABLE_SECTIONS`
    key) from ``<results_dir>/<exp>``, with its row of the cost table, the whole run's totals and
    its study claim; the rest of the file is kept. For a matrix rerun (or added) without rerunning
    the others. A section not yet in ``out`` goes where the full report puts it."""
    from carbon_gym.errors import ConfigError

    if exp not in TABLE_SECTIONS:
        raise ConfigError("section", f"unknown section {exp!r}; allowed: {', '.join(TABLE_SECTIONS)}")
    if not os.path.isfile(out):
        raise ConfigError("out", f"{out!r} not found: a section is rewritten in an existing RESULTS.md (write the whole file first)")
    figs = Figures(results_dir, figures_dir, out)
    section = table_section(results_dir, exp, figs)
    if section is None:
        raise ConfigError("results_dir", f"{os.path.join(results_dir, exp, exp + '.md')!r} not found; run "
                          f"`carbon-gym experiment {exp} --out {results_dir}` first")
    old = open(out, encoding="utf-8").read()
    head, sections = _split_sections(old)
    title = f"## {TABLE_SECTIONS[exp]}\n"
    block = section.rstrip("\n") + "\n"
    at = next((i for i, sec in enumerate(sections) if sec.startswith(title)), None)
    if at is not None:
        sections[at] = block
    else:
        order = list(TABLE_SECTIONS)
        later = {f"## {TABLE_SECTIONS[e]}\n" for e in order[order.index(exp) + 1:]}
        later |= {"## A learned agent deciding capacity", CAPACITY_BEGIN, COMPARISON_TITLE}
        at = next((i for i, sec in enumerate(sections) if any(sec.startswith(t) for t in later)), len(sections))
        sections.insert(at, block)
    text = _with_costs_of(head + "".join("\n" + sec for sec in sections), results_dir, exp)
    key = SECTION_CLAIMS.get(exp)
    claim = _claims(results_dir).get(key) if key else None
    if key is not None and claim is not None:
        text = _with_claim(text, key, claim)
    figs.copy()
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    return out


def write_results_md(results_dir: str = "results", *, out: str = "RESULTS.md", figures_dir: str = "docs/figures", command: str | None = None,  # noqa: C901
                     overwrite: bool = True) -> str:
    """Write RESULTS.md from ``results_dir/headline`` (+ the other experiments found there).

    Figures are copied (PNG) into ``figures_dir`` so the Markdown links work from the repo root.
    Hand-written notes between the ``notes`` markers of an existing ``out`` are kept. With
    ``overwrite=False`` nothing is written when ``out`` or any figure to be copied already
    exists: :class:`~carbon_gym.errors.ConfigError` (field ``out`` or ``figures``) names it.
    """
    from carbon_gym.errors import ConfigError

    if not overwrite and os.path.exists(out):
        raise ConfigError("out", f"{out!r} exists (RESULTS.md is tracked: regenerating it is a deliberate step); write "
                          "elsewhere, or allow replacing it (carbon-gym report --force)")
    text, figs = _results_md(results_dir, out=out, figures_dir=figures_dir, command=command)
    clash = [dst for _, dst in figs.copies if os.path.exists(dst)]
    if clash and not overwrite:
        raise ConfigError("figures", f"{len(clash)} figure(s) would be replaced, e.g. {clash[0]!r}; choose another "
                          "figures directory, or allow replacing them (carbon-gym report --force)")
    figs.copy()
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    return out


def _results_md(results_dir: str, *, out: str, figures_dir: str, command: str | None) -> tuple[str, Figures]:  # noqa: C901
    """The text of RESULTS.md (to be written at ``out``, whose notes it keeps) and the figures it
    links (not yet copied)."""
    head_dir = os.path.join(results_dir, "headline")
    with open(os.path.join(head_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    summary = _read_csv(os.path.join(head_dir, "summary.csv"))
    runs = _read_csv(os.path.join(head_dir, "runs.csv"))
    notes = ""
    if os.path.isfile(out):
        old = open(out, encoding="utf-8").read()
        if NOTES_BEGIN in old:  # (an end marker lost in a hand edit: the notes run to the end of the file)
            notes = old.split(NOTES_BEGIN, 1)[1].split(NOTES_END, 1)[0].strip("\n")
    os.makedirs(figures_dir, exist_ok=True)

    figs = Figures(results_dir, figures_dir, out)
    fig = figs.link

    v = cfg.get("versions", {})
    runs_meta = cfg.get("runs", [])
    durations = sorted({r.get("duration_s") for r in runs_meta if r.get("duration_s") is not None})
    scen = list(dict.fromkeys(summary["scenario"]))
    pols = list(dict.fromkeys(summary["policy"]))
    lines: list[str] = []
    add = lines.append
    add("# Results\n")
    add("Generated by `carbon-gym report` from a real run of the headline experiment (and the other experiments")
    add("whose outputs were present). Numbers are means over seeds with 95% t-intervals; every policy saw the")
    add("same requests and the same carbon for a given seed (common random numbers); episode starts are spread")
    add("over the 2023 carbon year (day of year x hour of day, the same for every policy).\n")
    add("## How it was produced\n")
    add("```bash")
    add(command or cfg.get("command") or "carbon-gym experiment headline --preset quick")
    add(f"carbon-gym report {results_dir}")
    add("```\n")
    add(f"- scenarios: {', '.join(scen)}")
    add(f"- policies: {', '.join(pols)}")
    windows = sorted({float(w) for w in runs["window_s"].dropna()}) if runs is not None and "window_s" in runs else []
    warm = sorted({float(r.get("overrides", {}).get("env.warmup_s", 0.0)) for r in runs_meta})
    preset = cfg.get("preset", "?")
    if windows:
        add(f"- measurement window: {', '.join(f'{w:g}' for w in windows)} s (steady state: after a {', '.join(f'{w:g}' for w in warm)} s burn-in "
            "that is simulated, not counted; no drain; work in flight at the end counted as far as it was run in the window)")
    else:
        add("- measurement window: none (episodes from an empty cluster, arrivals for "
            f"{', '.join(f'{d:g}' for d in durations)} s, then the drain, all counted"
            + (": the quick preset, a smoke test, not a result)" if preset == "quick" else ")"))
    add(starts_line(runs_meta))
    add(f"- preset `{preset}`" + (f": {PRESETS[preset].note}" if preset in PRESETS else ""))
    if "elapsed_s" in cfg:
        add(f"- wall time: {cfg['elapsed_s'] / 60:.1f} min on {cfg.get('workers')} worker process(es), {cfg.get('cpu_count')} CPU cores ({cfg.get('backend')})")
    if runs is not None and "cpu_s" in runs:
        add(f"- CPU time of the runs: {runs['cpu_s'].sum() / 60:.1f} min in total ({runs['cpu_s'].sum() / 120:.1f} min of wall time on 2 dedicated cores)")
    costs = run_costs_markdown(results_dir)
    if costs:
        add("\nEvery matrix in this file, its command and cost:\n")
        add(costs)
    add("- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "platform"))
    add(f"- platform: {v.get('platform', '?')}\n")
    try:
        add(slo_section(results_dir))  # the operating points within the SLO lead (eval/slo_report.py)
    except FileNotFoundError:
        pass
    add("## Headline: carbon reduction vs round-robin (SLO violation %)\n")
    bsum = _read_csv(os.path.join(head_dir, "bound_summary.csv"))
    add(headline_table(summary, bsum))
    add(f"Full table (carbon in kg, latencies in ms; decision time is wall clock per step). {METRICS_NOTE}\n")
    add(summary_markdown(summary))
    bounds = _read_csv(os.path.join(head_dir, "bounds.csv"))
    if bounds is not None and runs is not None:
        from eval.bound import bound_check_markdown, with_bounds

        add(bound_check_markdown(with_bounds(runs, bounds)))
    for exp, stem, caption in (
        ("headline", "headline_reduction", "Carbon reduction vs round-robin per scenario and policy."),
        ("headline", "headline_violations", "SLO violation rate per scenario and policy."),
    ):
        p = fig(exp, stem)
        if p:
            add(f"![{caption}]({p})\n\n*{caption}*\n")
    focus = next((s for s in scen if s.endswith("-moderate")), scen[0])
    for stem, caption in (
        (f"{focus}_carbon_over_time_seed0", f"{focus}, seed 0: carbon emission rate per datacenter (lines, one per policy) over grid intensity (shaded)."),
        (f"{focus}_load_by_hour", f"{focus}: share of requests each policy sends to each datacenter, by UTC hour (all seeds)."),
        (f"{focus}_latency_cdf", f"{focus}: TTFT and TPOT distributions (seeds pooled); dashed = SLO target."),
    ):
        p = fig("headline", stem)
        if p:
            add(f"![{caption}]({p})\n\n*{caption}*\n")
    mvi_runs = milp_vs_ilp_runs(results_dir) if _own_runs(results_dir, "milp-vs-ilp") is not None else None
    mvi_covers = mvi_runs is not None and runs is not None and set(runs["scenario"]) <= set(mvi_runs["scenario"])
    if not mvi_covers and runs is not None and "milp" in set(runs["policy"]):  # (kept unless experiment b covers its scenarios)
        ilps = [p for p in ILP_POLICIES if p in set(runs["policy"])]
        if ilps:
            add("## Facility MILP vs per-request ILPs (from the headline runs)\n")
            add(f"Reduction vs rr, % (SLO violation %; MLPerf p99 verdict), and the paired gap MILP - ILP in percentage points (mean ± 95% CI over seeds). {METRICS_NOTE}\n")
            add(milp_vs_ilp_markdown(milp_vs_ilp_table(runs, ilps=ilps), ilps))
    bound_runs = _own_runs(results_dir, "bound")
    bound_ran = bound_runs is not None
    if bounds is not None and runs is not None and not (bound_runs is not None and set(runs["policy"]) <= set(bound_runs["policy"])):
        from eval.bound import bound_share, with_bounds

        add("## Share of the carbon lower bound (from the headline runs)\n")
        add("The headline's runs against the bound of their episodes " + (
            "(the clairvoyant heuristic of `carbon-gym experiment bound`: \"Share of the carbon lower bound\" below).\n" if bound_ran
            else "(the clairvoyant heuristic of `carbon-gym experiment bound` was not run).\n"))
        add(bound_share(with_bounds(runs, bounds))[1])
    for exp in TABLE_SECTIONS:
        section = table_section(results_dir, exp, figs)
        if section is not None:
            add(section)
    if os.path.isfile(os.path.join(results_dir, "capacity", "runs.csv")):
        from eval.capacity_report import capacity_section

        add(capacity_section(results_dir))
    add(COMPARISON_TITLE + "\n")
    add(COMPARISON_NOTE)
    ours = _claims(results_dir)
    add("| claim | study | this run |")
    add("|---|---|---|")
    for key, claim, study in STUDY_CLAIMS:
        add(f"| {claim} | {study} | {ours.get(key, 'not run')} |")
    add("")
    add("## Discussion\n")
    add(NOTES_BEGIN)
    add(notes or "(to be written: where and why these numbers differ from the study's)")
    add(NOTES_END)
    return "\n".join(lines) + "\n", figs


#: The sections the headline matrix writes (titles as prefixes), in file order.
HEADLINE_SECTIONS = ("## How it was produced\n", "## Headline:", "## Facility MILP vs per-request ILPs (from the headline runs)\n",
                     "## Share of the carbon lower bound (from the headline runs)\n")
#: The study claims computed from the headline matrix.
HEADLINE_CLAIMS = ("carbon", "violation")


def write_headline_section(results_dir: str, *, out: str = "RESULTS.md", figures_dir: str = "docs/figures", command: str | None = None) -> str:
    """Rewrite the headline's parts of an existing ``out`` in place from ``<results_dir>/headline``:
    the preamble, "How it was produced" (its cost table keeps the rows of matrices not under
    ``results_dir``, with the totals summed again), the headline section, the sections derived from
    the headline runs and the headline's study claims; every other section is kept. For a headline
    rerun without the other experiments' outputs at hand."""
    from carbon_gym.errors import ConfigError

    if not os.path.isfile(out):
        raise ConfigError("out", f"{out!r} not found: a section is rewritten in an existing RESULTS.md (write the whole file first)")
    if not os.path.isfile(os.path.join(results_dir, "headline", "config.json")):
        raise ConfigError("results_dir", f"{os.path.join(results_dir, 'headline')!r} not found; run "
                          f"`carbon-gym experiment headline --out {results_dir}` first")
    old = open(out, encoding="utf-8").read()
    new, figs = _results_md(results_dir, out=out, figures_dir=figures_dir, command=command)
    _, old_secs = _split_sections(old)
    new_head, new_secs = _split_sections(new)

    def own(sec: str) -> str | None:
        return next((t for t in HEADLINE_SECTIONS if sec.startswith(t)), None)

    fresh = {own(s): s for s in new_secs if own(s)}
    secs: list[str] = []
    for sec in old_secs:
        t = own(sec)
        if t is None:
            secs.append(sec)
        elif t in fresh:
            secs.append(fresh.pop(t))
    for t, sec in list(fresh.items()):  # a headline section the old file lacked: after the last of its kind before it
        before = HEADLINE_SECTIONS[:HEADLINE_SECTIONS.index(t)]
        at = max((i + 1 for i, s in enumerate(secs) if own(s) in before), default=0)
        secs.insert(at, sec)
    text = new_head + "".join("\n" + s for s in secs)
    new_rows = _costs_rows(new)
    mine = {_cost_dir(r) for r in new_rows}
    if new_rows:
        text = _with_cost_rows(text, new_rows, new_rows + [r for r in _costs_rows(old) if _cost_dir(r) not in mine])
    ours = _claims(results_dir)
    for key in HEADLINE_CLAIMS:
        text = _with_claim(text, key, ours.get(key, "not run"))
    figs.copy()
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    return out
