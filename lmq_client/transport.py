"""TLS, compression and AUTH for the clients: the options, and the handshake's decisions.

A client asks for upgrades in IDENTIFY (``tls_v1``, ``snappy``, ``deflate`` + ``deflate_level``)
and the daemon's JSON answer says which it grants, and whether it wants ``AUTH``. Then, in
nsqd's order, on the same connection: the TLS handshake and an ``OK`` frame through TLS; the
compression layer and an ``OK`` frame through it; ``AUTH <secret>`` and its JSON answer. The
async ``Connection`` and the blocking client in ``lmq_client.sync`` both follow that sequence;
this module holds what they share, sans I/O:

* ``TransportOptions`` — what the user asked for (go-nsq's names: ``tls_v1``,
  ``tls_root_ca_file``, ``tls_cert``, ``tls_key``, ``tls_insecure_skip_verify``, ``snappy``,
  ``deflate``, ``deflate_level``, ``auth_secret``); picklable, for Spark executors.
* ``plan_upgrades`` — checks the daemon's answer against the request. Unlike go-nsq, a client
  that asked for TLS refuses a daemon that does not offer it (a user who configured a CA file
  expects encryption, not a silent downgrade); declined compression is just not used.
* ``FrameReader`` — reads the handshake's frames one at a time and keeps the bytes after them:
  the daemon sends its compressed ``OK`` right behind the plaintext IDENTIFY answer, so both can
  arrive in one read, and those bytes belong to the next layer.

The codecs and TLS contexts are lmqd's own (``lmqd.transport``), so both ends speak the same
bytes.
"""

from __future__ import annotations

import json
import ssl
import struct
from typing import Any

import attrs

from lmq_client.errors import AuthRequired, ConnectionFailed, error_from_frame
from lmqd.transport.compression import DeflateStream, SnappyStream, StreamCodec
from lmqd.transport.tls import TLSConfigError, client_context

__all__ = [
    "FrameReader",
    "TransportOptions",
    "Upgrades",
    "parse_auth_answer",
    "plan_upgrades",
]

_FRAME_HEADER = struct.Struct(">ii")
_FRAME_RESPONSE = 0
_FRAME_ERROR = 1
_MAX_HANDSHAKE_FRAME = 1024 * 1024
"""Largest frame accepted during the handshake (IDENTIFY and AUTH answers are ~300 bytes): a
daemon, or something that is not one, cannot make the client buffer more."""


@attrs.frozen(kw_only=True)
class TransportOptions:
    """How to talk to the daemon beyond plain TCP. The default is plain TCP, no AUTH."""

    tls: bool = False
    """Upgrade to TLS after IDENTIFY (go-nsq's ``tls_v1``)."""
    tls_root_ca_file: str | None = None
    """PEM CA bundle that signs the daemon's certificate (system CAs if None)."""
    tls_cert: str | None = None
    """Client certificate, for daemons started with ``--tls-client-auth-policy``."""
    tls_key: str | None = None
    tls_insecure_skip_verify: bool = False
    """Accept any daemon certificate (encryption without authentication)."""
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = attrs.field(default=6)
    """1 (fast) .. 9 (small); the daemon caps it at its ``--max-deflate-level``."""
    auth_secret: str | bytes | None = attrs.field(default=None, repr=False)
    """Sent with AUTH when the daemon requires it (``--auth-http-address``)."""

    @deflate_level.validator
    def _check_level(self, attribute: attrs.Attribute[int], value: int) -> None:
        if not 1 <= value <= 9:
            raise ValueError(f"deflate_level must be 1..9, not {value}")

    def __attrs_post_init__(self) -> None:
        if self.snappy and self.deflate:
            # nsqd would answer E_IDENTIFY_FAILED; say so before connecting.
            raise ValueError("choose snappy or deflate, not both")
        tls_files = (self.tls_root_ca_file, self.tls_cert, self.tls_key)
        if not self.tls and (any(tls_files) or self.tls_insecure_skip_verify):
            raise ValueError("TLS settings given without tls=True")
        if self.tls_key and not self.tls_cert:
            raise ValueError("tls_key needs tls_cert")

    @property
    def secret(self) -> bytes | None:
        """The AUTH secret as bytes."""
        if self.auth_secret is None:
            return None
        if isinstance(self.auth_secret, str):
            return self.auth_secret.encode("utf-8")
        return self.auth_secret

    def identify_fields(self) -> dict[str, Any]:
        """The IDENTIFY keys that ask for these upgrades."""
        fields: dict[str, Any] = {}
        if self.tls:
            fields["tls_v1"] = True
        if self.snappy:
            fields["snappy"] = True
        if self.deflate:
            fields["deflate"] = True
            fields["deflate_level"] = self.deflate_level
        return fields

    def ssl_context(self) -> ssl.SSLContext:
        """The client TLS context (files are read here: ``ValueError`` if unusable)."""
        try:
            return client_context(
                ca_file=self.tls_root_ca_file,
                cert_file=self.tls_cert,
                key_file=self.tls_key,
                verify=not self.tls_insecure_skip_verify,
            )
        except TLSConfigError as exc:
            raise ValueError(str(exc)) from None


PLAIN = TransportOptions()


@attrs.frozen
class Upgrades:
    """What the handshake does after IDENTIFY, in this order."""

    tls: bool
    codec: StreamCodec | None
    auth_secret: bytes | None
    """Send AUTH with this (None: the daemon does not want AUTH)."""


def plan_upgrades(
    options: TransportOptions, settings: dict[str, Any], address: str
) -> Upgrades:
    """Check IDENTIFY's answer against ``options``; ``ConnectionFailed`` when the daemon's
    answer cannot be followed, ``errors.AuthRequired`` when it wants a secret we lack."""
    tls = settings.get("tls_v1") is True
    snappy = settings.get("snappy") is True
    deflate = settings.get("deflate") is True
    unasked = (tls, options.tls), (snappy, options.snappy), (deflate, options.deflate)
    if any(granted and not asked for granted, asked in unasked):
        raise ConnectionFailed(address, "the daemon enabled an upgrade that was not asked for")
    if options.tls and not tls:
        raise ConnectionFailed(
            address, "TLS was asked for but the daemon does not offer it (no --tls-cert?)"
        )
    if snappy and deflate:
        raise ConnectionFailed(address, "the daemon enabled both snappy and deflate")
    codec: StreamCodec | None = None
    if snappy:
        codec = SnappyStream()
    elif deflate:
        level = settings.get("deflate_level", options.deflate_level)
        if not isinstance(level, int) or not 1 <= level <= 9:
            raise ConnectionFailed(address, f"the daemon answered deflate_level {level!r}")
        codec = DeflateStream(level)
    secret = None
    if settings.get("auth_required") is True:
        secret = options.secret
        if secret is None:
            raise AuthRequired(
                text="the daemon requires AUTH: give an auth secret", address=address
            )
    return Upgrades(tls=tls, codec=codec, auth_secret=secret)


def parse_auth_answer(data: bytes) -> dict[str, Any]:
    """AUTH's answer (``identity``, ``identity_url``, ``permission_count``); {} if not JSON."""
    try:
        answer = json.loads(data)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


class FrameReader:
    """Frames of the handshake, one at a time, keeping whatever follows them.

    Heartbeats are skipped (the daemon sends its first after a whole heartbeat interval; the
    handshake is over long before). Error frames raise their ``NSQError``.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._buf = b""

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def take_rest(self) -> bytes:
        """The bytes received after the last frame returned (for the next layer)."""
        rest, self._buf = self._buf, b""
        return rest

    def next_response(self) -> bytes | None:
        """The next response frame's data, or None if more bytes are needed."""
        while len(self._buf) >= _FRAME_HEADER.size:
            size, frame_type = _FRAME_HEADER.unpack_from(self._buf)
            if not 4 <= size <= _MAX_HANDSHAKE_FRAME:
                if self._buf.startswith(b"HTTP"):
                    # An HTTP server's "HTTP/1.1 400 ..." read as a frame size (1213486160).
                    raise ConnectionFailed(
                        self.address, "the answer is HTTP, not NSQ's TCP protocol; is it the HTTP "
                        "port?"
                    )
                raise ConnectionFailed(self.address, f"invalid frame size {size} in handshake")
            if len(self._buf) < 4 + size:
                return None
            data = self._buf[8 : 4 + size]
            self._buf = self._buf[4 + size :]
            if frame_type == _FRAME_RESPONSE:
                if data == b"_heartbeat_":
                    continue
                return data
            if frame_type == _FRAME_ERROR:
                code, _, text = data.partition(b" ")
                raise error_from_frame(
                    code.decode("ascii", "replace"),
                    text.decode("utf-8", "replace"),
                    address=self.address,
                )
            raise ConnectionFailed(self.address, f"unexpected frame type {frame_type} in handshake")
        return None
