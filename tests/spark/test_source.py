"""The ``lmq`` source's batch reads: one address for both sides, columns, offset and time
ranges, empty and impossible ranges, and errors as one line.

Rules for this module (see conftest.py): one SparkSession for the package (``local[2]``, no UI,
loopback only); daemons are lmqd subprocesses on 127.0.0.1, port 0 (the shared ``daemons``);
each test its own topics; every Spark job bounded by ``spark_guard``. Messages are published
with the blocking client and read back by offset; the source consumes nothing, so a topic
without channels keeps them all for it. Streams are in ``test_source_stream.py``.
"""

from __future__ import annotations

import datetime
import json
import logging
import socket
import threading
import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql.datasource import InputPartition

from lmq_client.errors import ConnectionFailed
from lmq_client.http import HTTPClient
from lmq_client.spark import LmqDataLossError, SourceOptions
from lmq_client.spark.nodes import http_address_of
from lmq_client.spark.source_read import LmqPartition, read_partition
from lmq_client.sync import Producer
from tests.support.process import LmqdProcess

from .conftest import (
    drain_and_expire,
    http_address,
    publish,
    receive,
    retain_little,
    spark_guard,
)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def reader(spark: SparkSession, **options: str) -> DataFrameReader:
    frame = spark.read.format("lmq")
    for key, value in options.items():
        frame = frame.option(key, value)
    return frame


def rows(frame: DataFrame, *columns: str) -> list[tuple[object, ...]]:
    spark = frame.sparkSession
    with spark_guard(spark):
        got = frame.orderBy("topic", "node", "offset").select(*columns).collect()
    return [tuple(r) for r in got]


def error_of(frame: DataFrameReader) -> str:
    """The text Spark raises for a read that fails on the driver."""
    with pytest.raises(PySparkException) as info:
        frame.load().collect()
    return str(info.value)


# -- one address for both sides --------------------------------------------------------------------


def test_the_source_finds_the_http_api_from_the_tcp_address(daemon: LmqdProcess) -> None:
    assert http_address_of(daemon.tcp_address, timeout=5) == http_address(daemon)
    # The address the source's option meant before: an HTTP API is read as given.
    assert http_address_of(http_address(daemon), timeout=5) == http_address(daemon)
    # Another spelling of the host keeps the user's host with the daemon's HTTP port.
    port = http_address(daemon).rpartition(":")[2]
    tcp_port = daemon.tcp_address.rpartition(":")[2]
    assert http_address_of(f"localhost:{tcp_port}", timeout=5) == f"127.0.0.1:{port}"
    with pytest.raises(ConnectionFailed, match="cannot connect"):
        http_address_of(f"127.0.0.1:{closed_port()}", timeout=5)


def test_a_non_nsq_port_is_named(daemon: LmqdProcess) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        address = f"127.0.0.1:{listener.getsockname()[1]}"

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(100)
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n" + b"\0" * 20)

        thread = threading.Thread(target=answer)
        thread.start()
        with pytest.raises(ConnectionFailed, match="not an NSQ daemon"):
            http_address_of(address, timeout=5)
        thread.join(5)


def test_the_same_address_writes_and_reads(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    with spark_guard(spark):
        spark.range(5).selectExpr("CAST(id AS STRING) AS value").write.format("lmq").mode(
            "append"
        ).option("address", daemon.tcp_address).option("topic", topic).save()
    read = reader(spark, address=daemon.tcp_address, topic=topic).load()
    got = rows(read, "value", "node")
    assert sorted(v for v, _ in got) == [b"0", b"1", b"2", b"3", b"4"]
    assert {n for _, n in got} == {http_address(daemon)}
    # One daemon given several ways is one node: each message is read once.
    tcp_port = daemon.tcp_address.rpartition(":")[2]
    http_port = http_address(daemon).rpartition(":")[2]
    twice = reader(spark, address=f"{daemon.tcp_address},localhost:{tcp_port}", topic=topic,
                   httpAddress=f"localhost:{http_port}").load()  # fmt: skip
    assert len(rows(twice, "value")) == 5


# -- columns -------------------------------------------------------------------------------------


def test_batch_read_of_two_daemons_and_its_columns(
    spark: SparkSession, daemons: list[LmqdProcess], topic: str
) -> None:
    first, second = daemons
    publish(first, topic, [b"a%d" % i for i in range(8)])
    publish(second, topic, [b"b%d" % i for i in range(3)])
    frame = reader(spark, address=f"{first.tcp_address},{second.tcp_address}", topic=topic,
                   partitionSize="2").load()  # fmt: skip
    assert frame.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,node:string,offset:bigint,"
        "timestamp:timestamp,timestampType:int,id:string,attempts:int,priority:int,"
        "headerMap:map<string,string>>"
    )
    got = rows(frame, "node", "offset", "value")
    assert got == sorted([
        *((http_address(first), i, b"a%d" % i) for i in range(8)),
        *((http_address(second), i, b"b%d" % i) for i in range(3)),
    ])
    with spark_guard(spark):
        row = frame.orderBy("offset").first()
    assert row is not None
    assert (row.key, row.topic, row.timestampType, row.attempts, len(row.id)) == (
        None, topic, 1, 0, 16,
    )
    assert isinstance(row.timestamp, datetime.datetime)
    assert abs(row.timestamp.timestamp() - time.time()) < 300
    # Kafka's habit: CAST(key AS STRING), CAST(value AS STRING)
    with spark_guard(spark):
        cast = frame.selectExpr("CAST(key AS STRING) k", "CAST(value AS STRING) v").collect()
    assert sorted(r.v for r in cast)[:2] == ["a0", "a1"] and {r.k for r in cast} == {None}


def test_headers_as_kafkas_array_when_asked_and_as_a_map(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    with Producer(daemon.tcp_address) as producer:
        producer.publish(topic, b"plain")
        producer.publish(topic, b"rich", headers={"trace": "t-1", "k": "v"}, priority=7)
        producer.publish(topic, b"high", priority=9)
    plain = reader(spark, address=daemon.tcp_address, topic=topic).load()
    assert "headers" not in plain.columns  # as Kafka's source without includeHeaders
    assert rows(plain, "value", "headerMap", "priority") == [
        (b"plain", None, 0), (b"rich", {"trace": "t-1", "k": "v"}, 7), (b"high", None, 9),
    ]
    kafka = reader(spark, address=daemon.tcp_address, topic=topic, includeHeaders="true").load()
    assert kafka.schema["headers"].dataType.simpleString() == (
        "array<struct<key:string,value:binary>>"
    )
    got = rows(kafka, "value", "headers")
    assert got[0] == (b"plain", None)
    assert got[1][0] == b"rich"
    headers = got[1][1]
    assert isinstance(headers, list)
    assert [(h.key, h.value) for h in headers] == [("trace", b"t-1"), ("k", b"v")]


# -- ranges ----------------------------------------------------------------------------------------


def test_offset_ranges_by_topic_and_node_in_any_spelling(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    publish(daemon, topic, [b"m%d" % i for i in range(10)])
    port = http_address(daemon).rpartition(":")[2]
    spellings = [http_address(daemon), f"localhost:{port}", daemon.tcp_address]
    for spelling in spellings:
        frame = reader(spark, address=daemon.tcp_address, subscribe=topic,
                       startingOffsets=json.dumps({topic: {spelling: 2}}),
                       endingOffsets=json.dumps({topic: {spelling: 5}})).load()  # fmt: skip
        assert rows(frame, "offset") == [(2,), (3,), (4,)], spelling
    # Kafka's -2 and -1
    frame = reader(spark, address=daemon.tcp_address, topic=topic,
                   startingOffsets=json.dumps({topic: {spellings[1]: -2}}),
                   endingOffsets=json.dumps({topic: {spellings[1]: -1}})).load()  # fmt: skip
    assert len(rows(frame, "offset")) == 10


def test_time_positions(spark: SparkSession, daemon: LmqdProcess, topic: str) -> None:
    publish(daemon, topic, [b"old%d" % i for i in range(3)])
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    publish(daemon, topic, [b"new%d" % i for i in range(4)])
    time.sleep(0.05)
    after_ms = int(time.time() * 1000)
    time.sleep(0.05)
    publish(daemon, topic, [b"late"])
    node = http_address(daemon)
    for options in (
        {"startingTimestamp": str(middle_ms), "endingTimestamp": str(after_ms)},
        {"startingOffsetsByTimestamp": json.dumps({topic: {node: middle_ms}}),
         "endingOffsetsByTimestamp": json.dumps({topic: {node: after_ms}})},
    ):
        frame = reader(spark, address=daemon.tcp_address, topic=topic, **options).load()
        assert rows(frame, "value") == [(b"new%d" % i,) for i in range(4)], options
    # No message at or after the time: Kafka's strategies, error (default) or latest.
    future = str(int(time.time() * 1000) + 3_600_000)
    text = error_of(reader(spark, address=daemon.tcp_address, topic=topic,
                           startingTimestamp=future))  # fmt: skip
    assert (
        f"option 'startingTimestamp': topic '{topic}' on {node} has no message at or after"
    ) in text
    latest = reader(spark, address=daemon.tcp_address, topic=topic, startingTimestamp=future,
                    startingOffsetsByTimestampStrategy="latest").load()  # fmt: skip
    assert rows(latest, "value") == []


def test_empty_ranges_are_empty_frames(spark: SparkSession, daemon: LmqdProcess, topic: str
                                       ) -> None:  # fmt: skip
    publish(daemon, topic, [b"x", b"y"])
    node = http_address(daemon)
    for options in (
        {"startingOffsets": "latest"},
        {"startingOffsets": json.dumps({topic: {node: 1}}),
         "endingOffsets": json.dumps({topic: {node: 1}})},
        {"subscribePattern": f"{topic}-none-.*"},  # a pattern matching nothing
    ):
        given = {"topic": topic, **options}
        if "subscribePattern" in options:
            del given["topic"]
        frame = reader(spark, address=daemon.tcp_address, **given).load()
        with spark_guard(spark):
            assert frame.count() == 0, options
            assert frame.collect() == []


def first_line(text: str) -> str:
    return text.splitlines()[0]


def test_impossible_ranges_and_unknown_topics_are_one_line(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    publish(daemon, topic, [b"x", b"y", b"z"])
    node = http_address(daemon)
    prefix = (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source reader: "
        "lmq_client.spark.errors.LmqSourceError: lmq source: "
    )
    cases = {
        "after": ({"topic": topic, "startingOffsets": json.dumps({topic: {node: 2}}),
                   "endingOffsets": json.dumps({topic: {node: 1}})},
                  f"topic '{topic}' on {node}: the start (2) is after the end (1); check "
                  "startingOffsets and endingOffsets"),
        "past the end": ({"topic": topic, "endingOffsets": json.dumps({topic: {node: 9}})},
                         f"option 'endingOffsets': offset 9 of topic '{topic}' on {node} is "
                         "past its end (3: the next message gets that offset)"),
        "unknown topic": ({"subscribe": f"{topic},{topic}-nope"},
                          f"topic '{topic}-nope' does not exist on any node read ({node})"),
        "unknown node": ({"topic": topic,
                          "startingOffsets": json.dumps({topic: {"127.0.0.1:1": 0}})},
                         f"offsets given for {topic} on 127.0.0.1:1, which is not a node read "
                         f"({node})"),
    }  # fmt: skip
    for name, (options, message) in cases.items():
        text = error_of(reader(spark, address=daemon.tcp_address, **options))
        assert first_line(text) == prefix + message, name
        assert "Traceback" not in text, name


def test_a_user_s_mistakes_are_one_line_without_a_traceback(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    dead = f"127.0.0.1:{closed_port()}"
    cases = {
        "no address": ({"topic": topic}, "option 'address' is required"),
        "bad option": ({"address": daemon.tcp_address, "topic": topic, "startingOffset": "x"},
                       "unknown option 'startingoffset'"),  # Spark lower-cases keys
        "kafka option": ({"kafka.bootstrap.servers": daemon.tcp_address, "subscribe": topic},
                         "option 'kafka.bootstrap.servers' is Kafka's: use 'address'"),
        "stopped daemon": ({"address": dead, "topic": topic},
                           f"option 'address': {dead}: cannot connect (Connection refused)"),
        "stopped http": ({"httpAddress": dead, "topic": topic},
                         f"option 'httpAddress': {dead}: HTTP API unreachable"),
    }  # fmt: skip
    for name, (options, message) in cases.items():
        text = error_of(reader(spark, **options))
        line = first_line(text)
        expected = "lmq_client.spark.errors.LmqSourceError: lmq source: " + message
        assert expected in line, (name, text)
        assert "Traceback" not in text and len(text.splitlines()) <= 2, (name, text)


def test_an_executor_finds_offsets_gone_since_planning(
    small_segments: LmqdProcess, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # What a task does when retention deleted part of its range after the plan: fail naming
    # the offsets (failOnDataLoss), or log them and read the rest. The daemon counts them.
    daemon = small_segments
    publish(daemon, topic, [b"m%d" % i for i in range(3)])
    retain_little(daemon, topic)
    publish(daemon, topic, [b"m%d" % i for i in range(3, 200)])
    earliest = drain_and_expire(daemon, topic, 200)
    node = http_address(daemon)
    planned = LmqPartition(topic, node, 0, 200)  # planned when all 200 were stored
    strict = SourceOptions(addresses=(daemon.tcp_address,), topics=(topic,))
    with pytest.raises(LmqDataLossError) as info:
        list(read_partition(strict, planned))
    assert str(info.value).startswith(
        f"lmq source: topic '{topic}' on {node}: offsets 0..{earliest - 1} ({earliest} messages) "
        "are no longer stored"
    )
    lenient = SourceOptions(addresses=(daemon.tcp_address,), topics=(topic,),
                            fail_on_data_loss=False)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="lmq_client.spark"):
        got = list(read_partition(lenient, planned))
    assert [v for b in got for v in b.column(1).to_pylist()] == [
        b"m%d" % i for i in range(earliest, 200)
    ]
    assert f"offsets 0..{earliest - 1}" in caplog.text and "going on" in caplog.text
    stats = HTTPClient(node).stats(topic=topic)
    assert stats["topics"][0]["reader_lost_count"] == 2 * earliest
    # PySpark's stand-in for an empty plan reads nothing
    assert list(read_partition(strict, InputPartition(None))) == []


def test_a_sink_s_topic_column_and_the_source_s_topic_column(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    # Kafka's habit on both sides: rows routed by a topic column, read back by subscribe.
    left, right = f"{topic}-l", f"{topic}-r"
    with spark_guard(spark):
        spark.createDataFrame([(left, "1"), (right, "2"), (left, "3")], "topic string, value string"
                              ).write.format("lmq").mode("append").option(
            "address", daemon.tcp_address).save()  # fmt: skip
    frame = reader(spark, address=daemon.tcp_address, subscribe=f"{left},{right}").load()
    # (the two partitions publish in either order: compare the rows, not their offsets)
    assert sorted(rows(frame, "topic", "value")) == [(left, b"1"), (left, b"3"), (right, b"2")]
    assert receive(daemon.tcp_address, right, 1) == [b"2"]  # a channel still gets them
