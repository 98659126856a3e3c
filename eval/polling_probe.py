"""Why the facility MILP's reduction depends on the polling period: per-step diagnostics.

Runs round-robin and the MILP on one scenario at several polling periods (the full preset's
window, the same starts as experiment d) and, at every step of the measurement window, compiles
the facility program the MILP sees from the env's state (:func:`solvers.facility_model.compile_facility`;
an observer: the episode is the same as without it) and records what bounds its placement:

- ``floor %``: steps whose fleet prompt-token budget cannot hold the step's new prompts, so the
  overload floor spreads them in proportion to capacity (``FacilityConfig.overload_spread``);
- ``theta binds %``: datacenter-steps (up, cleanest half by the step's grid intensity) whose own
  budget is the added-wait budget ``theta_d / beta_d`` rather than the prefill cap;
- ``clean left %``: at the cleanest half of the datacenters, the prompt tokens the step may still
  send (own budget) as a share of the per-period prefill cap ``Q0_d`` (median over steps);
- ``clean backlog %``: their backlog (queued + in transit) as a share of ``Q0_d`` (median);

and from the completed requests: ``uplink (ms)`` (mean placement-to-datacenter delay),
``queue (ms)`` (mean engine-queue wait) and ``active g/kWh`` (carbon over active energy of the
requests: how clean the datacenters that did the work were). ``vs rr %`` is the run's carbon
reduction against round-robin at the same period and start::

    python -m eval.polling_probe --scenario llama8b-moderate --periods 0.1,0.5,1,2 --seeds 23,46
    python -m eval.polling_probe --periods 0.1 --seeds 23,46 --milp-arg prefill_horizon_s=1

``--milp-arg KEY=VALUE`` (a :class:`~solvers.facility_model.FacilityConfig` field) sets the MILP's
setting and the probe's alike.
It prints a markdown table (one row per period and policy, means over the seeds) and its wall
and CPU time.
"""

from __future__ import annotations

import argparse
import ast
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Sequence

import numpy as np

from carbon_gym.policy import EpisodeObserver
from eval.experiments import preset_overrides
from eval.runner import OVERRIDE_POLLING, RunSpec, make_specs, run_one, window_of
from eval.tables import REFERENCE_POLICY
from solvers.facility import FacilityMILP
from solvers.facility_model import FacilityConfig, compile_facility

__all__ = ["ProgramProbe", "probe_run", "main"]


class ProgramProbe(EpisodeObserver):
    """Compiles the MILP's program at every step from ``window_start_s`` on and keeps the
    figures of the module docstring (read-only: builds its own problem from the state)."""

    def __init__(self, window_start_s: float, config: FacilityConfig | None = None) -> None:
        self.window_start_s = float(window_start_s)
        self.config = config or FacilityConfig()
        self.rows: dict[str, list[float]] = {"floor": [], "theta_binds": [], "clean_left": [], "clean_backlog": []}

    def on_reset(self, env: Any, observation: Any, info: dict[str, Any]) -> None:
        self._sched = FacilityMILP(env, self.config)

    def before_step(self, env: Any, step: int) -> None:
        state = env.unwrapped.state()
        if float(state.time_s) < self.window_start_s:
            return
        p = self._sched.problem_of(state)
        if p.n_requests == 0:
            return
        cfg = self._sched.config  # (its operating point resolved for this env)
        data = compile_facility(p, cfg)
        q0 = p.prefill_rate_cap_tokens(cfg.prefill_share)
        own_theta = data.theta / np.maximum(data.beta, 1e-300)
        own = np.minimum(own_theta, data.prefill_cap)
        up = np.flatnonzero(p.up)
        clean = up[np.argsort(p.carbon_g_per_kwh[up], kind="stable")[: max(1, up.size // 2)]]
        r = self.rows
        r["floor"].append(float(data.floor_tok.sum() > 0))
        r["theta_binds"].append(float(np.mean(own_theta[clean] < data.prefill_cap[clean])))
        r["clean_left"].append(float(own[clean].sum() / max(q0[clean].sum(), 1e-12)))
        r["clean_backlog"].append(float(p.backlog_prompt_tokens[clean].sum() / max(q0[clean].sum(), 1e-12)))


def probe_run(spec: RunSpec) -> dict[str, Any]:
    """One run of ``spec`` with a :class:`ProgramProbe` (compiling with the MILP settings of
    ``spec.policy_kwargs`` when it has them): its carbon and the probe's figures."""
    start_s, _ = window_of(dict(spec.overrides))
    kw = dict(spec.policy_kwargs)
    probe = ProgramProbe(start_s, FacilityConfig(**kw) if kw else None)
    res = run_one(spec, observers=[probe])
    q = res.requests
    keep = q["arrival_s"] >= start_s
    e_j = float(q["energy_j"][keep].sum())

    def over_steps(key: str, stat: Any) -> float:  # % of the window's steps (NaN: no step had requests)
        return 100.0 * float(stat(probe.rows[key])) if probe.rows[key] else float("nan")

    return {
        "period_s": float(dict(spec.overrides)[OVERRIDE_POLLING]), "policy": spec.policy, "seed": spec.seed,
        "carbon_g": float(res.metrics["carbon_g"]), "viol_pct": float(res.metrics["slo_violation_pct"]),
        "floor_pct": over_steps("floor", np.mean), "theta_binds_pct": over_steps("theta_binds", np.mean),
        "clean_left_pct": over_steps("clean_left", np.median), "clean_backlog_pct": over_steps("clean_backlog", np.median),
        "uplink_ms": 1e3 * float(np.mean((q["dc_arrival_s"] - q["sent_s"])[keep])),
        "queue_ms": 1e3 * float(np.mean((q["first_scheduled_s"] - q["dc_arrival_s"])[keep])),
        "active_g_per_kwh": float(q["carbon_g"][keep].sum()) / (e_j / 3.6e6) if e_j > 0 else float("nan"),
        "cpu_s": float(res.metrics["cpu_s"]),
    }


def probe_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of :func:`probe_run` rows: means over seeds per period and policy, the
    reduction paired by seed against rr at the same period."""
    rr = {(r["period_s"], r["seed"]): r["carbon_g"] for r in rows if r["policy"] == REFERENCE_POLICY}
    keys = sorted({(r["period_s"], r["policy"]) for r in rows})
    cols = ["floor_pct", "theta_binds_pct", "clean_left_pct", "clean_backlog_pct", "uplink_ms", "queue_ms", "active_g_per_kwh"]
    out = ["| polling (s) | policy | vs rr % | SLO viol. % | floor % | theta binds % | clean left % | clean backlog % "
           "| uplink (ms) | queue (ms) | active g/kWh |", "|" + "---|" * 11]
    for period, pol in keys:
        rs = [r for r in rows if r["period_s"] == period and r["policy"] == pol]
        red = [100.0 * (1.0 - r["carbon_g"] / rr[(period, r["seed"])]) for r in rs if (period, r["seed"]) in rr]
        vals = [float(np.mean([r[c] for r in rs])) for c in cols]
        out.append(f"| {period:g} | {pol} | {np.mean(red):.1f} | {np.mean([r['viol_pct'] for r in rs]):.2f} | "
                   + " | ".join(f"{v:.1f}" if i < 4 else f"{v:.0f}" for i, v in enumerate(vals)) + " |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.polling_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="llama8b-moderate")
    ap.add_argument("--periods", default="0.1,0.5,1,2", help="polling periods, seconds (comma-separated)")
    ap.add_argument("--seeds", default="23,46", help="episode seeds (comma-separated)")
    ap.add_argument("--policies", default="rr,milp", help="policies (the registry's names); rr is the reference")
    ap.add_argument("--milp-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="a FacilityConfig setting of the MILP (repeatable), e.g. prefill_horizon_s=1")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args(argv)
    periods = [float(x) for x in a.periods.split(",") if x.strip()]
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    pols = [x.strip() for x in a.policies.split(",") if x.strip()]
    milp_kw: dict[str, Any] = {}
    for item in a.milp_arg:
        key, sep, val = item.partition("=")
        if not sep or key not in FacilityConfig.__dataclass_fields__:
            ap.error(f"--milp-arg: expected KEY=VALUE with KEY a FacilityConfig field, got {item!r}")
        try:
            milp_kw[key] = ast.literal_eval(val)
        except (ValueError, SyntaxError):
            milp_kw[key] = val
    FacilityConfig(**milp_kw)  # a ConfigError names a bad value before any run
    specs = [s for p in periods
             for s in make_specs([a.scenario], pols, seeds, overrides={**preset_overrides("full", None, None), OVERRIDE_POLLING: p},
                                 policy_kwargs={"milp": milp_kw} if milp_kw else None)]
    wall0, t0 = time.perf_counter(), time.time()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=max(1, a.workers)) as ex:
        for i, row in enumerate(ex.map(probe_run, specs), 1):
            rows.append(row)
            print(f"[{i}/{len(specs)}] {row['policy']} @ {row['period_s']:g} s seed {row['seed']}: {row['cpu_s']:.0f} CPU-s", flush=True)
    print(f"\n{a.scenario}, full preset window, seeds {a.seeds}" + (f", MILP {milp_kw}" if milp_kw else "") + "\n")
    print(probe_table(rows))
    print(f"{len(specs)} runs, {(time.perf_counter() - wall0) / 60:.1f} min wall, "
          f"{sum(r['cpu_s'] for r in rows) / 60:.1f} CPU-min (started {time.strftime('%Y-%m-%d %H:%M', time.gmtime(t0))} UTC)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
