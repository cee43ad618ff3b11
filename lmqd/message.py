"""The message object shared by topics, channels, storage and the wire encoder.

A message is created once per publish and stored once in its topic's stream; each channel that
delivers it makes its own copy (the per-channel fields differ) sharing the same ``id``,
``timestamp`` and ``body`` object, so a body is never copied in memory however many channels a
topic has.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable
from itertools import chain

import attrs

from lmqd.message_ext import MessageExt, decode_ext, encode_ext

# nsqd/guid.go: 64-bit ids from a millisecond-ish clock (UnixNano >> 20), a node id and a sequence.
_TWEPOCH = 1288834974288
_NODE_ID_BITS = 10
_SEQUENCE_BITS = 12
_SEQUENCE_MASK = (1 << _SEQUENCE_BITS) - 1
_TS_SHIFT = _NODE_ID_BITS + _SEQUENCE_BITS

MSG_ID_LENGTH = 16


@attrs.define(slots=True, eq=False, repr=False, weakref_slot=False)
class Message:
    """One message as a topic or channel holds it.

    ``deliver_at`` and ``deadline`` are on the trio clock (``trio.current_time()``); storage
    converts them to wall-clock time when it writes them, so deferred messages keep their
    deadline across restarts.
    """

    id: bytes
    """16 bytes of lowercase ASCII hex, as on the wire."""
    body: bytes
    timestamp: int
    """Publish time, nanoseconds since the Unix epoch; kept through requeues and restarts."""
    attempts: int = 0
    """Deliveries so far; incremented right before each delivery (first delivery sends 1)."""
    deliver_at: float = 0.0
    """Trio time before which the message must not be delivered (DPUB, REQ with a delay)."""
    client_id: int = 0
    """While in flight: the id of the client that holds it."""
    deadline: float = 0.0
    """While in flight: trio time at which it times out."""
    delivered_at: float = 0.0
    """While in flight: trio time of this delivery (TOUCH never extends past it + max timeout)."""
    offset: int = -1
    """The message's offset in its topic's stream (``lmqd.engine.stream``), on the copies a
    channel reads from its topic's log; -1 for none (the published objects themselves: the
    stream knows their offsets). A durable channel keeps it while the message holds its
    cursor's low-water mark, and sets it to -1 once a copy in a store stands for it."""
    ext: MessageExt | None = None
    """lmq's per-message fields (priority, TTL, dedup id, headers), for the messages published
    with them (``lmqd.message_ext``); None for every other message: NSQ's messages cost nothing
    more than this slot."""

    def copy(self) -> Message:
        """A fresh per-channel copy: same id, timestamp, body object, deferral, offset and
        extension."""
        return Message(
            self.id, self.body, self.timestamp, self.attempts, self.deliver_at, 0, 0.0, 0.0,
            self.offset, self.ext,
        )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"<Message {self.id.decode('ascii', 'replace')} attempts={self.attempts} "
            f"len={len(self.body)}>"
        )


def copies(messages: Iterable[Message]) -> list[Message]:
    """``[m.copy() for m in messages]`` without a method call per message (a channel's
    copies of a batch: the hot path of topics with several channels)."""
    new = Message
    return [
        new(m.id, m.body, m.timestamp, m.attempts, m.deliver_at, 0, 0.0, 0.0, m.offset, m.ext)
        for m in messages
    ]


class GuidFactory:
    """Time-ordered unique 64-bit message ids, after nsqd's ``guid.go`` (one per topic).

    nsqd refuses to make more than 4096 ids in one clock tick and makes the caller retry; this
    factory instead borrows the next tick, so a burst never fails and ids stay unique and
    increasing as long as the wall clock does not jump backwards by more than the burst borrowed.
    """

    __slots__ = ("_last_tick", "_node_bits", "_sequence")

    def __init__(self, node_id: int) -> None:
        if not 0 <= node_id < (1 << _NODE_ID_BITS):
            raise ValueError("--node-id must be [0,1024)")
        self._node_bits = node_id << _SEQUENCE_BITS
        self._last_tick = 0
        self._sequence = 0

    def new_ids(self, count: int) -> list[bytes]:
        """Return ``count`` new ids, each 16 bytes of lowercase hex.

        Ids within one tick are consecutive integers, so a run of them is packed as big-endian
        uint64s and turned to hex in one call, split on the separator ``bytes.hex`` puts
        between every 8 bytes: ~80 ns an id, against ~300 ns for ``b"%016x" % value`` each.
        """
        tick = (time.time_ns() >> 20) - _TWEPOCH
        if tick <= self._last_tick:
            tick = self._last_tick
            seq = self._sequence
        else:
            seq = 0
        runs: list[range] = []
        left = count
        while left:
            if seq > _SEQUENCE_MASK:
                tick += 1
                seq = 0
            take = min(left, _SEQUENCE_MASK + 1 - seq)
            first = (tick << _TS_SHIFT) | self._node_bits | seq
            runs.append(range(first, first + take))
            seq += take
            left -= take
        self._last_tick = tick
        self._sequence = seq
        values = runs[0] if len(runs) == 1 else chain.from_iterable(runs)
        return struct.pack(f">{count}Q", *values).hex(" ", 8).encode().split()

    def new_id(self) -> bytes:
        return self.new_ids(1)[0]


READ_FRAME = struct.Struct(">IqqH16s")
"""A message as lmqd's ``GET /topic/read`` sends it (docs/http.md): size (the bytes after this
field: 34 + the body's), offset, timestamp (ns since the epoch), attempts, id; then the body.
NSQ's message frame with the offset added, so a reader can resume exactly where it stopped."""

READ_CONTENT_TYPE = "application/x-lmq-messages"

READ_EXT_LENGTH = struct.Struct(">H")
"""With ``ext=1`` (``GET /topic/read``), the length of the extension block that follows the id in
every frame (0: none); the block holds what a consumer sees of the extension (priority and
headers, as in frame type 3), and ``size`` counts it and its length."""


def encode_read_frames(entries: Iterable[tuple[int, Message]], *, ext: bool = False) -> bytes:
    """``(offset, message)`` pairs as ``READ_FRAME``\\ s, concatenated; with ``ext``, each with
    its extension's length and block after the id (``READ_EXT_LENGTH``)."""
    pack = READ_FRAME.pack
    fixed = READ_FRAME.size - 4
    parts: list[bytes] = []
    if not ext:
        for offset, m in entries:
            body = m.body
            parts.append(pack(fixed + len(body), offset, m.timestamp, m.attempts, m.id))
            parts.append(body)
        return b"".join(parts)
    fixed += READ_EXT_LENGTH.size
    no_block = READ_EXT_LENGTH.pack(0)
    for offset, m in entries:
        body = m.body
        block = b""
        if m.ext is not None and m.ext.visible:
            shown = MessageExt(priority=m.ext.priority, headers=m.ext.headers)
            block = encode_ext(shown, check=False)
        parts.append(
            pack(fixed + len(block) + len(body), offset, m.timestamp, m.attempts, m.id)
        )
        parts.append(READ_EXT_LENGTH.pack(len(block)) + block if block else no_block)
        parts.append(body)
    return b"".join(parts)


def decode_read_frames(data: bytes, *, ext: bool = False) -> list[tuple[int, Message]]:
    """The ``(offset, message)`` pairs of ``encode_read_frames`` (with ``ext``: of
    ``encode_read_frames(..., ext=True)``, each message with its extension, None without one);
    raises ``ValueError`` (``ExtError`` for a bad block) if the data is not framed so."""
    out: list[tuple[int, Message]] = []
    header = READ_FRAME.size + (READ_EXT_LENGTH.size if ext else 0)
    unpack = READ_FRAME.unpack_from
    pos = 0
    end = len(data)
    length = 0
    while pos < end:
        if pos + header > end:
            raise ValueError("truncated read frame")
        size, offset, ts, attempts, msg_id = unpack(data, pos)
        if ext:
            (length,) = READ_EXT_LENGTH.unpack_from(data, pos + READ_FRAME.size)
        stop = pos + 4 + size
        if size < header - 4 + length or stop > end:
            raise ValueError("malformed read frame")
        message = Message(msg_id, data[pos + header + length : stop], ts, attempts)
        if length:
            message.ext = decode_ext(data[pos + header : pos + header + length])
        out.append((offset, message))
        pos = stop
    return out
