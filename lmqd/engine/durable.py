"""A durable channel's acknowledgements (``--durable``): which stored copy a message's progress
is recorded in, and when it may be.

In durable mode every message of a channel is in one of two disk queues until FIN: the channel's
main queue, or its deferred store (REQ with a delay, DPUB; see ``lmqd.engine.stores``). A queue's
persisted read position never passes a message that was not acknowledged, so after a crash every
message not FIN'd is delivered again (at-least-once). This unit keeps that bookkeeping out of the
channel's delivery logic:

* ``ack`` acknowledges finished (or sampled-out, or duplicate) messages in the queue that holds
  them: messages read back from the deferred store are remembered (``from_store``), all others
  belong to the main queue.
* ``ack_when_copied`` handles a message superseded by a copy in the deferred store (a REQ with a
  delay): the original is acknowledged only once the copy is fsynced, since acknowledging first
  could lose it to a power failure in between. After a failed sync the original stays
  unacknowledged and is read again after a restart (a duplicate, never a loss).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from lmqd.engine.backend import StoredQueue
from lmqd.engine.syncer import Syncer
from lmqd.message import Message


class DurableAcks:
    """Acknowledgements of one durable channel's messages in its main queue and deferred store."""

    __slots__ = ("_from_store", "_main", "_store", "_superseded", "_syncer")

    def __init__(
        self,
        main: StoredQueue,
        store: Callable[[], StoredQueue | None],
        syncer: Syncer | None,
    ) -> None:
        self._main = main
        self._store = store
        """The deferred store if it is open on disk (None otherwise)."""
        self._syncer = syncer
        self._from_store: dict[int, Message] = {}
        """Messages whose stored copy is in the deferred store, by ``id()``."""
        self._superseded: dict[int, Message] = {}
        """Originals to acknowledge once their deferred-store copy is fsynced."""

    def from_store(self, messages: Sequence[Message]) -> None:
        """``messages`` were read from the deferred store: acknowledge them there."""
        side = self._from_store
        for m in messages:
            side[id(m)] = m

    def ack(self, messages: Sequence[Message]) -> None:
        """Acknowledge messages that are done (or superseded) in the queue of their copy."""
        side = self._from_store
        if side:
            main: list[Message] = []
            other: list[Message] = []
            for m in messages:
                (other if side.pop(id(m), None) is not None else main).append(m)
            store = self._store()
            if other and store is not None:
                self._ack_in(store, other)
        else:
            main = list(messages)
        if main:
            self._ack_in(self._main, main)

    def _ack_in(self, queue: StoredQueue, messages: Sequence[Message]) -> None:
        if queue.ack_messages(messages) and self._syncer is not None:
            self._syncer.note_dirty(queue)

    def ack_when_copied(self, original: Message) -> None:
        """Acknowledge ``original`` once its copy in the deferred store is fsynced."""
        store = self._store()
        if self._syncer is None or store is None:
            self.ack((original,))
            return
        self._superseded[id(original)] = original
        self._syncer.when_durable(store, partial(self._copy_synced, original), urgent=False)

    def _copy_synced(self, original: Message, error: OSError | None) -> None:
        # Syncer callback for ack_when_copied.
        if self._superseded.pop(id(original), None) is not None and error is None:
            self.ack((original,))

    def ack_superseded(self) -> None:
        """Shutdown: acknowledge every original whose copy the final sync makes durable."""
        if self._superseded:
            self.ack(list(self._superseded.values()))
            self._superseded.clear()

    def clear(self) -> None:
        """The channel was emptied or deleted: nothing is left to acknowledge."""
        self._from_store.clear()
        self._superseded.clear()
