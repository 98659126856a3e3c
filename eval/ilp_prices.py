"""``python -m eval.ilp_prices SCENARIO``: what the state-aware per-request ILP charges at each
datacenter, after it has run the scenario for a while.

Runs ``ilp-state`` on ``SCENARIO`` (seed, polling period and seconds as given) and, at the last
step, prints per datacenter (greenest first) what its program sees for the longest-waiting
pending request: the intensity (g/kWh), the simulator's TPOT estimate (ms) and the prefill share
of iteration time it implies (``1 - decode iteration / TPOT``), the request's estimated prefill
and decode energy (J: the independent-cost energy of :mod:`solvers.per_request`, the decode part
``tp (P_dec(1) - P_idle) x output x TPOT``, so proportional to the datacenter's TPOT) and its
price (g). It shows why ``ilp-state`` keeps load on every datacenter where TPOT rises steeply
with load (RESULTS.md, "Batching-aware facility pricing vs per-request pricing on Mixtral").

    python -m eval.ilp_prices mixtral8x7b-moderate --seconds 40
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any, Sequence

import numpy as np

__all__ = ["ilp_prices", "main"]


def ilp_prices(scenario: str, *, seed: int = 0, polling_period_s: float = 0.1, seconds: float = 40.0) -> dict[str, Any]:
    """The per-datacenter figures of the module docstring (arrays, greenest first) after
    ``seconds`` of ``ilp-state`` on ``scenario`` (world seed ``seed``)."""
    from carbon_gym.registry import make_policy
    from eval.runner import RunSpec, make_env, resolve_run_scenario
    from solvers.per_request import per_request_costs

    spec = RunSpec(scenario, "ilp-state", int(seed), overrides=(("duration_s", float(seconds) + 10.0), ("polling_period_s", float(polling_period_s))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc, _ = resolve_run_scenario(spec)
        env = make_env(sc)
    pol = make_policy("ilp-state", env)
    obs, info = env.reset(seed=int(seed))
    pol.reset(env)
    steps = max(1, int(round(float(seconds) / float(polling_period_s))))
    for _ in range(steps):
        obs, _, _, _, info = env.step(pol.act(obs, info))
    p = pol.problem_of(env.unwrapped.state())
    if p.n_requests == 0:
        raise RuntimeError(f"no pending request at {seconds} s")
    r = int(np.argmax(p.waited_s))
    pre_s = p.prefill_tokens_of(r) * p.prefill_s_per_token
    e_pre = p.tp * (p.gpu_prefill_w - p.gpu_idle_w) * pre_s
    e_dec = p.tp * (p.decode_power_w(1.0) - p.gpu_idle_w) * p.output_tokens[r] * p.tpot_now_s
    price = per_request_costs(p, r, p.est_queue_wait_s, p.tpot_now_s, 1.0)
    o = np.lexsort((np.arange(p.n_datacenters), p.pue, p.carbon_g_per_kwh))
    return {"datacenter": o, "intensity_g_per_kwh": p.carbon_g_per_kwh[o], "tpot_now_ms": 1e3 * p.tpot_now_s[o],
            "prefill_share_now": p.prefill_share_now[o], "prefill_j": np.broadcast_to(e_pre, o.shape)[o],
            "decode_j": e_dec[o], "price_g": price[o]}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.ilp_prices", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", help="scenario name, e.g. mixtral8x7b-moderate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--polling-period", type=float, default=0.1, help="seconds (default 0.1)")
    ap.add_argument("--seconds", type=float, default=40.0, help="simulated seconds of ilp-state before the snapshot (default 40)")
    a = ap.parse_args(argv)
    from carbon_gym.errors import ConfigError

    try:
        t = ilp_prices(a.scenario, seed=a.seed, polling_period_s=a.polling_period, seconds=a.seconds)
    except (ConfigError, RuntimeError) as exc:
        print(f"python -m eval.ilp_prices: error: {exc}", file=sys.stderr)
        return 2
    print("datacenter intensity_g_per_kwh tpot_now_ms prefill_share_now prefill_j decode_j price_g")
    for i in range(len(t["datacenter"])):
        print(f"{t['datacenter'][i]:3d} {t['intensity_g_per_kwh'][i]:7.0f} {t['tpot_now_ms'][i]:7.1f} {t['prefill_share_now'][i]:5.2f} "
              f"{t['prefill_j'][i]:7.0f} {t['decode_j'][i]:7.0f} {t['price_g'][i]:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
