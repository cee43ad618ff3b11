"""Fixtures for the HTTP API suites: real ``LmqDaemon``s run in-process on 127.0.0.1 port 0.

``start_daemon(**options)`` starts one (``await nursery.start(daemon.run)``, so it returns once
TCP and HTTP listen) with ``data_path`` in ``tmp_path``, and shuts every daemon down at the end
of the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from httpwire import Running, StartDaemon

from lmqd.daemon import LmqDaemon
from lmqd.options import Options

# A daemon starts in milliseconds; the guard is for a listener that never comes up.
START_TIMEOUT_S = 10.0


@pytest.fixture
async def start_daemon(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[StartDaemon]:
    daemons: list[LmqDaemon] = []

    async def start(**overrides: Any) -> Running:
        options = Options(
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            data_path=str(tmp_path),
            **overrides,
        )
        daemon = LmqDaemon(options)
        with trio.fail_after(START_TIMEOUT_S):
            addresses = await nursery.start(daemon.run)
        daemons.append(daemon)
        assert addresses.http is not None
        return Running(daemon, addresses.tcp, addresses.http)

    yield start
    for daemon in daemons:
        daemon.shutdown()
