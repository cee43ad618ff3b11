"""A streaming query into lmq, run as its own process so that a test can kill its driver.

``python -m tests.spark.stream_job --input DIR --checkpoint DIR --address A --topic T [...]``
reads the text files of ``--input`` (two per micro-batch, so each batch has two partitions;
Spark's file source is replayable: a batch re-run after a restart reads the same files), or
with ``--source-topic S`` the lmq topic ``S`` on the same ``--address`` (the lmq source, from
its earliest offset, ``--per-trigger`` messages per micro-batch in two partitions: lmq → Spark
→ lmq), and writes every line or message as a message through ``lmq-faulty``: the real sink
(``LmqDataSource``'s stream writer, unchanged) with two test-only faults around it, chosen by the
command line:

* ``--fail-once MARKER --fail-after N``: partition 0's task raises once, after its first ``N``
  rows were published (MPUBs of 10 rows, answered OK) and before the rest: a task failure that
  Spark retries (``--master local[2,2]``), the retry publishing the partition from its start;
* ``--hang-batch B --hang-signal FILE``: partition 0's task of micro-batch ``B``, having
  published all its rows, writes its pid to ``FILE`` and waits instead of returning, so the
  batch is never committed: the test then kills the driver (``kill -9`` of its process group)
  and starts this job again on the same checkpoint, which re-runs batch ``B``.

Both faults happen once (the marker or signal file exists afterwards). The query runs with
``availableNow`` and ends when the input is consumed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql.types import StructType

from lmq_client.spark import local_session
from lmq_client.spark.datasource import LmqDataSource
from lmq_client.spark.options import SinkOptions
from lmq_client.spark.publish import LmqCommitMessage
from lmq_client.spark.sink import BATCH_ID_PROPERTY, LmqStreamWriter

SLICE_ROWS = 10
"""Rows per record batch handed to the sink, and its ``batchSize``: one MPUB per slice, so a
fault after ``N`` rows (a multiple of 10) comes after exactly ``N`` rows were answered OK."""

HANG_LIMIT_S = 120.0
"""How long a hanging task waits at most (the test kills it long before; a bound all the same,
should the test die first)."""


class FaultyStreamWriter(LmqStreamWriter):
    """The sink's stream writer with the faults the module docstring describes."""

    def __init__(self, options: SinkOptions, faults: dict[str, str]) -> None:
        super().__init__(options)
        self.faults = faults

    def write(self, iterator: Iterator[Any]) -> LmqCommitMessage:
        context = TaskContext.get()
        assert context is not None
        first_partition = context.partitionId() == 0
        marker = self.faults.get("failoncemarker")
        if marker and first_partition:
            iterator = _failing_once(iterator, Path(marker), int(self.faults["failafter"]))
        else:
            iterator = _sliced(iterator)
        message = super().write(iterator)
        signal = self.faults.get("hangsignal")
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        if (
            signal and first_partition and batch == self.faults["hangbatch"]
            and not os.path.exists(signal)
        ):  # fmt: skip
            Path(signal).write_text(str(os.getpid()))
            parent = os.getppid()
            deadline = time.monotonic() + HANG_LIMIT_S
            while time.monotonic() < deadline and os.getppid() == parent:
                time.sleep(0.1)
            raise RuntimeError("test: the driver was to be killed while this task waited")
        return message


def _sliced(iterator: Iterator[Any]) -> Iterator[Any]:
    for batch in iterator:
        for start in range(0, batch.num_rows, SLICE_ROWS):
            yield batch.slice(start, SLICE_ROWS)


def _failing_once(iterator: Iterator[Any], marker: Path, after: int) -> Iterator[Any]:
    rows = 0
    for piece in _sliced(iterator):
        if rows >= after and not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError(f"test: task fails once after {rows} rows")
        rows += piece.num_rows
        yield piece


class FaultyLmqDataSource(LmqDataSource):
    """``lmq-faulty``: ``lmq`` whose stream writer is ``FaultyStreamWriter``; the faults' own
    options (``failOnceMarker``, ``failAfter``, ``hangBatch``, ``hangSignal``) are taken out
    before the sink checks the rest."""

    @classmethod
    def name(cls) -> str:
        return "lmq-faulty"

    def streamWriter(self, schema: StructType, overwrite: bool) -> LmqStreamWriter:
        names = ("failoncemarker", "failafter", "hangbatch", "hangsignal")
        faults = {k.lower(): v for k, v in self.options.items() if k.lower() in names}
        for key in [k for k in self.options if k.lower() in names]:
            del self.options[key]
        writer = super().streamWriter(schema, overwrite)
        return FaultyStreamWriter(writer.options, faults)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input")
    parser.add_argument("--source-topic")
    parser.add_argument("--per-trigger", default="50")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--dedup-ids", default="true")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--fail-once")
    parser.add_argument("--fail-after", default="20")
    parser.add_argument("--hang-batch")
    parser.add_argument("--hang-signal")
    args = parser.parse_args(argv)
    spark = local_session("lmq-stream-job", master=args.master, log_level="ERROR")
    spark.dataSource.register(FaultyLmqDataSource)
    if args.source_topic:
        per_trigger = int(args.per_trigger)
        rows = (
            spark.readStream.format("lmq").option("address", args.address)
            .option("topic", args.source_topic).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(per_trigger))
            .option("partitionSize", str(max(1, per_trigger // 2))).load().select("value")
        )  # fmt: skip
    else:
        rows = spark.readStream.format("text").option("maxFilesPerTrigger", "2").load(args.input)
    writer = (
        rows.writeStream.format("lmq-faulty")
        .option("address", args.address)
        .option("topic", args.topic)
        .option("batchSize", str(SLICE_ROWS))
        .option("retryTimeoutMs", "0")
        .option("dedupIds", args.dedup_ids)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
    )  # fmt: skip
    if args.fail_once:
        writer = writer.option("failOnceMarker", args.fail_once)
        writer = writer.option("failAfter", args.fail_after)
    if args.hang_signal:
        writer = writer.option("hangBatch", args.hang_batch)
        writer = writer.option("hangSignal", args.hang_signal)
    query = writer.start()
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
