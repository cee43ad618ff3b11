"""Fixtures shared by the storage tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .storage_helpers import memory_dir


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A tmpfs directory for the loops that reopen a queue once per byte offset."""
    with memory_dir() as path:
        yield path
