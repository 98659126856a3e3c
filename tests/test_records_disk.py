"""Streaming records to a disk that fills up, and bad ``record_dir`` paths (issue 22, item 3)."""

from __future__ import annotations

import errno
import os
import warnings

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError, RecordWriteError
from carbon_gym.sim import records as records_mod
from carbon_gym.sim.records import load_record_dir


def _env(tmp_path, **kw) -> GeoServeEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GeoServeEnv("dev", overrides={"duration_s": 12.0}, record_dir=tmp_path / "rec", record_chunk_rows=8, **kw)


def _rr(env: GeoServeEnv, step: int) -> np.ndarray:
    K, D = env.layout.max_pending, env.layout.n_datacenters
    return (np.arange(K) + step) % D


def _full_disk(monkeypatch, after_files: int) -> None:
    """A stubbed writer: the chunk files after the first ``after_files`` fail with ENOSPC midway."""
    real = np.lib.format.write_array
    calls = {"files": 0}
    real_zip = records_mod.RecordWriter.flush

    def write_array(f, arr, allow_pickle=False):  # noqa: ANN001
        if calls["files"] >= after_files:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(f, arr, allow_pickle=allow_pickle)

    def flush(self):  # noqa: ANN001
        n = len(self.files)
        real_zip(self)
        if len(self.files) > n:
            calls["files"] += 1

    monkeypatch.setattr(np.lib.format, "write_array", write_array)
    monkeypatch.setattr(records_mod.RecordWriter, "flush", flush)


def test_disk_full_mid_episode_gives_a_clear_error_and_a_consistent_env(tmp_path, monkeypatch) -> None:
    ref = _env(tmp_path / "ref")
    ref.reset(seed=0)
    done, k = False, 0
    while not done:
        *_, done, info = ref.step(_rr(ref, k))
        k += 1
    ref_em = info["episode_metrics"]

    _full_disk(monkeypatch, after_files=2)
    env = _env(tmp_path)
    env.reset(seed=0)
    k = 0
    with pytest.raises(RecordWriteError) as ei:
        for k in range(100):
            env.step(_rr(env, k))
    msg = str(ei.value)
    assert str(tmp_path / "rec") in msg and "No space left on device" in msg and "reset()" in msg
    assert ei.value.directory.startswith(str(tmp_path / "rec"))
    # the episode is closed: a clear RuntimeError, not a misleading ConfigError
    with pytest.raises(RuntimeError, match="reset"):
        env.step(_rr(env, k + 1))
    em = env.episode_metrics(check_ledger=True)  # no OSError: the unwritten rows are in memory
    assert em["ledger"]["ok"] and em["completed"] > 16
    # the first 2 files hold what they held; no partial third file
    files = sorted(p.name for p in (tmp_path / "rec" / "episode-00000").iterdir())
    assert files == ["part-00000.npz", "part-00001.npz"]
    on_disk = load_record_dir(tmp_path / "rec" / "episode-00000")
    assert 16 <= len(on_disk) < em["completed"]
    # nothing lost: disk + memory hold every completed request, and the percentiles are exact
    every = env.unwrapped._writer.read_all()
    assert len(every) == em["completed"] and np.array_equal(every.request_id[: len(on_disk)], on_disk.request_id)
    assert em["ttft_p90_s"] == float(np.percentile(every.ttft_s, 90))
    assert ref_em["ledger"]["ok"] and ref_em["completed"] > em["completed"]
    env.close()  # does not raise again


def test_disk_full_at_the_final_flush(tmp_path, monkeypatch) -> None:
    _full_disk(monkeypatch, after_files=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = GeoServeEnv("dev", overrides={"duration_s": 3.0}, record_dir=tmp_path / "rec", record_chunk_rows=10**6)
    env.reset(seed=0)
    with pytest.raises(RecordWriteError, match="rec"):
        for k in range(10):
            env.step(_rr(env, k))
    assert env.episode_metrics()["ledger"]["ok"]
    monkeypatch.undo()
    env.reset(seed=1)  # a new episode in a new directory works again
    assert (tmp_path / "rec" / "episode-00001").is_dir()


@pytest.mark.parametrize("bad, what", [("", "empty path"), ("a\x00b", "NUL byte")])
def test_bad_record_dir_strings(bad: str, what: str) -> None:
    with pytest.raises(ConfigError, match=what) as ei:
        GeoServeEnv("dev", record_dir=bad)
    assert ei.value.field == "record_dir"


def test_record_dir_under_a_file(tmp_path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="cannot create") as ei:
        GeoServeEnv("dev", record_dir=f / "sub")
    assert ei.value.field == "record_dir"
    with pytest.raises(ConfigError, match="not a directory"):
        GeoServeEnv("dev", record_dir=f)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write anywhere")
def test_record_dir_unwritable(tmp_path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match="not writable"):
            GeoServeEnv("dev", record_dir=d)
    finally:
        d.chmod(0o700)


# ------------------------------------------------------------------ issue 42, item 1: a real full filesystem
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: Runs the dev env with records under argv[1] until a write fails, in a Gymnasium AsyncVectorEnv
#: (argv[2] == "vector": the worker's error re-raised as ``type(err)(str(err))``) or plainly;
#: argv[3] (optional): RLIMIT_FSIZE in bytes (SIGXFSZ ignored, so writes past it fail with EFBIG).
_RUN_TO_FULL = r'''
import json, resource, signal, sys, warnings
import numpy as np
import gymnasium as gym
from carbon_gym.env import GeoServeEnv
warnings.simplefilter("ignore")

def make():
    return GeoServeEnv("dev", overrides={"duration_s": 60.0}, record_dir=sys.argv[1], record_chunk_rows=8)

if len(sys.argv) > 3:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
env = gym.vector.AsyncVectorEnv([make], context="fork", shared_memory=False) if sys.argv[2] == "vector" else make()
env.reset(seed=0)
n = env.single_action_space.shape[0] if sys.argv[2] == "vector" else env.action_space.shape[0]
out = {"type": None}
try:
    for k in range(500):
        a = np.arange(n) % 3
        env.step(a[None] if sys.argv[2] == "vector" else a)
except Exception as e:
    out = {"type": type(e).__name__, "msg": str(e), "directory": getattr(e, "directory", None)}
print(json.dumps(out))
'''


def _run_to_full(cmd_prefix: list[str], record_dir: str, mode: str, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run([*cmd_prefix, sys.executable, "-c", _RUN_TO_FULL, record_dir, mode, *extra], env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _tmpfs_prefix(mount: str, size: str) -> list[str]:
    """``unshare -rm`` + a tmpfs of ``size`` at ``mount`` (a private mount namespace, no root
    needed where user namespaces are allowed), or a skip saying why not."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): cannot mount a small tmpfs without root")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs {mount}"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"unprivileged tmpfs mount not allowed here: {probe.stderr.strip()[:200]}")
    return ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs {mount} && exec "$@"', "sh"]


@pytest.mark.parametrize("mode", ["plain", "vector"])
def test_full_tmpfs_gives_record_write_error(tmp_path, mode: str) -> None:
    """A real 12 KiB filesystem fills up: the env (and Gymnasium's AsyncVectorEnv re-raising the
    worker's error, formerly a TypeError) raises RecordWriteError naming the directory and ENOSPC."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    out = _run_to_full(_tmpfs_prefix(str(mount), "12k"), str(mount / "rec"), mode)
    assert out["type"] == "RecordWriteError", out
    assert out["msg"].startswith(f"record_dir {mount}/rec/episode-00000: cannot write part-000")
    assert "No space left on device" in out["msg"] and "unwritten records are kept in memory" in out["msg"]
    assert out["directory"] == f"{mount}/rec/episode-00000"


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE / SIGXFSZ behaviour checked on Linux only")
@pytest.mark.parametrize("mode", ["plain", "vector"])
def test_file_size_limit_gives_record_write_error(tmp_path, mode: str) -> None:
    """RLIMIT_FSIZE of 6000 bytes (SIGXFSZ ignored): the chunk file that passes it fails with EFBIG."""
    out = _run_to_full([], str(tmp_path / "rec"), mode, "6000")
    assert out["type"] == "RecordWriteError", out
    assert "File too large" in out["msg"] and out["directory"] == str(tmp_path / "rec" / "episode-00000")
