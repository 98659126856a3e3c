"""The class set policy's learner path: the network runs once per request class and the slots
gather their class's logits (``SetNetwork._forward``); log-probabilities, entropies, values and
gradients equal those of the per-slot evaluation (``SetNetwork.per_slot``) on random and real
observations with their masks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

import torch as th  # noqa: E402

from test_train_fast import random_obs  # noqa: E402
from train.envs import make_episode_env  # noqa: E402
from train.set_policy import SetActorCriticPolicy, layout_spec  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

NET = {"hidden": 16, "classes": True, "demand_features": True, "load_feedback": 1}


@pytest.fixture(scope="module")
def batches():
    """(env, observations stacked (B, ...), masks (B, K x (D + 1))) of dev (D = 2, K = 64) and
    the paper topology (D = 16, K = 96): real steps (requests deferred so that slots fill) and
    random observations of the paper layout with classes of several members."""
    warnings.simplefilter("ignore", UserWarning)
    out = {}
    for name, scen, ov in (("dev", "dev", {"duration_s": 8}),
                           ("paper", "llama8b-low", {"duration_s": 4, "env.max_pending": 96})):
        env = make_episode_env(scen, ov, None)
        obs, info = env.reset(seed=4)
        K = env.unwrapped.layout.max_pending
        D = env.unwrapped.layout.n_datacenters
        rows, masks = [], []
        for _ in range(4):
            rows.append(obs)
            masks.append(np.asarray(info["action_mask"], bool).reshape(-1))
            obs, _, _, _, info = env.step(np.full(K, D, dtype=np.int64))  # defer all: the slots fill
        out[name] = (env, rows, masks)
    env, real, _ = out["paper"]
    spec = layout_spec(env)
    rng = np.random.default_rng(5)
    K, D = spec["max_pending"], spec["n_datacenters"]
    rand, rmasks = [], []
    for n, down in ((0, 0), (1, 0), (30, 2), (96, 0), (70, 5)):
        o = random_obs(spec, rng, n, down=down)
        m = np.zeros((K, D + 1), bool)
        m[:, D] = True
        m[:n, :D] = rng.uniform(size=(n, D)) > 0.2  # per-request masks, not constant within a class
        m[:n, :down] = False
        rand.append(o)
        rmasks.append(m.reshape(-1))
    out["random"] = (env, rand, rmasks)
    return out


def _stack(rows: list[dict]) -> dict[str, th.Tensor]:
    return {k: th.as_tensor(np.stack([np.asarray(r[k], dtype=np.float32) for r in rows])) for k in rows[0]}


def _policy(env, reduction: str) -> SetActorCriticPolicy:
    th.manual_seed(3)
    return SetActorCriticPolicy(env.observation_space, env.action_space, lambda _: 1e-3, layout=layout_spec(env),
                                logprob_reduction=reduction, **NET)


def _valid_counts(env, rows) -> np.ndarray:
    L = env.unwrapped.layout
    return np.array([(np.asarray(r["slots"]).reshape(L.max_pending, -1)[:, L.slot_columns["valid"]] > 0.5).sum() for r in rows])


@pytest.mark.parametrize("which", ["dev", "paper", "random"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_class_path_gives_the_per_slot_log_probs_entropy_and_values(batches, which, reduction):
    env, rows, masks = batches[which]
    assert _valid_counts(env, rows).max() >= 20  # real batches hold many requests
    pol = _policy(env, reduction)
    obs, m = _stack(rows), np.stack(masks)
    with th.no_grad():
        dist = pol.get_distribution(obs, action_masks=m)
        actions = dist.sample()
        v1, lp1, ent1 = pol.evaluate_actions(obs, actions, action_masks=m)
        pol.net.per_slot = True
        v0, lp0, ent0 = pol.evaluate_actions(obs, actions, action_masks=m)
    K = env.unwrapped.layout.max_pending
    assert actions.shape == (len(rows), K)
    assert np.asarray(m).reshape(len(rows), K, -1)[np.arange(len(rows))[:, None], np.arange(K), actions.numpy()].all()
    tol = 1e-6 * (1.0 if reduction == "mean" else float(K))
    assert th.allclose(lp1, lp0, rtol=0, atol=tol), (lp1 - lp0).abs().max()
    assert th.allclose(ent1, ent0, rtol=0, atol=tol), (ent1 - ent0).abs().max()
    assert th.allclose(v1, v0, rtol=0, atol=1e-6), (v1 - v0).abs().max()
    # not trivially equal: the log-probs and entropies differ between observations
    assert lp0.std() > 1e-3 and ent0.max() > 0.1


def test_class_path_scores_fewer_rows_than_slots(batches):
    env, rows, _ = batches["paper"]
    pol = _policy(env, "mean")
    net = pol.net
    dc, sl, _ = net.split_obs(_stack(rows))
    valid = sl[:, :, net._s_valid] > 0.5
    crow, sizes, slot_class = net.class_rows(sl, valid, dc)
    n_valid = valid.sum(dim=1)
    assert crow.shape[1] < 0.5 * int(n_valid.max())  # the network runs on C << K rows
    assert th.equal(sizes.sum(dim=1), n_valid.to(sizes.dtype))  # every valid request in one class
    # gathering the class rows gives the class-mean slot rows on the valid slots
    gathered = crow.gather(1, slot_class.unsqueeze(-1).expand(-1, -1, crow.shape[-1]))
    ref = net.class_mean_slots(sl, valid, dc)
    assert th.equal(gathered[valid], ref[valid])


def test_class_path_gradients_match_the_per_slot_ones(batches):
    env, rows, masks = batches["paper"]
    env_r, rand, rmasks = batches["random"]
    obs, m = _stack(rows + rand), np.stack(masks + rmasks)
    pol = _policy(env, "mean")
    with th.no_grad():
        actions = pol.get_distribution(obs, action_masks=m).sample()
    rng = np.random.default_rng(0)
    adv = th.as_tensor(rng.normal(size=len(actions)), dtype=th.float32)
    ret = th.as_tensor(rng.normal(size=(len(actions), 1)), dtype=th.float32)

    def grads(per_slot: bool) -> list[th.Tensor]:
        pol.net.per_slot = per_slot
        pol.zero_grad()
        v, lp, ent = pol.evaluate_actions(obs, actions, action_masks=m)
        loss = -(lp * adv).mean() + 0.5 * ((v - ret) ** 2).mean() - 0.01 * ent.mean()
        loss.backward()
        return [p.grad.detach().clone() for p in pol.parameters()]

    g1, g0 = grads(False), grads(True)
    f1, f0 = th.cat([g.reshape(-1) for g in g1]), th.cat([g.reshape(-1) for g in g0])
    assert f0.norm() > 1e-3
    cos = th.dot(f1, f0) / (f1.norm() * f0.norm())
    assert cos > 1 - 1e-6
    assert (f1 - f0).norm() < 1e-4 * f0.norm()
    for a, b in zip(g1, g0):
        assert th.allclose(a, b, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("n_choices", [5, 70])  # 70: too many choices for the int64 (class, mask) key
def test_slot_categorical_class_mode_equals_per_slot_on_gathered_logits(n_choices):
    from train.slot_dist import SlotCategorical

    g = th.Generator().manual_seed(1)
    B, C, K, A = 3, 4, 9, n_choices
    class_logits = th.randn(B, C, A, generator=g)
    slot_class = th.randint(0, C, (B, K), generator=g)
    masks = th.rand(B, K, A, generator=g) > 0.3
    masks[:, :, -1] = True
    masks[:, -1, :-1] = False  # a padded slot: defer only
    gathered = class_logits.gather(1, slot_class.unsqueeze(-1).expand(-1, -1, A))
    for reduction in ("mean", "sum"):
        ref = SlotCategorical(K, A, reduction).proba_distribution(gathered.reshape(B, -1))
        ref.apply_masking(masks.reshape(B, -1))
        cls = SlotCategorical(K, A, reduction).proba_distribution(class_logits, slot_class)
        cls.apply_masking(masks.reshape(B, -1))
        actions = ref.sample()
        assert th.allclose(cls.log_prob(actions), ref.log_prob(actions), atol=1e-6)
        assert th.allclose(cls.entropy(), ref.entropy(), atol=1e-6)
        assert th.equal(cls.mode(), ref.mode())
        assert th.allclose(cls.logits, ref.logits)
        cls.apply_masking(None)  # unmasked: the class rows themselves
        ref.apply_masking(None)
        assert th.allclose(cls.log_prob(actions), ref.log_prob(actions), atol=1e-6)


def test_dense_unique_equals_torch_unique():
    import torch as th

    from train.set_policy import dense_unique

    g = th.Generator().manual_seed(0)
    for size, n in ((1, 5), (7, 1), (50, 200), (2305 * 3, 6000)):
        x = th.randint(0, size, (n,), generator=g)
        x[0] = size - 1  # the table's last value
        u, inv = dense_unique(x, size)
        u_ref, inv_ref = th.unique(x, return_inverse=True)
        assert th.equal(u, u_ref) and th.equal(inv, inv_ref) and inv.dtype == inv_ref.dtype == th.int64
