"""The ``lmq`` data source through a real local Spark session into real lmqd daemons.

Rules for this module (see conftest.py): one SparkSession for the whole package (``local[2]``,
no UI, loopback only); daemons are subprocesses on 127.0.0.1, port 0; each test its own topic;
every Spark job bounded by ``spark_guard``, every wait for messages by a timeout; consumers check
that exactly the expected bodies arrive and nothing more follows. ``local[2]`` makes one attempt
per task (no retries), so a failing task fails its job at once.
"""

from __future__ import annotations

import datetime
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from lmq_client.http import HTTPClient
from lmq_client.sync import Consumer
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd

from .conftest import (
    JOB_TIMEOUT_S,
    receive,
    receive_at_least,
    restart_later,
    spark_guard,
    write_lines,
)


def _run_available_now(query: StreamingQuery) -> None:
    # processAllAvailable() would raise too, but waits without a bound on a stuck query.
    finished = query.awaitTermination(60)
    if not finished:
        query.stop()
        pytest.fail("streaming query still running after 60 s")


def _closed_port_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_stream_publishes_each_row_once_and_restarts_from_the_checkpoint(
    spark: SparkSession, daemon: LmqdProcess, topic: str, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    write_lines(source, "part-0.txt", [f"event {i}" for i in range(600)])
    write_lines(source, "part-1.txt", [f"event {i}" for i in range(600, 1000)])

    def start() -> StreamingQuery:
        lines = spark.readStream.text(str(source))
        upper = lines.select(F.upper(F.col("value")).alias("body"))
        return (
            upper.writeStream.format("lmq")
            .option("address", daemon.tcp_address)
            .option("topic", topic)
            .option("bodyColumn", "body")
            .option("batchSize", "128")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    with spark_guard(spark):
        _run_available_now(start())
    first = receive(daemon.tcp_address, topic, 1000)
    assert sorted(first) == sorted(f"EVENT {i}".encode() for i in range(1000))

    # Restarted from its checkpoint, the query publishes only what arrived since.
    write_lines(source, "part-2.txt", ["late 1", "late 2"])
    with spark_guard(spark):
        _run_available_now(start())
    assert sorted(receive(daemon.tcp_address, topic, 2)) == [b"LATE 1", b"LATE 2"]


def test_batch_write_of_a_binary_column(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    df = spark.range(0, 3000, numPartitions=3).select(
        F.concat(F.lit(b"\x00\x01"), F.col("id").cast("string").cast("binary")).alias("payload")
    )
    with spark_guard(spark):
        df.write.format("lmq").mode("append").option("address", daemon.tcp_address).option(
            "topic", topic
        ).option("bodyColumn", "PAYLOAD").save()
    bodies = receive(daemon.tcp_address, topic, 3000)
    assert sorted(bodies) == sorted(b"\x00\x01%d" % i for i in range(3000))


def test_rows_without_a_body_column_arrive_as_json(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    df = spark.sql(
        """SELECT * FROM VALUES
             (1, 'ünï', 2.5D, TIMESTAMP'2026-01-02 03:04:05.5', DATE'2026-01-02', array(1, 2),
              named_struct('a', 1, 'b', 'x'), map('k', 7L), CAST(12.30 AS DECIMAL(6,2))),
             (2, NULL, NULL, NULL, NULL, array(), NULL, NULL, NULL)
           AS t(id, name, score, at, day, tags, inner, counts, price)"""
    )
    with spark_guard(spark):
        df.write.format("lmq").mode("append").option("address", daemon.tcp_address).option(
            "topic", topic
        ).save()
    rows = sorted((json.loads(b) for b in receive(daemon.tcp_address, topic, 2)),
                  key=lambda r: r["id"])
    at = datetime.datetime(2026, 1, 2, 3, 4, 5, 500000)
    zone = spark.conf.get("spark.sql.session.timeZone")
    assert zone is not None
    assert rows[0].pop("at") == (
        at.replace(tzinfo=_zoneinfo(zone)).astimezone(_zoneinfo(zone)).isoformat()
    )
    assert rows == [
        {"id": 1, "name": "ünï", "score": 2.5, "day": "2026-01-02", "tags": [1, 2],
         "inner": {"a": 1, "b": "x"}, "counts": {"k": 7}, "price": "12.30"},
        {"id": 2, "name": None, "score": None, "at": None, "day": None, "tags": [],
         "inner": None, "counts": None, "price": None},
    ]


def _zoneinfo(name: str) -> datetime.tzinfo:
    import zoneinfo

    return zoneinfo.ZoneInfo(name)


def test_partitions_spread_over_several_daemons(
    spark: SparkSession, daemons: list[LmqdProcess], topic: str
) -> None:
    addresses = ",".join(d.tcp_address for d in daemons)
    df = spark.range(0, 400, numPartitions=4).select(F.col("id").cast("string").alias("v"))
    with spark_guard(spark):
        df.write.format("lmq").mode("append").option("address", addresses).option(
            "topic", topic
        ).option("bodyColumn", "v").save()
    # spark.range splits 0..399 into 4 runs of 100; partition p publishes to daemon p % 2.
    expected = {
        daemons[0].tcp_address: [*range(0, 100), *range(200, 300)],
        daemons[1].tcp_address: [*range(100, 200), *range(300, 400)],
    }
    for address, ids in expected.items():
        bodies = receive(address, topic, len(ids))
        assert sorted(int(b) for b in bodies) == ids


def test_deferred_rows_from_a_delay_column(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    df = spark.createDataFrame([("soon", 0), ("later", 1500)], "v string, wait_ms int")
    with spark_guard(spark):
        started = time.monotonic()
        df.coalesce(1).write.format("lmq").mode("append").option(
            "address", daemon.tcp_address
        ).option("topic", topic).option("bodyColumn", "v").option("deferColumn", "wait_ms").save()
    # The task sends the DPUB for "later" before the final MPUB holding "soon", yet "later"
    # arrives second, no sooner than 1.5 s after the write began.
    assert receive(daemon.tcp_address, topic, 2) == [b"soon", b"later"]
    assert time.monotonic() - started >= 1.5


def test_stream_fails_with_one_short_line_when_no_daemon_is_reachable(
    spark: SparkSession, topic: str, tmp_path: Path
) -> None:
    dead = _closed_port_address()
    write_lines(tmp_path / "in", "part-0.txt", ["a", "b"])
    query = (
        spark.readStream.text(str(tmp_path / "in"))
        .writeStream.format("lmq")
        .option("address", dead)
        .option("topic", topic)
        .option("retryTimeoutMs", "1000")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    started = time.monotonic()
    with spark_guard(spark), pytest.raises(PySparkException) as info:
        _run_available_now(query)
    assert 1.0 <= time.monotonic() - started < 30
    text = str(info.value)
    line = re.search(r"LmqSinkError: (.*)", text)
    assert line is not None, text
    assert re.fullmatch(
        rf"lmq sink: publishing to topic '{topic}' on {dead} failed: cannot connect \(.*\) "
        r"\(retried for 1(\.\d+)? s; partition 0, attempt 0; no row published\)",
        line.group(1),
    ), line.group(1)
    # Spark's own words and the error's line: no Python traceback at all
    assert "Traceback" not in text and 'File "' not in text, text
    assert not query.isActive


def test_with_hidden_tracebacks_the_driver_sees_only_the_error_line(
    spark: SparkSession, topic: str
) -> None:
    dead = _closed_port_address()
    spark.conf.set("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true")
    try:
        with spark_guard(spark), pytest.raises(PySparkException) as info:
            spark.range(1).selectExpr("'x' AS value").write.format("lmq").mode("append").option(
                "address", dead
            ).option("topic", topic).option("retryTimeoutMs", "0").save()
    finally:
        spark.conf.unset("spark.sql.execution.pyspark.udf.hideTraceback.enabled")
    text = str(info.value)
    assert "Traceback" not in text, text
    assert (
        f"LmqSinkError: lmq sink: publishing to topic '{topic}' on {dead} failed: cannot connect"
    ) in text


def test_a_value_column_is_the_body_and_a_topic_column_routes_rows(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    # what a Kafka sink user writes: key and value columns, the topic per row
    df = spark.createDataFrame(
        [(f"{topic}-a", "k1", "one"), (f"{topic}-b", "k2", "two"), (f"{topic}-a", "k3", "three")],
        "topic string, key string, value string",
    )
    with spark_guard(spark):
        df.write.format("lmq").mode("append").option("address", daemon.tcp_address).save()
    assert sorted(receive(daemon.tcp_address, f"{topic}-a", 2)) == [b"one", b"three"]
    assert receive(daemon.tcp_address, f"{topic}-b", 1) == [b"two"]
    # a topic option wins over the column, and bodyColumn over value
    with spark_guard(spark):
        df.write.format("lmq").mode("append").option("address", daemon.tcp_address).option(
            "topic", topic
        ).option("bodyColumn", "key").save()
    assert sorted(receive(daemon.tcp_address, topic, 3)) == [b"k1", b"k2", b"k3"]


def test_a_row_with_an_invalid_topic_fails_the_write_naming_it(
    spark: SparkSession, daemon: LmqdProcess
) -> None:
    df = spark.createDataFrame([("fine", "x"), ("not fine!", "y")], "topic string, value string")
    with spark_guard(spark), pytest.raises(PySparkException) as info:
        df.coalesce(1).write.format("lmq").mode("append").option(
            "address", daemon.tcp_address
        ).save()
    assert (
        "lmq sink: topics from column 'topic': row 1: invalid topic name 'not fine!'"
    ) in str(info.value)


def test_tasks_reuse_their_workers_connections(
    spark: SparkSession, restartable: list[LmqdProcess], topic: str
) -> None:
    daemon = restartable[0]
    assert daemon.http_address is not None
    stats = HTTPClient(daemon.http_address)
    df = spark.range(0, 100, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
    for _ in range(4):
        with spark_guard(spark):
            df.write.format("lmq").mode("append").option("address", daemon.tcp_address).option(
                "topic", topic
            ).save()
    # 8 tasks ran; their producers stayed open in the (reused) Python workers, at most one
    # per worker of local[2], instead of a connection opened and closed per task
    producers = stats.stats(include_clients=True)["producers"] or []
    assert 1 <= len(producers) <= 2, producers
    assert stats.stats(topic)["topics"][0]["message_count"] == 400


def _wait_for_rows(query: StreamingQuery, rows: int) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while sum(p["numInputRows"] for p in query.recentProgress) < rows:
        assert query.isActive, query.exception()
        assert time.monotonic() < deadline, query.recentProgress
        time.sleep(0.2)


def test_a_stream_survives_a_daemon_restart(
    spark: SparkSession, restartable: list[LmqdProcess], topic: str, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    address = restartable[0].tcp_address
    write_lines(source, "part-0.txt", [f"before {i}" for i in range(100)])
    query = (
        spark.readStream.text(str(source)).writeStream.format("lmq")
        .option("address", address).option("topic", topic)
        .option("retryTimeoutMs", "30000")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )  # fmt: skip
    try:
        with spark_guard(spark):
            _wait_for_rows(query, 100)
            restarted = restart_later(restartable, 3.0)
            # published while the daemon is down: the task retries until it is back
            write_lines(source, "part-1.txt", [f"after {i}" for i in range(100)])
            _wait_for_rows(query, 200)
            restarted.join(JOB_TIMEOUT_S)
            assert query.isActive and query.exception() is None
    finally:
        query.stop()
    expected = {f"{w} {i}".encode() for w in ("before", "after") for i in range(100)}
    receive_at_least(address, topic, expected)


@pytest.fixture
def strict_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LmqdProcess]:
    server = start_lmqd(tmp_path_factory.mktemp("lmqd-strict"), ["--max-msg-size=100"])
    try:
        yield server
    finally:
        stop_lmqd(server)


def test_batch_write_fails_clearly_when_the_daemon_rejects_a_publish(
    spark: SparkSession, strict_daemon: LmqdProcess, topic: str
) -> None:
    address = strict_daemon.tcp_address
    df = spark.range(0, 10, numPartitions=1).select(
        F.when(F.col("id") == 7, F.repeat(F.lit("x"), 101)).otherwise(F.lit("fine")).alias("v")
    )
    with spark_guard(spark), pytest.raises(PySparkException) as info:
        df.write.format("lmq").mode("append").option("address", address).option(
            "topic", topic
        ).option("bodyColumn", "v").save()
    assert (
        f"lmq sink: publishing to topic '{topic}' on {address} failed: E_BAD_MESSAGE MPUB "
        f"message too big 101 > 100 (from {address})"
    ) in str(info.value)


@pytest.mark.parametrize(
    ("mode", "options", "message"),
    [
        ("append", {"address": "127.0.0.1:4150"}, "lmq sink: option 'topic' is required"),
        ("append", {"address": "127.0.0.1:4150", "topic": "t", "bodyColumn": "id"},
         "lmq sink: bodyColumn 'id' must be a string or binary column, not bigint"),
        ("overwrite", {"address": "127.0.0.1:4150", "topic": "t"},
         "lmq sink: a topic is a stream of messages and cannot be overwritten; use mode('append')"),
    ],
)
def test_bad_options_fail_before_any_task_runs(
    spark: SparkSession, mode: str, options: dict[str, str], message: str
) -> None:
    df = spark.range(3)
    with spark_guard(spark), pytest.raises(PySparkException) as info:
        df.write.format("lmq").mode(mode).options(**options).save()
    assert message in str(info.value)


def test_headers_and_priority_columns_reach_consumers(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    df = spark.sql(
        """SELECT * FROM VALUES
             ('a', map('trace', 't-1', 'tenant', 'x'), 7, 60000L),
             ('b', NULL, NULL, NULL),
             ('c', map(), 0, NULL)
           AS t(value, headers, prio, ttl)"""
    )
    with spark_guard(spark):
        (df.write.format("lmq").mode("append").option("address", daemon.tcp_address)
         .option("topic", topic).option("priorityColumn", "prio").option("ttlColumn", "ttl")
         .option("dedupIds", "true").save())  # fmt: skip
    got: dict[bytes, tuple[dict[str, str], int]] = {}
    with Consumer(topic, "check", daemon.tcp_address, max_in_flight=10) as consumer:
        while len(got) < 3:
            message = consumer.get(20.0)
            assert message is not None, got
            got[message.body] = (message.headers, message.priority)
            message.finish()
        assert consumer.get(0.5) is None
    assert got == {b"a": ({"trace": "t-1", "tenant": "x"}, 7), b"b": ({}, 0), b"c": ({}, 0)}


def test_a_bad_header_fails_the_write_naming_row_and_column(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    df = spark.sql("SELECT * FROM VALUES ('a', map('ok', '1')), ('b', map('', 'v')) "
                   "AS t(value, headers)").coalesce(1)  # fmt: skip
    with spark_guard(spark), pytest.raises(PySparkException) as info:
        (df.write.format("lmq").mode("append").option("address", daemon.tcp_address)
         .option("topic", topic).save())  # fmt: skip
    assert re.search(
        rf"LmqSinkError: lmq sink: topic '{topic}': row 1: column 'headers': a header key must "
        r"be 1\.\.255 bytes \(partition 0; 0 of this task's rows were published before it\)",
        str(info.value),
    ), str(info.value)
