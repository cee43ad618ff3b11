"""Benchmark the Spark source: rows/s reading a retained topic, beside the ideal reader.

    .venv/bin/python scripts/bench_spark_source.py [--messages 1000000] [--size 100] [--runs 3]
        [--partition-size 100000] [--readers 2] [--per-trigger 250000] [--conf KEY=VALUE]

Starts its own lmqd (``python -m lmqd`` on 127.0.0.1, port 0, HTTP on, data in a temporary
directory, ``--retention-ms`` of an hour so the topic keeps every message on disk), publishes
``--messages`` bodies of ``--size`` bytes in MPUBs of 1000, and starts a local SparkSession
(``local[2]``, no UI). Each run times, one after the other:

* ``batch``: ``spark.read.format("lmq")`` of the whole topic (``address``: the daemon's TCP
  address, as the sink takes it; ``failOnDataLoss`` on, the default) written to Spark's ``noop``
  sink (every row is produced, nothing is stored), from the call to its return;
* ``stream``: the same as a stream with ``Trigger.AvailableNow`` and ``maxOffsetsPerTrigger``
  (``--per-trigger``), into the streaming ``noop`` sink with a fresh checkpoint, from ``start()``
  until the query stops by itself;
* ``ideal``: the reader without Spark: ``--readers`` processes (as many as Spark's ``local[2]``
  tasks) each reading its share of the offsets with ``GET /topic/read`` (10,000 messages a
  request, ``lmq_client.http.HTTPClient.read``, which splits the frames into messages), started
  together and timed until the last is done. What a reader by offset gets from the daemon at
  best on this machine: the bar the Spark source is measured against.

Each line gives the rate and the CPU time per row of the daemon and of the client (Spark's JVM
with its Python workers, or the ideal readers; from ``/proc``): where the time goes on a machine
whose cores they share. Prints one line per run and the medians.

A stream's time is also split by Spark's own progress reports (``durationMs`` of each
micro-batch): ``read`` (``addBatch``: the tasks reading the batch's ranges into the sink; its
rate is the source's reading beside the ideal reader's), ``checkpoint`` (``walCommit`` and
``commitOffsets``: Spark writing the batch to the checkpoint's offset and commit logs),
``plan`` (``latestOffset``, ``getBatch``, ``queryPlanning``: the source's planning on the driver
and Spark's) and ``start/stop`` (the rest of the wall time: the query's start, with the Python
process Spark starts for the source's driver side, and its end).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from lmq_client.http import HTTPClient
from lmq_client.spark import local_session
from lmq_client.sync import Producer

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_spark import spark_setting  # scripts/, beside this one

from tests.support.process import start_lmqd, stop_lmqd, tree_cpu_seconds

TOPIC = "source-bench"
MPUB = 1000
READ_COUNT = 10_000


def publish(tcp: str, messages: int, size: int) -> None:
    body = b"x" * size
    with Producer(tcp) as producer:
        for start in range(0, messages, MPUB):
            producer.mpub(TOPIC, [body] * min(MPUB, messages - start))


def read_range(http: str, start: int, end: int) -> tuple[int, float]:
    """Messages of ``[start, end)`` read by offset (one reader process), and its CPU seconds."""
    cpu = time.process_time()
    client = HTTPClient(http, timeout=30)
    position, got = start, 0
    while position < end:
        batch, position = client.read(TOPIC, position, min(READ_COUNT, end - position))
        got += len(batch)
    return got, time.process_time() - cpu


def read_ideal(pool: ProcessPoolExecutor, http: str, messages: int, readers: int
               ) -> tuple[float, float]:  # fmt: skip
    """Seconds ``readers`` processes take to read every message by offset together, and the
    CPU seconds they used."""
    share = -(-messages // readers)
    started = time.perf_counter()
    futures = [
        pool.submit(read_range, http, start, min(start + share, messages))
        for start in range(0, messages, share)
    ]
    answers = [f.result() for f in futures]
    seconds = time.perf_counter() - started
    assert sum(n for n, _ in answers) == messages, answers
    return seconds, sum(cpu for _, cpu in answers)


PHASES = {
    "read": ("addBatch",),
    "checkpoint": ("walCommit", "commitOffsets"),
    "plan": ("latestOffset", "getBatch", "queryPlanning"),
}
"""A stream's phases, each the sum of these ``durationMs`` keys over its micro-batches."""


def phases(progress: list[dict[str, Any]], seconds: float) -> dict[str, float]:
    """Seconds of each of ``PHASES`` in a stream's ``recentProgress``, and ``start/stop``: the
    wall time ``seconds`` outside its micro-batches (``triggerExecution``)."""
    spent = {
        name: sum(p["durationMs"].get(key, 0) for p in progress for key in keys) / 1000
        for name, keys in PHASES.items()
    }
    triggers = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    spent["start/stop"] = seconds - triggers
    return spent


class Run(NamedTuple):
    """One variant's run: rows per second, and CPU microseconds per row of the daemon and of
    the client (Spark's JVM with its Python workers, or the ideal readers)."""

    rate: float
    daemon_us: float
    client_us: float


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partition-size", type=int, default=100_000)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--per-trigger", type=int, default=250_000)
    parser.add_argument("--conf", type=spark_setting, action="append", default=[],
                        metavar="KEY=VALUE", help="a Spark setting for the session (repeatable)")
    args = parser.parse_args()
    results: dict[str, list[Run]] = {}
    stream_phases: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="lmq-spark-source-") as data:
        daemon = start_lmqd(Path(data) / "lmqd", ["--retention-ms=3600000"])
        try:
            assert daemon.http_address is not None
            started = time.perf_counter()
            publish(daemon.tcp_address, args.messages, args.size)
            print(f"published {args.messages:,} x {args.size} B in "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
            spark = local_session("bench-spark-source", log_level="ERROR", conf=dict(args.conf))

            def batch() -> float:
                frame = (
                    spark.read.format("lmq").option("address", daemon.tcp_address)
                    .option("topic", TOPIC).option("partitionSize", str(args.partition_size))
                    .load()
                )  # fmt: skip
                t0 = time.perf_counter()
                frame.write.format("noop").mode("overwrite").save()
                return time.perf_counter() - t0

            def stream(run: int) -> float:
                query = (
                    spark.readStream.format("lmq").option("address", daemon.tcp_address)
                    .option("topic", TOPIC).option("startingOffsets", "earliest")
                    .option("maxOffsetsPerTrigger", str(args.per_trigger))
                    .option("partitionSize", str(args.partition_size)).load()
                    .writeStream.format("noop").trigger(availableNow=True)
                    .option("checkpointLocation", f"{data}/checkpoint-{run}")
                )  # fmt: skip
                t0 = time.perf_counter()
                running = query.start()
                running.awaitTermination()
                seconds = time.perf_counter() - t0
                rows = sum(p["numInputRows"] for p in running.recentProgress)
                assert rows == args.messages, rows
                spent = phases(running.recentProgress, seconds)
                stream_phases.append(spent)
                print(f"run {run} stream phases: "
                      + ", ".join(f"{name} {value:.2f} s" for name, value in spent.items())
                      + f"; read {args.messages / spent['read']:,.0f} rows/s", flush=True)
                return seconds

            batch()  # warm-up, not timed: the JVM's code paths and the Python workers
            gateway: Any = spark.sparkContext._jvm
            jvm = int(gateway.java.lang.ProcessHandle.current().pid())
            rows = args.messages

            def record(name: str, run: int, seconds: float, daemon_cpu: float, client_cpu: float
                       ) -> None:  # fmt: skip
                result = Run(rows / seconds, daemon_cpu / rows * 1e6, client_cpu / rows * 1e6)
                results.setdefault(name, []).append(result)
                print(f"run {run} {name:>6}: {result.rate:9,.0f} rows/s, CPU per row: daemon "
                      f"{result.daemon_us:.2f} us, client {result.client_us:.2f} us", flush=True)

            with ProcessPoolExecutor(args.readers) as pool:
                read_ideal(pool, daemon.http_address, min(rows, 100_000), args.readers)
                for run in range(1, args.runs + 1):
                    for name in ("batch", "stream"):
                        daemon_cpu, spark_cpu = daemon.cpu_seconds(), tree_cpu_seconds(jvm)
                        seconds = batch() if name == "batch" else stream(run)
                        record(name, run, seconds, daemon.cpu_seconds() - daemon_cpu,
                               tree_cpu_seconds(jvm) - spark_cpu)  # fmt: skip
                    daemon_cpu = daemon.cpu_seconds()
                    seconds, readers_cpu = read_ideal(pool, daemon.http_address, rows,
                                                      args.readers)  # fmt: skip
                    record("ideal", run, seconds, daemon.cpu_seconds() - daemon_cpu, readers_cpu)
            spark.stop()
        finally:
            stop_lmqd(daemon)
    print(f"{args.messages:,} messages of {args.size} B, partitionSize {args.partition_size}, "
          f"{args.readers} ideal readers, {args.runs} runs, load {os.getloadavg()[0]:.1f}; "
          "medians:")
    ideal = statistics.median(r.rate for r in results["ideal"])
    for name, runs in results.items():
        rate = statistics.median(r.rate for r in runs)
        print(f"{name:>7}: {rate:9,.0f} rows/s ({rate / ideal:4.0%} of ideal), CPU per row: "
              f"daemon {statistics.median(r.daemon_us for r in runs):.2f} us, client "
              f"{statistics.median(r.client_us for r in runs):.2f} us "
              f"(runs: {', '.join(f'{r.rate:,.0f}' for r in runs)})")
    if stream_phases:
        median = {name: statistics.median(p[name] for p in stream_phases) for name in PHASES}
        median["start/stop"] = statistics.median(p["start/stop"] for p in stream_phases)
        read = args.messages / median["read"]
        print(" stream's phases (medians): "
              + ", ".join(f"{name} {value:.2f} s" for name, value in median.items())
              + f"; reading alone {read:,.0f} rows/s ({read / ideal:.0%} of ideal)")


if __name__ == "__main__":
    main()
