"""Benchmark the Spark sink beside NSQ's bench_writer, and an lmq -> Spark -> lmq pipeline.

    .venv/bin/python scripts/bench_spark.py [--rows 1000000] [--runs 3] [--partitions 2]
        [--size 16] [--rows-writer] [--batch-size 1000]
        [--nsq-bin DIR] [--writer-seconds 5] [--pipeline] [--per-trigger 200000]
        [--conf KEY=VALUE]

Starts its own lmqd (``python -m lmqd`` on 127.0.0.1, port 0, data in a temporary directory,
default flags) and a local SparkSession
(``local[2]``, no UI). Each run writes ``--rows`` rows of a ``--size``-byte string column
(``"event-<id>"`` padded) with ``df.write.format("lmq")`` to a fresh topic, and is timed from the
``save()`` call to its return, i.e. until every MPUB was answered ``OK``. Beside it:

* ``bench_writer``: NSQ's own publisher benchmark (``bench_writer`` from NSQ v1.3.0, in
  ``--nsq-bin``, default ``$LMQ_NSQ_BIN`` or ``.nsq/bin``: ``/work/shared/nsq/install`` puts it
  there) publishing ``--size``-byte messages in MPUBs of ``--batch-size`` to the same daemon for
  ``--writer-seconds``, one publisher per CPU as NSQ runs it: the ideal client, what the daemon
  takes from publishers that do nothing else;
* ``noop``: the same DataFrame written to Spark's ``noop`` sink: Spark's own cost of producing
  the rows, the floor under any sink;
* ``lmq-rows`` (with ``--rows-writer``): the same publisher fed row by row through the plain
  ``DataSourceWriter`` API (Spark converts each Arrow batch to ``Row`` objects first);
* ``pipeline`` (with ``--pipeline``): ``--rows`` retained messages read by the lmq source and
  written by the lmq sink to another topic of the same daemon, a stream with
  ``Trigger.AvailableNow``, ``maxOffsetsPerTrigger`` ``--per-trigger``, ``failOnDataLoss`` and
  dedup ids on (the defaults): exactly-once end to end; timed from ``start()`` until the query
  stops by itself, every message then in the output topic.

Each line gives the rate and the CPU time per row of the daemon and of the client (Spark's JVM
with its Python workers, or bench_writer; from ``/proc``), and of the client's, the Python
workers' (the rest is the JVM's), which says where the time goes on a machine whose cores they
share; the medians add how many cores daemon and client kept busy together. Prints one line
per run and the medians. The daemon holds the messages (no channel consumes them): past
``--mem-queue-size`` (10 000 by default) they go to its disk queue, as in production.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSourceWriter
from pyspark.sql.types import StructType

from lmq_client.spark import LmqDataSource, SinkOptions, local_session
from lmq_client.spark.publish import BatchingPublisher, LmqCommitMessage
from lmq_client.sync import Producer

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import own_cpu_seconds, start_lmqd, tree_cpu_seconds

ROOT = Path(__file__).resolve().parent.parent

log = logging.getLogger("bench_spark")


class RowsWriter(DataSourceWriter):
    """The row-by-row variant: the same batching publisher, fed from ``Row`` objects."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> LmqCommitMessage:
        options = self.options
        column = options.body_column
        assert column is not None
        with Producer(list(options.addresses), connect_timeout=options.timeout_s,
                      response_timeout=options.timeout_s) as producer:
            publisher = BatchingPublisher(producer, options.topic,
                                          batch_size=options.batch_size,
                                          batch_bytes=options.batch_bytes)
            # Rows gathered per MPUB, then handed over as one Arrow column (what the publisher
            # takes): the row-by-row cost is Spark's Row objects and this loop.
            bodies: list[bytes] = []
            for row in iterator:
                bodies.append(row[column].encode())
                if len(bodies) == options.batch_size:
                    publisher.add(pa.array(bodies, pa.binary()), None, 0)
                    bodies = []
            if bodies:
                publisher.add(pa.array(bodies, pa.binary()), None, 0)
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


BENCH_WRITER_RATE = re.compile(r"([0-9.]+)ops/s")


def bench_writer(binary: Path, address: str, args: argparse.Namespace) -> tuple[float, float]:
    """NSQ's bench_writer against ``address``: messages it published per second, and its
    own CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [str(binary), f"--nsqd-tcp-address={address}", f"--topic=bench-{uuid.uuid4().hex[:8]}",
         f"--size={args.size}", f"--batch-size={args.batch_size}",
         f"--runfor={args.writer_seconds}s"],
        capture_output=True, text=True, check=True, timeout=args.writer_seconds + 60,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = BENCH_WRITER_RATE.search(out.stdout + out.stderr)
    if found is None:
        raise SystemExit(f"bench_writer said nothing of its rate: {out.stdout}{out.stderr}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return float(found.group(1)), cpu


def pipeline(spark: SparkSession, address: str, checkpoint: str, args: argparse.Namespace,
             dedup_ids: bool) -> Callable[[], None]:  # fmt: skip
    """An AvailableNow stream moving ``--rows`` messages from one topic to another through
    Spark (lmq source -> lmq sink), ready to run (the input is published now)."""
    source, target = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    body = b"x" * args.size
    with Producer(address) as producer:
        for start in range(0, args.rows, 1000):
            producer.mpub(source, [body] * min(1000, args.rows - start))
    query = (
        spark.readStream.format("lmq").option("address", address).option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.per_trigger)).load().select("value")
        .writeStream.format("lmq").option("address", address).option("topic", target)
        .option("batchSize", str(args.batch_size)).option("dedupIds", str(dedup_ids).lower())
        .option("checkpointLocation", checkpoint).trigger(availableNow=True)
    )  # fmt: skip

    def run() -> None:
        running = query.start()
        running.awaitTermination()
        rows = sum(p["numInputRows"] for p in running.recentProgress)
        assert rows == args.rows, rows

    return run


class Run(NamedTuple):
    """One variant's run: rows (or messages) per second, and CPU microseconds per row of the
    daemon and of the client (Spark's JVM with its Python workers, or bench_writer), and of
    that, Spark's Python workers' (the data source's code and PySpark's reading of the Arrow
    batches the JVM sends them)."""

    rate: float
    daemon_us: float
    client_us: float
    python_us: float = 0.0


def spark_setting(text: str) -> tuple[str, str]:
    """``--conf KEY=VALUE``: one setting of the benchmark's SparkSession."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r}")
    return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--size", type=int, default=16, help="body bytes")
    parser.add_argument("--batch-size", type=int, default=1000, help="messages per MPUB")
    parser.add_argument("--rows-writer", action="store_true",
                        help="also time the row-by-row writer")
    parser.add_argument("--nsq-bin", type=Path,
                        default=Path(os.environ.get("LMQ_NSQ_BIN", ROOT / ".nsq" / "bin")))
    parser.add_argument("--writer-seconds", type=int, default=5)
    parser.add_argument("--pipeline", action="store_true",
                        help="also time an lmq -> Spark -> lmq stream (AvailableNow)")
    parser.add_argument("--per-trigger", type=int, default=200_000)
    parser.add_argument("--conf", type=spark_setting, action="append", default=[],
                        metavar="KEY=VALUE", help="a Spark setting for the session (repeatable)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    writer = args.nsq_bin / "bench_writer"
    if not writer.exists():
        raise SystemExit(f"no {writer}: extract NSQ's programs there (/work/shared/nsq/install "
                         f"{args.nsq_bin}) or name them with --nsq-bin or LMQ_NSQ_BIN")

    results: dict[str, list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        daemon = start_lmqd(Path(tmp) / "lmqd")
        address = daemon.tcp_address
        try:
            spark = local_session("lmq-bench", install_java=True, log_level="ERROR",
                                  conf=dict(args.conf))
            spark.dataSource.register(LmqRowsDataSource)
            gateway: Any = spark.sparkContext._jvm
            jvm = int(gateway.java.lang.ProcessHandle.current().pid())
            df = frame(spark, args.rows, args.partitions, args.size)

            def lmq(fmt: str, data: DataFrame) -> Callable[[], None]:
                def save() -> None:
                    (data.write.format(fmt).mode("append").option("address", address)
                     .option("topic", f"bench-{uuid.uuid4().hex[:8]}")
                     .option("bodyColumn", "body").option("batchSize", str(args.batch_size))
                     .save())
                return save

            def measured(name: str, run: int, action: Callable[[], None]) -> None:
                daemon_cpu, spark_cpu = daemon.cpu_seconds(), tree_cpu_seconds(jvm)
                jvm_cpu = own_cpu_seconds(jvm)
                seconds = timed(action)
                daemon_cpu = daemon.cpu_seconds() - daemon_cpu
                spark_cpu = tree_cpu_seconds(jvm) - spark_cpu
                python_cpu = spark_cpu - (own_cpu_seconds(jvm) - jvm_cpu)
                per_row = [cpu / args.rows * 1e6 for cpu in (daemon_cpu, spark_cpu, python_cpu)]
                record(name, run, Run(args.rows / seconds, *per_row))

            def record(name: str, run: int, result: Run) -> None:
                results.setdefault(name, []).append(result)
                log.info("run %d %-16s %9.0f rows/s, CPU per row: daemon %.2f us, client %.2f "
                         "us (Python %.2f us)", run, name, *result)  # fmt: skip

            variants: dict[str, Callable[[], None]] = {
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
            for run in range(1, args.runs + 1):
                for name, save in variants.items():
                    measured(name, run, save)
                daemon_cpu = daemon.cpu_seconds()
                rate, writer_cpu = bench_writer(writer, address, args)
                sent = rate * args.writer_seconds
                record("bench_writer", run, Run(rate, (daemon.cpu_seconds() - daemon_cpu) / sent
                                                * 1e6, writer_cpu / sent * 1e6))  # fmt: skip
                if args.pipeline:
                    for dedup_ids in (True, False):
                        name = "pipeline" if dedup_ids else "pipeline-no-dedup"
                        measured(name, run, pipeline(spark, address, f"{tmp}/ck-{name}-{run}",
                                                     args, dedup_ids))  # fmt: skip
            spark.stop()
        finally:
            daemon.terminate(60)
    print(f"{args.rows} rows of {args.size} bytes, {args.partitions} partitions, "
          f"batchSize {args.batch_size}, {args.runs} runs, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}; medians:")
    ideal = statistics.median(r.rate for r in results["bench_writer"])
    for name, runs in results.items():
        rate = statistics.median(r.rate for r in runs)
        print(f"{name:>17}: {rate:9.0f} rows/s ({rate / ideal:5.0%} of bench_writer), CPU per "
              f"row: daemon {statistics.median(r.daemon_us for r in runs):.2f} us, client "
              f"{statistics.median(r.client_us for r in runs):.2f} us (Python "
              f"{statistics.median(r.python_us for r in runs):.2f} us), cores busy "
              f"{statistics.median(r.rate * (r.daemon_us + r.client_us) / 1e6 for r in runs):.2f} "
              f"(runs: {', '.join(f'{r.rate:.0f}' for r in runs)})")


if __name__ == "__main__":
    main()
