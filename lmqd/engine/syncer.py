"""The syncer: one trio task that makes the disk queues durable in group-commit rounds.

Theory of operation
-------------------
Writes to a disk queue or a topic's log (a ``Syncable``) only hand bytes to the OS; an fsync
makes them durable. The syncer runs those fsyncs in **rounds**: it calls ``prepare_sync()``
(non-blocking, event-loop thread) on every queue the round covers, then runs all the jobs with
one ``trio.to_thread.run_sync(run_sync_jobs, jobs)``: one fsync per file written and one per
directory, however many queues and publishers the round serves. Writes that arrive while a
round runs in the worker thread wait for the next round, which starts as soon as the previous
one returns: group commit.

A queue is in a round when

* someone waits for it urgently (``when_durable(..., urgent=True)``: a ``--durable`` publisher
  whose ``OK`` is held), which starts a round at once;
* it reached ``--sync-every`` reads, writes and acknowledgements (``note_dirty``, called once per
  batch by topics and channels), which also starts a round at once;
* ``--sync-timeout`` passed since the last tick and it has any unsynced activity (nsqd's ticker).

**Generations.** Each queue counts its ``prepare_sync`` calls. Writes made now are covered by the
next prepare, so a waiter registered now is tagged ``gen + 1`` and is resolved when the job of that
prepare finishes: ``callback(None)`` if it succeeded (or had nothing to do), ``callback(error)``
if its fsync failed. Waiters are resolved in order; a callback may register new waiters (they
belong to a later generation). A queue that was closed or deleted resolves its waiters with
``None``: close syncs (blocking) and delete drops the messages anyway.

**Gathering.** Publishers that each wait for their ``OK`` before sending again arrive just after
a round started (they were answered by the previous one), so rounds would alternate between a
few and most of them. A round started by durable publishers alone therefore waits, for at most
the duration of the previous round (and ``MAX_GATHER``), until as many publishers are waiting as
the previous round served. A lone publisher never waits (the previous round served one); a
busier load costs at most one round's latency while it grows.

The metadata file rides along: ``metadata_changed()`` asks for a round, and the round writes the
snapshot taken when it was prepared before it syncs the queues, so a burst of topic and channel
creations costs one write. Writes are at least ``METADATA_MIN_INTERVAL`` apart: a snapshot and
the file are O(topics), so a flood of creations on a daemon with thousands of topics would
otherwise spend the loop (and, encoding, the GIL) on back-to-back rewrites of the whole file; a
change is still on disk within that interval and a round.

**Statistics.** ``statistics()`` counts rounds and failures and times each round's worker-thread
call (metadata write plus fsyncs, measured with ``trio.current_time()`` around ``to_thread``) into
a cumulative sum and fixed buckets (``FSYNC_BUCKETS``): plain counters, which ``lmqd.metrics``
turns into the ``lmqd_fsync_duration_seconds`` histogram at scrape time.

Every callback is a plain ``def`` run in the syncer task: it only changes state (releases held
responses, acknowledges a topic's messages), as everywhere else in lmqd.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence

import attrs
import trio

from lmqd.engine.backend import BackendQueue, Syncable
from lmqd.storage import Metadata, SyncJob, run_sync_jobs, save_metadata
from lmqd.storage.metadata import MetadataEncoder

__all__ = ["FSYNC_BUCKETS", "DurableCallback", "Syncer", "SyncerStats"]

log = logging.getLogger("lmqd.syncer")

_EVERY_GENERATION = 1 << 62

METADATA_MIN_INTERVAL = 0.25
"""Seconds between the starts of two metadata writes at least (four a second at most)."""

MAX_GATHER = 0.005
"""Longest a round waits for more durable publishers (seconds): a few fsyncs' worth."""

FSYNC_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)
"""Upper bounds (seconds, inclusive) of the round-duration histogram; +Inf is implied after them."""

DurableCallback = Callable[[OSError | None], None]
"""Called with ``None`` once the writes it waited for are durable, or with the sync's error."""


@attrs.frozen(kw_only=True)
class SyncerStats:
    """Counters since the daemon started (the benchmark and the tests read them)."""

    rounds: int
    """Rounds that ran a worker-thread call (each: one fsync per file, one per directory)."""
    queue_syncs: int
    """Sync jobs run (one per queue per round it was in)."""
    failed_syncs: int
    metadata_writes: int
    fsync_seconds_total: float = 0.0
    """Time spent in the rounds' worker-thread calls (metadata write and fsyncs), seconds."""
    fsync_bucket_counts: tuple[int, ...] = (0,) * (len(FSYNC_BUCKETS) + 1)
    """Rounds per duration bucket, *not* cumulative: ``[i]`` counts rounds that took at most
    ``FSYNC_BUCKETS[i]`` and more than the bound before it; the last entry counts the rest
    (+Inf). They sum to ``rounds``."""


class _QueueState:
    __slots__ = ("gen", "queue", "waiters")

    def __init__(self, queue: Syncable) -> None:
        self.queue = queue
        self.gen = 0
        """``prepare_sync`` calls made by the syncer for this queue."""
        self.waiters: deque[tuple[int, DurableCallback]] | None = None
        """Callbacks with the generation they wait for, made by the first one (an empty deque
        is 760 bytes, and most topics' logs never have a waiter: only ``--durable`` ones)."""

    def resolve(self, gen: int, error: OSError | None) -> None:
        """Call back every waiter of generation ``gen`` or older, in order."""
        waiters = self.waiters
        if waiters is None:
            return
        done = []
        while waiters and waiters[0][0] <= gen:
            done.append(waiters.popleft()[1])
        for callback in done:
            try:
                callback(error)
            except Exception:
                # A broken callback must not stop the syncer (and so every later fsync).
                log.error("SYNCER(%s): callback failed", self.queue.name, exc_info=True)


def _run_round(
    metadata_file: str,
    metadata: Metadata | None,
    jobs: Sequence[SyncJob],
    encoder: MetadataEncoder,
) -> tuple[OSError | None, list[OSError | None]]:
    """The blocking half of a round (worker thread): the metadata file, then the queues."""
    metadata_error = None
    if metadata is not None:
        try:
            save_metadata(metadata_file, metadata, encoder)
        except OSError as exc:
            metadata_error = exc
    errors = run_sync_jobs(jobs) if jobs else []
    return metadata_error, errors


class Syncer:
    """Group commit for every disk queue of one daemon (see the module docstring)."""

    def __init__(
        self,
        *,
        sync_every: int,
        sync_timeout: float,
        metadata_file: str,
        metadata: Callable[[], Metadata],
        on_health: Callable[[str | None], None] | None = None,
    ) -> None:
        self._sync_every = sync_every
        self._sync_timeout = sync_timeout
        self._metadata_file = metadata_file
        self._metadata = metadata
        self._on_health = on_health
        self._states: dict[Syncable, _QueueState] = {}
        self.backend_changed: Callable[[BackendQueue], None] = self._backend_changed
        """``_backend_changed`` bound once: every channel's own store and priority lanes call
        it after a write or read (one object for all of them, not one per channel)."""
        self._urgent: set[_QueueState] = set()
        self._due: set[_QueueState] = set()
        self._metadata_dirty = False
        self._metadata_next = -math.inf
        """When the next metadata write may start (``METADATA_MIN_INTERVAL``)."""
        self._metadata_failed = False
        self._probe = False
        """Write the metadata file at the next tick (``probe_on_tick``)."""
        self._retry: set[_QueueState] = set()
        """Queues whose last job failed: in the next tick's round, even if not dirty again."""
        self.round_started = -math.inf
        """When (``trio.current_time``) the last round started (its writes are from then)."""
        self._encoder = MetadataEncoder()
        """Reuses unchanged topics' JSON between metadata writes (one round at a time)."""
        self._wake = trio.Event()
        self._round_done = trio.Event()
        self._running = False
        self._in_round = False
        self._waiting = 0
        """Urgent waiters registered since the last round was prepared."""
        self._last_served = 0
        self._last_round_s = 0.0
        self._gather_target = 0
        self._gathered = trio.Event()
        self._rounds = 0
        self._queue_syncs = 0
        self._failed_syncs = 0
        self._metadata_writes = 0
        self._fsync_seconds = 0.0
        self._fsync_buckets = [0] * (len(FSYNC_BUCKETS) + 1)

    # -- what the queues' owners call (plain def, never blocks) --------------------------------

    def register(self, queue: Syncable) -> None:
        """Start looking after ``queue`` (a closed or deleted queue is dropped by itself)."""
        if queue not in self._states:
            self._states[queue] = _QueueState(queue)

    def _backend_changed(self, backend: BackendQueue) -> None:
        # A channel's store was written or read: if it is on disk, the syncer counts it.
        stored = backend.stored
        if stored is not None:
            self.note_dirty(stored)

    def note_dirty(self, queue: Syncable) -> None:
        """A batch was written, read or acknowledged: sync at once past ``--sync-every``."""
        if queue.dirty_count >= self._sync_every:
            state = self._states.get(queue)
            if state is not None and state not in self._due:
                self._due.add(state)
                self._wake.set()

    def when_durable(
        self, queue: Syncable, callback: DurableCallback, *, urgent: bool = True
    ) -> None:
        """Call ``callback`` once everything written to ``queue`` so far is fsynced.

        ``urgent`` starts a round now (a publisher is waiting); otherwise the queue's normal
        schedule (``--sync-every``, ``--sync-timeout``) covers it.
        """
        state = self._states.get(queue)
        if state is None:
            self.register(queue)
            state = self._states[queue]
        waiters = state.waiters
        if waiters is None:
            waiters = state.waiters = deque()
        waiters.append((state.gen + 1, callback))
        if urgent:
            self._urgent.add(state)
            self._waiting += 1
            if self._waiting >= self._gather_target:
                self._gathered.set()
            self._wake.set()

    def probe_on_tick(self) -> None:
        """Write the metadata file at the next ``--sync-timeout`` tick: an unhealthy daemon's
        check that the disk takes writes again (its success clears the health error). Once
        per tick at most, however often it is asked."""
        self._probe = True

    def metadata_changed(self) -> None:
        """Write the metadata file in the next round (started at once; bursts coalesce)."""
        self._metadata_dirty = True
        self._wake.set()

    @property
    def busy(self) -> bool:
        """Whether a round runs or urgent work waits (a durable publisher, a metadata change)."""
        return bool(self._urgent) or self._metadata_dirty or self._in_round

    def statistics(self) -> SyncerStats:
        """A snapshot of the counters (``/metrics`` reads one per scrape)."""
        return SyncerStats(
            rounds=self._rounds,
            queue_syncs=self._queue_syncs,
            failed_syncs=self._failed_syncs,
            metadata_writes=self._metadata_writes,
            fsync_seconds_total=self._fsync_seconds,
            fsync_bucket_counts=tuple(self._fsync_buckets),
        )

    # -- the task ----------------------------------------------------------------------------

    async def wait_idle(self) -> None:
        """Return once no urgent work is waiting (shutdown: release the held ``OK`` responses)."""
        while self._running and self.busy:
            await self._round_done.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run rounds until cancelled. Call once."""
        self._running = True
        try:
            task_status.started()
            next_tick = trio.current_time() + self._sync_timeout
            while True:
                if not (self._urgent or self._due or self._metadata_ready()):
                    self._wake = trio.Event()
                    wake_at = next_tick
                    if self._metadata_dirty:
                        wake_at = min(wake_at, self._metadata_next)
                    with trio.move_on_at(wake_at):
                        await self._wake.wait()
                    idle = not (self._urgent or self._due or self._metadata_ready())
                    if idle and trio.current_time() < next_tick:
                        continue  # woken for a metadata write that is not due yet
                if not (self._due or self._metadata_dirty) and self._waiting < self._last_served:
                    await self._gather(next_tick)
                now = trio.current_time()
                tick = now >= next_tick
                if tick:
                    next_tick = now + self._sync_timeout
                await self._round(tick)
                # Lets the connections run between back-to-back rounds (and batch more writes).
                await trio.lowlevel.checkpoint()
        finally:
            self._running = False
            self._round_done.set()

    def _metadata_ready(self) -> bool:
        return self._metadata_dirty and trio.current_time() >= self._metadata_next

    async def _gather(self, next_tick: float) -> None:
        # Wait (briefly) for as many durable publishers as the previous round served.
        self._gather_target = self._last_served
        self._gathered = trio.Event()
        limit = min(self._last_round_s, MAX_GATHER)
        with trio.move_on_at(min(trio.current_time() + limit, next_tick)):
            await self._gathered.wait()
        self._gather_target = 0

    def _select(self, tick: bool) -> list[_QueueState]:
        selected = self._urgent | self._due
        self._urgent = set()
        self._due = set()
        self._last_served = self._waiting
        self._waiting = 0
        if tick:
            if self._metadata_failed or self._probe:
                self._metadata_failed = self._probe = False
                self._metadata_dirty = True
            selected |= self._retry
            self._retry = set()
            for state in self._states.values():
                if state.queue.dirty_count > 0 or state.waiters or state.queue.closed:
                    selected.add(state)
        return list(selected)

    async def _round(self, tick: bool) -> None:
        entries: list[tuple[_QueueState, int, int]] = []  # state, generation, job index or -1
        jobs: list[SyncJob] = []
        for state in self._select(tick):
            queue = state.queue
            if queue.closed:
                del self._states[queue]
                state.resolve(_EVERY_GENERATION, None)
                continue
            state.gen += 1
            try:
                job = queue.prepare_sync()
            except OSError as exc:  # dup() of a descriptor failed (EMFILE): report, don't stop
                log.error("SYNCER(%s): cannot prepare a sync: %s", queue.name, exc)
                self._failed_syncs += 1
                state.resolve(state.gen, exc)
                continue
            if job is None:
                entries.append((state, state.gen, -1))
            else:
                entries.append((state, state.gen, len(jobs)))
                jobs.append(job)
        metadata = None
        if self._metadata_ready():
            self._metadata_dirty = False
            self._metadata_next = trio.current_time() + METADATA_MIN_INTERVAL
            metadata = self._metadata()
        errors: list[OSError | None] = []
        metadata_error = None
        if jobs or metadata is not None:
            # Not abandoned on cancel: a job owns descriptors and must finish (or never start).
            self._in_round = True
            started = self.round_started = trio.current_time()
            try:
                metadata_error, errors = await trio.to_thread.run_sync(
                    _run_round, self._metadata_file, metadata, jobs, self._encoder
                )
            finally:
                self._in_round = False
            elapsed = trio.current_time() - started
            self._last_round_s = elapsed
            # Recorded with ``_rounds`` so the histogram's count always equals the round counter.
            self._fsync_seconds += elapsed
            self._fsync_buckets[bisect_left(FSYNC_BUCKETS, elapsed)] += 1
            self._rounds += 1
            self._queue_syncs += len(jobs)
        if metadata is not None:
            if metadata_error is None:
                self._metadata_writes += 1
            else:
                log.error("METADATA: write failed: %s", metadata_error)
                self._metadata_failed = True  # retried at the next tick, not in a busy loop
        failure: OSError | None = metadata_error
        for state, gen, index in entries:
            error = errors[index] if index >= 0 else None
            if error is not None:
                self._failed_syncs += 1
                failure = error
                # Its positions were not persisted: tried again at the next tick (a full disk
                # with space back), not in a busy loop.
                self._retry.add(state)
            state.resolve(gen, error)
        if self._on_health is not None and (jobs or metadata is not None):
            self._on_health(None if failure is None else f"sync failed: {failure}")
        self._round_done.set()
        self._round_done = trio.Event()
