"""The set policy: permutation equivariance over requests, one set of weights on two topology
sizes, the vectorised masked distribution, and MaskablePPO integration."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

import torch as th  # noqa: E402

from train.envs import make_episode_env  # noqa: E402
from train.set_policy import SetNetwork, SlotCategorical, layout_spec  # noqa: E402


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def envs():
    """dev (D=2, K=64) and the paper topology (D=16, K=96) with real observations."""
    warnings.simplefilter("ignore", UserWarning)
    small = make_episode_env("dev", {"duration_s": 8}, None)
    big = make_episode_env("llama8b-low", {"duration_s": 4, "env.max_pending": 96}, None)
    out = []
    for env in (small, big):
        obs, info = env.reset(seed=4)
        out.append((env, obs, info))
    return out


def _t(obs):
    return {k: th.as_tensor(np.asarray(v, dtype=np.float32))[None] for k, v in obs.items()}


def test_same_weights_on_two_topology_sizes(envs):
    (small, o_s, i_s), (big, o_b, i_b) = envs
    Ls, Lb = small.unwrapped.layout, big.unwrapped.layout
    assert (Ls.n_datacenters, Ls.max_pending) == (2, 64)
    assert (Lb.n_datacenters, Lb.max_pending) == (16, 96)
    th.manual_seed(0)
    net = SetNetwork(layout_spec(small), hidden=16)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    logits_s, value_s = net(_t(o_s))
    assert logits_s.shape == (1, 64, 3) and value_s.shape == (1, 1)
    net.bind(big)
    logits_b, value_b = net(_t(o_b))
    assert logits_b.shape == (1, 96, 17) and value_b.shape == (1, 1)
    assert th.isfinite(logits_b).all() and th.isfinite(value_b).all()
    # A second network bound to the big layout from the start, loaded with the same weights, agrees.
    other = SetNetwork(layout_spec(big), hidden=16)
    other.load_state_dict(state)
    assert th.allclose(other(_t(o_b))[0], logits_b)
    # The inference path gives the training path's logits.
    with th.inference_mode():
        assert th.allclose(net.scores(_t(o_b)), logits_b, atol=1e-5)


def test_scores_are_equivariant_to_request_permutation(envs):
    (_, _, _), (big, obs, info) = envs
    L = big.unwrapped.layout
    K, F = L.max_pending, L.n_slot_features
    slots = np.asarray(obs["slots"]).reshape(K, F)
    n = int((slots[:, L.slot_columns["valid"]] > 0.5).sum())
    assert n >= 20  # a real step of the paper topology holds many requests
    th.manual_seed(1)
    net = SetNetwork(layout_spec(big), hidden=16)
    logits, value = net(_t(obs))
    perm = np.random.default_rng(0).permutation(K)  # mixes valid and padded slots
    permuted = dict(obs)
    permuted["slots"] = slots[perm].reshape(-1)
    logits_p, value_p = net(_t(permuted))
    assert th.allclose(logits_p[0], logits[0][perm], atol=1e-5)
    assert th.allclose(value_p, value, atol=1e-5)
    # Not trivially constant: different requests get different scores.
    assert logits[0, :n, :-1].std() > 0


def test_slot_categorical_matches_per_slot_categoricals():
    th.manual_seed(0)
    K, C = 5, 4
    logits = th.randn(3, K * C)
    masks = th.ones(3, K, C, dtype=th.bool)
    masks[:, 1, 0] = False
    masks[:, 4, :-1] = False  # a padded slot: defer only
    dist = SlotCategorical(K, C, "sum").proba_distribution(logits)
    dist.apply_masking(masks.reshape(3, -1).numpy())
    actions = dist.sample()
    assert actions.shape == (3, K)
    assert (actions[:, 4] == C - 1).all() and (actions[:, 1] != 0).all()
    ref_lp = th.zeros(3)
    ref_ent = th.zeros(3)
    lg = logits.reshape(3, K, C).masked_fill(~masks, -1e8)
    for k in range(K):
        cat = th.distributions.Categorical(logits=lg[:, k])
        ref_lp += cat.log_prob(actions[:, k])
        ref_ent += cat.entropy()
    assert th.allclose(dist.log_prob(actions), ref_lp, atol=1e-5)
    assert th.allclose(dist.entropy(), ref_ent, atol=1e-4)
    mean = SlotCategorical(K, C, "mean").proba_distribution(logits)
    mean.apply_masking(masks.reshape(3, -1))
    # "mean" averages over the 4 slots that hold a decision (the padded slot is excluded).
    assert th.allclose(mean.log_prob(actions), ref_lp / 4, atol=1e-5)


def test_maskable_ppo_uses_the_set_policy_with_masks():
    import gymnasium as gym
    from sb3_contrib import MaskablePPO

    import carbon_gym  # noqa: F401
    from train.set_policy import SetActorCriticPolicy

    env = gym.make("carbon_gym/GeoServe-v0", scenario="dev", overrides={"duration_s": 8})
    model = MaskablePPO(SetActorCriticPolicy, env, n_steps=16, batch_size=8, n_epochs=1, seed=0, device="cpu",
                        policy_kwargs={"layout": layout_spec(env), "hidden": 8})
    model.learn(16)
    assert model.num_timesteps == 16
    obs, _ = env.reset(seed=0)
    mask = env.unwrapped.action_masks()
    act, _ = model.predict(obs, action_masks=mask)
    m = mask.reshape(len(act), -1)
    assert m[np.arange(len(act)), act].all()
    n_params = sum(p.numel() for p in model.policy.parameters())
    assert n_params < 10_000  # independent of K and D


def test_shipped_checkpoint_is_small_and_runs_on_any_topology():
    from carbon_gym.policy import rollout
    from train.policy import SHIPPED_CHECKPOINT, LearnedPolicy

    if not SHIPPED_CHECKPOINT.exists():
        pytest.skip("no shipped checkpoint in train/checkpoints/")
    assert SHIPPED_CHECKPOINT.stat().st_size < 2 * 1024 * 1024
    policy = LearnedPolicy.load(SHIPPED_CHECKPOINT)
    assert policy.kind == "set" and policy.net.D == 16
    # Trained on the 16-datacenter topology, it runs unchanged on the 2-datacenter dev scenario.
    m = rollout(make_episode_env("dev", {"duration_s": 8}, None), policy, seed=0)
    assert m["invalid_actions"] == 0 and m["placed"] > 0
