"""PushPins: a topic's pushed messages handed to its channels, pinned until durable there.

The pump pushes each deferred message (DPUB) and each message with an lmq priority into every
channel with a cursor (``stream.py``): the cursors step over them. A durable channel writes its
copy to one of its stores (deferred, or a priority lane's); until that copy is fsynced the stream
keeps ``#topic`` from passing the message (``TopicStream.pin``), so a crash before then pumps it
again for every channel (a duplicate for those that had it, never a loss). The round trip -- pin,
push, the syncer's callback, unpin and move ``#topic`` -- is all here.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Protocol

from lmqd.engine.backend import BackendError
from lmqd.engine.channel import Channel
from lmqd.engine.context import EngineContext
from lmqd.engine.stream import TopicStream
from lmqd.message import Message, copies

__all__ = ["PushPins", "TopicBasics"]


class TopicBasics(Protocol):
    """What every part of a topic reads of it (``topic.Topic``); each part's own ``Protocol``
    adds what else it needs (the parts import no topic: no import cycle)."""

    @property
    def ctx(self) -> EngineContext: ...

    @property
    def name(self) -> str: ...

    @property
    def exiting(self) -> bool: ...

    @property
    def stream(self) -> TopicStream: ...

log = logging.getLogger("lmqd.topic")


class PushPins:
    """One topic's pushes to its channels and the pins of the durable ones' copies."""

    __slots__ = ("_topic",)

    def __init__(self, topic: TopicBasics) -> None:
        self._topic = topic

    def push(self, channel: Channel, batch_pushed: list[Message], now: float) -> None:
        """Copies of a pump batch's pushed messages (with their offsets) to one channel; what
        it wrote to its stores (a durable channel's copies) is pinned until fsynced. Pinning
        after the push is pinning before any sync: no task runs in between."""
        topic = self._topic
        stream = topic.stream
        try:
            written = channel.push(copies(batch_pushed), now)
        except BackendError as exc:
            # The channel holds in memory what was not stored; pinned for good, so a restart
            # pumps them again for this channel.
            for m in batch_pushed:
                stream.pin(m.offset)
            log.error(
                "TOPIC(%s): channel(%s) cannot store %d pushed messages (held in memory "
                "until a restart pumps them again) - %s",
                topic.name,
                channel.name,
                len(batch_pushed),
                exc,
            )
            topic.ctx.events.set_health(str(exc))
            return
        syncer = topic.ctx.syncer
        if syncer is None:
            return  # nothing is ever synced: nothing to wait for
        for store, offsets in written:
            for offset in offsets:
                stream.pin(offset)  # #topic must not pass it before this channel's copy is safe
            syncer.when_durable(store, partial(self._unpin, offsets), urgent=False)

    def _unpin(self, offsets: list[int], error: OSError | None) -> None:
        # Syncer callback: a channel's pushed copies are durable (or their sync failed: the
        # pin stays, so a restart pumps them again for every channel). ``#topic`` moves now,
        # so the next tick persists it even if nothing else happens (a crash after that does
        # not push them again).
        topic = self._topic
        if error is None and not topic.exiting:
            stream = topic.stream
            for offset in offsets:
                stream.unpin(offset)
            stream.move_topic_cursor()
