"""Evaluation layer of carbon_gym: the ``carbon-gym`` command-line tool, the evaluation harness
(policy x scenario x seed matrices with common random numbers), the study's experiments, plots,
TensorBoard logging and benchmarks.

Importing :mod:`eval` is cheap; heavy dependencies (pandas, matplotlib, solvers, torch,
tensorboard, ray) are imported by the submodules that need them, when they need them.
"""

from __future__ import annotations

__all__ = ["cli", "harness", "experiments", "plots", "tb"]
