"""Fit :class:`~carbon_gym.physics.power.PhasePowerModel` parameters from GPU power measurements.

Inputs (see :mod:`calibration.io`): either power samples at known batch states
(``phase,prefill_tokens,n_decode,power_w``), or a power log (nvidia-smi / NVML) plus the
intervals during which the GPU ran each steady state (what ``calibrate profile`` writes).

Fit, per GPU (the model's form is in :mod:`carbon_gym.physics.power`):

* ``idle_w``: mean of the idle samples (no prefill, no decode).
* decode curve ``P(n) = max - (max - min) exp(-(n - 1) / sat)``: for each ``sat`` the curve is
  linear in (min, max), solved by least squares; ``sat`` by a log-grid search refined by golden
  section. With fewer than three distinct batch sizes the prior's ``sat`` is kept.
* prefill ``P = P(n) + (prefill_w - P(n)) min(1, tokens / prefill_sat)``: linear in ``prefill_w``
  for each ``prefill_sat``, searched the same way (prior kept with fewer than two distinct sizes).
* ``host_w`` (non-GPU node power) is not visible in GPU logs: it is kept from the prior.

The energy error compares, for every interval (or, for plain samples, every state), the energy
the fitted model predicts with the measured one (trapezoidal integral of the power log).
"""

from __future__ import annotations

import math
from pathlib import Path
from dataclasses import dataclass, replace

import numpy as np

from carbon_gym.errors import ConfigError
from carbon_gym.physics.power import PhasePowerModel

from .io import PowerLog, PowerStates
from .profile_fit import sig

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def _min_1d(f, lo: float, hi: float, n_grid: int = 40, iters: int = 60) -> float:
    """Minimise ``f`` over [lo, hi] (log grid then golden section around the best point)."""
    grid = np.geomspace(lo, hi, n_grid)
    vals = [f(x) for x in grid]
    i = int(np.argmin(vals))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, n_grid - 1)]
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    best = min([(fc, c), (fd, d), (vals[i], grid[i])])
    return float(best[1])


def states_from_log(log: PowerLog, intervals: PowerStates, trim_s: float = 0.5, gpu: int | None = None) -> PowerStates:
    """Mean power of each interval's samples, leaving out ``trim_s`` (at most 25%) at both ends.

    Power meters average over a window and the GPU takes a moment to settle, so the edges of an
    interval are not representative of its steady state.
    """
    if intervals.start_s is None or intervals.end_s is None:
        raise ConfigError("intervals", "need start_s and end_s")
    if gpu is not None:
        log = log.for_gpu(gpu)
    elif np.unique(log.gpu).size > 1:
        raise ConfigError("gpu", "the power log holds several GPUs; choose one", allowed=sorted(set(log.gpu.tolist())))
    power = np.full(len(intervals.phase), np.nan)
    for i, (a, b) in enumerate(zip(intervals.start_s, intervals.end_s)):
        trim = min(trim_s, 0.25 * (b - a))
        m = (log.time_s >= a + trim) & (log.time_s <= b - trim)
        if not np.any(m):
            raise ConfigError("intervals", f"interval {i} ({intervals.phase[i]}, {a:.3f}-{b:.3f} s) has no power samples")
        power[i] = float(np.mean(log.power_w[m]))
    return replace(intervals, power_w=power)


def interval_energy_j(log: PowerLog, start_s: float, end_s: float) -> float:
    """Measured energy over [start_s, end_s]: trapezoidal integral of the (linearly interpolated) log."""
    t, p = log.time_s, log.power_w
    inside = (t > start_s) & (t < end_s)
    tt = np.concatenate([[start_s], t[inside], [end_s]])
    pp = np.concatenate([[np.interp(start_s, t, p)], p[inside], [np.interp(end_s, t, p)]])
    return float(np.sum(0.5 * (pp[1:] + pp[:-1]) * np.diff(tt)))


@dataclass
class PowerFit:
    """Fitted power model and its errors.

    Attributes:
        model: the fitted :class:`PhasePowerModel`.
        states: the states it was fitted on (mean measured watts per state).
        predicted_w: model watts per state.
        energy_rows: (phase, prefill_tokens, n_decode, measured_j, model_j) per interval or state.
    """

    model: PhasePowerModel
    states: PowerStates
    predicted_w: np.ndarray
    energy_rows: list[tuple[str, int, int, float, float]]

    @property
    def power_mape_pct(self) -> float:
        """MAPE of the model's watts against the measured mean watts per state."""
        m = self.states.power_w
        return float(np.mean(np.abs(self.predicted_w - m) / m) * 100.0)

    @property
    def energy_error_pct(self) -> float:
        """Error of the total energy, percent (signed)."""
        meas = sum(r[3] for r in self.energy_rows)
        pred = sum(r[4] for r in self.energy_rows)
        return (pred - meas) / meas * 100.0

    @property
    def energy_mape_pct(self) -> float:
        """Mean absolute percentage error of the energy per interval / state."""
        return float(np.mean([abs(r[4] - r[3]) / r[3] * 100.0 for r in self.energy_rows]))

    def report_lines(self) -> list[str]:
        """Per-state table and the energy error."""
        m = self.model
        lines = [f"power fit {m.name}: idle_w={m.idle_w} prefill_w={m.prefill_w} decode_min_w={m.decode_min_w} "
                 f"decode_max_w={m.decode_max_w} decode_sat_seqs={m.decode_sat_seqs} "
                 f"prefill_sat_tokens={m.prefill_sat_tokens} host_w={m.host_w} (host_w kept from the prior)",
                 f"  {'phase':<10s}{'prefill':>8s}{'decode':>7s}{'measured_W':>12s}{'model_W':>9s}{'err_%':>8s}"]
        s = self.states
        for ph, pt, nd, meas, pred in zip(s.phase, s.prefill_tokens, s.n_decode, s.power_w, self.predicted_w):
            lines.append(f"  {ph:<10s}{int(pt):>8d}{int(nd):>7d}{meas:>12.1f}{pred:>9.1f}{(pred - meas) / meas * 100:>8.2f}")
        lines.append(f"power MAPE per state {self.power_mape_pct:.2f}%; energy error total {self.energy_error_pct:+.2f}%, "
                     f"per interval MAPE {self.energy_mape_pct:.2f}%")
        return lines


def _decode_fit(n: np.ndarray, p: np.ndarray, sat: float) -> tuple[float, float, float]:
    e = np.exp(-(n - 1.0) / sat)
    A = np.column_stack([e, 1.0 - e])  # P = min * e + max * (1 - e)
    (pmin, pmax), *_ = np.linalg.lstsq(A, p, rcond=None)
    return float(pmin), float(pmax), float(np.sum((A @ np.array([pmin, pmax]) - p) ** 2))


def fit_power(states: PowerStates, prior: PhasePowerModel, name: str | None = None) -> PowerFit:
    """Fit the power model to measured states (see the module docstring); ``prior`` fills what the data cannot."""
    pt, nd, pw = states.prefill_tokens.astype(float), states.n_decode.astype(float), states.power_w.astype(float)
    if np.any(~np.isfinite(pw)):
        raise ConfigError("power_w", "every state needs a measured power (join intervals with a log first)")
    idle = (pt == 0) & (nd == 0)
    dec = (pt == 0) & (nd > 0)
    pre = pt > 0
    idle_w = float(np.mean(pw[idle])) if np.any(idle) else prior.idle_w

    sat = prior.decode_sat_seqs
    pmin, pmax = prior.decode_min_w, prior.decode_max_w
    if np.unique(nd[dec]).size >= 3:
        sat = _min_1d(lambda s: _decode_fit(nd[dec], pw[dec], s)[2], 0.25, 4096.0)
        pmin, pmax, _ = _decode_fit(nd[dec], pw[dec], sat)
    elif np.any(dec):  # too few batch sizes for the shape: keep the prior's shape, fit its level
        base = np.array([prior.decode_power_w(int(x)) for x in nd[dec]])
        k = float(np.sum(pw[dec] * base) / np.sum(base * base))
        pmin, pmax = prior.decode_min_w * k, prior.decode_max_w * k
    pmax = max(pmax, pmin)
    decode_model = replace(prior, decode_min_w=max(pmin, 0.0), decode_max_w=max(pmax, 0.0), decode_sat_seqs=sat)

    prefill_w, psat = prior.prefill_w, prior.prefill_sat_tokens
    if np.any(pre):
        base = np.array([decode_model.decode_power_w(int(x)) for x in nd[pre]])

        def solve(s: float) -> tuple[float, float]:
            f = np.minimum(1.0, pt[pre] / s)
            w = float(np.sum(f * (pw[pre] - base * (1.0 - f))) / np.sum(f * f))
            return w, float(np.sum((base + (w - base) * f - pw[pre]) ** 2))

        if np.unique(pt[pre]).size >= 2:
            psat = _min_1d(lambda s: solve(s)[1], 1.0, 65536.0)
        prefill_w = solve(psat)[0]
    model = PhasePowerModel(
        name=name or prior.name, idle_w=sig(idle_w), prefill_w=sig(max(prefill_w, 0.0)),
        decode_min_w=sig(decode_model.decode_min_w), decode_max_w=sig(decode_model.decode_max_w),
        decode_sat_seqs=sig(sat), prefill_sat_tokens=sig(psat), host_w=prior.host_w,
        source=f"fitted by calibration/power_fit.py from {states.source}; host_w from the prior ({prior.name})",
    )
    pred = np.array([model.gpu_power_w(int(a), int(b)) for a, b in zip(pt, nd)])
    return PowerFit(model, states, pred, [])


def energy_rows_from_log(model: PhasePowerModel, log: PowerLog, intervals: PowerStates) -> list[tuple[str, int, int, float, float]]:
    """(phase, prefill, decode, measured J, model J) of every interval."""
    rows = []
    for ph, pt, nd, a, b in zip(intervals.phase, intervals.prefill_tokens, intervals.n_decode, intervals.start_s,
                                intervals.end_s):
        rows.append((ph, int(pt), int(nd), interval_energy_j(log, a, b), model.gpu_power_w(int(pt), int(nd)) * (b - a)))
    return rows


def fit_power_from_log(log: PowerLog, intervals: PowerStates, prior: PhasePowerModel, trim_s: float = 0.5,
                       gpu: int | None = None, name: str | None = None) -> PowerFit:
    """Join a power log with its intervals, fit, and compute the energy error per interval."""
    if gpu is not None:
        log = log.for_gpu(gpu)
    states = states_from_log(log, intervals, trim_s)
    fit = fit_power(states, prior, name)
    fit.energy_rows = energy_rows_from_log(fit.model, log, intervals)
    return fit


def aggregate_states(states: PowerStates) -> tuple[PowerStates, np.ndarray]:
    """Mean power per distinct (phase, prefill_tokens, n_decode) state, and the samples in each."""
    keys: dict[tuple[str, float, float], list[float]] = {}
    for ph, pt, nd, pw in zip(states.phase, states.prefill_tokens, states.n_decode, states.power_w):
        keys.setdefault((ph, float(pt), float(nd)), []).append(float(pw))
    ks = list(keys)
    return (PowerStates(states.source, tuple(k[0] for k in ks), np.array([k[1] for k in ks]),
                        np.array([k[2] for k in ks]), np.array([np.mean(keys[k]) for k in ks])),
            np.array([len(keys[k]) for k in ks], dtype=np.float64))


def fit_power_from_samples(states: PowerStates, prior: PhasePowerModel, name: str | None = None) -> PowerFit:
    """Fit from samples, averaged per state; each sample counts as one equal time slice for the energy error."""
    mean_states, counts = aggregate_states(states)
    fit = fit_power(mean_states, prior, name)
    fit.energy_rows = [(ph, int(pt), int(nd), float(m * c), float(p * c)) for ph, pt, nd, m, p, c in
                       zip(mean_states.phase, mean_states.prefill_tokens, mean_states.n_decode, mean_states.power_w,
                           fit.predicted_w, counts)]
    return fit


def power_tables(model: PhasePowerModel) -> dict[str, dict]:
    """TOML ``[power]`` table of a model (for :func:`calibration.io.dump_params_toml`)."""
    return {"power": {"name": model.name, "idle_w": model.idle_w, "prefill_w": model.prefill_w,
                      "decode_min_w": model.decode_min_w, "decode_max_w": model.decode_max_w,
                      "decode_sat_seqs": model.decode_sat_seqs, "prefill_sat_tokens": model.prefill_sat_tokens,
                      "host_w": model.host_w, "source": model.source}}


# --------------------------------------------------------------------------- published serving points

SHIPPED_SERVING_POWER = Path(__file__).resolve().parent / "measurements" / "serving_power.csv"
# GPU whose published serving points fit each shipped power file, and where the fitted curve is
# transferred to a GPU without its own measurement (same die and TDP; see measurements/README.md).
POWER_SOURCES = {"a100-40gb": "a100-40gb", "a100-80gb": "a100-40gb", "h100-80gb": "h100-80gb", "h200": "h100-80gb"}


@dataclass(frozen=True)
class ServingPoint:
    """One published serving measurement: mean running batch and average GPU power (per GPU)."""

    source: str
    gpu: str
    engine: str
    label: str
    mean_batch: float
    avg_gpu_power_w: float
    median_itl_s: float


def load_serving_points(path: str | Path = SHIPPED_SERVING_POWER) -> list[ServingPoint]:
    """Rows of ``serving_power.csv``; mean batch by Little's law and power = energy x rate where not given."""
    import csv

    p = Path(path)
    if not p.exists():
        raise ConfigError("serving_power", f"file not found: {p}")
    out = []
    with open(p, newline="") as f:
        for i, r in enumerate(csv.DictReader(line for line in f if not line.startswith("#"))):
            def num(k: str, r: dict = r) -> float:
                v = (r.get(k) or "").strip()
                return float(v) if v else float("nan")
            batch, power = num("mean_batch"), num("avg_gpu_power_w")
            if math.isnan(batch):
                batch = num("requests_per_s") * num("latency_s")
            if math.isnan(power):
                power = num("energy_per_request_j") * num("requests_per_s")
            if not (batch > 0 and power > 0):
                raise ConfigError("serving_power", f"{p.name} row {i + 1}: need mean_batch and power (or what gives them)")
            label = f"rate {r['request_rate']}" if r["request_rate"] != "inf" else f"max_num_seqs {r['max_num_seqs']}"
            out.append(ServingPoint(r["source"], r["gpu"], r["engine"], label, batch, power, num("median_itl_ms") * 1e-3))
    return out


def fit_serving_power(points: list[ServingPoint], gpu: str, prior: PhasePowerModel, name: str | None = None) -> PowerFit:
    """Fit the decode curve ``P(n)`` of ``gpu`` to its serving points' (mean batch, average power).

    The published figures are averages over whole serving runs, prefill included; for chat
    traffic prefill is a few percent of the busy time, so the fitted curve is the *serving* power
    at a running batch of ``n``. ``prefill_w`` is not resolved by these figures: it is set to the
    fitted ``decode_max_w`` (so a prefill chunk never draws less than a saturated decode) - a
    chosen value, range ``decode_max_w``..TDP. ``idle_w`` and ``host_w`` are kept from ``prior``.
    """
    pts = [p for p in points if p.gpu == gpu]
    if len(pts) < 3:
        raise ConfigError("gpu", f"fewer than 3 serving points for {gpu!r}",
                          allowed=sorted({p.gpu for p in points}))
    states = PowerStates(f"serving points ({pts[0].source}, {pts[0].engine})", tuple("decode" for _ in pts),
                         np.zeros(len(pts), dtype=np.int64),
                         np.array([max(1, int(round(p.mean_batch))) for p in pts], dtype=np.int64),
                         np.array([p.avg_gpu_power_w for p in pts]))
    fit = fit_power(states, prior, name)
    m = fit.model
    model = replace(m, prefill_w=m.decode_max_w,
                    source=f"decode curve fitted by calibration/power_fit.py (fit_serving_power) to {len(pts)} published "
                           f"serving points of {gpu} ({pts[0].source}, {pts[0].engine}; calibration/measurements/); "
                           f"prefill_w = decode_max_w (chosen, not resolved by the data); idle_w and host_w from the prior")
    pred = np.array([model.gpu_power_w(0, int(n)) for n in states.n_decode])
    return PowerFit(model, states, pred, [("decode", 0, int(n), float(w), float(q)) for n, w, q in
                                          zip(states.n_decode, states.power_w, pred)])
