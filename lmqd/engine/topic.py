"""Topic: the published stream, stored once, read by every channel; one messagePump task.

A topic's parts, each in a room of its own: its ``TopicStream`` (``stream.py``: the messages by
offset, memory tail then log), its ``PublishPath`` (``publish.py``: ids, publish policies, dedup,
overflow), its channels (``channel.py``, each reading the stream through its own cursor,
``cursor.py``), and the pushes of deferred and prioritised messages to them (``pins.py``). What
stays here: the channels' registry, the pump between the stream and the channels, the topic's
policy, admin (pause, empty, close, delete) and statistics.

The pump hands the stream to the channels in batches (nsqd's messagePump): it moves the
stream's ``pumped`` offset, below which the channels read through their cursors, pushes the
batch's deferred messages (DPUB) into every channel's deferred queue and those with an lmq
priority into every channel's priority lanes (``lanes.py``), puts copies into the channels that
have no cursor (ephemeral ones, and every channel of an ephemeral topic, which has no log), and
asks each channel to deliver once per batch. A topic that is paused or has no channels does not
pump: it keeps its backlog, and the first channel created reads it (nsqd). lmq's internal channels
(``internal.py``) read the stream ahead of the pump and do not count as channels here, so the
backlog waits for the users' first channel.

**Tasks only while there is work.** ``attach(nursery)`` (the broker's, with the service's
nursery) is where the pump and the channels' timer tasks run, and none of them runs while idle:
the pump starts when there is something to hand on (a publish, a first channel, an unpause) and
ends after ``PUMP_IDLE_S`` without a batch; a channel's task starts at its first deadline or
delivery request and ends when nothing is in flight, deferred or asked for and nothing was
delivered for ``TASK_IDLE_S`` (``Channel._serve``). Tens of thousands of topics created and never
used then cost no task each (a task is tens of objects the cyclic collector traverses). Closing
or deleting a topic ends its tasks. ``run`` is for tests and tools: a nursery of the topic's own,
until it is closed or deleted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import trio

from lmqd.engine.admission import PublishCounters, PublishGate
from lmqd.engine.backend import storage_damage
from lmqd.engine.channel import Channel
from lmqd.engine.context import EngineContext
from lmqd.engine.cursor import ChannelCursor, DurableCursor
from lmqd.engine.e2e import E2eLatencyStream, empty_latency
from lmqd.engine.errors import TopicExiting
from lmqd.engine.internal import reads_ahead
from lmqd.engine.pins import PushPins
from lmqd.engine.policy import PolicyValue, TopicPolicy, shared_default
from lmqd.engine.publish import PublishOutcome, PublishPath
from lmqd.engine.salvage import Salvage
from lmqd.engine.stream import TopicStream
from lmqd.message import Message, copies
from lmqd.message_ext import MessageExt
from lmqd.names import is_ephemeral
from lmqd.stats import NO_E2E_LATENCY, E2eLatency, TopicStats
from lmqd.storage import ChannelMetadata, TopicLog, TopicMetadata
from lmqd.storage.atrest.compression import Compression

__all__ = ["PUMP_BATCH", "PUMP_IDLE_S", "Topic"]

log = logging.getLogger("lmqd.topic")

# Messages handed on per pump iteration. Large enough that the per-batch costs (a checkpoint, one
# delivery round per channel) vanish per message; small enough that one busy topic yields to the
# network tasks often (a batch of 2048 takes roughly a millisecond).
PUMP_BATCH = 2048

PUMP_IDLE_S = 10.0
"""A pump with nothing to hand on for this long ends its task (the next publish starts it
again: one task start, tens of microseconds). Long enough that a topic published to at any
steady rate keeps its task (a publish finds it waiting: one ``Event.set``); short enough that
topics gone quiet stop holding a task's ~40 objects for the cyclic collector to traverse."""


class Topic:
    """One topic: its stream, its channels and the pump between them."""

    # Slots: no per-instance dict (~1 KB and a GC-tracked object less per topic).
    __slots__ = (
        "_metadata", "_nursery", "_paused", "_pump_active_at", "_pump_running", "_pump_scope",
        "_run_scope", "_wakeup", "ahead", "channels", "ctx", "durable", "ephemeral", "exiting",
        "following", "message_bytes", "message_count", "name", "options", "pins", "policy",
        "policy_settings", "publishing", "stream",
    )  # fmt: skip

    def __init__(self, ctx: EngineContext, name: str, *, log: TopicLog | None = None) -> None:
        """Topic ``name`` of the engine ``ctx``, its messages in ``log`` past memory (None:
        ephemeral, nothing on disk; ``ctx.stores.topic_log`` says which)."""
        self.ctx = ctx
        self.name = name
        options = self.options = ctx.options
        self.ephemeral = is_ephemeral(name)
        self._paused = False
        self._metadata: TopicMetadata | None = None
        """The metadata file's entry for this topic, until something in it changes."""
        self.exiting = False
        self.following = False
        """A mirror's copy of a primary's topic (``replica.py``): it does not pump; its
        ``pumped`` offset and its channels' positions are the primary's."""
        self.channels: dict[str, Channel] = {}
        self.ahead: list[Channel] = []
        """Internal channels: they read the stream ahead of the pump (``internal.py``)."""
        self.message_count = 0
        self.message_bytes = 0
        self.stream = TopicStream(
            name,
            log=log,
            limit=options.mem_queue_limit,
            write_through=options.durable,
            drop_overflow=self.ephemeral,
            clock=ctx.clock,
        )
        """The topic's messages by offset: memory tail and log."""
        self.durable = options.durable and log is not None
        """``--durable``: every publish is in the log, and its ``OK`` waits for the fsync."""
        self.policy_settings: dict[str, PolicyValue] = {}
        """The topic's own policy keys (``policy.py``), persisted with the metadata."""
        self.policy = shared_default(
            TopicPolicy, options, lambda: TopicPolicy.effective(options, {})
        )
        """The effective policy: the daemon's defaults, then ``policy_settings``."""
        self.publishing = PublishPath(self)
        self.pins = PushPins(self)
        self._apply_policy()
        if ctx.syncer is not None and log is not None:
            ctx.syncer.register(self.stream)
        self._wakeup: trio.Event | None = None
        """What the pump waits on while it waits (None: it is busy, or has no task)."""
        self._nursery: trio.Nursery | None = None
        """Where the pump and the channels' tasks run while they have work (``attach``)."""
        self._pump_running = False
        self._pump_scope: trio.CancelScope | None = None
        self._pump_active_at = -math.inf
        """When the pump last handed a batch on (or was started): it ends ``PUMP_IDLE_S``
        later if nothing came since."""
        self._run_scope: trio.CancelScope | None = None

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

    @property
    def wrote_backend(self) -> bool:
        """Whether the last publish wrote to the log (a success there clears bad health)."""
        return self.stream.wrote_backend

    # -- publishing (publish.py) -------------------------------------------------------------

    @property
    def gate(self) -> PublishGate | None:
        """The publish policies (``admission.py``); None when none is on: nsqd's path."""
        return self.publishing.gate

    @property
    def publish_counters(self) -> PublishCounters:
        """What the publish policies did."""
        return self.publishing.counters

    @property
    def message_ttls(self) -> bool:
        """Whether a message with its own ``ttl_ms`` was published (or found in the log)."""
        return self.publishing.message_ttls

    def publish(
        self,
        bodies: Sequence[bytes],
        now: float,
        defer: float = 0.0,
        exts: Sequence[MessageExt | None] | None = None,
        *,
        keep: bool = True,
    ) -> list[Message]:
        """Make messages of ``bodies`` (new ids, one wall-clock timestamp) and store them at
        the next offsets; ``exts``: each one's lmq extension (``Message.ext``), if any.
        Returns the messages made, unless ``keep`` is false (a publisher's path, which has no
        use for them: a backlog's messages are then written without making them).

        ``defer`` > 0 (seconds, DPUB) sets ``deliver_at = now + defer``. Raises
        ``TopicExiting``, or ``BackendError`` having stored none of them; with publish
        policies (``gate``), ``PublishRefused`` having stored none of them, and duplicates
        are left out of the result.
        """
        return self.publishing.publish(bodies, now, defer, exts, keep=keep)

    def publish_run(
        self,
        bodies: Sequence[bytes],
        sizes: Sequence[int],
        now: float,
        defer: float = 0.0,
        exts: Sequence[MessageExt | None] | None = None,
        *,
        keep: bool = True,
    ) -> PublishOutcome:
        """Publish a run of commands (``sizes``: how many of ``bodies`` each has, in order)
        through the publish policies: dedup, then ``max_depth`` (see ``admission.py``). The
        rate was the caller's (``gate.reserve``). ``exts``: each body's lmq extension, if any;
        ``keep``: as ``publish``'s. Raises ``TopicExiting`` or ``BackendError`` having stored
        nothing and remembered nothing."""
        return self.publishing.publish_run(bodies, sizes, now, defer, exts, keep=keep)

    def put_many(self, messages: Sequence[Message]) -> None:
        """Store already-built messages (at the next offsets). All or none: raises
        ``TopicExiting``, or ``BackendError`` having stored none of them."""
        self.publishing.put_many(messages)

    def backlog(self) -> int:
        """The deepest backlog of a channel plus the topic's own; what ``max_depth`` bounds."""
        return self.publishing.backlog()

    def recover_dedup(self, now: float) -> None:
        """Rebuild the dedup windows from the messages an earlier run left in the log: call
        once, at start-up, after the topic's policy is restored (its ``dedup_window_ms`` is
        the windows' length). Blocking (reads the log for the body window).

        A stored message's age (wall clock now minus its timestamp) becomes the time it was
        accepted in this run's terms (``now`` minus the age), so each entry expires when it
        would have in an uninterrupted run. Dedup ids come from what the log noted while it
        recovered (``TopicLog.take_recovered_ids``: no read); bodies (``dedup_window_ms``)
        are read from the first message of the window (the log's time index), at most the
        window's ``max_entries`` newest. What the log holds depends on the mode: see
        docs/durability.md."""
        self.publishing.recover_dedup(now)

    # -- the pump ----------------------------------------------------------------------------

    def _pump_ready(self) -> bool:
        return (
            not self.paused
            and not self.following
            and self.stream.depth > 0
            and any(not c.exiting and _pumped_to(c) for c in self.channels.values())
        )

    def wake_pump(self) -> None:
        """Something the pump may act on changed: wake it, or start its task."""
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()
        elif not self._pump_running:
            self._start_pump()

    def _start_pump(self) -> None:
        nursery = self._nursery
        if nursery is not None and not self.exiting and self._pump_ready():
            self._pump_running = True
            nursery.start_soon(self._pump, name=f"pump {self.name}")

    async def _pump(self) -> None:
        """The messagePump task: started when there is something to pump (``_start_pump``),
        it waits for more while it is busy and ends after ``PUMP_IDLE_S`` without a batch,
        so an idle topic holds no task; ends at once when the topic is closed or deleted."""
        clock = self.ctx.clock
        self._pump_active_at = clock()
        try:
            while not self.exiting:
                with trio.CancelScope(deadline=self._pump_active_at + PUMP_IDLE_S) as scope:
                    self._pump_scope = scope
                    await self._pump_batches()
                if self._pump_ready():
                    self._pump_active_at = clock()
                elif clock() >= self._pump_active_at + PUMP_IDLE_S:
                    return
        finally:
            self._pump_scope = None
            self._wakeup = None
            self._pump_running = False

    async def _pump_batches(self) -> None:
        clock = self.ctx.clock
        while True:
            if not self._pump_ready():
                self._wakeup = wakeup = trio.Event()
                await wakeup.wait()
                continue
            now = clock()
            self._pump_batch(now)
            self._pump_active_at = now
            # One checkpoint per batch: lets the connections run between batches.
            await trio.lowlevel.checkpoint()

    def _pump_batch(self, now: float) -> None:
        """Hand the next batch of the stream to the channels (see the module docstring)."""
        stream = self.stream
        channels = [c for c in self.channels.values() if not c.exiting and _pumped_to(c)]
        start, end, pushed_at = stream.take_pump_batch(PUMP_BATCH)
        readers = [c for c in channels if c.cursor is not None]
        fed = [c for c in channels if c.cursor is None]
        stream.feeds = len(fed)
        for channel in readers:
            channel.message_count += end - start
        if pushed_at and readers:
            batch_pushed = stream.messages_at(pushed_at)
            for channel in readers:
                self.pins.push(channel, batch_pushed, now)
        if fed:
            batch = stream.read_range(start, end)
            if not readers and stream.log is None:
                # The tail forgets them below: the first channel may keep the objects.
                for channel in fed[1:]:
                    channel.put_many(copies(batch), now)
                fed[0].put_many(batch, now)
            else:
                for channel in fed:
                    channel.put_many(copies(batch), now)
        for channel in channels:
            channel.deliver(now)
        stream.trim()

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
        durable = self.durable and not ephemeral
        cursor = (
            None
            if ephemeral or self.ephemeral
            else (DurableCursor if durable else ChannelCursor)(
                self.stream, name, at=start_at, ahead=reads_ahead(name)
            )
        )
        channel = Channel(self.ctx, self.name, name, owner=self, cursor=cursor, durable=durable)
        channel.retry.set_ttl(self.policy.ttl_ms)
        if self.message_ttls:
            channel.retry.note_message_ttls()
        self.channels[name] = channel
        if cursor is not None and cursor.ahead:
            self.ahead.append(channel)
        self._metadata = None
        log.info("TOPIC(%s): new channel(%s)", self.name, name)
        events = self.ctx.events
        if not channel.ephemeral:
            events.metadata_changed()
        channel.attach(self._nursery)
        self.wake_pump()  # the first channel takes the backlog
        events.channel_created(self.name, name)
        return channel

    def channel_or_none(self, name: str) -> Channel | None:
        return self.channels.get(name)

    def stored_channel_names(self) -> list[str]:
        """Channels the topic's log keeps a cursor for (restored with the topic)."""
        log_ = self.stream.log
        if log_ is None:
            return []
        # ``#`` starts no channel name: ``#topic``, and mirrors' holds (``holds.py``).
        return sorted(name for name in log_.cursors if not name.startswith("#"))

    def delete_channel(self, name: str) -> None:
        """Delete a channel and its stored messages (``KeyError`` if absent). An ephemeral
        topic left without channels deletes itself and tells the engine's events."""
        channel = self.channels.pop(name)
        if channel in self.ahead:
            self.ahead.remove(channel)
        self._metadata = None
        channel.delete()
        log.info("TOPIC(%s): deleted channel(%s)", self.name, name)
        events = self.ctx.events
        if not channel.ephemeral:
            events.metadata_changed()
        events.channel_deleted(self.name, name)
        if self.ephemeral and not self.channels and not self.exiting:
            self.delete()
            events.ephemeral_topic_emptied(self)

    # What the channels tell their topic (``channel.ChannelOwner``).

    def entry_changed(self) -> None:
        """A channel's paused flag or policy changed: the metadata entry is made again."""
        self._metadata = None

    def channel_unused(self, channel: Channel) -> None:
        """An ephemeral channel's last client left (nsqd deletes the channel then)."""
        if self.channels.get(channel.name) is channel:
            self.delete_channel(channel.name)

    # -- policy ------------------------------------------------------------------------------

    def set_policy(self, changes: Mapping[str, PolicyValue]) -> TopicPolicy:
        """Set policy keys (validated by ``policy.parse_update``); returns the effective policy.

        Raises ``BackendError`` if turning retention on had to write the memory tail to the log
        and that failed (the policy is set all the same; the tail is written at the next
        publish or at shutdown).
        """
        self.policy_settings.update(changes)
        self._metadata = None
        self.policy = TopicPolicy.effective(self.options, self.policy_settings)
        if not self.ephemeral:
            self.ctx.events.metadata_changed()
        self._apply_policy()
        return self.policy

    def _apply_policy(self) -> None:
        policy = self.policy
        for channel in self.channels.values():
            channel.retry.set_ttl(policy.ttl_ms)
        self.publishing.apply_policy(policy)
        log_ = self.stream.log
        if log_ is None:
            return
        log_.retention_ms = policy.retention_ms or None
        log_.retention_bytes = policy.retention_bytes or None
        compression = Compression.parse(policy.compression)
        if log_.compression != compression:
            log_.compression = compression
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

    def metadata_entry(self) -> TopicMetadata:
        """This topic's entry in the metadata file: the same object while nothing in it
        changed (name, paused flags, durable channels, topic and channel policies), so writing
        the file for 10,000 topics does not rebuild and re-encode 10,000 entries
        (``storage.MetadataEncoder``)."""
        entry = self._metadata
        if entry is None:
            entry = self._metadata = TopicMetadata(
                self.name,
                self._paused,
                tuple(
                    ChannelMetadata(c.name, c.paused, tuple(sorted(c.policy_settings.items())))
                    for c in self.channels.values()
                    if not c.ephemeral
                ),
                tuple(sorted(self.policy_settings.items())),
            )
        return entry

    def pause(self) -> None:
        """Stop the pump: messages accumulate at the topic."""
        self.paused = True
        self.ctx.events.metadata_changed()

    def unpause(self) -> None:
        """Restart the pump."""
        self.paused = False
        self.wake_pump()
        self.ctx.events.metadata_changed()

    def empty(self) -> None:
        """Drop the messages not yet handed to the channels (channels keep theirs, as nsqd)."""
        self.stream.reset_unpumped()

    def close(self, salvage: Salvage | None = None) -> None:
        """Shut down: close every channel (each writes its in-flight, requeued and deferred
        messages to its stores), then the stream (the memory tail to the log, every cursor
        where its channel is, the log synced and closed); ends ``run``. Idempotent.

        ``salvage`` writes what a full disk takes and counts what it does not (``salvage.py``).
        """
        if self.exiting:
            return
        self.exiting = True
        self._stop_tasks()
        if salvage is None:
            salvage = Salvage()
        closed_ok = [channel.close(salvage) for channel in self.channels.values()]
        if all(closed_ok):
            # Every channel synced its stores: the deferred copies the pump made are durable.
            self.stream.clear_pins()
        self.stream.close(salvage)
        log.info("TOPIC(%s): closed", self.name)

    def delete(self) -> None:
        """Delete the topic, its channels and all their messages; ends ``run``. Idempotent."""
        if self.exiting:
            return
        self.exiting = True
        self._stop_tasks()
        channels = list(self.channels.values())
        self.channels.clear()
        self.ahead.clear()
        for channel in channels:
            channel.delete()
        self.stream.delete()
        log.info("TOPIC(%s): deleted", self.name)

    def _stop_tasks(self) -> None:
        # Closed or deleted (``exiting`` is set): the pump ends, as does ``run``; the channels
        # end their own tasks as they are closed or deleted.
        for scope in (self._pump_scope, self._run_scope):
            if scope is not None:
                scope.cancel()

    def attach(self, nursery: trio.Nursery | None) -> None:
        """Run the pump and the channels' tasks in ``nursery``, each only while it has work
        (an idle topic or channel holds no task); None: no tasks any more (the service is
        stopping). The broker attaches every topic to the service's nursery."""
        self._nursery = nursery
        for channel in self.channels.values():
            channel.attach(nursery)
        if nursery is not None:
            self.wake_pump()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Attach the topic to a nursery of its own and return once it is closed or deleted
        (tests and tools; the daemon attaches its topics to its own nursery). Call once."""
        scope = self._run_scope = trio.CancelScope()
        if self.exiting:
            scope.cancel()
        try:
            async with trio.open_nursery() as nursery:
                self.attach(nursery)
                task_status.started()
                with scope:
                    await trio.sleep_forever()
        finally:
            self._run_scope = None
            self.attach(None)

    # -- statistics --------------------------------------------------------------------------

    def e2e_latency(self, now: float) -> E2eLatency:
        """The channels' E2E latency streams merged (nsqd's topic percentiles)."""
        if not self.options.e2e_processing_latency_percentiles:
            return NO_E2E_LATENCY
        streams = [c.e2e_stream for c in self.channels.values() if c.e2e_stream is not None]
        if not streams:
            return empty_latency(self.options)  # no FIN yet on any channel
        return E2eLatencyStream.combined(streams, now)

    def statistics(self, now: float, *, include_clients: bool = True) -> TopicStats:
        """A frozen snapshot for /stats, channels sorted by name."""
        publishing = self.publishing
        return TopicStats(
            topic_name=self.name,
            channels=tuple(
                self.channels[n].statistics(now, include_clients=include_clients)
                for n in sorted(self.channels)
            ),
            depth=self.depth,
            backend_depth=self.backend_depth,
            message_count=self.message_count,
            message_bytes=self.message_bytes,
            paused=self.paused,
            e2e_processing_latency=self.e2e_latency(now),
            publish_policy=(
                publishing.counters.snapshot()
                if publishing.gate is not None or publishing.counters.any
                else None
            ),
            storage_damage=storage_damage([self.log.damage] if self.log is not None else []),
            stored_bytes=self.log.bytes_on_disk if self.log is not None else 0,
            logical_bytes=self.log.logical_bytes if self.log is not None else 0,
            reader_lost_count=self.stream.reader_lost_count,
        )


def _pumped_to(channel: Channel) -> bool:
    """Whether the pump hands messages on to ``channel`` (not to an internal one, which reads
    ahead of it: ``internal.py``)."""
    cursor = channel.cursor
    return cursor is None or not cursor.ahead
