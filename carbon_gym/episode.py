"""The env's episode tally: request counts, SLO violations, latency percentiles, per-datacenter
sums, and the end-of-episode metrics and ledger built from them (:class:`EpisodeTally`)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from .ledger import check_ledger

if TYPE_CHECKING:  # pragma: no cover
    from .sim import Simulator
    from .sim.records import AbortedRequests, RecordWriter, RequestRecords

__all__ = ["LEFT_METRICS", "EpisodeTally", "unfinished_requests"]

# counters and per-datacenter arrays a measurement window reports from its baseline
_WINDOW_COUNTS = ("arrived", "placed", "aborted", "completed", "violations", "ttft_violations", "tpot_violations",
                  "deferred", "invalid_actions", "failed_over_completed", "blocked", "context_truncated",
                  "context_truncated_tokens")
_WINDOW_ARRAYS = ("dc_placed", "dc_completed")

_SUM, _MAX = np.add.reduce, np.maximum.reduce  # the ufunc reductions behind ndarray.sum/max

#: The window metrics of the work left at a measurement window's end (:meth:`EpisodeTally.window_left`).
LEFT_METRICS = ("left_requests", "left_prompt_tokens", "left_prompt_positions", "left_decode_tokens", "left_decode_ctx",
                "left_samples")


class EpisodeTally:
    """Counters of one episode (units: requests, seconds, joules, grams CO2eq).

    Args:
        n_datacenters: D.
        ttft_target_s, tpot_target_s: SLO targets; a completed request violates its SLO when its
            TTFT or its TPOT exceeds its target.
        writer: a :class:`~carbon_gym.sim.records.RecordWriter` streaming completed records to
            disk (latency percentiles then come from the files), or None (kept in memory).
    """

    def __init__(self, n_datacenters: int, ttft_target_s: float, tpot_target_s: float, writer: RecordWriter | None = None) -> None:
        D = n_datacenters
        self.D = D
        self.ttft_target_s = ttft_target_s
        self.tpot_target_s = tpot_target_s
        self.writer = writer
        self.arrived = 0
        self.placed = 0
        self.aborted = 0
        self.completed = 0
        self.violations = 0
        self.ttft_violations = 0
        self.tpot_violations = 0
        self.deferred = 0
        self.blocked = 0  # request-steps: pending requests with no allowed datacenter, per decision
        self.invalid_actions = 0
        self.context_truncated = 0  # arrivals cut to the context window (carbon_gym.workload.fit_context)
        self.context_truncated_tokens = 0
        self.max_output_placed = 0
        self.failed_over_completed = 0
        self._failover_ids: set[int] = set()
        self._ttft_parts: list[np.ndarray] = []
        self._tpot_parts: list[np.ndarray] = []
        self._ttft_sum = 0.0
        self._tpot_sum = 0.0
        self.dc_placed = np.zeros(D, dtype=np.int64)
        self.dc_completed = np.zeros(D, dtype=np.int64)
        self.done_energy_j = np.zeros(D)
        self.done_carbon_g = np.zeros(D)
        self.fo_energy_j = np.zeros(D)
        self.fo_carbon_g = np.zeros(D)
        self.reported_energy_j = 0.0
        self.reported_carbon_g = 0.0
        self.window: dict[str, Any] | None = None  # the measurement window's baseline (start_window)

    @property
    def in_flight(self) -> int:
        """Placed requests neither completed nor aborted."""
        return self.placed - self.completed - self.aborted

    def add_context_truncated(self, dropped_tokens: np.ndarray | None) -> None:
        """Count arrivals whose context was truncated (``dropped_tokens`` > 0 per request)."""
        if dropped_tokens is not None and dropped_tokens.size:
            self.context_truncated += int(np.count_nonzero(dropped_tokens))
            self.context_truncated_tokens += int(dropped_tokens.sum())

    def add_placed(self, ids: np.ndarray, failed_over: np.ndarray, datacenters: np.ndarray, output_tokens: np.ndarray) -> None:
        """``ids`` (simulator request ids) were submitted to ``datacenters``; ``failed_over``
        marks re-submissions of failed-over requests (tracked until they complete)."""
        if self.aborted:
            fo = failed_over > 0
            if fo.any():
                self._failover_ids.update(ids[fo].tolist())
        self.placed += int(ids.shape[0])
        self.dc_placed += np.bincount(datacenters, minlength=self.D)
        mo = int(_MAX(output_tokens))
        if mo > self.max_output_placed:
            self.max_output_placed = mo

    def add_aborted(self, ab: AbortedRequests) -> None:
        """Requests an outage aborted (``AbortedRequests``): their shares are wasted work."""
        n = len(ab)
        self.aborted += n
        self.fo_energy_j += np.bincount(ab.datacenter, weights=ab.energy_j, minlength=self.D)
        self.fo_carbon_g += np.bincount(ab.datacenter, weights=ab.carbon_g, minlength=self.D)
        lost = set(ab.request_id.tolist()) & self._failover_ids
        if lost:  # failed over again: the new submission is the one that counts
            self._failover_ids.difference_update(lost)

    def add_reported(self, carbon_g: float, energy_j: float) -> None:
        """Carbon (g) and facility energy (J) reported in one step's info (or the reset's)."""
        self.reported_carbon_g += carbon_g
        self.reported_energy_j += energy_j

    def add_completed(self, records: RequestRecords) -> tuple[int, tuple[float, float, float, float]]:
        """Tally one step's completed ``RequestRecords``; return (violations, (TTFT mean, TPOT
        mean, TTFT max, TPOT max)) of those records (zeros when there are none)."""
        n = len(records)
        if not n:
            return 0, (0.0, 0.0, 0.0, 0.0)
        D = self.D
        ttft = records.ttft_s
        tpot = records.tpot_s
        v_ttft = ttft > self.ttft_target_s
        v_tpot = tpot > self.tpot_target_s
        violations = int(np.count_nonzero(v_ttft | v_tpot))
        self.ttft_violations += int(np.count_nonzero(v_ttft))
        self.tpot_violations += int(np.count_nonzero(v_tpot))
        self.violations += violations
        self.completed += n
        self.dc_completed += np.bincount(records.datacenter, minlength=D)
        self.done_energy_j += np.bincount(records.datacenter, weights=records.energy_j, minlength=D)
        self.done_carbon_g += np.bincount(records.datacenter, weights=records.carbon_g, minlength=D)
        if self.writer is not None:
            self._ttft_sum += float(_SUM(ttft))
            self._tpot_sum += float(_SUM(tpot))
        else:
            # copies: the record columns are views of one table holding every column
            self._ttft_parts.append(ttft.copy())
            self._tpot_parts.append(tpot.copy())
        if self._failover_ids:
            hit = [i for i in records.request_id.tolist() if i in self._failover_ids]
            if hit:
                self._failover_ids.difference_update(hit)
                self.failed_over_completed += len(hit)
        if self.writer is not None:  # last: a write failure (RecordWriteError) leaves the tally complete
            self.writer.append(records)
        # sum / n is what ndarray.mean computes (same floats)
        return violations, (float(_SUM(ttft)) / n, float(_SUM(tpot)) / n, float(_MAX(ttft)), float(_MAX(tpot)))

    def start_window(self, sim: Any, pending: int) -> None:
        """Open the measurement window now (``sim.now_s``): what the episode metrics report from
        here on is counted from this baseline (counts, sums, energy and carbon per datacenter,
        the completions so far and the backlog: placed-unfinished + pending requests)."""
        t = sim.totals()
        self.window = {
            "start_s": float(sim.now_s),
            "counts": {k: getattr(self, k) for k in _WINDOW_COUNTS},
            "dc": {k: getattr(self, k).copy() for k in _WINDOW_ARRAYS},
            "carbon_g": np.asarray(t.carbon_g, dtype=np.float64).copy(),
            "energy_j": np.asarray(t.facility_energy_j, dtype=np.float64).copy(),
            "it_energy_j": float(np.sum(t.it_energy_j)),
            "parts": len(self._ttft_parts), "rows": len(self.writer) if self.writer is not None else 0,
            "sums": (self._ttft_sum, self._tpot_sum),
            "backlog": self.in_flight + int(pending),
        }

    @staticmethod
    def window_left(sim: Any) -> dict[str, float]:
        """What the requests placed and unfinished have not computed yet, an upper count
        (:meth:`carbon_gym.sim.Simulator.work_left`), in the terms of the bound's per-request
        least engine-seconds (:mod:`eval.bound`, whose request of prompt p and output o has its
        prompt positions 1 ... p and decode iterations t = 0 ... o - 2 reading a context of
        p + t): ``left_requests``, ``left_prompt_tokens`` (positions), ``left_prompt_positions``
        (their sum: the last L of p sum to L p - L (L - 1) / 2), ``left_decode_tokens``
        (iterations), ``left_decode_ctx`` (the contexts of the last r of them:
        r (p + o - 1 - r) + r (r - 1) / 2), ``left_samples`` (output tokens still to sample)."""
        w = sim.work_left()
        p = w["prompt_tokens"].astype(np.float64)
        L = w["prompt_left"].astype(np.float64)
        r = w["decode_left"].astype(np.float64)
        d = np.maximum(w["output_tokens"].astype(np.float64) - 1.0, 0.0)
        return {"left_requests": float(p.size), "left_prompt_tokens": float(L.sum()),
                "left_prompt_positions": float((L * p - L * (L - 1.0) / 2.0).sum()), "left_decode_tokens": float(r.sum()),
                "left_decode_ctx": float((r * (p + d - r) + r * (r - 1.0) / 2.0).sum()),
                "left_samples": float((r + w["first_token_left"]).sum())}

    def latency_stats(self) -> tuple[list[float], list[float], float, float]:
        """(TTFT p50/p90/p99, TPOT p50/p90/p99, TTFT mean, TPOT mean) over completed requests
        (in the measurement window, once one is open), s."""
        w = self.window
        c = self.completed - (w["counts"]["completed"] if w else 0)
        if self.writer is not None:
            skip = int(w["rows"]) if w else 0
            tq = self.writer.percentiles("ttft_s", (50, 90, 99), skip)
            pq = self.writer.percentiles("tpot_s", (50, 90, 99), skip)
            s0 = w["sums"] if w else (0.0, 0.0)
            return tq, pq, ((self._ttft_sum - s0[0]) / c if c else float("nan")), ((self._tpot_sum - s0[1]) / c if c else float("nan"))
        first = int(w["parts"]) if w else 0
        ttft = np.concatenate(self._ttft_parts[first:]) if self._ttft_parts[first:] else np.zeros(0)
        tpot = np.concatenate(self._tpot_parts[first:]) if self._tpot_parts[first:] else np.zeros(0)
        # (one call per array: the same values as one call per percentile)
        tq = np.percentile(ttft, (50, 90, 99)).tolist() if ttft.size else [float("nan")] * 3
        pq = np.percentile(tpot, (50, 90, 99)).tolist() if tpot.size else [float("nan")] * 3
        return tq, pq, (float(ttft.mean()) if c else float("nan")), (float(tpot.mean()) if c else float("nan"))

    def ledger(self, sim: Simulator, unplaced: int, pue: np.ndarray, strict: bool = False) -> dict[str, Any]:
        """:func:`carbon_gym.ledger.check_ledger` of the episode so far."""
        return check_ledger(
            arrived=self.arrived, placed=self.placed, completed=self.completed, failed_over=self.aborted,
            failed_over_completed=self.failed_over_completed, in_flight=self.in_flight, unplaced=unplaced,
            totals=sim.totals(), attribution=sim.energy_attribution(),
            completed_energy_j=self.done_energy_j, completed_carbon_g=self.done_carbon_g,
            failed_over_energy_j=self.fo_energy_j, failed_over_carbon_g=self.fo_carbon_g,
            reported_energy_j=self.reported_energy_j, reported_carbon_g=self.reported_carbon_g,
            pue=pue, strict=strict,
        )

    def metrics(self, sim: Simulator, *, unplaced: int, blocked: int = 0, steps: int, drain_s: float, world_seed: int | None, pue: np.ndarray,
                check_ledger: bool, strict: bool) -> dict[str, Any]:
        """The episode metrics (see :meth:`GeoServeEnv.episode_metrics` for the keys)."""
        totals = sim.totals()
        ledger = self.ledger(sim, unplaced, pue, strict=check_ledger and strict)
        if check_ledger and not ledger["ok"]:
            warnings.warn(f"episode ledger check failed: {ledger['problems']}", RuntimeWarning, stacklevel=3)
        w = self.window
        if w is not None:
            return self._window_metrics(sim, totals, ledger, unplaced=unplaced, blocked=blocked, steps=steps,
                                        world_seed=world_seed)
        c = self.completed
        dc_carbon = np.asarray(totals.carbon_g, dtype=np.float64).copy()
        dc_energy = np.asarray(totals.facility_energy_j, dtype=np.float64) / 3.6e6
        return {
            "steps": steps,
            "sim_time_s": float(sim.now_s),
            "drain_s": drain_s,
            "arrived": self.arrived,
            "placed": self.placed,
            "completed": c,
            "in_flight_at_truncation": self.in_flight,
            "aborted": self.aborted,
            "failed_over": self.aborted,
            "failed_over_completed": self.failed_over_completed,
            "unplaced_at_end": unplaced,
            "deferred": self.deferred,
            "blocked": self.blocked,
            "blocked_at_end": int(blocked),
            "context_truncated": self.context_truncated,
            "context_truncated_tokens": self.context_truncated_tokens,
            "invalid_actions": self.invalid_actions,
            "carbon_g": float(dc_carbon.sum()),
            "energy_kwh": float(dc_energy.sum()),
            "it_energy_kwh": float(np.sum(totals.it_energy_j) / 3.6e6),
            "carbon_g_per_request": float(dc_carbon.sum() / c) if c else float("nan"),
            **_latency_metrics(c, self.latency_stats(), self.violations, self.ttft_violations, self.tpot_violations),
            "dc_carbon_g": dc_carbon,
            "dc_energy_kwh": dc_energy,
            "dc_placed": self.dc_placed.copy(),
            "dc_completed": self.dc_completed.copy(),
            "world_seed": world_seed,
            "ledger": ledger,
        }

    def _window_metrics(self, sim: Any, totals: Any, ledger: dict[str, Any], *, unplaced: int, blocked: int, steps: int,
                        world_seed: Any) -> dict[str, Any]:
        """The episode metrics of a measurement window (see :meth:`start_window`): every count,
        latency, energy and carbon from the window's start to now; the energy of work in flight
        at the end counted as far as its tokens were run in the window (the time integral of the
        engines' power), none of the drain's; ``unfinished_window`` = the growth of the backlog
        (placed-unfinished + pending) over the window, work the window took in and did not do.
        The ledger still covers the whole episode."""
        w = self.window
        assert w is not None
        n = {k: getattr(self, k) - w["counts"][k] for k in _WINDOW_COUNTS}
        c = n["completed"]
        dc_carbon = np.asarray(totals.carbon_g, dtype=np.float64) - w["carbon_g"]
        dc_energy = (np.asarray(totals.facility_energy_j, dtype=np.float64) - w["energy_j"]) / 3.6e6
        backlog = self.in_flight + int(unplaced)
        return {
            "steps": steps,
            "sim_time_s": float(sim.now_s),
            "drain_s": 0.0,
            "measure": "window",
            "window_start_s": w["start_s"],
            "window_s": float(sim.now_s) - w["start_s"],
            "arrived": n["arrived"],
            "placed": n["placed"],
            "completed": c,
            "in_flight_at_truncation": self.in_flight,
            "aborted": n["aborted"],
            "failed_over": n["aborted"],
            "failed_over_completed": n["failed_over_completed"],
            "unplaced_at_end": unplaced,
            "backlog_start": int(w["backlog"]),
            "backlog_end": backlog,
            "unfinished_window": max(0, backlog - int(w["backlog"])),
            **self.window_left(sim),
            "deferred": n["deferred"],
            "blocked": n["blocked"],
            "blocked_at_end": int(blocked),
            "context_truncated": n["context_truncated"],
            "context_truncated_tokens": n["context_truncated_tokens"],
            "invalid_actions": n["invalid_actions"],
            "carbon_g": float(dc_carbon.sum()),
            "energy_kwh": float(dc_energy.sum()),
            "it_energy_kwh": float((np.sum(totals.it_energy_j) - w["it_energy_j"]) / 3.6e6),
            "carbon_g_per_request": float(dc_carbon.sum() / c) if c else float("nan"),
            **_latency_metrics(c, self.latency_stats(), n["violations"], n["ttft_violations"], n["tpot_violations"]),
            "dc_carbon_g": dc_carbon,
            "dc_energy_kwh": dc_energy,
            "dc_placed": self.dc_placed - w["dc"]["dc_placed"],
            "dc_completed": self.dc_completed - w["dc"]["dc_completed"],
            "world_seed": world_seed,
            "ledger": ledger,
        }


def _latency_metrics(completed: int, stats: tuple[list[float], list[float], float, float], violations: int,
                     ttft_violations: int, tpot_violations: int) -> dict[str, Any]:
    """The latency and violation entries of the episode metrics: TTFT / TPOT mean, p50, p90, p99
    (s; ``stats`` from :meth:`EpisodeTally.latency_stats`) and the violation counts and rates over
    ``completed`` requests (NaN when none)."""
    tq, pq, ttft_mean, tpot_mean = stats
    c = completed
    nan = float("nan")
    return {
        "ttft_mean_s": ttft_mean, "ttft_p50_s": tq[0], "ttft_p90_s": tq[1], "ttft_p99_s": tq[2],
        "tpot_mean_s": tpot_mean, "tpot_p50_s": pq[0], "tpot_p90_s": pq[1], "tpot_p99_s": pq[2],
        "violations": violations,
        "violation_rate": violations / c if c else nan,
        "ttft_violation_rate": ttft_violations / c if c else nan,
        "tpot_violation_rate": tpot_violations / c if c else nan,
    }


def unfinished_requests(metrics: dict[str, Any]) -> int:
    """Requests an episode left unfinished, from its episode metrics: with a measurement window,
    the backlog's growth over it (``unfinished_window``: work the window took in and did not do);
    otherwise what the drain limit left in flight plus what was never placed."""
    if metrics.get("measure") == "window":
        return int(metrics["unfinished_window"])
    return int(metrics.get("in_flight_at_truncation", 0)) + int(metrics.get("unplaced_at_end", 0))
