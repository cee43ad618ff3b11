"""The client side of a V2 connection, sans I/O: commands to bytes, bytes to frame events.

Used by lmq_client and by the tests. It buffers like ``ServerConnection``: chunks are joined only
once a whole frame has arrived, and every complete frame in the buffer is decoded at once.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Mapping
from typing import Any, TypeAlias

from lmqd.message_ext import ExtError, decode_ext
from lmqd.protocol.connection import MAGIC_V2
from lmqd.protocol.errors import ProtocolError
from lmqd.protocol.events import Command, encode_identify
from lmqd.protocol.extension import FRAME_TYPE_EXT_MESSAGE
from lmqd.protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    MESSAGE_HEADER_SIZE,
    Error,
    MessageFrame,
    Response,
    make_message_frame,
)

FrameEvent: TypeAlias = Response | Error | MessageFrame
"""What ``ClientConnection.next_events()`` returns."""

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
"""Largest frame accepted by default: far above what nsqd sends with its default
``--max-msg-size`` (1 MiB + 30 bytes of framing), while bounding a client's buffer against a
corrupt size field. Raise it for a server with a larger ``--max-msg-size``."""

_unpack_size = struct.Struct(">i").unpack_from
_unpack_message = struct.Struct(">iiqH16s").unpack_from
_U16 = struct.Struct(">H")


class ClientConnection:
    """Encodes commands and decodes the server's frames for one connection."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._eof_parsed = False
        self._buf = b""
        self._pos = 0
        self._chunks: list[bytes] = []
        self._chunks_len = 0
        self._need = 4  # bytes (from _pos) required before anything can be decoded
        self._eof = False
        self._error: ProtocolError | None = None
        self._pending: collections.deque[FrameEvent] = collections.deque()

    @staticmethod
    def initial_bytes() -> bytes:
        """The protocol magic, to send first."""
        return MAGIC_V2

    @staticmethod
    def send(event: Command | Mapping[str, Any]) -> bytes:
        """The bytes for a command; a mapping is sent as IDENTIFY with that JSON body."""
        if isinstance(event, Mapping):
            return encode_identify(event)
        return event.encode()

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the server; ``b""`` means the server closed (EOF)."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RuntimeError("received data after EOF")
        if type(data) is not bytes:
            data = bytes(data)
        assert isinstance(data, bytes)
        self._chunks.append(data)
        self._chunks_len += len(data)

    def next_events(self) -> list[FrameEvent]:
        """Every complete frame received so far, decoded ([] = need more data).

        Raises ``ProtocolError`` (code ``E_BAD_PROTOCOL``) for a frame that cannot be valid: a
        size below 4 or above ``max_frame_size``, an unknown frame type, a short message frame.
        Frames before the bad one are returned first; later calls raise again.
        """
        events = list(self._pending)
        self._pending.clear()
        if self._error is not None:
            if events:
                return events
            raise self._error
        try:
            if self._chunks and len(self._buf) - self._pos + self._chunks_len >= self._need:
                self._join()
                self._parse(events)
        except ProtocolError as exc:
            self._error = exc
            if events:
                return events
            raise
        if self._eof:
            self._eof_parsed = True
        return events

    @property
    def closed(self) -> bool:
        """The server sent EOF and every complete frame before it has been returned."""
        return self._eof_parsed and not self._pending

    def next_event(self) -> FrameEvent | None:
        """The next complete frame, or None if more data is needed."""
        if not self._pending:
            self._pending.extend(self.next_events())
        return self._pending.popleft() if self._pending else None

    def _join(self) -> None:
        chunks = self._chunks
        if self._pos >= len(self._buf) and len(chunks) == 1:
            self._buf = chunks[0]
        else:
            self._buf = b"".join([memoryview(self._buf)[self._pos :], *chunks])
        self._pos = 0
        self._chunks = []
        self._chunks_len = 0

    def _parse(self, events: list[FrameEvent]) -> None:
        buf = self._buf
        pos = self._pos
        end = len(buf)
        max_size = self.max_frame_size
        need = 4
        try:
            while end - pos >= 4:
                size = _unpack_size(buf, pos)[0]
                if size < 4:  # the size counts the 4-byte frame type
                    raise ProtocolError("E_BAD_PROTOCOL", f"invalid frame size {size}")
                if size > max_size:
                    raise ProtocolError("E_BAD_PROTOCOL", f"frame too big {size} > {max_size}")
                frame_end = pos + 4 + size
                if frame_end > end:
                    need = frame_end - pos
                    break
                frame_type = _unpack_size(buf, pos + 4)[0]
                if frame_type == FRAME_TYPE_MESSAGE:
                    if size < 4 + MESSAGE_HEADER_SIZE:
                        raise ProtocolError("E_BAD_PROTOCOL", f"message frame too short ({size})")
                    _, _, timestamp, attempts, msg_id = _unpack_message(buf, pos)
                    events.append(
                        make_message_frame(msg_id, timestamp, attempts, buf[pos + 34 : frame_end])
                    )
                elif frame_type == FRAME_TYPE_EXT_MESSAGE:
                    events.append(_ext_message(buf, pos, size, frame_end))
                elif frame_type == FRAME_TYPE_RESPONSE:
                    events.append(Response(data=buf[pos + 8 : frame_end]))
                elif frame_type == FRAME_TYPE_ERROR:
                    code, _, text = buf[pos + 8 : frame_end].partition(b" ")
                    events.append(
                        Error(
                            code=code.decode("ascii", "backslashreplace"),
                            text=text.decode("utf-8", "backslashreplace"),
                        )
                    )
                else:
                    raise ProtocolError("E_BAD_PROTOCOL", f"unknown frame type {frame_type}")
                pos = frame_end
        finally:
            self._need = need
            if pos >= end:
                self._buf = b""
                self._pos = 0
            else:
                self._pos = pos


def _ext_message(buf: bytes, pos: int, size: int, frame_end: int) -> MessageFrame:
    """An extended message frame (type 3: lmq's extension) at ``pos``."""
    head = 4 + MESSAGE_HEADER_SIZE
    if size < head + 2:
        raise ProtocolError("E_BAD_PROTOCOL", f"message frame too short ({size})")
    _, _, timestamp, attempts, msg_id = _unpack_message(buf, pos)
    at = pos + 4 + head
    n = _U16.unpack_from(buf, at)[0]
    body_at = at + 2 + n
    if body_at > frame_end:
        raise ProtocolError("E_BAD_PROTOCOL", "extension block past the frame's end")
    try:
        ext = decode_ext(buf[at + 2 : body_at])
    except ExtError as exc:
        raise ProtocolError("E_BAD_PROTOCOL", f"bad extension block: {exc}") from None
    return make_message_frame(msg_id, timestamp, attempts, buf[body_at:frame_end], ext)
