"""The PySpark data source ``lmq``: write DataFrames and streams into lmq (or nsqd) topics, and
read lmq topics by offset (``spark.read``/``spark.readStream.format("lmq")``, ``source.py``),
as Spark's Kafka source reads Kafka topics (Kafka's option names, ``failOnDataLoss``,
``Trigger.AvailableNow``).

::

    from lmq_client.spark import LmqDataSource

    spark.dataSource.register(LmqDataSource)
    (df.writeStream.format("lmq")
        .option("address", "127.0.0.1:4150")
        .option("topic", "events")                # or a `topic` column, row by row
        .option("checkpointLocation", "/tmp/ck")  # `value` is the body (or bodyColumn);
        .start())                                 # with neither, each row as a JSON object

Executors publish with the blocking ``lmq_client.sync.Producer`` (pooled per worker process,
``pool.py``) in MPUB batches, from the Arrow record batches Spark hands them, retrying across a
daemon restart (``retry.py``). Delivery is at-least-once, and exactly-once into lmqd for streams:
every row carries a dedup id from its query, micro-batch, partition and index (``sink.py``),
so the topic drops what a retry or a restart from the checkpoint publishes again;
``docs/spark.md`` says under which conditions.

PySpark and PyArrow are not dependencies of lmq itself (they are ~650 MB, and the daemon, the
clients and lmqadmin never use them): they come with the ``spark`` extra,
``pip install 'lmq[spark]'``. Without them, importing this package (or any module in it, since
Python imports the package first) raises an ImportError that says which extra to install.
"""

from typing import TYPE_CHECKING

from lmq_client._lazy import lazy_names

# The top-level modules the spark extra brings: PySpark, PyArrow, and py4j (PySpark's own
# dependency, named here so that a half-installed PySpark gets the same advice).
_EXTRA_MODULES = frozenset({"pyspark", "pyarrow", "py4j"})

try:  # what the extra brings, checked at once; the package's own modules load on first use
    import pyarrow  # type: ignore[import-untyped]  # noqa: F401
    import pyspark.sql.datasource  # noqa: F401
except ModuleNotFoundError as exc:
    if (exc.name or "").partition(".")[0] not in _EXTRA_MODULES:
        raise
    raise ModuleNotFoundError(
        f"lmq_client.spark needs {exc.name}, which is not installed; it comes with lmq's spark "
        "extra: pip install 'lmq[spark]'",
        name=exc.name,
    ) from exc

if TYPE_CHECKING:
    from lmq_client.spark.datasource import LmqDataSource
    from lmq_client.spark.errors import LmqDataLossError, LmqSinkError, LmqSourceError
    from lmq_client.spark.options import SinkOptions
    from lmq_client.spark.publish import LmqCommitMessage
    from lmq_client.spark.session import ensure_java, local_session
    from lmq_client.spark.sink import LmqBatchWriter, LmqStreamWriter
    from lmq_client.spark.source import LmqBatchReader, LmqStreamReader
    from lmq_client.spark.source_options import SourceOptions

_HOMES = {
    "LmqBatchWriter": "sink", "LmqDataSource": "datasource", "LmqStreamWriter": "sink",
    "LmqDataLossError": "errors", "LmqSinkError": "errors", "LmqSourceError": "errors",
    "SinkOptions": "options", "LmqCommitMessage": "publish", "ensure_java": "session",
    "local_session": "session", "LmqBatchReader": "source", "LmqStreamReader": "source",
    "SourceOptions": "source_options",
}  # fmt: skip
"""Where each public name lives (``lmq_client._lazy``): Spark's Python workers unpickle a
reader or a writer from its own module, in a fresh process per micro-batch and per query, and
import what that side needs, not every module of the package."""

__getattr__ = lazy_names(__name__, _HOMES)

__all__ = [
    "LmqBatchReader",
    "LmqBatchWriter",
    "LmqCommitMessage",
    "LmqDataLossError",
    "LmqDataSource",
    "LmqSinkError",
    "LmqSourceError",
    "LmqStreamReader",
    "LmqStreamWriter",
    "SinkOptions",
    "SourceOptions",
    "ensure_java",
    "local_session",
]
