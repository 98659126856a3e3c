"""Learning-curve figure of a training run, read back from its TensorBoard events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .tags import TAGS

__all__ = ["read_scalars", "plot_run", "plot_compare", "plot_dagger", "scalar_table", "PANELS", "main"]

#: (title, tag) of each panel, in order; panels whose tag is absent are skipped.
PANELS = (
    ("reduction vs round-robin, held-out episode (%)", TAGS.reduction_vs_rr_pct),
    ("SLO violation rate, held-out episode", TAGS.slo_violation_rate),
    ("carbon per step, training rollouts (g)", TAGS.carbon_step_g),
    ("episode return (normalised reward, Monitor)", "rollout/ep_rew_mean"),
    ("value loss", "train/value_loss"),
    ("approx. KL", "train/approx_kl"),
    ("p99 TTFT, held-out episode (s)", TAGS.ttft_p99_s),
    ("TTFT violation rate, training rollouts", "rollout/ttft_violation_rate"),
    ("SLO multipliers (slo_constraint): TTFT", "slo/lambda_ttft"),
    ("behaviour cloning: cross-entropy", "bc/ce"),
    ("behaviour cloning: agreement with expert", "bc/accuracy"),
)


def read_scalars(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every scalar under ``logdir`` (all event files)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: sorted((e.step, float(e.value)) for e in acc.Scalars(tag)) for tag in acc.Tags().get("scalars", [])}


def plot_run(run_dir: str | Path, out_png: str | Path, title: str | None = None) -> Path:
    """Plot the run's learning curves (``run_dir/tb``) into ``out_png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scalars = read_scalars(Path(run_dir) / "tb")
    panels = [(t, tag) for t, tag in PANELS if scalars.get(tag)]
    if not panels:
        panels = [(tag, tag) for tag in sorted(scalars)[:4]]
    n = max(1, len(panels))
    cols = 2
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(10, 2.8 * rows), squeeze=False)
    for ax, (t, tag) in zip(axes.flat, panels):
        pts = scalars.get(tag, [])
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3)
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("epoch" if tag.startswith("bc/") else "timesteps", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title or f"training run {Path(run_dir).name}", fontsize=10)
    return _save(fig, out_png)


def plot_compare(
    runs: dict[str, str | Path],
    out_png: str | Path,
    *,
    tags: tuple[str, ...] = (TAGS.reduction_vs_rr_pct, TAGS.slo_violation_rate),
    reference: dict[str, dict[str, float]] | None = None,
    title: str = "",
) -> Path:
    """Overlay several runs (``{label: run_dir}``): one panel per tag, x = timesteps.
    ``reference`` adds horizontal lines, ``{label: {tag: value}}`` (e.g. the facility MILP)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tags), figsize=(5.2 * len(tags), 3.4), squeeze=False)
    data = {label: read_scalars(Path(d) / "tb") for label, d in runs.items()}
    for ax, tag in zip(axes[0], tags):
        for label, sc in data.items():
            pts = sc.get(tag, [])
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", ms=3, label=label)
        for i, (label, vals) in enumerate((reference or {}).items()):
            if tag in vals:
                ax.axhline(vals[tag], ls="--", lw=1, color=f"C{len(data) + i}", label=label)
        ax.set_title(tag, fontsize=9)
        ax.set_xlabel("timesteps", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, out_png)


def plot_dagger(runs: dict[str, str | Path], out_png: str | Path, title: str = "") -> Path:
    """DAgger curves of imitation runs (``{label: run_dir}`` holding ``dagger.json``), x = round:
    reduction vs round-robin and SLO violation rate on each validation episode (the expert's as
    dashed lines), and the imitation losses at the end of each round."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15.5, 3.6))
    styles = ["-", ":", "-.", "--"]
    for i, (label, d) in enumerate(runs.items()):
        data = json.loads((Path(d) / "dagger.json").read_text())
        rounds = data["rounds"]
        xs = [r["round"] for r in rounds]
        for j, (scen, ref) in enumerate(data["refs"].items()):
            name, _, start = scen.partition("@")
            short = name.split("-")[-1] + (f"@{start[5:10]}" if start else "")
            red = [r[f"reduction_{scen}"] for r in rounds]
            vio = [100 * r[f"violation_{scen}"] for r in rounds]
            axes[0].plot(xs, red, styles[i % 4], marker="o", ms=3, color=f"C{j}", label=f"{label}: {short}")
            axes[1].plot(xs, vio, styles[i % 4], marker="o", ms=3, color=f"C{j}", label=f"{label}: {short}")
            if i == 0:
                milp_red = 100 * (1 - ref["milp"]["carbon_g"] / ref["rr"]["carbon_g"])
                axes[0].axhline(milp_red, ls="--", lw=1, color=f"C{j}", alpha=0.6, label=f"expert: {short}")
                axes[1].axhline(100 * ref["milp"]["violation_rate"], ls="--", lw=1, color=f"C{j}", alpha=0.6, label=f"expert: {short}")
        for key, c in (("ce", "C2"), ("val_ce", "C3"), ("aggregate", "C4")):
            ys = [r["bc"].get(key) for r in rounds]
            if all(y is not None for y in ys):
                axes[2].plot(xs, ys, styles[i % 4], marker="o", ms=3, color=c, label=f"{label}: {key}")
    axes[0].set_title("reduction vs round-robin, validation episode (%)", fontsize=9)
    axes[1].set_title("SLO violation rate, validation episode (%)", fontsize=9)
    axes[2].set_title("imitation loss at the end of the round", fontsize=9)
    for ax in axes:
        ax.set_xlabel("DAgger round (0 = expert data only)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, out_png)


def _save(fig: Any, out_png: str | Path) -> Path:
    """Lay out ``fig``, write it to ``out_png`` (folders made) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


#: Columns of :func:`scalar_table` by default: the held-out episode and the SLO constraint.
TABLE_TAGS = (TAGS.reduction_vs_rr_pct, TAGS.slo_violation_rate, TAGS.ttft_p99_s, "rollout/ttft_violation_rate",
              "rollout/tpot_violation_rate", "slo/lambda_ttft", "slo/lambda_tpot", TAGS.carbon_step_g, "train/approx_kl",
              "train/explained_variance")


def scalar_table(logdir: str | Path, tags: tuple[str, ...] = TABLE_TAGS, every: int = 1) -> str:
    """A markdown table of ``tags`` (those present) by timestep, every ``every``-th logged step
    (the steps of a held-out evaluation always kept)."""
    sc = read_scalars(logdir)
    cols = [t for t in tags if t in sc]
    if not cols:
        return "(none of the tags " + ", ".join(tags) + " in " + str(logdir) + ")\n"
    by: dict[int, dict[str, float]] = {}
    for t in cols:
        for step, v in sc[t]:
            by.setdefault(step, {})[t] = v
    steps = sorted(by)
    keep = [st for i, st in enumerate(steps) if i % max(1, every) == 0 or TAGS.reduction_vs_rr_pct in by[st] or st == steps[-1]]
    lines = ["| timesteps | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for st in keep:
        lines.append(f"| {st} | " + " | ".join(f"{by[st][t]:.4g}" if t in by[st] else "" for t in cols) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m train.curves RUN_DIR [--every N] [--png OUT]``: print the run's scalars as a
    markdown table (:func:`scalar_table`) and optionally plot its curves."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m train.curves", description=main.__doc__)
    ap.add_argument("run_dir", help="a training run folder (its tb/)")
    ap.add_argument("--every", type=int, default=1, help="print every N-th logged timestep (default 1)")
    ap.add_argument("--png", default=None, help="also plot the curves into this PNG")
    a = ap.parse_args(argv)
    tb = Path(a.run_dir) / "tb"
    if not tb.is_dir():
        print(f"error: run_dir: {str(tb)!r} not found (a carbon-gym train run folder)", file=sys.stderr)
        return 2
    sys.stdout.write(scalar_table(tb, every=a.every))
    if a.png:
        print(f"wrote {plot_run(a.run_dir, a.png)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
