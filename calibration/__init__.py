"""Calibration of carbon_gym's physics models: fit, derive, validate.

* :mod:`calibration.profile_fit` — latency parameters from kernel profiles (``calibrate fit``);
* :mod:`calibration.derive` — other models / TP degrees from their shapes (``calibrate derive``);
* :mod:`calibration.power_fit` — power parameters from GPU power logs (``calibrate power``);
* :mod:`calibration.serving_fit` — end-to-end overhead correction from vLLM benchmarks
  (``calibrate serving``);
* :mod:`calibration.profiler` — the GPU profiling script (``calibrate profile``);
* :mod:`calibration.report` — the validation protocol (``calibrate report``);
* :mod:`calibration.io` — readers / writers of every input and output format.

Entry point: :func:`calibration.cli.main` (``python -m calibration`` or ``carbon-gym calibrate``).
See ``calibration/README.md``.
"""
