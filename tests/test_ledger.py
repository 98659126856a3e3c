"""The end-of-episode ledger: request counts and energy / carbon identities, strict and not."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import LedgerError
from carbon_gym.faults import FaultRuntime, scenario_faults
from carbon_gym.ledger import check_ledger
from carbon_gym.policy import RoundRobinPolicy, rollout
from carbon_gym.scenario import load_scenario
from carbon_gym.world import build_world


def test_ledger_of_a_plain_episode_adds_up():
    m = rollout(GeoServeEnv("dev", overrides={"duration_s": 20.0}), RoundRobinPolicy(), seed=0)
    led = m["ledger"]
    assert led["ok"] and led["arrived"] == led["completed"] == m["completed"] > 100
    assert led["failed_over"] == led["failed_over_completed"] == 0 and led["wasted_energy_j"] == 0.0
    assert led["energy_j"] == pytest.approx(m["energy_kwh"] * 3.6e6, rel=1e-12)
    # facility energy = idle + host + active (each at facility level)
    assert led["idle_energy_j"] + led["host_energy_j"] + led["active_energy_j"] == pytest.approx(led["energy_j"], rel=1e-9)
    # everything active was split over completed requests (no request left in flight)
    assert led["attributed_energy_j"] == pytest.approx(led["active_energy_j"], rel=1e-9)
    assert 0 < led["active_carbon_g"] < led["carbon_g"]
    assert led["attributed_carbon_g"] == pytest.approx(led["active_carbon_g"], rel=1e-9)


def test_ledger_counts_in_flight_and_unplaced_at_truncation():
    env = GeoServeEnv("dev", overrides={"duration_s": 10.0, "workload.rate_per_s": 40.0, "env.max_pending": 128},
                      drain_limit_s=0.0)
    obs, info = env.reset(seed=0)
    D = env.layout.n_datacenters
    while True:
        last = env.simulator.now_s >= 9.0
        a = np.where(info["action_mask"][:, 0], 0, D)
        if last:
            a[::2] = D  # leave half of the last step's requests unplaced
        obs, r, term, trunc, info = env.step(a)
        if trunc:
            break
    led = info["episode_metrics"]["ledger"]
    assert led["ok"] and led["in_flight_at_truncation"] > 0 and led["unplaced_at_end"] > 0
    assert led["arrived"] == led["completed"] + led["in_flight_at_truncation"] + led["unplaced_at_end"]
    assert led["in_flight_energy_j"] > 0
    # what is in flight has shares not (yet) in the attributed total
    assert led["attributed_energy_j"] < led["active_energy_j"]


def test_ledger_after_outages_counts_wasted_work_exactly():
    env = GeoServeEnv("dev-fault-region")
    m = rollout(env, RoundRobinPolicy(), seed=0)
    led = m["ledger"]
    assert led["ok"] and led["failed_over"] > 0 and led["failed_over_completed"] == led["failed_over"]
    assert led["wasted_energy_j"] > 0 and led["wasted_carbon_g"] > 0
    assert led["placed"] == led["completed"] + led["failed_over"] + led["in_flight_at_truncation"]


def test_mid_episode_ledger_holds_at_every_step_fast_and_step_mode():
    for step_mode in (False, True):
        sc = load_scenario("dev-fault", overrides={"duration_s": 30.0, "workload.rate_per_s": 30.0})
        sim, wl = build_world(sc, 0, step_mode=step_mode)
        rt = FaultRuntime(scenario_faults(sc), sim)
        D = sim.n_datacenters
        done_e, done_c, fo_e, fo_c = (np.zeros(D) for _ in range(4))
        placed = completed = failed = 0
        for k in range(1, 40):
            t = k * 0.75
            b = wl.arrivals_between(min((k - 1) * 0.75, 30.0), min(t, 30.0))
            for ab in rt.advance(t):
                failed += len(ab)
                fo_e += np.bincount(ab.datacenter, weights=ab.energy_j, minlength=D)
                fo_c += np.bincount(ab.datacenter, weights=ab.carbon_g, minlength=D)
            up = np.flatnonzero(rt.accepting())
            sim.submit_batch(b.origin, b.arrival_s, b.prompt_tokens, b.output_tokens, up[np.arange(len(b)) % up.size])
            placed += len(b)
            r = sim.pop_completed()
            completed += len(r)
            done_e += np.bincount(r.datacenter, weights=r.energy_j, minlength=D)
            done_c += np.bincount(r.datacenter, weights=r.carbon_g, minlength=D)
            tot = sim.totals()
            led = check_ledger(
                arrived=placed, placed=placed, completed=completed, failed_over=failed, failed_over_completed=0,
                in_flight=placed - completed - failed, unplaced=failed, totals=tot, attribution=sim.energy_attribution(),
                completed_energy_j=done_e, completed_carbon_g=done_c, failed_over_energy_j=fo_e,
                failed_over_carbon_g=fo_c, reported_energy_j=float(tot.facility_energy_j.sum()),
                reported_carbon_g=float(tot.carbon_g.sum()), pue=np.array([d.pue for d in sim.datacenters]),
                strict=True, rtol=1e-9,
            )
            assert led["ok"]
        assert failed > 0


def _inputs(env):
    sim = env.simulator
    t = env._tally
    return dict(
        arrived=t.arrived, placed=t.placed, completed=t.completed, failed_over=t.aborted,
        failed_over_completed=t.failed_over_completed, in_flight=t.in_flight,
        unplaced=len(env._pending), totals=sim.totals(), attribution=sim.energy_attribution(),
        completed_energy_j=t.done_energy_j.copy(), completed_carbon_g=t.done_carbon_g.copy(),
        failed_over_energy_j=t.fo_energy_j.copy(), failed_over_carbon_g=t.fo_carbon_g.copy(),
        reported_energy_j=t.reported_energy_j, reported_carbon_g=t.reported_carbon_g,
        pue=np.array([d.pue for d in sim.datacenters]),
    )


def _inputs_after_rr_steps(steps: int = 17) -> dict:
    """The ledger inputs of dev-fault after ``steps`` round-robin steps (mid-episode, outages included)."""
    env = GeoServeEnv("dev-fault", overrides={"duration_s": 25.0})
    obs, info = env.reset(seed=0)
    rr = RoundRobinPolicy()
    for _ in range(steps):
        obs, *_, info = env.step(rr.act(obs, info))
    return _inputs(env)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda k: k.update(completed=k["completed"] - 1), "arrived"),
        (lambda k: k.update(arrived=k["arrived"] + 1), "arrived"),
        (lambda k: k.update(failed_over_completed=k["failed_over"] + 1), "failed-over-and-completed"),
        (lambda k: k.update(completed_energy_j=k["completed_energy_j"] * 1.001), "active energy"),
        (lambda k: k.update(completed_carbon_g=k["completed_carbon_g"] * 0.999), "active carbon"),
        (lambda k: k.update(reported_energy_j=k["reported_energy_j"] - 1.0), "per-step energy"),
        (lambda k: k.update(reported_carbon_g=k["reported_carbon_g"] * 1.01), "per-step carbon"),
        (lambda k: k.update(totals=dataclasses.replace(k["totals"], submitted=k["totals"].submitted + 1)),
         "simulator submitted"),
        (lambda k: k.update(pue=k["pue"] * 1.01), "PUE"),
        (lambda k: k.update(totals=dataclasses.replace(k["totals"], cached_prompt_tokens=k["totals"].prompt_tokens + 1)),
         "prefix-cache"),
    ],
)
def test_a_lost_request_or_joule_raises_in_strict_mode_and_is_reported_otherwise(change, message):
    kw = _inputs_after_rr_steps()
    assert check_ledger(**kw, strict=True)["ok"]
    change(kw)
    with pytest.raises(LedgerError, match=message):
        check_ledger(**kw, strict=True)
    led = check_ledger(**kw, strict=False)
    assert not led["ok"] and message in led["problems"]


def test_active_energy_of_an_idle_datacenter_is_compared_at_the_scale_of_its_gpu_energy():
    # active = (GPU - idle) x PUE: a datacenter that did no work rounds to about -1e-7 J of its
    # megajoules (seen with capacity control on qwen7b-moderate), which is no lost joule; 1 J is
    kw = _inputs_after_rr_steps()
    a = kw["attribution"]
    d0 = np.zeros_like(np.asarray(a.active_energy_j))
    d0[0] = 1.0

    def idle_dc0(active_j, active_g):  # datacenter 0 with no work: every part 0, its active figure given
        kw2 = dict(kw)
        kw2["completed_energy_j"] = kw["completed_energy_j"] * (1 - d0)
        kw2["completed_carbon_g"] = kw["completed_carbon_g"] * (1 - d0)
        kw2["failed_over_energy_j"] = kw["failed_over_energy_j"] * (1 - d0)
        kw2["failed_over_carbon_g"] = kw["failed_over_carbon_g"] * (1 - d0)
        kw2["attribution"] = dataclasses.replace(
            a, **{f: np.asarray(getattr(a, f)) * (1 - d0) for f in (
                "in_flight_share_j", "in_progress_j", "aborted_partial_j", "in_flight_share_carbon_g",
                "in_progress_carbon_g", "aborted_partial_carbon_g")},
            active_energy_j=np.asarray(a.active_energy_j) * (1 - d0) + d0 * active_j,
            active_carbon_g=np.asarray(a.active_carbon_g) * (1 - d0) + d0 * active_g)
        return check_ledger(**kw2, strict=False)

    assert float(np.asarray(kw["totals"].gpu_energy_j)[0]) > 1e4  # (J: the scale of the rounding)
    assert idle_dc0(0.0, 0.0)["ok"]
    assert idle_dc0(-1.6749043425079437e-07, -2e-11)["ok"], idle_dc0(-1.6749043425079437e-07, -2e-11)["problems"]
    led = idle_dc0(1.0, 0.0)
    assert not led["ok"] and "active energy" in led["problems"]


def test_env_strict_ledger_raises_and_lenient_env_warns():
    for strict in (True, False):
        env = GeoServeEnv("dev", overrides={"duration_s": 5.0}, strict_ledger=strict)
        obs, info = env.reset(seed=0)
        rr = RoundRobinPolicy()
        for _ in range(3):
            obs, *_, info = env.step(rr.act(obs, info))
        env._tally.done_energy_j[0] += 5.0  # a joule goes missing
        a = rr.act(obs, info)
        env.step(a)
        if strict:
            with pytest.raises(LedgerError, match="datacenter 0: active energy"):
                env.step(rr.act(obs, info))
        else:
            with pytest.warns(RuntimeWarning, match="ledger check failed"):
                obs, r, term, trunc, info = env.step(rr.act(obs, info))
            assert trunc and not info["episode_metrics"]["ledger"]["ok"]


def test_ledger_passes_through_vector_envs():
    envs = gym.vector.SyncVectorEnv([lambda: GeoServeEnv("dev-fault", overrides={"duration_s": 16.0})] * 2)
    obs, info = envs.reset(seed=0)
    D = 4
    for _ in range(16):
        obs, r, term, trunc, info = envs.step(np.full((2, envs.single_action_space.shape[0]), D))
    assert trunc.all()
    led = info["episode_metrics"]["ledger"]
    assert led["ok"].all() and (led["arrived"] == led["unplaced_at_end"]).all()
