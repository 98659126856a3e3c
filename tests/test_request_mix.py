"""eval.request_mix: per run and datacenter, the requests served after the burn-in, their share,
mean prompt / output tokens and p99 TPOT, from a matrix's per-request records (numbers by hand);
a matrix without records is refused naming ``dir``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from eval.request_mix import main, request_mix


def _matrix(tmp_path, with_records=True):
    d = tmp_path / "m"
    (d / "requests").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"runs": [{"run_id": "s__p__seed0", "overrides": {"env.warmup_s": 10.0}}]}))
    if with_records:
        pd.DataFrame({"datacenter": [0, 0, 1, 1, 1, 0], "arrival_s": [5.0, 11.0, 12.0, 13.0, 14.0, 20.0],
                      "prompt_tokens": [9999, 100, 300, 500, 700, 300], "output_tokens": [1, 10, 20, 30, 40, 30],
                      "tpot_s": [9.0, 0.01, 0.02, 0.03, np.nan, 0.05]}).to_parquet(d / "requests" / "s__p__seed0.parquet")
    return d


def test_request_mix_by_hand(tmp_path, capsys):
    t = request_mix(str(_matrix(tmp_path))).set_index("datacenter")
    # the request at 5 s is in the burn-in: dc0 keeps 2 (100 and 300 tokens), dc1 3
    assert t.loc[0, "requests"] == 2 and t.loc[1, "requests"] == 3
    assert t.loc[0, "share"] == pytest.approx(0.4) and t.loc[1, "share"] == pytest.approx(0.6)
    assert t.loc[0, "prompt_tokens_mean"] == pytest.approx(200.0) and t.loc[1, "output_tokens_mean"] == pytest.approx(30.0)
    assert t.loc[1, "tpot_p99_s"] == pytest.approx(np.percentile([0.02, 0.03], 99))  # (NaN TPOT left out)
    assert main([str(tmp_path / "m")]) == 0
    assert "s__p__seed0" in capsys.readouterr().out


def test_request_mix_needs_records(tmp_path, capsys):
    assert main([str(_matrix(tmp_path, with_records=False))]) == 2
    err = capsys.readouterr().err
    assert "dir: " in err and "without --no-requests" in err
    assert main([str(tmp_path / "nowhere")]) == 2
