"""What a scheduler believed about each request it placed: TTFT and TPOT estimates, for checking
against what the simulator then produced (issue 40: "estimates that hold").

Every :class:`solvers.base.Scheduler` keeps an :class:`EstimateLog`: at each decision, for every
request it placed (not deferred), the TTFT and TPOT the shared placement model predicts at the
chosen datacenter *given the whole step's assignment* (:func:`placed_estimates`). It is the model
the facility MILP plans with (``solvers/facility.py``'s ``h_rd`` and TPOT rows), evaluated on the
decision actually taken, so its error is the error of the MILP's constraints:

    TTFT_r = waited_r + net_rd + W0_d + f_d + prefill_rd + beta_d x (prefill tokens placed at d
             this step by requests older than r)           (requests are sent oldest first)
    TPOT_r = tpot_base_d + slope_d x (max(1, (running_d + queue_len_d + K_d) / E_d) - 1)

(seconds; ``beta_d = prefill_s_per_token_d / E_d``, ``K_d`` requests placed at d this step, ``E_d``
the serving engines). A request placed twice (re-queued after an outage) keeps its last estimate.
The evaluation (:mod:`eval.estimate_error`) joins the log with the simulator's request records on
(arrival time, origin) and reports the error distribution.
"""

from __future__ import annotations

import numpy as np

from .problem import PlacementProblem

__all__ = ["EstimateLog", "placed_estimates", "ESTIMATE_COLUMNS"]

#: Columns of :meth:`EstimateLog.to_dict` (seconds unless noted).
ESTIMATE_COLUMNS = ("arrival_s", "origin", "datacenter", "decided_s", "ttft_estimate_s", "tpot_estimate_s")


def placed_estimates(problem: PlacementProblem, assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R,) TTFT and (R,) TPOT estimates in seconds of each request at its assigned datacenter
    (NaN where deferred), from the shared placement model (see the module docstring)."""
    a = np.asarray(assignment, dtype=np.int64)
    r_n, d_n = problem.n_requests, problem.n_datacenters
    ttft = np.full(r_n, np.nan)
    tpot = np.full(r_n, np.nan)
    placed = np.flatnonzero((a >= 0) & (a < d_n))
    if placed.size == 0:
        return ttft, tpot
    d = a[placed]
    e = np.maximum(problem.n_engines.astype(np.float64), 1.0)
    if problem.cached_prompt_tokens is None:
        tok = problem.prompt_tokens[placed]
    else:
        tok = problem.prompt_tokens[placed] - problem.cached_prompt_tokens[placed, d]
    beta = problem.prefill_s_per_token / e
    # requests are sent oldest first (slot order): r waits behind the older ones placed at d
    order = placed[np.argsort(problem.slot[placed], kind="stable")]
    pos = np.empty(r_n, dtype=np.int64)
    pos[order] = np.arange(order.size)
    rank = pos[placed]
    onehot = np.zeros((order.size, d_n))
    onehot[rank, d] = tok
    before = np.cumsum(onehot, axis=0)[rank, d] - tok
    ttft[placed] = (problem.waited_s[placed] + problem.network_s[placed, d] + problem.est_queue_wait_s[d]
                    + problem.prefill_fixed_s[d] + tok * problem.prefill_s_per_token[d] + beta[d] * before)
    k = np.bincount(d, minlength=d_n).astype(np.float64)
    n_after = np.maximum((problem.running + problem.queue_len + k) / e, 1.0)
    tpot_d = problem.tpot_base_s + problem.tpot_slope_s_per_seq * (n_after - 1.0)
    tpot[placed] = tpot_d[d]
    return ttft, tpot


class EstimateLog:
    """Per-request estimates of one episode, appended at each decision (see the module docstring)."""

    def __init__(self, track_open: bool = False) -> None:
        self._parts: list[tuple[np.ndarray, ...]] = []
        #: with ``track_open``: (arrival_s, origin) -> TTFT estimate (s) of placed requests not yet
        #: seen completing (:meth:`observe`)
        self.track_open = bool(track_open)
        self._open: dict[tuple[float, int], float] = {}

    def clear(self) -> None:
        """Forget the episode's estimates."""
        self._parts = []
        self._open = {}

    def observe(self, arrival_s: np.ndarray, origin: np.ndarray, ttft_s: np.ndarray) -> np.ndarray:
        """TTFT residuals (realised - estimated, s) of completions (their arrival times, origins and
        realised TTFTs), each request's open estimate consumed (so a completion counts once);
        completions without one (placed by another policy, or already seen) are skipped."""
        pop = self._open.pop
        est = np.array([pop(k, np.nan) for k in zip(np.asarray(arrival_s, dtype=np.float64).tolist(),
                                                      np.asarray(origin, dtype=np.int64).tolist())], dtype=np.float64)
        res = np.asarray(ttft_s, dtype=np.float64) - est if est.size else np.zeros(0)
        return res[np.isfinite(res)]

    def record(self, problem: PlacementProblem, assignment: np.ndarray, arrival_s: np.ndarray, origin: np.ndarray) -> None:
        """Log the placed requests of one decision. ``arrival_s`` and ``origin`` are (R,) in the
        problem's request order (the pending requests' arrival times in seconds and origins)."""
        if problem.n_requests == 0:
            return
        ttft, tpot = placed_estimates(problem, assignment)
        keep = np.isfinite(ttft)
        if not keep.any():
            return
        a = np.asarray(assignment, dtype=np.int64)[keep]
        if self.track_open:
            keys = zip(np.asarray(arrival_s, dtype=np.float64)[keep].tolist(), np.asarray(origin, dtype=np.int64)[keep].tolist())
            self._open.update(zip(keys, ttft[keep].tolist()))
        self._parts.append((np.asarray(arrival_s, dtype=np.float64)[keep], np.asarray(origin, dtype=np.int64)[keep],
                            a, np.full(int(keep.sum()), float(problem.time_s)), ttft[keep], tpot[keep]))

    def __len__(self) -> int:
        return sum(p[0].size for p in self._parts)

    def to_dict(self) -> dict[str, np.ndarray]:
        """The log as columns (:data:`ESTIMATE_COLUMNS`), in decision order."""
        if not self._parts:
            return {c: np.zeros(0, dtype=np.int64 if c in ("origin", "datacenter") else np.float64) for c in ESTIMATE_COLUMNS}
        return {c: np.concatenate([p[i] for p in self._parts]) for i, c in enumerate(ESTIMATE_COLUMNS)}
