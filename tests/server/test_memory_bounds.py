"""Memory bounded in bytes: a consumer's output, and all connections' buffers together.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs (``start_daemon``); each client talks to a ``TcpConnection`` over
  in-memory streams on trio's autojump clock. A client that never reads is the client end of a
  ``trio.testing.lockstep_stream_pair()``: the server's sends block until it receives, as on a
  socket whose peer stopped reading.
- Big messages are published through the broker with one shared body object, so a test holds
  no more memory than the bounds it checks.
- Every wait is bounded (``fail_after``; ``move_on_after`` where *nothing* must arrive).
- One test goes through the TCP listener (127.0.0.1, port 0) on the real clock.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from lmqd.broker import Broker
from lmqd.protocol import MessageFrame
from lmqd.server import TcpConnection
from lmqd.server.budget import BufferBudget
from lmqd.server.session import OUTPUT_HIGH_WATER
from lmqd.units import KiB, MiB
from tests.support.daemon import StartDaemon
from tests.support.rawbytes import MAGIC_V2, identify, pub, rdy, sub
from tests.support.wire import Wire

# A heartbeat interval and a message timeout longer than any test: what is measured is the
# byte bounds, not the write deadline or redeliveries.
QUIET = {"heartbeat_interval": 120_000, "msg_timeout": 600_000}


@pytest.fixture
async def daemon(start_daemon: StartDaemon) -> Broker:
    return (await start_daemon(max_heartbeat_interval=300.0)).broker


def serve(
    broker: Broker,
    nursery: trio.Nursery,
    budget: BufferBudget | None = None,
    *,
    lockstep: bool = False,
) -> tuple[trio.abc.Stream, TcpConnection]:
    """One connection served over memory streams; the client's end and the handler."""
    pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
    ends: tuple[trio.abc.Stream, trio.abc.Stream] = pair()
    client_end, server_end = ends
    handler = TcpConnection(broker, server_end, "test:1", budget=budget)

    async def run() -> None:
        try:
            await handler.serve()
        finally:
            await server_end.aclose()

    nursery.start_soon(run)
    return client_end, handler


async def stuck_consumer(
    broker: Broker, nursery: trio.Nursery, topic: str, ready: int, budget: BufferBudget | None
) -> tuple[trio.abc.Stream, TcpConnection]:
    """A subscriber with RDY ``ready`` that sends its commands and reads nothing."""
    stream, handler = serve(broker, nursery, budget, lockstep=True)
    await stream.send_all(MAGIC_V2 + identify(**QUIET) + sub(topic, "c") + rdy(ready))
    await trio.testing.wait_all_tasks_blocked()
    return stream, handler


async def test_a_consumer_that_never_reads_holds_only_its_byte_room(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(60):
        stream, handler = await stuck_consumer(daemon, nursery, "big", 300, None)
        body = b"m" * MiB
        daemon.publish("big", [body] * 300)
        await trio.testing.wait_all_tasks_blocked()
        channel = daemon.topics["big"].channels["c"]
        # 4 MiB of room: messages start at 0, 1, 2 and 3 MiB of bodies; the fifth would start
        # at the bound. The other 296 stay in the channel, not in flight.
        assert channel.in_flight_count == 4
        assert channel.depth == 296
        assert OUTPUT_HIGH_WATER <= handler.output.pending_bytes < OUTPUT_HIGH_WATER + MiB
        assert handler.budget.used == handler.output.pending_bytes
        # It reads at last: every message arrives exactly once, never more than 5 in flight.
        consumer = Wire(stream, answer_heartbeats=False)
        assert await consumer.response() == b"OK"  # IDENTIFY
        assert await consumer.response() == b"OK"  # SUB
        seen: set[bytes] = set()
        while len(seen) < 300:
            frame = await consumer.frame()
            assert isinstance(frame, MessageFrame), frame
            assert frame.id not in seen and len(frame.body) == MiB
            seen.add(frame.id)
            assert channel.in_flight_count <= 5
            await consumer.fin(frame.id)
        await trio.testing.wait_all_tasks_blocked()
        assert (channel.in_flight_count, channel.depth, channel.timeout_count) == (0, 0, 0)


async def test_past_the_daemon_wide_bound_no_new_publish_is_applied_until_it_drains(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    budget = BufferBudget(1 * MiB)
    with trio.fail_after(60):
        stuck, _ = await stuck_consumer(daemon, nursery, "flood", 10, budget)
        pub_stream, _ = serve(daemon, nursery, budget)
        publisher = Wire(pub_stream, answer_heartbeats=False)
        await publisher.send(MAGIC_V2 + identify(**QUIET))
        assert await publisher.response() == b"OK"
        # Four 512 KiB messages wait for the stuck consumer: 2 MiB, past the 1 MiB bound.
        daemon.publish("flood", [b"s" * (512 * KiB)] * 4)
        await trio.testing.wait_all_tasks_blocked()
        assert budget.over
        # The publisher's reader was already waiting in a receive: that one receive still
        # brings half a PUB, which is buffered (and counted).
        begun = pub("flood", b"1" * (64 * KiB))
        used = budget.used
        await publisher.send(begun[: len(begun) // 2])
        await trio.testing.wait_all_tasks_blocked()
        assert budget.used == used + len(begun) // 2
        # The begun PUB is completed and answered (only the bytes it needs are read); the next
        # one, sent with them, waits meanwhile.
        await publisher.send(begun[len(begun) // 2 :] + pub("flood", b"2"))
        assert await publisher.response() == b"OK"
        with trio.move_on_after(10):
            frame = await publisher.frame()
            pytest.fail(f"a new publish was applied past the bound: {frame}")
        topic = daemon.topics["flood"]
        assert topic.message_count == 5
        # The stuck consumer reads its messages: the output drains, the total drops under the
        # bound and the second PUB is applied and answered.
        consumer = Wire(stuck, answer_heartbeats=False)
        for _ in range(2):
            assert await consumer.response() == b"OK"  # IDENTIFY, SUB
        received = [await consumer.message() for _ in range(4)]
        await consumer.send(b"".join(b"FIN " + m.id + b"\n" for m in received))
        assert await publisher.response() == b"OK"
        assert topic.message_count == 6
        assert budget.paused_count >= 1
        # Everything that was counted is released when the connections end.
        await consumer.aclose()
        await publisher.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert budget.used == 0


async def test_a_client_that_publishes_and_consumes_past_the_bound_does_not_deadlock(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    budget = BufferBudget(1 * MiB)
    body = b"b" * (256 * KiB)
    with trio.fail_after(60):
        stream, _ = serve(daemon, nursery, budget)
        client = Wire(stream, answer_heartbeats=False)
        await client.send(MAGIC_V2 + identify(**QUIET))
        assert await client.response() == b"OK"
        await client.sub("self", "c", rdy=100)
        # Twenty PUBs in one go, to itself: its own output passes the bound, so reading its
        # commands pauses until it reads what it was sent; it does, and FINs everything.
        await client.send(pub("self", body) * 20)
        oks = 0
        fins = 0
        while oks < 20 or fins < 20:
            frame = await client.frame()
            if isinstance(frame, MessageFrame):
                await client.fin(frame.id)
                fins += 1
            else:
                oks += 1
        await trio.testing.wait_all_tasks_blocked()
        channel = daemon.topics["self"].channels["c"]
        assert (channel.in_flight_count, channel.depth) == (0, 0)
        await client.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert budget.used == 0


async def test_a_slow_client_completing_its_command_holds_up_no_one_once_under_the_bound(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    budget = BufferBudget(1 * MiB)
    with trio.fail_after(60):
        stuck, _ = await stuck_consumer(daemon, nursery, "slow", 10, budget)
        publishers = []
        for _ in range(2):
            stream, _ = serve(daemon, nursery, budget)
            wire = Wire(stream, answer_heartbeats=False)
            await wire.send(MAGIC_V2 + identify(**QUIET))
            assert await wire.response() == b"OK"
            publishers.append(wire)
        slow, other = publishers
        daemon.publish("slow", [b"s" * (512 * KiB)] * 4)
        await trio.testing.wait_all_tasks_blocked()
        assert budget.over
        # Both begin a PUB while over the bound; the slow one gets the turn to complete its
        # command first, then sends nothing more; the other waits behind it.
        command = pub("slow", b"p" * 1000)
        await slow.send(command[:100])
        await trio.testing.wait_all_tasks_blocked()
        await other.send(command[:100])
        await trio.testing.wait_all_tasks_blocked()
        await other.send(command[100:])
        with trio.move_on_after(5):
            await other.frame()
            pytest.fail("a second command was completed while another had the turn")
        # The stuck consumer reads its messages: under the bound, the other stops waiting for
        # the slow one's turn and is read as usual.
        consumer = Wire(stuck, answer_heartbeats=False)
        for _ in range(2):
            assert await consumer.response() == b"OK"  # IDENTIFY, SUB
        for _ in range(4):
            await consumer.message()
        assert await other.response() == b"OK"
        await slow.send(command[100:])
        assert await slow.response() == b"OK"
        assert daemon.topics["slow"].message_count == 6


async def test_past_the_bound_a_client_that_also_publishes_still_has_its_fins_read(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    budget = BufferBudget(1 * MiB)
    with trio.fail_after(60):
        stream, _ = serve(daemon, nursery, budget)
        client = Wire(stream, answer_heartbeats=False)
        await client.send(MAGIC_V2 + identify(**QUIET))
        assert await client.response() == b"OK"
        await client.sub("mine", "c", rdy=1)
        daemon.publish("mine", [b"first"])
        message = await client.message()
        stuck, _ = await stuck_consumer(daemon, nursery, "other", 10, budget)
        daemon.publish("other", [b"s" * (512 * KiB)] * 4)
        await trio.testing.wait_all_tasks_blocked()
        assert budget.over
        # Past the bound: its FIN is applied, its PUB (after it) waits, and so does the start
        # of a third one, which no longer counts against the bound while it waits.
        used = budget.used
        third = pub("mine", b"third")
        await client.send(b"FIN " + message.id + b"\n" + pub("mine", b"second") + third[:8])
        await trio.testing.wait_all_tasks_blocked()
        channel = daemon.topics["mine"].channels["c"]
        assert (channel.in_flight_count, channel.depth) == (0, 0)
        assert daemon.topics["mine"].message_count == 1
        assert budget.used == used
        # Under the bound again (the stuck consumer reads), the PUB is applied and delivered.
        consumer = Wire(stuck, answer_heartbeats=False)
        for _ in range(2):
            assert await consumer.response() == b"OK"  # IDENTIFY, SUB
        for _ in range(4):
            await consumer.message()
        assert await client.response() == b"OK"
        assert (await client.message()).body == b"second"
        await client.send(third[8:])
        assert await client.response() == b"OK"
        assert daemon.topics["mine"].message_count == 3
        await client.aclose()
        await consumer.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert budget.used == 0


async def test_every_tcp_connection_counts_against_the_one_budget_of_the_flag(
    start_daemon: StartDaemon,
) -> None:
    # Real loopback sockets here (the listener is what is tested), so the real clock.
    with trio.fail_after(30):
        running = await start_daemon(max_buffered_bytes=3 * MiB)
        broker = running.broker
        first = await Wire.connect(running.addresses.tcp, client_id="one")
        second = await Wire.connect(running.addresses.tcp, client_id="two")
        connections = list(broker.clients.values())
        assert len(connections) == 2
        budgets = {id(getattr(c, "budget", None)) for c in connections}
        assert len(budgets) == 1  # one budget shared by the listener's connections
        budget = getattr(connections[0], "budget", None)
        assert isinstance(budget, BufferBudget) and budget.limit == 3 * MiB
        await first.aclose()
        await second.aclose()
