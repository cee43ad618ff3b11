"""A small trio V2 client for the durability tests: raw bytes through ``ClientConnection``.

Not a test module. Heartbeats are answered with NOP wherever frames are read, so a test may sit
idle as long as it likes; every read has the caller's ``fail_after`` around it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from lmqd.options import Options
from lmqd.protocol import (
    ClientConnection,
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
from lmqd.service import BoundAddresses, LmqDaemon

HEARTBEAT = b"_heartbeat_"


class ConnectionClosed(Exception):
    """The daemon closed (or reset) the connection."""


class Wire:
    """One V2 connection: send commands, read frames in order."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.codec = ClientConnection()
        self.frames: deque[FrameEvent] = deque()

    @classmethod
    async def connect(cls, address: tuple[str, int], **identify: object) -> Wire:
        """Connect, send the magic and IDENTIFY (heartbeats every 2 s unless given)."""
        stream = await trio.open_tcp_stream(*address)
        wire = cls(stream)
        settings = {"heartbeat_interval": 2000, **identify}
        await wire.send(ClientConnection.initial_bytes() + ClientConnection.send(settings))
        assert await wire.response() == b"OK"
        return wire

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ConnectionClosed(str(exc)) from None

    async def frame(self) -> FrameEvent:
        """The next frame that is not a heartbeat (heartbeats are answered)."""
        while True:
            while self.frames:
                event = self.frames.popleft()
                if isinstance(event, Response) and event.data == HEARTBEAT:
                    await self.send(Nop().encode())
                    continue
                return event
            try:
                data = await self.stream.receive_some(256 * 1024)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ConnectionClosed(str(exc)) from None
            if not data:
                raise ConnectionClosed("EOF")
            self.codec.receive_data(data)
            self.frames.extend(self.codec.next_events())

    async def response(self) -> bytes:
        event = await self.frame()
        assert isinstance(event, Response), event
        return event.data

    async def error(self) -> Error:
        event = await self.frame()
        assert isinstance(event, Error), event
        return event

    async def message(self) -> MessageFrame:
        event = await self.frame()
        assert isinstance(event, MessageFrame), event
        return event

    async def pub(self, topic: str, body: bytes) -> FrameEvent:
        await self.send(Pub(topic=topic, body=body).encode())
        return await self.frame()

    async def mpub(self, topic: str, bodies: list[bytes]) -> FrameEvent:
        await self.send(Mpub(topic=topic, bodies=bodies).encode())
        return await self.frame()

    async def dpub(self, topic: str, defer_ms: int, body: bytes) -> FrameEvent:
        await self.send(Dpub(topic=topic, defer_ms=defer_ms, body=body).encode())
        return await self.frame()

    async def sub(self, topic: str, channel: str, rdy: int = 0) -> None:
        await self.send(Sub(topic=topic, channel=channel).encode())
        assert await self.response() == b"OK"
        if rdy:
            await self.send(Rdy(count=rdy).encode())

    async def fin(self, msg_id: bytes) -> None:
        await self.send(b"FIN " + msg_id + b"\n")

    async def req(self, msg_id: bytes, delay_ms: int) -> None:
        await self.send(b"REQ " + msg_id + b" %d\n" % delay_ms)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def eventually(predicate: Callable[[], bool]) -> None:
    """Wait until ``predicate()`` holds (daemon state changes in other tasks, with no event to
    wait on); the caller's ``fail_after`` bounds the wait."""
    while True:  # polls daemon state
        if predicate():
            return
        await trio.sleep(0.005)


class Running:
    """An in-process ``LmqDaemon`` running in a test's nursery."""

    def __init__(self, daemon: LmqDaemon, address: tuple[str, int], done: trio.Event) -> None:
        self.daemon = daemon
        self.broker = daemon.broker
        self.address = address
        self.done = done

    async def stop(self) -> None:
        """Graceful shutdown, as SIGTERM does; returns once ``run()`` has finished."""
        self.daemon.shutdown()
        await self.done.wait()


async def start_daemon(nursery: trio.Nursery, data_path: Path, **overrides: Any) -> Running:
    """Start an ``LmqDaemon`` on 127.0.0.1 port 0 (no HTTP unless overridden) in ``data_path``."""
    settings: dict[str, Any] = {"tcp_address": "127.0.0.1:0", "http_address": ""}
    settings.update(overrides)
    options = Options(data_path=str(data_path), **settings)
    daemon = LmqDaemon(options)
    done = trio.Event()

    async def run(*, task_status: trio.TaskStatus[BoundAddresses]) -> None:
        try:
            await daemon.run(task_status=task_status)
        finally:
            done.set()

    bound = await nursery.start(run)
    return Running(daemon, bound.tcp, done)
