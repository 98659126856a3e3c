"""Error types raised by carbon_gym.

Every error that bad input can trigger derives from :class:`CarbonGymError` and names the
offending field, file or line, so that a user never has to read a traceback to find out what
was wrong. They also derive from :class:`ValueError` so generic handlers keep working.
"""

from __future__ import annotations

from typing import Any, Iterable


class CarbonGymError(ValueError):
    """Base class of every documented carbon_gym error.

    Errors pickle with their message and attributes (``field``, ``allowed``, ``source``), so
    an error raised in a worker process (vector envs, parallel evaluation) arrives intact. Every
    class can also be built from its formatted message alone, ``type(err)(str(err))`` (what
    Gymnasium's ``AsyncVectorEnv`` does to re-raise a worker's error is ``type(err)(err)``): the
    same message, the attributes copied from ``err`` or, from a string, read back from it as far
    as it shows them.
    """

    def __init__(self, *args: Any) -> None:
        if len(args) == 1 and isinstance(args[0], CarbonGymError):  # type(err)(err): keep its text and attributes
            self.__dict__.update(vars(args[0]))
            args = (str(args[0]),)
        super().__init__(*args)

    def __reduce__(self) -> tuple:
        return _rebuild_error, (type(self), self.args, dict(self.__dict__))


class ConfigError(CarbonGymError):
    """A configuration value (scenario field, parameter file entry, argument) is invalid.

    Args:
        field: dotted name of the bad field, e.g. ``"workload.rate_per_s"``.
        message: what is wrong with it.
        allowed: optional description or iterable of allowed values.
        source: optional file (and line) the value came from.

    ``ConfigError(text)`` (one argument) keeps ``text`` as the whole message (a re-raised error);
    ``field`` is then the text before its first ``": "``.
    """

    def __init__(self, field: str, message: str | None = None, allowed: Any = None, source: str | None = None):
        if message is None:
            self.field, self.allowed, self.source = str(field).partition(": ")[0], None, None
            super().__init__(field)
            return
        if isinstance(allowed, Iterable) and not isinstance(allowed, (str, list, tuple, set, frozenset)):
            allowed = list(allowed)  # (a generator or a view: kept as a list, readable and picklable)
        self.field = field
        self.allowed = allowed
        self.source = source
        text = f"{field}: {message}"
        if allowed is not None:
            if isinstance(allowed, (list, tuple, set, frozenset)) or (
                isinstance(allowed, Iterable) and not isinstance(allowed, str)
            ):
                allowed_text = ", ".join(map(str, allowed))
            else:
                allowed_text = str(allowed)
            text += f" (allowed: {allowed_text})"
        if source:
            text = f"{source}: {text}"
        super().__init__(text)


class DataError(CarbonGymError):
    """A data file (carbon trace, workload trace, parameter file) is malformed.

    Args:
        source: the file, optionally with ``:line``.
        message: what is wrong.

    ``DataError(text)`` (one argument) keeps ``text`` as the whole message (a re-raised error).
    """

    def __init__(self, source: str, message: str | None = None):
        if message is None:
            self.source = str(source).partition(": ")[0]
            super().__init__(source)
            return
        self.source = source
        super().__init__(f"{source}: {message}")


class ActionError(CarbonGymError):
    """An action passed to ``env.step`` has the wrong shape, range or chooses a masked option."""


class RecordWriteError(CarbonGymError):
    """Streamed request records could not be written (disk full, directory removed, ...).

    Args:
        directory: the record directory.
        message: what failed (the operating system's reason).

    ``RecordWriteError(text)`` (one argument) keeps ``text`` as the whole message (a re-raised
    error, e.g. by Gymnasium's ``AsyncVectorEnv`` when a worker's disk fills up).
    """

    def __init__(self, directory: str, message: str | None = None):
        if message is None:
            head, sep, reason = str(directory).partition(": ")
            self.directory = head.removeprefix("record_dir ") if sep else ""
            self.reason = reason if sep else str(directory)
            super().__init__(directory)
            return
        self.directory = directory
        self.reason = message
        super().__init__(f"record_dir {directory}: {message}")


class OutputWriteError(CarbonGymError):
    """An output file (an evaluation's tables, records, figures, TensorBoard run) could not be
    written (disk full, file size limit, directory removed, ...). Nothing half-written is left
    under the file's name: it is written under a temporary name and renamed when complete.

    Args:
        path: the file (or TensorBoard run directory) that was not written.
        message: the operating system's reason.

    ``OutputWriteError(text)`` (one argument) keeps ``text`` as the whole message (a re-raised
    error); ``path`` is then read back from ``cannot write <path>: ...`` where the text has it.
    """

    def __init__(self, path: str, message: str | None = None):
        if message is None:
            text = str(path)
            head, sep, reason = text.removeprefix("cannot write ").partition(": ")
            known = sep and text.startswith("cannot write ")
            self.path, self.reason = (head, reason) if known else ("", text)
            super().__init__(path)
            return
        self.path = path
        self.reason = message
        super().__init__(f"cannot write {path}: {message}")


class LedgerError(CarbonGymError):
    """The end-of-episode accounting check failed: a request or a joule is unaccounted for."""


def check_finite_nonneg(field: str, value: float, *, allow_zero: bool = True) -> float:
    """Return ``float(value)`` or raise :class:`ConfigError` if it is NaN, infinite or negative."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, f"expected a number, got {value!r}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise ConfigError(field, f"must be finite, got {value!r}")
    if v < 0 or (not allow_zero and v == 0):
        raise ConfigError(field, f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return v


def check_seed(value: Any, field: str = "seed") -> int | None:
    """``value`` as a Python ``int`` (None stays None), or :class:`ConfigError` naming ``field``.

    Accepted: None, an ``int`` or any integral numpy scalar (``np.int64(5)``, ``np.uint32``),
    ``>= 0`` (no upper bound, as Gymnasium: a 128-bit ``SeedSequence`` entropy is a seed).
    Refused: bools, floats (also integral ones: ``1.0`` is a slip, not a seed), NaN, strings,
    sequences and negative integers."""
    if value is None:
        return None
    import numpy as np

    allowed = "None or an integer >= 0 (Python or numpy)"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(field, f"expected a non-negative integer or None, got {value!r} ({type(value).__name__})",
                          allowed=allowed)
    v = int(value)
    if v < 0:
        raise ConfigError(field, f"{v} is negative", allowed=allowed)
    return v


def check_choice(field: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``allowed``, else raise :class:`ConfigError` listing them."""
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(field, f"unknown value {value!r}", allowed=allowed)
    return value


def _rebuild_error(cls: type[CarbonGymError], args: tuple, state: dict) -> CarbonGymError:
    """Unpickle a :class:`CarbonGymError` without calling its ``__init__`` (whose arguments
    differ between the subclasses)."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err
