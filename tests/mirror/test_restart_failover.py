"""What a primary's channel kept in its stores across a restart of the primary is delivered by
the promoted mirror: the stores carry the topic offsets of what they hold, so the restarted
primary tells its mirror those by offset, and a promotion never looks for them by id.

Rules for this module:
- Real processes (``tests.cluster.procs``): a primary and its mirror on 127.0.0.1, ports from
  the OS (the restarted primary takes its HTTP port again, where the mirror looks), data in
  ``tmp_path``; every wait is bounded; every process is stopped in ``finally``.
- The primary's channel keeps requeued and deferred messages in its stores: ``--durable`` (all
  written to them; a ``kill -9`` keeps them) or ``--mem-queue-size=4`` (past four, and at a
  SIGTERM everything); the consumer is lmq_client's blocking ``Consumer``.
- What decides: after the restart the mirror counts no untracked message, and a consumer of the
  promoted node receives exactly what the restarted primary held unfinished (``/peek``): after
  a SIGTERM every message the consumer did not finish, and none that it did.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lmq_client.sync import Consumer, Producer
from tests.cluster.procs import Daemon, eventually, http, lmqd
from tests.mirror.test_failover import topic_state
from tests.mirror.test_requeue_failover import CHANNEL, TOPIC, receive

MESSAGES = 120
DELAY_S = 4.0
"""The delay of the deferred requeues: still deferred at the restart, due soon after a
promotion."""


def unfinished(address: str) -> set[bytes]:
    """The bodies of what the channel holds unfinished (``/peek``: ready, deferred, in
    flight)."""
    bodies: set[bytes] = set()
    for state in ("queued", "deferred", "in_flight"):
        status, doc = http(address, "GET", f"/peek?topic={TOPIC}&channel={CHANNEL}"
                                           f"&state={state}&n=1000")  # fmt: skip
        assert status == 200, doc
        bodies |= {m["body"].encode() for m in doc["messages"]}
    return bodies


@pytest.mark.parametrize(
    ("flags", "restart"),
    [(("--durable",), "sigterm"), (("--durable",), "kill"), (("--mem-queue-size=4",), "sigterm")],
    ids=["durable-sigterm", "durable-kill", "spilled-sigterm"],
)
def test_stored_unfinished_messages_survive_a_restart_then_a_promotion(
    tmp_path: Path, flags: tuple[str, ...], restart: str
) -> None:
    primary = lmqd(tmp_path / "p", *flags)
    mirror: Daemon | None = None
    try:
        mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}", *flags)
        published = [b"job-%d" % i for i in range(MESSAGES)]
        with Producer(primary.tcp) as producer:
            producer.mpub(TOPIC, published)
        finished: set[bytes] = set()
        seen: set[bytes] = set()
        # A third finished, a third requeued at once (deferred when it comes back), a third
        # deferred; the consumer leaves once it has seen every message (what it holds in
        # flight is requeued by the primary).
        with Consumer(TOPIC, CHANNEL, primary.tcp, max_in_flight=20, max_attempts=0) as consumer:
            deadline = time.monotonic() + 60
            while len(seen) < MESSAGES and time.monotonic() < deadline:
                message = consumer.get(timeout=2)
                if message is None:
                    continue
                again = message.body in seen
                seen.add(message.body)
                match int(message.body.split(b"-")[1]) % 3:
                    case 0:
                        message.finish()
                        finished.add(message.body)
                    case 1 if not again:
                        message.requeue(0.0, backoff=False)
                    case _:
                        message.requeue(DELAY_S, backoff=False)
        assert len(seen) == MESSAGES and len(finished) == MESSAGES // 3
        time.sleep(2.5)  # channel positions are followed at least every second

        port = primary.http_port
        if restart == "kill":
            primary.process.kill()
            primary.terminate()  # (only collects it: it is dead)
        else:
            assert primary.stop() == 0
        primary = lmqd(tmp_path / "p", f"--http-address=127.0.0.1:{port}", *flags)
        eventually(lambda: http(mirror.http, "GET", "/stats?format=json")[1]["mirror"],
                   lambda m: m["state"] == "following", 30)  # fmt: skip
        time.sleep(2.5)  # the restarted primary's channels, followed at least every second
        pending = unfinished(primary.http)
        assert pending >= set(published) - finished  # the primary lost nothing it held
        if restart == "sigterm":
            assert pending == set(published) - finished
        # (after a kill -9, the primary delivers again what it finished since it last wrote
        # its channel's position: at least once, as any --durable node)
        # The restarted primary told its mirror every stored message by offset.
        assert topic_state(mirror.http, TOPIC)["untracked_messages"] == 0  # type: ignore[index]

        primary.process.kill()
        primary.terminate()
        status, summary = http(mirror.http, "POST", "/mirror/promote")
        assert status == 200, summary
        assert summary["missing"] == 0 and summary["untracked"] == 0, summary

        received = receive(mirror.tcp, pending, within=DELAY_S + 30)
        # Exactly what the restarted primary held unfinished.
        assert set(received) == pending, sorted(pending ^ set(received))[:10]
    finally:
        for process in (mirror, primary):
            if process is not None:
                process.terminate()
