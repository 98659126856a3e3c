"""eval.ilp_prices: the state-aware ILP's per-datacenter price of a request, after a short run."""

from __future__ import annotations

import numpy as np

from eval.ilp_prices import ilp_prices, main


def test_ilp_prices_dev(capsys):
    t = ilp_prices("dev", seed=0, polling_period_s=1.0, seconds=5.0)
    assert sorted(t["datacenter"].tolist()) == [0, 1]
    assert np.all(np.diff(t["intensity_g_per_kwh"]) >= 0)  # greenest first
    # the independent-cost decode energy is proportional to the datacenter's TPOT estimate
    ratio = t["decode_j"] / t["tpot_now_ms"]
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)
    assert np.all(t["decode_j"] > 0) and np.all(t["price_g"] > 0)
    assert np.all((t["prefill_share_now"] >= 0) & (t["prefill_share_now"] <= 0.95))
    assert main(["dev", "--polling-period", "1", "--seconds", "5"]) == 0
    assert "price_g" in capsys.readouterr().out
    assert main(["no-such-scenario", "--seconds", "1"]) == 2
