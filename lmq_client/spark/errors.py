"""The sink's own exception: what a failed write task raises, and so what Spark reports."""

from __future__ import annotations

from lmq_client.errors import LmqClientError

__all__ = ["LmqSinkError"]


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
