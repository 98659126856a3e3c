"""Generalisation tests of a learned policy (issue 24 item 3): data never used for training.

Usage::

    python -m train.generalise --checkpoint PATH [--days 2] [--duration-s 60]
        [--test NAME=SCENARIO[,KEY=VALUE...]] ... [--carbon-csv PATH --year YYYY]

Each test is a scenario with overrides (``--test other-load=llama8b-high``,
``--test faults=dev-fault-region``, ``--test other-topology=dev``); ``--carbon-csv`` adds the
test ``other-year``: the first ``--test``'s scenario (default ``llama8b-moderate``) on the
user's carbon CSV (``carbon.file``) with starts spread over all days of ``--year``. Per test,
round-robin, the facility MILP and the learned policy run the same episodes (world seed
1000 + i, :func:`train.evaluate.evaluate_episode`); the table gives their reductions vs
round-robin, the learned policy's **share of the MILP's reduction** (learned / MILP, mean of the
per-episode reductions) and the **violation difference** (learned - MILP, percentage points).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

import numpy as np

from carbon_gym.errors import CarbonGymError, ConfigError

__all__ = ["GenTest", "parse_test", "run_tests", "markdown"]

#: Default tests when none is given: other loads and a fault scenario of the shipped set.
DEFAULT_TESTS = ("other-load=llama8b-high", "faults=dev-fault-region", "other-topology=dev")


class GenTest:
    """One test: a name, a scenario, its overrides and the episode starts (None: held-out days of 2023)."""

    def __init__(self, name: str, scenario: str, overrides: dict[str, Any], starts: list[str] | None = None) -> None:
        self.name, self.scenario, self.overrides, self.starts = name, scenario, dict(overrides), starts


def _value(v: str) -> Any:
    v = v.strip()
    try:
        return int(v) if v.lstrip("-").isdigit() else float(v)
    except ValueError:
        return v


def parse_test(text: str) -> GenTest:
    """``NAME=SCENARIO[,KEY=VALUE...]`` -> :class:`GenTest`; :class:`ConfigError` (field ``--test``)."""
    name, sep, rest = text.partition("=")
    parts = [p for p in rest.split(",") if p.strip()]
    if not sep or not name.strip() or not parts:
        raise ConfigError("--test", f"expected NAME=SCENARIO[,KEY=VALUE...], got {text!r}")
    over = {}
    for p in parts[1:]:
        k, s2, v = p.partition("=")
        if not s2 or not k.strip():
            raise ConfigError("--test", f"override {p!r} of test {name!r} is not KEY=VALUE")
        over[k.strip()] = _value(v)
    return GenTest(name.strip(), parts[0].strip(), over)


def run_tests(tests: Sequence[GenTest], *, checkpoint: str | None, days: int, duration_s: float,
              log: Any = None) -> dict[str, dict[str, Any]]:
    """Per test: ``{"scenario", "episodes", "rr"/"milp"/"learned": {carbon_g, violation_rate} means,
    "reduction_milp_pct", "reduction_learned_pct", "share_of_milp", "violation_diff_pp"}``."""
    from .envs import heldout_starts
    from .evaluate import evaluate_episode

    out: dict[str, dict[str, Any]] = {}
    for t in tests:
        starts = t.starts if t.starts is not None else heldout_starts(int(days))
        over = {**t.overrides, "duration_s": float(duration_s)}
        red_m, red_l, vd = [], [], []
        per: dict[str, list[dict[str, float]]] = {"rr": [], "milp": [], "learned": []}
        for i, st in enumerate(starts):
            for name in per:
                per[name].append(evaluate_episode(name, t.scenario, st, 1000 + i, over, checkpoint=checkpoint))
            rr = per["rr"][-1]["carbon_g"]
            red_m.append(100.0 * (1.0 - per["milp"][-1]["carbon_g"] / rr))
            red_l.append(100.0 * (1.0 - per["learned"][-1]["carbon_g"] / rr))
            vd.append(100.0 * (per["learned"][-1]["violation_rate"] - per["milp"][-1]["violation_rate"]))
            if log:
                log(f"generalise: {t.name} {t.scenario} {st}: MILP {red_m[-1]:.1f}%, learned {red_l[-1]:.1f}%, "
                    f"violations {vd[-1]:+.2f} pp")
        rm, rl = float(np.mean(red_m)), float(np.mean(red_l))
        out[t.name] = {"scenario": t.scenario, "overrides": t.overrides, "episodes": len(starts),
                       **{k: {"carbon_g": float(np.mean([e["carbon_g"] for e in v])),
                              "violation_rate": float(np.mean([e["violation_rate"] for e in v]))} for k, v in per.items()},
                       "reduction_milp_pct": rm, "reduction_learned_pct": rl,
                       "share_of_milp": rl / rm if abs(rm) > 1e-9 else float("nan"),
                       "violation_diff_pp": float(np.mean(vd))}
    return out


def markdown(res: dict[str, dict[str, Any]]) -> str:
    """The generalisation table."""
    lines = ["| test | scenario | episodes | MILP reduction vs rr | learned reduction vs rr | share of the MILP's "
             "reduction | violations learned - MILP (pp) |", "|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        lines.append(f"| {name} | {r['scenario']} | {r['episodes']} | {r['reduction_milp_pct']:.1f}% | "
                     f"{r['reduction_learned_pct']:.1f}% | {100 * r['share_of_milp']:.0f}% | {r['violation_diff_pp']:+.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.generalise", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=None, help="default: the shipped agent")
    ap.add_argument("--test", action="append", default=[], metavar="NAME=SCENARIO[,KEY=VALUE...]")
    ap.add_argument("--carbon-csv", default=None, help="a carbon CSV of another year (adds the test other-year)")
    ap.add_argument("--year", type=int, default=None, help="the year of --carbon-csv")
    ap.add_argument("--days", type=int, default=2, help="episode starts per test")
    ap.add_argument("--duration-s", type=float, default=60.0)
    a = ap.parse_args(argv)
    try:
        tests = [parse_test(t) for t in (a.test or DEFAULT_TESTS)]
        if a.carbon_csv:
            from pathlib import Path

            from .envs import heldout_starts

            if a.year is None:
                raise ConfigError("--year", "--carbon-csv needs the year of its data (--year YYYY)")
            scen = tests[0].scenario if a.test else "llama8b-moderate"
            tests.append(GenTest("other-year", scen, {"carbon.file": str(Path(a.carbon_csv).resolve())},
                                 heldout_starts(int(a.days), every=1, year=int(a.year))))
        res = run_tests(tests, checkpoint=a.checkpoint, days=a.days, duration_s=a.duration_s,
                        log=lambda m: print(m, file=sys.stderr))
    except CarbonGymError as exc:
        print(f"generalise: error: {exc}", file=sys.stderr)
        return 2
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
