"""The durability tests' clients: ``Wire``\\ s that ask for heartbeats every 2 s.

``IDENTIFY`` is what every client here sends: heartbeats every 2 s, the setting these tests were
written with (a ``Wire`` answers them whenever it reads). ``connect`` is tests/conftest.py's
fixture with ``IDENTIFY`` as its default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.wire import Connect, open_connections

IDENTIFY: dict[str, object] = {"heartbeat_interval": 2000}


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """``await connect(address, **identify)`` -> a ``Wire`` sending ``IDENTIFY``, closed at the
    end of the test."""
    async with open_connections(**IDENTIFY) as connect:
        yield connect
