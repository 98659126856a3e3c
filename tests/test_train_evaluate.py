"""The held-out comparison of train/evaluate.py: which days and seeds it runs, the cache, and the
table's ratios (episodes stubbed: the harness itself is tested elsewhere)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from carbon_gym.errors import ConfigError  # noqa: E402
from train import evaluate  # noqa: E402
from train.envs import heldout_starts  # noqa: E402


@pytest.fixture
def stub_episodes(monkeypatch):
    """evaluate_episode replaced by a recorder returning fixed metrics per policy."""
    calls = []
    carbon = {"round-robin": 100.0, "facility-milp": 80.0, "learned": 84.0}
    viol = {"round-robin": 0.01, "facility-milp": 0.04, "learned": 0.03}
    dec = {"round-robin": 1e-4, "facility-milp": 2e-2, "learned": 2e-4}

    def fake(name, scenario, start_utc, seed, overrides, checkpoint=None, mode=None, trust=False):
        calls.append((name, scenario, start_utc, seed))
        return {"carbon_g": carbon[name], "violation_rate": viol[name], "decision_s_mean": dec[name],
                "decision_s_p95": 2 * dec[name], "wall_s": 0.0}

    monkeypatch.setattr(evaluate, "evaluate_episode", fake)
    return calls


def test_skip_days_runs_the_later_starts_with_their_own_seeds(stub_episodes, tmp_path):
    out = evaluate.run_evaluation(checkpoint=None, scenarios=["llama8b-low"], baselines=["rr", "milp"], days=2,
                                  duration_s=60.0, max_pending=None, out_md=str(tmp_path / "t.md"),
                                  out_json=str(tmp_path / "sub" / "r.json"), cache_json=None, skip_days=3,
                                  log=lambda *a: None)
    starts = heldout_starts(5)[3:]
    assert {(c[2], c[3]) for c in stub_episodes} == {(starts[0], 1003), (starts[1], 1004)}
    assert {c[0] for c in stub_episodes} == {"round-robin", "facility-milp", "learned"}
    assert out["meta"]["starts"] == starts and out["meta"]["skip_days"] == 3
    assert json.loads((tmp_path / "sub" / "r.json").read_text())["meta"]["skip_days"] == 3  # parent folder made
    row = out["summary"]["llama8b-low"]
    assert row["learned"]["reduction_pct"] == pytest.approx(16.0) and row["facility-milp"]["reduction_pct"] == pytest.approx(20.0)
    # learned / MILP: 80% of the reduction, -1.00 pp violations, 100x lower decision time
    assert "| llama8b-low | 80% | -1.00 | 100x |" in (tmp_path / "t.md").read_text()


def test_baselines_come_from_the_cache_and_only_the_learned_rows_rerun(stub_episodes, tmp_path):
    cache = tmp_path / "cache.json"
    kw = dict(checkpoint=None, scenarios=["llama8b-low"], baselines=["rr", "milp"], days=1, duration_s=60.0,
              max_pending=None, out_md=None, out_json=None, cache_json=str(cache), log=lambda *a: None)
    evaluate.run_evaluation(**kw)
    first = len(stub_episodes)
    evaluate.run_evaluation(**kw)
    assert first == 3 and [c[0] for c in stub_episodes[first:]] == ["learned"]


def test_negative_skip_days_is_refused(stub_episodes):
    with pytest.raises(ConfigError, match="skip_days"):
        evaluate.run_evaluation(checkpoint=None, scenarios=["llama8b-low"], baselines=["rr"], days=1, duration_s=60.0,
                                max_pending=None, out_md=None, out_json=None, cache_json=None, skip_days=-1,
                                log=lambda *a: None)


def test_rank_candidates_applies_the_selection_rule(tmp_path, capsys):
    from train.rank_candidates import main as rank

    def cand(name: str, shares: list[float], dvs: list[float]) -> str:
        summ = {}
        for scen, sh, dv in zip(["low", "moderate", "high"], shares, dvs):
            summ[scen] = {"facility-milp": {"reduction_pct": 10.0, "violation_rate": 0.04, "episodes": 3},
                          "learned": {"reduction_pct": 10.0 * sh, "violation_rate": 0.04 + dv / 100.0, "episodes": 3}}
        p = tmp_path / f"sel_{name}.json"
        p.write_text(json.dumps({"summary": summ}))
        return str(p)

    a = cand("a", [0.95, 0.90, 0.79], [-1.0, -0.5, -0.5])   # 2 loads (high: share 79%)
    b = cand("b", [0.85, 0.85, 0.85], [-0.1, 0.0, -0.2])    # 3 loads, minimum 85%
    c = cand("c", [0.99, 0.99, 0.90], [-0.1, -0.1, -0.1])   # 3 loads, minimum 90%
    d = cand("d", [0.99, 0.99, 0.99], [-0.1, 0.01, -0.1])   # 2 loads (moderate: +0.01 pp)
    assert rank([a, b, c, d]) == "c"
    assert "| c | 99% / -0.10 pp * (3) | 99% / -0.10 pp * (3) | 90% / -0.10 pp * (3) | 3 | 90.0% |" in capsys.readouterr().out
    assert rank([a, b]) == "b"
    e = cand("e", [0.85, 0.86, 0.85], [-0.1, -0.1, -0.1])   # ties b on loads and minimum share
    assert rank([b, e]) == "b" and rank([e, b]) == "e"     # first listed wins a full tie...
    assert rank([b, e, "--incumbent", "e"]) == "e"          # ...unless the incumbent is named


def test_rank_candidates_margin_rule(tmp_path, capsys):
    from train.rank_candidates import main as rank

    def cand(name: str, shares: list[float], dvs: list[float]) -> str:
        summ = {scen: {"facility-milp": {"reduction_pct": 10.0, "violation_rate": 0.04, "episodes": 3},
                       "learned": {"reduction_pct": 10.0 * sh, "violation_rate": 0.04 + dv / 100.0, "episodes": 3}}
                for scen, sh, dv in zip(["low", "moderate", "high"], shares, dvs)}
        p = tmp_path / f"sel_{name}.json"
        p.write_text(json.dumps({"summary": summ}))
        return str(p)

    a = cand("a", [0.99, 0.95, 0.95], [-1.0, -0.05, -0.5])  # smallest margin 0.05 pp
    b = cand("b", [0.90, 0.86, 0.88], [-1.0, -0.30, -0.4])  # 0.30 pp, every share >= 85%
    c = cand("c", [0.90, 0.84, 0.88], [-2.0, -0.60, -0.9])  # 0.60 pp, but 84% at moderate load
    assert rank([a, b, c]) == "a"                           # the targets rule: minimum share
    assert rank([a, b, c, "--rule", "margin"]) == "b"
    assert "| b | 90% / -1.00 pp * (3) | 86% / -0.30 pp * (3) | 88% / -0.40 pp * (3) | 3 | 86.0% | +0.30 |" \
        in capsys.readouterr().out
    assert rank([a, b, c, "--rule", "margin", "--min-share", "0.8"]) == "c"
    # no candidate reaches the share everywhere: the targets rule decides
    assert rank([a, b, c, "--rule", "margin", "--min-share", "0.99"]) == "a"
    assert "rule 'targets'" in capsys.readouterr().out


def test_rank_candidates_merges_the_files_of_one_candidate(tmp_path):
    from train.rank_candidates import candidate_name, merged_summary

    def run(stem: str, eps: dict[str, tuple[float, float, float]]) -> str:
        # per episode: round-robin carbon, MILP carbon, learned carbon (g); violation rates fixed
        res = {"low": {k: {"round-robin": {"carbon_g": rr, "violation_rate": 0.0, "decision_s_mean": 1e-4,
                                          "decision_s_p95": 2e-4},
                           "facility-milp": {"carbon_g": m, "violation_rate": 0.04, "decision_s_mean": 2e-2,
                                             "decision_s_p95": 3e-2},
                           "learned": {"carbon_g": ln, "violation_rate": 0.02, "decision_s_mean": 2e-4,
                                       "decision_s_p95": 3e-4}} for k, (rr, m, ln) in eps.items()}}
        p = tmp_path / f"{stem}.json"
        p.write_text(json.dumps({"results": res, "summary": {}}))
        return str(p)

    assert candidate_name("x/sel_R_0.5_20.json") == "R_0.5_20" == candidate_name("sel35-44_R_0.5_20.json")
    assert candidate_name("R_0.5_20.json") == "R_0.5_20"
    f1 = run("sel_R", {"d0|seed=1": (100.0, 70.0, 80.0)})
    f2 = run("sel35_R", {"d1|seed=2": (200.0, 100.0, 120.0)})
    s = merged_summary([f1, f2])["low"]
    assert s["facility-milp"]["reduction_pct"] == pytest.approx((30.0 + 50.0) / 2)
    assert s["learned"]["reduction_pct"] == pytest.approx((20.0 + 40.0) / 2)
    assert s["learned"]["episodes"] == 2
    with pytest.raises(ValueError, match="two results files"):
        merged_summary([f1, run("sel9_R", {"d0|seed=1": (1.0, 1.0, 1.0)})])
