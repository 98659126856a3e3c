"""The placement problem every scheduler in :mod:`solvers` solves, independent of the env.

A :class:`PlacementProblem` is one polling step's decision, in physical units: R pending
requests (origin, prompt length, predicted output length, time already waited, network delay
to every datacenter, which datacenters are allowed) and D datacenters (carbon intensity, PUE,
load, the simulator's latency estimates, engine counts, power figures), plus the SLO targets.
Schedulers map a problem to an ``assignment`` (int array of length R; a datacenter index, or
``D`` = defer). :func:`solvers.envadapter.problem_from_state` builds one from the env's typed state;
:func:`synthetic_problem` builds realistic random ones for tests and benchmarks.

All the energy/latency arithmetic the schedulers share sits here too (one place to check it):

* per-GPU decode power ``P_dec(n) = decode_max_w - (decode_max_w - decode_min_w) exp(-(n-1)/sat)``
  (the simulator's :class:`carbon_gym.physics.power.PhasePowerModel`, evaluated at real ``n``);
* decode iteration time of an engine with ``n`` sequences ``t(n) = tpot_idle_s + slope (n - 1)``;
* engine energy above idle per decode iteration ``dE(n) = tp (P_dec(n) - idle_w) t(n)``, ``dE(0)=0``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError

J_PER_KWH = 3.6e6
#: The per-GPU power fields of a :class:`PlacementProblem` (a float, or (D,) per datacenter).
POWER_FIELDS = ("gpu_idle_w", "gpu_prefill_w", "decode_min_w", "decode_max_w", "decode_sat_seqs")

__all__ = ["PlacementProblem", "synthetic_problem", "J_PER_KWH", "POWER_FIELDS"]


def _arr(x: Any, dtype: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=dtype))


@dataclass
class PlacementProblem:
    """One polling step's placement decision, in physical units.

    Requests (length R unless noted):
        origin: origin region index.
        prompt_tokens: prompt length, tokens.
        output_tokens: predicted output length, tokens (the predictor's, or true under "oracle").
        waited_s: time already waited since arrival, seconds (counts against TTFT).
        network_s: (R, D) network delay added to TTFT (uplink + downlink), seconds.
        allowed: (R, D) bool, datacenters the env allows for this request (its action mask).
        slot: env action slot of each request (``-1`` when the problem is not from an env).
        cached_prompt_tokens: optional (R, D) prompt tokens of each request already in the prefix
            cache of the best engine of each datacenter (the env's ``cached_prefix_tokens``),
            tokens, at most the prompt; None (default): no prefix caching. Prefill time, prefill
            energy and TTFT use the *prefill tokens* ``prompt - cached`` (:attr:`prefill_tokens`).
        session_dc: optional (R,) datacenter that served the request's session's previous turn
            (-1: none); None: no sessions.

    Datacenters (length D):
        carbon_g_per_kwh: grid carbon intensity now, gCO2eq/kWh.
        pue: power usage effectiveness (facility / IT power).
        up: datacenter is up.
        n_engines: engines serving the model; busy_engines: engines with work now.
        running: sequences in running batches; queue_len: requests waiting (engine queues + in transit).
        free_kv_tokens: free KV-cache capacity, tokens (all engines together).
        est_queue_wait_s: simulator's estimate of the queueing wait a new request sees, seconds.
        prefill_s_per_token: estimated prefill seconds per prompt token of a new request.
        tpot_now_s: estimated per-token decode time a new request would see now, seconds.
        tpot_idle_s: per-token decode time of a lone sequence on an idle engine, seconds.
        tpot_slope_s_per_seq: added decode iteration time per extra sequence on one engine, s.

    Scalars:
        backlog_prompt_tokens: optional (D,) prompt tokens already waiting at each datacenter
        (queued or in transit, not yet prefilled), tokens; default ``queue_len`` x the mean prompt
        of the pending requests (the queued prompts are not observed one by one).
        prefill_fixed_s: optional (D,) fixed latency of the prefill iteration a new prompt joins
        (the decodes of the batch run in it), seconds, added to every request's prefill time
        (default 0).
        decode_iteration_s: optional (D,) decode iteration time of the current batch without
        prefill interference, seconds (default ``tpot_idle_s + slope (n - 1)``, n the batch per
        busy engine).
        tp: GPUs per engine; gpu_idle_w, gpu_prefill_w, decode_min_w, decode_max_w, decode_sat_seqs:
        per-GPU power model (watts, sequences): one float when every datacenter has the same GPU,
        else (D,) per datacenter (heterogeneous topologies: each datacenter's own GPU);
        max_seqs_per_engine: vLLM max_num_seqs;
        ttft_slo_s, tpot_slo_s: SLO targets, seconds; poll_s: polling period, seconds;
        carbon_forecast_g_per_kwh: optional (D, H) forecast, gCO2eq/kWh; time_s: sim time, s.
    """

    origin: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    waited_s: np.ndarray
    network_s: np.ndarray
    allowed: np.ndarray
    carbon_g_per_kwh: np.ndarray
    pue: np.ndarray
    up: np.ndarray
    n_engines: np.ndarray
    busy_engines: np.ndarray
    running: np.ndarray
    queue_len: np.ndarray
    free_kv_tokens: np.ndarray
    est_queue_wait_s: np.ndarray
    prefill_s_per_token: np.ndarray
    tpot_now_s: np.ndarray
    tpot_idle_s: np.ndarray
    tpot_slope_s_per_seq: np.ndarray
    tp: int = 1
    gpu_idle_w: float | np.ndarray = 63.0
    gpu_prefill_w: float | np.ndarray = 400.0
    decode_min_w: float | np.ndarray = 180.0
    decode_max_w: float | np.ndarray = 300.0
    decode_sat_seqs: float | np.ndarray = 48.0
    max_seqs_per_engine: int = 256
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.1
    poll_s: float = 1.0
    time_s: float = 0.0
    slot: np.ndarray = None  # type: ignore[assignment]  # None: the default, filled in __post_init__
    carbon_forecast_g_per_kwh: np.ndarray | None = None
    decode_iteration_s: np.ndarray | None = None
    prefill_fixed_s: np.ndarray = None  # type: ignore[assignment]  # None: the default, filled in __post_init__
    backlog_prompt_tokens: np.ndarray = None  # type: ignore[assignment]  # None: the default, filled in __post_init__
    cached_prompt_tokens: np.ndarray | None = None
    session_dc: np.ndarray | None = None

    def __post_init__(self) -> None:  # noqa: C901
        for name in ("origin", "slot"):
            if getattr(self, name) is not None:
                setattr(self, name, _arr(getattr(self, name), np.int64))
        for name in ("prompt_tokens", "output_tokens", "waited_s"):
            setattr(self, name, _arr(getattr(self, name), np.float64))
        r = self.prompt_tokens.shape[0]
        dc_float = ("carbon_g_per_kwh", "pue", "free_kv_tokens", "est_queue_wait_s", "prefill_s_per_token",
                    "tpot_now_s", "tpot_idle_s", "tpot_slope_s_per_seq", "running", "queue_len")
        for name in dc_float:
            setattr(self, name, _arr(getattr(self, name), np.float64))
        for name in ("n_engines", "busy_engines"):
            setattr(self, name, _arr(getattr(self, name), np.int64))
        self.up = _arr(self.up, bool)
        d = self.carbon_g_per_kwh.shape[0]
        if self.prefill_fixed_s is None:
            self.prefill_fixed_s = np.zeros(d)
        self.prefill_fixed_s = _arr(self.prefill_fixed_s, np.float64)
        if self.prefill_fixed_s.shape != (d,) or np.any(~np.isfinite(self.prefill_fixed_s)) or np.any(self.prefill_fixed_s < 0):
            raise ConfigError("problem.prefill_fixed_s", f"must be ({d},) finite seconds >= 0")
        if self.backlog_prompt_tokens is None:
            mean_prompt = float(np.mean(self.prompt_tokens)) if r else 0.0
            self.backlog_prompt_tokens = self.queue_len * mean_prompt
        self.backlog_prompt_tokens = _arr(self.backlog_prompt_tokens, np.float64)
        if self.backlog_prompt_tokens.shape != (d,) or np.any(~np.isfinite(self.backlog_prompt_tokens)) \
                or np.any(self.backlog_prompt_tokens < 0):
            raise ConfigError("problem.backlog_prompt_tokens", f"must be ({d},) finite tokens >= 0")
        if self.decode_iteration_s is not None:
            self.decode_iteration_s = _arr(self.decode_iteration_s, np.float64)
            if self.decode_iteration_s.shape != (d,) or np.any(~np.isfinite(self.decode_iteration_s)):
                raise ConfigError("problem.decode_iteration_s", f"must be ({d},) finite seconds")
        self.network_s = _arr(self.network_s, np.float64).reshape(r, d) if r else np.zeros((0, d))
        self.allowed = _arr(self.allowed, bool).reshape(r, d) if r else np.zeros((0, d), bool)
        if self.slot is None:
            self.slot = np.full(r, -1, dtype=np.int64)
        for name in ("origin", "output_tokens", "waited_s", "slot"):
            if getattr(self, name).shape != (r,):
                raise ConfigError(f"problem.{name}", f"must have shape ({r},), got {getattr(self, name).shape}")
        for name in dc_float + ("n_engines", "busy_engines", "up"):
            if getattr(self, name).shape != (d,):
                raise ConfigError(f"problem.{name}", f"must have shape ({d},), got {getattr(self, name).shape}")
        for name in ("prompt_tokens", "output_tokens", "waited_s", "network_s", "carbon_g_per_kwh",
                     "free_kv_tokens", "est_queue_wait_s", "prefill_s_per_token", "tpot_now_s",
                     "tpot_idle_s", "tpot_slope_s_per_seq", "running", "queue_len"):
            a = getattr(self, name)
            if a.size and (not np.all(np.isfinite(a)) or np.any(a < 0)):
                raise ConfigError(f"problem.{name}", "must be finite and >= 0")
        if d < 1:
            raise ConfigError("problem.carbon_g_per_kwh", "needs at least one datacenter")
        self._check_sessions(r, d)
        if np.any(self.pue < 1.0):
            raise ConfigError("problem.pue", "must be >= 1")
        if np.any(self.n_engines < 1):
            raise ConfigError("problem.n_engines", "must be >= 1 per datacenter")
        if self.tp < 1:
            raise ConfigError("problem.tp", "must be >= 1")
        for name in POWER_FIELDS:  # a float (every datacenter the same GPU) or (D,) per datacenter
            v = getattr(self, name)
            if np.ndim(v) == 0:
                continue
            a = _arr(v, np.float64)
            if a.shape != (d,) or not np.all(np.isfinite(a)) or np.any(a < 0):
                raise ConfigError(f"problem.{name}", f"must be a float or ({d},) finite values >= 0 (one per datacenter)")
            setattr(self, name, a)
        if not (self.ttft_slo_s > 0 and self.tpot_slo_s > 0 and self.poll_s > 0):
            raise ConfigError("problem.slo", "ttft_slo_s, tpot_slo_s and poll_s must be > 0")

    def _check_sessions(self, r: int, d: int) -> None:
        """Validate ``cached_prompt_tokens`` ((R, D), 0 <= cached <= prompt) and ``session_dc``."""
        if self.cached_prompt_tokens is not None:
            c = _arr(self.cached_prompt_tokens, np.float64)
            c = c.reshape(r, d) if c.size == r * d else c
            if c.shape != (r, d) or not np.all(np.isfinite(c)) or np.any(c < 0) or np.any(c > self.prompt_tokens[:, None]):
                raise ConfigError("problem.cached_prompt_tokens", f"must be ({r}, {d}) tokens in [0, prompt_tokens]")
            self.cached_prompt_tokens = c
        if self.session_dc is not None:
            s = _arr(self.session_dc, np.int64)
            if s.shape != (r,) or np.any(s < -1) or np.any(s >= d):
                raise ConfigError("problem.session_dc", f"must be ({r},) datacenter indices or -1 (none)")
            self.session_dc = s

    # ------------------------------------------------------------------ sizes
    @property
    def n_requests(self) -> int:
        """R, pending requests."""
        return int(self.prompt_tokens.shape[0])

    @property
    def n_datacenters(self) -> int:
        """D, datacenters (``D`` is also the defer value of an assignment)."""
        return int(self.carbon_g_per_kwh.shape[0])

    @property
    def defer(self) -> int:
        """The assignment value meaning "defer to the next step" (= D)."""
        return self.n_datacenters

    # ------------------------------------------------------------------ physics helpers
    @property
    def grams_per_joule(self) -> np.ndarray:
        """(D,) gCO2eq per joule of IT energy: carbon x PUE / 3.6e6."""
        return self.carbon_g_per_kwh * self.pue / J_PER_KWH

    def decode_power_w(self, n: np.ndarray | float) -> np.ndarray:
        """Per-GPU decode power with ``n`` (real, >= 1) sequences, watts (``n`` (D,), or the power
        fields (D,), give (D,) per datacenter; a scalar ``n`` with float fields gives a 0-d array)."""
        n = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
        return self.decode_max_w - (self.decode_max_w - self.decode_min_w) * np.exp(-(n - 1.0) / self.decode_sat_seqs)

    def iteration_s(self, n: np.ndarray | float) -> np.ndarray:
        """Decode iteration time with ``n`` (>= 1) sequences per engine, per datacenter (D,), s."""
        n = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
        return self.tpot_idle_s + self.tpot_slope_s_per_seq * (n - 1.0)

    def engine_increment_j(self, n: np.ndarray | float) -> np.ndarray:
        """Engine energy above idle per decode iteration with ``n`` sequences, (D,) joules (0 at n=0)."""
        n = np.asarray(n, dtype=np.float64) * np.ones(self.n_datacenters)
        e = self.tp * (self.decode_power_w(n) - self.gpu_idle_w) * self.iteration_s(n)
        return np.where(n <= 0, 0.0, e)

    @property
    def prefill_tokens(self) -> np.ndarray:
        """(R, D) prompt tokens each request would prefill at each datacenter: prompt - cached
        (the prompt everywhere without ``cached_prompt_tokens``)."""
        if self.cached_prompt_tokens is None:
            return np.repeat(self.prompt_tokens[:, None], self.n_datacenters, axis=1)
        return self.prompt_tokens[:, None] - self.cached_prompt_tokens

    def prefill_tokens_of(self, r: int) -> np.ndarray | float:
        """Prefill tokens of request ``r``: (D,) with cached prefixes, else its prompt (a float)."""
        if self.cached_prompt_tokens is None:
            return self.prompt_tokens[r]
        return self.prompt_tokens[r] - self.cached_prompt_tokens[r]

    @property
    def prefill_s(self) -> np.ndarray:
        """(R, D) prefill latency of each request at each datacenter: fixed + prefill tokens x per-token, s."""
        return self.prefill_fixed_s[None, :] + self.prefill_compute_s

    @property
    def prefill_compute_s(self) -> np.ndarray:
        """(R, D) engine time the prefill of each request adds (prefill tokens x per-token), seconds."""
        if self.cached_prompt_tokens is None:
            return self.prompt_tokens[:, None] * self.prefill_s_per_token[None, :]
        return (self.prompt_tokens[:, None] - self.cached_prompt_tokens) * self.prefill_s_per_token[None, :]

    @property
    def batch_per_busy_engine(self) -> np.ndarray:
        """(D,) mean running sequences per busy engine (0 when no engine is busy)."""
        return np.where(self.busy_engines > 0, self.running / np.maximum(self.busy_engines, 1), 0.0)

    @property
    def tpot_base_s(self) -> np.ndarray:
        """(D,) per-token decode time of a 1-sequence batch under current conditions, seconds.

        The part of the simulator's estimate ``tpot_now_s`` that the batch size does not
        explain (e.g. prefill chunks mixed into decode iterations): ``tpot_now_s - slope (n - 1)``
        with ``n`` the current batch per busy engine, never below ``tpot_idle_s``.
        """
        n = np.maximum(self.batch_per_busy_engine, 1.0)
        return np.maximum(self.tpot_now_s - self.tpot_slope_s_per_seq * (n - 1.0), self.tpot_idle_s)

    @property
    def seqs_per_engine(self) -> np.ndarray:
        """(D,) most sequences per engine that keep TPOT within the SLO (<= max_seqs_per_engine).

        From ``tpot_base + slope (n - 1) <= tpot_slo``; 0 when even one sequence misses it.
        """
        slope = np.maximum(self.tpot_slope_s_per_seq, 1e-12)
        n = 1.0 + np.floor((self.tpot_slo_s - self.tpot_base_s) / slope + 1e-9)
        n = np.where(self.tpot_base_s > self.tpot_slo_s, 0.0, n)
        return np.clip(n, 0.0, float(self.max_seqs_per_engine))

    @property
    def decode_iter_s(self) -> np.ndarray:
        """(D,) decode iteration time of the current batch without prefill interference, s."""
        if self.decode_iteration_s is not None:
            return self.decode_iteration_s
        n = np.maximum(self.batch_per_busy_engine, 1.0)
        return np.minimum(self.tpot_idle_s + self.tpot_slope_s_per_seq * (n - 1.0), self.tpot_now_s)

    @property
    def prefill_share_now(self) -> np.ndarray:
        """(D,) share of iteration time prefill chunks take now, ``1 - decode_iter / tpot_now``."""
        return np.clip(1.0 - self.decode_iter_s / np.maximum(self.tpot_now_s, 1e-12), 0.0, 0.95)

    def prefill_rate_cap_tokens(self, max_share: float = 1.0) -> np.ndarray:
        """(D,) prompt tokens per polling period a datacenter can prefill while decoding within
        TPOT: the prefill share rho of iteration time stretches TPOT to ``t_dec / (1 - rho)``,
        so ``rho <= min(1 - t_dec / TPOT_slo, max_share)`` and tokens <= rho E poll_s / prefill_s_per_token."""
        rho_max = np.clip(np.minimum(1.0 - self.decode_iter_s / self.tpot_slo_s, max_share), 0.0, 1.0)
        return rho_max * self.n_engines * self.poll_s / np.maximum(self.prefill_s_per_token, 1e-12)

    @property
    def backlog_wait_s(self) -> np.ndarray:
        """(D,) wait a new prompt sees behind the datacenter's backlog spread over its engines:
        ``backlog_prompt_tokens x prefill_s_per_token / n_engines``, seconds."""
        return self.backlog_prompt_tokens * self.prefill_s_per_token / self.n_engines

    def lone_energy_j(self, tpot_s: np.ndarray | None = None) -> np.ndarray:
        """(R, D) energy above idle of serving each request alone on an engine, joules.

        ``tp [(prefill_w - idle_w) prefill_s + (P_dec(1) - idle_w) output_tokens tpot_s]``: the
        whole engine active-power increment over the request's service time (the
        independent-cost assumption of the per-request ILPs). ``tpot_s`` is (R, D) or (D,);
        default ``tpot_idle_s``.
        """
        tpot = self.tpot_idle_s if tpot_s is None else np.asarray(tpot_s, dtype=np.float64)
        pre = (self.gpu_prefill_w - self.gpu_idle_w) * self.prefill_compute_s
        dec = (self.decode_power_w(1.0) - self.gpu_idle_w) * self.output_tokens[:, None] * tpot
        return self.tp * (pre + dec)

    def subset(self, idx: np.ndarray) -> PlacementProblem:
        """The same step restricted to requests ``idx`` (datacenter state unchanged)."""
        idx = np.asarray(idx, dtype=np.int64)
        kw = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        for name in ("origin", "prompt_tokens", "output_tokens", "waited_s", "network_s", "allowed", "slot",
                     "cached_prompt_tokens", "session_dc"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)[idx]
        return PlacementProblem(**kw)

    def ttft_estimate_s(self, queue_wait_s: np.ndarray | None = None) -> np.ndarray:
        """(R, D) TTFT estimate: waited + network + queue wait (default the simulator's) + prefill."""
        q = self.est_queue_wait_s if queue_wait_s is None else queue_wait_s
        return self.waited_s[:, None] + self.network_s + q[None, :] + self.prefill_s


def synthetic_problem(
    rng: np.random.Generator,
    n_requests: int,
    n_datacenters: int = 16,
    n_regions: int = 4,
    load: float = 0.5,
    engines_per_dc: int = 32,
    tp: int = 1,
    waited_max_s: float = 1.0,
    down_fraction: float = 0.0,
) -> PlacementProblem:
    """A random but realistic step of the paper topology (A100, Llama-3.1-8B-like numbers).

    Args:
        rng: random generator (the only source of randomness).
        n_requests: R.
        n_datacenters, n_regions: topology size; datacenter ``d`` sits in region ``d % n_regions``.
        load: 0..1, how busy the datacenters are (busy engines, batch, queue wait).
        engines_per_dc: engines per datacenter.
        tp: GPUs per engine.
        waited_max_s: requests have waited uniformly in [0, waited_max_s).
        down_fraction: probability a datacenter is down.
    """
    r, d = int(n_requests), int(n_datacenters)
    dc_region = np.arange(d) % n_regions
    origin = rng.integers(0, n_regions, r)
    prompt = np.minimum(np.round(rng.lognormal(np.log(600), 0.9, r)), 8000).clip(4)
    output = np.minimum(np.round(rng.lognormal(np.log(180), 0.8, r)), 2000).clip(1)
    region_rtt = rng.uniform(0.08, 0.25, (n_regions, n_regions))
    region_rtt = 0.5 * (region_rtt + region_rtt.T)
    np.fill_diagonal(region_rtt, 0.01)
    net = region_rtt[origin][:, dc_region] + rng.uniform(0.0, 0.01, (r, d))
    up = rng.random(d) >= down_fraction
    if not up.any():
        up[0] = True
    allowed = np.broadcast_to(up, (r, d)).copy()
    n_eng = np.full(d, engines_per_dc)
    busy = np.minimum(n_eng, np.round(n_eng * np.clip(load * 2.0 * rng.uniform(0.3, 1.0, d), 0, 1))).astype(int)
    running = busy * np.round(load * rng.uniform(10, 200, d))
    queue = np.round(load * rng.uniform(0, 50, d) * (busy == n_eng))
    tpot_idle = np.full(d, 0.01226)
    slope = np.full(d, 1.0e-4)
    per_engine = np.where(busy > 0, running / np.maximum(busy, 1), 0.0)
    tpot_now = tpot_idle + slope * np.maximum(per_engine, 0.0) + load * rng.uniform(0, 0.03, d)
    kv_total = n_eng * 400_000.0
    free_kv = np.maximum(kv_total - running * 800.0, 0.0)
    return PlacementProblem(
        origin=origin, prompt_tokens=prompt, output_tokens=output,
        waited_s=rng.uniform(0, waited_max_s, r), network_s=net, allowed=allowed,
        carbon_g_per_kwh=rng.uniform(20, 750, d), pue=rng.uniform(1.05, 1.5, d), up=up,
        n_engines=n_eng, busy_engines=busy, running=running, queue_len=queue, free_kv_tokens=free_kv,
        est_queue_wait_s=load * rng.uniform(0.0, 0.8, d) * (busy == n_eng),
        prefill_s_per_token=np.full(d, 9.3e-5), tpot_now_s=tpot_now, tpot_idle_s=tpot_idle,
        tpot_slope_s_per_seq=slope, tp=tp,
    )
