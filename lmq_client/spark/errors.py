"""The data source's own exceptions: what a failed task or plan raises, and so what Spark
reports to the user."""

from __future__ import annotations

import os
from typing import NoReturn

from lmq_client.errors import LmqClientError

__all__ = [
    "HIDE_TRACEBACK_ENV",
    "LmqDataLossError",
    "LmqSinkError",
    "LmqSourceError",
    "raise_for_spark",
]


class LmqSinkError(LmqClientError):
    """A write task could not publish its rows: a daemon refused or was unreachable, or a row
    cannot be a message (null or empty body, negative delay).

    The message names the topic and, for publish failures, the daemon; Spark shows it (inside its
    own ``PythonException`` text) as the cause of the failed query. ``published`` is how many of
    the task's rows the daemons had already answered ``OK`` for: a retry of the task publishes
    them again (stored again unless they carry dedup ids).
    """

    def __init__(self, message: str, *, topic: str, address: str = "", published: int = 0) -> None:
        super().__init__(message)
        self.topic = topic
        self.address = address
        self.published = published

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields: the default reduce would call __init__(message) and fail.
        return (_rebuild, (str(self), self.topic, self.address, self.published))


def _rebuild(message: str, topic: str, address: str, published: int) -> LmqSinkError:
    return LmqSinkError(message, topic=topic, address=address, published=published)


class LmqSourceError(LmqClientError):
    """A read cannot go on: a bad option, a daemon that cannot be reached or read, an
    impossible range. The message is one line naming the option, topic or daemon."""


class LmqDataLossError(LmqSourceError):
    """Offsets the query was due to read are gone (``failOnDataLoss=true``, the default): the
    message names the topic, the node and the range, and how to go on."""


WORKER_ENV = "PYTHON_WORKER_FACTORY_SECRET"
"""Set by Spark's JVM in every Python worker it starts (and in no driver)."""
HIDE_TRACEBACK_ENV = "SPARK_HIDE_TRACEBACK"
"""PySpark's switch (``pyspark.util.handle_worker_exception``) for reporting a Python worker's
exception as its last line only, the one ``spark.sql.execution.pyspark.udf.hideTraceback.
enabled`` sets for every worker."""


def raise_for_spark(error: BaseException) -> NoReturn:
    """Raise ``error`` so that Spark reports it as one line, without a Python traceback.

    PySpark formats a worker's exception after it has left our frames, reading
    ``SPARK_HIDE_TRACEBACK`` from the environment at that moment; every PySpark worker (the
    planner, the streaming source's runner, an executor's task) exits right after reporting an
    exception, so setting the variable here affects this one report and dies with the process.
    Elsewhere (a test calling a reader itself) the environment is left alone: a JVM started
    later would hand the variable to every worker. Only errors meant for the user go through
    here: a bug of ours keeps its traceback."""
    if WORKER_ENV in os.environ:
        os.environ[HIDE_TRACEBACK_ENV] = "1"
    raise error.with_traceback(None) from None
