"""The blocking client (``lmq_client.sync``) against a real lmqd subprocess.

Rules for this module: plain (non-trio) tests, since the client blocks; the daemon is the
``lmqd_server`` fixture from tests/conftest.py (127.0.0.1, port 0, data in tmp_path); socket
timeouts of a few seconds bound every call.
"""

from __future__ import annotations

import json
import pickle
import socket
import threading
import time
import urllib.request

import pytest

from lmq_client import errors
from lmq_client.backoff import Backoff
from lmq_client.message import Message
from lmq_client.sync import Consumer, Producer
from tests.support.process import LmqdProcess


def _depth(server: LmqdProcess, topic: str) -> int:
    url = f"http://{server.http_address}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as response:
        data = json.load(response)
    return sum(c["depth"] for t in data["topics"] or [] for c in t["channels"]) or sum(
        t["depth"] for t in data["topics"] or []
    )


def test_publish_mpub_dpub_then_consume(lmqd_server: LmqdProcess) -> None:
    with Producer(lmqd_server.tcp_address, connect_timeout=5) as producer:
        producer.publish("s", b"one")
        producer.mpub("s", [b"two", b"three"])
        producer.dpub("s", 0.05, b"four")
        assert producer.address == lmqd_server.tcp_address
    assert _depth(lmqd_server, "s") == 4  # no channel yet: the topic holds all four
    with Consumer(
        "s", "c", lmqd_server.tcp_address, max_in_flight=10, connect_timeout=5
    ) as consumer:
        bodies: list[bytes] = []
        while len(bodies) < 4:
            message = consumer.get(timeout=5)
            assert message is not None
            bodies.append(message.body)
            if message.body == b"two" and message.attempts == 1:
                message.requeue(0)  # delivered again, attempts 2
                bodies.pop()
                continue
            message.finish()
    assert sorted(bodies) == [b"four", b"one", b"three", b"two"]


def test_errors_carry_codes_and_connection_recovers(lmqd_server: LmqdProcess) -> None:
    producer = Producer(lmqd_server.tcp_address, connect_timeout=5)
    with pytest.raises(errors.BadMessageError) as info:
        producer.publish("s", b"")
    assert info.value.code == "E_BAD_MESSAGE"
    with pytest.raises(errors.InvalidError) as info2:
        producer.dpub("s", 10_000.0, b"x")
    assert info2.value.code == "E_INVALID"
    with pytest.raises(errors.InvalidNameError):
        producer.mpub("no spaces", [b"x"])
    producer.mpub("s", [b"ok"])  # reconnected after the fatal errors
    producer.close()


def test_unreachable_daemon_names_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    address = f"127.0.0.1:{port}"
    with pytest.raises(ConnectionError) as info:
        Producer(address, connect_timeout=2).publish("t", b"x")
    assert isinstance(info.value, errors.ConnectionFailed)
    assert address in str(info.value)


def test_failover_to_second_address(lmqd_server: LmqdProcess) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    producer = Producer([dead, lmqd_server.tcp_address], connect_timeout=2)
    producer.publish("f", b"x")
    assert producer.address == lmqd_server.tcp_address
    # picklable for Spark (no socket inside), and usable after unpickling
    clone = pickle.loads(pickle.dumps(producer))
    clone.publish("f", b"y")
    clone.close()
    producer.close()


def test_idle_producer_survives_heartbeat_timeout(lmqd_server: LmqdProcess) -> None:
    """Idle past two heartbeat intervals: the daemon drops the connection; publish reconnects."""
    producer = Producer(lmqd_server.tcp_address, connect_timeout=5, heartbeat_interval=1.0)
    producer.publish("idle", b"first")
    time.sleep(2.6)  # 2 missed heartbeat answers (1 s each) and a little
    producer.publish("idle", b"second")  # must not fail on the dead socket
    producer.close()
    assert _depth(lmqd_server, "idle") == 2


def test_heartbeat_answered_while_waiting(lmqd_server: LmqdProcess) -> None:
    """A consumer that waits in get() for 2.5 s with 1 s heartbeats stays connected."""
    with Consumer("hb", "c", lmqd_server.tcp_address, heartbeat_interval=1.0) as consumer:
        assert consumer.get(timeout=2.5) is None
        with Producer(lmqd_server.tcp_address) as producer:
            producer.publish("hb", b"still here")
        message = consumer.get(timeout=5)
        assert message is not None and message.body == b"still here"
        message.finish()


def test_requeue_backs_off_then_probes(lmqd_server: LmqdProcess) -> None:
    """A requeue with backoff sets RDY 0 for the backoff delay, then RDY 1 on one daemon; a
    success ends the backoff and the full RDY comes back (the async consumer's rules)."""
    backoff = Backoff(base=0.5, max_delay=0.5, jitter=0.0)
    with Producer(lmqd_server.tcp_address, connect_timeout=5) as producer:
        producer.mpub("bo", [b"a", b"b"])
    with Consumer(
        "bo", "c", lmqd_server.tcp_address, max_in_flight=5, connect_timeout=5, backoff=backoff
    ) as consumer:
        address = lmqd_server.tcp_address
        first = consumer.get(timeout=5)
        assert first is not None and consumer.rdy_counts() == {address: 5}
        failed_at = time.monotonic()
        first.requeue(0)  # back in the queue at once, but the consumer pauses
        assert consumer.rdy_counts() == {address: 0}
        assert consumer.statistics().backoff_level == 1
        # "b" was already in flight when the backoff began: still handed out, not counted
        second = consumer.get(timeout=5)
        assert second is not None and second.body == b"b"
        second.finish()
        assert consumer.statistics().backoff_level == 1
        again = consumer.get(timeout=5)
        assert again is not None and (again.body, again.attempts) == (b"a", 2)
        assert time.monotonic() - failed_at >= 0.5
        assert consumer.rdy_counts() == {address: 1}  # the probe
        again.finish()
        assert consumer.rdy_counts() == {address: 5}
        stats = consumer.statistics()
    assert (stats.received, stats.finished, stats.requeued, stats.backoff_level) == (3, 2, 1, 0)


def test_run_gives_up_after_max_attempts(lmqd_server: LmqdProcess) -> None:
    """``run(handler)``: a raising handler requeues (``requeue_delay * attempts``) and backs
    off; after ``max_attempts`` deliveries ``on_give_up`` sees the message, then it is
    finished."""
    address = lmqd_server.tcp_address
    with Producer(address, connect_timeout=5) as producer:
        producer.publish("poison", b"bad")
        producer.publish("poison", b"good")
    attempts: list[tuple[bytes, int]] = []
    gave_up: list[tuple[bytes, int]] = []

    def give_up(message: Message) -> None:
        gave_up.append((message.body, message.attempts))
        with Producer(address, connect_timeout=5) as producer:
            producer.publish("poison", b"last")  # the handler stops at this one

    consumer = Consumer(
        "poison", "c", address, connect_timeout=5, max_attempts=2, on_give_up=give_up,
        requeue_delay=0.05, backoff=Backoff(base=0.05, max_delay=0.1, jitter=0.0),
    )

    def handler(message: Message) -> None:
        attempts.append((message.body, message.attempts))
        if message.body == b"bad":
            raise ValueError("cannot handle it")
        if message.body == b"last":
            consumer.close()

    # run() blocks until close(): in a thread, so the test is bounded by the join
    worker = threading.Thread(target=consumer.run, args=(handler,), daemon=True)
    worker.start()
    worker.join(timeout=10)
    alive = worker.is_alive()
    if alive:
        consumer.close()
    assert not alive, f"run() did not end; attempts so far {attempts}"
    assert [a for body, a in attempts if body == b"bad"] == [1, 2]
    assert gave_up == [(b"bad", 3)]
    assert [body for body, _ in attempts if body != b"bad"] == [b"good", b"last"]
    stats = consumer.statistics()
    assert (stats.given_up, stats.requeued, stats.finished) == (1, 2, 3)


def test_blocking_clients_publish_and_consume_lmq_fields(lmqd_server: LmqdProcess) -> None:
    address = lmqd_server.tcp_address
    with Producer(address, connect_timeout=5) as producer:
        producer.publish("fields", b"a", headers={"k": "v"}, priority=3, ttl=30.0)
        producer.mpub("fields", [b"b", b"c"], priority=2, dedup_ids=[b"1", b"2"])
        producer.dpub("fields", 0.01, b"d", headers={"late": "yes"})
        producer.publish("fields", b"e")
        with pytest.raises(ValueError, match="ttl"):
            producer.publish("fields", b"x", ttl=0)
    got = {}
    with Consumer("fields", "c", address, max_in_flight=10, connect_timeout=5) as consumer:
        for _ in range(5):
            m = consumer.get(timeout=5)
            assert m is not None
            got[m.body] = (m.headers, m.priority)
            m.finish()
    assert got == {
        b"a": ({"k": "v"}, 3), b"b": ({}, 2), b"c": ({}, 2), b"d": ({"late": "yes"}, 0),
        b"e": ({}, 0),
    }  # fmt: skip


def test_dpub_takes_seconds_and_the_old_milliseconds_still_work_with_a_warning() -> None:
    """The delay on the wire (DPUB's milliseconds) for each spelling, read by lmqd's own
    parser in a one-connection fake daemon on 127.0.0.1."""
    from lmqd.protocol import Dpub, Identify, Limits, ServerConnection, encode_response

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    delays: list[int] = []

    def daemon() -> None:
        conn, _ = listener.accept()
        conn.settimeout(5)
        codec = ServerConnection(Limits(snappy_available=False, deflate_available=False))
        with conn:
            while data := conn.recv(65536):
                codec.receive_data(data)
                for event in codec.next_events():
                    if isinstance(event, Identify):
                        conn.sendall(encode_response(b'{"max_rdy_count": 2500}'))
                    elif isinstance(event, Dpub):
                        delays.append(event.defer_ms)
                        conn.sendall(encode_response(b"OK"))

    thread = threading.Thread(target=daemon, daemon=True)
    thread.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    with Producer(address, connect_timeout=5, response_timeout=5) as producer:
        producer.dpub("s", 1.5, b"a")
        producer.dpub("s", delay=0.25, body=b"b")
        producer.dpub("s", 0, b"c")
        with pytest.warns(DeprecationWarning, match="an int delay is read as milliseconds"):
            producer.dpub("s", 1500, b"d")
        with pytest.warns(DeprecationWarning, match="delay_ms"):
            producer.dpub("s", delay_ms=40, body=b"e")
    thread.join(5)
    listener.close()
    assert delays == [1500, 250, 0, 1500, 40]
