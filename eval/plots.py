"""Figures of the evaluation (matplotlib, Agg backend, PNG + PDF).

Every function takes plain tables (pandas DataFrames or column dicts) produced by
:mod:`eval.tables` / :mod:`eval.runner` and writes ``<stem>.png`` and ``<stem>.pdf`` (each all or nothing, :func:`eval.writers.atomic_path`), returning the two paths.
matplotlib is imported lazily (``import eval.plots`` is cheap).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

SECONDS_PER_HOUR = 3600.0


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, stem: str) -> list[str]:
    """Write ``stem.png`` (150 dpi) and ``stem.pdf``; close the figure; return the paths."""
    from eval.writers import atomic_path

    paths = [stem + ".png", stem + ".pdf"]
    try:
        with atomic_path(paths[0]) as tmp:  # (all or nothing: a full disk leaves no half figure)
            fig.savefig(tmp, dpi=150, bbox_inches="tight", format="png")
        with atomic_path(paths[1]) as tmp:
            fig.savefig(tmp, bbox_inches="tight", format="pdf", metadata={"CreationDate": None})
    finally:
        _plt().close(fig)
    return paths


def _colors(names: Sequence[str]) -> dict[str, Any]:
    """A colour per name: tab10, or tab20 when there are more than 10 (so no two share one)."""
    plt = _plt()
    k = 10 if len(names) <= 10 else 20
    cmap = plt.get_cmap(f"tab{k}")
    return {n: cmap(i % k) for i, n in enumerate(names)}


def _grid(n: int) -> tuple[int, int]:
    cols = int(np.ceil(np.sqrt(n)))
    rows = int(np.ceil(n / cols))
    return rows, cols


def carbon_over_time(
    steps: Mapping[str, Any],
    dc_names: Sequence[str],
    stem: str,
    *,
    title: str = "",
    arrivals_end_s: float | None = None,
) -> list[str]:
    """Carbon emission rate per datacenter over the episode, grid intensity shaded behind.

    The last step of an episode is its drain (no new arrivals, until placed work completes or
    the drain limit passes) and can be much longer than a polling period; ``arrivals_end_s``
    limits the x axis to 1.15 x the arrival window so the drain does not squash the episode.

    Args:
        steps: ``{policy: steps DataFrame}`` of one (scenario, seed); each frame has ``time_s``,
            ``carbon_g_dc<i>`` (g emitted in the step) and ``intensity_g_per_kwh_dc<i>``.
        dc_names: datacenter labels (one small panel each).
    """
    plt = _plt()
    policies = list(steps)
    colors = _colors(policies)
    n = len(dc_names)
    rows, cols = _grid(n)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.3 * rows), sharex=True, squeeze=False)
    def edges_of(frame: Any) -> np.ndarray:
        t = np.asarray(frame["time_s"], dtype=float)
        first = t[1] - t[0] if t.size > 1 else t[0]
        return np.concatenate([[t[0] - first], t]) / 60.0  # step k covers [edges[k], edges[k+1])

    for d, name in enumerate(dc_names):
        ax = axes[d // cols][d % cols]
        ax2 = ax.twinx()
        first = steps[policies[0]]
        ci_col = f"intensity_g_per_kwh_dc{d}"
        if ci_col in first:
            e = edges_of(first)
            ci = np.asarray(first[ci_col], dtype=float)
            ax2.stairs(ci, e, fill=True, color="0.88", zorder=0, linewidth=0)
            ax2.set_ylim(0, max(1.0, float(np.nanmax(ci)) * 1.15))
        ax2.tick_params(axis="y", labelsize=6, colors="0.45")
        ax.set_zorder(ax2.get_zorder() + 1)
        ax.patch.set_visible(False)
        top = 0.0
        for pol in policies:
            s = steps[pol]
            col = f"carbon_g_dc{d}"
            if col not in s:
                continue
            e = edges_of(s)
            rate = np.asarray(s[col], dtype=float) / np.maximum(np.diff(e) * 60.0, 1e-9)
            ax.stairs(rate, e, color=colors[pol], linewidth=0.9, label=pol, baseline=None)
            top = max(top, float(np.nanmax(rate)) if rate.size else 0.0)
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)
        ax.set_title(name, fontsize=8)
        ax.tick_params(labelsize=6)
        if d % cols == 0:
            ax.set_ylabel("carbon (g/s)", fontsize=7)
        if (d % cols) == cols - 1:
            ax2.set_ylabel("grid gCO2/kWh", fontsize=7, color="0.45")
    if arrivals_end_s:
        for row in axes:
            for ax in row:
                ax.set_xlim(0, 1.15 * float(arrivals_end_s) / 60.0)
    for d in range(n, rows * cols):
        axes[d // cols][d % cols].axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("time (min)", fontsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 8), fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1.02))
    if title:
        fig.suptitle(title, y=1.06, fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def load_by_hour(
    requests: Mapping[str, Sequence[tuple[Any, float]]],
    dc_names: Sequence[str],
    stem: str,
    *,
    title: str = "",
) -> list[str]:
    """Where each policy sends load over the day: stacked share of requests per datacenter vs
    UTC hour of day (of the carbon trace).

    Args:
        requests: ``{policy: [(requests DataFrame, episode start offset s), ...]}``; frames need
            ``arrival_s`` and ``datacenter``. Hours with no request are left blank.
    """
    plt = _plt()
    policies = list(requests)
    rows, cols = _grid(len(policies))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), sharey=True, squeeze=False)
    n_dc = len(dc_names)
    cmap = plt.get_cmap("tab20")
    for k, pol in enumerate(policies):
        ax = axes[k // cols][k % cols]
        counts = np.zeros((24, n_dc))
        for frame, offset_s in requests[pol]:
            if len(frame) == 0:
                continue
            hour = (((float(offset_s) + np.asarray(frame["arrival_s"], dtype=float)) / SECONDS_PER_HOUR) % 24).astype(int)
            dc = np.asarray(frame["datacenter"], dtype=int)
            ok = (dc >= 0) & (dc < n_dc)
            np.add.at(counts, (hour[ok], dc[ok]), 1.0)
        tot = counts.sum(axis=1, keepdims=True)
        share = np.divide(counts, tot, out=np.full_like(counts, np.nan), where=tot > 0)
        bottom = np.zeros(24)
        hours = np.arange(24)
        for d in range(n_dc):
            vals = np.nan_to_num(share[:, d])
            ax.bar(hours, vals, bottom=bottom, width=0.9, color=cmap(d % 20), label=dc_names[d], linewidth=0)
            bottom += vals
        ax.set_title(pol, fontsize=9)
        ax.set_xlim(-0.5, 23.5)
        ax.set_ylim(0, 1)
        ax.set_xticks(range(0, 24, 3))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("hour of day (UTC)", fontsize=8)
        if k % cols == 0:
            ax.set_ylabel("share of requests", fontsize=8)
    for k in range(len(policies), rows * cols):
        axes[k // cols][k % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def _ecdf(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(x[np.isfinite(x)])
    return x, np.arange(1, x.size + 1) / max(x.size, 1)


def latency_cdfs(
    requests: Mapping[str, Any],
    stem: str,
    *,
    ttft_target_s: float | None = None,
    tpot_target_s: float | None = None,
    title: str = "",
) -> list[str]:
    """Empirical CDFs of TTFT and TPOT per policy (log x axis), SLO targets as dashed lines.

    Args:
        requests: ``{policy: DataFrame with ttft_s, tpot_s}`` (seeds pooled).
    """
    plt = _plt()
    colors = _colors(list(requests))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, col, target, label in (
        (axes[0], "ttft_s", ttft_target_s, "TTFT (s)"),
        (axes[1], "tpot_s", tpot_target_s, "TPOT (s)"),
    ):
        for pol, frame in requests.items():
            x = np.asarray(frame[col], dtype=float)
            if col == "tpot_s" and "output_tokens" in frame:
                x = x[np.asarray(frame["output_tokens"]) > 1]  # TPOT is undefined for 1-token outputs
            x = x[x > 0]
            if x.size == 0:
                continue
            xs, ys = _ecdf(x)
            ax.step(xs, ys, where="post", color=colors[pol], label=pol, linewidth=1.1)
        if target:
            ax.axvline(target, color="k", linestyle="--", linewidth=0.8)
            ax.axhline(0.99, color="0.6", linestyle=":", linewidth=0.8)
        ax.set_xscale("log")
        from matplotlib.ticker import NullFormatter

        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def bars(
    table: Any,
    *,
    x: str,
    hue: str,
    y: str,
    stem: str,
    yerr: str | None = None,
    ylabel: str = "",
    title: str = "",
    hue_order: Sequence[str] | None = None,
    x_order: Sequence[str] | None = None,
) -> list[str]:
    """Grouped bar chart of ``table[y]`` by ``x`` (groups) and ``hue`` (bars), error bars ``yerr``."""
    plt = _plt()
    xs = list(x_order) if x_order is not None else list(dict.fromkeys(table[x]))
    hs = list(hue_order) if hue_order is not None else list(dict.fromkeys(table[hue]))
    colors = _colors(hs)
    width = 0.8 / max(len(hs), 1)
    fig, ax = plt.subplots(figsize=(min(14.0, max(5.0, 1.1 * len(xs) * max(1, len(hs)) * 0.35 + 2)), 3.6))
    for j, h in enumerate(hs):
        vals, errs = [], []
        for xv in xs:
            sel = table[(table[x] == xv) & (table[hue] == h)]
            vals.append(float(sel[y].iloc[0]) if len(sel) else np.nan)
            errs.append(float(sel[yerr].iloc[0]) if (yerr and len(sel) and yerr in sel) else np.nan)
        pos = np.arange(len(xs)) - 0.4 + width * (j + 0.5)
        e = np.nan_to_num(np.asarray(errs, dtype=float)) if yerr else None
        ax.bar(pos, vals, width=width, color=colors[h], label=h, yerr=e, capsize=2, error_kw={"linewidth": 0.7})
    ax.set_xticks(np.arange(len(xs)))
    ax.set_xticklabels([str(v) for v in xs], rotation=20, ha="right", fontsize=8)
    ax.axhline(0, color="k", linewidth=0.6)
    ax.set_ylabel(ylabel or y)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(len(hs), 4), frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def polling_curve(table: Any, stem: str, *, title: str = "") -> list[str]:
    """SLO violation rate and carbon reduction vs polling period, one line per policy.

    Args:
        table: rows with ``policy``, ``polling_s``, ``slo_violation_pct`` (+``_ci95``),
            ``reduction_vs_rr_pct`` (+``_ci95``).
    """
    plt = _plt()
    pols = list(dict.fromkeys(table["policy"]))
    colors = _colors(pols)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.3))
    for pol in pols:
        sel = table[table["policy"] == pol].sort_values("polling_s")
        for ax, col in ((axes[0], "slo_violation_pct"), (axes[1], "reduction_vs_rr_pct")):
            err = sel[col + "_ci95"].to_numpy(float) if col + "_ci95" in sel else None
            ax.errorbar(sel["polling_s"], sel[col], yerr=None if err is None else np.nan_to_num(err), marker="o", color=colors[pol], label=pol, capsize=2, linewidth=1.1, markersize=4)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    periods = sorted(set(float(v) for v in table["polling_s"]))
    axes[0].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(periods))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("polling period (s)")
        ax.axvline(2.0, color="0.5", linestyle=":", linewidth=0.8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("SLO violations (% of requests)")
    axes[1].set_ylabel("carbon reduction vs rr (%)")
    axes[1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def tradeoff(table: Any, stem: str, *, sweep_policy: str, param: str, title: str = "") -> list[str]:
    """Carbon reduction vs SLO violation: the swept policy as a labelled frontier, others as points.

    Args:
        table: rows with ``policy``, ``slo_violation_pct``, ``reduction_vs_rr_pct`` (+ ``_ci95``)
            and, for the sweep's rows, the swept value in column ``param``.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    sweep = table[table["policy"] == sweep_policy].sort_values("slo_violation_pct")
    ax.errorbar(
        sweep["slo_violation_pct"], sweep["reduction_vs_rr_pct"],
        xerr=np.nan_to_num(sweep.get("slo_violation_pct_ci95", 0 * sweep["slo_violation_pct"]).to_numpy(float)),
        yerr=np.nan_to_num(sweep.get("reduction_vs_rr_pct_ci95", 0 * sweep["reduction_vs_rr_pct"]).to_numpy(float)),
        marker="o", color="C0", label=f"{sweep_policy} ({param} swept)", capsize=2, linewidth=1.2,
    )
    for _, r in sweep.iterrows():
        ax.annotate(f"{r[param]:g}", (r["slo_violation_pct"], r["reduction_vs_rr_pct"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    others = table[table["policy"] != sweep_policy]
    colors = _colors(list(dict.fromkeys(others["policy"])))
    for _, r in others.iterrows():
        ax.scatter([r["slo_violation_pct"]], [r["reduction_vs_rr_pct"]], color=colors[r["policy"]], marker="s", s=25, label=r["policy"], zorder=3)
    ax.set_xlabel("SLO violations (% of requests)")
    ax.set_ylabel("carbon reduction vs rr (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def frontiers(points: Any, singles: Any, stem: str, *, title: str = "") -> list[str]:
    """Carbon reduction vs SLO violation: one frontier per knob-driven policy (its points joined
    in violation order, its Pareto points filled, its default ringed), the other policies as
    points.

    Args:
        points: :func:`eval.frontiers.frontier_points` rows of one scenario.
        singles: summary rows of the policies without a knob (``policy``, ``slo_violation_pct``,
            ``reduction_vs_rr_pct``).
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    pols = list(dict.fromkeys(points["policy"]))
    colors = _colors(pols + [p for p in singles["policy"] if p not in pols])
    for pol in pols:
        g = points[points["policy"] == pol].sort_values("slo_violation_pct")
        c = colors[pol]
        ax.plot(g["slo_violation_pct"], g["reduction_vs_rr_pct"], color=c, linewidth=1.0, alpha=0.6)
        eff = g[g["pareto"].astype(bool)]
        ax.scatter(eff["slo_violation_pct"], eff["reduction_vs_rr_pct"], color=c, s=22, zorder=3, label=f"{pol} ({g['knob'].iloc[0]})")
        rest = g[~g["pareto"].astype(bool)]
        ax.scatter(rest["slo_violation_pct"], rest["reduction_vs_rr_pct"], facecolors="none", edgecolors=c, s=22, zorder=3)
        d = g[g["default"].astype(bool)]
        ax.scatter(d["slo_violation_pct"], d["reduction_vs_rr_pct"], facecolors="none", edgecolors="k", s=70, zorder=4)
        for _, r in g.iterrows():
            ax.annotate(f"{r['value']:g}", (r["slo_violation_pct"], r["reduction_vs_rr_pct"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points", color=c)
    for _, r in singles.iterrows():
        ax.scatter([r["slo_violation_pct"]], [r["reduction_vs_rr_pct"]], color=colors[r["policy"]], marker="s", s=25,
                   label=r["policy"], zorder=3)
    ax.set_xlabel("SLO violations (% of requests)")
    ax.set_ylabel("carbon reduction vs rr (%)")
    ax.grid(alpha=0.3)
    if len(colors) > 8:  # many policies: the legend beside the axes, not over the points
        fig.set_size_inches(8.5, 4.2)
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=7, frameon=False)
    if title:
        ax.set_title(title + " (ringed: defaults)", fontsize=10)
    fig.tight_layout()
    return save(fig, stem)
