"""Trained agents as :class:`carbon_gym.policy.Policy` objects the evaluation harness can run.

``LearnedPolicy.load(path)`` reads a checkpoint (:mod:`train.checkpoint`):

* a **set-policy checkpoint** (``.npz``, the pickle-free format that ``carbon-gym train export``
  and ``train imitate`` write; the shipped agent ``train/checkpoints/llama8b_set.npz``): JSON
  metadata and float32 tensors, read without unpickling anything. The shared pair network
  (:class:`train.set_policy.SetNetwork`) is re-bound to whatever env it is reset on, so one
  checkpoint runs on any topology size and slot count;
* an **SB3 .zip** from ``carbon-gym train`` (a ``MaskablePPO`` with the set policy, or a ``PPO`` on
  :class:`~carbon_gym.wrappers.RoutingWeightsWrapper`, whose per-datacenter weights are turned
  into the per-request action as the wrapper does): these hold pickled objects that can run code
  when loaded, so they are refused unless ``trust=True`` (``--trust-checkpoint``).

The set policy samples each request's datacenter from its scores by default (``mode="sample"``,
seeded by ``seed`` and reset with the episode, so runs are reproducible): requests with the same
features are then split across datacenters in proportion to their probabilities, as in training.
``mode="argmax"`` takes the best-scored choice for every request; ``mode="systematic"`` splits
each request class over the datacenters in proportion to its probabilities with one random
offset per class (floor or ceiling of every expected count; see :mod:`train.fast`).

Decisions of a class network run in numpy (``backend="auto"`` -> ``"numpy"``,
:class:`train.fast.NumpySetScorer`: the network's weights as numpy arrays, no torch call per
step, each request class scored once); a per-request network runs in torch (scoring n x D pairs
is faster there). ``backend="torch"`` runs the torch network (the reference; same logits).
Every step's logits are checked before a choice is made: NaN, inf or values at or below -5e7
(where an allowed choice could lose to a masked one; the weights' size did it, as they are
checked finite on load) raise a :class:`ConfigError` (field ``checkpoint``; see
:mod:`train.checkpoint`, "Large finite weights").

Names in the policy registry (:func:`train.register_policies`, factory
:func:`make_learned_policy`): ``"learned"`` (the shipped checkpoint,
``train/checkpoints/llama8b_set.npz``), ``"learned:<path>"`` or ``"ppo:<path>"``; keyword
``path=`` overrides the path, ``trust=True`` admits pickled SB3 zips.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError

from .checkpoint import (ENV_META_NAME, MODES, ON_MISMATCH, POLICY_META_NAME, SAFETY_KNOB_NAMES, check_checkpoint_env,
                         check_env_fingerprint, check_safety, checkpoint_env_meta, checkpoint_format, load_sb3_model, network_from_checkpoint, read_sb3_meta,
                         read_set_checkpoint, save_set_checkpoint, write_checkpoint_env, write_policy_meta)

__all__ = ["LearnedPolicy", "make_learned_policy", "export_checkpoint", "write_policy_meta",
           "SHIPPED_CHECKPOINT", "MODES", "BACKENDS", "POLICY_META_NAME", "ENV_META_NAME", "SAFETY_KNOB_NAMES",
           "checkpoint_env_meta", "write_checkpoint_env", "check_checkpoint_env"]

SHIPPED_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "llama8b_set.npz"
#: :data:`train.slot_dist.MASKED_LOGIT` (not imported: that module imports torch) and the lowest
#: logit a decision admits, half of it: below it an allowed choice could lose to a masked one.
_MASKED_LOGIT = -1e8
_LOGIT_FLOOR = _MASKED_LOGIT / 2
BACKENDS = ("auto", "numpy", "torch")


class LearnedPolicy:
    """A trained agent behind the ``Policy`` protocol (``act(observation, info)``).

    Args:
        model: a :class:`~train.set_policy.SetNetwork`, or an SB3 model (``MaskablePPO`` with the
            set policy, or ``PPO`` on routing weights).
        mode: ``"sample"`` (default), ``"argmax"`` or ``"systematic"`` (set policy only; routing
            PPO is deterministic; ``"systematic"`` needs the numpy backend).
        seed: seed of the sampling RNG, restarted at every :meth:`reset`.
        threads: torch intra-op threads used by ``act`` on the torch backend (1 keeps decision
            times comparable).
        backend: ``"auto"`` (default: ``"numpy"`` for a class network; ``"torch"`` for a
            per-request one, where scoring n x D pairs is faster in torch), ``"numpy"`` or
            ``"torch"`` for the set policy's decisions.
        load_price, headroom_penalty, headroom_margin: inference-time safety knobs (numpy
            backend only; a zero price / penalty is neutral: the network's own logits), see
            :data:`train.fast.SAFETY_KNOBS`: a larger ``headroom_penalty`` moves requests off
            datacenters where their estimated TTFT headroom is below ``headroom_margin`` (SLO
            units); a larger ``load_price`` moves them off datacenters proposed more requests per
            engine than average.
        trained_polling_period_s: the polling period (s) the network was trained at; None
            (default): the checkpoint fingerprint's ``polling_period_s`` where it records one (for
            the env's scenario, else its first training env), else the env's own. At :meth:`reset`
            every per-step request count the network reads (pending load, demand, load feedback) is
            multiplied by this over the env's polling period (``count_scale``): an agent trained at
            1 s reads a 0.1 s step's requests as those of a 1 s step, i.e. as a rate, instead of a
            tenth of its training load (its capacity head would power a tenth of the servers).
            Bit-identical where the two periods are equal.
        on_env_mismatch: what :meth:`reset` does when the env differs from the training envs a
            checkpoint's fingerprint records (:func:`train.checkpoint.check_env_fingerprint`:
            scenario, topology size, slots, forecast hours, capacity control, layout hash, code
            version): ``"warn"`` (default; once per distinct set of mismatches), ``"error"`` or
            ``"ignore"``. The mismatches of the last reset are in ``env_mismatches``.
    """

    def __init__(self, model: Any, *, mode: str = "sample", seed: int = 0, threads: int = 1, backend: str = "auto",
                 load_price: float = 0.0,
                 headroom_penalty: float = 0.0, headroom_margin: float = 0.0, on_env_mismatch: str = "warn",
                 trained_polling_period_s: float | None = None) -> None:
        import torch as th

        from .set_policy import SetActorCriticPolicy, SetNetwork

        if mode not in MODES:
            raise ConfigError("mode", f"unknown mode {mode!r}", allowed=list(MODES))
        if backend not in BACKENDS:
            raise ConfigError("backend", f"unknown backend {backend!r}", allowed=list(BACKENDS))
        if on_env_mismatch not in ON_MISMATCH:
            raise ConfigError("on_env_mismatch", f"unknown value {on_env_mismatch!r}", allowed=list(ON_MISMATCH))
        self.on_env_mismatch = on_env_mismatch
        if trained_polling_period_s is not None:
            v = trained_polling_period_s
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(float(v)) and float(v) > 0):
                raise ConfigError("trained_polling_period_s", f"must be None or a polling period > 0 seconds, got {v!r}")
        self.trained_polling_period_s = None if trained_polling_period_s is None else float(trained_polling_period_s)
        #: Per-step request counts times this (see ``trained_polling_period_s``); resolved at :meth:`reset`.
        self.count_scale = 1.0
        #: The checkpoint's training-env fingerprint (None: not recorded) and where it came from.
        self.fingerprint: list[dict[str, Any]] | None = None
        self.source = "policy"
        self.env_mismatches: list[str] = []
        self._warned: set[tuple[str, ...]] = set()
        self.mode = mode
        self.seed = int(seed)
        self.threads = int(threads)
        if isinstance(model, SetNetwork):
            self.model: Any = None
            net: Any = model
        else:
            self.model = model
            net = model.policy.net if isinstance(model.policy, SetActorCriticPolicy) else None
        self.kind = "set" if net is not None else "routing"
        if backend == "auto":
            backend = "numpy" if net is not None and net.classes is not None else "torch"
        if backend == "torch" and mode == "systematic":
            raise ConfigError("mode", "mode 'systematic' needs backend='numpy'", allowed=["sample", "argmax"])
        self.backend = backend
        self.safety = check_safety({"load_price": load_price, "headroom_penalty": headroom_penalty,
                                    "headroom_margin": headroom_margin})
        active = [k for k in ("headroom_penalty", "load_price") if self.safety[k]]
        if active and (self.kind != "set" or backend != "numpy"):
            raise ConfigError(
                active[0], f"safety knob {active[0]}={self.safety[active[0]]} (given, or recorded in the checkpoint) "
                f"needs a set policy on backend='numpy'; pass {active[0]}=0.0 for the network's own decisions",
                allowed=[0.0])
        if self.kind == "set":
            self.net = net
            self.net.eval()
            if backend == "numpy":
                from .fast import NumpySetScorer, choose, systematic_sorted

                self.scorer = NumpySetScorer(self.net)
                self._choose, self._systematic = choose, systematic_sorted  # (an import per step costs ~30 us)
                for k, v in self.safety.items():
                    setattr(self.scorer, k, v)
        self._gen = th.Generator().manual_seed(self.seed)
        self._rng = np.random.default_rng(self.seed)
        self._router: Any = None
        self._env: Any = None
        self._cap_every = 0  # steps between capacity decisions (0: no capacity action)
        self._step = 0

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, path: str | Path, *, trust: bool = False, **kwargs: Any) -> LearnedPolicy:
        """Load a checkpoint; ``kwargs`` as for the constructor. ``mode`` and the safety knobs
        default to those recorded in the checkpoint (SB3 zips without a record: the
        constructor's defaults, neutral knobs).

        A set-policy checkpoint (:mod:`train.checkpoint`) is read without unpickling anything.
        An SB3 ``.zip`` unpickles Python objects, which can run its author's code: it is refused
        with a :class:`ConfigError` (field ``trust``) unless ``trust=True``."""
        p = Path(path)
        if checkpoint_format(p) == "set":
            ck = read_set_checkpoint(p)
            check_checkpoint_env(ck.env, str(p))
            for k, v in ck.policy.items():
                kwargs.setdefault(k, v)
            pol = cls(network_from_checkpoint(ck), **kwargs)
            pol.fingerprint, pol.source = ck.fingerprint, str(p)
            return pol
        stored, pmeta, _ = read_sb3_meta(p)
        model = load_sb3_model(p, trust=trust)  # (refuses first unless trusted)
        check_checkpoint_env(stored, str(p))
        for k, v in pmeta.items():
            kwargs.setdefault(k, v)
        return cls(model, **kwargs)

    # ------------------------------------------------------------------ Policy protocol
    def reset(self, env: Any = None) -> None:
        """Bind to ``env`` (its layout; for routing PPO a fresh weights-to-requests router) and
        restart the sampling RNG."""
        self._gen.manual_seed(self.seed)
        self._rng = np.random.default_rng(self.seed)
        self._env = env
        if env is None:
            return
        if self.fingerprint:
            mism = check_env_fingerprint(self.fingerprint, env, self.source, on_mismatch="ignore")
            key = tuple(mism)
            if mism and self.on_env_mismatch != "ignore" and (self.on_env_mismatch == "error" or key not in self._warned):
                self._warned.add(key)
                check_env_fingerprint(self.fingerprint, env, self.source, on_mismatch=self.on_env_mismatch)
            self.env_mismatches = mism
        base = env.unwrapped
        self._step = 0
        self._cap_every = 0
        if self.kind == "set":
            self.net.bind(base.layout)
            self.count_scale = self._count_scale(base)
            self.net.count_scale = self.count_scale
            if self.backend == "numpy":
                self.scorer.bind(self.net.spec)
                self.scorer.count_scale = self.count_scale
            if getattr(self.net, "capacity_head", False) and bool(getattr(base.layout, "capacity_agent", False)):
                sc = base.scenario
                self._cap_every = max(int(round(float(sc.capacity.period_s) / float(sc.polling_period_s))), 1)
        else:
            from carbon_gym.wrappers import RoutingWeightsWrapper

            self._router = RoutingWeightsWrapper(base)

    def _count_scale(self, base: Any) -> float:
        """The training polling period (given, else the fingerprint's) over the env's; 1.0 when
        neither records one."""
        sc = getattr(base, "scenario", None)
        if sc is None:
            return 1.0
        trained = self.trained_polling_period_s
        if trained is None and self.fingerprint:
            same = [f for f in self.fingerprint if f.get("scenario") == str(sc.name)]
            trained = (same[0] if same else self.fingerprint[0]).get("polling_period_s")
        return 1.0 if trained is None else float(trained) / float(sc.polling_period_s)

    def act(self, observation: Any, info: dict[str, Any]) -> Any:
        """The per-request action (length K; D = defer) for this step; with a capacity head on an
        env with ``[capacity] control = "agent"``, at each capacity decision (the first step and
        every ``capacity.period_s``) the dict ``{"route", "capacity", "servers"}``: the head's
        most likely server count per datacenter (argmax, deterministic) with every engine of the
        powered servers awake."""
        route = self._act_route(observation, info)
        if not self._cap_every:
            return route
        decision = self._step % self._cap_every == 0
        self._step += 1
        if not decision:
            return route
        from .slot_dist import awake_engines

        servers = self.capacity_servers(observation)
        awake = awake_engines(servers, self.net.engines_per_node, np.asarray(self.net.spec["n_engines"], dtype=np.int64))
        return {"route": route, "capacity": awake, "servers": servers}

    def capacity_servers(self, observation: Any) -> np.ndarray:
        """(D,) servers to power per datacenter: the capacity head's argmax on this observation
        (numpy backend: reusing the embeddings of this step's routing decision)."""
        if self.backend == "numpy":
            logits = self.scorer.capacity_logits(observation["datacenters"], observation["globals"])
        else:
            import torch as th

            net = self.net
            with th.inference_mode():
                obs_t = {k: th.from_numpy(np.asarray(observation[k], dtype=np.float32))[None]
                         for k in ("datacenters", "slots", "globals")}
                logits = net.observation_capacity_scores(obs_t)[0].double().numpy()
        if not (np.isfinite(logits).all() and logits.max(axis=1).min() > _LOGIT_FLOOR):  # (masked entries: MASKED_LOGIT)
            raise self._bad_logits(logits, "capacity", "float64" if self.backend == "numpy" else "float32")
        return logits.argmax(axis=1).astype(np.int64)

    def _bad_logits(self, logits: np.ndarray, what: str, dtype: str) -> ConfigError:
        """The error for ``logits`` (of the ``what`` head, computed in ``dtype``) that hold NaN,
        inf or values at or below :data:`_LOGIT_FLOOR` (where an allowed choice could lose to a
        masked one): the weights are finite (checked on load), so their size did it."""
        n_nan, n_inf = int(np.isnan(logits).sum()), int(np.isinf(logits).sum())
        n_low = int(((logits <= _LOGIT_FLOOR) & (logits != _MASKED_LOGIT)).sum())
        return ConfigError("checkpoint", f"{self.source}: the network's {what} logits on this observation are unusable "
                           f"({n_nan} NaN, {n_inf} inf, {n_low} at or below {_LOGIT_FLOOR:g}, of {logits.size}; computed "
                           f"in {dtype}): its weights (finite, checked on load) or the safety knobs are too large; "
                           "nothing was decided")

    def _act_route(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        if self.kind == "set" and self.backend == "numpy":
            self.scorer._last_e = None  # (the capacity head reuses this step's embeddings only)
            return self._act_numpy(observation, info)
        import torch as th

        prev = th.get_num_threads()
        if prev != self.threads:
            th.set_num_threads(self.threads)
        try:
            if self.kind == "set":
                return self._act_set(observation, info)
            return self._act_routing(observation)
        finally:
            if prev != self.threads:
                th.set_num_threads(prev)

    def _mask(self, info: dict[str, Any]) -> np.ndarray:
        m = info.get("action_mask") if info else None
        if m is None:
            if self._env is None:
                raise ConfigError("info", "needs info['action_mask'] or a reset(env) first")
            D1 = int(self._env.unwrapped.layout.n_datacenters) + 1
            m = self._env.unwrapped.action_masks().reshape(-1, D1)
        return np.asarray(m, dtype=bool)

    def _bound_mask(self, info: dict[str, Any], model: Any) -> tuple[np.ndarray, int, int]:
        """The (K, D + 1) mask, K and D, checked against the sizes ``model`` (scorer or network) is bound to."""
        mask = self._mask(info)
        K, C = mask.shape
        D = C - 1
        if model.D != D or model.K != K:
            raise ConfigError(
                "observation", f"policy bound to D={model.D}, K={model.K} but the env has D={D}, K={K}: call reset(env) first"
            )
        return mask, K, D

    def _act_numpy(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        sc = self.scorer
        mask, K, D = self._bound_mask(info, sc)
        slots = np.asarray(observation["slots"], dtype=np.float32).reshape(K, sc.F_S)
        v = sc._s_valid
        n = _front_count(slots, v, info.get("pending") if info else None)
        if n >= 0:  # the env fills slots 0..n-1
            action = np.empty(K, dtype=np.int64)
            action[n:] = D
            if n == 0:
                return action
            rows, m, idx = slots[:n], mask[:n], slice(0, n)
        else:
            action = np.full(K, D, dtype=np.int64)
            idx = np.flatnonzero(slots[:, v] > 0.5)
            n = idx.shape[0]
            if n == 0:
                return action
            rows, m = slots[idx], mask[idx]
        # one mask row for all requests <=> each row equals the one before (a flat comparison)
        flat = m.reshape(-1)
        one_mask = self.mode == "systematic" and bool((flat[D + 1:] == flat[:-(D + 1)]).all())
        logits, inv, _, counts = sc.class_logits(observation["datacenters"], rows, observation["globals"], inverse=not one_mask)
        if not (logits.min() > _LOGIT_FLOOR and logits.max() < np.inf):  # (~2 us; NaN fails both; module docstring)
            raise self._bad_logits(logits, "routing", "float64")
        if one_mask:
            # per-class counts, written in class-sorted order (same choices as choose())
            pick = action[idx] if isinstance(idx, slice) else np.empty(n, dtype=np.int64)  # (a view of action, or not)
            pick[sc.last_order()] = self._systematic(logits, m[0], counts, self._rng)
            if not isinstance(idx, slice):
                action[idx] = pick
            return action
        rank = sc.last_ranks() if self.mode == "systematic" else None
        action[idx] = self._choose(logits, m, inv, self.mode, self._rng, rank)
        return action

    def _act_set(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        import torch as th

        net = self.net
        mask, K, D = self._bound_mask(info, net)
        valid_rows = np.asarray(observation["slots"]).reshape(K, -1)[:, net._s_valid] > 0.5
        n = int(valid_rows.sum())
        action = np.full(K, D, dtype=np.int64)
        if n == 0:
            return action
        idx = np.flatnonzero(valid_rows)
        contiguous = idx[-1] == n - 1
        F_S = net.F_S
        slots = np.asarray(observation["slots"], dtype=np.float32).reshape(K, F_S)
        slots = slots[:n] if contiguous else slots[idx]
        with th.inference_mode():
            obs_t = {
                "datacenters": th.from_numpy(np.asarray(observation["datacenters"], dtype=np.float32)).reshape(1, -1),
                "slots": th.from_numpy(np.ascontiguousarray(slots)).reshape(1, -1),
                "globals": th.from_numpy(np.asarray(observation["globals"], dtype=np.float32)).reshape(1, -1),
            }
            logits = net.scores(obs_t)[0]
            lo, hi = th.aminmax(logits)
            if not (float(lo) > _LOGIT_FLOOR and float(hi) < np.inf):
                raise self._bad_logits(logits.numpy(), "routing", "float32")
            m = th.from_numpy(mask[:n] if contiguous else mask[idx])
            logits = logits.masked_fill(~m, -1e8)
            if self.mode == "argmax":
                pick = logits.argmax(dim=-1)
            else:
                u = th.rand(logits.shape, generator=self._gen).clamp_(1e-12, 1.0 - 1e-7)
                pick = (logits - th.log(-th.log(u))).argmax(dim=-1)
        action[idx] = pick.numpy()
        return action

    def _act_routing(self, observation: Any) -> np.ndarray:
        if self._router is None:
            raise ConfigError("env", "the routing-weights agent needs reset(env) before act()")
        weights, _ = self.model.predict(observation, deterministic=True)
        return self._router.action(np.clip(np.asarray(weights, dtype=np.float64), 0.0, 1.0))


def _front_count(slots: np.ndarray, col: int, pending: Any) -> int:
    """The number n of valid slots (flag column ``col`` > 0.5) when they are slots 0..n-1, else -1.
    ``pending`` (the env's ``info["pending"]``, if given) is checked, not trusted: slots 0..n-1
    valid, slot n and the last slot not (the env fills slots from the front, so the slots in
    between are not read); without it, or if the check fails, all slots are scanned."""
    K = slots.shape[0]
    if isinstance(pending, (int, np.integer)) and pending >= 0:
        p = min(int(pending), K)  # (more pending than slots: all K hold one)
        if (p == K or not (slots[p, col] > 0.5 or slots[K - 1, col] > 0.5)) and bool((slots[:p, col] > 0.5).all()):
            return p
    valid = slots[:, col] > 0.5
    n = int(np.count_nonzero(valid))
    return n if bool(valid[:n].all()) else -1


#: Training-time state that a compact SB3 copy does not need (the last observations alone are
#: n_envs x K x F_S floats).
_EXPORT_EXCLUDE = ["_last_obs", "_last_original_obs", "_last_episode_starts", "ep_info_buffer", "ep_success_buffer"]


def export_checkpoint(src: str | Path, dst: str | Path, mode: str | None = None,
                      safety: dict[str, float] | None = None, *, trust: bool = False,
                      training: dict[str, Any] | None = None) -> Path:
    """Write the agent in ``src`` to ``dst`` for evaluation and sharing; returns ``dst``.

    A set policy is written in the pickle-free format (:func:`train.checkpoint.save_set_checkpoint`)
    whatever ``src`` is; a routing-weights PPO (no pickle-free format) as a compact SB3 copy
    without training-time state. The default choice ``mode`` and safety knobs recorded in ``src``
    are kept unless ``mode`` / ``safety`` (a dict of :data:`SAFETY_KNOB_NAMES` values) are given.
    ``trust`` admits an SB3 ``src`` (loading it unpickles objects). ``training`` records how the
    network was made; by default that of a set-policy ``src``, else the run's ``config.json``
    next to ``src`` if there is one."""
    pol = LearnedPolicy.load(src, trust=trust, **(safety or {}), **({"mode": mode} if mode else {}))
    out = Path(dst)
    if pol.kind == "set":
        if training is None:
            training = _training_record(Path(src))
        return save_set_checkpoint(out, pol.net, policy={"mode": pol.mode, **pol.safety}, training=training,
                                   fingerprint=pol.fingerprint)
    out.parent.mkdir(parents=True, exist_ok=True)
    pol.model.save(out, exclude=list(_EXPORT_EXCLUDE))
    write_checkpoint_env(out)
    write_policy_meta(out, {"mode": pol.mode, **{k: v for k, v in pol.safety.items() if v}})
    return out


def _training_record(src: Path) -> dict[str, Any]:
    """What is known of how the network in ``src`` was made: the record of a set-policy
    checkpoint, or the run's ``config.json`` beside an SB3 one."""
    if checkpoint_format(src) == "set":
        return dict(read_set_checkpoint(src).training)
    return run_config_record(src.parent / "config.json", exported_from=src.name)


def run_config_record(cfg: Path, exported_from: str) -> dict[str, Any]:
    """``{"exported_from", "config", "config_digest"}`` from a training run's ``config.json``
    (only ``exported_from`` when it is missing or unreadable)."""
    out: dict[str, Any] = {"exported_from": exported_from}
    if cfg.is_file():
        try:  # (carbon-gym train writes {"digest": ..., "config": ...})
            rec = json.loads(cfg.read_text())
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            out["config"] = rec.get("config", rec)
            if "digest" in rec:
                out["config_digest"] = rec["digest"]
    return out


def make_learned_policy(path: str | None = None, env: Any = None, *, trust: bool = False, **kwargs: Any) -> LearnedPolicy:
    """Registry factory of ``learned`` / ``learned:<path>`` / ``ppo:<path>`` (see
    :func:`train.register_policies`): the checkpoint at ``path`` (None: the shipped one),
    reset on ``env`` when given; ``trust=True`` admits pickled SB3 zips; ``kwargs`` as for
    :meth:`LearnedPolicy.load`."""
    import sys
    import time

    src = str(SHIPPED_CHECKPOINT) if path is None else path
    from .checkpoint import require_trust

    require_trust(src, trust)  # (a refused checkpoint is refused before any note)
    first = not _LOADED
    if first:  # say what the pause is: the first load in a process imports torch (1-3 s here)
        print(f"carbon-gym: note: loading the learned policy {src} (first load in this process: importing torch and "
              "building the network, a few seconds)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    policy = LearnedPolicy.load(src, trust=trust, **kwargs)
    if first:
        _LOADED.append(src)
        print(f"carbon-gym: note: learned policy loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    if env is not None:
        policy.reset(env)
    return policy


_LOADED: list[str] = []  # checkpoints loaded in this process (the first load announces itself)
