"""The per-request figures sample long runs instead of pooling every record (issue 21: the
headline's figures ran out of memory pooling 10 M records)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from eval import figures


def test_figure_sample_is_uniform_ordered_and_deterministic(monkeypatch):
    monkeypatch.setattr(figures, "FIGURE_SAMPLE_PER_RUN", 1000)
    n = 10_000
    frame = pd.DataFrame({"arrival_s": np.arange(n, dtype=float), "datacenter": np.arange(n) % 4,
                          "ttft_s": np.linspace(0.0, 1.0, n)})
    small = frame.iloc[:1000]
    assert figures._figure_sample(small, 0) is small  # at the limit: every record, untouched
    a, b, c = (figures._figure_sample(frame, s) for s in (3, 3, 4))
    assert len(a) == 1000 and list(a.index) == list(range(1000))
    assert a.equals(b) and not a.equals(c)  # deterministic in the seed
    assert np.all(np.diff(a["arrival_s"].to_numpy()) > 0)  # original order, no repeats
    assert set(a["arrival_s"]).issubset(set(frame["arrival_s"]))
    # uniform: each datacenter keeps about its share, the mean TTFT about the population's
    shares = np.bincount(a["datacenter"].to_numpy(), minlength=4) / 1000
    assert np.all(np.abs(shares - 0.25) < 0.05)
    assert abs(a["ttft_s"].mean() - 0.5) < 0.03
