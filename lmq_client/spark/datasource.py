"""``LmqDataSource``: the PySpark data source ``lmq`` (batch and streaming writers and readers).

Writing: Spark creates the data source and its writer on the driver (in a Python worker), checks
the options and the schema there, pickles the writer to the executors, calls ``write`` once per
task with that task's Arrow record batches, and finally ``commit`` (all tasks returned) or
``abort`` (some failed) on the driver. ``commit`` has nothing left to do, since every row was
answered ``OK`` before its task returned; it only logs a summary. The writers and their
exactly-once dedup ids: ``sink.py``. Reading: ``source.py`` (offsets per daemon, ranges read by
``GET /topic/read``). See ``docs/spark.md``.

This module imports neither side: Spark unpickles the data source in fresh Python processes
(the planner's, a stream's source runner, one per query), and each method imports the side it
makes, so that a reading process never loads the sink's modules, nor a writing one the source's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from lmq_client.spark.errors import LmqSinkError, LmqSourceError, raise_for_spark

if TYPE_CHECKING:
    from lmq_client.spark.options import SinkOptions
    from lmq_client.spark.sink import LmqBatchWriter, LmqStreamWriter
    from lmq_client.spark.source import LmqBatchReader, LmqStreamReader
    from lmq_client.spark.source_options import SourceOptions

__all__ = ["LmqDataSource"]


class LmqDataSource(DataSource):
    """Writes a DataFrame's rows to an lmq (or nsqd) topic, one message per row, and reads an
    lmq topic by offset (``reader``, ``streamReader``: ``source.py``).

    Register it with ``spark.dataSource.register(LmqDataSource)``, then::

        df.write.format("lmq").mode("append").option("address", "127.0.0.1:4150")
            .option("topic", "events").option("bodyColumn", "value").save()
        df.writeStream.format("lmq").option("address", ...).option("topic", ...)
            .option("checkpointLocation", path).start()

    Sink options (names case-insensitive): ``address`` (TCP, ``host:port[,host:port...]``)
    and/or ``lookupdHttpAddress`` (lookupds whose nodes are published to; one of the two is
    required), ``topic`` (without it, a string ``topic`` column routes each row),
    ``bodyColumn`` (string or binary column; default a string/binary ``value`` column; with
    neither, each row is sent as a JSON object), ``batchSize`` (messages per MPUB, 1000),
    ``batchBytes`` (bytes per MPUB body, 5 MiB), ``deferMs`` (DPUB every row with this delay),
    ``deferColumn`` (integer column of per-row delays in ms), ``headersColumn`` (default a
    ``headers`` column of a headers type), ``priorityColumn``, ``ttlColumn`` (lmq's
    per-message fields), ``dedupIds`` (a dedup id on every row: true for streams, false for
    batch writes by default), ``timeout`` (seconds to connect and for each answer, 10),
    ``retryTimeoutMs`` (how long a publish is retried while no daemon takes it, 30000), TLS,
    compression and ``authSecret``. Source options: ``source_options.py``.
    """

    @classmethod
    def name(cls) -> str:
        """The format name: ``df.write.format("lmq")``, ``spark.read.format("lmq")``."""
        return "lmq"

    def schema(self) -> StructType:
        """What a read returns (``source_read.source_schema``: Kafka's ``headers`` column
        with ``includeHeaders=true``)."""
        from lmq_client.spark.source_read import source_schema

        flag = {k.lower(): v for k, v in self.options.items()}.get("includeheaders", "false")
        return source_schema(flag.strip().lower() == "true")

    def reader(self, schema: StructType) -> LmqBatchReader:
        """``spark.read.format("lmq")``: a batch read of offset ranges (``source.py``; the
        options in ``source_options.py`` and docs/spark.md)."""
        from lmq_client.spark.source import LmqBatchReader

        return LmqBatchReader(self._source_options(schema))

    def streamReader(self, schema: StructType) -> LmqStreamReader:
        """``spark.readStream.format("lmq")``: a stream of offset ranges (``source.py``)."""
        from lmq_client.spark.source import LmqStreamReader

        return LmqStreamReader(self._source_options(schema))

    def _source_options(self, schema: StructType) -> SourceOptions:
        from lmq_client.spark.source_options import SourceOptions
        from lmq_client.spark.source_read import source_schema

        try:
            options = SourceOptions.parse(self.options)
        except ValueError as exc:
            raise_for_spark(LmqSourceError(str(exc)))
        expected = source_schema(options.include_headers)
        if schema != expected:
            raise_for_spark(LmqSourceError(
                f"lmq source: the schema is fixed ({expected.simpleString()}); "
                "select or cast columns after reading"
            ))  # fmt: skip
        return options

    def writer(self, schema: StructType, overwrite: bool) -> LmqBatchWriter:
        """The batch writer; ``mode("overwrite")`` is refused (a topic cannot be replaced)."""
        if overwrite:
            raise_for_spark(ValueError(
                "lmq sink: a topic is a stream of messages and cannot be overwritten; "
                "use mode('append')"
            ))  # fmt: skip
        from lmq_client.spark.sink import LmqBatchWriter

        return LmqBatchWriter(self._options(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LmqStreamWriter:
        """The streaming writer. In complete output mode every micro-batch republishes the
        whole result table (a topic has nothing to truncate)."""
        from lmq_client.spark.sink import LmqStreamWriter

        return LmqStreamWriter(self._options(schema))

    def _options(self, schema: StructType) -> SinkOptions:
        from lmq_client.spark.options import SinkOptions

        try:
            return SinkOptions.parse(self.options).resolve_columns(schema)
        except ValueError as exc:
            topic = {k.lower(): v for k, v in self.options.items()}.get("topic", "")
            raise_for_spark(LmqSinkError(str(exc), topic=topic))
