"""The trio clients against real lmqd daemons running in this process.

Rules for this module: daemons run in-process (``start_daemon``) on 127.0.0.1 with port 0
(except the restart test, which reuses the port the first daemon got), data in ``tmp_path``;
every test is bounded by ``trio.fail_after``; delays (backoff, reconnect) are set to a few
milliseconds so the real clock costs little. Exact backoff timing is tested against the fake
daemon (test_consumer_fake.py).
"""

from __future__ import annotations

import collections

import pytest
import trio

from lmq_client import errors
from lmq_client.backoff import Backoff
from lmq_client.consumer import Consumer
from lmq_client.message import Message
from lmq_client.producer import Producer
from tests.support.daemon import StartDaemon

FAST = Backoff(base=0.01, max_delay=0.05, jitter=0.0)


async def test_several_consumers_several_daemons(start_daemon: StartDaemon) -> None:
    """Two daemons, two consumers on one channel (each on both daemons): every message once."""
    a = (await start_daemon()).tcp_address
    b = (await start_daemon()).tcp_address
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


async def test_pipelined_publishes_from_many_tasks(start_daemon: StartDaemon) -> None:
    a = (await start_daemon()).tcp_address
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


async def test_publish_errors_carry_nsq_codes(start_daemon: StartDaemon) -> None:
    a = (await start_daemon()).tcp_address
    with trio.fail_after(10):
        async with Producer(a) as producer:
            with pytest.raises(errors.BadMessageError) as info:
                await producer.publish("t", b"")
            assert info.value.code == "E_BAD_MESSAGE"
            # the daemon closed after the fatal error; the next publish reconnects
            await producer.publish("t", b"fine")
            with pytest.raises(errors.InvalidError, match="DPUB timeout"):
                await producer.dpub("t", 10_000_000, b"too late")


async def test_reconnect_after_daemon_restart(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    a = daemon.tcp_address
    port = daemon.tcp[1]
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
            await daemon.stop()
            await consumer.wait_connections(0)
            with pytest.raises(errors.ConnectionFailed):
                await producer.publish("r", b"while down")
            await start_daemon(tcp_address=f"127.0.0.1:{port}")  # same address again
            await consumer.wait_connections(1)
            await producer.publish("r", b"after")  # the producer reconnects on demand
            await arrived.wait()
    assert got == [b"before", b"after"]


async def test_give_up_after_max_attempts_real_daemon(start_daemon: StartDaemon) -> None:
    a = (await start_daemon()).tcp_address
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
