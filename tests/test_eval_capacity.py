"""The capacity experiment's table and RESULTS.md section (eval/capacity_report.py) on tiny
synthetic runs with answers by hand: reductions paired by seed, energy by state grouped, merged
reruns, the section written in place between its markers."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from eval import capacity_report as cr
from eval.stats import t_critical_95

STATES = ("gpu_active", "gpu_idle", "gpu_falling_asleep", "gpu_asleep", "gpu_waking", "gpu_booting",
          "host_on", "host_standby", "host_off", "host_booting")


def run(scen: str, pol: str, seed: int, carbon_g: float, *, states: dict[str, float] | None = None, valid: bool = True,
        servers: float = 8.0, engines: float = 64.0) -> dict:
    row = {"scenario": scen, "policy": pol, "seed": seed, "carbon_g": carbon_g, "slo_violation_pct": 1.0 + seed,
           "unfinished_pct": 0.0 if valid else 5.0, "run_valid": valid, "mlperf_p99_pass": seed == 0,
           "mlperf_ttft_p99_pass": seed == 0, "mlperf_tpot_p99_pass": True, "wall_s": 10.0, "cpu_s": 9.0,
           "decision_p95_s": 0.001, "window_s": 1200.0, "energy_kwh": 0.0}
    if states is not None:  # capacity metrics (control != always_on)
        for s in STATES:
            row[f"energy_kwh_{s}"] = states.get(s, 0.0)
        row["energy_kwh"] = sum(states.values())
        row.update({"mean_servers_on": servers, "mean_awake_engines": engines, "engine_wakes": 2, "server_boots": 1,
                    "capacity_waits": 3})
    return row


def synthetic_runs() -> pd.DataFrame:
    on = {"gpu_active": 4.0, "gpu_idle": 1.0, "host_on": 5.0}
    slept = {"gpu_active": 4.0, "gpu_idle": 0.3, "gpu_falling_asleep": 0.125, "gpu_asleep": 0.35, "gpu_waking": 0.125,
             "host_on": 2.0, "host_standby": 0.5, "host_off": 0.2, "gpu_booting": 0.25, "host_booting": 0.45}
    rows = []
    for seed, (ref, react, x) in enumerate([(100.0, 50.0, 40.0), (200.0, 100.0, 100.0)]):
        rows.append(run("s", cr.ALWAYS_ON_LABEL, seed, ref))
        rows.append(run("s", "rr", seed, ref, states=on))
        rows.append(run("s", cr.REACTIVE_REFERENCE, seed, react, states=slept, servers=4.0, engines=20.0))
        rows.append(run("s", "x+reactive", seed, x, states=slept, servers=2.0 + seed, engines=10.0))
    return pd.DataFrame(rows)


def test_specs_reference_always_on_then_agent_policies():
    specs = cr.capacity_specs(["a", "b"], ["rr", "rr+reactive"], [0, 1], {"duration_s": 60.0})
    assert len(specs) == 2 * 2 * 3
    ref = [s for s in specs if s.policy_name == cr.ALWAYS_ON_LABEL]
    assert len(ref) == 4 and all(dict(s.overrides)["capacity.control"] == "always_on" and s.policy == "rr" for s in ref)
    agent = [s for s in specs if s.policy_name != cr.ALWAYS_ON_LABEL]
    assert all(dict(s.overrides)["capacity.control"] == "agent" and dict(s.overrides)["duration_s"] == 60.0 for s in agent)
    # one scenario label: the same requests and episode starts for the reference and the others
    assert {s.scenario_name for s in specs} == {"a", "b"} and specs[0].start_offset_s() == specs[2].start_offset_s()
    # a later matrix without rr leaves the rr reference out (merged with the first); milp brings its
    # routing-only run along
    later = cr.capacity_specs(["a"], ["milp"], [0], {})
    assert [(s.policy_name, dict(s.overrides)["capacity.control"]) for s in later] == [
        (cr.MILP_ALWAYS_ON_LABEL, "always_on"), ("milp", "agent")]


def test_specs_take_aliases_and_learned_checkpoints_as_everywhere():
    """``NAME=POLICY`` and ``learned:<checkpoint>`` are named as in the other experiments, with
    their ``--policy-arg`` settings; an aliased MILP brings its own routing-only run, unless its
    settings are all the capacity stage's (always on it would be ``milp (always on)`` to the bit)."""
    specs = cr.capacity_specs(["a"], ["cap=learned:train/checkpoints/llama8b_capacity_set.npz", "m8=milp", "p7=milp"], [0, 1], {},
                              {"cap": {"trained_polling_period_s": 1.0}, "m8": {"capacity_util_cap": 0.8, "capacity_basis": "datacenter"},
                               "p7": {"capacity_util_cap": 0.8, "max_prefill_share": 0.7}})
    got = [(s.policy, s.policy_name, dict(s.overrides)["capacity.control"], dict(s.policy_kwargs)) for s in specs]
    m8 = {"capacity_util_cap": 0.8, "capacity_basis": "datacenter"}
    p7 = {"capacity_util_cap": 0.8, "max_prefill_share": 0.7}
    assert got == [
        ("learned:train/checkpoints/llama8b_capacity_set.npz", "cap", "agent", {"trained_polling_period_s": 1.0}),
        ("learned:train/checkpoints/llama8b_capacity_set.npz", "cap", "agent", {"trained_polling_period_s": 1.0}),
        ("milp", "m8", "agent", m8),
        ("milp", "m8", "agent", m8),
        ("milp", "p7 (always on)", "always_on", p7),
        ("milp", "p7", "agent", p7),
        ("milp", "p7 (always on)", "always_on", p7),
        ("milp", "p7", "agent", p7),
    ]
    assert cr._capacity_only(()) is False and cr._capacity_only((("capacity_load_margin", 0.0),)) is True


def test_specs_autoscaler_settings_only_on_rows_deciding_capacity():
    """``--set capacity.params.<key>`` reaches the rows that decide capacity; the always-on
    references (which the simulator refuses autoscaler settings under) run without it."""
    over = {"duration_s": 60.0, "capacity.params.down_util": 0.54, "capacity.params": {"up_util": 0.9}}
    specs = cr.capacity_specs(["a"], ["rr", "rr+reactive", "milp"], [0], over)
    by = {s.policy_name: dict(s.overrides) for s in specs}
    for ref in (cr.ALWAYS_ON_LABEL, cr.MILP_ALWAYS_ON_LABEL):
        assert by[ref] == {"duration_s": 60.0, "capacity.control": "always_on"}
    assert by["rr+reactive"] == {**over, "capacity.control": "agent"}


def test_table_reductions_paired_by_seed_with_t_intervals():
    t = cr.capacity_table(synthetic_runs()).set_index("policy")
    # x: seed 0 60% / 20%, seed 1 50% / 0% below always-on / rr+reactive
    x = t.loc["x+reactive"]
    half = t_critical_95(1) * math.sqrt(((60 - 55) ** 2 + (50 - 55) ** 2) / 1) / math.sqrt(2)
    assert x["reduction_vs_always_on_pct"] == pytest.approx(55.0)
    assert x["reduction_vs_always_on_pct_ci95"] == pytest.approx(half)
    assert x["reduction_vs_reactive_pct"] == pytest.approx(10.0)
    assert x["reduction_vs_reactive_pct_ci95"] == pytest.approx(t_critical_95(1) * math.sqrt(200) / math.sqrt(2))
    assert t.loc[cr.REACTIVE_REFERENCE, "reduction_vs_always_on_pct"] == pytest.approx(50.0)
    assert t.loc[cr.REACTIVE_REFERENCE, "reduction_vs_always_on_pct_ci95"] == pytest.approx(0.0)
    assert t.loc["rr", "reduction_vs_always_on_pct"] == 0.0
    assert t.loc[cr.ALWAYS_ON_LABEL, "reduction_vs_reactive_pct"] == pytest.approx(-100.0)
    assert x["carbon_kg"] == pytest.approx(0.07) and x["mean_servers_on"] == pytest.approx(2.5)
    assert x["slo_violation_pct"] == pytest.approx(1.5) and x["mlperf_p99_pass_share"] == 0.5
    assert x["mlperf_ttft_p99_pass_share"] == 0.5 and x["valid_share"] == 1.0


def test_table_groups_the_energy_by_state():
    t = cr.capacity_table(synthetic_runs()).set_index("policy")
    r = t.loc[cr.REACTIVE_REFERENCE]
    assert r["energy_kwh[GPU asleep]"] == pytest.approx(0.125 + 0.35 + 0.125)  # falling + asleep + waking
    assert r["energy_kwh[boot]"] == pytest.approx(0.7)  # GPUs and host while booting
    assert r["energy_kwh[host off]"] == pytest.approx(0.2)
    groups = sum(r[f"energy_kwh[{g}]"] for g in cr.ENERGY_GROUPS)
    assert groups == pytest.approx(r["energy_kwh"]) and r["energy_kwh"] == pytest.approx(8.3)
    # the always-on run has no ledger of states: NaN, shown as "–"
    assert math.isnan(t.loc[cr.ALWAYS_ON_LABEL, "energy_kwh[GPU active]"])


def md_rows(md: str, first_table: bool = True) -> dict[str, dict[str, str]]:
    """policy -> {column: cell} of the first (or second) Markdown table of ``md``."""
    tables = [b for b in md.split("\n\n") if b.startswith("| scenario")]
    lines = tables[0 if first_table else 1].strip().splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out[cells[1]] = dict(zip(head, cells))
    return out


def test_markdown_marks_invalid_runs_and_an_invalid_reference():
    runs = synthetic_runs()
    md = cr.capacity_markdown(cr.capacity_table(runs))
    x = md_rows(md)["x+reactive"]
    assert (x["vs always-on rr %"], x["vs rr+reactive %"], x["MLPerf p99 pass"]) == ("55.0 ± 63.5", "10.0 ± 127.1", "1/2 ✗ (TTFT)")
    assert (x["servers on"], x["awake engines"], x["wakes / boots / waits"]) == ("2.5 ± 6.4", "10.0 ± 0.0", "2/1/3")
    assert md_rows(md)[cr.ALWAYS_ON_LABEL]["servers on"] == "–"
    e = md_rows(md, first_table=False)["rr+reactive"]
    assert [e[k].split(" ±")[0] for k in ("total", "GPU active", "GPU idle", "GPU asleep", "host on", "host standby", "host off", "boot")] == \
        ["8.3", "4.0", "0.3", "0.6", "2.0", "0.5", "0.2", "0.7"]
    runs.loc[(runs["policy"] == cr.REACTIVE_REFERENCE) & (runs["seed"] == 1), "run_valid"] = False
    rows = md_rows(cr.capacity_markdown(cr.capacity_table(runs)))
    assert (rows["rr+reactive"]["vs always-on rr %"], rows["rr+reactive"]["vs rr+reactive %"]) == ("invalid", "invalid")
    assert (rows["x+reactive"]["vs always-on rr %"], rows["x+reactive"]["vs rr+reactive %"]) == ("55.0 ± 63.5", "(ref. invalid)")


def write_dir(path, runs: pd.DataFrame, command: str) -> None:
    path.mkdir(parents=True)
    runs.to_csv(path / "runs.csv", index=False)
    (path / "capacity.md").write_text("s: 600 s burn-in, then 1200 s measured.\n\n(table)\n", encoding="utf-8")
    cfg = {"command": command, "elapsed_s": 120.0, "workers": 1, "cpu_count": 2, "versions": {"git": "abc", "platform": "p"},
           "runs": [{"start_utc": "2023-03-01T05:00:00Z", "overrides": {"env.warmup_s": 600.0}}]}
    (path / "config.json").write_text(json.dumps(cfg), encoding="utf-8")


def test_merged_runs_later_directory_replaces_the_same_run(tmp_path):
    runs = synthetic_runs()
    write_dir(tmp_path / "capacity", runs, "first")
    later = runs[runs["policy"].isin([cr.ALWAYS_ON_LABEL, "x+reactive"])].copy()
    later.loc[later["policy"] == "x+reactive", "carbon_g"] = [20.0, 20.0]
    write_dir(tmp_path / "capacity-rerun" / "capacity", later, "second")
    dirs = cr.capacity_dirs(str(tmp_path))
    assert [d.split(str(tmp_path))[1] for d in dirs] == ["/capacity", "/capacity-rerun/capacity"]
    m = cr.merged_runs(dirs)
    assert len(m) == len(runs)  # the reference, then CAPACITY_POLICIES' order, then others; seeds in order within
    assert list(zip(m["policy"], m["seed"])) == [(p, k) for p in (cr.ALWAYS_ON_LABEL, "rr", "rr+reactive", "x+reactive") for k in (0, 1)]
    assert list(m[m["policy"] == "x+reactive"]["carbon_g"]) == [20.0, 20.0]
    t = cr.capacity_table(m).set_index("policy")
    assert t.loc["x+reactive", "reduction_vs_always_on_pct"] == pytest.approx((80.0 + 90.0) / 2)
    # a scenario seen first in a later matrix still lists the reference first
    milp = runs[runs["policy"] == "rr"].assign(scenario="t", policy="milp")
    ref = runs[runs["policy"] == cr.ALWAYS_ON_LABEL].assign(scenario="t")
    write_dir(tmp_path / "capacity-a" / "capacity", milp, "milp")
    write_dir(tmp_path / "capacity-b" / "capacity", ref, "ref")
    m = cr.merged_runs(cr.capacity_dirs(str(tmp_path)))
    assert list(m[m["scenario"] == "t"]["policy"]) == [cr.ALWAYS_ON_LABEL] * 2 + ["milp"] * 2
    assert list(dict.fromkeys(m["scenario"])) == ["s", "t"]


def test_section_written_in_place_between_markers(tmp_path):
    write_dir(tmp_path / "capacity", synthetic_runs(), "carbon-gym experiment capacity --out r")
    out = tmp_path / "RESULTS.md"
    before = "# Results\n\n## Headline\n\nkeep me\n\n## Comparison with the study\n\n| a |\n\n<!-- notes:begin -->\nmine\n<!-- notes:end -->\n"
    out.write_text(before, encoding="utf-8")
    cr.write_capacity_section(str(tmp_path), out=str(out))
    text = out.read_text(encoding="utf-8")
    assert text.index("keep me") < text.index(cr.SECTION_BEGIN) < text.index(cr.SECTION_END) < text.index("## Comparison with the study")
    assert text.count(cr.SECTION_TITLE) == 1 and "carbon-gym experiment capacity --out r" in text and "mine" in text
    assert "measurement window: 1200 s after a 600 s burn-in" in text and "is 3.5 boots (~345 s to serving) and 40 capacity periods" in text and "wall time (capacity): 2.0 min for 1 runs" in text
    # where the saving comes from, against rr (agent) = always-on: host 5.0 -> 2.7 kWh (on + standby + off), GPU
    # floor 1.0 -> 0.3 idle + 0.6 asleep, active unchanged, boots 0.7 kWh: 10.0 - 8.3 = 2.3 + 0.1 + 0.0 - 0.7
    assert ("rr+reactive saves 1.7 kWh of 10.0: host power 2.3 kWh, GPU idle/asleep floor 0.1 kWh, GPU active 0.0 kWh, "
            "boots cost 0.7 kWh") in text
    assert "rr under control = agent (routing only) is +0.00% vs always-on" in text
    assert "- starts: 2 (seeds 0, 1;" in text and "One start (seed) per cell" not in text
    assert "largest reduction: x+reactive 55.0% at 1.50% violation" in text
    # a second write replaces the section only
    (tmp_path / "capacity" / "capacity.md").write_text("new head\n\n(table)\n", encoding="utf-8")
    cr.write_capacity_section(str(tmp_path), out=str(out))
    again = out.read_text(encoding="utf-8")
    assert again.count(cr.SECTION_BEGIN) == 1 and "new head" in again
    assert again.split(cr.SECTION_BEGIN)[0] == text.split(cr.SECTION_BEGIN)[0]
    assert again.split(cr.SECTION_END)[1] == text.split(cr.SECTION_END)[1]


def test_cli_report_section_capacity(tmp_path, capsys):
    from eval import cli

    write_dir(tmp_path / "capacity", synthetic_runs(), "cmd")
    out = tmp_path / "R.md"
    out.write_text("# R\n\nold text\n", encoding="utf-8")
    assert cli.main(["report", str(tmp_path), "--section", "capacity", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# R\n\nold text\n") and cr.SECTION_TITLE in text
    assert cli.main(["report", str(tmp_path / "none"), "--section", "capacity", "--out", str(out)]) == 2
    assert "carbon-gym experiment capacity" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == text


def test_cli_report_section_capacity_updates_its_cost_rows(tmp_path):
    """``report --section capacity`` also replaces the capacity matrix's row of the cost table (the
    old one-start row would otherwise stay beside the new section) and sums the totals again;
    the other rows are kept."""
    from eval import cli

    write_dir(tmp_path / "capacity", synthetic_runs().assign(cpu_s=30.0), "carbon-gym experiment capacity --seeds 2")
    out = tmp_path / "R.md"
    head = "| results | runs | workers | wall (min) | CPU of the runs (min) | command |\n|---|---|---|---|---|---|\n"
    out.write_text("# R\n\nEvery matrix in this file, its command and cost:\n\n" + head
                   + "| capacity | 24 | 2 | 10.5 | 19.6 | `old` |\n| headline | 360 | 2 | 40.0 | 70.4 | `h` |\n\n"
                   "Whole run: 384 runs, 50.5 min of wall time summed over the commands (some ran at the same time), "
                   "90.0 CPU-minutes (45.0 min on 2 dedicated cores).\n", encoding="utf-8")
    assert cli.main(["report", str(tmp_path), "--section", "capacity", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    cpu_min = 30.0 * len(synthetic_runs()) / 60
    assert "`old`" not in text and "| headline | 360 | 2 | 40.0 | 70.4 | `h` |" in text
    assert f"| capacity | 1 | 1 | 2.0 | {cpu_min:.1f} | `carbon-gym experiment capacity --seeds 2` |" in text
    assert f"Whole run: 361 runs, 42.0 min of wall time summed over the commands (some ran at the same time), {70.4 + cpu_min:.1f} CPU-minutes" in text
    assert cr.SECTION_TITLE in text


def test_states_table_durations_from_the_power_file():
    from carbon_gym.physics.power import load_power_states
    from carbon_gym.scenario import load_scenario
    from carbon_gym.specs import load_model_spec

    sc = load_scenario("mixtral8x7b-low")
    st = load_power_states(sc.gpu)
    gb = load_model_spec(sc.model).weight_bytes / sc.tp / 1e9
    row = md_rows(cr.states_markdown(["mixtral8x7b-low"]))["a100-80gb (4)"]
    # TP4: every GPU copies its share at the per-GPU node rate
    assert float(row["wake (s)"]) == pytest.approx(st.wake_fixed_s + gb / st.copy_gb_per_s_node, abs=0.005)
    assert float(row["fall asleep (s)"]) == pytest.approx(st.fall_asleep_fixed_s + gb / st.copy_gb_per_s_node, abs=0.005)
    assert float(row["boot to serving (s)"]) == pytest.approx(st.server_boot_s + st.cold_start_fixed_s + st.cold_start_s_per_gb * gb, abs=0.5)


def test_experiment_end_to_end_on_dev(tmp_path):
    """``carbon-gym experiment capacity`` on dev (16 engines, 2 nodes): rr routing only under
    control = agent is the always-on run bit for bit; the reactive autoscaler sleeps engines."""
    from eval import cli

    argv = ["experiment", "capacity", "--scenarios", "dev", "--policies", "rr,rr+reactive", "--window-s", "60", "--warmup-s", "60",
            "--seeds", "1", "--workers", "1", "--no-progress", "--no-tensorboard", "--no-plots", "--no-requests", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    runs = pd.read_csv(tmp_path / "capacity" / "runs.csv").set_index("policy")
    assert list(runs.index) == [cr.ALWAYS_ON_LABEL, "rr", "rr+reactive"]
    assert runs.loc["rr", "carbon_g"] == runs.loc[cr.ALWAYS_ON_LABEL, "carbon_g"]
    assert runs.loc["rr", "engine_sleeps"] == 0 and runs.loc["rr", "mean_awake_engines"] == 16
    assert runs.loc["rr+reactive", "engine_sleeps"] > 0 and runs.loc["rr+reactive", "mean_awake_engines"] < 16
    states = [c for c in runs.columns if c.startswith("energy_kwh_")]
    assert runs.loc["rr+reactive", states].sum() == pytest.approx(runs.loc["rr+reactive", "energy_kwh"], rel=1e-9)
    table = pd.read_csv(tmp_path / "capacity" / "capacity.csv").set_index("policy")
    c_on, c_re = runs.loc[cr.ALWAYS_ON_LABEL, "carbon_g"], runs.loc["rr+reactive", "carbon_g"]
    assert table.loc["rr+reactive", "reduction_vs_always_on_pct"] == pytest.approx(100 * (c_on - c_re) / c_on)
    out = tmp_path / "R.md"
    assert cli.main(["report", str(tmp_path), "--section", "capacity", "--out", str(out)]) == 0
    assert "| dev | rr+reactive | 1 |" in out.read_text(encoding="utf-8")


def test_milp_util_cap_text_reads_the_runs_or_names_the_old_default():
    old = pd.DataFrame({"policy": ["milp", "rr"]})  # runs before policy_capacity_util_cap was recorded
    assert cr._milp_util_cap(old) == "0.7"
    new = pd.DataFrame({"policy": ["milp", "milp", "rr", "x"], "policy_capacity_util_cap": [0.68, 0.9, None, 0.5]})
    assert cr._milp_util_cap(new) == "0.68 / 0.9"  # the MILP's rows only, every value recorded
