"""``carbon-gym eval`` onto a full disk or under a file size limit (issue 43, item 4): one line
naming the file, exit status 1, and no half-written file under an output's name (each is
written under a hidden temporary name and renamed when complete, :func:`eval.writers.atomic_path`)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from carbon_gym.errors import OutputWriteError

ROOT = Path(__file__).resolve().parents[1]
EVAL = ["eval", "--policies", "rr", "--scenarios", "dev", "--seeds", "1", "--duration-s", "10", "--no-progress",
        "--workers", "1"]
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE / SIGXFSZ behaviour checked on Linux only")


def _limit(nbytes: int):
    """preexec_fn: RLIMIT_FSIZE of ``nbytes`` with SIGXFSZ ignored, so a write past it fails with EFBIG."""
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return pre


def _eval(out: Path, *args: str, prefix: tuple[str, ...] = (), preexec=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([*prefix, sys.executable, "-m", "eval", *EVAL, "--out", str(out), *args], env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=preexec)


def _no_stale_git_lock() -> None:
    """The run's ``git status`` (config.json's versions) takes no index lock that a git killed by
    the size limit's SIGXFSZ (subprocess restores its default) would leave in this checkout."""
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--git-path", "index.lock"], capture_output=True, text=True)
    if r.returncode == 0:
        lock = Path(r.stdout.strip())
        assert not (lock if lock.is_absolute() else ROOT / lock).exists()


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "Exception in thread" not in res.stderr, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1, res.stderr
    return errors[0]


@linux_only
def test_file_size_limit_names_the_file_and_leaves_no_half_file(tmp_path: Path) -> None:
    """20 kB: the first run's request records (~25 kB of parquet) pass it; formerly a raw pyarrow
    OSError traceback and a truncated requests/dev__rr__seed0.parquet of exactly 20000 bytes."""
    out = tmp_path / "ev"
    line = _error_line(_eval(out, "--no-plots", preexec=_limit(20_000)))
    assert line == f"carbon-gym: error: cannot write {out}/requests/dev__rr__seed0.parquet: File too large"
    assert _files(out) == {}  # (nothing else was written yet, and no temporary file is left)
    _no_stale_git_lock()


@linux_only
def test_a_late_failure_leaves_only_complete_files(tmp_path: Path) -> None:
    """40 kB: every table fits, the first figure (a PNG) does not; every file left is whole."""
    import pandas as pd

    ref = tmp_path / "ref"
    assert _eval(ref, "--no-plots").returncode == 0
    out = tmp_path / "ev"
    line = _error_line(_eval(out, preexec=_limit(40_000)))
    assert line.startswith(f"carbon-gym: error: cannot write {out}/figures/") and line.endswith(".png: File too large")
    left = _files(out)
    assert not [f for f in left if os.path.basename(f).startswith(".tmp-") or f.startswith("figures/")], left
    def names(files: dict[str, int]) -> set[str]:  # (an event file's name holds its time and pid)
        return {os.path.dirname(f) if "tfevents" in f else f for f in files}

    assert names(left) == names(_files(ref)) and len(left) == len(_files(ref)) == 7, left
    for kind in ("requests", "steps"):  # the records are whole and equal to an unlimited run's
        a = pd.read_parquet(out / kind / "dev__rr__seed0.parquet")
        b = pd.read_parquet(ref / kind / "dev__rr__seed0.parquet")
        pd.testing.assert_frame_equal(a.drop(columns=[c for c in a if c.startswith("decision")]),
                                      b.drop(columns=[c for c in b if c.startswith("decision")]))
    assert len(pd.read_csv(out / "runs.csv")) == 1 and (out / "config.json").read_text().rstrip().endswith("}")
    _no_stale_git_lock()


def test_atomic_path_keeps_the_earlier_file_on_error(tmp_path: Path) -> None:
    from eval.writers import atomic_path, write_text

    p = tmp_path / "summary.md"
    write_text(str(p), "earlier\n")
    with pytest.raises(OutputWriteError) as e:
        with atomic_path(str(p)) as tmp:
            Path(tmp).write_text("half")
            raise OSError(28, os.strerror(28))
    assert str(e.value) == f"cannot write {p}: No space left on device" and e.value.path == str(p)
    assert p.read_text() == "earlier\n" and os.listdir(tmp_path) == ["summary.md"]
    with pytest.raises(KeyError):  # (any other error: re-raised as it is, the temporary file removed too)
        with atomic_path(str(p)) as tmp:
            Path(tmp).write_text("half")
            raise KeyError("x")
    assert os.listdir(tmp_path) == ["summary.md"]
    again = OutputWriteError(str(e.value))  # (rebuilds from its text)
    assert (again.path, again.reason, str(again)) == (str(p), "No space left on device", str(e.value))


_TB = r'''
import resource, signal, sys
from types import SimpleNamespace
import numpy as np
from eval.writers import write_tensorboard
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
n = 500
res = SimpleNamespace(spec=SimpleNamespace(scenario_name="dev", policy_name="rr", seed=0),
                      steps={"step": np.arange(n), "carbon_g": np.full(n, 2.0)})
try:
    write_tensorboard(res, sys.argv[1])
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
'''


@linux_only
def test_tensorboard_run_is_replaced_whole_or_kept(tmp_path: Path) -> None:
    """A TensorBoard run that cannot be written (formerly an error in TensorBoard's writer thread,
    printed as a traceback and dropped by its close) is an OutputWriteError naming the run's
    folder; the earlier run's events are kept, no partial event file is added."""
    from eval.tb import read_scalars
    from eval.writers import write_tensorboard

    n = 500
    res = SimpleNamespace(spec=SimpleNamespace(scenario_name="dev", policy_name="rr", seed=0),
                          steps={"step": np.arange(n), "carbon_g": np.ones(n)})
    d = write_tensorboard(res, str(tmp_path / "tb"))
    before = _files(Path(d))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([sys.executable, "-c", _TB, str(tmp_path / "tb")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    assert r.stdout.strip() == f"OutputWriteError: cannot write {d}: File too large"
    assert _files(Path(d)) == before and os.listdir(Path(d).parent) == ["seed_0"]
    assert [v for _, v in read_scalars(d)["carbon/step_g"]] == [1.0] * n


def test_full_tmpfs_names_the_file(tmp_path: Path) -> None:
    """A real 16 KiB filesystem (``unshare -rm``, skipped where not allowed) fills up: ENOSPC,
    one line naming the file, nothing half-written left on it."""
    from test_records_disk import _tmpfs_prefix

    mount = tmp_path / "mnt"
    mount.mkdir()
    prefix = _tmpfs_prefix(str(mount), "16k")
    script = f'mount -t tmpfs -o size=16k tmpfs {mount} && "$@"; rc=$?; find {mount} -type f -printf "%P %s\\n"; exit $rc'
    res = _eval(mount / "ev", "--no-plots", prefix=(*prefix[:4], script, "sh"))
    line = _error_line(res)
    assert line.startswith(f"carbon-gym: error: cannot write {mount}/ev/") and line.endswith(": No space left on device")
    bad = line.split("cannot write ")[1].rsplit(": ", 1)[0]
    left = res.stdout.split("\n")[-200:]
    assert not [ln for ln in left if ln and (ln.split(" ")[0] == os.path.relpath(bad, mount) or "/.tmp-" in ln
                                            or ln.startswith(".tmp-"))], left
