"""The one policy registry (carbon_gym.registry), the one rollout loop (carbon_gym.policy.run_episode)
and the one round-robin; user policy classes by ``package.module:Class`` through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from carbon_gym import registry
from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError
from carbon_gym.policy import EpisodeObserver, RoundRobinPolicy, rollout, run_episode

TABLE_NAMES = ["rr", "greedy", "least-loaded", "planner", "planner-1h", "ilp", "ilp-state", "greedy-cap", "ilp-cap", "milp",
               "milp-greedy", "clairvoyant", "milp-mpc", "sticky", "learned"]


@pytest.fixture
def dev_env():
    env = GeoServeEnv("dev", overrides={"duration_s": 6.0})
    yield env
    env.close()


# ------------------------------------------------------------------------------ names


def test_every_layer_registers_its_short_table_names():
    pytest.importorskip("solvers")
    assert registry.available_policies() == TABLE_NAMES
    # not the bound, not the look-ahead baseline (capacity control only), not the session-sticky baseline, not the learned agent
    assert registry.default_policies() == TABLE_NAMES[:-4]
    assert set(registry.available_prefixes()) == {"learned", "ppo"}
    sources = {n: registry.policy_info(n).source for n in TABLE_NAMES}
    assert sources["rr"] == "carbon_gym" and sources["milp"] == "solvers"
    assert sources["clairvoyant"] == "eval" and sources["learned"] == "train" and sources["milp-mpc"] == "solvers"
    for alias, name in (("round-robin", "rr"), ("carbon-greedy", "greedy"), ("ilp-static", "ilp"),
                        ("facility-milp", "milp"), ("facility-greedy", "milp-greedy"), ("session-sticky", "sticky")):
        assert registry.canonical_policy_name(alias) == name
        assert registry.policy_info(alias) is registry.policy_info(name)
    assert registry.canonical_policy_name("learned:x/y.zip") == "learned:x/y.zip"
    assert registry.canonical_policy_name("nosuch") == "nosuch"


def test_plain_import_carbon_gym_builds_the_milp_in_a_fresh_process():
    pytest.importorskip("solvers")
    code = ("import sys, carbon_gym\n"
            "from carbon_gym.env import GeoServeEnv\n"
            "assert 'solvers' not in sys.modules\n"
            "p = carbon_gym.make_policy('milp', GeoServeEnv('dev'), time_limit_s=0.5)\n"
            "print(type(p).__module__, type(p).__name__, p.config.time_limit_s)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["solvers.facility", "FacilityMILP", "0.5"]


def test_unknown_names_and_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="unknown policy 'nosuch'") as exc:
        registry.make_policy("nosuch")
    assert "rr" in exc.value.allowed and "round-robin (= rr)" in exc.value.allowed
    assert "package.module:Class" in exc.value.allowed
    with pytest.raises(ConfigError, match="bad arguments for 'rr'"):
        registry.make_policy("rr", None, bogus=1)
    with pytest.raises(ConfigError, match="missing the argument"):
        registry.check_policy_name("learned:")
    with pytest.raises(ConfigError, match="no checkpoint at '/no/such.zip'"):
        registry.check_policy_name("learned:/no/such.zip")


def test_register_and_unregister():
    class Always0:
        def act(self, observation, info):
            return np.zeros(len(info["action_mask"]), dtype=np.int64)

    try:
        registry.register_policy("test-always0", lambda env=None, **kw: Always0(), aliases=("test-zero",),
                                 doc="test", in_all=False)
        assert isinstance(registry.make_policy("test-zero"), Always0)
        assert registry.canonical_policy_name("test-zero") == "test-always0"
        assert "test-always0" in registry.available_policies()
        assert "test-always0" not in registry.default_policies()
        with pytest.raises(ConfigError, match="already registered"):
            registry.register_policy("test-always0", lambda env=None: Always0())
        with pytest.raises(ConfigError, match="already registered"):
            registry.register_policy("other", lambda env=None: Always0(), aliases=("rr",))
        registry.register_policy_prefix("testpre", lambda arg, env=None, **kw: (arg, Always0())[1])
        assert isinstance(registry.make_policy("testpre:anything"), Always0)
        assert registry.split_prefix("testpre:a:b") == ("testpre", "a:b")
    finally:
        registry.unregister_policy("test-always0")
        registry.unregister_policy("testpre")
    assert registry.canonical_policy_name("test-zero") == "test-zero"
    with pytest.raises(ConfigError, match="unknown policy"):
        registry.make_policy("test-always0")
    for bad in ("", "a:b", " x"):
        with pytest.raises(ConfigError, match="bad policy name"):
            registry.register_policy(bad, lambda env=None: None)
    with pytest.raises(ConfigError, match="bad policy prefix"):
        registry.register_policy_prefix("a.b", lambda arg, env=None: None)
    with pytest.raises(ConfigError, match="is not callable"):
        registry.register_policy("x-not-callable", 3)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ module:Class


USER_MODULE = '''
import numpy as np


class WithEnv:
    """Every request to datacenter ``target`` when allowed, else the first allowed one."""

    def __init__(self, env, target=0):
        self.env = env
        self.target = int(target)

    def act(self, observation, info):
        mask = np.asarray(info["action_mask"], dtype=bool)
        d = mask.shape[1] - 1
        first = np.where(mask[:, :d].any(axis=1), np.argmax(mask[:, :d], axis=1), d)
        return np.where(mask[:, self.target], self.target, first).astype(np.int64)


class NoEnv(WithEnv):
    def __init__(self, target=1):
        super().__init__(None, target)


def factory(env, target=0):
    return WithEnv(env, target)


class NoAct:
    def __init__(self, env):
        pass


def no_act_factory(env):
    return object()


def broken_import_guard():
    pass
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg_reg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mymod.py").write_text(USER_MODULE)
    (pkg / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_module_class_form_constructs_per_signature(user_module, dev_env):
    a = registry.make_policy("mypkg_reg.mymod:WithEnv", dev_env, target=1)
    assert type(a).__name__ == "WithEnv" and a.env is dev_env and a.target == 1
    b = registry.make_policy("mypkg_reg.mymod:NoEnv", dev_env)
    assert type(b).__name__ == "NoEnv" and b.env is None and b.target == 1
    c = registry.make_policy("mypkg_reg.mymod:factory", dev_env, target=1)
    assert c.env is dev_env and c.target == 1
    assert registry.check_policy_name("mypkg_reg.mymod:WithEnv") == "mypkg_reg.mymod:WithEnv"
    # it runs: every request to datacenter 1 (dev: both datacenters always allowed)
    m = rollout(dev_env, a, seed=0)
    assert m["dc_placed"][0] == 0 and m["dc_placed"][1] == m["completed"] + m["in_flight_at_truncation"] > 0


@pytest.mark.parametrize("name,needle", [
    ("mypkg_reg.nosuch:X", "no module 'mypkg_reg.nosuch' on the Python path"),
    ("mypkg_reg.mymod:Nope", "module 'mypkg_reg.mymod' has no attribute 'Nope'"),
    ("mypkg_reg.mymod:NoAct", "class 'NoAct' has no act(observation, info) method"),
    ("mypkg_reg.mymod:no_act_factory", "built 'object', which has no act"),
    ("mypkg_reg.broken:X", "importing module 'mypkg_reg.broken' failed: RuntimeError: boom at import"),
    ("mypkg_reg.mymod:WithEnv.missing", "has no attribute 'WithEnv.missing'"),
])
def test_module_class_form_errors_name_the_problem(user_module, dev_env, name, needle):
    with pytest.raises(ConfigError, match="^policy: ") as exc:
        registry.make_policy(name, dev_env)
    assert needle in str(exc.value)


def test_cli_eval_runs_a_user_policy_class_from_the_python_path(tmp_path):
    """``carbon-gym eval --policies mypkg.mymod:MyPolicy --scenarios dev --seeds 1`` from the
    directory holding ``mypkg/``, with a keyword argument, on two spawned worker processes."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mymod.py").write_text(USER_MODULE + "\n\nMyPolicy = WithEnv\n")
    script = os.path.join(os.path.dirname(sys.executable), "carbon-gym")
    cmd = [script] if os.path.isfile(script) else [sys.executable, "-m", "eval"]
    out = tmp_path / "out"
    argv = ["eval", "--policies", "mypkg.mymod:MyPolicy", "--scenarios", "dev", "--seeds", "1",
            "--duration-s", "5", "--policy-arg", "mypkg.mymod:MyPolicy.target=1", "--workers", "2",
            "--out", str(out), "--no-progress", "--no-plots", "--no-tensorboard", "--no-requests"]
    res = subprocess.run(cmd + argv, capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert res.returncode == 0, res.stderr
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["policy"]) == ["rr", "mypkg.mymod:MyPolicy"]
    assert runs["requests_arrived"].iloc[0] == runs["requests_arrived"].iloc[1] > 20  # same workload
    cfg = json.loads((out / "config.json").read_text())
    mine = cfg["runs"][1]
    assert mine["policy_kwargs"] == {"target": 1} and mine["run_id"] == "dev__mypkg.mymod_MyPolicy__seed0"
    assert mine["dc_placed"][0] == 0 and mine["dc_placed"][1] == runs["requests_arrived"].iloc[1]
    rr = cfg["runs"][0]["dc_placed"]
    assert abs(rr[0] - rr[1]) <= 1  # round-robin alternates


# ------------------------------------------------------------------------------ one loop, one round-robin


class _Counter(EpisodeObserver):
    def __init__(self):
        self.resets, self.before, self.after, self.decisions = 0, [], [], []

    def on_reset(self, env, observation, info):
        self.resets += 1

    def before_step(self, env, step):
        self.before.append(step)

    def after_step(self, env, step, action, reward, terminated, truncated, info, decision_s):
        self.after.append(step)
        self.decisions.append(decision_s)


def test_run_episode_observers_see_every_step_and_change_nothing(dev_env):
    obs = _Counter()
    ep = run_episode(dev_env, RoundRobinPolicy(), seed=3, observers=[obs])
    assert ep.ended and ep.steps == dev_env.max_episode_steps == 6
    assert obs.resets == 1 and obs.before == obs.after == list(range(6))
    np.testing.assert_array_equal(ep.decision_s, obs.decisions)
    m = rollout(dev_env, RoundRobinPolicy(), seed=3)
    assert m["carbon_g"] == ep.info["episode_metrics"]["carbon_g"] and m["steps"] == 6
    assert m["return"] == pytest.approx(ep.total_reward, abs=0)
    part = run_episode(dev_env, RoundRobinPolicy(), seed=3, max_steps=2)
    assert part.steps == 2 and not part.ended


def test_round_robin_cycles_over_the_allowed_datacenters():
    """The rule the golden results pin (rr): request i to the first allowed datacenter at or
    after the cursor, the cursor one past it, kept across steps and cleared by reset."""
    mask = np.array([[True, False, True, True]] * 3)  # 3 datacenters (+ defer); dc 1 not allowed
    rr = RoundRobinPolicy()
    assert list(rr.act(None, {"action_mask": mask})) == [0, 2, 0]
    assert list(rr.act(None, {"action_mask": mask})) == [2, 0, 2]
    rr.reset()
    assert list(rr.act(None, {"action_mask": mask})) == [0, 2, 0]
    mixed = np.array([[True, True, False, True], [False, False, False, True], [False, True, True, True]])
    rr.reset()
    assert list(rr.act(None, {"action_mask": mixed})) == [0, 3, 1]  # nothing allowed: defer (3)
    assert type(registry.make_policy("round-robin")) is RoundRobinPolicy
