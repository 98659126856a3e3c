"""The set policy's capacity head (``set_policy.capacity_head``): numpy logits equal the torch
network's, the learned policy's action at capacity decisions, the checkpoint round trip, the
capacity cross-entropy on an analytic case, and a tiny DAgger run on the capacity-aware MILP."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError
from train.fast import NumpySetScorer
from train.set_policy import MASKED_LOGIT, SetNetwork, layout_spec


def _env(**over):
    return GeoServeEnv("dev", overrides={"duration_s": 40.0, "capacity.control": "agent", **over})


def _obs_after(env, steps: int):
    obs, info = env.reset(seed=0)
    K = env.unwrapped.layout.max_pending
    for _ in range(steps):
        obs, _, _, _, info = env.step({"route": np.zeros(K, dtype=np.int64)})
    return obs, info


def test_numpy_capacity_logits_equal_the_torch_network():
    env = _env()
    th.manual_seed(3)
    net = SetNetwork(layout_spec(env), hidden=8, classes=True, demand_features=True, load_feedback=1, capacity_head=True)
    net64 = SetNetwork(layout_spec(env), hidden=8, classes=True, demand_features=True, load_feedback=1,
                       capacity_head=True).double()
    net64.load_state_dict({k: v.double() for k, v in net.state_dict().items()})
    for steps in (0, 3, 7):
        obs, _ = _obs_after(env, steps)
        K = net.K
        sl = np.asarray(obs["slots"], dtype=np.float32).reshape(K, -1)
        valid = sl[:, net._s_valid] > 0.5
        dc = th.from_numpy(np.asarray(obs["datacenters"], np.float32)).reshape(1, net.D, net.F_D)
        gl = th.from_numpy(np.asarray(obs["globals"], np.float32)).reshape(1, -1)
        slt = th.from_numpy(sl).reshape(1, K, -1)
        for model, tol in ((net64, 1e-9), (net, 1e-4)):
            sc = NumpySetScorer(model)
            if valid.any():
                sc.class_logits(obs["datacenters"], sl[valid], obs["globals"])
            zn = sc.capacity_logits(obs["datacenters"], obs["globals"])
            zt = model.capacity_scores(dc, gl, model.totals(slt.to(model.pair_out.weight.dtype), th.from_numpy(valid)[None]))[0]
            np.testing.assert_allclose(zn, zt.detach().double().numpy(), atol=tol, rtol=tol)
            assert zn.shape == (2, 2)  # dev: one server per datacenter -> 0 or 1
    env.close()
    # a layout without capacity control cannot feed the head
    plain = GeoServeEnv("dev", overrides={"duration_s": 4.0})
    net.bind(layout_spec(plain))
    with pytest.raises(ConfigError, match="capacity_head"):
        net.capacity_scores(dc, gl, th.zeros(1, 3))
    plain.close()


def test_candidates_mask_beyond_each_datacenters_servers():
    env = _env()
    net = SetNetwork(layout_spec(env), hidden=4, classes=True, capacity_head=True)
    obs, _ = _obs_after(env, 2)
    dc = th.from_numpy(np.asarray(obs["datacenters"], np.float32)).reshape(1, net.D, net.F_D)
    x, mask = net.capacity_candidates(dc, th.tensor([[32.0, 0.0, 0.0]]), n_servers=[2, 4], n_engines=[16, 32])
    assert mask.tolist() == [[True, True, True, False, False], [True, True, True, True, True]]
    np.testing.assert_allclose(x[0, 0, :3, 0].numpy(), [0.0, 0.5, 1.0])  # n / S_d
    # pending per engine of n servers, / 16 (8 engines a server; 0 servers -> 0.5 engine)
    np.testing.assert_allclose(x[0, 1, :, 2].numpy(), [4.0, 32 / 128, 32 / 256, 32 / 384, 32 / 512], rtol=1e-6)
    gl = th.from_numpy(np.asarray(obs["globals"], np.float32))[None]
    z = net.capacity_scores(dc, gl, th.tensor([[32.0, 0.0, 0.0]]), n_servers=[2, 4], n_engines=[16, 32])
    z = z.detach()
    assert float(z[0, 0, 3]) == MASKED_LOGIT and float(z[0, 0, 2]) != MASKED_LOGIT
    env.close()


def test_learned_policy_decides_servers_at_capacity_decisions_and_round_trips(tmp_path):
    from train.checkpoint import read_set_checkpoint, save_set_checkpoint
    from train.policy import LearnedPolicy

    env = _env()
    th.manual_seed(0)
    net = SetNetwork(layout_spec(env), hidden=8, classes=True, demand_features=True, capacity_head=True)
    with th.no_grad():  # bias the head to "one server" everywhere
        net.cap_head[2].bias.fill_(0.0)
        net.cap_head[2].weight.zero_()
        net.cap_head[0].weight.zero_()
        net.cap_head[0].bias.zero_()
        net.cap_head[0].weight[0, net.hidden] = 1.0  # unit 0 = n / S_d
        net.cap_head[2].weight[0, 0] = 5.0
    path = save_set_checkpoint(tmp_path / "cap.npz", net, policy={"mode": "systematic"})
    ck = read_set_checkpoint(path)
    assert ck.network["capacity_head"] is True and "cap_head.0.weight" in ck.tensors
    for backend in ("numpy", "torch"):
        pol = LearnedPolicy.load(path, backend=backend, mode="argmax")
        obs, info = env.reset(seed=0)
        pol.reset(env)
        kinds = []
        for _ in range(35):
            a = pol.act(obs, info)
            kinds.append(isinstance(a, dict))
            if isinstance(a, dict):
                assert a["servers"].tolist() == [1, 1] and a["capacity"].tolist() == [8, 8]
            obs, _, _, _, info = env.step(a)
        assert [i for i, k in enumerate(kinds) if k] == [0, 30]  # every capacity.period_s = 30 steps
    # a capacity-head policy on an env without capacity control only routes
    plain = GeoServeEnv("dev", overrides={"duration_s": 4.0})
    pol = LearnedPolicy.load(path)
    obs, info = plain.reset(seed=0)
    pol.reset(plain)
    assert not isinstance(pol.act(obs, info), dict)
    env.close()
    plain.close()


def test_capacity_loss_is_the_cross_entropy_of_the_expert_servers():
    from train.imitate import CapacityStep, capacity_loss

    env = _env()
    net = SetNetwork(layout_spec(env), hidden=4, classes=True, capacity_head=True)
    with th.no_grad():
        for p in net.cap_head.parameters():
            p.zero_()  # every candidate scores 0: uniform over 0..S_d
    obs, _ = _obs_after(env, 1)
    dc = np.asarray(obs["datacenters"], np.float32).reshape(2, -1)
    st = CapacityStep(dc, np.asarray(obs["globals"], np.float32), np.zeros(3), np.array([1, 0]), np.array([True, True]),
                      np.array([1, 1]), np.array([8, 8]))
    ce, acc, mae = capacity_loss(net, [st])
    assert float(ce.detach()) == pytest.approx(np.log(2.0), rel=1e-6)  # two choices each
    # a datacenter that is down does not count
    st_down = CapacityStep(dc, st.gl, st.totals, st.servers, np.array([True, False]), st.n_servers, st.n_engines)
    assert float(capacity_loss(net, [st_down])[0].detach()) == pytest.approx(np.log(2.0), rel=1e-6)
    env.close()


def test_config_checks_the_capacity_head():
    from train.config import config_from_dict

    with pytest.raises(ConfigError, match="set_policy.capacity_head"):
        config_from_dict({"name": "x", "scenarios": ["dev"], "set_policy": {"classes": True, "capacity_head": True}})
    with pytest.raises(ConfigError, match="dagger.capacity_weight"):
        config_from_dict({"name": "x", "scenarios": ["dev"], "set_policy": {"classes": True, "capacity_head": True},
                          "dagger": {"capacity_weight": -1.0}})


def test_tiny_dagger_run_learns_the_milps_capacity(tmp_path):
    from train.config import config_from_dict
    from train.imitate import run_dagger
    from train.policy import LearnedPolicy

    over = {"duration_s": 60, "capacity.control": "agent"}
    cfg = config_from_dict({
        "name": "tiny-cap", "scenarios": ["dev"], "overrides": over, "total_timesteps": 0,
        "set_policy": {"hidden": 8, "classes": True, "demand_features": True, "capacity_head": True},
        "dagger": {"expert": "milp", "scenarios": ["dev"], "overrides": over, "expert_episodes": 3, "rounds": 1,
                   "episodes_per_round": 1, "epochs": 30, "val_scenarios": ["dev"], "rollout_mode": "systematic",
                   "eval_mode": "systematic", "learning_rate": 1e-2},
    })
    out = run_dagger(cfg, tmp_path / "run", log=lambda _: None)
    r0, r1 = out["rounds"]
    # 2 expert decisions per 60 s episode: 4 training + 2 validation decisions after round 0
    assert r0["capacity_steps"] == 4 and r1["capacity_steps"] == 6
    h0 = r0["bc_history"]
    assert h0[-1]["capacity_ce"] < 0.5 * h0[0]["capacity_ce"]  # it fits the expert's servers
    assert h0[-1]["val_capacity_acc"] == 1.0
    pol = LearnedPolicy.load(out["best"])
    assert pol.net.capacity_head and pol.fingerprint[0]["action"] == "route+capacity"


def test_count_scale_reads_a_step_as_the_training_periods_requests():
    """``count_scale`` s multiplies every per-step count the network reads: the numpy and torch
    logits with it equal those without it on s x the counts, and they agree with each other."""
    env = _env(polling_period_s=0.5)
    th.manual_seed(5)
    net = SetNetwork(layout_spec(env), hidden=8, classes=True, demand_features=True, load_feedback=1, capacity_head=True)
    obs, _ = _obs_after(env, 4)
    K = net.K
    sl = np.asarray(obs["slots"], dtype=np.float32).reshape(K, -1)
    valid = sl[:, net._s_valid] > 0.5
    assert valid.sum() >= 2
    dc = th.from_numpy(np.asarray(obs["datacenters"], np.float32)).reshape(1, net.D, net.F_D)
    gl = th.from_numpy(np.asarray(obs["globals"], np.float32)).reshape(1, -1)
    slt, vt = th.from_numpy(sl).reshape(1, K, -1), th.from_numpy(valid)[None]
    base = net.totals(slt, vt)
    net.count_scale = 10.0
    assert th.equal(net.totals(slt, vt), 10.0 * base)
    sc = NumpySetScorer(net)
    assert sc.count_scale == 10.0
    flat = {"datacenters": dc.reshape(1, -1), "slots": slt.reshape(1, -1), "globals": gl}
    zt = net.scores(flat)[0].detach().numpy()[valid]
    logits, inv, _, _ = sc.class_logits(obs["datacenters"], sl[valid], obs["globals"])
    np.testing.assert_allclose(logits[inv], zt, atol=1e-4, rtol=1e-4)  # (float64 against float32)
    plain = NumpySetScorer(net)
    plain.count_scale = 1.0
    unscaled, inv1, _, _ = plain.class_logits(obs["datacenters"], sl[valid], obs["globals"])
    assert np.abs(unscaled[inv1] - zt).max() > 1e-2  # (the scale moves the routing logits)
    # the capacity head: scaled totals t read as 10 t by an unscaled scorer
    t = np.array([3.0, 0.5, 0.7])
    scaled = sc.capacity_logits(obs["datacenters"], obs["globals"], t)
    np.testing.assert_allclose(scaled, plain.capacity_logits(obs["datacenters"], obs["globals"], 10.0 * t), rtol=1e-12)
    assert not np.allclose(scaled, plain.capacity_logits(obs["datacenters"], obs["globals"], t))
    env.close()


def test_learned_policy_resolves_the_count_scale(tmp_path):
    from train.checkpoint import env_fingerprint, save_set_checkpoint
    from train.policy import LearnedPolicy

    env = _env(polling_period_s=0.5)
    net = SetNetwork(layout_spec(env), hidden=4, classes=True, capacity_head=True)
    bare = save_set_checkpoint(tmp_path / "bare.npz", net)
    fp = env_fingerprint(_env(polling_period_s=2.0))
    assert fp["polling_period_s"] == 2.0
    stamped = save_set_checkpoint(tmp_path / "fp.npz", net, fingerprint=[fp])
    for path, kw, scale in ((bare, {}, 1.0), (bare, {"trained_polling_period_s": 1.0}, 2.0),
                            (stamped, {"on_env_mismatch": "ignore"}, 4.0),
                            (stamped, {"on_env_mismatch": "ignore", "trained_polling_period_s": 0.5}, 1.0)):
        for backend in ("numpy", "torch"):
            pol = LearnedPolicy.load(path, backend=backend, **kw)
            pol.reset(env)
            assert pol.count_scale == scale and pol.net.count_scale == scale
            if backend == "numpy":
                assert pol.scorer.count_scale == scale
    for bad in (0, -1.0, float("nan"), True, "1"):
        with pytest.raises(ConfigError, match="trained_polling_period_s"):
            LearnedPolicy.load(bare, trained_polling_period_s=bad)
    env.close()
