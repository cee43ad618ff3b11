"""Publishes that outlive a daemon restart: retry with backoff, for a bounded time.

A write task that loses its daemon (connection refused while it restarts, a connection lost
mid-answer, ``E_MPUB_FAILED`` from a daemon that is shutting down) retries the same command
instead of failing at once: after 0.1 s, then twice as long each time up to 2 s, until
``retryTimeoutMs`` (30 s by default) has passed since the first failure of the outage, with one
last attempt at the deadline. A success ends the outage: the next failure gets the whole time
again. Each retry reconnects (the blocking producer drops a failed connection and fails over
through its addresses when it connects), so a stream rides out a restart of its daemon, or the
loss of one of several.

What is retried is a command whose answer never came, so the daemon may have stored it: a
retry after a lost answer can publish that MPUB twice (at-least-once, as a retried Spark task
would), unless its messages carry dedup ids, which the daemon recognises. Errors that another
attempt cannot cure (``E_BAD_MESSAGE``, ``E_BAD_TOPIC``, ``E_INVALID``, authorisation) fail at
once.

Time comes from ``clock`` and waits go through ``sleep`` (``time.monotonic`` and ``time.sleep``
by default), so tests drive the schedule with a fake clock and assert exact times.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from lmq_client.core.backoff import Backoff
from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError
from lmqd.protocol.extension import XpubMessage

__all__ = ["RETRY_BACKOFF", "MessageProducer", "RetryExhausted", "RetryingProducer", "retryable"]

log = logging.getLogger("lmq_client.spark")

RETRY_BACKOFF = Backoff(base=0.1, max_delay=2.0, jitter=0.0)
"""0.1, 0.2, 0.4, 0.8, 1.6, then every 2 s: a daemon back within a second costs a few hundred
milliseconds, and a long outage costs one connection attempt every 2 s (refused at once on a
reachable host). No jitter: the tasks of one job fail together but reconnect to different
daemons, and a restarted lmqd accepts a few hundred connections at once without trouble."""

_RETRYABLE_CODES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})
"""nsqd's answers for "could not store it now" (exiting, a full or failing disk)."""


def retryable(error: LmqClientError) -> bool:
    """Whether another attempt, later, may succeed: a connection that failed or was lost, or a
    daemon that could not store the message now."""
    if isinstance(error, ConnectionFailed):
        return True
    return isinstance(error, NSQError) and error.code in _RETRYABLE_CODES


class RetryExhausted(LmqClientError):
    """The last error of an outage that outlasted the retry timeout: ``error`` (the last
    failure), ``retried_s`` (how long it was retried), ``attempts``."""

    def __init__(self, error: LmqClientError, *, retried_s: float, attempts: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.retried_s = retried_s
        self.attempts = attempts


class MessageProducer(Protocol):
    """What the sink needs of a producer (``lmq_client.sync.Producer``, or a test's fake)."""

    @property
    def address(self) -> str | None: ...

    def publish_items(
        self, topic: str, count: int, items: Sequence[bytes | memoryview], *, extension: bool
    ) -> None: ...

    def dpub(self, topic: str, delay: float, body: bytes) -> None: ...

    def xpub(
        self, topic: str, messages: Sequence[XpubMessage], *, defer_ms: int | None = None
    ) -> None: ...

    def close(self) -> None: ...


class RetryingProducer:
    """``producer`` with every command retried as the module docstring says.

    ``retry_timeout_s`` 0 retries nothing (the first error is raised as is). When an outage
    outlasts the timeout, ``RetryExhausted`` carries its last error.
    """

    def __init__(
        self,
        producer: MessageProducer,
        *,
        retry_timeout_s: float,
        backoff: Backoff = RETRY_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.producer = producer
        self.retry_timeout_s = retry_timeout_s
        self.backoff = backoff
        self.clock = clock
        self.sleep = sleep
        self.retries = 0
        """Commands sent again, over the producer's life."""

    @property
    def address(self) -> str | None:
        return self.producer.address

    def publish_items(
        self, topic: str, count: int, items: Sequence[bytes | memoryview], *, extension: bool
    ) -> None:
        self._run(topic, lambda: self.producer.publish_items(
            topic, count, items, extension=extension))  # fmt: skip

    def dpub(self, topic: str, delay: float, body: bytes) -> None:
        """DPUB ``delay`` seconds (``lmq_client.sync.Producer.dpub``), retried as the rest."""
        self._run(topic, lambda: self.producer.dpub(topic, delay, body))

    def xpub(
        self, topic: str, messages: Sequence[XpubMessage], *, defer_ms: int | None = None
    ) -> None:
        self._run(topic, lambda: self.producer.xpub(topic, messages, defer_ms=defer_ms))

    def close(self) -> None:
        self.producer.close()

    def _run(self, topic: str, command: Callable[[], None]) -> None:
        failures = 0
        first_failure = deadline = 0.0
        while True:
            try:
                command()
                return
            except (NSQError, ConnectionFailed) as exc:
                if self.retry_timeout_s <= 0 or not retryable(exc):
                    raise
                now = self.clock()
                if not failures:
                    first_failure, deadline = now, now + self.retry_timeout_s
                failures += 1
                if now >= deadline:
                    raise RetryExhausted(
                        exc, retried_s=now - first_failure, attempts=failures
                    ) from None
                delay = min(self.backoff.delay(failures), deadline - now)
                log.warning(
                    "SPARK(%s): %s; retrying in %.1f s (%.1f s of %g s left)",
                    topic, exc, delay, deadline - now, self.retry_timeout_s,
                )  # fmt: skip
            self.retries += 1
            self.sleep(delay)
