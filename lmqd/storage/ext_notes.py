"""ExtensionNotes: what start-up recovery learns of the stored messages' lmq extensions.

Recovery reads every record of a topic log or a disk queue anyway (``recovery.py`` verifies
each one, ``scan.py`` hands each valid record to a visitor). ``ExtensionNotes.visit`` is such a
visitor: for the rare record that holds option blocks (lmq's extension: ``record.py``
``FLAG_HEADERS``) it reads each message's block (``decoder.extension_blocks``, then
``message_ext.ttl_and_dedup_id``: the first fields only) and notes

* ``message_ttls``: some stored message has its own ``ttl_ms``. The engine screens a topic's or
  channel's messages for their own TTL only once it knows that some may have one (a cost per
  message it does not pay otherwise), so a restart must tell it about the messages an earlier
  run stored.
* ``dedup_ids``: the newest ``keep_ids`` dedup ids, with their messages' timestamps, in offset
  order: the topic rebuilds its dedup-id window from them (``lmqd.engine.topic``), so a
  publisher retrying across a restart is not enqueued twice.

Cost: a record without option blocks costs the call and two byte reads (a batch holds up to
256 KiB of messages, so nothing per message); a record with them, the C unpack of its entries
and a walk of its option blocks (~1 us a message). Nothing is read that recovery did not read.
Memory: at most ``keep_ids`` ids (the engine's ``DEDUP_MAX_ENTRIES``, what a topic's window
holds at most, ~150 bytes each), handed over once and dropped (``TopicLog.take_recovered_ids``).
"""

from __future__ import annotations

from collections import deque

from lmqd.message_ext import ttl_and_dedup_id
from lmqd.storage.decoder import extension_blocks
from lmqd.storage.record import BATCH_FLAG_OPTIONS, FLAG_HEADERS, TYPE_MESSAGE, FormatError

__all__ = ["ExtensionNotes"]


class ExtensionNotes:
    """A recovery visitor (``scan.RecordVisitor``) noting TTLs and dedup ids; see above."""

    __slots__ = ("dedup_ids", "message_ttls")

    def __init__(self, keep_ids: int = 0) -> None:
        self.message_ttls = False
        """Some message seen has its own ``ttl_ms``."""
        self.dedup_ids: deque[tuple[int, bytes]] = deque(maxlen=keep_ids)
        """The newest ``keep_ids`` (timestamp ns, dedup id) seen, oldest first."""

    def visit(self, view: memoryview, pos: int, end: int, count: int, at: int = 0) -> None:
        """Note the extension blocks of the valid record at ``view[pos:end]`` (``at``: its
        file offset, unused; ``scan.RecordVisitor``)."""
        flags = view[pos + 5]
        if not flags & (FLAG_HEADERS if view[pos + 4] == TYPE_MESSAGE else BATCH_FLAG_OPTIONS):
            return
        try:
            blocks = extension_blocks(view, pos, end)
        except FormatError:
            return  # the reader's decoder drops such a block too
        keep = self.dedup_ids.maxlen
        for timestamp, block in blocks:
            ttl_ms, dedup_id = ttl_and_dedup_id(block)
            if ttl_ms:
                self.message_ttls = True
            if dedup_id and keep:
                self.dedup_ids.append((timestamp, dedup_id))
