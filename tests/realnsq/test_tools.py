"""NSQ's own tools against lmqd, as against nsqd: to_nsq, nsq_tail, nsq_stat, nsq_to_file,
nsq_to_nsq, nsq_to_http; and nsq_tail reading a dead-letter topic.

Rules for this module: one nsqd and one lmqd (127.0.0.1, port 0, data in temp dirs), and a
second lmqd as nsq_to_nsq's destination; each tool runs against both daemons with the same
input, and what it did there (its output, the files or requests it made) is compared: equal to
each other, and carrying every message once. Tools that run until stopped get a Ctrl-C (SIGINT)
once the daemon shows every message finished; every wait is bounded. Skipped without
``LMQ_NSQ_BIN``.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.cluster.procs import eventually, http

from .conftest import Started
from .programs import Consumer, Daemon, Tool, lmqd, nsqd, requires_nsq, run_tool

pytestmark = [pytest.mark.interop, requires_nsq]

WITHIN_S = 20.0


@attrs.frozen
class Daemons:
    nsqd: Daemon
    lmqd: Daemon
    destination: Daemon
    """An lmqd that nsq_to_nsq copies into."""

    @property
    def pair(self) -> tuple[tuple[str, Daemon], tuple[str, Daemon]]:
        return ("nsqd", self.nsqd), ("lmqd", self.lmqd)


@pytest.fixture(scope="module")
def daemons(started: Started, tmp_path_factory: pytest.TempPathFactory) -> Daemons:
    base = tmp_path_factory.mktemp("tools")
    return Daemons(
        started(nsqd(base / "nsqd")), started(lmqd(base / "lmqd")),
        started(lmqd(base / "destination")),
    )  # fmt: skip


def channel_stats(daemon: Daemon, topic: str, channel: str) -> dict[str, Any]:
    answer = http(daemon.http, "GET", f"/stats?format=json&topic={topic}&channel={channel}")[1]
    for t in answer["topics"] or []:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return dict(c)
    return {}


def wait_finished(daemon: Daemon, topic: str, channel: str, count: int) -> None:
    """Until the channel was handed ``count`` messages and holds none (all finished)."""
    eventually(
        lambda: channel_stats(daemon, topic, channel),
        lambda c: c.get("message_count") == count
        and (c["depth"], c["in_flight_count"], c["deferred_count"]) == (0, 0, 0),
        WITHIN_S,
    )


def publish(daemon: Daemon, topic: str, bodies: list[str]) -> None:
    status, _ = http(daemon.http, "POST", f"/mpub?topic={topic}", "\n".join(bodies).encode())
    assert status == 200


def test_to_nsq_then_nsq_tail_carry_every_message_in_order(daemons: Daemons) -> None:
    lines = [f"line {i}" for i in range(1000)]
    outputs = {}
    for name, daemon in daemons.pair:
        done = run_tool("to_nsq", "--topic=pipe", f"--nsqd-tcp-address={daemon.tcp}",
                        input="".join(f"{line}\n" for line in lines).encode())  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        # nsq_tail's ephemeral channel is the topic's first: it gets the whole backlog.
        done = run_tool("nsq_tail", "--topic=pipe", f"--nsqd-tcp-address={daemon.tcp}", "-n",
                        str(len(lines)))  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        outputs[name] = done.stdout.decode().splitlines()
    assert outputs["lmqd"] == outputs["nsqd"] == lines


def test_nsq_stat_reports_lmqd_as_it_reports_nsqd(daemons: Daemons) -> None:
    reports = {}
    for name, daemon in daemons.pair:
        assert http(daemon.http, "POST", "/topic/create?topic=stat")[0] == 200
        assert http(daemon.http, "POST", "/channel/create?topic=stat&channel=c")[0] == 200
        publish(daemon, "stat", [f"s{i}" for i in range(12)])
        assert http(daemon.http, "POST", "/pub?topic=stat&defer=600000", b"later")[0] == 200
        # Something in every column: in flight, deferred, requeued, finished.
        with Consumer(daemon.tcp, "stat", "c") as consumer:
            taken = consumer.take(5)
            consumer.fin(taken[:2])
            consumer.req(taken[2], delay_ms=600_000)
            done = run_tool("nsq_stat", "--topic=stat", "--channel=c",
                            f"--nsqd-http-address={daemon.http}", "--count=2",
                            "--interval=200ms")  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        reports[name] = done.stdout.decode()
    assert reports["lmqd"] == reports["nsqd"]
    rows = reports["lmqd"].splitlines()[2:4]
    # ingress egress | total mem disk inflt def | req t-o msgs clients
    assert [row.split() for row in rows] == [
        ["0", "0", "|", "7", "7", "0", "2", "2", "|", "1", "0", "13", "1"]
    ] * 2


def run_consumer_tool(
    daemon: Daemon, name: str, topic: str, bodies: list[str], *args: str
) -> tuple[int, str]:
    """Start NSQ's tool ``name`` on ``topic`` (its channel is named after it), publish
    ``bodies`` once it has subscribed, stop it (Ctrl-C) once it has finished them all; its exit
    code and output."""
    assert http(daemon.http, "POST", f"/topic/create?topic={topic}")[0] == 200
    tool = Tool(name, f"--topic={topic}", f"--nsqd-tcp-address={daemon.tcp}", *args)
    code = -1
    try:
        eventually(lambda: channel_stats(daemon, topic, name), bool, WITHIN_S)
        publish(daemon, topic, bodies)
        wait_finished(daemon, topic, name, len(bodies))
    finally:
        code = tool.stop()
    return code, tool.output()


def test_nsq_to_file_writes_every_message_once(daemons: Daemons, tmp_path: Path) -> None:
    bodies = [f"archived {i}" for i in range(300)]
    written = {}
    for name, daemon in daemons.pair:
        out = tmp_path / name
        code, output = run_consumer_tool(
            daemon, "nsq_to_file", "files", bodies, f"--output-dir={out}", "--sync-interval=100ms"
        )
        assert code == 0, output
        written[name] = sorted(
            line for path in out.iterdir() for line in path.read_text().splitlines()
        )
    assert written["lmqd"] == written["nsqd"] == sorted(bodies)


def test_nsq_to_nsq_copies_every_message_once(daemons: Daemons) -> None:
    bodies = [f"copied {i}" for i in range(300)]
    copied = {}
    for name, daemon in daemons.pair:
        target = f"copy.from.{name}"
        code, output = run_consumer_tool(
            daemon, "nsq_to_nsq", "copy", bodies,
            f"--destination-nsqd-tcp-address={daemons.destination.tcp}",
            f"--destination-topic={target}",
        )  # fmt: skip
        assert code == 0, output
        read = http(daemons.destination.http, "GET",
                    f"/topic/read?topic={target}&offset=0&format=json")[1]  # fmt: skip
        copied[name] = sorted(base64.b64decode(m["body"]).decode() for m in read["messages"])
    assert copied["lmqd"] == copied["nsqd"] == sorted(bodies)


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]]
    protocol_version = "HTTP/1.1"  # keep-alive, as nsq_to_http's Go client expects

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length", "0"))
        self.received.append((self.path, self.rfile.read(size)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """An HTTP server on 127.0.0.1 port 0 keeping every POST: (its URL, what it received)."""
    received: list[tuple[str, bytes]] = []
    handler = type("Handler", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_nsq_to_http_posts_every_message_once(
    daemons: Daemons, collector: tuple[str, list[tuple[str, bytes]]]
) -> None:
    url, received = collector
    bodies = [f"posted {i}" for i in range(200)]
    posted = {}
    for name, daemon in daemons.pair:
        # Its exit code is not checked: stopped while it holds messages, nsq_to_http may wait
        # for them for ever against nsqd (docs/interop.md); it is killed then.
        run_consumer_tool(daemon, "nsq_to_http", "hooks", bodies, f"--post={url}/{name}")
        posted[name] = sorted(body.decode() for path, body in received if path == f"/{name}")
    assert posted["lmqd"] == posted["nsqd"] == sorted(bodies)


def test_nsq_tail_reads_the_dead_letters_that_came_before_it(daemons: Daemons) -> None:
    # lmq's dead letters are an ordinary topic: NSQ's tools started afterwards read them all.
    daemon = daemons.lmqd
    assert http(daemon.http, "POST", "/topic/create?topic=orders")[0] == 200
    assert http(daemon.http, "POST", "/channel/create?topic=orders&channel=work")[0] == 200
    policy = json.dumps({"max_attempts": 1, "dead_letter_topic": "orders.dead"}).encode()
    assert http(daemon.http, "POST", "/channel/policy?topic=orders&channel=work", policy)[0] == 200
    bodies = [f"order {i}" for i in range(5)]
    publish(daemon, "orders", bodies)
    with Consumer(daemon.tcp, "orders", "work") as consumer:
        for message in consumer.take(5):
            consumer.req(message, delay_ms=0)  # out of attempts: dead-lettered
        eventually(
            lambda: http(daemon.http, "GET", "/stats?format=json&topic=orders.dead")[1],
            lambda s: bool(s["topics"]) and s["topics"][0]["message_count"] == 5,
            WITHIN_S,
        )
    done = run_tool("nsq_tail", "--topic=orders.dead", f"--nsqd-tcp-address={daemon.tcp}",
                    "-n", "5")  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(done.stdout.decode().splitlines()) == bodies
