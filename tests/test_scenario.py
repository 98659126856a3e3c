"""Scenario files: schema validation, overrides, shipped scenarios, load levels, world wiring (issue 3)."""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings

import numpy as np
import pytest

from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import CarbonGymError, ConfigError, DataError
from carbon_gym.policy import RoundRobinPolicy, rollout
from carbon_gym.scenario import (
    DEFAULT_REGIONS,
    MLPERF_SLO,
    list_scenarios,
    load_load_levels,
    load_scenario,
    parse_override,
    parse_overrides,
)
from carbon_gym.sim import register_dispatcher
from carbon_gym.sim.dispatch import _DISPATCHERS
from carbon_gym.world import build_carbon, build_forecaster, build_network, build_predictor, build_topology, build_workload

STUDY = [f"{m}-{lvl}" for m in ("llama8b", "qwen7b", "mixtral8x7b") for lvl in ("low", "moderate", "high")]

MINIMAL = """
name = "mine"
model = "llama-3.1-8b"
duration_s = 30.0

[topology]
preset = "default"
only_regions = ["europe"]
datacenters_per_region = 2
nodes_per_datacenter = 1

[workload]
rate_per_s = 4.0
"""


def load(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PROVISIONAL load-level warning
        return load_scenario(**kw) if "name_or_path" in kw else None


def scen(name, overrides=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_scenario(name, overrides=overrides)


def write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ----------------------------------------------------------------------------- shipped


def test_every_shipped_scenario_loads_and_is_named_after_its_file():
    names = list_scenarios()
    assert "dev" in names and set(STUDY) <= set(names)
    for n in names:
        s = scen(n)
        assert s.name == n and s.source.endswith(f"{n}.toml")
        assert s.rate_per_s > 0 and s.duration_s > 0 and s.polling_period_s == 1.0
        assert s.slo.ttft_s == MLPERF_SLO[s.model][0] and s.slo.tpot_s == MLPERF_SLO[s.model][1]


def test_study_matrix_topology_and_tp():
    for n in STUDY:
        s = scen(n)
        topo = s.topology_spec()
        assert topo.n_regions == 4 and topo.n_datacenters == 16
        assert sum(d.gpus for d in topo.datacenters) == 512
        assert s.tp == (4 if n.startswith("mixtral") else 1)
        assert s.n_engines() == 512 // s.tp


def test_load_levels_scale_with_measured_capacity():
    levels = load_load_levels()
    assert levels.fractions["low"] < levels.fractions["moderate"] < levels.fractions["high"] <= 1.0
    for short, model in (("llama8b", "llama-3.1-8b"), ("qwen7b", "qwen2.5-7b"), ("mixtral8x7b", "mixtral-8x7b")):
        for lvl in ("low", "moderate", "high"):
            s = scen(f"{short}-{lvl}")
            expected = levels.fractions[lvl] * levels.capacity(model, "a100-80gb", s.tp).level_rate_per_s(levels.basis) * s.n_engines()
            assert s.rate_per_s == pytest.approx(expected)
            assert f"{model}/a100-80gb/tp{s.tp}" in s.rate_source
            assert s.workload.load == lvl and s.workload.rate_per_s is None


def test_load_levels_come_from_the_capacity_of_that_model_gpu_and_tp():
    """A load level needs the capacity measured for the scenario's (model, GPU, TP): another GPU or
    TP is a named error (never the A100 TP1 rate, nor that rate halved by a larger TP)."""
    base = scen("llama8b-moderate")
    assert "llama-3.1-8b/a100-80gb/tp1" in base.rate_source and "x 512 engines" in base.rate_source
    from carbon_gym.scenario import load_load_levels

    h100 = scen("llama8b-moderate", {"gpu": "h100-80gb"})
    cap = load_load_levels().capacity("llama-3.1-8b", "h100-80gb", 1).level_rate_per_s("cluster")
    assert h100.rate_per_s == pytest.approx(0.6 * cap * 512) and h100.rate_per_s != base.rate_per_s
    assert "llama-3.1-8b/h100-80gb/tp1" in h100.rate_source
    for ov, key in (({"gpu": "h100-80gb", "model": "qwen2.5-7b"}, "qwen2.5-7b/h100-80gb/tp1"),
                    ({"engine.tp": 2}, "llama-3.1-8b/a100-80gb/tp2")):
        with pytest.raises(ConfigError, match="workload.load") as e:
            scen("llama8b-moderate", ov)
        assert key in str(e.value) and "llama-3.1-8b/a100-80gb/tp1" in str(e.value)  # names the measured ones
    s = scen("llama8b-moderate", {"engine.tp": 2, "workload.load": None, "workload.rate_per_s": 100.0})
    assert s.rate_per_s == 100.0 and s.rate_source == "workload.rate_per_s"


def test_a_registered_dispatcher_is_accepted_by_the_scenario_schema():
    with pytest.raises(ConfigError, match="engine.dispatcher") as e:
        scen("dev", {"engine.dispatcher": "fewest_running"})
    assert "least_work" in str(e.value)
    register_dispatcher("fewest_running", lambda engine: len(engine.running))
    try:
        s = scen("dev", {"engine.dispatcher": "fewest_running", "duration_s": 5.0})
        assert s.engine.dispatcher == "fewest_running"
        m = rollout(GeoServeEnv(s), RoundRobinPolicy(), seed=0)
        assert m["completed"] > 0 and m["ledger"]["ok"]
    finally:
        _DISPATCHERS.pop("fewest_running", None)


def test_dev_scenario_is_tiny():
    s = scen("dev")
    topo = s.topology_spec()
    assert topo.regions == ("europe",) and [d.zone for d in topo.datacenters] == ["DE", "FR"]
    assert all(d.nodes == 1 for d in topo.datacenters) and s.n_engines() == 16
    assert s.duration_s <= 60 and s.rate_per_s <= 10


# ----------------------------------------------------------------------------- overrides


def test_overrides_by_dotted_key():
    s = scen("llama8b-moderate", {"workload.rate_per_s": 50, "duration_s": 600, "carbon.kind": "direct", "engine.chunked_prefill": False})
    assert s.rate_per_s == 50.0 and s.workload.load is None  # the rate override replaces the load level
    assert s.duration_s == 600.0 and s.carbon.kind == "direct" and s.engine.chunked_prefill is False
    s2 = scen("dev", {"workload.load": "high"})
    assert s2.workload.rate_per_s is None and s2.rate_per_s == pytest.approx(load_load_levels().fractions["high"] * load_load_levels().capacity("llama-3.1-8b", "a100-80gb", 1).level_rate_per_s("cluster") * 16)
    s3 = scen("dev", {"topology.datacenters.1.zone": "NO"})
    assert [d.zone for d in s3.topology_spec().datacenters] == ["DE", "NO"]
    with pytest.raises(ConfigError) as exc:
        scen("dev", {"workload.rate_per_sec": 5})
    assert exc.value.field == "workload.rate_per_sec" and "did you mean 'rate_per_s'" in str(exc.value)
    with pytest.raises(ConfigError, match="duration_s"):
        scen("dev", {"duration_s": "ten"})


def test_parse_override_strings_for_the_cli():
    assert parse_override("workload.rate_per_s=50") == ("workload.rate_per_s", 50)
    assert parse_override("carbon.kind=direct") == ("carbon.kind", "direct")
    assert parse_override('carbon.start_utc="2023-01-01T00:00:00Z"') == ("carbon.start_utc", "2023-01-01T00:00:00Z")
    assert parse_override("engine.chunked_prefill=false") == ("engine.chunked_prefill", False)
    assert parse_override("workload.region_shares=[0.5, 0.5]") == ("workload.region_shares", [0.5, 0.5])
    assert parse_overrides(["a=1", "b=2.5"]) == {"a": 1, "b": 2.5}
    with pytest.raises(ConfigError):
        parse_override("novalue")


def test_round_trip_through_toml(tmp_path):
    for name in ("dev", "llama8b-moderate", "mixtral8x7b-high"):
        s = scen(name)
        p = write(tmp_path, s.to_toml(), f"{name}.toml")
        s2 = scen(str(p))
        assert dataclasses.replace(s2, source="") == dataclasses.replace(s, source="")


# ----------------------------------------------------------------------------- user files


def test_minimal_user_file_gets_defaults(tmp_path):
    s = scen(str(write(tmp_path, MINIMAL)))
    assert s.name == "mine" and s.tp == 1 and s.slo.ttft_s == 2.0 and s.slo.tpot_s == 0.1
    assert [d.zone for d in s.topology_spec().datacenters] == ["DE", "GB"]
    assert s.engine.max_num_seqs == 256 and s.env.predictor == "binned" and s.faults == ()
    assert s.carbon.file == "packaged" and s.polling_period_s == 1.0


def test_custom_topology_with_explicit_pue_and_rtts(tmp_path):
    text = """
name = "custom"
model = "mixtral-8x7b"
[topology]
preset = "custom"
nodes_per_datacenter = 2
[[topology.regions]]
name = "africa"
client_zone = "ZA"
utc_offset_h = 2
rtt_ms = [5.0, 180.0]
[[topology.datacenters]]
name = "joburg"
region = "africa"
zone = "ZA"
pue = 1.3
[[topology.datacenters]]
name = "paris"
region = "africa"
zone = "FR"
nodes = 1
[workload]
rate_per_s = 3.0
"""
    s = scen(str(write(tmp_path, text)))
    topo = build_topology(s)
    assert [(d.zone, d.pue, d.nodes) for d in topo.datacenters] == [("ZA", 1.3, 2), ("FR", 1.08, 1)]
    assert s.n_engines() == (16 + 8) // 4
    np.testing.assert_allclose(build_network(s).one_way_s, [[0.0025, 0.09]])
    trace, off = build_carbon(s)
    assert trace.zones == ("ZA", "FR") and off == (31 + 28 + 31 + 30 + 31 + 0) * 86400
    # without rtt_ms, ZA has no RTT data: a clear error at build time
    with pytest.raises(ConfigError, match="rtt_ms"):
        build_network(scen(str(write(tmp_path, text.replace("rtt_ms = [5.0, 180.0]\n", ""), "norrt.toml"))))


def test_user_carbon_file_relative_to_scenario(tmp_path):
    (tmp_path / "ci.csv").write_text("datetime_utc,DE,GB\n" + "".join(f"2020-01-01 {h:02d}:00:00,{100 + h},{200 + h}\n" for h in range(24)))
    text = MINIMAL + '\n[carbon]\nfile = "ci.csv"\nstart_utc = "2020-01-01T05:30:00Z"\nforecast_error_std_frac = 0.1\n'
    s = scen(str(write(tmp_path, text)))
    trace, off = build_carbon(s)
    assert trace.start_utc.year == 2020 and off == 5.5 * 3600
    assert trace.intensity(0, off) == 105.0
    f = build_forecaster(s, trace)
    assert f.forecast(off).shape == (24, 2)
    with pytest.raises(ConfigError, match="carbon.start_utc"):
        build_carbon(scen(str(write(tmp_path, text.replace("2020-01-01T05:30", "2021-01-01T05:30"), "late.toml"))))


def test_workload_built_from_scenario_is_deterministic_and_capped():
    s = scen("dev")
    a = build_workload(s).arrivals_between(0.0, 60.0)
    b = build_workload(s).arrivals_between(0.0, 60.0)
    c = build_workload(s, seed=1).arrivals_between(0.0, 60.0)
    assert np.array_equal(a.arrival_s, b.arrival_s) and not np.array_equal(a.arrival_s, c.arrival_s)
    assert abs(len(a) - 8.0 * 60) < 4 * np.sqrt(8.0 * 60)
    assert np.all(a.prompt_tokens + a.output_tokens <= s.workload.max_context_tokens)
    assert np.all(a.origin == 0)
    replay = scen("dev", {"workload.arrival": "replay", "workload.lengths": "trace", "workload.rate_per_s": 11.0})
    r = build_workload(replay).arrivals_between(0.0, 600.0)
    assert abs(len(r) - 11.0 * 600) < 0.1 * 11.0 * 600
    assert build_predictor(s).name == "binned"
    assert build_predictor(scen("dev", {"env.predictor": "oracle"})).name == "oracle"


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "patch, field, needle",
    [
        ('colour = "red"\n', "colour", "unknown field"),
        ('[slo]\nttft_ms = 2000\n', "slo.ttft_ms", "did you mean 'ttft_s'"),
        ('[slo]\ntpot_s = 100\n', "slo.tpot_s", "is it in milliseconds"),
        ('[slo]\nttft_s = "2 s"\n', "slo.ttft_s", "write a plain number"),
        ('[engine]\ntp = 3\n', "engine.tp", "does not divide"),
        ('[engine]\nmax_num_seqs = 2.5\n', "engine.max_num_seqs", "expected an integer"),
        ('[engine]\nchunked_prefill = "yes"\n', "engine.chunked_prefill", "expected true or false"),
        ('[carbon]\nkind = "scope2"\n', "carbon.kind", "allowed: lca, direct"),
        ('[carbon]\nstart_utc = "2031-01-01T00:00:00Z"\n', "carbon.start_utc", "outside the carbon trace"),
        ('[carbon]\nstart_utc = "midsummer"\n', "carbon.start_utc", "ISO-8601"),
        ('[carbon]\nfile = "missing.csv"\n', "carbon.file", "file not found"),
        ('[env]\npredictor = "gpt"\n', "env.predictor", "allowed: oracle, binned"),
        ('[env]\nmax_pending = 0\n', "env.max_pending", "out of range"),
        ('polling_period_s = -1.0\n', "polling_period_s", "out of range"),
    ],
)
def test_bad_fields_are_named_with_the_file(tmp_path, patch, field, needle):
    # top-level keys must precede tables in TOML: put the patch first, then the minimal file
    text = patch + MINIMAL if not patch.startswith("[") else MINIMAL + "\n" + patch
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        scen(str(p))
    msg = str(exc.value)
    assert exc.value.field == field, msg
    assert needle in msg, msg
    assert str(p) in msg, msg


def test_cross_field_errors(tmp_path):
    cases = [
        (MINIMAL.replace("rate_per_s = 4.0", 'rate_per_s = 4.0\nload = "low"'), "workload.rate_per_s", "not both"),
        (MINIMAL.replace("rate_per_s = 4.0", "rate_per_s = 4.0\nregion_shares = [0.5, 0.5]"), "workload.region_shares", "one share per region"),
        (MINIMAL.replace("rate_per_s = 4.0", 'rate_per_s = 4.0\nlengths = "trace"'), "workload.lengths", "replay"),
        (MINIMAL.replace("rate_per_s = 4.0", "rate_per_s = 4.0\nmax_context_tokens = 100000"), "workload.max_context_tokens", "max_model_len"),
        (MINIMAL.replace("rate_per_s = 4.0", 'rate_per_s = 4.0\nlengths = "imdb"'), "workload.lengths", "unknown dataset"),
        (MINIMAL.replace("rate_per_s = 4.0", ""), "workload.rate_per_s", "set workload.rate_per_s or workload.load"),
        (MINIMAL.replace('model = "llama-3.1-8b"', 'model = "gpt-5"'), "model", "unknown model"),
        (MINIMAL.replace('only_regions = ["europe"]', 'only_regions = ["mars"]'), "topology.only_regions[0]", "unknown value"),
        (MINIMAL.replace('preset = "default"', 'preset = "custom"'), "topology.only_regions", "only with"),
        (MINIMAL.replace("duration_s = 30.0", "duration_s = 30.0\npolling_period_s = 60.0"), "polling_period_s", "longer than"),
    ]
    for i, (text, field, needle) in enumerate(cases):
        p = write(tmp_path, text, f"c{i}.toml")
        with pytest.raises(ConfigError) as exc:
            scen(str(p))
        assert exc.value.field == field, (field, str(exc.value))
        assert needle in str(exc.value), str(exc.value)
        assert f"c{i}.toml" in str(exc.value)


def test_unknown_scenario_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_scenario("llama8b-extreme")
    assert "llama8b-moderate" in str(exc.value)  # lists the shipped ones
    with pytest.raises(DataError, match="invalid TOML"):
        load_scenario(str(write(tmp_path, "name = [", "broken.toml")))
    with pytest.raises(DataError, match="not found"):
        load_scenario(str(tmp_path / "absent.toml"))
    assert issubclass(ConfigError, CarbonGymError)


def test_default_regions_cover_the_sixteen_zones():
    zones = [z for zs in DEFAULT_REGIONS.values() for z in zs]
    assert len(zones) == 16 and len(set(zones)) == 16


# ----------------------------------------------------------------------------- world


@pytest.mark.skipif(importlib.util.find_spec("carbon_gym.sim.simulator") is None, reason="simulator not written yet")
def test_build_world_dev_runs():
    from carbon_gym.world import build_world

    s = scen("dev", {"duration_s": 10.0})
    sim, workload = build_world(s, seed=0)
    n = 0
    for t in range(10):  # poll once per second: requests wait for the scheduler's next decision
        batch = workload.arrivals_between(float(t), float(t + 1))
        sim.advance_to(float(t + 1))
        sim.submit_batch(batch.origin, batch.arrival_s, batch.prompt_tokens, batch.output_tokens, np.arange(len(batch)) % 2)
        n += len(batch)
    sim.advance_to(300.0)
    assert n > 40 and sim.totals().submitted == n and sim.totals().completed == n
    assert len(sim.pop_completed()) == n


def test_shipped_scenarios_show_a_whole_polling_period_of_arrivals():
    for n in list_scenarios():
        s = scen(n)
        per_step = s.rate_per_s * (1 + s.workload.diurnal_amplitude) * s.polling_period_s
        assert s.env.max_pending >= 1.25 * per_step + 4 * np.sqrt(per_step) + 16, n


def test_readme_annotated_example_loads(tmp_path):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "carbon_gym" / "scenarios" / "README.md").read_text()
    block = re.search(r"## Annotated example\s+```toml\n(.*?)```", readme, re.S).group(1)
    s = scen(str(write(tmp_path, block, "example.toml")))
    assert s.name == "my-study" and s.workload.arrival == "gamma" and s.workload.region_shares == (0.6, 0.4)
    assert [r.name for r in s.regions()] == ["north_america", "europe"]
    assert s.n_engines() == 2 * 4 * 2 * 8
    w = build_workload(s).arrivals_between(0.0, 10.0)
    assert len(w) > 0 and np.all(w.prompt_tokens + w.output_tokens <= 8192)


def test_a_shipped_name_is_not_taken_for_a_file_or_directory_of_that_name(tmp_path, monkeypatch):
    from pathlib import Path

    from carbon_gym.scenario import SCENARIO_DIR, scenario_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "dev").mkdir()  # as in "/" (where /dev exists) or a project with a dev/ folder
    assert scenario_path("dev") == SCENARIO_DIR / "dev.toml"
    assert load_scenario("dev").name == "dev"
    # a TOML file without the suffix, not a shipped name: read as a path
    (tmp_path / "mine").write_text((SCENARIO_DIR / "dev.toml").read_text().replace('name = "dev"', 'name = "mine"'))
    assert scenario_path("mine") == Path("mine") and load_scenario("mine").name == "mine"
    with pytest.raises(ConfigError, match="unknown scenario 'nope'"):
        scenario_path("nope")
    with pytest.raises(DataError):
        scenario_path("dev/x.toml")  # a path: a missing file is reported as such
