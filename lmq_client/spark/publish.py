"""One write task: encode its record batches, publish them in MPUB batches, report what was sent.

Theory of operation. A task (one partition of one Spark job or micro-batch) runs on an executor
in a Python worker. It takes a blocking ``lmq_client.sync.Producer`` from the process's pool
(``pool.py``: kept open between the tasks a worker runs), for the daemons in the order its
partition number picks (``address[partition % n]`` first, the others as connect fail-over), so
the partitions of a job spread over the daemons. With ``lookupdHttpAddress`` the daemons are
also the nodes the lookupds list (``GET /nodes``, asked by each task, so a micro-batch sees the
nodes of its time), minus those on which the topic is tombstoned (being deleted), in one sorted
order that every task of a job computes alike. Bodies are gathered into MPUBs of at most
``batchSize`` messages and ``batchBytes`` bytes, one pending MPUB per topic when a ``topic``
column routes the rows; deferred rows go out one DPUB each (NSQ has no deferred MPUB). Each
command waits for its ``OK`` before the next one is sent, and ``write`` returns its commit
message only after the last one: a task that returns has had every row accepted by a daemon.

A command that fails for want of a daemon (refused, lost, ``E_*PUB_FAILED``) is retried with
backoff for up to ``retryTimeoutMs`` (``retry.py``), so a daemon restart does not fail the
task; any other error, or an outage longer than that, ends the task with an ``LmqSinkError``
naming the topic and daemon, and Spark's task retry (and, for a stream, the restart from the
checkpoint) takes over. Either kind of retry may publish an unanswered MPUB twice:
at-least-once, unless the rows carry dedup ids (``write_partition``'s ``dedup_scope``, on for
streams): then they go as XPUBs, and the topic drops the copies it has already stored.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import WriterCommitMessage

from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError
from lmq_client.lookupd import LookupdNode, lookup_nodes, merge_nodes
from lmq_client.spark.encode import BadRowError, RowEncoder
from lmq_client.spark.errors import LmqSinkError
from lmq_client.spark.frames import NO_BLOCK, Items, items_of
from lmq_client.spark.options import SinkOptions
from lmq_client.spark.pool import PRODUCERS, ProducerPool
from lmq_client.spark.retry import MessageProducer, RetryExhausted, RetryingProducer
from lmq_client.sync import Producer
from lmq_client.transport import PLAIN, TransportOptions
from lmqd.message_ext import decode_ext
from lmqd.protocol.extension import XpubMessage

__all__ = [
    "MAX_PENDING_TOPICS",
    "BatchingPublisher",
    "LmqCommitMessage",
    "MessageProducer",
    "TopicRouter",
    "addresses_for_partition",
    "daemon_addresses",
    "dedup_prefix",
    "summarize",
    "write_partition",
]

log = logging.getLogger("lmq_client.spark")

# An MPUB (or XPUB) body is a 4-byte message count, then each message's item (frames.py).
_MPUB_HEADER = 4


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
    """Gathers rows into MPUBs within the size limits; sends deferred rows one command each.

    ``add`` may publish (whenever a command fills); ``flush`` publishes what is left.
    ``published`` counts rows the daemon answered ``OK`` for. Rows come as Arrow columns and
    go out as slices of one buffer of wire items (``frames.py``): no Python object per row.
    Rows given with extension blocks (``blocks``: headers, priority, TTL, dedup ids) go out as
    XPUBs instead, batched alike (a deferred one alone, as a DPUB would).
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
        self._pending: list[memoryview] = []
        self._pending_count = 0
        self._pending_bytes = _MPUB_HEADER
        self._pending_extension = False

    def add(
        self,
        bodies: Any,
        delays: Sequence[int] | None,
        defer_ms: int,
        blocks: Any | None = None,
    ) -> None:
        """Queue ``bodies`` (a ``binary`` Arrow array; with ``blocks``, one extension block per
        body); each is deferred by its entry in ``delays`` (None: ``defer_ms``)."""
        if delays is None:
            if defer_ms:
                for i in range(len(bodies)):
                    self._deferred(defer_ms, bodies, blocks, i)
            else:
                self._add_now(items_of(bodies, blocks))
            return
        now = [i for i, delay in enumerate(delays) if not delay]
        if len(now) < len(bodies):
            for i, delay in enumerate(delays):
                if delay:
                    self._deferred(delay, bodies, blocks, i)
            if not now:
                return
            rows = pa.array(now, pa.int64())
            bodies = bodies.take(rows)
            blocks = None if blocks is None else blocks.take(rows)
        self._add_now(items_of(bodies, blocks))

    def flush(self) -> None:
        """Publish the partly filled MPUB (or XPUB), if any."""
        count = self._pending_count
        if count:
            self.producer.publish_items(
                self.topic, count, self._pending, extension=self._pending_extension
            )
            self._pending = []
            self._pending_count = 0
            self._pending_bytes = _MPUB_HEADER
            self.mpubs += 1
            self.published += count

    def _add_now(self, items: Items) -> None:
        if items.extension != self._pending_extension:
            self.flush()
            self._pending_extension = items.extension
        i, n = 0, len(items)
        while i < n:
            stop = min(n, i + self.batch_size - self._pending_count)
            budget = self.batch_bytes - self._pending_bytes
            full = self._pending_count + (stop - i) >= self.batch_size
            if items.size(i, stop) > budget:
                # Bytes run out before the count does: take what fits, then send.
                stop = items.fitting(i, stop, budget)
                if stop == i:
                    if self._pending_count:
                        self.flush()
                        continue
                    stop = i + 1  # a message bigger than batchBytes goes alone: the daemon decides
                full = True
            self._pending.append(items.slice(i, stop))
            self._pending_count += stop - i
            self._pending_bytes += items.size(i, stop)
            if full:
                self.flush()
            i = stop

    def _deferred(self, delay_ms: int, bodies: Any, blocks: Any | None, row: int) -> None:
        body = bodies[row].as_py()
        block = NO_BLOCK if blocks is None else blocks[row].as_py()
        if block == NO_BLOCK:
            self.producer.dpub(self.topic, delay_ms / 1000, body)
        else:
            self.producer.xpub(self.topic, [XpubMessage(body, decode_ext(block))],
                               defer_ms=delay_ms)  # fmt: skip
        self.dpubs += 1
        self.published += 1


MAX_PENDING_TOPICS = 64
"""Topics that may hold a partly filled MPUB at once when a ``topic`` column routes rows. A
task buffers at most this many MPUBs (each up to ``batchSize``/``batchBytes``); rows spread over
more topics than this flush every pending MPUB first (smaller MPUBs, bounded memory)."""


class TopicRouter:
    """One ``BatchingPublisher`` per topic over one producer; ``topic`` is the topic of the
    command in progress (for error messages); the counters add up every topic's."""

    def __init__(self, producer: MessageProducer, *, batch_size: int, batch_bytes: int) -> None:
        self.producer = producer
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.topic = ""
        self._publishers: dict[str, BatchingPublisher] = {}
        self._done = {"published": 0, "mpubs": 0, "dpubs": 0}

    def add(
        self,
        topic: str,
        bodies: Any,
        delays: Sequence[int] | None,
        defer_ms: int,
        blocks: Any | None = None,
    ) -> None:
        """Queue ``bodies`` for ``topic`` (as ``BatchingPublisher.add``)."""
        publisher = self._publishers.get(topic)
        if publisher is None:
            if len(self._publishers) >= MAX_PENDING_TOPICS:
                self.flush()
                self._retire()
            publisher = self._publishers[topic] = BatchingPublisher(
                self.producer, topic, batch_size=self.batch_size, batch_bytes=self.batch_bytes
            )
        self.topic = topic
        publisher.add(bodies, delays, defer_ms, blocks)

    def flush(self) -> None:
        """Publish every topic's partly filled MPUB."""
        for topic, publisher in self._publishers.items():
            self.topic = topic
            publisher.flush()

    def _retire(self) -> None:
        for publisher in self._publishers.values():
            self._done["published"] += publisher.published
            self._done["mpubs"] += publisher.mpubs
            self._done["dpubs"] += publisher.dpubs
        self._publishers.clear()

    def _total(self, name: str) -> int:
        live: int = sum(getattr(p, name) for p in self._publishers.values())
        return self._done[name] + live

    @property
    def published(self) -> int:
        return self._total("published")

    @property
    def mpubs(self) -> int:
        return self._total("mpubs")

    @property
    def dpubs(self) -> int:
        return self._total("dpubs")


def _by_topic(topics: list[str]) -> list[tuple[str, list[int]]]:
    """Row indexes per topic, topics in order of first appearance, rows in order."""
    if len(set(topics)) == 1:
        return [(topics[0], list(range(len(topics))))] if topics else []
    groups: dict[str, list[int]] = {}
    for index, topic in enumerate(topics):
        groups.setdefault(topic, []).append(index)
    return list(groups.items())


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
            log.warning("SPARK(%s): lookupd %s: %s", options.topic or "*", lookupd, exc)
            failures.append(f"{lookupd}: {exc}")
    found = [n.tcp_address for n in merge_nodes(answers) if options.topic not in n.tombstoned]
    addresses = list(dict.fromkeys([*options.addresses, *found]))
    if not addresses:
        reason = "; ".join(failures) if failures else "they list no node"
        raise LmqSinkError(
            f"lmq sink: {options.described_topic}: no daemon to publish to from lookupds "
            f"{', '.join(options.lookupd_addresses)} ({reason})",
            topic=options.topic,
            published=0,
        )
    return addresses


ProducerFactory = Callable[[list[str], float], MessageProducer]


def _sync_producer(
    addresses: list[str], timeout: float, transport: TransportOptions = PLAIN
) -> MessageProducer:
    return Producer(addresses, connect_timeout=timeout, response_timeout=timeout,
                    transport=transport)


def write_partition(
    options: SinkOptions,
    batches: Iterable[Any],
    *,
    partition_id: int = 0,
    attempt: int = 0,
    producer_factory: ProducerFactory | None = None,
    pool: ProducerPool | None = None,
    lookup: NodeLookup = _lookup_nodes,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    dedup_scope: str | None = None,
) -> LmqCommitMessage:
    """Publish every row of ``batches`` (pyarrow record batches); the commit message when done.

    With ``dedup_scope`` (the query and batch, or the batch write: ``sink.py``) row ``i``
    of the task gets the dedup id ``<dedup_scope>:<partition_id>:<i>`` (``dedup_prefix``).

    The producer comes from ``pool`` (by default the process's, ``pool.PRODUCERS``, unless a
    ``producer_factory`` is given: then a fresh one, closed at the end) and goes back to it
    when the task succeeds. Raises ``LmqSinkError`` naming the topic (and the daemon, for
    publish failures) on the first failure that retrying (``retry.py``) did not cure; rows
    published before it stay published.
    """
    addresses = addresses_for_partition(daemon_addresses(options, lookup), partition_id)
    if pool is None and producer_factory is None:
        pool = PRODUCERS
    factory = producer_factory or _pooled_factory(options.transport)
    key = (tuple(addresses), options.timeout_s, options.transport)
    if pool is not None:
        producer = pool.take(key, lambda: factory(addresses, options.timeout_s))
    else:
        producer = factory(addresses, options.timeout_s)
    retrying = RetryingProducer(
        producer, retry_timeout_s=options.retry_timeout_s, clock=clock, sleep=sleep
    )
    router = TopicRouter(retrying, batch_size=options.batch_size, batch_bytes=options.batch_bytes)
    encoder = RowEncoder(options)
    prefix = None if dedup_scope is None else dedup_prefix(dedup_scope, partition_id)
    rows = 0
    succeeded = False
    try:
        for batch in batches:
            try:
                bodies, delays = encoder.encode(batch, rows)
                topics = encoder.topics(batch, rows)
                blocks = encoder.blocks(batch, rows, prefix)
            except BadRowError as exc:
                raise LmqSinkError(
                    f"lmq sink: {options.described_topic}: {exc} (partition {partition_id}; "
                    f"{router.published} of this task's rows were published before it)",
                    topic=options.topic,
                    published=router.published,
                ) from None
            rows += len(bodies)
            if topics is None:
                router.add(options.topic, bodies, delays, options.defer_ms, blocks)
                continue
            for topic, indexes in _by_topic(topics):
                if len(indexes) < len(bodies):
                    rows_of_topic = pa.array(indexes, pa.int64())
                    router.add(
                        topic,
                        bodies.take(rows_of_topic),
                        None if delays is None else [delays[i] for i in indexes],
                        options.defer_ms,
                        None if blocks is None else blocks.take(rows_of_topic),
                    )
                else:
                    router.add(topic, bodies, delays, options.defer_ms, blocks)
        router.flush()
        succeeded = True
    except (NSQError, ConnectionFailed, RetryExhausted) as exc:
        raise _publish_error(exc, options, router, producer, addresses, partition_id, attempt
                             ) from None  # fmt: skip
    except LmqSinkError:
        raise
    except LmqClientError as exc:  # a daemon without lmq's extension (nsqd) refused an XPUB
        raise LmqSinkError(
            f"lmq sink: publishing to topic {router.topic!r} failed: {exc}; headers, priority, "
            "TTL and dedup ids need lmqd (publish to nsqd with option dedupIds=false and no "
            f"headers, priority or TTL column) (partition {partition_id}, attempt {attempt})",
            topic=router.topic,
            address=producer.address or "",
            published=router.published,
        ) from None
    finally:
        used = producer.address or ""
        if pool is not None and succeeded:
            pool.give_back(key, producer)
        else:
            producer.close()
    message = LmqCommitMessage(
        partition_id=partition_id,
        attempt=attempt,
        address=used,
        rows=router.published,
        mpubs=router.mpubs,
        dpubs=router.dpubs,
    )
    log.debug("SPARK(%s): partition %d published %d rows to %s (%d retries)",
              options.topic or "*", partition_id, message.rows, used or "-", retrying.retries)
    return message


def dedup_prefix(scope: str, partition_id: int) -> bytes:
    """The dedup ids of partition ``partition_id``'s rows start with this; the row's index in
    the task follows. ``scope`` is short (``sink.query_scope``: 22 characters of query
    id and the batch id), so an id stays far below the extension's 255 bytes."""
    return f"{scope}:{partition_id}:".encode()


def _pooled_factory(transport: TransportOptions) -> ProducerFactory:
    def make(addresses: list[str], timeout: float) -> MessageProducer:
        return _sync_producer(addresses, timeout, transport)

    return make


def _publish_error(
    exc: LmqClientError,
    options: SinkOptions,
    router: TopicRouter,
    producer: MessageProducer,
    addresses: Sequence[str],
    partition_id: int,
    attempt: int,
) -> LmqSinkError:
    """One line naming topic and daemon, what failed, and what was published before."""
    retried = ""
    if isinstance(exc, RetryExhausted):
        retried = f"retried for {exc.retried_s:.3g} s; "
        exc = exc.error
    address = getattr(exc, "address", "") or producer.address or ", ".join(addresses)
    # A connection error names its address first; said once is enough.
    reason = exc.reason if isinstance(exc, ConnectionFailed) and exc.address == address else exc
    published = router.published
    if published:
        done = (f"{published} of this task's rows were published before the failure and are "
                "published again if Spark retries the task")  # fmt: skip
    else:
        done = "no row published"
    return LmqSinkError(
        f"lmq sink: publishing to topic {router.topic!r} on {address} failed: {reason} "
        f"({retried}partition {partition_id}, attempt {attempt}; {done})",
        topic=router.topic,
        address=address,
        published=published,
    )


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
