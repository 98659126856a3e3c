"""The numpy decision path of the set policy (train.fast) against the torch network, request
classes, the choice modes, class-level imitation and the evaluation's policy aliases."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

import torch as th  # noqa: E402

from train.envs import make_episode_env  # noqa: E402
from train.fast import NumpySetScorer, choose  # noqa: E402
from train.set_policy import SetNetwork, layout_spec  # noqa: E402


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def layouts():
    warnings.simplefilter("ignore", UserWarning)
    out = {}
    for name, scen, ov in (("dev", "dev", {"duration_s": 4}), ("paper", "llama8b-moderate", {"duration_s": 3, "env.max_pending": 512})):
        env = make_episode_env(scen, ov, None)
        obs, info = env.reset(seed=3)
        for _ in range(2):
            obs, _, _, _, info = env.step(np.zeros(env.unwrapped.layout.max_pending, dtype=np.int64))
        out[name] = (env, obs, info)
    return out


def random_obs(spec: dict, rng: np.random.Generator, n_valid: int, down: int = 0) -> dict[str, np.ndarray]:
    """A random observation of layout ``spec``: lengths drawn from a few values, so request
    classes hold several members; ``down`` datacenters marked down."""
    D, K, F_D, F_S, R = (spec[k] for k in ("n_datacenters", "max_pending", "n_dc_features", "n_slot_features", "n_regions"))
    c, s = spec["dc_columns"], spec["slot_columns"]
    dc = rng.uniform(0.0, 1.0, (D, F_D)).astype(np.float32)
    dc[:, c["up"]] = 1.0
    dc[:down, c["up"]] = 0.0
    sl = np.zeros((K, F_S), np.float32)
    sl[:n_valid, s["valid"]] = 1.0
    sl[np.arange(n_valid), s["origin"] + rng.integers(0, R, n_valid)] = 1.0
    sl[:n_valid, s["prompt"]] = rng.choice([0.05, 0.3, 0.31, 1.2, 4.0], n_valid) * rng.uniform(0.98, 1.02, n_valid)
    sl[:n_valid, s["predicted_output"]] = rng.choice([0.02, 0.1, 0.25, 0.6], n_valid)
    sl[:n_valid, s["waited"]] = rng.choice([0.0, 0.1, 0.4], n_valid) + rng.uniform(0.0, 0.01, n_valid)
    sl[:n_valid, s["network"]:s["network"] + D] = rng.uniform(0.0, 0.2, (n_valid, D))
    gl = rng.uniform(-1.0, 1.0, 4).astype(np.float32)
    return {"datacenters": dc.reshape(-1), "slots": sl.reshape(-1), "globals": gl}


def _t(obs, dtype=th.float32):
    return {k: th.as_tensor(np.asarray(v)).to(dtype)[None] for k, v in obs.items()}


@pytest.mark.parametrize("name", ["dev", "paper"])
@pytest.mark.parametrize("classes,demand,feedback", [(None, False, 0), (True, True, 0), ({"output_ratio": 3.0, "used_bin": 0.2}, False, 0),
                                                     (True, True, 2), (None, False, 1)])
def test_numpy_logits_equal_torch_on_random_observations(layouts, name, classes, demand, feedback):
    env = layouts[name][0]
    spec = layout_spec(env)
    rng = np.random.default_rng(7)
    th.manual_seed(1)
    net = SetNetwork(spec, hidden=16, classes=classes, demand_features=demand, load_feedback=feedback)
    n64 = SetNetwork(spec, hidden=16, classes=classes, demand_features=demand, load_feedback=feedback).double()
    n64.load_state_dict({k: v.double() for k, v in net.state_dict().items()})
    sc64 = NumpySetScorer(net)
    K = spec["max_pending"]
    checked_classes = checked_rows = 0
    for trial in range(6):
        n_valid = int(rng.integers(1, K + 1))
        obs = random_obs(spec, rng, n_valid, down=trial % 2)
        rows = obs["slots"].reshape(K, -1)[:n_valid]
        with th.no_grad():
            ref64 = n64.scores(_t(obs, th.float64))[0, :n_valid].numpy()
            ref32 = net.scores(_t(obs))[0, :n_valid].numpy()
        lg, inv, rep, counts = sc64.class_logits(obs["datacenters"], rows, obs["globals"])
        assert np.abs(lg[inv] - ref64).max() < 1e-9
        assert np.abs(lg[inv] - ref32).max() < 1e-4 * max(1.0, np.abs(ref32).max())
        # argmax actions equal: numpy (float64) vs torch float64
        assert (lg[inv].argmax(axis=1) == ref64.argmax(axis=1)).all()
        assert counts.sum() == n_valid and (inv[rep] == np.arange(len(rep))).all()
        if classes is None:
            assert len(rep) == n_valid
        checked_classes += len(rep)
        checked_rows += n_valid
    if classes is not None:  # classes hold several requests (scored once)
        assert checked_classes < 0.8 * checked_rows


def test_group_without_inverse_gives_the_same_classes(layouts):
    """group(inverse=False) (the systematic fast path) skips only the row -> class map: the
    class rows, sizes, first rows and sorted order equal those of the full call."""
    env = layouts["paper"][0]
    spec = layout_spec(env)
    rng = np.random.default_rng(5)
    th.manual_seed(3)
    sc = NumpySetScorer(SetNetwork(spec, hidden=8, classes=True, demand_features=True))
    assert sc._key_fits_int16  # the radix-sorted int16 keys are the path under test
    K = spec["max_pending"]
    obs = random_obs(spec, rng, 500)
    rows = obs["slots"].reshape(K, -1)[:500]
    dc = obs["datacenters"].reshape(spec["n_datacenters"], -1)
    crow, inv, rep, counts = sc.group(rows, dc)
    order = sc.last_order().copy()
    crow2, inv2, rep2, counts2 = sc.group(rows, dc, inverse=False)
    assert inv2 is None and np.array_equal(crow, crow2) and np.array_equal(rep, rep2) and np.array_equal(counts, counts2)
    assert np.array_equal(order, sc.last_order())
    # classes are runs of the stable sort: every member of class c precedes every member of c + 1
    assert np.array_equal(inv[order], np.repeat(np.arange(len(counts)), counts))
    assert (np.diff(inv[order]) >= 0).all() and all((np.diff(order[inv[order] == c]) > 0).all() for c in range(len(counts)))


def test_class_members_share_scores_and_are_permutation_equivariant(layouts):
    env = layouts["paper"][0]
    spec = layout_spec(env)
    rng = np.random.default_rng(11)
    th.manual_seed(2)
    net = SetNetwork(spec, hidden=16, classes=True, demand_features=True)
    K = spec["max_pending"]
    obs = random_obs(spec, rng, 300)
    sc = NumpySetScorer(net)
    rows = obs["slots"].reshape(K, -1)[:300]
    _, inv, _, _ = sc.group(rows, obs["datacenters"].reshape(spec["n_datacenters"], -1))
    with th.no_grad():
        logits = net.scores(_t(obs))[0, :300]
        for c in np.unique(inv)[:20]:
            members = np.flatnonzero(inv == c)
            assert th.allclose(logits[members], logits[members[0]].expand(len(members), -1), atol=1e-6)
        perm = rng.permutation(300)
        sl = obs["slots"].reshape(K, -1).copy()
        sl[:300] = sl[perm]
        permuted = dict(obs, slots=sl.reshape(-1))
        logits_p = net.scores(_t(permuted))[0, :300]
    assert th.allclose(logits_p, logits[perm], atol=1e-5)


def test_learned_policy_numpy_and_torch_backends_agree(layouts, tmp_path):
    from sb3_contrib import MaskablePPO

    from train.policy import LearnedPolicy
    from train.set_policy import SetActorCriticPolicy

    env, obs, info = layouts["paper"]
    spec = layout_spec(env)
    model = MaskablePPO(SetActorCriticPolicy, env, n_steps=8, batch_size=8, device="cpu", seed=0,
                        policy_kwargs={"layout": spec, "hidden": 16, "classes": True, "demand_features": True})
    path = tmp_path / "m.zip"
    model.save(path)  # (an SB3 zip: loaded with trust)
    a_np = LearnedPolicy.load(path, mode="argmax", backend="numpy", trust=True)
    a_th = LearnedPolicy.load(path, mode="argmax", backend="torch", trust=True)
    a_auto = LearnedPolicy.load(path, mode="argmax", trust=True)
    assert a_np.net.classes is not None and a_auto.backend == "numpy"
    a_np.reset(env)
    a_th.reset(env)
    a_auto.reset(env)
    x, y = a_np.act(obs, info), a_th.act(obs, info)
    n = int((np.asarray(obs["slots"]).reshape(spec["max_pending"], -1)[:, 0] > 0.5).sum())
    assert n > 0 and (x == y).all() and (a_auto.act(obs, info) == x).all()
    # sampling is reproducible under the seed and restarts with reset()
    s = LearnedPolicy.load(path, mode="sample", seed=5, trust=True)
    s.reset(env)
    first = s.act(obs, info)
    s.reset(env)
    assert (s.act(obs, info) == first).all()


def _probs(lg: np.ndarray, mask: np.ndarray) -> np.ndarray:
    z = np.where(mask, lg, -np.inf)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def test_choose_modes_follow_the_class_probabilities():
    rng = np.random.default_rng(0)
    C, D1 = 3, 5
    logits = rng.normal(0.0, 1.0, (C, D1))
    mask_row = np.array([True, False, True, True, True])
    inv = np.repeat(np.arange(C), [4000, 7, 1])
    rng.shuffle(inv)
    mask = np.tile(mask_row, (len(inv), 1))
    p = _probs(logits, mask_row[None, :])
    # sample: frequencies within 4 standard errors, masked choice never taken
    pick = choose(logits, mask, inv, "sample", np.random.default_rng(1))
    assert not (pick == 1).any() and pick.min() >= 0 and pick.max() < D1
    freq = np.bincount(pick[inv == 0], minlength=D1) / 4000
    assert np.all(np.abs(freq - p[0]) < 4 * np.sqrt(p[0] * (1 - p[0]) / 4000) + 1e-9)
    # systematic: every choice gets the floor or the ceiling of its expected count
    for seed in range(5):
        pick = choose(logits, mask, inv, "systematic", np.random.default_rng(seed))
        for c, size in ((0, 4000), (1, 7), (2, 1)):
            cnt = np.bincount(pick[inv == c], minlength=D1)
            assert (cnt >= np.floor(size * p[c]) - 1e-9).all() and (cnt <= np.ceil(size * p[c]) + 1e-9).all()
    # argmax
    assert (choose(logits, mask, inv, "argmax") == p.argmax(axis=1)[inv]).all()
    # masks that differ inside a class are honoured per request
    mask2 = mask.copy()
    mask2[:100, 0] = False
    pick = choose(logits, mask2, inv, "sample", np.random.default_rng(2))
    assert not (pick[:100] == 0).any() and not (pick == 1).any()


@pytest.mark.parametrize("feedback", [0, 1])
def test_class_level_loss_equals_per_request_cross_entropy(layouts, feedback):
    from train.imitate import _batch, _loss, compress_step

    env = layouts["paper"][0]
    spec = layout_spec(env)
    rng = np.random.default_rng(5)
    th.manual_seed(3)
    net = SetNetwork(spec, hidden=16, classes=True, demand_features=True, load_feedback=feedback)
    K, D = spec["max_pending"], spec["n_datacenters"]
    obs = random_obs(spec, rng, 200)
    mask = np.ones((K, D + 1), bool)
    mask[200:, :D] = False
    expert = rng.integers(0, D + 1, K)
    step = compress_step(NumpySetScorer(net), obs, mask, expert)
    assert step is not None and step.counts.sum() == 200
    with th.no_grad():
        ce, _ = _loss(net, _batch([step]))
        logits = net.scores(_t(obs))[0, :200]
        ref = -th.log_softmax(logits, dim=-1).gather(1, th.as_tensor(expert[:200]).unsqueeze(1)).mean()
    assert abs(float(ce) - float(ref)) < 1e-4


def test_evaluate_resolves_names_with_the_one_registry():
    from train.evaluate import policy_key

    # rows keep solvers' long names (as in the caches and JSON files written before)
    assert [policy_key(n) for n in ("rr", "ilp", "milp", "facility-milp", "ilp-state", "learned")] == [
        "round-robin", "ilp-static", "facility-milp", "facility-milp", "ilp-state", "learned"]


def test_dagger_config_validation(tmp_path):
    from carbon_gym.errors import ConfigError
    from train.config import config_from_dict, load_config

    cfg = load_config("llama8b_dagger")
    assert cfg.dagger is not None and cfg.set_policy["classes"] is True
    with pytest.raises(ConfigError, match="classes"):
        config_from_dict({"scenarios": ["dev"], "dagger": {}})
    with pytest.raises(ConfigError, match="dagger.rollout_mode"):
        config_from_dict({"scenarios": ["dev"], "set_policy": {"classes": True}, "dagger": {"rollout_mode": "x"}})
    with pytest.raises(ConfigError, match="dagger.bogus"):
        config_from_dict({"scenarios": ["dev"], "set_policy": {"classes": True}, "dagger": {"bogus": 1}})


def test_systematic_ranks_from_the_scorer_equal_the_computed_ones(layouts):
    env = layouts["paper"][0]
    spec = layout_spec(env)
    rng = np.random.default_rng(9)
    th.manual_seed(4)
    sc = NumpySetScorer(SetNetwork(spec, hidden=8, classes=True))
    obs = random_obs(spec, rng, 400)
    rows = obs["slots"].reshape(spec["max_pending"], -1)[:400]
    lg, inv, _, counts = sc.class_logits(obs["datacenters"], rows, obs["globals"])
    rank = sc.last_ranks()
    for c in range(len(counts)):  # ranks 0..size-1 inside every class, in row order
        assert (rank[inv == c] == np.arange(counts[c])).all()
    mask = np.ones((400, spec["n_datacenters"] + 1), bool)
    a = choose(lg, mask, inv, "systematic", np.random.default_rng(3), rank)
    b = choose(lg, mask, inv, "systematic", np.random.default_rng(3))
    assert (a == b).all()


def test_checkpoint_records_its_choice_mode(layouts, tmp_path):
    from sb3_contrib import MaskablePPO

    from carbon_gym.errors import ConfigError
    from train.policy import LearnedPolicy, export_checkpoint, write_policy_meta
    from train.set_policy import SetActorCriticPolicy

    env = layouts["dev"][0]
    model = MaskablePPO(SetActorCriticPolicy, env, n_steps=8, batch_size=8, device="cpu", seed=0,
                        policy_kwargs={"layout": layout_spec(env), "hidden": 8, "classes": True})
    src = tmp_path / "src.zip"
    model.save(src)
    assert LearnedPolicy.load(src, trust=True).mode == "sample"  # nothing recorded: the constructor's default
    out = export_checkpoint(src, tmp_path / "out.npz", mode="systematic", trust=True)
    assert LearnedPolicy.load(out).mode == "systematic"
    assert LearnedPolicy.load(out, mode="argmax").mode == "argmax"  # explicit wins
    assert LearnedPolicy.load(export_checkpoint(out, tmp_path / "again.npz")).mode == "systematic"  # kept
    with pytest.raises(ConfigError, match="mode"):
        write_policy_meta(src, {"mode": "bogus"})


def test_dagger_run_writes_rounds_tensorboard_and_a_loadable_checkpoint(tmp_path):
    from train.config import config_from_dict
    from train.curves import read_scalars
    from train.imitate import run_dagger
    from train.policy import LearnedPolicy

    cfg = config_from_dict({
        "name": "tiny", "scenarios": ["llama8b-low"], "overrides": {"duration_s": 3, "env.max_pending": 2048},
        "total_timesteps": 0, "set_policy": {"hidden": 8, "classes": True, "demand_features": True},
        "dagger": {"scenarios": ["llama8b-low", "llama8b-high"], "overrides": {"duration_s": 3}, "expert_episodes": 2,
                   "rounds": 1, "episodes_per_round": 1, "epochs": 2, "val_scenarios": ["llama8b-low"],
                   "rollout_mode": "systematic", "eval_mode": "systematic", "aggregate_weight": 1.0},
    })
    out = run_dagger(cfg, tmp_path / "run", log=lambda _: None)
    assert len(out["rounds"]) == 2 and out["rounds"][1]["steps"] > out["rounds"][0]["steps"]
    assert out["rounds"][1]["episodes"][0]["learner_acts"] and not out["rounds"][0]["episodes"][0]["learner_acts"]
    tags = read_scalars(tmp_path / "run" / "tb")
    assert {"eval/reduction_vs_rr_pct", "slo/violation_rate", "imitate/ce"} <= set(tags)
    pol = LearnedPolicy.load(out["best"])
    assert pol.mode == "systematic" and pol.net.classes is not None and pol.net.demand_features
    # the checkpoint records its training envs and data days: 3 expert + 1 learner episode starts
    assert [f["scenario"] for f in pol.fingerprint] == ["llama8b-low", "llama8b-high"]
    assert pol.fingerprint[0]["n_datacenters"] == 16 and pol.fingerprint[0]["action"] == "route"
    from train.checkpoint import read_set_checkpoint
    from train.envs import is_heldout_day

    days = read_set_checkpoint(out["best"]).training["data_days"]
    starts = days["training_starts_utc"]
    assert len(starts) == 3 and {s for s, _ in starts} <= {"llama8b-low", "llama8b-high"}
    from datetime import datetime

    for _, st in starts:
        assert not is_heldout_day(datetime.strptime(st, "%Y-%m-%dT%H:%M:%SZ").timetuple().tm_yday)
    assert len(days["validation_starts_utc"]) >= 1


def test_systematic_counts_path_equals_per_request_systematic():
    from train.fast import systematic_sorted

    rng = np.random.default_rng(0)
    for trial in range(100):
        C, C1 = int(rng.integers(1, 30)), int(rng.integers(2, 18))
        lg = rng.normal(0.0, 2.0, (C, C1))
        mrow = rng.random(C1) < 0.7
        mrow[-1] = True
        counts = rng.integers(1, 50, C)
        inv = np.repeat(np.arange(C), counts)  # class-sorted rows: rank = position in the class
        a = choose(lg, np.tile(mrow, (len(inv), 1)), inv, "systematic", np.random.default_rng(trial))
        b = systematic_sorted(lg, mrow, counts, np.random.default_rng(trial))
        assert (a == b).all()


# ---------------------------------------------------------------------------- the numpy path's actions

#: The shipped agent on a short llama8b-moderate episode (6 steps of 4,096 slots): per step the
#: observation, the action mask, the pending count and the action the compiled (numba) decision
#: path took (the path that produced the first tests/data/golden_quick.json), recorded before the
#: numpy path replaced it (the actions were checked equal to numba's recording). Replaying the
#: observations keeps the check independent of the simulator's physics. Keys ``<mode>__<field>``;
#: ``systematic_reversed``: each step also decided with the slots in reverse order (the valid ones
#: at the back) and one request masked differently (the per-request path); those actions are recorded.
RECORDED = "data/learned_replay.npz"


def _replayed_actions(key: str, rec: Any) -> np.ndarray:
    """The numpy path's actions (steps, K) on the recorded observations of ``key`` (mode, variant),
    the policy bound to a llama8b-moderate env (same layout) with ``seed=3``, as recorded."""
    import gymnasium as gym

    from train.policy import SHIPPED_CHECKPOINT, LearnedPolicy

    mode = key.split("_")[0]
    env = gym.make("carbon_gym/GeoServe-v0", scenario="llama8b-moderate", overrides={"duration_s": 6.0},
                   disable_env_checker=True)
    pol = LearnedPolicy.load(SHIPPED_CHECKPOINT, mode=mode, seed=3)
    env.reset(seed=1001)
    pol.reset(env)
    K = env.unwrapped.layout.max_pending
    out = []
    for i in range(rec[f"{key}__actions"].shape[0]):
        obs = {k: rec[f"{key}__{k}"][i] for k in ("datacenters", "slots", "globals")}
        info = {"action_mask": rec[f"{key}__mask"][i], "pending": int(rec[f"{key}__pending"][i])}
        a = pol.act(obs, info)
        if key.endswith("reversed"):
            o2 = dict(obs, slots=np.array(obs["slots"]).reshape(K, -1)[::-1].reshape(-1).copy())
            m2 = info["action_mask"][::-1].copy()
            m2[-1, 0] = False
            a = pol.act(o2, dict(info, action_mask=m2))
        out.append(a)
    env.close()
    return np.array(out)


@pytest.mark.parametrize("key", ["systematic", "sample", "argmax", "systematic_reversed"])
def test_numpy_path_takes_the_recorded_actions_of_the_shipped_agent(key):
    import os

    rec = np.load(os.path.join(os.path.dirname(__file__), RECORDED), allow_pickle=False)
    want = rec[f"{key}__actions"]
    got = _replayed_actions(key, rec)
    assert got.shape == want.shape == (6, 4096)
    diff = np.argwhere(got != want)
    assert diff.size == 0, f"{len(diff)} choices differ, first at (step, slot) {diff[0].tolist()}"
    assert len(np.unique(want)) > 10 and (want != 16).sum() > 5000  # (requests spread over the datacenters)


@pytest.mark.parametrize("classes", [True, None])
def test_numpy_argmax_equals_the_torch_network_over_an_episode(classes):
    """A short real episode with a random network (load feedback, demand features, a class or a
    per-request network): the numpy path (float64) takes the torch network's argmax choices at
    every step, also on the reversed slots with one request masked differently."""
    from train.policy import LearnedPolicy

    env = make_episode_env("llama8b-moderate", {"duration_s": 4, "env.max_pending": 2048}, None)
    th.manual_seed(0)
    net = SetNetwork(layout_spec(env), hidden=16, classes=classes, demand_features=True, load_feedback=1)
    a = LearnedPolicy(net, mode="argmax", backend="numpy")
    b = LearnedPolicy(net, mode="argmax", backend="torch")
    assert LearnedPolicy(net).backend == ("numpy" if classes else "torch")  # auto
    obs, info = env.reset(seed=1)
    a.reset(env)
    b.reset(env)
    K = env.unwrapped.layout.max_pending
    steps = 0
    while True:
        act_a = a.act(obs, info)
        assert np.array_equal(act_a, b.act(obs, info)), steps
        o2 = dict(obs, slots=np.array(obs["slots"]).reshape(K, -1)[::-1].reshape(-1).copy())
        m2 = info["action_mask"][::-1].copy()
        m2[-1, 0] = False
        i2 = dict(info, action_mask=m2)
        assert np.array_equal(a.act(o2, i2), b.act(o2, i2)), steps
        obs, _, _, trunc, info = env.step(act_a)
        steps += 1
        if trunc:
            break
    assert steps >= 4


def test_unknown_backend_names_the_allowed_ones(layouts):
    from carbon_gym.errors import ConfigError
    from train.policy import LearnedPolicy

    net = SetNetwork(layout_spec(layouts["dev"][0]), hidden=8, classes=True)
    with pytest.raises(ConfigError, match=r"backend.*'numba'.*allowed: auto, numpy, torch"):
        LearnedPolicy(net, backend="numba")
    with pytest.raises(TypeError, match="dtype"):  # (float64 only: a float32 pair layer was no faster, and changed choices)
        LearnedPolicy(net, dtype="float32")
    with pytest.raises(ConfigError, match="systematic.*numpy"):
        LearnedPolicy(net, mode="systematic", backend="torch")


def test_front_count_checks_the_envs_pending_count():
    """The number of valid slots when they are slots 0..n-1 (else -1): the env's ``pending``
    hint is used only when it checks out (slots before it valid, slot n and the last slot not),
    so a wrong hint costs a full scan, never a wrong count."""
    from train.policy import _front_count

    K = 64
    slots = np.zeros((K, 3), np.float32)
    slots[:10, 1] = 1.0
    for hint in (10, None, 9, 11, 0, K, 10 ** 6, -1, "10"):
        assert _front_count(slots, 1, hint) == 10, hint
    slots[K - 1, 1] = 1.0  # valid slots not at the front
    for hint in (10, None, 11, K):
        assert _front_count(slots, 1, hint) == -1, hint
    full = np.ones((K, 3), np.float32)
    assert _front_count(full, 1, 10 ** 6) == K and _front_count(full, 1, K) == K
    assert _front_count(np.zeros((K, 3), np.float32), 1, 0) == 0
