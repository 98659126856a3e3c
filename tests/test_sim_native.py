"""The compiled simulator (mypyc build of carbon_gym/sim/request.py, prefix_cache.py, engine.py, datacenter.py and simulator.py, setup.py):
same results as the pure-Python modules, and the import-time choice between them
(carbon_gym/sim/_native.py) never runs a build older than the sources."""

from __future__ import annotations

import copy
import importlib.machinery
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import carbon_gym.sim as sim_pkg
from carbon_gym.sim import _native

COMPILED = sim_pkg.IMPLEMENTATION["engine"] == "compiled"
ROOT = Path(__file__).resolve().parents[1]

# one dev episode and one with a datacenter outage (fail-over, draining), round-robin and a
# fixed uneven split, every per-request record and the episode metrics, as JSON
_EPISODES = textwrap.dedent("""
    import json, sys
    import numpy as np
    import gymnasium as gym
    import carbon_gym
    from carbon_gym.policy import RoundRobinPolicy, rollout
    import carbon_gym.sim as s

    out = {"implementation": s.IMPLEMENTATION["engine"]}
    for scen in ("dev", "dev-fault"):
        env = gym.make("carbon_gym/GeoServe-v0", scenario=scen, overrides={"duration_s": 40.0})
        m = rollout(env, RoundRobinPolicy(), seed=7)
        out[scen] = {k: (float(v) if isinstance(v, (int, float, np.number)) else None) for k, v in m.items()
                     if "decision" not in k and "wall" not in k}  # (wall-clock timings differ run to run)
        # a second episode, stepping by hand with an uneven split, keeping every completion record
        u = env.unwrapped
        obs, info = env.reset(seed=11)
        rec = []
        done = False
        while not done:
            mask = info["action_mask"]
            a = np.where(mask[:, 0], 0, mask.shape[1] - 1)
            a[::3] = np.where(mask[::3, 1], 1, a[::3])
            obs, r, term, trunc, info = env.step(a)
            done = term or trunc
            recs = u.last_completed
            rec += [recs.request_id.tolist(), recs.ttft_s.tolist(), recs.energy_j.tolist(), recs.carbon_g.tolist()]
        out[scen + "/records"] = rec
        out[scen + "/metrics"] = {k: float(v) for k, v in info["episode_metrics"].items()
                                  if isinstance(v, (int, float)) and "decision" not in k and "wall" not in k}
    print(json.dumps(out))
""")


def _run_episodes(pure: bool) -> dict:
    env = dict(os.environ)
    env.pop(_native.PURE_ENV_VAR, None)
    if pure:
        env[_native.PURE_ENV_VAR] = "1"
    res = subprocess.run([sys.executable, "-c", _EPISODES], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not COMPILED, reason=f"no compiled simulator here ({sim_pkg.IMPLEMENTATION['reason']})")
def test_compiled_simulator_gives_exactly_the_pure_python_results():
    fast, slow = _run_episodes(pure=False), _run_episodes(pure=True)
    assert fast.pop("implementation") == "compiled" and slow.pop("implementation") == "python"
    assert fast["dev"]["completed"] > 100 and fast["dev-fault"]["completed"] > 100
    assert len(fast["dev/records"]) > 100
    assert fast == slow  # every float, bit for bit


@pytest.mark.skipif(not COMPILED, reason=f"no compiled simulator here ({sim_pkg.IMPLEMENTATION['reason']})")
def test_compiled_simulator_objects_deep_copy():
    import gymnasium as gym

    env = gym.make("carbon_gym/GeoServe-v0", scenario="dev-fault", overrides={"duration_s": 40.0})
    obs, info = env.reset(seed=3)
    u = env.unwrapped
    for _ in range(12):  # past the outage's start: draining datacenters, fail-over
        obs, *_, info = env.step(np.full(u._K, 0))
    twin = copy.deepcopy(u)
    assert type(twin.simulator.datacenters[0].engines[0]).__module__ == "carbon_gym.sim.engine"
    for _ in range(5):
        m = u.action_masks().reshape(u._K, -1)
        a = np.where(m[:, 2], 2, m.shape[1] - 1)  # Ontario, or defer
        r1 = u.step(a)
        r2 = twin.step(a)
        np.testing.assert_array_equal(r1[0]["datacenters"], r2[0]["datacenters"])
        assert r1[1] == r2[1]
    assert twin.simulator.datacenters[0] is not u.simulator.datacenters[0]


def _fake_package(tmp_path: Path, name: str, built: bool, record: str | None) -> Path:
    """A package directory like carbon_gym/sim: the compiled modules' sources (each defines
    WHERE = "source"), optionally stand-in extension files and a sources record."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for mod in _native.COMPILED_MODULES:
        (pkg / f"{mod}.py").write_text('WHERE = "source"\n')
        if built:
            (pkg / f"{mod}{suffix}").write_bytes(b"not a real extension: never imported here")
    if record == "match":
        (pkg / _native.SOURCES_FILE).write_text(json.dumps({m: _native.source_digest(pkg / f"{m}.py") for m in _native.COMPILED_MODULES}))
    elif record == "old":
        (pkg / _native.SOURCES_FILE).write_text(json.dumps({m: "0" * 64 for m in _native.COMPILED_MODULES}))
    return pkg


@pytest.fixture
def clean_modules():
    before = set(sys.modules)
    yield
    for k in set(sys.modules) - before:
        del sys.modules[k]


def test_select_without_a_build_keeps_the_sources(tmp_path, clean_modules, monkeypatch):
    monkeypatch.delenv(_native.PURE_ENV_VAR, raising=False)
    pkg = _fake_package(tmp_path, "fake_none", built=False, record=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = _native.select("fake_none", pkg)
    assert out == {**{m: "python" for m in _native.COMPILED_MODULES}, "reason": "no compiled build"}
    assert set(_native.COMPILED_MODULES) == {"request", "prefix_cache", "engine", "datacenter", "simulator"}
    assert "fake_none.engine" not in sys.modules  # nothing to bypass: the normal import runs later


def test_select_keeps_a_build_that_matches_the_sources(tmp_path, clean_modules, monkeypatch):
    monkeypatch.delenv(_native.PURE_ENV_VAR, raising=False)
    pkg = _fake_package(tmp_path, "fake_ok", built=True, record="match")
    out = _native.select("fake_ok", pkg)
    assert out["engine"] == out["datacenter"] == "compiled"
    assert "fake_ok.engine" not in sys.modules  # left to the normal import (the extension)


@pytest.mark.parametrize("record", ["old", None])
def test_select_runs_the_sources_of_a_stale_build_and_warns(tmp_path, clean_modules, monkeypatch, record):
    monkeypatch.delenv(_native.PURE_ENV_VAR, raising=False)
    name = f"fake_stale_{record}"
    pkg = _fake_package(tmp_path, name, built=True, record=record)
    with pytest.warns(RuntimeWarning, match=r"stale compiled build: request\.py, prefix_cache\.py, engine\.py, datacenter\.py, simulator\.py changed .*pip install -e \."):
        out = _native.select(name, pkg)
    assert out["engine"] == out["datacenter"] == "python" and out["reason"].startswith("stale compiled build")
    for mod in _native.COMPILED_MODULES:  # the .py sources are the modules now
        assert sys.modules[f"{name}.{mod}"].WHERE == "source"


def test_select_runs_the_sources_when_asked(tmp_path, clean_modules, monkeypatch):
    monkeypatch.setenv(_native.PURE_ENV_VAR, "1")
    pkg = _fake_package(tmp_path, "fake_pure", built=True, record="match")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = _native.select("fake_pure", pkg)
    assert out["reason"] == "CARBON_GYM_PURE_PYTHON=1" and out["engine"] == "python"
    assert sys.modules["fake_pure.datacenter"].WHERE == "source"


def test_a_partial_build_is_not_mixed_with_sources(tmp_path, clean_modules, monkeypatch):
    monkeypatch.delenv(_native.PURE_ENV_VAR, raising=False)
    pkg = _fake_package(tmp_path, "fake_partial", built=True, record="match")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (pkg / f"datacenter{suffix}").unlink()
    with pytest.warns(RuntimeWarning, match="datacenter.py"):
        out = _native.select("fake_partial", pkg)
    assert out["engine"] == out["datacenter"] == "python"
    assert sys.modules["fake_partial.engine"].WHERE == "source"
