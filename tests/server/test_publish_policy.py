"""Topic publish policies as a TCP publisher sees them, on trio's autojump clock.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs (``start_daemon``); each client is a ``Wire`` talking to a
  ``TcpConnection`` over a memory stream (``serve_in_memory``), so virtual time is exact.
- Commands are raw bytes, several to a buffer where pipelining is the point.
- Every time assertion is an exact virtual time; every test is bounded by ``fail_after``.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from lmqd.broker import Broker
from lmqd.protocol import Error
from tests.support.daemon import StartDaemon, serve_in_memory
from tests.support.rawbytes import MAGIC_V2, dpub, mpub, pub
from tests.support.wire import Wire

TIMEOUT = 60.0  # virtual seconds


@pytest.fixture
async def daemon(start_daemon: StartDaemon) -> Broker:
    return (await start_daemon()).broker


async def connect(daemon: Broker, nursery: trio.Nursery) -> Wire:
    client = Wire(serve_in_memory(daemon, nursery, "producer:1"), answer_heartbeats=True)
    await client.send(MAGIC_V2)
    return client


def as_sent(error: Error) -> bytes:
    return f"{error.code} {error.text}".encode()


async def test_rate_limit_paces_a_publisher_in_virtual_time(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon.get_topic("t").set_policy({"publish_rate": 4, "publish_burst": 2})
        producer = await connect(daemon, nursery)
        start = trio.current_time()
        answered = []
        for n in range(10):
            await producer.send(pub("t", b"%d" % n))
            assert await producer.response() == b"OK"
            answered.append(trio.current_time() - start)
        # The burst at once, then one every 1/4 s: 2 + 4 per second.
        assert answered == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
        assert daemon.topics["t"].message_count == 10


async def test_a_pipelined_run_waits_once_and_others_are_not_held(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon.get_topic("t").set_policy({"publish_rate": 4, "publish_burst": 2})
        producer = await connect(daemon, nursery)
        other = await connect(daemon, nursery)
        start = trio.current_time()
        await producer.send(b"".join(pub("t", b"%d" % n) for n in range(8)))
        # Another connection, to a topic without a policy, is answered while it waits.
        await other.send(pub("free", b"x"))
        assert await other.response() == b"OK"
        assert trio.current_time() == start
        # The run is paid for up to the 1 s bound (6: the burst and 4 at 4/s), answered
        # together; the rest waits its own turn.
        for _ in range(6):
            assert await producer.response() == b"OK"
            assert trio.current_time() == start + 1.0
        for _ in range(2):
            assert await producer.response() == b"OK"
            assert trio.current_time() == start + 1.5
        assert daemon.topics["t"].message_count == 8


async def test_over_the_rate_beyond_the_wait_bound_is_refused_with_the_commands_error(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon.get_topic("t").set_policy({"publish_rate": 4, "publish_burst": 2})
        producer = await connect(daemon, nursery)
        start = trio.current_time()
        # 7 messages: 5 missing = 1.25 s > the 1 s bound: refused at once, whole.
        await producer.send(mpub("t", [b"a"] * 7))
        error = await producer.error()
        assert as_sent(error) == (
            b"E_MPUB_FAILED MPUB failed topic t is over its publish rate (4/s, burst 2)"
        )
        assert trio.current_time() == start
        assert await producer.closed()  # E_MPUB_FAILED is fatal (nsqd)
        topic = daemon.topics["t"]
        assert topic.message_count == 0
        stats = topic.statistics(trio.current_time()).publish_policy
        assert stats is not None and stats.rate_limited_count == 7


async def test_max_depth_reject_answers_the_exact_error_after_the_oks_due(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon.get_topic("t").set_policy({"max_depth": 3})
        producer = await connect(daemon, nursery)
        await producer.send(
            pub("t", b"1") + mpub("t", [b"2", b"3"]) + pub("t", b"4") + pub("t", b"5")
        )
        assert await producer.response() == b"OK"
        assert await producer.response() == b"OK"
        error = await producer.error()
        assert as_sent(error) == b"E_PUB_FAILED PUB failed topic t is full (max_depth 3)"
        assert await producer.closed()
        second = await connect(daemon, nursery)
        await second.send(mpub("t", [b"x"]))
        assert as_sent(await second.error()) == (
            b"E_MPUB_FAILED MPUB failed topic t is full (max_depth 3)"
        )
        third = await connect(daemon, nursery)
        await third.send(dpub("t", 1000, b"later"))
        assert as_sent(await third.error()) == (
            b"E_DPUB_FAILED DPUB failed topic t is full (max_depth 3)"
        )
        topic = daemon.topics["t"]
        assert topic.message_count == 3
        stats = topic.statistics(trio.current_time()).publish_policy
        assert stats is not None and stats.overflow_refused_count == 3


async def test_duplicates_are_answered_ok_and_enqueued_once(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon.get_topic("t").set_policy({"dedup_window_ms": 10_000})
        producer = await connect(daemon, nursery)
        await producer.send(pub("t", b"same") + mpub("t", [b"same", b"other"]) + pub("t", b"same"))
        for _ in range(3):
            assert await producer.response() == b"OK"
        await trio.sleep(10.0)
        await producer.send(pub("t", b"same"))
        assert await producer.response() == b"OK"
        topic = daemon.topics["t"]
        assert topic.message_count == 3  # same, other, and same again after the window
        stats = topic.statistics(trio.current_time()).publish_policy
        assert stats is not None and stats.deduplicated_count == 2


async def test_dpub_takes_its_token_and_a_policy_removed_mid_wait_is_harmless(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        topic = daemon.get_topic("t")
        topic.set_policy({"publish_rate": 2, "publish_burst": 1})
        producer = await connect(daemon, nursery)
        start = trio.current_time()
        await producer.send(dpub("t", 5000, b"later") + dpub("t", 5000, b"later too"))
        assert await producer.response() == b"OK"
        assert trio.current_time() == start
        assert await producer.response() == b"OK"
        assert trio.current_time() == start + 0.5
        # A run waiting for its tokens when the rate is turned off is published as reserved.
        await producer.send(pub("t", b"1") + pub("t", b"2"))
        await trio.sleep(0.25)
        topic.set_policy({"publish_rate": 0})
        assert await producer.response() == b"OK"
        assert await producer.response() == b"OK"
        assert trio.current_time() == start + 1.5
        await producer.send(pub("t", b"3"))
        assert await producer.response() == b"OK"
        assert trio.current_time() == start + 1.5
        assert topic.message_count == 5
        assert topic.channels == {}
        assert topic.depth == 5
