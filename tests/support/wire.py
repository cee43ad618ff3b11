"""The tests' V2 client: trio streams carry the bytes, the sans-IO ``ClientConnection`` decodes.

``Wire`` is the client end of one V2 connection. ``Wire.connect(address, **identify)`` opens a
TCP connection, sends the magic and, when settings are given, IDENTIFY; ``Wire(stream)`` wraps
any trio stream, such as the client end of ``tests.support.daemon.serve_in_memory`` (send the
magic yourself). Commands go out as bytes, so a test can send anything, malformed included, or
as protocol events; frames come back decoded by ``lmqd.protocol.ClientConnection`` (the codec
lmq_client uses) as ``Response``, ``Error`` and ``MessageFrame`` events. Tests of the exact
bytes a daemon sends use ``tests.support.rawbytes``, which trusts no codec of ours.

Heartbeats are answered with NOP and never returned, by default, so a test may sit idle between
two reads as long as it likes; with ``answer_heartbeats=False`` they are returned like any other
frame (for the tests of heartbeats themselves). No read has a timeout of its own: the caller's
``fail_after`` bounds it.

The ``connect`` fixture opens wires that are closed at the end of the test.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from lmqd.protocol import (
    ClientConnection,
    Command,
    Dpub,
    Error,
    FrameEvent,
    MessageFrame,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Response,
    Sub,
)

__all__ = [
    "OK",
    "Connect",
    "ConnectionClosed",
    "Wire",
    "connect_fixture",
    "consume_exactly",
    "open_connections",
]

Address = tuple[str, int]

RECEIVE_SIZE = 256 * 1024
"""Bytes asked of the stream per read: many frames at once, as a real client reads (the codec
keeps whatever a read splits)."""

OK = Response(data=b"OK")
"""The frame that answers a successful PUB, MPUB, DPUB, SUB or IDENTIFY."""


class ConnectionClosed(Exception):
    """The daemon closed (or reset) the connection."""


class Wire:
    """One V2 connection: send commands, read frames in order."""

    def __init__(self, stream: trio.abc.Stream, *, answer_heartbeats: bool = True) -> None:
        self.stream = stream
        self.answer_heartbeats = answer_heartbeats
        self.codec = ClientConnection()
        self.negotiated: dict[str, Any] | None = None
        """The daemon's IDENTIFY answer, when ``feature_negotiation`` was asked for."""
        self._frames: deque[FrameEvent] = deque()

    @classmethod
    async def connect(cls, address: Address, **identify: object) -> Wire:
        """Connect, send the magic and, if ``identify`` has settings, IDENTIFY with them."""
        wire = cls(await trio.open_tcp_stream(*address))
        await wire.send(ClientConnection.initial_bytes())
        if identify:
            await wire.identify(**identify)
        return wire

    @property
    def local_address(self) -> Address:
        """``(host, port)`` of this end of a TCP connection (what the daemon reports)."""
        assert isinstance(self.stream, trio.SocketStream), self.stream
        host, port = self.stream.socket.getsockname()[:2]
        return host, port

    # -- sending -------------------------------------------------------------------------------

    async def send(self, data: bytes | Command | Mapping[str, Any]) -> None:
        """Send raw bytes as they are, a command event encoded, a mapping as IDENTIFY."""
        if not isinstance(data, bytes):
            data = ClientConnection.send(data)
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ConnectionClosed(str(exc)) from None

    async def identify(self, **settings: object) -> bytes:
        """IDENTIFY; the answer must be ``OK``, or JSON (kept in ``negotiated``) when
        ``feature_negotiation`` is set."""
        await self.send(settings)
        data = await self.response()
        if settings.get("feature_negotiation"):
            self.negotiated = json.loads(data)
        else:
            assert data == b"OK", data
        return data

    async def pub(self, topic: str, body: bytes) -> FrameEvent:
        """PUB; the frame that answers it."""
        await self.send(Pub(topic=topic, body=body))
        return await self.frame()

    async def mpub(self, topic: str, bodies: Sequence[bytes]) -> FrameEvent:
        await self.send(Mpub(topic=topic, bodies=list(bodies)))
        return await self.frame()

    async def dpub(self, topic: str, defer_ms: int, body: bytes) -> FrameEvent:
        await self.send(Dpub(topic=topic, defer_ms=defer_ms, body=body))
        return await self.frame()

    async def sub(self, topic: str, channel: str, rdy: int = 0) -> None:
        """SUB (answered ``OK``), then RDY ``rdy`` unless 0."""
        await self.send(Sub(topic=topic, channel=channel))
        assert await self.response() == b"OK"
        if rdy:
            await self.rdy(rdy)

    async def rdy(self, count: int) -> None:
        await self.send(Rdy(count=count))

    async def fin(self, msg_id: bytes) -> None:
        await self.send(b"FIN " + msg_id + b"\n")

    async def req(self, msg_id: bytes, delay_ms: int) -> None:
        await self.send(b"REQ " + msg_id + b" %d\n" % delay_ms)

    async def touch(self, msg_id: bytes) -> None:
        await self.send(b"TOUCH " + msg_id + b"\n")

    # -- receiving -----------------------------------------------------------------------------

    async def frame(self) -> FrameEvent:
        """The next frame (heartbeats answered and skipped, unless ``answer_heartbeats`` is
        off); ``ConnectionClosed`` once the daemon has closed and every frame was read."""
        while True:
            while self._frames:
                event = self._frames.popleft()
                if self.answer_heartbeats and isinstance(event, Response) and event.is_heartbeat:
                    await self.send(Nop())
                    continue
                return event
            try:
                data = await self.stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ConnectionClosed(str(exc)) from None
            if not data:
                raise ConnectionClosed("EOF")
            self.codec.receive_data(data)
            self._frames.extend(self.codec.next_events())

    async def response(self) -> bytes:
        """The next frame, which must be a response; its data."""
        event = await self.frame()
        assert isinstance(event, Response), event
        return event.data

    async def error(self) -> Error:
        """The next frame, which must be an error."""
        event = await self.frame()
        assert isinstance(event, Error), event
        return event

    async def message(self) -> MessageFrame:
        """The next frame, which must be a message."""
        event = await self.frame()
        assert isinstance(event, MessageFrame), event
        return event

    async def closed(self) -> bool:
        """Read (and drop) frames until the daemon closes the connection; True then. The
        caller's ``fail_after`` catches a connection that stays open."""
        try:
            while True:
                await self.frame()
        except ConnectionClosed:
            return True

    async def aclose(self) -> None:
        await self.stream.aclose()


EXTRA_WAIT_S = 0.2
"""How long ``consume_exactly`` waits for a message too many: a daemon with the message ready
sends it within a few scheduler rounds."""


async def consume_exactly(
    address: Address, topic: str, channel: str, count: int
) -> list[bytes]:
    """SUB on ``channel`` (NSQ's way: SUB creates it), FIN ``count`` messages, and fail if one
    more arrives within ``EXTRA_WAIT_S``; their bodies, in the order received."""
    wire = await Wire.connect(address)
    await wire.sub(topic, channel, rdy=count + 10)
    got = []
    for _ in range(count):
        m = await wire.message()
        got.append(m.body)
        await wire.fin(m.id)
    with trio.move_on_after(EXTRA_WAIT_S):
        extra = await wire.message()
        raise AssertionError(f"one message too many: {extra.body!r}")
    await wire.aclose()
    return got


class Connect:
    """``await connect(address, **identify)`` -> a ``Wire``; ``defaults`` are IDENTIFY settings
    every wire sends (the call's own settings win)."""

    def __init__(self, **defaults: object) -> None:
        self.defaults = defaults
        self.opened: list[Wire] = []

    async def __call__(self, address: Address, **identify: object) -> Wire:
        wire = await Wire.connect(address, **{**self.defaults, **identify})
        self.opened.append(wire)
        return wire

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            for wire in self.opened:
                await wire.aclose()


@asynccontextmanager
async def open_connections(**defaults: object) -> AsyncIterator[Connect]:
    """A ``Connect`` whose wires are all closed on exit."""
    connect = Connect(**defaults)
    try:
        yield connect
    finally:
        await connect.aclose()


@pytest.fixture(name="connect")
async def connect_fixture() -> AsyncIterator[Connect]:
    """``await connect(address, **identify)`` -> a ``Wire``, closed at the end of the test."""
    async with open_connections() as connect:
        yield connect
