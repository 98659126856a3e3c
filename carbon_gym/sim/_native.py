"""Which implementation of the simulator's hot modules runs: compiled (mypyc) or pure Python.

``pip install`` compiles :data:`COMPILED_MODULES` (the request and model state, the engine, the datacenter and the simulator,
where the event loop spends its time) with mypyc when it can (``setup.py``; about twice as fast
per event) and records the SHA-256 of each compiled source in ``_native_sources.json``. The
compiled and the pure-Python modules are the same source and give the same results
(``tests/test_sim_native.py``).

:func:`select` runs once, when :mod:`carbon_gym.sim` is imported, before those modules are: it
keeps the compiled modules only if every one of them is present and was built from the source
now on disk. Otherwise - a source edited since the build (an editable install), a partial
build, or ``CARBON_GYM_PURE_PYTHON=1`` in the environment - it loads all of them from their
``.py`` sources, so an edit is never silently ignored; a stale build also warns, naming the fix.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

__all__ = ["COMPILED_MODULES", "PURE_ENV_VAR", "SOURCES_FILE", "select", "source_digest"]

#: Modules of this package that ``setup.py`` compiles (dependency order: engine first).
COMPILED_MODULES = ("request", "prefix_cache", "engine", "datacenter", "simulator")
#: Set to 1 to run the pure-Python modules even when compiled ones are installed.
PURE_ENV_VAR = "CARBON_GYM_PURE_PYTHON"
#: Written by ``setup.py``: ``{module: sha256 of its .py source}`` for the compiled build.
SOURCES_FILE = "_native_sources.json"

_HERE = Path(__file__).resolve().parent


def source_digest(path: Path) -> str:
    """SHA-256 (hex) of the file at ``path``."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extension(here: Path, name: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = here / f"{name}{suffix}"
        if p.exists():
            return p
    return None


def _load_source(here: Path, package: str, name: str) -> None:
    """Import ``package.name`` from its ``.py`` file in ``here`` (bypassing an extension module
    next to it)."""
    full = f"{package}.{name}"
    spec = importlib.util.spec_from_file_location(full, here / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise


def select(package: str, here: Path | None = None) -> dict[str, str]:
    """Decide and set up the implementation of :data:`COMPILED_MODULES` of ``package`` (the
    ``carbon_gym.sim`` package name, whose directory is ``here``, by default this file's); returns
    ``{module: "compiled" | "python"}`` plus the key ``"reason"``: why (``"compiled build matches
    the sources"``, ``"no compiled build"``, ``"CARBON_GYM_PURE_PYTHON=1"``, ``"stale compiled
    build: ..."``)."""
    here = _HERE if here is None else Path(here)
    built = {name: _extension(here, name) for name in COMPILED_MODULES}
    if not any(built.values()):
        reason = "no compiled build"
    elif os.environ.get(PURE_ENV_VAR, "").strip() not in ("", "0"):
        reason = f"{PURE_ENV_VAR}=1"
    else:
        reason = ""
        try:
            recorded = json.loads((here / SOURCES_FILE).read_text())
        except (OSError, ValueError):
            recorded = {}
        changed = [n for n in COMPILED_MODULES if built[n] is None or recorded.get(n) != source_digest(here / f"{n}.py")]
        if changed:
            reason = f"stale compiled build: {', '.join(n + '.py' for n in changed)} changed since it was compiled"
            warnings.warn(
                f"carbon_gym.sim: {reason}; running the pure-Python simulator (same results, slower). "
                f"Rebuild with `pip install -e .` (or set {PURE_ENV_VAR}=1 to silence this).",
                RuntimeWarning, stacklevel=3,
            )
    if reason:
        for name in COMPILED_MODULES:
            if built[name] is not None and f"{package}.{name}" not in sys.modules:
                _load_source(here, package, name)
        impl = "python"
    else:
        reason, impl = "compiled build matches the sources", "compiled"
    out = {name: impl for name in COMPILED_MODULES}
    out["reason"] = reason
    return out
