"""Build script: everything is in pyproject.toml except the optional compiled simulator.

``pip install`` compiles the simulator's modules (``carbon_gym/sim/request.py``, ``engine.py``, ``datacenter.py``
and ``simulator.py``; the same source, run as C extensions, about twice as fast per event) with
mypyc, which the build requirements in pyproject.toml provide. The pure-Python package is
installed instead, with a message, when mypyc or a C compiler is missing, when the compile fails,
or when ``CARBON_GYM_NO_COMPILE=1`` is set. ``carbon_gym/sim/_native.py`` chooses at import time
and falls back to the ``.py`` sources when they changed since the build.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SIM = ROOT / "carbon_gym" / "sim"
sys.path.insert(0, str(SIM))
from _native import COMPILED_MODULES, SOURCES_FILE, source_digest  # noqa: E402  (no package import: numpy may be absent)

sys.path.pop(0)


def _say(msg: str) -> None:
    print(f"carbon_gym setup: {msg}", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that installs the pure-Python simulator if compiling fails (no C compiler...)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # distutils' CompileError / PlatformError / ExecError
            _say(f"compiling the simulator failed ({exc}); installing the pure-Python simulator")
            (SIM / SOURCES_FILE).unlink(missing_ok=True)
            for name in COMPILED_MODULES:  # an earlier in-place build of an editable install
                for suffix in EXTENSION_SUFFIXES:
                    (SIM / f"{name}{suffix}").unlink(missing_ok=True)


#: setup.py commands that build extensions (pip also runs setup.py for metadata only: egg_info...)
BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}


def ext_modules() -> list:
    """mypyc extensions of the compiled modules, or [] (pure Python)."""
    if not BUILD_COMMANDS & set(sys.argv[1:]):
        return []
    if os.environ.get("CARBON_GYM_NO_COMPILE", "").strip() not in ("", "0"):
        _say("CARBON_GYM_NO_COMPILE is set: pure-Python simulator")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not available: pure-Python simulator")
        return []
    files = [f"carbon_gym/sim/{name}.py" for name in COMPILED_MODULES]
    try:
        # imports outside the compiled modules are not followed and installed packages are not
        # looked at (numpy, gymnasium... are untyped objects here): a fast build, and the same
        # compiled code whatever is installed when it runs (pip's build env may lack numpy)
        mods = mypycify(["--follow-imports=skip", "--ignore-missing-imports", "--no-site-packages", *files], opt_level="2")
    except (Exception, SystemExit) as exc:  # mypy reports type errors by SystemExit
        _say(f"mypyc could not compile the simulator ({exc!r}): pure-Python simulator")
        return []
    (SIM / SOURCES_FILE).write_text(json.dumps({n: source_digest(SIM / f"{n}.py") for n in COMPILED_MODULES}, indent=1) + "\n")
    return mods


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
