"""The write-through cache: records just written, kept as the message objects they came from.

While a queue's reader keeps up (it has read everything written before a ``put_many``), the
records that call writes are also kept here, each as (segment, offset, end, messages), up to
``WRITE_CACHE_BYTES`` of records. The reader (``reader.py``) takes a record from the front when
it is exactly the one at its read position, and hands its messages out through the same
pending-record path a decoded batch takes: same read positions, same partial reads, same close
and reopen. What is on disk does not change (every record is written and synced as before); only
the read-back is skipped: no ``pread``, no CRC check, no decoding, which is most of a spilled
message's cost (docs/storage.md, "Write-through cache"; docs/benchmarks.md).

States: the cache is *open* (records written now may join it) from the moment the reader has
caught up until a write does not fit; then the reader reads the files until it has caught up
again, and the cache reopens only once it is empty. It is dropped (emptied and closed) when the
reader finds it does not start at its read position, and when the queue is repaired, emptied,
deleted or closed. Acknowledgement mode never opens it (``enabled=False``): its messages carry
tokens of what is on disk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from lmqd.message import Message
from lmqd.storage.writer import Placed
from lmqd.units import MiB

WRITE_CACHE_BYTES = 1 * MiB
"""Bytes of records a queue whose reader keeps up keeps as message objects: ~7,000 messages of
100 bytes, enough for what a channel writes between two delivery rounds."""


class WriteCache:
    """Records written since the reader caught up, oldest first; see the module docstring."""

    __slots__ = ("bytes", "capacity", "enabled", "open", "records")

    def __init__(self, capacity: int = WRITE_CACHE_BYTES, *, enabled: bool = True) -> None:
        self.capacity = capacity
        """Bytes of records the cache may stand for."""
        self.enabled = enabled
        self.open = False
        """Whether records written now may join the cache (it is contiguous with the reader)."""
        self.records: deque[tuple[int, int, int, list[Message]]] = deque()
        """(segment, offset, end, messages) of the records cached, the reader's next first.
        Never replaced (only cleared): the reader holds it."""
        self.bytes = 0
        """Bytes on disk of the records cached."""

    def reader_caught_up(self) -> None:
        """The reader has read everything written: open the cache if it is empty."""
        self.open = self.enabled and not self.records

    def remember(self, messages: Sequence[Message], placed: list[Placed]) -> None:
        """Cache the records just written (``put_many``), or close the cache if they don't fit."""
        size = sum(sum(stored) for *_, stored in placed)
        if self.bytes + size > self.capacity:
            self.open = False  # the reader is behind: it reads the files from here on
            return
        records = self.records
        listed = messages if isinstance(messages, list) else list(messages)  # a deque can't slice
        for number, pos, batches, stored in placed:
            for (first, end, _), record_size in zip(batches, stored, strict=True):
                rec_end = pos + record_size
                records.append((number, pos, rec_end, listed[first:end]))
                pos = rec_end
        self.bytes += size

    def drop(self) -> None:
        """Empty and close the cache."""
        self.records.clear()
        self.bytes = 0
        self.open = False
