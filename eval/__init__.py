"""Evaluation layer of carbon_gym: the ``carbon-gym`` command-line tool, the evaluation of
policy x scenario x seed matrices with common random numbers, the study's experiments, plots,
TensorBoard logging and benchmarks.

=================  ===========================================================================
module             job
=================  ===========================================================================
``runner``         :class:`RunSpec`, episode starts, :func:`run_one` (one episode, recorded)
``backends``       :func:`run_matrix`: in process, local process pool or Ray
``stats``          95% t-intervals, percentiles, paired differences
``tables``         runs / summary tables, Markdown, the fault report tables
``writers``        csv / parquet records, TensorBoard, config.json, the output directory
``experiments``    ``carbon-gym eval`` driver, experiments a-f, shared figures
``clairvoyant``    the clairvoyant heuristic (policy ``clairvoyant``; the true bound is ``bound``)
``report``         RESULTS.md
``cli``            the ``carbon-gym`` command
=================  ===========================================================================

Importing :mod:`eval` is cheap; heavy dependencies (pandas, matplotlib, solvers, torch,
tensorboard, ray) are imported by the submodules that need them, when they need them.
"""

from __future__ import annotations

__all__ = ["cli", "runner", "backends", "stats", "tables", "writers", "experiments", "clairvoyant", "report",
           "plots", "tb"]
