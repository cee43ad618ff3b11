"""One write task: encode its record batches, publish them in MPUB batches, report what was sent.

Theory of operation. A task (one partition of one Spark job or micro-batch) runs on an executor
in a Python worker. It opens one blocking ``lmq_client.sync.Producer``, to the daemon picked by
its partition number (``address[partition % n]``, the others as connect fail-over), so the
partitions of a job spread over the daemons. With ``lookupdHttpAddress`` the daemons are also
the nodes the lookupds list (``GET /nodes``, asked by each task, so a micro-batch sees the nodes
of its time), minus those on which the topic is tombstoned (being deleted), in one sorted
order that every task of a job computes alike. Bodies are gathered into MPUBs of at most
``batchSize`` messages and ``batchBytes`` bytes; deferred rows go out one DPUB each (NSQ has no
deferred MPUB). Each command waits for its ``OK`` before the next one is sent, and ``write``
returns its commit message only after the last one: a task that returns has had every row
accepted by a daemon. Any error ends the task at once with an ``LmqSinkError`` naming the topic
and daemon; nothing is retried here, because Spark's task retry (and, for a stream, the restart
from the checkpoint) already gives at-least-once delivery, and a retry here could not know
whether an unanswered MPUB was stored.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from pyspark.sql.datasource import WriterCommitMessage

from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError
from lmq_client.lookupd import LookupdNode, lookup_nodes, merge_nodes
from lmq_client.spark.encode import BadRowError, RowEncoder
from lmq_client.spark.errors import LmqSinkError
from lmq_client.spark.options import SinkOptions
from lmq_client.sync import Producer
from lmq_client.transport import PLAIN, TransportOptions

__all__ = [
    "BatchingPublisher",
    "LmqCommitMessage",
    "MessageProducer",
    "addresses_for_partition",
    "daemon_addresses",
    "summarize",
    "write_partition",
]

log = logging.getLogger("lmq_client.spark")

# An MPUB body is a 4-byte message count, then a 4-byte size before each message.
_MPUB_HEADER = 4
_MPUB_PER_MESSAGE = 4


class MessageProducer(Protocol):
    """What the sink needs of a producer (``lmq_client.sync.Producer``, or a test's fake)."""

    @property
    def address(self) -> str | None: ...

    def mpub(self, topic: str, bodies: Sequence[bytes]) -> None: ...

    def dpub(self, topic: str, delay_ms: int, body: bytes) -> None: ...

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class LmqCommitMessage(WriterCommitMessage):
    """A task's report to the driver: every one of its ``rows`` was answered ``OK``.

    ``address`` is the daemon it published to ("" if it had no rows), ``mpubs`` and ``dpubs``
    the commands it took.
    """

    partition_id: int
    attempt: int
    address: str
    rows: int
    mpubs: int
    dpubs: int


class BatchingPublisher:
    """Gathers bodies into MPUBs within the size limits; sends deferred bodies as DPUBs.

    ``add`` may publish (whenever a batch fills); ``flush`` publishes what is left. ``published``
    counts rows the daemon answered ``OK`` for. Bodies are neither copied nor inspected beyond
    their length.
    """

    def __init__(
        self, producer: MessageProducer, topic: str, *, batch_size: int, batch_bytes: int
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.published = 0
        self.mpubs = 0
        self.dpubs = 0
        self._pending: list[bytes] = []
        self._pending_bytes = _MPUB_HEADER

    def add(self, bodies: Sequence[bytes], delays: Sequence[int] | None, defer_ms: int) -> None:
        """Queue ``bodies``; each is deferred by its entry in ``delays`` (None: ``defer_ms``)."""
        if delays is None:
            if defer_ms:
                for body in bodies:
                    self._dpub(defer_ms, body)
            else:
                self._add_now(bodies)
            return
        now = [body for body, delay in zip(bodies, delays, strict=True) if not delay]
        if len(now) < len(bodies):
            for body, delay in zip(bodies, delays, strict=True):
                if delay:
                    self._dpub(delay, body)
        self._add_now(now)

    def flush(self) -> None:
        """Publish the partly filled MPUB, if any."""
        if self._pending:
            pending = self._pending
            self.producer.mpub(self.topic, pending)
            self._pending = []
            self._pending_bytes = _MPUB_HEADER
            self.mpubs += 1
            self.published += len(pending)

    def _add_now(self, bodies: Sequence[bytes]) -> None:
        i, n = 0, len(bodies)
        while i < n:
            chunk = bodies[i : i + self.batch_size - len(self._pending)]
            size = _MPUB_PER_MESSAGE * len(chunk) + sum(map(len, chunk))
            if self._pending_bytes + size <= self.batch_bytes:
                # The common case: a whole slice fits, measured with C-speed sum/len.
                self._pending.extend(chunk)
                self._pending_bytes += size
                i += len(chunk)
            else:
                # Bytes run out before the count does: fill up body by body, then send.
                for body in chunk:
                    size = _MPUB_PER_MESSAGE + len(body)
                    if self._pending and self._pending_bytes + size > self.batch_bytes:
                        break
                    # A body bigger than batchBytes goes alone; the daemon decides on it.
                    self._pending.append(body)
                    self._pending_bytes += size
                    i += 1
                self.flush()
                continue
            if len(self._pending) >= self.batch_size:
                self.flush()

    def _dpub(self, delay_ms: int, body: bytes) -> None:
        self.producer.dpub(self.topic, delay_ms, body)
        self.dpubs += 1
        self.published += 1


def addresses_for_partition(addresses: Sequence[str], partition_id: int) -> list[str]:
    """``addresses`` rotated so that partition ``p`` starts at ``addresses[p % n]``."""
    k = partition_id % len(addresses)
    return [*addresses[k:], *addresses[:k]]


NodeLookup = Callable[[str, float], list[LookupdNode]]
"""``lookup(lookupd, timeout)`` -> the nodes it lists (``lmq_client.lookupd.lookup_nodes``)."""


def _lookup_nodes(lookupd: str, timeout: float) -> list[LookupdNode]:
    return lookup_nodes(lookupd, timeout=timeout)


def daemon_addresses(options: SinkOptions, lookup: NodeLookup = _lookup_nodes) -> list[str]:
    """The daemons to publish to: ``address`` as given, then the nodes the lookupds list that
    do not have the topic tombstoned, sorted. ``LmqSinkError`` if that leaves none."""
    if not options.lookupd_addresses:
        return list(options.addresses)
    answers: list[list[LookupdNode]] = []
    failures: list[str] = []
    for lookupd in options.lookupd_addresses:
        try:
            answers.append(lookup(lookupd, options.timeout_s))
        except LmqClientError as exc:
            log.warning("SPARK(%s): lookupd %s: %s", options.topic, lookupd, exc)
            failures.append(f"{lookupd}: {exc}")
    found = [n.tcp_address for n in merge_nodes(answers) if options.topic not in n.tombstoned]
    addresses = list(dict.fromkeys([*options.addresses, *found]))
    if not addresses:
        reason = "; ".join(failures) if failures else "they list no node"
        raise LmqSinkError(
            f"lmq sink: topic {options.topic!r}: no daemon to publish to from lookupds "
            f"{', '.join(options.lookupd_addresses)} ({reason})",
            topic=options.topic,
            published=0,
        )
    return addresses


ProducerFactory = Callable[[list[str], float], MessageProducer]


def _sync_producer(
    addresses: list[str], timeout: float, transport: TransportOptions = PLAIN
) -> MessageProducer:
    return Producer(addresses, timeout=timeout, transport=transport)


def write_partition(
    options: SinkOptions,
    batches: Iterable[Any],
    *,
    partition_id: int = 0,
    attempt: int = 0,
    producer_factory: ProducerFactory | None = None,
    lookup: NodeLookup = _lookup_nodes,
) -> LmqCommitMessage:
    """Publish every row of ``batches`` (pyarrow record batches); the commit message when done.

    Raises ``LmqSinkError`` naming the topic (and the daemon, for publish failures) on the first
    failure; rows published before it stay published.
    """
    addresses = addresses_for_partition(daemon_addresses(options, lookup), partition_id)
    if producer_factory is None:
        producer_factory = functools.partial(_sync_producer, transport=options.transport)
    producer = producer_factory(addresses, options.timeout_s)
    publisher = BatchingPublisher(
        producer, options.topic, batch_size=options.batch_size, batch_bytes=options.batch_bytes
    )
    encoder = RowEncoder(options)
    rows = 0
    try:
        for batch in batches:
            try:
                bodies, delays = encoder.encode(batch, rows)
            except BadRowError as exc:
                raise LmqSinkError(
                    f"lmq sink: topic {options.topic!r}: {exc} (partition {partition_id}; "
                    f"{publisher.published} of this task's rows were published before it)",
                    topic=options.topic,
                    published=publisher.published,
                ) from None
            rows += len(bodies)
            publisher.add(bodies, delays, options.defer_ms)
        publisher.flush()
    except (NSQError, ConnectionFailed) as exc:
        address = exc.address or producer.address or ", ".join(addresses)
        raise LmqSinkError(
            f"lmq sink: publishing to topic {options.topic!r} on {address} failed: {exc} "
            f"(partition {partition_id}, attempt {attempt}; {publisher.published} of this "
            f"task's rows were published before the failure and are published again if Spark "
            f"retries the task)",
            topic=options.topic,
            address=address,
            published=publisher.published,
        ) from None
    finally:
        used = producer.address or ""
        producer.close()
    message = LmqCommitMessage(
        partition_id=partition_id,
        attempt=attempt,
        address=used,
        rows=publisher.published,
        mpubs=publisher.mpubs,
        dpubs=publisher.dpubs,
    )
    log.debug("SPARK(%s): partition %d published %d rows to %s",
              options.topic, partition_id, message.rows, used or "-")
    return message


def summarize(messages: Sequence[WriterCommitMessage | None]) -> tuple[int, int, dict[str, int]]:
    """``(rows, tasks that reported, rows per daemon)`` from a job's commit messages."""
    rows = tasks = 0
    per_daemon: dict[str, int] = {}
    for message in messages:
        if isinstance(message, LmqCommitMessage):
            tasks += 1
            rows += message.rows
            if message.rows:
                per_daemon[message.address] = per_daemon.get(message.address, 0) + message.rows
    return rows, tasks, per_daemon
