"""One V2 connection to one daemon, on anyio; the building block of Producer and Consumer.

Theory of operation
-------------------
The framing is the sans-IO ``lmqd.protocol.ClientConnection``; this module only moves bytes.
``run()`` connects, sends the magic and IDENTIFY (with ``feature_negotiation``), performs the
upgrades the daemon granted (TLS, then snappy or deflate, then AUTH: ``lmq_client.transport``),
reports itself started, then runs a reader and a writer task until either ends. After the
upgrades the stream is an ``anyio.streams.tls.TLSStream`` and/or an
``lmq_client.streams.CompressedStream`` around the socket, and the two tasks do not know the
difference.

Everything async goes through anyio (task groups, events, cancel scopes, ``anyio.connect_tcp``),
so one code base runs in asyncio and trio applications alike; the protocol itself is the sans-IO
codec and knows neither.

Writing is synchronous: ``write()`` appends bytes to an output list and wakes the writer, which
sends everything pending in one ``send``. So a thousand FINs queued by message handlers cost
one send, and commands keep the order in which they were written.

Commands that the daemon answers (IDENTIFY, SUB, PUB, MPUB, DPUB, CLS) get a ``Reply``; the daemon
answers them in order (go-nsq#320: the protocol is FIFO on one connection), so replies are a
deque matched to response and error frames as they arrive. That is what lets a Producer pipeline:
many publishes in flight, each caller woken by its own answer. ``_heartbeat_`` frames are not
answers: the reader writes ``NOP`` for them. Non-fatal errors (E_FIN_FAILED, E_REQ_FAILED,
E_TOUCH_FAILED) answer nothing either; they go to ``on_error``. A fatal error answers the oldest
outstanding command; the daemon then closes, and every other outstanding command fails with
``ConnectionFailed`` (the daemon stored nothing after the failing command).

Message frames are handed to ``on_messages`` once per received buffer, as a list, so a consumer
handles a burst of deliveries with one call.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import ByteStream, TaskStatus

from lmq_client._util import USER_AGENT, identify_body, parse_identify_response
from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError, error_from_frame
from lmq_client.streams import CompressedStream, PrefixedStream, start_tls
from lmq_client.transport import (
    PLAIN,
    FrameReader,
    TransportOptions,
    parse_auth_answer,
    plan_upgrades,
)
from lmqd.net import split_address
from lmqd.protocol import (
    Auth,
    ClientConnection,
    Error,
    MessageFrame,
    Nop,
    Response,
    encode_identify,
)

__all__ = ["Connection", "Reply", "open_tcp_stream"]

log = logging.getLogger("lmq_client.connection")

# One receive takes up to this much: a full RDY window of small messages in one call.
RECEIVE_SIZE = 256 * 1024
# Extra time past two heartbeat intervals before declaring the daemon dead: the daemon's ticker
# and our clock drift apart a little, and a busy daemon may send a heartbeat late.
HEARTBEAT_GRACE = 5.0

StreamOpener = Callable[[str], Awaitable[ByteStream]]
MessagesCallback = Callable[["Connection", list[MessageFrame]], None]
ErrorCallback = Callable[["Connection", NSQError], None]


async def open_tcp_stream(address: str) -> ByteStream:
    """The default way to reach a daemon: TCP (anyio turns Nagle off: commands are small)."""
    host, port = split_address(address)
    return await anyio.connect_tcp(host, port)


class Reply:
    """The daemon's answer to one command, to be awaited with ``wait()``."""

    __slots__ = ("_data", "_done", "_error")

    def __init__(self) -> None:
        self._done = anyio.Event()
        self._data = b""
        self._error: BaseException | None = None

    def set(self, data: bytes) -> None:
        self._data = data
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    @property
    def done(self) -> bool:
        """True once the answer (or the failure) arrived."""
        return self._done.is_set()

    async def wait(self) -> bytes:
        """The response frame's data (``b"OK"``...); raises ``NSQError`` or ``ConnectionFailed``."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._data


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
        self.error: LmqClientError | None = None
        """Why the connection ended (None while it is open or after a clean close)."""
        self._open_stream = open_stream
        self._codec = ClientConnection()
        self._stream: ByteStream | None = None
        self._out: list[bytes] = []
        self._wake_writer = anyio.Event()
        self._flushed = anyio.Event()
        self._flushed.set()
        self._replies: deque[Reply] = deque()
        # A cancel scope needs a running event loop: made when ``run`` starts.
        self._cancel: anyio.CancelScope | None = None
        self._close_requested = False
        self._closed = anyio.Event()
        self._open = False

    def __repr__(self) -> str:
        return f"<Connection {self.address} open={self._open}>"

    @property
    def is_open(self) -> bool:
        """True between the end of the handshake and the end of the connection."""
        return self._open

    @property
    def max_rdy_count(self) -> int:
        """The daemon's RDY ceiling (pynsq assumes 2500 when the daemon does not say)."""
        value = self.server_settings.get("max_rdy_count", 2500)
        return value if isinstance(value, int) and value > 0 else 2500

    # -- writing ---------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue bytes (one or more encoded commands) for the writer; never blocks."""
        if not self._open:
            raise self._not_open()
        self._out.append(data)
        self._wake_writer.set()
        if self._flushed.is_set():
            self._flushed = anyio.Event()

    def command(self, data: bytes) -> Reply:
        """Queue a command that the daemon answers; ``await reply.wait()`` for the answer."""
        self.write(data)
        reply = Reply()
        self._replies.append(reply)
        return reply

    async def request(self, data: bytes) -> bytes:
        """Send a command and wait for its answer (see ``Reply.wait``)."""
        return await self.command(data).wait()

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
                self._open = True
                task_status.started(self)
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._writer, tasks.cancel_scope)
                    await self._reader()
                    tasks.cancel_scope.cancel()
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
        if self._open or self._stream is not None:
            await self._closed.wait()

    async def wait_closed(self) -> None:
        """Wait until the connection has ended, for whatever reason."""
        await self._closed.wait()

    async def flush(self) -> None:
        """Wait until everything written so far was sent (or the connection ended)."""
        await self._flushed.wait()

    def _not_open(self) -> ConnectionFailed:
        if self.error is None:
            return ConnectionFailed(self.address, "not connected")
        if isinstance(self.error, ConnectionFailed):
            return ConnectionFailed(self.address, self.error.reason)
        return ConnectionFailed(self.address, f"connection closed after {self.error}")

    def _shutdown(self) -> None:
        self._open = False
        if self.error is None:
            self.error = ConnectionFailed(self.address, "connection closed")
        # Each waiter gets its own exception object: one instance raised in many tasks would
        # collect all their tracebacks.
        while self._replies:
            self._replies.popleft().fail(self._not_open())
        self._out.clear()
        self._flushed.set()
        self._closed.set()

    def _lost(self, reason: str) -> None:
        if self.error is None:
            self.error = ConnectionFailed(self.address, reason)
            log.info("NSQD(%s): %s", self.address, reason)

    async def _connect(self) -> None:
        reader = FrameReader(self.address)
        try:
            with anyio.fail_after(self.connect_timeout):
                self._stream = await self._open_stream(self.address)
                await self._stream.send(
                    self._codec.initial_bytes() + encode_identify(self.identify)
                )
                self.server_settings = parse_identify_response(await self._handshake_frame(reader))
                await self._upgrade(reader)
        except TimeoutError:
            raise ConnectionFailed(self.address, "timed out connecting") from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise ConnectionFailed(self.address, f"cannot connect ({_reason(exc)})") from None
        log.debug("NSQD(%s): connected, %s", self.address, self.server_settings)

    async def _upgrade(self, reader: FrameReader) -> None:
        """TLS, compression, AUTH, as the daemon's IDENTIFY answer says (nsqd's order)."""
        assert self._stream is not None
        upgrades = plan_upgrades(self.transport, self.server_settings, self.address)
        if upgrades.tls:
            host, _ = split_address(self.address)
            # The handshake is bounded by connect_timeout, like the rest of _connect.
            self._stream = await start_tls(
                self._with_rest(reader), self.transport.ssl_context(), server_hostname=host
            )
            await self._expect_ok(reader, "TLS")
        if upgrades.codec is not None:
            self._stream = CompressedStream(self._with_rest(reader), upgrades.codec)
            await self._expect_ok(reader, upgrades.codec.name)
        if upgrades.auth_secret is not None:
            await self._stream.send(Auth(secret=upgrades.auth_secret).encode())
            self.auth_identity = parse_auth_answer(await self._handshake_frame(reader))
            log.info("NSQD(%s): authenticated as %s", self.address, self.auth_identity)
        # Frames that came right behind the last handshake frame go to the reader task.
        self._stream = self._with_rest(reader)

    def _with_rest(self, reader: FrameReader) -> ByteStream:
        assert self._stream is not None
        rest = reader.take_rest()
        return PrefixedStream(self._stream, rest) if rest else self._stream

    async def _expect_ok(self, reader: FrameReader, upgrade: str) -> None:
        data = await self._handshake_frame(reader)
        if data != b"OK":
            raise ConnectionFailed(self.address, f"invalid answer {data[:50]!r} after {upgrade}")

    async def _handshake_frame(self, reader: FrameReader) -> bytes:
        assert self._stream is not None
        while True:
            data = reader.next_response()
            if data is not None:
                return data
            try:
                received = await self._stream.receive(RECEIVE_SIZE)
            except anyio.EndOfStream:
                raise ConnectionFailed(
                    self.address, "connection closed during the handshake"
                ) from None
            reader.receive_data(bytes(received))

    # -- the two tasks ---------------------------------------------------------------------------

    async def _writer(self, cancel: anyio.CancelScope) -> None:
        stream = self._stream
        assert stream is not None
        try:
            while True:
                if not self._out:
                    self._flushed.set()
                    await self._wake_writer.wait()
                    self._wake_writer = anyio.Event()
                    continue
                data = b"".join(self._out)
                self._out.clear()
                await stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._lost(f"connection lost while writing ({_reason(exc)})")
        finally:
            cancel.cancel()

    async def _reader(self) -> None:
        stream = self._stream
        assert stream is not None
        codec = self._codec
        timeout = (
            2 * self.heartbeat_interval + HEARTBEAT_GRACE
            if self.heartbeat_interval > 0
            else math.inf
        )
        while True:
            with anyio.move_on_after(timeout):
                try:
                    data = await stream.receive(RECEIVE_SIZE)
                except anyio.EndOfStream:
                    self._lost("connection closed by the daemon")
                    return
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    self._lost(f"connection lost ({_reason(exc)})")
                    return
                # Socket streams give bytes already; bytes() of bytes is free.
                codec.receive_data(bytes(data))
                try:
                    while events := codec.next_events():
                        self._dispatch(events)
                except Exception as exc:  # a malformed frame: nothing more can be trusted
                    log.warning("NSQD(%s): protocol error", self.address, exc_info=True)
                    self._lost(f"protocol error ({exc})")
                    return
                if not self._open:  # a fatal error frame
                    return
                continue
            self._lost(f"no data for {timeout:.0f}s (heartbeats missed)")
            return

    def _dispatch(self, events: list[Response | Error | MessageFrame]) -> None:
        messages: list[MessageFrame] = []
        for event in events:
            if type(event) is MessageFrame:
                messages.append(event)
            elif isinstance(event, Response):
                if event.is_heartbeat:
                    self.write(Nop().encode())
                elif self._replies:
                    self._replies.popleft().set(event.data)
                else:
                    log.warning("NSQD(%s): unexpected response %r", self.address, event.data)
            elif isinstance(event, Error):
                error = error_from_frame(event.code, event.text, address=self.address)
                if not error.fatal:
                    log.info("NSQD(%s): %s", self.address, error)
                    if self.on_error is not None:
                        self.on_error(self, error)
                    continue
                log.warning("NSQD(%s): %s", self.address, error)
                # The daemon closes after a fatal error: refuse new commands right away, so a
                # Producer reconnects instead of writing into the dying connection.
                self.error = error
                self._open = False
                if self._replies:
                    self._replies.popleft().fail(error)
                elif self.on_error is not None:
                    self.on_error(self, error)
                break
        if messages and self.on_messages is not None:
            self.on_messages(self, messages)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, anyio.BrokenResourceError) and exc.__cause__ is not None:
        # a failed TLS handshake or a corrupt compressed stream: the cause says which
        return str(exc.__cause__) or type(exc.__cause__).__name__
    return str(exc) or type(exc).__name__
