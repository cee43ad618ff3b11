"""Losing a primary: two lmqd processes on loopback, ``kill -9``, promotion, consumers through
an lmqlookupd.

Rules for this module:
- Real processes (``tests.cluster.procs``): an lmqlookupd, a primary and its mirror
  (``--mirror-of``), all on 127.0.0.1 with ports from the OS and data in ``tmp_path``; every wait
  is ``eventually`` with a bound; every process is stopped in ``finally``.
- What a user sees decides: the logs compared by ``GET /topic/read`` on both nodes, deferred
  messages by ``GET /peek``, consumers of lmq_client's blocking ``Consumer`` that know only the
  lookupd.
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmq_client.errors import NSQError, SubFailedError
from lmq_client.sync import Consumer, Producer
from tests.cluster.procs import Daemon, eventually, http, lmqd, lookupd
from tests.support.process import lmqadmin_command

TOPIC = "orders"
CHANNEL = "billing"
PLAIN = 600
WITH_EXT = 40
DEFERRED = 5


def read_all(address: str, topic: str = TOPIC) -> list[dict[str, Any]]:
    """Every message the node stores for ``topic``, by offset (JSON ``/topic/read``)."""
    out: list[dict[str, Any]] = []
    offset = 0
    while True:
        status, doc = http(address, "GET", f"/topic/read?topic={topic}&offset={offset}"
                                           "&count=10000&format=json")  # fmt: skip
        assert status == 200, doc
        out += doc["messages"]
        if doc["next"] >= doc["end"]:
            return out
        offset = doc["next"]


def mirror_stats(address: str) -> dict[str, Any]:
    status, doc = http(address, "GET", "/stats?format=json")
    assert status == 200
    return dict(doc["mirror"])


def topic_state(address: str, topic: str = TOPIC) -> dict[str, Any] | None:
    topics = mirror_stats(address)["topics"]
    return next((t for t in topics if t["topic_name"] == topic), None)


def caught_up(address: str, end: int) -> bool:
    t = topic_state(address)
    return t is not None and t["end_offset"] >= end and t["lag_messages"] == 0


def deferred_peek(address: str) -> list[tuple[str, int]]:
    status, doc = http(address, "GET", f"/peek?topic={TOPIC}&channel={CHANNEL}"
                                       "&state=deferred&n=1000")  # fmt: skip
    assert status == 200, doc
    return sorted((m["id"], m["deliver_at"]) for m in doc["messages"])


def lookup_ports(lookupd_http: str) -> list[int]:
    status, doc = http(lookupd_http, "GET", f"/lookup?topic={TOPIC}")
    if status != 200:
        return []
    return sorted(p["tcp_port"] for p in doc["producers"])


def test_kill_9_the_primary_promote_the_mirror_consumers_carry_on(tmp_path: Path) -> None:
    lk = lookupd()
    primary = lmqd(tmp_path / "p", f"--lookupd-tcp-address={lk.tcp}")
    mirror: Daemon | None = None
    try:
        mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}",
                      f"--lookupd-tcp-address={lk.tcp}")  # fmt: skip
        published = [b"plain-%d" % i for i in range(PLAIN)]
        published += [b"ext-%d" % i for i in range(WITH_EXT)]
        published += [b"deferred-%d" % i for i in range(DEFERRED)]
        with Producer(primary.tcp) as producer:
            producer.mpub(TOPIC, published[:PLAIN])
            for i in range(WITH_EXT):
                producer.publish(TOPIC, b"ext-%d" % i, headers={"n": str(i)}, priority=i % 3)
            for i in range(DEFERRED):
                producer.dpub(TOPIC, 600.0, b"deferred-%d" % i)
        total = PLAIN + WITH_EXT + DEFERRED
        # A consumer finishes part, requeues some for later, and leaves some in flight.
        finished: set[bytes] = set()
        later: set[bytes] = set()
        """Bodies (unique) of the messages finished, and requeued with a delay."""
        consumer = Consumer(TOPIC, CHANNEL, primary.tcp, max_in_flight=100)
        try:
            got = 0
            while got < 300:
                message = consumer.get(timeout=10)
                assert message is not None
                got += 1
                if got <= 250:
                    message.finish()
                    finished.add(message.body)
                elif got <= 260:
                    message.requeue(600.0, backoff=False)
                    later.add(message.body)
            # (the last 40 stay in flight until the primary dies)
            consumer.get(timeout=0.2)  # lets the FINs and REQs go out
            end = eventually(lambda: http(primary.http, "GET", f"/topic/offsets?topic={TOPIC}"),
                             lambda a: a[1]["end"] == total, 10)[1]["end"]  # fmt: skip
            eventually(lambda: caught_up(mirror.http, end), bool, 20)
            time.sleep(2.5)  # channel positions are followed at least every second

            # The mirror's log is the primary's, offset for offset: every message the primary
            # took (the primary itself no longer stores those every channel and the mirror
            # read from memory), and the same as the primary where it still has them.
            mirror_log = read_all(mirror.http)
            assert [m["offset"] for m in mirror_log] == list(range(total))
            assert sorted(base64.b64decode(m["body"]) for m in mirror_log) == sorted(published)
            by_offset = {m["offset"]: m for m in mirror_log}
            still = read_all(primary.http)
            assert still and all(by_offset[m["offset"]] == m for m in still)
            with_ext = [m for m in mirror_log if m.get("headers")]
            assert len(with_ext) == WITH_EXT and with_ext[1]["headers"] == {"n": "1"}
            assert with_ext[1]["priority"] == 1
            deferred_before = deferred_peek(primary.http)
            assert len(deferred_before) == DEFERRED + len(later)

            # The mirror serves reads, refuses writes, and is not registered while it mirrors.
            status, doc = http(mirror.http, "POST", f"/pub?topic={TOPIC}", b"no")
            assert (status, doc) == (403, {"message": "MIRROR_READ_ONLY",
                                           "primary": primary.http})  # fmt: skip
            with Producer(mirror.tcp) as refused, pytest.raises(NSQError) as info:
                refused.publish(TOPIC, b"no")
            assert f"E_PUB_FAILED PUB failed mirror of {primary.http}" in str(info.value)
            assert http(mirror.http, "POST", "/topic/create?topic=x")[0] == 403
            assert lookup_ports(lk.http) == [primary.tcp_port]

            primary.process.kill()  # kill -9: what the primary held in memory is gone
            primary.process.wait(10)
        finally:
            consumer.close()
        eventually(lambda: mirror_stats(mirror.http)["state"], lambda s: s == "disconnected", 20)

        promoted = subprocess.run(
            lmqadmin_command(mirror.tcp, "--http-address", mirror.http, "mirror", "promote"),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert promoted.returncode == 0, promoted.stderr
        assert "promoted to primary at epoch 1" in promoted.stdout
        status, role = http(mirror.http, "GET", "/mirror")
        assert (role["role"], role["epoch"]) == ("primary", 1)
        assert role["promoted_from"]["address"] == primary.http
        eventually(lambda: lookup_ports(lk.http), lambda ports: mirror.tcp_port in ports, 20)

        # Deferred messages (DPUB, REQ with a delay) kept their due times.
        after = deferred_peek(mirror.http)
        assert [i for i, _ in after] == [i for i, _ in deferred_before]
        for (_, was), (_, now) in zip(deferred_before, after, strict=True):
            assert abs(was - now) <= 5, (was, now)

        # A consumer that knows only the lookupd gets every message the primary had not
        # finished (the deferred ones aside: due in ten minutes), and none it had.
        waiting = later | {b"deferred-%d" % i for i in range(DEFERRED)}
        wanted = set(published) - finished - waiting
        received: list[bytes] = []
        with Consumer(TOPIC, CHANNEL, lookupd_http_addresses=[lk.http], max_in_flight=100,
                      lookupd_poll_interval=1.0) as again:  # fmt: skip
            deadline = time.monotonic() + 60
            while set(received) < wanted and time.monotonic() < deadline:
                message = again.get(timeout=1)
                if message is not None:
                    received.append(message.body)
                    message.finish()
        assert set(received) == wanted
        assert len(received) == len(wanted), "a message delivered twice"
        assert mirror.process.poll() is None
    finally:
        for process in (mirror, primary, lk):
            if process is not None:
                process.terminate()


@contextlib.contextmanager
def followed_pair(tmp_path: Path, published: int) -> Iterator[list[Daemon]]:
    """``[primary, mirror]`` with ``published`` messages copied; a test may replace either
    (a restart), and what the list holds at the end is stopped."""
    primary = lmqd(tmp_path / "p")
    pair = [primary, lmqd(tmp_path / "m", f"--mirror-of={primary.http}")]
    try:
        with Producer(primary.tcp) as producer:
            producer.mpub(TOPIC, [b"a"] * published)
        eventually(lambda: caught_up(pair[1].http, published), bool, 20)
        yield pair
    finally:
        for process in reversed(pair):
            process.terminate()


def test_a_mirror_that_sees_the_primary_again_catches_up(tmp_path: Path) -> None:
    with followed_pair(tmp_path, 100) as pair:
        primary, mirror = pair
        port = primary.http_port
        assert primary.stop() == 0  # SIGTERM: the primary writes everything and stops
        state = eventually(lambda: mirror_stats(mirror.http),
                           lambda s: s["state"] == "disconnected" and s["failures"] >= 2, 20)
        assert "cannot connect" in state["last_error"]
        # Backoff: the failures grow slower than one a second.
        time.sleep(3)
        assert mirror_stats(mirror.http)["failures"] <= state["failures"] + 3
        primary = pair[0] = lmqd(tmp_path / "p", f"--http-address=127.0.0.1:{port}")
        with Producer(primary.tcp) as producer:
            producer.mpub(TOPIC, [b"b"] * 50)
        eventually(lambda: caught_up(mirror.http, 150), bool, 60)
        assert read_all(mirror.http) == read_all(primary.http)
        assert topic_state(mirror.http)["gap_messages"] == 0  # type: ignore[index]


def test_the_promoted_node_refuses_to_follow_the_old_primary(tmp_path: Path) -> None:
    with followed_pair(tmp_path, 10) as (primary, mirror):
        status, summary = http(mirror.http, "POST", "/mirror/promote")
        assert status == 200 and summary["epoch"] == 1, summary
        assert http(mirror.http, "POST", "/mirror/promote")[1] == {"message": "NOT_A_MIRROR"}
        mirror.stop()
        refused = subprocess.run(
            mirror.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert refused.returncode == 1
        lines = [line for line in refused.stdout.splitlines() if "failed to start" in line]
        assert len(lines) == 1 and "epoch 1" in lines[0] and "--mirror-force" in lines[0], (
            refused.stdout
        )
        assert "Traceback" not in refused.stdout
        forced = lmqd(tmp_path / "m", f"--mirror-of={primary.http}", "--mirror-force")
        try:
            eventually(lambda: caught_up(forced.http, 10), bool, 20)
            assert mirror_stats(forced.http)["epoch"] == 0
        finally:
            forced.terminate()


def test_something_that_is_not_lmqd_at_the_address(tmp_path: Path) -> None:
    primary = lmqd(tmp_path / "p")
    try:
        for target, words in ((primary.tcp, "not an lmqd HTTP API"),):
            done = subprocess.run(
                [*primary.args[:3], "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                 f"--data-path={tmp_path / 'm'}", f"--mirror-of={target}"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
                check=False,
            )  # fmt: skip
            assert done.returncode == 1, done.stdout
            failed = [line for line in done.stdout.splitlines() if "failed to start" in line]
            assert len(failed) == 1 and words in failed[0], done.stdout
            assert "Traceback" not in done.stdout
        # A data directory with topics of its own does not become a mirror by accident.
        own = tmp_path / "own"
        with_topics = lmqd(own)
        with Producer(with_topics.tcp) as producer:
            producer.publish("mine", b"x")
        with_topics.stop()
        done = subprocess.run(
            [*primary.args[:3], "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
             f"--data-path={own}", f"--mirror-of={primary.http}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 1
        assert "holds topics of this node's own" in done.stdout
    finally:
        primary.terminate()


def test_mirror_status_and_stats_in_lmqadmin(tmp_path: Path) -> None:
    with followed_pair(tmp_path, 10) as (primary, mirror):
        for args in (("mirror", "status"), ("stats", "--interval", "0")):
            done = subprocess.run(
                lmqadmin_command(mirror.tcp, "--http-address", mirror.http,
                                 "--http-address", primary.http, *args),
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert f"{mirror.http}: mirror of {primary.http} (epoch 0): following" in done.stdout
            assert "mirror " in done.stdout.split(f"{primary.http}:", 1)[1]
        done = subprocess.run(
            lmqadmin_command(primary.tcp, "--http-address", primary.http, "mirror", "status",
                             "--json"),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        doc = json.loads(done.stdout)[primary.http]
        assert doc["role"] == "primary" and len(doc["mirrors"]) == 1


def test_new_topics_and_replay_channels_of_the_mirror(tmp_path: Path) -> None:
    primary = lmqd(tmp_path / "p")
    mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}")
    try:
        eventually(lambda: mirror_stats(mirror.http)["state"], lambda s: s == "following", 20)
        # A topic created after the mirror came, its messages consumed at once: the primary
        # kept them for the mirror (a hold made with the topic), which copies every one.
        with Producer(primary.tcp) as producer:
            producer.mpub("fresh", [b"f%d" % i for i in range(100)])
        with Consumer("fresh", "c", primary.tcp, max_in_flight=100) as consumer:
            for _ in range(100):
                message = consumer.get(timeout=10)
                assert message is not None
                message.finish()
        eventually(lambda: http(mirror.http, "GET", "/stats?format=json")[1]["mirror"]["topics"],
                   lambda ts: any(t["topic_name"] == "fresh" and t["end_offset"] == 100
                                  and t["gap_messages"] == 0 for t in ts), 20)  # fmt: skip
        assert [base64.b64decode(m["body"]) for m in read_all(mirror.http, "fresh")] == [
            b"f%d" % i for i in range(100)
        ]
        # A followed channel is the primary's: no consumer on the mirror...
        refusal = f"E_SUB_FAILED SUB failed mirror of {primary.http}"
        with pytest.raises(SubFailedError, match=refusal), Consumer(
            "fresh", "c", mirror.tcp
        ) as refused:
            refused.get(timeout=1)
        # ... but a replay channel of the mirror's own reads the copy.
        assert http(mirror.http, "POST", "/channel/create?topic=fresh&channel=audit"
                                         "&from=earliest")[0] == 200  # fmt: skip
        with Consumer("fresh", "audit", mirror.tcp, max_in_flight=100) as replay:
            bodies = []
            while len(bodies) < 100:
                message = replay.get(timeout=10)
                assert message is not None
                bodies.append(message.body)
                message.finish()
        assert sorted(bodies) == sorted(b"f%d" % i for i in range(100))
        time.sleep(1.5)  # the next look at the primary leaves the mirror's own channel alone
        assert http(mirror.http, "GET", "/stats?format=json&topic=fresh&channel=audit")[1][
            "topics"][0]["channels"][0]["channel_name"] == "audit"
        assert http(mirror.http, "POST", "/channel/delete?topic=fresh&channel=c")[0] == 403
    finally:
        mirror.terminate()
        primary.terminate()
