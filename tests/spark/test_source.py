"""The ``lmq`` source: batch reads of offset ranges and streams restarted from their checkpoint.

Rules for this module (see conftest.py): one SparkSession for the package (``local[2]``, no UI,
loopback only); daemons are lmqd subprocesses on 127.0.0.1, port 0 (the shared ``daemons``);
each test its own topic; every Spark job bounded by ``spark_guard``. Messages are published with
the blocking client and read back by offset; the source consumes nothing, so a topic without
channels keeps them all for it.
"""

from __future__ import annotations

import datetime
import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.streaming.query import StreamingQuery

from lmq_client.errors import ConnectionFailed
from lmq_client.spark import LmqBatchReader, LmqStreamReader, SourceOptions
from lmq_client.sync import Producer
from tests.support.process import LmqdProcess

from .conftest import spark_guard


def publish(daemon: LmqdProcess, topic: str, bodies: list[bytes]) -> None:
    with Producer(daemon.tcp_address) as producer:
        producer.mpub(topic, bodies)


def http_address(daemon: LmqdProcess) -> str:
    assert daemon.http_address is not None
    return daemon.http_address


def test_source_options_are_checked_on_the_driver() -> None:
    options = SourceOptions.parse({
        "address": "127.0.0.1:4151, 127.0.0.1:4152", "topic": "t",
        "startingOffsets": '{"127.0.0.1:4152": 7}', "MAXMESSAGESPERTRIGGER": "10",
    })
    assert options.addresses == ("127.0.0.1:4151", "127.0.0.1:4152")
    assert (options.starting, options.ending, options.max_per_trigger) == (
        {"127.0.0.1:4152": 7}, "latest", 10,
    )
    # httpAddress is the name that says what it takes; address is its older name
    assert SourceOptions.parse({"HTTPADDRESS": "127.0.0.1:4151", "topic": "t"}).addresses == (
        "127.0.0.1:4151",
    )
    found = SourceOptions.parse({"lookupdHttpAddress": "127.0.0.1:4161", "topic": "t",
                                 "startingOffsets": '{"10.0.0.7:4151": 3}'})  # fmt: skip
    assert (found.addresses, found.lookupd_addresses, found.starting) == (
        (), ("127.0.0.1:4161",), {"10.0.0.7:4151": 3},
    )
    assert found.lookupd_poll_interval_s == 10.0
    for given, message in (
        ({"topic": "t"}, "'httpAddress' is required"),
        ({"address": "x:1", "httpAddress": "x:1", "topic": "t"}, "not both"),
        ({"httpAddress": "x", "topic": "t"}, "option 'httpAddress': invalid address"),
        ({"lookupdHttpAddress": "l:1", "topic": "t", "startingOffsets": '{"nope": 1}'},
         "option 'startingOffsets': invalid address 'nope'"),
        ({"address": "x:1", "topic": "bad name"}, "option 'topic'"),
        ({"address": "x:1", "topic": "t", "bodyColumn": "v"}, "unknown option 'bodyColumn'"),
        ({"address": "x:1", "topic": "t", "startingOffsets": "soon"}, "earliest, latest or"),
        ({"address": "x:1", "topic": "t", "startingOffsets": '{"y:2": 1}'},
         "not in 'httpAddress'"),
        ({"address": "x:1", "topic": "t", "maxMessagesPerTrigger": "0"}, "at least 1"),
        ({"address": "x:1", "topic": "t", "lookupdPollIntervalMs": "-5"}, "at least 0"),
    ):
        with pytest.raises(ValueError, match=message):
            SourceOptions.parse(given)


def test_a_tcp_address_given_to_the_source_says_to_give_the_http_one(
    daemon: LmqdProcess, topic: str
) -> None:
    with pytest.raises(ConnectionFailed) as info:
        LmqBatchReader(SourceOptions(addresses=(daemon.tcp_address,), topic=topic))
    assert str(info.value) == (
        f"{daemon.tcp_address}: not an HTTP API: the source reads through the daemons' HTTP "
        "addresses (httpAddress, lmqd's --http-address), not their TCP addresses"
    )


def test_a_daemon_that_does_not_answer_keeps_its_offset_and_is_logged_once(
    daemon: LmqdProcess, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    dead = f"127.0.0.1:{_closed_port()}"
    publish(daemon, topic, [b"x", b"y"])
    reader = LmqStreamReader(SourceOptions(addresses=(http_address(daemon), dead), topic=topic))
    start = {http_address(daemon): 0, dead: 4}
    with caplog.at_level(logging.INFO, logger="lmq_client.spark"):
        for _ in range(3):
            assert reader.latestOffset(start, ReadAllAvailable()) == {
                http_address(daemon): 2, dead: 4,
            }
    said = [r.getMessage() for r in caplog.records if dead in r.getMessage()]
    assert len(said) == 1 and "does not answer" in said[0] and "stays at 4" in said[0], said


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_batch_read_of_an_offset_range(
    spark: SparkSession, daemons: list[LmqdProcess], topic: str
) -> None:
    first, second = daemons
    publish(first, topic, [b"a%d" % i for i in range(8)])
    publish(second, topic, [b"b%d" % i for i in range(3)])
    nodes = f"{http_address(first)},{http_address(second)}"
    reader = (
        spark.read.format("lmq").option("httpAddress", nodes).option("topic", topic)
        .option("partitionSize", "2")
    )
    with spark_guard(spark):
        rows = reader.load().orderBy("node", "offset").collect()
    assert [(r.node, r.offset, r.value) for r in rows] == sorted([
        *((http_address(first), i, b"a%d" % i) for i in range(8)),
        *((http_address(second), i, b"b%d" % i) for i in range(3)),
    ])
    row = rows[0]
    assert (row.topic, row.attempts, len(row.id)) == (topic, 0, 16)
    assert isinstance(row.timestamp, datetime.datetime)
    assert abs(row.timestamp.timestamp() - datetime.datetime.now().timestamp()) < 300
    ranged = (
        reader.option("startingOffsets", json.dumps({http_address(first): 2}))
        .option("endingOffsets", json.dumps({http_address(first): 5, http_address(second): 0}))
    )
    with spark_guard(spark):
        got = ranged.load().orderBy("offset").select("offset", "value").collect()
    assert [(r.offset, r.value) for r in got] == [(i, b"a%d" % i) for i in range(2, 5)]
    assert spark.read.format("lmq").option("address", nodes).option("topic", topic).load() \
        .schema.simpleString() == (
            "struct<value:binary,id:string,topic:string,node:string,offset:bigint,"
            "timestamp:timestamp,attempts:int,headers:map<string,string>,priority:int>"
        )


def test_a_stream_restarted_from_its_checkpoint_reads_exactly_the_new_messages(
    spark: SparkSession, daemon: LmqdProcess, topic: str, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    batches: list[tuple[int, list[tuple[int, bytes]]]] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        rows = frame.select("offset", "value").collect()
        batches.append((batch_id, sorted((r.offset, r.value) for r in rows)))

    def start(**options: str) -> StreamingQuery:
        stream = (
            spark.readStream.format("lmq").option("address", http_address(daemon))
            .option("topic", topic).option("startingOffsets", "earliest")
        )
        for key, value in options.items():
            stream = stream.option(key, value)
        return (
            stream.load().writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint)).start()
        )

    def run(**options: str) -> None:
        query = start(**options)
        try:
            with spark_guard(spark):
                query.processAllAvailable()
        finally:
            query.stop()

    publish(daemon, topic, [b"m%d" % i for i in range(50)])
    run(maxMessagesPerTrigger="20")
    read: list[tuple[int, bytes]] = [entry for _, rows in batches for entry in rows]
    assert read == [(i, b"m%d" % i) for i in range(50)]
    assert all(len(rows) <= 20 for _, rows in batches)
    assert len([rows for _, rows in batches if rows]) == 3

    publish(daemon, topic, [b"m%d" % i for i in range(50, 80)])
    before = len(batches)
    run()  # from the checkpoint: only what came after the last committed batch
    again = [entry for _, rows in batches[before:] for entry in rows]
    assert again == [(i, b"m%d" % i) for i in range(50, 80)]
    ids: Any = [batch_id for batch_id, _ in batches]
    assert ids == sorted(set(ids))  # no batch read twice


def test_headers_and_priority_columns(
    spark: SparkSession, daemon: LmqdProcess, topic: str
) -> None:
    with Producer(daemon.tcp_address) as producer:
        producer.publish(topic, b"plain")
        producer.publish(topic, b"rich", headers={"trace": "t-1", "k": "v"}, priority=7)
        producer.publish(topic, b"high", priority=9)
        producer.publish(topic, b"tagged", headers={"only": "headers"}, ttl=60.0)
    reader = spark.read.format("lmq").option("httpAddress", http_address(daemon))
    with spark_guard(spark):
        rows = reader.option("topic", topic).load().orderBy("offset").collect()
    assert [(r.value, r.headers, r.priority) for r in rows] == [
        (b"plain", None, 0),
        (b"rich", {"trace": "t-1", "k": "v"}, 7),
        (b"high", None, 9),
        (b"tagged", {"only": "headers"}, 0),
    ]
