"""Checkpoints without code execution (train.checkpoint): the pickle-free set-policy format, the
trust rule for stable-baselines3 zips, and clear errors for malicious or malformed files.

Each malicious file carries a payload that creates a marker file when unpickled; every test
checks that the payload really runs when the file is opened the unsafe way (so the test can
fail), and that the carbon-gym entry points (API and CLI) give a clear error without creating it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pathlib
import pickle
import subprocess
import sys
import warnings
import zipfile

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

import torch as th  # noqa: E402

from carbon_gym.errors import ConfigError  # noqa: E402
from train.checkpoint import META_NAME, checkpoint_format, read_set_checkpoint  # noqa: E402
from train.policy import SHIPPED_CHECKPOINT, LearnedPolicy, export_checkpoint, make_learned_policy  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class Payload:
    """Unpickles as ``Path(marker).touch()``: what a malicious checkpoint could run instead."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.fixture(scope="module")
def sb3_zip(tmp_path_factory):
    """A genuine MaskablePPO set-policy checkpoint (dev layout, class network)."""
    from sb3_contrib import MaskablePPO

    from train.envs import make_episode_env
    from train.set_policy import SetActorCriticPolicy, layout_spec

    warnings.simplefilter("ignore", UserWarning)
    env = make_episode_env("dev", {"duration_s": 4}, None)
    model = MaskablePPO(SetActorCriticPolicy, env, n_steps=8, batch_size=8, device="cpu", seed=0,
                        policy_kwargs={"layout": layout_spec(env), "hidden": 8, "classes": True})
    path = tmp_path_factory.mktemp("sb3") / "agent.zip"
    model.save(path)
    return path


def _rewrite(src: pathlib.Path, dst: pathlib.Path, replace: dict[str, bytes],
             compression: int = zipfile.ZIP_STORED) -> pathlib.Path:
    """``src`` copied to ``dst`` with members replaced or added."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for name in zin.namelist():
            zout.writestr(name, replace.get(name, zin.read(name)))
        for name, data in replace.items():
            if name not in zin.namelist():
                zout.writestr(name, data)
    return dst


def _malicious_data(sb3_zip: pathlib.Path, marker: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """``sb3_zip`` whose ``data`` entry ``policy_class`` is a pickled :class:`Payload`."""
    with zipfile.ZipFile(sb3_zip) as zf:
        data = json.loads(zf.read("data"))
    data["policy_class"] = {":type:": "<class 'abc.ABCMeta'>",
                            ":serialized:": base64.b64encode(pickle.dumps(Payload(marker))).decode()}
    return _rewrite(sb3_zip, dst, {"data": json.dumps(data).encode()})


def test_pickled_sb3_checkpoint_is_refused_without_trust_and_runs_nothing(sb3_zip, tmp_path, capsys):
    from eval import cli

    marker = tmp_path / "pwned"
    bad = _malicious_data(sb3_zip, marker, tmp_path / "shared_agent.zip")
    assert checkpoint_format(bad) == "sb3"
    with pytest.raises(ConfigError, match=r"^trust: .*stable-baselines3 checkpoint.*can run code") as err:
        LearnedPolicy.load(bad)
    assert err.value.field == "trust"
    with pytest.raises(ConfigError, match="trust"):
        make_learned_policy(str(bad))
    with pytest.raises(ConfigError, match="trust"):
        export_checkpoint(bad, tmp_path / "out.npz")
    assert not marker.exists()
    # the command line: one error line naming the flag, exit status 2, nothing run
    for argv in (["eval", "--policies", f"learned:{bad}", "--scenarios", "dev", "--seeds", "1", "--out", str(tmp_path / "ev"),
                  "--no-progress", "--no-plots"],
                 ["experiment", "headline", "--policies", f"learned:{bad}", "--scenarios", "dev", "--out", str(tmp_path / "ex")],
                 ["train", "evaluate", "--checkpoint", str(bad), "--scenarios", "dev", "--policies", "rr", "--days", "1",
                  "--out", str(tmp_path / "t.md"), "--cache", ""],
                 ["train", "export", "--checkpoint", str(bad), "--out", str(tmp_path / "x.npz")],
                 ["train", "decision-time", "--checkpoint", str(bad), "--scenario", "dev", "--steps", "1"]):
        assert cli.main(argv) == 2, argv
        errline = capsys.readouterr().err.strip().splitlines()
        assert len(errline) == 1 and "trust" in errline[0] and "stable-baselines3" in errline[0], (argv, errline)
        assert not marker.exists(), argv
    assert not (tmp_path / "ev").exists() and not (tmp_path / "x.npz").exists()
    # (the payload is real: trusting the file runs it, then the broken entry gives a clear error)
    with pytest.raises(ConfigError):
        LearnedPolicy.load(bad, trust=True)
    assert marker.exists()


def test_malicious_policy_pth_gives_a_clear_error_even_when_trusted(sb3_zip, tmp_path):
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    th.save({"policy.net.pair_out.bias": Payload(marker)}, buf)
    bad = _rewrite(sb3_zip, tmp_path / "bad_pth.zip", {"policy.pth": buf.getvalue()})
    with pytest.raises(ConfigError, match=r"policy.*\.pth member holds objects other than tensors"):
        LearnedPolicy.load(bad, trust=True)
    assert not marker.exists()
    th.load(io.BytesIO(buf.getvalue()), weights_only=False)  # (the payload is real)
    assert marker.exists()


def test_set_checkpoint_with_a_pickled_tensor_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    obj = io.BytesIO()
    np.save(obj, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    bad = _rewrite(SHIPPED_CHECKPOINT, tmp_path / "bad.npz", {"pair_out.bias.npy": obj.getvalue()})
    with pytest.raises(ConfigError, match=r"pair_out.bias.npy is not a plain numeric array"):
        LearnedPolicy.load(bad)
    assert not marker.exists()
    np.load(bad, allow_pickle=True)["pair_out.bias"]  # (the payload is real)
    assert marker.exists()


def test_malformed_set_checkpoints_name_what_is_wrong(tmp_path):
    with zipfile.ZipFile(SHIPPED_CHECKPOINT) as zf:
        meta = json.loads(zf.read(META_NAME))

    def variant(name: str, **replace: bytes) -> pathlib.Path:
        return _rewrite(SHIPPED_CHECKPOINT, tmp_path / name, {k.replace("__", "."): v for k, v in replace.items()})

    def with_meta(name: str, change) -> pathlib.Path:
        m = json.loads(json.dumps(meta))
        change(m)
        return _rewrite(SHIPPED_CHECKPOINT, tmp_path / name, {META_NAME: json.dumps(m).encode()})

    f64 = io.BytesIO()
    np.save(f64, np.zeros(1), allow_pickle=False)
    cases = [
        (variant("f64.npz", pair_out__bias__npy=f64.getvalue()), r"pair_out.bias.npy is float64 \[1\], expected float32 \[1\]"),
        (with_meta("version.npz", lambda m: m.update(format_version=9)), r"format_version 9 is not supported.*allowed: 1"),
        (with_meta("mode.npz", lambda m: m["policy"].update(mode="greedy")), r"mode: .*unknown mode 'greedy'"),
        (with_meta("knob.npz", lambda m: m["policy"].update(load_price=-1)), r"load_price: must be finite and >= 0"),
        (with_meta("key.npz", lambda m: m["network"].update(dropout=0.1)), r"network section has unknown keys \['dropout'\]"),
        (with_meta("hidden.npz", lambda m: m["network"].update(hidden=16)), r"tensors do not fit the network .*wrong shape"),
        (with_meta("extra.npz", lambda m: m["tensors"].update({"x": {"shape": [1], "dtype": "float32"}})),
         r"tensor 'x' is listed but 'x.npy' is missing"),
    ]
    for path, pattern in cases:
        with pytest.raises(ConfigError, match=pattern):
            LearnedPolicy.load(path)


def test_shipped_checkpoint_loads_without_unpickling_anything():
    """In a fresh interpreter, an audit hook counts ``pickle.find_class`` events (every global an
    unpickler resolves: how a pickle runs code) while the shipped agent loads and decides."""
    code = """
import json, pickle, sys, warnings
warnings.simplefilter("ignore")
import torch
from train.envs import make_episode_env
from train.policy import SHIPPED_CHECKPOINT, LearnedPolicy
env = make_episode_env("dev", {"duration_s": 3}, None)
seen = []
on = [True]
sys.addaudithook(lambda ev, args: seen.append(str(args)) if on[0] and ev == "pickle.find_class" else None)
pol = LearnedPolicy.load(SHIPPED_CHECKPOINT)
obs, info = env.reset(seed=0)
pol.reset(env)
pol.act(obs, info)
on[0] = False
n = len(seen)
on[0] = True
import pathlib
pickle.loads(pickle.dumps(pathlib.Path("x")))  # (the hook sees an unpickled global)
on[0] = False
print(json.dumps({"during_load": seen[:n], "control": len(seen) - n, "mode": pol.mode, "knobs": pol.safety}))
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["during_load"] == [] and out["control"] >= 1
    assert out["mode"] == "systematic" and out["knobs"] == {"load_price": 0.0, "headroom_penalty": 20.0, "headroom_margin": 0.6}


def test_shipped_checkpoint_is_the_pickle_free_format_with_its_records():
    from train.checkpoint import FORMAT, checkpoint_env_meta

    assert checkpoint_format(SHIPPED_CHECKPOINT) == "set"
    with zipfile.ZipFile(SHIPPED_CHECKPOINT) as zf:
        names = zf.namelist()
        meta = json.loads(zf.read(META_NAME))
    assert meta["format"] == FORMAT and set(names) == {META_NAME} | {f"{k}.npy" for k in meta["tensors"]}
    ck = read_set_checkpoint(SHIPPED_CHECKPOINT)
    assert ck.policy == {"mode": "systematic", "load_price": 0.0, "headroom_penalty": 20.0, "headroom_margin": 0.6}
    assert ck.env == checkpoint_env_meta()
    assert ck.network["hidden"] == 8 and ck.network["load_feedback"] == 1 and ck.network["demand_features"] is True
    assert ck.training["config"]["name"] == "llama8b_dagger_h8"
    assert ck.training["data_days"]["validation_starts_utc"] == ["2023-06-13T07:13:00Z", "2023-01-28T16:23:00Z"]
    # the tensors are numpy's own format: numpy reads them without pickle
    with np.load(SHIPPED_CHECKPOINT, allow_pickle=False) as z:
        assert np.array_equal(z["pair_out.weight"], ck.tensors["pair_out.weight"])


def test_export_round_trip_is_byte_identical_and_keeps_the_records(tmp_path):
    out = export_checkpoint(SHIPPED_CHECKPOINT, tmp_path / "copy.npz")
    assert out.read_bytes() == SHIPPED_CHECKPOINT.read_bytes()
    knob = export_checkpoint(SHIPPED_CHECKPOINT, tmp_path / "k.npz", mode="argmax", safety={"headroom_penalty": 5.0})
    ck = read_set_checkpoint(knob)
    assert ck.policy == {"mode": "argmax", "load_price": 0.0, "headroom_penalty": 5.0, "headroom_margin": 0.6}
    assert ck.training == read_set_checkpoint(SHIPPED_CHECKPOINT).training


def test_trusted_sb3_export_gives_the_same_network_and_actions(sb3_zip, tmp_path):
    from train.envs import make_episode_env

    a = LearnedPolicy.load(sb3_zip, trust=True, mode="systematic")
    b = LearnedPolicy.load(export_checkpoint(sb3_zip, tmp_path / "agent.npz", mode="systematic", trust=True))
    sa, sb = a.net.state_dict(), b.net.state_dict()
    assert sa.keys() == sb.keys() and all(th.equal(sa[k], sb[k]) for k in sa)
    env = make_episode_env("dev", {"duration_s": 4}, None)
    obs, info = env.reset(seed=2)
    a.reset(env)
    b.reset(env)
    for _ in range(3):
        x = a.act(obs, info)
        assert np.array_equal(x, b.act(obs, info))
        obs, _, _, _, info = env.step(x)


def test_trust_flag_lets_the_cli_evaluate_an_sb3_checkpoint(sb3_zip, tmp_path, capsys):
    """--trust-checkpoint reaches the policy factory through the harness (the run completes and
    its table has the learned row)."""
    from eval import cli

    out = tmp_path / "ev"
    argv = ["eval", "--policies", f"learned:{sb3_zip}", "--scenarios", "dev", "--seeds", "1", "--duration-s", "4",
            "--out", str(out), "--workers", "1", "--no-progress", "--no-plots", "--no-tensorboard", "--no-requests"]
    assert cli.main(argv) == 2 and not out.exists()
    capsys.readouterr()
    assert cli.main(argv + ["--trust-checkpoint"]) == 0
    assert "learned" in (out / "summary.md").read_text()


def test_fingerprint_is_recorded_and_checked_against_the_env(tmp_path):
    import warnings

    from carbon_gym.env import GeoServeEnv
    from train.checkpoint import check_env_fingerprint, env_fingerprint, save_set_checkpoint
    from train.policy import LearnedPolicy
    from train.set_policy import SetNetwork, layout_spec

    dev = GeoServeEnv("dev", overrides={"duration_s": 3.0})
    fp = env_fingerprint(dev)
    assert fp["scenario"] == "dev" and fp["n_datacenters"] == 2 and fp["n_regions"] == 1
    assert fp["capacity_control"] == "always_on" and fp["action"] == "route" and len(fp["layout_hash"]) == 16
    assert env_fingerprint(GeoServeEnv("dev", overrides={"duration_s": 3.0})) == fp  # deterministic
    net = SetNetwork(layout_spec(dev), hidden=4, classes=True)
    path = save_set_checkpoint(tmp_path / "fp.npz", net, fingerprint=[fp])
    pol = LearnedPolicy.load(path)
    assert pol.fingerprint == [fp]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pol.reset(dev)  # the training env: nothing to say
    assert pol.env_mismatches == []
    # other slots K and capacity control: each difference named
    other = GeoServeEnv("dev", overrides={"duration_s": 3.0, "env.max_pending": 24, "capacity.control": "agent"})
    with pytest.warns(UserWarning, match="max_pending: checkpoint") as rec:
        pol.reset(other)
    msg = str(rec[0].message)
    for name in ("max_pending", "capacity_control", "action", "layout_hash"):
        assert f"{name}: checkpoint" in msg
    assert "n_datacenters" not in msg and "scenario" not in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pol.reset(other)  # warned once for the same mismatches
    assert any(m.startswith("max_pending") for m in pol.env_mismatches)
    # another scenario and topology size; refused on request
    big = GeoServeEnv("llama8b-low", overrides={"duration_s": 3.0})
    strict = LearnedPolicy.load(path, on_env_mismatch="error")
    with pytest.raises(ConfigError, match=r"scenario: checkpoint trained on \['dev'\], this env 'llama8b-low'.*n_datacenters: "
                                          r"checkpoint 2, this env 16"):
        strict.reset(big)
    assert check_env_fingerprint(None, big, "x") == []  # older checkpoints record none
    # the load: another rate is named; a fingerprint without the field (older checkpoints) does not compare it
    assert fp["rate_per_s"] == 8.0
    busier = GeoServeEnv("dev", overrides={"duration_s": 3.0, "workload.rate_per_s": 12.0})
    assert check_env_fingerprint([fp], busier, "x", on_mismatch="ignore") == ["rate_per_s: checkpoint 8.0, this env 12.0"]
    older = {k: v for k, v in fp.items() if k != "rate_per_s"}
    assert check_env_fingerprint([older], busier, "x", on_mismatch="ignore") == []
    busier.close()
    with pytest.raises(ConfigError, match="on_env_mismatch"):
        LearnedPolicy.load(path, on_env_mismatch="shrug")
    # export keeps it
    from train.policy import export_checkpoint

    assert read_set_checkpoint(export_checkpoint(path, tmp_path / "copy.npz")).fingerprint == [fp]
    for e in (dev, other, big):
        e.close()
