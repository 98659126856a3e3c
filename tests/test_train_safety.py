"""Inference-time safety knobs of the learned policy (train.fast.SAFETY_KNOBS): neutral values give
exactly the network's decisions; stronger values move choices in the documented direction (off
pairs with little estimated TTFT headroom; toward an even proposed load per engine); checkpoints
record them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

import torch as th  # noqa: E402

from carbon_gym.errors import ConfigError  # noqa: E402
from train.envs import make_episode_env  # noqa: E402
from train.policy import SHIPPED_CHECKPOINT, LearnedPolicy, export_checkpoint  # noqa: E402
from train.set_policy import layout_spec  # noqa: E402


@pytest.fixture(scope="module")
def paper():
    """A real llama8b-moderate observation (the scenario's K) after one round-robin step: ~1,600
    pending requests in ~100 classes, TTFT headroom spread over 0.3-0.9 SLO."""
    warnings.simplefilter("ignore", UserWarning)
    prev = th.get_num_threads()
    th.set_num_threads(1)
    env = make_episode_env("llama8b-moderate", {"duration_s": 3}, None)
    obs, info = env.reset(seed=3)
    for _ in range(1):
        lay = env.unwrapped.layout
        obs, _, _, _, info = env.step(np.arange(lay.max_pending, dtype=np.int64) % lay.n_datacenters)  # round-robin
    yield env, obs, info
    env.close()
    th.set_num_threads(prev)


def _class_probs(pol: LearnedPolicy, obs: dict) -> tuple[np.ndarray, np.ndarray]:
    """Choice probabilities (C, D + 1) and class sizes (C,) of ``obs``."""
    sc = pol.scorer
    slots = np.asarray(obs["slots"]).reshape(sc.K, sc.F_S)
    rows = slots[slots[:, sc._s_valid] > 0.5]
    lg, _, _, counts = sc.class_logits(obs["datacenters"], rows, obs["globals"])
    p = np.exp(lg - lg.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p, counts


def test_neutral_knobs_give_exactly_the_networks_actions(paper):
    env, obs, info = paper
    neutral = {"load_price": 0.0, "headroom_penalty": 0.0}  # (the shipped checkpoint records a headroom penalty)
    ref = LearnedPolicy.load(SHIPPED_CHECKPOINT, mode="systematic", **neutral)
    torch_ref = LearnedPolicy.load(SHIPPED_CHECKPOINT, mode="argmax", backend="torch", **neutral)
    arg = LearnedPolicy.load(SHIPPED_CHECKPOINT, mode="argmax", **neutral)
    for p in (ref, torch_ref, arg):
        p.reset(env)
    assert ref.safety == {"load_price": 0.0, "headroom_penalty": 0.0, "headroom_margin": 0.6}
    assert (arg.act(obs, info) == torch_ref.act(obs, info)).all()  # the network's own argmax
    # the logits are the torch network's (which has no knobs)
    sc = ref.scorer
    slots = np.asarray(obs["slots"]).reshape(sc.K, sc.F_S)
    n = int((slots[:, sc._s_valid] > 0.5).sum())
    lg = sc.class_logits(obs["datacenters"], slots[:n], obs["globals"])[0][sc.group(slots[:n], np.asarray(obs["datacenters"], np.float32).reshape(sc.D, sc.F_D))[1]]
    with th.inference_mode():
        t_obs = {k: th.as_tensor(np.asarray(v, np.float32)).reshape(1, -1) for k, v in obs.items()}
        t_obs["slots"] = th.as_tensor(slots[:n].astype(np.float32)).reshape(1, -1)
        ref_lg = torch_ref.net.scores(t_obs)[0].numpy()
    np.testing.assert_allclose(lg, ref_lg, rtol=1e-4, atol=1e-4)
    a = ref.act(obs, info)
    assert n > 100 and len(set(a[:n].tolist())) > 2  # a real split over several datacenters


def test_headroom_penalty_moves_mass_off_pairs_below_the_margin(paper):
    env, obs, info = paper
    obs = {k: np.array(v, copy=True) for k, v in obs.items()}
    spec = layout_spec(env)
    D, F_D = spec["n_datacenters"], spec["n_dc_features"]
    sc = LearnedPolicy.load(SHIPPED_CHECKPOINT).scorer
    sc.bind(spec)
    slots = np.asarray(obs["slots"]).reshape(sc.K, sc.F_S)
    rows = slots[slots[:, sc._s_valid] > 0.5]
    dc = obs["datacenters"].reshape(D, F_D).astype(np.float64)
    crow = sc.group(rows, dc.astype(np.float32))[0]
    head = 1.0 - (crow[:, 2:3] + crow[:, 3:] + dc[:, sc._c_wait] + dc[:, sc._c_prefill] * crow[:, :1])
    margin = float(np.median(head))  # half the (class, datacenter) pairs fall below it
    below = head < margin
    assert 0.3 < below.mean() < 0.7
    mass, short = [], []
    for beta in (0.0, 5.0, 20.0):
        pol = LearnedPolicy.load(SHIPPED_CHECKPOINT, headroom_penalty=beta, headroom_margin=margin)
        pol.reset(env)
        p, counts = _class_probs(pol, obs)
        mass.append(float(counts @ (p[:, :D] * below).sum(axis=1)))
        short.append(float(counts @ (p[:, :D] * np.maximum(margin - head, 0.0)).sum(axis=1)))
    assert mass[0] > mass[1] > mass[2]  # strictly fewer expected requests on pairs below the margin
    assert short[0] > short[1] > short[2]  # and less expected headroom shortfall (request x SLO)
    assert short[2] < 0.95 * short[0], short  # 86.3 -> 83.3 -> 74.7 on this step


def test_load_price_evens_the_proposed_load_per_engine(paper):
    env, obs, info = paper
    spec = layout_spec(env)
    eng = np.maximum(np.asarray(spec["n_engines"], float), 1.0)
    spread = []
    for gamma in (0.0, 0.1, 0.5):
        pol = LearnedPolicy.load(SHIPPED_CHECKPOINT, load_price=gamma, headroom_penalty=0.0)
        pol.reset(env)
        p, counts = _class_probs(pol, obs)
        req = (counts @ p[:, :-1]) / eng  # proposed requests per engine, per datacenter
        spread.append(float(req.max() - req.min()))
    assert spread[0] > spread[1] > spread[2]


def test_checkpoint_records_the_knobs(tmp_path):
    old = LearnedPolicy.load(SHIPPED_CHECKPOINT)
    # the shipped checkpoint records the knobs selected on validation days (train/RESULTS_TRAIN.md)
    assert old.safety == {"load_price": 0.0, "headroom_penalty": 20.0, "headroom_margin": 0.6}
    assert old.scorer.headroom_penalty == 20.0 and old.scorer.headroom_margin == 0.6
    out = export_checkpoint(SHIPPED_CHECKPOINT, tmp_path / "k.npz",
                            safety={"load_price": 0.08, "headroom_penalty": 0.0, "headroom_margin": 0.0})
    pol = LearnedPolicy.load(out)
    assert pol.safety == {"load_price": 0.08, "headroom_penalty": 0.0, "headroom_margin": 0.0} and pol.scorer.load_price == 0.08
    assert pol.mode == old.mode == "systematic"
    assert LearnedPolicy.load(out, load_price=0.0).safety["load_price"] == 0.0  # explicit wins
    assert LearnedPolicy.load(export_checkpoint(out, tmp_path / "again.npz")).safety["load_price"] == 0.08  # kept
    with pytest.raises(ConfigError, match="load_price"):
        LearnedPolicy.load(SHIPPED_CHECKPOINT, load_price=-1.0)
    with pytest.raises(ConfigError, match="load_price"):
        LearnedPolicy.load(SHIPPED_CHECKPOINT, backend="torch", mode="argmax", load_price=1.0, headroom_penalty=0.0)
    with pytest.raises(ConfigError, match="headroom_penalty=20.0 .* pass headroom_penalty=0.0"):  # recorded knob, torch path
        LearnedPolicy.load(SHIPPED_CHECKPOINT, backend="torch", mode="argmax")
    both = export_checkpoint(SHIPPED_CHECKPOINT, tmp_path / "h.npz", safety={"headroom_penalty": 20.0, "headroom_margin": 0.6})
    assert LearnedPolicy.load(both).safety == {"load_price": 0.0, "headroom_penalty": 20.0, "headroom_margin": 0.6}
