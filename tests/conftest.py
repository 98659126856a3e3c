"""Fixtures shared by several test modules (opt-in: a module asks for them by name)."""

from __future__ import annotations

import warnings
from typing import Iterator

import pytest


@pytest.fixture
def torch_one_thread() -> Iterator[None]:
    """One torch thread and no UserWarnings for the test (the previous thread count is restored
    after it): small networks run faster on one thread, and the test stays off the other core
    of CI's 2-core runners."""
    th = pytest.importorskip("torch")
    warnings.simplefilter("ignore", UserWarning)
    prev = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(prev)
