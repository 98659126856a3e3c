"""Requests with no allowed datacenter (issue 22, item 2) take no slot: the slots always show the
oldest K placeable requests, the blocked ones stay pending (nothing lost) and are counted."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.scenario import load_scenario, scenario_from_dict


def _europe_cut(k: int = 64, end_s: float = 1000.0) -> GeoServeEnv:
    """dev-fault with every link from Europe cut from t = 0 (the issue's starvation case)."""
    sc = load_scenario("dev-fault", overrides={"env.max_pending": k})
    d = sc.to_dict()
    d["faults"] = [*d.get("faults", []), {"kind": "link_degradation", "region": "europe", "cut": True,
                                          "start_s": 0.0, "end_s": end_s}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GeoServeEnv(scenario_from_dict(d))


def _first_allowed(env: GeoServeEnv, mask: np.ndarray) -> np.ndarray:
    D = env.layout.n_datacenters
    a = np.full(env.layout.max_pending, D, dtype=np.int64)
    for k in range(len(env.state().pending)):
        ok = np.flatnonzero(mask[k, :D])
        a[k] = ok[k % ok.size]
    return a


def _check_offer(env: GeoServeEnv) -> None:
    """The invariant: the slots hold the oldest placeable requests, every one with an allowed
    datacenter; any pending request not shown is blocked, unless all K slots are full."""
    st = env.state()
    allp = env.pending_requests(include_overflow=True)
    shown = st.pending.seq
    K = env.layout.max_pending
    assert st.action_mask[:, :-1].any(axis=1).all()  # every shown request can be placed
    assert len(allp["seq"]) == st.pending_total
    if len(shown) < K:
        assert st.pending_total - len(shown) == st.pending_blocked
    # oldest first among the shown ones, and no older placeable request is hidden
    assert np.all(np.diff(st.pending.arrival_s) >= 0)


def test_europe_cut_from_start_completes_every_request_with_a_live_path() -> None:
    env = _europe_cut()
    _, info = env.reset(seed=0)
    europe = env.layout.region_names.index("europe")
    blocked_seen = 0
    done = False
    while not done:
        _check_offer(env)
        _, _, _, done, info = env.step(_first_allowed(env, info["action_mask"]))
        blocked_seen = max(blocked_seen, info["blocked"])
    em = info["episode_metrics"]
    assert em["ledger"]["ok"]
    left = env.pending_requests(include_overflow=True)["origin"]
    # before: 51 of 720 completed (the Europe requests at the head hid everything behind them)
    assert em["arrived"] == 720 and em["completed"] == 720 - len(left) and len(left) > 200
    assert np.all(left == europe)  # only requests without a live path are left
    assert em["unplaced_at_end"] == len(left) and em["in_flight_at_truncation"] == 0
    assert blocked_seen > 64 and em["blocked"] > 0  # more blocked than K at once: the old starvation
    assert em["blocked_at_end"] == len(left)  # the link never comes back


def test_blocked_requests_are_offered_again_when_their_link_returns() -> None:
    env = _europe_cut(k=64, end_s=20.0)
    _, info = env.reset(seed=1)
    europe = env.layout.region_names.index("europe")
    for _ in range(18):  # decisions at t = 2 .. 19 s
        _, _, _, _, info = env.step(_first_allowed(env, info["action_mask"]))
        _check_offer(env)
        assert not np.any(env.state().pending.origin == europe)
    assert info["blocked"] > 0 and env.state().pending_blocked == info["blocked"]
    _, _, _, _, info = env.step(_first_allowed(env, info["action_mask"]))  # now t = 20 s: link back
    st = env.state()
    assert info["blocked"] == 0 and np.any(st.pending.origin == europe)
    # the oldest requests come first again (the blocked Europe ones were waiting longest)
    assert st.pending.origin[0] == europe


def test_all_datacenters_down_blocks_everything_and_loses_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = GeoServeEnv("dev", overrides={"duration_s": 6.0})
    _, info = env.reset(seed=0)
    for d in range(env.layout.n_datacenters):
        env.set_datacenter_up(d, False)
    st = env.state()
    assert len(st.pending) == 0 and st.pending_blocked == st.pending_total > 0
    D = env.layout.n_datacenters
    _, _, _, _, info = env.step(np.full(env.layout.max_pending, D))
    assert info["placed"] == 0 and info["blocked"] == info["pending"] and info["overflow"] == 0
    env.set_datacenter_up(0, True)
    st = env.state()
    assert st.pending_blocked == 0 and len(st.pending) == min(st.pending_total, env.layout.max_pending)
    done = False
    while not done:
        _, _, _, done, info = env.step(_first_allowed(env, info_mask(env)))
    em = info["episode_metrics"]
    assert em["ledger"]["ok"] and em["unplaced_at_end"] == 0 and em["blocked"] > 0 and em["blocked_at_end"] == 0


def info_mask(env: GeoServeEnv) -> np.ndarray:
    return env.action_masks().reshape(env.layout.max_pending, -1)


@pytest.mark.parametrize("policy_seed", [0, 1])
def test_blocking_is_deterministic(policy_seed: int) -> None:
    runs = []
    for _ in range(2):
        env = _europe_cut(end_s=30.0)
        _, info = env.reset(seed=policy_seed)
        done = False
        trace = []
        while not done:
            _, r, _, done, info = env.step(_first_allowed(env, info["action_mask"]))
            trace.append((r, info["blocked"], info["placed"]))
        runs.append((trace, info["episode_metrics"]["carbon_g"]))
    assert runs[0] == runs[1]
