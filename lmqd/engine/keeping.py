"""How a channel keeps the messages it owns: nsqd's memory first, or ``--durable``'s on disk.

A channel owns its requeued, timed-out, deferred and pushed messages (its topic's log keeps the
rest, ``stream.py``). Where those go and what a FIN, a requeue or a shutdown must record is the
one thing that differs between the storage modes, so it lives here, in two classes chosen once
when the channel is made (``Keeping.kind``): the channel's delivery code calls the same methods
whatever the mode, and a default-mode channel pays nothing for the durable one's bookkeeping.

* ``Keeping`` (default mode, and every ephemeral channel): the own store is a ``SpillQueue``,
  memory up to ``--mem-queue-size`` then its disk queue (``put_many_or_hold``: a failed write
  never loses a message, it is held in memory and health turns NOK); deferred messages wait in
  memory and go to the deferred store only at shutdown; nothing is acknowledged anywhere.
* ``DurableKeeping`` (``--durable``): every message not FIN'd has a copy on disk that a crash
  brings back -- in the topic's log (unsettled by the channel's cursor) or in one of the
  channel's stores (own, deferred, priority lanes) -- and ``DurableAcks`` (``durable.py``)
  records where, acknowledging there on FIN. A requeued message still holding the log is
  written to the own store so that the log's low-water mark moves on (settled once the copy is
  fsynced), a deferred one to the deferred store, and a message held in flight while the
  channel read on past it (more than what is in flight plus one sync window, ``--sync-every``)
  or while the log moved to a newer segment is copied to the deferred store too
  (``release.py``): a crash then replays at most that much, not everything published since
  the held message.
  A message requeued or timed out after it was read back from a store is written again, with
  its attempts, so a crash does not forget its deliveries.

Both keep the channel's **deferred store** (``topic:channel#deferred``, opened when first
needed): read back whole into the deferred heap at start-up and after every write
(``load_deferred``), written at shutdown (``flush``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import partial
from typing import Protocol

from lmqd.engine.backend import BackendError, BackendQueue, StoredQueue, Syncable
from lmqd.engine.durable import DurableAcks
from lmqd.engine.holds import forget_offsets, note_offsets, restored_holds
from lmqd.engine.lanes import LANE_SUFFIX, by_level, priority_of
from lmqd.engine.release import HeldRelease
from lmqd.engine.salvage import Salvage
from lmqd.engine.sources import ChannelBasics, ReadySources
from lmqd.message import Message
from lmqd.storage import run_sync_jobs

__all__ = ["DurableKeeping", "Keeping", "KeepingOwner"]


class KeepingOwner(ChannelBasics, Protocol):
    """The channel, as its keeping sees it."""

    last_backend_error: BackendError | None

    @property
    def subject(self) -> str: ...

    @property
    def sources(self) -> ReadySources: ...

    @property
    def disk_queues(self) -> tuple[StoredQueue, ...]: ...

    def request_delivery(self) -> None: ...

    def hold_deferred(self, messages: Sequence[Message]) -> None: ...

    def push(
        self, messages: Sequence[Message], now: float
    ) -> list[tuple[StoredQueue, list[int]]]: ...

log = logging.getLogger("lmqd.channel")

class Keeping:
    """nsqd's default mode: a channel's own messages in memory first (see the module
    docstring). One per channel; ``kind`` picks the class."""

    __slots__ = ("_channel", "_dq", "offset_notes", "unnoted_stored")

    durable = False
    mem_factor = 1
    """How much of ``--mem-queue-size`` the channel's queues hold in memory (durable: none)."""

    @staticmethod
    def kind(durable: bool) -> type[Keeping]:
        """The class for a channel: durable (``--durable`` and a stored channel) or not."""
        return DurableKeeping if durable else Keeping

    def __init__(self, channel: KeepingOwner) -> None:
        self._channel = channel
        self._dq: BackendQueue | None = self._open_dq(False)
        """The deferred store, once open (at start-up only if it has files)."""
        self.offset_notes = channel.ctx.stores.offset_notes(channel.topic_name, channel.name)
        """While a mirror holds the topic: the offsets of the messages this channel keeps in
        its stores, by id (``holds.note_offsets``); its stores write them with those messages
        (``record.FLAG_OFFSET``) so that a restart finds them (``note_stored``)."""
        self.unnoted_stored = 0
        """Messages the stores held without an offset when ``note_stored`` read them (stored
        before a mirror held the topic, read from memory, or by an older build): at most
        that many of what the stores hold are not followed by offset."""

    def _open_dq(self, create: bool) -> BackendQueue | None:
        channel = self._channel
        return channel.ctx.stores.deferred_store(channel.topic_name, channel.name, create)

    def restore(self) -> None:
        """Start-up: what an earlier run left in the deferred store goes to the deferred heap;
        first, if a mirror held the topic, the offsets of what the stores hold are noted."""
        cursor = self._channel.sources.cursor
        if cursor is not None and restored_holds(cursor.stream):
            self.note_stored()
        if self._dq is not None and self._dq.depth:
            self.load_deferred()

    # -- the deferred store ----------------------------------------------------------------

    @property
    def deferred_store(self) -> StoredQueue | None:
        """The deferred store on disk, once open."""
        return self._dq.stored if self._dq is not None else None

    def open_deferred_store(self) -> BackendQueue | None:
        """The deferred store, opened if needed; None if the channel has none (not stored on
        disk). Raises ``BackendError`` if it cannot be opened."""
        if self._dq is None:
            self._dq = self._open_dq(True)
        return self._dq

    def store_deferred(self, messages: Sequence[Message]) -> None:
        """Write deferred messages to the deferred store and hold what it reads back.

        Raises ``BackendError`` having stored none of them.
        """
        dq = self.open_deferred_store()
        if dq is None:
            raise BackendError(f"{self._channel.subject}: no deferred store")
        dq.put_many(messages)
        self.load_deferred()

    def load_deferred(self, in_flight: dict[bytes, Message] | None = None) -> None:
        """Read the whole deferred store into the deferred heap (it is always read to its end).

        ``in_flight``: messages just copied there while they are in flight (``check``),
        by id: their copies are not deferred, they stand for them on disk.
        """
        dq = self._dq
        assert dq is not None
        channel = self._channel
        deferred = channel.deferred
        while dq.depth:
            got = dq.read_many(dq.depth)
            if not got:
                break  # unreadable bytes were set aside or reading paused: see the storage log
            for m in got:
                held = in_flight.pop(m.id, None) if in_flight else None
                if held is None or not self._aliased(held, m):
                    self._from_store(m)
                    deferred.push(m)
        stored = dq.stored
        syncer = channel.ctx.syncer
        if syncer is not None and stored is not None:
            syncer.note_dirty(stored)
        channel.wake_at(deferred.next_deadline())

    def _aliased(self, held: Message, stored: Message) -> bool:
        return False

    def _from_store(self, m: Message) -> None:
        pass

    # -- messages the channel takes --------------------------------------------------------

    def put_many(self, messages: Sequence[Message], now: float) -> None:
        """Messages from the topic (a channel without a cursor; a redrive): deferred ones
        into the deferred queue, the rest onto the ready queue."""
        for m in messages:
            if m.deliver_at > now or m.ext is not None:
                # Rare (DPUB, lmq's extension): look at each only when one is of those.
                self._channel.push(messages, now)
                return
        self.enqueue(messages)

    def push(self, messages: Sequence[Message], now: float) -> list[tuple[StoredQueue, list[int]]]:
        """The topic's pushed messages (deferred, or with a priority): into the deferred queue,
        or the priority lanes, or (due already, no priority) the own store. Returns the stores
        written with the offsets they took (a durable channel's; none here)."""
        channel = self._channel
        due = [m for m in messages if m.deliver_at <= now]
        if len(due) < len(messages):
            deferred = channel.deferred
            for m in messages:
                if m.deliver_at > now:
                    deferred.push(m)
            channel.wake_at(deferred.next_deadline())
        if due:
            self.enqueue(due)
            channel.request_delivery()
        return []

    def enqueue(self, messages: Sequence[Message]) -> None:
        """Messages the channel already owns (from its topic, requeued, timed out, due) onto
        the ready queue, those with a priority into their lanes (``_put_ranked``), the others
        into the own store (``_put_unranked``)."""
        self._enqueue(messages, rewrite=False)

    def _enqueue(self, messages: Sequence[Message], *, rewrite: bool) -> None:
        if self._channel.sources.lanes is not None:
            messages = self._enqueue_ranked(messages, rewrite=rewrite)
            if not messages:
                return
        self._put_unranked(messages, rewrite)

    def _put_unranked(self, messages: Sequence[Message], rewrite: bool) -> None:
        """Into the own store: a failed backend write holds them in memory (``SpillQueue``) and
        turns health NOK."""
        sources = self._channel.sources
        queue = sources.queue
        if sources.unbuffered:
            queue.limit = sources.memory_limit()
        error = queue.put_many_or_hold(messages)
        self._note_write(error, queue.wrote_backend, count=len(messages))

    def _enqueue_ranked(self, messages: Sequence[Message], *, rewrite: bool) -> Sequence[Message]:
        """Of ``messages``, those with a priority into their lanes (``rewrite``: requeued, see
        ``DurableKeeping.requeue``); returns the others."""
        groups = by_level(messages)
        if not groups:
            return messages
        lanes = self._channel.sources.lanes
        assert lanes is not None
        ranked = [m for group in groups.values() for m in group]
        self._put_ranked(ranked, rewrite)
        if len(ranked) == len(messages):
            return ()
        return [m for m in messages if not priority_of(m)]

    def _put_ranked(self, ranked: list[Message], rewrite: bool) -> None:
        lanes = self._channel.sources.lanes
        assert lanes is not None
        self._note_write(*lanes.put_many_or_hold(ranked), count=len(ranked))

    def _note_write(self, error: BackendError | None, wrote: bool, *, count: int) -> None:
        """Health after a write of messages the channel owns: bad while a backend refuses."""
        channel = self._channel
        if error is not None:
            log.error(
                "%s: backend write of %d messages failed, kept in memory - %s",
                channel.subject,
                count,
                error,
            )
            if channel.last_backend_error is None:
                channel.ctx.events.set_health(str(error))
            channel.last_backend_error = error
        elif channel.last_backend_error is not None and wrote:
            channel.ctx.events.set_health(None)
            channel.last_backend_error = None

    def requeue(self, messages: Sequence[Message]) -> None:
        """Delivered messages that came back (``REQ 0``, a timeout, their consumer gone) onto
        the ready queue: ``enqueue`` here."""
        self.note(messages)
        self.enqueue(messages)

    def defer_owned(self, messages: Sequence[Message]) -> None:
        """Messages the channel owns, their ``deliver_at`` set, into the deferred queue."""
        self.note(messages)
        channel = self._channel
        for m in messages:
            channel.deferred.push(m)
        channel.wake_at(channel.deferred.next_deadline())

    def defer_read(self, m: Message) -> None:
        """A deferred message read from the cursor (a replay): held until it is due."""
        self._channel.deferred.push(m)

    # -- what the sources take ------------------------------------------------------------

    def unique_taken(
        self, taken: list[Message], count: int
    ) -> tuple[list[Message], set[bytes] | None]:
        """Messages taken from memory, as they may be delivered: here all of them (only a
        durable channel can hold one message twice, after a crash); and the ids seen."""
        return taken, None

    def reads_each(self, replaying: bool) -> bool:
        """Whether a read from the cursor must be looked at message by message (the
        in-flight rule, deferred ones): only in a replay, which reads deferred messages."""
        return replaying

    def lane_read(self, backend: BackendQueue, messages: list[Message]) -> None:
        """``messages`` were read back from a priority lane's store ``backend``."""

    # -- what becomes of the messages ---------------------------------------------------

    def duplicate(self, m: Message) -> None:
        """``m`` was read again while another copy is in flight (or taken in this round)."""
        log.debug(
            "%s: dropping a duplicate of %s read from disk while it is in flight",
            self._channel.subject,
            m.id.decode("ascii", "replace"),
        )

    def done(self, messages: Sequence[Message]) -> None:
        """``messages`` are finished for this channel (FIN, sampled out, dropped, empty)."""
        if self.offset_notes:
            forget_offsets(self.offset_notes, messages)

    def done_when_copied(self, messages: Sequence[Message], copies_in: Syncable | None) -> None:
        """``messages`` were copied elsewhere (a dead-letter topic, a redrive): done here once
        the copies are durable."""
        if self.offset_notes:
            forget_offsets(self.offset_notes, messages)

    def redrive_store(self) -> Syncable | None:
        """What makes messages redriven into this channel durable (None: nothing to wait)."""
        return None

    def clear(self) -> None:
        """The channel was emptied or deleted: nothing is left to record."""
        self.offset_notes.clear()

    def note_stored(self) -> None:
        """A mirror holds the topic (or held it, at start-up): the offsets the records of the
        channel's stores carry (``record.FLAG_OFFSET``) are noted, as ``note`` noted them when
        they went there: of everything the stores have still to give back, and of what they
        gave back already that the channel holds unfinished (deferred, in flight ...), found
        in what is left of their files. A read of those files, once (twice if it holds some)."""
        notes = self.offset_notes
        queues = self._channel.disk_queues
        self.unnoted_stored = self._note_stored(queues, None)
        wanted = {m.id for m in self.held_messages() if m.offset < 0 and m.id not in notes}
        if wanted:
            self._note_stored(queues, wanted)

    def held_messages(self) -> list[Message]:
        """What the channel holds unfinished in memory: in flight, deferred, requeued, in its
        priority lanes."""
        channel = self._channel
        sources = channel.sources
        held = [*channel.in_flight, *channel.deferred, *sources.queue.memory()]
        if sources.lanes is not None:
            for _, _, messages in sources.lanes.memory():
                held += messages
        return held

    def _note_stored(self, queues: Sequence[StoredQueue], wanted: set[bytes] | None) -> int:
        notes = self.offset_notes
        unnoted = 0
        for queue in queues:
            try:
                found, without = queue.stored_offsets(read_too=wanted is not None)
            except OSError as exc:
                log.warning(
                    "%s: cannot read the offsets %s holds (a promoted mirror may not find "
                    "its unfinished messages): %s",
                    self._channel.subject,
                    queue.name,
                    exc,
                )
                continue
            unnoted += without
            if wanted is None:
                notes.update(found)
            else:
                notes.update((i, o) for i, o in found.items() if i in wanted)
        return unnoted

    def note(self, messages: Sequence[Message]) -> None:
        """``messages`` go to the channel's stores: their offsets are noted while a mirror
        holds the topic (``holds.note_offsets``)."""
        cursor = self._channel.sources.cursor
        stream = cursor.stream if cursor is not None else None
        note_offsets(self.offset_notes, stream, messages)

    # -- deliveries -----------------------------------------------------------------------

    def delivered(self, now: float) -> None:
        """A round put messages in flight at ``now``."""

    @property
    def next_check(self) -> float:
        """When ``check`` wants to run next (``math.inf``: never)."""
        return math.inf

    def check(self, now: float) -> None:
        """Periodic work the channel's timer runs at ``next_check``."""

    # -- shutdown -----------------------------------------------------------------------------

    def flush(self, ready: list[Message], deferred: list[Message], salvage: Salvage) -> bool:
        """``Channel.close``: ready and in-flight messages to the own store, deferred ones
        (with their deadlines) to the deferred store, the priority lanes' memory to their
        stores, each as far as the disk takes them, then one sync of every store. Returns False
        if something could not be written or synced (logged)."""
        ok, copied = self._flush(ready, deferred, salvage)
        lanes = self._channel.sources.lanes
        if lanes is not None:
            lanes_ok, lanes_copied = self._flush_lanes(salvage)
            ok = ok and lanes_ok
            copied += lanes_copied
        # One group of jobs: every queue's data is fsynced before any positions file is written,
        # so an acknowledgement in one queue never becomes durable before the copy in the other.
        jobs = [job for q in self._channel.disk_queues if (job := q.prepare_sync()) is not None]
        for job, error in zip(jobs, run_sync_jobs(jobs), strict=True):
            if error is not None:
                ok = False
                log.error("%s: final sync of %s failed: %s", self._channel.subject, job.name, error)
        if ok:
            self._flushed(copied)
        return ok

    def _flushed(self, copied: list[Message]) -> None:
        """The copies ``flush`` wrote are durable."""

    def _flush(
        self, ready: list[Message], deferred: list[Message], salvage: Salvage
    ) -> tuple[bool, list[Message]]:
        """Ready and in-flight messages to the own store, deferred ones to the deferred store.
        Returns (all written, the messages written)."""
        channel = self._channel
        copied: list[Message] = []
        subject = channel.subject
        if deferred:
            dq: BackendQueue | None = None
            try:
                dq = self.open_deferred_store()
            except BackendError as exc:
                log.warning("%s: %s", subject, exc)
            if dq is not None:
                put_deferred = dq.put_many
                done, _ = salvage.write_prefix(
                    subject, lambda chunk, _index: put_deferred(chunk), deferred
                )
                copied += deferred[:done]
                deferred = deferred[done:]
                if deferred:
                    log.warning(
                        "%s: %d deferred messages go to the main store (due at once after a "
                        "restart)",
                        subject,
                        len(deferred),
                    )
            # Not stored on time: kept with the others (nsqd's way: due at once after a restart).
            ready += deferred
        lanes = channel.sources.lanes
        if lanes is not None and any(map(priority_of, ready)):
            # In flight with a priority: back to their lanes (written by ``_flush_lanes``).
            lanes.hold(ready)
            ready = [m for m in ready if not priority_of(m)]
        if not ready:
            return True, copied
        put = channel.sources.backend.put_many
        done = salvage.write(
            subject,
            f"{channel.topic_name}:{channel.name}",
            lambda chunk, _index: put(chunk),
            ready,
            kept_elsewhere=self.durable,
        )
        copied += ready[:done]
        return done == len(ready), copied

    def _flush_lanes(self, salvage: Salvage) -> tuple[bool, list[Message]]:
        """Each priority lane's memory to its store, as ``_flush`` does."""
        channel = self._channel
        lanes = channel.sources.lanes
        assert lanes is not None
        ok = True
        copied: list[Message] = []
        for level, backend, messages in lanes.memory():
            done = salvage.write(
                channel.subject,
                f"{channel.topic_name}:{channel.name}{LANE_SUFFIX}{level}",
                partial(_write_chunk, backend),
                messages,
                kept_elsewhere=self.durable,
            )
            copied += messages[:done]
            ok = ok and done == len(messages)
        lanes.clear_memory()
        return ok, copied

    def close(self) -> None:
        if self._dq is not None:
            self._dq.close()

    def delete(self) -> None:
        if self._dq is not None:
            self._dq.delete()

    def empty(self) -> None:
        if self._dq is not None:
            self._dq.empty()


class DurableKeeping(Keeping):
    """``--durable``: every message not FIN'd keeps a copy on disk (see the module docstring)."""

    __slots__ = ("_acks", "_release")

    durable = True
    mem_factor = 0

    def __init__(self, channel: KeepingOwner) -> None:
        self._acks = DurableAcks(
            lambda: channel.sources.backend.stored,
            lambda: self.deferred_store,
            channel.ctx.syncer,
            channel.sources.cursor,
        )
        self._release = HeldRelease(self, channel, self._acks)
        """Copies messages held in flight out of the log's way (``release.py``)."""
        super().__init__(channel)

    def _aliased(self, held: Message, stored: Message) -> bool:
        self._acks.alias(held, stored)
        return True

    def _from_store(self, m: Message) -> None:
        self._acks.from_store((m,))

    def put_many(self, messages: Sequence[Message], now: float) -> None:
        """All of them (deferred ones too, with their time) to the channel's stores; raises
        ``BackendError`` having stored none of them."""
        deferred = [m for m in messages if m.deliver_at > now]
        ready = [m for m in messages if m.deliver_at <= now] if deferred else messages
        if deferred:
            # First, so that a failure here stores nothing (a failure of the main write below
            # leaves these stored: the topic's retry duplicates them, never loses them).
            self.store_deferred(deferred)
        if ready:
            self._channel.sources.queue.put_many(ready)  # limit 0: straight to disk, all or none

    def push(self, messages: Sequence[Message], now: float) -> list[tuple[StoredQueue, list[int]]]:
        """Deferred messages to the deferred store, those with a priority to their lanes'
        stores; returns each store written with the offsets of the messages it took (durable
        once it is synced). If a store fails, the messages it did not take are held in memory
        (their offsets cleared) and ``BackendError`` is raised."""
        channel = self._channel
        written: list[tuple[StoredQueue, list[int]]] = []
        deferred = [m for m in messages if m.deliver_at > 0]
        lanes = channel.sources.lanes
        ranked = [m for m in messages if not m.deliver_at] if deferred else messages
        try:
            if deferred:
                self.store_deferred(deferred)
                store = self.deferred_store
                if store is not None:
                    written.append((store, [m.offset for m in deferred]))
                deferred = []
            if lanes is not None and ranked:
                for level, lane in lanes.put_many(ranked).items():
                    store = lane.backend.stored
                    if store is not None:
                        written.append(
                            (store, [m.offset for m in ranked if priority_of(m) == level])
                        )
                ranked = []
        except BackendError:
            done = {offset for _, offsets in written for offset in offsets}
            held = [m for m in (*deferred, *ranked) if m.offset not in done]
            for m in held:
                m.offset = -1  # the pin stays: a restart pumps them again
            self._hold_pushed(held)
            raise
        return written

    def _hold_pushed(self, messages: Sequence[Message]) -> None:
        """Pushed messages held in memory only (their store could not take them)."""
        channel = self._channel
        deferred = [m for m in messages if m.deliver_at]
        if deferred:
            channel.hold_deferred(deferred)
        ranked = [m for m in messages if not m.deliver_at]
        lanes = channel.sources.lanes
        if ranked and lanes is not None:
            lanes.hold(ranked)
            channel.request_delivery()

    def requeue(self, messages: Sequence[Message]) -> None:
        """As ``enqueue``, and those read back from a store are written again too (their old
        copies acknowledged once the new ones are fsynced): the copy a crash brings back must
        count every delivery so far, not those before it was written."""
        self.note(messages)
        self._enqueue(messages, rewrite=True)

    def _put_unranked(self, messages: Sequence[Message], rewrite: bool) -> None:
        """Requeued, timed-out or due messages. Those still holding the log (and, ``rewrite``,
        every one) are written to the own store (the log's low-water mark must not wait for
        them), their offsets settled once that copy is fsynced; the others are unacknowledged in
        a store already, so memory holds them without risk (at most what was in flight or
        deferred)."""
        sources = self._channel.sources
        queue = sources.queue
        pinning = messages if rewrite else [m for m in messages if m.offset >= 0]
        if pinning:
            try:
                queue.put_many(pinning)  # limit 0: straight to the own store's disk
            except BackendError as exc:
                log.error(
                    "%s: cannot store %d requeued messages (kept in memory, unsettled in the "
                    "log) - %s",
                    self._channel.subject,
                    len(pinning),
                    exc,
                )
                self._channel.ctx.events.set_health(str(exc))  # the syncer's next round clears it
                queue.hold(pinning)
            else:
                self._acks.ack_when_copied(pinning, sources.backend.stored)
            if len(pinning) == len(messages):
                return
            messages = [m for m in messages if m.offset < 0]
        queue.hold(messages)

    def _put_ranked(self, ranked: list[Message], rewrite: bool) -> None:
        # As ``enqueue``: those still holding the log (and, requeued, every one) get a copy in
        # their lane's store, the others are safe in a store already.
        lanes = self._channel.sources.lanes
        assert lanes is not None
        if rewrite:
            pinning = ranked
        else:
            pinning = [m for m in ranked if m.offset >= 0]
            lanes.hold([m for m in ranked if m.offset < 0])
        for level, group in by_level(pinning).items():
            try:
                lane = lanes.put_many(group)[level]
            except BackendError as exc:
                self._note_write(exc, False, count=len(group))
                lanes.hold(group)
            else:
                self._acks.ack_when_copied(group, lane.backend.stored)

    def defer_owned(self, messages: Sequence[Message]) -> None:
        """To the deferred store (so that a long delay does not hold the own store's read
        position back); the originals are acknowledged once that is synced."""
        self.note(messages)
        try:
            self.store_deferred(messages)
        except BackendError as exc:
            log.warning(
                "%s: cannot store %d deferred messages (kept unacknowledged in memory): %s",
                self._channel.subject,
                len(messages),
                exc,
            )
            super().defer_owned(messages)
        else:
            self._acks.ack_when_copied(messages, self.deferred_store)

    def defer_read(self, m: Message) -> None:
        try:
            self.store_deferred((m,))
        except BackendError as exc:
            log.warning(
                "%s: cannot store a deferred message (kept in memory, unsettled in the log): %s",
                self._channel.subject,
                exc,
            )
            super().defer_read(m)
        else:
            self._acks.ack_when_copied((m,), self.deferred_store)

    def unique_taken(
        self, taken: list[Message], count: int
    ) -> tuple[list[Message], set[bytes] | None]:
        """After a crash a message can be here twice (the topic pumped it again, or it was read
        again from a store): ``taken`` without duplicates, topped up from memory."""
        if not taken:
            return taken, None
        sources = self._channel.sources
        seen: set[bytes] = set()
        out: list[Message] = []
        while taken:
            sources.admit(taken, math.inf, out, seen)  # memory: nothing to defer
            taken = sources.queue.take_memory(count - len(out)) if len(out) < count else []
        return out, seen

    def reads_each(self, replaying: bool) -> bool:
        # A restart may read again what a store also had: every read is looked at.
        return True

    def lane_read(self, backend: BackendQueue, messages: list[Message]) -> None:
        stored = backend.stored
        if stored is not None:
            self._acks.from_lane(stored, messages)

    def duplicate(self, m: Message) -> None:
        super().duplicate(m)
        self._acks.ack((m,))

    def done(self, messages: Sequence[Message]) -> None:
        super().done(messages)
        self._acks.ack(messages)

    def done_when_copied(self, messages: Sequence[Message], copies_in: Syncable | None) -> None:
        super().done_when_copied(messages, copies_in)
        self._acks.ack_when_copied(messages, copies_in)

    def redrive_store(self) -> Syncable | None:
        return self._channel.sources.backend.stored

    def clear(self) -> None:
        super().clear()
        self._acks.clear()

    def delivered(self, now: float) -> None:
        self._release.delivered(now)

    @property
    def next_check(self) -> float:
        return self._release.next_check

    def check(self, now: float) -> None:
        self._release.check(now)

    def _flushed(self, copied: list[Message]) -> None:
        # The copies are durable: the originals are done where they were (the queues'
        # positions are persisted as they close, the log's cursor as the topic closes).
        self._acks.ack(copied)
        self._acks.ack_superseded()


def _write_chunk(backend: BackendQueue, chunk: Sequence[Message], _index: int) -> None:
    backend.put_many(chunk)
