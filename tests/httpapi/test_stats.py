"""``/stats`` (JSON and text) and ``/metrics`` for a daemon with real traffic.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs in-process on 127.0.0.1 port 0; producers and consumers are raw V2
  TCP connections, publishing also goes over HTTP, so every counter comes from real traffic.
- Every test body runs under ``trio.fail_after(TIMEOUT)``.
- Key lists are nsqd v1.3.0's (nsq-reference §2.4), written out here, in nsqd's order.
"""

from __future__ import annotations

import re
import time
from typing import Any

import attrs
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon import RunningDaemon, StartDaemon, eventually
from tests.support.http import http
from tests.support.wire import OK, Wire

TIMEOUT = 15.0

TOP_KEYS = ["version", "health", "start_time", "topics", "memory", "producers"]
# lmq's policy counters come after nsqd's fields (whose order and names are unchanged).
POLICY_KEYS = ["dead_letter_count", "expired_count", "max_attempts_dropped_count"]
TOPIC_KEYS = ["topic_name", "channels", "depth", "backend_depth", "message_count",
              "message_bytes", "paused", "e2e_processing_latency", *POLICY_KEYS]
CHANNEL_KEYS = ["channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count",
                "message_count", "requeue_count", "timeout_count", "client_count", "clients",
                "paused", "e2e_processing_latency", *POLICY_KEYS]
LMQ_EXTRA_KEYS = ["storage_damage"]
"""lmq's keys after nsqd's and the policy counters in each topic and channel object (nsqd's
clients ignore them)."""
TOPIC_EXTRA_KEYS = ["reader_lost_count", "stored_bytes", "logical_bytes"]
"""lmq's keys after those in each topic object only."""
CLIENT_KEYS = ["client_id", "hostname", "version", "remote_address", "state", "ready_count",
               "in_flight_count", "message_count", "finish_count", "requeue_count", "connect_ts",
               "sample_rate", "deflate", "snappy", "user_agent", "tls", "tls_cipher_suite",
               "tls_version", "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual"]
PRODUCER_KEYS = [*CLIENT_KEYS[:15], "pub_counts", *CLIENT_KEYS[15:]]
MEMORY_KEYS = ["heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
               "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes",
               "gc_total_runs"]
E2E_KEYS = ["count", "percentiles"]


@attrs.frozen
class Traffic:
    producer: Wire
    consumer: Wire
    in_flight_id: bytes


async def make_traffic(running: RunningDaemon) -> Traffic:
    """orders: channels ship (1 consumer, RDY 2 then 0, one FIN) and audit (no consumer); 2 messages
    published over TCP, 3 by /mpub, 1 deferred by /pub; topic ``other`` with channel ``x``."""
    base = running.http
    await http(base, "POST", "/topic/create?topic=orders")
    await http(base, "POST", "/channel/create?topic=orders&channel=ship")
    await http(base, "POST", "/channel/create?topic=orders&channel=audit")
    await http(base, "POST", "/topic/create?topic=other")
    await http(base, "POST", "/channel/create?topic=other&channel=x")
    producer = await Wire.connect(
        running.tcp, client_id="prod", hostname="prod.example", user_agent="test-producer/1.0",
        feature_negotiation=False,
    )
    consumer = await Wire.connect(
        running.tcp, client_id="cons", hostname="cons.example", user_agent="test-consumer/1.0",
        feature_negotiation=False,
    )
    await consumer.sub("orders", "ship", 2)
    assert await producer.pub("orders", b"p1") == OK
    assert await producer.pub("orders", b"p2") == OK
    assert (await http(base, "POST", "/mpub?topic=orders", b"m1\nm2\nm3")).status == 200
    assert (await http(base, "POST", "/pub?topic=orders&defer=60000", b"later")).status == 200
    first = await consumer.message()
    second = await consumer.message()
    assert {first.body, second.body} == {b"p1", b"p2"}
    # RDY is a window: close it before the FIN, or the freed slot takes the next message.
    await consumer.send(b"RDY 0\nFIN " + first.id + b"\n")
    ship = running.broker.topics["orders"].channels["ship"]
    await eventually(lambda: ship.in_flight_count == 1 and ship.depth == 3)
    audit = running.broker.topics["orders"].channels["audit"]
    await eventually(lambda: audit.depth == 5)
    return Traffic(producer, consumer, second.id)


def check_e2e(e2e: dict[str, Any], count: int) -> None:
    assert list(e2e) == E2E_KEYS
    assert e2e["count"] == count
    # With --e2e-processing-latency-percentile set, nsqd lists them in the configured order.
    if e2e["percentiles"] is not None:
        assert [p["quantile"] for p in e2e["percentiles"]] == [0.5, 0.99]
        assert all(list(p) == ["quantile", "value"] for p in e2e["percentiles"])


async def test_stats_json_has_nsqds_shape_and_counts(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, e2e_processing_latency_percentiles=(0.5, 0.99))
        traffic = await make_traffic(running)
        r = await http(running.http, "GET", "/stats?format=json")
        assert r.status == 200 and r.v1
        stats = r.json()
        assert list(stats) == TOP_KEYS
        assert stats["version"] == "1.3.0"
        assert stats["health"] == "OK"
        assert stats["start_time"] == running.broker.start_time
        assert list(stats["memory"]) == MEMORY_KEYS
        assert all(isinstance(v, int) and v >= 0 for v in stats["memory"].values())

        orders, other = stats["topics"]  # sorted by name
        assert [orders["topic_name"], other["topic_name"]] == ["orders", "other"]
        for topic in stats["topics"]:
            assert list(topic) == TOPIC_KEYS + LMQ_EXTRA_KEYS + TOPIC_EXTRA_KEYS
        bodies = [b"p1", b"p2", b"m1", b"m2", b"m3", b"later"]
        assert orders["message_count"] == 6
        assert orders["message_bytes"] == sum(len(b) for b in bodies)
        assert (orders["depth"], orders["backend_depth"], orders["paused"]) == (0, 0, False)
        check_e2e(orders["e2e_processing_latency"], 1)

        audit, ship = orders["channels"]  # sorted by name
        for channel in orders["channels"]:
            assert list(channel) == CHANNEL_KEYS + LMQ_EXTRA_KEYS + ["priority_depths"]
        assert [audit["channel_name"], ship["channel_name"]] == ["audit", "ship"]
        assert {k: ship[k] for k in CHANNEL_KEYS[1:9]} == {
            "depth": 3, "backend_depth": 0, "in_flight_count": 1, "deferred_count": 1,
            "message_count": 6, "requeue_count": 0, "timeout_count": 0, "client_count": 1,
        }
        assert {k: audit[k] for k in CHANNEL_KEYS[1:10]} == {
            "depth": 5, "backend_depth": 0, "in_flight_count": 0, "deferred_count": 1,
            "message_count": 6, "requeue_count": 0, "timeout_count": 0, "client_count": 0,
            "clients": [],
        }
        check_e2e(ship["e2e_processing_latency"], 1)
        check_e2e(audit["e2e_processing_latency"], 0)

        (client,) = ship["clients"]
        assert list(client) == CLIENT_KEYS
        local = traffic.consumer.local_address
        assert client["remote_address"] == f"{local[0]}:{local[1]}"
        assert {k: client[k] for k in CLIENT_KEYS if k not in ("remote_address", "connect_ts")} == {
            "client_id": "cons", "hostname": "cons.example", "version": "V2", "state": 3,
            "ready_count": 0, "in_flight_count": 1, "message_count": 2, "finish_count": 1,
            "requeue_count": 0, "sample_rate": 0, "deflate": False, "snappy": False,
            "user_agent": "test-consumer/1.0", "tls": False, "tls_cipher_suite": "",
            "tls_version": "", "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }
        assert abs(client["connect_ts"] - time.time()) < 60

        # HTTP publishers are not clients: only the TCP producer is listed.
        (producer,) = stats["producers"]
        assert list(producer) == PRODUCER_KEYS
        assert producer["client_id"] == "prod" and producer["user_agent"] == "test-producer/1.0"
        assert producer["pub_counts"] == [{"topic": "orders", "count": 2}]
        assert (producer["message_count"], producer["state"]) == (0, 0)

        (x,) = other["channels"]
        assert (x["channel_name"], x["message_count"], other["message_count"]) == ("x", 0, 0)
        await traffic.consumer.aclose()
        await traffic.producer.aclose()


async def test_stats_json_filters(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        traffic = await make_traffic(running)

        async def stats(query: str) -> dict[str, Any]:
            r = await http(running.http, "GET", "/stats?format=json" + query)
            assert r.status == 200
            result: dict[str, Any] = r.json()
            return result

        s = await stats("&include_clients=false")
        assert s["producers"] is None  # Go nil slice
        ship = s["topics"][0]["channels"][1]
        assert (ship["channel_name"], ship["clients"], ship["client_count"]) == ("ship", None, 1)
        s = await stats("&include_clients=0&include_mem=false")
        assert list(s) == ["version", "health", "start_time", "topics", "producers"]
        s = await stats("&include_mem=nonsense&include_clients=nonsense")  # unknown = default
        assert "memory" in s and s["producers"] is not None
        s = await stats("&topic=nope")
        assert s["topics"] is None  # nsqd returns no topic slice at all
        s = await stats("&topic=other")
        assert [t["topic_name"] for t in s["topics"]] == ["other"]
        # nsqd narrows each producer's pub_counts to the topic asked for
        assert [p.get("pub_counts") for p in s["producers"]] == [None]
        s = await stats("&topic=orders")
        assert [p["pub_counts"] for p in s["producers"]] == [[{"topic": "orders", "count": 2}]]
        s = await stats("&topic=orders&channel=audit")
        assert [c["channel_name"] for t in s["topics"] for c in t["channels"]] == ["audit"]
        # a channel filter alone drops the topics without such a channel
        s = await stats("&channel=ship")
        assert [(t["topic_name"], [c["channel_name"] for c in t["channels"]])
                for t in s["topics"]] == [("orders", ["ship"])]
        s = await stats("&topic=orders&channel=nope")
        assert s["topics"] == []
        s = await stats("&topic=&channel=")  # empty values mean no filter, as nsqd's Get
        assert len(s["topics"]) == 2
        r = await http(running.http, "GET", "/stats?format=json&topic=%zz")
        assert (r.status, r.json()) == (400, {"message": "INVALID_REQUEST"})
        await traffic.consumer.aclose()
        await traffic.producer.aclose()


async def test_stats_json_empty_daemon(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        r = await http(running.http, "GET", "/stats?format=json")
        # nsqd's own test checks this prefix for an empty daemon (TestHTTPgetStatusJSON).
        prefix = (
            f'{{"version":"1.3.0","health":"OK","start_time":{running.broker.start_time},'
            '"topics":[],"memory":{'
        )
        assert r.body.startswith(prefix.encode()), r.body
        assert r.body.endswith(b',"producers":null}')


async def test_stats_text(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        traffic = await make_traffic(running)
        await http(running.http, "POST", "/channel/pause?topic=orders&channel=audit")
        await http(running.http, "POST", "/topic/pause?topic=other")
        for target in ("/stats", "/stats?format=text", "/stats?format=yaml"):
            r = await http(running.http, "GET", target)
            assert r.status == 200 and r.v1
            assert r.headers["content-type"] == "text/plain; charset=utf-8"
            assert r.body.startswith(b"lmqd v") and b"\nTopics:\n" in r.body
        text = (await http(running.http, "GET", "/stats")).body.decode()
        lines = text.split("\n")
        assert re.fullmatch(r"lmqd v\S+ \(nsqd 1\.3\.0 compatible, built w/python[\d.]+\)",
                            lines[0])
        assert re.fullmatch(r"start_time \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)",
                            lines[1])
        assert re.fullmatch(r"uptime (\d+(\.\d+)?(ns|µs|ms|s)|(\d+h)?\d+m\d+(\.\d+)?s)", lines[2])
        assert lines[3:6] == ["", "Health: OK", ""]
        assert lines[6] == "Memory:"
        assert [line.split("\t")[0] for line in lines[7:16]] == [
            f"   {key:<25}" for key in MEMORY_KEYS
        ]
        assert lines[16:18] == ["", "Topics:"]
        cport = traffic.consumer.local_address[1]
        pport = traffic.producer.local_address[1]
        expected = [
            "   [orders         ] depth: 0     be-depth: 0     msgs: 6        e2e%: ",
            "   *P [audit                    ] depth: 5     be-depth: 0     inflt: 0    def: 1"
            "    re-q: 0     timeout: 0     msgs: 6        e2e%: ",
            "      [ship                     ] depth: 3     be-depth: 0     inflt: 1    def: 1"
            "    re-q: 0     timeout: 0     msgs: 6        e2e%: ",
            f"        [V2 cons.example:{cport} test-consumer/1.0] state: 3 inflt: 1    rdy: 0"
            "    fin: 1        re-q: 0        msgs: 2        connected: ",
            "",
            "*P [other          ] depth: 0     be-depth: 0     msgs: 0        e2e%: ",
            "      [x                        ] depth: 0     be-depth: 0     inflt: 0    def: 0"
            "    re-q: 0     timeout: 0     msgs: 0        e2e%: ",
            "",
            "Producers:",
            f"   [V2 prod.example:{pport} test-producer/1.0] msgs: 2        topics: orders=2"
            " connected: ",
            "",
        ]
        got = [re.sub(r"connected: \d+s$", "connected: ", line) for line in lines[18:]]
        assert got == expected
        await traffic.consumer.aclose()
        await traffic.producer.aclose()


async def test_stats_text_empty_daemon(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        text = (await http(running.http, "GET", "/stats?include_mem=false")).body.decode()
        assert text.split("\n")[3:] == ["", "Health: OK", "", "Topics: None", "",
                                        "Producers: None", ""]


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


async def test_metrics_parse_and_agree_with_stats(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        traffic = await make_traffic(running)
        r = await http(running.http, "GET", "/metrics")
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        metrics = samples(r.body.decode())
        stats = (await http(running.http, "GET", "/stats?format=json")).json()

        def value(name: str, **labels: str) -> float:
            return metrics[(name, frozenset(labels.items()))]

        assert value("lmqd_healthy") == 1
        assert value("lmqd_start_time_seconds") == stats["start_time"]
        assert value("lmqd_topics") == len(stats["topics"])
        assert value("lmqd_info", version=value_label(metrics, "lmqd_info", "version"),
                     nsqd_version="1.3.0") == 1
        checked = 0
        for t in stats["topics"]:
            name = t["topic_name"]
            assert value("lmqd_topic_depth", topic=name) == t["depth"]
            assert value("lmqd_topic_backend_depth", topic=name) == t["backend_depth"]
            assert value("lmqd_topic_messages_total", topic=name) == t["message_count"]
            assert value("lmqd_topic_message_bytes_total", topic=name) == t["message_bytes"]
            assert value("lmqd_topic_paused", topic=name) == int(t["paused"])
            assert value("lmqd_topic_channels", topic=name) == len(t["channels"])
            for c in t["channels"]:
                key = {"topic": name, "channel": c["channel_name"]}
                assert value("lmqd_channel_depth", **key) == c["depth"]
                assert value("lmqd_channel_backend_depth", **key) == c["backend_depth"]
                assert value("lmqd_channel_in_flight", **key) == c["in_flight_count"]
                assert value("lmqd_channel_deferred", **key) == c["deferred_count"]
                assert value("lmqd_channel_messages_total", **key) == c["message_count"]
                assert value("lmqd_channel_requeues_total", **key) == c["requeue_count"]
                assert value("lmqd_channel_timeouts_total", **key) == c["timeout_count"]
                assert value("lmqd_channel_clients", **key) == c["client_count"]
                assert value("lmqd_channel_paused", **key) == int(c["paused"])
                for client in c["clients"]:
                    ckey = {**key, "client_id": client["client_id"],
                            "remote_address": client["remote_address"]}
                    assert value("lmqd_client_delivered_messages_total", **ckey) == client[
                        "message_count"]
                    assert value("lmqd_client_finished_messages_total", **ckey) == client[
                        "finish_count"]
                    assert value("lmqd_client_requeued_messages_total", **ckey) == client[
                        "requeue_count"]
                    assert value("lmqd_client_in_flight", **ckey) == client["in_flight_count"]
                    assert value("lmqd_client_ready", **ckey) == client["ready_count"]
                    checked += 1
                checked += 1
        assert checked == 4  # 3 channels + 1 client
        (producer,) = stats["producers"]
        assert value("lmqd_producer_published_messages_total", client_id="prod",
                     remote_address=producer["remote_address"], topic="orders") == 2
        # e2e percentiles not configured: no latency series, as /stats reports null
        assert not [k for k in metrics if "e2e" in k[0]]
        assert ("process_resident_memory_bytes", frozenset()) in metrics
        # OpenMetrics when a scraper asks for it
        r = await http(running.http, "GET", "/metrics",
                       headers=(("Accept", "application/openmetrics-text; version=1.0.0"),))
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.body.endswith(b"# EOF\n")
        r = await http(running.http, "POST", "/metrics")
        assert (r.status, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
        await traffic.consumer.aclose()
        await traffic.producer.aclose()


def value_label(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
                label: str) -> str:
    (labels,) = [dict(k[1]) for k in metrics if k[0] == name]
    return labels[label]


async def test_metrics_clients_flag_switches_the_per_client_series(
    start_daemon: StartDaemon,
) -> None:
    """On by default (the test above); ``metrics_clients=False`` leaves every client- and
    producer-labelled family out while the topic and channel series stay."""
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, metrics_clients=False)
        traffic = await make_traffic(running)
        text = (await http(running.http, "GET", "/metrics")).body.decode()
        names = {name for name, _ in samples(text)}
        assert "lmqd_channel_clients" in names
        assert not [n for n in names if n.startswith(("lmqd_client_", "lmqd_producer_"))]
        assert "lmqd_client_" not in text and "lmqd_producer_" not in text
        # /stats still lists every client
        stats = (await http(running.http, "GET", "/stats?format=json")).json()
        orders = next(t for t in stats["topics"] if t["topic_name"] == "orders")
        ship = next(c for c in orders["channels"] if c["channel_name"] == "ship")
        assert [c["client_id"] for c in ship["clients"]] == ["cons"]
        await traffic.consumer.aclose()
        await traffic.producer.aclose()
