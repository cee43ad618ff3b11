"""Example pipeline: a stream of order files -> clean up and enrich in Spark -> an lmq topic.

With ``./scripts/run`` running (lmqd on 127.0.0.1:4150), in another terminal::

    .venv/bin/python scripts/spark_pipeline.py --demo 1000     # write 1000 sample orders, publish
    .venv/bin/lmqadmin tail orders -n 5                        # look at a few

Reads JSON-lines files as they appear in ``--input`` (Spark's file stream source), drops orders
without a customer or with a non-positive amount, converts amounts to EUR, flags big orders, and
publishes each remaining order as one JSON message to ``--topic`` with the ``lmq`` data source.
Progress is kept in ``--checkpoint``: run it again and only files added since are published.
``--once`` (the default) processes what is there and exits (``trigger(availableNow=True)``);
``--watch SECONDS`` keeps polling the directory until Ctrl-C.

Spark runs locally (``local[2]``, loopback only, no UI); Java 17 is installed with apt-get if
missing and we are root, as ``./scripts/test`` does. Nothing else is downloaded.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from lmq_client.spark import local_session

log = logging.getLogger("spark_pipeline")

ROOT = Path(__file__).resolve().parent.parent

ORDER_SCHEMA = StructType([
    StructField("order_id", StringType()),
    StructField("customer", StringType()),
    StructField("amount", DoubleType()),
    StructField("currency", StringType()),
    StructField("created_at", StringType()),
])

# Fixed rates keep the example self-contained; a real pipeline would join a rates table.
EUR_PER_UNIT = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17, "CHF": 1.04}
BIG_ORDER_EUR = 500.0


def write_demo_orders(directory: Path, count: int) -> None:
    """``count`` sample orders (some invalid, to be filtered out) as one new JSON-lines file."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random()
    lines = []
    for _ in range(count):
        lines.append(json.dumps({
            "order_id": f"o-{rng.getrandbits(48):012x}",
            "customer": rng.choice(["ada", "grace", "linus", "barbara", None]),
            "amount": round(rng.uniform(-20, 1000), 2),
            "currency": rng.choice(list(EUR_PER_UNIT)),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }))
    name = f"orders-{time.time_ns()}.jsonl"
    # Written under a dot-name and renamed: Spark's file source skips hidden files, so it never
    # reads a half-written one.
    tmp = directory / f".{name}"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(directory / name)
    log.info("demo: wrote %d orders to %s", count, directory / name)


def start_pipeline(
    spark: SparkSession,
    *,
    source: Path,
    checkpoint: Path,
    address: str,
    topic: str,
    watch: float | None = None,
) -> StreamingQuery:
    """Start the streaming query: every order file in ``source`` -> valid, enriched orders as
    JSON messages on ``topic``. Without ``watch`` it stops once the files present are done."""
    rates = F.create_map(*[F.lit(x) for pair in EUR_PER_UNIT.items() for x in pair])
    orders = spark.readStream.schema(ORDER_SCHEMA).json(str(source))
    enriched = (
        orders.where(F.col("customer").isNotNull() & (F.col("amount") > 0))
        .withColumn("amount_eur", F.round(F.col("amount") * rates[F.col("currency")], 2))
        .withColumn("big", F.col("amount_eur") >= BIG_ORDER_EUR)
        .withColumn("created_at", F.to_timestamp("created_at"))
    )
    writer = (
        enriched.writeStream.format("lmq")
        .option("address", address)
        .option("topic", topic)  # no bodyColumn: each row becomes one JSON object
        .option("checkpointLocation", str(checkpoint))
    )
    if watch:
        return writer.trigger(processingTime=f"{watch} seconds").start()
    return writer.trigger(availableNow=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--address", default="127.0.0.1:4150",
                        help="lmqd TCP address(es), comma-separated [default: %(default)s]")
    parser.add_argument("--topic", default="orders", help="[default: %(default)s]")
    parser.add_argument("--input", type=Path, default=ROOT / "data" / "spark-demo" / "in",
                        help="directory of JSON-lines order files [default: %(default)s]")
    parser.add_argument("--checkpoint", type=Path,
                        default=ROOT / "data" / "spark-demo" / "checkpoint",
                        help="the query's progress [default: %(default)s]")
    parser.add_argument("--demo", type=int, metavar="N", default=0,
                        help="first write N sample orders into --input")
    parser.add_argument("--watch", type=float, metavar="SECONDS",
                        help="keep running, looking for new files every SECONDS")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    if args.demo:
        write_demo_orders(args.input, args.demo)
    args.input.mkdir(parents=True, exist_ok=True)

    spark = local_session("lmq-pipeline", install_java=True, log_level="ERROR")
    query = start_pipeline(spark, source=args.input, checkpoint=args.checkpoint,
                           address=args.address, topic=args.topic, watch=args.watch)
    if args.watch:
        log.info("watching %s (Ctrl-C to stop)", args.input)
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
    else:
        query.awaitTermination()
    # Spark counts the rows its sink wrote in each micro-batch's progress report.
    published = sum(max(0, p["sink"]["numOutputRows"]) for p in query.recentProgress)
    log.info("published %d orders to topic %r on %s", published, args.topic, args.address)
    spark.stop()


if __name__ == "__main__":
    main()
