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


# ------------------------------------------------------------------ issue 42, item 1
import ast  # noqa: E402
import inspect  # noqa: E402
from pathlib import Path  # noqa: E402

from carbon_gym import errors as errors_mod  # noqa: E402
from carbon_gym.errors import OutputWriteError, RecordWriteError  # noqa: E402

#: Every error class of carbon_gym/errors.py (found, not listed: a new class is covered too).
ERROR_CLASSES = sorted((c for c in vars(errors_mod).values()
                        if isinstance(c, type) and issubclass(c, CarbonGymError)), key=lambda c: c.__name__)
#: One instance of each class, built as the project builds it.
SAMPLES = {
    "CarbonGymError": CarbonGymError("something is wrong"),
    "ConfigError": ConfigError("workload.rate_per_s", "must be > 0, got -1", allowed="> 0", source="s.toml"),
    "DataError": DataError("carbon.csv:12", "intensity is NaN"),
    "ActionError": ActionError("action[3] = 9 is out of range"),
    "RecordWriteError": RecordWriteError("/mnt/full/rec/episode-00000", "cannot write part-00001.npz (No space left "
                                         "on device); 26 unwritten records are kept in memory"),
    "LedgerError": LedgerError("episode ledger: counts differ"),
    "OutputWriteError": OutputWriteError("runs/eval/requests/dev__rr__seed0.parquet", "File too large"),
}
ROOT = Path(__file__).resolve().parents[1]


def test_every_error_class_has_a_sample() -> None:
    assert sorted(SAMPLES) == [c.__name__ for c in ERROR_CLASSES] and len(ERROR_CLASSES) == 7


@pytest.mark.parametrize("form", ["error", "text"])
@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_error_rebuilds_from_one_argument(cls: type[CarbonGymError], form: str) -> None:
    """``type(err)(err)`` (how Gymnasium's AsyncVectorEnv re-raises a worker's error: a full disk
    under record_dir gave ``TypeError: RecordWriteError.__init__() missing 1 required positional
    argument: 'message'``) and ``type(err)(str(err))``: the same class, message and args."""
    err = SAMPLES[cls.__name__]
    again = cls(err if form == "error" else str(err))
    assert type(again) is cls and str(again) == str(err) and again.args == err.args
    if form == "error":
        assert vars(again) == vars(err)
    back = pickle.loads(pickle.dumps(again))
    assert type(back) is cls and str(back) == str(err) and vars(back) == vars(again)


def test_rebuilt_errors_read_their_attributes_back() -> None:
    cfg = ConfigError(str(ConfigError("slo.ttft_s", "must be > 0")))
    assert cfg.field == "slo.ttft_s" and cfg.allowed is None and cfg.source is None
    assert DataError(str(DataError("carbon.csv:12", "intensity is NaN"))).source == "carbon.csv:12"
    rw = RecordWriteError(str(SAMPLES["RecordWriteError"]))
    assert rw.directory == "/mnt/full/rec/episode-00000"
    assert rw.reason.startswith("cannot write part-00001.npz (No space left on device)")
    ow = OutputWriteError(str(SAMPLES["OutputWriteError"]))
    assert (ow.path, ow.reason) == ("runs/eval/requests/dev__rr__seed0.parquet", "File too large")
    assert OutputWriteError("disk full").path == "" and OutputWriteError("disk full").reason == "disk full"
    bare = RecordWriteError("disk full")
    assert bare.directory == "" and bare.reason == "disk full" and str(bare) == "disk full"


def _construction_sites() -> list[tuple[str, int, str, ast.Call]]:
    names = {c.__name__ for c in ERROR_CLASSES}
    out = []
    for pkg in ("carbon_gym", "solvers", "train", "eval", "calibration"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    if name in names:
                        out.append((str(path.relative_to(ROOT)), node.lineno, name, node))
    return out


def test_every_construction_site_fits_its_class() -> None:
    """Each ``XxxError(...)`` call in the packages binds to the class's signature: no site can
    raise a TypeError instead of its error (what a full disk did)."""
    by_name = {c.__name__: c for c in ERROR_CLASSES}
    sites = _construction_sites()
    counts: dict[str, int] = {}
    bad = []
    for where, line, name, call in sites:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue  # (*args / **kwargs: not statically known)
        init = next((c.__dict__["__init__"] for c in by_name[name].__mro__ if "__init__" in c.__dict__), None)
        try:
            if isinstance(init, type(_construction_sites)):  # (a Python __init__; ValueError's takes any arguments)
                inspect.signature(init).bind("self", *["x"] * len(call.args), **{k.arg: "x" for k in call.keywords if k.arg})
            elif call.keywords:
                raise TypeError(f"{name} takes no keyword arguments")
        except TypeError as exc:
            bad.append(f"{where}:{line} {name}: {exc}")
        counts[name] = counts.get(name, 0) + 1
    assert bad == []
    # every class is built somewhere, ConfigError in hundreds of places
    assert set(counts) >= {"ConfigError", "DataError", "ActionError", "RecordWriteError", "LedgerError", "OutputWriteError"}
    assert counts["RecordWriteError"] == 2 and counts["ConfigError"] > 300
