"""Benchmark the Spark source: rows/s reading a retained topic with ``spark.read.format("lmq")``.

    .venv/bin/python scripts/bench_spark_source.py [--messages 1000000] [--size 100] [--runs 3]
        [--partition-size 100000]

Starts its own lmqd (``python -m lmqd`` on 127.0.0.1, port 0, HTTP on, data in a temporary
directory, ``--retention-ms`` of an hour so the topic keeps every message on disk), publishes
``--messages`` bodies of ``--size`` bytes in MPUBs of 1000, and starts a local SparkSession
(``local[2]``, no UI). Each run reads the whole topic with ``spark.read.format("lmq")`` and
writes it to Spark's ``noop`` sink (every row is produced, nothing is stored), timed from the
call to its return. For comparison it also times one Python process reading the same offsets
with ``GET /topic/read`` (``lmq_client.http.HTTPClient.read``) and decoding them: the source's
transport alone, without Spark.

Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lmq_client.http import HTTPClient
from lmq_client.spark import local_session
from lmq_client.sync import Producer

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import start_lmqd, stop_lmqd

TOPIC = "source-bench"
MPUB = 1000


def publish(tcp: str, messages: int, size: int) -> None:
    body = b"x" * size
    with Producer(tcp) as producer:
        for start in range(0, messages, MPUB):
            producer.mpub(TOPIC, [body] * min(MPUB, messages - start))


def read_plain(http: str, messages: int) -> float:
    """Seconds one process takes to read every message by offset (no Spark)."""
    client = HTTPClient(http, timeout=30)
    position = 0
    started = time.perf_counter()
    got = 0
    while position < messages:
        batch, position = client.read(TOPIC, position, 10_000)
        got += len(batch)
    assert got == messages, got
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partition-size", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmq-spark-source-") as data:
        daemon = start_lmqd(Path(data), ["--retention-ms=3600000"])
        try:
            assert daemon.http_address is not None
            started = time.perf_counter()
            publish(daemon.tcp_address, args.messages, args.size)
            print(f"published {args.messages:,} x {args.size} B in "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
            spark = local_session("bench-spark-source", log_level="ERROR")
            spark_s, plain_s = [], []
            for run in range(1, args.runs + 1):
                frame = (
                    spark.read.format("lmq").option("httpAddress", daemon.http_address)
                    .option("topic", TOPIC).option("partitionSize", str(args.partition_size))
                    .load()
                )
                t0 = time.perf_counter()
                frame.write.format("noop").mode("overwrite").save()
                spark_s.append(time.perf_counter() - t0)
                plain_s.append(read_plain(daemon.http_address, args.messages))
                print(f"run {run}: spark {args.messages / spark_s[-1]:,.0f} rows/s, "
                      f"plain HTTP read {args.messages / plain_s[-1]:,.0f} msgs/s", flush=True)
            spark.stop()
            print(f"median over {args.runs} runs: spark source "
                  f"{args.messages / statistics.median(spark_s):,.0f} rows/s, plain HTTP read "
                  f"{args.messages / statistics.median(plain_s):,.0f} msgs/s "
                  f"({args.messages:,} messages of {args.size} B)")
        finally:
            stop_lmqd(daemon)


if __name__ == "__main__":
    main()
