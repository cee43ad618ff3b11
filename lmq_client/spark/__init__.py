"""The PySpark data source ``lmq``: write DataFrames and streams into lmq (or nsqd) topics.

::

    from lmq_client.spark import LmqDataSource

    spark.dataSource.register(LmqDataSource)
    (df.writeStream.format("lmq")
        .option("address", "127.0.0.1:4150")
        .option("topic", "events")
        .option("bodyColumn", "value")            # without it: each row as a JSON object
        .option("checkpointLocation", "/tmp/ck")
        .start())

Executors publish with the blocking ``lmq_client.sync.Producer`` in MPUB batches, from the
Arrow record batches Spark hands them. Delivery is at-least-once; ``docs/spark.md`` says exactly
what a retry or a restart from the checkpoint publishes again.
"""

from lmq_client.spark.datasource import LmqBatchWriter, LmqDataSource, LmqStreamWriter
from lmq_client.spark.errors import LmqSinkError
from lmq_client.spark.options import SinkOptions
from lmq_client.spark.publish import LmqCommitMessage
from lmq_client.spark.session import ensure_java, local_session

__all__ = [
    "LmqBatchWriter",
    "LmqCommitMessage",
    "LmqDataSource",
    "LmqSinkError",
    "LmqStreamWriter",
    "SinkOptions",
    "ensure_java",
    "local_session",
]
