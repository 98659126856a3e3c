"""The p99-aware SLO constraint of PPO from reward (:mod:`train.lagrangian`): the penalty and the
dual step against hand-computed values, the env's per-target violation counts, the config's
checks, and a dev training run that logs, saves and resumes its multipliers."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

from carbon_gym.errors import ConfigError  # noqa: E402
from train.config import SloConstraintConfig, config_from_dict  # noqa: E402
from train.lagrangian import VecSloLagrangian, find_lagrangian  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class _Scripted(gym.Env):
    """Reward 0; each step's info is the next of ``infos`` (completed, TTFT / TPOT violations)."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, infos: list[dict]) -> None:
        self._infos = infos
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        info = dict(self._infos[self._t % len(self._infos)])
        self._t += 1
        return np.zeros(1, np.float32), 0.0, False, False, info


def _venv(*scripts: list[dict]) -> DummyVecEnv:
    return DummyVecEnv([lambda s=s: _Scripted(s) for s in scripts])


def test_penalty_and_dual_step_match_the_formulas():
    cfg = SloConstraintConfig(budget=0.01, lr=0.5, init_lambda=2.0, max_lambda=3.0)
    a = [{"completed": 100, "ttft_violations": 3, "tpot_violations": 0}]
    b = [{"completed": 300, "ttft_violations": 0, "tpot_violations": 1}]
    lag = VecSloLagrangian(_venv(a, b), cfg)
    lag.reset()
    _, rew, _, infos = lag.step(np.zeros(2, dtype=np.int64))
    # n_ref = mean completions of the first step = 200; penalty = sum_k lambda_k (v_k - b n) / (b n_ref)
    p0 = 2.0 * (3 - 1) / 2.0 + 2.0 * (0 - 1) / 2.0  # env 0: TTFT 3 over a budget of 1, TPOT 0
    p1 = 2.0 * (0 - 3) / 2.0 + 2.0 * (1 - 3) / 2.0  # env 1: both within their budget of 3: a bonus
    assert rew.tolist() == pytest.approx([-p0, -p1])
    assert infos[0]["slo_penalty"] == pytest.approx(p0) and infos[1]["slo_penalty"] == pytest.approx(p1)
    row = lag.update()
    # rates over the rollout: TTFT 3/400 = 0.75 budget, TPOT 1/400 = 0.25 budget
    assert row["ttft_violation_rate"] == pytest.approx(0.0075) and row["tpot_violation_rate"] == pytest.approx(0.0025)
    assert row["lambda_ttft"] == pytest.approx(2.0 + 0.5 * (0.75 - 1.0))
    assert row["lambda_tpot"] == pytest.approx(2.0 + 0.5 * (0.25 - 1.0))
    assert lag.n_ref == pytest.approx(200.0)
    # a rate far above the budget raises the multiplier up to its clip, far below down to 0
    hot = VecSloLagrangian(_venv([{"completed": 10, "ttft_violations": 10, "tpot_violations": 0}]), cfg)
    hot.reset()
    for _ in range(3):
        hot.step(np.zeros(1, dtype=np.int64))
    row = hot.update()
    assert row["lambda_ttft"] == 3.0 and row["lambda_tpot"] == pytest.approx(1.5)
    for _ in range(5):
        hot.step(np.zeros(1, dtype=np.int64))
        row = hot.update()
    assert row["lambda_tpot"] == 0.0 and row["lambda_ttft"] == 3.0
    assert hot.update() == {}  # no step since the last update: no dual step
    # the state round-trips
    again = VecSloLagrangian(_venv(a), cfg, state=json.loads(json.dumps(hot.state_dict())))
    assert again.lambdas.tolist() == hot.lambdas.tolist() and again.n_ref == hot.n_ref
    assert find_lagrangian(again) is again and find_lagrangian(_venv(a)) is None


class _Ends(_Scripted):
    """As _Scripted, truncated every 2nd step with the given episode metrics."""

    def __init__(self, infos: list[dict], metrics: dict) -> None:
        super().__init__(infos)
        self._metrics = metrics

    def step(self, action):
        obs, r, term, _, info = super().step(action)
        last = self._t % 2 == 0
        if last:
            info["episode_metrics"] = dict(self._metrics)
        return obs, r, term, last, info


def test_unfinished_requests_are_charged_at_the_episode_end():
    cfg = SloConstraintConfig(budget=0.01, lr=0.5, init_lambda=1.0, max_lambda=10.0)
    step = [{"completed": 100, "ttft_violations": 1, "tpot_violations": 1}]
    lag = VecSloLagrangian(DummyVecEnv([lambda: _Ends(step, {"measure": "window", "unfinished_window": 50, "in_flight_at_truncation": 9}),
                                        lambda: _Ends(step, {"in_flight_at_truncation": 30, "unplaced_at_end": 20})]), cfg)
    lag.reset()
    _, rew, dones, infos = lag.step(np.zeros(2, dtype=np.int64))
    assert not dones.any() and rew.tolist() == pytest.approx([0.0, 0.0])  # at the budget exactly: no penalty
    _, rew, dones, infos = lag.step(np.zeros(2, dtype=np.int64))
    assert dones.all() and [i["slo_unfinished"] for i in infos] == [50, 50]  # window growth; in flight + unplaced
    # v = 1 + 50 over each target, n = 150: (51 - 1.5) / (0.01 x 100) per target, two targets
    assert rew.tolist() == pytest.approx([-2 * 49.5, -2 * 49.5])
    row = lag.update()
    assert row["ttft_violation_rate"] == pytest.approx(104 / 500)


def test_a_missing_info_key_is_named():
    lag = VecSloLagrangian(_venv([{"completed": 1}]), SloConstraintConfig())
    lag.reset()
    with pytest.raises(KeyError, match="ttft_violations"):
        lag.step(np.zeros(1, dtype=np.int64))


def test_env_steps_count_each_target_and_sum_to_the_episode():
    from carbon_gym.env import GeoServeEnv
    from carbon_gym.policy import RoundRobinPolicy

    warnings.simplefilter("ignore", UserWarning)
    env = GeoServeEnv(scenario="dev", overrides={"duration_s": 30, "slo.ttft_s": 0.3, "slo.tpot_s": 0.02})
    pol = RoundRobinPolicy()
    obs, info = env.reset(seed=0)
    tt = tp = both = 0
    done = False
    while not done:
        obs, _, _, done, info = env.step(pol.act(obs, info))
        assert max(info["ttft_violations"], info["tpot_violations"]) <= info["violations"] <= info["ttft_violations"] + info["tpot_violations"]
        tt += info["ttft_violations"]
        tp += info["tpot_violations"]
        both += info["violations"]
    m = info["episode_metrics"]
    assert both == m["violations"]
    assert tt == round(m["ttft_violation_rate"] * m["completed"]) and tp == round(m["tpot_violation_rate"] * m["completed"])
    assert tt > 0 and tp > 0  # the tight targets make both counts non-trivial


def test_config_checks_name_the_field():
    base = {"name": "x", "scenarios": ["dev"]}
    cfg = config_from_dict({**base, "slo_constraint": {"budget": 0.01}})
    assert cfg.slo_constraint == SloConstraintConfig(budget=0.01)
    assert config_from_dict(base).slo_constraint is None
    assert config_from_dict(base).digest() != cfg.digest()
    for bad, field in [({"budget": 0.0}, "slo_constraint.budget"), ({"budget": 1.5}, "slo_constraint.budget"),
                       ({"lr": -1}, "slo_constraint.lr"), ({"init_lambda": 5, "max_lambda": 1}, "slo_constraint.init_lambda"),
                       ({"budget": "1%"}, "slo_constraint.budget"), ({"budjet": 0.01}, "slo_constraint.budjet")]:
        with pytest.raises(ConfigError) as e:
            config_from_dict({**base, "slo_constraint": bad})
        assert e.value.field == field, (bad, e.value)


def test_training_logs_saves_and_resumes_the_multipliers(tmp_path):
    from train.runner import train

    warnings.simplefilter("ignore", UserWarning)
    raw = {
        "name": "lag", "algorithm": "maskable_ppo", "scenarios": ["dev"], "n_envs": 1, "total_timesteps": 64,
        "overrides": {"duration_s": 20, "env.slo_weight": 0.0, "slo.ttft_s": 0.3},
        "set_policy": {"hidden": 8}, "ppo": {"n_steps": 32, "batch_size": 32, "n_epochs": 1},
        "eval": {"every_timesteps": 0, "final": False},
        "checkpoint": {"every_timesteps": 32},
        "slo_constraint": {"budget": 0.01, "lr": 0.5, "init_lambda": 1.0, "max_lambda": 50.0},
    }
    run = tmp_path / "run"
    train(config_from_dict(raw), run, log=lambda _: None, stop_after_timesteps=32)
    hist = json.loads((run / "lagrangian_history.json").read_text())
    assert len(hist) == 1 and hist[0]["ttft_violation_rate"] > 0.01  # a 0.3 s TTFT target on dev is missed often
    assert hist[0]["lambda_ttft"] == pytest.approx(1.0 + 0.5 * (hist[0]["ttft_violation_rate"] / 0.01 - 1.0))
    saved = json.loads((run / "state.json").read_text())["slo_lagrangian"]
    assert saved["lambdas"][0] == pytest.approx(hist[0]["lambda_ttft"])
    train(config_from_dict(raw), run, resume=True, log=lambda _: None)
    hist = json.loads((run / "lagrangian_history.json").read_text())
    assert len(hist) == 2 and hist[1]["timesteps"] == 64
    # the resumed run's dual step started from the saved multiplier, not from init_lambda
    assert hist[1]["lambda_ttft"] == pytest.approx(min(50.0, max(0.0, hist[0]["lambda_ttft"] + 0.5 * (hist[1]["ttft_violation_rate"] / 0.01 - 1.0))))
    rows = (run / "tb" / "progress.csv").read_text().splitlines()
    assert "slo/lambda_ttft" in rows[0] and "rollout/ttft_violation_rate" in rows[0]


def test_the_best_slo_passing_policy_is_kept(tmp_path):
    """With [slo_constraint], every held-out evaluation whose episode passes p99 (each target's
    share of late completions <= 1%; generous targets here, so every one passes) and beats the
    earlier passing ones is exported to best.npz, recorded in best.json."""
    from train.policy import LearnedPolicy
    from train.runner import train

    warnings.simplefilter("ignore", UserWarning)
    raw = {
        "name": "best", "algorithm": "maskable_ppo", "scenarios": ["dev"], "n_envs": 1, "total_timesteps": 64,
        "overrides": {"duration_s": 10, "env.slo_weight": 0.0, "slo.ttft_s": 60.0, "slo.tpot_s": 10.0},
        "set_policy": {"hidden": 8}, "ppo": {"n_steps": 32, "batch_size": 32, "n_epochs": 1},
        "eval": {"every_timesteps": 32, "final": True},
        "slo_constraint": {"budget": 0.01},
    }
    run = tmp_path / "run"
    out = train(config_from_dict(raw), run, log=lambda _: None)
    assert out["best"] == str(run / "best.npz")
    hist = json.loads((run / "eval_history.json").read_text())
    best = json.loads((run / "best.json").read_text())
    top = max(hist, key=lambda r: r["eval/reduction_vs_rr_pct"])
    assert best["reduction_vs_rr_pct"] == pytest.approx(top["eval/reduction_vs_rr_pct"])
    assert best["ttft_violation_rate"] == 0.0 and best["tpot_violation_rate"] == 0.0
    assert LearnedPolicy.load(run / "best.npz").net is not None
    # an impossible target: nothing passes, nothing is kept
    raw2 = {**raw, "overrides": {**raw["overrides"], "slo.ttft_s": 0.001}}
    train(config_from_dict(raw2), tmp_path / "none", log=lambda _: None)
    assert not (tmp_path / "none" / "best.json").exists() and not (tmp_path / "none" / "best.npz").exists()
