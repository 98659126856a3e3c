"""Sessions and prefix caches as the env sees them: the per (pending request, datacenter) cached
prefix tokens of the typed state and the observation, the datacenter of each session's previous
turn, and the cache and session-move metrics of an episode.

:class:`SessionTracker` exists only in an env whose scenario has a prefix workload
(:func:`carbon_gym.sessions.is_prefix_workload`); every other env has none and pays nothing.

**Per decision** (:meth:`SessionTracker.observe`, once per observation): for the visible pending
requests, their prefix hashes, session ids and turns (from the pending store), the cached prefix
tokens at the best engine of each datacenter (``Simulator.cached_prefix_tokens_batch``: zeros
without ``engine.prefix_caching``) and the datacenter that served each session's previous turn
(``-1`` for none). The simulator does not move between the observation and the placement, so the
placement reads the same figures.

**Fail-over.** The tracker keeps the session and turn of each placed request of a session until it
completes (:meth:`SessionTracker.placed`, :meth:`SessionTracker.completed`); a request an outage
aborts gets them back (:meth:`SessionTracker.aborted`) and returns to the pending store with them
and with its prefix hashes (``AbortedRequests.prefix_hashes``), so it can hit a cache again. Placed
again, it counts as a turn of its session again (a move when it leaves the failed datacenter).

**Metric definitions** (:meth:`SessionTracker.metrics`; keys of ``episode_metrics`` of a prefix
workload, window-relative under ``env.measure = "window"``):

* ``prefix_prompt_tokens``, ``prefix_cached_tokens``: prompt tokens of the requests engines
  admitted, and of those the tokens their prefix cache served (the simulator's totals:
  ``SimTotals.prompt_tokens`` / ``cached_prompt_tokens``, first admissions);
  ``prefix_hit_rate`` = cached / prompt (NaN when none was admitted), overall and per datacenter
  (``dc_prefix_hit_rate``, (D,)); ``prefill_tokens_saved``: prompt tokens not prefilled thanks to
  the cache (re-admissions after a preemption included).
* ``session_turns``: placed requests of a session whose previous turn was placed before (the
  turns that could move); ``session_moves``: those placed at another datacenter than the previous
  turn; ``session_move_rate`` = moves / turns.
* ``move_reprefill_tokens``: the prompt tokens a move makes the new datacenter prefill again,
  summed over moves: ``max(0, cached(prev) - cached(new))`` at the decision, with ``cached(d)``
  the request's cached prefix tokens at the best engine of datacenter ``d`` (state field
  ``cached_prefix_tokens``): zero when the previous datacenter had lost the prefix anyway.
* ``move_reprefill_energy_j``: their facility energy from the prefill power model: ``tokens x
  est_prefill_s_per_token(new) x tp x (prefill_w - idle_w) x PUE(new)`` (the GPUs' power above
  idle while prefilling, the simulator's marginal prefill time per token at the decision);
  ``move_reprefill_carbon_g``: the same x the new datacenter's grid intensity now / 3.6e6.
* ``move_ttft_cost_s``: the TTFT the moves added, estimated: ``tokens x
  est_prefill_s_per_token(new)`` summed over moves (``move_ttft_cost_s_mean``: per move).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .pending import PROMPT
from .sim.results import SNAPSHOT_ARRAY_ROWS

__all__ = ["SessionTracker", "SESSION_METRICS", "session_tracker"]

#: Counters of :class:`SessionTracker` (window-relative under a measurement window).
_COUNTERS = ("session_turns", "session_moves", "move_reprefill_tokens", "move_reprefill_energy_j",
             "move_reprefill_carbon_g", "move_ttft_cost_s")
#: Every key :meth:`SessionTracker.metrics` adds to the episode metrics.
SESSION_METRICS = ("prefix_prompt_tokens", "prefix_cached_tokens", "prefix_hit_rate", "prefill_tokens_saved",
                   "dc_prefix_hit_rate", "session_turns", "session_moves", "session_move_rate", "move_reprefill_tokens",
                   "move_reprefill_energy_j", "move_reprefill_carbon_g", "move_ttft_cost_s", "move_ttft_cost_s_mean")
_ROW_PREFILL = SNAPSHOT_ARRAY_ROWS.index("est_prefill_s_per_token")
_ROW_CARBON = SNAPSHOT_ARRAY_ROWS.index("carbon_g_per_kwh")


class SessionTracker:
    """Cached prefixes of the visible pending requests, each session's last datacenter and the
    episode's cache / session-move metrics (module docstring).

    Args:
        n_datacenters: D.
        prefill_power_w: (D,) or scalar GPU power above idle while prefilling, per engine
            (``tp x (prefill_w - idle_w)``), W.
        pue: (D,) PUE of each datacenter.
    """

    def __init__(self, n_datacenters: int, prefill_power_w: Any, pue: Any) -> None:
        self.D = int(n_datacenters)
        self.prefill_power_w = np.broadcast_to(np.asarray(prefill_power_w, dtype=np.float64), (self.D,)).copy()
        self.pue = np.asarray(pue, dtype=np.float64).reshape(self.D)
        self.reset()

    def reset(self) -> None:
        """Forget every session (a new episode)."""
        self.session_dc: dict[int, int] = {}
        self.in_flight: dict[int, tuple[int, int]] = {}  # request id -> (session, turn), placed and not completed
        self.counts = dict.fromkeys(_COUNTERS, 0.0)
        self._base: dict[str, Any] | None = None  # the window's baseline (counts and simulator totals)
        self._set_visible(np.zeros((0, self.D), dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                          np.zeros(0, dtype=np.int32))

    def _set_visible(self, cached: np.ndarray, sid: np.ndarray, sdc: np.ndarray, turn: np.ndarray) -> None:
        self.cached, self.session_id, self.session_dc_of, self.turn = cached, sid, sdc, turn

    def observe(self, sim: Any, store: Any, rows: np.ndarray, window_open: bool = False) -> None:
        """Read the visible pending ``rows`` (of the pending ``store``): cached prefix tokens (n, D),
        session ids and the datacenter of each session's previous turn (module docstring).
        ``window_open``: the measurement window is open; the first observation after it opened
        (at the simulated time it opened) takes the window's baseline."""
        if window_open and self._base is None:
            t = sim.totals()
            self._base = {"counts": dict(self.counts), "prompt": t.prompt_tokens.copy(),
                          "cached": t.cached_prompt_tokens.copy(), "saved": t.prefill_saved_tokens.copy()}
        n = int(rows.shape[0])
        info = store.prefix_of(rows) if n else None
        if info is None:
            self._set_visible(np.zeros((n, self.D), dtype=np.int64), np.full(n, -1, dtype=np.int64),
                              np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int32))
            return
        hashes, sid, turn = info
        cached = sim.cached_prefix_tokens_batch(hashes, rows[:, PROMPT].astype(np.int64))
        get = self.session_dc.get
        sdc = np.array([get(s, -1) if s >= 0 else -1 for s in sid.tolist()], dtype=np.int64)
        self._set_visible(np.asarray(cached, dtype=np.int64), sid.astype(np.int64), sdc, turn)

    def placed(self, place: np.ndarray, dcs: np.ndarray, snap: np.ndarray, ids: np.ndarray | None = None) -> None:
        """The visible requests where ``place`` is True go to ``dcs`` (one per placed request):
        count the session turns and moves with their re-prefill cost, remember each session's
        datacenter. ``snap``: the decision's snapshot array (prefill time per token, carbon);
        ``ids``: their request ids (one per placed request), to keep the session and turn of
        each until it completes (fail-over)."""
        idx = np.flatnonzero(place)
        if not idx.size:
            return
        sid = self.session_id[idx]
        has = sid >= 0
        if not has.any():
            return
        if ids is not None:
            self.in_flight.update(zip(np.asarray(ids)[has].tolist(), zip(sid[has].tolist(), self.turn[idx][has].tolist())))
        c = self.counts
        prev = self.session_dc_of[idx]
        for i, s, p, d in zip(idx[has].tolist(), sid[has].tolist(), prev[has].tolist(), np.asarray(dcs)[has].tolist()):
            if p >= 0:
                c["session_turns"] += 1
                if p != d:
                    c["session_moves"] += 1
                    lost = max(int(self.cached[i, p]) - int(self.cached[i, d]), 0)
                    if lost:
                        t_s = lost * float(snap[_ROW_PREFILL, d])
                        e_j = t_s * self.prefill_power_w[d] * self.pue[d]
                        c["move_reprefill_tokens"] += lost
                        c["move_ttft_cost_s"] += t_s
                        c["move_reprefill_energy_j"] += e_j
                        c["move_reprefill_carbon_g"] += e_j * float(snap[_ROW_CARBON, d]) / 3.6e6
            self.session_dc[s] = d

    def completed(self, request_ids: np.ndarray) -> None:
        """Forget the session and turn of completed requests."""
        if self.in_flight:
            pop = self.in_flight.pop
            for rid in request_ids.tolist():
                pop(rid, None)

    def aborted(self, request_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(session id (int64, -1: none), turn (int32))`` of requests an outage aborted (they
        are forgotten: placed again, they get new ids)."""
        pop = self.in_flight.pop
        got = [pop(rid, (-1, 0)) for rid in request_ids.tolist()]
        return (np.array([g[0] for g in got], dtype=np.int64), np.array([g[1] for g in got], dtype=np.int32))

    def encode(self, slots: np.ndarray, n: int, col: int, prompt_tokens: np.ndarray | None) -> None:
        """Write the observation's ``cached_prefix`` columns (the share of each visible
        request's prompt cached at each datacenter) into ``slots`` (K, F_S) rows ``:n`` from
        column ``col`` on."""
        if n and self.cached.size and prompt_tokens is not None:
            slots[:n, col:col + self.D] = self.cached / np.maximum(prompt_tokens, 1.0)[:, None]

    def state_fields(self, n: int) -> dict[str, np.ndarray]:
        """The :class:`~carbon_gym.state.PendingRequests` fields of the ``n`` visible requests
        (empty, i.e. zeros and -1, when ``n`` is not the visible count: the overflow is not read)."""
        if n != self.cached.shape[0]:
            return {}
        return {"cached_prefix_tokens": self.cached.copy(), "session_id": self.session_id.copy(),
                "session_dc": self.session_dc_of.copy()}

    def metrics(self, sim: Any) -> dict[str, Any]:
        """The cache and session-move metrics (module docstring), window-relative when a window
        baseline was taken."""
        t = sim.totals()
        prompt = np.asarray(t.prompt_tokens, dtype=np.int64)
        cached = np.asarray(t.cached_prompt_tokens, dtype=np.int64)
        saved = np.asarray(t.prefill_saved_tokens, dtype=np.int64)
        counts = dict(self.counts)
        if self._base is not None:
            b = self._base
            prompt, cached, saved = prompt - b["prompt"], cached - b["cached"], saved - b["saved"]
            counts = {k: v - b["counts"][k] for k, v in counts.items()}
        p_all = int(prompt.sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            dc_rate = np.where(prompt > 0, cached / np.maximum(prompt, 1), np.nan)
        turns, moves = int(counts["session_turns"]), int(counts["session_moves"])
        return {
            "prefix_prompt_tokens": p_all,
            "prefix_cached_tokens": int(cached.sum()),
            "prefix_hit_rate": float(cached.sum()) / p_all if p_all else float("nan"),
            "prefill_tokens_saved": int(saved.sum()),
            "dc_prefix_hit_rate": dc_rate,
            "session_turns": turns,
            "session_moves": moves,
            "session_move_rate": moves / turns if turns else float("nan"),
            "move_reprefill_tokens": int(counts["move_reprefill_tokens"]),
            "move_reprefill_energy_j": float(counts["move_reprefill_energy_j"]),
            "move_reprefill_carbon_g": float(counts["move_reprefill_carbon_g"]),
            "move_ttft_cost_s": float(counts["move_ttft_cost_s"]),
            "move_ttft_cost_s_mean": float(counts["move_ttft_cost_s"]) / moves if moves else float("nan"),
        }


def session_tracker(layout: Any, parts: Any, pue: np.ndarray) -> SessionTracker | None:
    """The :class:`SessionTracker` of an env (its observation ``layout``, world ``parts`` and
    PUEs), or None when the scenario has no prefix workload (``layout.prefix_cache`` False)."""
    if not layout.prefix_cache:
        return None
    tp = int(parts.engine.tp)
    power = np.array([tp * (float(g.power.prefill_w) - float(g.power.idle_w)) for g in parts.datacenter_gpus()])
    return SessionTracker(layout.n_datacenters, power, pue)
