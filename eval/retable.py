"""``python -m eval.retable DIR``: rewrite a finished matrix's tables from its ``runs.csv`` (and
``summary.csv``), no run repeated; for a table whose code changed after the run (experiments
tradeoff and milp-vs-ilp; headline: its bounds, ``bounds.csv``, ``bound_summary.csv`` and
``headline.md``, recomputed, e.g. after a change to the SLO-true bound). The experiment is read from the matrix's ``config.json``; the output
is what a run with the current code writes (tests check it byte for byte)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

__all__ = ["RETABLE", "retable", "main"]

#: The experiments whose tables can be rewritten from their files.
RETABLE = ("tradeoff", "milp-vs-ilp", "headline")


def retable(directory: str) -> list[str]:
    """Rewrite the tables of the matrix in ``directory``; returns the files written.
    :class:`~carbon_gym.errors.ConfigError` (field ``dir``) names what is missing or not supported."""
    import pandas as pd

    from carbon_gym.errors import ConfigError

    conf = os.path.join(directory, "config.json")
    runs_csv = os.path.join(directory, "runs.csv")
    for f in (conf, runs_csv):
        if not os.path.isfile(f):
            raise ConfigError("dir", f"{f!r} not found (a finished matrix of carbon-gym experiment {'|'.join(RETABLE)})")
    with open(conf, encoding="utf-8") as fh:
        exp = json.load(fh).get("experiment")
    runs = pd.read_csv(runs_csv)
    if exp == "tradeoff":
        from eval.frontiers import tradeoff_tables

        summary_csv = os.path.join(directory, "summary.csv")
        if not os.path.isfile(summary_csv):
            raise ConfigError("dir", f"{summary_csv!r} not found")
        tradeoff_tables(runs, pd.read_csv(summary_csv), directory)
        return [os.path.join(directory, n) for n in ("tradeoff.md", "tradeoff.csv", "equal_violation.csv")]
    if exp == "milp-vs-ilp":
        from eval.milp_vs_ilp import milp_vs_ilp_tables

        milp_vs_ilp_tables(runs, directory)
        return [os.path.join(directory, n) for n in ("milp-vs-ilp.md", "milp-vs-ilp.csv")]
    if exp == "headline":
        return _headline(directory, runs)
    raise ConfigError("dir", f"experiment {exp!r} of {conf!r}: its tables are not rewritten from files (allowed: {', '.join(RETABLE)})")


def _headline(directory: str, runs: object) -> list[str]:
    """The headline experiment's bound files and table (:func:`eval.experiments.headline_files`)."""
    import pandas as pd

    from carbon_gym.errors import ConfigError
    from eval.bound import matrix_specs
    from eval.experiments import headline_files

    summary_csv = os.path.join(directory, "summary.csv")
    if not os.path.isfile(summary_csv):
        raise ConfigError("dir", f"{summary_csv!r} not found")
    return headline_files(directory, list(matrix_specs(directory).values()), runs, pd.read_csv(summary_csv))[1]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.retable", description=__doc__)
    ap.add_argument("dir", help="a finished matrix, e.g. results/tradeoff or results/milp-vs-ilp")
    a = ap.parse_args(argv)
    from carbon_gym.errors import ConfigError

    try:
        written = retable(a.dir)
    except ConfigError as exc:
        print(f"python -m eval.retable: error: {exc}", file=sys.stderr)
        return 2
    for f in written:
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
