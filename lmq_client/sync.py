"""Blocking clients on plain sockets: no event loop, for scripts and Spark executors.

``Producer`` sends one command at a time and waits for its answer, answering any heartbeat that
arrives meanwhile with NOP. Before each command it also reads whatever arrived while it was idle:
heartbeats get their NOP, and a connection the daemon closed (for instance after heartbeats went
unanswered for a long idle spell) is noticed there and replaced before anything is sent, so an
idle producer never loses a publish to a stale socket.

``Consumer`` consumes from several daemons, given or found through lookupds, on one thread:
``get()`` waits on all of them at once (``select``), and does the lookupd queries and redials
when they are due; messages are answered with the same ``Message`` API as the async consumer.
It also has the async consumer's backoff (``lmq_client.backoff.BackoffState``: a requeue with
backoff sets RDY 0 everywhere for a while, then probes with RDY 1) and its ``max_attempts``
with an ``on_give_up`` hook; ``run(handler)`` is its handler loop.

Both take ``transport`` (``lmq_client.transport.TransportOptions``): the connection then performs
the upgrades the daemon grants after IDENTIFY, as the async client does: TLS with
``ssl.SSLContext.wrap_socket`` on the same socket, compression with lmqd's codecs around every
send and receive, then AUTH.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import random
import select
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Unpack

from lmq_client._util import (
    address_list,
    check_name,
    identify_body,
    parse_identify_response,
)
from lmq_client.backoff import Backoff, BackoffState
from lmq_client.errors import (
    ConnectionFailed,
    LmqClientError,
    NSQError,
    all_addresses_failed,
    error_from_frame,
)
from lmq_client.extension import Fields, publish_command, require_extension
from lmq_client.lookupd import (
    DEFAULT_POLL_INTERVAL,
    DEFAULT_POLL_JITTER,
    DEFAULT_TIMEOUT,
    Discovery,
    lookup_producers,
    lookupd_addresses,
)
from lmq_client.message import Message
from lmq_client.rdy import choose_active, rdy_targets
from lmq_client.stats import ConsumerStats
from lmq_client.transport import (
    PLAIN,
    FrameReader,
    TransportOptions,
    parse_auth_answer,
    plan_upgrades,
)
from lmqd.message_ext import ExtError
from lmqd.net import split_address
from lmqd.protocol import (
    Auth,
    ClientConnection,
    Cls,
    Error,
    MessageFrame,
    Nop,
    Rdy,
    Response,
    Sub,
)
from lmqd.protocol.extension import XpubMessage, encode_xpub
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
        """``Message`` answers go straight to the socket. On a connection lost meanwhile they
        are dropped (the daemon delivers the message again); the consumer notices the loss
        when it next reads."""
        if self._open:
            with contextlib.suppress(ConnectionFailed):
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

    def publish(
        self,
        topic: str,
        body: bytes,
        *,
        dedup_id: str | bytes | None = None,
        **fields: Unpack[Fields],
    ) -> None:
        """PUB one message; returns when the daemon answered OK. With lmq's per-message fields
        (``headers``, ``priority`` 0-9, ``ttl`` in seconds, ``dedup_id``; ``lmq_client.extension``)
        it is an XPUB, which only lmqd takes."""
        check_name("topic", topic)
        ids = None if dedup_id is None else [dedup_id]
        command, ext = publish_command(topic, [body], single=True, dedup_ids=ids, **fields)
        self._command(command, extension=ext)

    def mpub(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        dedup_ids: Sequence[str | bytes] | None = None,
        **fields: Unpack[Fields],
    ) -> None:
        """MPUB: several messages, stored atomically (all or none); lmq's fields apply to every
        message, ``dedup_ids`` gives each its own (an XPUB, as ``publish``)."""
        check_name("topic", topic)
        if not bodies:
            raise ValueError("mpub needs at least one message")
        command, ext = publish_command(topic, bodies, single=False, dedup_ids=dedup_ids, **fields)
        self._command(command, extension=ext)

    def dpub(
        self,
        topic: str,
        delay_ms: int,
        body: bytes,
        *,
        dedup_id: str | bytes | None = None,
        **fields: Unpack[Fields],
    ) -> None:
        """DPUB: one message delivered ``delay_ms`` milliseconds from now (lmq's fields as
        ``publish``)."""
        check_name("topic", topic)
        ids = None if dedup_id is None else [dedup_id]
        command, ext = publish_command(
            topic, [body], single=True, defer_ms=delay_ms, dedup_ids=ids, **fields
        )
        self._command(command, extension=ext)

    def xpub(
        self, topic: str, messages: Sequence[XpubMessage], *, defer_ms: int | None = None
    ) -> None:
        """XPUB: several messages, each with its own extension (headers, priority, TTL, dedup
        id), stored atomically, deferred by ``defer_ms`` if given; only lmqd takes it. For
        callers whose messages differ in more than their dedup ids (the Spark sink's columns).
        ``ValueError`` for an extension out of bounds."""
        check_name("topic", topic)
        if not messages:
            raise ValueError("xpub needs at least one message")
        try:
            command = encode_xpub(topic, list(messages), defer_ms)
        except ExtError as exc:
            raise ValueError(str(exc)) from None
        self._command(command, extension=True)

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

    def _command(self, data: bytes, *, extension: bool = False) -> bytes:
        conn = self._connection()
        if extension:
            require_extension(conn.server_settings, conn.address)
        try:
            conn.sendall(data)
            return conn.read_response()
        except (NSQError, ConnectionFailed):
            if not conn.is_open:
                self._conn = None
            raise


class Consumer:
    """A blocking consumer of ``topic``/``channel`` on one or several daemons, listed in
    ``address`` and/or found through the lookupds at ``lookupd_http_addresses``.

    ``get(timeout)`` returns the next ``Message`` (or None when nothing came within ``timeout``);
    iterating yields messages until ``close()``. Answer each with ``finish()``/``requeue()``.
    Heartbeats are answered while waiting in ``get``; don't leave it uncalled for longer than two
    heartbeat intervals, or the daemons drop the connections.

    Everything happens inside ``get``: it waits on every connection at once (``select``), takes
    messages from them in turn, and when they are due queries the lookupds (go-nsq's schedule:
    at once, then every ``lookupd_poll_interval`` after a random ``lookupd_poll_jitter`` share
    of it; a query blocks for at most ``lookupd_timeout``) and redials lost connections. The
    rules for discovered daemons are ``lmq_client.lookupd.Discovery``'s: new ones are connected,
    ones no longer listed are dropped, and one whose connection ended is redialled only if the
    lookupds still list it. A daemon given by address is redialled after the reconnect backoff.
    ``max_in_flight`` is spread over the connections as RDY (``lmq_client.rdy``), as the async
    consumer does.

    The constructor connects to the addresses given and queries the lookupds once. Without
    lookupds it raises ``ConnectionFailed`` when none of the addresses could be subscribed; it
    raises the daemon's ``NSQError`` when one refuses the subscription. A connection lost later
    is never an exception: ``get`` goes on with the others and redials.

    Backoff and give-up are the async consumer's: ``message.requeue()`` (with ``backoff``, the
    default) sets RDY 0 on every connection for ``backoff.delay(level)`` seconds, then RDY 1 on
    one; successes step the level down. A message delivered more than ``max_attempts`` times
    (0: no limit) is not returned: ``on_give_up(message)`` sees it, then it is finished.
    ``run(handler)`` calls ``handler(message)`` for each message until ``close()``: returning
    finishes it, raising requeues it after ``min(requeue_delay * attempts,
    max_requeue_delay)`` seconds and backs off.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        address: str | Sequence[str] = (),
        *,
        lookupd_http_addresses: str | Sequence[str] = (),
        lookupd_poll_interval: float = DEFAULT_POLL_INTERVAL,
        lookupd_poll_jitter: float = DEFAULT_POLL_JITTER,
        lookupd_timeout: float = DEFAULT_TIMEOUT,
        max_in_flight: int = 1,
        timeout: float = 10.0,
        heartbeat_interval: float = 30.0,
        msg_timeout: float | None = None,
        reconnect_backoff: Backoff | None = None,
        max_attempts: int = 5,
        on_give_up: Callable[[Message], object] | None = None,
        requeue_delay: float = 90.0,
        max_requeue_delay: float = 900.0,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        transport: TransportOptions = PLAIN,
    ) -> None:
        check_name("topic", topic)
        check_name("channel", channel)
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.topic = topic
        self.channel = channel
        self.lookupd_addresses = lookupd_addresses(lookupd_http_addresses)
        given = [address] if isinstance(address, str) else list(address)
        if not given and not self.lookupd_addresses:
            raise ValueError("give daemon addresses, lookupd_http_addresses, or both")
        self.addresses = address_list(given) if given else []
        self.max_in_flight = max_in_flight
        self.timeout = timeout
        self.heartbeat_interval = heartbeat_interval
        self.lookupd_timeout = lookupd_timeout
        self.transport = transport
        self.reconnect_backoff = reconnect_backoff or Backoff(base=1.0, max_delay=60.0)
        self.max_attempts = max_attempts
        self.on_give_up = on_give_up
        self.requeue_delay = requeue_delay
        self.max_requeue_delay = max_requeue_delay
        self.backoff = backoff or Backoff(base=1.0, max_delay=120.0)
        self._flow = BackoffState(self.backoff)
        self._probe: str | None = None
        """The connection that gets RDY 1 while the backoff probes."""
        self._received = self._finished = self._requeued = self._given_up = 0
        self._identify = {} if msg_timeout is None else {"msg_timeout": round(msg_timeout * 1000)}
        self._rng = rng or random.Random()
        self._conns: dict[str, _SocketConnection] = {}
        self._rdy: dict[str, int] = {}
        self._active: set[str] = set()
        self._got_message: set[str] = set()
        self._rdy_stale = True
        """The connections or the active set changed since RDY was last set."""
        self._turn = 0
        self._redial: dict[str, tuple[int, float]] = {}
        """Addresses given whose connection is down: (failures, when to dial again)."""
        self._closed = False
        self._discovery = (
            Discovery(
                interval=lookupd_poll_interval,
                jitter=lookupd_poll_jitter,
                reconnect_backoff=self.reconnect_backoff,
                rng=self._rng,
                start=time.monotonic(),
            )
            if self.lookupd_addresses
            else None
        )
        failures: list[ConnectionFailed] = []
        try:
            for given_address in self.addresses:
                try:
                    self._subscribe(given_address)
                except ConnectionFailed as exc:
                    failures.append(exc)
                    self._schedule_redial(given_address, time.monotonic())
            if self._discovery is None and not self._conns:
                raise all_addresses_failed(failures)
            self._maintain(time.monotonic())
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        """The daemon consumed from (the first connected one, when there are several)."""
        return next(iter(self._conns), "")

    @property
    def connected_addresses(self) -> list[str]:
        """The daemons subscribed on right now."""
        return list(self._conns)

    def rdy_counts(self) -> dict[str, int]:
        """The RDY last sent on each connection, by daemon address."""
        return dict(self._rdy)

    def statistics(self) -> ConsumerStats:
        """Counters and state, as the async consumer's ``statistics()``."""
        return ConsumerStats(
            received=self._received,
            finished=self._finished,
            requeued=self._requeued,
            given_up=self._given_up,
            connections=len(self._conns),
            backoff_level=self._flow.level,
        )

    def requeue_delay_for(self, message: Message) -> float:
        """The delay of ``run``'s requeue: ``requeue_delay * attempts``, capped (go-nsq)."""
        return min(self.requeue_delay * message.attempts, self.max_requeue_delay)

    def run(self, handler: Callable[[Message], object]) -> None:
        """Hand every message to ``handler`` until ``close()`` (which the handler may call).

        A handler that returns finishes the message (unless it answered it itself); one that
        raises requeues it with ``requeue_delay_for(message)`` and backs off.
        """
        for message in self:
            try:
                handler(message)
            except Exception:
                log.warning(
                    "consumer %s/%s: handler failed on %r", self.topic, self.channel, message,
                    exc_info=True,
                )
                if not message.responded:
                    message.requeue(self.requeue_delay_for(message))
            else:
                if not message.responded:
                    message.finish()

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
        while not self._closed:
            message = self.get(None)
            if message is not None:
                yield message

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: until one comes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            now = time.monotonic()
            self._maintain(now)
            message = self._next_message()
            if message is not None:
                if self.max_attempts and message.attempts > self.max_attempts:
                    self._give_up(message)
                    continue
                return message
            now = time.monotonic()
            wake = self._next_due()
            if deadline is not None:
                if now >= deadline:
                    return None
                wake = min(wake, deadline)
            self._wait(max(0.0, wake - now) if wake < math.inf else None)
        return None

    def close(self) -> None:
        """Send CLS and disconnect; unanswered messages are redelivered by the daemons."""
        self._closed = True
        for address in list(self._conns):
            self._disconnect(address)

    def _give_up(self, message: Message) -> None:
        log.warning(
            "consumer %s/%s: giving up on %r after %d attempts",
            self.topic, self.channel, message, message.attempts,
        )
        self._given_up += 1
        if self.on_give_up is not None:
            try:
                self.on_give_up(message)
            except Exception:
                log.exception("consumer %s/%s: give-up hook failed", self.topic, self.channel)
        if not message.responded:
            message.finish()

    def _message_done(self, message: Message, *, success: bool, backoff: bool) -> None:
        """Called by ``Message`` when it is answered: counters and backoff."""
        if success:
            self._finished += 1
        else:
            self._requeued += 1
        if not (success or backoff):
            return
        flow = self._flow
        if not flow.outcome(time.monotonic(), failure=not success):
            return
        self._probe = None
        self._rdy_stale = True
        if flow.paused_until is not None:
            log.info(
                "consumer %s/%s: backing off for %.3fs (level %d)",
                self.topic, self.channel, flow.paused_until - time.monotonic(), flow.level,
            )
        else:
            log.info("consumer %s/%s: backoff over", self.topic, self.channel)
        self._update_rdy()

    # -- connections -----------------------------------------------------------------------------

    def _subscribe(self, address: str) -> None:
        conn = _SocketConnection(
            address,
            timeout=self.timeout,
            heartbeat_interval=self.heartbeat_interval,
            identify=self._identify,
            transport=self.transport,
        )
        try:
            conn.sendall(Sub(topic=self.topic, channel=self.channel).encode())
            conn.read_response()
        except BaseException:
            conn.close()
            raise
        self._conns[address] = conn
        self._rdy[address] = 0
        self._rdy_stale = True
        self._redial.pop(address, None)
        if self._discovery is not None:
            self._discovery.connected(address)

    def _disconnect(self, address: str) -> None:
        conn = self._conns.pop(address, None)
        self._rdy.pop(address, None)
        self._rdy_stale = True
        self._active.discard(address)
        self._got_message.discard(address)
        if self._probe == address:
            self._probe = None
        if conn is not None and conn.is_open:
            with contextlib.suppress(LmqClientError):
                conn.sendall(Cls().encode())
            conn.close()

    def _lost(self, address: str, reason: object) -> None:
        """A connection failed or was closed by its daemon: drop it, and decide when to redial."""
        log.warning("consumer %s/%s: %s: %s", self.topic, self.channel, address, reason)
        self._disconnect(address)
        if self._closed:
            return
        now = time.monotonic()
        if address in self.addresses:
            self._schedule_redial(address, now)
        elif self._discovery is not None:
            self._discovery.connection_ended(address, now)
        self._update_rdy()

    def _schedule_redial(self, address: str, now: float) -> None:
        failures = self._redial.get(address, (0, 0.0))[0] + 1
        self._redial[address] = (failures, now + self.reconnect_backoff.delay(failures))

    def _next_due(self) -> float:
        due = min((at for _, at in self._redial.values()), default=math.inf)
        if self._flow.paused_until is not None:
            due = min(due, self._flow.paused_until)
        if self._discovery is not None:
            due = min(due, self._discovery.next_poll_at)
        return due

    def _maintain(self, now: float) -> None:
        """End a backoff pause, redial given addresses and query the lookupds when due; then
        set RDY."""
        if self._flow.pause_over(now):
            self._rdy_stale = True  # probe with RDY 1
        for address, (_, at) in list(self._redial.items()):
            if at <= now and address not in self._conns:
                try:
                    self._subscribe(address)
                except (ConnectionFailed, NSQError) as exc:
                    log.warning("consumer %s/%s: %s", self.topic, self.channel, exc)
                    self._schedule_redial(address, time.monotonic())
        discovery = self._discovery
        if discovery is not None and discovery.next_poll_at <= now:
            discovery.polled(now)
            found = self._query_lookupds()
            if found is not None:
                found -= set(self.addresses)
            connect, drop = discovery.answered(time.monotonic(), found)
            for address in drop:
                log.info("consumer %s/%s: %s is no longer listed by the lookupds; dropping it",
                         self.topic, self.channel, address)
                self._disconnect(address)
                discovery.connection_ended(address, time.monotonic(), dropped=True)
            for address in connect:
                try:
                    self._subscribe(address)
                except (ConnectionFailed, NSQError) as exc:
                    log.warning("consumer %s/%s: %s", self.topic, self.channel, exc)
                    discovery.connection_ended(address, time.monotonic())
            self._rotate()
        self._update_rdy()

    def _query_lookupds(self) -> set[str] | None:
        found: set[str] | None = None
        for lookupd in self.lookupd_addresses:
            try:
                producers = lookup_producers(lookupd, self.topic, timeout=self.lookupd_timeout)
            except LmqClientError as exc:
                log.warning("consumer %s/%s: lookupd %s: %s", self.topic, self.channel,
                            lookupd, exc)
                continue
            found = (found or set()) | set(producers)
        return found

    # -- RDY -------------------------------------------------------------------------------------

    def _rotate(self) -> None:
        """With fewer slots than connections: move slots off connections that got nothing."""
        conns = list(self._conns)
        if len(conns) > self.max_in_flight:
            idle = [a for a in conns if a not in self._got_message]
            self._active = choose_active(conns, self._active, idle, self.max_in_flight, self._rng)
            self._rdy_stale = True
        self._got_message.clear()

    def _update_rdy(self) -> None:
        """Send RDY where the wanted value changed (only after connections or slots moved:
        ``get`` calls this once per message)."""
        if not self._rdy_stale:
            return
        self._rdy_stale = False
        conns = list(self._conns)
        if len(conns) > self.max_in_flight and len(self._active & set(conns)) < min(
            self.max_in_flight, len(conns)
        ):
            self._active = choose_active(conns, self._active, (), self.max_in_flight, self._rng)
        caps = {a: int(c.server_settings.get("max_rdy_count") or 2500)
                for a, c in self._conns.items()}  # fmt: skip
        wanted = rdy_targets(self.max_in_flight, conns, caps, self._active)
        if self._flow.paused_until is not None:
            wanted = dict.fromkeys(conns, 0)
        elif self._flow.probing:
            if self._probe not in self._conns and conns:
                self._probe = self._rng.choice(conns)
            wanted = {a: (1 if a == self._probe else 0) for a in conns}
        for address, count in wanted.items():
            if self._rdy.get(address) != count:
                try:
                    self._conns[address].sendall(Rdy(count=count).encode())
                except ConnectionFailed as exc:
                    self._lost(address, exc)
                    return
                self._rdy[address] = count

    # -- receiving -------------------------------------------------------------------------------

    def _next_message(self) -> Message | None:
        """A message already received on some connection (taken in turn), else None."""
        addresses = list(self._conns)
        for i in range(len(addresses)):
            address = addresses[(self._turn + i) % len(addresses)]
            conn = self._conns.get(address)
            if conn is None:
                continue
            try:
                event = conn.next_event(0)
            except ConnectionFailed as exc:
                self._lost(address, exc)
                continue
            while event is not None:
                if isinstance(event, MessageFrame):
                    self._turn = (self._turn + i + 1) % max(1, len(addresses))
                    self._got_message.add(address)
                    self._received += 1
                    return Message(
                        event.id, event.body, event.timestamp, event.attempts, conn, self,
                        event.ext,
                    )
                if isinstance(event, Error):
                    error = error_from_frame(event.code, event.text, address=address)
                    if error.fatal:
                        self._lost(address, error)
                        break
                    log.info("NSQD(%s): %s", address, error)
                # other responses (CLOSE_WAIT) need nothing
                try:
                    event = conn.next_event(0)
                except ConnectionFailed as exc:
                    self._lost(address, exc)
                    break
        return None

    def _wait(self, timeout: float | None) -> None:
        """Until some connection has bytes (read and parsed here), or ``timeout``."""
        conns = list(self._conns.items())
        if not conns:
            time.sleep(timeout if timeout is not None else self.heartbeat_interval)
            return
        if any(c._buffered() for _, c in conns):
            timeout = 0.0
        ready, _, _ = select.select([c._sock for _, c in conns], [], [], timeout)
        for address, conn in conns:
            if conn._sock in ready or conn._buffered():
                try:
                    conn._receive(0)
                except ConnectionFailed as exc:
                    self._lost(address, exc)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
