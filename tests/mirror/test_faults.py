"""A mirror's faults: ``kill -9`` mid-copy (with and without ``--durable``), a mirror that lags
past the primary's bound (a gap, reported), topic empty and retention while it lags.

Rules for this module:
- Real processes (``tests.cluster.procs``) on 127.0.0.1, ports from the OS, data in
  ``tmp_path``; every wait is ``eventually`` with a bound; every process is stopped in
  ``finally``.
- Logs are compared through the binary ``GET /topic/read`` (``lmq_client.http``): offset, id,
  timestamp and body of every message.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from lmq_client.http import HTTPClient
from lmq_client.sync import Consumer, Producer
from tests.cluster.procs import Daemon, eventually, http, lmqd

TOPIC = "orders"


def log_of(address: str) -> list[tuple[int, bytes, int, bytes]]:
    """(offset, id, timestamp, body) of every message the node stores for the topic."""
    client = HTTPClient(address, timeout=30)
    out: list[tuple[int, bytes, int, bytes]] = []
    offset = 0
    while True:
        messages, following = client.read(TOPIC, offset, 10_000)
        out += [(m.offset, m.id, m.timestamp, m.body) for m in messages]
        if following == offset:
            return out
        offset = following


def topic_state(address: str) -> dict[str, Any]:
    status, doc = http(address, "GET", "/stats?format=json")
    assert status == 200
    topics = doc["mirror"]["topics"]
    return dict(topics[0]) if topics else {"end_offset": 0, "lag_messages": -1}


def publish(address: str, count: int, body: bytes = b"m") -> None:
    with Producer(address) as producer:
        for start in range(0, count, 50_000):
            end = min(count, start + 50_000)
            producer.mpub(TOPIC, [body + b"%d" % i for i in range(start, end)])


@pytest.mark.parametrize("durable", [False, True], ids=["default", "durable"])
def test_a_mirror_killed_mid_copy_resumes_without_duplicates(
    tmp_path: Path, durable: bool
) -> None:
    total = 400_000
    primary = lmqd(tmp_path / "p")
    mirror: Daemon | None = None
    flags = [f"--mirror-of={primary.http}", *(["--durable"] if durable else [])]
    try:
        publish(primary.tcp, total)
        mirror = lmqd(tmp_path / "m", *flags)
        copied = eventually(lambda: topic_state(mirror.http)["end_offset"],  # type: ignore[union-attr]
                            lambda end: end > 0, 30)  # fmt: skip
        mirror.process.send_signal(signal.SIGKILL)
        mirror.terminate()  # (only collects it: it is dead)
        assert copied < total, "the copy ended before the kill: make the backlog longer"
        mirror = lmqd(tmp_path / "m", *flags)
        eventually(lambda: topic_state(mirror.http),  # type: ignore[union-attr]
                   lambda t: t["end_offset"] == total and t["lag_messages"] == 0, 120)
        copy = log_of(mirror.http)
        assert [entry[0] for entry in copy] == list(range(total))  # each offset once, none lost
        assert copy == log_of(primary.http)
        assert topic_state(mirror.http)["gap_messages"] == 0
        mirror.check_stop()
        mirror = None
    finally:
        for process in (mirror, primary):
            if process is not None:
                process.terminate()


def test_a_mirror_lagging_past_the_bound_reports_the_gap(tmp_path: Path) -> None:
    primary = lmqd(tmp_path / "p", "--mirror-max-lag=1000", "--mem-queue-size=100",
                   "--max-bytes-per-file=4096", "--sync-timeout=100ms")
    mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}")
    try:
        publish(primary.tcp, 10)
        eventually(lambda: topic_state(mirror.http)["end_offset"], lambda end: end == 10, 20)
        mirror.check_stop()  # the mirror is down a while: it reads nothing
        publish(primary.tcp, 5000, b"late")
        with Consumer(TOPIC, "c", primary.tcp, max_in_flight=500) as consumer:
            for _ in range(5000):
                message = consumer.get(timeout=10)
                assert message is not None
                message.finish()
        # The primary lets go of what lags past the bound (from 10 to 5010 - 1000), and says so.
        eventually(lambda: http(primary.http, "GET", "/stats?format=json")[1]["mirrors"][0],
                   lambda link: link["released_messages"] == 4000, 20)  # fmt: skip
        time.sleep(1)  # the syncer's rounds delete the segments nobody holds any more
        mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}")
        state = eventually(lambda: topic_state(mirror.http),
                           lambda t: t["end_offset"] == 5010 and t["lag_messages"] == 0, 30)
        assert state["state"] == "gap"
        # The offsets it missed are those the primary had deleted (small segments) or read from
        # memory once the hold let them go: every one is either copied or counted.
        assert 3000 < state["gap_messages"] <= 4000
        assert state["gap_messages"] + len(log_of(mirror.http)) == 5010
        assert state["skipped_messages"] == 0
        assert any("GAP" in line for line in mirror.output_lines())
        assert any("releasing what it has not copied" in line for line in primary.output_lines())
        _, text = http(mirror.http, "GET", "/metrics")
        assert 'lmqd_mirror_gap_messages_total{topic="orders"}' in text
        assert 'lmqd_mirror_state{state="gap",topic="orders"} 1.0' in text
    finally:
        mirror.terminate()
        primary.terminate()


def test_empty_and_retention_while_the_mirror_lags_lose_nothing(tmp_path: Path) -> None:
    primary = lmqd(tmp_path / "p", "--mem-queue-size=100", "--max-bytes-per-file=4096",
                   "--sync-timeout=100ms")
    mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}")
    try:
        publish(primary.tcp, 10)
        eventually(lambda: topic_state(mirror.http)["end_offset"], lambda end: end == 10, 20)
        assert http(primary.http, "POST", f"/channel/create?topic={TOPIC}&channel=c")[0] == 200
        http(primary.http, "POST", f"/topic/policy?topic={TOPIC}", b'{"retention_ms": 1}')
        time.sleep(1.5)  # the channel is followed
        mirror.check_stop()  # the mirror is down a while: it reads nothing
        http(primary.http, "POST", f"/topic/pause?topic={TOPIC}")
        publish(primary.tcp, 300, b"emptied")
        assert http(primary.http, "POST", f"/topic/empty?topic={TOPIC}")[0] == 200
        http(primary.http, "POST", f"/topic/unpause?topic={TOPIC}")
        publish(primary.tcp, 300, b"kept")
        with Consumer(TOPIC, "c", primary.tcp, max_in_flight=300) as consumer:
            for _ in range(310):
                message = consumer.get(timeout=10)
                assert message is not None and not message.body.startswith(b"emptied")
                message.finish()
        time.sleep(1.5)  # retention's and the syncer's rounds: segments go if they may
        mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}")
        state = eventually(lambda: topic_state(mirror.http),
                           lambda t: t["end_offset"] == 610 and t["lag_messages"] == 0, 30)
        # Nothing the primary accepted is missing from the copy: its hold kept it all.
        assert state["gap_messages"] == 0 and state["state"] == "following"
        assert [entry[0] for entry in log_of(mirror.http)] == list(range(610))
        # Promoted, the copy does not deliver what the primary emptied or finished.
        time.sleep(2)
        assert http(mirror.http, "POST", "/mirror/promote")[0] == 200
        with Producer(mirror.tcp) as producer:
            producer.publish(TOPIC, b"after")
        with Consumer(TOPIC, "c", mirror.tcp) as consumer:
            message = consumer.get(timeout=10)
            assert message is not None and message.body == b"after"
            message.finish()
            assert consumer.get(timeout=1) is None
    finally:
        mirror.terminate()
        primary.terminate()
