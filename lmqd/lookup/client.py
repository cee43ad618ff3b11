"""The registering side of a V1 connection, sans I/O: commands to bytes, bytes to responses.

This is what a node (lmqd, like nsqd) uses to register with a lookupd::

    conn = LookupClientConnection()
    out = conn.initial_bytes() + conn.send(Identify(...)) + conn.send(Register(topic="t"))
    ... send ``out``, then feed what arrives to ``conn.receive_data`` ...
    conn.next_event()  # -> IdentifyResponse(...), then Ok()

A V1 response carries no frame type, so what its payload means depends on the command it
answers: ``send`` remembers the commands in order and each response is matched with the oldest
unanswered one. A payload starting ``E_`` is an ``Error`` (and the lookupd closes the
connection after it); the answer to IDENTIFY is decoded as Go's nsqd decodes it (a JSON object;
missing fields get zero values; ``null`` is an empty object); the answer to PING, REGISTER
and UNREGISTER must be ``OK``. Anything else is a ``LookupProtocolError`` with code
``E_BAD_PROTOCOL``: the lookupd is not speaking V1, and the caller should drop the connection,
as nsqd does when an IDENTIFY reply does not decode.
"""

from __future__ import annotations

import collections
import struct

from lmqd.lookup.errors import LookupProtocolError
from lmqd.lookup.events import (
    Command,
    ConnectionClosed,
    Error,
    Identify,
    IdentifyResponse,
    Ok,
    Response,
)
from lmqd.lookup.gojson import decode_struct
from lmqd.lookup.server import MAGIC_V1

__all__ = ["MAX_RESPONSE_SIZE", "LookupClientConnection"]

MAX_RESPONSE_SIZE = 1024 * 1024
"""Largest response accepted.

The longest legitimate answer is an error echoing one command line (under 200 bytes from any
lookupd for the names a node registers); the IDENTIFY answer is about 100 bytes. nsqd accepts up
to its ``--max-body-size`` (5 MiB); 1 MiB bounds the buffer against a corrupt size just as well.
"""

_unpack_size = struct.Struct(">i").unpack_from
_OK = Ok()

# What nsqd reads from the IDENTIFY answer (plus hostname, which nsqlookupd also sends).
_INFO_FIELDS: dict[str, type] = {
    "tcp_port": int,
    "http_port": int,
    "version": str,
    "broadcast_address": str,
    "hostname": str,
}


class LookupClientConnection:
    """Encodes commands and decodes the lookupd's responses for one connection."""

    def __init__(self, *, max_response_size: int = MAX_RESPONSE_SIZE) -> None:
        self.max_response_size = max_response_size
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self._error: LookupProtocolError | None = None
        self._sent: collections.deque[type[Command]] = collections.deque()

    @staticmethod
    def initial_bytes() -> bytes:
        """The protocol magic, to send first."""
        return MAGIC_V1

    def send(self, command: Command) -> bytes:
        """The bytes of ``command``; its response is expected after those already pending."""
        data = command.encode()
        self._sent.append(type(command))
        return data

    @property
    def pending(self) -> int:
        """How many commands sent have not been answered yet."""
        return len(self._sent)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the lookupd; ``b""`` means it closed (EOF)."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RuntimeError("received data after EOF")
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_event(self) -> Response | ConnectionClosed | None:
        """The next response, ``ConnectionClosed`` after the lookupd's EOF, or None (need data).

        Raises ``LookupProtocolError`` (``E_BAD_PROTOCOL``) for a response that cannot be V1,
        and again on every later call.
        """
        if self._error is not None:
            raise self._error
        try:
            event = self._parse_one()
        except LookupProtocolError as exc:
            self._error = exc
            raise
        if event is None and self._eof:
            return ConnectionClosed()
        return event

    def _parse_one(self) -> Response | None:
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 4:
            return None
        size: int = _unpack_size(buf, pos)[0]
        if size < 0 or size > self.max_response_size:
            raise _bad(f"invalid response size {size}")
        end = pos + 4 + size
        if end > len(buf):
            return None
        payload = bytes(buf[pos + 4 : end])
        self._pos = end
        if not self._sent:
            raise _bad(f"unexpected response {payload[:100]!r}")
        answered = self._sent.popleft()
        if payload.startswith(b"E_"):
            code, _, text = payload.partition(b" ")
            return Error(
                code=code.decode("ascii", "backslashreplace"),
                text=text.decode("utf-8", "backslashreplace"),
            )
        if answered is Identify:
            try:
                info = decode_struct(payload, _INFO_FIELDS)
            except ValueError as exc:
                raise _bad(f"IDENTIFY response is not a JSON object: {exc}") from None
            return IdentifyResponse(**info)
        if payload != b"OK":
            raise _bad(f"expected OK, got {payload[:100]!r}")
        return _OK


def _bad(text: str) -> LookupProtocolError:
    return LookupProtocolError("E_BAD_PROTOCOL", text)
