"""Topic: the published stream, stored once, read by every channel; one messagePump task.

Publishing (``publish`` / ``put_many``) gives each message the topic's next offset and hands
it to the topic's ``TopicStream`` (``stream.py``): memory up to ``--mem-queue-size``, past that
the topic's log, once whatever the number of channels (``--durable``: the log at once, and the
publisher's ``OK`` waits for its fsync, see ``lmqd.engine.syncer``). All or none, so a publisher
whose messages could not be stored gets an error and still has them. A publish only wakes the
pump (one ``trio.Event.set``).

The pump hands the stream to the channels in batches (nsqd's messagePump): it moves the
stream's ``pumped`` offset, below which the channels read through their cursors
(``cursor.py``), pushes the batch's deferred messages (DPUB) into every channel's deferred
queue, puts copies into the channels that have no cursor (ephemeral ones, and every channel of an
ephemeral topic, which has no log), and asks each channel to deliver once per batch. A topic
that is paused or has no channels does not pump: it keeps its backlog, and the first channel
created reads it (nsqd).

A durable channel keeps its copy of a deferred message in its deferred store; until that copy is
fsynced the stream keeps ``#topic`` from passing the message (``TopicStream.pin``), so a crash
before then pumps it again.

``run`` owns a nursery holding the pump and every channel's timer task; channels created later
are started into it, and each channel cancels its own task when deleted.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING

import trio

from lmqd.engine.backend import BackendError, BackendQueue, DummyBackend, storage_damage
from lmqd.engine.channel import Channel, TopicExiting
from lmqd.engine.cursor import ChannelCursor
from lmqd.engine.e2e import E2eLatencyStream
from lmqd.engine.policy import TopicPolicy
from lmqd.engine.stream import TOPIC_CURSOR, TopicStream
from lmqd.message import GuidFactory, Message
from lmqd.names import is_ephemeral
from lmqd.options import Options
from lmqd.stats import NO_E2E_LATENCY, E2eLatency, TopicStats
from lmqd.storage import ChannelMetadata, TopicLog, TopicMetadata

if TYPE_CHECKING:
    from lmqd.engine.syncer import Syncer

__all__ = ["Topic", "TopicExiting"]

log = logging.getLogger("lmqd.topic")

# Messages handed on per pump iteration. Large enough that the per-batch costs (a checkpoint, one
# delivery round per channel) vanish per message; small enough that one busy topic yields to the
# network tasks often (a batch of 2048 takes roughly a millisecond).
PUMP_BATCH = 2048


class Topic:
    """One topic: its stream, its channels and the pump between them."""

    def __init__(
        self,
        name: str,
        options: Options,
        *,
        log: TopicLog | None = None,
        channel_backend_factory: Callable[[str, str], BackendQueue],
        on_deleted_ephemeral: Callable[[Topic], None] | None = None,
        guid: GuidFactory | None = None,
        rng: random.Random | None = None,
        syncer: Syncer | None = None,
        on_change: Callable[[], None] | None = None,
        on_health: Callable[[str | None], None] | None = None,
        deferred_store_factory: Callable[[str, str, bool], BackendQueue | None] | None = None,
        on_channel_created: Callable[[str, str], None] | None = None,
        on_channel_deleted: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.name = name
        self.options = options
        self.ephemeral = is_ephemeral(name)
        self._paused = False
        self._metadata: TopicMetadata | None = None
        """The metadata file's entry for this topic, until something in it changes."""
        self.exiting = False
        self.channels: dict[str, Channel] = {}
        self.message_count = 0
        self.message_bytes = 0
        self._channel_backend_factory = channel_backend_factory
        self._on_deleted_ephemeral = on_deleted_ephemeral
        self._guid = guid if guid is not None else GuidFactory(options.node_id)
        self._rng = rng
        self._syncer = syncer
        self._deferred_store_factory = deferred_store_factory
        self._on_change = on_change
        self._on_health = on_health
        self._on_channel_created = on_channel_created
        self._on_channel_deleted = on_channel_deleted
        """Told ``(topic, channel)`` when a channel is created or deleted on its own (not when
        the whole topic is deleted): the broker passes it on to its observers."""
        self.stream = TopicStream(
            name,
            log=log,
            limit=options.mem_queue_size,
            write_through=options.durable,
            drop_overflow=self.ephemeral,
            clock=clock,
        )
        """The topic's messages by offset: memory tail and log."""
        self.durable = options.durable and log is not None
        """``--durable``: every publish is in the log, and its ``OK`` waits for the fsync."""
        self.policy_settings: dict[str, int] = {}
        """The topic's own policy keys (``policy.py``), persisted with the metadata."""
        self.policy = TopicPolicy.effective(options, {})
        """The effective policy: the daemon's defaults, then ``policy_settings``."""
        self._apply_policy()
        if syncer is not None and log is not None:
            syncer.register(self.stream)
        self._wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._run_scope = trio.CancelScope()

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    @property
    def log(self) -> TopicLog | None:
        """The topic's log (None: ephemeral, nothing on disk)."""
        return self.stream.log

    @property
    def depth(self) -> int:
        """Messages not yet handed to the channels: memory + log."""
        return self.stream.depth

    @property
    def backend_depth(self) -> int:
        """Of ``depth``, the messages in the log."""
        return self.stream.backend_depth

    @property
    def dropped_count(self) -> int:
        """Messages an ephemeral topic dropped because its memory was full."""
        return self.stream.dropped_count

    @property
    def durable_queue(self) -> TopicStream | None:
        """What a durable publisher waits for the fsync of (None: not durable)."""
        return self.stream if self.durable else None

    # -- publishing --------------------------------------------------------------------------

    def publish(self, bodies: Sequence[bytes], now: float, defer: float = 0.0) -> list[Message]:
        """Make messages of ``bodies`` (new ids, one wall-clock timestamp) and store them at
        the next offsets.

        ``defer`` > 0 (seconds, DPUB) sets ``deliver_at = now + defer``. Raises
        ``TopicExiting``, or ``BackendError`` having stored none of them.
        """
        if self.exiting:
            raise TopicExiting(f"topic {self.name} is exiting")
        ids = self._guid.new_ids(len(bodies))
        ts = time.time_ns()
        deliver_at = now + defer if defer > 0 else 0.0
        # map() calls the constructor without a Python-level loop: ~25% less per message. The
        # offsets are not set on the objects (~20% more per message): the stream knows them,
        # and the copies channels read from the log carry theirs.
        messages = list(map(Message, ids, bodies, repeat(ts), repeat(0), repeat(deliver_at)))
        self._put(messages, sum(map(len, bodies)), deliver_at > 0)
        return messages

    def put_many(self, messages: Sequence[Message]) -> None:
        """Store already-built messages (at the next offsets). All or none: raises
        ``TopicExiting``, or ``BackendError`` having stored none of them."""
        if self.exiting:
            raise TopicExiting(f"topic {self.name} is exiting")
        self._put(messages, sum(len(m.body) for m in messages), any(m.deliver_at for m in messages))

    @property
    def wrote_backend(self) -> bool:
        """Whether the last publish wrote to the log (a success there clears bad health)."""
        return self.stream.wrote_backend

    def _put(self, messages: Sequence[Message], nbytes: int, deferred: bool) -> None:
        stream = self.stream
        first = stream.next_offset
        stream.append(messages)  # raises BackendError having stored none
        if deferred:
            kept = stream.next_offset - first  # an ephemeral topic may have dropped the rest
            stream.note_deferred(
                [first + k for k, m in enumerate(messages[:kept]) if m.deliver_at]
            )
        self.message_count += len(messages)
        self.message_bytes += nbytes
        if stream.wrote_backend and self._syncer is not None:
            self._syncer.note_dirty(stream)
        self._wakeup.set()

    # -- the pump ----------------------------------------------------------------------------

    def _pump_ready(self) -> bool:
        return (
            not self.paused
            and self.stream.depth > 0
            and any(not c.exiting for c in self.channels.values())
        )

    async def _pump(self) -> None:
        while True:
            if not self._pump_ready():
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            self._pump_batch(trio.current_time())
            # One checkpoint per batch: lets the connections run between batches.
            await trio.lowlevel.checkpoint()

    def _pump_batch(self, now: float) -> None:
        """Hand the next batch of the stream to the channels (see the module docstring)."""
        stream = self.stream
        channels = [c for c in self.channels.values() if not c.exiting]
        start, end, deferred_at = stream.take_pump_batch(PUMP_BATCH)
        readers = [c for c in channels if c.cursor is not None]
        pushed = [c for c in channels if c.cursor is None]
        for channel in readers:
            channel.message_count += end - start
        if deferred_at and readers:
            deferred = stream.messages_at(deferred_at)
            for channel in readers:
                self._push_deferred(channel, deferred, now)
        if pushed:
            batch = stream.read_range(start, end)
            if not readers and stream.log is None:
                # The tail forgets them below: the first channel may keep the objects.
                for channel in pushed[1:]:
                    channel.put_many([m.copy() for m in batch], now)
                pushed[0].put_many(batch, now)
            else:
                for channel in pushed:
                    channel.put_many([m.copy() for m in batch], now)
        for channel in channels:
            channel.deliver(now)
        stream.trim()

    def _push_deferred(self, channel: Channel, deferred: list[Message], now: float) -> None:
        """Copies of the batch's deferred messages (with their offsets) to one channel."""
        copies = [m.copy() for m in deferred]
        if not channel.durable:
            channel.push_deferred(copies, now)
            return
        stream = self.stream
        offsets = [m.offset for m in deferred]
        for offset in offsets:
            stream.pin(offset)  # #topic must not pass them before this channel's copy is safe
        try:
            channel.push_deferred(copies, now)
        except BackendError as exc:
            # Kept in memory; the pin stays, so a restart pumps them again for this channel.
            log.error(
                "TOPIC(%s): channel(%s) cannot store %d deferred messages (held in memory "
                "until a restart pumps them again) - %s",
                self.name,
                channel.name,
                len(copies),
                exc,
            )
            if self._on_health is not None:
                self._on_health(str(exc))
            for m in copies:
                m.offset = -1
            channel.hold_deferred(copies)
            return
        store = channel.deferred_store
        if self._syncer is None or store is None:
            for offset in offsets:
                stream.unpin(offset)
            return
        self._syncer.when_durable(store, partial(self._unpin, offsets), urgent=False)

    def _unpin(self, offsets: list[int], error: OSError | None) -> None:
        # Syncer callback: a channel's deferred copies are durable (or their sync failed: the
        # pin stays, so a restart pumps them again for every channel).
        if error is None and not self.exiting:
            for offset in offsets:
                self.stream.unpin(offset)

    # -- channels ----------------------------------------------------------------------------

    def get_channel(self, name: str, start_at: int | None = None) -> Channel:
        """The channel called ``name``, created (and its timer started) if absent.

        A new channel reads what the topic hands on from now on (nsqd), or, with ``start_at``,
        from that offset on (a replay; clamped to what is stored). Raises ``TopicExiting`` if
        the topic is being deleted or closed.
        """
        channel = self.channels.get(name)
        if channel is not None:
            return channel
        if self.exiting:
            raise TopicExiting(f"topic {self.name} is exiting")
        ephemeral = is_ephemeral(name)
        backend = DummyBackend() if ephemeral else self._channel_backend_factory(self.name, name)
        durable = self.durable and not ephemeral
        cursor = (
            None
            if ephemeral or self.ephemeral
            else ChannelCursor(self.stream, name, durable=durable, at=start_at)
        )
        channel = Channel(
            self.name,
            name,
            self.options,
            backend=backend,
            on_last_client_removed=self._on_last_client_removed,
            rng=self._rng,
            syncer=self._syncer,
            on_health=self._on_health,
            deferred_store=(
                None
                if self._deferred_store_factory is None
                else partial(self._deferred_store_factory, self.name, name)
            ),
            cursor=cursor,
            durable=durable,
            on_paused_changed=self._metadata_changed,
        )
        self.channels[name] = channel
        self._metadata = None
        log.info("TOPIC(%s): new channel(%s)", self.name, name)
        if not channel.ephemeral and self._on_change is not None:
            self._on_change()
        if self._nursery is not None:
            self._nursery.start_soon(channel.run)
        self._wakeup.set()  # the first channel takes the backlog
        if self._on_channel_created is not None:
            self._on_channel_created(self.name, name)
        return channel

    def channel_or_none(self, name: str) -> Channel | None:
        return self.channels.get(name)

    def stored_channel_names(self) -> list[str]:
        """Channels the topic's log keeps a cursor for (restored with the topic)."""
        log_ = self.stream.log
        if log_ is None:
            return []
        return sorted(name for name in log_.cursors if name != TOPIC_CURSOR)

    def delete_channel(self, name: str) -> None:
        """Delete a channel and its stored messages (``KeyError`` if absent). An ephemeral
        topic left without channels deletes itself and tells ``on_deleted_ephemeral``."""
        channel = self.channels.pop(name)
        self._metadata = None
        channel.delete()
        log.info("TOPIC(%s): deleted channel(%s)", self.name, name)
        if not channel.ephemeral and self._on_change is not None:
            self._on_change()
        if self._on_channel_deleted is not None:
            self._on_channel_deleted(self.name, name)
        if self.ephemeral and not self.channels and not self.exiting:
            self.delete()
            if self._on_deleted_ephemeral is not None:
                self._on_deleted_ephemeral(self)

    def _on_last_client_removed(self, channel: Channel) -> None:
        # An ephemeral channel's last client left (nsqd deletes the channel then).
        if self.channels.get(channel.name) is channel:
            self.delete_channel(channel.name)

    # -- policy ------------------------------------------------------------------------------

    def set_policy(self, changes: Mapping[str, int]) -> TopicPolicy:
        """Set policy keys (validated by ``policy.parse_update``); returns the effective policy.

        Raises ``BackendError`` if turning retention on had to write the memory tail to the log
        and that failed (the policy is set all the same; the tail is written at the next
        publish or at shutdown).
        """
        self.policy_settings.update(changes)
        self._metadata = None
        self.policy = TopicPolicy.effective(self.options, self.policy_settings)
        if self._on_change is not None and not self.ephemeral:
            self._on_change()
        self._apply_policy()
        return self.policy

    def _apply_policy(self) -> None:
        log_ = self.stream.log
        if log_ is None:
            return
        policy = self.policy
        log_.retention_ms = policy.retention_ms or None
        log_.retention_bytes = policy.retention_bytes or None
        self.stream.set_write_through(policy.retains or self.options.durable)

    # -- admin -------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        """Whether the pump is stopped (persisted in the metadata file)."""
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._paused = value
        self._metadata = None

    def _metadata_changed(self) -> None:
        self._metadata = None

    def metadata_entry(self) -> TopicMetadata:
        """This topic's entry in the metadata file: the same object while nothing in it
        changed (name, paused flags, durable channels, policy), so writing the file for 10,000
        topics does not rebuild and re-encode 10,000 entries (``storage.MetadataEncoder``)."""
        entry = self._metadata
        if entry is None:
            entry = self._metadata = TopicMetadata(
                self.name,
                self._paused,
                tuple(
                    ChannelMetadata(c.name, c.paused)
                    for c in self.channels.values()
                    if not c.ephemeral
                ),
                tuple(sorted(self.policy_settings.items())),
            )
        return entry

    def pause(self) -> None:
        """Stop the pump: messages accumulate at the topic."""
        self.paused = True
        if self._on_change is not None:
            self._on_change()

    def unpause(self) -> None:
        """Restart the pump."""
        self.paused = False
        self._wakeup.set()
        if self._on_change is not None:
            self._on_change()

    def empty(self) -> None:
        """Drop the messages not yet handed to the channels (channels keep theirs, as nsqd)."""
        self.stream.reset_unpumped()

    def close(self) -> None:
        """Shut down: close every channel (each writes its in-flight, requeued and deferred
        messages to its stores), then the stream (the memory tail to the log, every cursor
        where its channel is, the log synced and closed); ends ``run``. Idempotent."""
        if self.exiting:
            return
        self.exiting = True
        self._run_scope.cancel()
        closed_ok = [channel.close() for channel in self.channels.values()]
        if all(closed_ok):
            # Every channel synced its stores: the deferred copies the pump made are durable.
            self.stream.clear_pins()
        self.stream.close()
        log.info("TOPIC(%s): closed", self.name)

    def delete(self) -> None:
        """Delete the topic, its channels and all their messages; ends ``run``. Idempotent."""
        if self.exiting:
            return
        self.exiting = True
        self._run_scope.cancel()
        channels = list(self.channels.values())
        self.channels.clear()
        for channel in channels:
            channel.delete()
        self.stream.delete()
        log.info("TOPIC(%s): deleted", self.name)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the pump and every channel's timer until ``close`` or ``delete``. Call once."""
        try:
            with self._run_scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    for channel in self.channels.values():
                        nursery.start_soon(channel.run)
                    nursery.start_soon(self._pump)
                    task_status.started()
        finally:
            self._nursery = None

    # -- statistics --------------------------------------------------------------------------

    def e2e_latency(self) -> E2eLatency:
        """The channels' E2E latency streams merged (nsqd's topic percentiles)."""
        if not self.options.e2e_processing_latency_percentiles:
            return NO_E2E_LATENCY
        return E2eLatencyStream.combined(
            (c.e2e_stream for c in self.channels.values()), trio.current_time()
        )

    def statistics(self, *, include_clients: bool = True) -> TopicStats:
        """A frozen snapshot for /stats, channels sorted by name."""
        return TopicStats(
            topic_name=self.name,
            channels=tuple(
                self.channels[n].statistics(include_clients=include_clients)
                for n in sorted(self.channels)
            ),
            depth=self.depth,
            backend_depth=self.backend_depth,
            message_count=self.message_count,
            message_bytes=self.message_bytes,
            paused=self.paused,
            e2e_processing_latency=self.e2e_latency(),
            storage_damage=storage_damage([self.log.damage] if self.log is not None else []),
        )
