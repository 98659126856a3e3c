"""From the env's typed state to a :class:`~solvers.problem.PlacementProblem`, and back to an action.

Everything a scheduler sees comes from :meth:`carbon_gym.env.GeoServeEnv.state` (an
:class:`~carbon_gym.state.EnvState` in physical units: the datacenters' snapshot and carbon as
the feed reports it, the visible pending requests, the action mask, the static layout) and static
facts of the scenario (the power and latency models the simulator was built with, engine
settings, SLO targets). Nothing is read from the simulator's hidden state: the true output lengths
of pending requests stay hidden. The scaled float32 observation is never decoded.

Mapping (state -> problem):

* requests: the visible pending requests, in slot order (oldest first); ``network_s`` (uplink +
  downlink, link degradation included); ``output_tokens`` = the predicted output length (the
  scenario's predictor; true lengths only under ``predictor = "oracle"``); ``allowed`` = their
  rows of the action mask.
* per datacenter: ``prefill_s_per_token = est_prefill_s_per_token + est_iteration_s / chunk``
  (the marginal time per prompt token plus the fixed time of one prefill iteration spread over a
  chunk of ``max_num_batched_tokens - running sequences per engine`` tokens), so
  ``prompt x prefill_s_per_token`` approximates the simulator's prefill estimate
  ``ceil(prompt / chunk) x est_iteration_s + prompt x est_prefill_s_per_token`` when prompts
  queue back to back; a request's own prefill latency adds ``prefill_fixed_s = est_iteration_s``
  (the iteration it joins);
  ``tpot_idle_s`` is the latency model's decode iteration of one sequence with a 1,000-token
  context; ``decode_iteration_s`` is the model's decode iteration at the current batch per busy
  engine (no prefill interference), at most the TPOT estimate; ``free_kv_tokens =
  free_kv_blocks x block_tokens``; ``backlog_prompt_tokens = queue_len x`` the mean pending
  prompt, and ``est_queue_wait_s`` is the larger of the simulator's estimate (the queue of the
  single engine its dispatcher would pick) and that backlog spread over the engines,
  ``backlog x prefill_s_per_token / n_engines``. Estimates of a datacenter that is down
  (infinite in the state) are replaced by a large finite number (``up`` is False and the mask
  forbids it anyway). A missing carbon value (feed gap) gets a stand-in
  (:meth:`EnvFacts.carbon_stand_in`).
* prefix caches and sessions (scenarios with a prefix workload): ``cached_prompt_tokens`` = the
  state's ``cached_prefix_tokens`` (None when no visible request has a cached prefix anywhere, so
  that such steps build exactly the problem of a workload without caching), capped at
  ``prompt - 1`` (an engine computes at least one prompt token); ``session_dc`` = the state's
  (None when no visible request's session has a previous turn).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from carbon_gym.state import EnvState

from .problem import PlacementProblem

#: Finite stand-in for the infinite estimates of a datacenter that is down, seconds.
DOWN_ESTIMATE_S = 1.0e6
#: Intensity (gCO2eq/kWh) assumed for every datacenter when no carbon data has ever been seen.
FALLBACK_CARBON_G_PER_KWH = 400.0
#: Context length at which the lone-sequence decode time is evaluated, tokens.
LONE_CONTEXT_TOKENS = 1000.0


class EnvFacts:
    """Static facts of an env needed to build problems (read once per episode): the engine
    settings and the latency and power models of the env's world.

    Attributes:
        tp, power (the power model), max_num_batched_tokens, chunked_prefill, tpot_idle_s (D,),
        raw_slope_s_per_seq, poll_s: see :class:`PlacementProblem`.
    """

    def __init__(self, env: Any) -> None:
        base = env.unwrapped
        self.env = env
        self.layout = base.layout
        parts = base.world_parts
        latency, power, eng = parts.latency, parts.power, parts.engine
        self.tp = int(eng.tp)
        self.max_num_batched_tokens = int(eng.max_num_batched_tokens)
        self.chunked_prefill = bool(eng.chunked_prefill)
        self.power = power
        c = LONE_CONTEXT_TOKENS
        lone = float(latency.iteration_time_s(0, 0.0, 1, c, 1))
        self.tpot_idle_s = np.full(self.layout.n_datacenters, lone)
        # decode iteration time per extra sequence (no prefill interference), at 1,000-token contexts
        n = 32
        self.raw_slope_s_per_seq = (float(latency.iteration_time_s(0, 0.0, n + 1, c * (n + 1), n + 1))
                                    - float(latency.iteration_time_s(0, 0.0, n, c * n, n)))
        self.poll_s = float(self.layout.polling_period_s)
        #: last intensity seen per datacenter (gCO2eq/kWh), the stand-in while a feed is missing
        self.last_carbon_g_per_kwh = np.full(self.layout.n_datacenters, np.nan)

    def carbon_stand_in(self, observed_g_per_kwh: np.ndarray, forecast_g_per_kwh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Replace missing (NaN) intensities by a stand-in and remember the observed ones.

        A missing value (carbon-feed gap fault) becomes the datacenter's last observed
        intensity; a datacenter never observed gets the highest intensity visible this step
        (pessimistic, so an unknown grid is not preferred), or ``FALLBACK_CARBON_G_PER_KWH`` if
        no datacenter has data. A missing forecast hour takes the stand-in current value.
        """
        now = np.asarray(observed_g_per_kwh, dtype=np.float64).copy()
        seen = np.isfinite(now)
        self.last_carbon_g_per_kwh[seen] = now[seen]
        if not seen.all():
            pessimistic = float(now[seen].max()) if seen.any() else FALLBACK_CARBON_G_PER_KWH
            last = self.last_carbon_g_per_kwh
            now = np.where(seen, now, np.where(np.isfinite(last), last, pessimistic))
        fc = np.asarray(forecast_g_per_kwh, dtype=np.float64)
        if fc.size and not np.all(np.isfinite(fc)):
            fc = np.where(np.isfinite(fc), fc, now.reshape((-1,) + (1,) * (fc.ndim - 1)))
        return now, fc


def problem_from_state(state: EnvState, facts: EnvFacts) -> PlacementProblem:
    """The :class:`PlacementProblem` of one env step from its :class:`~carbon_gym.state.EnvState`
    (see the module docstring for the mapping)."""
    L = state.layout
    ds = state.datacenters
    pend = state.pending
    d_n = L.n_datacenters
    up = np.asarray(ds.up, dtype=bool)
    n_eng = np.maximum(np.asarray(ds.n_engines, dtype=np.int64), 1)

    def finite(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return np.where(np.isfinite(x), np.maximum(x, 0.0), DOWN_ESTIMATE_S)

    running = np.asarray(ds.running, dtype=np.float64)
    busy = np.asarray(ds.busy_engines, dtype=np.float64)
    per_engine = np.where(busy > 0, running / np.maximum(busy, 1.0), 0.0)
    if facts.chunked_prefill:
        chunk = np.maximum(facts.max_num_batched_tokens - per_engine, 1.0)
    else:
        chunk = np.full(d_n, float(facts.max_num_batched_tokens))
    ppt = finite(ds.est_prefill_s_per_token) + finite(ds.est_iteration_s) / chunk
    ppt = np.where(up, ppt, DOWN_ESTIMATE_S)
    tpot_now = finite(ds.est_tpot_s)
    t_dec = np.minimum(facts.tpot_idle_s + facts.raw_slope_s_per_seq * np.maximum(per_engine - 1.0, 0.0), tpot_now)
    prompts = np.maximum(np.asarray(pend.prompt_tokens, dtype=np.float64), 1.0)
    queue_len = np.asarray(ds.queue_len, dtype=np.float64)
    backlog = queue_len * (float(prompts.mean()) if prompts.size else 0.0)
    # the simulator's queue-wait estimate is that of the one engine its dispatcher picks next
    # (often idle even when the datacenter holds a backlog); a batch of placements waits behind
    # the whole backlog spread over the engines
    wait = np.maximum(finite(ds.est_queue_wait_s), np.where(up, backlog * ppt / n_eng, 0.0))
    pw = facts.power
    carbon_now, carbon_forecast = facts.carbon_stand_in(ds.carbon_g_per_kwh, ds.carbon_forecast_g_per_kwh)
    n = len(pend)
    cached = getattr(pend, "cached_prefix_tokens", None)
    cached = np.minimum(cached, prompts[:, None] - 1.0) if cached is not None and cached.size and cached.any() else None
    sdc = getattr(pend, "session_dc", None)
    sdc = sdc if sdc is not None and sdc.size and bool((sdc >= 0).any()) else None
    return PlacementProblem(
        origin=pend.origin,
        prompt_tokens=prompts,
        output_tokens=np.maximum(np.asarray(pend.predicted_output_tokens, dtype=np.float64), 1.0),
        waited_s=np.maximum(np.asarray(pend.waited_s, dtype=np.float64), 0.0),
        network_s=np.maximum(np.asarray(pend.network_s, dtype=np.float64), 0.0),
        allowed=np.asarray(state.action_mask, dtype=bool)[:, :d_n],
        carbon_g_per_kwh=np.maximum(carbon_now, 0.0),
        pue=np.maximum(np.asarray(ds.pue, dtype=np.float64), 1.0),
        up=up,
        n_engines=n_eng,
        busy_engines=np.asarray(ds.busy_engines, dtype=np.int64),
        running=running,
        queue_len=queue_len,
        backlog_prompt_tokens=np.where(up, backlog, 0.0),
        free_kv_tokens=np.asarray(ds.free_kv_blocks, dtype=np.float64) * float(L.block_tokens),
        est_queue_wait_s=wait,
        prefill_s_per_token=ppt,
        prefill_fixed_s=np.where(up, finite(ds.est_iteration_s), 0.0),
        tpot_now_s=tpot_now,
        decode_iteration_s=np.where(up, t_dec, facts.tpot_idle_s),
        tpot_idle_s=facts.tpot_idle_s,
        tpot_slope_s_per_seq=np.where(up, finite(ds.tpot_slope_s_per_seq), 0.0),
        tp=facts.tp,
        gpu_idle_w=float(pw.idle_w),
        gpu_prefill_w=float(pw.prefill_w),
        decode_min_w=float(pw.decode_min_w),
        decode_max_w=float(pw.decode_max_w),
        decode_sat_seqs=float(pw.decode_sat_seqs),
        max_seqs_per_engine=int(L.max_num_seqs),
        ttft_slo_s=float(L.ttft_target_s),
        tpot_slo_s=float(L.tpot_target_s),
        poll_s=facts.poll_s,
        time_s=float(state.elapsed_s),
        slot=np.arange(n),
        carbon_forecast_g_per_kwh=carbon_forecast,
        cached_prompt_tokens=cached,
        session_dc=sdc,
    )


def action_from_assignment(problem: PlacementProblem, assignment: np.ndarray, max_pending: int) -> np.ndarray:
    """The env action (length K): each request's datacenter (or D = defer) in its slot; padded
    slots get D."""
    d_n = problem.n_datacenters
    action = np.full(int(max_pending), d_n, dtype=np.int64)
    action[problem.slot] = np.asarray(assignment, dtype=np.int64)
    return action
