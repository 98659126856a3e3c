"""The documented error types: messages name the field and the allowed values, and every error
survives a round trip through pickle (worker processes re-raise them in the parent)."""

from __future__ import annotations

import pickle

import pytest

from carbon_gym.errors import ActionError, CarbonGymError, ConfigError, DataError, LedgerError


@pytest.mark.parametrize("err", [
    ConfigError("workload.rate_per_s", "must be > 0, got -1", allowed="> 0", source="s.toml"),
    ConfigError("model", "unknown", allowed={"a": 1, "b": 2}.keys()),
    ConfigError("x", "bad"),
    DataError("carbon.csv:12", "intensity is NaN"),
    ActionError("action[3] = 9 is out of range"),
    LedgerError("episode ledger: counts differ"),
])
def test_errors_pickle_with_message_and_attributes(err: CarbonGymError) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and vars(back) == vars(err)
    assert isinstance(back, ValueError)


def test_config_error_names_field_allowed_and_source() -> None:
    e = ConfigError("model", "unknown 'llama'", allowed=(x for x in ("llama-3.1-8b", "qwen2.5-7b")), source="s.toml")
    assert str(e) == "s.toml: model: unknown 'llama' (allowed: llama-3.1-8b, qwen2.5-7b)"
    assert e.field == "model" and e.allowed == ["llama-3.1-8b", "qwen2.5-7b"] and e.source == "s.toml"
