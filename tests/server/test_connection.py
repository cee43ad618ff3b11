"""The TCP connection handler driven over in-memory streams, on trio's autojump clock.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs (``start_daemon``: listening on 127.0.0.1 port 0, unused); each test
  client is a ``Wire`` talking to a ``TcpConnection`` through ``serve_in_memory`` (a
  ``trio.testing.memory_stream_pair()``), so virtual time is exact.
- Commands are written as raw bytes (``tests.support.rawbytes``), several to a buffer where that
  is the point; frames are read back through ``ClientConnection``, heartbeats included.
- Every timeout assertion is an exact virtual time.
"""

from __future__ import annotations

import json
import struct

import pytest
import trio
import trio.testing

from lmqd.broker import Broker
from lmqd.protocol import Error
from tests.support.daemon import StartDaemon, serve_in_memory
from tests.support.rawbytes import MAGIC_V2, identify, pub
from tests.support.wire import Wire


@pytest.fixture
async def daemon(start_daemon: StartDaemon) -> Broker:
    """The broker of a daemon with the default options."""
    return (await start_daemon()).broker


async def connect(daemon: Broker, nursery: trio.Nursery, name: str = "test") -> Wire:
    """A client connection to ``daemon`` past the magic; heartbeats come back as frames."""
    client = Wire(serve_in_memory(daemon, nursery, f"{name}:1"), answer_heartbeats=False)
    await client.send(MAGIC_V2)
    return client


def as_sent(error: Error) -> bytes:
    """An error frame's data as the daemon sent it: the code, a space, the text."""
    return f"{error.code} {error.text}".encode()


async def subscriber(
    daemon: Broker, nursery: trio.Nursery, topic: str, channel: str, rdy: int, **ident: object
) -> Wire:
    client = await connect(daemon, nursery)
    if ident:
        await client.send(identify(**ident))
        await client.response()
    await client.send(f"SUB {topic} {channel}\n".encode())
    assert await client.response() == b"OK"
    await client.send(f"RDY {rdy}\n".encode())
    return client


async def test_pub_sub_fin_round_trip(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    producer = await connect(daemon, nursery)
    await producer.send(pub("orders", b"hello") + b"NOP\n" + pub("orders", b"world"))
    assert await producer.response() == b"OK"
    assert await producer.response() == b"OK"
    consumer = await subscriber(daemon, nursery, "orders", "c", rdy=10)
    first = await consumer.message()
    assert (first.attempts, first.body) == (1, b"hello")
    second = await consumer.message()
    assert second.body == b"world"
    await consumer.send(b"FIN " + first.id + b"\nFIN " + second.id + b"\n")
    await trio.testing.wait_all_tasks_blocked()
    channel = daemon.topics["orders"].channels["c"]
    assert (channel.in_flight_count, channel.depth) == (0, 0)
    assert [p.to_dict() for p in daemon.producers()[0].pub_counts] == [
        {"topic": "orders", "count": 2}
    ]


async def test_heartbeat_on_time_and_disconnect_after_two_missed(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    client = await connect(daemon, nursery)
    start = trio.current_time()
    await client.send(identify(heartbeat_interval=1000, feature_negotiation=True))
    negotiated = json.loads(await client.response())
    assert negotiated["max_rdy_count"] == 2500
    assert await client.response() == b"_heartbeat_"
    assert trio.current_time() == start + 1.0
    # Never answered: the connection is dropped 2 intervals after the last bytes received.
    assert await client.closed()
    assert trio.current_time() == start + 2.0


async def test_default_heartbeat_is_30s_and_nop_keeps_connection(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    client = await connect(daemon, nursery)
    start = trio.current_time()
    for beat in (1, 2, 3):
        assert await client.response() == b"_heartbeat_"
        assert trio.current_time() == start + 30.0 * beat
        await client.send(b"NOP\n")
    assert len(daemon.clients) == 1


async def test_no_heartbeat_before_the_magic_and_closed_without_a_frame(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """nsqd's IOLoop (and its heartbeat ticker) starts only once the 4-byte magic is read; a
    connection that never sends it gets no frame at all, and lmqd closes it after two heartbeat
    intervals of silence without one (nsqd closes one whose magic it cannot read)."""
    silent = serve_in_memory(daemon, nursery, "silent:1")
    start = trio.current_time()
    assert await silent.receive_some(1024) == b""  # nothing, not even a heartbeat, then EOF
    assert trio.current_time() == start + 60.0
    # The magic 10 s after connecting: the ticker starts there (nsqd's IOLoop).
    late = Wire(serve_in_memory(daemon, nursery, "late:1"), answer_heartbeats=False)
    start = trio.current_time()
    await trio.sleep(10.0)
    await late.send(MAGIC_V2)
    assert await late.response() == b"_heartbeat_"
    assert trio.current_time() == start + 40.0


async def test_message_timeout_redelivers_with_attempts_two(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(
        daemon, nursery, "t", "c", rdy=1, msg_timeout=5000, heartbeat_interval=60000
    )
    producer = await connect(daemon, nursery)
    await producer.send(pub("t", b"x"))
    await producer.response()
    first = await consumer.message()
    delivered = trio.current_time()
    assert first.attempts == 1
    again = await consumer.message()
    assert (again.attempts, again.id, again.body) == (2, first.id, b"x")
    assert trio.current_time() == delivered + 5.0
    assert daemon.topics["t"].channels["c"].timeout_count == 1


async def test_req_with_delay_redelivers_exactly_then(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=1)
    producer = await connect(daemon, nursery)
    await producer.send(pub("t", b"x"))
    await producer.response()
    msg_id = (await consumer.message()).id
    requeued = trio.current_time()
    await consumer.send(b"REQ " + msg_id + b" 2000\n")
    assert (await consumer.message()).attempts == 2
    assert trio.current_time() == requeued + 2.0


async def test_req_delay_is_clamped_to_max_req_timeout(
    start_daemon: StartDaemon, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    lmqd = await start_daemon(max_req_timeout=10.0)
    consumer = await subscriber(lmqd.broker, nursery, "t", "c", rdy=1, heartbeat_interval=60000)
    lmqd.broker.publish("t", [b"x"])
    msg_id = (await consumer.message()).id
    requeued = trio.current_time()
    await consumer.send(b"REQ " + msg_id + b" 99999999\n")  # clamped, not an error (nsqd)
    assert (await consumer.message()).attempts == 2
    assert trio.current_time() == requeued + 10.0
    lmqd.shutdown()


async def test_dpub_delivers_at_its_time(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=5)
    producer = await connect(daemon, nursery)
    sent = trio.current_time()
    await producer.send(b"DPUB t 1500\n" + struct.pack(">i", 5) + b"later")
    assert await producer.response() == b"OK"
    assert (await consumer.message()).body == b"later"
    assert trio.current_time() == sent + 1.5


async def test_touch_extends_deadline(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(
        daemon, nursery, "t", "c", rdy=1, msg_timeout=4000, heartbeat_interval=60000
    )
    daemon.publish("t", [b"x"])
    msg_id = (await consumer.message()).id
    delivered = trio.current_time()
    await trio.sleep(3)
    await consumer.send(b"TOUCH " + msg_id + b"\n")
    assert (await consumer.message()).attempts == 2
    assert trio.current_time() == delivered + 3.0 + 4.0


async def test_disconnect_requeues_in_flight_at_once(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    first = await subscriber(daemon, nursery, "t", "c", rdy=1)
    daemon.publish("t", [b"x"])
    msg_id = (await first.message()).id
    second = await subscriber(daemon, nursery, "t", "c", rdy=1)
    left = trio.current_time()
    await first.stream.aclose()
    again = await second.message()
    assert (again.id, again.attempts) == (msg_id, 2)
    assert trio.current_time() == left  # not after the 60 s msg timeout, as nsqd would


async def test_rdy_zero_stops_delivery_and_window_is_respected(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=2)
    daemon.publish("t", [b"1", b"2", b"3"])
    ids = [(await consumer.message()).id for _ in range(2)]
    await trio.testing.wait_all_tasks_blocked()
    channel = daemon.topics["t"].channels["c"]
    assert (channel.in_flight_count, channel.depth) == (2, 1)  # RDY is a window: 2 in flight
    await consumer.send(b"RDY 0\nFIN " + ids[0] + b"\n")
    await trio.testing.wait_all_tasks_blocked()
    assert (channel.in_flight_count, channel.depth) == (1, 1)  # freed, but RDY 0 sends nothing
    await consumer.send(b"RDY 1\nFIN " + ids[1] + b"\n")
    assert (await consumer.message()).body == b"3"


async def test_rdy_over_max_rdy_count_is_fatal(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=2500)
    await consumer.send(b"RDY 2501\n")
    assert as_sent(await consumer.error()) == b"E_INVALID RDY count 2501 out of range 0-2500"
    assert await consumer.closed()


async def test_fin_unknown_id_is_not_fatal(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=1)
    await consumer.send(b"FIN 0123456789abcdef\n")
    assert as_sent(await consumer.error()) == (
        b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"
    )
    daemon.publish("t", [b"still here"])
    assert (await consumer.message()).body == b"still here"


async def test_responses_before_a_fatal_error_are_sent_first(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    client = await connect(daemon, nursery)
    await client.send(pub("t", b"a") + b"ASDF\n" + pub("t", b"never"))
    assert await client.response() == b"OK"
    assert as_sent(await client.error()) == b"E_INVALID invalid command ASDF"
    assert await client.closed()
    assert daemon.topics["t"].message_count == 1


async def test_cls_answers_close_wait_and_ignores_later_rdy(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=1)
    await consumer.send(b"CLS\nRDY 5\n")
    assert await consumer.response() == b"CLOSE_WAIT"
    daemon.publish("t", [b"x"])
    await trio.testing.wait_all_tasks_blocked()
    assert daemon.topics["t"].channels["c"].depth == 1


async def test_ephemeral_channel_goes_with_its_last_consumer(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t#tmp", "c#ephemeral", rdy=1)
    assert "c#ephemeral" in daemon.topics["t#tmp"].channels
    await consumer.stream.aclose()
    await trio.testing.wait_all_tasks_blocked()
    assert "t#tmp" not in daemon.topics  # its last channel went, so the ephemeral topic did too


async def test_deleting_a_channel_closes_its_consumers_connections(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=1)
    other = await subscriber(daemon, nursery, "t", "keep", rdy=1)
    daemon.topics["t"].delete_channel("c")
    assert await consumer.closed()
    daemon.publish("t", [b"x"])
    assert (await other.message()).body == b"x"


async def test_a_buffer_of_fins_with_one_unknown_id(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=3)
    daemon.publish("t", [b"1", b"2"])
    ids = [(await consumer.message()).id for _ in range(2)]
    await consumer.send(b"FIN " + ids[0] + b"\nFIN ffffffffffffffff\nFIN " + ids[1] + b"\n")
    assert as_sent(await consumer.error()) == (
        b"E_FIN_FAILED FIN ffffffffffffffff failed ID not in flight"
    )
    await trio.testing.wait_all_tasks_blocked()
    assert daemon.topics["t"].channels["c"].in_flight_count == 0


async def test_pub_counts_count_messages_in_a_coalesced_buffer(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    producer = await connect(daemon, nursery)
    mpub = b"MPUB t\n" + struct.pack(">ii", 4 + 2 * 5, 2) + (struct.pack(">i", 1) + b"m") * 2
    await producer.send(pub("t", b"a") + pub("t", b"b") + mpub)  # one buffer, one publish
    for _ in range(3):
        assert await producer.response() == b"OK"
    assert [p.to_dict() for p in daemon.producers()[0].pub_counts] == [{"topic": "t", "count": 4}]
