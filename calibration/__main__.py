"""``python -m calibration <command>``: the same as ``carbon-gym calibrate <command>``."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
