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
