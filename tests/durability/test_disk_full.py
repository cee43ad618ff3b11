"""A full disk: at shutdown (what fits is kept, the rest counted, exit status 3) and while running
(health, ``E_PUB_FAILED``, automatic recovery).

Rules for this module (STYLE.md):
- In process the disk fills through ``tests.support.diskquota.DiskQuota`` over ``os.pwrite``
  (the ``disk`` fixture; truncating or deleting files frees space, as on a real file system).
  A real ``python -m lmqd`` subprocess gets ``tests.support.smalldisk.open_small_disk``: the
  same quota around the subprocess, and in a second case a real 4 MiB tmpfs where one can be
  mounted (root), else the quota again: selected at run time, the same assertions either way.
- Daemons listen on 127.0.0.1 port 0 with their data in ``tmp_path``; clients speak V2
  (``tests.support.wire.Wire``) and HTTP (``tests.support.http``).
- A message counts as acknowledged only when its ``OK`` was read.
- Every test has a ``fail_after`` guard.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio

from lmqd.protocol import Error, Pub, Response
from lmqd.service import EXIT_MESSAGES_LOST
from tests.support.daemon import RunningDaemon, StartDaemon, eventually
from tests.support.diskquota import DiskQuota
from tests.support.faults import FsyncFault
from tests.support.http import http
from tests.support.process import DaemonProcess
from tests.support.smalldisk import open_small_disk
from tests.support.wire import Connect, Wire

OK = Response(data=b"OK")
TIMEOUT = 60.0

_LOST = re.compile(r"SHUTDOWN: (\d+) messages could not be written to disk and are lost \((.*)\)")
_QUEUE_LOST = re.compile(
    r"(TOPIC|CHANNEL)\(([^)]+)\): (\d+) of (\d+) messages could not be written at shutdown and "
    r"are lost \((\d+) kept\): .*No space left on device"
)


def address(text: str | None) -> tuple[str, int]:
    assert text is not None
    host, _, port = text.rpartition(":")
    return host, int(port)


async def drain(wire: Wire, expected: int) -> list[bytes]:
    """Read and FIN ``expected`` messages, then make sure no more come within half a second."""
    bodies = []
    for _ in range(expected):
        msg = await wire.message()
        bodies.append(msg.body)
        await wire.fin(msg.id)
    with trio.move_on_after(0.5):
        extra = await wire.frame()
        raise AssertionError(f"more than {expected} messages: {extra}")
    return bodies


# -- shutdown ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tmpfs", [False, True], ids=["quota", "tmpfs-if-mountable"])
async def test_sigterm_on_a_full_disk_keeps_what_fits_counts_the_rest_and_exits_3(
    tmp_path: Path, connect: Connect, tmpfs: bool
) -> None:
    sent = [b"m%05d:%s" % (i, b"x" * 60) for i in range(5000)]
    with open_small_disk(tmp_path, tmpfs=tmpfs) as disk:
        server = DaemonProcess(disk.command())
        try:
            await trio.to_thread.run_sync(server.wait_started)
            tcp = address(server.address("TCP"))
            with trio.fail_after(TIMEOUT):
                consumer = await connect(tcp)
                await consumer.sub("t", "c")
                producer = await connect(tcp)
                for i in range(0, len(sent), 500):
                    assert await producer.mpub("t", sent[i : i + 500]) == OK
                # 100 in flight at the signal: the channel writes them to its own store.
                await consumer.rdy(100)
                in_flight = [(await consumer.message()).body for _ in range(100)]
                assert in_flight == sent[:100]
                # Room for several hundred of the 5,000 messages (~100 bytes each on disk).
                disk.fill(80_000)
            code = await trio.to_thread.run_sync(server.stop)
        finally:
            server.terminate()
        output = server.output()
        assert code == EXIT_MESSAGES_LOST, f"{disk.kind}:\n{output}"
        assert "Traceback" not in output, output
        (summary,) = _LOST.findall(output)
        lost = int(summary[0])
        per_queue = dict(item.split(": ") for item in summary[1].split(", "))
        lines = {(m[1], int(m[2]), int(m[3]), int(m[4])) for m in _QUEUE_LOST.findall(output)}
        # Each queue's ERROR line agrees with the summary; the topic kept a part of its tail.
        assert {name: str(n) for name, n, _, _ in lines} == per_queue
        assert sum(int(n) for n in per_queue.values()) == lost
        (topic_line,) = [line for line in lines if line[0] == "t"]
        assert topic_line[3] > 0 and topic_line[1] > 0, topic_line  # some kept, some lost
        assert 0 < lost < len(sent)

        # Space is back: lmqd on the same directory delivers every message that was kept.
        disk.free()
        restarted = DaemonProcess(disk.command())
        try:
            await trio.to_thread.run_sync(restarted.wait_started)
            with trio.fail_after(TIMEOUT):
                consumer = await connect(address(restarted.address("TCP")))
                await consumer.sub("t", "c", rdy=500)
                got = await drain(consumer, len(sent) - lost)
            assert len(set(got)) == len(got), "duplicates"
            assert set(got) <= set(sent)
            assert set(in_flight) <= set(got)  # the channel's own store came first and fit
        finally:
            await trio.to_thread.run_sync(restarted.check_stop)


@pytest.mark.parametrize("tmpfs", [False, True], ids=["quota", "tmpfs-if-mountable"])
async def test_a_real_lmqd_on_a_full_disk_refuses_reports_and_recovers_by_itself(
    tmp_path: Path, connect: Connect, tmpfs: bool
) -> None:
    big = b"b" * 65536  # more than any page or two a file that shrinks may give back
    with open_small_disk(tmp_path, tmpfs=tmpfs) as disk:
        server = DaemonProcess(disk.command(["--mem-queue-size=0", "--sync-timeout=1s"]))
        try:
            await trio.to_thread.run_sync(server.wait_started)
            tcp, http_address = address(server.address("TCP")), address(server.address("HTTP"))
            with trio.fail_after(TIMEOUT):
                producer = await connect(tcp)
                acknowledged = [b"before-%d" % i for i in range(10)]
                for body in acknowledged:
                    assert await producer.pub("t", body) == OK
                disk.fill(0)
                answer = await producer.pub("t", big)
                assert isinstance(answer, Error) and answer.code == "E_PUB_FAILED", disk.kind
                assert "No space left on device" in answer.text
                r = await http(http_address, "GET", "/ping")
                assert r.status == 500 and r.body.startswith(b"NOK - "), r
                disk.free()
                await eventually_ok(http_address)  # the probe at the next tick: no publish
                again = await connect(tcp)
                assert await again.pub("t", big) == OK
                acknowledged.append(big)
                consumer = await connect(tcp)
                await consumer.sub("t", "c", rdy=100)
                assert await drain(consumer, len(acknowledged)) == acknowledged
        finally:
            await trio.to_thread.run_sync(server.check_stop)


# -- while running -------------------------------------------------------------------------------

MODES: dict[str, dict[str, Any]] = {
    # Memory first: a tail of 10, so the 11th unread message needs the log.
    "default": {"mem_queue_size": 10},
    "durable": {"durable": True},
}


async def ping(daemon: RunningDaemon | tuple[str, int]) -> tuple[int, bytes]:
    r = await http(daemon.http if isinstance(daemon, RunningDaemon) else daemon, "GET", "/ping")
    return r.status, r.body


async def health(running: RunningDaemon) -> str:
    stats = (await http(running.http, "GET", "/stats?format=json")).json()
    assert isinstance(stats["health"], str)
    return stats["health"]


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_a_full_disk_is_health_publishes_fail_and_service_resumes_when_space_returns(
    start_daemon: StartDaemon, connect: Connect, disk: DiskQuota, mode: str
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, **MODES[mode])
        producer = await connect(running.tcp)
        acknowledged = [b"before-%d" % i for i in range(20)]
        for body in acknowledged:
            assert await producer.pub("t", body) == OK
        assert await ping(running) == (200, b"OK")

        disk.fill()
        refused = []
        for command, code in (("pub", "E_PUB_FAILED"), ("mpub", "E_MPUB_FAILED"),
                              ("dpub", "E_DPUB_FAILED")):
            wire = await connect(running.tcp)
            if command == "pub":
                answer = await wire.pub("t", b"refused-pub")
            elif command == "mpub":
                answer = await wire.mpub("t", [b"refused-mpub-1", b"refused-mpub-2"])
            else:
                answer = await wire.dpub("t", 10, b"refused-dpub")
            assert isinstance(answer, Error) and answer.code == code, answer
            assert "No space left on device" in answer.text
            assert await wire.closed()  # fatal, as nsqd
            refused.append(answer)
        r = await http(running.http, "POST", "/pub?topic=t", b"refused-http")
        assert r.status == 503, r  # nsqd's answer to a failed put: 503 EXITING
        status, body = await ping(running)
        assert status == 500 and body.startswith(b"NOK - "), body
        assert b"No space left on device" in body
        assert (await health(running)).startswith("NOK - ")
        metrics = (await http(running.http, "GET", "/metrics")).body.decode()
        assert "\nlmqd_healthy 0.0\n" in metrics
        (failures,) = re.findall(r"\nlmqd_write_failures_total (\S+)\n", metrics)
        assert float(failures) >= 4  # PUB, MPUB, DPUB, /pub: each refused write counted

        # Space comes back: the next write succeeds and clears the error, nothing is lost.
        disk.free()
        again = await connect(running.tcp)
        assert await again.pub("t", b"after") == OK
        acknowledged.append(b"after")
        assert await ping(running) == (200, b"OK")
        assert await health(running) == "OK"
        assert disk.refused > 0
        consumer = await connect(running.tcp)
        await consumer.sub("t", "c", rdy=100)
        got = await drain(consumer, len(acknowledged))
        assert sorted(got) == sorted(acknowledged)


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_shutdown_with_no_space_at_all_counts_per_queue_what_only_memory_held(
    start_daemon: StartDaemon,
    connect: Connect,
    disk: DiskQuota,
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    options: dict[str, Any] = {"mem_queue_size": 10_000} if mode == "default" else MODES[mode]
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(**options)
        consumer = await connect(running.tcp)
        await consumer.sub("t", "c")
        producer = await connect(running.tcp)
        sent = [b"m%03d" % i for i in range(80)]
        assert await producer.mpub("t", sent) == OK
        await consumer.rdy(30)
        in_flight = [(await consumer.message()).body for _ in range(30)]
        disk.fill()
        await running.stop()
        if mode == "default":
            # In flight: only the channel had them; the rest: only the topic's memory tail.
            assert running.daemon.lost_at_shutdown == {"t:c": 30, "t": 50}
            (summary,) = [r for r in caplog.records if r.getMessage().startswith("SHUTDOWN:")]
            assert summary.levelname == "ERROR"
            assert summary.getMessage() == (
                "SHUTDOWN: 80 messages could not be written to disk and are lost (t: 50, t:c: 30)"
            )
            kept: list[bytes] = []
        else:
            # Every message is in the log, the ones in flight unsettled: nothing is lost.
            assert running.daemon.lost_at_shutdown == {}
            kept = sent
        assert in_flight == sent[:30]
        # A full disk is an operator's problem, not a bug: no traceback in the log.
        assert not [r for r in caplog.records if r.exc_info], "traceback logged"

        disk.free()
        restarted = await start_daemon(running.data_path, **options)
        consumer = await connect(restarted.tcp)
        await consumer.sub("t", "c", rdy=100)
        assert sorted(await drain(consumer, len(kept))) == kept


async def test_default_mode_accepts_into_memory_while_the_disk_is_full_and_consumers_keep_up(
    start_daemon: StartDaemon, connect: Connect, disk: DiskQuota
) -> None:
    # nsqd: a put into the memory queue while it has room touches no disk, so it succeeds.
    # (Health may turn NOK meanwhile: the sync round that persists the channel's position
    # every --sync-timeout cannot write the log's state file.)
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, mem_queue_size=10)
        consumer = await connect(running.tcp)
        await consumer.sub("t", "c", rdy=1)
        producer = await connect(running.tcp)
        # A second topic whose channel never reads (created first: creating needs the disk).
        for target in ("/topic/create?topic=u", "/channel/create?topic=u&channel=idle"):
            r = await http(running.http, "POST", target)
            assert r.status == 200, r
        disk.fill()
        for i in range(50):
            assert await producer.pub("t", b"m%d" % i) == OK
            msg = await consumer.message()
            assert msg.body == b"m%d" % i
            await consumer.fin(msg.id)
        # A backlog past the memory tail does need it: refused, and health says why.
        answers = [await producer.pub("u", b"backlog-%d" % i) for i in range(11)]
        assert answers[:10] == [OK] * 10
        assert isinstance(answers[10], Error) and answers[10].code == "E_PUB_FAILED"
        status, body = await ping(running)
        assert status == 500 and b"No space left on device" in body


async def test_health_turns_ok_by_itself_once_space_returns(
    start_daemon: StartDaemon, connect: Connect, disk: DiskQuota
) -> None:
    # While unhealthy the syncer rewrites the metadata file once per --sync-timeout tick: no
    # publish is needed for /ping to see the space come back.
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, mem_queue_size=0, sync_timeout=0.2)
        producer = await connect(running.tcp)
        assert await producer.pub("t", b"stored") == OK
        await trio.sleep(0.5)  # synced by the ticks: no write is pending when the disk fills
        disk.fill()
        answer = await producer.pub("t", b"refused")
        assert isinstance(answer, Error) and answer.code == "E_PUB_FAILED"
        # Still NOK a few ticks later: each probe fails while the disk is full.
        await trio.sleep(0.5)
        status, body = await ping(running)
        assert status == 500 and b"No space left on device" in body, body
        disk.free()
        await eventually_ok(running)
        consumer = await connect(running.tcp)
        await consumer.sub("t", "c", rdy=10)
        assert await drain(consumer, 1) == [b"stored"]


async def eventually_ok(daemon: RunningDaemon | tuple[str, int]) -> None:
    """Poll ``/ping`` as a health check does until it answers ``OK``."""
    while True:
        if await ping(daemon) == (200, b"OK"):
            return
        await trio.sleep(0.05)


async def test_a_sync_round_that_started_before_a_failed_write_does_not_clear_it(
    start_daemon: StartDaemon, connect: Connect, disk: DiskQuota, fsync: FsyncFault
) -> None:
    # The round runs in a worker thread; a publish refused meanwhile is newer news than the
    # round's success. (--sync-timeout is long: no tick's probe interferes.)
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, durable=True, sync_timeout=3600.0)
        first = await connect(running.tcp)
        assert await first.pub("a", b"first") == OK
        other = await connect(running.tcp)
        assert await other.pub("b", b"first") == OK
        await eventually(lambda: not running.broker.syncer.busy)
        fsync.hold = True
        await first.send(Pub(topic="a", body=b"small"))
        await trio.to_thread.run_sync(fsync.held.wait, TIMEOUT)
        # Room for the round's state file, not for a 64 KiB message.
        disk.fill(8 * 1024)
        answer = await other.pub("b", b"x" * 65536)
        assert isinstance(answer, Error) and answer.code == "E_PUB_FAILED"
        fsync.hold = False
        fsync.released.set()
        assert await first.frame() == OK  # the round succeeded...
        status, body = await ping(running)
        assert status == 500 and b"No space left on device" in body  # ...and cleared nothing
