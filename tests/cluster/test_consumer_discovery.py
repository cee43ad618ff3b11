"""The trio Consumer finding daemons through lookupds, on the autojump clock.

Rules for this module: real ``LmqDaemon``s in-process (``start_lmqd``) on 127.0.0.1 port 0; the
lookupd is a scripted query function (``ScriptedLookupd``: what it lists is set by the test, and
it records when it was asked), so poll times are exact virtual times. Topics and channels are
``#ephemeral``: nothing goes to disk, so no worker thread lets the autojump clock run ahead.
Every test is bounded by ``trio.fail_after`` (virtual seconds), entered once its nodes have
started (their start-up runs a worker thread, see conftest.py).
"""

from __future__ import annotations

import random

import trio
import trio.testing

from lmq_client.backoff import Backoff
from lmq_client.consumer import Consumer
from lmq_client.errors import ConnectionFailed
from lmq_client.message import Message
from lmq_client.producer import Producer

from .conftest import LmqdNode, StartLmqd

TIMEOUT = 1000.0
TOPIC, CHANNEL = "t#ephemeral", "c#ephemeral"
EXACT = Backoff(base=1.0, max_delay=8.0, jitter=0.0)


class Fixed(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


class ScriptedLookupd:
    """Answers ``listed`` for every lookupd address except those in ``down``."""

    def __init__(self, *listed: LmqdNode) -> None:
        self.listed = list(listed)
        self.down: set[str] = set()
        self.asked: list[tuple[float, str, str]] = []

    async def query(self, lookupd: str, topic: str) -> list[str]:
        self.asked.append((trio.current_time(), lookupd, topic))
        await trio.lowlevel.checkpoint()
        if lookupd in self.down:
            raise ConnectionFailed(lookupd, "HTTP API unreachable (refused)")
        return [node.tcp_address for node in self.listed]

    def times(self) -> list[float]:
        return sorted({at for at, _, _ in self.asked})


def consumer(lookupd: ScriptedLookupd, **kwargs: object) -> Consumer:
    settings: dict[str, object] = {
        "lookupd_http_addresses": ["127.0.0.1:4161"], "lookupd_query": lookupd.query,
        "rng": Fixed(0.5), "reconnect_backoff": EXACT, "max_in_flight": 4,
    }  # fmt: skip
    settings.update(kwargs)
    return Consumer(TOPIC, CHANNEL, **settings)  # type: ignore[arg-type]


async def test_polls_at_once_then_on_go_nsqs_jittered_schedule(
    start_lmqd: StartLmqd, autojump_clock: trio.testing.MockClock
) -> None:
    node = await start_lmqd()
    with trio.fail_after(TIMEOUT):
        lookupd = ScriptedLookupd(node)
        started = trio.current_time()
        async with consumer(lookupd) as c:
            assert c.connected_addresses == [node.tcp_address]
            assert c.discovered_addresses == [node.tcp_address]
            await trio.sleep(200)
        # random() = 0.5: the second query after 0.5 * 0.3 * 60 = 9 s plus one interval
        assert lookupd.times() == [started, started + 69, started + 129, started + 189]


async def test_new_producers_are_connected_and_vanished_ones_dropped(
    start_lmqd: StartLmqd, autojump_clock: trio.testing.MockClock
) -> None:
    a, b = await start_lmqd(), await start_lmqd()
    with trio.fail_after(TIMEOUT):
        lookupd = ScriptedLookupd(a)
        started = trio.current_time()
        async with consumer(lookupd, lookupd_poll_jitter=0.0) as c:
            assert c.rdy_counts() == {a.tcp_address: 4}
            lookupd.listed = [a, b]
            await c.wait_connections(2)
            assert trio.current_time() == started + 60
            assert c.rdy_counts() == {a.tcp_address: 2, b.tcp_address: 2}  # spread over both
            lookupd.listed = [b]
            await trio.sleep_until(started + 121)
            assert c.rdy_counts() == {a.tcp_address: 2, b.tcp_address: 2}  # missed once: kept
            await c.wait_connections(1)
            assert trio.current_time() == started + 180  # missed twice: dropped
            assert c.rdy_counts() == {b.tcp_address: 4}


async def test_every_message_from_every_discovered_node(
    start_lmqd: StartLmqd, autojump_clock: trio.testing.MockClock
) -> None:
    nodes = [await start_lmqd() for _ in range(3)]
    with trio.fail_after(TIMEOUT):
        lookupd = ScriptedLookupd(*nodes)
        got: list[bytes] = []
        done = trio.Event()

        async def handle(message: Message) -> None:
            got.append(message.body)
            if len(got) == 300:
                done.set()

        async with consumer(lookupd, handler=handle, max_in_flight=10) as c:
            assert sorted(c.connected_addresses) == sorted(n.tcp_address for n in nodes)
            for i, node in enumerate(nodes):
                async with Producer(node.tcp_address) as producer:
                    await producer.mpub(TOPIC, [f"{i}-{j}".encode() for j in range(100)])
            await done.wait()
            await trio.sleep(5)  # a duplicate would arrive meanwhile
        assert sorted(got) == sorted(f"{i}-{j}".encode() for i in range(3) for j in range(100))


async def test_an_ended_connection_is_redialled_only_while_the_lookupds_list_it(
    start_lmqd: StartLmqd, autojump_clock: trio.testing.MockClock
) -> None:
    a, b = await start_lmqd(), await start_lmqd()
    with trio.fail_after(TIMEOUT):
        lookupd = ScriptedLookupd(a, b)
        async with consumer(lookupd, lookupd_poll_jitter=0.0) as c:
            # a's channel is deleted while a is still listed: asked again 1 s later, redialled
            closed = trio.current_time()
            a.daemon.broker.topics[TOPIC].delete_channel(CHANNEL)
            await trio.sleep(0.5)
            assert c.connected_addresses == [b.tcp_address]
            await c.wait_connections(2)
            assert trio.current_time() == closed + 1
            assert lookupd.times()[-1] == closed + 1
            # nsqadmin's tombstone flow: a is no longer listed, then its topic is deleted
            lookupd.listed = [b]
            closed = trio.current_time()
            a.daemon.broker.delete_topic(TOPIC)
            await c.wait_connections(1)
            await trio.sleep(150)
            assert lookupd.times()[-3:] == [closed + 1, 60.0 + lookupd.times()[0], 120.0
                                            + lookupd.times()[0]]  # fmt: skip
            assert c.connected_addresses == [b.tcp_address]
            assert TOPIC not in a.daemon.broker.topics  # not recreated by a redial


async def test_a_lookupd_that_fails_is_skipped_and_an_unanswered_round_changes_nothing(
    start_lmqd: StartLmqd, autojump_clock: trio.testing.MockClock
) -> None:
    a, b = await start_lmqd(), await start_lmqd()
    with trio.fail_after(TIMEOUT):
        lookupd = ScriptedLookupd(a, b)
        lookupd.down = {"127.0.0.1:4161"}
        async with consumer(
            lookupd, lookupd_http_addresses=["127.0.0.1:4161", "127.0.0.1:4261"],
            lookupd_poll_jitter=0.0,
        ) as c:  # fmt: skip
            assert sorted(c.connected_addresses) == sorted([a.tcp_address, b.tcp_address])
            lookupd.down = {"127.0.0.1:4161", "127.0.0.1:4261"}
            await trio.sleep(200)  # three rounds nobody answered
            assert len(c.connected_addresses) == 2


async def test_explicit_addresses_and_lookupds_together(
    start_lmqd: StartLmqd, autojump_clock: trio.testing.MockClock
) -> None:
    a, b = await start_lmqd(), await start_lmqd()
    with trio.fail_after(TIMEOUT):
        lookupd = ScriptedLookupd(a, b)  # a is listed too: one connection to it, not two
        async with Consumer(TOPIC, CHANNEL, a.tcp_address, lookupd_http_addresses="l:4161",
                            lookupd_query=lookupd.query, max_in_flight=2) as c:  # fmt: skip
            assert sorted(c.connected_addresses) == sorted([a.tcp_address, b.tcp_address])
            assert c.rdy_counts() == {a.tcp_address: 1, b.tcp_address: 1}
