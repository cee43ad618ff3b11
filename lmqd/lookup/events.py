"""The V1 events: one class per command, one per kind of response, and the end of the stream.

Commands (``Identify``, ``Register``, ``Unregister``, ``Ping``) are what
``LookupServerConnection`` parses and what a registering daemon sends through
``LookupClientConnection``; responses (``Ok``, ``IdentifyResponse``, ``Error``) are what the
server sends and the client parses. ``encode()`` gives each one's bytes on the wire.

V1 responses are ``[int32 size][payload]`` with no frame type: the payload alone says what it
is only together with the command it answers (``OK``, a JSON object for IDENTIFY, or an error
string ``E_...``), which is why the client codec keeps the commands it has sent in order.
"""

from __future__ import annotations

import struct
from typing import TypeAlias

import attrs

from lmqd.lookup import gojson

__all__ = [
    "Command",
    "ConnectionClosed",
    "Error",
    "Identify",
    "IdentifyResponse",
    "Ok",
    "Ping",
    "Register",
    "Response",
    "Unregister",
    "encode_response",
]

_SIZE = struct.Struct(">i")


def encode_response(payload: bytes) -> bytes:
    """``payload`` framed as a V1 response: its 4-byte big-endian size, then the payload."""
    return _SIZE.pack(len(payload)) + payload


def _peer_json(
    broadcast_address: str, hostname: str, http_port: int, tcp_port: int, version: str
) -> bytes:
    # nsqd and nsqlookupd both build these objects as Go maps, so the keys come out sorted.
    return gojson.dumps(
        {
            "broadcast_address": broadcast_address,
            "hostname": hostname,
            "http_port": http_port,
            "tcp_port": tcp_port,
            "version": version,
        },
        sort_keys=True,
    )


# -- commands -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Identify:
    """IDENTIFY: who the registering node is and where its clients reach it.

    nsqlookupd requires a non-empty ``broadcast_address`` and ``version`` and non-zero ports;
    ``hostname`` is optional.
    """

    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    hostname: str = ""

    def encode(self) -> bytes:
        """``IDENTIFY\\n`` + size + the JSON body, byte for byte as nsqd writes it."""
        body = _peer_json(
            self.broadcast_address, self.hostname, self.http_port, self.tcp_port, self.version
        )
        return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


@attrs.frozen(kw_only=True)
class Register:
    """REGISTER: the node has ``topic`` (and, if given, its ``channel``)."""

    topic: str
    channel: str | None = None

    def encode(self) -> bytes:
        """The command line."""
        if self.channel is None:
            return b"REGISTER %s\n" % self.topic.encode()
        return b"REGISTER %s %s\n" % (self.topic.encode(), self.channel.encode())


@attrs.frozen(kw_only=True)
class Unregister:
    """UNREGISTER: the node no longer has ``channel`` of ``topic``, or (no channel) ``topic``."""

    topic: str
    channel: str | None = None

    def encode(self) -> bytes:
        """The command line."""
        if self.channel is None:
            return b"UNREGISTER %s\n" % self.topic.encode()
        return b"UNREGISTER %s %s\n" % (self.topic.encode(), self.channel.encode())


@attrs.frozen(kw_only=True)
class Ping:
    """PING: the node is alive (refreshes its liveness once it has identified)."""

    def encode(self) -> bytes:
        """The command line."""
        return b"PING\n"


Command: TypeAlias = Identify | Register | Unregister | Ping
"""A command a registering node sends."""


# -- responses ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Ok:
    """``OK``: the answer to PING, REGISTER and UNREGISTER."""

    def encode(self) -> bytes:
        """The framed response."""
        return b"\x00\x00\x00\x02OK"


@attrs.frozen(kw_only=True)
class IdentifyResponse:
    """The lookupd's own peer information, the answer to IDENTIFY.

    ``tcp_port`` and ``http_port`` are the lookupd's listening ports and ``broadcast_address``
    its ``--broadcast-address``: nsqd queries ``http://<broadcast_address>:<http_port>/channels``
    with them.
    """

    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    hostname: str = ""

    def encode(self) -> bytes:
        """The framed response (a JSON object with sorted keys)."""
        return encode_response(
            _peer_json(
                self.broadcast_address, self.hostname, self.http_port, self.tcp_port, self.version
            )
        )


@attrs.frozen(kw_only=True)
class Error:
    """An error response, ``<code> <text>``; nsqlookupd closes the connection after it."""

    code: str
    text: str = ""

    def encode(self) -> bytes:
        """The framed response."""
        payload = f"{self.code} {self.text}" if self.text else self.code
        return encode_response(payload.encode("utf-8"))


Response: TypeAlias = Ok | IdentifyResponse | Error
"""A response the lookupd sends."""


@attrs.frozen(kw_only=True)
class ConnectionClosed:
    """The peer closed the connection and everything before that has been returned."""
