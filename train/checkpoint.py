"""Checkpoint files of learned policies: a pickle-free format for set policies, and the trust rule.

**The set-policy format** (what ``carbon-gym train export`` and ``train imitate`` write, and what
the shipped agent ``train/checkpoints/llama8b_set.npz`` is): a zip archive holding

* ``carbon_gym_checkpoint.json``: ``format`` / ``format_version``; ``network`` (the
  :class:`~train.set_policy.SetNetwork` constructor's arguments: ``hidden``, ``classes``,
  ``demand_features``, ``load_feedback``, ``capacity_head`` (only when true) and the training env's ``layout``); ``tensors`` (name ->
  shape and dtype of every entry of the network's ``state_dict``); ``policy`` (default choice
  ``mode`` and the safety knobs :data:`SAFETY_KNOB_NAMES`); ``env`` (:func:`checkpoint_env_meta`:
  the env version and observation scales the network was trained for, checked on load);
  ``training`` (how it was made: config, data days = training and validation episode starts,
  source; informational); ``fingerprint`` (optional; :func:`env_fingerprint` of each training
  scenario's env: scenario, topology size, slots, forecast hours, capacity control, observation
  layout hash and code version), checked against the env a policy is reset on
  (:func:`check_env_fingerprint`: mismatches named, warned or refused);
* one ``<tensor name>.npy`` per tensor (float32, numpy's own format).

:func:`read_set_checkpoint` reads it with ``json`` and ``numpy.lib.format``'s header readers
only (``numpy.load(path, allow_pickle=False)`` reads the tensors too): no member can run code.

**What a load checks**, each failure a :class:`ConfigError` (field ``checkpoint``, one line naming
the member, section or tensor and what is wrong), all before anything is allocated from what the
file claims:

* members: the JSON member and one ``<name>.npy`` per listed tensor, nothing else (an extra
  member, e.g. a stable-baselines3 ``data`` or ``policy.pth``, is refused by name, not ignored),
  none twice, at most 256 MiB uncompressed in all;
* the JSON member: at most 1 MiB, nested at most 64 levels (counted on the text before it is
  parsed), sections known; ``network`` (:func:`check_network_meta`: ``hidden`` an integer in
  :data:`HIDDEN_RANGE`, ``load_feedback`` one in :data:`LOAD_FEEDBACK_RANGE`, booleans and
  numbers with a fraction such as ``8.7`` or ``1e4`` refused; typed layout), ``tensors``,
  ``policy``, ``training`` objects, ``env`` an object or null, ``fingerprint`` a list of objects;
  knobs numbers;
* tensors: at most 64, float32 shapes of at most 4 integers whose values fit the size limit;
  each ``.npy`` header (read alone) must give float32 and the listed shape, and the member's size
  must be exactly header + data (a header claiming 10^12 values is refused unread; an object
  array, which only pickle reads, too); every value finite (the error names the tensor and its
  NaN / inf counts);
* :func:`network_from_checkpoint` compares the network's parameter shapes, computed on a
  parameter-free copy (torch's ``meta`` device), with the stored tensors before building it.

**Large finite weights** (up to float32's 3.4e38) load. At decision time
(:class:`train.policy.LearnedPolicy`) every step's logits are checked (~2 us): NaN, inf, or a
value at or below -5e7 (half the masking logit -1e8, below which an allowed choice could lose
to a masked one) raise a :class:`ConfigError` (field ``checkpoint``) naming the counts, and
nothing is decided. Measured on the shipped agent at llama8b-moderate: the numpy path computes in
float64, where all weights 1e38 (or 3.4e38) give finite logits of ~1e195 and run, and weights of
random sign 3e38 give finite logits far below -5e7 and are refused at the first decision;
float64 does not overflow within the admitted sizes (every weight 3.4e38 at ``hidden`` 2048
with 16 feedback passes: logits ~3e208, under float64's 1.8e308). The torch path
(``backend="torch"``, and a per-request network's default) computes in float32, where 1e38
weights give NaN / inf logits: refused at the first decision.

**SB3 ``.zip`` checkpoints** (``carbon-gym train``'s ``final.zip``, ``bc.zip`` and its resumption
checkpoints, routing-weights PPO agents) hold pickled Python objects: stable-baselines3 unpickles
the entries of their ``data`` member while loading, which runs whatever code their author put
there. :func:`load_sb3_model` therefore refuses them unless the caller passes ``trust=True``
(``--trust-checkpoint`` on the command line); :func:`checkpoint_format` tells the two formats
apart from the archive's member names alone.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from carbon_gym.errors import CarbonGymError, ConfigError

__all__ = [
    "FORMAT", "FORMAT_VERSION", "META_NAME", "ENV_META_NAME", "POLICY_META_NAME", "SAFETY_KNOB_NAMES", "MODES",
    "SetCheckpoint", "checkpoint_format", "save_set_checkpoint", "read_set_checkpoint", "network_from_checkpoint",
    "require_trust", "read_sb3_meta", "load_sb3_model", "check_safety", "checkpoint_env_meta", "write_checkpoint_env",
    "check_checkpoint_env", "write_policy_meta", "env_fingerprint", "check_env_fingerprint", "FINGERPRINT_FIELDS",
    "ON_MISMATCH", "NETWORK_KEYS", "HIDDEN_RANGE", "LOAD_FEEDBACK_RANGE", "check_network_meta",
]

#: ``format`` and ``format_version`` of the pickle-free set-policy checkpoint.
FORMAT = "carbon-gym/set-policy"
FORMAT_VERSION = 1
#: Name of the JSON member of a set-policy checkpoint.
META_NAME = "carbon_gym_checkpoint.json"
#: Name of the file inside an SB3 checkpoint .zip that records the env it was trained for.
ENV_META_NAME = "carbon_gym_env.json"
#: Name of the file inside an SB3 checkpoint .zip that records how the policy acts by default.
POLICY_META_NAME = "carbon_gym_policy.json"
#: Safety knobs a checkpoint may record (:data:`train.fast.SAFETY_KNOBS`).
SAFETY_KNOB_NAMES = ("load_price", "headroom_penalty", "headroom_margin")
#: Choice modes of :class:`train.policy.LearnedPolicy`.
MODES = ("sample", "argmax", "systematic")
#: Largest uncompressed total of a set-policy checkpoint's members (the shipped ones: 11-20 KB).
_MAX_MEMBER_BYTES = 256 << 20
#: Largest JSON member, and its deepest nesting of arrays / objects (the shipped ones: 6-9 KB, 5).
_MAX_META_BYTES = 1 << 20
_MAX_JSON_DEPTH = 64
#: Sections of the JSON member.
_META_KEYS = ("format", "format_version", "network", "tensors", "policy", "env", "training", "fingerprint")
#: Keys of its ``network`` section (:class:`~train.set_policy.SetNetwork`'s arguments).
NETWORK_KEYS = ("hidden", "classes", "demand_features", "load_feedback", "layout", "capacity_head")
#: Admitted ``network.hidden`` (a network of 2048 holds ~46 M weights, 185 MB, under
#: :data:`_MAX_MEMBER_BYTES`) and ``network.load_feedback`` (passes), both ends included.
HIDDEN_RANGE = (1, 2048)
LOAD_FEEDBACK_RANGE = (0, 16)
_LAYOUT_INTS = ("n_datacenters", "max_pending", "n_regions", "forecast_hours", "n_dc_features", "n_slot_features")
_LAYOUT_COLUMNS = ("dc_columns", "slot_columns", "global_columns")
_MAX_LAYOUT_SIZE = 1 << 20
#: Most tensors a checkpoint may list (the shipped ones: 28 and 32), and what their names may hold.
_MAX_TENSORS = 64
_TENSOR_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,199}")
_TRUST_HINT = ("pass trust=True (API) or --trust-checkpoint (CLI) only if you trust whoever made the file; "
               "`carbon-gym train export --trust-checkpoint --checkpoint IN.zip --out OUT.npz` converts a set-policy "
               "one to the pickle-free format once")


@dataclass(frozen=True)
class SetCheckpoint:
    """A read set-policy checkpoint: its JSON sections and tensors (float32 arrays)."""

    path: str
    network: dict[str, Any]
    tensors: dict[str, np.ndarray]
    policy: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] | None = None
    training: dict[str, Any] = field(default_factory=dict)
    fingerprint: list[dict[str, Any]] | None = None


# ------------------------------------------------------------------------------ format detection
def checkpoint_format(path: str | Path) -> str:
    """``"set"`` (the pickle-free format) or ``"sb3"`` (a stable-baselines3 .zip), from the
    archive's member names (nothing is unpickled); :class:`ConfigError` (field ``path``) if
    ``path`` is missing or neither."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("path", f"no checkpoint at {str(p)!r}")
    try:
        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConfigError("path", f"{str(p)!r} is not a carbon-gym checkpoint (a zip archive): {exc}") from None
    if META_NAME in names:
        return "set"
    if "data" in names:
        return "sb3"
    raise ConfigError("path", f"{str(p)!r} is neither a carbon-gym set-policy checkpoint (no {META_NAME}) nor a "
                      "stable-baselines3 .zip (no 'data')")


# ------------------------------------------------------------------------------ set-policy format
def save_set_checkpoint(path: str | Path, net: Any, *, policy: Mapping[str, Any] | None = None,
                        training: Mapping[str, Any] | None = None,
                        fingerprint: Sequence[Mapping[str, Any]] | None = None) -> Path:
    """Write the :class:`~train.set_policy.SetNetwork` ``net`` in the pickle-free format.

    Args:
        path: file to write (``.npz`` by convention; parents are created).
        net: the network (its ``state_dict`` and constructor arguments; the layout it is bound to
            is recorded as the training layout).
        policy: ``{"mode": ..., <knob>: ...}`` (:data:`MODES`, :data:`SAFETY_KNOB_NAMES`); absent
            knobs are recorded as 0 (neutral), an absent mode as ``"sample"``.
        training: how the network was made (JSON-serialisable; informational).
        fingerprint: :func:`env_fingerprint` of the training env(s) (None: not recorded).
    Returns the path written."""
    pol = _check_policy_meta(dict(policy or {}))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().float().numpy() for k, v in net.state_dict().items()}
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "network": {"hidden": int(net.hidden), "classes": net.classes, "demand_features": bool(net.demand_features),
                    "load_feedback": int(net.load_feedback), "layout": dict(net.spec),
                    **({"capacity_head": True} if getattr(net, "capacity_head", False) else {})},
        "tensors": {k: {"shape": list(a.shape), "dtype": str(a.dtype)} for k, a in state.items()},
        "policy": {"mode": pol.get("mode", "sample"), **{k: float(pol.get(k, 0.0)) for k in SAFETY_KNOB_NAMES}},
        "env": checkpoint_env_meta(),
        "training": dict(training or {}),
    }
    if fingerprint is not None:
        meta["fingerprint"] = [dict(f) for f in fingerprint]
    text = json.dumps(meta, indent=1, sort_keys=True, default=str)
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w") as zf:  # (fixed member dates: the same network gives the same bytes)
        zf.writestr(_member(META_NAME), text)
        for k, a in state.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(a), allow_pickle=False)
            zf.writestr(_member(k + ".npy"), buf.getvalue())
    tmp.replace(out)
    return out


def _member(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def read_set_checkpoint(path: str | Path) -> SetCheckpoint:
    """Read a set-policy checkpoint without unpickling anything (module docstring, "What a load
    checks"): :class:`ConfigError` (field ``checkpoint``) naming what is wrong with a malformed
    one, raised before any array is allocated from what the file claims."""
    p = Path(path)
    src = str(p)
    if checkpoint_format(p) != "set":
        raise ConfigError("path", f"{src!r} is not a carbon-gym set-policy checkpoint (no {META_NAME})")
    try:
        with zipfile.ZipFile(p) as zf:
            names = zf.namelist()
            twice = sorted({n for n in names if names.count(n) > 1}) if len(set(names)) != len(names) else []
            if twice:
                raise ConfigError("checkpoint", f"{src}: members {twice} appear more than once")
            meta = _parse_meta(_read_member(zf, META_NAME, src, _MAX_META_BYTES), src)
            listed = meta["tensors"]
            allowed = [META_NAME] + [f"{k}.npy" for k in listed]
            unknown = sorted(set(names) - set(allowed))
            if unknown:
                raise ConfigError("checkpoint", f"{src}: unknown members {unknown} (nothing else is read from a set-policy "
                                  f"checkpoint, and nothing is ignored: remove them, or re-export a clean copy)",
                                  allowed=[f"{META_NAME} and one <tensor>.npy per tensor listed in it: {allowed[1:]}"])
            total = sum(zf.getinfo(m).file_size for m in allowed if m in names)
            if total > _MAX_MEMBER_BYTES:
                raise ConfigError("checkpoint", f"{src}: members hold {total} bytes uncompressed (at most {_MAX_MEMBER_BYTES})")
            tensors = {name: _read_tensor(zf, name, shape, src) for name, shape in listed.items()}
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
        raise ConfigError("checkpoint", f"{src}: malformed set-policy checkpoint ({type(exc).__name__}: {exc})") from None
    bad = [(k, int(np.isnan(a).sum()), int(np.isinf(a).sum()), a.size) for k, a in tensors.items() if not np.isfinite(a).all()]
    if bad:
        k, n_nan, n_inf, size = bad[0]
        more = f"; so do {len(bad) - 1} other tensors: {[b[0] for b in bad[1:6]]}{' ...' if len(bad) > 6 else ''}" if len(bad) > 1 else ""
        raise ConfigError("checkpoint", f"{src}: tensor {k!r} holds non-finite weights ({n_nan} NaN, {n_inf} inf of {size} "
                          f"values){more}: the file is damaged or was edited")
    return SetCheckpoint(path=src, network=meta["network"], tensors=tensors, policy=meta["policy"], env=meta["env"],
                         training=meta["training"], fingerprint=meta["fingerprint"])


def _read_member(zf: zipfile.ZipFile, name: str, src: str, limit: int = _MAX_MEMBER_BYTES) -> bytes:
    info = zf.getinfo(name)
    if info.file_size > limit:
        raise ConfigError("checkpoint", f"{src}: member {name!r} is {info.file_size} bytes (at most {limit})")
    return zf.read(name)


def _json_depth(text: str) -> int:
    """The deepest nesting of arrays / objects in the JSON ``text``, counted without parsing it
    (brackets outside strings; a malformed text gives some number, then fails to parse)."""
    bare = _JSON_STRING.sub('""', text).encode("utf-8", errors="replace")
    b = np.frombuffer(bare, dtype=np.uint8)
    step = np.isin(b, _OPEN).astype(np.int64) - np.isin(b, _CLOSE)
    return int(np.cumsum(step).max(initial=0))


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_OPEN, _CLOSE = np.frombuffer(b"[{", dtype=np.uint8), np.frombuffer(b"]}", dtype=np.uint8)


def _parse_meta(raw: bytes, src: str) -> dict[str, Any]:
    """The checked sections of a checkpoint's JSON member ``raw`` (its size already bounded):
    ``network``, ``tensors`` (name -> shape tuple), ``policy``, ``env``, ``training``, ``fingerprint``."""
    def bad(what: str, **kw: Any) -> ConfigError:
        return ConfigError("checkpoint", f"{src}: {META_NAME}: {what}", **kw)

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad(f"not UTF-8 text ({exc})") from None
    depth = _json_depth(text)
    if depth > _MAX_JSON_DEPTH:
        raise bad(f"nested {depth} levels deep (at most {_MAX_JSON_DEPTH})")
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as exc:  # (JSONDecodeError is a ValueError)
        raise bad(f"not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise bad(f"does not describe a {FORMAT!r} checkpoint")
    version = meta.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise ConfigError("checkpoint", f"{src}: format_version {version!r} is not supported", allowed=[FORMAT_VERSION])
    unknown = sorted(set(meta) - set(_META_KEYS))
    if unknown:
        raise bad(f"unknown sections {unknown}", allowed=list(_META_KEYS))
    if "network" not in meta or "tensors" not in meta:
        raise bad("lists no network or no tensors")
    for key in ("network", "tensors", "policy", "training"):
        if key in meta and not isinstance(meta[key], dict):
            raise bad(f"{key!r} must be an object, got {type(meta[key]).__name__} {_short(meta[key])}")
    env, fp = meta.get("env"), meta.get("fingerprint")
    if env is not None and not isinstance(env, dict):
        raise bad(f"'env' must be an object (the env record) or null, got {type(env).__name__} {_short(env)}")
    if fp is not None and not (isinstance(fp, list) and all(isinstance(f, dict) for f in fp)):
        raise ConfigError("checkpoint", f"{src}: 'fingerprint' must be a list of env records, got {type(fp).__name__}")
    policy = dict(meta.get("policy", {}))
    for k in SAFETY_KNOB_NAMES:
        if k in policy and not (isinstance(policy[k], (int, float)) and not isinstance(policy[k], bool)):
            raise ConfigError(k, f"{src}: policy.{k} must be a number, got {_short(policy[k])}")
    return {"network": check_network_meta(meta["network"], src), "tensors": _check_tensor_list(meta["tensors"], src),
            "policy": _check_policy_meta(policy, src), "env": env,
            "training": dict(meta.get("training", {})), "fingerprint": fp}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_network_meta(cfg: Any, src: str) -> dict[str, Any]:
    """The ``network`` section ``cfg`` of a checkpoint, checked before anything is built: known
    keys; ``hidden`` an integer in :data:`HIDDEN_RANGE`, ``load_feedback`` one in
    :data:`LOAD_FEEDBACK_RANGE` (JSON numbers with a fraction, ``1e4`` included, and booleans
    are refused); ``demand_features`` / ``capacity_head`` booleans; ``classes`` null, a boolean
    or an object of numbers; ``layout`` an object with the integer sizes, column maps and
    engine counts :func:`train.set_policy.layout_spec` writes. :class:`ConfigError` (field
    ``checkpoint``) naming the first bad entry."""
    def bad(what: str) -> ConfigError:
        return ConfigError("checkpoint", f"{src}: network.{what}")

    if not isinstance(cfg, dict):
        raise ConfigError("checkpoint", f"{src}: network section must be an object, got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(NETWORK_KEYS))
    if unknown or "layout" not in cfg or "hidden" not in cfg:
        raise ConfigError("checkpoint", f"{src}: network section has unknown keys {unknown} or lacks layout/hidden",
                          allowed=list(NETWORK_KEYS))
    for key, (lo, hi) in (("hidden", HIDDEN_RANGE), ("load_feedback", LOAD_FEEDBACK_RANGE)):
        v = cfg.get(key, 0)
        if not _is_int(v) or not lo <= v <= hi:
            raise bad(f"{key} must be an integer in {lo}..{hi}, got {_short(v)} ({type(v).__name__})")
    for key in ("demand_features", "capacity_head"):
        if not isinstance(cfg.get(key, False), bool):
            raise bad(f"{key} must be true or false, got {_short(cfg[key])}")
    cls = cfg.get("classes")
    if not (cls is None or isinstance(cls, bool) or (isinstance(cls, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in cls.values()))):
        raise bad(f"classes must be null, true/false or an object of finite numbers, got {_short(cls)}")
    _check_layout_meta(cfg["layout"], bad)
    return dict(cfg)


def _check_layout_meta(lay: Any, bad: Any) -> None:
    """The ``network.layout`` record :func:`train.set_policy.layout_spec` writes: integer sizes,
    column maps of integer indices, lists of integer engine / server counts."""
    if not isinstance(lay, dict):
        raise bad(f"layout must be an object, got {type(lay).__name__} {_short(lay)}")
    for key in _LAYOUT_INTS:
        if not _is_int(lay.get(key)) or not 0 <= lay[key] <= _MAX_LAYOUT_SIZE:
            raise bad(f"layout.{key} must be an integer in 0..{_MAX_LAYOUT_SIZE}, got {_short(lay.get(key))}")
    for key in _LAYOUT_COLUMNS:
        cols = lay.get(key)
        if not isinstance(cols, dict) or not all(_is_int(i) and 0 <= i <= _MAX_LAYOUT_SIZE for i in cols.values()):
            raise bad(f"layout.{key} must be an object of column indices, got {_short(cols)}")
    for key in ("n_engines", "n_servers"):
        v = lay.get(key, [])
        if not isinstance(v, list) or len(v) > _MAX_LAYOUT_SIZE or not all(_is_int(x) and x >= 0 for x in v):
            raise bad(f"layout.{key} must be a list of non-negative integers, got {_short(v)}")


def _check_tensor_list(listed: dict[str, Any], src: str) -> dict[str, tuple[int, ...]]:
    """``tensors`` (name -> ``{"shape", "dtype"}``) as name -> shape, checked: at most
    :data:`_MAX_TENSORS` names of parameters (letters, digits, ``_`` and ``.``), float32, shapes
    of at most 4 non-negative integers whose element count fits :data:`_MAX_MEMBER_BYTES`."""
    if not listed:
        raise ConfigError("checkpoint", f"{src}: {META_NAME} lists no network or no tensors")
    if len(listed) > _MAX_TENSORS:
        raise ConfigError("checkpoint", f"{src}: {len(listed)} tensors listed (at most {_MAX_TENSORS})")
    out = {}
    for name, desc in listed.items():
        where = f"{src}: tensor {_short(name)}"
        if not _TENSOR_NAME.fullmatch(name):
            raise ConfigError("checkpoint", f"{where}: not a parameter name (letters, digits, '_' and '.')")
        if not isinstance(desc, dict) or set(desc) != {"shape", "dtype"}:
            raise ConfigError("checkpoint", f"{where}: must be described by {{\"shape\": [...], \"dtype\": \"float32\"}}, "
                              f"got {_short(desc)}")
        shape = desc["shape"]
        if not isinstance(shape, list) or len(shape) > 4 or not all(_is_int(n) and n >= 0 for n in shape):
            raise ConfigError("checkpoint", f"{where}: shape must be a list of at most 4 non-negative integers, "
                              f"got {_short(shape)}")
        if desc["dtype"] != "float32":
            raise ConfigError("checkpoint", f"{where}: dtype {_short(desc['dtype'])} is not float32")
        if 4 * math.prod(shape) > _MAX_MEMBER_BYTES:
            raise ConfigError("checkpoint", f"{where}: shape {shape} is {math.prod(shape)} values "
                              f"(at most {_MAX_MEMBER_BYTES // 4})")
        out[name] = tuple(shape)
    return out


def _read_tensor(zf: zipfile.ZipFile, name: str, shape: tuple[int, ...], src: str) -> np.ndarray:
    """The tensor ``name`` of ``zf`` (float32, C order), its .npy header checked against the
    listed ``shape`` and the member's size before its data is read."""
    member = f"{name}.npy"
    if member not in zf.namelist():
        raise ConfigError("checkpoint", f"{src}: tensor {name!r} is listed but {member!r} is missing")
    size = zf.getinfo(member).file_size
    with zf.open(member) as f:
        try:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"npy format version {version} (1.0 or 2.0 expected)")
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            got_shape, fortran, dtype = read_header(f)
            start = f.tell()
        except (ValueError, SyntaxError, TypeError) as exc:  # a malformed header
            raise ConfigError("checkpoint", f"{src}: {member} is not a plain numeric array ({exc})") from None
        if dtype.hasobject:
            raise ConfigError("checkpoint", f"{src}: {member} is not a plain numeric array (an object array, which only "
                              "pickle could read; refused)")
        if dtype != np.float32 or tuple(got_shape) != shape:
            raise ConfigError("checkpoint", f"{src}: {member} is {dtype} {list(got_shape)}, expected float32 {list(shape)}")
        want = start + 4 * math.prod(shape)
        if size != want:
            raise ConfigError("checkpoint", f"{src}: {member} is {size} bytes, its header says {want}")
        data = f.read(want - start)
    arr = np.frombuffer(data, dtype=np.float32, count=math.prod(shape)).reshape(shape, order="F" if fortran else "C")
    return np.ascontiguousarray(arr)


def network_from_checkpoint(ck: SetCheckpoint) -> Any:
    """The :class:`~train.set_policy.SetNetwork` of ``ck`` (float32, eval mode): built from its
    ``network`` section (:func:`check_network_meta`), its weights from ``ck.tensors``, whose
    names and shapes must be exactly the network's: compared on a parameter-free copy (torch's
    ``meta`` device) before the network is built, so a ``hidden`` that does not fit the stored
    tensors allocates nothing."""
    import torch as th

    from .set_policy import SetNetwork

    cfg = check_network_meta(ck.network, ck.path)

    def build() -> Any:
        try:
            return SetNetwork(cfg["layout"], hidden=cfg["hidden"], classes=cfg.get("classes"),
                              demand_features=cfg.get("demand_features", False), load_feedback=cfg.get("load_feedback", 0),
                              capacity_head=cfg.get("capacity_head", False))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            if isinstance(exc, CarbonGymError):
                raise
            raise ConfigError("checkpoint", f"{ck.path}: network section does not build a SetNetwork ({exc!r})") from None

    with th.device("meta"):
        want = {k: list(v.shape) for k, v in build().state_dict().items()}
    got = {k: list(v.shape) for k, v in ck.tensors.items()}
    if want != got:
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        raise ConfigError("checkpoint", f"{ck.path}: tensors do not fit the network (missing {missing}, unexpected "
                          f"{extra}, wrong shape {wrong}{' ' + str({k: (want[k], got[k]) for k in wrong[:3]}) if wrong else ''})")
    net = build()
    net.load_state_dict({k: th.from_numpy(np.array(a, dtype=np.float32)) for k, a in ck.tensors.items()})
    return net.eval()


# ------------------------------------------------------------------------------ SB3 zips: the trust rule
def require_trust(path: str | Path, trust: bool) -> None:
    """:class:`ConfigError` (field ``trust``) if ``path`` is an SB3 checkpoint and ``trust`` is
    not set: loading one unpickles its contents, which can run any code."""
    if checkpoint_format(path) == "sb3" and not trust:
        raise ConfigError("trust", f"{str(path)!r} is a stable-baselines3 checkpoint: loading it unpickles Python "
                          f"objects, which can run code its author chose; refused without trust ({_TRUST_HINT})",
                          allowed=["trust=True / --trust-checkpoint", "a carbon-gym set-policy checkpoint (.npz)"])


def read_sb3_meta(path: str | Path) -> tuple[dict[str, Any] | None, dict[str, Any], str]:
    """(env record or None, policy record, the ``data`` member's text) of an SB3 checkpoint,
    read as JSON / text only (nothing is unpickled)."""
    src = str(path)
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            data = zf.read("data").decode("utf-8", errors="replace")
            env = json.loads(zf.read(ENV_META_NAME)) if ENV_META_NAME in names else None
            pmeta = json.loads(zf.read(POLICY_META_NAME)) if POLICY_META_NAME in names else {}
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        raise ConfigError("path", f"{src!r} is not a carbon-gym training checkpoint (an SB3 .zip): {exc}") from None
    return env, _check_policy_meta(dict(pmeta), src), data


def load_sb3_model(path: str | Path, *, trust: bool = False) -> Any:
    """The SB3 model in ``path`` (``MaskablePPO`` with the set policy, or ``PPO``), on the CPU;
    refused without ``trust`` (:func:`require_trust`). Its ``.pth`` members go through torch's
    weights-only loader: one holding other objects gives a :class:`ConfigError`, not a raw
    ``UnpicklingError``."""
    require_trust(path, trust)
    _, _, data = read_sb3_meta(path)
    if "SetActorCriticPolicy" in data or "Maskable" in data:
        from sb3_contrib import MaskablePPO as algo
    else:
        from stable_baselines3 import PPO as algo
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Could not deserialize object")
            return algo.load(path, device="cpu")
    except pickle.UnpicklingError as exc:
        raise ConfigError("checkpoint", f"{str(path)!r}: a .pth member holds objects other than tensors, which torch's "
                          f"weights-only loader refuses ({str(exc).splitlines()[0][:200]})") from None
    except (KeyError, ValueError, RuntimeError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, CarbonGymError):
            raise
        raise ConfigError("checkpoint", f"{str(path)!r}: stable-baselines3 could not load it ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None


# ------------------------------------------------------------------------------ policy and env records
def check_safety(knobs: Mapping[str, Any]) -> dict[str, float]:
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


def _check_policy_meta(meta: dict[str, Any], source: str = "") -> dict[str, Any]:
    """``meta`` (mode and knobs) checked: known keys, a known mode, valid knobs (as floats)."""
    where = f"{source}: " if source else ""
    unknown = sorted(set(meta) - {"mode", *SAFETY_KNOB_NAMES})
    if unknown:
        raise ConfigError("policy meta", f"{where}unknown keys {unknown}", allowed=["mode", *SAFETY_KNOB_NAMES])
    if "mode" in meta and meta["mode"] not in MODES:
        raise ConfigError("mode", f"{where}unknown mode {meta['mode']!r}", allowed=list(MODES))
    out: dict[str, Any] = {"mode": meta["mode"]} if "mode" in meta else {}
    out.update(check_safety({k: meta[k] for k in SAFETY_KNOB_NAMES if k in meta}))
    return out


def write_policy_meta(path: str | Path, meta: dict[str, Any]) -> None:
    """Record ``meta`` (``{"mode": ..., <safety knob>: ...}``: the default choice mode and safety
    knobs, :data:`SAFETY_KNOB_NAMES`; an absent knob is neutral) inside an SB3 checkpoint .zip."""
    _check_policy_meta(dict(meta))
    with zipfile.ZipFile(path, "a") as zf:
        if POLICY_META_NAME in zf.namelist():
            raise ConfigError("checkpoint", f"{path} already records its policy settings")
        zf.writestr(POLICY_META_NAME, json.dumps(meta, sort_keys=True))


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
    """Record :func:`checkpoint_env_meta` inside the SB3 checkpoint .zip at ``path``."""
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


# ------------------------------------------------------------------------------ env fingerprint
#: Fields of :func:`env_fingerprint` compared by :func:`check_env_fingerprint` (``git_commit`` is
#: recorded, not compared: any commit would differ).
FINGERPRINT_FIELDS = ("scenario", "n_datacenters", "n_regions", "max_pending", "forecast_hours", "capacity_control",
                      "action", "layout_hash", "carbon_gym_version", "env_version", "rate_per_s", "polling_period_s")
#: What :func:`check_env_fingerprint` does with mismatches.
ON_MISMATCH = ("warn", "error", "ignore")


def _digest(obj: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _git_commit() -> str | None:
    """The source tree's commit (None outside a git checkout); cached per process."""
    if _GIT[0] == "":
        import subprocess

        try:
            res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                                 text=True, timeout=10)
            _GIT[0] = res.stdout.strip() if res.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            _GIT[0] = None
    return _GIT[0]


_GIT: list[str | None] = [""]


def env_fingerprint(env: Any) -> dict[str, Any]:
    """What a trained policy saw of its env: the scenario's name, topology size (datacenters,
    regions), slots K, forecast hours, ``capacity.control``, the action (``"route"`` or
    ``"route+capacity"``), ``layout_hash`` (sha256 prefix of
    :func:`carbon_gym.observation.observation_signature`: columns, sizes, scales, action sizes),
    the carbon_gym and env versions, the scenario's mean request rate ``rate_per_s`` (requests/s,
    rounded to 4 significant digits: a load level's rate moves when its capacity basis does) and
    the git commit of the code (None outside a checkout) and the polling period ``polling_period_s``
    (s; :class:`train.policy.LearnedPolicy` reads per-step counts in its units)."""
    import carbon_gym
    from carbon_gym.observation import ENV_VERSION, observation_signature

    base = getattr(env, "unwrapped", env)
    lay = base.layout
    sc = getattr(base, "scenario", None)
    return {
        "scenario": None if sc is None else str(sc.name),
        "n_datacenters": int(lay.n_datacenters), "n_regions": int(lay.n_regions), "max_pending": int(lay.max_pending),
        "forecast_hours": int(lay.forecast_hours),
        "capacity_control": None if sc is None else str(sc.capacity.control),
        "action": "route+capacity" if bool(getattr(lay, "capacity_agent", False)) else "route",
        "layout_hash": _digest(observation_signature(base)),
        "carbon_gym_version": str(carbon_gym.__version__), "env_version": ENV_VERSION, "git_commit": _git_commit(),
        "rate_per_s": None if sc is None else float(f"{float(sc.rate_per_s):.4g}"),
        "polling_period_s": None if sc is None else float(sc.polling_period_s),
    }


def check_env_fingerprint(stored: Sequence[Mapping[str, Any]] | None, env: Any, source: str,
                          on_mismatch: str = "warn") -> list[str]:
    """Compare the env ``env`` with the training envs ``stored`` (a checkpoint's fingerprint).
    Returns the mismatches, each ``"field: checkpoint X, this env Y"`` against the training env
    of the same scenario (else the first; fields the checkpoint does not record are not compared);
    ``on_mismatch``: ``"warn"`` (a ``UserWarning`` naming
    them), ``"error"`` (:class:`ConfigError`) or ``"ignore"``. Nothing is compared when the
    checkpoint records no fingerprint (older checkpoints)."""
    if on_mismatch not in ON_MISMATCH:
        raise ConfigError("on_env_mismatch", f"unknown value {on_mismatch!r}", allowed=list(ON_MISMATCH))
    if not stored:
        return []
    now = env_fingerprint(env)
    same = [f for f in stored if f.get("scenario") == now["scenario"]]
    ref = same[0] if same else stored[0]
    out = []
    if not same:
        names = sorted({str(f.get("scenario")) for f in stored})
        out.append(f"scenario: checkpoint trained on {names}, this env {now['scenario']!r}")
    out += [f"{k}: checkpoint {ref.get(k)!r}, this env {now[k]!r}" for k in FINGERPRINT_FIELDS
            if k != "scenario" and k in ref and ref.get(k) != now[k]]  # (a field newer than the checkpoint: not compared)
    if out and on_mismatch == "error":
        raise ConfigError("checkpoint", f"{source}: the env differs from the one the policy was trained on: "
                          + "; ".join(out), allowed=["on_env_mismatch='warn' or 'ignore' to run it anyway"])
    if out and on_mismatch == "warn":
        warnings.warn(f"{source}: the env differs from the one the policy was trained on: " + "; ".join(out), stacklevel=3)
    return out
