"""The feature table: the observation encodes the typed state, decode inverts it, the docs are
generated from it, and a datacenter feature is one table row."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import carbon_gym.observation as obs_mod
from carbon_gym.env import GeoServeEnv
from carbon_gym.observation import DC_FEATURES, ESTIMATE_CAP, Feature, decode_observation, features_markdown
from carbon_gym.policy import RoundRobinPolicy

DOCS = Path(__file__).resolve().parents[1] / "docs" / "observation.md"


def _episode(scenario: str, steps: int, seed: int = 0, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = GeoServeEnv(scenario, **kw)
    pol = RoundRobinPolicy()
    obs, info = env.reset(seed=seed)
    for _ in range(steps):
        yield env, obs
        obs, _, _, trunc, info = env.step(pol.act(obs, info))
        if trunc:
            break


def test_docs_hold_the_generated_feature_tables():
    text = DOCS.read_text()
    block = re.search(r"-->\n(.*)<!-- end generated -->", text, re.S)
    assert block is not None and block.group(1) == features_markdown()
    assert "`est_queue_wait` | est. queueing wait" in features_markdown()
    assert features_markdown().replace("\n", "\n    ") in (GeoServeEnv.__doc__ or "")


@pytest.mark.parametrize("scenario", ["dev", "dev-fault"])
def test_decoded_observation_equals_the_typed_state_to_float32(scenario):
    seen_gap = False
    for env, obs in _episode(scenario, 40, overrides={"duration_s": 40.0}):
        st = env.state()
        dec = decode_observation(obs, env)
        ds = st.datacenters
        L = env.layout
        for f in DC_FEATURES:
            if not L.width(f):
                continue
            want = np.asarray(getattr(ds, f.source))
            got = dec[f.source]
            if f.kind in ("int", "bool"):
                np.testing.assert_array_equal(got, want, err_msg=f.source)
                continue
            if f.estimate:
                target = L.ttft_target_s if f.scale == "ttft" else L.tpot_target_s
                if f.scale == "prefill_ref":
                    target = L.ttft_target_s / 1024.0
                elif f.scale == "tpot_slope_ref":
                    target = L.tpot_target_s / 64.0
                want = np.where(ds.up, np.clip(want, 0.0, ESTIMATE_CAP * target), np.inf)
            np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-30, err_msg=f.source)
        seen_gap |= bool(ds.carbon_stale.any() or ds.carbon_missing.any())
        n = len(st.pending)
        assert n == int(dec["slot_valid"].sum()) and st.action_mask.shape == (n, L.n_datacenters + 1)
        np.testing.assert_allclose(dec["slot_network_s"][:n], st.pending.network_s, rtol=1e-6)
        np.testing.assert_allclose(dec["slot_waited_s"][:n], st.pending.waited_s, rtol=1e-6, atol=1e-12)
        np.testing.assert_array_equal(dec["slot_origin"][:n], st.pending.origin)
        assert st.pending_total == dec["pending_total"]
        pr = env.pending_requests()
        np.testing.assert_array_equal(pr["seq"], st.pending.seq)
        np.testing.assert_array_equal(pr["network_s"], st.pending.network_s)
    assert seen_gap == (scenario == "dev-fault")  # dev-fault has a stale carbon feed


def test_a_datacenter_feature_is_one_table_row(monkeypatch):
    """``accepting_engines`` is a state field but no feature: one row makes it one."""
    row = Feature("accepting", "accepting_engines", "engines", "engines", "engines taking new requests", kind="int")
    monkeypatch.setattr(obs_mod, "DC_FEATURES", DC_FEATURES + (row,))
    for env, obs in _episode("dev-fault", 30, overrides={"duration_s": 30.0}):
        L = env.layout
        assert L.dc_columns["accepting"] == L.n_dc_features - 1 and env.observation_space.contains(obs)
        st = env.state()
        col = obs["datacenters"].reshape(L.n_datacenters, -1)[:, L.dc_columns["accepting"]]
        np.testing.assert_array_equal(col, (st.datacenters.accepting_engines / L.n_engines).astype(np.float32))
        np.testing.assert_array_equal(decode_observation(obs, env)["accepting_engines"], st.datacenters.accepting_engines)
    assert "`accepting` | engines taking new requests" in features_markdown()
    assert st.datacenters.accepting_engines.min() < L.n_engines.max()  # dev-fault drains engines: not a constant


def test_state_is_exact_where_the_observation_is_capped():
    """With a TPOT target of 0.05 ms the decode-time estimates exceed the observation's cap (100 x
    the target); the state keeps the true values."""
    for env, obs in _episode("dev", 5, overrides={"duration_s": 5.0, "slo.tpot_s": 5e-5}):  # noqa: B007 (the last step's)
        pass
    st = env.state()
    cap = ESTIMATE_CAP * env.layout.tpot_target_s
    assert st.datacenters.est_tpot_s.min() > 1.5 * cap
    np.testing.assert_allclose(decode_observation(obs, env)["est_tpot_s"], cap, rtol=1e-7)


# ------------------------------------------------------------------ issue 43, item 5
def _all_at_once(drained: int = 4):
    """dev-fault with every fault over the whole episode (all start at 0 s and end at 60 s), the
    engine drain leaving ``drained`` of us-cal-ciso's 8 engines out."""
    from carbon_gym.scenario import load_scenario, scenario_from_dict

    raw = load_scenario("dev-fault").to_dict()
    for f in raw["faults"]:
        f["start_s"], f["end_s"] = 0.0, 60.0
        if f["kind"] == "engine_drain":
            f["engines"] = drained
    return scenario_from_dict(raw)


def _observations_in_space(scenario, d: int | None) -> tuple[int, int, int]:
    """One episode sending every request to datacenter ``d`` where allowed (None: round-robin);
    (steps, steps with an observation outside observation_space, steps whose typed-state TPOT
    slope was negative somewhere). At a negative slope the feature is exactly 0."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = GeoServeEnv(scenario)
    L = env.layout
    D, col = L.n_datacenters, L.dc_columns["tpot_slope"]
    pol = RoundRobinPolicy()
    obs, info = env.reset(seed=0)
    steps = outside = negative = 0
    while True:
        assert env.observation_space.contains(obs) or not steps
        slope = env.state().datacenters.tpot_slope_s_per_seq
        feat = obs["datacenters"].reshape(D, -1)[:, col]
        if (slope < 0).any():
            negative += 1
            assert (feat[slope < 0] == 0.0).all()
        if d is None:
            a = pol.act(obs, info)
        else:
            m = info["action_mask"]
            a = np.where(m[:, d], d, np.where(m[:, :D].any(1), np.argmax(m[:, :D], axis=1), D))
        obs, _, _, trunc, info = env.step(a)
        steps += 1
        outside += not env.observation_space.contains(obs)
        if trunc:
            return steps, outside, negative


def test_tpot_slope_stays_in_the_space_under_an_all_at_once_fault_schedule():
    """The simulator's TPOT-slope estimate is a difference of the latency table at n + 2 and n + 1
    batched sequences; the A100 table dips between 40 and 48 tokens, so an engine running 39-46
    short-context sequences has a negative slope. Reproduced with every dev-fault fault at once
    (fr down, the Europe -> Ontario link slow, Ontario's feed stale, 7 of Los Angeles' 8 engines
    drained) and everything sent to Los Angeles: its last engine passes through that batch size.
    The feature was then below its space's floor of 0 (5 steps outside observation_space); it
    is clipped to 0 now, the typed state keeping the estimate."""
    steps, outside, negative = _observations_in_space(_all_at_once(drained=7), d=2)
    assert steps == 60 and outside == 0 and negative >= 1
    steps, outside, _ = _observations_in_space(_all_at_once(), d=None)  # (the shipped faults, at once)
    assert steps == 60 and outside == 0
