"""Validation of the routing action of :class:`~carbon_gym.env.GeoServeEnv` (its Action Space
section): the fast path for a valid integer action, and the messages that name the slot, the
value and the allowed choices."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import pending as P
from .errors import ActionError

__all__ = ["parse_route_action"]

# The ufunc reductions behind ndarray.sum/max/min/all (same results, without the Python wrapper).
_MAX, _MIN, _ALL = np.maximum.reduce, np.minimum.reduce, np.logical_and.reduce


def parse_route_action(env: Any, action: Any) -> tuple[np.ndarray, int]:
    """Validate ``action``; return (choice per visible slot, number of invalid entries deferred)."""
    K, D, n = env._K, env._D, env._n_visible
    try:
        a = action if type(action) is np.ndarray else np.asarray(action)
    except Exception as exc:  # pragma: no cover - exotic objects
        raise ActionError(f"action could not be converted to an array: {exc}") from None
    if a.shape != (K,):
        raise ActionError(
            f"action must have shape ({K},): one entry per pending-request slot "
            f"(a datacenter index 0..{D - 1}, or {D} = defer); got shape {a.shape}"
        )
    kind = a.dtype.kind
    nonint: np.ndarray | None = None
    if kind in "iu":
        v = a[:n].astype(np.int64, copy=False)
        if n == 0:
            return v, 0
        # fast path: every entry in range and allowed by the mask
        if _MIN(v) >= 0 and _MAX(v) <= D and _ALL(env._mask[env._arange_k[:n], v]):
            return v, 0
    elif kind == "f":
        av = a[:n]
        ok = np.isfinite(av)
        ok[ok] = av[ok] == np.round(av[ok])
        nonint = ~ok
        v = np.where(ok, av, -1).astype(np.int64)
    else:
        raise ActionError(
            f"action must hold integers (datacenter index 0..{D - 1}, or {D} = defer); got dtype {a.dtype}"
        )
    out_of_range = (v < 0) | (v > D)
    if nonint is not None:
        out_of_range |= nonint
    masked = np.zeros(n, dtype=bool)
    in_range = ~out_of_range
    if n:
        masked[in_range] = ~env._mask[np.flatnonzero(in_range), v[in_range]]
    invalid = out_of_range | masked
    n_invalid = int(np.count_nonzero(invalid))
    if n_invalid == 0:
        return v, 0
    if env._invalid_action == "raise":
        k = int(np.flatnonzero(invalid)[0])
        more = f" ({n_invalid - 1} more invalid entries)" if n_invalid > 1 else ""
        raise ActionError(_invalid_message(env, k, a[k].item(), bool(out_of_range[k])) + more)
    return np.where(invalid, D, v), n_invalid

def _invalid_message(env: Any, k: int, value: Any, out_of_range: bool) -> str:
    D = env._D
    allowed = np.flatnonzero(env._mask[k])
    if out_of_range:
        return (
            f"action[{k}] = {value!r} is not a valid choice for slot {k} (a pending request): "
            f"expected an integer 0..{D - 1} (datacenter) or {D} (defer); allowed now: {allowed.tolist()}"
        )
    d = int(value)
    name = env.layout.datacenter_names[d]
    row = env._pending.rows[k]
    need = -(-(int(row[P.PROMPT]) + 1) // env.layout.block_tokens)
    fault_why = env._faults.masked_reason(int(row[P.ORIGIN]), d) if env._faults is not None else None
    if fault_why is not None:
        why = fault_why
    elif not env._up[d]:
        why = "the datacenter is down"
    else:
        why = f"the request needs {need} KV blocks, one engine there has {int(env.layout.engine_kv_blocks[d])}"
    return (
        f"action[{k}] = {d} sends slot {k}'s request to datacenter {d} ({name!r}), which is masked: {why}; "
        f"allowed now: {allowed.tolist()} ({D} = defer)"
    )
