"""GPUs as data (issue 20, item 3): a scenario naming its own GPU spec / latency / power files by
path, and heterogeneous datacenters (nodes of different GPUs in one topology)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from carbon_gym._toml import data_path, load_toml
from carbon_gym.env import GeoServeEnv
from carbon_gym.errors import ConfigError
from carbon_gym.physics.latency import latency_params_path
from carbon_gym.policy import RoundRobinPolicy
from carbon_gym.scenario import load_scenario
from carbon_gym.specs import load_gpu_spec, load_model_spec
from carbon_gym.world import build_parts, build_world

DEV = (Path(__file__).resolve().parent.parent / "carbon_gym" / "scenarios" / "dev.toml").read_text()
SPEC = """[my-a100]
display_name = "my A100 copy"
memory_bytes = 80e9
peak_bf16_flops = 312e12
hbm_bytes_per_s = 2.039e12
tdp_w = 400
gpus_per_node = 8
"""
HOST_EXTRA_W = 100.0


def _gpu_dir(tmp_path: Path) -> Path:
    """Copies of the A100-80GB files as GPU 'my-a100', the power file's host_w raised by 100 W."""
    d = tmp_path / "gpus"
    d.mkdir()
    (d / "my_gpu.toml").write_text(SPEC)
    shutil.copy(latency_params_path("a100-80gb", "llama-3.1-8b", 1), d / "my_latency.toml")
    text = data_path("params", "power", "a100-80gb.toml").read_text()
    host = load_toml(data_path("params", "power", "a100-80gb.toml"))["power"]["host_w"]
    assert f"host_w = {host}\n" in text
    (d / "my_power.toml").write_text(text.replace(f"host_w = {host}\n", f"host_w = {host + HOST_EXTRA_W}\n", 1))
    return d


def _custom_scenario(tmp_path: Path, files: str = "") -> Path:
    files = files or ('[gpu_files.my-a100]\nspec = "gpus/my_gpu.toml"\nlatency = "gpus/my_latency.toml"\n'
                      'power = "gpus/my_power.toml"\n')
    text = DEV.replace('gpu = "a100-80gb"', 'gpu = "my-a100"').replace('duration_s = 60.0', 'duration_s = 10.0')
    p = tmp_path / "mine.toml"
    p.write_text(text.replace("[topology]", files + "\n[topology]", 1))
    return p


def _rr_metrics(scenario) -> dict:
    env = GeoServeEnv(scenario)
    policy = RoundRobinPolicy()
    obs, info = env.reset(seed=0)
    while True:
        obs, _, _, trunc, info = env.step(policy.act(obs, info))
        if trunc:
            return info["episode_metrics"]


def test_scenario_gpu_files_resolved_relative_and_episode_energy_moves(tmp_path: Path) -> None:
    _gpu_dir(tmp_path)
    s = load_scenario(str(_custom_scenario(tmp_path)))
    assert s.gpu == "my-a100"
    assert s.gpu_file("my-a100", "power") == str(tmp_path / "gpus" / "my_power.toml")
    parts = build_parts(s)
    assert parts.gpu.display_name == "my A100 copy" and parts.power.host_w == 1000.0 + HOST_EXTRA_W
    assert parts.power_states is not None  # (the copied [states] table)
    again = load_scenario(_write(tmp_path / "round.toml", s.to_toml()))  # (to_toml keeps the resolved paths)
    assert again.gpu_files == s.gpu_files
    # the same episode on the packaged A100: same timeline, facility energy higher by exactly
    # 100 W per node x PUE x the episode's simulated time
    ref = load_scenario("dev", overrides={"duration_s": 10.0})
    m, m0 = _rr_metrics(s), _rr_metrics(ref)
    assert m["completed"] == m0["completed"] > 20 and m["sim_time_s"] == m0["sim_time_s"]
    pue = np.array([d.pue for d in parts.topology.datacenters])
    want = m0["dc_energy_kwh"] + HOST_EXTRA_W * 1 * pue * m0["sim_time_s"] / 3.6e6  # (1 node per datacenter)
    np.testing.assert_allclose(m["dc_energy_kwh"], want, rtol=1e-9)
    assert m["ttft_p99_s"] == m0["ttft_p99_s"]


def _write(p: Path, text: str) -> str:
    p.write_text(text)
    return str(p)


def test_gpu_files_errors_name_the_field_and_the_file(tmp_path: Path) -> None:
    _gpu_dir(tmp_path)
    p = _custom_scenario(tmp_path, '[gpu_files.my-a100]\nspec = "gpus/my_gpu.toml"\npower = "gpus/nope.toml"\n')
    with pytest.raises(ConfigError) as e:
        load_scenario(str(p))
    assert e.value.field == "gpu_files.my-a100.power" and "nope.toml" in str(e.value) and str(p) in str(e.value)
    p = _custom_scenario(tmp_path, '[gpu_files.my-a100]\nspec = "gpus/my_gpu.toml"\ncolour = "red"\n')
    with pytest.raises(ConfigError) as e:
        load_scenario(str(p))
    assert e.value.field == "gpu_files.my-a100.colour" and e.value.allowed == ["latency", "power", "spec"]
    p = _custom_scenario(tmp_path, '[gpu_files.other]\nspec = "gpus/my_gpu.toml"\n')  # no spec for my-a100
    with pytest.raises(ConfigError) as e:
        load_scenario(str(p))
    assert e.value.field == "gpu" and "a100-80gb" in e.value.allowed
    # a spec but no latency / power file: there is no packaged set for that name
    s = load_scenario(str(_custom_scenario(tmp_path, '[gpu_files.my-a100]\nspec = "gpus/my_gpu.toml"\n')))
    with pytest.raises(ConfigError) as e:
        build_parts(s)
    assert e.value.field == "gpu_files.my-a100.latency" and "a100-80gb__llama-3.1-8b__tp1" in e.value.allowed


HETERO = """
name = "hetero"
model = "llama-3.1-8b"
gpu = "a100-80gb"
duration_s = 10.0

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
nodes = 2

[workload]
rate_per_s = 12.0

[carbon]
start_utc = "2023-06-15T12:00:00Z"
"""


def _kv_blocks(gpu: str) -> int:
    g, m = load_gpu_spec(gpu), load_model_spec("llama-3.1-8b")
    return int(math.floor((g.memory_bytes * 0.9 - m.weight_bytes) / (16 * m.kv_bytes_per_token)))


def test_heterogeneous_datacenters_use_their_own_gpu(tmp_path: Path) -> None:
    s = load_scenario(_write(tmp_path / "hetero.toml", HETERO))
    assert s.datacenter_gpus() == ("a100-80gb", "h100-80gb") and s.n_engines() == 8 + 16
    sim, _ = build_world(s, 0)
    snap = sim.snapshot()
    pw = {g: load_toml(data_path("params", "power", f"{g}.toml"))["power"] for g in ("a100-80gb", "h100-80gb")}
    pue = np.array([d.pue for d in s.topology_spec().datacenters])
    idle = np.array([(8 * pw["a100-80gb"]["idle_w"] + pw["a100-80gb"]["host_w"]),
                     (16 * pw["h100-80gb"]["idle_w"] + 2 * pw["h100-80gb"]["host_w"])]) * pue
    np.testing.assert_allclose(snap.power_w, idle, rtol=1e-12)
    assert list(snap.total_kv_blocks) == [8 * _kv_blocks("a100-80gb"), 16 * _kv_blocks("h100-80gb")]
    assert _kv_blocks("a100-80gb") == _kv_blocks("h100-80gb")  # (same 80 GB: the iteration times differ)
    # the H100 datacenter's engines run the H100 latency set: one engine's prefill is faster there
    t = [dc.models.iteration_time_s(2048, 2048 * 2049 / 2.0, 0, 0.0, 1) for dc in sim.datacenters]
    assert t[1] < 0.6 * t[0]
    env = GeoServeEnv(s)
    env.reset(seed=0)
    L = env.layout
    np.testing.assert_allclose(L.nameplate_w, np.array([8 * 400.0, 16 * 700.0]) * pue)
    assert list(L.engine_kv_blocks) == [_kv_blocks("a100-80gb"), _kv_blocks("h100-80gb")]
    m = _rr_metrics(s)
    assert m["completed"] == m["arrived"] > 50


def test_heterogeneous_capacity_control_and_load_levels(tmp_path: Path) -> None:
    s = load_scenario(_write(tmp_path / "hetero.toml", HETERO), overrides={"topology.datacenters.1.gpu": "a100-40gb"})
    sim, _ = build_world(s, 0)
    st = {g: load_toml(data_path("params", "power", f"{g}.toml"))["states"] for g in ("a100-80gb", "a100-40gb")}
    sim.set_capacity(1, 0, 2)  # every a100-40gb engine of fr falls asleep (servers stay on): its own sleep power
    sim.advance_to(5.0)
    snap = sim.snapshot()
    assert (snap.sleeping_engines[1], snap.awake_engines[0]) == (16, 8)
    host = load_toml(data_path("params", "power", "a100-40gb.toml"))["power"]["host_w"]
    assert snap.power_w[1] == pytest.approx((16 * st["a100-40gb"]["sleep_w"] + 2 * host) * s.topology_spec().datacenters[1].pue)
    assert list(snap.total_kv_blocks) == [8 * _kv_blocks("a100-80gb"), 16 * _kv_blocks("a100-40gb")]
    # load levels: each GPU type's measured capacity x its engines; a GPU type not measured for the
    # model is a named error
    from carbon_gym.scenario import load_load_levels

    caps = load_load_levels()
    mixed = load_scenario(_write(tmp_path / "h2.toml", HETERO.replace("rate_per_s = 12.0", 'load = "moderate"')))
    assert mixed.rate_per_s == pytest.approx(0.6 * (8 * caps.capacity("llama-3.1-8b", "a100-80gb", 1).level_rate_per_s("cluster")
                                                    + 16 * caps.capacity("llama-3.1-8b", "h100-80gb", 1).level_rate_per_s("cluster")))
    with pytest.raises(ConfigError) as e:
        load_scenario(_write(tmp_path / "h4.toml", HETERO.replace("rate_per_s = 12.0", 'load = "moderate"')
                             .replace('model = "llama-3.1-8b"', 'model = "qwen2.5-7b"')))
    assert e.value.field == "workload.load" and "qwen2.5-7b/h100-80gb" in str(e.value)
    both = load_scenario(_write(tmp_path / "h3.toml", HETERO.replace('gpu = "h100-80gb"\n', "")
                                .replace("rate_per_s = 12.0", 'load = "moderate"')))
    assert both.rate_per_s == pytest.approx(0.6 * 2.9585 * 24)  # the cluster figure of llama-3.1-8b/a100-80gb/tp1


def test_unknown_datacenter_gpu_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_scenario(_write(tmp_path / "h.toml", HETERO.replace('"h100-80gb"', '"b200"')))
    assert e.value.field == "topology.datacenters[1].gpu" and "h100-80gb" in e.value.allowed


# issue 43 item 3: a GPU spec file given by path is checked like a scenario table (every field
# typed, finite and in its stated range; a missing field or an unknown key named)
BAD_SPECS = [
    ("tdp_w = 400", "tdp_w = 0", "my-a100.tdp_w", "(0, 5000] watts", "0.0 is out of range"),
    ("tdp_w = 400", "tdp_w = -400", "my-a100.tdp_w", "(0, 5000] watts", "-400.0 is out of range"),
    ("tdp_w = 400", "tdp_w = 6000", "my-a100.tdp_w", "(0, 5000] watts", "6000.0 is out of range"),
    ("tdp_w = 400", "tdp_w = nan", "my-a100.tdp_w", None, "must be finite, got nan"),
    ("memory_bytes = 80e9", "memory_bytes = inf", "my-a100.memory_bytes", None, "must be finite, got inf"),
    ("memory_bytes = 80e9", 'memory_bytes = "80GB"', "my-a100.memory_bytes", None, "expected a number in bytes"),
    ("memory_bytes = 80e9", "memory_bytes = 2e12", "my-a100.memory_bytes", "(0, 1.024e+12] bytes", "out of range"),
    ("peak_bf16_flops = 312e12", "peak_bf16_flops = -1.0", "my-a100.peak_bf16_flops", "(0, 1e+17] FLOP/s", "out of range"),
    ("hbm_bytes_per_s = 2.039e12", "hbm_bytes_per_s = 0", "my-a100.hbm_bytes_per_s", "(0, 1e+14] bytes per second",
     "out of range"),
    ("tdp_w = 400\n", "", "my-a100.tdp_w", None, "required field is missing"),
    ('display_name = "my A100 copy"', "display_name = 3", "my-a100.display_name", None, "expected a string, got 3"),
    ("tdp_w = 400", "tdp = 400", "my-a100.tdp", None, "did you mean 'tdp_w'?"),
    ("memory_bytes = 80e9", "memory_bytes = 80e9\nmemory_gb = 80", "my-a100.memory_gb", None, "did you mean 'memory_bytes'?"),
    ("gpus_per_node = 8", "gpus_per_node = 1e6", "my-a100.gpus_per_node", None, "expected an integer, got 1000000.0"),
    ("gpus_per_node = 8", "gpus_per_node = 1000000", "my-a100.gpus_per_node", "[1, 64]", "1000000 is out of range"),
    ("gpus_per_node = 8", "gpus_per_node = 0", "my-a100.gpus_per_node", "[1, 64]", "0 is out of range"),
    ("gpus_per_node = 8", "gpus_per_node = true", "my-a100.gpus_per_node", None, "expected an integer, got True"),
]


@pytest.mark.parametrize("old,new,field,allowed,text", BAD_SPECS, ids=[b[1].replace("\n", "; ") or "no-tdp_w" for b in BAD_SPECS])
def test_gpu_spec_file_is_strictly_validated(tmp_path: Path, old: str, new: str, field: str, allowed: str | None,
                                             text: str) -> None:
    d = _gpu_dir(tmp_path)
    assert old in SPEC
    (d / "my_gpu.toml").write_text(SPEC.replace(old, new, 1))
    spec_file = str(d / "my_gpu.toml")
    with pytest.raises(ConfigError) as e:  # by the scenario's [gpu_files] ...
        load_scenario(str(_custom_scenario(tmp_path)))
    assert e.value.field == field and e.value.source == spec_file
    assert str(e.value).startswith(f"{spec_file}: {field}: ") and text in str(e.value)
    if allowed is not None:
        assert e.value.allowed == allowed and f"(allowed: {allowed})" in str(e.value)
    if "unknown field" in str(e.value):
        assert "tdp_w" in e.value.allowed
    with pytest.raises(ConfigError) as e2:  # ... and directly (calibration's --gpu-spec)
        load_gpu_spec("my-a100", spec_file)
    assert str(e2.value) == str(e.value)


def test_gpu_spec_table_that_is_not_a_table_and_the_packaged_specs(tmp_path: Path) -> None:
    d = _gpu_dir(tmp_path)
    (d / "my_gpu.toml").write_text('my-a100 = "big"\n')
    with pytest.raises(ConfigError) as e:
        load_gpu_spec("my-a100", d / "my_gpu.toml")
    assert e.value.field == "my-a100" and "expected a table, got 'big'" in str(e.value)
    g = load_gpu_spec("my-a100", _write(d / "ok.toml", SPEC))
    assert (g.name, g.tdp_w, g.gpus_per_node, type(g.gpus_per_node)) == ("my-a100", 400.0, 8, int)
    from carbon_gym.specs import available_gpus

    for name in available_gpus():  # (every shipped table passes the same checks)
        assert load_gpu_spec(name).name == name
