"""One blocking V2 connection: the handshake and its upgrades, then bytes in and out.

``SocketConnection`` connects, sends the magic and IDENTIFY, performs the upgrades the daemon
granted in nsqd's order (TLS with ``ssl.SSLContext.wrap_socket`` on the same socket, then
compression with lmqd's codecs around every send and receive, then AUTH:
``lmq_client.transport`` decides), and from then on only moves bytes: ``receive(timeout)``
decodes what one read brought, ``flush()`` sends what the connection's ``Link`` (the sans-IO
protocol state, ``lmq_client.core.link``) has queued. What the frames mean is the cores'
business (``lmq_client.core``).
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from lmq_client._util import identify_body, parse_identify_response, receive_buffer
from lmq_client.core.link import Link
from lmq_client.errors import ConnectionFailed, reason
from lmq_client.transport import (
    PLAIN,
    FrameReader,
    TransportOptions,
    parse_auth_answer,
    plan_upgrades,
)
from lmqd.net import split_address
from lmqd.protocol import Auth, ClientConnection, FrameEvent
from lmqd.transport.compression import CompressionError, StreamCodec

__all__ = ["SocketConnection"]

LinkFactory = Callable[[dict[str, Any], float], Link]


class SocketConnection:
    """A blocking V2 connection to ``address``, handshake done when the constructor returns;
    ``link`` is its protocol state (``make_link(server_settings, now)``, or a plain ``Link``).

    Raises ``ConnectionFailed`` (unreachable, handshake failed or timed out after
    ``connect_timeout``) or the daemon's ``NSQError``.
    """

    def __init__(
        self,
        address: str,
        *,
        connect_timeout: float,
        heartbeat_interval: float,
        identify: dict[str, Any] | None = None,
        transport: TransportOptions = PLAIN,
        make_link: LinkFactory | None = None,
    ) -> None:
        self.address = address
        self.timeout = connect_timeout
        self._codec = ClientConnection()
        self._unparsed = False
        self._compression: StreamCodec | None = None
        self._open = False
        self.auth_identity: dict[str, Any] | None = None
        host, port = split_address(address)
        try:
            self._sock: socket.socket = socket.create_connection(
                (host, port), timeout=connect_timeout
            )
        except OSError as exc:
            raise ConnectionFailed(address, f"cannot connect ({reason(exc)})") from None
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
        now = time.monotonic()
        self.link = (
            make_link(self.server_settings, now) if make_link is not None
            else Link(address, heartbeat_interval=heartbeat_interval, now=now,
                      settings=self.server_settings)
        )  # fmt: skip

    @property
    def is_open(self) -> bool:
        return self._open and self.link.open

    @property
    def socket(self) -> socket.socket:
        return self._sock

    def receive(self, timeout: float | None) -> list[FrameEvent] | None:
        """The frames one read brings, waiting up to ``timeout`` (None: no limit) for it; [] if
        only part of a frame came, None if nothing did. EOF, errors and a malformed frame close
        the connection and raise ``ConnectionFailed``."""
        if self._unparsed:
            self._unparsed = False
            events = self._decode()
            if events:
                return events
        data = self._read(timeout)
        if data is None:
            return None
        self._codec.receive_data(data)
        return self._decode()

    def poll(self) -> list[FrameEvent]:
        """Everything that arrived already, without waiting."""
        events: list[FrameEvent] = []
        while self._open and (
            self._unparsed or self.buffered() or select.select([self._sock], [], [], 0)[0]
        ):
            got = self.receive(0)
            if got is None:
                break
            events.extend(got)
        return events

    def flush(self) -> None:
        """Send what the link has queued (``ConnectionFailed`` if the connection is lost)."""
        data = self.link.take_output()
        if data and self._open:
            self.sendall(data)

    def _decode(self) -> list[FrameEvent]:
        events: list[FrameEvent] = []
        try:
            while batch := self._codec.next_events():
                events.extend(batch)
        except Exception as exc:
            self.close()
            raise ConnectionFailed(self.address, f"protocol error ({exc})") from None
        return events

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
                why = reason(exc)
                raise ConnectionFailed(self.address, f"TLS handshake failed ({why})") from None
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
            self._codec.receive_data(rest)
            self._unparsed = True

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

    def sendall(self, data: bytes) -> None:
        if self._compression is not None:
            data = self._compression.compress(data)
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self.close()
            raise ConnectionFailed(self.address, f"connection lost ({reason(exc)})") from None

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

    def buffered(self) -> bool:
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
            buffer = receive_buffer()
            try:
                data = bytes(buffer[: self._sock.recv_into(buffer)])
            except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
                return None
            except OSError as exc:
                self.close()
                raise ConnectionFailed(self.address, f"connection lost ({reason(exc)})") from None
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
