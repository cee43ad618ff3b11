"""The lookupd side of one V1 connection, sans I/O: bytes in, command events out.

Theory of operation
-------------------
``receive_data`` appends to one ``bytearray``; the bytes already parsed are dropped from its
front once per ``receive_data`` call (not once per command, so a buffer of many pipelined
commands is not shifted once per command). ``next_event`` parses one command from the read
position: either a command line, or (after an ``IDENTIFY`` line) the 4-byte body size and then
the body. The part of a pending line already searched for its newline is remembered, so a line
that trickles in one byte at a time is searched once in total, never rescanned.

Lines are handled as nsqlookupd handles them: ASCII whitespace is stripped from both ends (Go's
``strings.TrimSpace``; nsqlookupd would also strip the non-ASCII spaces U+0085 and U+00A0, which
no registering node sends), the rest is split on single spaces, and the first word is the
command, looked up in the state table of ``state.py``. Parameters past the ones a command uses
are ignored, and an empty channel parameter (``REGISTER t  c``) means "no channel", as in
nsqlookupd.

Bounds (nsqlookupd has none; these keep one connection's buffer small):

- ``MAX_LINE_LENGTH``: a line that has not ended within it is refused;
- ``MAX_IDENTIFY_SIZE``: a larger (or negative) IDENTIFY size is refused as soon as the size
  is read, before any of the body is buffered.

Errors: every V1 error is fatal. ``next_event`` raises the ``LookupProtocolError`` (with
nsqlookupd's text) when it reaches the bad input, after returning the valid commands before
it, and raises it again on every later call; the server sends ``error.frame()`` and closes.
The end of the stream (``receive_data(b"")``) inside an IDENTIFY body or its size is an error
too, as in nsqlookupd; anywhere else it is ``ConnectionClosed``.
"""

from __future__ import annotations

import enum
import struct

from lmqd.lookup import errors
from lmqd.lookup.errors import LookupProtocolError
from lmqd.lookup.events import (
    Command,
    ConnectionClosed,
    Identify,
    Ping,
    Register,
    Response,
    Unregister,
)
from lmqd.lookup.gojson import decode_struct
from lmqd.lookup.state import COMMANDS, TRANSITIONS, PeerState
from lmqd.names import decode_name

__all__ = [
    "MAGIC_V1",
    "MAX_IDENTIFY_SIZE",
    "MAX_LINE_LENGTH",
    "LookupServerConnection",
]

MAGIC_V1 = b"  V1"
"""The 4 bytes a V1 peer sends first."""

MAX_LINE_LENGTH = 1024
"""Longest command line accepted, newline included.

The longest legitimate line is ``UNREGISTER <64-byte topic> <64-byte channel>\\r\\n``, 142 bytes;
1 KiB is well above it and bounds what a peer that never sends a newline can make us buffer.
"""

MAX_IDENTIFY_SIZE = 1024 * 1024
"""Largest IDENTIFY body accepted.

nsqd sends about 100 bytes (nsqd master adds two short topology fields); 1 MiB leaves any
future field room while bounding the buffer. nsqlookupd itself allocates whatever size it is
sent, and crashes on a negative one.
"""

_unpack_size = struct.Struct(">i").unpack_from
_SPACE = b" "

# What an IDENTIFY body is decoded into: nsqlookupd's PeerInfo fields (remote_address included:
# it is type-checked, then replaced with the connection's address).
_PEER_FIELDS: dict[str, type] = {
    "remote_address": str,
    "hostname": str,
    "broadcast_address": str,
    "tcp_port": int,
    "http_port": int,
    "version": str,
}


class _Expect(enum.Enum):
    LINE = "line"
    IDENTIFY_SIZE = "identify size"
    IDENTIFY_BODY = "identify body"


class LookupServerConnection:
    """Parses one registering node's byte stream into command events; see the module docstring.

    ``state`` is the peer's state (``state.py``): IDENTIFIED once an ``Identify`` event has been
    returned.
    """

    state: PeerState
    max_line_length: int
    max_identify_size: int

    def __init__(
        self,
        *,
        max_line_length: int = MAX_LINE_LENGTH,
        max_identify_size: int = MAX_IDENTIFY_SIZE,
    ) -> None:
        self.state = PeerState.AWAITING_MAGIC
        self.max_line_length = max_line_length
        self.max_identify_size = max_identify_size
        self._buf = bytearray()
        self._pos = 0
        self._scanned = 0  # bytes from _pos known to hold no newline
        self._expect = _Expect.LINE
        self._body_size = 0
        self._eof = False
        self._error: LookupProtocolError | None = None

    # -- input and output ---------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the peer; ``b""`` means the peer closed (EOF)."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RuntimeError("received data after EOF")
        if self._error is not None:
            return  # the connection is ending: don't buffer what will never be parsed
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @staticmethod
    def send(event: Response) -> bytes:
        """The bytes of a response (``Ok``, ``IdentifyResponse``, ``Error``)."""
        return event.encode()

    def next_event(self) -> Command | ConnectionClosed | None:
        """The next command, ``ConnectionClosed`` after the peer's EOF, or None (need data).

        Raises ``LookupProtocolError`` for invalid input, and again on every later call.
        """
        if self._error is not None:
            raise self._error
        try:
            event = self._parse_one()
        except LookupProtocolError as exc:
            self._error = exc
            raise
        if event is None and self._eof:
            if self._expect is _Expect.IDENTIFY_SIZE:
                self._error = errors.failed_to_read_body_size()
                raise self._error
            if self._expect is _Expect.IDENTIFY_BODY:
                self._error = errors.failed_to_read_body()
                raise self._error
            # Anything else left is a partial line from a peer that is gone: nothing to answer.
            return ConnectionClosed()
        return event

    def next_events(self) -> list[Command | ConnectionClosed]:
        """Every event available now, in order ([] = need data).

        An error is raised once the events before it have been returned (by this call, or by
        the next one if this one had events to return).
        """
        events: list[Command | ConnectionClosed] = []
        while True:
            try:
                event = self.next_event()
            except LookupProtocolError:
                if events:
                    return events
                raise
            if event is None:
                return events
            events.append(event)
            if isinstance(event, ConnectionClosed):
                return events

    # -- parsing ------------------------------------------------------------------------------

    def _parse_one(self) -> Command | None:
        buf = self._buf
        available = len(buf) - self._pos
        if self.state is PeerState.AWAITING_MAGIC:
            if available < len(MAGIC_V1):
                return None
            if buf[: len(MAGIC_V1)] != MAGIC_V1:
                raise errors.bad_protocol()
            self._pos = len(MAGIC_V1)
            self.state = PeerState.ANONYMOUS
            available -= len(MAGIC_V1)
        while True:
            if self._expect is _Expect.IDENTIFY_SIZE:
                if available < 4:
                    return None
                size: int = _unpack_size(buf, self._pos)[0]
                if size < 0:
                    raise errors.invalid_body_size(size)
                if size > self.max_identify_size:
                    raise errors.body_too_big(size, self.max_identify_size)
                self._pos += 4
                available -= 4
                self._body_size = size
                self._expect = _Expect.IDENTIFY_BODY
            if self._expect is _Expect.IDENTIFY_BODY:
                if available < self._body_size:
                    return None
                end = self._pos + self._body_size
                body = bytes(buf[self._pos : end])
                self._pos = end
                self._expect = _Expect.LINE
                return self._identify(body)
            line = self._next_line()
            if line is None:
                return None
            command = self._command(line)
            if command is not None:
                return command
            # IDENTIFY: go on to its size and body.
            available = len(buf) - self._pos

    def _next_line(self) -> bytes | None:
        buf = self._buf
        start = self._pos
        newline = buf.find(b"\n", start + self._scanned)
        if newline < 0:
            pending = len(buf) - start
            if pending >= self.max_line_length:
                raise errors.line_too_long(self.max_line_length)
            self._scanned = pending
            return None
        if newline + 1 - start > self.max_line_length:
            raise errors.line_too_long(self.max_line_length)
        self._scanned = 0
        self._pos = newline + 1
        return bytes(buf[start:newline]).strip()

    def _command(self, line: bytes) -> Command | None:
        """The event for a command line, or None for IDENTIFY (whose body follows)."""
        params = line.split(_SPACE)
        name = params[0]
        rules = COMMANDS.get(name)
        if rules is None:
            raise errors.invalid_command(name)
        refusal = rules[self.state]
        if refusal is not None:
            raise refusal()
        if name == b"PING":
            return Ping()
        if name == b"IDENTIFY":
            self._expect = _Expect.IDENTIFY_SIZE
            return None
        verb = name.decode("ascii")
        if len(params) < 2:
            raise errors.insufficient_params(verb)
        topic = decode_name(params[1])
        if topic is None:
            raise errors.bad_topic(verb, params[1])
        channel: str | None = None
        raw_channel = params[2] if len(params) > 2 else b""
        if raw_channel:
            channel = decode_name(raw_channel)
            if channel is None:
                raise errors.bad_channel(verb, raw_channel)
        if name == b"REGISTER":
            return Register(topic=topic, channel=channel)
        return Unregister(topic=topic, channel=channel)

    def _identify(self, body: bytes) -> Identify:
        try:
            peer = decode_struct(body, _PEER_FIELDS)
        except ValueError:
            raise errors.failed_to_decode_body() from None
        if not (
            peer["broadcast_address"] and peer["tcp_port"] and peer["http_port"] and peer["version"]
        ):
            raise errors.missing_fields()
        self.state = TRANSITIONS[b"IDENTIFY"]
        return Identify(
            broadcast_address=peer["broadcast_address"],
            tcp_port=peer["tcp_port"],
            http_port=peer["http_port"],
            version=peer["version"],
            hostname=peer["hostname"],
        )
