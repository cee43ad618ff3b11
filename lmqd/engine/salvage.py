"""Salvage: a shutdown's writes of what only memory holds, keeping what fits and counting the rest.

Theory of operation
-------------------
At shutdown each channel writes its in-flight, requeued and deferred messages to its stores and
each topic its memory tail to its log. Written as one call each, a full disk would refuse the
whole batch (a write is stored whole or not at all, ``lmqd.storage.writer``) and every message
in it would be lost, also the ones that would have fit. ``Salvage.write`` therefore writes a
queue's messages front to back in chunks: a chunk that fails is halved and tried again, down to
a single message, so a partial write keeps every message before the first one that does not
fit, in order (the log's offsets stay increasing; what is not written leaves a gap, as a
consumed memory tail does). A single message that fails is retried after a short pause while
the shutdown's shared retry budget lasts (space freed meanwhile, a transient I/O error), then
the queue gives up on it and on everything after it.

Cost: ``O(log n)`` failed writes per queue on top of the successful ones (each failed write is
a ``pwrite`` that the writer truncates back); at most ``RETRIES`` pauses per shutdown, whatever
the number of queues.

Every message given up is counted under its queue's name (``topic`` or ``topic:channel``) when
nothing else keeps it: a durable channel's copies are not counted (their originals are still
unsettled in the topic's log or unacknowledged in a store, so a restart delivers them again).
The service logs the counts at ERROR and exits with a non-zero status
(``lmqd.service.EXIT_MESSAGES_LOST``).

No fallback file: a restart only looks in ``--data-path``, and a full or failing disk there
refuses a fallback file as it refused the queue's own files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from lmqd.engine.backend import BackendError
from lmqd.message import Message

__all__ = ["RETRIES", "RETRY_PAUSE_S", "Salvage"]

log = logging.getLogger("lmqd.daemon")

RETRIES = 3
"""Single-message writes retried per shutdown, all queues together: enough to ride out a brief
error or space another process frees while lmqd shuts down, few enough that a disk that stays
full delays the exit by at most ``RETRIES * RETRY_PAUSE_S`` (0.6 s), not per queue."""

RETRY_PAUSE_S = 0.2
"""Pause before each retry: a blocking sleep, as the rest of the shutdown's writes block."""


class Salvage:
    """One shutdown's chunked writes, their shared retry budget and the messages not kept."""

    def __init__(
        self,
        *,
        retries: int = RETRIES,
        pause_s: float = RETRY_PAUSE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.retries_left = retries
        self._pause_s = pause_s
        self._sleep = sleep
        self.lost: dict[str, int] = {}
        """Queue name -> messages that could not be written and that nothing else keeps."""

    @property
    def lost_count(self) -> int:
        """Messages lost at this shutdown, every queue together."""
        return sum(self.lost.values())

    def write_prefix(
        self,
        subject: str,
        write: Callable[[Sequence[Message], int], None],
        messages: Sequence[Message],
    ) -> tuple[int, BackendError | None]:
        """Write as many of ``messages`` as the disk takes, in order (halving a chunk that
        fails, retrying a single message while the budget lasts); returns how many were written
        (a prefix) and the last error. Counts nothing: ``write`` does."""
        total = len(messages)
        written = 0
        size = total
        error: BackendError | None = None
        while written < total:
            chunk = messages[written : written + size]
            try:
                write(chunk, written)
            except BackendError as exc:
                error = exc
                if size > 1:
                    size = max(size // 2, 1)
                    continue
                if self.retries_left > 0:
                    self.retries_left -= 1
                    log.warning("%s: write failed at shutdown, retrying: %s", subject, exc)
                    self._sleep(self._pause_s)
                    continue
                break
            written += len(chunk)
        return written, error

    def write(
        self,
        subject: str,
        name: str,
        write: Callable[[Sequence[Message], int], None],
        messages: Sequence[Message],
        *,
        kept_elsewhere: bool = False,
    ) -> int:
        """Write ``messages`` in order through ``write(chunk, index of its first message)``,
        which stores a chunk whole or raises ``BackendError``; returns how many were written
        (always a prefix). The rest is counted under the queue's ``name`` (as lost unless
        ``kept_elsewhere``) and logged at ERROR, subject first (``TOPIC(orders)``)."""
        total = len(messages)
        written, error = self.write_prefix(subject, write, messages)
        left = total - written
        if left:
            if kept_elsewhere:
                log.error(
                    "%s: %d of %d messages could not be written at shutdown; they are still "
                    "on disk where they came from and are delivered again after a restart: %s",
                    subject,
                    left,
                    total,
                    error,
                )
            else:
                self.lost[name] = self.lost.get(name, 0) + left
                log.error(
                    "%s: %d of %d messages could not be written at shutdown and are lost "
                    "(%d kept): %s",
                    subject,
                    left,
                    total,
                    written,
                    error,
                )
        return written
