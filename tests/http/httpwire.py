"""Test-side helpers for the HTTP suites: the daemon fixture, an h11 HTTP/1.1 client and a raw
V2 TCP client.

``start_daemon(**options)`` (a fixture; test modules import ``start_daemon_fixture``) starts a
real ``LmqDaemon`` in-process with ``await nursery.start(daemon.run)``, so it returns once TCP and
HTTP listen on 127.0.0.1 port 0, with ``data_path`` in ``tmp_path``, and shuts every daemon down
at the end of the test. (It lives here, not in a ``conftest.py``: a ``tests/http/conftest.py``
would be imported as the top-level module ``conftest`` and shadow ``tests/conftest.py`` for the
suites that import from it, and an ``__init__.py`` would make this directory shadow the stdlib
``http`` package.)

The HTTP client is h11 over a trio stream, so a test sees exactly the status, headers and body
bytes the server sent (no client library normalising them), and can also send what a library
would refuse to (a ``Content-Length`` with no body, chunked uploads, odd methods).
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import h11
import pytest
import trio

from lmqd.broker import Broker
from lmqd.options import Options
from lmqd.service import LmqDaemon

Address = tuple[str, int]


@attrs.frozen
class Running:
    """A daemon started by the ``start_daemon`` fixture and its bound addresses."""

    daemon: LmqDaemon
    tcp: Address
    http: Address

    @property
    def broker(self) -> Broker:
        return self.daemon.broker


StartDaemon = Callable[..., Awaitable[Running]]

# A daemon starts in milliseconds; the guard is for a listener that never comes up.
START_TIMEOUT_S = 10.0


@pytest.fixture(name="start_daemon")
async def start_daemon_fixture(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[StartDaemon]:
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


@attrs.frozen
class HttpResult:
    status: int
    headers: dict[str, str]
    """Lower-cased names; the last value of a repeated header."""
    body: bytes

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json; charset=utf-8", self.headers
        return json.loads(self.body)

    @property
    def v1(self) -> bool:
        """Whether nsqd's ``X-NSQ-Content-Type: nsq; version=1.0`` header is present."""
        return self.headers.get("x-nsq-content-type") == "nsq; version=1.0"


async def eventually(predicate: Callable[[], bool]) -> None:
    """Wait until ``predicate()`` holds (the daemon's pump and timers run in other tasks);
    the caller's ``fail_after`` bounds the wait."""
    while True:  # polls daemon state, which has no event to wait on
        if predicate():
            return
        await trio.sleep(0.005)


async def _read_response(conn: h11.Connection, stream: trio.SocketStream) -> HttpResult:
    response: h11.Response | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
            continue
        if isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    assert response is not None
    headers = {k.decode().lower(): v.decode() for k, v in response.headers}
    return HttpResult(response.status_code, headers, bytes(body))


async def http(
    address: Address,
    method: str,
    target: str,
    body: bytes | None = None,
    *,
    headers: tuple[tuple[str, str], ...] = (),
    chunked: bool = False,
) -> HttpResult:
    """One request on a fresh connection; ``chunked`` sends the body with chunked encoding."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        hdrs = [("Host", f"{address[0]}:{address[1]}"), *headers]
        if chunked:
            hdrs.append(("Transfer-Encoding", "chunked"))
        elif body is not None or method in ("POST", "PUT"):
            hdrs.append(("Content-Length", str(len(body or b""))))
        data = conn.send(h11.Request(method=method, target=target, headers=hdrs))
        if body:
            if chunked:
                for i in range(0, len(body), 65536):
                    data += conn.send(h11.Data(data=body[i : i + 65536])) or b""
            else:
                data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data or b"")
        return await _read_response(conn, stream)


async def http_headers_only(
    address: Address, method: str, target: str, content_length: int
) -> HttpResult:
    """Send only the request head announcing ``content_length`` bytes, then read the answer: a
    server that rejects by Content-Length answers without waiting for the body."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        head = conn.send(h11.Request(method=method, target=target, headers=[
            ("Host", f"{address[0]}:{address[1]}"), ("Content-Length", str(content_length)),
        ]))
        await stream.send_all(head or b"")
        return await _read_response(conn, stream)


# -- V2 TCP ------------------------------------------------------------------------------------

FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2


@attrs.frozen
class V2Message:
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


class V2Client:
    """The client end of a V2 connection, driven byte by byte (no client library)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    @classmethod
    async def connect(cls, address: Address, **identify: object) -> V2Client:
        client = cls(await trio.open_tcp_stream(*address))
        await client.stream.send_all(b"  V2")
        if identify:
            await client.send(b"IDENTIFY\n", json.dumps(identify).encode())
            assert await client.response() == b"OK"
        return client

    async def send(self, line: bytes, body: bytes | None = None) -> None:
        data = line if body is None else line + struct.pack(">i", len(body)) + body
        await self.stream.send_all(data)

    async def frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buffer) >= 8:
                (size,) = struct.unpack(">i", self.buffer[:4])
                if len(self.buffer) >= 4 + size:
                    (kind,) = struct.unpack(">i", self.buffer[4:8])
                    data = bytes(self.buffer[8 : 4 + size])
                    del self.buffer[: 4 + size]
                    if kind == FRAME_RESPONSE and data == b"_heartbeat_":
                        continue
                    return kind, data
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise EOFError("connection closed")
            self.buffer += chunk

    async def response(self) -> bytes:
        kind, data = await self.frame()
        assert kind == FRAME_RESPONSE, (kind, data)
        return data

    async def message(self) -> V2Message:
        kind, data = await self.frame()
        assert kind == FRAME_MESSAGE, (kind, data)
        timestamp, attempts = struct.unpack(">qH", data[:10])
        return V2Message(timestamp, attempts, data[10:26], data[26:])

    async def subscribe(self, topic: str, channel: str, rdy: int) -> None:
        await self.send(f"SUB {topic} {channel}\n".encode())
        assert await self.response() == b"OK"
        await self.send(f"RDY {rdy}\n".encode())

    async def publish(self, topic: str, body: bytes) -> None:
        await self.send(f"PUB {topic}\n".encode(), body)
        assert await self.response() == b"OK"

    async def aclose(self) -> None:
        await self.stream.aclose()
