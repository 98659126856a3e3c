"""Heterogeneous topologies in the schedulers and evaluation tools (issue 20, item 3): every
per-datacenter figure the solvers' env adapter, the planner's capacity, the facility MILP's
capacity stage, the clairvoyant heuristic and the carbon lower bound use is that of the
datacenter's own GPU (one H100 datacenter among A100 ones), and the bound stays below every
policy's carbon on a short heterogeneous run."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.physics.latency import load_latency_model
from carbon_gym.physics.power import load_power_model, load_power_states
from carbon_gym.scenario import load_load_levels, load_scenario
from carbon_gym.specs import load_gpu_spec, load_model_spec

MODEL = "llama-3.1-8b"
GPUS = ("a100-80gb", "h100-80gb", "a100-80gb")  # de, fr, gb

HETERO = """
name = "hetero3"
model = "llama-3.1-8b"
gpu = "a100-80gb"
duration_s = 10.0
polling_period_s = 1.0

[topology]
preset = "custom"
nodes_per_datacenter = 1

[[topology.regions]]
name = "europe"
client_zone = "DE"

[[topology.datacenters]]
name = "de"
region = "europe"
zone = "DE"

[[topology.datacenters]]
name = "fr"
region = "europe"
zone = "FR"
gpu = "h100-80gb"

[[topology.datacenters]]
name = "gb"
region = "europe"
zone = "GB"

[workload]
arrival = "poisson"
rate_per_s = 12.0
lengths = "azure-conv"
max_context_tokens = 8192

[carbon]
kind = "lca"
start_utc = "2023-06-15T12:00:00Z"
"""


@pytest.fixture()
def hetero_path(tmp_path: Path) -> Path:
    p = tmp_path / "hetero3.toml"
    p.write_text(HETERO)
    return p


def _env(path: Path, **over: object) -> GeoServeEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GeoServeEnv(load_scenario(str(path), dict(over)))


def _kv_tokens(gpu: str) -> float:
    g, m = load_gpu_spec(gpu), load_model_spec(MODEL)
    return 16.0 * math.floor((g.memory_bytes * 0.9 - m.weight_bytes) / (16 * m.kv_bytes_per_token))


def _lone_decode_s(gpu: str) -> float:
    return float(load_latency_model(gpu, MODEL, 1).iteration_time_s(0, 0.0, 1, 1000.0, 1))


def test_env_adapter_uses_each_datacenters_gpu(hetero_path: Path) -> None:
    from solvers.envadapter import EnvFacts, problem_from_state

    env = _env(hetero_path)
    env.reset(seed=0)
    facts = EnvFacts(env)
    assert facts.gpus == list(GPUS)
    lat = {g: load_latency_model(g, MODEL, 1) for g in set(GPUS)}
    pw = {g: load_power_model(g) for g in set(GPUS)}
    np.testing.assert_array_equal(facts.tpot_idle_s, [_lone_decode_s(g) for g in GPUS])
    slope = [float(lat[g].iteration_time_s(0, 0.0, 33, 33000.0, 33) - lat[g].iteration_time_s(0, 0.0, 32, 32000.0, 32)) for g in GPUS]
    np.testing.assert_allclose(facts.raw_slope_s_per_seq, slope, rtol=1e-12)
    assert facts.tpot_idle_s[1] < 0.8 * facts.tpot_idle_s[0]  # (the H100 decodes faster)
    for _ in range(3):  # some load, so the problem has requests
        env.step(np.zeros(env.layout.max_pending, dtype=np.int64))
    p = problem_from_state(env.state(), facts)
    assert p.n_requests > 0
    for field, attr in (("gpu_idle_w", "idle_w"), ("gpu_prefill_w", "prefill_w"), ("decode_min_w", "decode_min_w"),
                        ("decode_max_w", "decode_max_w"), ("decode_sat_seqs", "decode_sat_seqs")):
        np.testing.assert_array_equal(getattr(p, field), [getattr(pw[g], attr) for g in GPUS])
    assert p.gpu_idle_w[1] != p.gpu_idle_w[0]
    # the per-request ILPs' energy: each datacenter's own power model (a request served alone)
    r = 0
    want = [p.tp * ((pw[g].prefill_w - pw[g].idle_w) * p.prompt_tokens[r] * p.prefill_s_per_token[d]
                    + (float(pw[g].gpu_power_w(0, 1)) - pw[g].idle_w) * p.output_tokens[r] * _lone_decode_s(g))
            for d, g in enumerate(GPUS)]
    np.testing.assert_allclose(p.lone_energy_j()[r], want, rtol=1e-12)
    # the KV capacity the problem sees is each datacenter's own (8 engines of its GPU, idle but for de)
    assert p.free_kv_tokens[1] == 8 * _kv_tokens("h100-80gb") and p.free_kv_tokens[2] == 8 * _kv_tokens("a100-80gb")


def test_homogeneous_adapter_keeps_float_power_fields() -> None:
    from solvers.envadapter import EnvFacts

    env = GeoServeEnv("dev", {"duration_s": 5.0})
    env.reset(seed=0)
    facts = EnvFacts(env)
    pw = load_power_model("a100-80gb")
    assert facts.power_w == {"gpu_idle_w": pw.idle_w, "gpu_prefill_w": pw.prefill_w, "decode_min_w": pw.decode_min_w,
                             "decode_max_w": pw.decode_max_w, "decode_sat_seqs": pw.decode_sat_seqs}
    assert all(type(v) is float for v in facts.power_w.values())


def test_planner_and_capacity_stage_use_each_datacenters_gpu(hetero_path: Path) -> None:
    from solvers.baselines import _per_engine_capacity_rps
    from solvers.envadapter import EnvFacts, problem_from_state
    from solvers.facility_capacity import CapacityFacts, capacity_problem, solve_capacity

    levels = load_load_levels()
    rates = [levels.capacity(MODEL, g, 1).per_engine_rate_per_s for g in GPUS]
    env = _env(hetero_path, **{"capacity.control": "agent"})
    env.reset(seed=0)
    np.testing.assert_array_equal(_per_engine_capacity_rps(env, 4.0), rates)
    assert _per_engine_capacity_rps(GeoServeEnv("dev"), 4.0) == levels.capacity(MODEL, "a100-80gb", 1).per_engine_rate_per_s
    cf = CapacityFacts.from_env(env)
    gb = load_model_spec(MODEL).weight_bytes / 1e9
    for d, g in enumerate(GPUS):
        pw, st = load_power_model(g), load_power_states(g)
        assert (cf.idle_w[d], cf.host_w[d], cf.host_off_w[d]) == (pw.idle_w, pw.host_w, st.host_off_w)
        assert cf.boot_j_per_gpu_server[1][d] == pytest.approx(st.boot_s(gb) * st.boot_gpu_w, rel=1e-12)
        assert cf.wake_j[d] == pytest.approx(st.wake_s(gb, 1) * max(st.transition_w - st.sleep_w, 0.0), rel=1e-12)
    state = env.state()
    p = problem_from_state(state, EnvFacts(env))
    cp = capacity_problem(state, p, cf, np.full(3, 50.0), 0.8, 0.1, 300.0, 1.0)
    np.testing.assert_array_equal(cp.engine_capacity_per_s, rates)
    np.testing.assert_allclose(cp.server_on_w, [load_power_model(g).host_w + 8 * load_power_model(g).idle_w for g in GPUS], rtol=1e-12)
    res = solve_capacity(cp)
    assert res.status.startswith("milp") and res.rate_per_s.sum() == pytest.approx(cp.arrival_per_s, rel=1e-6)
    assert np.all(res.rate_per_s <= 0.8 * np.asarray(rates) * res.awake + 1e-6)  # each at its own GPU's capacity


def test_clairvoyant_uses_each_datacenters_gpu(hetero_path: Path) -> None:
    from eval.clairvoyant import ClairvoyantPolicy

    env = _env(hetero_path)
    env.reset(seed=0)
    pol = ClairvoyantPolicy()
    pol.reset(env)
    mean_p, mean_o = float(pol._prompt.mean()), float(pol._output.mean())
    levels = load_load_levels()
    for d, g in enumerate(GPUS):
        batch = int(max(1, min(256, math.floor(_kv_tokens(g) * 0.9 / (mean_p + mean_o)))))
        lat = load_latency_model(g, MODEL, 1)
        t_iter = float(lat.iteration_time_s(0, 0.0, batch, batch * (mean_p + mean_o / 2.0), batch))
        assert pol.t_decode_per_token_s[d] == pytest.approx(t_iter / batch, rel=1e-12)
        p_tok = max(1, int(round(mean_p)))
        assert pol.t_prefill_per_token_s[d] == pytest.approx(float(lat.prefill_time_s(p_tok, 2048)) / p_tok, rel=1e-12)
        assert pol.engine_rate_per_s[d] == levels.capacity(MODEL, g, 1).per_engine_rate_per_s
    assert pol.t_decode_per_token_s[1] < pol.t_decode_per_token_s[0]


def test_bound_uses_each_datacenters_gpu(hetero_path: Path) -> None:
    from carbon_gym.world import build_parts
    from eval.bound import carbon_lower_bound

    def sc(gpus: tuple[str, str, str]):
        text = HETERO.replace('gpu = "h100-80gb"\n', "")
        for name, g in zip(("de", "fr", "gb"), gpus):
            text = text.replace(f'name = "{name}"\nregion', f'name = "{name}"\ngpu = "{g}"\nregion')
        p = hetero_path.with_name("-".join(gpus) + ".toml")
        p.write_text(text)
        return load_scenario(str(p))

    s = load_scenario(str(hetero_path))
    b = carbon_lower_bound(s, 0)
    assert b.status == "Optimal" and b.active_g > 0
    # the floor by hand, each datacenter at its own GPU's idle and host power
    parts = build_parts(s)
    tr, off = parts.carbon, parts.carbon_offset_s
    t_floor = 10.0
    want = sum(d.pue * (d.gpus * load_power_model(g).idle_w + d.nodes * load_power_model(g).host_w)
               * tr.integral(tr.zone_index(d.zone), off, off + t_floor) for d, g in zip(parts.topology.datacenters, GPUS)) / 3.6e6
    assert b.floor_g == pytest.approx(want, rel=1e-12)
    # the active part: all the work goes to the cleanest grid (FR), which has H100 nodes: the same
    # optimum as with H100 everywhere, not the A100 one
    h100 = carbon_lower_bound(sc(("h100-80gb",) * 3), 0)
    a100 = carbon_lower_bound(sc(("a100-80gb",) * 3), 0)
    assert b.active_g == pytest.approx(h100.active_g, rel=1e-6)
    assert abs(a100.active_g - b.active_g) > 0.05 * b.active_g


@pytest.mark.parametrize("measure", ["episode", "window"])
def test_bound_is_below_every_policy_on_a_heterogeneous_run(hetero_path: Path, measure: str) -> None:
    from eval.bound import bound_for_spec
    from eval.runner import RunSpec, run_one

    over: tuple = (("duration_s", 12.0),)
    if measure == "window":
        over = (("duration_s", 12.0), ("env.measure", "window"), ("env.warmup_s", 4.0))
    carbons = {}
    backlog = 0
    for policy in ("rr", "greedy", "ilp-state", "planner", "milp", "clairvoyant"):
        spec = RunSpec(str(hetero_path), policy, 0, overrides=over)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = run_one(spec, keep_requests=False).metrics
        if measure == "episode":
            assert m["requests_completed"] == m["requests_arrived"] > 100, policy
        else:
            backlog = max(backlog, int(m["backlog_end"]))
        carbons[policy] = m["carbon_g"]
    b = bound_for_spec(RunSpec(str(hetero_path), "rr", 0, overrides=over), backlog_end=backlog)
    assert b.status in ("Optimal", "window") and b.active_g > 0
    assert all(c >= b.carbon_g for c in carbons.values()), (b.carbon_g, carbons)


def test_problem_power_fields_per_datacenter_are_checked() -> None:
    from carbon_gym.errors import ConfigError
    from solvers.problem import synthetic_problem

    p = synthetic_problem(np.random.default_rng(0), 5, n_datacenters=3)
    q = dataclasses.replace(p, gpu_idle_w=[63.0, 75.0, 63.0], decode_min_w=np.array([194.0, 460.0, 194.0]))
    assert q.gpu_idle_w.shape == (3,) and p.gpu_idle_w == 63.0
    # (D,) fields: each datacenter's own figure, the same arithmetic as the floats
    np.testing.assert_array_equal(q.lone_energy_j()[:, 1], dataclasses.replace(p, gpu_idle_w=75.0, decode_min_w=460.0).lone_energy_j()[:, 1])
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(p, gpu_prefill_w=[400.0, 700.0])
    assert e.value.field == "problem.gpu_prefill_w"


def test_packaged_load_levels_are_read_once_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import shutil

    import carbon_gym.load_levels as scen

    src = scen.load_levels_path()
    copy = tmp_path / "load_levels.toml"
    shutil.copy(src, copy)
    monkeypatch.setattr(scen, "load_levels_path", lambda: copy)
    a = scen.load_load_levels()
    assert scen.load_load_levels() is a  # cached
    with pytest.raises(TypeError):
        a.fractions["low"] = 0.5  # type: ignore[index]  # (shared: read-only)
    copy.write_text(copy.read_text().replace("low = 0.3", "low = 0.25"))
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    b = scen.load_load_levels()
    assert b is not a and b.fractions["low"] == 0.25 and a.fractions["low"] == 0.3
    assert scen.load_load_levels(copy) is not scen.load_load_levels(copy)  # a file by path: read every time
