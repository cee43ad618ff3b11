"""The server side of one V2 connection, sans I/O: bytes in, command events out.

Theory of operation
-------------------
``receive_data`` only appends the bytes to a list of chunks. ``next_events`` joins them into one
``bytes`` buffer only when something can be parsed, then parses *every* complete command in it
and returns them all, so the server handles a thousand FINs from one receive as one batch.

Parsing never rescans: when a command line is incomplete, the bytes already searched for its
newline are remembered, and new chunks are searched only for a newline before anything is joined
(so a line trickling in one byte at a time costs O(1) per byte). When a command's body is
incomplete, the parser records how many bytes the command needs in total and does nothing until
that many have arrived; a body declared bigger than the limits is refused as soon as its 4-byte
size is read, before any of it is buffered. Bodies in the events are ``bytes`` slices of the
buffer (the daemon keeps them).

Commands are dispatched on their name through a per-state dict (built from the table in
``state.py``), so a command that the state forbids costs nothing to check. SUB and CLS change
the state when they are parsed, so later commands in the same buffer see the new state.

Errors: each error is a ``ProtocolError`` with nsqd's text, checked in nsqd's order. If valid
commands precede the error in a buffer they are returned first and the error is raised by the
next call; every call after that raises it again (all parser errors are fatal).

Upgrades: an IDENTIFY that negotiates TLS, snappy or deflate is the last command parsed as
plaintext. The parser stops right after it (``upgrading`` becomes True) and parses nothing more
until ``resume()``: whatever the client sent after it belongs to the new layer (a TLS
ClientHello, compressed commands), and the server takes it back with ``take_unparsed()`` to
feed it through that layer. With ``Limits.tls_required`` every command but IDENTIFY is refused
with nsqd's ``E_INVALID cannot <CMD> in current state (TLS required)`` until the server calls
``tls_established()``; that is one more handler table, so the check costs nothing per command.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable

from lmqd.message import MSG_ID_LENGTH
from lmqd.message_ext import ExtError
from lmqd.names import decode_name
from lmqd.protocol import errors
from lmqd.protocol.errors import ProtocolError
from lmqd.protocol.events import (
    Auth,
    Cls,
    Dpub,
    Event,
    Fins,
    Identify,
    Nop,
    Rdy,
    Req,
    Sub,
    Touch,
    Xpub,
    make_fins,
    make_mpub,
    make_pub,
)
from lmqd.protocol.extension import EXT_VERSION, XpubBlockCache
from lmqd.protocol.identify import IdentifySettings, decode_identify_body, negotiate
from lmqd.protocol.limits import Limits
from lmqd.protocol.state import IGNORED_STATES, LEGAL_STATES, TRANSITIONS, ClientState

MAGIC_V2 = b"  V2"
"""The 4 bytes a V2 client sends first."""


_unpack_size = struct.Struct(">i").unpack_from
_UINT64_MASK = (1 << 64) - 1
# A run of well-formed "FIN <16-byte id>\n" lines (an id never holds a space, and one ending in
# "\r" would lose it to the line-ending strip, so those take the line-by-line path).
_FIN_RUN = re.compile(rb"(?:FIN [^ \r\n]{16}\n)+")
_FIN_LINE_LENGTH = 21
_FIN_COLUMNS = ((0, b"F"), (1, b"I"), (2, b"N"), (3, b" "), (20, b"\n"))
_NOP = Nop()
_CLS = Cls()

# A handler gets the connection, the command's parameters (the line split on spaces), the buffer
# and the offset just past the line; it appends its event and returns the offset after the
# command, or -(offset the command needs the buffer to reach) when its body is incomplete.
# Handlers are plain functions in tables shared by all connections (see _TABLES), so a
# connection holds no reference cycle and its buffer is freed as soon as it is dropped.
_Handler = Callable[["ServerConnection", list[bytes], bytes, int, list[Event]], int]


class _StopParsing(Exception):
    """Raised by a handler after a command that ends plaintext parsing (an upgrading
    IDENTIFY); ``offset`` is just past it."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


def parse_uint(raw: bytes) -> int | None:
    """nsqd's ``ByteToBase10``: unsigned decimal digits only, "" is 0, wraps modulo 2**64."""
    if not raw.isdigit():
        return 0 if not raw else None
    # 10**64 is a multiple of 2**64, so the last 64 digits decide the value modulo 2**64 (and
    # int() refuses strings of more than 4300 digits).
    return int(raw[-64:]) & _UINT64_MASK


def _as_int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


class ServerConnection:
    """Parses one client's byte stream into command events; see the module docstring."""

    limits: Limits
    state: ClientState
    """The client state (nsqd's numbers, shown in /stats)."""
    identify: IdentifySettings | None
    """The settings from the client's IDENTIFY, None until it sends one."""
    closed: bool
    """The peer sent EOF and everything before it has been returned by ``next_events``."""
    upgrading: bool
    """An IDENTIFY negotiated an upgrade: nothing more is parsed until ``resume()``."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.state = ClientState.INIT
        self.identify = None
        self.closed = False
        self._xpub_blocks = XpubBlockCache()
        self._auth_seen = False
        self._buf = b""
        self._pos = 0
        self._chunks: list[bytes] = []
        self._chunks_len = 0
        self._chunks_scanned = 0  # chunks already searched for a newline
        self._line_scanned = 0  # bytes of the pending line known to hold no newline
        self._need = len(MAGIC_V2)  # bytes (from _pos) required before parsing; 0 = a newline
        self._magic_ok = False
        self._eof = False
        self._error: ProtocolError | None = None
        self.upgrading = False
        self._tls_pending = limits.tls_required
        self._handlers = _TLS_GATE if limits.tls_required else _TABLES[ClientState.INIT]

    # -- input ------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the client; ``b""`` means the client closed (EOF)."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RuntimeError("received data after EOF")
        if self._error is not None:
            return  # the connection is ending: don't buffer what will never be parsed
        if type(data) is not bytes:
            data = bytes(data)  # bodies are slices of the buffer and must be bytes
        assert isinstance(data, bytes)
        self._chunks.append(data)
        self._chunks_len += len(data)

    def next_events(self) -> list[Event]:
        """Every complete command received so far, in order ([] = need more data).

        Raises ``ProtocolError`` for invalid input (after returning any valid commands that came
        before it), and again on every later call.
        """
        if self._error is not None:
            raise self._error
        events: list[Event] = []
        try:
            if self._ready_to_parse():
                self._join()
                if not self._magic_ok:
                    self._check_magic()
                self._parse(events)
        except ProtocolError as exc:
            self._error = exc
            if events:
                return events
            raise
        if self._eof:
            # Anything left is a partial command from a peer that is gone: nothing to answer.
            self.closed = True
        return events

    @property
    def started(self) -> bool:
        """Whether the client sent the protocol magic: nsqd's IOLoop (and its heartbeats)
        begins only then."""
        return self._magic_ok

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and held for a command not complete yet (the daemon-wide buffer
        bound counts them)."""
        return len(self._buf) + self._chunks_len

    @property
    def receiving_body(self) -> bool:
        """Whether a command's body (or its 4-byte size) is partly received: completing it
        takes exactly ``missing_bytes`` more, and only its client can send them."""
        return bool(self._need) and (len(self._buf) - self._pos + self._chunks_len) > 0

    @property
    def missing_bytes(self) -> int:
        """How many more bytes may be read to complete the command being received, and no
        more: what it still needs when its size is known, else what its line may still take
        (at least 1). 0 when nothing is pending."""
        available = len(self._buf) - self._pos + self._chunks_len
        if not available:
            return 0
        if self._need:
            return max(self._need - available, 1)
        return max(self.limits.max_line_length - available, 1)

    def take_unparsed(self) -> bytes:
        """Every byte received and not parsed (after an upgrading IDENTIFY: the first bytes of
        the new layer); they are forgotten here."""
        data = b"".join([memoryview(self._buf)[self._pos :], *self._chunks])
        self.discard_input()
        return data

    def discard_input(self) -> None:
        """Forget every byte received and not parsed: the connection is over, and a command
        it never completed (a large body its client abandoned) must not hold its memory until
        the connection object itself is collected."""
        self._buf = b""
        self._pos = 0
        self._chunks = []
        self._chunks_len = 0
        self._chunks_scanned = 0
        self._line_scanned = 0
        self._need = 0

    def resume(self) -> None:
        """The upgrade is in place: parse again (the bytes now come through the new layer)."""
        self.upgrading = False

    def tls_established(self) -> None:
        """The connection is TLS now: ``--tls-required`` no longer refuses commands."""
        if self._tls_pending:
            self._tls_pending = False
            self._handlers = _TABLES[self.state]

    def _ready_to_parse(self) -> bool:
        if not self._chunks or self.upgrading:
            return False
        available = len(self._buf) - self._pos + self._chunks_len
        if self._need:
            return available >= self._need
        # Waiting for the end of a command line: look for a newline in the new chunks only.
        chunks = self._chunks
        for i in range(self._chunks_scanned, len(chunks)):
            if b"\n" in chunks[i]:
                return True
        self._chunks_scanned = len(chunks)
        if available >= self.limits.max_line_length:
            raise errors.line_too_long(self.limits.max_line_length)
        return False

    def _join(self) -> None:
        chunks = self._chunks
        if self._pos >= len(self._buf) and len(chunks) == 1:
            self._buf = chunks[0]  # the common case: the previous buffer was fully parsed
        else:
            self._buf = b"".join([memoryview(self._buf)[self._pos :], *chunks])
        self._pos = 0
        self._chunks = []
        self._chunks_len = 0
        self._chunks_scanned = 0
        self._need = 0

    def _check_magic(self) -> None:
        if self._buf[:4] != MAGIC_V2:
            raise errors.bad_protocol()
        self._pos = 4
        self._magic_ok = True

    # -- the parse loop -------------------------------------------------------------------------

    def _parse(self, events: list[Event]) -> None:
        buf = self._buf
        pos = self._pos
        end = len(buf)
        max_line = self.limits.max_line_length
        skip = self._line_scanned
        self._line_scanned = 0
        try:
            while pos < end:
                nl = buf.find(b"\n", pos + skip)
                skip = 0
                if nl < 0:
                    if end - pos >= max_line:
                        raise errors.line_too_long(max_line)
                    self._line_scanned = end - pos
                    break
                if nl - pos >= max_line:
                    raise errors.line_too_long(max_line)
                line_end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl  # strip "\r"
                params = buf[pos:line_end].split(b" ")
                # self._handlers is looked up each time: SUB and CLS replace it.
                handler = self._handlers.get(params[0])
                if handler is None:
                    if self._tls_pending:  # nsqd checks the TLS policy before the name
                        raise errors.tls_required(params[0])
                    raise errors.invalid_command(params[0])
                after = handler(self, params, buf, nl + 1, events)
                if after < 0:
                    self._need = -after - pos
                    break
                pos = after
        except _StopParsing as stop:
            pos = stop.offset
            self.upgrading = True
        finally:
            if pos >= end:
                self._buf = b""
                self._pos = 0
            else:
                self._pos = pos

    # -- state ----------------------------------------------------------------------------------

    def _set_state(self, state: ClientState) -> None:
        self.state = state
        self._handlers = _TABLES[state]

    # -- commands without a body ----------------------------------------------------------------

    def _fin(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        if len(params) < 2:
            raise errors.insufficient_params("FIN")
        msg_id = params[1]
        if len(msg_id) != MSG_ID_LENGTH:
            raise errors.invalid_message_id()
        # A consumer sends one FIN per message, so FINs come in runs: take the rest of the run
        # at once (``_fin_run``) instead of line by line, and give consecutive FINs as one event.
        last = events[-1] if events else None
        if type(last) is Fins:
            ids = last.ids
        else:
            ids = []
            events.append(make_fins(ids))
        ids.append(msg_id)
        run = _fin_run(buf, p)
        ids += run
        return p + len(run) * _FIN_LINE_LENGTH

    def _req(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        if len(params) < 3:
            raise errors.insufficient_params("REQ")
        msg_id = params[1]
        if len(msg_id) != MSG_ID_LENGTH:
            raise errors.invalid_message_id()
        timeout_ms = parse_uint(params[2])
        if timeout_ms is None:
            raise errors.req_could_not_parse(params[2])
        events.append(Req(id=msg_id, timeout_ms=timeout_ms))
        return p

    def _touch(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        if len(params) < 2:
            raise errors.insufficient_params("TOUCH")
        msg_id = params[1]
        if len(msg_id) != MSG_ID_LENGTH:
            raise errors.invalid_message_id()
        events.append(Touch(id=msg_id))
        return p

    def _rdy(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        count = 1
        if len(params) > 1:
            parsed = parse_uint(params[1])
            if parsed is None:
                raise errors.rdy_could_not_parse(params[1])
            count = _as_int64(parsed)  # nsqd converts the uint64 to int64
        max_rdy = self.limits.max_rdy_count
        if count < 0 or count > max_rdy:
            raise errors.rdy_out_of_range(count, max_rdy)
        events.append(Rdy(count=count))
        return p

    def _sub(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        if self.identify is not None and self.identify.heartbeat_interval_ms <= 0:
            raise errors.sub_heartbeats_disabled()
        if len(params) < 3:
            raise errors.insufficient_params("SUB")
        topic = decode_name(params[1])
        if topic is None:
            raise errors.bad_topic("SUB", params[1])
        channel = decode_name(params[2])
        if channel is None:
            raise errors.bad_channel("SUB", params[2])
        events.append(Sub(topic=topic, channel=channel))
        self._set_state(TRANSITIONS["SUB"])
        return p

    def _cls(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        events.append(_CLS)
        self._set_state(TRANSITIONS["CLS"])
        return p

    def _nop(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        events.append(_NOP)
        return p

    # -- commands with a body -------------------------------------------------------------------

    def _pub(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        if len(params) < 2:
            raise errors.insufficient_params("PUB")
        topic = decode_name(params[1])
        if topic is None:
            raise errors.bad_topic("PUB", params[1])
        if len(buf) - p < 4:
            return -(p + 4)
        size: int = _unpack_size(buf, p)[0]
        if size <= 0:
            raise errors.message_invalid_size("PUB", size)
        max_msg = self.limits.max_msg_size
        if size > max_msg:
            raise errors.message_too_big("PUB", size, max_msg)
        p += 4
        end = p + size
        if end > len(buf):
            return -end
        append = events.append
        append(make_pub(topic, buf[p:end]))
        # A producer pipelines PUBs to one topic: while the next line is exactly "PUB <topic>\n"
        # take its message without re-parsing the line. Anything unusual (an incomplete or
        # invalid size or body) is left to the general path, which re-parses and reports it.
        line = b"PUB " + params[1] + b"\n"
        line_length = len(line)
        buf_length = len(buf)
        while buf.startswith(line, end):
            p = end + line_length
            if buf_length - p < 4:
                break
            size = _unpack_size(buf, p)[0]
            if size <= 0 or size > max_msg:
                break
            p += 4
            if p + size > buf_length:
                break
            append(make_pub(topic, buf[p : p + size]))
            end = p + size
        return end

    def _dpub(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        if len(params) < 3:
            raise errors.insufficient_params("DPUB")
        topic = decode_name(params[1])
        if topic is None:
            raise errors.bad_topic("DPUB", params[1])
        defer_ms = parse_uint(params[2])
        if defer_ms is None:
            raise errors.dpub_could_not_parse(params[2])
        if defer_ms > self.limits.max_req_timeout_ms:
            raise errors.dpub_out_of_range(defer_ms, self.limits.max_req_timeout_ms)
        if len(buf) - p < 4:
            return -(p + 4)
        size: int = _unpack_size(buf, p)[0]
        if size <= 0:
            raise errors.message_invalid_size("DPUB", size)
        if size > self.limits.max_msg_size:
            raise errors.message_too_big("DPUB", size, self.limits.max_msg_size)
        p += 4
        end = p + size
        if end > len(buf):
            return -end
        events.append(Dpub(topic=topic, defer_ms=defer_ms, body=buf[p:end]))
        return end

    def _mpub(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        if len(params) < 2:
            raise errors.insufficient_params("MPUB")
        topic = decode_name(params[1])
        if topic is None:
            raise errors.bad_topic("MPUB", params[1])
        if len(buf) - p < 4:
            return -(p + 4)
        limits = self.limits
        body_size: int = _unpack_size(buf, p)[0]
        if body_size <= 0:
            raise errors.invalid_body_size("MPUB", body_size)
        if body_size > limits.max_body_size:
            raise errors.body_too_big("MPUB", body_size, limits.max_body_size)
        if body_size < 4:
            raise errors.mpub_size_mismatch(body_size)  # no room for the message count
        if len(buf) - p < 8:
            return -(p + 8)
        count: int = _unpack_size(buf, p + 4)[0]
        # Each message takes at least 5 bytes (4-byte size + 1-byte body) after the count.
        if count <= 0 or count > (limits.max_body_size - 4) // 5:
            raise errors.mpub_invalid_count(count)
        end = p + 4 + body_size
        if end > len(buf):
            return -end
        # The whole body is here (at most max_body_size bytes): check and slice its parts.
        max_msg = limits.max_msg_size
        bodies: list[bytes] = []
        append = bodies.append
        q = p + 8
        for i in range(count):
            if q + 4 > end:
                raise errors.mpub_size_mismatch(body_size)
            size = _unpack_size(buf, q)[0]
            if size <= 0:
                raise errors.mpub_invalid_message_size(i, size)
            if size > max_msg:
                raise errors.message_too_big("MPUB", size, max_msg)
            q += 4
            next_q = q + size
            if next_q > end:
                raise errors.mpub_size_mismatch(body_size)
            append(buf[q:next_q])
            q = next_q
        if q != end:
            raise errors.mpub_size_mismatch(body_size)
        events.append(make_mpub(topic, bodies))
        return end

    def _xpub(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        # lmq's extension (lmqd.protocol.extension): MPUB's body rules, each message with its
        # extension block, optionally deferred as DPUB.
        if self.identify is None or self.identify.lmq_ext != EXT_VERSION:
            raise errors.extension_not_negotiated()
        if len(params) < 2:
            raise errors.insufficient_params("XPUB")
        topic = decode_name(params[1])
        if topic is None:
            raise errors.bad_topic("XPUB", params[1])
        defer_ms = 0
        if len(params) > 2:
            parsed = parse_uint(params[2])
            if parsed is None:
                raise errors.dpub_could_not_parse(params[2])
            if parsed > self.limits.max_req_timeout_ms:
                raise errors.dpub_out_of_range(parsed, self.limits.max_req_timeout_ms)
            defer_ms = parsed
        body = self._read_body("XPUB", buf, p)
        if isinstance(body, int):
            return body
        try:
            bodies, exts = self._xpub_blocks.parse(body, max_msg_size=self.limits.max_msg_size)
        except ExtError as exc:
            raise errors.bad_extension(str(exc)) from None
        events.append(Xpub(topic=topic, bodies=bodies, exts=exts, defer_ms=defer_ms))
        return p + 4 + len(body)

    def _identify(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        if self.identify is not None:
            # nsqd accepts a second IDENTIFY but its message pump ignores it; lmqd refuses.
            raise errors.cannot_in_state("IDENTIFY")
        body = self._read_body("IDENTIFY", buf, p)
        if isinstance(body, int):
            return body
        data = decode_identify_body(body)
        settings = negotiate(data, self.limits)
        self.identify = settings
        events.append(Identify(settings=settings, data=data))
        if settings.tls_v1 or settings.snappy or settings.deflate:
            raise _StopParsing(p + 4 + len(body))
        return p + 4 + len(body)

    def _auth(self, params: list[bytes], buf: bytes, p: int, events: list[Event]) -> int:
        if len(params) != 1:
            raise errors.auth_invalid_params()
        body = self._read_body("AUTH", buf, p)
        if isinstance(body, int):
            return body
        if self._auth_seen:
            raise errors.auth_already_set()
        self._auth_seen = True
        events.append(Auth(secret=body))
        return p + 4 + len(body)

    def _read_body(self, cmd: str, buf: bytes, p: int) -> bytes | int:
        """IDENTIFY's, AUTH's and XPUB's ``[size][body]``: the body, or -(offset needed)."""
        if len(buf) - p < 4:
            return -(p + 4)
        size: int = _unpack_size(buf, p)[0]
        max_body = self.limits.max_body_size
        if size > max_body:
            raise errors.body_too_big(cmd, size, max_body)
        if size <= 0:
            raise errors.invalid_body_size(cmd, size)
        p += 4
        end = p + size
        if end > len(buf):
            return -end
        return buf[p:end]


def _fin_run(buf: bytes, p: int) -> list[bytes]:
    """The ids of the well-formed ``FIN <16-byte id>\\n`` lines starting at ``p``, in order.

    All in C, however long the run: a column at a time, every 21st byte must be ``F``, the next
    ``I`` and so on (``bytes.lstrip`` counts how many lines in a row have it); then, if the run
    holds exactly one space and one newline per line and no ``\\r``, its ids are what is left
    once the ``FIN `` prefixes are removed, split on the newlines. Otherwise an id holds a space,
    ``\\r`` or ``\\n`` (which the line-by-line parser reads differently) and the run ends at the
    first such line, which ``_FIN_RUN`` finds (a rare case).
    """
    count = (len(buf) - p) // _FIN_LINE_LENGTH
    for offset, char in _FIN_COLUMNS:
        if not count:
            return []
        column = buf[p + offset : p + count * _FIN_LINE_LENGTH : _FIN_LINE_LENGTH]
        count -= len(column.lstrip(char))
    if not count:
        return []
    run = buf[p : p + count * _FIN_LINE_LENGTH]
    if run.count(b" ") != count or run.count(b"\n") != count or b"\r" in run:
        match = _FIN_RUN.match(buf, p)
        if match is None:
            return []
        run = buf[p : match.end()]
    ids = run.replace(b"FIN ", b"").split(b"\n")
    ids.pop()  # the empty piece after the last newline
    return ids


def _ignore(
    conn: ServerConnection, params: list[bytes], buf: bytes, p: int, events: list[Event]
) -> int:
    return p


def _illegal(cmd: str) -> _Handler:
    def handler(
        conn: ServerConnection, params: list[bytes], buf: bytes, p: int, events: list[Event]
    ) -> int:
        raise errors.cannot_in_state(cmd)

    return handler


_HANDLERS: dict[str, _Handler] = {
    "IDENTIFY": ServerConnection._identify,
    "AUTH": ServerConnection._auth,
    "SUB": ServerConnection._sub,
    "RDY": ServerConnection._rdy,
    "FIN": ServerConnection._fin,
    "REQ": ServerConnection._req,
    "TOUCH": ServerConnection._touch,
    "CLS": ServerConnection._cls,
    "NOP": ServerConnection._nop,
    "PUB": ServerConnection._pub,
    "MPUB": ServerConnection._mpub,
    "DPUB": ServerConnection._dpub,
    "XPUB": ServerConnection._xpub,
}


def _table(state: ClientState) -> dict[bytes, _Handler]:
    """Command name -> handler in ``state``, from the table in state.py."""
    table: dict[bytes, _Handler] = {}
    for name, handler in _HANDLERS.items():
        if state in LEGAL_STATES[name]:
            table[name.encode()] = handler
        elif state in IGNORED_STATES.get(name, ()):
            table[name.encode()] = _ignore
        else:
            table[name.encode()] = _illegal(name)
    return table


_TABLES: dict[ClientState, dict[bytes, _Handler]] = {state: _table(state) for state in ClientState}


def _tls_refused(cmd: bytes) -> _Handler:
    def handler(
        conn: ServerConnection, params: list[bytes], buf: bytes, p: int, events: list[Event]
    ) -> int:
        raise errors.tls_required(cmd)

    return handler


_TLS_GATE: dict[bytes, _Handler] = {
    name: handler if name == b"IDENTIFY" else _tls_refused(name)
    for name, handler in _TABLES[ClientState.INIT].items()
}
"""The table of a connection that must upgrade to TLS first (only IDENTIFY is not refused)."""
