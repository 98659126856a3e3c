"""The study run's seeds for the learned agent start on days it never saw (eval/heldout_seeds.py)."""

from datetime import datetime

from eval.heldout_seeds import USED_HELDOUT_STARTS, fresh_heldout_seeds
from eval.runner import SECONDS_PER_DAY, episode_start_offset_s
from train.envs import heldout_starts


def test_fresh_seeds_start_on_unseen_heldout_days():
    seeds = fresh_heldout_seeds("llama8b-moderate", 8)
    assert seeds == [23, 46, 59, 69, 75, 85, 91, 92]  # the list eval/study_1h.sh passes
    spent = {datetime.fromisoformat(s.replace("Z", "+00:00")).timetuple().tm_yday for s in heldout_starts(USED_HELDOUT_STARTS)}
    days = [int(episode_start_offset_s("llama8b-moderate", k) // SECONDS_PER_DAY) + 1 for k in seeds]
    assert all(d % 4 == 0 and d not in spent for d in days)
    # every seed skipped below the last one is a training day or a spent held-out day
    skipped = set(range(seeds[-1])) - set(seeds)
    for k in skipped:
        d = int(episode_start_offset_s("llama8b-moderate", k) // SECONDS_PER_DAY) + 1
        assert d % 4 != 0 or d in spent
