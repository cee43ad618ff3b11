"""The trio clients against real lmqd daemons running in this process.

Rules for this module: daemons listen on 127.0.0.1 with port 0 (except the restart test, which
reuses the port the first daemon got), data in ``tmp_path``; every test is bounded by
``trio.fail_after``; delays (backoff, reconnect) are set to a few milliseconds so the real clock
costs little. Exact backoff timing is tested against the fake daemon (test_consumer_fake.py).
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from lmq_client import errors
from lmq_client.backoff import Backoff
from lmq_client.consumer import Consumer
from lmq_client.message import Message
from lmq_client.producer import Producer
from lmqd.options import Options
from lmqd.service import LmqDaemon

FAST = Backoff(base=0.01, max_delay=0.05, jitter=0.0)


def _options(tmp_path: Path, name: str, port: int = 0) -> Options:
    data = tmp_path / name
    data.mkdir(exist_ok=True)
    return Options(tcp_address=f"127.0.0.1:{port}", http_address="", data_path=str(data))


class Daemons:
    """Start (and stop) in-process daemons inside the test's nursery."""

    def __init__(self, nursery: trio.Nursery, tmp_path: Path) -> None:
        self.nursery = nursery
        self.tmp_path = tmp_path
        self.count = 0
        self.stopped: dict[LmqDaemon, trio.Event] = {}

    async def start(self, port: int = 0) -> tuple[LmqDaemon, str]:
        self.count += 1
        daemon = LmqDaemon(_options(self.tmp_path, f"d{self.count}", port))
        bound = await self.nursery.start(self._run, daemon)
        host, port = bound.tcp
        return daemon, f"{host}:{port}"

    async def stop(self, daemon: LmqDaemon) -> None:
        """Shut the daemon down and wait until it has closed its listener."""
        daemon.shutdown()
        await self.stopped[daemon].wait()

    async def _run(self, daemon: LmqDaemon, *, task_status: trio.TaskStatus[Any]) -> None:
        self.stopped[daemon] = trio.Event()
        try:
            await daemon.run(task_status=task_status)
        finally:
            self.stopped[daemon].set()


@pytest.fixture
async def daemons(tmp_path: Path) -> AsyncIterator[Daemons]:
    async with trio.open_nursery() as nursery:
        yield Daemons(nursery, tmp_path)
        nursery.cancel_scope.cancel()


async def test_several_consumers_several_daemons(daemons: Daemons) -> None:
    """Two daemons, two consumers on one channel (each on both daemons): every message once."""
    _, a = await daemons.start()
    _, b = await daemons.start()
    n = 300
    got: dict[str, list[bytes]] = collections.defaultdict(list)
    done = trio.Event()

    def handler_for(name: str):  # type: ignore[no-untyped-def]
        async def handler(message: Message) -> None:
            got[name].append(message.body)
            if sum(len(v) for v in got.values()) == 2 * n:
                done.set()

        return handler

    with trio.fail_after(20):
        async with (
            Consumer("orders", "billing", [a, b], handler=handler_for("c1"), max_in_flight=20)
            as c1,
            Consumer("orders", "billing", [a, b], handler=handler_for("c2"), max_in_flight=20)
            as c2,
        ):
            assert sorted(c1.connected_addresses) == sorted([a, b])
            assert sorted(c1.rdy_counts().values()) == [10, 10]
            async with Producer(a) as pa, Producer(b) as pb, trio.open_nursery() as pubs:
                for i in range(0, n, 50):
                    pubs.start_soon(pa.mpub, "orders", [b"a%d" % j for j in range(i, i + 50)])
                    pubs.start_soon(pb.mpub, "orders", [b"b%d" % j for j in range(i, i + 50)])
            await done.wait()
            stats = c1.statistics(), c2.statistics()
    everything = got["c1"] + got["c2"]
    assert len(everything) == 2 * n
    assert set(everything) == {b"a%d" % i for i in range(n)} | {b"b%d" % i for i in range(n)}
    assert got["c1"] and got["c2"]  # both consumers took part
    assert stats[0].finished + stats[1].finished == 2 * n


async def test_pipelined_publishes_from_many_tasks(daemons: Daemons) -> None:
    _, a = await daemons.start()
    with trio.fail_after(20):
        async with Producer(a) as producer:
            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(producer.publish, "pipe", b"%d" % i)
            await producer.dpub("pipe", 0.05, b"deferred")
        received = set()
        async with Consumer("pipe", "c", a, max_in_flight=50) as consumer:
            async for message in consumer:
                received.add(message.body)
                message.finish()
                if len(received) == 201:
                    break
    assert b"deferred" in received


async def test_publish_errors_carry_nsq_codes(daemons: Daemons) -> None:
    _, a = await daemons.start()
    with trio.fail_after(10):
        async with Producer(a) as producer:
            with pytest.raises(errors.BadMessageError) as info:
                await producer.publish("t", b"")
            assert info.value.code == "E_BAD_MESSAGE"
            # the daemon closed after the fatal error; the next publish reconnects
            await producer.publish("t", b"fine")
            with pytest.raises(errors.InvalidError, match="DPUB timeout"):
                await producer.dpub("t", 10_000_000, b"too late")


async def test_reconnect_after_daemon_restart(daemons: Daemons) -> None:
    daemon, a = await daemons.start()
    port = int(a.rpartition(":")[2])
    got: list[bytes] = []
    arrived = trio.Event()

    async def handler(message: Message) -> None:
        got.append(message.body)
        arrived.set()

    with trio.fail_after(20):
        async with (
            Consumer("r", "c", a, handler=handler, reconnect_backoff=FAST) as consumer,
            Producer(a) as producer,
        ):
            await producer.publish("r", b"before")
            await arrived.wait()
            arrived = trio.Event()
            await daemons.stop(daemon)
            await consumer.wait_connections(0)
            with pytest.raises(errors.ConnectionFailed):
                await producer.publish("r", b"while down")
            await daemons.start(port)  # same address again
            await consumer.wait_connections(1)
            await producer.publish("r", b"after")  # the producer reconnects on demand
            await arrived.wait()
    assert got == [b"before", b"after"]


async def test_give_up_after_max_attempts_real_daemon(daemons: Daemons) -> None:
    _, a = await daemons.start()
    attempts: list[int] = []
    given_up = trio.Event()
    gave_up: list[Message] = []

    async def handler(message: Message) -> None:
        attempts.append(message.attempts)
        raise RuntimeError("always fails")

    def give_up(message: Message) -> None:
        gave_up.append(message)
        given_up.set()

    with trio.fail_after(20):
        async with Producer(a) as producer:
            await producer.publish("g", b"poison")
        async with Consumer(
            "g", "c", a, handler=handler, max_attempts=3, on_give_up=give_up,
            requeue_delay=0.0, backoff=FAST,
        ) as consumer:
            await given_up.wait()
            stats = consumer.statistics()
    assert attempts == [1, 2, 3]
    assert [m.attempts for m in gave_up] == [4]
    assert (stats.given_up, stats.requeued, stats.finished) == (1, 3, 1)
