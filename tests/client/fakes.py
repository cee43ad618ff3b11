"""A scripted fake daemon for client tests (after go-nsq's mock nsqd).

``FakeNetwork.open_stream`` is passed to a client as its ``open_stream``: each connection the
client opens becomes a ``memory_stream_pair`` whose server end is a ``FakeDaemon`` that the test
drives step by step (the client's end goes through ``TrioByteStream``: the clients take anyio
byte streams). The fake parses what the client sends with the real sans-IO ``ServerConnection``
(so the client's bytes are checked by the same parser lmqd uses) and timestamps every command
on the trio clock, which the tests compare with exact virtual times. These tests run the async
clients under anyio's trio backend; ``test_backends.py`` runs them under asyncio too.

Upgrades are real: ``start_tls`` runs the server side of a TLS handshake on the connection (with
lmqd's ``start_tls_server``) and ``start_compression`` wraps it in lmqd's ``CompressedStream``,
each followed by the ``OK`` frame nsqd sends, so the client's TLS and codecs meet the server's.
"""

from __future__ import annotations

import errno
import json
import math
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import trio
import trio.testing
from anyio.abc import ByteStream

from lmqd.message import Message as DaemonMessage
from lmqd.protocol import (
    Event,
    Limits,
    ServerConnection,
    encode_error,
    encode_message,
    encode_response,
    one_per_command,
)
from lmqd.transport.compression import DeflateStream, SnappyStream, StreamCodec
from lmqd.transport.streams import CompressedStream, start_tls_server
from lmqd.transport.tls import ServerTLS

IDENTIFY_RESPONSE: dict[str, Any] = {
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 6,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}


class TrioByteStream(ByteStream):
    """A trio stream as the anyio byte stream the clients expect (trio's exceptions become
    anyio's, b"" becomes ``anyio.EndOfStream``)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            data = await self.stream.receive_some(max_bytes)
        except trio.BrokenResourceError as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc
        except trio.ClosedResourceError as exc:
            raise anyio.ClosedResourceError(str(exc)) from exc
        if not data:
            raise anyio.EndOfStream
        return bytes(data)

    async def send(self, item: bytes) -> None:
        try:
            await self.stream.send_all(item)
        except trio.BrokenResourceError as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc
        except trio.ClosedResourceError as exc:
            raise anyio.ClosedResourceError(str(exc)) from exc

    async def send_eof(self) -> None:
        raise NotImplementedError("the clients never half-close")

    async def aclose(self) -> None:
        await self.stream.aclose()


class FakeDaemon:
    """The server end of one client connection."""

    def __init__(self, address: str, stream: trio.abc.Stream) -> None:
        self.address = address
        self.stream = stream
        # The fake runs the upgrades itself (start_tls, start_compression): its parser must
        # negotiate none, or it would stop after IDENTIFY waiting for lmqd's upgrade.
        self.codec = ServerConnection(Limits(snappy_available=False, deflate_available=False))
        self.log: list[tuple[float, Event]] = []
        self._pending: list[Event] = []
        self.eof = False

    async def next_command(self, limit: float = math.inf) -> Event:
        """The next command the client sent (waits for it); EOFError once the client closed."""
        with trio.fail_after(limit):
            while not self._pending:
                if self.eof:
                    raise EOFError(self.address)
                data = await self.stream.receive_some(65536)
                self.codec.receive_data(bytes(data))
                if not data:
                    self.eof = True
                now = trio.current_time()
                for event in one_per_command(self.codec.next_events()):
                    self.log.append((now, event))
                    self._pending.append(event)
        return self._pending.pop(0)

    async def expect(self, kind: type[Any], limit: float = math.inf) -> Any:
        """The next command, asserted to be of ``kind``."""
        event = await self.next_command(limit)
        assert isinstance(event, kind), f"expected {kind.__name__}, got {event!r}"
        return event

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def respond(self, data: bytes = b"OK") -> None:
        await self.send(encode_response(data))

    async def error(self, body: bytes) -> None:
        await self.send(encode_error(body))

    async def deliver(
        self, msg_id: bytes, body: bytes, attempts: int = 1, timestamp: int = 0
    ) -> None:
        await self.send(encode_message(DaemonMessage(msg_id, body, timestamp, attempts)))

    async def handshake(self, **overrides: Any) -> dict[str, Any]:
        """Answer the magic + IDENTIFY; returns the client's IDENTIFY document."""
        from lmqd.protocol import Identify

        identify = await self.expect(Identify)
        await self.respond(json.dumps({**IDENTIFY_RESPONSE, **overrides}).encode())
        data: dict[str, Any] = identify.data
        return data

    async def subscribe(self, **overrides: Any) -> Any:
        """Handshake, then answer SUB with OK; returns the Sub event."""
        from lmqd.protocol import Sub

        await self.handshake(**overrides)
        sub = await self.expect(Sub)
        await self.respond()
        return sub

    async def answer_cls(self) -> None:
        """Wait for the consumer's CLS (skipping other commands) and answer CLOSE_WAIT."""
        from lmqd.protocol import Cls

        while not isinstance(await self.next_command(), Cls):
            pass
        await self.respond(b"CLOSE_WAIT")

    async def start_tls(self, context: ssl.SSLContext) -> trio.SSLStream[trio.abc.Stream]:
        """The server side of the ``tls_v1`` upgrade, then ``OK`` over TLS (as nsqd)."""
        secure = await start_tls_server(self.stream, context)
        self.stream = secure
        await self.respond()
        return secure

    async def start_compression(self, codec: StreamCodec) -> None:
        """Compress both directions from now on, then ``OK`` through the codec (as nsqd)."""
        self.stream = CompressedStream(self.stream, codec)
        await self.respond()

    async def close(self) -> None:
        await self.stream.aclose()


class FakeNetwork:
    """Hands out FakeDaemons for the connections a client opens; ``refuse`` fails them."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[FakeDaemon](math.inf)
        self.refuse: set[str] = set()
        self.attempts: list[tuple[float, str]] = []

    async def open_stream(self, address: str) -> ByteStream:
        self.attempts.append((trio.current_time(), address))
        await trio.lowlevel.checkpoint()
        if address in self.refuse:
            raise OSError(errno.ECONNREFUSED, "Connection refused")
        client, server = trio.testing.memory_stream_pair()
        self._send.send_nowait(FakeDaemon(address, server))
        return TrioByteStream(client)

    async def accept(self, limit: float = math.inf) -> FakeDaemon:
        """The daemon end of the next connection the client opens."""
        with trio.fail_after(limit):
            return await self._receive.receive()


async def upgrade(
    fake: FakeDaemon,
    *,
    tls: ServerTLS | None = None,
    codec: StreamCodec | None = None,
    auth: bool = False,
) -> dict[str, Any]:
    """nsqd's side of IDENTIFY and the upgrades; returns the client's IDENTIFY document."""
    identify = await fake.handshake(
        tls_v1=tls is not None,
        snappy=isinstance(codec, SnappyStream),
        deflate=isinstance(codec, DeflateStream),
        deflate_level=codec.level if isinstance(codec, DeflateStream) else 6,
        auth_required=auth,
    )
    if tls is not None:
        await fake.start_tls(tls.context)
    if codec is not None:
        await fake.start_compression(codec)
    return identify


async def serve_one(
    script: Callable[[FakeDaemon], Awaitable[None]],
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept one connection on 127.0.0.1 and run ``script(FakeDaemon)`` on it."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    listener = listeners[0]
    task_status.started(f"127.0.0.1:{listener.socket.getsockname()[1]}")
    async with listener:
        stream = await listener.accept()
    fake = FakeDaemon("sync", stream)
    try:
        await script(fake)
    finally:
        await fake.close()
