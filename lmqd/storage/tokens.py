"""Acknowledgement tokens: which stored message a ``StoredMessage`` is.

In acknowledgement mode a disk queue hands out ``StoredMessage`` objects, each with a ``token``:
one int holding the message's segment number, the offset of its record in the segment and its
index in the record::

    token = ((segment << 40) | offset) << 24 | index

An int, not a tuple, because the queue keeps every outstanding token in a set and a deque
(``acks.py``): ints hash and compare in C and cost no allocation. The tokens of one record's
messages are consecutive (``record_token(...) + k`` for message ``k``), so a reader hands out a
batch's tokens as one ``range``. Tokens also sort in the order the messages were written, which
is what makes the oldest outstanding token the position to persist.

Bit widths: 24 for the index (at least ``record.MAX_BATCH_COUNT``), 40 for the offset (a segment
of up to 1 TiB), the rest for the segment number.
"""

from __future__ import annotations

import attrs

from lmqd.message import Message

INDEX_BITS = 24
"""Bits for a message's index in its record: >= ``record.MAX_BATCH_COUNT``."""
OFFSET_BITS = 40
"""Bits for a record's offset in its segment file."""
_OFFSET_MASK = (1 << OFFSET_BITS) - 1
_INDEX_MASK = (1 << INDEX_BITS) - 1


@attrs.define(slots=True, eq=False, repr=False, weakref_slot=False)
class StoredMessage(Message):
    """A message read in acknowledgement mode: ``token`` is what ``DiskQueue.ack`` takes."""

    token: int = 0


def token_position(token: int) -> tuple[int, int]:
    """The (segment, offset) of the record holding the message a ``StoredMessage.token`` is for."""
    record = token >> INDEX_BITS
    return record >> OFFSET_BITS, record & _OFFSET_MASK


def token_index(token: int) -> int:
    """The index, inside its record, of the message a ``StoredMessage.token`` stands for."""
    return token & _INDEX_MASK


def record_token(segment: int, offset: int) -> int:
    """The token of message 0 of the record at (segment, offset); message k's is this + k."""
    return ((segment << OFFSET_BITS) | offset) << INDEX_BITS
