"""The clairvoyant heuristic: a policy that knows the episode's future (not a bound: the true
lower bound on carbon is :mod:`eval.bound`; some policies beat this packing).

:class:`ClairvoyantPolicy` is registered in the policy registry as ``clairvoyant`` (not part of
``--policies all``) by :func:`register_policies`, this package's entry point in the
``carbon_gym.policies`` group.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ClairvoyantPolicy", "register_policies"]


class ClairvoyantPolicy:
    """Clairvoyant greedy: the cleanest capacity filled first, SLOs ignored (experiment f).

    Knows what no real scheduler can: every request's true output length and the whole episode's
    arrivals (a twin of the env's workload, built from the same scenario and world seed) and the
    actual carbon trace ahead. It acts through ``env.step`` like every policy, so the simulator
    charges it the same physics, idle and host power included (power no routing can avoid).

    Capacity (from the simulator's throughput): each engine serves the per-engine rate measured
    with the simulator in ``carbon_gym/data/load_levels.toml`` (requests/s at the scenario's
    lengths) times ``utilisation``; a request costs ``w / mean(w)`` of a mean request, with
    ``w = prompt x t_prefill_per_token + output x t_iter(B) / B`` from the latency model at a
    saturated batch ``B = min(max_num_seqs, KV tokens x kv_fill / mean(prompt + output))``. When
    no measured rate exists, the capacity is the latency model's ``1 / mean(w)`` alone.
    Every step, requests (longest first) go to the datacenter with the lowest
    ``intensity x PUE`` over the next polling period whose backlog still fits in
    ``horizon_steps`` polling periods of its capacity; when every datacenter is full, to the
    least-backlogged one. Backlogs drain at capacity between steps (a fluid model).

    It is a *bound* in spirit, not a proof: a latency-ignorant packing of the cleanest capacity
    with perfect information. Reductions are reported as a share of its reduction; a share above
    100% means a policy found savings this packing misses.

    Args:
        utilisation: multiple of the measured per-engine capacity the packing may use (> 0).
        kv_fill: share of an engine's KV cache the saturated batch may occupy.
        horizon_steps: backlog allowed per datacenter, in polling periods of its capacity.
    """

    def __init__(self, utilisation: float = 1.0, kv_fill: float = 0.9, horizon_steps: float = 2.0):
        from carbon_gym.errors import ConfigError

        for name, v, hi in (("utilisation", utilisation, 10.0), ("kv_fill", kv_fill, 1.0), ("horizon_steps", horizon_steps, 1e6)):
            if not (0 < float(v) <= hi):
                raise ConfigError(f"clairvoyant.{name}", f"must be in (0, {hi:g}], got {v!r}")
        self.utilisation = float(utilisation)
        self.kv_fill = float(kv_fill)
        self.horizon_steps = float(horizon_steps)
        self._env = None
        self.mismatches = 0  # pending requests whose twin lengths did not match (predicted used)

    def reset(self, env: Any) -> None:
        """Build the workload twin and the capacity model for this episode."""
        from carbon_gym.world import build_workload

        u = env.unwrapped
        self._env = u
        sc = u.scenario
        sim = u.simulator
        seed = int(u.episode_metrics()["world_seed"])
        twin = build_workload(sc, seed).arrivals_between(0.0, float(sc.duration_s))
        self._prompt = np.asarray(twin.prompt_tokens, dtype=np.int64)
        self._output = np.asarray(twin.output_tokens, dtype=np.int64)
        cfg = sim.engine_config
        mean_p = float(self._prompt.mean()) if self._prompt.size else 512.0
        mean_o = float(self._output.mean()) if self._output.size else 128.0
        from carbon_gym.scenario import load_load_levels

        levels = load_load_levels()
        # per GPU type (each datacenter's own: latency model, KV capacity, measured rate)
        topo = sim.topology
        gpu_of = [topo.datacenter_gpu(d) for d in range(topo.n_datacenters)]
        models = dict(zip(gpu_of, u.world_parts.datacenter_gpus()))
        first = {g: gpu_of.index(g) for g in models}
        per_gpu: dict[str, tuple[int, float, float, float, float, str]] = {}
        for g, m in models.items():
            kv_tokens = float(sim.datacenters[first[g]].engines[0].total_blocks * cfg.block_tokens)
            batch = int(max(1, min(cfg.max_num_seqs, math.floor(kv_tokens * self.kv_fill / max(mean_p + mean_o, 1.0)))))
            ctx = mean_p + mean_o / 2.0
            lat = m.latency
            t_iter = float(lat.iteration_time_s(0, 0.0, batch, batch * ctx, batch))
            chunk = int(cfg.max_num_batched_tokens)
            p_tok = max(1, int(round(mean_p)))
            t_prefill = float(lat.prefill_time_s(p_tok, chunk)) / p_tok
            w = self._prompt.astype(np.float64) * t_prefill + self._output.astype(np.float64) * (t_iter / batch)
            mean_w = float(w.mean()) if w.size else 1.0
            cap = levels.find(sc.model, g, sc.tp)  # None: not measured, the latency model's
            rate = cap.per_engine_rate_per_s if cap is not None else None
            # engine capacity in "mean requests" per second; a request costs w / mean(w) of them
            engine_rate = float(rate) if rate else 1.0 / mean_w
            per_gpu[g] = (batch, t_iter / batch, t_prefill, engine_rate, 1.0 / (mean_w * engine_rate),
                          "measured (load_levels.toml)" if rate else "latency model")
        cols = [per_gpu[g] for g in gpu_of]
        main = per_gpu[gpu_of[0]]
        self.batch = main[0]  # (the first datacenter's; per datacenter in the arrays below)
        self.t_decode_per_token_s = np.array([c[1] for c in cols])
        self.t_prefill_per_token_s = np.array([c[2] for c in cols])
        self.engine_rate_per_s = np.array([c[3] for c in cols])
        self.capacity_source = main[5] if len(per_gpu) == 1 else ", ".join(f"{g}: {c[5]}" for g, c in per_gpu.items())
        self._work_scale = np.array([c[4] for c in cols])  # engine-seconds per work-second, per datacenter
        snap = sim.snapshot()
        self._n_engines = np.asarray(snap.n_engines, dtype=np.float64)
        self._pue = np.asarray(snap.pue, dtype=np.float64)
        trace = sim.carbon
        self._trace = trace
        self._zones = np.array([trace.zone_index(d.zone) for d in sim.topology.datacenters], dtype=np.int64)
        self._offset = float(sim.carbon_offset_s)
        self._P = float(sc.polling_period_s)
        self._backlog = np.zeros(self._n_engines.size)
        self._last_t = float(sim.now_s)

    def _work_s(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """(n, D) latency-model engine-seconds of each request at the saturated batch on each
        datacenter's GPU."""
        return prompt[:, None] * self.t_prefill_per_token_s[None, :] + output[:, None] * self.t_decode_per_token_s[None, :]

    def act(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        """Per-slot datacenter (or defer for padded slots / nothing allowed)."""
        u = self._env
        if u is None:
            raise RuntimeError("ClairvoyantPolicy.reset(env) must be called after env.reset")
        mask = np.asarray(info["action_mask"], dtype=bool)
        k, choices = mask.shape
        D = choices - 1
        action = np.full(k, D, dtype=np.int64)
        pend = u.pending_requests()
        n = int(pend["seq"].shape[0])
        now = float(u.simulator.now_s)
        cap_rate = self._n_engines * self.utilisation  # engine-seconds per second
        self._backlog = np.maximum(0.0, self._backlog - cap_rate * max(0.0, now - self._last_t))
        self._last_t = now
        if n == 0:
            return action
        seq = pend["seq"]
        prompt = pend["prompt_tokens"].astype(np.int64)
        ok = (seq < self._prompt.size)
        ok[ok] &= self._prompt[seq[ok]] == prompt[ok]
        self.mismatches += int(n - np.count_nonzero(ok))
        output = np.where(ok, self._output[np.minimum(seq, max(self._prompt.size - 1, 0))] if self._prompt.size else 0, np.rint(pend["predicted_output_tokens"])).astype(np.float64)
        work = self._work_s(prompt.astype(np.float64), output) * self._work_scale[None, :]
        t0 = self._offset + now
        ci = np.array([self._trace.mean_intensity(int(z), t0, t0 + self._P) for z in self._zones]) * self._pue
        order = np.argsort(ci, kind="stable")
        limit = cap_rate * self._P * self.horizon_steps
        allowed = mask[:n, :D]
        for i in np.argsort(-work.max(axis=1), kind="stable"):
            row = allowed[i]
            if not row.any():
                continue
            pick = -1
            for d in order:
                if row[d] and self._backlog[d] + work[i, d] <= limit[d]:
                    pick = int(d)
                    break
            if pick < 0:  # every allowed datacenter is full: least relative backlog
                rel = np.where(row, self._backlog / np.maximum(limit, 1e-12), np.inf)
                pick = int(np.argmin(rel))
            action[i] = pick
            self._backlog[pick] += work[i, pick]
        return action


def _clairvoyant(env: Any = None, **kwargs: Any) -> ClairvoyantPolicy:
    return ClairvoyantPolicy(**kwargs)


def register_policies() -> None:
    """Register ``clairvoyant`` in :mod:`carbon_gym.registry` (idempotent)."""
    from carbon_gym.registry import register_policy

    register_policy("clairvoyant", _clairvoyant, in_all=False, replace=True,
                    doc="bound: true lengths, all arrivals and carbon known, SLOs ignored (experiment f)")
