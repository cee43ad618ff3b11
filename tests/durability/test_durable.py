"""``--durable`` in process: OK after fsync, failures, crash snapshots, restarts.

Rules for this module (STYLE.md):
- Real ``LmqDaemon``\\ s in the test's nursery on 127.0.0.1 port 0 (``start_daemon``),
  ``data_path`` in ``tmp_path``; V2 clients (``tests.support.wire.Wire``). Real clock: the
  daemon's fsyncs run in worker threads, and a publisher's ``OK`` waits for them, which a jumping
  clock would reorder with heartbeats.
- Faults are injected by wrapping ``os.fsync`` (the ``fsync`` fixture) / ``os.pwrite`` (the
  calls a full or failing disk fails); holding the worker thread's fsyncs shows what waits for
  them. The event-loop thread (opening a queue) is never held or failed.
- A ``kill -9`` is simulated by copying the data directory from the event-loop thread between two
  steps of the daemon (an instant at which no worker thread is running): the copy is exactly what
  the OS would hold if the process died there. A new daemon on the copy is the restart.
- Every test has a ``fail_after`` guard.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from lmqd.engine.backend import BackendError, LazyBackend
from lmqd.protocol import Error, Response
from lmqd.storage import DiskQueue
from tests.support.daemon import RunningDaemon, StartDaemon, eventually
from tests.support.faults import FsyncFault
from tests.support.http import HttpResult, http
from tests.support.wire import Connect, ConnectionClosed

TIMEOUT = 20
OK = Response(data=b"OK")


async def durable(
    start_daemon: StartDaemon, path: Path | None = None, **options: Any
) -> RunningDaemon:
    running = await start_daemon(path, durable=True, **options)
    await eventually(lambda: not running.broker.syncer.busy)
    return running


async def test_ok_is_sent_only_after_the_fsync(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect, fsync: FsyncFault
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await durable(start_daemon, tmp_path)
        producer = await connect(running.tcp)
        assert await producer.pub("t", b"first") == OK  # creates the topic
        await eventually(lambda: not running.broker.syncer.busy)
        fsync.hold = True
        await producer.send(b"PUB t\n\x00\x00\x00\x06second")
        await trio.to_thread.run_sync(fsync.held.wait, TIMEOUT)
        with trio.move_on_after(0.3) as waited:
            await producer.frame()
        assert waited.cancelled_caught, "OK sent before the fsync completed"
        fsync.hold = False
        fsync.released.set()
        assert await producer.frame() == OK


async def test_http_pub_answers_only_after_the_fsync(
    start_daemon: StartDaemon, tmp_path: Path, fsync: FsyncFault
) -> None:
    """/pub shares the durable path: its 200 OK, like a TCP OK, waits for the fsync."""
    with trio.fail_after(TIMEOUT):
        running = await durable(start_daemon, tmp_path, http=True)
        answers: list[HttpResult] = []

        async def post() -> None:
            answers.append(await http(running.http, "POST", "/pub?topic=h", b"body"))

        async with trio.open_nursery() as posts:
            posts.start_soon(post)  # creates the topic (and its queue)
        assert (answers[0].status, answers[0].body) == (200, b"OK")
        await eventually(lambda: not running.broker.syncer.busy)
        fsync.hold = True
        async with trio.open_nursery() as posts:
            posts.start_soon(post)
            await trio.to_thread.run_sync(fsync.held.wait, TIMEOUT)
            await trio.sleep(0.3)
            assert len(answers) == 1, "/pub answered before the fsync completed"
            fsync.hold = False
            fsync.released.set()
        assert (answers[1].status, answers[1].body) == (200, b"OK")
        assert running.broker.topics["h"].depth == 2


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (b"PUB t\n\x00\x00\x00\x01x", "E_PUB_FAILED"),
        (b"MPUB t\n\x00\x00\x00\x09\x00\x00\x00\x01\x00\x00\x00\x01x", "E_MPUB_FAILED"),
        (b"DPUB t 100\n\x00\x00\x00\x01x", "E_DPUB_FAILED"),
    ],
)
async def test_failed_fsync_fails_the_publish_and_health_recovers(
    start_daemon: StartDaemon,
    tmp_path: Path,
    connect: Connect,
    fsync: FsyncFault,
    command: bytes,
    code: str,
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await durable(start_daemon, tmp_path)
        daemon = running.broker
        producer = await connect(running.tcp)
        assert await producer.pub("t", b"stored") == OK
        await eventually(lambda: not daemon.syncer.busy)
        fsync.fail = True
        await producer.send(command)
        error = await producer.error()
        assert error.code == code
        kind = code.split("_")[1]
        assert error.text == f"{kind} failed [Errno 5] Input/output error"
        with pytest.raises(ConnectionClosed):  # fatal, as nsqd's E_PUB_FAILED
            await producer.frame()
        assert daemon.health.startswith("NOK - sync failed")
        fsync.fail = False
        again = await connect(running.tcp)
        assert await again.pub("t", b"after") == OK
        assert daemon.health == "OK"
        consumer = await connect(running.tcp)
        await consumer.sub("t", "c", rdy=10)
        bodies = set()
        with trio.move_on_after(0.5):
            while True:
                bodies.add((await consumer.message()).body)
        # Nothing stored was lost; the failed one may be delivered too (it was never OK'd).
        assert {b"stored", b"after"} <= bodies <= {b"stored", b"after", b"x"}


async def test_failed_write_answers_at_once_and_loses_nothing_stored(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await durable(start_daemon, tmp_path)
        producer = await connect(running.tcp)
        assert await producer.pub("t", b"stored") == OK
        real_pwrite = os.pwrite
        full = True

        def pwrite(fd: int, data: Any, offset: int) -> int:
            if full:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", pwrite)
        error = await producer.pub("t", b"lost")
        assert isinstance(error, Error) and error.code == "E_PUB_FAILED"
        assert "No space left on device" in error.text
        assert running.broker.health.startswith("NOK - ")
        full = False
        again = await connect(running.tcp)
        assert await again.pub("t", b"after") == OK
        assert running.broker.health == "OK"
        consumer = await connect(running.tcp)
        await consumer.sub("t", "c", rdy=10)
        assert [(await consumer.message()).body for _ in range(2)] == [b"stored", b"after"]


def snapshot(source: Path, target: Path) -> None:
    """What the OS holds for the data directory right now (the daemon's state at a kill -9)."""
    shutil.copytree(source, target)


async def test_kill9_snapshot_keeps_every_ok_and_every_unfinished_message(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    with trio.fail_after(TIMEOUT):
        live = tmp_path / "live"
        running = await durable(start_daemon, live, sync_timeout=60.0)
        daemon = running.broker
        consumer = await connect(running.tcp, msg_timeout=60000)
        await consumer.sub("t", "c", rdy=20)
        other = await connect(running.tcp)
        await other.sub("t", "d")  # a second channel, never read: it must hold everything
        producer = await connect(running.tcp)
        published = [b"m%03d" % i for i in range(200)]
        for i in range(0, 200, 20):
            assert await producer.mpub("t", published[i : i + 20]) == OK
        got = [await consumer.message() for _ in range(20)]
        await consumer.send(b"RDY 0\n")
        for m in got[:15]:
            await consumer.fin(m.id)
        finished = {m.body for m in got[:15]}
        in_flight = [m.body for m in got[15:]]
        await eventually(lambda: daemon.topics["t"].channels["c"].in_flight_count == 5)
        await eventually(lambda: not daemon.syncer.busy)
        snapshot(live, tmp_path / "crashed")  # no await: the event loop stands still

        restarted = await durable(start_daemon, tmp_path / "crashed")
        consumer = await connect(restarted.tcp)
        await consumer.sub("t", "c", rdy=300)
        delivered: list[bytes] = []
        with trio.move_on_after(1.0):
            while True:
                m = await consumer.message()
                delivered.append(m.body)
                await consumer.fin(m.id)
        # At least once: everything not finished, in flight included; finished ones may return.
        assert set(delivered) >= set(published) - finished
        assert set(in_flight) <= set(delivered)
        reader = await connect(restarted.tcp)
        await reader.sub("t", "d", rdy=300)
        on_d: set[bytes] = set()
        with trio.move_on_after(1.0):
            while True:
                m = await reader.message()
                on_d.add(m.body)
                await reader.fin(m.id)
        assert on_d == set(published)
        await running.stop()


async def test_clean_restart_delivers_exactly_the_unfinished_messages(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    with trio.fail_after(TIMEOUT):
        first = await durable(start_daemon, tmp_path)
        consumer = await connect(first.tcp, msg_timeout=60000)
        await consumer.sub("t", "c", rdy=5)
        producer = await connect(first.tcp)
        published = [b"m%d" % i for i in range(10)]
        assert await producer.mpub("t", published) == OK
        got = [await consumer.message() for _ in range(5)]
        await consumer.send(b"RDY 0\n")
        for m in got[:3]:
            await consumer.fin(m.id)
        await consumer.req(got[3].id, 60_000)  # deferred a minute
        assert await producer.dpub("t", 60_000, b"later") == OK
        channel = first.broker.topics["t"].channels["c"]
        await eventually(lambda: channel.deferred_count == 2 and channel.in_flight_count == 1)
        await first.stop()

        second = await durable(start_daemon, tmp_path)
        channel = second.broker.topics["t"].channels["c"]
        # The in-flight one, at shutdown:
        assert isinstance(channel.sources.backend.stored, DiskQueue)
        assert channel.deferred_count == 2  # read back from the deferred store at start-up
        consumer = await connect(second.tcp)
        await consumer.sub("t", "c", rdy=20)
        delivered = []
        with trio.move_on_after(1.0):
            while True:
                m = await consumer.message()
                delivered.append((m.body, m.attempts))
                await consumer.fin(m.id)
        # Exactly once each: FIN'd ones never, in-flight one again (attempt 2), the rest once;
        # the two deferred ones keep their deadline (a minute away) and are not due yet.
        assert sorted(delivered) == sorted([(b"m4", 2), *((b"m%d" % i, 1) for i in range(5, 10))])
        assert second.broker.topics["t"].channels["c"].deferred_count == 2
        assert second.broker.topics["t"].depth == 0


async def test_a_requeue_the_store_refuses_stays_in_the_log_for_that_channel_only(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await durable(start_daemon, tmp_path, sync_timeout=0.2)
        daemon = running.broker
        ok_reader = await connect(running.tcp, heartbeat_interval=30000)
        await ok_reader.sub("t", "ok", rdy=10)
        bad_reader = await connect(running.tcp, heartbeat_interval=30000)
        await bad_reader.sub("t", "bad", rdy=10)
        bad = daemon.topics["t"].channels["bad"]
        assert bad.cursor is not None and isinstance(bad.sources.backend, LazyBackend)
        store = bad.sources.backend.opened()  # its own store: opened when first written, here now
        real_put = store.put_many
        failing = True

        def put_many(messages: Any) -> None:
            if failing:
                raise BackendError("DISKQUEUE(t:bad): write failed: disk full")
            real_put(messages)

        monkeypatch.setattr(store, "put_many", put_many)
        producer = await connect(running.tcp)
        assert await producer.mpub("t", [b"a", b"b"]) == OK
        for m in [await ok_reader.message() for _ in range(2)]:
            await ok_reader.fin(m.id)
        first, second = [await bad_reader.message() for _ in range(2)]
        await bad_reader.fin(second.id)
        # A REQ moves a message to the channel's own store; that write fails: it is held in
        # memory, and the log keeps it for this channel (unsettled), nothing lost.
        await bad_reader.req(first.id, 0)
        await eventually(lambda: daemon.health.startswith("NOK"))
        again = await bad_reader.message()
        assert (again.body, again.attempts) == (b"a", 2)
        assert bad.cursor.unsettled_count == 1
        failing = False
        await bad_reader.req(again.id, 0)  # stored now: the log lets it go once synced
        await eventually(lambda: bad.cursor is not None and bad.cursor.unsettled_count == 0)
        last = await bad_reader.message()
        assert (last.body, last.attempts) == (b"a", 3)
        await bad_reader.fin(last.id)
        await eventually(lambda: daemon.health == "OK")
        with trio.move_on_after(0.3):
            extra = await ok_reader.frame()
            pytest.fail(f"channel 'ok' got a message twice: {extra}")


async def test_deferred_messages_are_due_on_time_behind_a_backlog(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await durable(start_daemon, tmp_path, sync_timeout=0.1)
        consumer = await connect(running.tcp, msg_timeout=60000)
        await consumer.sub("t", "c", rdy=1)
        producer = await connect(running.tcp)
        assert await producer.mpub("t", [b"backlog%d" % i for i in range(500)]) == OK
        assert await producer.dpub("t", 300, b"soon") == OK
        first = await consumer.message()
        channel = running.broker.topics["t"].channels["c"]
        cursor = channel.cursor
        assert cursor is not None
        await eventually(lambda: channel.deferred_count == 1)  # pushed by the topic's pump
        await consumer.req(first.id, 60_000)  # a long REQ: moved to the deferred store
        await eventually(lambda: channel.deferred_count == 2)
        second = await consumer.message()
        assert second.body == b"backlog1"
        # Once the deferred store's copy is synced, only what is in flight holds the log.
        await eventually(lambda: cursor.unsettled_count == 1)
        await trio.sleep(0.4)
        await consumer.fin(second.id)
        third = await consumer.message()
        assert third.body == b"soon"  # due: ahead of the 498 still on disk


async def test_kill9_with_a_held_message_loses_nothing_and_old_segments_go(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    """One message held in flight must not keep the log: it is copied to the channel's store
    and the segments every channel passed are deleted; a kill -9 then loses nothing."""
    with trio.fail_after(TIMEOUT):
        live = tmp_path / "live"
        running = await durable(
            start_daemon, live, sync_timeout=0.05, max_bytes_per_file=2048, msg_timeout=3.0
        )
        holder = await connect(running.tcp, msg_timeout=3000)
        await holder.sub("t", "a", rdy=1)
        other = await connect(running.tcp)
        await other.sub("t", "b", rdy=50)
        producer = await connect(running.tcp)
        published = [b"message %03d " % i + b"x" * 40 for i in range(120)]
        assert await producer.mpub("t", published[:1]) == OK
        held = await holder.message()  # never FIN'd: in flight across everything below
        for i in range(1, 120, 20):
            assert await producer.mpub("t", published[i : i + 20]) == OK
        await holder.send(b"RDY 50\n")
        finished = {b"a": {held.body}, b"b": set()}
        for wire, channel, count in ((holder, b"a", 119), (other, b"b", 120)):
            for _ in range(count):
                m = await wire.message()
                await wire.fin(m.id)
                finished[channel].add(m.body)
        assert finished == {b"a": set(published), b"b": set(published)}
        log = running.broker.topics["t"].log
        assert log is not None
        await eventually(lambda: log.earliest_offset > 0)  # the held message's segment went
        await eventually(lambda: not running.broker.syncer.busy)
        snapshot(live, tmp_path / "crashed")  # kill -9 here

        restarted = await durable(start_daemon, tmp_path / "crashed")
        holder = await connect(restarted.tcp)
        await holder.sub("t", "a", rdy=200)
        while True:  # FINs after the last sync may come back first (at-least-once)
            again = await holder.message()
            await holder.fin(again.id)
            if again.body == held.body:  # due at once after the restart (as from the log)
                break
        assert again.attempts == 2
        await running.stop()


async def test_a_message_in_flight_at_a_kill9_comes_back_counting_that_delivery(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    with trio.fail_after(TIMEOUT):
        live = tmp_path / "live"
        running = await durable(start_daemon, live, sync_timeout=0.05)
        consumer = await connect(running.tcp, msg_timeout=60000)
        await consumer.sub("t", "c", rdy=1)
        producer = await connect(running.tcp)
        assert await producer.pub("t", b"first") == OK
        first = await consumer.message()
        assert first.attempts == 1
        assert await producer.pub("t", b"second") == OK  # a sync: it records the read too
        log = running.broker.topics["t"].log
        assert log is not None
        await eventually(lambda: log.dirty_count == 0 and not running.broker.syncer.busy)
        snapshot(live, tmp_path / "crashed")  # kill -9 with "first" in flight

        restarted = await durable(start_daemon, tmp_path / "crashed")
        consumer = await connect(restarted.tcp)
        await consumer.sub("t", "c", rdy=2)
        got = {(m.body, m.attempts) for m in [await consumer.message() for _ in range(2)]}
        assert got == {(b"first", 2), (b"second", 1)}
        await running.stop()


async def test_a_new_channels_ok_waits_for_its_start_to_be_fsynced(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect, fsync: FsyncFault
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await durable(start_daemon, tmp_path, http=True)
        producer = await connect(running.tcp)
        assert await producer.pub("t", b"first") == OK
        await eventually(lambda: not running.broker.syncer.busy)
        fsync.hold = True
        consumer = await connect(running.tcp)
        await consumer.send(b"SUB t new\n")
        await trio.to_thread.run_sync(fsync.held.wait, TIMEOUT)
        with trio.move_on_after(0.3) as waited:
            await consumer.frame()
        assert waited.cancelled_caught, "SUB's OK sent before the channel's start was fsynced"
        answers: list[HttpResult] = []

        async def create() -> None:
            answers.append(await http(running.http, "POST", "/channel/create?topic=t&channel=h"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create)
            await trio.sleep(0.3)
            assert answers == [], "/channel/create answered before the fsync"
            fsync.hold = False
            fsync.released.set()
        assert await consumer.frame() == OK
        assert answers[0].status == 200


async def test_after_a_crash_a_new_channel_gets_nothing_handed_on_before_it_existed(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    with trio.fail_after(TIMEOUT):
        live = tmp_path / "live"
        running = await durable(start_daemon, live, sync_timeout=60.0, http=True)
        reader = await connect(running.tcp)
        await reader.sub("t", "c")
        assert (await http(running.http, "POST", "/topic/pause?topic=t")).status == 200
        producer = await connect(running.tcp)
        assert await producer.mpub("t", [b"old%d" % i for i in range(20)]) == OK
        # The pump hands them on after their sync: the topic's position in the log is not
        # fsynced past them (no periodic sync for a minute).
        assert (await http(running.http, "POST", "/topic/unpause?topic=t")).status == 200
        await eventually(lambda: running.broker.topics["t"].depth == 0)
        late = await connect(running.tcp)
        await late.sub("t", "late")
        await eventually(lambda: not running.broker.syncer.busy)
        snapshot(live, tmp_path / "crashed")  # kill -9 right after the OK

        restarted = await durable(start_daemon, tmp_path / "crashed")
        late = await connect(restarted.tcp)
        await late.sub("t", "late", rdy=100)
        producer = await connect(restarted.tcp)
        assert await producer.pub("t", b"after") == OK
        got: list[bytes] = []
        with trio.move_on_after(1.0):
            while True:
                m = await late.message()
                got.append(m.body)
                await late.fin(m.id)
        assert got == [b"after"]
        await running.stop()
