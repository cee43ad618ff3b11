"""The TCP connection handler driven over in-memory streams, on trio's autojump clock.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs (listening on 127.0.0.1 port 0, unused); each test client talks to a
  ``TcpClient`` through ``trio.testing.memory_stream_pair()`` so virtual time is exact.
- Bytes are written and checked raw, as a client would see them: frames are read by size.
- Every timeout assertion is an exact virtual time.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from lmqd.broker import Broker
from lmqd.options import Options
from lmqd.server import TcpConnection
from lmqd.service import LmqDaemon

MAGIC = b"  V2"


def pub(topic: str, body: bytes) -> bytes:
    return f"PUB {topic}\n".encode() + struct.pack(">i", len(body)) + body


def identify(**fields: object) -> bytes:
    body = json.dumps(fields).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(body)) + body


class RawClient:
    """The client end of one connection: send bytes, read frames by their size prefix."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buffer) >= 4:
                (size,) = struct.unpack(">i", self.buffer[:4])
                if len(self.buffer) >= 4 + size:
                    frame_type = struct.unpack(">i", self.buffer[4:8])[0]
                    data = bytes(self.buffer[8 : 4 + size])
                    del self.buffer[: 4 + size]
                    return frame_type, data
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise EOFError("connection closed")
            self.buffer += chunk

    async def response(self) -> bytes:
        frame_type, data = await self.frame()
        assert frame_type == 0, (frame_type, data)
        return data

    async def error(self) -> bytes:
        frame_type, data = await self.frame()
        assert frame_type == 1, (frame_type, data)
        return data

    async def message(self) -> tuple[int, int, bytes, bytes]:
        frame_type, data = await self.frame()
        assert frame_type == 2, (frame_type, data)
        timestamp, attempts = struct.unpack(">qH", data[:10])
        return timestamp, attempts, data[10:26], data[26:]

    async def closed(self) -> bool:
        """True once the server has closed the connection (after any frames pending)."""
        try:
            while True:
                await self.frame()
        except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
            return True


@pytest.fixture
async def daemon(nursery: trio.Nursery, tmp_path: object) -> AsyncIterator[Broker]:
    options = Options(tcp_address="127.0.0.1:0", http_address="", data_path=str(tmp_path))
    lmqd = LmqDaemon(options)
    await nursery.start(lmqd.run)
    yield lmqd.broker
    lmqd.shutdown()


async def connect(daemon: Broker, nursery: trio.Nursery, name: str = "test") -> RawClient:
    client_end, server_end = trio.testing.memory_stream_pair()
    handler = TcpConnection(daemon, server_end, f"{name}:1")

    async def serve() -> None:
        try:
            await handler.serve()
        finally:
            await server_end.aclose()  # as lmqd.server.tcp does for a socket

    nursery.start_soon(serve)
    client = RawClient(client_end)
    await client.send(MAGIC)
    return client


async def subscriber(
    daemon: Broker, nursery: trio.Nursery, topic: str, channel: str, rdy: int, **ident: object
) -> RawClient:
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
    _, attempts, msg_id, body = await consumer.message()
    assert (attempts, body) == (1, b"hello")
    _, _, msg_id2, body2 = await consumer.message()
    assert body2 == b"world"
    await consumer.send(b"FIN " + msg_id + b"\nFIN " + msg_id2 + b"\n")
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


async def test_message_timeout_redelivers_with_attempts_two(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(
        daemon, nursery, "t", "c", rdy=1, msg_timeout=5000, heartbeat_interval=60000
    )
    producer = await connect(daemon, nursery)
    await producer.send(pub("t", b"x"))
    await producer.response()
    _, attempts, msg_id, _ = await consumer.message()
    delivered = trio.current_time()
    assert attempts == 1
    _, attempts, msg_id2, body = await consumer.message()
    assert (attempts, msg_id2, body) == (2, msg_id, b"x")
    assert trio.current_time() == delivered + 5.0
    assert daemon.topics["t"].channels["c"].timeout_count == 1


async def test_req_with_delay_redelivers_exactly_then(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=1)
    producer = await connect(daemon, nursery)
    await producer.send(pub("t", b"x"))
    await producer.response()
    _, _, msg_id, _ = await consumer.message()
    requeued = trio.current_time()
    await consumer.send(b"REQ " + msg_id + b" 2000\n")
    _, attempts, _, _ = await consumer.message()
    assert attempts == 2
    assert trio.current_time() == requeued + 2.0


async def test_req_delay_is_clamped_to_max_req_timeout(
    nursery: trio.Nursery, tmp_path: object, autojump_clock: trio.testing.MockClock
) -> None:
    options = Options(
        tcp_address="127.0.0.1:0", http_address="", data_path=str(tmp_path), max_req_timeout=10.0
    )
    lmqd = LmqDaemon(options)
    await nursery.start(lmqd.run)
    consumer = await subscriber(lmqd.broker, nursery, "t", "c", rdy=1, heartbeat_interval=60000)
    lmqd.broker.publish("t", [b"x"])
    _, _, msg_id, _ = await consumer.message()
    requeued = trio.current_time()
    await consumer.send(b"REQ " + msg_id + b" 99999999\n")  # clamped, not an error (nsqd)
    _, attempts, _, _ = await consumer.message()
    assert attempts == 2
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
    _, _, _, body = await consumer.message()
    assert body == b"later"
    assert trio.current_time() == sent + 1.5


async def test_touch_extends_deadline(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(
        daemon, nursery, "t", "c", rdy=1, msg_timeout=4000, heartbeat_interval=60000
    )
    daemon.publish("t", [b"x"])
    _, _, msg_id, _ = await consumer.message()
    delivered = trio.current_time()
    await trio.sleep(3)
    await consumer.send(b"TOUCH " + msg_id + b"\n")
    _, attempts, _, _ = await consumer.message()
    assert attempts == 2
    assert trio.current_time() == delivered + 3.0 + 4.0


async def test_disconnect_requeues_in_flight_at_once(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    first = await subscriber(daemon, nursery, "t", "c", rdy=1)
    daemon.publish("t", [b"x"])
    _, _, msg_id, _ = await first.message()
    second = await subscriber(daemon, nursery, "t", "c", rdy=1)
    left = trio.current_time()
    await first.stream.aclose()
    _, attempts, msg_id2, _ = await second.message()
    assert (msg_id2, attempts) == (msg_id, 2)
    assert trio.current_time() == left  # not after the 60 s msg timeout, as nsqd would


async def test_rdy_zero_stops_delivery_and_window_is_respected(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=2)
    daemon.publish("t", [b"1", b"2", b"3"])
    ids = [(await consumer.message())[2] for _ in range(2)]
    await trio.testing.wait_all_tasks_blocked()
    channel = daemon.topics["t"].channels["c"]
    assert (channel.in_flight_count, channel.depth) == (2, 1)  # RDY is a window: 2 in flight
    await consumer.send(b"RDY 0\nFIN " + ids[0] + b"\n")
    await trio.testing.wait_all_tasks_blocked()
    assert (channel.in_flight_count, channel.depth) == (1, 1)  # freed, but RDY 0 sends nothing
    await consumer.send(b"RDY 1\nFIN " + ids[1] + b"\n")
    assert (await consumer.message())[3] == b"3"


async def test_rdy_over_max_rdy_count_is_fatal(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=2500)
    await consumer.send(b"RDY 2501\n")
    assert await consumer.error() == b"E_INVALID RDY count 2501 out of range 0-2500"
    assert await consumer.closed()


async def test_fin_unknown_id_is_not_fatal(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=1)
    await consumer.send(b"FIN 0123456789abcdef\n")
    assert await consumer.error() == b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"
    daemon.publish("t", [b"still here"])
    assert (await consumer.message())[3] == b"still here"


async def test_responses_before_a_fatal_error_are_sent_first(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    client = await connect(daemon, nursery)
    await client.send(pub("t", b"a") + b"ASDF\n" + pub("t", b"never"))
    assert await client.response() == b"OK"
    assert await client.error() == b"E_INVALID invalid command ASDF"
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
    assert (await other.message())[3] == b"x"


async def test_a_buffer_of_fins_with_one_unknown_id(
    daemon: Broker, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    consumer = await subscriber(daemon, nursery, "t", "c", rdy=3)
    daemon.publish("t", [b"1", b"2"])
    ids = [(await consumer.message())[2] for _ in range(2)]
    await consumer.send(b"FIN " + ids[0] + b"\nFIN ffffffffffffffff\nFIN " + ids[1] + b"\n")
    assert await consumer.error() == b"E_FIN_FAILED FIN ffffffffffffffff failed ID not in flight"
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
