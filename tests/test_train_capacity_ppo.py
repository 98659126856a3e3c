"""MaskablePPO with the capacity head (``set_policy.capacity_head``, ``capacity.control = "agent"``):
the flattened capacity action's distribution (route + servers per datacenter; awake engines from
the servers), its log-probability against the head's own categorical, the training env's masks
between decisions, and a dev-scale fine-tuning run from a set-policy checkpoint."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

import torch as th  # noqa: E402

from carbon_gym.errors import ConfigError  # noqa: E402
from train.config import config_from_dict  # noqa: E402
from train.envs import ScenarioMixEnv  # noqa: E402
from train.set_policy import SetActorCriticPolicy, SetNetwork, layout_spec  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

#: dev (2 datacenters x 1 server of 8 engines), 1 s steps, a capacity decision every 5 s
OVER = {"duration_s": 20, "capacity.control": "agent", "capacity.period_s": 5.0}
NET = {"hidden": 8, "classes": True, "demand_features": True, "capacity_head": True}


def _policy(env, reduction: str = "mean") -> SetActorCriticPolicy:
    th.manual_seed(2)
    return SetActorCriticPolicy(env.observation_space, env.action_space, lambda _: 1e-3, layout=layout_spec(env),
                                logprob_reduction=reduction, **NET)


def _t(obs):
    return {k: th.as_tensor(np.asarray(v, dtype=np.float32))[None] for k, v in obs.items()}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_capacity_log_prob_is_the_heads_categorical_at_decisions_and_zero_between(reduction):
    warnings.simplefilter("ignore", UserWarning)
    env = ScenarioMixEnv(["dev"], OVER)
    obs, _ = env.reset(seed=1)
    pol = _policy(env, reduction)
    net = pol.net
    K, D = net.K, net.D
    L = env.layout
    epn = np.asarray(L.n_engines) // np.asarray(L.n_servers)
    decisions = 0
    th.manual_seed(0)
    for step in range(12):
        mask = env.action_masks()
        assert mask.shape == (K * (D + 1) + int((np.asarray(L.n_engines) + 1).sum()) + int((np.asarray(L.n_servers) + 1).sum()),)
        decision = env._inner.unwrapped.state().capacity_decision
        assert decision == (step % 5 == 0)
        with th.no_grad():
            dist = pol.get_distribution(_t(obs), action_masks=mask[None])
            act = dist.sample()
            lp = dist.log_prob(act)
            ent = dist.entropy()
            _, lp_eval, ent_eval = pol.evaluate_actions(_t(obs), act, action_masks=mask[None])
            route = dist.route
            lp_route, ent_route = route.log_prob(act[:, :K]), route.entropy()
            head = net.capacity_scores(*(lambda dc, sl, gl: (dc, gl, net.totals(sl, sl[:, :, net._s_valid] > 0.5)))(
                *net.split_obs(_t(obs))))[0]  # (D, S + 1), the head's logits (masked beyond S_d)
        a = act[0].numpy()
        servers, awake = a[K + D:], a[K:K + D]
        np.testing.assert_array_equal(awake, np.minimum(servers * epn, L.n_engines))  # every engine of a powered server
        assert th.allclose(lp_eval, lp) and th.allclose(ent_eval, ent)
        if decision:
            decisions += 1
            cats = [th.distributions.Categorical(logits=head[d]) for d in range(D)]
            ref_lp = th.stack([c.log_prob(th.as_tensor(servers[d])) for d, c in enumerate(cats)])
            ref_ent = th.stack([c.entropy() for c in cats])
            red = (lambda x: x.sum()) if reduction == "sum" else (lambda x: x.mean())
            assert float(lp - lp_route) == pytest.approx(float(red(ref_lp)), abs=1e-5)
            assert float(ent - ent_route) == pytest.approx(float(red(ref_ent)), abs=1e-5)
            assert float(red(ref_ent)) > 0.1  # a real choice (2 values per datacenter)
        else:  # only the servers in force are allowed: no choice, no log-probability
            np.testing.assert_array_equal(servers, env._inner.unwrapped.state().capacity_target_servers)
            assert float(lp - lp_route) == pytest.approx(0.0, abs=1e-6)
            assert float(ent - ent_route) == pytest.approx(0.0, abs=1e-6)
        obs, _, term, trunc, _ = env.step(a)
        assert not (term or trunc)
    assert decisions == 3
    env.close()


def test_ppo_fine_tunes_a_capacity_checkpoint_on_dev(tmp_path):
    from sb3_contrib import MaskablePPO

    from carbon_gym.policy import rollout
    from train.checkpoint import save_set_checkpoint
    from train.envs import make_episode_env
    from train.policy import LearnedPolicy, export_checkpoint
    from train.runner import train

    warnings.simplefilter("ignore", UserWarning)
    env = make_episode_env("dev", OVER, None)
    th.manual_seed(5)
    start = SetNetwork(layout_spec(env), **NET)
    ck = save_set_checkpoint(tmp_path / "dagger_best.npz", start)  # stands for a DAgger run's best round
    steady = {**OVER, "env.measure": "window", "env.warmup_s": 5.0}  # the steady-state reward: no drain
    cfg = config_from_dict({
        "name": "cap-ppo", "scenarios": ["dev"], "overrides": steady, "n_envs": 1, "total_timesteps": 192,
        "set_policy": NET, "init_checkpoint": str(ck), "vec_normalize": {"reward": True},
        "ppo": {"n_steps": 64, "batch_size": 32, "n_epochs": 2, "learning_rate": 1e-2, "target_kl": None},
        "eval": {"every_timesteps": 0, "final": False},
    })
    out = train(cfg, tmp_path / "run", log=lambda _: None)
    assert out["num_timesteps"] == 192
    # the run started from the checkpoint's weights (the step-0 checkpoint, saved before PPO) ...
    init = MaskablePPO.load(tmp_path / "run" / "checkpoints" / "step_000000000.zip", device="cpu").policy.net
    for k, v in start.state_dict().items():
        assert th.equal(init.state_dict()[k], v), k
    model = MaskablePPO.load(out["final_zip"], device="cpu")
    net = model.policy.net
    assert net.capacity_head and model.policy.action_space.nvec.tolist()[-4:] == [9, 9, 2, 2]
    # ... and PPO moved the capacity head (its log-probability carries a gradient at the decisions)
    # (with no gradient Adam leaves a weight where it was; the output bias, shared by every
    # candidate, gets no gradient through the softmax and is not checked)
    moved = {k: float((v - start.state_dict()[k]).abs().max()) for k, v in net.state_dict().items() if k.startswith("cap_head")}
    assert min(moved["cap_head.0.weight"], moved["cap_head.0.bias"], moved["cap_head.2.weight"]) > 1e-3, moved
    # the fine-tuned head exports to the pickle-free format and decides capacity in an episode
    dst = export_checkpoint(out["final"], tmp_path / "ft.npz", trust=True)
    pol = LearnedPolicy.load(dst)
    assert pol.net.capacity_head
    m = rollout(make_episode_env("dev", OVER, None), pol, seed=0)
    assert m["invalid_actions"] == 0 and m["capacity_decisions"] == 4


def test_critic_warmup_moves_only_the_critic_then_ppo_moves_the_actor(tmp_path):
    """``critic_warmup_timesteps``: during the warm-up only ``value_head`` changes (the actor,
    capacity head included, keeps the checkpoint's weights); after it PPO moves the actor, and
    the full optimizer is back (a checkpoint saved after the warm-up resumes)."""
    from sb3_contrib import MaskablePPO

    from train.checkpoint import save_set_checkpoint
    from train.envs import make_episode_env
    from train.runner import train

    warnings.simplefilter("ignore", UserWarning)
    env = make_episode_env("dev", OVER, None)
    th.manual_seed(6)
    start = SetNetwork(layout_spec(env), **NET)
    ck = save_set_checkpoint(tmp_path / "best.npz", start)
    raw = {"name": "warm", "scenarios": ["dev"], "overrides": {**OVER, "env.measure": "window", "env.warmup_s": 5.0},
           "n_envs": 1, "set_policy": NET, "init_checkpoint": str(ck), "vec_normalize": {"reward": True},
           "critic_warmup_timesteps": 128, "checkpoint": {"every_timesteps": 64, "keep": 10},
           "ppo": {"n_steps": 64, "batch_size": 32, "n_epochs": 2, "learning_rate": 1e-2, "target_kl": None},
           "eval": {"every_timesteps": 0, "final": False}}
    logs: list[str] = []
    train(config_from_dict({**raw, "total_timesteps": 128}), tmp_path / "a", log=logs.append)
    assert any("critic warm-up: 128 timesteps" in m for m in logs)
    warm = MaskablePPO.load(tmp_path / "a" / "final.zip", device="cpu").policy.net.state_dict()
    s0 = start.state_dict()
    changed = {k for k, v in warm.items() if not th.equal(v, s0[k])}
    assert changed and all(k.startswith("value_head") for k in changed), changed
    out = train(config_from_dict({**raw, "total_timesteps": 256}), tmp_path / "b", log=lambda _: None)
    net = MaskablePPO.load(out["final_zip"], device="cpu").policy.net.state_dict()
    assert float((net["cap_head.0.weight"] - s0["cap_head.0.weight"]).abs().max()) > 1e-3
    # a checkpoint after the warm-up holds the full optimizer (every parameter), so it resumes
    b192 = MaskablePPO.load(tmp_path / "b" / "checkpoints" / "step_000000192.zip", device="cpu")
    assert len(b192.policy.optimizer.param_groups[0]["params"]) == len(list(b192.policy.parameters()))
    with pytest.raises(ConfigError, match="critic_warmup_timesteps"):
        config_from_dict({k: v for k, v in raw.items() if k != "init_checkpoint"})


def test_capacity_ppo_config_is_checked(tmp_path):
    base = {"name": "x", "scenarios": ["dev"], "set_policy": dict(NET)}
    with pytest.raises(ConfigError, match="capacity.control"):
        config_from_dict(base)  # the head needs the capacity action
    cfg = config_from_dict({**base, "overrides": OVER})
    assert cfg.set_policy["capacity_head"] and cfg.init_checkpoint is None
    with pytest.raises(ConfigError, match="bc"):
        config_from_dict({**base, "overrides": OVER, "bc": {"expert": "rr"}})
    with pytest.raises(ConfigError, match="init_checkpoint"):
        config_from_dict({**base, "overrides": OVER, "init_checkpoint": 3})
    # the shipped fine-tuning configs start from their DAgger configs' networks
    from train.config import load_config

    for ppo, dagger in (("dev_ppo_capacity", "dev_dagger_capacity"), ("llama8b_ppo_capacity", "llama8b_dagger_capacity")):
        a, b = load_config(ppo), load_config(dagger)
        assert a.init_checkpoint == f"runs/train/{dagger}/best.npz"
        assert {k: v for k, v in a.set_policy.items() if k != "logprob_reduction"} == b.set_policy
    # a checkpoint of another network is refused, naming the difference
    from train.checkpoint import save_set_checkpoint
    from train.envs import make_vec_env
    from train.runner import build_model, init_from_checkpoint

    warnings.simplefilter("ignore", UserWarning)
    venv = make_vec_env(["dev"], OVER, n_envs=1, seed=0, routing=False)
    model = build_model(cfg, venv)
    other = SetNetwork(layout_spec(venv.get_attr("layout")[0]), hidden=4, classes=True, demand_features=True, capacity_head=True)
    path = save_set_checkpoint(tmp_path / "h4.npz", other)
    with pytest.raises(ConfigError, match="hidden"):
        init_from_checkpoint(model, path, log=lambda _: None)
    with pytest.raises(ConfigError, match="no such file"):
        init_from_checkpoint(model, tmp_path / "missing.npz", log=lambda _: None)
    venv.close()
