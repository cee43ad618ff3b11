"""Benchmark the Spark source: rows/s reading a retained topic, beside the ideal reader.

    .venv/bin/python scripts/bench_spark_source.py [--messages 1000000] [--size 100] [--runs 3]
        [--partition-size 100000] [--readers 2] [--per-trigger 250000]

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

Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from lmq_client.http import HTTPClient
from lmq_client.spark import local_session
from lmq_client.sync import Producer

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import start_lmqd, stop_lmqd

TOPIC = "source-bench"
MPUB = 1000
READ_COUNT = 10_000


def publish(tcp: str, messages: int, size: int) -> None:
    body = b"x" * size
    with Producer(tcp) as producer:
        for start in range(0, messages, MPUB):
            producer.mpub(TOPIC, [body] * min(MPUB, messages - start))


def read_range(http: str, start: int, end: int) -> int:
    """Messages of ``[start, end)`` read by offset (one reader process)."""
    client = HTTPClient(http, timeout=30)
    position, got = start, 0
    while position < end:
        batch, position = client.read(TOPIC, position, min(READ_COUNT, end - position))
        got += len(batch)
    return got


def read_ideal(pool: ProcessPoolExecutor, http: str, messages: int, readers: int) -> float:
    """Seconds ``readers`` processes take to read every message by offset together."""
    share = -(-messages // readers)
    started = time.perf_counter()
    futures = [
        pool.submit(read_range, http, start, min(start + share, messages))
        for start in range(0, messages, share)
    ]
    got = sum(f.result() for f in futures)
    seconds = time.perf_counter() - started
    assert got == messages, got
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partition-size", type=int, default=100_000)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--per-trigger", type=int, default=250_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmq-spark-source-") as data:
        daemon = start_lmqd(Path(data) / "lmqd", ["--retention-ms=3600000"])
        try:
            assert daemon.http_address is not None
            started = time.perf_counter()
            publish(daemon.tcp_address, args.messages, args.size)
            print(f"published {args.messages:,} x {args.size} B in "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
            spark = local_session("bench-spark-source", log_level="ERROR")

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
                return seconds

            batch()  # warm-up, not timed: the JVM's code paths and the Python workers
            results: dict[str, list[float]] = {"batch": [], "stream": [], "ideal": []}
            with ProcessPoolExecutor(args.readers) as pool:
                read_ideal(pool, daemon.http_address, min(args.messages, 100_000), args.readers)
                for run in range(1, args.runs + 1):
                    results["batch"].append(batch())
                    results["stream"].append(stream(run))
                    results["ideal"].append(
                        read_ideal(pool, daemon.http_address, args.messages, args.readers)
                    )
                    print(f"run {run}: " + ", ".join(
                        f"{name} {args.messages / times[-1]:,.0f} rows/s"
                        for name, times in results.items()
                    ), flush=True)  # fmt: skip
            spark.stop()
        finally:
            stop_lmqd(daemon)
    print(f"{args.messages:,} messages of {args.size} B, partitionSize {args.partition_size}, "
          f"{args.readers} ideal readers, {args.runs} runs; medians:")
    ideal = statistics.median(results["ideal"])
    for name, times in results.items():
        median = statistics.median(times)
        print(f"{name:>7}: {median:6.2f} s = {args.messages / median:9,.0f} rows/s "
              f"({ideal / median:4.0%} of ideal; runs: {', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
