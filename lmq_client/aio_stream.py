"""A TCP stream for asyncio that can hand what it receives straight to a function.

Theory of operation
-------------------
anyio's asyncio socket stream keeps received bytes in a queue for ``receive()``: every receive
resumes and pauses the transport's reading (two ``epoll_ctl`` calls) and the bytes reach the
reading task one turn of the event loop after they arrived. A publisher waiting for its ``OK``
pays that on every publish, and then a second turn to be woken by the reading task: on this
machine it made the asyncio producer the slowest of lmq's front ends (~0.95 us of CPU a message
against 0.55 for a hand-written asyncio protocol doing the same MPUBs; docs/benchmarks.md).

``AsyncioTcpStream`` is an ``anyio.abc.SocketStream`` over an asyncio protocol of its own. Until
told otherwise it behaves as anyio's (``receive`` from a queue, reading paused between receives,
so TLS, compression and the handshake run over it unchanged). ``push(on_data)`` switches it for
good: every later chunk goes to ``on_data(data, now)`` inside the event loop's read callback, and
``wait_ended()`` returns when the connection ends or ``on_data`` returns False. ``on_data`` runs
outside any task: it must not await, nor call anything that asks anyio which loop runs it
(``anyio.Event()``, ``anyio.current_time()``): setting an event made earlier is fine. The
producer's answers are handled there (``Connection(receive_in_callback=True)``); the consumer's,
which create events, are not. ``open_tcp_stream`` uses it under asyncio; trio has no such cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Callable

import anyio
from anyio.abc import SocketStream

from lmq_client._util import receive_buffer
from lmq_client.errors import reason

__all__ = ["AsyncioTcpStream", "FutureEvent", "connect_asyncio_tcp", "running_asyncio"]

PushTarget = Callable[[bytes, float], bool]
"""``on_data(data, now) -> keep_going``: ``now`` is the event loop's clock (anyio's, on asyncio)."""


class _Protocol(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        # A plain Protocol's transport reads with recv(256 KiB): see receive_buffer.
        self.buffer = receive_buffer()
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.readable = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.ended = asyncio.Event()
        self.exception: BaseException | None = None
        self.at_eof = False
        self.on_data: PushTarget | None = None
        self.time: Callable[[], float] = asyncio.get_running_loop().time

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(0)  # a send waits until the kernel took it all

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self.buffer[:nbytes])
        on_data = self.on_data
        if on_data is None:
            self.chunks.append(data)
            self.readable.set()
        elif not on_data(data, self.time()):
            self.on_data = None
            self.ended.set()

    def eof_received(self) -> bool:
        self.at_eof = True
        self.readable.set()
        self.ended.set()
        return True  # half-closed: the transport is closed by aclose

    def connection_lost(self, exc: Exception | None) -> None:
        self.exception = exc
        self.readable.set()
        self.writable.set()
        self.ended.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()


class FutureEvent:
    """A one-shot event on asyncio, with ``anyio.Event``'s ``set`` and ``wait``: one future.
    ``anyio.Event()`` asks which loop runs and wraps an ``asyncio.Event`` (~4 us to make on
    this machine, and its wait makes a future anyway); a producer makes one per publish."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    def is_set(self) -> bool:
        return self._future.done()

    async def wait(self) -> None:
        """Until ``set`` (a cancelled wait cancels the event: it is waited for once)."""
        await self._future


class AsyncioTcpStream(SocketStream):
    """A TCP connection on asyncio, pulled with ``receive`` or pushed with ``push``."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._closed = False

    @property
    def _raw_socket(self) -> socket.socket:
        sock: socket.socket = self._transport.get_extra_info("socket")
        return sock

    @property
    def end_reason(self) -> str:
        """Why the connection ended, in words (for a log line)."""
        protocol = self._protocol
        if protocol.exception is not None:
            return f"connection lost ({reason(protocol.exception)})"
        return "connection closed by the daemon" if protocol.at_eof else "connection closed"

    async def receive(self, max_bytes: int = 65536) -> bytes:
        protocol = self._protocol
        if protocol.on_data is not None:
            raise RuntimeError("the stream pushes what it receives")
        if not protocol.readable.is_set() and not self._transport.is_closing():
            self._transport.resume_reading()
            try:
                await protocol.readable.wait()
            finally:
                self._transport.pause_reading()
        else:
            await anyio.lowlevel.checkpoint()
        if not protocol.chunks:
            if self._closed:
                raise anyio.ClosedResourceError
            if protocol.exception is not None:
                raise anyio.BrokenResourceError from protocol.exception
            raise anyio.EndOfStream
        chunk = protocol.chunks.popleft()
        if len(chunk) > max_bytes:
            protocol.chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        if not protocol.chunks and not protocol.at_eof and protocol.exception is None:
            protocol.readable.clear()
        return chunk

    def push(self, on_data: PushTarget) -> None:
        """From now on hand every received chunk to ``on_data`` (see the module docstring),
        those already queued first."""
        protocol = self._protocol
        while protocol.chunks:
            if not on_data(protocol.chunks.popleft(), protocol.time()):
                protocol.ended.set()
                return
        protocol.on_data = on_data
        if not self._transport.is_closing():
            self._transport.resume_reading()

    async def wait_ended(self) -> None:
        """Until the connection ended or the pushed-to function returned False."""
        await self._protocol.ended.wait()

    async def send(self, item: bytes) -> None:
        protocol = self._protocol
        if self._closed:
            raise anyio.ClosedResourceError
        if protocol.exception is not None or self._transport.is_closing():
            raise anyio.BrokenResourceError from protocol.exception
        self._transport.write(item)
        if protocol.writable.is_set():
            await anyio.lowlevel.cancel_shielded_checkpoint()  # sent: a cancel now would lie
            return
        await protocol.writable.wait()
        if self._closed:
            raise anyio.ClosedResourceError
        if protocol.exception is not None:
            raise anyio.BrokenResourceError from protocol.exception

    async def send_eof(self) -> None:
        with contextlib.suppress(OSError):
            self._transport.write_eof()

    async def aclose(self) -> None:
        self._closed = True
        self._transport.abort()
        await anyio.lowlevel.checkpoint()


def running_asyncio() -> bool:
    """Whether the calling task runs on asyncio (not trio, nor trio as asyncio's guest)."""
    import trio  # a core dependency: imported already wherever anyio runs on it

    if trio.lowlevel.in_trio_run():
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def connect_asyncio_tcp(host: str, port: int) -> AsyncioTcpStream:
    """Connect to ``host:port`` (asyncio turns Nagle off for TCP); ``OSError`` if it cannot."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(_Protocol, host, port)
    return AsyncioTcpStream(transport, protocol)
