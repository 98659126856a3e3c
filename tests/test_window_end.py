"""eval.window_end: what a measurement window carries out and in (synthetic run, by hand), and
the largest recorded window-end ages of a group of runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from eval.runner import BACKLOG_AGE_EDGES_S, largest_backlog_ages
from eval.window_end import window_end_shares


def test_shares_by_hand():
    # ten requests arriving at 0.5, 1.5, ..., 9.5 s, work 1..10; window [3, 9)
    arrival = np.arange(10) + 0.5
    work = np.arange(1.0, 11.0)
    decode = work / 2.0
    # completed: 0-5 and 7 (6 and 8 in flight at 9 s; 9 arrives after the window)
    done = np.array([0, 1, 2, 3, 4, 5, 7])
    done_s = np.array([1.0, 2.0, 3.5, 4.0, 5.0, 6.0, 8.5])
    first = np.array([0.8, 1.8, 3.2, 2.9, 4.0, 5.8, 8.0])
    x = window_end_shares(arrival, work, decode, done, done_s, first, (3.0, 9.0), backlog_end=2)
    inside = 4 + 5 + 6 + 7 + 8 + 9  # arrivals 3.5 ... 8.5
    assert x["window_arrivals"] == 6 and x["in_flight"] == 2
    assert x["largest_n_share"] == pytest.approx((9 + 8) / inside)  # the two largest window arrivals
    assert x["in_flight_share"] == pytest.approx((7 + 9) / inside)  # requests 6 and 8
    assert (x["in_flight_age_p50_s"], x["in_flight_age_max_s"]) == pytest.approx((1.5, 2.5))
    # carried in: arrived before 3 s, finished after it: request 2 (first token 3.2 s: decoded in the window)
    assert (x["carry_in"], x["carry_in_full"]) == (1, 1)
    assert x["carry_in_share"] == pytest.approx(3 / inside) and x["carry_in_full_decode_share"] == pytest.approx(1.5 / inside)


def test_largest_ages_of_a_group():
    cols = {f"backlog_end_age_gt_{e:g}s": [float(i), float(i + 1)] for i, e in enumerate(BACKLOG_AGE_EDGES_S)}
    got = largest_backlog_ages(pd.DataFrame(cols))
    assert got == {float(e): float(i + 1) for i, e in enumerate(BACKLOG_AGE_EDGES_S)}
    assert largest_backlog_ages(pd.DataFrame({"backlog_end": [3]})) is None  # runs from before the figures
    cols["backlog_end_age_gt_1s"][0] = float("nan")
    assert largest_backlog_ages(pd.DataFrame(cols)) is None
