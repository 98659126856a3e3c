"""Seeds whose episode start falls on a day the shipped learned agent never saw.

The experiments spread episode starts over the carbon year by seed
(:func:`eval.runner.episode_start_offset_s`); the learned agent trains on every day except each
``every``-th (:func:`train.envs.is_heldout_day`), and its knob was selected, then tested, on the
held-out starts ``0 .. used - 1`` of :func:`train.envs.heldout_starts`. A study run that reports
the learned agent beside the schedulers uses, for every policy, the first ``n`` seeds whose start
is on a held-out day that none of those starts touched, so no reported episode was seen in
training, selection or an earlier test::

    python -m eval.heldout_seeds --scenario llama8b-moderate --n 8
    # 23,46,59,69,75,85,91,92

The seeds are a property of the scenario name (the start is hashed from it), so each scenario
has its own list.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Sequence

from eval.runner import SECONDS_PER_DAY, episode_start_offset_s
from train.envs import heldout_starts, is_heldout_day

#: Held-out starts already spent by the shipped agent: 45 for knob selection, 20 for its test.
USED_HELDOUT_STARTS = 65


def fresh_heldout_seeds(scenario: str, n: int, *, every: int = 4, used: int = USED_HELDOUT_STARTS,
                        max_seed: int = 100_000) -> list[int]:
    """The first ``n`` seeds >= 0 whose start (day of year, 1-based) for ``scenario`` is a
    held-out day (``day % every == 0``) not touched by the first ``used`` held-out starts."""
    spent = {datetime.fromisoformat(s.replace("Z", "+00:00")).timetuple().tm_yday for s in heldout_starts(used, every)}
    out: list[int] = []
    for seed in range(max_seed):
        day = int(episode_start_offset_s(scenario, seed) // SECONDS_PER_DAY) + 1
        if is_heldout_day(day, every) and day not in spent:
            out.append(seed)
            if len(out) == n:
                return out
    raise ValueError(f"only {len(out)} fresh held-out seeds below {max_seed} for {scenario!r}")


def training_seeds(scenario: str, n: int, *, every: int = 4, max_seed: int = 100_000) -> list[int]:
    """The first ``n`` seeds >= 0 whose start for ``scenario`` is on a training day (not a held-out
    day): where a scheduler's knobs (margins, budgets) are chosen, never on the reported starts."""
    out = [seed for seed in range(max_seed)
           if not is_heldout_day(int(episode_start_offset_s(scenario, seed) // SECONDS_PER_DAY) + 1, every)][:n]
    if len(out) < n:
        raise ValueError(f"only {len(out)} training seeds below {max_seed} for {scenario!r}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.heldout_seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="llama8b-moderate")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--used", type=int, default=USED_HELDOUT_STARTS, help="held-out starts already spent")
    ap.add_argument("--training", action="store_true",
                    help="list training-day seeds instead (where knobs are chosen), not held-out ones")
    a = ap.parse_args(argv)
    if a.training:
        print(",".join(map(str, training_seeds(a.scenario, a.n))))
        return 0
    print(",".join(map(str, fresh_heldout_seeds(a.scenario, a.n, used=a.used))))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
