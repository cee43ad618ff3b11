"""lmq's replay endpoints: channels created at an offset or time, seek, reading by offset.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs in-process on 127.0.0.1 port 0 (``start_daemon``) with its data in
  ``tmp_path``; requests go over a real socket (``tests.support.http``); consumers speak V2
  (``tests.support.wire``).
- Every test body runs under ``trio.fail_after(TIMEOUT)``.
- Times given to the daemon are the messages' own timestamps (read back through the API), never
  guesses about the wall clock.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest
import trio

from lmqd.message import READ_CONTENT_TYPE, READ_FRAME, decode_read_frames
from lmqd.message_ext import MessageExt
from lmqd.positions import MAX_OFFSET, parse_number, parse_position
from tests.support.daemon import RunningDaemon, StartDaemon, eventually
from tests.support.http import http
from tests.support.wire import Wire, consume_exactly

TIMEOUT = 10.0


async def publish(running: RunningDaemon, topic: str, bodies: list[bytes]) -> None:
    r = await http(running.http, "POST", f"/mpub?topic={topic}", b"\n".join(bodies))
    assert r.status == 200


async def consume(running: RunningDaemon, topic: str, channel: str, count: int) -> list[bytes]:
    return await consume_exactly(running.tcp, topic, channel, count)


def frames(data: bytes) -> list[tuple[int, int, int, bytes, bytes]]:
    """(offset, timestamp, attempts, id, body) of each message of a binary /topic/read."""
    out = []
    pos = 0
    while pos < len(data):
        size, offset, ts, attempts, msg_id = READ_FRAME.unpack_from(data, pos)
        start = pos + READ_FRAME.size
        end = pos + 4 + size
        out.append((offset, ts, attempts, msg_id, data[start:end]))
        pos = end
    return out


def test_positions_parse() -> None:
    assert parse_position("earliest") is not None and parse_position("earliest").earliest
    assert parse_position("latest") is not None and parse_position("latest").latest
    assert parse_position("offset:17") is not None and parse_position("offset:17").offset == 17
    assert parse_position("1700000000123").time_ns == 1_700_000_000_123_000_000  # type: ignore[union-attr]
    when = parse_position("2023-11-14T22:13:20.5Z")
    assert when is not None and when.time_ns == 1_700_000_000_500_000_000
    assert parse_position("2023-11-14T23:13:20+01:00").time_ns == 1_700_000_000 * 10**9  # type: ignore[union-attr]
    for bad in ("", "soon", "offset:", "offset:-1", "-5", "2023-11-14", "2023-11-14T22:13:20",
                "1.5", "offset:1e3", "offset:\u0663"):
        assert parse_position(bad) is None, bad
    # Past int64 is past everything stored, without converting thousands of digits.
    huge = parse_position("offset:" + "9" * 5000)
    assert huge is not None and huge.offset == MAX_OFFSET
    assert parse_position("offset:" + "0" * 40 + "7") == parse_position("offset:7")
    assert parse_number("9223372036854775807") == parse_number("9223372036854775808") == MAX_OFFSET


@pytest.mark.parametrize("mem_queue_size", [0, 10_000])
async def test_a_channel_created_from_earliest_replays_the_retained_log(
    start_daemon: StartDaemon, mem_queue_size: int
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, mem_queue_size=mem_queue_size)
        base = running.http
        # Kept on disk: no channel yet (the topic holds them), then written at once
        # (--mem-queue-size=0) or on the way to the first channel below (memory first).
        await publish(running, "t", [b"a", b"b", b"c"])
        assert await consume(running, "t", "first", 3) == [b"a", b"b", b"c"]
        assert (await http(base, "POST", "/channel/create?topic=t&channel=late")).status == 200
        r = await http(base, "POST", "/channel/create?topic=t&channel=replay&from=earliest")
        assert (r.status, r.body) == (200, b"")
        await publish(running, "t", [b"d"])
        assert await consume(running, "t", "late", 1) == [b"d"]  # nsqd: new ones only
        replayed = await consume(running, "t", "replay", 4 if mem_queue_size == 0 else 1)
        # Memory first: what the only channel read from memory never reached the disk.
        assert replayed == ([b"a", b"b", b"c", b"d"] if mem_queue_size == 0 else [b"d"])


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("how", ["create", "seek"])
async def test_replayed_messages_are_first_deliveries(
    start_daemon: StartDaemon, how: str, durable: bool
) -> None:
    """A channel created from the earliest offset, or moved back to it, delivers what it replays
    (what another channel took first) with attempts 1: nothing of it was delivered to the
    channel before."""
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(
            http=True, mem_queue_size=0, retention_ms=3_600_000, durable=durable
        )
        await publish(running, "t", [b"a", b"b", b"c"])
        assert await consume(running, "t", "first", 3) == [b"a", b"b", b"c"]
        if how == "create":
            r = await http(running.http, "POST", "/channel/create?topic=t&channel=c&from=earliest")
        else:
            await http(running.http, "POST", "/channel/create?topic=t&channel=c")
            r = await http(running.http, "POST", "/channel/seek?topic=t&channel=c&to=earliest")
        assert r.status == 200
        wire = await Wire.connect(running.tcp)
        await wire.sub("t", "c", rdy=10)
        got = [await wire.message() for _ in range(3)]
        assert [(m.body, m.attempts) for m in got] == [(b"a", 1), (b"b", 1), (b"c", 1)]
        await wire.aclose()


async def test_replay_from_a_time_and_seek(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, mem_queue_size=0)
        base = running.http
        await publish(running, "t", [b"old1", b"old2"])
        await trio.sleep(0.01)
        await publish(running, "t", [b"new1", b"new2"])
        r = await http(base, "GET", "/topic/read?topic=t&offset=0&format=json")
        assert r.status == 200
        messages = r.json()["messages"]
        assert [m["offset"] for m in messages] == [0, 1, 2, 3]
        new_ts = messages[2]["timestamp"]
        assert new_ts > messages[1]["timestamp"]
        ms = new_ts // 1_000_000  # at or before it, 10 ms after the old ones
        r = await http(base, "POST", f"/channel/create?topic=t&channel=since&from={ms}")
        assert r.status == 200
        assert await consume(running, "t", "since", 2) == [b"new1", b"new2"]
        rfc = datetime.fromtimestamp(new_ts / 1e9 - 0.0005, UTC).isoformat()
        rfc = rfc.replace("+00:00", "Z")
        r = await http(base, "POST", f"/channel/create?topic=t&channel=rfc&from={rfc}")
        assert r.status == 200
        assert await consume(running, "t", "rfc", 2) == [b"new1", b"new2"]

        r = await http(base, "POST", "/channel/seek?topic=t&channel=since&to=earliest")
        assert (r.status, r.json()) == (200, {"offset": 0})
        assert await consume(running, "t", "since", 4) == [b"old1", b"old2", b"new1", b"new2"]
        r = await http(base, "POST", "/channel/seek?topic=t&channel=since&to=offset:3")
        assert r.json() == {"offset": 3}
        assert await consume(running, "t", "since", 1) == [b"new2"]
        r = await http(base, "POST", "/channel/seek?topic=t&channel=since&to=latest")
        assert r.json() == {"offset": 4}


async def test_seek_leaves_in_flight_messages_to_settle(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, mem_queue_size=0)
        await publish(running, "t", [b"a", b"b"])
        wire = await Wire.connect(running.tcp)
        await wire.sub("t", "c", rdy=1)
        held = await wire.message()
        r = await http(running.http, "POST", "/channel/seek?topic=t&channel=c&to=latest")
        assert r.json() == {"offset": 2}
        channel = running.broker.topics["t"].channels["c"]
        assert (channel.depth, channel.in_flight_count) == (0, 1)
        await wire.fin(held.id)
        await wire.send(b"NOP\n")
        with trio.move_on_after(0.2):
            extra = await wire.frame()
            pytest.fail(f"FIN of a message in flight across a seek failed: {extra}")
        assert channel.in_flight_count == 0
        await wire.aclose()


async def test_reading_by_offset_consumes_nothing(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, mem_queue_size=2)
        base = running.http
        bodies = [b"m%d" % i for i in range(7)]
        await publish(running, "t", bodies)  # 5 in the log, 2 in memory
        r = await http(base, "GET", "/topic/offsets?topic=t")
        assert (r.status, r.json()) == (
            200, {"topic": "t", "earliest": 0, "end": 7, "pumped": 0},
        )
        r = await http(base, "GET", "/topic/offsets?topic=t&at=latest")
        assert r.json()["offset"] == 7
        r = await http(base, "GET", "/topic/read?topic=t&offset=3&count=3")
        assert r.status == 200
        assert r.headers["content-type"] == READ_CONTENT_TYPE
        assert (r.headers["x-lmq-next-offset"], r.headers["x-lmq-end-offset"]) == ("6", "7")
        got = frames(r.body)
        assert [(o, b) for o, _, _, _, b in got] == [(3, b"m3"), (4, b"m4"), (5, b"m5")]
        assert all(a == 0 and len(i) == 16 and ts > 0 for _, ts, a, i, _ in got)
        r = await http(base, "GET", "/topic/read?topic=t&offset=3&count=3&format=json")
        assert r.json()["next"] == 6
        # The JSON answer carries the binary one's offset headers too.
        assert {k: v for k, v in r.headers.items() if k.startswith("x-lmq-")} == {
            "x-lmq-next-offset": "6", "x-lmq-earliest-offset": "0", "x-lmq-end-offset": "7",
        }
        r = await http(base, "GET", "/topic/read?topic=t&offset=0&end=2")
        assert [b for *_, b in frames(r.body)] == [b"m0", b"m1"]
        r = await http(base, "GET", "/topic/read?topic=t&offset=7")
        assert (r.body, r.headers["x-lmq-next-offset"]) == (b"", "7")
        assert await consume(running, "t", "c", 7) == bodies  # all still there


async def test_replay_errors(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        await publish(running, "t", [b"x"])
        await publish(running, "e#ephemeral", [b"x"])
        assert (await http(base, "POST", "/channel/create?topic=t&channel=c")).status == 200
        cases = [
            ("POST", "/channel/create?topic=t&channel=d&from=soon", 400, "INVALID_ARG_FROM"),
            ("POST", "/channel/create?topic=t&channel=c&from=earliest", 400, "CHANNEL_EXISTS"),
            ("POST", "/channel/create?topic=e%23ephemeral&channel=d&from=earliest", 400,
             "NOT_STORED"),
            ("POST", "/channel/create?topic=t&channel=d%23ephemeral&from=earliest", 400,
             "NOT_STORED"),
            ("POST", "/channel/create?topic=nope&channel=d&from=earliest", 404,
             "TOPIC_NOT_FOUND"),
            ("POST", "/channel/seek?topic=t&channel=c", 400, "MISSING_ARG_TO"),
            ("POST", "/channel/seek?topic=t&channel=c&to=x", 400, "INVALID_ARG_TO"),
            ("POST", "/channel/seek?topic=t&channel=nope&to=earliest", 404, "CHANNEL_NOT_FOUND"),
            ("POST", "/channel/seek?topic=nope&channel=c&to=earliest", 404, "TOPIC_NOT_FOUND"),
            ("POST", "/channel/seek?channel=c&to=earliest", 400, "MISSING_ARG_TOPIC"),
            ("POST", "/channel/seek?topic=t&to=earliest", 400, "MISSING_ARG_CHANNEL"),
            ("POST", "/channel/seek?topic=t&channel=b%20d&to=earliest", 400,
             "INVALID_ARG_CHANNEL"),
            ("GET", "/topic/offsets?topic=nope", 404, "TOPIC_NOT_FOUND"),
            ("GET", "/topic/offsets?topic=t&at=x", 400, "INVALID_ARG_AT"),
            ("GET", "/topic/read?topic=t", 400, "MISSING_ARG_OFFSET"),
            ("GET", "/topic/read?topic=t&offset=-1", 400, "INVALID_ARG_OFFSET"),
            ("GET", "/topic/read?topic=t&offset=0&count=0", 400, "INVALID_ARG_COUNT"),
            ("GET", "/topic/read?topic=t&offset=0&count=10001", 400, "INVALID_ARG_COUNT"),
            ("GET", "/topic/read?topic=t&offset=0&count=" + "9" * 5000, 400,
             "INVALID_ARG_COUNT"),
            ("GET", "/topic/read?topic=t&offset=%D9%A3", 400, "INVALID_ARG_OFFSET"),
            ("GET", "/topic/read?topic=t&offset=0&end=x", 400, "INVALID_ARG_END"),
            ("GET", "/topic/read?topic=b%20d&offset=0", 400, "INVALID_ARG_TOPIC"),
        ]
        for method, target, status, message in cases:
            r = await http(base, method, target)
            assert (r.status, r.json()) == (status, {"message": message}), target
        # Offsets past everything stored, however many digits: clamped (seek), read as the end.
        for to in ("offset:" + "9" * 5000, "offset:99999999999999999999", "9" * 30):
            r = await http(base, "POST", f"/channel/seek?topic=t&channel=c&to={to}")
            assert (r.status, r.json()) == (200, {"offset": 1}), to
        r = await http(base, "GET", "/topic/read?topic=t&offset=" + "9" * 5000)
        assert (r.status, r.body) == (200, b"")
        r = await http(base, "GET", "/topic/read?topic=t&offset=0&count=10000&end=" + "9" * 40)
        assert (r.status, len(frames(r.body))) == (200, 1)
        # A binary answer is framed as documented: one 38-byte header per message.
        r = await http(base, "GET", "/topic/read?topic=t&offset=0")
        assert len(r.body) == READ_FRAME.size + 1
        assert struct.unpack_from(">I", r.body)[0] == READ_FRAME.size - 4 + 1


@pytest.mark.parametrize("mem_queue_size", [0, 10_000])
async def test_read_carries_priority_and_headers_when_asked(
    start_daemon: StartDaemon, mem_queue_size: int
) -> None:
    with trio.fail_after(TIMEOUT):
        # read from the topic's log (written at once), or from its memory
        running = await start_daemon(http=True, mem_queue_size=mem_queue_size)
        base = running.http
        await publish(running, "t", [b"plain"])
        r = await http(base, "POST", "/pub?topic=t&priority=7&dedup_id=d1", b"rich",
                       headers=(("Lmq-Header-Trace", "t-1"), ("Lmq-Header-K", "v")))
        assert r.status == 200
        r = await http(base, "POST", "/pub?topic=t&ttl_ms=60000", b"ttl-only")
        assert r.status == 200
        # Without ext=1: the frames every reader got before, no X-Lmq-Ext.
        r = await http(base, "GET", "/topic/read?topic=t&offset=0")
        assert "x-lmq-ext" not in r.headers
        assert [b for *_, b in frames(r.body)] == [b"plain", b"rich", b"ttl-only"]
        r = await http(base, "GET", "/topic/read?topic=t&offset=0&ext=1")
        assert r.headers["x-lmq-ext"] == "1"
        got = decode_read_frames(r.body, ext=True)
        assert [(o, m.body) for o, m in got] == [(0, b"plain"), (1, b"rich"), (2, b"ttl-only")]
        # what a consumer sees: priority and headers; no TTL or dedup id
        assert [m.ext for _, m in got] == [
            None, MessageExt(priority=7, headers=(("trace", "t-1"), ("k", "v"))), None,
        ]
        # a message without a visible field has a 0-length block: 2 bytes more than before
        assert struct.unpack_from(">I", r.body)[0] == READ_FRAME.size - 4 + 2 + len(b"plain")
        r = await http(base, "GET", "/topic/read?topic=t&offset=0&format=json")
        messages = r.json()["messages"]
        assert [sorted(m) for m in messages] == [
            ["attempts", "body", "id", "offset", "timestamp"],
            ["attempts", "body", "headers", "id", "offset", "priority", "timestamp"],
            ["attempts", "body", "id", "offset", "timestamp"],
        ]
        assert (messages[1]["priority"], messages[1]["headers"]) == (7, {"trace": "t-1", "k": "v"})


async def test_a_replayed_channel_counts_the_messages_replay_hands_it(
    start_daemon: StartDaemon,
) -> None:
    # nsqd's message_count counts what the topic puts into a channel; a replay puts messages in
    # again. Without them the count falls behind the depth, and tools' rates (nsq_stat, nsqadmin,
    # lmqadmin stats: count growth minus what is still held) go negative.
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, mem_queue_size=0)

        async def counts(channel: str) -> tuple[int, int]:
            r = await http(running.http, "GET", "/stats?format=json&topic=t")
            [c] = [c for c in r.json()["topics"][0]["channels"] if c["channel_name"] == channel]
            return c["depth"], c["message_count"]

        r = await http(running.http, "POST", "/topic/create?topic=t")
        r = await http(running.http, "POST", "/channel/create?topic=t&channel=live")
        assert r.status == 200
        await publish(running, "t", [b"m%d" % i for i in range(20)])
        r = await http(running.http, "POST", "/channel/create?topic=t&channel=late&from=offset:15")
        assert r.status == 200
        assert await counts("late") == (5, 5)
        await publish(running, "t", [b"n%d" % i for i in range(5)])
        assert await counts("late") == (10, 10)
        wire = await Wire.connect(running.tcp)
        await wire.sub("t", "late", rdy=4)
        taken = [await wire.message() for _ in range(4)]
        await wire.rdy(0)
        for m in taken:
            await wire.fin(m.id)
        channel = running.broker.topics["t"].channels["late"]
        await eventually(lambda: channel.in_flight_count == 0)
        await wire.aclose()
        assert await counts("late") == (6, 10)
        r = await http(running.http, "POST", "/channel/seek?topic=t&channel=late&to=offset:0")
        assert r.json() == {"offset": 0}
        # The 6 not read yet stay counted once; 19 more are handed again: 4 went out.
        assert await counts("late") == (25, 29)
        r = await http(running.http, "POST", "/channel/seek?topic=t&channel=late&to=latest")
        assert await counts("late") == (0, 29)  # a jump ahead takes nothing back


async def test_offsets_a_reader_asks_for_and_does_not_find_are_counted(
    start_daemon: StartDaemon,
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        await publish(running, "t", [b"m%d" % i for i in range(10)])
        # A channel reads them all from memory: they leave it without ever being written.
        assert len(await consume(running, "t", "c", 10)) == 10
        await publish(running, "t", [b"n%d" % i for i in range(3)])
        r = await http(base, "GET", "/topic/offsets?topic=t")
        assert (r.json()["earliest"], r.json()["end"], "lost" in r.json()) == (10, 13, False)
        r = await http(base, "GET", "/topic/offsets?topic=t&from=4")
        assert (r.json()["earliest"], r.json()["lost"]) == (10, 6)
        r = await http(base, "GET", "/topic/offsets?topic=t&from=11")
        assert r.json()["lost"] == 0
        r = await http(base, "GET", "/topic/offsets?topic=t&from=x")
        assert (r.status, r.json()) == (400, {"message": "INVALID_ARG_FROM"})
        # A read from offset 8 gets 10.. and counts 8 and 9.
        r = await http(base, "GET", "/topic/read?topic=t&offset=8&count=2")
        assert [o for o, *_ in frames(r.body)] == [10, 11]
        r = await http(base, "GET", "/topic/read?topic=t&offset=11")  # nothing missing
        assert [o for o, *_ in frames(r.body)] == [11, 12]
        r = await http(base, "GET", "/stats?format=json&topic=t")
        assert r.json()["topics"][0]["reader_lost_count"] == 6 + 2
        r = await http(base, "GET", "/metrics")
        assert b'lmqd_topic_reader_lost_messages_total{topic="t"} 8.0' in r.body


async def test_the_offsets_of_many_topics_in_one_answer(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        await publish(running, "a", [b"1", b"2"])
        await publish(running, "b", [b"3"])
        r = await http(base, "GET", "/topics/offsets")
        assert r.json() == {"topics": {
            "a": {"earliest": 0, "end": 2, "pumped": 0},
            "b": {"earliest": 0, "end": 1, "pumped": 0},
        }}
        r = await http(base, "GET", "/topics/offsets?topics=b,nope,b")
        assert r.json() == {"topics": {"b": {"earliest": 0, "end": 1, "pumped": 0}}}
        r = await http(base, "GET", "/topics/offsets?topics=")
        assert r.json() == {"topics": {}}
        r = await http(base, "GET", "/topics/offsets?topics=a,bad!")
        assert (r.status, r.json()) == (400, {"message": "INVALID_ARG_TOPICS"})


async def test_emptying_a_topic_never_gives_its_offsets_again(start_daemon: StartDaemon) -> None:
    # A reader by offset that read the emptied messages must find them gone, not new messages
    # in their place (the Spark source would skip those silently).
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        await publish(running, "t", [b"m%d" % i for i in range(5)])  # in memory, no channel
        r = await http(base, "POST", "/topic/empty?topic=t")
        assert r.status == 200
        await publish(running, "t", [b"n0", b"n1"])
        r = await http(base, "GET", "/topic/read?topic=t&offset=0")
        assert [(o, b) for o, *_, b in frames(r.body)] == [(5, b"n0"), (6, b"n1")]
        r = await http(base, "GET", "/topic/offsets?topic=t&from=3")
        assert (r.json()["earliest"], r.json()["end"], r.json()["lost"]) == (5, 7, 2)
        # nsqd's behaviour for consumers is unchanged: a channel gets what came after
        assert await consume(running, "t", "c", 2) == [b"n0", b"n1"]
