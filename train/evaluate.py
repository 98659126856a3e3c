"""Compare a trained checkpoint with the schedulers on held-out days; write the Markdown table.

Every policy runs the same episodes (common random numbers): for each scenario, ``days`` episode
starts on held-out days of the carbon year (:func:`train.envs.heldout_starts`, never used in
training), world seed ``1000 + i`` for the i-th start, through ``env.step`` via
:func:`carbon_gym.policy.rollout` (decision time measured outside the env, one torch thread).
Per episode: carbon reduction vs round-robin (%), SLO violation rate, mean decision time per
step. Results of the baselines are cached in ``cache_json`` so re-evaluating a new checkpoint
reruns only the learned policy.
"""

from __future__ import annotations

import json
import platform
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from carbon_gym.errors import ConfigError

from .envs import heldout_starts, make_episode_env

__all__ = ["run_evaluation", "evaluate_episode", "summarise", "markdown_table"]

REFERENCE = "round-robin"
LABELS = {
    "round-robin": "round-robin",
    "carbon-greedy": "carbon-greedy",
    "ilp-state": "per-request ILP (state-aware)",
    "ilp-static": "per-request ILP (load-independent)",
    "facility-milp": "facility MILP",
    "learned": "learned (set policy, shipped)",
}


def policy_key(name: str) -> str:
    """Row key of policy ``name`` (short or long) in this table, its cache and its JSON files:
    solvers' long name where the registry (:mod:`carbon_gym.registry`) has one (``milp`` ->
    ``facility-milp``, ``rr`` -> ``round-robin``: its first alias), else the registered name."""
    from carbon_gym.registry import policy_info

    info = policy_info(name)
    return info.aliases[0] if info.aliases else info.name


def _policy(name: str, env: Any, checkpoint: str | None, mode: str | None = None, trust: bool = False) -> Any:
    """Policy ``name`` from the registry; the learned one from ``checkpoint`` (default: the
    shipped one), sampling seed 0; ``trust`` admits a pickled SB3 checkpoint."""
    from carbon_gym.registry import make_policy

    if name == "learned":
        kw: dict[str, Any] = {"mode": mode} if mode else {}
        return make_policy("learned", env, path=checkpoint or None, seed=0, trust=trust, **kw)
    return make_policy(name, env)


def evaluate_episode(name: str, scenario: str, start_utc: str, seed: int, overrides: dict[str, Any],
                     checkpoint: str | None = None, mode: str | None = None, trust: bool = False) -> dict[str, Any]:
    """One episode of policy ``name``; returns the scalar metrics that the table uses (``trust``:
    admit an SB3 ``checkpoint``, see :meth:`train.policy.LearnedPolicy.load`)."""
    import torch as th

    from carbon_gym.policy import rollout

    th.set_num_threads(1)
    env = make_episode_env(scenario, overrides, start_utc)
    try:
        pol = _policy(name, env, checkpoint, mode, trust)
        t0 = time.perf_counter()
        m = rollout(env, pol, seed=seed)
        wall = time.perf_counter() - t0
    finally:
        env.close()
    keys = ("carbon_g", "energy_kwh", "violation_rate", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
            "completed", "arrived", "unplaced_at_end", "decision_s_mean", "decision_s_p95")
    out = {k: float(m[k]) for k in keys}
    sc = env.unwrapped.scenario
    # MLPerf's latency criterion: p99 TTFT and p99 TPOT within the scenario's targets
    out["mlperf_p99_pass"] = float(out["ttft_p99_s"] <= float(sc.ttft_s) and out["tpot_p99_s"] <= float(sc.tpot_s))
    out["wall_s"] = wall
    return out


def summarise(results: dict[str, dict[str, dict[str, Any]]], policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-scenario means over episodes: ``{scenario: {policy: {...}}}`` with reduction vs rr (%)
    per episode averaged (and its min/max), violation rate, decision time."""
    out: dict[str, dict[str, Any]] = {}
    for scen, eps in results.items():
        rows: dict[str, Any] = {}
        for p in policies:
            red, viol, dec, p95, passed = [], [], [], [], []
            for per in eps.values():
                if p not in per or REFERENCE not in per:
                    continue
                rr = per[REFERENCE]["carbon_g"]
                red.append(100.0 * (1.0 - per[p]["carbon_g"] / rr))
                viol.append(per[p]["violation_rate"])
                passed.append(float(per[p].get("mlperf_p99_pass", float("nan"))))  # (NaN: a cached episode from before)
                dec.append(per[p]["decision_s_mean"])
                p95.append(per[p]["decision_s_p95"])
            if red:
                rows[p] = {"reduction_pct": float(np.mean(red)), "reduction_min": float(np.min(red)),
                           "reduction_max": float(np.max(red)), "violation_rate": float(np.mean(viol)),
                           "decision_s_mean": float(np.mean(dec)), "decision_s_p95": float(np.mean(p95)), "episodes": len(red),
                           "mlperf_p99_pass_share": float(np.mean(passed)) if np.isfinite(passed).all() else float("nan")}
        out[scen] = rows
    return out


def _verdict(r: dict[str, Any]) -> str:
    """Episodes passing MLPerf's p99 criterion, ``k/n`` with ✗ when some episode fails
    (the mark of :mod:`eval.tables`); ``–`` for cached episodes without the verdict."""
    share, n = float(r.get("mlperf_p99_pass_share", float("nan"))), int(r["episodes"])
    if not np.isfinite(share):
        return "–"
    k = int(round(share * n))
    return f"{k}/{n} " + ("✓" if k == n else "✗")


def markdown_table(summary: dict[str, dict[str, Any]], policies: Sequence[str]) -> str:
    """The results table (one block of rows per scenario) plus the learned-vs-MILP ratios."""
    lines = [
        "| scenario | policy | carbon reduction vs rr (%) mean [min, max] | SLO violation rate (per request) | MLPerf p99 pass (episodes) | decision time per step (ms) mean / p95 |",
        "|---|---|---|---|---|---|",
    ]
    for scen, rows in summary.items():
        for p in policies:
            r = rows.get(p)
            if r is None:
                continue
            lines.append(
                f"| {scen} | {LABELS.get(p, p)} | {r['reduction_pct']:.1f} [{r['reduction_min']:.1f}, {r['reduction_max']:.1f}] "
                f"| {100 * r['violation_rate']:.2f}% | {_verdict(r)} | {1e3 * r['decision_s_mean']:.2f} / {1e3 * r['decision_s_p95']:.2f} |"
            )
    lines += ["", "| scenario | learned reduction / MILP reduction | learned violation - MILP violation (pp) | MILP decision time / learned |",
              "|---|---|---|---|"]
    for scen, rows in summary.items():
        a, b = rows.get("learned"), rows.get("facility-milp")
        if not a or not b:
            continue
        share = a["reduction_pct"] / b["reduction_pct"] if abs(b["reduction_pct"]) > 1e-9 else float("nan")
        lines.append(f"| {scen} | {100 * share:.0f}% | {100 * (a['violation_rate'] - b['violation_rate']):+.2f} | "
                     f"{b['decision_s_mean'] / a['decision_s_mean']:.0f}x |")
    return "\n".join(lines)


def run_evaluation(*, checkpoint: str | None, scenarios: Sequence[str], baselines: Sequence[str], days: int,
                   duration_s: float, max_pending: int | None, out_md: str | None, out_json: str | None,
                   cache_json: str | None = "runs/train/eval_cache.json", learned: bool = True,
                   mode: str | None = None, skip_days: int = 0, trust: bool = False,
                   log: Any = print) -> dict[str, Any]:
    """Run the comparison and write the Markdown table (``out_md``) and raw JSON (``out_json``).

    The episodes are the held-out starts ``skip_days .. skip_days + days - 1`` of
    :func:`train.envs.heldout_starts` (world seed ``1000 + index``): ``skip_days`` leaves out
    starts already used, so that a later check runs on days nobody has looked at. ``trust``
    admits an SB3 ``checkpoint`` (checked before any episode runs, as is a set-policy one:
    :func:`train.checkpoint.read_set_checkpoint`)."""
    warnings.simplefilter("ignore", UserWarning)
    if learned and checkpoint:
        from .checkpoint import checkpoint_format, network_from_checkpoint, read_set_checkpoint, require_trust

        require_trust(checkpoint, trust)
        if checkpoint_format(checkpoint) == "set":  # a malformed one is refused before any episode runs
            network_from_checkpoint(read_set_checkpoint(checkpoint))
    base = [policy_key(b) for b in baselines]
    if REFERENCE not in base:
        base.insert(0, REFERENCE)
    policies = base + (["learned"] if learned else [])
    if int(skip_days) < 0:
        raise ConfigError("skip_days", f"must be >= 0, got {skip_days!r}")
    starts = heldout_starts(int(days) + int(skip_days))[int(skip_days):]
    cache: dict[str, Any] = {}
    if cache_json and Path(cache_json).exists():
        cache = json.loads(Path(cache_json).read_text())
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for scen in scenarios:
        overrides: dict[str, Any] = {"duration_s": float(duration_s)}
        if max_pending:
            overrides["env.max_pending"] = int(max_pending)
        results[scen] = {}
        for i, start in enumerate(starts, start=int(skip_days)):
            key = f"{start}|seed={1000 + i}"
            per = results[scen].setdefault(key, {})
            for p in policies:
                ck = f"{scen}|{key}|{p}|{duration_s}|{max_pending}"
                if p != "learned" and ck in cache:
                    per[p] = cache[ck]
                    continue
                per[p] = evaluate_episode(p, scen, start, 1000 + i, overrides, checkpoint, mode, trust)
                log(f"{scen} {start} {p}: carbon {per[p]['carbon_g']:.1f} g, violations {per[p]['violation_rate']:.4f}, "
                    f"decision {1e3 * per[p]['decision_s_mean']:.2f} ms ({per[p]['wall_s']:.0f} s)")
                if p != "learned":
                    cache[ck] = per[p]
                    if cache_json:
                        Path(cache_json).parent.mkdir(parents=True, exist_ok=True)
                        Path(cache_json).write_text(json.dumps(cache, indent=1))
    summary = summarise(results, policies)
    table = markdown_table(summary, policies)
    meta = {"checkpoint": str(checkpoint) if checkpoint else "shipped", "mode": mode, "scenarios": list(scenarios), "starts": starts,
            "skip_days": int(skip_days),
            "duration_s": duration_s, "max_pending": max_pending, "python": platform.python_version()}
    if out_md:
        Path(out_md).parent.mkdir(parents=True, exist_ok=True)
        Path(out_md).write_text(table + "\n")
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps({"meta": meta, "results": results, "summary": summary}, indent=1))
    log(table)
    return {"summary": summary, "results": results, "table": table, "meta": meta}


def paired_decision_times(scenario: str, *, checkpoint: str | None = None, other: str = "facility-milp",
                          steps: int = 30, start_utc: str | None = None, seed: int = 1000,
                          duration_s: float = 60.0, trust: bool = False) -> dict[str, Any]:
    """Decision wall time of the learned policy and of ``other`` on the *same* observations,
    timed alternately in one process (so machine load affects both alike). The learned policy
    drives the episode; ``other`` is only asked for its action. Returns per-policy mean / p50 /
    p95 wall seconds and the ratio of means; ``cpu`` holds the same statistics of the process
    CPU time of each call (insensitive to the process being descheduled on a busy machine), and
    ``cpu_ratio_mean`` their ratio of means."""
    import torch as th

    from .policy import SHIPPED_CHECKPOINT, LearnedPolicy

    th.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    env = make_episode_env(scenario, {"duration_s": float(duration_s)}, start_utc or heldout_starts(1)[0])
    learned = LearnedPolicy.load(checkpoint or SHIPPED_CHECKPOINT, seed=0, trust=trust)
    obs, info = env.reset(seed=seed)
    learned.reset(env)
    ref = _policy(other, env, None)
    reset_fn = getattr(ref, "reset", None)
    if callable(reset_fn):
        reset_fn(env)
    t_l, t_o, c_l, c_o = [], [], [], []
    for _ in range(int(steps)):
        c0, t0 = time.process_time(), time.perf_counter()
        ref.act(obs, info)
        t_o.append(time.perf_counter() - t0)
        c_o.append(time.process_time() - c0)
        c0, t0 = time.process_time(), time.perf_counter()
        action = learned.act(obs, info)
        t_l.append(time.perf_counter() - t0)
        c_l.append(time.process_time() - c0)
        obs, _, term, trunc, info = env.step(action)
        if term or trunc:
            break
    env.close()

    def stats(x: list[float]) -> dict[str, float]:
        a = np.asarray(x)
        return {"mean_s": float(a.mean()), "p50_s": float(np.median(a)), "p95_s": float(np.percentile(a, 95))}

    out = {"learned": stats(t_l), other: stats(t_o), "steps": len(t_l), "scenario": scenario,
           "cpu": {"learned": stats(c_l), other: stats(c_o)}}
    out["ratio_mean"] = out[other]["mean_s"] / out["learned"]["mean_s"]
    out["ratio_p50"] = out[other]["p50_s"] / out["learned"]["p50_s"]
    out["cpu_ratio_mean"] = out["cpu"][other]["mean_s"] / max(out["cpu"]["learned"]["mean_s"], 1e-9)
    return out
