"""The in-process lmqlookupd fixture for this package's tests.

``lookupd`` starts a ``LookupDaemon`` in the test's nursery with ``await nursery.start(...)``,
so it returns once TCP and HTTP listen on 127.0.0.1 port 0, and shuts it down at the end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest
import trio

from lmqd.lookupd import Addresses, LookupDaemon, LookupdOptions

# A daemon starts in milliseconds; the guard is for a listener that never comes up.
START_TIMEOUT_S = 10.0


@attrs.frozen
class RunningLookupd:
    daemon: LookupDaemon
    tcp: tuple[str, int]
    http: tuple[str, int]


async def start_lookupd(nursery: trio.Nursery, **overrides: object) -> RunningLookupd:
    options = LookupdOptions(
        tcp_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        broadcast_address="127.0.0.1",
        **overrides,  # type: ignore[arg-type]
    )
    daemon = LookupDaemon(options)
    with trio.fail_after(START_TIMEOUT_S):
        addresses: Addresses = await nursery.start(daemon.run)
    return RunningLookupd(daemon, addresses.tcp, addresses.http)


@pytest.fixture
async def lookupd(nursery: trio.Nursery) -> AsyncIterator[RunningLookupd]:
    running = await start_lookupd(nursery)
    yield running
    running.daemon.shutdown()
