"""``lmqadmin stats``: fitting 80 columns, human numbers, rates while watching, the per-client
view and unknown topics, against a real lmqd subprocess.

Rules for this module: one daemon for the module (``lmqd_module_server``: 127.0.0.1, port 0, data
in a temp dir); each test its own topics; commands through click's CliRunner with ``COLUMNS`` set
as a terminal would; consumers are the trio client under ``trio.fail_after``. Nothing waits longer
than a few seconds.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import trio
from click.testing import CliRunner, Result

from lmq_client.admin.cli import cli
from lmq_client.consumer import Consumer
from lmq_client.http import HTTPClient
from lmq_client.sync import Producer
from tests.support.process import LmqdProcess

TIMEOUT = 20.0


def run(server: LmqdProcess, *args: str, columns: int | None = None) -> Result:
    assert server.http_address is not None
    env = {"LMQ_TCP_ADDRESS": server.tcp_address, "LMQ_HTTP_ADDRESS": server.http_address}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def publish(server: LmqdProcess, topic: str, count: int) -> None:
    with Producer(server.tcp_address) as producer:
        for i in range(0, count, 1000):
            producer.mpub(topic, [b"m%d" % j for j in range(i, min(count, i + 1000))])


def test_stats_fits_80_columns_with_thousands_separators(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    assert server.http_address is not None
    http = HTTPClient(server.http_address)
    http.topic_action("create", "wide")
    http.channel_action("create", "wide", "billing")
    publish(server, "wide", 12_345)
    result = run(server, "stats", "wide", "--interval", "0", columns=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, result.output
    header = next(line for line in lines if "topic / channel" in line)
    # the most important columns stay; the rest are named as hidden
    for column in ("depth", "in-flight", "rate/s", "messages", "clients"):
        assert column in header
    assert "e2e latency" not in header and "mem" not in header
    assert "column(s) hidden to fit 80 columns; --json has them all" in result.output
    channel_row = next(line for line in lines if "│   billing " in line)
    assert "12,345" in channel_row.split("│")[2]
    # wide output (a pipe without COLUMNS): every column, no caption
    result = run(server, "stats", "wide", "--interval", "0")
    assert "e2e latency" in result.output and "hidden" not in result.output
    # so narrow that only the name fits: still one table, the name column kept
    result = run(server, "stats", "wide", "--interval", "0", columns=20)
    assert result.exit_code == 0 and "wide" in result.output


def test_stats_of_an_unknown_topic_or_channel_exits_1_in_one_line(
    lmqd_module_server: LmqdProcess,
) -> None:
    server = lmqd_module_server
    assert server.http_address is not None
    result = run(server, "stats", "no-such-topic")
    assert result.exit_code == 1
    assert result.output == (
        f"lmqadmin: error: topic no-such-topic not found on {server.http_address}\n"
    )
    HTTPClient(server.http_address).topic_action("create", "known")
    result = run(server, "stats", "known", "nope", "--json")
    assert result.exit_code == 1
    assert result.output == (
        f"lmqadmin: error: channel known/nope not found on {server.http_address}\n"
    )
    result = run(server, "stats", "no-such-topic", "nope")
    assert result.exit_code == 1 and "topic no-such-topic not found" in result.output
    result = run(server, "stats", "--clients", "no-such-topic")
    assert result.exit_code == 1 and "topic no-such-topic not found" in result.output


def test_watch_shows_messages_per_second_between_samples(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    assert server.http_address is not None
    HTTPClient(server.http_address).topic_action("create", "flow")
    stop = threading.Event()

    def publisher() -> None:
        with Producer(server.tcp_address) as producer:
            while not stop.is_set():
                producer.mpub("flow", [b"x"] * 50)
                time.sleep(0.01)

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        result = run(server, "--json", "stats", "flow", "--watch", "--count", "2",
                     "--interval", "0.3")
    finally:
        stop.set()
        thread.join(10)
    assert result.exit_code == 0, result.output
    snapshots = [json.loads(line) for line in result.output.splitlines()]
    assert len(snapshots) == 2
    first, second = (s["topics"][0] for s in snapshots)
    # at most 50 messages per 10 ms, so at most ~5,000/s; a publisher that ran gives > 0
    for snap in (first, second):
        assert 0 < snap["rate"] < 6000
    assert second["message_count"] > first["message_count"]


def test_stats_clients_lists_each_consumer_and_publisher(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    assert server.http_address is not None
    HTTPClient(server.http_address).topic_action("create", "cl")
    publish(server, "cl", 3)
    results: list[Result] = []

    async def consume_and_look() -> None:
        consumer = Consumer("cl", "workers", server.tcp_address, max_in_flight=7)
        with trio.fail_after(TIMEOUT):
            async with consumer:
                for _ in range(2):
                    (await consumer.__anext__()).finish()
                third = await consumer.__anext__()  # stays in flight while we look
                # the FINs are sent by now; give the daemon a moment to count them
                await trio.sleep(0.2)
                results.append(await trio.to_thread.run_sync(
                    lambda: run(server, "stats", "--clients", "cl", "--interval", "0")))
                results.append(await trio.to_thread.run_sync(
                    lambda: run(server, "--json", "stats", "--clients", "--interval", "0.2")))
                third.finish()

    trio.run(consume_and_look)
    table, as_json = results
    assert table.exit_code == 0, table.output
    row = next(line for line in table.output.splitlines() if "cl/workers" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    header = next(line for line in table.output.splitlines() if "topic / channel" in line)
    names = [c.strip() for c in header.split("┃")[1:-1]]
    shown = dict(zip(names, cells, strict=True))
    assert shown["RDY"] == "7" and shown["in-flight"] == "1" and shown["finished"] == "2"
    assert shown["delivered"] == "3" and shown["requeued"] == "0"
    assert shown["user agent"].startswith("lmq_client/")
    assert shown["tls / compression"] == "-"
    assert shown["connected"].endswith("s")
    data = json.loads(as_json.output)
    (consumer,) = [c for c in data["consumers"] if c["topic"] == "cl"]
    assert (consumer["channel"], consumer["ready_count"], consumer["finish_count"]) == (
        "workers", 7, 2,
    )
    assert consumer["rate"] == 0.0 and consumer["connected_s"] >= 0
    assert consumer["node"] == server.http_address
    # the Producer above published over TCP and disconnected: no producer is left listed
    assert all(p["node"] == server.http_address for p in data["producers"])


def test_in_and_out_rates_between_samples(lmqd_module_server: LmqdProcess) -> None:
    """rate/s counts what came in, out/s what left (a channel's finished messages; a topic's
    handed to its channels), nsq_stat's ingress and egress."""
    from lmq_client.admin.stats import sample
    from lmq_client.sync import Consumer as SyncConsumer

    server = lmqd_module_server
    assert server.http_address is not None
    http = HTTPClient(server.http_address)
    http.topic_action("create", "inout")
    http.channel_action("create", "inout", "work")
    first = sample([http], "inout")
    publish(server, "inout", 20)
    with SyncConsumer("inout", "work", server.tcp_address, max_in_flight=1) as consumer:
        for _ in range(10):
            message = consumer.get(timeout=5)
            assert message is not None
            message.finish()
        consumer.get(timeout=0.2)  # the 10th FIN has been processed once the next arrives
        second = sample([http], "inout", previous=first)
    elapsed = second.taken_at - first.taken_at
    topic_row, channel_row = second.rows[("inout", None)], second.rows[("inout", "work")]
    assert topic_row.rate == channel_row.rate == pytest.approx(20 / elapsed)
    assert topic_row.out_rate == pytest.approx(20 / elapsed)  # all handed to the channel
    assert channel_row.out_rate == pytest.approx(10 / elapsed)  # ten finished


def test_stats_shows_stored_bytes_and_the_compression_ratio(
    lmqd_module_server: LmqdProcess,
) -> None:
    """A topic whose policy compresses at rest (``lmqadmin topic policy --compression``): the
    stored column shows its log's bytes and the ratio, ``--json`` the figures."""
    server = lmqd_module_server
    assert server.http_address is not None
    http = HTTPClient(server.http_address)
    http.topic_action("create", "zipped")
    set_policy = run(server, "topic", "policy", "zipped", "--compression", "zstd")
    assert set_policy.exit_code == 0 and "compression=zstd" in set_policy.output
    refused = run(server, "topic", "policy", "zipped", "--compression", "brotli")
    assert refused.exit_code == 1 and "unknown compression 'brotli'" in refused.output
    body = json.dumps({"user": "someone", "event": "page_view", "path": "/items/1"}).encode()
    with Producer(server.tcp_address) as producer:
        for _ in range(20):
            producer.mpub("zipped", [body] * 1000)
    deadline = time.monotonic() + TIMEOUT
    while True:  # the topic's memory tail goes to its log past --mem-queue-size
        data = json.loads(run(server, "--json", "stats", "zipped").output)
        (topic,) = data["topics"]
        if topic["stored_bytes"] > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert topic["logical_bytes"] > 3 * topic["stored_bytes"] > 0, topic
    assert topic["compression_ratio"] == topic["logical_bytes"] / topic["stored_bytes"]
    table = run(server, "stats", "zipped", "--interval", "0", columns=250).output
    assert "stored" in table and f"{topic['compression_ratio']:.1f}x" in table, table
