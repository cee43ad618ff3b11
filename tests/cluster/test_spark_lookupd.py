"""``lookupdHttpAddress`` in Spark: sink tasks spread over the nodes a lookupd lists, and the
source reads the nodes it lists for the topic, as they come and go.

Rules for this module: ``write_partition`` and the source's reader are called as Spark calls
them (real Arrow record batches, offsets as Spark keeps them), without a JVM, against one
``lmqlookupd`` and two ``lmqd`` subprocesses that register with it (127.0.0.1, port 0, data in
``tmp_path``); one test runs a real stream on the Spark package's session-wide local
SparkSession (``tests/spark/conftest.py``, every job bounded by ``spark_guard``). Option parsing
needs no daemon. Waits poll the lookupd with a bound.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable

from lmq_client.errors import ConnectionFailed
from lmq_client.http import HTTPClient
from lmq_client.lookupd import LookupdNode, lookup_http_producers
from lmq_client.spark import LmqSinkError, LmqStreamReader, SinkOptions, SourceOptions
from lmq_client.spark.publish import daemon_addresses, write_partition
from lmq_client.spark.source import LmqPartition
from lmq_client.sync import Producer
from tests.spark.conftest import spark, spark_guard

from . import procs
from .procs import Daemon, eventually, http

__all__ = ["spark"]  # the Spark package's session fixture, used here too

pytestmark = pytest.mark.interop

WITHIN_S = 20.0


def batches(rows: list[str]) -> list[Any]:
    return [pa.RecordBatch.from_pydict({"value": rows})]


def test_lookupd_option_parses_alone_or_beside_addresses() -> None:
    alone = SinkOptions.parse({"lookupdHttpAddress": "127.0.0.1:4161, http://l2:4161/", "topic":
                               "t"})  # fmt: skip
    assert alone.addresses == ()
    assert alone.lookupd_addresses == ("127.0.0.1:4161", "http://l2:4161/")
    both = SinkOptions.parse({"address": "h:4150", "LOOKUPDHTTPADDRESS": "l:4161", "topic": "t"})
    assert (both.addresses, both.lookupd_addresses) == (("h:4150",), ("l:4161",))
    with pytest.raises(ValueError, match="option 'lookupdHttpAddress': invalid lookupd address"):
        SinkOptions.parse({"lookupdHttpAddress": "ftp://l:1", "topic": "t"})
    with pytest.raises(ValueError, match=r"'address' is required \(or give 'lookupdHttpAddress'"):
        SinkOptions.parse({"topic": "t"})


def test_addresses_are_the_given_ones_then_the_nodes_without_the_topic_tombstoned() -> None:
    nodes = {
        "l1": [LookupdNode("10.0.0.2", 4150, 4151, topics=("t",), tombstoned=frozenset({"t"})),
               LookupdNode("10.0.0.1", 4150, 4151, topics=("t", "u"))],
        "l2": [LookupdNode("10.0.0.3", 4150, 4151), LookupdNode("10.0.0.1", 4150, 4151)],
    }  # fmt: skip

    def lookup(lookupd: str, timeout: float) -> list[LookupdNode]:
        if lookupd == "l3:1":
            raise ConnectionFailed(lookupd, "HTTP API unreachable (refused)")
        return nodes[lookupd.partition(":")[0]]

    options = SinkOptions(addresses=("h:1",), lookupd_addresses=("l1:1", "l2:1", "l3:1"),
                          topic="t")  # fmt: skip
    assert daemon_addresses(options, lookup) == ["h:1", "10.0.0.1:4150", "10.0.0.3:4150"]
    nobody = SinkOptions(lookupd_addresses=("l3:1",), topic="t")
    with pytest.raises(LmqSinkError, match="no daemon to publish to from lookupds l3:1"):
        daemon_addresses(nobody, lookup)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Daemon, list[Daemon]]]:
    lookupd = procs.lookupd()
    nodes: list[Daemon] = []
    try:
        for i in range(2):
            nodes.append(procs.lmqd(tmp_path / f"n{i}", f"--lookupd-tcp-address={lookupd.tcp}"))
        yield lookupd, nodes
    finally:
        for node in nodes:
            node.check_stop()
        lookupd.check_stop()


def message_count(node: Daemon, topic: str) -> int:
    topics = HTTPClient(node.http).stats(topic)["topics"] or []
    return int(topics[0]["message_count"]) if topics else 0


def test_partitions_spread_over_the_lookupds_nodes(cluster: tuple[Daemon, list[Daemon]]) -> None:
    lookupd, nodes = cluster
    eventually(lambda: len(http(lookupd.http, "GET", "/nodes")[1]["producers"]),
               lambda n: n == 2, WITHIN_S)  # fmt: skip
    options = SinkOptions.parse({"lookupdHttpAddress": lookupd.http, "topic": "spread",
                                 "bodyColumn": "value"})  # fmt: skip
    used = [
        write_partition(options, batches([f"p{p}-{i}" for i in range(10)]), partition_id=p).address
        for p in range(4)
    ]
    ordered = sorted(n.tcp for n in nodes)
    assert used == [ordered[0], ordered[1], ordered[0], ordered[1]]
    assert [message_count(n, "spread") for n in nodes] == [20, 20]

    # nsqadmin's tombstone: the topic is being deleted on one node, so tasks avoid it
    tombstoned = nodes[0]
    status, _ = http(lookupd.http, "POST",
                     f"/topic/tombstone?topic=spread&node=127.0.0.1:{tombstoned.http_port}")
    assert status == 200
    for p in range(2):
        message = write_partition(options, batches(["late"]), partition_id=p)
        assert message.address == nodes[1].tcp
    assert [message_count(n, "spread") for n in nodes] == [20, 22]


# -- the source ------------------------------------------------------------------------------


def publish(node: Daemon, topic: str, bodies: list[bytes]) -> None:
    with Producer(node.tcp) as producer:
        producer.mpub(topic, bodies)


def wait_listed(lookupd: Daemon, topic: str, nodes: list[Daemon]) -> None:
    """Until the lookupd lists exactly ``nodes`` for ``topic`` (registration is asynchronous)."""
    wanted = sorted(n.http for n in nodes)
    eventually(lambda: sorted(lookup_http_producers(lookupd.http, topic)),
               lambda found: found == wanted, WITHIN_S)  # fmt: skip


def test_the_source_reader_follows_the_nodes_the_lookupd_lists(
    cluster: tuple[Daemon, list[Daemon]],
) -> None:
    lookupd, (first, second) = cluster
    assert lookup_http_producers(lookupd.http, "follow") == []  # 404 TOPIC_NOT_FOUND: none
    publish(first, "follow", [b"a0", b"a1", b"a2"])
    wait_listed(lookupd, "follow", [first])
    reader = LmqStreamReader(SourceOptions.parse({
        "lookupdHttpAddress": lookupd.http, "topic": "follow", "partitionSize": "2",
        "lookupdPollIntervalMs": "0",  # ask on every call (the default: every 10 s)
    }))  # fmt: skip
    start = reader.initialOffset()
    assert start == {"follow": {first.http: 3}}  # latest, on the one node that has the topic
    publish(first, "follow", [b"a3"])
    publish(second, "follow", [b"b0", b"b1", b"b2"])
    wait_listed(lookupd, "follow", [first, second])
    joined = reader.latestOffset(start, ReadAllAvailable())
    # the new node joins at its earliest offset (nothing published there is skipped), and is
    # read from the next batch on: its start is then in the checkpoint
    assert joined == {"follow": {first.http: 4, second.http: 0}}
    assert ranges(reader, start, joined) == [(first.http, 3, 4)]
    end = reader.latestOffset(joined, ReadAllAvailable())
    assert end == {"follow": {first.http: 4, second.http: 3}}
    assert ranges(reader, joined, end) == [(second.http, 0, 2), (second.http, 2, 3)]
    # a node that is gone keeps its offset; it is not dropped from the source's offsets
    gone = f"127.0.0.1:{closed_port()}"
    later = reader.latestOffset({"follow": {**end["follow"], gone: 7}}, ReadAllAvailable())
    assert later == {"follow": {first.http: 4, second.http: 3, gone: 7}}


def ranges(reader: LmqStreamReader, start: dict[str, Any], end: dict[str, Any]
           ) -> list[tuple[str, int, int]]:  # fmt: skip
    parts = reader.partitions(start, end)
    return sorted((p.node, p.start, p.end) for p in parts if isinstance(p, LmqPartition))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_stream_through_lookupd_reads_both_nodes_exactly_once_across_a_restart(
    spark: SparkSession, cluster: tuple[Daemon, list[Daemon]], tmp_path: Path
) -> None:
    lookupd, (first, second) = cluster
    topic = "through-lookupd"
    seen: list[tuple[str, int, bytes]] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        seen.extend((r.node, r.offset, r.value) for r in frame.collect())

    def run() -> None:
        query = (
            spark.readStream.format("lmq").option("lookupdHttpAddress", lookupd.http)
            .option("topic", topic).option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "4").load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint")).start()
        )  # fmt: skip
        try:
            with spark_guard(spark):
                query.processAllAvailable()
        finally:
            query.stop()

    def published(node: Daemon, tag: bytes, offsets: range) -> list[tuple[str, int, bytes]]:
        publish(node, topic, [tag + b"%d" % i for i in offsets])
        return [(node.http, i, tag + b"%d" % i) for i in offsets]

    def new_rows(before: int) -> list[tuple[str, int, bytes]]:
        return sorted(seen[before:])

    # at first only one node has the topic
    expected = published(first, b"a", range(5))
    wait_listed(lookupd, topic, [first])
    run()
    assert new_rows(0) == sorted(expected)

    # the second node gets the topic while the query is stopped: it is new to the checkpoint,
    # read from its first message; the first node continues after its committed offset
    expected = published(first, b"a", range(5, 7)) + published(second, b"b", range(3))
    wait_listed(lookupd, topic, [first, second])
    before = len(seen)
    run()
    assert new_rows(before) == sorted(expected)

    # and once more: both nodes now continue from the checkpoint, nothing read twice
    expected = published(first, b"a", range(7, 9)) + published(second, b"b", range(3, 6))
    before = len(seen)
    run()
    assert new_rows(before) == sorted(expected)
