"""Output-length predictors (issue 3 / study: predictor instead of the true length)."""

from __future__ import annotations

import numpy as np
import pytest

from carbon_gym.errors import ConfigError
from carbon_gym.predict import (
    PREDICTORS,
    BinnedPredictor,
    OraclePredictor,
    evaluate_predictor,
    make_predictor,
    train_test_split,
)

# the held-out figures quoted in carbon_gym/predict.py's docstring
DOCUMENTED = {
    "azure-conv": (3873, 44.1, 0.46, 127.6),
    "azure-code": (1764, 17.9, 0.50, 17.9),
    "sharegpt": (6146, 220.0, 2.82, 221.4),
    "arxiv": (5651, 145.9, 0.75, 191.4),
}


@pytest.mark.parametrize("dataset", list(DOCUMENTED))
def test_held_out_accuracy_matches_docstring(dataset):
    n, mae, mape, base = DOCUMENTED[dataset]
    s = evaluate_predictor(dataset)
    assert s.n == n
    assert s.mae == pytest.approx(mae, abs=0.05)
    assert s.mape == pytest.approx(mape, abs=0.005)
    assert s.baseline_mae == pytest.approx(base, abs=0.05)
    assert s.mae <= s.baseline_mae + 0.1  # never meaningfully worse than a constant


def test_binned_beats_constant_where_prompt_length_is_informative():
    for dataset, gain in (("azure-conv", 0.5), ("arxiv", 0.15)):
        s = evaluate_predictor(dataset)
        assert s.mae < (1 - gain) * s.baseline_mae


def test_binned_recovers_a_known_step_function():
    rng = np.random.default_rng(0)
    p = rng.integers(1, 4096, 20_000)
    o = np.where(p < 512, 50, 400)  # output depends only on whether the prompt is short
    pred = BinnedPredictor(bins_per_octave=1, min_count=5).fit(p, o)
    assert pred.predict(np.array([100, 200, 1000, 3000])).tolist() == [50, 50, 400, 400]
    # the true output lengths are never read
    np.testing.assert_array_equal(pred.predict(np.array([100]), np.array([9999])), [50])


def test_empty_bins_fall_back_to_global_median():
    pred = BinnedPredictor(min_count=3).fit(np.array([10, 10, 10, 1000]), np.array([1, 2, 3, 500]))
    assert pred.global_value == 2.5
    assert pred.predict(np.array([10]))[0] == 2.0
    assert pred.predict(np.array([1000, 10**6]))[0] == 2.5  # 1 sample < min_count


def test_oracle_and_registry():
    assert set(PREDICTORS) == {"oracle", "binned"}
    o = make_predictor("oracle")
    assert isinstance(o, OraclePredictor)
    np.testing.assert_array_equal(o.predict(np.array([5, 6]), np.array([7, 8])), [7.0, 8.0])
    with pytest.raises(ConfigError, match="true output"):
        o.predict(np.array([5]))
    b = make_predictor("binned", dataset="azure-code")
    assert b.name == "binned" and b.predict(np.array([1000])).shape == (1,)
    with pytest.raises(ConfigError, match="env.predictor"):
        make_predictor("transformer")
    with pytest.raises(ConfigError):
        BinnedPredictor().predict(np.array([1]))


def test_split_is_a_partition():
    tr, te = train_test_split(1000, 0.2, seed=3)
    assert te.size == 200 and np.intersect1d(tr, te).size == 0 and np.union1d(tr, te).size == 1000
