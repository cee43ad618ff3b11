"""Benchmark the Spark sink: rows/s from a local Spark job into one lmqd, median of several runs.

    .venv/bin/python scripts/bench_spark.py [--rows 1000000] [--runs 3] [--partitions 2]
        [--size 16] [--address HOST:PORT] [--rows-writer] [--batch-size 1000]

Starts its own lmqd (``python -m lmqd`` on 127.0.0.1, port 0, data in a temporary directory,
default flags) unless ``--address`` names a running one, and a local SparkSession
(``local[2]``, no UI). Each run writes ``--rows`` rows of a ``--size``-byte string column
(``"event-<id>"`` padded) with ``df.write.format("lmq")`` to a fresh topic, and is timed from the
``save()`` call to its return, i.e. until every MPUB was answered ``OK``. For comparison it also
times:

* ``noop``: the same DataFrame written to Spark's ``noop`` sink: Spark's own cost of producing
  the rows, the floor under any sink;
* ``lmq-rows`` (with ``--rows-writer``): the same publisher fed row by row through the plain
  ``DataSourceWriter`` API (Spark converts each Arrow batch to ``Row`` objects first), to show
  what the Arrow path saves.

Prints one line per run and the medians. The daemon holds the messages (no channel consumes
them): past ``--mem-queue-size`` (10 000 by default) they go to its disk queue, as in production.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSourceWriter
from pyspark.sql.types import StructType

from lmq_client.spark import LmqDataSource, SinkOptions, local_session
from lmq_client.spark.publish import BatchingPublisher, LmqCommitMessage
from lmq_client.sync import Producer

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import LmqdProcess, start_lmqd

log = logging.getLogger("bench_spark")


class RowsWriter(DataSourceWriter):
    """The row-by-row variant: the same batching publisher, fed from ``Row`` objects."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> LmqCommitMessage:
        options = self.options
        column = options.body_column
        assert column is not None
        with Producer(list(options.addresses), timeout=options.timeout_s) as producer:
            publisher = BatchingPublisher(producer, options.topic,
                                          batch_size=options.batch_size,
                                          batch_bytes=options.batch_bytes)
            for row in iterator:
                publisher.add([row[column].encode()], None, 0)
            publisher.flush()
            address = producer.address or ""
        return LmqCommitMessage(partition_id=0, attempt=0, address=address,
                                rows=publisher.published, mpubs=publisher.mpubs, dpubs=0)


class LmqRowsDataSource(LmqDataSource):
    """``format("lmq_rows")``: ``LmqDataSource`` with the row-by-row writer."""

    @classmethod
    def name(cls) -> str:
        return "lmq_rows"

    def writer(self, schema: StructType, overwrite: bool) -> RowsWriter:  # type: ignore[override]
        return RowsWriter(SinkOptions.parse(self.options).resolve_columns(schema))


def frame(spark: SparkSession, rows: int, partitions: int, size: int) -> DataFrame:
    body = F.rpad(F.concat(F.lit("event-"), F.col("id").cast("string")), size, "x")
    return spark.range(0, rows, numPartitions=partitions).select(body.alias("body"))


def timed(save: Any) -> float:
    started = time.perf_counter()
    save()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--size", type=int, default=16, help="body bytes")
    parser.add_argument("--batch-size", type=int, default=1000, help="messages per MPUB")
    parser.add_argument("--address", help="a running daemon (default: start one)")
    parser.add_argument("--rows-writer", action="store_true",
                        help="also time the row-by-row writer")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        daemon: LmqdProcess | None = None
        address = args.address
        if address is None:
            daemon = start_lmqd(Path(tmp) / "lmqd", http=False)
            address = daemon.tcp_address
        try:
            spark = local_session("lmq-bench", install_java=True, log_level="ERROR")
            spark.dataSource.register(LmqRowsDataSource)
            df = frame(spark, args.rows, args.partitions, args.size)
            def lmq(fmt: str, data: DataFrame) -> Any:
                def save() -> None:
                    (data.write.format(fmt).mode("append").option("address", address)
                     .option("topic", f"bench-{uuid.uuid4().hex[:8]}")
                     .option("bodyColumn", "body").option("batchSize", str(args.batch_size))
                     .save())
                return save

            variants: dict[str, Any] = {
                "noop": lambda: df.write.format("noop").mode("overwrite").save(),
                "lmq": lmq("lmq", df),
            }
            if args.rows_writer:
                variants["lmq-rows"] = lmq("lmq_rows", df)
            # Warm-up, not timed: the JVM's code paths, and the Python workers (started, with
            # pyspark, pyarrow and lmq_client imported, on the first Python job; ~6 s).
            small = frame(spark, 10_000, args.partitions, args.size)
            for fmt in ("lmq", "lmq_rows"):
                lmq(fmt, small)()
            df.write.format("noop").mode("overwrite").save()
            results: dict[str, list[float]] = {name: [] for name in variants}
            for run in range(1, args.runs + 1):
                for name, save in variants.items():
                    seconds = timed(save)
                    results[name].append(seconds)
                    log.info("run %d %-9s %7.2f s  %9.0f rows/s", run, name, seconds,
                             args.rows / seconds)
            spark.stop()
        finally:
            if daemon is not None:
                daemon.terminate(60)
    cpus = os.cpu_count()
    print(f"{args.rows} rows of {args.size} bytes, {args.partitions} partitions, "
          f"batchSize {args.batch_size}, {args.runs} runs, {cpus} CPUs")
    for name, times in results.items():
        median = statistics.median(times)
        print(f"{name:>9}: median {median:6.2f} s = {args.rows / median:9.0f} rows/s "
              f"(runs: {', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
