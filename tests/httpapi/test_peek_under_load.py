"""``GET /peek`` of every state while consumers run: the consumers get exactly what they get
without peeking.

One scenario runs twice, without and with a task peeking all the time (``peeking``), each in the
default mode and in ``--durable``; the assertions on what the consumers receive are the same in
both runs and exact (every message, how often, on which attempt, in what order where the order
is defined), so a peek that moved, requeued, reordered, settled or re-read anything fails them.
What is peeked: a topic's backlog (``late``: no channel yet, then drained by a consumer), and on
topic ``t`` a channel whose consumer FINs (``work``), one that REQs every message once, some with
a delay (``req``: deferred, and the channel's own store), one whose consumer holds its messages
in flight (``held``), one whose messages are dead-lettered (``dlq``), and the dead-letter topic
``t.dead`` (topic level, its consumer's channel, its redrive channel). ``--mem-queue-size 10``
puts nearly everything on disk (the topic log, the channels' own stores).

Rules for this module: the in-process daemon with HTTP on 127.0.0.1 port 0; real V2 consumers
(``Wire``) in trio tasks; the real clock (sockets), every test under ``fail_after``; all
messages of ``t`` have the same priority, so their order is FIFO whatever priority delivery does.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from lmqd.message_ext import MessageExt
from lmqd.protocol import MessageFrame
from lmqd.protocol.extension import XpubMessage, encode_xpub
from tests.support.daemon import RunningDaemon, StartDaemon
from tests.support.http import http
from tests.support.wire import OK, Wire

TIMEOUT = 60
N = 300
"""Messages published to ``t`` at once (XPUB batches of ``BATCH``), then ``D`` deferred ones."""
BATCH = 20
D = 10
DEFER_MS = 1000
"""Long enough for several rounds of peeks to see the deferred messages."""
TOTAL = N + D
HELD = 5
LATE = 1200
"""Messages of the channel-less topic ``late``: more than a peek may return (1000)."""
PRIORITY = 4
NEGOTIATE = {"feature_negotiation": True, "lmq_ext": 1}


def headers_of(body: bytes) -> dict[str, str]:
    return {"seq": body.decode()} if body.startswith(b"m-") else {"late": "yes"}


@attrs.define
class Received:
    """What one consumer got: (body, attempts) per delivery, headers per body."""

    deliveries: list[tuple[bytes, int]] = attrs.Factory(list)
    ids: list[bytes] = attrs.Factory(list)
    headers: dict[bytes, dict[str, str]] = attrs.Factory(dict)
    done: trio.Event = attrs.Factory(trio.Event)


async def consume(
    address: tuple[str, int], topic: str, channel: str, action: str, expect: int,
    got: Received, rdy: int = 7,
) -> None:  # fmt: skip
    """Subscribe and answer every delivery: ``fin``, ``hold`` (nothing), ``req_once`` (REQ the
    first attempt, 0 ms or 150 ms by body, FIN the second) or ``req`` (REQ 0). Sets ``got.done``
    after ``expect`` deliveries and keeps answering until cancelled."""
    wire = await Wire.connect(address, msg_timeout=120_000, **NEGOTIATE)
    try:
        await wire.sub(topic, channel, rdy=rdy)
        while True:
            frame = await wire.frame()
            assert isinstance(frame, MessageFrame), frame
            got.deliveries.append((frame.body, frame.attempts))
            got.ids.append(frame.id)
            got.headers[frame.body] = dict(frame.ext.headers) if frame.ext else {}
            if action == "fin" or (action == "req_once" and frame.attempts > 1):
                await wire.fin(frame.id)
            elif action == "req_once":
                await wire.req(frame.id, 0 if frame.body[-1] % 2 else 150)
            elif action == "req":
                await wire.req(frame.id, 0)
            if len(got.deliveries) == expect:
                got.done.set()
    finally:
        with trio.CancelScope(shield=True):
            await wire.aclose()


@attrs.define
class Peeker:
    """Peeks every state again and again, checking each answer on its own."""

    running: RunningDaemon
    peeks: Counter[str] = attrs.Factory(Counter)
    seen: Counter[str] = attrs.Factory(Counter)
    """Answers with at least one message, per query."""

    QUERIES = (
        ("topic=late", 1000), ("topic=late", 7), ("topic=late&channel=c", 50),
        ("topic=late&channel=c&state=in_flight", 1000),
        ("topic=t", 10), ("topic=t&channel=work", 1), ("topic=t&channel=work", 1000),
        ("topic=t&channel=work&state=in_flight", 3), ("topic=t&channel=work&state=deferred", 4),
        ("topic=t&channel=req", 1000), ("topic=t&channel=req&state=deferred", 1000),
        ("topic=t&channel=req&state=in_flight", 2),
        ("topic=t&channel=held&state=in_flight", 1000), ("topic=t&channel=held", 30),
        ("topic=t&channel=held&state=deferred", 1000),
        ("topic=t&channel=dlq", 100), ("topic=t&channel=dlq&state=in_flight", 100),
        ("topic=t.dead", 100), ("topic=t.dead&channel=x", 100),
        ("topic=t.dead&channel=x&state=in_flight", 100),
        ("topic=t.dead&channel=lmq.redrive", 1000),
    )  # fmt: skip

    async def run(self) -> None:
        while True:
            for query, n in self.QUERIES:
                await self.peek(query, n)

    async def peek(self, query: str, n: int) -> list[dict[str, Any]]:
        answer = await http(self.running.http, "GET", f"/peek?{query}&n={n}")
        if answer.status == 404 and query.endswith(("channel=c", "channel=lmq.redrive")):
            return []  # a channel created by its consumer's SUB or the first dead letter
        assert answer.status == 200, (query, answer.body)
        doc = answer.json()
        messages: list[dict[str, Any]] = doc["messages"]
        assert doc["count"] == len(messages) <= n, (query, doc["count"])
        state = doc["state"]
        for m in messages:
            body = m["body"].encode()
            assert m["body_encoding"] == "utf-8"
            if query.startswith("topic=late"):
                assert (m["priority"], m["headers"]) == (0, {}), m
            else:
                dead = query.startswith("topic=t.dead")
                expected = headers_of(body) | (_dead_letter_headers() if dead else {})
                assert (m["priority"], m["headers"]) == (PRIORITY, expected), (query, m)
            if state == "in_flight":
                assert m["deadline"] is not None and m["attempts"] >= 1, m
            elif state == "deferred":
                assert m["deliver_at"] is not None, m
            else:
                assert m["deadline"] is None, m
            if doc["channel"] is None:  # a dead letter's attempts start again (docs/http.md)
                assert m["offset"] is not None, m
                assert m["attempts"] == 0, m
        self.peeks[query] += 1
        self.seen[query] += bool(messages)
        return messages


def _dead_letter_headers() -> dict[str, str]:
    return {
        "lmq-dead-letter-topic": "t",
        "lmq-dead-letter-channel": "dlq",
        "lmq-dead-letter-reason": "max_attempts",
        "lmq-dead-letter-attempts": "1",
        "lmq-dead-letter-path": "t",
    }


async def _post(running: RunningDaemon, target: str, body: bytes = b"") -> None:
    answer = await http(running.http, "POST", target, body)
    assert answer.status == 200, (target, answer.body)


@pytest.mark.parametrize("durable", [False, True], ids=["default", "durable"])
@pytest.mark.parametrize("peeking", [False, True], ids=["alone", "peeked"])
async def test_consumers_get_the_same_with_and_without_peeks(
    start_daemon: StartDaemon, tmp_path: Path, peeking: bool, durable: bool
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, http=True, mem_queue_size=10, durable=durable)
        tcp = running.tcp
        for topic in ("t", "late", "t.dead"):
            await _post(running, f"/topic/create?topic={topic}")
        for channel in ("work", "req", "held", "dlq"):
            await _post(running, f"/channel/create?topic=t&channel={channel}")
        await _post(running, "/channel/create?topic=t.dead&channel=x")
        policy = json.dumps({"max_attempts": 1, "dead_letter_topic": "t.dead"}).encode()
        await _post(running, "/channel/policy?topic=t&channel=dlq", policy)
        # The channel-less topic's backlog, published before anything runs.
        late = [b"late-%04d" % i for i in range(LATE)]
        for i in range(0, LATE, 200):
            await _post(running, "/mpub?topic=late", b"\n".join(late[i : i + 200]))

        got = {name: Received() for name in ("work", "req", "held", "dlq", "x", "late")}
        peeker = Peeker(running)
        async with trio.open_nursery() as nursery:
            if peeking:
                nursery.start_soon(peeker.run)
                # The topic-level backlog is peeked (bounded: 1000 of 1200) before it drains.
                assert len(await peeker.peek("topic=late", 1000)) == 1000
            for channel, action, expect, rdy in [
                ("work", "fin", TOTAL, 7), ("req", "req_once", 2 * TOTAL, 7),
                ("held", "hold", HELD, HELD), ("dlq", "req", TOTAL, 7),
            ]:  # fmt: skip
                nursery.start_soon(
                    consume, tcp, "t", channel, action, expect, got[channel], rdy
                )
            nursery.start_soon(consume, tcp, "t.dead", "x", "fin", TOTAL, got["x"])
            nursery.start_soon(consume, tcp, "late", "c", "fin", LATE, got["late"])

            producer = await Wire.connect(tcp, **NEGOTIATE)
            bodies = [b"m-%04d" % i for i in range(N)]
            for i in range(0, N, BATCH):
                batch = [
                    XpubMessage(b, MessageExt(priority=PRIORITY, headers=(("seq", b.decode()),)))
                    for b in bodies[i : i + BATCH]
                ]
                await producer.send(encode_xpub("t", batch))
                assert await producer.frame() == OK
            late_ext = MessageExt(priority=PRIORITY, headers=(("late", "yes"),))
            deferred = [b"d-%02d" % i for i in range(D)]
            for b in deferred:
                await producer.send(encode_xpub("t", [XpubMessage(b, late_ext)], DEFER_MS))
                assert await producer.frame() == OK
            await producer.aclose()

            for received in got.values():
                await received.done.wait()
            await trio.sleep(0.3)  # a delivery too many would arrive now
            if peeking:
                # Every state was seen while the consumers ran (the held messages included).
                held = await peeker.peek("topic=t&channel=held&state=in_flight", 1000)
                assert sorted(m["id"].encode() for m in held) == sorted(got["held"].ids)
                assert all(m["attempts"] == 1 for m in held)
                redrive = await peeker.peek("topic=t.dead&channel=lmq.redrive", 1000)
                assert sorted(m["body"] for m in redrive) == sorted(
                    b.decode() for b in bodies + deferred
                )
            # Before the consumers leave (the held messages go back then).
            t_stats = running.broker.topics["t"].statistics(trio.current_time())
            stats = {c.channel_name: c for c in t_stats.channels}
            nursery.cancel_scope.cancel()

        ordered = [(b, 1) for b in bodies]
        first_attempts = Counter({(b, 1): 1 for b in bodies + deferred})
        # work: each message once, on its first attempt; the undeferred ones in publish order.
        assert [d for d in got["work"].deliveries if d[0].startswith(b"m-")] == ordered
        assert Counter(got["work"].deliveries) == first_attempts
        assert got["work"].headers == {b: headers_of(b) for b in bodies + deferred}
        # req: each message exactly twice, attempts 1 then 2.
        assert Counter(got["req"].deliveries) == first_attempts + Counter(
            {(b, 2): 1 for b in bodies + deferred}
        )
        # held: the first HELD messages, still held, never redelivered.
        assert got["held"].deliveries == ordered[:HELD]
        # dlq and the dead-letter topic: each message once, with its dead-letter headers.
        assert Counter(got["dlq"].deliveries) == first_attempts
        # (a dead letter's attempts start again: its consumer sees 1, docs/http.md)
        assert Counter(got["x"].deliveries) == first_attempts
        assert got["x"].headers == {
            b: headers_of(b) | _dead_letter_headers() for b in bodies + deferred
        }
        # late: the topic's backlog in order, once each.
        assert got["late"].deliveries == [(b, 1) for b in late]

        assert (stats["work"].requeue_count, stats["work"].timeout_count) == (0, 0)
        assert (stats["req"].requeue_count, stats["req"].timeout_count) == (TOTAL, 0)
        assert (stats["held"].in_flight_count, stats["held"].timeout_count) == (HELD, 0)
        assert (stats["dlq"].dead_letter_count, stats["dlq"].timeout_count) == (TOTAL, 0)
        for name in ("work", "req", "dlq"):
            assert (stats[name].depth, stats[name].in_flight_count) == (0, 0), name
        if peeking:
            assert set(peeker.peeks) == {q for q, _ in Peeker.QUERIES}
            assert sum(peeker.peeks.values()) >= 2 * len(Peeker.QUERIES)
            # Each state had messages to show while the consumers ran: memory and disk (the
            # log behind a 10-message tail, the channels' own stores), deferred, in flight,
            # dead letters.
            seen = {q for q, n in peeker.seen.items() if n}
            assert seen >= {
                "topic=late", "topic=t&channel=held", "topic=t&channel=held&state=in_flight",
                "topic=t.dead&channel=lmq.redrive",
            }, peeker.seen  # fmt: skip
            assert any("state=deferred" in q for q in seen), peeker.seen
