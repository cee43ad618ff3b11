"""One write task without Spark: batching, DPUB routing, errors, commit messages.

The batching rules run against a recording fake producer; ``write_partition`` then runs against
real lmqd subprocesses (127.0.0.1, port 0; see conftest.py) with real record batches, exactly as
an executor's Python worker would call it.
"""

from __future__ import annotations

import pickle
import re
import socket
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from lmq_client.errors import LmqClientError, MpubFailedError
from lmq_client.spark import LmqCommitMessage, LmqSinkError, SinkOptions
from lmq_client.spark.frames import blocks_of
from lmq_client.spark.publish import (
    BatchingPublisher,
    addresses_for_partition,
    dedup_prefix,
    summarize,
    write_partition,
)
from lmq_client.spark.sink import LmqStreamWriter, query_scope
from lmq_client.sync import Consumer
from lmqd.message_ext import MessageExt
from lmqd.protocol.extension import XpubMessage, encode_xpub
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd

from .conftest import decode_items, receive


class FakeProducer:
    """Records commands; fails the ``fail_at``-th command (1-based) with ``error``."""

    def __init__(self, address: str = "fake:1", *, fail_at: int = 0,
                 error: Exception | None = None) -> None:
        self.connected = address
        self.commands: list[tuple[str, int, list[bytes]]] = []
        self.fail_at = fail_at
        self.error = error
        self.closed = False
        self.xpubs: list[list[XpubMessage]] = []

    @property
    def address(self) -> str | None:
        return None if self.closed else self.connected

    def _record(self, command: tuple[str, int, list[bytes]]) -> None:
        if len(self.commands) + 1 == self.fail_at:
            assert self.error is not None
            raise self.error
        self.commands.append(command)

    def publish_items(
        self, topic: str, count: int, items: Sequence[bytes | memoryview], *, extension: bool
    ) -> None:
        messages = decode_items(count, items, extension=extension)
        if extension:
            self.xpub(topic, messages)
        else:
            assert topic == "t"
            self._record(("MPUB", 0, [m.body for m in messages]))

    def dpub(self, topic: str, delay: float, body: bytes) -> None:
        assert topic == "t"
        self._record(("DPUB", round(delay * 1000), [body]))  # recorded as DPUB's milliseconds

    def xpub(
        self, topic: str, messages: Sequence[XpubMessage], *, defer_ms: int | None = None
    ) -> None:
        assert topic == "t"
        self.xpubs.append(list(messages))
        self._record(("XPUB", defer_ms or 0, [m.body for m in messages]))

    def close(self) -> None:
        self.closed = True


def _bin(bodies: list[bytes]) -> pa.Array:
    return pa.array(bodies, pa.binary())


def _sizes(producer: FakeProducer) -> list[int]:
    return [len(bodies) for _, _, bodies in producer.commands]


def _mpub_body_size(bodies: list[bytes]) -> int:
    return 4 + sum(4 + len(b) for b in bodies)


def test_mpubs_hold_batch_size_messages_across_adds() -> None:
    producer = FakeProducer()
    publisher = BatchingPublisher(producer, "t", batch_size=4, batch_bytes=10**6)
    bodies = [b"%d" % i for i in range(11)]
    publisher.add(_bin(bodies[:3]), None, 0)
    assert producer.commands == []  # nothing full yet
    publisher.add(_bin(bodies[3:10]), None, 0)
    assert _sizes(producer) == [4, 4]
    publisher.add(_bin(bodies[10:]), None, 0)
    publisher.flush()
    publisher.flush()  # nothing left: no empty MPUB
    assert _sizes(producer) == [4, 4, 3]
    assert [b for _, _, batch in producer.commands for b in batch] == bodies
    assert (publisher.published, publisher.mpubs, publisher.dpubs) == (11, 3, 0)


def test_mpubs_stop_at_batch_bytes_exactly() -> None:
    producer = FakeProducer()
    # 4 + 3 * (4 + 10) = 46: three 10-byte bodies fill a 46-byte MPUB body exactly.
    publisher = BatchingPublisher(producer, "t", batch_size=100, batch_bytes=46)
    publisher.add(_bin([b"x" * 10] * 7), None, 0)
    publisher.flush()
    assert _sizes(producer) == [3, 3, 1]
    assert max(_mpub_body_size(bodies) for _, _, bodies in producer.commands) == 46


def test_a_body_bigger_than_batch_bytes_goes_alone() -> None:
    producer = FakeProducer()
    publisher = BatchingPublisher(producer, "t", batch_size=100, batch_bytes=30)
    publisher.add(_bin([b"a", b"B" * 50, b"c", b"d"]), None, 0)
    publisher.flush()
    assert [bodies for _, _, bodies in producer.commands] == [[b"a"], [b"B" * 50], [b"c", b"d"]]


def test_deferred_rows_go_as_dpubs_the_rest_in_mpubs() -> None:
    producer = FakeProducer()
    publisher = BatchingPublisher(producer, "t", batch_size=10, batch_bytes=10**6)
    publisher.add(_bin([b"a", b"b", b"c", b"d"]), [0, 300, 0, 5], 0)
    publisher.flush()
    assert producer.commands == [
        ("DPUB", 300, [b"b"]),
        ("DPUB", 5, [b"d"]),
        ("MPUB", 0, [b"a", b"c"]),
    ]
    assert (publisher.published, publisher.mpubs, publisher.dpubs) == (4, 1, 2)


def test_a_constant_delay_sends_every_row_as_dpub() -> None:
    producer = FakeProducer()
    publisher = BatchingPublisher(producer, "t", batch_size=10, batch_bytes=10**6)
    publisher.add(_bin([b"a", b"b"]), None, 1500)
    publisher.flush()
    assert producer.commands == [("DPUB", 1500, [b"a"]), ("DPUB", 1500, [b"b"])]


def test_partitions_start_at_their_own_daemon() -> None:
    addresses = ["a:1", "b:1", "c:1"]
    assert addresses_for_partition(addresses, 0) == ["a:1", "b:1", "c:1"]
    assert addresses_for_partition(addresses, 4) == ["b:1", "c:1", "a:1"]
    assert addresses_for_partition(addresses, 5) == ["c:1", "a:1", "b:1"]
    assert addresses_for_partition(["a:1"], 7) == ["a:1"]


def _options(**kwargs: object) -> SinkOptions:
    defaults: dict[str, object] = {
        "addresses": ("a:1", "b:1"), "topic": "t", "body_column": "v", "retry_timeout_s": 0.0,
    }
    return SinkOptions(**{**defaults, **kwargs})  # type: ignore[arg-type]


def _batches(*groups: list[str]) -> list[object]:
    return [pa.record_batch([pa.array(group)], names=["v"]) for group in groups]


def test_write_partition_reports_rows_and_closes_the_producer() -> None:
    made: list[tuple[list[str], float, FakeProducer]] = []

    def factory(addresses: list[str], timeout: float) -> FakeProducer:
        made.append((addresses, timeout, FakeProducer(addresses[0])))
        return made[-1][2]

    message = write_partition(
        _options(batch_size=2, timeout_s=3.0), _batches(["a", "b", "c"], ["d"]),
        partition_id=3, attempt=1, producer_factory=factory,
    )
    [(addresses, timeout, producer)] = made
    assert (addresses, timeout) == (["b:1", "a:1"], 3.0)
    assert producer.closed
    assert _sizes(producer) == [2, 2]
    assert message == LmqCommitMessage(
        partition_id=3, attempt=1, address="b:1", rows=4, mpubs=2, dpubs=0
    )
    assert pickle.loads(pickle.dumps(message)) == message  # travels back to the driver


def test_a_publish_failure_names_topic_daemon_and_what_was_published() -> None:
    error = MpubFailedError("E_MPUB_FAILED", "MPUB failed disk full", address="b:1")
    producer = FakeProducer("b:1", fail_at=2, error=error)
    with pytest.raises(LmqSinkError) as info:
        write_partition(_options(batch_size=2), _batches(["a", "b", "c", "d"]), partition_id=1,
                        producer_factory=lambda addresses, timeout: producer)
    assert str(info.value) == (
        "lmq sink: publishing to topic 't' on b:1 failed: E_MPUB_FAILED MPUB failed disk full "
        "(from b:1) (partition 1, attempt 0; 2 of this task's rows were published before the "
        "failure and are published again if Spark retries the task)"
    )
    assert (info.value.topic, info.value.address, info.value.published) == ("t", "b:1", 2)
    assert producer.closed
    copy = pickle.loads(pickle.dumps(info.value))
    assert (str(copy), copy.topic, copy.address, copy.published) == (
        str(info.value), "t", "b:1", 2
    )


def test_a_bad_row_fails_the_task_after_the_rows_before_it() -> None:
    producer = FakeProducer()
    batches = [pa.record_batch([pa.array(group)], names=["v"]) for group in (["a", "b"], ["c", ""])]
    with pytest.raises(LmqSinkError) as info:
        write_partition(_options(batch_size=1), batches,
                        producer_factory=lambda addresses, timeout: producer)
    assert str(info.value) == (
        "lmq sink: topic 't': row 3 has an empty 'v': NSQ accepts no empty message "
        "(partition 0; 2 of this task's rows were published before it)"
    )
    assert _sizes(producer) == [1, 1]


def test_summarize_counts_finished_tasks_per_daemon() -> None:
    messages: list[LmqCommitMessage | None] = [
        LmqCommitMessage(partition_id=0, attempt=0, address="a:1", rows=5, mpubs=1, dpubs=0),
        None,
        LmqCommitMessage(partition_id=2, attempt=0, address="", rows=0, mpubs=0, dpubs=0),
        LmqCommitMessage(partition_id=3, attempt=1, address="a:1", rows=2, mpubs=0, dpubs=2),
    ]
    assert summarize(messages) == (7, 3, {"a:1": 7})


# -- against real daemons --------------------------------------------------------------------


def _closed_port_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_rows_reach_a_real_daemon(daemon: LmqdProcess, topic: str) -> None:
    options = SinkOptions(addresses=(daemon.tcp_address,), topic=topic, body_column="v",
                          batch_size=7)
    rows = [f"row-{i}" for i in range(50)]
    message = write_partition(options, _batches(rows[:20], rows[20:]))
    assert (message.rows, message.mpubs, message.address) == (50, 8, daemon.tcp_address)
    assert receive(daemon.tcp_address, topic, 50) == [r.encode() for r in rows]


def test_a_dead_daemon_is_skipped_for_the_next(daemon: LmqdProcess, topic: str) -> None:
    dead = _closed_port_address()
    options = SinkOptions(addresses=(daemon.tcp_address, dead), topic=topic, body_column="v")
    # Partition 1 starts at the dead daemon and fails over to the live one when connecting.
    message = write_partition(options, _batches(["x", "y"]), partition_id=1)
    assert message.address == daemon.tcp_address
    assert sorted(receive(daemon.tcp_address, topic, 2)) == [b"x", b"y"]


def test_no_daemon_reachable_fails_naming_the_address(topic: str) -> None:
    dead = _closed_port_address()
    options = SinkOptions(addresses=(dead,), topic=topic, body_column="v", timeout_s=5.0,
                          retry_timeout_s=0.5)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(LmqSinkError) as info:
        write_partition(options, _batches(["x"]))
    # refused at once, retried for half a second, not a connect timeout
    assert 0.5 <= time.monotonic() - started < 5.0
    text = str(info.value)
    assert re.fullmatch(
        rf"lmq sink: publishing to topic '{topic}' on {dead} failed: cannot connect \(.*\) "
        r"\(retried for 0\.5\d* s; partition 0, attempt 0; no row published\)",
        text,
    ), text
    assert "\n" not in text


def test_deferred_rows_arrive_after_their_delay(daemon: LmqdProcess, topic: str) -> None:
    options = SinkOptions(addresses=(daemon.tcp_address,), topic=topic, body_column="v",
                          defer_column="wait")
    batch = pa.record_batch([pa.array(["now", "later", "also-now"]), pa.array([0, 600, None])],
                            names=["v", "wait"])
    with Consumer(topic, "check", daemon.tcp_address, max_in_flight=10) as consumer:
        started = time.monotonic()
        message = write_partition(options, [batch])
        assert (message.rows, message.mpubs, message.dpubs) == (3, 1, 1)
        arrivals: dict[bytes, float] = {}
        while len(arrivals) < 3:
            got = consumer.get(10.0)
            assert got is not None, arrivals
            arrivals[got.body] = time.monotonic() - started
            got.finish()
    assert arrivals[b"now"] < 0.6 and arrivals[b"also-now"] < 0.6
    assert arrivals[b"later"] >= 0.6


@pytest.fixture
def small_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LmqdProcess]:
    server = start_lmqd(tmp_path_factory.mktemp("lmqd-small"), ["--max-msg-size=64"])
    try:
        yield server
    finally:
        stop_lmqd(server)


def test_a_rejected_mpub_fails_with_the_daemons_error(
    small_daemon: LmqdProcess, topic: str
) -> None:
    address = small_daemon.tcp_address
    options = SinkOptions(addresses=(address,), topic=topic, body_column="v", batch_size=2)
    with pytest.raises(LmqSinkError) as info:  # not retried: another try cannot cure it
        write_partition(options, _batches(["ok-1", "ok-2", "ok-3", "x" * 65]))
    assert str(info.value) == (
        f"lmq sink: publishing to topic '{topic}' on {address} failed: E_BAD_MESSAGE MPUB "
        f"message too big 65 > 64 (from {address}) (partition 0, attempt 0; 2 of this task's "
        "rows were published before the failure and are published again if Spark retries "
        "the task)"
    )
    assert receive(address, topic, 2) == [b"ok-1", b"ok-2"]


# -- lmq's per-message fields ------------------------------------------------------------------


def test_rows_with_extensions_go_as_xpubs_within_the_byte_limit() -> None:
    producer = FakeProducer()
    exts = [MessageExt(dedup_id=b"id-%d" % i) for i in range(5)]
    bodies = [b"x" * 10 for _ in range(5)]
    one = [XpubMessage(bodies[0], exts[0])]
    # room for exactly two messages: what the XPUB body (after its size) holds for two
    limit = len(encode_xpub("t", one * 2)) - len("XPUB t\n") - 4
    publisher = BatchingPublisher(producer, "t", batch_size=100, batch_bytes=limit)
    publisher.add(_bin(bodies), None, 0, blocks_of(exts))
    publisher.flush()
    assert [(name, len(b)) for name, _, b in producer.commands] == [
        ("XPUB", 2), ("XPUB", 2), ("XPUB", 1)
    ]
    assert [m.ext for batch in producer.xpubs for m in batch] == exts
    assert publisher.published == 5


def test_deferred_rows_with_extensions_are_deferred_xpubs() -> None:
    producer = FakeProducer()
    exts = [MessageExt(dedup_id=b"a"), MessageExt(dedup_id=b"b")]
    publisher = BatchingPublisher(producer, "t", batch_size=100, batch_bytes=10**6)
    publisher.add(_bin([b"now", b"later"]), [0, 250], 0, blocks_of(exts))
    publisher.flush()
    assert producer.commands == [("XPUB", 250, [b"later"]), ("XPUB", 0, [b"now"])]
    assert [m.ext for batch in producer.xpubs for m in batch] == [exts[1], exts[0]]
    assert (publisher.mpubs, publisher.dpubs) == (1, 1)


def test_headers_and_priority_reach_a_consumer(daemon: LmqdProcess, topic: str) -> None:
    options = SinkOptions(addresses=(daemon.tcp_address,), topic=topic, body_column="v",
                          headers_column="headers", priority_column="prio")  # fmt: skip
    batch = pa.record_batch(
        [pa.array(["a", "b"]), pa.array([[("trace", "t-1")], None], pa.map_(pa.string(),
         pa.string())), pa.array([7, None], pa.int8())],
        names=["v", "headers", "prio"],
    )  # fmt: skip
    assert write_partition(options, [batch]).rows == 2
    with Consumer(topic, "check", daemon.tcp_address, max_in_flight=10) as consumer:
        got: dict[bytes, tuple[dict[str, str], int]] = {}
        while len(got) < 2:
            message = consumer.get(10.0)
            assert message is not None, got
            got[message.body] = (message.headers, message.priority)
            message.finish()
    assert got == {b"a": ({"trace": "t-1"}, 7), b"b": ({}, 0)}


def test_a_task_run_again_with_its_dedup_ids_is_stored_once(
    daemon: LmqdProcess, topic: str
) -> None:
    options = SinkOptions(addresses=(daemon.tcp_address,), topic=topic, body_column="v",
                          batch_size=3)  # fmt: skip
    rows = [f"row-{i}" for i in range(10)]
    # the first attempt published 4 rows and failed; the retry publishes all 10 again
    write_partition(options, _batches(rows[:4]), partition_id=1, dedup_scope="Q:5")
    second = write_partition(options, _batches(rows[:6], rows[6:]), partition_id=1,
                             dedup_scope="Q:5")  # fmt: skip
    assert second.rows == 10  # answered OK, the daemon dropped the 4 it had
    # the same rows in another partition, batch or query are other rows
    write_partition(options, _batches(rows[:1]), partition_id=2, dedup_scope="Q:5")
    write_partition(options, _batches(rows[:1]), partition_id=1, dedup_scope="Q:6")
    bodies = receive(daemon.tcp_address, topic, 12)
    assert sorted(bodies) == sorted([r.encode() for r in rows] + [b"row-0", b"row-0"])


def test_query_scope_is_short_and_stable() -> None:
    query = "7bdd9b86-5447-4540-ab24-75b124c38030"
    scope = query_scope(query, "17")
    assert scope == query_scope(query, "17") and scope.endswith(":17")
    assert len(scope.split(":")[0]) == 22  # the UUID's 16 bytes in base64url, unpadded
    # the longest id a task can make stays far below the extension's 255 bytes
    assert len(dedup_prefix(query_scope(query, str(2**63 - 1)), 2**31 - 1)) + 19 < 100


def test_a_stream_task_without_spark_batch_ids_fails_unless_dedup_ids_are_off() -> None:
    options = SinkOptions(addresses=("127.0.0.1:1",), topic="t", body_column="v")
    # outside Spark there is no TaskContext, as in a task Spark runs without the properties
    with pytest.raises(LmqSinkError, match=r"^lmq sink: topic 't': Spark gave this task no "
                       r"query and batch id .* set option dedupIds=false for at-least-once$"):
        LmqStreamWriter(options).write(iter([]))
    off = SinkOptions(addresses=("127.0.0.1:1",), topic="t", body_column="v", dedup_ids=False)
    assert LmqStreamWriter(off).write(iter([])).rows == 0


def test_a_daemon_without_the_extension_fails_the_task_saying_what_to_change() -> None:
    refusal = LmqClientError("b:1 does not support lmq's message extension (headers, priority, "
                             "ttl, dedup_id): it is not lmqd, or an older one")  # fmt: skip
    producer = FakeProducer("b:1", fail_at=1, error=refusal)
    with pytest.raises(LmqSinkError) as info:
        write_partition(_options(), _batches(["x"]), dedup_scope="Q:1",
                        producer_factory=lambda addresses, timeout: producer)  # fmt: skip
    assert str(info.value) == (
        "lmq sink: publishing to topic 't' failed: b:1 does not support lmq's message extension "
        "(headers, priority, ttl, dedup_id): it is not lmqd, or an older one; headers, priority, "
        "TTL and dedup ids need lmqd (publish to nsqd with option dedupIds=false and no headers, "
        "priority or TTL column) (partition 0, attempt 0)"
    )
    assert producer.closed
