"""Load presets: the measured capacities reproduce with the current simulator, and round-robin at
the presets runs at the intended fraction of capacity and within the SLO (issue 3, item 4)."""

from __future__ import annotations

import warnings

import pytest

from carbon_gym.capacity import probe_slo, round_robin_slo
from carbon_gym.scenario import load_load_levels, load_scenario

SHORT = {"llama-3.1-8b": "llama8b", "qwen2.5-7b": "qwen7b", "mixtral-8x7b": "mixtral8x7b"}


def scen(name, overrides=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_scenario(name, overrides=overrides)


@pytest.mark.slow
@pytest.mark.parametrize("model", list(SHORT))
def test_stored_capacity_is_the_slo_knee(model):
    levels = load_load_levels()
    s = scen(f"{SHORT[model]}-moderate", {"workload.rate_per_s": 1.0})
    entry = levels.capacity(model, s.gpu, s.tp)
    if entry.provisional:
        pytest.skip(f"{entry.key}: capacity still PROVISIONAL")
    cond = entry.conditions
    cap = entry.per_engine_rate_per_s
    kw = dict(duration_s=cond["probe_duration_s"], warmup_s=cond["probe_warmup_s"], seeds=tuple(cond["probe_seeds"]))
    at = probe_slo(s, cap, **kw)
    assert at.ok, at  # the stored rate meets both p99 targets ...
    assert at.p99_ttft_s == pytest.approx(cond["p99_ttft_s_at_capacity"], rel=1e-3)
    assert at.p99_tpot_s == pytest.approx(cond["p99_tpot_s_at_capacity"], rel=1e-3)
    above = probe_slo(s, cap * 1.05, **kw)
    assert not above.ok, above  # ... and 5% more load does not: it is the knee, not a guess


@pytest.mark.slow
def test_round_robin_at_presets_runs_at_the_intended_fraction():
    levels = load_load_levels()
    entry = levels.capacity("llama-3.1-8b", "a100-80gb", 1)
    cap = entry.level_rate_per_s(levels.basis)
    results = {}
    for level in ("moderate", "high"):
        # dev topology (2 datacenters x 8 engines), placement every 0.1 s so that the engines, not
        # the scheduler's polling wait, decide the latency
        s = scen("dev", {"workload.load": level, "polling_period_s": 0.1})
        assert s.rate_per_s / s.n_engines() == pytest.approx(levels.fractions[level] * cap)
        results[level] = round_robin_slo(s, duration_s=240.0, warmup_s=60.0)
        assert results[level].ok, (level, results[level])
    over = scen("dev", {"workload.rate_per_s": 1.3 * entry.per_engine_rate_per_s * 16, "polling_period_s": 0.1})
    r_over = round_robin_slo(over, duration_s=240.0, warmup_s=60.0)
    assert not r_over.ok, r_over  # beyond one engine's capacity round-robin breaks the p99 targets
    assert results["moderate"].p99_tpot_s < results["high"].p99_tpot_s < r_over.p99_tpot_s


def test_load_levels_are_fractions_of_the_cluster_figure():
    """The packaged file's level basis is the cluster figure (issue 20, item 4): every entry holds
    it beside the engine figure with its ratio, and every study scenario's rate is the level's
    fraction of it (not of the engine figure)."""
    levels = load_load_levels()
    assert levels.basis == "cluster"
    for cap in levels.capacities.values():
        assert cap.basis.startswith("engine:"), cap.key  # what per_engine_rate_per_s is
        c = cap.cluster_per_engine_rate_per_s
        assert c is not None and 0.4 * cap.per_engine_rate_per_s < c < cap.per_engine_rate_per_s, cap.key
        assert cap.conditions["cluster_to_engine_ratio"] == pytest.approx(c / cap.per_engine_rate_per_s, abs=1e-4)
        assert cap.level_rate_per_s("cluster") == c and cap.level_rate_per_s("engine") == cap.per_engine_rate_per_s
    for model, short in SHORT.items():
        s = scen(f"{short}-moderate", {"workload.rate_per_s": 1.0})
        cap = levels.capacity(model, s.gpu, s.tp)
        assert cap.conditions["cluster_scenario"] == s.name and cap.conditions["cluster_engines"] == s.n_engines()
        assert cap.conditions["cluster_p99_ttft_s_at_capacity"] <= s.ttft_s
        for level in ("low", "moderate", "high"):
            m = scen(f"{short}-{level}")
            assert m.rate_per_s == pytest.approx(levels.fractions[level] * cap.cluster_per_engine_rate_per_s * m.n_engines())
            assert "cluster-level capacity" in m.rate_source


def test_load_level_file_basis(tmp_path):
    """A file without ``level_basis`` (older files) reads with the engine basis; an unknown basis
    is a DataError naming the allowed ones; under the cluster basis an entry with no cluster figure
    is a ConfigError naming workload.load (never the engine figure silently)."""
    from carbon_gym.errors import ConfigError, DataError
    from carbon_gym.scenario import load_levels_path, load_rate_per_s

    text = load_levels_path().read_text()
    old = tmp_path / "old.toml"
    old.write_text(text.replace('level_basis = "cluster"', ""))
    levels = load_load_levels(old)
    assert levels.basis == "engine"
    cap = levels.capacity("llama-3.1-8b", "a100-80gb", 1)
    rate, why = load_rate_per_s("llama-3.1-8b", "a100-80gb", 1, "moderate", 512, levels)
    assert rate == pytest.approx(0.6 * cap.per_engine_rate_per_s * 512) and "engine-level" in why
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('level_basis = "cluster"', 'level_basis = "node"'))
    with pytest.raises(DataError, match="level_basis"):
        load_load_levels(bad)
    key = '[capacity."llama-3.1-8b/a100-80gb/tp1"]'
    head, tail = text.split(key)
    entry, rest = tail.split("\n[capacity.", 1)
    entry = "\n".join(ln for ln in entry.split("\n") if not ln.startswith("cluster_per_engine_rate_per_s"))
    missing = tmp_path / "missing.toml"
    missing.write_text(head + key + entry + "\n[capacity." + rest)
    with pytest.raises(ConfigError, match="workload.load") as e:
        load_rate_per_s("llama-3.1-8b", "a100-80gb", 1, "moderate", 512, load_load_levels(missing))
    assert "cluster" in str(e.value)


@pytest.mark.slow
def test_stored_cluster_capacity_is_round_robins_knee():
    """The cluster figure of Llama-3.1-8B reproduces: round-robin over llama8b-moderate with 1 s
    polling meets both p99 targets at it and not 5% above it (same probes as the measurement)."""
    from carbon_gym.capacity import cluster_probe

    cap = load_load_levels().capacity("llama-3.1-8b", "a100-80gb", 1)
    cond = cap.conditions
    s = scen("llama8b-moderate", {"workload.rate_per_s": 1.0})
    kw = dict(duration_s=cond["cluster_probe_duration_s"], warmup_s=cond["cluster_probe_warmup_s"],
              seeds=tuple(cond["cluster_probe_seeds"]))
    at = cluster_probe(s, cap.cluster_per_engine_rate_per_s, **kw)
    assert at.ok and at.p99_ttft_s == pytest.approx(cond["cluster_p99_ttft_s_at_capacity"], rel=1e-3), at
    above = cluster_probe(s, 1.05 * cap.cluster_per_engine_rate_per_s, **kw)
    assert not above.ok, above
