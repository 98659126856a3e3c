"""Benchmark: GeoServeEnv steps per wall-clock second with the round-robin policy.

Runs (a) the ``dev`` scenario (whole episodes, resets included) and (b) a moderate-load paper
scenario (default ``llama8b-moderate``, 512 GPUs, about a thousand requests per step) for a few
steps, and prints for each: steps/s (wall and per CPU second; the CPU figure is the one to trust
on a shared machine), simulated requests/s, and - from a second, instrumented run, so that the
timers do not slow the headline figures - the share of the step time spent in the simulator's
methods (``advance_to`` / ``submit_batch`` / ``snapshot_rows`` / ``carbon_energy_totals`` /
``pop_completed`` / ``totals``) versus the env's own work (observation, masks, bookkeeping) and the policy.

The first line says whether the simulator's engine and datacenter modules run compiled (mypyc,
built by ``pip install``) or as pure Python (``CARBON_GYM_PURE_PYTHON=1`` forces the latter, for a
comparison).

Usage::

    python eval/bench_env.py [--dev-steps 3000] [--repeats 5] [--paper-steps 20] [--paper-repeats 3]
                             [--paper-scenario llama8b-moderate] [--paper-only]

The dev run is repeated ``--repeats`` times (the shared machine's speed drifts by up to 30%
between runs minutes apart); the headline is the median run, and the sorted rates are printed.
The paper run is repeated ``--paper-repeats`` times; its figures are per CPU second of the
process (what one core gives, whatever else the machine runs), from the median run:

* ``paper_env_steps_per_s=``: env steps per CPU second;
* ``paper_us_per_request=``: CPU microseconds per request placed (env, policy and simulator);
* ``paper_us_per_event=``: CPU microseconds per simulator event (``Simulator.events_processed``).

The last line is ``env_steps_per_s=<median dev figure>`` (wall clock; left out with ``--paper-only``).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import gymnasium as gym

import carbon_gym  # noqa: F401  (registers the envs)
import carbon_gym.sim
from carbon_gym.policy import RoundRobinPolicy
from eval.cli import UsageError, parse_assignments

# the simulator methods the env calls (calls inside the simulator are not intercepted: nothing is
# counted twice)
SIM_METHODS = ("advance_to", "submit_batch", "snapshot_rows", "snapshot_array", "carbon_energy_totals",
               "pop_completed", "totals")


class _TimedSimulator:
    """Stands in for an env's simulator (bench only): times the calls of :data:`SIM_METHODS` and
    forwards every other attribute. (A stand-in rather than patched methods: the simulator may be
    compiled, and compiled instances take no new attributes.)"""

    def __init__(self, sim: Any, seconds: dict[str, float]) -> None:
        self._sim = sim
        self._seconds = seconds
        for name in SIM_METHODS:
            setattr(self, name, self._timed(getattr(sim, name), name))

    def _timed(self, fn: Any, name: str) -> Any:
        seconds = self._seconds

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - t0

        return timed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sim, name)


class _SimTimer:
    """Accumulates the wall time of the simulator's methods called by an env (bench only)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def install(self, env: Any) -> None:
        """Time the simulator calls of ``env`` (call again after each reset: a new simulator)."""
        base = env.unwrapped
        base._sim = _TimedSimulator(base._sim, self.seconds)


def bench(env_id: str, steps: int, overrides: dict[str, Any] | None = None, seed: int = 0,
          profile: bool = True) -> dict[str, float]:
    """Step ``env_id`` with round-robin for ``steps`` steps (resetting at episode ends)."""
    env = gym.make(env_id, overrides=overrides or {})
    policy = RoundRobinPolicy()
    timer = _SimTimer()
    done_steps = 0
    requests = 0
    events = 0
    act_s = 0.0
    reset_s = 0.0
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    episode = 0
    while done_steps < steps:
        if episode:
            events += env.unwrapped._sim.events_processed
        t0 = time.perf_counter()
        obs, info = env.reset(seed=seed + episode)
        reset_s += time.perf_counter() - t0
        if profile:
            timer.install(env)
        policy.reset(env)
        episode += 1
        while done_steps < steps:
            t0 = time.perf_counter()
            action = policy.act(obs, info)
            act_s += time.perf_counter() - t0
            obs, _, _, trunc, info = env.step(action)
            done_steps += 1
            requests += info["placed"]
            if trunc:
                break
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - cpu_start
    events += env.unwrapped._sim.events_processed
    sim_s = sum(timer.seconds.values())
    out = {
        "steps": done_steps,
        "episodes": episode,
        "wall_s": wall,
        "steps_per_s": done_steps / wall,
        "cpu_s": cpu,
        "steps_per_cpu_s": done_steps / cpu,
        "requests_per_s": requests / wall,
        "requests_per_step": requests / done_steps,
        "events": events,
        "us_per_request": cpu / max(requests, 1) * 1e6,
        "us_per_event": cpu / max(events, 1) * 1e6,
        "sim_share": sim_s / wall if profile else float("nan"),
        "policy_share": act_s / wall,
        "reset_share": reset_s / wall,
    }
    for name in SIM_METHODS:
        out[f"{name}_us_per_step"] = timer.seconds[name] / done_steps * 1e6
    env.close()
    return out


def _print(label: str, r: dict[str, float], p: dict[str, float] | None) -> None:
    """Headline figures of the plain run ``r``; time shares from the instrumented run ``p``."""
    print(f"{label}: {r['steps']} steps ({r['episodes']} episodes) in {r['wall_s']:.2f} s -> "
          f"{r['steps_per_s']:.0f} steps/s ({r['steps_per_cpu_s']:.0f} per CPU second), "
          f"{r['requests_per_s']:.0f} requests/s "
          f"({r['requests_per_step']:.1f} placed per step)")
    if p is None:
        return
    env_share = 1.0 - p["sim_share"] - p["policy_share"] - p["reset_share"]
    parts = ", ".join(f"{n} {p[f'{n}_us_per_step']:.0f} us" for n in SIM_METHODS if p[f"{n}_us_per_step"] > 0)
    print(f"  time shares (instrumented run): simulator methods {p['sim_share']:.0%} ({parts} per step), "
          f"reset (new simulator + workload) {p['reset_share']:.0%}, env's own work {env_share:.0%} "
          f"({env_share * p['wall_s'] / p['steps'] * 1e6:.0f} us per step), "
          f"round-robin policy {p['policy_share']:.0%}")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the figures (``paper_env_steps_per_s=``, ``paper_us_per_request=``,
    ``paper_us_per_event=``, and last ``env_steps_per_s=<dev>``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dev-steps", type=int, default=3000)
    ap.add_argument("--paper-steps", type=int, default=20)
    ap.add_argument("--paper-scenario", default="llama8b-moderate")
    ap.add_argument("--paper-repeats", type=int, default=3,
                    help="timed paper runs (the median, by steps per CPU second, is reported)")
    ap.add_argument("--paper-only", action="store_true", help="skip the dev runs")
    ap.add_argument("--no-profile", action="store_true",
                    help="skip the instrumented second run (time shares of the simulator's methods)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed dev runs (the shared machine's speed drifts between runs: the median is reported)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="scenario override for both runs, e.g. --set capacity.control=reactive (repeatable)")
    args = ap.parse_args(argv)
    profile = not args.no_profile
    try:
        extra: dict[str, Any] = parse_assignments(args.set, "--set")  # (as `carbon-gym experiment --set`)
    except UsageError as e:
        ap.error(str(e))
    impl = carbon_gym.sim.IMPLEMENTATION
    print(f"simulator modules ({', '.join(m for m in impl if m != 'reason')}): {impl['engine']} ({impl['reason']})")
    dev: dict[str, float] | None = None
    if not args.paper_only:
        # Warm-up (data loading, predictor fitting, imports) outside the timed runs.
        bench("carbon_gym/GeoServe-dev-v0", 10, extra, profile=False)
        runs = sorted((bench("carbon_gym/GeoServe-dev-v0", args.dev_steps, extra, profile=False)
                       for _ in range(max(args.repeats, 1))), key=lambda r: r["steps_per_s"])
        dev = runs[len(runs) // 2]  # the median run (the middle one of an odd count)
        dev_p = bench("carbon_gym/GeoServe-dev-v0", args.dev_steps, extra, profile=True) if profile else None
        _print("dev (median run)", dev, dev_p)
        if len(runs) > 1:
            rates = ", ".join(f"{r['steps_per_s']:.0f}" for r in runs)
            print(f"  {len(runs)} timed dev runs, steps/s sorted: {rates} (min {runs[0]['steps_per_s']:.0f}, "
                  f"median {dev['steps_per_s']:.0f}, max {runs[-1]['steps_per_s']:.0f})")
    if args.paper_steps > 0:
        env_id = carbon_gym.env_id_for_scenario(args.paper_scenario)
        ov = {**extra, "duration_s": float(args.paper_steps)}
        bench(env_id, 1, ov, profile=False)
        papers = sorted((bench(env_id, args.paper_steps, ov, profile=False)
                         for _ in range(max(args.paper_repeats, 1))), key=lambda r: r["steps_per_cpu_s"])
        paper = papers[len(papers) // 2]
        paper_p = bench(env_id, args.paper_steps, ov, profile=True) if profile else None
        _print(args.paper_scenario, paper, paper_p)
        print(f"  per CPU second (median of {len(papers)} runs): {paper['steps_per_cpu_s']:.1f} steps/s, "
              f"{paper['us_per_request']:.2f} us per request, {paper['us_per_event']:.3f} us per event "
              f"({paper['events'] / max(paper['requests_per_step'] * paper['steps'], 1):.2f} events per request)")
        print(f"paper_env_steps_per_s={paper['steps_per_cpu_s']:.1f}")
        print(f"paper_us_per_request={paper['us_per_request']:.2f}")
        print(f"paper_us_per_event={paper['us_per_event']:.3f}")
    if dev is not None:
        print(f"env_steps_per_s={dev['steps_per_s']:.0f}")


if __name__ == "__main__":
    main()
