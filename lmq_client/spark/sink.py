"""The sink side of the ``lmq`` data source: the batch and streaming writers Spark pickles to
its executors (``LmqDataSource.writer`` and ``streamWriter`` make them on the driver).

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
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from lmq_client.spark.errors import LmqSinkError, raise_for_spark
from lmq_client.spark.options import SinkOptions
from lmq_client.spark.publish import LmqCommitMessage, summarize, write_partition

__all__ = [
    "BATCH_ID_PROPERTY",
    "QUERY_ID_PROPERTY",
    "LmqBatchWriter",
    "LmqStreamWriter",
    "query_scope",
]

log = logging.getLogger("lmq_client.spark")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The local property Spark's micro-batch engine sets on a stream's tasks: the query's id, kept
in the checkpoint's ``metadata`` file (the same across restarts from that checkpoint)."""
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The local property holding the micro-batch's id (its number in the checkpoint's logs)."""


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
