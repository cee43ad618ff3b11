"""Blocking clients on plain sockets: no event loop, for scripts and Spark executors.

``Producer`` sends one command at a time and waits for its answer, answering any heartbeat that
arrives meanwhile with NOP. Before each command it also reads whatever arrived while it was idle:
heartbeats get their NOP, and a connection the daemon closed (for instance after heartbeats went
unanswered for a long idle spell) is noticed there and replaced before anything is sent, so an
idle producer never loses a publish to a stale socket.

``Consumer`` is deliberately simple: one daemon, ``RDY max_in_flight``, and messages from
``get()`` or iteration, answered with the same ``Message`` API as the trio consumer.

Both take ``transport`` (``lmq_client.transport.TransportOptions``): the connection then performs
the upgrades the daemon grants after IDENTIFY, as the trio client does: TLS with
``ssl.SSLContext.wrap_socket`` on the same socket, compression with lmqd's codecs around every
send and receive, then AUTH.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import select
import socket
import ssl
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

from lmq_client._util import (
    address_list,
    check_name,
    identify_body,
    parse_identify_response,
)
from lmq_client.errors import (
    ConnectionFailed,
    LmqClientError,
    NSQError,
    all_addresses_failed,
    error_from_frame,
)
from lmq_client.message import Message
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
    Cls,
    Dpub,
    Error,
    MessageFrame,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Response,
    Sub,
)
from lmqd.transport.compression import CompressionError, StreamCodec

__all__ = ["Consumer", "Message", "Producer"]

log = logging.getLogger("lmq_client.sync")

RECEIVE_SIZE = 256 * 1024
_NOP = Nop().encode()


class _SocketConnection:
    """One blocking V2 connection: handshake and upgrades, send, read frames with a timeout."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float,
        heartbeat_interval: float,
        identify: dict[str, Any] | None = None,
        transport: TransportOptions = PLAIN,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._codec = ClientConnection()
        self._events: collections.deque[Response | Error | MessageFrame] = collections.deque()
        self._compression: StreamCodec | None = None
        self._open = False
        self.auth_identity: dict[str, Any] | None = None
        host, port = split_address(address)
        try:
            self._sock: socket.socket = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise ConnectionFailed(address, f"cannot connect ({_reason(exc)})") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._open = True
        body = identify_body(heartbeat_interval=heartbeat_interval)
        body.update(transport.identify_fields())
        body.update(identify or {})
        try:
            self.sendall(self._codec.initial_bytes() + self._codec.send(body))
            reader = FrameReader(address)
            self.server_settings = parse_identify_response(self._handshake_frame(reader))
            self._upgrade(reader, transport, host)
        except BaseException:
            self.close()
            raise

    def _upgrade(self, reader: FrameReader, transport: TransportOptions, host: str) -> None:
        """TLS, compression, AUTH, as the daemon's IDENTIFY answer says (nsqd's order)."""
        upgrades = plan_upgrades(transport, self.server_settings, self.address)
        if upgrades.tls:
            if reader.take_rest():
                raise ConnectionFailed(self.address, "unexpected data before the TLS handshake")
            context = transport.ssl_context()
            try:
                self._sock = context.wrap_socket(self._sock, server_hostname=host)
            except (ssl.SSLError, ssl.CertificateError) as exc:
                raise ConnectionFailed(self.address, f"TLS handshake failed ({exc})") from None
            except OSError as exc:
                reason = _reason(exc)
                raise ConnectionFailed(self.address, f"TLS handshake failed ({reason})") from None
            self._expect_ok(reader, "TLS")
        if upgrades.codec is not None:
            self._compression = upgrades.codec
            # What followed the plaintext answer was already compressed.
            reader.receive_data(self._decompress(reader.take_rest()))
            self._expect_ok(reader, upgrades.codec.name)
        if upgrades.auth_secret is not None:
            self.sendall(Auth(secret=upgrades.auth_secret).encode())
            self.auth_identity = parse_auth_answer(self._handshake_frame(reader))
        rest = reader.take_rest()
        if rest:
            self._parse(rest)

    def _expect_ok(self, reader: FrameReader, upgrade: str) -> None:
        data = self._handshake_frame(reader)
        if data != b"OK":
            self.close()
            raise ConnectionFailed(self.address, f"invalid answer {data[:50]!r} after {upgrade}")

    def _handshake_frame(self, reader: FrameReader) -> bytes:
        deadline = time.monotonic() + self.timeout
        while True:
            data = reader.next_response()
            if data is not None:
                return data
            received = self._read(max(0.0, deadline - time.monotonic()))
            if received is None:
                raise ConnectionFailed(
                    self.address, f"no answer within {self.timeout:g}s during the handshake"
                )
            reader.receive_data(received)

    @property
    def is_open(self) -> bool:
        return self._open

    def write(self, data: bytes) -> None:
        """``Message`` answers go straight to the socket."""
        if self._open:
            self.sendall(data)

    def sendall(self, data: bytes) -> None:
        if self._compression is not None:
            data = self._compression.compress(data)
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self.close()
            raise ConnectionFailed(self.address, f"connection lost ({_reason(exc)})") from None

    def close(self) -> None:
        if self._open:
            self._open = False
            self._sock.close()

    def _decompress(self, data: bytes) -> bytes:
        assert self._compression is not None
        try:
            return self._compression.decompress(data)
        except CompressionError as exc:
            self.close()
            raise ConnectionFailed(self.address, f"connection lost ({exc})") from None

    def _buffered(self) -> bool:
        """Bytes are ready without reading the socket (TLS records, pending decompression)."""
        if self._compression is not None and self._compression.has_pending_output:
            return True
        return isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0

    def _read(self, timeout: float | None) -> bytes | None:
        """Plaintext bytes (after TLS and decompression), None if none came within ``timeout``.

        EOF and errors close the connection and raise ``ConnectionFailed``.
        """
        if self._compression is not None and self._compression.has_pending_output:
            out = self._decompress(b"")
            if out:
                return out
        while True:
            self._sock.settimeout(timeout)
            try:
                data = self._sock.recv(RECEIVE_SIZE)
            except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
                return None
            except OSError as exc:
                self.close()
                raise ConnectionFailed(self.address, f"connection lost ({_reason(exc)})") from None
            if not data:
                if self._compression is not None:
                    try:
                        self._compression.end_of_input()
                    except CompressionError as exc:
                        self.close()
                        raise ConnectionFailed(self.address, f"connection lost ({exc})") from None
                self.close()
                raise ConnectionFailed(self.address, "connection closed by the daemon")
            if self._compression is None:
                return data
            out = self._decompress(data)
            if out:
                return out
            # only part of a compressed chunk: read on

    def _parse(self, data: bytes) -> None:
        self._codec.receive_data(data)
        try:
            while events := self._codec.next_events():
                self._events.extend(events)
        except Exception as exc:
            self.close()
            raise ConnectionFailed(self.address, f"protocol error ({exc})") from None

    def _receive(self, timeout: float | None) -> bool:
        """Read once (waiting up to ``timeout``); False if nothing arrived in time."""
        data = self._read(timeout)
        if data is None:
            return False
        self._parse(data)
        return True

    def next_event(self, timeout: float | None) -> Response | Error | MessageFrame | None:
        """The next frame that is not a heartbeat (answered here), or None after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self._events:
                event = self._events.popleft()
                if isinstance(event, Response) and event.is_heartbeat:
                    self.sendall(_NOP)
                    continue
                return event
            # Heartbeats must not extend the wait: it ends at the deadline, whatever arrived.
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if remaining == 0.0 and not self._buffered():
                return None
            if not self._receive(remaining):
                return None

    def read_response(self) -> bytes:
        """The answer to the last command; fatal errors raise (and the daemon closes)."""
        while True:
            event = self.next_event(self.timeout)
            if event is None:
                self.close()
                raise ConnectionFailed(
                    self.address, f"no answer within {self.timeout:g}s (timeout)"
                )
            if isinstance(event, Response):
                return event.data
            if isinstance(event, Error):
                error = error_from_frame(event.code, event.text, address=self.address)
                if error.fatal:
                    self.close()
                    raise error
                log.info("NSQD(%s): %s", self.address, error)
            # a message frame on a publishing connection: not ours to handle

    def poll_idle(self) -> None:
        """Handle what arrived while idle without waiting: heartbeats get one NOP; EOF closes.

        Frames already parsed count too: a heartbeat can arrive in the same read as the answer
        to the last command.
        """
        heartbeats = 0
        while True:
            while self._events:
                event = self._events.popleft()
                if isinstance(event, Response) and event.is_heartbeat:
                    heartbeats += 1
            if not self._open:
                break
            if not (self._buffered() or select.select([self._sock], [], [], 0)[0]):
                break
            try:
                if not self._receive(0):
                    break
            except ConnectionFailed:
                return  # closed by the daemon while idle: the caller reconnects
        if heartbeats and self._open:
            with contextlib.suppress(ConnectionFailed):
                self.sendall(_NOP)


class Producer:
    """A blocking publisher to the daemon(s) at ``address``.

    Connects on first use. With several addresses it uses the first that accepts a connection
    and fails over to the next when connecting fails. A command that fails after it was sent is
    not retried here: the daemon may have stored it, and the caller decides (at-least-once).
    Raises ``NSQError`` subclasses (``.code``, e.g. ``E_MPUB_FAILED``) for the daemon's errors and
    ``ConnectionFailed`` (a ``ConnectionError`` naming the address) for network failures.
    """

    def __init__(
        self,
        address: str | list[str],
        *,
        timeout: float = 10.0,
        heartbeat_interval: float = 30.0,
        transport: TransportOptions = PLAIN,
    ) -> None:
        self.addresses = address_list(address)
        self.timeout = timeout
        self.heartbeat_interval = heartbeat_interval
        self.transport = transport
        self._conn: _SocketConnection | None = None
        self._next = 0

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Picklable (Spark ships objects to executors): the socket is not part of the state.
        state = self.__dict__.copy()
        state["_conn"] = None
        return state

    @property
    def address(self) -> str | None:
        """The daemon connected to, if any."""
        return self._conn.address if self._conn is not None and self._conn.is_open else None

    def connect(self) -> None:
        """Connect now (otherwise the first publish does)."""
        self._connection()

    def close(self) -> None:
        """Close the connection (the next publish would open a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def publish(self, topic: str, body: bytes) -> None:
        """PUB one message; returns when the daemon answered OK."""
        check_name("topic", topic)
        self._command(Pub(topic=topic, body=body).encode())

    def mpub(self, topic: str, bodies: Sequence[bytes]) -> None:
        """MPUB: several messages, stored atomically (all or none)."""
        check_name("topic", topic)
        if not bodies:
            raise ValueError("mpub needs at least one message")
        self._command(Mpub(topic=topic, bodies=list(bodies)).encode())

    def dpub(self, topic: str, delay_ms: int, body: bytes) -> None:
        """DPUB: one message delivered ``delay_ms`` milliseconds from now."""
        check_name("topic", topic)
        self._command(Dpub(topic=topic, defer_ms=delay_ms, body=body).encode())

    def _connection(self) -> _SocketConnection:
        conn = self._conn
        if conn is not None:
            conn.poll_idle()
            if conn.is_open:
                return conn
            self._conn = None
        failures: list[ConnectionFailed] = []
        for i in range(len(self.addresses)):
            index = (self._next + i) % len(self.addresses)
            try:
                conn = _SocketConnection(
                    self.addresses[index],
                    timeout=self.timeout,
                    heartbeat_interval=self.heartbeat_interval,
                    transport=self.transport,
                )
            except ConnectionFailed as exc:
                log.info("producer: %s", exc)
                failures.append(exc)
                continue
            self._next = index
            self._conn = conn
            return conn
        raise all_addresses_failed(failures)

    def _command(self, data: bytes) -> bytes:
        conn = self._connection()
        try:
            conn.sendall(data)
            return conn.read_response()
        except (NSQError, ConnectionFailed):
            if not conn.is_open:
                self._conn = None
            raise


class Consumer:
    """A blocking consumer of ``topic``/``channel`` on one daemon.

    ``get(timeout)`` returns the next ``Message`` (or None when nothing came within ``timeout``);
    iterating yields messages until ``close()``. Answer each with ``finish()``/``requeue()``.
    Heartbeats are answered while waiting in ``get``; don't leave it uncalled for longer than two
    heartbeat intervals, or the daemon drops the connection.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        address: str,
        *,
        max_in_flight: int = 1,
        timeout: float = 10.0,
        heartbeat_interval: float = 30.0,
        msg_timeout: float | None = None,
        transport: TransportOptions = PLAIN,
    ) -> None:
        check_name("topic", topic)
        check_name("channel", channel)
        self.topic = topic
        self.channel = channel
        identify = {} if msg_timeout is None else {"msg_timeout": round(msg_timeout * 1000)}
        self._conn = _SocketConnection(
            address,
            timeout=timeout,
            heartbeat_interval=heartbeat_interval,
            identify=identify,
            transport=transport,
        )
        try:
            self._conn.sendall(Sub(topic=topic, channel=channel).encode())
            self._conn.read_response()
            self._conn.sendall(Rdy(count=max_in_flight).encode())
        except BaseException:
            self._conn.close()
            raise

    @property
    def address(self) -> str:
        """The daemon consumed from."""
        return self._conn.address

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[Message]:
        while self._conn.is_open:
            message = self.get(None)
            if message is not None:
                yield message

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: until one comes)."""
        while True:
            try:
                event = self._conn.next_event(timeout)
            except ConnectionFailed:
                raise
            if event is None:
                return None
            if isinstance(event, MessageFrame):
                return Message(event.id, event.body, event.timestamp, event.attempts,
                               self._conn, None)
            if isinstance(event, Error):
                error = error_from_frame(event.code, event.text, address=self._conn.address)
                if error.fatal:
                    self._conn.close()
                    raise error
                log.info("NSQD(%s): %s", self._conn.address, error)
            # other responses (CLOSE_WAIT) need nothing

    def close(self) -> None:
        """Send CLS and disconnect; unanswered messages are redelivered by the daemon."""
        if self._conn.is_open:
            with contextlib.suppress(LmqClientError):
                self._conn.sendall(Cls().encode())
            self._conn.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
