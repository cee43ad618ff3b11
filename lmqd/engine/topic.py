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
queue and those with an lmq priority into every channel's priority lanes (``lanes.py``), puts
copies into the channels that have no cursor (ephemeral ones, and every channel of an
ephemeral topic, which has no log), and asks each channel to deliver once per batch. A topic
that is paused or has no channels does not pump: it keeps its backlog, and the first channel
created reads it (nsqd).

A durable channel keeps its copy of a pushed message in its deferred store or a lane's store;
until that copy is fsynced the stream keeps ``#topic`` from passing the message
(``TopicStream.pin``), so a crash before then pumps it again.

**Across a restart** (lmq's extension, docs/durability.md): the dedup windows (dedup ids, and
the bodies of a ``dedup_window_ms``) are rebuilt from what the log holds of them
(``recover_dedup``, at start-up; the log keeps the segments they need, ``_keep_for_dedup``), and
a log whose messages carry their own TTL makes every channel screen for it from the start
(``message_ttls``; a channel's own stores tell it the same, ``Channel``).

**Tasks only while there is work.** ``attach(nursery)`` (the broker's, with the service's
nursery) is where the pump and the channels' timer tasks run, and none of them runs while idle:
the pump starts when there is something to hand on (a publish, a first channel, an unpause) and
ends after ``PUMP_IDLE_S`` without a batch; a channel's task starts at its first deadline or
delivery request and ends when nothing is in flight, deferred or asked for and nothing was
delivered for ``TASK_IDLE_S`` (``Channel._serve``).
Tens of thousands of topics created and never used then cost no task each (a task is tens of
objects the cyclic collector traverses). Closing or deleting a topic ends its tasks. ``run`` is
for tests and tools: a nursery of the topic's own, until it is closed or deleted.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING

import attrs
import trio

from lmqd.engine.admission import PublishCounters, PublishGate, PublishRefused
from lmqd.engine.backend import BackendError, BackendQueue, DummyBackend, storage_damage
from lmqd.engine.channel import Channel, DeadLetterSink, TopicExiting
from lmqd.engine.cursor import ChannelCursor, pushed
from lmqd.engine.dedup import DedupWindow, body_digest
from lmqd.engine.e2e import E2eLatencyStream
from lmqd.engine.policy import PolicyValue, TopicPolicy, shared_default
from lmqd.engine.salvage import Salvage
from lmqd.engine.stream import TOPIC_CURSOR, TopicStream
from lmqd.message import GuidFactory, Message, copies
from lmqd.message_ext import MessageExt
from lmqd.names import is_ephemeral
from lmqd.options import Options
from lmqd.stats import NO_E2E_LATENCY, E2eLatency, TopicStats
from lmqd.storage import ChannelMetadata, TopicLog, TopicMetadata

if TYPE_CHECKING:
    from lmqd.engine.syncer import Syncer

__all__ = ["PublishOutcome", "Topic", "TopicExiting"]

log = logging.getLogger("lmqd.topic")

RECOVER_CHUNK = 1024
"""Messages ``recover_dedup`` reads from the log per step (a few read-aheads of the log's
reader): the decoded messages of one step are all it holds at a time besides the digests."""

# Messages handed on per pump iteration. Large enough that the per-batch costs (a checkpoint, one
# delivery round per channel) vanish per message; small enough that one busy topic yields to the
# network tasks often (a batch of 2048 takes roughly a millisecond).
PUMP_BATCH = 2048

PUMP_IDLE_S = 10.0
"""A pump with nothing to hand on for this long ends its task (the next publish starts it
again: one task start, tens of microseconds). Long enough that a topic published to at any
steady rate keeps its task (a publish finds it waiting: one ``Event.set``); short enough that
topics gone quiet stop holding a task's ~40 objects for the cyclic collector to traverse."""


DEDUP_ID_WINDOW_S = 300.0
"""How long a topic without a ``dedup_window_ms`` remembers a dedup id: five minutes, SQS FIFO's
deduplication interval (at most ``DEDUP_MAX_ENTRIES`` ids, oldest forgotten first)."""

_ID_NAMESPACE = b"\x00dedup_id:"
"""Dedup ids are remembered in a namespace of their own: an id never matches a body's digest."""


@attrs.frozen
class PublishOutcome:
    """What ``Topic.publish_run`` did with a run of publish commands."""

    messages: list[Message]
    """The messages stored (duplicates the dedup window left out are not among them)."""
    accepted: int
    """Commands accepted (answered OK), a prefix of the run."""
    refusal: PublishRefused | None = None
    """Why command ``accepted`` was refused (None: the whole run was accepted)."""


class Topic:
    """One topic: its stream, its channels and the pump between them."""

    # Slots: no per-instance dict (~1 KB and a GC-tracked object less per topic).
    __slots__ = (
        "_channel_backend_factory", "_clock", "_dead_letter", "_deferred_store_factory", "_guid",
        "_id_window", "_lane_backend_factory", "_metadata", "_nursery", "_on_change",
        "_on_channel_created", "_on_channel_deleted", "_on_deleted_ephemeral", "_on_health",
        "_paused", "_pump_active_at", "_pump_running", "_pump_scope", "_rng", "_run_scope",
        "_stored_lanes", "_syncer", "_wakeup", "_wall_clock", "channels", "durable", "ephemeral",
        "exiting", "gate", "message_bytes", "message_count", "message_ttls", "name", "options",
        "policy", "policy_settings", "publish_counters", "stream",
    )

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
        wall_clock: Callable[[], int] | None = None,
        dead_letter: DeadLetterSink | None = None,
        lane_backend_factory: Callable[[str, str, int], BackendQueue] | None = None,
        stored_lanes: Callable[[str, str], list[int]] | None = None,
    ) -> None:
        self.name = name
        self._lane_backend_factory = lane_backend_factory
        """A channel's priority lane's store (topic, channel, level)."""
        self._stored_lanes = stored_lanes
        """The levels whose lane stores a channel has on disk (topic, channel)."""
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
        self._wall_clock = wall_clock if wall_clock is not None else time.time_ns
        """Publish timestamps and the channels' TTL checks (ns since the epoch; tests make it
        follow the virtual clock)."""
        self._dead_letter = dead_letter
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
        self._clock = clock
        self.policy_settings: dict[str, PolicyValue] = {}
        """The topic's own policy keys (``policy.py``), persisted with the metadata."""
        self.message_ttls = log is not None and log.stored_message_ttls
        """A message with its own ``ttl_ms`` (lmq's extension) was published in this run, or
        the log held one when it opened: every channel screens for it
        (``Channel.note_message_ttls``)."""
        self.policy = shared_default(
            TopicPolicy, options, lambda: TopicPolicy.effective(options, {})
        )
        """The effective policy: the daemon's defaults, then ``policy_settings``."""
        self.publish_counters = PublishCounters()
        self._id_window: DedupWindow | None = None
        """The dedup ids (lmq's extension) accepted recently; made by the first one."""
        """What the publish policies did (kept when the policy changes)."""
        self.gate: PublishGate | None = None
        """The publish policies (``admission.py``); None when none is on: nsqd's path."""
        self._apply_policy()
        if syncer is not None and log is not None:
            syncer.register(self.stream)
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

    # -- publishing --------------------------------------------------------------------------

    def publish(
        self,
        bodies: Sequence[bytes],
        now: float,
        defer: float = 0.0,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> list[Message]:
        """Make messages of ``bodies`` (new ids, one wall-clock timestamp) and store them at
        the next offsets; ``exts``: each one's lmq extension (``Message.ext``), if any.

        ``defer`` > 0 (seconds, DPUB) sets ``deliver_at = now + defer``. Raises
        ``TopicExiting``, or ``BackendError`` having stored none of them; with publish
        policies (``gate``), ``PublishRefused`` having stored none of them, and duplicates
        are left out of the result.
        """
        if self.gate is not None:
            outcome = self.publish_run(bodies, [len(bodies)], now, defer, exts)
            if outcome.refusal is not None:
                raise outcome.refusal
            return outcome.messages
        digests: list[bytes] = []
        if exts is not None:
            bodies, exts, digests = self._unseen_ids(bodies, exts, now)
            if not bodies:
                return []
        messages = self._publish(bodies, now, defer, exts)
        if digests:
            self._remember_ids(digests, now)
        return messages

    def _unseen_ids(
        self, bodies: Sequence[bytes], exts: Sequence[MessageExt | None], now: float
    ) -> tuple[Sequence[bytes], Sequence[MessageExt | None], list[bytes]]:
        """lmq's dedup ids: the messages whose ``dedup_id`` the topic accepted within its dedup
        window (``dedup_window_ms``, else ``DEDUP_ID_WINDOW_S``), or that repeat one earlier in
        the same publish, are left out and counted (``deduplicated``); returns the rest and the
        digests to remember once they are stored (``_remember_ids``)."""
        if not any(e is not None and e.dedup_id for e in _distinct(exts)):
            return bodies, exts, []
        window = self._ids_window()
        window.expire(now)
        keys = [_ID_NAMESPACE + e.dedup_id if e is not None and e.dedup_id else b"" for e in exts]
        with_ids = list(filter(None, keys))
        new, digests = window.unseen(with_ids, set())
        if len(new) == len(with_ids):
            return bodies, exts, digests  # nothing repeated: the common case
        self.publish_counters.deduplicated += len(with_ids) - len(new)
        first = set(new)  # each kept once: at its first occurrence
        kept_bodies: list[bytes] = []
        kept_exts: list[MessageExt | None] = []
        for body, ext, key in zip(bodies, exts, keys, strict=True):
            if key:
                if key not in first:
                    continue
                first.discard(key)
            kept_bodies.append(body)
            kept_exts.append(ext)
        return kept_bodies, kept_exts, digests

    def _remember_ids(self, digests: list[bytes], now: float) -> None:
        if self._id_window is not None:
            self._id_window.remember(digests, now)

    def _ids_window(self) -> DedupWindow:
        """The dedup-id window, made (and kept on disk: ``_keep_for_dedup``) by the first id,
        its length the policy's ``dedup_window_ms``, else ``DEDUP_ID_WINDOW_S``."""
        ms = self.policy.dedup_window_ms
        length = ms / 1000 if ms else DEDUP_ID_WINDOW_S
        window = self._id_window
        if window is None:
            window = self._id_window = DedupWindow(length)
            self._keep_for_dedup()
        window.window = length
        return window

    def _keep_for_dedup(self) -> None:
        """Keep the log's segments for as long as the dedup windows look back (the dedup-id
        window once the topic has one, the body window of ``dedup_window_ms``), so that a
        restart rebuilds them from the log (``recover_dedup``) even after every channel has
        passed those segments."""
        log_ = self.stream.log
        if log_ is None:
            return
        keep = self.policy.dedup_window_ms
        if self._id_window is not None:
            keep = max(keep, int(self._id_window.window * 1000))
        log_.keep_recent_ms = keep or None

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
        log_ = self.stream.log
        if log_ is None:
            return
        started = time.perf_counter()
        wall = self._wall_clock()
        ids = log_.take_recovered_ids()
        id_count = self._recover_ids(ids, now, wall) if ids else 0
        body_count = 0
        gate = self.gate
        if gate is not None and gate.dedup is not None and log_.next_offset:
            body_count = self._recover_bodies(gate.dedup, now, wall)
        if id_count or body_count:
            log.info(
                "TOPIC(%s): dedup windows rebuilt from the log: %d id(s), %d body digest(s) "
                "in %.3fs",
                self.name,
                id_count,
                body_count,
                time.perf_counter() - started,
            )

    def _recover_ids(self, ids: list[tuple[int, bytes]], now: float, wall: int) -> int:
        window = self._ids_window()
        cutoff = wall - int(window.window * 1e9)
        return window.restore(
            (now - max(wall - ts, 0) / 1e9, body_digest(_ID_NAMESPACE + dedup_id))
            for ts, dedup_id in ids
            if ts > cutoff
        )

    def _recover_bodies(self, window: DedupWindow, now: float, wall: int) -> int:
        log_ = self.stream.log
        assert log_ is not None
        end = self.stream.known_from
        start = max(log_.offset_for_time(wall - int(window.window * 1e9)), end - window.max_entries)
        if start >= end:
            return 0
        reader = log_.open_reader(start)
        entries: list[tuple[float, bytes]] = []
        try:
            while got := reader.read_many(RECOVER_CHUNK, end):
                entries += (
                    (now - max(wall - m.timestamp, 0) / 1e9, body_digest(m.body)) for _, m in got
                )
        finally:
            reader.close()
        return window.restore(entries)

    def _publish(
        self,
        bodies: Sequence[bytes],
        now: float,
        defer: float,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> list[Message]:
        if self.exiting:
            raise TopicExiting(f"topic {self.name} is exiting")
        ids = self._guid.new_ids(len(bodies))
        ts = self._wall_clock()
        deliver_at = now + defer if defer > 0 else 0.0
        # map() calls the constructor without a Python-level loop: ~25% less per message. The
        # offsets are not set on the objects (~20% more per message): the stream knows them,
        # and the copies channels read from the log carry theirs.
        if exts is None:
            messages = list(map(Message, ids, bodies, repeat(ts), repeat(0), repeat(deliver_at)))
            ranked = False
        else:
            if len(exts) != len(bodies):
                raise ValueError("one extension per body")
            # The same with each one's extension (the fields after deliver_at: their defaults).
            messages = list(
                map(Message, ids, bodies, repeat(ts), repeat(0), repeat(deliver_at), repeat(0),
                    repeat(0.0), repeat(0.0), repeat(-1), exts)
            )  # fmt: skip
            distinct = _distinct(exts)
            if not self.message_ttls and any(e is not None and e.ttl_ms for e in distinct):
                self.message_ttls = True
                for channel in self.channels.values():
                    channel.note_message_ttls()
            ranked = any(e is not None and e.priority for e in distinct)
        self._put(messages, sum(map(len, bodies)), deliver_at > 0 or ranked)
        return messages

    def publish_run(
        self,
        bodies: Sequence[bytes],
        sizes: Sequence[int],
        now: float,
        defer: float = 0.0,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> PublishOutcome:
        """Publish a run of commands (``sizes``: how many of ``bodies`` each has, in order)
        through the publish policies: dedup, then ``max_depth`` (see ``admission.py``). The
        rate was the caller's (``gate.reserve``). ``exts``: each body's lmq extension, if any.
        Raises ``TopicExiting`` or ``BackendError`` having stored nothing and remembered
        nothing."""
        gate = self.gate
        if gate is None:
            return PublishOutcome(self.publish(bodies, now, defer, exts), len(sizes))
        id_digests: list[bytes] = []
        if exts is not None and len(sizes) == 1:  # an XPUB: alone in its run (the session)
            bodies, exts, id_digests = self._unseen_ids(bodies, exts, now)
            if not bodies:
                return PublishOutcome([], 1)
            sizes = [len(bodies)]
        if self.exiting:
            raise TopicExiting(f"topic {self.name} is exiting")
        window = gate.dedup
        pending: set[bytes] = set()
        if window is not None:
            window.expire(now)
        reject = gate.max_depth > 0 and not gate.drop_oldest
        room = gate.max_depth - self.backlog() if reject else 0
        kept: list[bytes] = []
        kept_exts: list[MessageExt | None] = []
        digests: list[bytes] = []
        accepted = 0
        refusal: PublishRefused | None = None
        offered = 0
        start = 0
        for size in sizes:
            command = bodies[start : start + size]
            if window is not None:
                new, new_digests = window.unseen(command, pending)
            else:
                new, new_digests = list(command), []
            if reject and new and len(kept) + len(new) > room:
                refusal = gate.refuse_full(size)
                log.debug("TOPIC(%s): refused %d messages: %s", self.name, size, refusal)
                break
            if exts is not None:
                kept_exts += _kept_exts(command, exts[start : start + size], new)
            start += size
            kept += new
            digests += new_digests
            offered += size
            accepted += 1
        messages = (
            self._publish(kept, now, defer, kept_exts if exts is not None else None) if kept else []
        )
        if window is not None:
            window.remember(digests, now)
            gate.counters.deduplicated += offered - len(kept)
        if gate.drop_oldest and gate.max_depth > 0 and messages:
            gate.counters.overflow_dropped += self._drop_oldest(gate.max_depth, now)
        if id_digests and accepted:
            self._remember_ids(id_digests, now)
        return PublishOutcome(messages, accepted, refusal)

    def backlog(self) -> int:
        """The deepest backlog of a channel: its waiting messages plus the topic's not yet
        handed on (the topic's alone without channels); what ``max_depth`` bounds."""
        deepest = 0
        for channel in self.channels.values():
            if not channel.exiting:
                depth = channel.depth
                if depth > deepest:
                    deepest = depth
        return self.stream.depth + deepest

    def _drop_oldest(self, limit: int, now: float) -> int:
        """Drop the oldest waiting messages of every backlog over ``limit`` (the topic's not
        yet handed on first, which every channel would get); how many (see
        ``PublishCounters.overflow_dropped``)."""
        stream = self.stream
        dropped = 0
        over = stream.depth - limit
        if over > 0:
            dropped += stream.drop_unpumped(over)
        pending = stream.depth
        for channel in self.channels.values():
            if channel.exiting:
                continue
            over = channel.depth + pending - limit
            if over > 0:
                dropped += channel.drop_oldest(over, now)
        return dropped

    def put_many(self, messages: Sequence[Message]) -> None:
        """Store already-built messages (at the next offsets). All or none: raises
        ``TopicExiting``, or ``BackendError`` having stored none of them."""
        if self.exiting:
            raise TopicExiting(f"topic {self.name} is exiting")
        self._put(messages, sum(len(m.body) for m in messages), any(map(pushed, messages)))

    @property
    def wrote_backend(self) -> bool:
        """Whether the last publish wrote to the log (a success there clears bad health)."""
        return self.stream.wrote_backend

    def _put(self, messages: Sequence[Message], nbytes: int, some_pushed: bool) -> None:
        stream = self.stream
        first = stream.next_offset
        stream.append(messages, nbytes)  # raises BackendError having stored none
        if some_pushed:
            kept = stream.next_offset - first  # an ephemeral topic may have dropped the rest
            stream.note_pushed([first + k for k, m in enumerate(messages[:kept]) if pushed(m)])
        self.message_count += len(messages)
        self.message_bytes += nbytes
        if stream.wrote_backend and self._syncer is not None:
            self._syncer.note_dirty(stream)
        self._wake_pump()

    # -- the pump ----------------------------------------------------------------------------

    def _pump_ready(self) -> bool:
        return (
            not self.paused
            and self.stream.depth > 0
            and any(not c.exiting for c in self.channels.values())
        )

    def _wake_pump(self) -> None:
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
            self._pump_active_at = trio.current_time()
            nursery.start_soon(self._pump, name=f"pump {self.name}")

    async def _pump(self) -> None:
        """The messagePump task: started when there is something to pump (``_start_pump``),
        it waits for more while it is busy and ends after ``PUMP_IDLE_S`` without a batch,
        so an idle topic holds no task; ends at once when the topic is closed or deleted."""
        try:
            while not self.exiting:
                with trio.CancelScope(deadline=self._pump_active_at + PUMP_IDLE_S) as scope:
                    self._pump_scope = scope
                    await self._pump_batches()
                if self._pump_ready():
                    self._pump_active_at = trio.current_time()
                elif trio.current_time() >= self._pump_active_at + PUMP_IDLE_S:
                    return
        finally:
            self._pump_scope = None
            self._wakeup = None
            self._pump_running = False

    async def _pump_batches(self) -> None:
        while True:
            if not self._pump_ready():
                self._wakeup = wakeup = trio.Event()
                await wakeup.wait()
                continue
            now = trio.current_time()
            self._pump_batch(now)
            self._pump_active_at = now
            # One checkpoint per batch: lets the connections run between batches.
            await trio.lowlevel.checkpoint()

    def _pump_batch(self, now: float) -> None:
        """Hand the next batch of the stream to the channels (see the module docstring)."""
        stream = self.stream
        channels = [c for c in self.channels.values() if not c.exiting]
        start, end, pushed_at = stream.take_pump_batch(PUMP_BATCH)
        readers = [c for c in channels if c.cursor is not None]
        fed = [c for c in channels if c.cursor is None]
        for channel in readers:
            channel.message_count += end - start
        if pushed_at and readers:
            batch_pushed = stream.messages_at(pushed_at)
            for channel in readers:
                self._push(channel, batch_pushed, now)
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

    def _push(self, channel: Channel, batch_pushed: list[Message], now: float) -> None:
        """Copies of the batch's pushed messages (deferred, or with a priority; with their
        offsets) to one channel."""
        copied = copies(batch_pushed)
        if not channel.durable:
            channel.push(copied, now)
            return
        stream = self.stream
        for m in batch_pushed:
            stream.pin(m.offset)  # #topic must not pass it before this channel's copy is safe
        try:
            written = channel.push(copied, now)
        except BackendError as exc:
            # The channel holds in memory what was not stored; their pins stay, so a restart
            # pumps them again for this channel.
            log.error(
                "TOPIC(%s): channel(%s) cannot store %d pushed messages (held in memory "
                "until a restart pumps them again) - %s",
                self.name,
                channel.name,
                len(copied),
                exc,
            )
            if self._on_health is not None:
                self._on_health(str(exc))
            return
        for store, offsets in written:
            if self._syncer is None:
                for offset in offsets:
                    stream.unpin(offset)
            else:
                self._syncer.when_durable(store, partial(self._unpin, offsets), urgent=False)

    def _unpin(self, offsets: list[int], error: OSError | None) -> None:
        # Syncer callback: a channel's pushed copies are durable (or their sync failed: the
        # pin stays, so a restart pumps them again for every channel). ``#topic`` moves now,
        # so the next tick persists it even if nothing else happens (a crash after that does
        # not push them again).
        if error is None and not self.exiting:
            for offset in offsets:
                self.stream.unpin(offset)
            self.stream.move_topic_cursor()

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
            # Only an ephemeral channel asks (a bound method less per durable channel).
            on_last_client_removed=self._on_last_client_removed if ephemeral else None,
            rng=self._rng,
            syncer=self._syncer,
            on_health=self._on_health,
            deferred_store=self._deferred_store_factory,
            cursor=cursor,
            durable=durable,
            dead_letter=self._dead_letter,
            wall_clock=self._wall_clock,
            on_paused_changed=self._metadata_changed,
            lane_backend=self._lane_backend_factory,
            stored_lanes=(
                self._stored_lanes(self.name, name) if self._stored_lanes is not None else ()
            ),
        )
        channel.set_ttl(self.policy.ttl_ms)
        if self.message_ttls:
            channel.note_message_ttls()
        self.channels[name] = channel
        self._metadata = None
        log.info("TOPIC(%s): new channel(%s)", self.name, name)
        if not channel.ephemeral and self._on_change is not None:
            self._on_change()
        channel.attach(self._nursery)
        self._wake_pump()  # the first channel takes the backlog
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

    def set_policy(self, changes: Mapping[str, PolicyValue]) -> TopicPolicy:
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
        for channel in self.channels.values():
            channel.set_ttl(self.policy.ttl_ms)
        policy = self.policy
        if policy.gates_publishing:
            if self.gate is None:
                self.gate = PublishGate(self.name, self.publish_counters)
            self.gate.configure(policy, self._clock())
        else:
            self.gate = None
        if self._id_window is not None:
            self._ids_window()  # its length follows dedup_window_ms
        log_ = self.stream.log
        if log_ is None:
            return
        self._keep_for_dedup()
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
        if self._on_change is not None:
            self._on_change()

    def unpause(self) -> None:
        """Restart the pump."""
        self.paused = False
        self._wake_pump()
        if self._on_change is not None:
            self._on_change()

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
            self._wake_pump()

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
            publish_policy=(
                self.publish_counters.snapshot()
                if self.gate is not None or self.publish_counters.any
                else None
            ),
            storage_damage=storage_damage([self.log.damage] if self.log is not None else []),
            reader_lost_count=self.stream.reader_lost_count,
        )


def _distinct(exts: Sequence[MessageExt | None]) -> Iterable[MessageExt | None]:
    """The distinct extension objects of ``exts`` (a publish's messages often share one),
    found with C loops: no bytecode per message."""
    return dict(zip(map(id, exts), exts, strict=True)).values()


def _kept_exts(
    command: Sequence[bytes], exts: Sequence[MessageExt | None], kept: Sequence[bytes]
) -> list[MessageExt | None]:
    """The extensions of the bodies of ``command`` that dedup kept (``kept`` is a subsequence
    of ``command``, the same objects)."""
    out: list[MessageExt | None] = []
    k = 0
    for body, ext in zip(command, exts, strict=True):
        if k < len(kept) and kept[k] is body:
            out.append(ext)
            k += 1
    return out
