"""One V2 connection to one daemon, on anyio; the building block of Producer and Consumer.

Theory of operation
-------------------
The framing is the sans-IO ``lmqd.protocol.ClientConnection``; this module only moves bytes.
``run()`` connects, sends the magic and IDENTIFY (with ``feature_negotiation``), performs the
upgrades the daemon granted (TLS, then snappy or deflate, then AUTH: ``lmq_client.handshake``),
reports itself started, then runs a reader and a writer task until either ends. After the
upgrades the stream is an ``anyio.streams.tls.TLSStream`` and/or an
``lmq_client.streams.CompressedStream`` around the socket, and the two tasks do not know the
difference.

Everything async goes through anyio (task groups, events, cancel scopes, ``anyio.connect_tcp``),
so one code base runs in asyncio and trio applications alike; the protocol itself is the sans-IO
codec and knows neither.

After the handshake the connection's protocol state is a sans-IO ``lmq_client.core.Link``
(made by ``make_link``: the consumer core's own for a consumer): writing is a plain call that
appends to the link's output and wakes the writer, which sends everything pending in one
``send`` (a thousand FINs queued by message handlers cost one send); answers are matched to
commands in order, heartbeats get their ``NOP`` and errors are sorted there. The reader hands
each received buffer's decoded frames to ``receive`` (the consumer core's), or by default to the
link and the message frames, as one list, to ``on_messages``. A daemon silent for two heartbeat
intervals plus ``HEARTBEAT_GRACE`` is gone.

A publisher waiting for its answer need not wake the writer: it queues its command ``quiet`` and
sends it from its own task (``send_now``). On plain TCP, sends go straight to the socket while
the kernel takes them whole (``lmq_client.direct_send``: anyio's send yields to the loop once
per call). On asyncio, a producer's answers are handled in the transport's read callback
(``receive_in_callback``, ``lmq_client.aio_stream``): the reader task only waits for the end.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from anyio.abc import ByteStream, TaskStatus

from lmq_client._util import USER_AGENT, identify_body
from lmq_client.aio_stream import (
    AsyncioTcpStream,
    FutureEvent,
    connect_asyncio_tcp,
    running_asyncio,
)
from lmq_client.core.link import RECEIVE_SIZE, Link, max_rdy_count
from lmq_client.core.link import Reply as CoreReply
from lmq_client.direct_send import DirectSender
from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError, reason
from lmq_client.handshake import handshake
from lmq_client.transport import PLAIN, TransportOptions
from lmqd.net import split_address
from lmqd.protocol import ClientConnection, FrameEvent, MessageFrame

__all__ = ["Connection", "OneShotEvent", "Reply", "event_type", "open_tcp_stream"]

log = logging.getLogger("lmq_client.connection")

StreamOpener = Callable[[str], Awaitable[ByteStream]]
MessagesCallback = Callable[["Connection", list[MessageFrame]], None]
ErrorCallback = Callable[["Connection", NSQError], None]
LinkFactory = Callable[[dict[str, Any], float], Link]
"""``make_link(server_settings, now)``: the link for a connection whose handshake is done."""
Receiver = Callable[[Any, list[FrameEvent], float], None]
"""``receive(link, events, now)``: the decoded frames of one read."""


async def open_tcp_stream(address: str) -> ByteStream:
    """The default way to reach a daemon: TCP (Nagle off: commands are small); on asyncio a
    stream that can push what it receives (``lmq_client.aio_stream``)."""
    host, port = split_address(address)
    if running_asyncio():
        return await connect_asyncio_tcp(host, port)
    return await anyio.connect_tcp(host, port)


def event_type() -> Callable[[], OneShotEvent]:
    """The cheapest one-shot event of the running loop, for a ``Reply`` per command:
    ``anyio.Event()`` asks which loop runs each time (~6 us), its backend's class does not, and
    on asyncio a bare future does less still (``aio_stream.FutureEvent``)."""
    return FutureEvent if running_asyncio() else type(anyio.Event())


class OneShotEvent(Protocol):
    """What a ``Reply`` needs of an event: ``anyio.Event`` or ``aio_stream.FutureEvent``."""

    def set(self) -> None: ...

    async def wait(self) -> None: ...


class Reply(CoreReply):
    """The daemon's answer to one command, to be awaited with ``wait()``."""

    __slots__ = ("_event",)

    def __init__(self, event: OneShotEvent | None = None) -> None:
        super().__init__()
        self._event = anyio.Event() if event is None else event
        self.waker = self._event.set

    async def wait(self) -> bytes:
        """The response frame's data (``b"OK"``...); raises ``NSQError`` or ``ConnectionFailed``."""
        await self._event.wait()
        return self.result()


class Connection:
    """A V2 connection to the daemon at ``address``; ``await task_group.start(conn.run)`` opens
    it.

    ``identify`` holds extra IDENTIFY keys (``msg_timeout`` in ms, ``output_buffer_timeout``...);
    ``server_settings`` is the daemon's answer to IDENTIFY (``max_rdy_count``...);
    ``transport`` asks for TLS, compression and gives the AUTH secret; ``auth_identity`` is the
    daemon's answer to AUTH (``identity``, ``identity_url``, ``permission_count``), if it asked.
    """

    def __init__(
        self,
        address: str,
        *,
        heartbeat_interval: float = 30.0,
        connect_timeout: float = 5.0,
        identify: dict[str, Any] | None = None,
        on_messages: MessagesCallback | None = None,
        on_error: ErrorCallback | None = None,
        open_stream: StreamOpener = open_tcp_stream,
        transport: TransportOptions = PLAIN,
        make_link: LinkFactory | None = None,
        receive: Receiver | None = None,
        receive_in_callback: bool = False,
    ) -> None:
        self.address = address
        self.heartbeat_interval = heartbeat_interval
        self.connect_timeout = connect_timeout
        self.transport = transport
        self.identify = identify_body(heartbeat_interval=heartbeat_interval, user_agent=USER_AGENT)
        self.identify.update(transport.identify_fields())
        self.identify.update(identify or {})
        self.on_messages = on_messages
        self.on_error = on_error
        self.server_settings: dict[str, Any] = {}
        self.auth_identity: dict[str, Any] | None = None
        self.link: Link | None = None
        """The protocol state, once the handshake is done."""
        self._make_link = make_link
        self._receive = receive
        self.receive_in_callback = receive_in_callback
        """``receive`` may run in asyncio's read callback (``lmq_client.aio_stream``)."""
        self._handshake_error: LmqClientError | None = None
        self._open_stream = open_stream
        self._codec = ClientConnection()
        self._stream: ByteStream | None = None
        self._wake_writer = anyio.Event()
        self._writer_parked = False
        self._sender: DirectSender | None = None
        self.quiet = False
        """While set, queued output does not wake the writer (``send_now`` sends it)."""
        self._sending = False
        self._flushed: anyio.Event | None = None
        """Made by ``flush()`` when it has to wait; set by the writer once nothing is left."""
        # A cancel scope needs a running event loop: made when ``run`` starts.
        self._cancel: anyio.CancelScope | None = None
        self._close_requested = False
        self._closed = anyio.Event()

    def __repr__(self) -> str:
        return f"<Connection {self.address} open={self.is_open}>"

    @property
    def is_open(self) -> bool:
        """True between the end of the handshake and the end of the connection."""
        return self.link is not None and self.link.open

    @property
    def error(self) -> LmqClientError | None:
        """Why the connection ended (None while it is open)."""
        return self.link.error if self.link is not None else self._handshake_error

    @property
    def max_rdy_count(self) -> int:
        """The daemon's RDY ceiling (pynsq assumes 2500 when the daemon does not say)."""
        return max_rdy_count(self.server_settings)

    # -- writing ---------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue bytes (one or more encoded commands) for the writer; never blocks."""
        if self.link is None:
            raise ConnectionFailed(self.address, "not connected")
        self.link.write(data)

    def command(self, data: bytes) -> Reply:
        """Queue a command that the daemon answers; ``await reply.wait()`` for the answer."""
        if self.link is None:
            raise ConnectionFailed(self.address, "not connected")
        reply = Reply()
        self.link.command(data, reply)
        return reply

    async def request(self, data: bytes) -> bytes:
        """Send a command and wait for its answer (see ``Reply.wait``)."""
        return await self.command(data).wait()

    def _output_queued(self) -> None:
        if self._writer_parked and not self.quiet:
            self._writer_parked = False
            self._wake_writer.set()

    async def send_now(self) -> None:
        """Send what is queued from this task, unless a send is under way (which takes it
        along): a publisher waiting for its answer saves the writer task's wake-up (queue its
        command with ``quiet`` set, so the writer is not woken for it). A send cancelled half-way
        may have sent part of a command: the connection is closed then."""
        link = self.link
        sender = self._sender
        if self._sending or link is None or sender is None or not link.open:
            return
        self._sending = True
        try:
            while data := link.take_output():
                await sender.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._lost(link, f"connection lost while writing ({reason(exc)})")
        except anyio.get_cancelled_exc_class():
            self._lost(link, "a send was cancelled half-way")
            if self._cancel is not None:
                self._cancel.cancel()
            raise
        finally:
            self._sending = False
        if link.out:
            self._output_queued()

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(
        self, *, task_status: TaskStatus[Connection] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect and handshake (then report started), and serve until closed or lost.

        Raises ``ConnectionFailed`` or ``NSQError`` if the handshake fails; afterwards a lost
        connection just returns, with the reason in ``self.error``.
        """
        self._cancel = anyio.CancelScope()
        if self._close_requested:
            self._cancel.cancel()
        with self._cancel:
            try:
                await self._connect()
                now = anyio.current_time()
                if self._make_link is not None:
                    link = self._make_link(self.server_settings, now)
                else:
                    link = Link(self.address, heartbeat_interval=self.heartbeat_interval,
                                now=now, settings=self.server_settings)  # fmt: skip
                link.wake = self._output_queued
                if self.on_error is not None:
                    on_error = self.on_error
                    link.on_error = lambda _, error: on_error(self, error)
                self.link = link
                if link.out:
                    self._output_queued()
                task_status.started(self)
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._writer, link, tasks.cancel_scope)
                    await self._reader(link)
                    tasks.cancel_scope.cancel()
            except LmqClientError as exc:
                self._handshake_error = exc
                raise
            finally:
                self._shutdown()
                if self._stream is not None:
                    with anyio.CancelScope(shield=True):
                        await self._stream.aclose()

    async def aclose(self) -> None:
        """Close now (no goodbye: outstanding commands fail with ``ConnectionFailed``)."""
        self._close_requested = True
        if self._cancel is not None:
            self._cancel.cancel()
        if self._stream is not None or self.link is not None:
            await self._closed.wait()

    async def wait_closed(self) -> None:
        """Wait until the connection has ended, for whatever reason."""
        await self._closed.wait()

    async def flush(self) -> None:
        """Wait until everything written so far was sent (or the connection ended)."""
        link = self.link
        if self._closed.is_set() or link is None or not (link.out or self._sending):
            return
        if self._flushed is None:
            self._flushed = anyio.Event()
        await self._flushed.wait()

    def _shutdown(self) -> None:
        if self._sender is not None:
            self._sender.forget()
        if self.link is not None:
            self.link.lost(ConnectionFailed(self.address, "connection closed"))
        self._set_flushed()
        self._closed.set()

    def _set_flushed(self) -> None:
        flushed, self._flushed = self._flushed, None
        if flushed is not None:
            flushed.set()

    def _lost(self, link: Link, why: str) -> None:
        if link.error is None:
            log.info("NSQD(%s): %s", self.address, why)
            link.lost(ConnectionFailed(self.address, why))

    async def _connect(self) -> None:
        try:
            with anyio.fail_after(self.connect_timeout):
                self._stream = await self._open_stream(self.address)
                done = await handshake(self._stream, self.address, self.identify, self.transport)
        except TimeoutError:
            raise ConnectionFailed(self.address, "timed out connecting") from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise ConnectionFailed(self.address, f"cannot connect ({reason(exc)})") from None
        self._stream = done.stream
        self.server_settings = done.server_settings
        self.auth_identity = done.auth_identity
        self._sender = DirectSender(self._stream)
        log.debug("NSQD(%s): connected, %s", self.address, self.server_settings)

    # -- the two tasks ---------------------------------------------------------------------------

    async def _writer(self, link: Link, cancel: anyio.CancelScope) -> None:
        sender = self._sender
        assert sender is not None
        try:
            while True:
                data = b"" if self._sending else link.take_output()
                if not data:
                    self._set_flushed()
                    # One event per wait, not per write: writes while the writer is busy add to
                    # ``link.out``, which it takes when its send is done.
                    self._wake_writer = anyio.Event()
                    self._writer_parked = True
                    await self._wake_writer.wait()
                    continue
                self._sending = True
                await sender.send(data)
                self._sending = False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._lost(link, f"connection lost while writing ({reason(exc)})")
        finally:
            cancel.cancel()

    def _received(self, link: Link, data: bytes, now: float) -> bool:
        """Handle one chunk from the daemon; False once the link is closed."""
        link.heard_at = now
        codec = self._codec
        codec.receive_data(data)
        receive = self._receive or self._receive_frames
        try:
            while events := codec.next_events():
                receive(link, events, now)
        except Exception as exc:  # a malformed frame: nothing more can be trusted
            log.warning("NSQD(%s): protocol error", self.address, exc_info=True)
            self._lost(link, f"protocol error ({exc})")
        return link.open

    async def _reader(self, link: Link) -> None:
        stream = self._stream
        assert stream is not None
        pushed = stream if isinstance(stream, AsyncioTcpStream) else None
        if pushed is not None and self.receive_in_callback:
            pushed.push(lambda data, now: self._received(link, data, now))
        else:
            pushed = None
        # The silence deadline is checked when a scope set for it expires, not re-armed on every
        # read (a timer per read cost a few us on asyncio): the scope is set again from the
        # time of the last read until a whole silence limit has passed without one. A cancelled
        # receive loses no data.
        while link.open:
            with anyio.CancelScope(deadline=link.heard_at + link.silence_limit) as silence:
                if pushed is not None:
                    await pushed.wait_ended()  # what arrives is handled by _received
                    self._lost(link, pushed.end_reason)
                    return
                while link.open:
                    try:
                        data = await stream.receive(RECEIVE_SIZE)
                    except anyio.EndOfStream:
                        self._lost(link, "connection closed by the daemon")
                        return
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                        self._lost(link, f"connection lost ({reason(exc)})")
                        return
                    # Socket streams give bytes already; bytes() of bytes is free.
                    if not self._received(link, bytes(data), anyio.current_time()):
                        return
            if silence.cancelled_caught and link.silent(anyio.current_time()):
                log.info("NSQD(%s): %s", self.address, link.error)
                return

    def _receive_frames(self, link: Link, events: list[FrameEvent], now: float) -> None:
        messages = link.receive(events, now)
        if messages and self.on_messages is not None:
            self.on_messages(self, messages)
