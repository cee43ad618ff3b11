"""Topic: the published stream, copied to every channel by one messagePump task.

Publishing (``publish`` / ``put_many``) appends to the topic's ``SpillQueue`` (memory up to
``--mem-queue-size``, the overflow in its backend queue; all or none, so a publisher whose
messages could not be stored gets an error and still has them). A publish
only wakes the pump (one ``trio.Event.set``); the pump then moves everything waiting in batches:
the first channel gets the original ``Message`` objects, every other channel ``msg.copy()`` (same
id, timestamp and body object), and each channel delivers once per batch. A topic that is paused
or has no channels keeps its backlog; the first channel created gets it (nsqd).

``run`` owns a nursery holding the pump and every channel's timer task; channels created later
are started into it, and each channel cancels its own task when deleted.

Durable topics (``--durable``: the backend is a disk queue in acknowledgement mode)
------------------------------------------------------------------------------------------
Every publish goes to the queue (no memory queue: the publisher's ``OK`` waits for the fsync of
exactly these records, see ``lmqd.engine.syncer``). The pump reads stored messages and writes a
copy to every channel's own queue; the topic acknowledges a batch only once every durable channel's
copy has been fsynced (``Syncer.when_durable``, on the channels' normal sync schedule), so the
topic's persisted read position never passes a message that exists nowhere else on disk. A
channel whose write or sync failed gets the batch again later (``_redo``, retried every
``RETRY_DELAY``); the others are not written twice.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING

import trio

from lmqd.engine.backend import BackendError, BackendQueue, DummyBackend, StoredQueue
from lmqd.engine.channel import Channel, TopicExiting
from lmqd.engine.e2e import E2eLatencyStream
from lmqd.engine.spill import SpillQueue
from lmqd.message import GuidFactory, Message
from lmqd.names import is_ephemeral
from lmqd.options import Options
from lmqd.stats import NO_E2E_LATENCY, E2eLatency, TopicStats

if TYPE_CHECKING:
    from lmqd.engine.syncer import Syncer

__all__ = ["Topic", "TopicExiting"]

log = logging.getLogger("lmqd.topic")

# Messages moved per pump iteration. Large enough that the per-batch costs (a checkpoint, one
# put_many and one delivery round per channel) vanish per message; small enough that one busy
# topic yields to the network tasks often (a batch of 2048 takes roughly a millisecond).
PUMP_BATCH = 2048
# A durable topic whose channel write failed (disk full, I/O error) tries again this much later:
# often enough to resume soon after the disk recovers, rarely enough not to flood the log.
RETRY_DELAY = 1.0


class _Pending:
    """One batch a durable topic pumped: acknowledged once every channel's copy is durable."""

    __slots__ = ("messages", "redo", "waiting")

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.waiting = 0
        """Channel copies written and not yet fsynced."""
        self.redo = 0
        """Retry batches queued for channels whose write or sync failed."""


class _Batch:
    """Messages to (re)send to some channels: ``targets`` None means every channel."""

    __slots__ = ("messages", "pending", "targets")

    def __init__(
        self, messages: list[Message], targets: list[Channel] | None, pending: _Pending
    ) -> None:
        self.messages = messages
        self.targets = targets
        self.pending = pending


class Topic:
    """One topic: its queue, its channels and the pump between them."""

    def __init__(
        self,
        name: str,
        options: Options,
        *,
        backend: BackendQueue,
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
    ) -> None:
        self.name = name
        self.options = options
        self.backend = backend
        self.ephemeral = is_ephemeral(name)
        self.paused = False
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
        disk = backend.stored
        self._disk = disk if disk is not None and disk.ack_mode else None
        """The acknowledgement-mode queue of a durable topic."""
        self._dirty: Callable[[], None] | None = (
            partial(syncer.note_dirty, disk) if syncer is not None and disk is not None else None
        )
        # nsqd makes no memory queue for a topic with --mem-queue-size 0, ephemeral or not (an
        # ephemeral topic then drops everything into its dummy backend). A durable topic has
        # none either: its publishers' OKs wait for the fsync of the records.
        self._queue = SpillQueue(
            backend, 0 if self._disk is not None else options.mem_queue_size, self._dirty
        )
        self._redo: deque[_Batch] = deque()
        self._pendings: set[_Pending] = set()
        self._retry_at = 0.0
        self._wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._run_scope = trio.CancelScope()

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    @property
    def depth(self) -> int:
        """Messages not yet pumped to channels: memory + backend."""
        return len(self._queue)

    @property
    def backend_depth(self) -> int:
        return self.backend.depth

    @property
    def durable(self) -> bool:
        """Whether publishes go to an acknowledgement-mode disk queue (``--durable``)."""
        return self._disk is not None

    @property
    def durable_queue(self) -> StoredQueue | None:
        """The queue whose fsync a durable publisher waits for (None: not durable)."""
        return self._disk

    # -- publishing --------------------------------------------------------------------------

    def publish(self, bodies: Sequence[bytes], now: float, defer: float = 0.0) -> list[Message]:
        """Make messages of ``bodies`` (new ids, one wall-clock timestamp) and put them.

        ``defer`` > 0 (seconds, DPUB) sets ``deliver_at = now + defer``. Raises
        ``TopicExiting``, or ``BackendError`` having stored none of them.
        """
        if self.exiting:
            raise TopicExiting(f"topic {self.name} is exiting")
        ids = self._guid.new_ids(len(bodies))
        ts = time.time_ns()
        deliver_at = now + defer if defer > 0 else 0.0
        # map() calls the constructor without a Python-level loop: ~25% less per message.
        messages = list(map(Message, ids, bodies, repeat(ts), repeat(0), repeat(deliver_at)))
        self._put(messages, sum(map(len, bodies)))
        return messages

    def put_many(self, messages: Sequence[Message]) -> None:
        """Queue already-built messages (publish, restore). All or none: raises
        ``TopicExiting``, or ``BackendError`` having stored none of them."""
        if self.exiting:
            raise TopicExiting(f"topic {self.name} is exiting")
        self._put(messages, sum(len(m.body) for m in messages))

    @property
    def wrote_backend(self) -> bool:
        """Whether the last publish wrote to the backend (a success there clears bad health)."""
        return self._queue.wrote_backend

    def _put(self, messages: Sequence[Message], nbytes: int) -> None:
        self._queue.put_many(messages)  # raises BackendError having queued none
        self.message_count += len(messages)
        self.message_bytes += nbytes
        self._wakeup.set()

    # -- the pump ----------------------------------------------------------------------------

    def _pump_ready(self) -> bool:
        return (
            not self.paused
            and bool(self.channels)
            and (self.depth > 0 or (bool(self._redo) and trio.current_time() >= self._retry_at))
        )

    async def _pump(self) -> None:
        while True:
            if not self._pump_ready():
                self._wakeup = trio.Event()
                # A retry batch waits for its delay; anything else wakes the pump earlier.
                deadline = self._retry_at if self._redo else float("inf")
                with trio.move_on_at(deadline):
                    await self._wakeup.wait()
                continue
            now = trio.current_time()
            if self._redo and now >= self._retry_at:
                self._resend(self._redo.popleft(), now)
                await trio.lowlevel.checkpoint()
                continue
            messages = self._queue.take(PUMP_BATCH)
            if not messages:
                # The backend holds messages it cannot read now (a corrupt region it could not
                # set aside yet): try again later rather than spin.
                await trio.sleep(RETRY_DELAY)
                continue
            if self._disk is None:
                self._fan_out(messages, now)
            else:
                pending = _Pending(messages)
                self._pendings.add(pending)
                self._send(_Batch(messages, None, pending), now)
                self._settle(pending)
            # One checkpoint per batch: lets the connections run between batches.
            await trio.lowlevel.checkpoint()

    def _fan_out(self, messages: list[Message], now: float) -> None:
        channels = [c for c in self.channels.values() if not c.exiting]
        if not channels:  # only exiting channels left: keep the batch (rare)
            self._queue.requeue_front(messages)
            return
        for channel in channels[1:]:
            channel.put_many([m.copy() for m in messages], now)
        channels[0].put_many(messages, now)
        for channel in channels:
            channel.deliver(now)

    # -- the durable pump ----------------------------------------------------------------------

    def _send(self, batch: _Batch, now: float) -> None:
        """Write a copy of the batch to each target channel; schedule retries for failures."""
        pending = batch.pending
        targets = batch.targets
        if targets is None:
            targets = list(self.channels.values())
        failed: list[Channel] = []
        error: BackendError | None = None
        syncer = self._syncer
        for channel in targets:
            if channel.exiting or self.channels.get(channel.name) is not channel:
                continue  # deleted meanwhile: its copy no longer matters
            # Copies for every channel, even the first: a retry must start from the originals.
            try:
                channel.put_many([m.copy() for m in batch.messages], now)
            except BackendError as exc:
                failed.append(channel)
                error = exc
                continue
            channel.deliver(now)
            if syncer is not None:
                for queue in channel.durable_queues:
                    pending.waiting += 1
                    syncer.when_durable(
                        queue, partial(self._copy_synced, pending, channel), urgent=False
                    )
        if failed:
            log.error(
                "TOPIC(%s): writing %d messages to %d channel(s) failed, retrying in %.0fs - %s",
                self.name,
                len(batch.messages),
                len(failed),
                RETRY_DELAY,
                error,
            )
            if self._on_health is not None:
                self._on_health(str(error))
            self._retry(_Batch(batch.messages, failed, pending))

    def _retry(self, batch: _Batch) -> None:
        batch.pending.redo += 1
        # Every failure postpones all retries: a disk that fails once likely fails again soon.
        self._retry_at = trio.current_time() + RETRY_DELAY
        self._redo.append(batch)
        self._wakeup.set()

    def _resend(self, batch: _Batch, now: float) -> None:
        batch.pending.redo -= 1
        self._send(batch, now)
        self._settle(batch.pending)

    def _copy_synced(self, pending: _Pending, channel: Channel, error: OSError | None) -> None:
        # Syncer callback: one channel's copy of a batch is durable (or its fsync failed).
        if self.exiting:
            return
        pending.waiting -= 1
        if error is not None:
            # The copy may be lost: write it again (a duplicate at worst, never a loss). A
            # channel with two queues can fail twice for one batch: one retry is enough.
            if not any(channel in (b.targets or ()) and b.pending is pending for b in self._redo):
                self._retry(_Batch(pending.messages, [channel], pending))
            self._settle(pending)
            return
        self._settle(pending)

    def _settle(self, pending: _Pending) -> None:
        """Acknowledge a batch at the topic once every channel's copy is durable."""
        if pending.waiting or pending.redo or pending not in self._pendings:
            return
        self._pendings.discard(pending)
        disk = self._disk
        if disk is not None and not self.exiting:
            disk.ack_messages(pending.messages)
            if self._dirty is not None:
                self._dirty()

    # -- channels ----------------------------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        """The channel called ``name``, created (and its timer started) if absent.

        Raises ``TopicExiting`` if the topic is being deleted or closed.
        """
        channel = self.channels.get(name)
        if channel is not None:
            return channel
        if self.exiting:
            raise TopicExiting(f"topic {self.name} is exiting")
        backend = (
            DummyBackend() if is_ephemeral(name) else self._channel_backend_factory(self.name, name)
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
        )
        self.channels[name] = channel
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

    def delete_channel(self, name: str) -> None:
        """Delete a channel and its stored messages (``KeyError`` if absent). An ephemeral
        topic left without channels deletes itself and tells ``on_deleted_ephemeral``."""
        channel = self.channels.pop(name)
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

    # -- admin -------------------------------------------------------------------------------

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
        """Drop the topic's own queued messages (channels keep theirs, as nsqd)."""
        self._queue.empty()
        self._redo.clear()
        self._pendings.clear()

    def close(self) -> None:
        """Shut down: close every channel (flushing them), write the memory queue to the
        backend, close it and end ``run``. Idempotent.

        A durable topic then acknowledges the batches whose channel copies the channels' close
        made durable; batches waiting for a retry stay unacknowledged (read again at the next
        start, so no channel misses them).
        """
        if self.exiting:
            return
        self.exiting = True
        self._run_scope.cancel()
        channels_ok = True
        for channel in self.channels.values():
            if not channel.close():
                channels_ok = False
        if self._disk is not None and channels_ok:
            self._disk.ack_messages([m for p in self._pendings if not p.redo for m in p.messages])
        self._pendings.clear()
        self._redo.clear()
        pending = self._queue.memory()
        if pending:
            self._queue.clear_memory()
            try:
                self.backend.put_many(pending)
            except Exception:
                log.error(
                    "TOPIC(%s): failed to flush %d messages to the backend at close",
                    self.name,
                    len(pending),
                    exc_info=True,
                )
        self.backend.close()
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
        self._queue.clear_memory()
        self._redo.clear()
        self._pendings.clear()
        self.backend.delete()
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
            backend_depth=self.backend.depth,
            message_count=self.message_count,
            message_bytes=self.message_bytes,
            paused=self.paused,
            e2e_processing_latency=self.e2e_latency(),
        )
