"""The lmq message extension on the wire, sans I/O.

A client opts in with ``"lmq_ext": 1`` in IDENTIFY (nsqd ignores unknown keys; lmqd's answer then
carries ``"lmq_ext": 1``). A client that does not ask never sees a byte of what follows. Each
message's fields travel as its **extension block** (``lmqd.message_ext``: priority, ttl_ms, dedup
id, headers).

**XPUB** (``parse_xpub_body``): publish one or more messages with their blocks, optionally
deferred: ``XPUB <topic> [<defer_ms>]\\n[4 size][4 count][count x ([2 ext length][ext][4 body
size][body])]``. ``size`` counts the bytes after itself. One ``OK`` answers the whole command, as
for MPUB; all or nothing.

**Message frames** to a consumer that negotiated the extension: a message with a priority or
headers comes in frame type 3 (``FRAME_TYPE_EXT_MESSAGE``), ``[8 timestamp][2 attempts][16 id]
[2 ext length][ext][body]``, the block holding the priority and headers (a TTL and a dedup id are
the daemon's business and are not sent); any other message comes in nsqd's frame type 2.
"""

from __future__ import annotations

import struct

import attrs

from lmqd.message_ext import (
    DEDUP_ID,
    NO_EXT,
    ExtError,
    MessageExt,
    decode_ext,
    encode_ext,
    with_dedup_id,
)

__all__ = [
    "EXT_VERSION",
    "FRAME_TYPE_EXT_MESSAGE",
    "IDENTIFY_KEY",
    "XpubBlockCache",
    "XpubMessage",
    "encode_xpub",
    "parse_xpub_body",
    "parse_xpub_columns",
]

IDENTIFY_KEY = "lmq_ext"
EXT_VERSION = 1
"""The extension's version: what a client puts under ``IDENTIFY_KEY`` and the answer repeats."""

FRAME_TYPE_EXT_MESSAGE = 3

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")


@attrs.frozen(slots=True)
class XpubMessage:
    """One message of an XPUB: its body and its extension."""

    body: bytes
    ext: MessageExt


def encode_xpub(topic: str, messages: list[XpubMessage], defer_ms: int | None = None) -> bytes:
    """The XPUB command for ``messages`` (a client's side)."""
    parts = [b"", b""]
    for m in messages:
        block = encode_ext(m.ext)
        parts += (_U16.pack(len(block)), block, _U32.pack(len(m.body)), m.body)
    parts[1] = _U32.pack(len(messages))
    size = sum(map(len, parts))
    line = (
        b"XPUB %s\n" % topic.encode()
        if defer_ms is None
        else (b"XPUB %s %d\n" % (topic.encode(), defer_ms))
    )
    parts[0] = line + _U32.pack(size)
    return b"".join(parts)


def parse_xpub_body(body: bytes, *, max_msg_size: int) -> list[XpubMessage]:
    """The messages of an XPUB body (what follows its 4-byte size); raises ``ExtError`` for
    anything malformed: a count that is not what follows, a message size of 0 or over
    ``max_msg_size``, a bad block, trailing bytes."""
    bodies, exts = parse_xpub_columns(body, max_msg_size=max_msg_size)
    return [XpubMessage(b, e or NO_EXT) for b, e in zip(bodies, exts, strict=True)]


def parse_xpub_columns(
    body: bytes, *, max_msg_size: int, decoded: dict[bytes, MessageExt | None] | None = None
) -> tuple[list[bytes], list[MessageExt | None]]:
    """``parse_xpub_body`` as the daemon takes it: the bodies, and each one's extension as a
    message holds it (None for the empty block ``b"\x00"``), in two lists.

    No object per message beyond its body: identical blocks (an XPUB whose messages share
    their fields, the common case) are decoded once and share one ``MessageExt``, a block equal
    to the one before it is recognised by one comparison. A block holding a dedup id alone (a
    distinct one per message) is read in place. ``decoded``: blocks decoded before
    (``XpubBlockCache``), used and added to.
    """
    end = len(body)
    if end < 4:
        raise ExtError("no message count")
    count = _I32.unpack_from(body, 0)[0]
    # Each message takes at least 2 + 1 + 4 + 1 bytes.
    if count <= 0 or count > (end - 4) // 8:
        raise ExtError(f"invalid message count {count}")
    bodies: list[bytes] = []
    exts: list[MessageExt | None] = []
    add_body = bodies.append
    add_ext = exts.append
    if decoded is None:
        decoded = {}
    unpack_u16 = _U16.unpack_from
    unpack_i32 = _I32.unpack_from
    last = b""  # the previous message's length-prefixed block
    span = 0
    ext: MessageExt | None = None
    p = 4
    for i in range(count):
        if last and body[p : p + span] == last:
            p += span
            if p + 4 > end:
                raise ExtError(f"message {i}: truncated")
        else:
            if p + 2 > end:
                raise ExtError(f"message {i}: truncated")
            n = unpack_u16(body, p)[0]
            q = p + 2 + n
            if q + 4 > end:
                raise ExtError(f"message {i}: truncated")
            if n > 2 and body[p + 2] == DEDUP_ID and body[p + 3] == n - 2:
                # A dedup id alone: one block per message (``decode_ext``'s fast case), so
                # neither looked up nor kept, nor compared with the next one.
                ext = with_dedup_id(body[p + 4 : q], body[p + 2 : q])
                last = b""
            else:
                raw = body[p + 2 : q]
                if raw == _NO_EXT_BLOCK:
                    ext = None
                elif raw in decoded:
                    ext = decoded[raw]
                else:
                    try:
                        # Not the empty block (found above): never NO_EXT.
                        ext = decoded[raw] = decode_ext(raw)
                    except ExtError as exc:
                        raise ExtError(f"message {i}: {exc}") from None
                span = 2 + n
                last = body[p:q]
            p = q
        size = unpack_i32(body, p)[0]
        p += 4
        if size <= 0 or size > max_msg_size:
            raise ExtError(f"message {i}: invalid body size {size}")
        if p + size > end:
            raise ExtError(f"message {i}: truncated body")
        add_body(body[p : p + size])
        add_ext(ext)
        p += size
    if p != end:
        raise ExtError(f"{end - p} bytes after the last message")
    return bodies, exts


_NO_EXT_BLOCK = b"\x00"


class XpubBlockCache:
    """The extension blocks of a connection's last XPUB and their ``MessageExt``, for the next
    one to use (a producer usually sends the same fields command after command): a block seen
    there is not decoded again.

    Bounded: once a command is parsed the cache is emptied unless it holds at most
    ``MAX_BLOCKS`` blocks of at most ``MAX_BLOCK_BYTES`` each (an XPUB with a dedup id per
    message has one block per message: those are not kept), so between commands a connection
    holds at most 16 KiB of blocks; checking costs a loop over at most 16 keys per command.
    """

    MAX_BLOCKS = 16
    MAX_BLOCK_BYTES = 1024

    __slots__ = ("blocks",)

    def __init__(self) -> None:
        self.blocks: dict[bytes, MessageExt | None] = {}

    def parse(
        self, body: bytes, *, max_msg_size: int
    ) -> tuple[list[bytes], list[MessageExt | None]]:
        """``parse_xpub_columns`` with the blocks kept from the last XPUB."""
        blocks = self.blocks
        try:
            return parse_xpub_columns(body, max_msg_size=max_msg_size, decoded=blocks)
        finally:
            if len(blocks) > self.MAX_BLOCKS or any(
                len(raw) > self.MAX_BLOCK_BYTES for raw in blocks
            ):
                self.blocks = {}
