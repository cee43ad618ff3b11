"""What a ``kill -9`` of ``--durable`` gives back: held messages, replays, attempts (issue 30).

Rules for this module (STYLE.md):
- Real ``LmqDaemon``\\ s in the test's nursery on 127.0.0.1 port 0 (``start_daemon``),
  ``data_path`` in ``tmp_path``; V2 clients (``tests.support.wire.Wire``). Real clock: fsyncs
  run in worker threads.
- A ``kill -9`` is a copy of the data directory taken from the event-loop thread between two
  steps of the daemon (no worker thread runs then): exactly what the OS would hold had the
  process died there. A new daemon on the copy is the restart.
- Every test has a ``fail_after`` guard; a wait for the daemon to settle is bounded and the
  assertion after it says what was wrong.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import trio

from lmqd.engine.channel import Channel
from tests.support.daemon import RunningDaemon, StartDaemon, eventually
from tests.support.wire import Connect, Wire

TIMEOUT = 30
HOLD_MS = 600_000
"""A holder's msg_timeout: ten minutes, far past every wait here."""


async def durable(start_daemon: StartDaemon, path: Path, **options: Any) -> RunningDaemon:
    running = await start_daemon(path, durable=True, **options)
    await eventually(lambda: not running.broker.syncer.busy)
    return running


def channel_of(running: RunningDaemon, topic: str = "t", name: str = "c") -> Channel:
    return running.broker.topics[topic].channels[name]


async def settled(running: RunningDaemon, held_offset: int, limit: float = 5.0) -> None:
    """Wait (at most ``limit`` seconds) until the channel's log mark has passed the held
    message and every sync has run: then the data directory holds what a crash keeps."""
    channel = channel_of(running)
    log = running.broker.topics["t"].log
    assert channel.cursor is not None and log is not None
    cursor = channel.cursor
    with trio.move_on_after(limit):
        await eventually(
            lambda: cursor.low > held_offset
            and log.dirty_count == 0
            and not running.broker.syncer.busy
        )


async def drain(wire: Wire, idle: float = 1.0) -> list[tuple[bytes, int]]:
    """(body, attempts) of everything delivered until nothing came for ``idle`` s; FIN'd."""
    got = []
    while True:
        with trio.move_on_after(idle) as quiet:
            m = await wire.message()
        if quiet.cancelled_caught:
            return got
        got.append((m.body, m.attempts))
        await wire.fin(m.id)


async def test_one_held_message_does_not_make_a_crash_replay_the_backlog(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    """The default 100 MiB segments: before, one message never finished kept the log's mark
    until the segment rolled, and each kill -9 replayed everything published since."""
    with trio.fail_after(TIMEOUT):
        live = tmp_path / "live"
        running = await durable(start_daemon, live, sync_every=500)
        holder = await connect(running.tcp, msg_timeout=HOLD_MS)
        await holder.sub("t", "c", rdy=1)
        producer = await connect(running.tcp)
        assert await producer.mpub("t", [b"held"])
        held = await holder.message()  # never answered
        worker = await connect(running.tcp)
        await worker.sub("t", "c", rdy=200)
        backlog = [b"m%05d" % i for i in range(6000)]
        for i in range(0, len(backlog), 200):
            assert await producer.mpub("t", backlog[i : i + 200])
        for _ in backlog:
            await worker.fin((await worker.message()).id)
        await settled(running, held_offset=0)
        shutil.copytree(live, tmp_path / "crashed")  # kill -9 here

        restarted = await durable(start_daemon, tmp_path / "crashed")
        reader = await connect(restarted.tcp)
        await reader.sub("t", "c", rdy=1000)
        again = await drain(reader)
        # At most what was in flight (the held message) and one sync window (--sync-every).
        assert (held.body, 2) in again
        assert len(again) <= 1 + 500, f"{len(again)} delivered again after the crash"
        await running.stop()


async def test_a_message_in_flight_when_the_log_rolls_comes_back_at_restart(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    """Copied out of the log's way while in flight, it used to be due at its deadline after a
    crash (up to --max-msg-timeout, 15 minutes); the log would have given it back at once."""
    with trio.fail_after(TIMEOUT):
        live = tmp_path / "live"
        running = await durable(start_daemon, live, max_bytes_per_file=2048, sync_timeout=0.1)
        holder = await connect(running.tcp, msg_timeout=HOLD_MS)
        await holder.sub("t", "c", rdy=1)
        producer = await connect(running.tcp)
        assert await producer.mpub("t", [b"held"])
        held = await holder.message()
        for i in range(0, 200, 20):  # several segments
            assert await producer.mpub("t", [b"x%03d" % j + b"." * 40 for j in range(i, i + 20)])
        worker = await connect(running.tcp)
        await worker.sub("t", "c", rdy=50)
        for _ in range(200):
            await worker.fin((await worker.message()).id)
        log = running.broker.topics["t"].log
        assert log is not None
        await eventually(lambda: log.earliest_offset > 0)  # copied: its segment went
        await settled(running, held_offset=0)
        shutil.copytree(live, tmp_path / "crashed")

        restarted = await durable(start_daemon, tmp_path / "crashed")
        reader = await connect(restarted.tcp)
        await reader.sub("t", "c", rdy=100)
        with trio.move_on_after(3) as late:
            while (await reader.message()).body != held.body:
                pass  # FINs after the last sync may come back first (at-least-once)
        assert not late.cancelled_caught, "the held message waits for its old deadline"
        await running.stop()


async def test_attempts_survive_a_crash(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    """A message delivered N times before kill -9 comes back with N + 1: one requeued twice
    (its copy read back from the channel's own store), one in flight from the log, and across
    a second crash before anything was read again."""
    with trio.fail_after(TIMEOUT):
        live = tmp_path / "live"
        running = await durable(start_daemon, live, sync_timeout=0.05)
        consumer = await connect(running.tcp, msg_timeout=HOLD_MS)
        await consumer.sub("t", "c", rdy=1)
        producer = await connect(running.tcp)
        assert await producer.mpub("t", [b"requeued", b"plain"])
        for attempt in (1, 2):
            m = await consumer.message()
            assert (m.body, m.attempts) == (b"requeued", attempt)
            await consumer.req(m.id, 0)
        m = await consumer.message()
        assert (m.body, m.attempts) == (b"requeued", 3)  # in flight from the own store
        await consumer.send(b"RDY 2\n")
        m = await consumer.message()
        assert (m.body, m.attempts) == (b"plain", 1)  # in flight from the log
        channel = channel_of(running)
        await eventually(lambda: channel.in_flight_count == 2)
        assert await producer.mpub("t", [b"sync"])  # a round that records the reads
        await eventually(lambda: not running.broker.syncer.busy)
        await trio.sleep(0.3)  # the own store's read position too (its sync timeout)
        await eventually(lambda: not running.broker.syncer.busy)
        shutil.copytree(live, tmp_path / "crashed")

        restarted = await durable(start_daemon, tmp_path / "crashed")
        await restarted.stop()  # a second crash (a restart that read nothing) keeps them too
        shutil.copytree(tmp_path / "crashed", tmp_path / "again")
        again = await durable(start_daemon, tmp_path / "again")
        reader = await connect(again.tcp)
        await reader.sub("t", "c", rdy=10)
        got = dict(await drain(reader))
        assert got.get(b"requeued") == 4 and got.get(b"plain") == 2, got
        await running.stop()
