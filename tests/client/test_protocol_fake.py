"""The trio clients' protocol handling, against a scripted fake daemon over memory streams.

Rules for this module: no sockets (``FakeNetwork`` hands the client memory streams); every test
runs on the ``autojump_clock`` so timeouts cost no real time, and asserts exact virtual times;
each test is bounded by ``trio.fail_after`` on that clock.
"""

from __future__ import annotations

import json

import pytest
import trio
import trio.lowlevel

from lmq_client import errors
from lmq_client.connection import Connection
from lmq_client.producer import Producer
from lmqd.protocol import Dpub, Identify, Mpub, Nop, Pub, encode_response

from .fakes import IDENTIFY_RESPONSE, FakeNetwork


async def test_producer_handshake_identify_and_pub(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                identify = await fake.handshake()
                assert identify["feature_negotiation"] is True
                assert identify["heartbeat_interval"] == 30000
                assert identify["user_agent"].startswith("lmq_client/")
                pub = await fake.expect(Pub)
                assert (pub.topic, pub.body) == ("t", b"hello")
                await fake.respond()
                mpub = await fake.expect(Mpub)
                assert mpub.bodies == [b"a", b"b"]
                await fake.respond()
                dpub = await fake.expect(Dpub)
                assert (dpub.defer_ms, dpub.body) == (1500, b"later")
                await fake.respond()

            nursery.start_soon(daemon)
            async with Producer("fake:4150", open_stream=net.open_stream) as producer:
                await producer.publish("t", b"hello")
                await producer.mpub("t", [b"a", b"b"])
                await producer.dpub("t", 1.5, b"later")


async def test_pipelined_answers_in_order_and_fatal_error(autojump_clock: trio.abc.Clock) -> None:
    """Three publishes in flight: OK, a fatal error (raised with its code), then the close."""
    net = FakeNetwork()
    results: dict[int, object] = {}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def answer() -> None:
                fake = await net.accept()
                await fake.handshake()
                # all three arrive before any answer: they were pipelined
                for _ in range(3):
                    await fake.expect(Mpub)
                await fake.respond()
                await fake.error(b"E_MPUB_FAILED MPUB failed disk full")
                await fake.close()

            nursery.start_soon(answer)
            async with Producer("fake:4150", open_stream=net.open_stream) as producer:

                async def publish(i: int) -> None:
                    try:
                        await producer.mpub("t", [b"m%d" % i])
                        results[i] = "ok"
                    except errors.LmqClientError as exc:
                        results[i] = exc

                async with trio.open_nursery() as pubs:
                    for i in range(3):
                        pubs.start_soon(publish, i)
                        await trio.lowlevel.checkpoint()
    assert results[0] == "ok"
    assert isinstance(results[1], errors.MpubFailedError)
    assert results[1].code == "E_MPUB_FAILED"
    assert results[1].text == "MPUB failed disk full"
    assert isinstance(results[2], errors.ConnectionFailed)
    assert isinstance(results[2], ConnectionError)
    assert "fake:4150" in str(results[2])


async def test_error_frame_codes_map_to_exceptions(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def answer() -> None:
                fake = await net.accept()
                await fake.handshake()
                await fake.expect(Pub)
                await fake.error(b"E_BAD_MESSAGE PUB message too big 105 > 100")
                await fake.close()

            nursery.start_soon(answer)
            async with Producer("fake:4150", open_stream=net.open_stream) as producer:
                with pytest.raises(errors.BadMessageError) as info:
                    await producer.publish("t", b"x" * 105)
    assert info.value.code == "E_BAD_MESSAGE"
    assert info.value.fatal
    assert str(info.value) == "E_BAD_MESSAGE PUB message too big 105 > 100 (from fake:4150)"


async def test_heartbeat_answered_with_nop_then_pub_still_matched(
    autojump_clock: trio.abc.Clock,
) -> None:
    net = FakeNetwork()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def answer() -> None:
                fake = await net.accept()
                await fake.handshake()
                await fake.expect(Pub)
                # a heartbeat arrives before the answer: it must not be taken for it
                await fake.send(encode_response(b"_heartbeat_"))
                await fake.expect(Nop)
                await fake.respond(b"OK")

            nursery.start_soon(answer)
            async with Producer("fake:4150", open_stream=net.open_stream) as producer:
                await producer.publish("t", b"x")


async def test_partial_frames_are_reassembled(autojump_clock: trio.abc.Clock) -> None:
    """The IDENTIFY answer and a PUB's OK arrive a few bytes at a time, with pauses."""
    net = FakeNetwork()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await fake.expect(Identify)
                answer = {**IDENTIFY_RESPONSE, "max_rdy_count": 7}
                frame = encode_response(json.dumps(answer).encode())
                for i in range(0, len(frame), 5):
                    await fake.send(frame[i : i + 5])
                    await trio.sleep(0.01)
                await fake.expect(Pub)
                frame = encode_response(b"_heartbeat_") + encode_response(b"OK")
                for byte in frame:
                    await fake.send(bytes([byte]))
                    await trio.sleep(0.001)

            nursery.start_soon(daemon)
            async with Producer("fake:4150", open_stream=net.open_stream) as producer:
                conn = await producer.connect()
                assert conn.max_rdy_count == 7
                await producer.publish("t", b"x")


async def test_missed_heartbeats_close_the_connection(autojump_clock: trio.abc.Clock) -> None:
    """Silence for 2 heartbeat intervals + 5 s grace ends the connection, at exactly that time."""
    net = FakeNetwork()
    conn = Connection("fake:4150", heartbeat_interval=1.0, open_stream=net.open_stream)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await fake.handshake()

            nursery.start_soon(daemon)
            await nursery.start(conn.run)
            start = trio.current_time()
            await conn.wait_closed()
            assert trio.current_time() - start == pytest.approx(7.0)
    assert isinstance(conn.error, errors.ConnectionFailed)
    assert "heartbeats missed" in str(conn.error)


async def test_identify_error_is_raised_by_connect(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await fake.expect(Identify)
                await fake.error(b"E_BAD_BODY IDENTIFY heartbeat interval (1) is invalid")
                await fake.close()

            nursery.start_soon(daemon)
            with pytest.raises(errors.BadBodyError, match="heartbeat interval"):
                async with Producer("fake:4150", open_stream=net.open_stream):
                    pass


async def test_failover_to_next_address_and_unreachable_names_all(
    autojump_clock: trio.abc.Clock,
) -> None:
    net = FakeNetwork()
    net.refuse = {"a:1"}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                assert fake.address == "b:2"
                await fake.handshake()

            nursery.start_soon(daemon)
            async with Producer(["a:1", "b:2"], open_stream=net.open_stream) as producer:
                assert producer.address == "b:2"
        net.refuse = {"a:1", "b:2"}
        with pytest.raises(errors.ConnectionFailed) as info:
            async with Producer(["a:1", "b:2"], open_stream=net.open_stream):
                pass
        assert "a:1" in str(info.value) and "b:2" in str(info.value)
        assert "Connection refused" in str(info.value)


async def test_invalid_topic_rejected_before_sending(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await fake.handshake()

            nursery.start_soon(daemon)
            async with Producer("fake:4150", open_stream=net.open_stream) as producer:
                with pytest.raises(errors.InvalidNameError):
                    await producer.publish("bad topic!", b"x")
