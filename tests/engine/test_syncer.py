"""The syncer (``lmqd.engine.syncer``): group commit, generations, schedules, failures, metadata.

Rules for this module (STYLE.md):
- Unit tests drive a real ``Syncer`` over ``FakeQueue``\\ s on pytest-trio's ``autojump_clock``
  and assert exact virtual times. A ``FakeQueue`` is a ``StoredQueue`` whose activity the test
  sets (``write``) and whose ``prepare_sync`` hands out real ``SyncJob``\\ s: no data file, a
  positions file in ``tmp_path`` -- or in a directory that does not exist, when ``broken``, so
  that the sync fails as a disk would. The metadata file is real too.
- The ``worker`` fixture stands in for the worker thread: ``trio.to_thread.run_sync`` runs the
  round's blocking half in the event loop after ``ROUND_S`` of virtual time, so a round has a
  known duration, and can be held (``worker.hold``) to show what arrives during a round. (A real
  thread would let the autojump clock move while it runs.)
- The tests "through a daemon" run a real ``LmqDaemon`` (``start_daemon``) on the real clock,
  with the ``fsync`` fault fixture; each has a ``fail_after`` guard.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from lmqd.engine.syncer import FSYNC_BUCKETS, MAX_GATHER, METADATA_MIN_INTERVAL, Syncer
from lmqd.message import Message
from lmqd.storage import Metadata, SyncJob
from lmqd.storage.sync import QueueFiles
from tests.support.daemon import StartDaemon, eventually
from tests.support.faults import FsyncFault
from tests.support.wire import OK, Connect

T = TypeVar("T")

ROUND_S = 0.008
"""Virtual duration of every round's worker-thread call (``worker`` fixture): longer than
``MAX_GATHER``, and inside one bucket of ``FSYNC_BUCKETS`` (5-10 ms), off its bounds."""

LONG_S = 3600.0
"""A ``--sync-timeout`` no test reaches: no tick interferes unless the test wants one."""

GUARD_S = 60.0
"""Guard of the unit tests, in virtual seconds: past the longest test's span (~15 s), so a round
that never ends fails the test at once instead of hanging it (the clock jumps to the guard)."""

TIMEOUT = 20
"""Guard of the tests through a daemon (real clock)."""


# -- fakes -----------------------------------------------------------------------------------


class FakeQueue:
    """A ``StoredQueue``: its activity is what the test says, its syncs are real ``SyncJob``\\ s."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.ack_mode = False
        self.closed = False
        self.dirty_count = 0
        self.bytes_on_disk = 0
        self.broken = False
        """The next syncs fail: their positions file goes to a directory that does not exist."""
        self.prepare_error: OSError | None = None
        """``prepare_sync`` raises this (a failed ``dup()``, say)."""
        self.prepared = 0
        """``prepare_sync`` calls that returned a job."""
        self._files = QueueFiles(name, str(directory), str(directory / f"{name}.positions"))
        missing = directory / "missing"
        self._broken_files = QueueFiles(name, str(missing), str(missing / f"{name}.positions"))
        self._last_files: QueueFiles | None = None

    @property
    def stored(self) -> FakeQueue:
        return self

    @property
    def depth(self) -> int:
        return 0

    def write(self, operations: int = 1) -> None:
        """Reads, writes or acknowledgements that the next sync makes durable."""
        self.dirty_count += operations

    def prepare_sync(self) -> SyncJob | None:
        if self.prepare_error is not None:
            raise self.prepare_error
        last = self._last_files
        if not self.dirty_count and (last is None or last.persisted_seq >= last.last_seq):
            return None  # as the real queues: a job whose positions were not persisted again
        files = self._last_files = self._broken_files if self.broken else self._files
        seq = files.next_seq()
        operations, self.dirty_count = self.dirty_count, 0
        self.prepared += 1
        return SyncJob(files, seq, [], b"positions %d" % seq, [], operations)

    def ack_messages(self, messages: Sequence[Message]) -> int:
        return 0

    def put_many(self, messages: Sequence[Message]) -> None:
        self.write(len(messages))

    def read_many(self, max_count: int) -> list[Message]:
        return []

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True


class Worker:
    """Stands in for ``trio.to_thread.run_sync``: ``ROUND_S`` of virtual time, then the call."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        """When each call started."""
        self.hold = False
        """Calls wait for ``release()`` (after their ``ROUND_S``)."""
        self._released = trio.Event()
        self._called = trio.Event()

    async def run_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self.calls.append(trio.current_time())
        self._called.set()
        await trio.sleep(ROUND_S)
        if self.hold:
            await self._released.wait()
        return fn(*args)

    async def wait_calls(self, count: int) -> None:
        """Wait until ``count`` calls have started in all."""
        while len(self.calls) < count:
            self._called = trio.Event()
            await self._called.wait()

    def release(self) -> None:
        self.hold = False
        self._released.set()
        self._released = trio.Event()


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Worker:
    fake = Worker()
    monkeypatch.setattr(trio.to_thread, "run_sync", fake.run_sync)
    return fake


class Waiter:
    """A ``DurableCallback`` that records when it was called and with what."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, OSError | None]] = []

    def __call__(self, error: OSError | None) -> None:
        self.calls.append((trio.current_time(), error))

    @property
    def done(self) -> bool:
        return bool(self.calls)


class Health:
    """The ``on_health`` callback: every report, in order."""

    def __init__(self) -> None:
        self.reports: list[str | None] = []

    def __call__(self, problem: str | None) -> None:
        self.reports.append(problem)


class Snapshots:
    """The ``metadata`` callable: counts the snapshots taken."""

    def __init__(self) -> None:
        self.taken = 0

    def __call__(self) -> Metadata:
        self.taken += 1
        return Metadata()


def make_syncer(
    tmp_path: Path,
    *,
    sync_every: int = 1000,
    sync_timeout: float = LONG_S,
    health: Health | None = None,
    snapshots: Snapshots | None = None,
    metadata_file: Path | None = None,
) -> Syncer:
    return Syncer(
        sync_every=sync_every,
        sync_timeout=sync_timeout,
        metadata_file=str(metadata_file or tmp_path / "lmqd.dat"),
        metadata=snapshots or Snapshots(),
        on_health=health,
    )


async def started(nursery: trio.Nursery, syncer: Syncer) -> float:
    """Start the syncer's task; the time it started."""
    await nursery.start(syncer.run)
    return trio.current_time()


# -- group commit ----------------------------------------------------------------------------


async def test_one_round_serves_every_waiter_registered_before_it(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path)
        t0 = await started(nursery, syncer)
        queues = [FakeQueue(f"q{i}", tmp_path) for i in range(5)]
        waiters = []
        for queue in queues:
            for _ in range(4):  # four publishers per queue
                queue.write()
                waiter = Waiter()
                syncer.when_durable(queue, waiter)
                waiters.append(waiter)
        assert syncer.busy
        await syncer.wait_idle()
        assert worker.calls == [t0]
        assert all(w.calls == [(t0 + ROUND_S, None)] for w in waiters)
        stats = syncer.statistics()
        assert (stats.rounds, stats.queue_syncs, stats.failed_syncs) == (1, 5, 0)
        assert [q.prepared for q in queues] == [1] * 5
        assert not syncer.busy


async def test_waiters_arriving_during_a_round_share_the_next_one(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path)
        t0 = await started(nursery, syncer)
        queue = FakeQueue("q", tmp_path)
        first = Waiter()
        queue.write()
        syncer.when_durable(queue, first)
        await worker.wait_calls(1)
        worker.hold = True
        late = []
        for _ in range(20):  # while round 1 runs in the "thread"
            queue.write()
            waiter = Waiter()
            syncer.when_durable(queue, waiter)
            late.append(waiter)
        await trio.sleep(1.0)
        assert first.calls == [] and not any(w.done for w in late)  # round 1 is held
        released = trio.current_time()
        worker.release()
        await syncer.wait_idle()
        assert first.calls == [(released, None)]
        # Round 2 started as round 1 returned; it had gathered all 20: one call for them all.
        assert worker.calls == [t0, released]
        assert all(w.calls == [(released + ROUND_S, None)] for w in late)
        assert syncer.statistics().rounds == 2


    # -- generations -----------------------------------------------------------------------------


async def test_a_waiter_registered_during_a_round_is_resolved_by_the_next(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path)
        t0 = await started(nursery, syncer)
        queue = FakeQueue("q", tmp_path)
        a, b = Waiter(), Waiter()
        queue.write()
        syncer.when_durable(queue, a)
        await trio.sleep(ROUND_S / 2)  # round 1 prepared a's write and runs
        queue.write()  # written after round 1's prepare: not covered by it
        syncer.when_durable(queue, b)
        await syncer.wait_idle()
        assert a.calls == [(t0 + ROUND_S, None)]
        assert b.calls == [(t0 + ROUND_S + ROUND_S, None)]
        assert queue.prepared == 2


async def test_waiters_are_resolved_in_order_and_a_callback_may_wait_again(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path)
        t0 = await started(nursery, syncer)
        queue = FakeQueue("q", tmp_path)
        order: list[str] = []
        again = Waiter()

        def first(error: OSError | None) -> None:
            order.append("first")
            queue.write()
            syncer.when_durable(queue, again)  # a later generation: the next round

        def broken(error: OSError | None) -> None:
            order.append("broken")
            raise RuntimeError("a callback that fails")

        queue.write()
        syncer.when_durable(queue, first)
        syncer.when_durable(queue, broken)
        syncer.when_durable(queue, lambda error: order.append("third"))
        await syncer.wait_idle()
        assert order == ["first", "broken", "third"]  # the failing callback stopped nothing
        # The next round: it first gathers (the last one served three, this one has one waiter).
        assert again.calls == [(t0 + ROUND_S + MAX_GATHER + ROUND_S, None)]


async def test_a_waiter_with_nothing_written_is_resolved_without_a_sync(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path)
        t0 = await started(nursery, syncer)
        waiter = Waiter()
        syncer.when_durable(FakeQueue("clean", tmp_path), waiter)
        await syncer.wait_idle()
        assert waiter.calls == [(t0, None)]
        assert worker.calls == []
        assert syncer.statistics().rounds == 0


async def test_a_closed_queue_resolves_its_waiters_and_is_dropped(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path, sync_every=1, sync_timeout=2.0)
        t0 = await started(nursery, syncer)
        queue = FakeQueue("q", tmp_path)
        queue.write()
        waiter = Waiter()
        syncer.when_durable(queue, waiter, urgent=False)
        queue.close()  # close syncs by itself; delete drops the messages anyway
        await trio.sleep(2.5)
        assert waiter.calls == [(t0 + 2.0, None)]
        assert queue.prepared == 0 and worker.calls == []
        queue.write()  # past --sync-every, but a closed queue is no longer looked after
        syncer.note_dirty(queue)
        await trio.sleep(2.0)
        assert queue.prepared == 0


    # -- schedules: --sync-every, --sync-timeout -------------------------------------------------


async def test_sync_every_starts_a_round_at_once(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path, sync_every=3)
        await started(nursery, syncer)
        queue = FakeQueue("q", tmp_path)
        syncer.register(queue)
        waiter = Waiter()
        syncer.when_durable(queue, waiter, urgent=False)
        queue.write(2)
        syncer.note_dirty(queue)
        await trio.sleep(10.0)
        assert worker.calls == [] and not waiter.done  # below --sync-every, no tick yet
        queue.write()
        reached = trio.current_time()
        syncer.note_dirty(queue)
        await trio.sleep(1.0)
        assert worker.calls == [reached]
        assert waiter.calls == [(reached + ROUND_S, None)]
        assert queue.prepared == 1 and queue.dirty_count == 0


async def test_sync_timeout_tick_syncs_every_queue_with_activity(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path, sync_timeout=2.0)
        t0 = await started(nursery, syncer)
        busy, idle = FakeQueue("busy", tmp_path), FakeQueue("idle", tmp_path)
        syncer.register(busy)
        syncer.register(idle)
        busy.write()
        waiter = Waiter()
        syncer.when_durable(busy, waiter, urgent=False)
        await trio.sleep(1.0)
        assert worker.calls == []  # not urgent, below --sync-every: waits for the tick
        await trio.sleep(1.5)
        assert worker.calls == [t0 + 2.0]
        assert waiter.calls == [(t0 + 2.0 + ROUND_S, None)]
        assert (busy.prepared, idle.prepared) == (1, 0)  # a clean queue costs no sync
        busy.write()  # t0 + 2.5: the next tick is 2 s after the last one
        await trio.sleep(2.0)
        assert worker.calls == [t0 + 2.0, t0 + 4.0]
        assert busy.prepared == 2
        await trio.sleep(10.0)
        assert len(worker.calls) == 2  # nothing written since: the ticks find nothing to do


    # -- failures and health ---------------------------------------------------------------------


async def test_a_failed_sync_calls_back_with_the_error_and_reports_health(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        health = Health()
        syncer = make_syncer(tmp_path, health=health)
        t0 = await started(nursery, syncer)
        bad, good = FakeQueue("bad", tmp_path), FakeQueue("good", tmp_path)
        bad.broken = True
        on_bad, on_good = Waiter(), Waiter()
        bad.write()
        good.write()
        syncer.when_durable(bad, on_bad)
        syncer.when_durable(good, on_good)
        await syncer.wait_idle()
        ((when, error),) = on_bad.calls
        assert when == t0 + ROUND_S and isinstance(error, FileNotFoundError)
        assert on_good.calls == [(t0 + ROUND_S, None)]  # one queue's failure stops no other
        assert health.reports == [f"sync failed: {error}"]
        assert syncer.statistics().failed_syncs == 1
        bad.broken = False
        retried = []
        for queue in (bad, good):  # as many waiters as last time: the round does not gather
            queue.write()
            retried.append(Waiter())
            syncer.when_durable(queue, retried[-1])
        await syncer.wait_idle()
        assert all(w.calls == [(t0 + ROUND_S + ROUND_S, None)] for w in retried)
        assert health.reports == [f"sync failed: {error}", None]  # healthy again


async def test_a_failed_sync_is_retried_at_the_next_tick_without_new_activity(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    # A full disk: the positions could not be written; once space is back the next tick
    # writes them (and clears the health error) though nothing new happened to the queue.
    with trio.fail_after(GUARD_S):
        health = Health()
        syncer = make_syncer(tmp_path, sync_timeout=2.0, health=health)
        t0 = await started(nursery, syncer)
        queue = FakeQueue("q", tmp_path)
        syncer.register(queue)
        queue.broken = True
        queue.write()
        await trio.sleep(2.5)
        assert worker.calls == [t0 + 2.0]
        assert len(health.reports) == 1 and health.reports[0] is not None
        await trio.sleep(2.0)
        assert worker.calls == [t0 + 2.0, t0 + 4.0]  # tried again at the tick, still failing
        queue.broken = False
        await trio.sleep(2.0)
        assert worker.calls == [t0 + 2.0, t0 + 4.0, t0 + 6.0]
        assert health.reports[-1] is None
        assert (tmp_path / "q.positions").exists()
        await trio.sleep(4.0)
        assert len(worker.calls) == 3  # persisted: nothing more to do


async def test_probe_on_tick_writes_the_metadata_file_once_at_the_next_tick(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        health = Health()
        snapshots = Snapshots()
        syncer = make_syncer(tmp_path, sync_timeout=2.0, health=health, snapshots=snapshots)
        t0 = await started(nursery, syncer)
        for _ in range(3):  # an unhealthy daemon asks after every failed write
            syncer.probe_on_tick()
        await trio.sleep(1.0)
        assert worker.calls == []  # not at once: at the tick, whatever the number of asks
        await trio.sleep(1.5)
        assert worker.calls == [t0 + 2.0] and snapshots.taken == 1
        assert health.reports == [None]  # the write succeeded: healthy
        await trio.sleep(4.0)
        assert len(worker.calls) == 1  # not asked again: no more probes


async def test_a_failed_prepare_fails_its_waiters_and_the_round_goes_on(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path)
        t0 = await started(nursery, syncer)
        bad, good = FakeQueue("bad", tmp_path), FakeQueue("good", tmp_path)
        too_many = OSError(24, "Too many open files")
        bad.prepare_error = too_many
        on_bad, on_good = Waiter(), Waiter()
        bad.write()
        good.write()
        syncer.when_durable(bad, on_bad)
        syncer.when_durable(good, on_good)
        await syncer.wait_idle()
        assert on_bad.calls == [(t0, too_many)]  # at once: nothing to wait for
        assert on_good.calls == [(t0 + ROUND_S, None)]
        stats = syncer.statistics()
        assert (stats.rounds, stats.queue_syncs, stats.failed_syncs) == (1, 1, 1)


    # -- the metadata file -----------------------------------------------------------------------


async def test_metadata_changes_coalesce_into_one_write(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        snapshots = Snapshots()
        syncer = make_syncer(tmp_path, snapshots=snapshots)
        t0 = await started(nursery, syncer)
        for _ in range(50):  # a burst of topic and channel creations
            syncer.metadata_changed()
        await worker.wait_calls(1)
        syncer.metadata_changed()  # during the round: its snapshot was taken before
        await syncer.wait_idle()
        # The second write waits for METADATA_MIN_INTERVAL after the first one started.
        assert worker.calls == [t0, t0 + max(ROUND_S, METADATA_MIN_INTERVAL)]
        assert snapshots.taken == 2
        assert syncer.statistics().metadata_writes == 2
        assert json.loads((tmp_path / "lmqd.dat").read_text())["topics"] == []


async def test_a_failed_metadata_write_is_retried_at_the_next_tick(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        health = Health()
        snapshots = Snapshots()
        directory = tmp_path / "data"
        syncer = make_syncer(
            tmp_path,
            sync_timeout=2.0,
            health=health,
            snapshots=snapshots,
            metadata_file=directory / "lmqd.dat",
        )
        t0 = await started(nursery, syncer)
        syncer.metadata_changed()  # the directory does not exist yet: the write fails
        await syncer.wait_idle()
        assert len(health.reports) == 1 and health.reports[0] is not None
        assert health.reports[0].startswith("sync failed: ")
        assert syncer.statistics().metadata_writes == 0
        await trio.sleep(1.5)
        assert snapshots.taken == 1  # not retried in a busy loop
        directory.mkdir()
        await trio.sleep(1.0)
        assert worker.calls == [t0, t0 + 2.0]  # retried at the tick
        assert snapshots.taken == 2
        assert syncer.statistics().metadata_writes == 1
        assert health.reports[-1] is None
        assert (directory / "lmqd.dat").exists()


    # -- gathering, statistics, wait_idle --------------------------------------------------------


async def test_a_round_gathers_as_many_publishers_as_the_last_one_served(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path)
        await started(nursery, syncer)
        queue = FakeQueue("q", tmp_path)

        def publish() -> Waiter:
            queue.write()
            waiter = Waiter()
            syncer.when_durable(queue, waiter)
            return waiter

        for _ in range(3):
            publish()
        await syncer.wait_idle()  # that round served 3 and took ROUND_S
        # One publisher alone: the round waits (at most MAX_GATHER, shorter than ROUND_S) for 3.
        alone = trio.current_time()
        lone = publish()
        await syncer.wait_idle()
        assert worker.calls[-1] == alone + MAX_GATHER
        assert lone.calls == [(alone + MAX_GATHER + ROUND_S, None)]
        # The round that served 1 asks for 1: the next publisher does not wait at all.
        again = trio.current_time()
        publish()
        await syncer.wait_idle()
        assert worker.calls[-1] == again
        # After a round of 1, three arrive together: no wait either.
        for _ in range(3):
            publish()
        await syncer.wait_idle()
        # Three again, one now and two a little later: the round starts when the third arrives.
        first = trio.current_time()
        publish()
        await trio.sleep(MAX_GATHER / 5)
        publish()
        publish()
        await syncer.wait_idle()
        assert worker.calls[-1] == first + MAX_GATHER / 5


async def test_statistics_count_rounds_and_their_durations(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path)
        await started(nursery, syncer)
        queues = [FakeQueue(f"q{i}", tmp_path) for i in range(3)]
        for round_number in range(4):
            for queue in queues[: round_number % 3 + 1]:
                queue.write()
                syncer.when_durable(queue, Waiter())
            await syncer.wait_idle()
        stats = syncer.statistics()
        assert (stats.rounds, stats.queue_syncs, stats.metadata_writes) == (4, 1 + 2 + 3 + 1, 0)
        assert stats.fsync_seconds_total == pytest.approx(4 * ROUND_S)
        bucket = FSYNC_BUCKETS.index(0.01)  # the (5 ms, 10 ms] bucket
        assert FSYNC_BUCKETS[bucket - 1] < ROUND_S < FSYNC_BUCKETS[bucket]
        assert stats.fsync_bucket_counts[bucket] == 4
        assert sum(stats.fsync_bucket_counts) == stats.rounds


async def test_wait_idle_waits_for_urgent_work_only_while_the_syncer_runs(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, worker: Worker
) -> None:
    with trio.fail_after(GUARD_S):
        syncer = make_syncer(tmp_path)
        queue = FakeQueue("q", tmp_path)
        queue.write()
        syncer.when_durable(queue, Waiter())
        t0 = trio.current_time()
        await syncer.wait_idle()  # not started yet: nothing would do the work
        assert trio.current_time() == t0 and syncer.busy
        async with trio.open_nursery() as nursery:
            worker.hold = True
            await nursery.start(syncer.run)  # round 1 serves the waiter at once, and is held
            await worker.wait_calls(1)
            syncer.metadata_changed()  # urgent work for round 2
            nursery.start_soon(release_after, worker, 5.0)
            await syncer.wait_idle()
            assert trio.current_time() == t0 + 5.0 + ROUND_S  # both rounds
            assert not syncer.busy
            await syncer.wait_idle()  # idle: at once
            assert trio.current_time() == t0 + 5.0 + ROUND_S
            nursery.cancel_scope.cancel()  # the syncer stops, as at the end of a shutdown
        queue.write()
        syncer.when_durable(queue, Waiter())
        assert syncer.busy
        await syncer.wait_idle()  # stopped: returns at once
        assert trio.current_time() == t0 + 5.0 + ROUND_S


async def release_after(worker: Worker, seconds: float) -> None:
    await trio.sleep(seconds)
    worker.release()


# -- through a daemon (real clock, real fsyncs) ----------------------------------------------


async def test_publishers_on_many_connections_share_fsyncs(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect, fsync: FsyncFault
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, durable=True)
        await eventually(lambda: not running.broker.syncer.busy)
        producers = [await connect(running.tcp) for _ in range(20)]
        for i, p in enumerate(producers[:2]):
            assert await p.pub(f"t{i}", b"warm-up") == OK
        await eventually(lambda: not running.broker.syncer.busy)
        before = running.broker.syncer.statistics().rounds
        fsync.hold = True
        for i, p in enumerate(producers):
            await p.send(b"PUB t%d\n\x00\x00\x00\x01x" % (i % 2))
        await trio.to_thread.run_sync(fsync.held.wait, TIMEOUT)
        await trio.sleep(0.2)  # every PUB has arrived while the first round is held
        fsync.hold = False
        fsync.released.set()
        for p in producers:
            assert await p.frame() == OK
        rounds = running.broker.syncer.statistics().rounds - before
        # The held round took the first publisher(s); every other one shared the next round.
        assert rounds <= 2, rounds


async def test_a_burst_of_creations_costs_few_metadata_writes(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        running = await start_daemon(tmp_path)
        syncer = running.broker.syncer
        await eventually(lambda: not syncer.busy)
        before = syncer.statistics().metadata_writes
        for i in range(50):
            running.broker.get_topic(f"burst{i}").get_channel("c")
        await eventually(lambda: not syncer.busy)
        writes = syncer.statistics().metadata_writes - before
        assert 1 <= writes <= 2  # one, or two if a round had started during the burst
        saved = json.loads((tmp_path / "lmqd.dat").read_text())
        assert len(saved["topics"]) == 50
        await running.stop()
