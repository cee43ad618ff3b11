"""``LmqDataSource``: the PySpark data source ``lmq`` (batch and streaming writers and readers).

Writing: Spark creates the data source and its writer on the driver (in a Python worker), checks
the options and the schema there, pickles the writer to the executors, calls ``write`` once per
task with that task's Arrow record batches, and finally ``commit`` (all tasks returned) or
``abort`` (some failed) on the driver. ``commit`` has nothing left to do, since every row was
answered ``OK`` before its task returned; it only logs a summary. Reading: ``source.py`` (offsets
per daemon, ranges read by ``GET /topic/read``). See ``docs/spark.md``.

Exactly-once writes. A write task gives every row a dedup id, ``<scope>:<partition>:<row>``
(``publish.dedup_prefix``), naming the row by where Spark put it, so that a task Spark runs again
publishes the same ids and the topic's dedup window drops what an earlier attempt had stored. For
a stream the scope is the query id and the micro-batch id, which Spark's micro-batch engine sets
on every task as the local properties ``sql.streaming.queryId`` and ``streaming.sql.batchId``:
both come from the checkpoint, so a batch re-run after a driver restart names its rows as the
first run did (the run id, ``spark.jobGroup.id``, changes at every start and is not used). A
batch write has neither; its scope is an id drawn when the writer is made on the driver, so it
covers the task retries of one ``save()``, not a second ``save()``.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from lmq_client.spark.errors import LmqSinkError, LmqSourceError, raise_for_spark
from lmq_client.spark.options import SinkOptions
from lmq_client.spark.publish import LmqCommitMessage, summarize, write_partition
from lmq_client.spark.source import LmqBatchReader, LmqStreamReader
from lmq_client.spark.source_options import SourceOptions
from lmq_client.spark.source_read import source_schema

__all__ = [
    "BATCH_ID_PROPERTY",
    "QUERY_ID_PROPERTY",
    "LmqBatchWriter",
    "LmqDataSource",
    "LmqStreamWriter",
    "query_scope",
]

log = logging.getLogger("lmq_client.spark")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The local property Spark's micro-batch engine sets on a stream's tasks: the query's id, kept
in the checkpoint's ``metadata`` file (the same across restarts from that checkpoint)."""
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The local property holding the micro-batch's id (its number in the checkpoint's logs)."""


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
        flag = {k.lower(): v for k, v in self.options.items()}.get("includeheaders", "false")
        return source_schema(flag.strip().lower() == "true")

    def reader(self, schema: StructType) -> LmqBatchReader:
        """``spark.read.format("lmq")``: a batch read of offset ranges (``source.py``; the
        options in ``source_options.py`` and docs/spark.md)."""
        return LmqBatchReader(self._source_options(schema))

    def streamReader(self, schema: StructType) -> LmqStreamReader:
        """``spark.readStream.format("lmq")``: a stream of offset ranges (``source.py``)."""
        return LmqStreamReader(self._source_options(schema))

    def _source_options(self, schema: StructType) -> SourceOptions:
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
        return LmqBatchWriter(self._options(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LmqStreamWriter:
        """The streaming writer. In complete output mode every micro-batch republishes the
        whole result table (a topic has nothing to truncate)."""
        return LmqStreamWriter(self._options(schema))

    def _options(self, schema: StructType) -> SinkOptions:
        try:
            return SinkOptions.parse(self.options).resolve_columns(schema)
        except ValueError as exc:
            topic = {k.lower(): v for k, v in self.options.items()}.get("topic", "")
            raise_for_spark(LmqSinkError(str(exc), topic=topic))


def _task() -> tuple[int, int]:
    context = TaskContext.get()
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


def query_scope(query_id: str, batch_id: str) -> str:
    """The dedup scope of micro-batch ``batch_id`` of query ``query_id`` (a UUID): the id in
    22 characters of URL-safe base64, then the batch, e.g. ``e72Jx...Q:17``."""
    packed = base64.urlsafe_b64encode(uuid.UUID(query_id).bytes).rstrip(b"=").decode()
    return f"{packed}:{int(batch_id)}"


def _stream_scope(options: SinkOptions) -> str | None:
    """This task's dedup scope for a stream (None with ``dedupIds=false``)."""
    if options.dedup_ids is False:
        return None
    context = TaskContext.get()
    query_id = batch_id = None
    if context is not None:
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
    if not query_id or not batch_id:
        raise LmqSinkError(
            f"lmq sink: {options.described_topic}: Spark gave this task no query and batch id "
            f"({QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY}: a continuous-mode query?), so its rows "
            "cannot get stable dedup ids; set option dedupIds=false for at-least-once",
            topic=options.topic,
        )
    return query_scope(query_id, batch_id)


def _write(
    options: SinkOptions, iterator: Iterator[Any], dedup_scope: str | None
) -> LmqCommitMessage:
    partition_id, attempt = _task()
    return write_partition(
        options, iterator, partition_id=partition_id, attempt=attempt, dedup_scope=dedup_scope
    )


# Spark shows the driver the failed task's Python traceback, then the error's line. The writers
# raise an ``LmqSinkError`` through ``errors.raise_for_spark``, so that what Spark shows after
# its own words is the one-line message, not a page of our frames (docs/spark.md).


class LmqBatchWriter(DataSourceArrowWriter):
    """``df.write.format("lmq")``: each task publishes its partition (Arrow batches).

    With ``dedupIds=true`` (off by default) rows get dedup ids scoped by an id drawn here, on
    the driver, once per ``save()``: a retried task's rows are not stored twice."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.dedup_scope = query_scope(str(uuid.uuid4()), "0") if options.dedup_ids else None

    def write(self, iterator: Iterator[Any]) -> LmqCommitMessage:
        """Publish this task's rows; returns only once every MPUB/DPUB was answered ``OK``."""
        try:
            return _write(self.options, iterator, self.dedup_scope)
        except LmqSinkError as error:
            raise_for_spark(error)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """All tasks succeeded: log what was published."""
        rows, tasks, per_daemon = summarize(messages)
        log.info("SPARK(%s): write committed: %d rows from %d tasks %s",
                 self.options.topic or "*", rows, tasks, per_daemon)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Some task failed: the rows of the tasks that succeeded stay published."""
        rows, tasks, per_daemon = summarize(messages)
        log.warning("SPARK(%s): write aborted; %d rows from %d finished tasks stay published %s",
                    self.options.topic or "*", rows, tasks, per_daemon)


class LmqStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("lmq")``: each micro-batch's tasks publish their partitions,
    every row with a dedup id from the query, batch, partition and row (``dedupIds``, on by
    default; see the module docstring)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> LmqCommitMessage:
        """Publish this task's rows; returns only once every MPUB/DPUB was answered ``OK``."""
        try:
            return _write(self.options, iterator, _stream_scope(self.options))
        except LmqSinkError as error:
            raise_for_spark(error)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """All tasks of micro-batch ``batchId`` succeeded; Spark records it in the checkpoint
        next, after which a restart never publishes it again."""
        rows, tasks, per_daemon = summarize(messages)
        log.info("SPARK(%s): batch %d committed: %d rows from %d tasks %s",
                 self.options.topic or "*", batchId, rows, tasks, per_daemon)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Micro-batch ``batchId`` failed: its published rows are published again when the
        query restarts from its checkpoint."""
        rows, tasks, per_daemon = summarize(messages)
        log.warning("SPARK(%s): batch %d aborted; %d rows from %d finished tasks stay published "
                    "and are published again when the query restarts %s",
                    self.options.topic or "*", batchId, rows, tasks, per_daemon)
