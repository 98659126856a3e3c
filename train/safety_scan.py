"""Scan the learned policy's inference-time safety knobs on the validation episodes.

Usage (one process; about 3-8 s per episode)::

    python -m train.safety_scan [--checkpoint PATH [--trust-checkpoint]] "headroom_margin=0.6;headroom_penalty=V" 10,20,30 [EPISODES]

The first argument names the knobs (``train.fast.SAFETY_KNOBS``); ``V`` takes each value of the
second argument (``"neutral"`` with values ``0``: the network alone). ``--checkpoint`` scans another
checkpoint than the shipped one (its recorded knobs are overridden by the scanned ones, the others
set to neutral; ``--trust-checkpoint`` admits an SB3 .zip, see :mod:`train.checkpoint`). ``EPISODES`` (comma-separated keys; default: the six below; ``all``: also the two
extra days of :data:`EXTRA`) picks validation episodes:
low / moderate / high load on the DAgger config's two validation days (2023-06-13 07:13 and
2023-01-28 16:23 UTC, world seed 12345, 60 s), never the test days of ``carbon-gym train
evaluate``. Round-robin and facility-MILP references come from ``train/curves/safety_scan.json``
(``validation_refs``). Prints, per setting and episode, the share of the MILP's reduction vs
round-robin and the violation rate minus the MILP's (pp); then, per setting and load, the means
over the episodes scanned (share of the mean reductions, mean violation difference) and at how
many loads both targets are met (share >= 80%, violations <= the MILP's).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

_D2 = "2023-01-28T16:23:00Z"
EPISODES = {"llama8b-low": ("llama8b-low", "2023-06-13T07:13:00Z"), "llama8b-moderate": ("llama8b-moderate", "2023-06-13T07:13:00Z"),
            "llama8b-high": ("llama8b-high", "2023-06-13T07:13:00Z"), f"llama8b-low@{_D2}": ("llama8b-low", _D2),
            f"llama8b-moderate@{_D2}": ("llama8b-moderate", _D2), f"llama8b-high@{_D2}": ("llama8b-high", _D2)}
#: Two more validation days (the next starts of the same sequence; not test days).
EXTRA = {f"{s}@{d}": (s, d) for d in ("2023-09-09T01:33:00Z", "2023-04-22T10:43:00Z")
         for s in ("llama8b-low", "llama8b-moderate", "llama8b-high")}
REFS = Path(__file__).resolve().parent / "curves" / "safety_scan.json"


def main(argv: list[str]) -> int:
    """Run the scan of ``argv`` (see the module docstring); returns the exit status."""
    import torch

    from .imitate import validation_episode
    from .policy import SHIPPED_CHECKPOINT, LearnedPolicy
    from .rank_candidates import meets_targets

    torch.set_num_threads(1)
    checkpoint = SHIPPED_CHECKPOINT
    if argv[:1] == ["--checkpoint"]:
        checkpoint, argv = Path(argv[1]), argv[2:]
    trust = argv[:1] == ["--trust-checkpoint"]
    argv = argv[1:] if trust else argv
    refs = json.loads(REFS.read_text())["validation_refs"]
    spec, values = argv[0], [float(v) for v in argv[1].split(",")]
    keys = argv[2].split(",") if len(argv) > 2 else list(EPISODES)
    if keys == ["all"]:
        keys = list(EPISODES) + list(EXTRA)
    neutral = {"load_price": 0.0, "headroom_penalty": 0.0, "headroom_margin": 0.0}
    for v in values:
        kw = dict(neutral)
        if spec != "neutral":
            kw.update({a: (v if b == "V" else float(b)) for a, b in (x.split("=") for x in spec.split(";"))})
        pol = LearnedPolicy.load(checkpoint, trust=trust, **kw)
        per_load: dict[str, list[tuple[float, float, float]]] = {}
        for k in keys:
            scen, start = {**EPISODES, **EXTRA}[k]
            t = time.perf_counter()
            m = validation_episode(pol, scen, {"duration_s": 60}, start, 12345)
            rr, milp = refs[k]["rr"], refs[k]["milp"]
            red = 100.0 * (1.0 - m["carbon_g"] / rr["carbon_g"])
            share = red / (100.0 * (1.0 - milp["carbon_g"] / rr["carbon_g"]))
            dv = 100.0 * (m["violation_rate"] - milp["violation_rate"])
            print(f"{kw} {k}: reduction {red:.2f}% ({100 * share:.0f}% of the MILP's), violations {100 * m['violation_rate']:.2f}% "
                  f"({dv:+.2f} pp vs the MILP) [{time.perf_counter() - t:.0f} s]", flush=True)
            milp_red = 100.0 * (1.0 - milp["carbon_g"] / rr["carbon_g"])
            per_load.setdefault(scen, []).append((red, milp_red, dv))
        met = 0
        shares = []
        for scen, rows in per_load.items():
            red_m = sum(r[0] for r in rows) / len(rows)
            milp_m = sum(r[1] for r in rows) / len(rows)
            dv_m = sum(r[2] for r in rows) / len(rows)
            share_m = red_m / milp_m if milp_m else float("nan")
            shares.append(share_m)
            ok = meets_targets(share_m, dv_m)
            met += ok
            print(f"{kw} {scen} mean over {len(rows)}: {100 * share_m:.0f}% of the MILP's reduction ({red_m:.2f}% vs {milp_m:.2f}%), "
                  f"violations {dv_m:+.2f} pp vs the MILP{' (both targets met)' if ok else ''}", flush=True)
        print(f"{kw} SUMMARY: both targets met at {met} of {len(per_load)} loads, minimum share {100 * min(shares):.0f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
