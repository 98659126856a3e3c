"""Trained agents as :class:`carbon_gym.policy.Policy` objects the evaluation harness can run.

``LearnedPolicy.load(path)`` reads a checkpoint written by ``carbon-gym train`` (an SB3 ``.zip``):

* a ``MaskablePPO`` with the set policy (:class:`train.set_policy.SetActorCriticPolicy`): the
  shared pair network is re-bound to whatever env it is reset on, so one checkpoint runs on any
  topology size and slot count;
* a ``PPO`` on :class:`~carbon_gym.wrappers.RoutingWeightsWrapper` (``MultiInputPolicy``): its
  per-datacenter weights are turned into the per-request action exactly as the wrapper does
  (the env must have the training env's spaces).

The set policy samples each request's datacenter from its scores by default (``mode="sample"``,
seeded by ``seed`` and reset with the episode, so runs are reproducible): requests with the same
features are then split across datacenters in proportion to their probabilities, as in training.
``mode="argmax"`` takes the best-scored choice for every request; ``mode="systematic"`` splits
each request class over the datacenters in proportion to its probabilities with one random
offset per class (floor or ceiling of every expected count; see :mod:`train.fast`).

Decisions of a class network run compiled when numba is installed (``backend="auto"`` ->
``"numba"``, :class:`train.fast_jit.JitSetScorer`: one compiled call per step, float64), else in
numpy (``"numpy"``, :class:`train.fast.NumpySetScorer`: the network's weights as numpy arrays, no
torch call per step, each request class scored once); a per-request network runs in torch
(scoring n x D pairs is faster there). ``backend="torch"`` runs the torch network (the
reference; same logits).

Names in the policy registry (:func:`train.register_policies`, factory
:func:`make_learned_policy`): ``"learned"`` (the shipped checkpoint,
``train/checkpoints/llama8b_set.zip``), ``"learned:<path>"`` or ``"ppo:<path>"``; keyword
``path=`` overrides the path.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError

from .fast import UniformStream

__all__ = ["LearnedPolicy", "make_learned_policy", "export_checkpoint", "write_policy_meta", "SHIPPED_CHECKPOINT", "MODES", "POLICY_META_NAME"]

SHIPPED_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "llama8b_set.zip"
MODES = ("sample", "argmax", "systematic")
BACKENDS = ("auto", "numba", "numpy", "torch")


class LearnedPolicy:
    """A trained SB3 agent behind the ``Policy`` protocol (``act(observation, info)``).

    Args:
        model: a loaded SB3 model (``MaskablePPO`` with the set policy, or ``PPO`` on routing weights).
        mode: ``"sample"`` (default), ``"argmax"`` or ``"systematic"`` (set policy only; routing
            PPO is deterministic; ``"systematic"`` needs the numba or numpy backend).
        seed: seed of the sampling RNG, restarted at every :meth:`reset`.
        threads: torch intra-op threads used by ``act`` (1 keeps decision times comparable).
        backend: ``"auto"`` (default: ``"numba"`` for a class network when numba is installed,
            else ``"numpy"``; ``"torch"`` for a per-request one, where scoring n x D pairs is
            faster in torch), ``"numba"`` (compiled, float64: the actions of ``"numpy"`` with
            ``dtype="float64"``), ``"numpy"`` or ``"torch"`` for the set policy's decisions.
        dtype: float type of the numpy path's pair layer (``"float32"``, default: ~1e-6 from the
            float64 logits, and faster; ``"float64"``: equal to the torch network to ~1e-15);
            the numba path is always float64.
        load_price, headroom_penalty, headroom_margin: inference-time safety knobs (numba or numpy
            backend only; a zero price / penalty is neutral: the network's own logits), see
            :data:`train.fast.SAFETY_KNOBS`: a larger ``headroom_penalty`` moves requests off
            datacenters where their estimated TTFT headroom is below ``headroom_margin`` (SLO
            units); a larger ``load_price`` moves them off datacenters proposed more requests per
            engine than average.
    """

    def __init__(self, model: Any, *, mode: str = "sample", seed: int = 0, threads: int = 1, backend: str = "auto",
                 dtype: str = "float32", load_price: float = 0.0,
                 headroom_penalty: float = 0.0, headroom_margin: float = 0.0) -> None:
        import torch as th

        from .set_policy import SetActorCriticPolicy

        if mode not in MODES:
            raise ConfigError("mode", f"unknown mode {mode!r}", allowed=list(MODES))
        if backend not in BACKENDS:
            raise ConfigError("backend", f"unknown backend {backend!r}", allowed=list(BACKENDS))
        self.model = model
        self.mode = mode
        self.seed = int(seed)
        self.threads = int(threads)
        self.kind = "set" if isinstance(model.policy, SetActorCriticPolicy) else "routing"
        if backend == "auto":
            if self.kind == "set" and model.policy.net.classes is not None:
                from .fast_jit import available

                backend = "numba" if available() else "numpy"
            else:
                backend = "torch"
        if backend == "torch" and mode == "systematic":
            raise ConfigError("mode", "mode 'systematic' needs backend='numpy' or 'numba'", allowed=["sample", "argmax"])
        self.backend = backend
        self.safety = _check_safety({"load_price": load_price, "headroom_penalty": headroom_penalty,
                                     "headroom_margin": headroom_margin})
        active = [k for k in ("headroom_penalty", "load_price") if self.safety[k]]
        if active and (self.kind != "set" or backend not in ("numpy", "numba")):
            raise ConfigError(
                active[0], f"safety knob {active[0]}={self.safety[active[0]]} (given, or recorded in the checkpoint) "
                f"needs a set policy on backend='numpy' or 'numba'; pass {active[0]}=0.0 for the network's own decisions",
                allowed=[0.0])
        if self.kind == "set":
            self.net = model.policy.net
            self.net.eval()
            self._train_layout = dict(self.net.spec)
            self.jit: Any = None
            if backend == "numba":
                from .fast_jit import JitSetScorer

                # compiled now (or loaded from numba's cache), not in the first decision; its
                # float64 reference scorer holds the knobs and is what ``scorer`` exposes
                self.jit = JitSetScorer(self.net)
                self.scorer = self.jit.ref
            elif backend == "numpy":
                from .fast import NumpySetScorer

                if dtype not in ("float32", "float64"):
                    raise ConfigError("dtype", f"unknown dtype {dtype!r}", allowed=["float32", "float64"])
                self.scorer = NumpySetScorer(self.net, dtype=np.dtype(dtype))
            if backend in ("numba", "numpy"):
                for k, v in self.safety.items():
                    setattr(self.scorer, k, v)
        self._gen = th.Generator().manual_seed(self.seed)
        self._rng = np.random.default_rng(self.seed)
        self._uniforms = UniformStream(self._rng)
        self._router: Any = None
        self._env: Any = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> "LearnedPolicy":
        """Load a checkpoint (``.zip`` from ``carbon-gym train``); ``kwargs`` as for the constructor.
        ``mode`` and the safety knobs default to those recorded in the checkpoint
        (:data:`POLICY_META_NAME`), if any (old checkpoints: neutral knobs)."""
        p = Path(path)
        if not p.exists():
            raise ConfigError("path", f"no checkpoint at {str(p)!r}")
        import zipfile

        try:
            with zipfile.ZipFile(p) as zf:
                data = zf.read("data").decode("utf-8", errors="replace")
                stored = json.loads(zf.read(ENV_META_NAME)) if ENV_META_NAME in zf.namelist() else None
                pmeta = json.loads(zf.read(POLICY_META_NAME)) if POLICY_META_NAME in zf.namelist() else {}
        except (zipfile.BadZipFile, KeyError, ValueError) as exc:
            raise ConfigError("path", f"{str(p)!r} is not a carbon-gym training checkpoint (an SB3 .zip): {exc}") from None
        check_checkpoint_env(stored, str(p))
        if "mode" in pmeta:  # the choice mode the checkpoint was selected with
            kwargs.setdefault("mode", str(pmeta["mode"]))
        for k in SAFETY_KNOB_NAMES:
            if k in pmeta:
                kwargs.setdefault(k, float(pmeta[k]))
        if "SetActorCriticPolicy" in data or "MaskableActorCriticPolicy" in data or "Maskable" in data:
            from sb3_contrib import MaskablePPO

            model = MaskablePPO.load(p, device="cpu")
        else:
            from stable_baselines3 import PPO

            model = PPO.load(p, device="cpu")
        return cls(model, **kwargs)

    # ------------------------------------------------------------------ Policy protocol
    def reset(self, env: Any = None) -> None:
        """Bind to ``env`` (its layout; for routing PPO a fresh weights-to-requests router) and
        restart the sampling RNG."""
        self._gen.manual_seed(self.seed)
        self._rng = np.random.default_rng(self.seed)
        self._uniforms = UniformStream(self._rng)
        self._env = env
        if env is None:
            return
        base = env.unwrapped
        if self.kind == "set":
            self.net.bind(base.layout)
            if self.backend == "numba":
                self.jit.bind(self.net.spec)
            elif self.backend == "numpy":
                self.scorer.bind(self.net.spec)
        else:
            from carbon_gym.wrappers import RoutingWeightsWrapper

            self._router = RoutingWeightsWrapper(base)

    def act(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        """The per-request action (length K; D = defer) for this step."""
        if self.kind == "set" and self.backend == "numba":
            return self._act_numba(observation, info)
        if self.kind == "set" and self.backend == "numpy":
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
        from .fast import choose, systematic_sorted

        sc = self.scorer
        mask, K, D = self._bound_mask(info, sc)
        slots = np.asarray(observation["slots"]).reshape(K, sc.F_S)
        valid = slots[:, sc._s_valid] > 0.5
        n = int(np.count_nonzero(valid))
        action = np.full(K, D, dtype=np.int64)
        if n == 0:
            return action
        if valid[:n].all():  # the env fills slots from the front
            rows, m, idx = slots[:n], mask[:n], slice(0, n)
        else:
            idx = np.flatnonzero(valid)
            rows, m = slots[idx], mask[idx]
        one_mask = self.mode == "systematic" and bool((m == m[0]).all())
        logits, inv, _, counts = sc.class_logits(observation["datacenters"], rows, observation["globals"], inverse=not one_mask)
        if one_mask:
            # per-class counts, written in class-sorted order (same choices as choose())
            pick = np.empty(n, dtype=np.int64)
            pick[sc.last_order()] = systematic_sorted(logits, m[0], counts, self._rng)
            action[idx] = pick
            return action
        rank = sc.last_ranks() if self.mode == "systematic" else None
        action[idx] = choose(logits, m, inv, self.mode, self._rng, rank)
        return action

    def _act_numba(self, observation: Any, info: dict[str, Any]) -> np.ndarray:
        jit = self.jit
        mask = info.get("action_mask") if info else None
        if mask is None:
            mask = self._bound_mask(info, jit)[0]
        # the env fills slots 0..pending-1 (checked), so the empty slots need not be scanned
        pending = info.get("pending", -1) if info else -1
        n_hint = min(int(pending), jit.K) if isinstance(pending, (int, np.integer)) and pending >= 0 else -1
        # (decide checks and, if need be, converts the arrays: each is looked at once per step)
        status, n, action = jit.decide(observation["slots"], mask, observation["datacenters"], observation["globals"],
                                       n_hint, self.mode == "systematic", self._uniforms)
        if status == 0:  # the usual step: decided in the one compiled call
            return action
        # per-request masks, another mode (status 1: the valid slots are 0..n-1), or valid slots
        # elsewhere (status 2): the compiled logits, then the choice
        K, D = jit.K, jit.D
        action.fill(D)
        mask = np.asarray(mask, dtype=bool)
        rows = np.ascontiguousarray(observation["slots"], dtype=np.float32).reshape(K, jit.F_S)  # (no copy if it is one)
        if status == 1:
            idx: Any = slice(0, n)
        else:
            idx = np.flatnonzero(rows[:, jit.ref._s_valid] > 0.5)
            n = idx.shape[0]
        if n == 0:
            return action
        m = mask[idx]
        logits, order, starts, counts = jit.class_logits(observation["datacenters"], rows[idx], observation["globals"])
        if self.mode == "systematic" and bool((m == m[0]).all()):
            action[idx] = jit.systematic(logits, m[0], counts, order, self._uniforms)
            return action
        inv = np.empty(n, dtype=np.intp)
        inv[order] = np.repeat(np.arange(counts.shape[0]), counts)
        # the numpy choice on the compiled logits
        from .fast import choose

        rank = None
        if self.mode == "systematic":
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n) - np.repeat(starts, counts)
        action[idx] = choose(logits, m, inv, self.mode, self._uniforms, rank)
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


#: Training-time state that a shipped checkpoint does not need (the last observations alone are
#: n_envs x K x F_S floats).
_EXPORT_EXCLUDE = ["_last_obs", "_last_original_obs", "_last_episode_starts", "ep_info_buffer", "ep_success_buffer"]


def export_checkpoint(src: str | Path, dst: str | Path, mode: str | None = None,
                      safety: dict[str, float] | None = None) -> Path:
    """Copy a training checkpoint to ``dst`` without its training-time state (smaller; loads
    with :meth:`LearnedPolicy.load` and SB3's ``load`` alike). The default choice ``mode`` and
    safety knobs recorded in ``src`` are kept unless ``mode`` / ``safety`` (a dict of
    :data:`SAFETY_KNOB_NAMES` values) are given. Returns ``dst``."""
    pol = LearnedPolicy.load(src, **(safety or {}))
    out = Path(dst)
    out.parent.mkdir(parents=True, exist_ok=True)
    pol.model.save(out, exclude=list(_EXPORT_EXCLUDE))
    write_checkpoint_env(out)
    import zipfile

    with zipfile.ZipFile(src) as zf:
        had = POLICY_META_NAME in zf.namelist()
    if mode is not None or had or any(pol.safety.values()):
        meta: dict[str, Any] = {"mode": mode or pol.mode}
        meta.update({k: v for k, v in pol.safety.items() if v})
        write_policy_meta(out, meta)
    return out


#: Safety knobs a checkpoint may record (:data:`train.fast.SAFETY_KNOBS`; kept here so that
#: reading the metadata does not import the numpy scorer).
SAFETY_KNOB_NAMES = ("load_price", "headroom_penalty", "headroom_margin")


def _check_safety(knobs: dict[str, Any]) -> dict[str, float]:
    """The knobs as floats; :class:`ConfigError` naming the knob if one is not finite, or negative
    (``headroom_margin``, a threshold, may be negative)."""
    out = {}
    for k, v in knobs.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ConfigError(k, f"must be a number, got {v!r}") from None
        if not np.isfinite(f) or (f < 0.0 and k != "headroom_margin"):
            raise ConfigError(k, f"must be finite{'' if k == 'headroom_margin' else ' and >= 0 (0 = neutral)'}, got {v!r}")
        out[k] = f
    return out


#: Name of the file inside a checkpoint .zip that records how the policy acts by default.
POLICY_META_NAME = "carbon_gym_policy.json"


def write_policy_meta(path: str | Path, meta: dict[str, Any]) -> None:
    """Record ``meta`` (``{"mode": ..., <safety knob>: ...}``: the default choice mode and safety
    knobs, :data:`SAFETY_KNOB_NAMES`; an absent knob is neutral) inside the checkpoint .zip."""
    import zipfile

    if "mode" in meta and meta["mode"] not in MODES:
        raise ConfigError("mode", f"unknown mode {meta['mode']!r}", allowed=list(MODES))
    unknown = sorted(set(meta) - {"mode", *SAFETY_KNOB_NAMES})
    if unknown:
        raise ConfigError("policy meta", f"unknown keys {unknown}", allowed=["mode", *SAFETY_KNOB_NAMES])
    _check_safety({k: meta[k] for k in SAFETY_KNOB_NAMES if k in meta})
    with zipfile.ZipFile(path, "a") as zf:
        if POLICY_META_NAME in zf.namelist():
            raise ConfigError("checkpoint", f"{path} already records its policy settings")
        zf.writestr(POLICY_META_NAME, json.dumps(meta, sort_keys=True))


#: Name of the file inside a checkpoint .zip that records the env it was trained for.
ENV_META_NAME = "carbon_gym_env.json"


def checkpoint_env_meta() -> dict[str, Any]:
    """What a set-policy checkpoint depends on in the env, independent of topology size: the env
    version and the fixed observation scales (the policy binds to column names, not indices)."""
    from carbon_gym import env as cg_env

    return {
        "env_version": cg_env.ENV_VERSION,
        "scales": {
            "carbon_g_per_kwh": cg_env.CARBON_SCALE_G_PER_KWH, "tokens": cg_env.TOKENS_SCALE,
            "queue_per_engine": cg_env.QUEUE_PER_ENGINE_SCALE, "prefill_ref_tokens": cg_env.PREFILL_REF_TOKENS,
            "tpot_slope_ref_seqs": cg_env.TPOT_SLOPE_REF_SEQS,
        },
    }


def write_checkpoint_env(path: str | Path) -> None:
    """Record :func:`checkpoint_env_meta` inside the checkpoint .zip at ``path``."""
    import zipfile

    with zipfile.ZipFile(path, "a") as zf:
        if ENV_META_NAME not in zf.namelist():
            zf.writestr(ENV_META_NAME, json.dumps(checkpoint_env_meta(), sort_keys=True))


def check_checkpoint_env(stored: dict[str, Any] | None, source: str) -> None:
    """Raise :class:`ConfigError` naming what differs if a checkpoint was made for another env
    version or other observation scales; warn if the checkpoint records no env at all."""
    if stored is None:
        warnings.warn(f"{source}: checkpoint records no carbon_gym env version; assuming it matches", stacklevel=3)
        return
    current = checkpoint_env_meta()
    diffs = [f"{k}: checkpoint {stored.get(k)!r}, this env {v!r}" for k, v in current.items() if stored.get(k) != v]
    if diffs:
        raise ConfigError("checkpoint", f"{source} was trained for another env: " + "; ".join(diffs) + " (retrain or use a matching carbon_gym)")


def make_learned_policy(path: str | None = None, env: Any = None, **kwargs: Any) -> LearnedPolicy:
    """Registry factory of ``learned`` / ``learned:<path>`` / ``ppo:<path>`` (see
    :func:`train.register_policies`): the checkpoint at ``path`` (None: the shipped one),
    reset on ``env`` when given; ``kwargs`` as for :meth:`LearnedPolicy.load`."""
    policy = LearnedPolicy.load(str(SHIPPED_CHECKPOINT) if path is None else path, **kwargs)
    if env is not None:
        policy.reset(env)
    return policy
