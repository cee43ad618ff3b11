"""Fixtures for the Spark sink tests: one local SparkSession, real lmqd daemons, a checker.

Rules for this package: daemons are ``lmqd`` subprocesses on 127.0.0.1 with port 0 (the
``start_lmqd`` of tests/support/process.py), data in pytest's temporary directories; Spark runs
``local[2]`` with loopback addresses, no UI and 2 shuffle partitions, and starts once per session
(~15 s); every Spark job is bounded by ``spark_guard`` (jobs cancelled, test failed) and every
wait for messages by a timeout, so a broken sink fails instead of hanging. Each test publishes to
its own topic, so tests share daemons without seeing each other's messages.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lmq_client.http import HTTPClient
from lmq_client.spark import local_session
from lmq_client.sync import Consumer, Producer
from lmqd.protocol.extension import XpubMessage, parse_xpub_body
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd

# A Spark job in these tests handles at most a few thousand rows: seconds on an idle machine.
# The bound is generous for a loaded 2-core CI box, yet fails a hung job long before CI's limit.
JOB_TIMEOUT_S = 90.0
# After the expected messages arrived, how long to wait to be sure no extra one follows: lmqd
# delivers a stored message within milliseconds, so a duplicate would show up well within this.
QUIET_S = 0.5
# Waiting for the first/next message of an expected set.
RECEIVE_TIMEOUT_S = 20.0


def decode_items(
    count: int, items: Sequence[bytes | memoryview], *, extension: bool
) -> list[XpubMessage]:
    """The messages of a ``publish_items`` call (the sink's fake producers record them): XPUB
    items by the daemon's own parser, MPUB items by their sizes; an item that does not add up
    fails the test."""
    data = b"".join(items)
    if extension:
        return parse_xpub_body(struct.pack(">I", count) + data, max_msg_size=1 << 30)
    bodies, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        bodies.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    assert pos == len(data) and len(bodies) == count, (pos, len(data), len(bodies), count)
    return [XpubMessage(body, None) for body in bodies]  # type: ignore[arg-type]


def mpub_item(body: bytes) -> bytes:
    """One message's MPUB item (its size, then the body)."""
    return struct.pack(">I", len(body)) + body


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """The session's one local SparkSession, ``lmq`` registered."""
    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON")}
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Executors' Python workers must import lmq_client: this interpreter's venv has it.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = local_session(
        "lmq-tests",
        conf={
            "spark.sql.warehouse.dir": str(warehouse),
            "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={warehouse}",
        },
        log_level="ERROR",  # failing jobs are the point of some tests; their stack traces are noise
    )
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LmqdProcess]]:
    """Two lmqd daemons shared by the package (tests use their own topics)."""
    started: list[LmqdProcess] = []
    try:
        for i in range(2):
            started.append(start_lmqd(tmp_path_factory.mktemp(f"lmqd{i}"), []))
        yield started
    finally:
        for server in started:
            stop_lmqd(server)


@pytest.fixture
def daemon(daemons: list[LmqdProcess]) -> LmqdProcess:
    """The first shared daemon."""
    return daemons[0]


@pytest.fixture
def topic() -> str:
    """A fresh topic name for this test."""
    return f"spark-{uuid.uuid4().hex[:12]}"


def publish(daemon: LmqdProcess, topic: str, bodies: list[bytes]) -> None:
    """``bodies`` into ``topic`` in one MPUB."""
    with Producer(daemon.tcp_address) as producer:
        producer.mpub(topic, bodies)


def http_address(daemon: LmqdProcess) -> str:
    """The daemon's HTTP address (the node's name in the source's offsets and rows)."""
    assert daemon.http_address is not None
    return daemon.http_address


@contextlib.contextmanager
def spark_guard(spark: SparkSession, seconds: float = JOB_TIMEOUT_S) -> Iterator[None]:
    """Cancel every Spark job still running after ``seconds`` and fail the test."""
    fired = threading.Event()

    def cancel() -> None:
        fired.set()
        spark.sparkContext.cancelAllJobs()

    timer = threading.Timer(seconds, cancel)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if fired.is_set():
            pytest.fail(f"Spark job still running after {seconds:g}s: cancelled")


def receive(address: str, topic: str, count: int, *, channel: str = "check") -> list[bytes]:
    """Exactly ``count`` message bodies from ``topic`` on ``address`` (finished), in arrival
    order; fails if fewer arrive in time or any more arrives within ``QUIET_S`` afterwards."""
    bodies: list[bytes] = []
    with Consumer(topic, channel, address, max_in_flight=max(1, min(count, 2500))) as consumer:
        while len(bodies) < count:
            message = consumer.get(RECEIVE_TIMEOUT_S)
            assert message is not None, (
                f"{topic} on {address}: {len(bodies)} of {count} messages arrived"
            )
            bodies.append(message.body)
            message.finish()
        extra = consumer.get(QUIET_S)
        assert extra is None, f"{topic} on {address}: unexpected message {extra.body!r}"
    return bodies


def receive_at_least(address: str, topic: str, expected: set[bytes]) -> list[bytes]:
    """Message bodies from ``topic`` on ``address`` until every one of ``expected`` arrived and
    nothing more came for ``QUIET_S`` (at-least-once: repeats allowed); fails on a body that
    is not expected, or if some do not arrive in time."""
    bodies: list[bytes] = []
    with Consumer(topic, "check", address, max_in_flight=2500) as consumer:
        while True:
            missing = expected - set(bodies)
            message = consumer.get(RECEIVE_TIMEOUT_S if missing else QUIET_S)
            if message is None:
                assert not missing, f"{topic} on {address}: {len(missing)} never arrived"
                return bodies
            assert message.body in expected, f"{topic}: unexpected {message.body!r}"
            bodies.append(message.body)
            message.finish()


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[list[LmqdProcess]]:
    """A daemon of the test's own, in a list: ``restart_later`` appends its successor."""
    servers = [start_lmqd(tmp_path / "lmqd-data", [])]
    try:
        yield servers
    finally:
        for server in servers:
            if server.process.poll() is None:
                stop_lmqd(server)


def restart_later(servers: list[LmqdProcess], down_s: float) -> threading.Thread:
    """Stop the last daemon now (SIGTERM: it writes what it holds to disk), start it again on
    the same ports and data after ``down_s`` seconds, in a thread (joined by the caller)."""
    old = servers[-1]
    assert old.http_address is not None
    flags = [f"--tcp-address={old.tcp_address}", f"--http-address={old.http_address}"]
    stop_lmqd(old)

    def start() -> None:
        time.sleep(down_s)
        servers.append(start_lmqd(old.data_path, flags))

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    return thread


def write_lines(directory: Path, name: str, lines: list[str]) -> None:
    """One input file for a file-stream source, written whole before Spark can list it."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"  # Spark's file source ignores names starting with "."
    tmp.write_text("".join(f"{line}\n" for line in lines))
    tmp.rename(directory / name)


SEGMENT_BYTES = 2048
"""``--max-bytes-per-file`` of ``small_segments``: about 30 small messages per log segment, so
that retention deletes the oldest of a few hundred messages and keeps the newest."""


@pytest.fixture
def small_segments(tmp_path: Path) -> Iterator[LmqdProcess]:
    """A daemon of the test's own whose topic logs are cut into small segments."""
    server = start_lmqd(tmp_path / "small-segments", [f"--max-bytes-per-file={SEGMENT_BYTES}"])
    try:
        yield server
    finally:
        stop_lmqd(server)


def retain_little(daemon: LmqdProcess, topic: str) -> None:
    """Give ``topic`` a retention of one byte: once a channel has passed a segment (all but
    the newest), it is deleted. Every message is then written to the log."""
    assert daemon.http_address is not None
    HTTPClient(daemon.http_address).topic_policy(topic, {"retention_bytes": 1})


def drain_and_expire(daemon: LmqdProcess, topic: str, count: int) -> int:
    """Consume ``count`` messages of ``topic`` on a channel (its first, so it gets the
    backlog), pause it, and wait until retention has deleted the segments it passed; the
    topic's earliest offset then."""
    assert daemon.http_address is not None
    http = HTTPClient(daemon.http_address)
    with Consumer(topic, "drain", daemon.tcp_address, max_in_flight=1000) as consumer:
        for _ in range(count):
            message = consumer.get(RECEIVE_TIMEOUT_S)
            assert message is not None
            message.finish()
    http.channel_action("pause", topic, "drain")
    deadline = time.monotonic() + RECEIVE_TIMEOUT_S
    while (earliest := int(http.topic_offsets(topic)["earliest"])) == 0:
        assert time.monotonic() < deadline, "retention deleted nothing"
        time.sleep(0.05)
    return earliest
