"""``/channel/policy`` and ``/channel/redrive`` over HTTP, with a real daemon and V2 consumer.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs in-process on 127.0.0.1 port 0 (``start_daemon``) with its data in
  ``tmp_path``; a restart is a graceful stop and a new daemon on the same directory.
- Consumers speak the V2 protocol through ``tests.support.wire.Wire``.
- Every test body runs under ``trio.fail_after(TIMEOUT)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.support.daemon import RunningDaemon, StartDaemon, eventually
from tests.support.http import http
from tests.support.wire import Wire, consume_exactly

TIMEOUT = 15.0

DEFAULTS = {
    "max_attempts": 0, "dead_letter_topic": "", "backoff_ms": 0, "backoff_max_ms": 0,
    "backoff_jitter": 0,
}  # fmt: skip


async def test_channel_policy_defaults_changes_and_persistence(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, http=True, max_attempts=9, backoff_ms=100)
        base = running.http
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            assert (await http(base, "POST", path)).status == 200
        r = await http(base, "GET", "/channel/policy?topic=t&channel=c")
        assert (r.status, r.json()) == (200, {**DEFAULTS, "max_attempts": 9, "backoff_ms": 100})
        assert r.headers["content-type"] == "application/json; charset=utf-8"
        change = {"max_attempts": 5, "dead_letter_topic": "t.dead", "backoff_jitter": 0.25}
        target = "/channel/policy?topic=t&channel=c"
        r = await http(base, "POST", target, json.dumps(change).encode())
        assert (r.status, r.json()) == (200, {**DEFAULTS, **change, "backoff_ms": 100})
        r = await http(base, "POST", "/channel/policy?topic=t&channel=c", b'{"backoff_ms": 0}')
        assert r.json()["backoff_ms"] == 0
        await running.stop()
        saved = json.loads((tmp_path / "lmqd.dat").read_text())
        [channel] = saved["topics"][0]["channels"]
        assert channel == {
            "name": "c", "paused": False,
            "policy": {"backoff_jitter": 0.25, "backoff_ms": 0, "dead_letter_topic": "t.dead",
                       "max_attempts": 5},
        }  # fmt: skip

        again = await start_daemon(tmp_path, http=True)  # no daemon defaults now
        r = await http(again.http, "GET", "/channel/policy?topic=t&channel=c")
        assert r.json() == {**DEFAULTS, **change}
        await again.stop()


async def test_channel_policy_errors(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            assert (await http(base, "POST", path)).status == 200
        target = "/channel/policy?topic=t&channel=c"
        cases = [
            ("GET", "/channel/policy", b"", 400, "MISSING_ARG_TOPIC"),
            ("GET", "/channel/policy?topic=b%20d&channel=c", b"", 400, "INVALID_ARG_TOPIC"),
            ("GET", "/channel/policy?topic=t", b"", 400, "MISSING_ARG_CHANNEL"),
            ("GET", "/channel/policy?topic=t&channel=b%20d", b"", 400, "INVALID_ARG_CHANNEL"),
            ("GET", "/channel/policy?topic=nope&channel=c", b"", 404, "TOPIC_NOT_FOUND"),
            ("GET", "/channel/policy?topic=t&channel=nope", b"", 404, "CHANNEL_NOT_FOUND"),
            ("POST", "/channel/policy?topic=t&channel=nope", b"{}", 404, "CHANNEL_NOT_FOUND"),
            ("POST", target, b"{", 400, "INVALID_POLICY: the body is not JSON"),
            ("POST", target, b"\xff", 400, "INVALID_POLICY: the body is not JSON"),
            ("POST", target, b"[1]", 400, "INVALID_POLICY: the policy must be a JSON object"),
            ("POST", target, b'{"retention_ms": 1}', 400,
             "INVALID_POLICY: unknown key 'retention_ms' (known: max_attempts, "
             "dead_letter_topic, backoff_ms, backoff_max_ms, backoff_jitter)"),
            ("POST", target, b'{"max_attempts": -1}', 400,
             "INVALID_POLICY: max_attempts must be an integer from 0 to 65535"),
            ("POST", target, b'{"max_attempts": 2.5}', 400,
             "INVALID_POLICY: max_attempts must be an integer from 0 to 65535"),
            ("POST", target, b'{"backoff_ms": "1s"}', 400,
             "INVALID_POLICY: backoff_ms must be an integer from 0 to 3600000"),
            ("POST", target, b'{"backoff_max_ms": 3600001}', 400,
             "INVALID_POLICY: backoff_max_ms must be an integer from 0 to 3600000"),
            ("POST", target, b'{"backoff_jitter": 2}', 400,
             "INVALID_POLICY: backoff_jitter must be a number from 0 to 1"),
            ("POST", target, b'{"backoff_jitter": NaN}', 400,
             "INVALID_POLICY: backoff_jitter must be a number from 0 to 1"),
            ("POST", target, b'{"dead_letter_topic": null}', 400,
             'INVALID_POLICY: dead_letter_topic must be a string ("" for none)'),
            ("POST", target, b'{"dead_letter_topic": "a b"}', 400,
             "INVALID_POLICY: dead_letter_topic must be a valid topic name"),
            ("POST", target, b'{"dead_letter_topic": "d#ephemeral"}', 400,
             "INVALID_POLICY: dead_letter_topic must not be ephemeral (dead letters are kept)"),
            ("POST", target, b'{"max_attempts": 3, "dead_letter_topic": "t"}', 400,
             "INVALID_POLICY: dead_letter_topic must not be the channel's own topic"),
            ("POST", target, b"{" + b" " * 70_000 + b"}", 413, "INVALID_POLICY: body too large"),
            ("POST", target, b'{"max_attempts": ' + b"1" * 5000 + b"}", 400,
             "INVALID_POLICY: max_attempts must be an integer from 0 to 65535"),
            ("POST", target, b'{"backoff_jitter": ' + b"1" * 5000 + b"}", 400,
             "INVALID_POLICY: backoff_jitter must be a number from 0 to 1"),
            ("POST", target, b'{"backoff_ms": ' + b"[" * 60_000, 400,
             "INVALID_POLICY: the body is not JSON"),
        ]  # fmt: skip
        for method, path, body, status, message in cases:
            r = await http(base, method, path, body or None)
            assert (r.status, r.json()) == (status, {"message": message}), (path, body)
        # A refused change changes nothing, not even its valid keys.
        r = await http(base, "GET", target)
        assert r.json() == DEFAULTS
        assert running.broker.metadata().topics[0].channels[0].policy == ()


async def test_redrive_errors(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        for path in (
            "/topic/create?topic=t", "/channel/create?topic=t&channel=c",
            "/topic/create?topic=plain",
        ):
            assert (await http(base, "POST", path)).status == 200
        redrive = "/channel/redrive?topic=t&channel=c"
        cases = [
            ("/channel/redrive?channel=c&from=d", 400, "MISSING_ARG_TOPIC"),
            ("/channel/redrive?topic=t&from=d", 400, "MISSING_ARG_CHANNEL"),
            ("/channel/redrive?topic=t&channel=x&from=d", 404, "CHANNEL_NOT_FOUND"),
            ("/channel/redrive?topic=nope&channel=c&from=d", 404, "TOPIC_NOT_FOUND"),
            (redrive, 400, "MISSING_ARG_FROM"),
            (f"{redrive}&from=a%20b", 400, "INVALID_ARG_FROM"),
            (f"{redrive}&from=t", 400, "INVALID_ARG_FROM: the channel's own topic"),
            (f"{redrive}&from=d&max=0", 400, "INVALID_ARG_MAX: an integer from 1 to 10000"),
            (f"{redrive}&from=d&max=10001", 400, "INVALID_ARG_MAX: an integer from 1 to 10000"),
            (f"{redrive}&from=d&max=-1", 400, "INVALID_ARG_MAX: an integer from 1 to 10000"),
            (f"{redrive}&from=d&max=five", 400, "INVALID_ARG_MAX: an integer from 1 to 10000"),
            (f"{redrive}&from=d&max=%C2%B2", 400, "INVALID_ARG_MAX: an integer from 1 to 10000"),
            (f"{redrive}&from=d", 404, "DEAD_LETTER_TOPIC_NOT_FOUND"),
            (f"{redrive}&from=plain", 404, "DEAD_LETTER_TOPIC_NOT_FOUND"),  # never a DLQ
        ]
        for path, status, message in cases:
            r = await http(base, "POST", path)
            assert (r.status, r.json()) == (status, {"message": message}), path
        r = await http(base, "GET", f"{redrive}&from=d")
        assert r.status == 405


async def test_dead_letters_counters_and_redrive(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            assert (await http(base, "POST", path)).status == 200
        policy = {"max_attempts": 2, "dead_letter_topic": "t.dead"}
        target = "/channel/policy?topic=t&channel=c"
        r = await http(base, "POST", target, json.dumps(policy).encode())
        assert r.status == 200
        for body in (b"one", b"two"):
            assert (await http(base, "POST", "/pub?topic=t", body)).status == 200
        wire = await Wire.connect(running.tcp)
        await wire.sub("t", "c", rdy=2)
        seen = []
        for _ in range(4):  # two deliveries of each, both REQ'd
            m = await wire.message()
            seen.append((m.body, m.attempts))
            await wire.req(m.id, 0)

        def dead_lettered() -> bool:
            return "t.dead" in running.broker.topics and (
                running.broker.topics["t.dead"].channels["lmq.redrive"].depth == 2
            )

        await eventually(dead_lettered)
        assert sorted(seen) == [(b"one", 1), (b"one", 2), (b"two", 1), (b"two", 2)]
        stats = (await http(base, "GET", "/stats?format=json&topic=t")).json()
        [topic] = stats["topics"]
        [channel] = topic["channels"]
        assert (channel["dead_letter_count"], channel["expired_count"]) == (2, 0)
        assert channel["max_attempts_dropped_count"] == 0
        assert topic["dead_letter_count"] == 2
        metrics = (await http(base, "GET", "/metrics")).body.decode()
        assert 'lmqd_channel_dead_lettered_total{channel="c",topic="t"} 2.0' in metrics
        assert 'lmqd_topic_dead_lettered_total{topic="t"} 2.0' in metrics
        assert 'lmqd_channel_expired_total{channel="c",topic="t"} 0.0' in metrics
        assert 'lmqd_channel_max_attempts_dropped_total{channel="c",topic="t"} 0.0' in metrics
        # The dead letters are an ordinary topic: readable with its attempts, by any channel.
        read = (await http(base, "GET", "/topic/read?topic=t.dead&offset=0&format=json")).json()
        assert sorted(m["attempts"] for m in read["messages"]) == [0, 0]  # counted again

        r = await http(base, "POST", "/channel/redrive?topic=t&channel=c&from=t.dead&max=1")
        assert (r.status, r.json()) == (200, {"moved": 1})
        again = await wire.message()
        assert again.attempts == 1  # a fresh set of attempts
        await wire.fin(again.id)
        r = await http(base, "POST", "/channel/redrive?topic=t&channel=c&from=t.dead")
        assert r.json() == {"moved": 1}
        last = await wire.message()
        assert {again.body, last.body} == {b"one", b"two"}
        await wire.fin(last.id)
        r = await http(base, "POST", "/channel/redrive?topic=t&channel=c&from=t.dead")
        assert r.json() == {"moved": 0}
        await wire.aclose()


async def dead_letter_two(running: RunningDaemon) -> None:
    """``t``'s channel ``c`` gives up on two messages (max_attempts 1): they go to ``t.dead``."""
    base = running.http
    for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
        assert (await http(base, "POST", path)).status == 200
    policy = {"max_attempts": 1, "dead_letter_topic": "t.dead"}
    r = await http(base, "POST", "/channel/policy?topic=t&channel=c", json.dumps(policy).encode())
    assert r.status == 200
    assert (await http(base, "POST", "/mpub?topic=t", b"one\ntwo")).status == 200
    wire = await Wire.connect(running.tcp)
    await wire.sub("t", "c", rdy=2)
    for _ in range(2):
        await wire.req((await wire.message()).id, 0)
    await eventually(
        lambda: "t.dead" in running.broker.topics
        and running.broker.topics["t.dead"].message_count == 2
    )
    await wire.aclose()


async def receive_all(running: RunningDaemon, topic: str, channel: str, count: int) -> list[bytes]:
    """SUB on a new channel and take ``count`` messages, and no more; sorted."""
    return sorted(await consume_exactly(running.tcp, topic, channel, count))


@pytest.mark.parametrize(
    "mode", [{}, {"mem_queue_size": 0}, {"durable": True}], ids=["memory-first", "disk", "durable"]
)
async def test_dead_letters_wait_for_the_first_channel_a_user_creates(
    start_daemon: StartDaemon, mode: dict[str, object]
) -> None:
    # The first dead letter creates t.dead's redrive channel; it must not take nsqd's "first
    # channel gets the backlog" away from the users' channels: nsq_tail, or any NSQ consumer
    # on a new channel, started after the dead letters, gets them.
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, **mode)
        await dead_letter_two(running)
        stats = (await http(running.http, "GET", "/stats?format=json&topic=t.dead")).json()
        [topic] = stats["topics"]
        assert topic["depth"] == 2  # waiting in the topic for its first channel, as nsqd shows
        assert [(c["channel_name"], c["depth"], c["message_count"]) for c in topic["channels"]] == [
            ("lmq.redrive", 2, 2)
        ]
        # nsq_tail's channel is ephemeral; with --mem-queue-size=0 an ephemeral channel keeps
        # only what a ready consumer takes at once (nsqd's unbuffered Go channel): a durable one.
        first = "tail123456#ephemeral" if not mode else "first"
        assert await receive_all(running, "t.dead", first, 2) == [b"one", b"two"]
        # The redrive channel keeps its own copies; a second user channel is a later one.
        assert running.broker.topics["t.dead"].channels["lmq.redrive"].depth == 2
        assert await receive_all(running, "t.dead", "later", 0) == []
        r = await http(running.http, "POST", "/channel/redrive?topic=t&channel=c&from=t.dead")
        assert r.json() == {"moved": 2}
        # Dead letters after that reach every channel at once, the redrive channel included.
        wire = await Wire.connect(running.tcp)
        await wire.sub("t", "c", rdy=2)
        for _ in range(2):
            await wire.req((await wire.message()).id, 0)
        await wire.aclose()
        assert await receive_all(running, "t.dead", "later", 2) == [b"one", b"two"]
        redrive = running.broker.topics["t.dead"].channels["lmq.redrive"]
        await eventually(lambda: redrive.depth == 2)


async def test_dead_letters_wait_for_a_users_channel_across_a_restart(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, http=True)
        await dead_letter_two(running)
        await running.stop()
        again = await start_daemon(tmp_path, http=True)
        assert await receive_all(again, "t.dead", "audit", 2) == [b"one", b"two"]
        r = await http(again.http, "POST", "/channel/redrive?topic=t&channel=c&from=t.dead")
        assert r.json() == {"moved": 2}
        await again.stop()


async def test_a_consumer_of_the_redrive_channel_leaves_the_users_copies_alone(
    start_daemon: StartDaemon,
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)  # memory first: the channels share objects
        await dead_letter_two(running)
        wire = await Wire.connect(running.tcp)
        await wire.sub("t.dead", "lmq.redrive", rdy=2)
        taken = [await wire.message() for _ in range(2)]
        assert [m.attempts for m in taken] == [1, 1]
        for m in taken:
            await wire.req(m.id, 0)
        again = [await wire.message() for _ in range(2)]
        assert [m.attempts for m in again] == [2, 2]
        await wire.rdy(0)
        user = await Wire.connect(running.tcp)
        await user.sub("t.dead", "audit", rdy=2)
        first = [await user.message() for _ in range(2)]
        assert sorted((m.body, m.attempts) for m in first) == [(b"one", 1), (b"two", 1)]
        await user.aclose()
        await wire.aclose()


async def reject_everything(wire: Wire, deliveries: list[bytes]) -> None:
    """A consumer that REQs every message it gets, recording each delivery."""
    while True:
        m = await wire.message()
        deliveries.append(m.body)
        await wire.req(m.id, 0)


@pytest.mark.parametrize(
    ("cycle", "policies", "options"),
    [
        (["a", "b"], {"a": "b", "b": "a"}, {}),
        (["a", "b", "x"], {"a": "b", "b": "x", "x": "a"}, {}),
        # A daemon-wide --dead-letter-topic in the loop: a/c goes to d by default, d/c back.
        (["a", "d"], {"d": "a"}, {"dead_letter_topic": "d"}),
    ],
    ids=["two", "three", "daemon-wide"],
)
async def test_a_dead_letter_loop_drops_what_comes_round_again(
    start_daemon: StartDaemon,
    cycle: list[str],
    policies: dict[str, str],
    options: dict[str, object],
) -> None:
    """Channel policies whose dead-letter topics make a loop: each message goes round once and
    is dropped (counted, WARNING) where it would go back to a topic it left; before, 100
    messages made 171k deliveries per topic in 30 s and never stopped."""
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, max_attempts=1, **options)
        base = running.http
        for topic in cycle:
            create = (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=c")
            for path in create:
                assert (await http(base, "POST", path)).status == 200
        for topic, target in policies.items():
            body = json.dumps({"dead_letter_topic": target}).encode()
            r = await http(base, "POST", f"/channel/policy?topic={topic}&channel=c", body)
            assert r.status == 200
        deliveries: dict[str, list[bytes]] = {topic: [] for topic in cycle}
        published = [b"m%d" % i for i in range(10)]
        wires = []
        async with trio.open_nursery() as consumers:
            for topic in cycle:
                wire = await Wire.connect(running.tcp)
                wires.append(wire)
                await wire.sub(topic, "c", rdy=100)
                consumers.start_soon(reject_everything, wire, deliveries[topic])
            assert (await http(base, "POST", "/mpub?topic=a", b"\n".join(published))).status == 200
            last = running.broker.topics[cycle[-1]].channels["c"]
            await eventually(lambda: last.max_attempts_dropped_count == len(published))
            await trio.sleep(0.5)  # nothing more goes round
            consumers.cancel_scope.cancel()
        for wire in wires:
            await wire.aclose()
        for topic in cycle:
            assert sorted(deliveries[topic]) == published, topic  # once in each topic
            channel = running.broker.topics[topic].channels["c"]
            dropped = len(published) if topic == cycle[-1] else 0
            assert (channel.dead_letter_count, channel.max_attempts_dropped_count) == (
                len(published) - dropped,
                dropped,
            ), topic
        read = await http(base, "GET", f"/topic/read?topic={cycle[-1]}&offset=0&format=json")
        headers = read.json()["messages"][0]["headers"]
        assert headers["lmq-dead-letter-path"] == ",".join(cycle[:-1])


async def test_a_redrive_starts_the_dead_letter_path_again(start_daemon: StartDaemon) -> None:
    """A message redriven back into the channel that dead-lettered it may be dead-lettered to
    the same topic again: the redrive is an operator's fresh start, as for its attempts."""
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        for path in ("/topic/create?topic=a", "/channel/create?topic=a&channel=c"):
            assert (await http(base, "POST", path)).status == 200
        body = json.dumps({"max_attempts": 1, "dead_letter_topic": "b"}).encode()
        assert (await http(base, "POST", "/channel/policy?topic=a&channel=c", body)).status == 200
        assert (await http(base, "POST", "/pub?topic=a", b"again")).status == 200
        wire = await Wire.connect(running.tcp)
        await wire.sub("a", "c", rdy=1)
        await wire.req((await wire.message()).id, 0)
        channel = running.broker.topics["a"].channels["c"]
        await eventually(lambda: channel.dead_letter_count == 1)
        r = await http(base, "POST", "/channel/redrive?topic=a&channel=c&from=b")
        assert r.json() == {"moved": 1}
        again = await wire.message()
        assert again.body == b"again"
        await wire.req(again.id, 0)
        await eventually(lambda: channel.dead_letter_count == 2)
        assert channel.max_attempts_dropped_count == 0
        read = await http(base, "GET", "/topic/read?topic=b&offset=0&format=json")
        paths = [m["headers"]["lmq-dead-letter-path"] for m in read.json()["messages"]]
        assert paths == ["a", "a"]
        await wire.aclose()
