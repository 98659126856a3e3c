"""``python -m eval ...`` is the same as ``carbon-gym ...``."""

from __future__ import annotations

from eval.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
