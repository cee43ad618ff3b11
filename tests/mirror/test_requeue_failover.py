"""Requeued messages survive a promotion: what the primary requeued (REQ, timeouts, a consumer
gone) and keeps in its channel's own stores is delivered by the promoted mirror.

Rules for this module:
- Real processes (``tests.cluster.procs``): a primary and its mirror on 127.0.0.1, ports from
  the OS, data in ``tmp_path``; every wait is bounded; every process is stopped in ``finally``.
- The primary's channel keeps requeues in its stores: ``--durable`` (every requeue written to
  them) or ``--mem-queue-size=4`` (past four, on disk); the consumer is lmq_client's blocking
  ``Consumer``, which FINs, REQs (at once and with a delay) or lets a message time out.
- What decides: a consumer of the promoted node receives every message the primary had not
  finished, and none that it had.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lmq_client.sync import Consumer, Producer
from tests.cluster.procs import Daemon, eventually, http, lmqd
from tests.mirror.test_failover import topic_state

TOPIC = "work"
CHANNEL = "jobs"
MESSAGES = 300


def receive(address: str, wanted: set[bytes], *, within: float) -> list[bytes]:
    """The bodies a consumer of ``CHANNEL`` at ``address`` receives (and finishes) until it has
    every one of ``wanted`` and then nothing more for 3 s, or for ``within`` seconds."""
    received: list[bytes] = []
    with Consumer(TOPIC, CHANNEL, address, max_in_flight=100, max_attempts=0) as consumer:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            message = consumer.get(timeout=3 if set(received) >= wanted else 1)
            if message is None:
                if set(received) >= wanted:
                    break
                continue
            received.append(message.body)
            message.finish()
    return received


@pytest.mark.parametrize(
    "flags", [("--durable",), ("--mem-queue-size=4",)], ids=["durable", "spilled"]
)
def test_requeued_and_timed_out_messages_are_delivered_after_a_promotion(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    primary = lmqd(tmp_path / "p", "--msg-timeout=1s", *flags)
    mirror: Daemon | None = None
    try:
        mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}", *flags)
        published = [b"job-%d" % i for i in range(MESSAGES)]
        with Producer(primary.tcp) as producer:
            producer.mpub(TOPIC, published)
        finished: set[bytes] = set()
        seen = 0
        # (max_attempts=0: the client never gives up on a message, and FINs none by itself)
        with Consumer(TOPIC, CHANNEL, primary.tcp, max_in_flight=20, max_attempts=0) as consumer:
            # Three rounds over what comes: a third finished, the rest requeued at once, after
            # a delay, or left to time out; requeues read back from the stores come again.
            deadline = time.monotonic() + 60
            while seen < 2 * MESSAGES and time.monotonic() < deadline:
                message = consumer.get(timeout=2)
                if message is None:
                    continue
                seen += 1
                match seen % 6:
                    case 0 | 3:
                        message.finish()
                        finished.add(message.body)
                    case 1 | 4:
                        message.requeue(0.0, backoff=False)
                    case 2:
                        message.requeue(0.5, backoff=False)
                    case _:
                        pass  # times out after a second
            # (leaving: what it holds in flight is requeued by the primary)
        assert seen == 2 * MESSAGES
        assert 0 < len(finished) < MESSAGES
        status, stats = http(primary.http, "GET", f"/stats?format=json&topic={TOPIC}")
        channel = stats["topics"][0]["channels"][0]
        assert channel["requeue_count"] > 100 and channel["timeout_count"] > 10, channel
        end = http(primary.http, "GET", f"/topic/offsets?topic={TOPIC}")[1]["end"]
        eventually(lambda: topic_state(mirror.http, TOPIC),
                   lambda t: t is not None and t["end_offset"] >= end, 20)  # fmt: skip
        time.sleep(2.5)  # channel positions are followed at least every second

        primary.process.kill()
        primary.process.wait(10)
        status, summary = http(mirror.http, "POST", "/mirror/promote")
        assert status == 200, summary
        assert summary["missing"] == 0, summary

        wanted = set(published) - finished
        received = receive(mirror.tcp, wanted, within=60)
        assert set(received) - finished == wanted, sorted(wanted - set(received))[:10]
        assert not set(received) & finished, sorted(set(received) & finished)[:10]
    finally:
        for process in (mirror, primary):
            if process is not None:
                process.terminate()
