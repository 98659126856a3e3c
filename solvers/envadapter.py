"""From the env's typed state to a :class:`~solvers.problem.PlacementProblem`, and back to an action.

Everything a scheduler sees comes from :meth:`carbon_gym.env.GeoServeEnv.state` (an
:class:`~carbon_gym.state.EnvState` in physical units: the datacenters' snapshot and carbon as
the feed reports it, the visible pending requests, the action mask, the static layout) and static
facts of the scenario (the power and latency models the simulator was built with - each
datacenter's own GPU's in a heterogeneous topology -, engine settings, SLO targets). Nothing is read from the simulator's hidden state: the true output lengths
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
  ``tpot_idle_s`` is the latency model's (the datacenter's GPU's) decode iteration of one
  sequence with a 1,000-token context; ``decode_iteration_s`` is the model's decode iteration at the current batch per busy
  engine (no prefill interference), at most the TPOT estimate; ``free_kv_tokens =
  free_kv_blocks x block_tokens``; ``backlog_prompt_tokens = queue_len x`` the mean pending
  prompt, and ``est_queue_wait_s`` is the larger of the simulator's estimate (the queue of the
  single engine its dispatcher would pick) and that backlog spread over the engines,
  ``backlog x prefill_s_per_token / n_engines``. Estimates of a datacenter that is down
  (infinite in the state) are replaced by a large finite number (``up`` is False and the mask
  forbids it anyway). A missing carbon value (feed gap) gets a stand-in
  (:meth:`EnvFacts.carbon_stand_in`).
* power: the per-GPU power fields from each datacenter's GPU power model: floats when every
  datacenter has the same GPU, else (D,) arrays (:func:`datacenter_power_fields`); the KV
  capacity (``free_kv_blocks``) and the simulator's latency estimates are already per datacenter.
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

from .problem import POWER_FIELDS, PlacementProblem

#: Finite stand-in for the infinite estimates of a datacenter that is down, seconds.
DOWN_ESTIMATE_S = 1.0e6
#: Intensity (gCO2eq/kWh) assumed for every datacenter when no carbon data has ever been seen.
FALLBACK_CARBON_G_PER_KWH = 400.0
#: Context length at which the lone-sequence decode time is evaluated, tokens.
LONE_CONTEXT_TOKENS = 1000.0


def datacenter_power_fields(powers: list[Any]) -> dict[str, Any]:
    """The per-GPU power fields of a :class:`PlacementProblem` (:data:`~solvers.problem.POWER_FIELDS`)
    from each datacenter's power model (D,): floats when every datacenter's model gives the same
    figures (a homogeneous topology), else (D,) arrays, each datacenter its own GPU's."""
    attrs = ("idle_w", "prefill_w", "decode_min_w", "decode_max_w", "decode_sat_seqs")
    vals = {f: np.array([float(getattr(pw, a)) for pw in powers], dtype=np.float64) for f, a in zip(POWER_FIELDS, attrs)}
    if all(np.all(v == v[0]) for v in vals.values()):
        return {f: float(v[0]) for f, v in vals.items()}
    return vals


class EnvFacts:
    """Static facts of an env needed to build problems (read once per episode): the engine
    settings and the latency and power models of each datacenter's GPU.

    Attributes:
        tp, max_num_batched_tokens, chunked_prefill, poll_s: see :class:`PlacementProblem`.
        gpus: (D,) GPU type name of each datacenter.
        tpot_idle_s: (D,) lone-sequence decode iteration of each datacenter's GPU, seconds.
        raw_slope_s_per_seq: (D,) decode iteration time per extra sequence there, seconds.
        power_w: the :data:`~solvers.problem.POWER_FIELDS` of the problem: floats when every
            datacenter has the same GPU (the power model of ``power``), else (D,) arrays.
        power: the power model of the scenario's main GPU (every datacenter's, when homogeneous).
    """

    def __init__(self, env: Any) -> None:
        base = env.unwrapped
        self.env = env
        self.layout = base.layout
        parts = base.world_parts
        eng = parts.engine
        self.tp = int(eng.tp)
        self.max_num_batched_tokens = int(eng.max_num_batched_tokens)
        self.chunked_prefill = bool(eng.chunked_prefill)
        self.power = parts.power
        d_n = self.layout.n_datacenters
        self.gpus = [parts.topology.datacenter_gpu(i) for i in range(d_n)]
        models = parts.datacenter_gpus()
        c = LONE_CONTEXT_TOKENS
        n = 32
        lone: dict[str, float] = {}
        slope: dict[str, float] = {}
        for g, m in zip(self.gpus, models):  # each GPU type's latency model, once
            if g not in lone:
                lat = m.latency
                lone[g] = float(lat.iteration_time_s(0, 0.0, 1, c, 1))
                # decode iteration time per extra sequence (no prefill interference), at 1,000-token contexts
                slope[g] = (float(lat.iteration_time_s(0, 0.0, n + 1, c * (n + 1), n + 1))
                            - float(lat.iteration_time_s(0, 0.0, n, c * n, n)))
        self.tpot_idle_s = np.array([lone[g] for g in self.gpus], dtype=np.float64)
        self.raw_slope_s_per_seq = np.array([slope[g] for g in self.gpus], dtype=np.float64)
        self.power_w = datacenter_power_fields([m.power for m in models])
        self.poll_s = float(self.layout.polling_period_s)
        #: last intensity seen per datacenter (gCO2eq/kWh), the stand-in while a feed is missing
        self.last_carbon_g_per_kwh = np.full(d_n, np.nan)

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
        **facts.power_w,
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
