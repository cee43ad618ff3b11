"""``--min-insync-mirrors``: nothing a producer was told ``OK`` for is lost when the primary is
killed with ``kill -9`` and its mirror promoted.

Rules for this module:
- Real processes (``tests.cluster.procs``): a primary and its mirror on 127.0.0.1, ports from
  the OS, data in ``tmp_path``; every wait is bounded; every process is stopped in ``finally``.
- The producer is a raw V2 socket that pipelines ``PUB``s (a window of them in flight, as a
  busy producer does): its ``OK``s come in order, so the first ``k`` bodies are the ones it was
  told ``OK`` for. Its loop is bounded in count and time and ends when the primary dies.
- What decides: every body acknowledged is in the promoted node's log (``/topic/read``).
- ``kill_rounds`` without the option loses acknowledged messages (asynchronous replication):
  ``python -m tests.mirror.test_insync_failover`` shows it (not a test: a loss is likely, not
  certain).
"""

from __future__ import annotations

import base64
import random
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.procs import Daemon, eventually, http, lmqd
from tests.mirror.test_failover import mirror_stats, read_all, topic_state

TOPIC = "acks"
WINDOW = 32
"""PUBs in flight at once."""
MAX_MESSAGES = 200_000
MAX_SECONDS = 20.0


class PipelinedProducer(threading.Thread):
    """Publishes ``m-<n>`` bodies until the connection ends (or its bounds); ``acked`` is how
    many got ``OK`` (the first ones), ``error`` the error frame or exception that ended it."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(b"  V2")
        self.sent = 0
        self.acked = 0
        self.error = ""
        self.first_ok = threading.Event()

    def _pub(self) -> bytes:
        body = b"m-%07d" % self.sent
        self.sent += 1
        return b"PUB %s\n" % TOPIC.encode() + struct.pack(">I", len(body)) + body

    def run(self) -> None:
        buffer = b""
        deadline = time.monotonic() + MAX_SECONDS
        try:
            while self.acked < MAX_MESSAGES and time.monotonic() < deadline:
                room = WINDOW - (self.sent - self.acked)
                if room > 0:
                    self.sock.sendall(b"".join(self._pub() for _ in range(room)))
                data = self.sock.recv(65536)
                if not data:
                    self.error = "EOF"
                    return
                buffer += data
                while len(buffer) >= 8:
                    size, kind = struct.unpack(">Ii", buffer[:8])
                    if len(buffer) < 4 + size:
                        break
                    frame, buffer = buffer[8 : 4 + size], buffer[4 + size :]
                    if kind == 1:
                        self.error = frame.decode()
                        return
                    if frame == b"_heartbeat_":
                        self.sock.sendall(b"NOP\n")
                    elif frame == b"OK":
                        self.acked += 1
                        self.first_ok.set()
        except OSError as exc:
            self.error = repr(exc)
        finally:
            self.sock.close()

    def acknowledged(self) -> set[bytes]:
        return {b"m-%07d" % n for n in range(self.acked)}


def one_round(
    path: Path, primary_flags: tuple[str, ...], mirror_flags: tuple[str, ...], rng: random.Random
) -> tuple[int, int]:
    """Publish, ``kill -9`` the primary at a random moment, promote the mirror: ``(acked, lost)``
    (messages told OK, and of those the ones the promoted node does not have)."""
    primary = lmqd(path / "p", *primary_flags)
    mirror: Daemon | None = None
    try:
        mirror = lmqd(path / "m", f"--mirror-of={primary.http}", *mirror_flags)
        # The mirror follows the topic before the producer starts (without the option, it would
        # otherwise lose everything published before its next look at the topic list).
        assert http(primary.http, "POST", f"/topic/create?topic={TOPIC}")[0] == 200
        eventually(lambda: topic_state(mirror.http, TOPIC), lambda t: t is not None, 20)
        producer = PipelinedProducer(primary.tcp)
        producer.start()
        assert producer.first_ok.wait(20), producer.error
        time.sleep(rng.uniform(0.2, 1.5))
        primary.process.kill()
        primary.process.wait(10)
        producer.join(30)
        assert not producer.is_alive()
        status, summary = http(mirror.http, "POST", "/mirror/promote")
        assert status == 200, summary
        status, _ = http(mirror.http, "GET", f"/topic/offsets?topic={TOPIC}")
        # (without the option the mirror may not even have heard of the topic yet)
        stored = (
            {base64.b64decode(m["body"]) for m in read_all(mirror.http, TOPIC)}
            if status == 200
            else set()
        )
        return producer.acked, len(producer.acknowledged() - stored)
    finally:
        for process in (mirror, primary):
            if process is not None:
                process.terminate()


def kill_rounds(
    tmp_path: Path,
    rounds: int,
    primary_flags: tuple[str, ...] = (),
    mirror_flags: tuple[str, ...] = (),
    seed: int = 28,
) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [
        one_round(tmp_path / f"round-{n}", primary_flags, mirror_flags, rng) for n in range(rounds)
    ]


@pytest.mark.parametrize(
    ("primary_flags", "mirror_flags"),
    [
        (("--min-insync-mirrors=1",), ()),
        (("--min-insync-mirrors=1", "--durable"), ("--durable",)),
    ],
    ids=["memory", "durable"],
)
def test_kill_9_loses_nothing_acknowledged(
    tmp_path: Path, primary_flags: tuple[str, ...], mirror_flags: tuple[str, ...]
) -> None:
    results = kill_rounds(tmp_path, 3, primary_flags, mirror_flags)
    assert all(acked > 0 for acked, _ in results), results
    assert [lost for _, lost in results] == [0, 0, 0], results


def test_without_a_mirror_in_sync_publishes_are_refused(tmp_path: Path) -> None:
    primary = lmqd(tmp_path / "p", "--min-insync-mirrors=1", "--mirror-ack-timeout=1s")
    mirror: Daemon | None = None
    try:
        status, doc = http(primary.http, "POST", f"/pub?topic={TOPIC}", b"x")
        assert (status, doc) == (503, {"message": "NOT_ENOUGH_MIRRORS"})
        producer = PipelinedProducer(primary.tcp)
        producer.run()
        assert producer.acked == 0
        assert producer.error == (
            "E_PUB_FAILED PUB failed NOT_ENOUGH_MIRRORS: 0 of --min-insync-mirrors=1 in sync "
            "(nothing stored; retry)"
        )
        mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}")
        eventually(lambda: mirror_stats(mirror.http)["state"], lambda s: s == "following", 20)
        assert http(primary.http, "POST", f"/pub?topic={TOPIC}", b"x") == (200, "OK")
        # The mirror stops (SIGSTOP: connected, silent): a held OK fails after the timeout,
        # then publishes are refused at once.
        mirror.process.send_signal(19)
        try:
            started = time.monotonic()
            status, doc = http(primary.http, "POST", f"/pub?topic={TOPIC}", b"y")
            assert (status, doc) == (503, {"message": "NOT_ENOUGH_MIRRORS"})
            assert 0.9 <= time.monotonic() - started < 3.5
            started = time.monotonic()
            assert http(primary.http, "POST", f"/pub?topic={TOPIC}", b"z")[0] == 503
            assert time.monotonic() - started < 0.5
        finally:
            mirror.process.send_signal(18)
        eventually(lambda: http(primary.http, "POST", f"/pub?topic={TOPIC}", b"w"),
                   lambda answer: answer == (200, "OK"), 20)  # fmt: skip
        status, doc = http(primary.http, "GET", f"/topic/offsets?topic={TOPIC}")
        assert doc["end"] >= 3  # x, y (stored, not acknowledged), then w
    finally:
        for process in (mirror, primary):
            if process is not None:
                process.terminate()


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        results = kill_rounds(Path(where), int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    print("without --min-insync-mirrors: (acked, lost) per round:", results)
