"""From the env's observation to a :class:`~solvers.problem.PlacementProblem`, and back to an action.

Everything a scheduler sees comes from the observation (decoded by
:func:`carbon_gym.env.decode_observation`), the action mask (``info["action_mask"]`` or
``env.action_masks()``) and static facts of the scenario (engine counts, the power and latency
models the simulator was built with, SLO targets). Nothing is read from the simulator's hidden
state: the true output lengths of pending requests stay hidden.

Mapping (observation -> problem):

* per slot: valid slots become the requests, in slot order (oldest first); ``slot_network_s``
  (uplink + downlink) is ``network_s``; ``slot_predicted_output_tokens`` is ``output_tokens``
  (the scenario's predictor; true lengths only when the scenario says ``predictor = "oracle"``).
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
  ``backlog x prefill_s_per_token / n_engines``. Estimates of a datacenter that is
  down (infinite in the observation) are replaced by a large finite number (``up`` is False and
  the mask forbids it anyway).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .problem import PlacementProblem

#: Finite stand-in for the infinite estimates of a datacenter that is down, seconds.
DOWN_ESTIMATE_S = 1.0e6
#: Intensity (gCO2eq/kWh) assumed for every datacenter when no carbon data has ever been seen.
FALLBACK_CARBON_G_PER_KWH = 400.0
#: Context length at which the lone-sequence decode time is evaluated, tokens.
LONE_CONTEXT_TOKENS = 1000.0


class EnvFacts:
    """Static facts of an env needed to build problems (read once per episode).

    Attributes:
        tp, power figures, max_num_batched_tokens, tpot_idle_s, poll_s: see :class:`PlacementProblem`.
    """

    def __init__(self, env: Any) -> None:
        base = getattr(env, "unwrapped", env)
        self.env = env
        self.layout = base.layout
        sc = base.scenario
        sim = getattr(base, "simulator", None)
        if sim is not None:
            latency, power, eng = sim.latency, sim.power, sim.engine_config
        else:  # before reset: load the same parts the world would
            from carbon_gym.world import build_parts

            parts = build_parts(sc)
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
        self.predictor = str(getattr(getattr(sc, "env", None), "predictor", "unknown"))
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


def problem_from_observation(observation: Any, env: Any, info: dict | None = None, facts: EnvFacts | None = None) -> PlacementProblem:
    """The :class:`PlacementProblem` of one env step (see the module docstring for the mapping)."""
    from carbon_gym.env import decode_observation

    facts = facts if facts is not None else EnvFacts(env)
    L = facts.layout
    obs = decode_observation(observation, L)
    d_n = L.n_datacenters
    if info is not None and "action_mask" in info:
        mask = np.asarray(info["action_mask"], dtype=bool).reshape(L.max_pending, d_n + 1)
    else:
        base = getattr(env, "unwrapped", env)
        mask = np.asarray(base.action_masks(), dtype=bool).reshape(L.max_pending, d_n + 1)
    valid = np.asarray(obs["slot_valid"], dtype=bool)
    slots = np.flatnonzero(valid)
    up = np.asarray(obs["up"], dtype=bool)
    n_eng = np.maximum(np.asarray(obs["n_engines"], dtype=np.int64), 1)

    def finite(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return np.where(np.isfinite(x), np.maximum(x, 0.0), DOWN_ESTIMATE_S)

    running = np.asarray(obs["running"], dtype=np.float64)
    busy = np.asarray(obs["busy_engines"], dtype=np.float64)
    per_engine = np.where(busy > 0, running / np.maximum(busy, 1.0), 0.0)
    if facts.chunked_prefill:
        chunk = np.maximum(facts.max_num_batched_tokens - per_engine, 1.0)
    else:
        chunk = np.full(d_n, float(facts.max_num_batched_tokens))
    ppt = finite(obs["est_prefill_s_per_token"]) + finite(obs["est_iteration_s"]) / chunk
    ppt = np.where(up, ppt, DOWN_ESTIMATE_S)
    tpot_now = finite(obs["est_tpot_s"])
    t_dec = np.minimum(facts.tpot_idle_s + facts.raw_slope_s_per_seq * np.maximum(per_engine - 1.0, 0.0), tpot_now)
    prompts = np.maximum(np.asarray(obs["slot_prompt_tokens"], dtype=np.float64)[slots], 1.0)
    queue_len = np.asarray(obs["queue_len"], dtype=np.float64)
    backlog = queue_len * (float(prompts.mean()) if prompts.size else 0.0)
    # the simulator's queue-wait estimate is that of the one engine its dispatcher picks next
    # (often idle even when the datacenter holds a backlog); a batch of placements waits behind
    # the whole backlog spread over the engines
    wait = np.maximum(finite(obs["est_queue_wait_s"]), np.where(up, backlog * ppt / n_eng, 0.0))
    pw = facts.power
    carbon_now, carbon_forecast = facts.carbon_stand_in(obs["carbon_g_per_kwh"], obs["carbon_forecast_g_per_kwh"])
    return PlacementProblem(
        origin=np.asarray(obs["slot_origin"])[slots],
        prompt_tokens=prompts,
        output_tokens=np.maximum(np.asarray(obs["slot_predicted_output_tokens"], dtype=np.float64)[slots], 1.0),
        waited_s=np.maximum(np.asarray(obs["slot_waited_s"], dtype=np.float64)[slots], 0.0),
        network_s=np.maximum(np.asarray(obs["slot_network_s"], dtype=np.float64)[slots], 0.0),
        allowed=mask[slots, :d_n],
        carbon_g_per_kwh=np.maximum(carbon_now, 0.0),
        pue=np.maximum(np.asarray(obs["pue"], dtype=np.float64), 1.0),
        up=up,
        n_engines=n_eng,
        busy_engines=np.asarray(obs["busy_engines"], dtype=np.int64),
        running=running,
        queue_len=queue_len,
        backlog_prompt_tokens=np.where(up, backlog, 0.0),
        free_kv_tokens=np.asarray(obs["free_kv_blocks"], dtype=np.float64) * float(obs["block_tokens"]),
        est_queue_wait_s=wait,
        prefill_s_per_token=ppt,
        prefill_fixed_s=np.where(up, finite(obs["est_iteration_s"]), 0.0),
        tpot_now_s=tpot_now,
        decode_iteration_s=np.where(up, t_dec, facts.tpot_idle_s),
        tpot_idle_s=facts.tpot_idle_s,
        tpot_slope_s_per_seq=np.where(up, finite(obs["tpot_slope_s_per_seq"]), 0.0),
        tp=facts.tp,
        gpu_idle_w=float(pw.idle_w),
        gpu_prefill_w=float(pw.prefill_w),
        decode_min_w=float(getattr(pw, "decode_min_w", pw.gpu_power_w(0, 1))),
        decode_max_w=float(getattr(pw, "decode_max_w", pw.gpu_power_w(0, 256))),
        decode_sat_seqs=float(getattr(pw, "decode_sat_seqs", 48.0)),
        max_seqs_per_engine=int(obs["max_num_seqs"]),
        ttft_slo_s=float(obs["ttft_target_s"]),
        tpot_slo_s=float(obs["tpot_target_s"]),
        poll_s=facts.poll_s,
        time_s=float(obs["elapsed_s"]),
        slot=slots,
        carbon_forecast_g_per_kwh=carbon_forecast,
    )


def action_from_assignment(problem: PlacementProblem, assignment: np.ndarray, max_pending: int) -> np.ndarray:
    """The env action (length K): each request's datacenter (or D = defer) in its slot; padded
    slots get D."""
    d_n = problem.n_datacenters
    action = np.full(int(max_pending), d_n, dtype=np.int64)
    action[problem.slot] = np.asarray(assignment, dtype=np.int64)
    return action
