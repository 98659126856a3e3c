"""The numpy decision path of the set policy (train.fast) against the torch network, request
classes, the choice modes, class-level imitation and the evaluation's policy aliases."""

from __future__ import annotations

import warnings

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
    sc32 = NumpySetScorer(net, dtype=np.float32)
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
        lg32, inv32, _, _ = sc32.class_logits(obs["datacenters"], rows, obs["globals"])
        assert np.abs(lg32[inv32] - ref64).max() < 1e-5 * max(1.0, np.abs(ref64).max())
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
    model.save(path)
    a_np = LearnedPolicy.load(path, mode="argmax", backend="numpy")
    a_th = LearnedPolicy.load(path, mode="argmax", backend="torch")
    a_auto = LearnedPolicy.load(path, mode="argmax")  # numba where installed, else numpy
    from train.fast_jit import available

    assert a_np.net.classes is not None and a_auto.backend == ("numba" if available() else "numpy")
    a_np.reset(env)
    a_th.reset(env)
    a_auto.reset(env)
    x, y = a_np.act(obs, info), a_th.act(obs, info)
    n = int((np.asarray(obs["slots"]).reshape(spec["max_pending"], -1)[:, 0] > 0.5).sum())
    assert n > 0 and (x == y).all() and (a_auto.act(obs, info) == x).all()
    # sampling is reproducible under the seed and restarts with reset()
    s = LearnedPolicy.load(path, mode="sample", seed=5)
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
    assert LearnedPolicy.load(src).mode == "sample"  # nothing recorded: the constructor's default
    out = export_checkpoint(src, tmp_path / "out.zip", mode="systematic")
    assert LearnedPolicy.load(out).mode == "systematic"
    assert LearnedPolicy.load(out, mode="argmax").mode == "argmax"  # explicit wins
    assert LearnedPolicy.load(export_checkpoint(out, tmp_path / "again.zip")).mode == "systematic"  # kept
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


# ---------------------------------------------------------------------------- compiled path (numba)


def _jit():
    return pytest.importorskip("train.fast_jit") if pytest.importorskip("numba") else None


def test_numpy_order_sum_and_edge_count_match_numpy_bit_for_bit():
    fj = _jit()
    rng = np.random.default_rng(0)
    for n in list(range(0, 40)) + [64, 127, 128, 129, 200, 300]:
        for _ in range(20):
            a = rng.random(n) * 10.0 ** rng.uniform(-6, 6, n)
            assert fj._np_sum(a) == float(np.sum(a)), n  # (the order decides the last bits)
    edges = 0.125 * np.arange(1, 64, dtype=np.float64)
    xs = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf), rng.uniform(-1, 9, 2000),
                         [0.0, -0.0, -5.0, 1e9, np.inf, -np.inf, np.nan]])
    for x in xs.astype(np.float32).astype(np.float64).tolist() + xs.tolist():
        assert fj._count_le(edges, x) == int(np.searchsorted(edges, x, "right")), x


def test_compiled_exp_is_within_one_ulp_of_numpy():
    """The softmaxes' exp (a polynomial, so that its loops vectorise) is within 1 ulp of numpy's
    exp for x in [-708, 709], 0 below -708, exactly 1 at 0, and keeps NaN."""
    fj = _jit()

    @fj._nb.njit
    def many(x):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = fj._exp(x[i])
        return out

    rng = np.random.default_rng(3)
    x = np.concatenate([-rng.random(200_000) * 708.0, -np.abs(rng.standard_normal(200_000)) * 3.0,
                        rng.random(20_000) * 709.0, -rng.random(20_000) * 1e-12, [0.0, -0.0, -708.0, 709.0]])
    got, want = many(x), np.exp(x)
    ulps = np.abs(got - want) / np.spacing(want)
    assert ulps.max() <= 1.0 and (got == want).mean() > 0.85
    assert many(np.array([0.0]))[0] == 1.0
    low = many(np.array([-708.01, -745.0, -1e9, -np.inf]))
    assert (low == 0.0).all()
    assert np.isnan(many(np.array([np.nan]))[0])
    with pytest.raises(AssertionError):  # (the check can fail: a 2-ulp error is caught)
        assert (np.abs(got * (1 + 4.5e-16) - want) / np.spacing(want)).max() <= 1.0


def test_fused_slot_layers_equal_the_affine_layers_bit_for_bit():
    fj = _jit()
    rng = np.random.default_rng(4)
    for C, H1, h in ((1, 8, 8), (90, 8, 8), (37, 16, 16), (5, 32, 32)):
        crow = rng.standard_normal((C, 3 + 16)) * rng.choice([0.0, 1.0, 30.0], (C, 19))  # (zeros: skipped terms)
        W_s1, b_s1 = rng.standard_normal((3, H1)), rng.standard_normal(H1)
        M_sd, bias = rng.standard_normal((H1, 2 * h)), rng.standard_normal(2 * h)
        sd = fj._affine(fj._relu_affine(crow[:, :3].copy(), W_s1, b_s1), M_sd, bias)
        sp, hd = fj._slot_layers(crow, W_s1, b_s1, M_sd, bias, h)
        assert np.array_equal(sp, sd[:, :h]) and np.array_equal(hd, np.maximum(sd[:, h:], 0.0))


def test_compiled_class_keys_match_numpy_on_bin_edges_and_odd_values(layouts):
    """The compiled output bin (a branch-free count of edges) equals numpy.searchsorted's, on the
    edges themselves, their float32 neighbours, negatives, infinities and NaN."""
    fj = _jit()
    spec = layout_spec(layouts["dev"][0])
    th.manual_seed(0)
    jit = fj.JitSetScorer(SetNetwork(spec, hidden=8, classes=True))
    r = jit.ref
    e32 = r._out_edges.astype(np.float32)
    preds = np.concatenate([e32, np.nextafter(e32, np.float32(-np.inf)), np.nextafter(e32, np.float32(np.inf)),
                            np.float32([0.0, -0.0, -3.0, 1e30, np.inf, -np.inf, np.nan])])
    rows = np.zeros((preds.size, jit.F_S), dtype=np.float32)
    rows[:, r._s_origin + np.arange(preds.size) % r.R] = 1.0
    rows[:, r._s_pred] = preds
    rows[:, r._s_prompt] = np.linspace(0.0, 3000.0, preds.size, dtype=np.float32)
    dc = np.zeros((jit.D, jit.F_D), dtype=np.float32)
    dc[:, r._c_up] = 1.0
    dc[:, r._c_prefill] = 1e-4
    pref32 = fj._mean_prefill32(dc, jit._icol[9], jit._icol[11])
    keys = fj._class_keys(rows, preds.size, jit._icol, r._origin_key.astype(np.float32), r._out_edges, r._used_edges,
                          pref32, jit._n_keys)
    out_bin = np.searchsorted(r._out_edges, rows[:, r._s_pred].astype(np.float64), "right")
    assert np.array_equal(keys // fj._USED_BINS % (len(r._out_edges) + 1), out_bin)
    assert out_bin[-1] == len(r._out_edges) and out_bin.min() == 0  # (NaN after every edge; some below the first)
    _, inv, _, _ = r.group(rows, dc)
    lg, order, starts, counts = jit.class_logits(dc.reshape(-1), rows, np.zeros(8, dtype=np.float32))
    inv_j = np.empty(preds.size, dtype=np.int64)
    inv_j[order] = np.repeat(np.arange(counts.size), counts)
    assert np.array_equal(inv_j, inv)


@pytest.mark.parametrize("name", ["dev", "paper"])
@pytest.mark.parametrize("demand,feedback", [(True, 1), (False, 0), (True, 2)])
def test_compiled_classes_and_logits_equal_the_float64_numpy_path(layouts, name, demand, feedback):
    fj = _jit()
    env = layouts[name][0]
    spec = layout_spec(env)
    rng = np.random.default_rng(17)
    th.manual_seed(4)
    net = SetNetwork(spec, hidden=16, classes=True, demand_features=demand, load_feedback=feedback)
    ref = NumpySetScorer(net)  # float64
    jit = fj.JitSetScorer(net)
    K = spec["max_pending"]
    for trial in range(6):
        for knobs in ({}, {"headroom_penalty": 5.0, "headroom_margin": 0.4}, {"load_price": 0.3}):
            for obj in (ref, jit.ref):
                for k in ("headroom_penalty", "headroom_margin", "load_price"):
                    setattr(obj, k, knobs.get(k, 0.0))
            n_valid = int(rng.integers(1, K + 1))
            obs = random_obs(spec, rng, n_valid, down=trial % 3)
            rows = obs["slots"].reshape(K, -1)[:n_valid]
            lg, inv, rep, counts = ref.class_logits(obs["datacenters"], rows, obs["globals"])
            order = ref.last_order()
            lg_j, order_j, starts_j, counts_j = jit.class_logits(obs["datacenters"], rows, obs["globals"])
            # the same classes, in the same order, with the same members (sorted like numpy's stable argsort)
            assert np.array_equal(counts, counts_j) and np.array_equal(order, order_j)
            assert np.array_equal(starts_j, np.cumsum(counts) - counts) and np.array_equal(order_j[starts_j], rep)
            np.testing.assert_allclose(lg_j, lg, rtol=1e-10, atol=1e-9)


def test_compiled_policy_takes_the_numpy_float64_policys_actions(layouts):
    """A short real episode, every mode: backend 'numba' gives the actions of backend 'numpy'
    with a float64 pair layer (same classes, logits to ~1e-13, same random draws)."""
    _jit()
    from sb3_contrib import MaskablePPO

    from train.policy import LearnedPolicy
    from train.set_policy import SetActorCriticPolicy

    env = make_episode_env("llama8b-moderate", {"duration_s": 4, "env.max_pending": 512}, None)
    th.manual_seed(0)
    model = MaskablePPO(SetActorCriticPolicy, env, n_steps=8, batch_size=8, device="cpu", seed=0,
                        policy_kwargs={"layout": layout_spec(env), "hidden": 16, "classes": True, "demand_features": True,
                                       "load_feedback": 1})
    for mode in ("systematic", "sample", "argmax"):
        a = LearnedPolicy(model, mode=mode, backend="numpy", dtype="float64", headroom_penalty=5.0, headroom_margin=0.5)
        b = LearnedPolicy(model, mode=mode, backend="numba", headroom_penalty=5.0, headroom_margin=0.5)
        assert b.backend == "numba" and LearnedPolicy(model, mode=mode).backend == "numba"  # auto
        obs, info = env.reset(seed=1)
        a.reset(env)
        b.reset(env)
        steps = 0
        while True:
            act_a, act_b = a.act(obs, info), b.act(obs, info)
            assert np.array_equal(act_a, act_b), (mode, steps)
            # also with the valid slots not at the front and one request masked differently
            n = int(info["pending"])
            if mode == "systematic" and n > 4:
                o2 = dict(obs, slots=np.array(obs["slots"]).reshape(env.unwrapped.layout.max_pending, -1)[::-1].reshape(-1).copy())
                m2 = info["action_mask"][::-1].copy()
                m2[-1, 0] = False
                i2 = dict(info, action_mask=m2)
                assert np.array_equal(a.act(o2, i2), b.act(o2, i2))
            obs, _, _, trunc, info = env.step(act_a)
            steps += 1
            if trunc:
                break
        assert steps >= 4


def test_compiled_backend_refuses_a_per_request_network(layouts):
    fj = _jit()
    env = layouts["dev"][0]
    net = SetNetwork(layout_spec(env), hidden=8, classes=None)
    from carbon_gym.errors import ConfigError

    with pytest.raises(ConfigError, match="class network"):
        fj.JitSetScorer(net)


def test_uniform_stream_hands_out_the_generators_own_numbers():
    """Blocks drawn ahead and handed out in order, to Python callers (``random``) and to a compiled
    consumer (``reserve``, then ``buf`` from ``pos``), give the generator's own sequence."""
    from train.fast import UniformStream

    us = UniformStream(np.random.default_rng(7))
    us.BLOCK = 64  # (small, so that the sizes below cross several refills)
    ref = np.random.default_rng(7)
    for size in (1, 5, 64, 0, 100, 3, 200, 7, 64):
        if size % 2:
            us.reserve(size)
            p = int(us.pos[0])
            got = us.buf[p:p + size].copy()
            us.pos[0] = p + size
        else:
            got = us.random(size)
        assert np.array_equal(got, ref.random(size)), size


def test_one_call_decision_equals_the_sorted_path_and_checks_its_hint(layouts):
    """JitSetScorer.decide (one compiled call) against class_logits + systematic on slots[:n]: the
    same systematic choices from the same uniforms, one per class (so the same classes), for
    every ``n_hint`` (right, none, or wrong: a wrong one only costs a full scan); status 1 with a
    per-request mask or another mode, 2 when the valid slots are not at the front; the scratch
    key table is all zeros afterwards. The fast entry point and numba's dispatcher agree."""
    fj = _jit()
    from train.fast import UniformStream

    env = layouts["paper"][0]
    spec = layout_spec(env)
    th.manual_seed(5)
    net = SetNetwork(spec, hidden=16, classes=True, demand_features=True, load_feedback=1)
    jit = fj.JitSetScorer(net)
    jit.ref.headroom_penalty, jit.ref.headroom_margin = 5.0, 0.4
    K, D = spec["max_pending"], spec["n_datacenters"]
    rng = np.random.default_rng(23)
    for trial in range(8):
        n_valid = 0 if trial == 0 else K if trial == 1 else int(rng.integers(1, K))
        obs = random_obs(spec, rng, n_valid, down=trial % 2)
        slots, dc, gl = obs["slots"], obs["datacenters"], obs["globals"]
        mask = np.ones((K, D + 1), dtype=bool)
        if trial % 3 == 2:
            mask[:, 0] = False  # (one mask for all, not all ones)
        expect = np.full(K, D, dtype=np.int64)
        if n_valid:
            lg, order, _, counts = jit.class_logits(dc, slots.reshape(K, -1)[:n_valid], gl)
            expect[:n_valid] = jit.systematic(lg, mask[0], counts, order, np.random.default_rng(trial))
        for hint in (n_valid, -1, max(n_valid - 1, 0), min(n_valid + 1, K), K, 0):
            us = UniformStream(np.random.default_rng(trial))
            status, n, action = jit.decide(slots, mask, dc, gl, hint, True, us)
            assert (status, n) == (0, n_valid), hint
            assert np.array_equal(action, expect), hint
            assert not jit._table.any()
            assert int(us.pos[0]) == (counts.shape[0] if n_valid else 0)
            # numba's dispatcher (taken for other argument types) runs the same compiled function
            us2 = UniformStream(np.random.default_rng(trial))
            us2.reserve(K)
            action2 = np.empty(K, dtype=np.int64)
            st2, n2 = fj._decide_jit(slots, mask, dc, gl, hint, True, jit._ip, jit._fp, jit._table, us2.buf, us2.pos,
                                     action2)
            assert (st2, n2) == (0, n_valid) and np.array_equal(action2, expect)
            # too few uniforms: status 3, nothing taken - at once for a hint > 0, after the classes
            # otherwise (none needed if there is no request)
            empty = UniformStream(np.random.default_rng(trial))
            want = (3, 0) if hint > 0 else (3, n_valid) if n_valid else (0, 0)
            assert fj._decide_jit(slots, mask, dc, gl, hint, True, jit._ip, jit._fp, jit._table, empty.buf, empty.pos,
                                  action2) == want, hint
            assert not jit._table.any()
            assert int(empty.pos[0]) == 0
            status, n, _ = jit.decide(slots, mask, dc, gl, hint, False, us)  # another mode
            assert (status, n) == (1, n_valid)
            # uniforms drawn only as far as the hint bounds the classes: a wrong (low) hint leaves too
            # few, and decide draws more and decides again, from the same stream
            short = UniformStream(np.random.default_rng(trial))
            short.BLOCK = 1
            st, n3, action3 = jit.decide(slots, mask, dc, gl, hint, True, short)
            assert (st, n3) == (0, n_valid) and np.array_equal(action3, expect), hint
            assert int(short.pos[0]) == (counts.shape[0] if n_valid else 0)
        if 1 < n_valid < K:
            m2 = mask.copy()
            m2[n_valid - 1, 1] = not m2[n_valid - 1, 1]
            assert jit.decide(slots, m2, dc, gl, n_valid, True, UniformStream(np.random.default_rng(0)))[0] == 1
            back = np.ascontiguousarray(slots.reshape(K, -1)[::-1]).reshape(-1)
            assert jit.decide(back, mask, dc, gl, -1, True, UniformStream(np.random.default_rng(0)))[0] == 2
            assert jit.decide(back, mask, dc, gl, n_valid, True, UniformStream(np.random.default_rng(0)))[0] == 2
    from carbon_gym.errors import ConfigError

    obs = random_obs(spec, rng, 5)
    us = UniformStream(np.random.default_rng(0))
    mask = np.ones((K, D + 1), dtype=bool)
    for bad in ({"slots": obs["slots"][:-1]}, {"datacenters": obs["datacenters"][:-1]}, {"globals": obs["globals"][:1]},
                {"mask": mask[:-1]}):
        o = {**obs, "mask": mask, **bad}
        with pytest.raises(ConfigError, match="layout bound by reset"):
            jit.decide(o["slots"], o["mask"], o["datacenters"], o["globals"], -1, True, us)
