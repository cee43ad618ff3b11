"""A durable channel's acknowledgements (``--durable``): where the stored copy of each message
is, and when its progress may be recorded there.

In durable mode every message a channel has not FIN'd has a copy on disk that a crash would
bring back: in its topic's log, unsettled by the channel's cursor (``lmqd.engine.cursor``), or in
one of the channel's own disk queues: its **own store** ``topic:channel`` (requeued messages,
what shutdown wrote, a backlog from before topic logs), its **deferred store**
``topic:channel#deferred`` (REQ with a delay, DPUB) or a **priority lane**'s store
``topic:channel#p<level>`` (``lmqd.engine.lanes``; see ``lmqd.engine.stores``). A queue's
persisted read position never passes a message that was not acknowledged, and the cursor's
persisted low-water mark never passes one not settled, so after a crash every message not FIN'd
is delivered again (at-least-once). This unit keeps that bookkeeping out of the channel's
delivery logic:

* ``ack`` records finished (or sampled-out, or duplicate) messages where their copy is: a
  message whose copy is in the deferred store is remembered (``from_store``; ``alias`` for an
  in-flight message whose copy was written there to free the log), a message still holding the
  log (``offset >= 0``) is settled in the cursor, the others belong to the own store.
* ``ack_when_copied`` handles messages superseded by a copy in one of the stores (a requeue, a
  REQ with a delay, a long-held message): the originals are acknowledged only once the copy is
  fsynced, since acknowledging first could lose them to a power failure in between. After a
  failed sync they stay unacknowledged and are read again after a restart (a duplicate, never a
  loss).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from lmqd.engine.backend import StoredQueue, Syncable
from lmqd.engine.cursor import ChannelCursor
from lmqd.engine.syncer import Syncer
from lmqd.message import Message


class DurableAcks:
    """Acknowledgements of one durable channel's messages in its log cursor and stores."""

    __slots__ = (
        "_cursor", "_from_lane", "_from_store", "_main", "_store", "_superseded", "_syncer"
    )  # fmt: skip

    def __init__(
        self,
        main: Callable[[], StoredQueue | None],
        store: Callable[[], StoredQueue | None],
        syncer: Syncer | None,
        cursor: ChannelCursor | None = None,
    ) -> None:
        self._main = main
        """The own store if it is open on disk (None otherwise)."""
        self._store = store
        """The deferred store if it is open on disk (None otherwise)."""
        self._syncer = syncer
        self._cursor = cursor
        self._from_store: dict[int, Message] = {}
        """By ``id()`` of the message delivered: the deferred store's message to acknowledge."""
        self._superseded: dict[int, Message] = {}
        """Originals to acknowledge once their copy in a store is fsynced."""
        self._from_lane: dict[int, tuple[StoredQueue, Message]] = {}
        """By ``id()`` of the message delivered: the priority lane's store it was read from
        (``lanes.py``)."""

    def from_store(self, messages: Sequence[Message]) -> None:
        """``messages`` were read from the deferred store: acknowledge them there."""
        side = self._from_store
        for m in messages:
            side[id(m)] = m

    def from_lane(self, queue: StoredQueue, messages: Sequence[Message]) -> None:
        """``messages`` were read from a priority lane's store ``queue``: acknowledge them
        there."""
        side = self._from_lane
        for m in messages:
            side[id(m)] = (queue, m)

    def alias(self, message: Message, stored: Message) -> None:
        """``message`` (in flight) is acknowledged by acknowledging ``stored``, its copy read
        back from the deferred store."""
        self._from_store[id(message)] = stored

    def ack(self, messages: Sequence[Message]) -> None:
        """Acknowledge messages that are done (or superseded) where their copy is."""
        side = self._from_store
        lanes = self._from_lane
        main: list[Message] = []
        stored: list[Message] = []
        offsets: list[int] = []
        in_lanes: dict[int, tuple[StoredQueue, list[Message]]] = {}
        for m in messages:
            holder = side.pop(id(m), None) if side else None
            if holder is not None:
                stored.append(holder)
            elif lanes and (lane := lanes.pop(id(m), None)) is not None:
                in_lanes.setdefault(id(lane[0]), (lane[0], []))[1].append(lane[1])
            elif m.offset >= 0:
                offsets.append(m.offset)
            else:
                main.append(m)
        if offsets and self._cursor is not None:
            self._cursor.settle_many(offsets)
        if stored:
            store = self._store()
            if store is not None:
                self._ack_in(store, stored)
        if main:
            queue = self._main()
            if queue is not None:
                self._ack_in(queue, main)
        for lane_queue, held in in_lanes.values():
            self._ack_in(lane_queue, held)

    def _ack_in(self, queue: StoredQueue, messages: Sequence[Message]) -> None:
        if queue.ack_messages(messages) and self._syncer is not None:
            self._syncer.note_dirty(queue)

    def ack_when_copied(self, originals: Sequence[Message], queue: Syncable | None) -> None:
        """Acknowledge ``originals`` once their copies, written to ``queue`` (a store of the
        channel's, or another topic's log: a dead letter, a redrive), are fsynced."""
        if self._syncer is None or queue is None:
            self.ack(originals)
            return
        superseded = self._superseded
        for m in originals:
            superseded[id(m)] = m
        self._syncer.when_durable(
            queue, partial(self._copies_synced, list(originals)), urgent=False
        )

    def settle_when_copied(
        self, offsets: Sequence[int], queue: StoredQueue | None, *, urgent: bool = False
    ) -> None:
        """Settle ``offsets`` in the log once the copies written to ``queue`` are fsynced (the
        messages themselves are acknowledged through ``alias`` from now on); ``urgent``: in a
        sync round started now, not at the queue's next scheduled one."""
        cursor = self._cursor
        if cursor is None:
            return
        if self._syncer is None or queue is None:
            cursor.settle_many(offsets)
            return
        settle = cursor.settle_many
        listed = list(offsets)

        def synced(error: OSError | None) -> None:
            if error is None:
                settle(listed)

        self._syncer.when_durable(queue, synced, urgent=urgent)

    def _copies_synced(self, originals: list[Message], error: OSError | None) -> None:
        # Syncer callback for ack_when_copied.
        superseded = self._superseded
        done = [m for m in originals if superseded.pop(id(m), None) is not None]
        if done and error is None:
            self.ack(done)

    def ack_superseded(self) -> None:
        """Shutdown: acknowledge every original whose copy the final sync makes durable."""
        if self._superseded:
            self.ack(list(self._superseded.values()))
            self._superseded.clear()

    def clear(self) -> None:
        """The channel was emptied or deleted: nothing is left to acknowledge."""
        self._from_store.clear()
        self._from_lane.clear()
        self._superseded.clear()
