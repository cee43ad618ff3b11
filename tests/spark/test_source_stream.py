"""The ``lmq`` source's streams: restarts from the checkpoint, lost data (``failOnDataLoss``),
``Trigger.AvailableNow`` with read limits, and several topics (``subscribe``,
``subscribePattern`` picking up a topic created while the stream runs).

Rules for this module (see conftest.py): the package's one SparkSession; daemons are lmqd
subprocesses on 127.0.0.1, port 0 (the shared ``daemons``, or ``small_segments`` where
retention must delete); each test its own topics and checkpoint in ``tmp_path``; every query is
stopped in a ``finally`` and every wait (``spark_guard``, ``wait_for``) is bounded. Rows are
collected on the driver by ``foreachBatch``, with their batch id.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from lmq_client.http import HTTPClient
from tests.support.process import LmqdProcess

from .conftest import (
    JOB_TIMEOUT_S,
    drain_and_expire,
    http_address,
    publish,
    retain_little,
    spark_guard,
)

Row = tuple[str, int, bytes]
"""``(topic, offset, value)`` of a row read."""


class Collected:
    """What ``foreachBatch`` saw: the rows of each micro-batch, by batch id."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[Row]]] = []
        self._lock = threading.Lock()

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = [(r.topic, r.offset, r.value) for r in frame.collect()]
        with self._lock:
            self.batches.append((batch_id, sorted(rows)))

    def rows(self, since: int = 0) -> list[Row]:
        with self._lock:
            return sorted(row for _, rows in self.batches[since:] for row in rows)

    def sizes(self, since: int = 0) -> list[int]:
        with self._lock:
            return [len(rows) for _, rows in self.batches[since:]]


def stream(
    spark: SparkSession, checkpoint: Path, collect: Collected, *, available_now: bool = False,
    **options: str,
) -> StreamingQuery:  # fmt: skip
    source = spark.readStream.format("lmq")
    for key, value in options.items():
        source = source.option(key, value)
    writer = source.load().writeStream.foreachBatch(collect).option(
        "checkpointLocation", str(checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def run_available(spark: SparkSession, query: StreamingQuery) -> None:
    """Until an AvailableNow query stops by itself (bounded); its error, if any, raised."""
    try:
        with spark_guard(spark):
            assert query.awaitTermination(JOB_TIMEOUT_S), "AvailableNow never stopped"
    finally:
        query.stop()


def run_all(spark: SparkSession, query: StreamingQuery) -> None:
    """Until a running query has read everything available now, then stop it."""
    try:
        with spark_guard(spark):
            query.processAllAvailable()
    finally:
        query.stop()


def wait_for(condition: Callable[[], bool], what: str, seconds: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


@pytest.fixture
def collect() -> Iterator[Collected]:
    yield Collected()


def test_a_stream_restarted_from_its_checkpoint_reads_exactly_the_new_messages(
    spark: SparkSession, daemon: LmqdProcess, topic: str, tmp_path: Path, collect: Collected
) -> None:
    options = {"address": daemon.tcp_address, "topic": topic, "startingOffsets": "earliest"}
    publish(daemon, topic, [b"m%d" % i for i in range(50)])
    run_all(spark, stream(spark, tmp_path / "ck", collect, maxOffsetsPerTrigger="20", **options))
    assert collect.rows() == [(topic, i, b"m%d" % i) for i in range(50)]
    assert [n for n in collect.sizes() if n] == [20, 20, 10]
    publish(daemon, topic, [b"m%d" % i for i in range(50, 80)])
    before = len(collect.batches)
    run_all(spark, stream(spark, tmp_path / "ck", collect, **options))  # from the checkpoint
    assert collect.rows(before) == [(topic, i, b"m%d" % i) for i in range(50, 80)]
    ids = [batch_id for batch_id, _ in collect.batches]
    assert ids == sorted(set(ids))  # no batch read twice


def test_lost_messages_fail_the_query_or_are_reported(
    spark: SparkSession, small_segments: LmqdProcess, topic: str, tmp_path: Path,
    collect: Collected,
) -> None:  # fmt: skip
    # The scenario: a checkpointed query read 50 messages; retention then deleted
    # messages it had not read; on restart the query must not skip them silently.
    daemon = small_segments
    node = http_address(daemon)
    publish(daemon, topic, [b"m%d" % i for i in range(50)])
    retain_little(daemon, topic)
    options = {"address": daemon.tcp_address, "topic": topic, "startingOffsets": "earliest"}
    run_available(spark, stream(spark, tmp_path / "ck", collect, available_now=True, **options))
    assert collect.rows() == [(topic, i, b"m%d" % i) for i in range(50)]

    publish(daemon, topic, [b"m%d" % i for i in range(50, 550)])
    earliest = drain_and_expire(daemon, topic, 550)  # a channel read them all: retention acts
    assert 50 < earliest < 550
    publish(daemon, topic, [b"m%d" % i for i in range(550, 580)])
    before = len(collect.batches)

    # failOnDataLoss=true, the default: the query fails, its first line naming what was lost
    with pytest.raises(PySparkException) as info:
        run_available(spark, stream(spark, tmp_path / "ck", collect, available_now=True, **options))
    text = str(info.value)
    lost = earliest - 50
    line = (
        f"lmq_client.spark.errors.LmqDataLossError: lmq source: topic '{topic}' on {node}: "
        f"offsets 50..{earliest - 1} ({lost} messages) are no longer stored"
    )
    assert line in text.splitlines()[0], text
    assert "Traceback" not in text, text
    assert collect.rows(before) == []

    # failOnDataLoss=false: the loss is logged and counted under #lost, and the query goes on
    query = stream(spark, tmp_path / "ck", collect, available_now=True, failOnDataLoss="false",
                   **options)  # fmt: skip
    run_available(spark, query)
    assert collect.rows(before) == [(topic, i, b"m%d" % i) for i in range(earliest, 580)]
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    end = json.loads(progress[0]["sources"][0]["endOffset"])
    assert end == {topic: {node: 580}, "#lost": {topic: {node: lost}}}
    # The daemon counted it each time a query found it gone: the failed run and this one.
    stats = HTTPClient(node).stats(topic=topic)
    assert stats["topics"][0]["reader_lost_count"] == 2 * lost


def test_available_now_reads_the_backlog_in_limited_batches_and_stops(
    spark: SparkSession, daemon: LmqdProcess, topic: str, tmp_path: Path, collect: Collected
) -> None:
    publish(daemon, topic, [b"m%d" % i for i in range(100)])
    options = {"address": daemon.tcp_address, "topic": topic, "startingOffsets": "earliest",
               "maxOffsetsPerTrigger": "30"}  # fmt: skip
    query = stream(spark, tmp_path / "ck", collect, available_now=True, **options)
    run_available(spark, query)
    assert collect.sizes() == [30, 30, 30, 10]
    assert collect.rows() == [(topic, i, b"m%d" % i) for i in range(100)]
    assert not query.isActive
    # The next run reads exactly what came since, and stops again.
    publish(daemon, topic, [b"m%d" % i for i in range(100, 120)])
    run_available(spark, stream(spark, tmp_path / "ck", collect, available_now=True, **options))
    assert collect.sizes()[4:] == [20]
    assert collect.rows(4) == [(topic, i, b"m%d" % i) for i in range(100, 120)]


def test_available_now_does_not_read_what_comes_after_it_started(
    spark: SparkSession, daemon: LmqdProcess, topic: str, tmp_path: Path, collect: Collected
) -> None:
    publish(daemon, topic, [b"m%d" % i for i in range(40)])
    arrived: list[Any] = []

    def publish_during_first_batch(frame: DataFrame, batch_id: int) -> None:
        collect(frame, batch_id)
        if not arrived:
            publish(daemon, topic, [b"late%d" % i for i in range(10)])
            arrived.append(batch_id)

    query = (
        spark.readStream.format("lmq").option("address", daemon.tcp_address)
        .option("topic", topic).option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "15").load()
        .writeStream.foreachBatch(publish_during_first_batch)
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    )  # fmt: skip
    run_available(spark, query)
    assert collect.rows() == [(topic, i, b"m%d" % i) for i in range(40)]


def test_min_offsets_hold_a_batch_until_enough_wait_or_the_delay_passed(
    spark: SparkSession, daemon: LmqdProcess, topic: str, tmp_path: Path, collect: Collected
) -> None:
    delay_s = 8.0
    publish(daemon, topic, [b"m%d" % i for i in range(5)])
    query = (
        spark.readStream.format("lmq").option("address", daemon.tcp_address)
        .option("topic", topic).option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "10").option("maxTriggerDelay", f"{delay_s:g}s").load()
        .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds").start()
    )  # fmt: skip

    def read(count: int) -> Callable[[], bool]:
        def done() -> bool:
            error = query.exception()
            assert error is None, error
            return len(collect.rows()) >= count

        return done

    try:
        with spark_guard(spark):
            # The first batch has no batch before it to wait after: it reads what is there.
            wait_for(read(5), "the first 5 messages")
            publish(daemon, topic, [b"m%d" % i for i in range(5, 8)])
            time.sleep(1.5)  # a batch is planned every 0.2 s: 3 waiting are held back
            assert len(collect.rows()) == 5
            topped_up = time.monotonic()
            publish(daemon, topic, [b"m%d" % i for i in range(8, 15)])
            wait_for(read(15), "a batch once 10 were waiting")
            # 2 waiting stay below the minimum: they come when the delay has passed since the
            # last batch, which was planned after the messages that topped it up were published.
            publish(daemon, topic, [b"m%d" % i for i in range(15, 17)])
            wait_for(read(17), "the batch the delay lets through")
            assert time.monotonic() - topped_up >= delay_s
    finally:
        query.stop()
    assert [n for n in collect.sizes() if n] == [5, 10, 2]
    assert collect.rows() == [(topic, i, b"m%d" % i) for i in range(17)]


def test_subscribe_reads_two_topics_and_says_which(
    spark: SparkSession, daemons: list[LmqdProcess], topic: str, tmp_path: Path,
    collect: Collected,
) -> None:  # fmt: skip
    first, second = daemons
    left, right = f"{topic}-a", f"{topic}-b"
    publish(first, left, [b"a%d" % i for i in range(3)])
    publish(second, right, [b"b%d" % i for i in range(2)])
    run_available(spark, stream(
        spark, tmp_path / "ck", collect, available_now=True,
        address=f"{first.tcp_address},{second.tcp_address}", subscribe=f"{left},{right}",
        startingOffsets="earliest",
    ))  # fmt: skip
    assert collect.rows() == [
        *((left, i, b"a%d" % i) for i in range(3)), *((right, i, b"b%d" % i) for i in range(2)),
    ]


def test_a_pattern_picks_up_a_topic_created_while_the_stream_runs(
    spark: SparkSession, daemon: LmqdProcess, topic: str, tmp_path: Path, collect: Collected
) -> None:
    old, new, other = f"{topic}-old", f"{topic}-new", f"x{topic}-new"
    publish(daemon, old, [b"o0", b"o1"])
    query = stream(spark, tmp_path / "ck", collect, address=daemon.tcp_address,
                   subscribePattern=f"{topic}-.*", startingOffsets="earliest",
                   lookupdPollIntervalMs="200")  # fmt: skip
    try:
        with spark_guard(spark):
            wait_for(lambda: len(collect.rows()) == 2, "the first topic's rows")
            publish(daemon, new, [b"n0", b"n1", b"n2"])  # created now, matching the pattern
            publish(daemon, other, [b"not matching"])
            wait_for(lambda: len(collect.rows()) == 5, "the new topic's rows")
            publish(daemon, new, [b"n3"])
            wait_for(lambda: len(collect.rows()) == 6, "the new topic's next row")
            query.processAllAvailable()
    finally:
        query.stop()
    assert collect.rows() == [
        (new, 0, b"n0"), (new, 1, b"n1"), (new, 2, b"n2"), (new, 3, b"n3"),
        (old, 0, b"o0"), (old, 1, b"o1"),
    ]  # fmt: skip
