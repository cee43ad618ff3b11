"""In-process lmqd nodes for the cluster tests, and a small HTTP client.

``start_lmqd(**options)`` starts a real ``LmqDaemon`` in the test's nursery on 127.0.0.1 port 0
(TCP and HTTP), its data in ``tmp_path``, and shuts it down at the end of the test. It sets no
timeout of its own: start-up reads the data directory in a worker thread, during which the
autojump clock would run any deadline out, so tests on that clock start their nodes before they
enter their ``fail_after``.
``http_request`` is one HTTP/1.1 request over a trio stream (h11), so it runs on the autojump
clock without threads.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import h11
import pytest
import trio

from lmqd.options import Options
from lmqd.service import LmqDaemon

Address = tuple[str, int]


@attrs.frozen
class LmqdNode:
    daemon: LmqDaemon
    tcp: Address
    http: Address

    @property
    def tcp_address(self) -> str:
        return f"{self.tcp[0]}:{self.tcp[1]}"

    @property
    def http_address(self) -> str:
        return f"{self.http[0]}:{self.http[1]}"


StartLmqd = Callable[..., Awaitable[LmqdNode]]


@pytest.fixture
async def start_lmqd(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[StartLmqd]:
    daemons: list[LmqDaemon] = []

    async def start(**overrides: Any) -> LmqdNode:
        data = tmp_path / f"node{len(daemons)}"
        data.mkdir()
        settings: dict[str, Any] = {
            "tcp_address": "127.0.0.1:0",
            "http_address": "127.0.0.1:0",
            "broadcast_address": "127.0.0.1",
            "data_path": str(data),
        }
        options = Options(**{**settings, **overrides})
        daemon = LmqDaemon(options)
        addresses = await nursery.start(daemon.run)
        daemons.append(daemon)
        assert addresses.http is not None
        return LmqdNode(daemon, addresses.tcp, addresses.http)

    yield start
    for daemon in daemons:
        daemon.shutdown()


@attrs.frozen
class HttpResult:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def http_request(
    address: Address, method: str, target: str, body: bytes = b""
) -> HttpResult:
    """One request on a fresh connection."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        headers = [("Host", f"{address[0]}:{address[1]}"), ("Content-Length", str(len(body)))]
        data = conn.send(h11.Request(method=method, target=target, headers=headers))
        data += (conn.send(h11.Data(data=body)) if body else b"") + conn.send(h11.EndOfMessage())
        await stream.send_all(data)
        status = 0
        chunks: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return HttpResult(status, b"".join(chunks))
