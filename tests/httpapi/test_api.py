"""nsqd's HTTP endpoints over plain HTTP/1.1: exact status codes, bodies and headers.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs in-process on 127.0.0.1 port 0 (``start_daemon``); requests go over
  a real socket through hypercorn, written and read with h11 so every byte is checked as sent.
- Every test body runs under ``trio.fail_after(TIMEOUT)``.
- Expected texts are nsqd v1.3.0's (nsq-reference §2), never lmqd's own output copied back.
"""

from __future__ import annotations

import gc
import json
import logging
import struct

import trio

from lmqd.names import MAX_NAME_LENGTH
from tests.support.daemon import RunningDaemon, StartDaemon, eventually
from tests.support.http import http, http_headers_only
from tests.support.wire import Wire

TIMEOUT = 10.0


async def subscribed(running: RunningDaemon, topic: str, channel: str, rdy: int) -> Wire:
    client = await Wire.connect(running.tcp)
    await client.sub(topic, channel, rdy)
    return client


def binary_mpub(*bodies: bytes) -> bytes:
    return struct.pack(">i", len(bodies)) + b"".join(
        struct.pack(">i", len(b)) + b for b in bodies
    )


async def test_ping_answers_health_in_plain_text(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        r = await http(running.http, "GET", "/ping")
        assert (r.status, r.body) == (200, b"OK")
        assert r.headers["content-type"] == "text/plain; charset=utf-8"
        assert not r.v1  # /ping is nsqd's PlainText handler, not V1
        error = "write /data/t.diskqueue: no space left on device"
        running.broker.set_health(error)
        r = await http(running.http, "GET", "/ping")
        assert (r.status, r.body) == (500, f"NOK - {error}".encode())
        stats = (await http(running.http, "GET", "/stats?format=json")).json()
        assert stats["health"] == f"NOK - {error}"
        running.broker.set_health(None)
        assert (await http(running.http, "GET", "/ping")).body == b"OK"


async def test_info(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(
            http=True, broadcast_address="node-1.example", max_heartbeat_interval=45.0,
            max_output_buffer_timeout=0.5, max_deflate_level=3,
        )
        r = await http(running.http, "GET", "/info")
        assert r.status == 200 and r.v1
        info = r.json()
        assert list(info) == [
            "version", "broadcast_address", "hostname", "http_port", "tcp_port", "start_time",
            "max_heartbeat_interval", "max_output_buffer_size", "max_output_buffer_timeout",
            "max_deflate_level",
        ]
        assert info["version"] == "1.3.0"
        assert info["broadcast_address"] == "node-1.example"
        assert info["http_port"] == running.http[1]
        assert info["tcp_port"] == running.tcp[1]
        assert info["start_time"] == running.broker.start_time
        assert info["max_heartbeat_interval"] == 45_000_000_000  # Go Duration: nanoseconds
        assert info["max_output_buffer_timeout"] == 500_000_000
        assert info["max_output_buffer_size"] == 65536
        assert info["max_deflate_level"] == 3


async def test_pub_delivers_through_the_topic(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        r = await http(running.http, "POST", "/topic/create?topic=orders")
        consumer = await subscribed(running, "orders", "ship", 10)
        r = await http(running.http, "POST", "/pub?topic=orders", b"order 1")
        assert (r.status, r.body, r.v1) == (200, b"OK", True)
        message = await consumer.message()
        assert (message.attempts, message.body) == (1, b"order 1")
        topic = running.broker.topics["orders"]
        assert (topic.message_count, topic.message_bytes) == (1, 7)
        await consumer.aclose()


async def test_pub_defer(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, max_req_timeout=10.0)
        await http(running.http, "POST", "/topic/create?topic=t")
        await http(running.http, "POST", "/channel/create?topic=t&channel=c")
        channel = running.broker.topics["t"].channels["c"]
        r = await http(running.http, "POST", "/pub?topic=t&defer=10000", b"later")  # = max
        assert (r.status, r.body) == (200, b"OK")
        assert channel.deferred_count == 1 and channel.depth == 0
        r = await http(running.http, "POST", "/pub?topic=t&defer=0", b"now")
        assert r.status == 200 and channel.depth == 1
        for bad in ("10001", "-1", "1.5", "1e3", "", "abc", "99999999999999999999"):
            r = await http(running.http, "POST", f"/pub?topic=t&defer={bad}", b"x")
            assert (r.status, r.json()) == (400, {"message": "INVALID_DEFER"}), bad
        # nsqd creates the topic before it validates defer.
        r = await http(running.http, "POST", "/pub?topic=fresh&defer=-5", b"x")
        assert r.status == 400
        assert "fresh" in running.broker.topics
        assert running.broker.topics["t"].message_count == 2


async def test_pub_bad_requests(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, max_msg_size=100)
        cases = [
            ("GET", "/pub?topic=t", None, 405, "METHOD_NOT_ALLOWED"),
            ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
            ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
            ("POST", "/pub?channel=t", b"x", 400, "MISSING_ARG_TOPIC"),
            ("POST", "/pub?topic=bad!name", b"x", 400, "INVALID_TOPIC"),
            ("POST", "/pub?topic=" + "a" * (MAX_NAME_LENGTH + 1), b"x", 400, "INVALID_TOPIC"),
            ("POST", "/pub?topic=", b"x", 400, "INVALID_TOPIC"),
            ("POST", "/pub?topic=t&x=%zz", b"x", 400, "INVALID_REQUEST"),
            ("POST", "/pub?topic=t;x=1", b"x", 400, "INVALID_REQUEST"),
            # the size is checked before the topic
            ("POST", "/pub", b"x" * 101, 413, "MSG_TOO_BIG"),
        ]
        for method, target, body, status, message in cases:
            r = await http(running.http, method, target, body)
            assert (r.status, r.json(), r.v1) == (status, {"message": message}, True), target
        r = await http(running.http, "GET", "/pub?topic=t")
        assert r.headers["allow"] == "OPTIONS, POST"
        # exactly max-msg-size is fine
        r = await http(running.http, "POST", "/pub?topic=t", b"y" * 100)
        assert (r.status, r.body) == (200, b"OK")
        assert running.broker.topics["t"].message_count == 1


async def test_oversized_bodies_are_refused_before_and_while_reading(
    start_daemon: StartDaemon,
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, max_msg_size=1000, max_body_size=5000)
        # Content-Length alone decides: the answer comes without the body ever being sent.
        r = await http_headers_only(running.http, "POST", "/pub?topic=t", 10**9)
        assert (r.status, r.json()) == (413, {"message": "MSG_TOO_BIG"})
        r = await http_headers_only(running.http, "POST", "/mpub?topic=t", 5001)
        assert (r.status, r.json()) == (413, {"message": "BODY_TOO_BIG"})
        r = await http_headers_only(running.http, "PUT", "/config/log_level", 10**9)
        assert (r.status, r.json()) == (413, {"message": "INVALID_VALUE"})
        # Without a Content-Length (chunked) the read is bounded and the result the same.
        r = await http(running.http, "POST", "/pub?topic=t", b"z" * 200_000, chunked=True)
        assert (r.status, r.json()) == (413, {"message": "MSG_TOO_BIG"})
        r = await http(running.http, "POST", "/mpub?topic=t", b"z\n" * 100_000, chunked=True)
        assert (r.status, r.json()) == (413, {"message": "BODY_TOO_BIG"})
        r = await http(running.http, "POST", "/mpub?topic=t&binary=true",
                       binary_mpub(b"z" * 900, b"z" * 900, b"z" * 900, b"z" * 900, b"z" * 900,
                                   b"z" * 900), chunked=True)
        assert (r.status, r.json()) == (413, {"message": "BODY_TOO_BIG"})
        r = await http(running.http, "POST", "/pub?topic=t", b"z" * 1000, chunked=True)
        assert (r.status, r.body) == (200, b"OK")
        assert running.broker.topics["t"].message_count == 1


async def test_mpub_text_mode(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, max_msg_size=10, max_body_size=60)
        await http(running.http, "POST", "/topic/create?topic=t")
        consumer = await subscribed(running, "t", "c", 100)
        # empty lines are skipped, a trailing newline is fine, "\r" is kept (nsqd splits on \n)
        r = await http(running.http, "POST", "/mpub?topic=t", b"one\n\ntwo\r\nthree\n")
        assert (r.status, r.body) == (200, b"OK")
        bodies = [(await consumer.message()).body for _ in range(3)]
        assert bodies == [b"one", b"two\r", b"three"]
        for binary in ("false", "0"):
            r = await http(running.http, "POST", f"/mpub?topic=t&binary={binary}", b"four")
            assert r.status == 200
            assert (await consumer.message()).body == b"four"
        r = await http(running.http, "POST", "/mpub?topic=t", b"ok\n" + b"x" * 11)
        assert (r.status, r.json()) == (413, {"message": "MSG_TOO_BIG"})
        r = await http(running.http, "POST", "/mpub?topic=t", b"")
        assert (r.status, r.body) == (200, b"OK")  # nothing to publish is not an error
        r = await http(running.http, "POST", "/mpub?topic=t", b"a\n" * 31)  # 62 > 60 bytes
        assert (r.status, r.json()) == (413, {"message": "BODY_TOO_BIG"})
        r = await http(running.http, "POST", "/mpub", b"a")
        assert (r.status, r.json()) == (400, {"message": "MISSING_ARG_TOPIC"})
        r = await http(running.http, "GET", "/mpub?topic=t")
        assert (r.status, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
        assert running.broker.topics["t"].message_count == 5
        await consumer.aclose()


async def test_mpub_binary_mode(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, max_msg_size=10, max_body_size=100)
        await http(running.http, "POST", "/topic/create?topic=t")
        consumer = await subscribed(running, "t", "c", 100)
        for flag in ("true", "1", "yes"):  # an unknown value means binary (deprecated)
            body = binary_mpub(b"a\nb", f"flag {flag}".encode())
            r = await http(running.http, "POST", f"/mpub?topic=t&binary={flag}", body)
            assert (r.status, r.body) == (200, b"OK"), flag
            assert [(await consumer.message()).body for _ in range(2)] == [
                b"a\nb", f"flag {flag}".encode()
            ]
        bad = [
            (b"", "BAD_BODY"),
            (b"\x00\x00", "BAD_BODY"),
            (struct.pack(">i", 0), "BAD_BODY"),
            (struct.pack(">i", -1), "BAD_BODY"),
            (struct.pack(">i", 20), "BAD_BODY"),  # > (100 - 4) // 5 messages cannot fit
            (struct.pack(">i", 2) + struct.pack(">i", 1) + b"x", "BAD_MESSAGE"),  # missing #2
            (struct.pack(">ii", 1, 0), "BAD_MESSAGE"),
            (struct.pack(">ii", 1, -5), "BAD_MESSAGE"),
            (struct.pack(">ii", 1, 11) + b"x" * 11, "BAD_MESSAGE"),  # > max-msg-size
            (struct.pack(">ii", 1, 5) + b"abc", "BAD_MESSAGE"),  # truncated body
        ]
        for body, message in bad:
            r = await http(running.http, "POST", "/mpub?topic=t&binary=true", body)
            assert (r.status, r.json()) == (413, {"message": message}), body
        assert running.broker.topics["t"].message_count == 6
        await consumer.aclose()


async def test_topic_admin(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        daemon = running.broker
        persisted: list[str] = []
        daemon.persist_metadata = lambda: persisted.append("x")  # type: ignore[method-assign]
        r = await http(running.http, "POST", "/topic/create?topic=t")
        assert (r.status, r.body, r.v1) == (200, b"", True)
        assert "t" in daemon.topics and not daemon.topics["t"].channels
        errors = [
            ("/topic/create", 400, "MISSING_ARG_TOPIC"),
            ("/topic/create?topic=no%20pe", 400, "INVALID_TOPIC"),
            ("/topic/delete", 400, "MISSING_ARG_TOPIC"),
            ("/topic/delete?topic=nope", 404, "TOPIC_NOT_FOUND"),
            ("/topic/delete?topic=bad!", 404, "TOPIC_NOT_FOUND"),  # nsqd doesn't validate here
            ("/topic/empty", 400, "MISSING_ARG_TOPIC"),
            ("/topic/empty?topic=bad!", 400, "INVALID_TOPIC"),
            ("/topic/empty?topic=nope", 404, "TOPIC_NOT_FOUND"),
            ("/topic/pause", 400, "MISSING_ARG_TOPIC"),
            ("/topic/pause?topic=nope", 404, "TOPIC_NOT_FOUND"),
            ("/topic/unpause?topic=nope", 404, "TOPIC_NOT_FOUND"),
            ("/topic/pause?topic=t&x=%", 400, "INVALID_REQUEST"),
        ]
        for target, status, message in errors:
            r = await http(running.http, "POST", target)
            assert (r.status, r.json()) == (status, {"message": message}), target
        r = await http(running.http, "GET", "/topic/create?topic=t")
        assert (r.status, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})

        await http(running.http, "POST", "/pub?topic=t", b"1")
        await http(running.http, "POST", "/pub?topic=t", b"2")
        assert daemon.topics["t"].depth == 2  # no channel: the topic holds its messages
        r = await http(running.http, "POST", "/topic/empty?topic=t")
        assert (r.status, r.body) == (200, b"")
        assert daemon.topics["t"].depth == 0

        assert persisted == []
        r = await http(running.http, "POST", "/topic/pause?topic=t")
        assert (r.status, r.body) == (200, b"")
        assert daemon.topics["t"].paused and persisted == ["x"]
        await http(running.http, "POST", "/channel/create?topic=t&channel=c")
        await http(running.http, "POST", "/pub?topic=t", b"3")
        await trio.sleep(0.05)  # the pump would run now if it were not paused
        assert daemon.topics["t"].depth == 1
        assert daemon.topics["t"].channels["c"].depth == 0
        r = await http(running.http, "POST", "/topic/unpause?topic=t")
        assert (r.status, r.body) == (200, b"")
        assert not daemon.topics["t"].paused and persisted == ["x", "x"]
        await eventually(lambda: daemon.topics["t"].channels["c"].depth == 1)

        r = await http(running.http, "POST", "/topic/delete?topic=t")
        assert (r.status, r.body) == (200, b"")
        assert "t" not in daemon.topics


async def test_channel_admin(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        daemon = running.broker
        persisted: list[str] = []
        daemon.persist_metadata = lambda: persisted.append("x")  # type: ignore[method-assign]
        errors = [
            ("/channel/create", 400, "MISSING_ARG_TOPIC"),
            ("/channel/create?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
            ("/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
            ("/channel/create?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
            ("/channel/create?topic=t&channel=c", 404, "TOPIC_NOT_FOUND"),
            ("/channel/delete?topic=t&channel=c", 404, "TOPIC_NOT_FOUND"),
            ("/channel/empty?topic=t", 400, "MISSING_ARG_CHANNEL"),
            ("/channel/pause?channel=c", 400, "MISSING_ARG_TOPIC"),
            ("/channel/unpause?topic=t&channel=c&%zz", 400, "INVALID_REQUEST"),
        ]
        for target, status, message in errors:
            r = await http(running.http, "POST", target)
            assert (r.status, r.json()) == (status, {"message": message}), target
        assert "t" not in daemon.topics  # /channel/create never creates the topic

        await http(running.http, "POST", "/topic/create?topic=t")
        r = await http(running.http, "POST", "/channel/create?topic=t&channel=c")
        assert (r.status, r.body, r.v1) == (200, b"", True)
        channel = daemon.topics["t"].channels["c"]
        for target in ("/channel/delete?topic=t&channel=x", "/channel/empty?topic=t&channel=x",
                       "/channel/pause?topic=t&channel=x", "/channel/unpause?topic=t&channel=x"):
            r = await http(running.http, "POST", target)
            assert (r.status, r.json()) == (404, {"message": "CHANNEL_NOT_FOUND"}), target

        r = await http(running.http, "POST", "/channel/pause?topic=t&channel=c")
        assert (r.status, r.body) == (200, b"")
        assert channel.paused and persisted == ["x"]
        consumer = await subscribed(running, "t", "c", 5)
        await http(running.http, "POST", "/mpub?topic=t", b"1\n2\n3")
        await eventually(lambda: channel.depth == 3)
        assert channel.in_flight_count == 0  # paused: nothing delivered
        r = await http(running.http, "POST", "/channel/unpause?topic=t&channel=c")
        assert (r.status, r.body) == (200, b"")
        assert not channel.paused and persisted == ["x", "x"]
        assert [(await consumer.message()).body for _ in range(3)] == [b"1", b"2", b"3"]
        assert channel.in_flight_count == 3

        # emptying drops ready, in-flight and deferred messages (nsqd Channel.Empty)
        await http(running.http, "POST", "/pub?topic=t&defer=60000", b"later")
        await http(running.http, "POST", "/channel/pause?topic=t&channel=c")
        await http(running.http, "POST", "/pub?topic=t", b"ready")
        await eventually(lambda: channel.depth == 1 and channel.deferred_count == 1)
        r = await http(running.http, "POST", "/channel/empty?topic=t&channel=c")
        assert (r.status, r.body) == (200, b"")
        assert (channel.depth, channel.in_flight_count, channel.deferred_count) == (0, 0, 0)

        r = await http(running.http, "POST", "/channel/delete?topic=t&channel=c")
        assert (r.status, r.body) == (200, b"")
        assert "c" not in daemon.topics["t"].channels
        await consumer.aclose()


async def test_config_get(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, node_id=77, msg_timeout=30.0, mem_queue_size=123,
                                     e2e_processing_latency_percentiles=(0.5, 0.99))
        expected = {
            "msg_timeout": 30_000_000_000,  # time.Duration: integer nanoseconds
            "sync_timeout": 2_000_000_000,
            "mem_queue_size": 123,
            "max_msg_size": 1048576,
            "id": 77,  # nsqd's cfg name for --node-id
            "log_level": 2,  # lg.LogLevel INFO
            "nsqlookupd_tcp_addresses": [],
            "e2e_processing_latency_percentiles": [0.5, 0.99],
            "tls_required": 0,
            "tls_min_version": 769,
            "snappy": True,
            "statsd_prefix": "nsq.%s",
            "verbose": False,  # accepted for nsqd compatibility, no Options field
        }
        for key, value in expected.items():
            r = await http(running.http, "GET", f"/config/{key}")
            assert (r.status, r.json(), r.v1) == (200, value, True), key
        for target in ("/config/nope", "/config/msg-timeout"):
            r = await http(running.http, "GET", target)
            assert (r.status, r.json()) == (400, {"message": "INVALID_OPTION"}), target
        for target in ("/config/", "/config/a/b"):
            r = await http(running.http, "GET", target)
            assert (r.status, r.json()) == (404, {"message": "NOT_FOUND"}), target
        r = await http(running.http, "POST", "/config/msg_timeout", b"1")
        assert (r.status, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
        assert r.headers["allow"] == "GET, OPTIONS, PUT"


async def test_config_put(start_daemon: StartDaemon) -> None:
    root = logging.getLogger()
    level = root.level
    try:
        with trio.fail_after(TIMEOUT):
            running = await start_daemon(http=True, max_msg_size=64)
            daemon = running.broker
            addrs = json.dumps(["127.0.0.1:4160", "127.0.0.1:1"]).encode()
            r = await http(running.http, "PUT", "/config/nsqlookupd_tcp_addresses", addrs)
            assert (r.status, r.json()) == (200, ["127.0.0.1:4160", "127.0.0.1:1"])
            assert daemon.options.nsqlookupd_tcp_addresses == ("127.0.0.1:4160", "127.0.0.1:1")
            r = await http(running.http, "GET", "/config/nsqlookupd_tcp_addresses")
            assert r.json() == ["127.0.0.1:4160", "127.0.0.1:1"]
            r = await http(running.http, "PUT", "/config/log_level", b"DEBUG")
            assert (r.status, r.json()) == (200, 1)
            assert daemon.options.log_level == "debug"
            assert root.level == logging.DEBUG
            cases = [
                ("/config/nsqlookupd_tcp_addresses", b"not json", 400, "INVALID_VALUE"),
                ("/config/nsqlookupd_tcp_addresses", b'"a:1"', 400, "INVALID_VALUE"),
                ("/config/nsqlookupd_tcp_addresses", b"[1, 2]", 400, "INVALID_VALUE"),
                ("/config/log_level", b"verbose", 400, "INVALID_VALUE"),
                ("/config/log_level", b"", 413, "INVALID_VALUE"),
                ("/config/log_level", b"x" * 65, 413, "INVALID_VALUE"),  # > max-msg-size
                ("/config/msg_timeout", b"1s", 400, "INVALID_OPTION"),
                ("/config/nope", b"1", 400, "INVALID_OPTION"),
            ]
            for target, body, status, message in cases:
                r = await http(running.http, "PUT", target, body)
                assert (r.status, r.json()) == (status, {"message": message}), (target, body)
            assert daemon.options.log_level == "debug"
            assert daemon.options.nsqlookupd_tcp_addresses == ("127.0.0.1:4160", "127.0.0.1:1")
    finally:
        root.setLevel(level)


async def test_routing_conventions(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        r = await http(running.http, "GET", "/nope")
        assert (r.status, r.json(), r.v1) == (404, {"message": "NOT_FOUND"}, True)
        r = await http(running.http, "POST", "/stats")
        assert (r.status, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
        assert r.headers["allow"] == "GET, OPTIONS"
        r = await http(running.http, "DELETE", "/topic/delete?topic=t")
        assert (r.status, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
        # httprouter's trailing-slash redirect
        r = await http(running.http, "GET", "/stats/?format=json")
        assert (r.status, r.headers["location"]) == (301, "/stats?format=json")
        r = await http(running.http, "POST", "/pub/?topic=t", b"x")
        assert (r.status, r.headers["location"]) == (307, "/pub?topic=t")
        r = await http(running.http, "OPTIONS", "/pub")
        assert (r.status, r.body, r.headers["allow"]) == (200, b"", "OPTIONS, POST")
        # params come from the query string only, never from a form body
        r = await http(running.http, "POST", "/topic/create", b"topic=t",
                       headers=(("Content-Type", "application/x-www-form-urlencoded"),))
        assert (r.status, r.json()) == (400, {"message": "MISSING_ARG_TOPIC"})


async def test_debug_freememory(start_daemon: StartDaemon) -> None:
    collected: list[int] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected.append(info["generation"])

    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        gc.callbacks.append(on_gc)
        try:
            # Only the youngest generation, every call: an older one would stall every client
            # for as long as its objects take to traverse.
            for _ in range(2):
                collected.clear()
                r = await http(running.http, "POST", "/debug/freememory")
                assert (r.status, r.body) == (200, b"")
                assert collected and set(collected) == {0}
        finally:
            gc.callbacks.remove(on_gc)


async def status_line(address: tuple[str, int], target: bytes) -> bytes:
    """The first line of the answer to ``GET target``, as sent."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % target)
        data = b""
        while b"\r\n" not in data:
            chunk = await stream.receive_some(4096)
            assert chunk, data
            data += chunk
    return data.partition(b"\r\n")[0]


async def test_status_lines_carry_the_reason_phrase_as_go_writes_them(
    start_daemon: StartDaemon,
) -> None:
    # nsqd (Go's net/http) writes "404 Not Found"; Go clients show it (nsqadmin's errors).
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        assert await status_line(running.http, b"/ping") == b"HTTP/1.1 200 OK"
        assert await status_line(running.http, b"/nope") == b"HTTP/1.1 404 Not Found"
        assert await status_line(running.http, b"/pub") == b"HTTP/1.1 405 Method Not Allowed"
