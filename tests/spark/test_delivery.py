"""The sink's delivery without Spark: retry with backoff, rows routed by a ``topic`` column, and
producers pooled between the tasks of one process.

Rules for this module: retry schedules run on a fake clock (``FakeClock``: ``sleep`` advances
it) and assert exact times; ``write_partition`` runs as an executor's Python worker calls it,
against scripted fake producers or real lmqd subprocesses (127.0.0.1, port 0, or the port a
restarted daemon had), with every wait bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from lmq_client.errors import (
    BadTopicError,
    ConnectionFailed,
    LmqClientError,
    MpubFailedError,
)
from lmq_client.http import HTTPClient
from lmq_client.spark import LmqSinkError, SinkOptions
from lmq_client.spark.pool import ProducerPool
from lmq_client.spark.publish import MAX_PENDING_TOPICS, write_partition
from lmq_client.spark.retry import RetryExhausted, RetryingProducer
from lmqd.protocol.extension import XpubMessage
from tests.support.process import LmqdProcess

from .conftest import decode_items, mpub_item, receive, restart_later


class FakeClock:
    """``clock()`` and ``sleep(s)`` for the retry schedule: sleeping moves time on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedProducer:
    """Fails its commands with ``errors`` in turn (None: succeed), then succeeds; records
    ``(time, command, topic, bodies)`` of every attempt."""

    def __init__(self, clock: FakeClock | None = None, errors: Sequence[Exception | None] = (),
                 address: str = "d:1") -> None:  # fmt: skip
        self.clock = clock or FakeClock()
        self.errors = list(errors)
        self.attempts: list[tuple[float, str, str, list[bytes]]] = []
        self.connected = address
        self.closed = False

    @property
    def address(self) -> str | None:
        return None if self.closed else self.connected

    def _attempt(self, command: str, topic: str, bodies: list[bytes]) -> None:
        self.attempts.append((self.clock.now, command, topic, bodies))
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error

    def publish_items(
        self, topic: str, count: int, items: Sequence[bytes | memoryview], *, extension: bool
    ) -> None:
        messages = decode_items(count, items, extension=extension)
        self._attempt("XPUB" if extension else "MPUB", topic, [m.body for m in messages])

    def dpub(self, topic: str, delay: float, body: bytes) -> None:
        self._attempt("DPUB", topic, [body])

    def xpub(
        self, topic: str, messages: Sequence[XpubMessage], *, defer_ms: int | None = None
    ) -> None:
        self._attempt("XPUB", topic, [m.body for m in messages])

    def close(self) -> None:
        self.closed = True

    def published(self) -> list[tuple[str, str, list[bytes]]]:
        """The attempts that succeeded (every attempt but the failed ones)."""
        return [a[1:] for a in self.attempts]


def _mpub(producer: RetryingProducer, body: bytes) -> None:
    producer.publish_items("t", 1, [mpub_item(body)], extension=False)


REFUSED = ConnectionFailed("d:1", "cannot connect (Connection refused)")


def test_a_publish_is_retried_with_backoff_until_the_daemon_is_back() -> None:
    clock = FakeClock()
    producer = ScriptedProducer(clock, [REFUSED, REFUSED, REFUSED])
    retrying = RetryingProducer(producer, retry_timeout_s=30, clock=clock, sleep=clock.sleep)
    _mpub(retrying, b"a")
    assert [(at, command) for at, command, _, _ in producer.attempts] == [
        (0.0, "MPUB"), (0.1, "MPUB"), (pytest.approx(0.3), "MPUB"), (pytest.approx(0.7), "MPUB"),
    ]  # fmt: skip
    assert clock.sleeps == [0.1, 0.2, 0.4]
    assert retrying.retries == 3


def test_an_outage_longer_than_the_timeout_fails_at_the_deadline() -> None:
    clock = FakeClock()
    producer = ScriptedProducer(clock, [REFUSED] * 100)
    retrying = RetryingProducer(producer, retry_timeout_s=3, clock=clock, sleep=clock.sleep)
    with pytest.raises(RetryExhausted) as info:
        retrying.dpub("t", 0.005, b"a")
    # 0.1 + 0.2 + 0.4 + 0.8 = 1.5; the next wait (1.6) is cut to the deadline, then one last try
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.5])
    assert producer.attempts[-1][0] == pytest.approx(3.0)
    assert (info.value.error, info.value.attempts) == (REFUSED, 6)
    assert info.value.retried_s == pytest.approx(3.0)


def test_a_success_gives_the_next_outage_the_whole_timeout() -> None:
    clock = FakeClock()
    producer = ScriptedProducer(clock, [REFUSED, REFUSED, None, REFUSED, None])
    retrying = RetryingProducer(producer, retry_timeout_s=0.25, clock=clock, sleep=clock.sleep)
    _mpub(retrying, b"a")  # fails at 0 and 0.1, succeeds at 0.25 (the deadline)
    clock.now = 100.0
    _mpub(retrying, b"b")  # a new outage: 0.1 s after its own first failure
    assert [at for at, *_ in producer.attempts] == pytest.approx([0, 0.1, 0.25, 100, 100.1])


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (MpubFailedError("E_MPUB_FAILED", "MPUB failed exiting", address="d:1"), True),
        (ConnectionFailed("d:1", "connection lost (EOF)"), True),
        (BadTopicError("E_BAD_TOPIC", "MPUB topic name 'x y' is not valid", address="d:1"),
         False),
    ],
)
def test_only_errors_another_attempt_may_cure_are_retried(
    error: LmqClientError, retried: bool
) -> None:
    clock = FakeClock()
    producer = ScriptedProducer(clock, [error])
    retrying = RetryingProducer(producer, retry_timeout_s=30, clock=clock, sleep=clock.sleep)
    if retried:
        _mpub(retrying, b"a")
        assert clock.sleeps == [0.1]
    else:
        with pytest.raises(type(error)):
            _mpub(retrying, b"a")
        assert clock.sleeps == []
    never = RetryingProducer(ScriptedProducer(clock, [error]), retry_timeout_s=0,
                             clock=clock, sleep=clock.sleep)  # fmt: skip
    with pytest.raises(type(error)):
        _mpub(never, b"a")


def _options(**kwargs: Any) -> SinkOptions:
    defaults: dict[str, Any] = {"addresses": ("d:1",), "topic": "t", "body_column": "v"}
    return SinkOptions(**{**defaults, **kwargs})


def test_a_task_whose_daemon_stays_away_fails_with_one_line_naming_it() -> None:
    clock = FakeClock()
    producer = ScriptedProducer(clock, [None] + [REFUSED] * 100)
    batches = [pa.RecordBatch.from_pydict({"v": ["a", "b", "c"]})]
    with pytest.raises(LmqSinkError) as info:
        write_partition(_options(batch_size=2, retry_timeout_s=10.0), batches, partition_id=3,
                        producer_factory=lambda addresses, timeout: producer,
                        clock=clock, sleep=clock.sleep)  # fmt: skip
    assert str(info.value) == (
        "lmq sink: publishing to topic 't' on d:1 failed: cannot connect (Connection refused) "
        "(retried for 10 s; partition 3, attempt 0; 2 of this task's rows were published "
        "before the failure and are published again if Spark retries the task)"
    )
    assert (info.value.address, info.value.published) == ("d:1", 2)


def test_rows_follow_their_topic_column_in_mpubs_per_topic() -> None:
    producer = ScriptedProducer()
    options = _options(topic="", body_column="value", topic_column="topic", batch_size=2)
    batches = [
        pa.RecordBatch.from_pydict({"topic": ["a", "b", "a", "a"], "value": ["1", "2", "3", "4"]}),
        pa.RecordBatch.from_pydict({"topic": ["b", "c"], "value": ["5", "6"]}),
    ]
    message = write_partition(options, batches,
                              producer_factory=lambda addresses, timeout: producer)  # fmt: skip
    assert producer.published() == [
        ("MPUB", "a", [b"1", b"3"]),
        ("MPUB", "b", [b"2", b"5"]),
        ("MPUB", "a", [b"4"]),
        ("MPUB", "c", [b"6"]),
    ]
    assert (message.rows, message.mpubs) == (6, 4)


def test_json_rows_routed_by_topic_leave_the_topic_out() -> None:
    producer = ScriptedProducer()
    options = _options(topic="", body_column=None, topic_column="topic")
    batch = pa.RecordBatch.from_pydict({"topic": ["a"], "n": [1]})
    write_partition(options, [batch], producer_factory=lambda addresses, timeout: producer)
    assert producer.published() == [("MPUB", "a", [b'{"n":1}'])]


@pytest.mark.parametrize(
    ("topics", "message"),
    [
        (["ok", "bad name"], "lmq sink: topics from column 'topic': row 1: invalid topic name "
                             "'bad name': 1-64 characters of [.a-zA-Z0-9_-], optionally ending "
                             "in #ephemeral (partition 0; 0 of this task's rows were published "
                             "before it)"),
        (["ok", None], "lmq sink: topics from column 'topic': row 1 has a null 'topic': it "
                       "routes the row to a topic (partition 0; 0 of this task's rows were "
                       "published before it)"),
    ],
)
def test_a_row_with_an_unusable_topic_fails_the_task_naming_it(
    topics: list[str | None], message: str
) -> None:
    producer = ScriptedProducer()
    options = _options(topic="", topic_column="topic")
    batch = pa.RecordBatch.from_pydict({"topic": topics, "v": ["x", "y"]})
    with pytest.raises(LmqSinkError) as info:
        write_partition(options, [batch], producer_factory=lambda addresses, timeout: producer)
    assert str(info.value) == message
    assert producer.attempts == []


def test_rows_over_many_topics_flush_before_the_pending_bound() -> None:
    producer = ScriptedProducer()
    options = _options(topic="", topic_column="topic")
    names = [f"t{i}" for i in range(MAX_PENDING_TOPICS + 1)]
    batch = pa.RecordBatch.from_pydict({"topic": names, "v": names})
    message = write_partition(options, [batch],
                              producer_factory=lambda addresses, timeout: producer)  # fmt: skip
    sent = producer.published()
    # the 65th topic flushed the 64 pending MPUBs first, then went out at the end
    assert [topic for _, topic, _ in sent] == names
    assert (message.rows, message.mpubs) == (len(names), len(names))


def test_a_pool_hands_a_producer_to_the_next_task_and_drops_a_failed_one() -> None:
    made: list[ScriptedProducer] = []

    def factory(addresses: list[str], timeout: float) -> ScriptedProducer:
        made.append(ScriptedProducer(address=addresses[0]))
        return made[-1]

    pool = ProducerPool()
    options = _options(addresses=("d:1", "d:2"), retry_timeout_s=0.0)
    batches = [pa.RecordBatch.from_pydict({"v": ["x"]})]
    for _ in range(3):
        write_partition(options, batches, producer_factory=factory, pool=pool)
    assert len(made) == 1 and not made[0].closed and pool.idle_count() == 1
    # another partition starts at the other daemon: another key, another producer
    write_partition(options, batches, partition_id=1, producer_factory=factory, pool=pool)
    assert [p.connected for p in made] == ["d:1", "d:2"]
    # a task that failed closes its producer rather than giving it back
    made[0].errors = [REFUSED]
    with pytest.raises(LmqSinkError):
        write_partition(options, batches, producer_factory=factory, pool=pool)
    assert made[0].closed and pool.idle_count() == 1
    write_partition(options, batches, producer_factory=factory, pool=pool)
    assert len(made) == 3
    pool.close_all()
    assert all(p.closed for p in made) and pool.idle_count() == 0


def test_a_forked_process_forgets_its_parents_producers(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = ProducerPool()
    parents = ScriptedProducer()
    pool.give_back("k", parents)
    monkeypatch.setattr("os.getpid", lambda: -7)  # what a forked worker sees
    fresh = ScriptedProducer()
    assert pool.take("k", lambda: fresh) is fresh
    pool.close_all()
    assert not parents.closed  # the parent's socket: not ours to close


# -- against real daemons --------------------------------------------------------------------


def _producers(daemon: LmqdProcess, topic: str) -> list[Any]:
    """The connections that published to ``topic`` (the daemon is shared with other tests,
    whose pooled producers may still be connected)."""
    assert daemon.http_address is not None
    stats = HTTPClient(daemon.http_address).stats(include_clients=True)
    return [p for p in stats.get("producers") or []
            if any(c["topic"] == topic for c in p.get("pub_counts") or [])]


def test_tasks_of_one_process_reuse_one_connection(daemon: LmqdProcess, topic: str) -> None:
    pool = ProducerPool()
    options = _options(addresses=(daemon.tcp_address,), topic=topic)
    try:
        for i in range(3):
            write_partition(options, [pa.RecordBatch.from_pydict({"v": [f"m{i}"]})], pool=pool)
        producers = _producers(daemon, topic)
        assert len(producers) == 1, producers
        assert sorted(receive(daemon.tcp_address, topic, 3)) == [b"m0", b"m1", b"m2"]
    finally:
        pool.close_all()


def test_a_task_rides_out_a_daemon_restart(restartable: list[LmqdProcess], topic: str) -> None:
    address = restartable[0].tcp_address
    options = _options(addresses=(address,), topic=topic, batch_size=10, retry_timeout_s=20.0)
    threads: list[threading.Thread] = []

    def batches() -> Iterator[Any]:
        yield pa.RecordBatch.from_pydict({"v": [f"before-{i}" for i in range(10)]})
        threads.append(restart_later(restartable, 1.0))
        yield pa.RecordBatch.from_pydict({"v": [f"after-{i}" for i in range(10)]})

    pool = ProducerPool()
    started = time.monotonic()
    try:
        message = write_partition(options, batches(), pool=pool)
    finally:
        pool.close_all()
    assert 1.0 <= time.monotonic() - started < 20.0
    threads[0].join(30)
    assert message.rows == 20
    # the daemon flushed the first MPUB to disk at SIGTERM: every row, at least once
    bodies = set(receive(address, topic, 20))
    assert bodies == {f"{w}-{i}".encode() for w in ("before", "after") for i in range(10)}
