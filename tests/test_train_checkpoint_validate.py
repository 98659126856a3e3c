"""Tampered set-policy checkpoints (.npz) give the checkpoint's named error, one line, before
anything is built from what they claim (issue 42 items 2 and 3, issue 43 item 2):

* non-finite weights (one tensor or all) are refused on load, naming the tensor;
* members other than the JSON and the listed tensors (an SB3 ``data``) are refused by name by
  every loader (API, ``train export`` / ``evaluate`` / ``decision-time``), nothing unpickled;
* the metadata is checked (types, bounds, nesting, size; .npy headers against it) before any
  allocation: ``hidden`` 1e4 / 1e6 / 8.7 / true, ``policy`` / ``training`` / ``env`` = 5, JSON
  nested 1e5 deep, a header claiming 1e12 values;
* finite but huge weights load; logits they make unusable (NaN, inf, below the masking logit's
  half) are refused at the decision.
"""

from __future__ import annotations

import base64
import io
import json
import pathlib
import pickle
import tracemalloc
import warnings
import zipfile

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

import torch as th  # noqa: E402

from carbon_gym.errors import ConfigError  # noqa: E402
from test_train_checkpoint import _rewrite as _rewrite_zip  # noqa: E402  (tests/ is on sys.path)
from train.checkpoint import META_NAME, network_from_checkpoint, read_set_checkpoint  # noqa: E402
from train.policy import SHIPPED_CHECKPOINT, LearnedPolicy, export_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

CAPACITY_CHECKPOINT = SHIPPED_CHECKPOINT.parent / "llama8b_capacity_set.npz"
with zipfile.ZipFile(SHIPPED_CHECKPOINT) as _zf:
    META = json.loads(_zf.read(META_NAME))
TENSORS = sorted(META["tensors"])


class Payload:
    """Unpickles as ``Path(marker).touch()``: what a planted pickle could run instead."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def _rewrite(dst: pathlib.Path, replace: dict[str, bytes], src: pathlib.Path = SHIPPED_CHECKPOINT) -> pathlib.Path:
    """``src`` with members replaced or added (deflated, as the shipped file is)."""
    return _rewrite_zip(src, dst, replace, zipfile.ZIP_DEFLATED)


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(a, dtype=np.float32), allow_pickle=False)
    return buf.getvalue()


def _with_meta(dst: pathlib.Path, change) -> pathlib.Path:
    m = json.loads(json.dumps(META))
    change(m)
    return _rewrite(dst, {META_NAME: json.dumps(m).encode()})


def _weights(dst: pathlib.Path, fn, names=TENSORS, src: pathlib.Path = SHIPPED_CHECKPOINT) -> pathlib.Path:
    with np.load(src, allow_pickle=False) as z:
        return _rewrite(dst, {f"{k}.npy": _npy(fn(z[k])) for k in names}, src)


# ------------------------------------------------------------------ issue 42 item 2: non-finite weights
def test_cli_evaluate_of_a_nan_checkpoint_exits_2_with_one_line_naming_the_tensor(tmp_path, capsys):
    from eval import cli

    bad = _weights(tmp_path / "nan.npz", lambda a: np.full_like(a, np.nan), ["pair_out.weight"])
    out = tmp_path / "t.md"
    argv = ["train", "evaluate", "--checkpoint", str(bad), "--scenarios", "dev", "--policies", "rr", "--days", "1",
            "--duration-s", "4", "--out", str(out), "--cache", ""]
    assert cli.main(argv) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == (f"carbon-gym train: error: checkpoint: {bad}: tensor 'pair_out.weight' holds non-finite weights "
                        "(8 NaN, 0 inf of 8 values): the file is damaged or was edited")
    assert not out.exists() and "carbon" not in cap.out  # refused before any episode ran (rr's included)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["one", "one value", "all"])
def test_non_finite_weights_are_refused_on_load_naming_the_tensor(tmp_path, value, where):
    if where == "one value":
        path = _weights(tmp_path / "x.npz", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 3, value, a),
                        ["dc_encoder.0.weight"])
        name, count = "dc_encoder.0.weight", 1
    else:
        names = ["defer_head.0.weight"] if where == "one" else TENSORS
        path = _weights(tmp_path / "x.npz", lambda a: np.full_like(a, value), names)
        name, count = names[0], int(np.prod(META["tensors"][names[0]]["shape"]))
    nan, inf = (count, 0) if np.isnan(value) else (0, count)
    pattern = rf"^checkpoint: .*: tensor '{name}' holds non-finite weights \({nan} NaN, {inf} inf of "
    if where == "all":
        pattern += rf".*so do {len(TENSORS) - 1} other tensors"
    for load in (read_set_checkpoint, LearnedPolicy.load, lambda p: export_checkpoint(p, tmp_path / "out.npz")):
        with pytest.raises(ConfigError, match=pattern) as err:
            load(path)
        assert err.value.field == "checkpoint" and "\n" not in str(err.value)
    assert not (tmp_path / "out.npz").exists()


# ------------------------------------------------------------------ issue 42 item 3: extra members
def _planted_data(marker: pathlib.Path) -> bytes:
    """An SB3 ``data`` member whose ``policy_class`` is a pickled :class:`Payload`."""
    entry = {":type:": "<class 'abc.ABCMeta'>", ":serialized:": base64.b64encode(pickle.dumps(Payload(marker))).decode()}
    return json.dumps({"policy_class": entry}).encode()


@pytest.mark.parametrize("extra", ["data", "policy.pth", "notes.txt"])
def test_extra_members_are_refused_by_every_loader(tmp_path, capsys, extra):
    from eval import cli

    marker = tmp_path / "pwned"
    payload = _planted_data(marker) if extra == "data" else b"anything"
    bad = _rewrite(tmp_path / "extra.npz", {extra: payload})
    pattern = rf"^checkpoint: .*unknown members \['{extra}'\].*allowed: {META_NAME} and one <tensor>.npy"
    for load in (read_set_checkpoint, LearnedPolicy.load, lambda p: export_checkpoint(p, tmp_path / "x.npz")):
        with pytest.raises(ConfigError, match=pattern):
            load(bad)
    for argv in (["train", "export", "--checkpoint", str(bad), "--out", str(tmp_path / "x.npz")],
                 ["train", "evaluate", "--checkpoint", str(bad), "--scenarios", "dev", "--policies", "rr", "--days", "1",
                  "--duration-s", "4", "--out", str(tmp_path / "t.md"), "--cache", ""],
                 ["train", "decision-time", "--checkpoint", str(bad), "--scenario", "dev", "--steps", "1"]):
        assert cli.main(argv) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"unknown members ['{extra}']" in lines[0], (argv, lines)
    assert not marker.exists() and not (tmp_path / "x.npz").exists() and not (tmp_path / "t.md").exists()
    if extra == "data":  # (the payload is real)
        pickle.loads(base64.b64decode(json.loads(payload)["policy_class"][":serialized:"]))
        assert marker.exists()


def test_duplicate_members_are_refused(tmp_path):
    bad = tmp_path / "dup.npz"
    with zipfile.ZipFile(SHIPPED_CHECKPOINT) as zin, zipfile.ZipFile(bad, "w") as zout, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (zipfile warns about the duplicate name)
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
        zout.writestr("pair_out.bias.npy", _npy(np.zeros(1)))
    with pytest.raises(ConfigError, match=r"members \['pair_out.bias.npy'\] appear more than once"):
        read_set_checkpoint(bad)


# ------------------------------------------------------------------ issue 43 item 2: metadata before allocation
@pytest.fixture
def no_real_network(monkeypatch):
    """Records the default device of every SetNetwork built: a refused checkpoint may build one
    on the ``meta`` device (no parameters allocated), never a real one."""
    from train import set_policy

    built: list[str] = []
    init = set_policy.SetNetwork.__init__

    def spy(self, *args, **kwargs):
        built.append(str(th.get_default_device()))
        init(self, *args, **kwargs)

    monkeypatch.setattr(set_policy.SetNetwork, "__init__", spy)
    return built


def _set(section: str, key: str | None, value):
    def change(m):
        if key is None:
            m[section] = value
        else:
            m[section][key] = value
    return change


META_CASES = {
    "hidden=1e4": (_set("network", "hidden", 1e4), r"network.hidden must be an integer in 1..2048, got 10000.0 \(float\)"),
    "hidden=10000": (_set("network", "hidden", 10000), r"network.hidden must be an integer in 1..2048, got 10000 \(int\)"),
    "hidden=1e6": (_set("network", "hidden", 1e6), r"network.hidden must be an integer in 1..2048, got 1000000.0"),
    "hidden=1000000": (_set("network", "hidden", 1000000), r"network.hidden must be an integer in 1..2048, got 1000000 "),
    "hidden=8.7": (_set("network", "hidden", 8.7), r"network.hidden must be an integer in 1..2048, got 8.7 \(float\)"),
    "hidden=true": (_set("network", "hidden", True), r"network.hidden must be an integer in 1..2048, got True \(bool\)"),
    "hidden=0": (_set("network", "hidden", 0), r"network.hidden must be an integer in 1..2048, got 0"),
    "load_feedback=true": (_set("network", "load_feedback", True), r"network.load_feedback must be an integer in 0..16"),
    "demand_features=1": (_set("network", "demand_features", 1), r"network.demand_features must be true or false"),
    "layout=5": (_set("network", "layout", 5), r"network.layout must be an object, got int 5"),
    "layout.n_datacenters=2.5": (lambda m: m["network"]["layout"].update(n_datacenters=2.5),
                                 r"network.layout.n_datacenters must be an integer"),
    "policy=5": (_set("policy", None, 5), r"'policy' must be an object, got int 5"),
    "training=5": (_set("training", None, 5), r"'training' must be an object, got int 5"),
    "env=5": (_set("env", None, 5), r"'env' must be an object \(the env record\) or null, got int 5"),
    "network=5": (_set("network", None, 5), r"'network' must be an object, got int 5"),
    "tensors=5": (_set("tensors", None, 5), r"'tensors' must be an object, got int 5"),
    "fingerprint=5": (_set("fingerprint", None, 5), r"'fingerprint' must be a list of env records, got int"),
    "knob='5'": (_set("policy", "load_price", "5"), r"^load_price: .*policy.load_price must be a number, got '5'"),
    "format_version=true": (_set("format_version", None, True), r"format_version True is not supported"),
    "unknown section": (_set("extra", None, {}), r"unknown sections \['extra'\]"),
    "tensor dtype": (lambda m: m["tensors"]["pair_out.bias"].update(dtype="float64"),
                     r"tensor 'pair_out.bias': dtype 'float64' is not float32"),
    "tensor shape 1.5": (lambda m: m["tensors"]["pair_out.bias"].update(shape=[1.5]),
                         r"tensor 'pair_out.bias': shape must be a list of at most 4 non-negative integers"),
    "tensor 1e12 values": (lambda m: m["tensors"]["pair_out.bias"].update(shape=[1000000, 1000000]),
                           r"tensor 'pair_out.bias': shape \[1000000, 1000000\] is 1000000000000 values \(at most"),
    "tensor name": (lambda m: m["tensors"].update({"../x": {"shape": [1], "dtype": "float32"}}),
                    r"tensor '../x': not a parameter name"),
}


@pytest.mark.parametrize("case", list(META_CASES))
def test_bad_metadata_gives_the_named_error_before_anything_is_built(tmp_path, no_real_network, case):
    change, pattern = META_CASES[case]
    path = _with_meta(tmp_path / "m.npz", change)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=pattern) as err:
            LearnedPolicy.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(err.value) and peak < 20 << 20, peak
    assert no_real_network == []


def test_a_hidden_size_that_does_not_fit_the_tensors_allocates_nothing(tmp_path, no_real_network):
    """hidden 2048 (admitted) against the stored 8-wide tensors: the shapes are compared on a
    network built on the meta device (a real one would hold ~46 M weights)."""
    path = _with_meta(tmp_path / "wide.npz", _set("network", "hidden", 2048))
    with pytest.raises(ConfigError, match=r"tensors do not fit the network .*wrong shape \['dc_context.bias'"):
        LearnedPolicy.load(path)
    assert no_real_network == ["meta"]


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deeply_nested_json_is_refused_before_parsing(tmp_path, opener):
    m = json.loads(json.dumps(META))
    m["training"] = {"deep": "PLACEHOLDER"}
    closer = "]" if opener == "[" else "}"
    text = json.dumps(m).replace('"PLACEHOLDER"', opener * 100_000 + "1" + closer * 100_000)
    path = _rewrite(tmp_path / "deep.npz", {META_NAME: text.encode()})
    with pytest.raises(ConfigError, match=rf"{META_NAME}: nested 100002 levels deep \(at most 64\)"):
        LearnedPolicy.load(path)
    # (brackets inside strings do not count)
    m["training"] = {"note": "[" * 1000 + '\\"{' * 100}
    assert read_set_checkpoint(_rewrite(tmp_path / "s.npz", {META_NAME: json.dumps(m).encode()})).training == m["training"]


def test_oversized_or_broken_json_is_refused(tmp_path):
    m = json.loads(json.dumps(META))
    m["training"] = {"blob": "x" * (2 << 20)}
    with pytest.raises(ConfigError, match=rf"member '{META_NAME}' is \d+ bytes \(at most 1048576\)"):
        LearnedPolicy.load(_rewrite(tmp_path / "big.npz", {META_NAME: json.dumps(m).encode()}))
    with pytest.raises(ConfigError, match=r"not valid JSON"):
        LearnedPolicy.load(_rewrite(tmp_path / "broken.npz", {META_NAME: b'{"format": '}))
    with pytest.raises(ConfigError, match=r"not UTF-8 text"):
        LearnedPolicy.load(_rewrite(tmp_path / "latin.npz", {META_NAME: b'{"format": "\xff"}'}))


def _header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def test_npy_header_claiming_1e12_values_is_refused_unread(tmp_path):
    """Crafted header bytes (no data behind them): refused from the header alone, whether or
    not the metadata lists the same shape; nothing near the claimed 4 TB is allocated."""
    huge = (1_000_000, 1_000_000)
    alone = _rewrite(tmp_path / "h1.npz", {"pair_out.bias.npy": _header(huge)})
    m = json.loads(json.dumps(META))
    m["tensors"]["pair_out.bias"]["shape"] = list(huge)
    both = _rewrite(tmp_path / "h2.npz", {"pair_out.bias.npy": _header(huge), META_NAME: json.dumps(m).encode()})
    short = _rewrite(tmp_path / "h3.npz", {"pair_out.bias.npy": _header((1,))})  # the right shape, no data
    cases = [(alone, r"pair_out.bias.npy is float32 \[1000000, 1000000\], expected float32 \[1\]"),
             (both, r"tensor 'pair_out.bias': shape \[1000000, 1000000\] is 1000000000000 values"),
             (short, r"pair_out.bias.npy is 128 bytes, its header says 132")]
    tracemalloc.start()
    try:
        for path, pattern in cases:
            with pytest.raises(ConfigError, match=pattern):
                LearnedPolicy.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, peak


HEADER_CASES = {
    "big-endian": (lambda: _header((1,), ">f4") + b"\0" * 4, r"pair_out.bias.npy is >f4 \[1\], expected float32 \[1\]"),
    "object": (lambda: _header((1,), "|O") + b"\0" * 8, r"pair_out.bias.npy is not a plain numeric array \(an object array"),
    "not npy": (lambda: b"hello", r"pair_out.bias.npy is not a plain numeric array"),
    "trailing bytes": (lambda: _npy(np.zeros(1)) + b"junk", r"pair_out.bias.npy is 136 bytes, its header says 132"),
}


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_other_npy_headers_are_refused(tmp_path, case):
    data, pattern = HEADER_CASES[case]
    with pytest.raises(ConfigError, match=pattern):
        read_set_checkpoint(_rewrite(tmp_path / "x.npz", {"pair_out.bias.npy": data()}))


# ------------------------------------------------------------------ large finite weights at decision time
def _run(pol: LearnedPolicy, steps: int = 3) -> None:
    from train.envs import make_episode_env

    env = make_episode_env("dev", {"duration_s": 8}, None)
    obs, info = env.reset(seed=0)
    pol.reset(env)
    try:
        for _ in range(steps):
            a = pol.act(obs, info)
            mask = np.asarray(info["action_mask"]).reshape(len(a), -1)
            assert mask[np.arange(len(a)), a].all()
            obs, _, _, _, info = env.step(a)
    finally:
        env.close()


def test_huge_finite_weights_load_and_unusable_logits_are_refused_at_the_decision(tmp_path):
    from train.policy import _LOGIT_FLOOR
    from train.slot_dist import MASKED_LOGIT

    assert _LOGIT_FLOOR == MASKED_LOGIT / 2
    ones = _weights(tmp_path / "big.npz", lambda a: np.full_like(a, 1e38))
    negative = _weights(tmp_path / "negative.npz", lambda a: np.full_like(a, -1e38))
    # numpy path (float64): all weights 1e38 give finite logits and run
    _run(LearnedPolicy.load(ones))
    # torch path (float32): NaN / inf logits, refused at the first decision
    torch_pol = LearnedPolicy.load(ones, backend="torch", mode="argmax", headroom_penalty=0.0)
    with pytest.raises(ConfigError, match=r"^checkpoint: .*big.npz: the network's routing logits on this observation are "
                                          r"unusable \(\d+ NaN, \d+ inf, 0 at or below -5e\+07, of \d+; computed in float32\)"):
        _run(torch_pol)
    # all weights -1e38: finite float64 logits (the ReLUs pass nothing: about the -1e38 biases) far
    # below the masking logit's half, where a masked choice could win: refused
    with pytest.raises(ConfigError, match=r"routing logits .* unusable \(0 NaN, 0 inf, [1-9]\d* at or below -5e\+07.*float64"):
        _run(LearnedPolicy.load(negative))


@pytest.mark.parametrize("path", [SHIPPED_CHECKPOINT, CAPACITY_CHECKPOINT], ids=lambda p: p.name)
def test_shipped_checkpoints_pass_every_check(path):
    ck = read_set_checkpoint(path)
    net = network_from_checkpoint(ck)
    assert {k: tuple(v.shape) for k, v in net.state_dict().items()} == {k: a.shape for k, a in ck.tensors.items()}
    with np.load(path, allow_pickle=False) as z:
        assert all(np.array_equal(z[k], ck.tensors[k]) for k in ck.tensors)
