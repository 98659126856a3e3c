"""The pickle-free resumption state of a training run (what ``carbon-gym train --resume`` reads).

A stable-baselines3 ``.zip`` (and VecNormalize's ``.pkl``) unpickles Python objects when loaded,
so a run folder someone else handed over could run their code on ``--resume``. Each checkpoint
of a run therefore also writes ``checkpoints/step_<t>.state.npz``: a zip of ``numpy`` arrays
(read with ``allow_pickle=False`` only) holding

* ``meta.json`` (a uint8 array of UTF-8 JSON): ``format`` / ``format_version``, the model's
  counters (``num_timesteps``, ``n_updates``, ``episode_num``), the episode-info and success buffers,
  the optimizer's hyperparameters (``param_groups``, without the parameters), the VecNormalize
  statistics' presence;
* ``policy/<name>``: every tensor of the policy's ``state_dict``;
* ``optim/<i>/<name>``: the optimizer's per-parameter state (Adam's ``step``, ``exp_avg``,
  ``exp_avg_sq``);
* ``vecnorm/ret_mean``, ``vecnorm/ret_var``, ``vecnorm/ret_count``: VecNormalize's return
  statistics (when the run normalises rewards).

Resuming builds the model afresh from the run's validated config (:func:`train.runner.build_model`)
and copies these arrays in: nothing in the run folder is unpickled.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from carbon_gym.errors import ConfigError

__all__ = ["STATE_FORMAT", "STATE_FORMAT_VERSION", "state_path_for", "save_resume_state", "load_resume_state"]

#: ``format`` / ``format_version`` recorded in ``meta.json``.
STATE_FORMAT = "carbon-gym/resume-state"
STATE_FORMAT_VERSION = 1
_COUNTERS = ("num_timesteps", "n_updates", "episode_num")


def state_path_for(zip_path: str | Path) -> Path:
    """``step_<t>.state.npz`` next to the SB3 ``step_<t>.zip``."""
    p = Path(zip_path)
    return p.with_name(p.name[: -len(".zip")] + ".state.npz" if p.name.endswith(".zip") else p.name + ".state.npz")


def save_resume_state(path: str | Path, model: Any, vecnorm: Any = None) -> Path:
    """Write ``model``'s resumption state (policy and optimizer tensors, counters) and, if given,
    the VecNormalize ``vecnorm``'s return statistics to ``path`` (via a temporary name, renamed
    when complete)."""
    arrays: dict[str, np.ndarray] = {}
    for name, t in model.policy.state_dict().items():
        arrays[f"policy/{name}"] = t.detach().cpu().numpy()
    opt = model.policy.optimizer.state_dict()
    for idx, st in opt["state"].items():
        for name, t in st.items():
            arrays[f"optim/{int(idx)}/{name}"] = np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t)
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in opt["param_groups"]]
    if vecnorm is not None:
        arrays["vecnorm/ret_mean"] = np.asarray(vecnorm.ret_rms.mean, dtype=np.float64)
        arrays["vecnorm/ret_var"] = np.asarray(vecnorm.ret_rms.var, dtype=np.float64)
        arrays["vecnorm/ret_count"] = np.asarray(vecnorm.ret_rms.count, dtype=np.float64)
    episodes = [{k: float(v) for k, v in e.items() if isinstance(v, (int, float))} for e in (model.ep_info_buffer or [])]
    meta = {
        "format": STATE_FORMAT, "format_version": STATE_FORMAT_VERSION,
        "num_timesteps": int(model.num_timesteps), "n_updates": int(model._n_updates),
        "episode_num": int(model._episode_num), "ep_info_buffer": episodes,
        "ep_success_buffer": [bool(x) for x in (model.ep_success_buffer or [])], "param_groups": groups,
        "vecnormalize": vecnorm is not None,
    }
    arrays["meta.json"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    dst = Path(path)
    tmp = dst.with_name(dst.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(tmp, dst)
    return dst


def _read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    src = str(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ConfigError("resume", f"{src!r} is not a carbon-gym resumption state (pickle-free .state.npz): {exc}") from None
    raw = arrays.pop("meta.json", None)
    try:
        meta = json.loads(bytes(np.asarray(raw, dtype=np.uint8)).decode()) if raw is not None else None
    except (ValueError, TypeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != STATE_FORMAT:
        raise ConfigError("resume", f"{src!r}: no readable meta.json of format {STATE_FORMAT!r}", allowed=[STATE_FORMAT])
    if meta.get("format_version") != STATE_FORMAT_VERSION:
        raise ConfigError("resume", f"{src!r}: format_version {meta.get('format_version')!r} is not supported",
                          allowed=[STATE_FORMAT_VERSION])
    for key in _COUNTERS:
        v = meta.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**53:
            raise ConfigError("resume", f"{src!r}: meta.json {key} = {v!r} is not an integer in [0, 2**53)")
    for k, a in arrays.items():
        if a.dtype.kind not in "fiub" or not np.all(np.isfinite(a)):
            raise ConfigError("resume", f"{src!r}: member {k!r} is not a finite numeric array")
    return meta, arrays


def load_resume_state(path: str | Path, model: Any, vecnorm: Any = None) -> dict[str, Any]:
    """Copy the resumption state at ``path`` into the freshly built ``model`` (and ``vecnorm``).

    :class:`ConfigError` (field ``resume``) naming the file if it is not a resumption state of this
    format, or if its tensors do not fit the model the config builds (names, shapes). Returns the
    file's ``meta.json``."""
    import torch as th

    p = Path(path)
    meta, arrays = _read(p)
    src = str(p)
    policy = {k[len("policy/"):]: th.from_numpy(np.array(v)) for k, v in arrays.items() if k.startswith("policy/")}
    mine = model.policy.state_dict()
    if set(policy) != set(mine) or any(tuple(policy[k].shape) != tuple(mine[k].shape) for k in mine):
        extra, missing = sorted(set(policy) - set(mine)), sorted(set(mine) - set(policy))
        shapes = [k for k in mine if k in policy and tuple(policy[k].shape) != tuple(mine[k].shape)]
        raise ConfigError("resume", f"{src!r}: its policy tensors do not fit the config's model (unknown {extra[:3]}, "
                          f"missing {missing[:3]}, other shapes {shapes[:3]})")
    model.policy.load_state_dict({k: policy[k].to(mine[k].dtype) for k in mine})
    state: dict[int, dict[str, Any]] = {}
    for k, v in arrays.items():
        if k.startswith("optim/"):
            _, idx, name = k.split("/", 2)
            state.setdefault(int(idx), {})[name] = th.from_numpy(np.array(v))
    groups = meta.get("param_groups")
    fresh = model.policy.optimizer.state_dict()
    if not isinstance(groups, list) or len(groups) != len(fresh["param_groups"]):
        raise ConfigError("resume", f"{src!r}: param_groups do not match the config's optimizer")
    merged = []
    for g, f in zip(groups, fresh["param_groups"]):
        if not isinstance(g, dict) or list(g.get("params", [])) != list(f["params"]):
            raise ConfigError("resume", f"{src!r}: param_groups do not match the config's optimizer")
        merged.append({**f, **{k: (tuple(v) if k == "betas" else v) for k, v in g.items() if k in f}})
    try:
        model.policy.optimizer.load_state_dict({"state": state, "param_groups": merged})
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ConfigError("resume", f"{src!r}: optimizer state does not fit the config's optimizer: {exc}") from None
    model.num_timesteps = int(meta["num_timesteps"])
    model._n_updates = int(meta["n_updates"])
    model._episode_num = int(meta["episode_num"])
    from collections import deque

    model.ep_info_buffer = deque(meta.get("ep_info_buffer") or [], maxlen=model._stats_window_size)
    model.ep_success_buffer = deque(meta.get("ep_success_buffer") or [], maxlen=model._stats_window_size)
    if vecnorm is not None:
        if not meta.get("vecnormalize") or "vecnorm/ret_var" not in arrays:
            raise ConfigError("vec_normalize", f"{src!r} has no VecNormalize statistics but the config uses them")
        vecnorm.ret_rms.mean = np.float64(arrays["vecnorm/ret_mean"])
        vecnorm.ret_rms.var = np.float64(arrays["vecnorm/ret_var"])
        vecnorm.ret_rms.count = float(arrays["vecnorm/ret_count"])
    return meta

