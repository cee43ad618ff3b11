"""The follower on the autojump clock: backoff while the primary does not answer, the state and
lag a mirror reports, and its catching up, at exact virtual times.

Rules for this module:
- An in-process daemon (``start_daemon``) is the mirror's node; its ``Follower`` is made by the
  test with a scripted ``FakePrimary`` instead of HTTP: each request answers at once, with
  what a primary's ``/mirror/topics`` and ``/mirror/fetch`` would (``lmqd.mirror.wire``,
  ``frames``), or fails as an unreachable host does. No socket is used, so virtual times are
  exact (until the first answer, after which the follower writes its state in a worker thread).
- The engine's wall clock follows the virtual clock (``WALL0`` + trio time): lags in seconds
  are exact too.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from lmqd.message import Message
from lmqd.mirror.follower import FETCH_WAIT_MS, Follower, MirrorRefused
from lmqd.mirror.frames import encode_copies
from lmqd.mirror.role import NodeRole
from lmqd.mirror.wire import encode_section
from lmqd.storage import AnchoredTimeBase
from lmqd.transport.http_client import HttpAnswer, HttpClientError
from tests.support.daemon import RunningDaemon, StartDaemon, eventually

WALL0 = 1_750_000_000 * 10**9
PRIMARY_TIMEBASE = AnchoredTimeBase(0.0, WALL0)


def virtual_wall_ns() -> int:
    return WALL0 + round(trio.current_time() * 1e9)


class FakePrimary:
    """A primary as the follower's requests see it: one topic ``t`` and its messages."""

    def __init__(self) -> None:
        self.up = False
        self.answer_html = False
        self.requests: list[tuple[float, str]] = []
        self.messages: list[Message] = []

    def publish(self, count: int) -> None:
        for _ in range(count):
            offset = len(self.messages)
            self.messages.append(Message(b"%016d" % offset, b"m%d" % offset, virtual_wall_ns()))

    def client(self) -> FakeClient:
        return FakeClient(self)

    def topics(self) -> bytes:
        end = len(self.messages)
        return json.dumps({
            "node_id": "primary-1", "epoch": 0,
            "topics": {"t": {"earliest": 0, "end": end, "pumped": end, "paused": False,
                             "policy": {}, "channels": {}}},
        }).encode()  # fmt: skip

    async def fetch(self, body: bytes) -> bytes:
        offset, _ = json.loads(body)["topics"]["t"]
        if offset >= len(self.messages):
            await trio.sleep(FETCH_WAIT_MS / 1000)  # a long poll with nothing new
        entries = list(enumerate(self.messages))[offset:]
        end = len(self.messages)
        return encode_section(
            "t", encode_copies(entries, PRIMARY_TIMEBASE), next_offset=end, end=end, earliest=0,
            since=0, next_ts=0, new_hold=offset == 0,
        )  # fmt: skip


class FakeClient:
    def __init__(self, primary: FakePrimary) -> None:
        self.primary = primary

    async def request(
        self, method: str, target: str, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()
    ) -> HttpAnswer:
        primary = self.primary
        path = urllib.parse.urlsplit(target).path
        primary.requests.append((trio.current_time(), path))
        await trio.lowlevel.checkpoint()
        if not primary.up:
            raise HttpClientError("cannot connect (Connection refused)", unreachable=True)
        if primary.answer_html:
            return HttpAnswer(200, {}, b"<html>hello</html>")
        if path == "/mirror/topics":
            return HttpAnswer(200, {}, primary.topics())
        return HttpAnswer(200, {}, await primary.fetch(body))

    async def aclose(self) -> None:
        pass


async def follow(start_daemon: StartDaemon, primary: FakePrimary) -> tuple[RunningDaemon, Follower]:
    node = await start_daemon()
    node.broker.engine.wall_clock = virtual_wall_ns
    follower = Follower(
        node.broker, NodeRole.new(), primary="primary:4151",
        client=primary.client,  # type: ignore[arg-type, return-value]
        save_role=lambda role: None, own_address=lambda: "mirror:4151",
    )  # fmt: skip
    node.broker.guard = follower
    return node, follower


def poll_times(primary: FakePrimary, since: float) -> list[float]:
    return [t - since for t, path in primary.requests if path == "/mirror/topics"]


async def test_backoff_state_and_lag_on_the_virtual_clock(
    autojump_clock: trio.testing.MockClock, start_daemon: StartDaemon, nursery: trio.Nursery
) -> None:
    primary = FakePrimary()
    primary.publish(5)
    node, follower = await follow(start_daemon, primary)
    t0 = trio.current_time()
    nursery.start_soon(follower.run)
    await trio.sleep(8.0)
    # Unreachable: the topic list is asked for at once, then 0.5, 1, 2, 4 s later.
    assert poll_times(primary, t0) == [0.0, 0.5, 1.5, 3.5, 7.5]
    stats = follower.statistics(trio.current_time())
    assert (stats.state, stats.failures, stats.seconds_since_contact) == ("disconnected", 5, -1.0)
    assert "Connection refused" in stats.last_error
    assert node.broker.topic_or_none("t") is None  # nothing followed before the first answer

    primary.up = True  # back: the next try, 8 s after the fifth failure, finds it
    await trio.sleep(7.4)
    assert poll_times(primary, t0)[-1] == 7.5
    await trio.sleep(0.2)
    assert poll_times(primary, t0)[5] == 15.5
    # (From the first answer on, the follower writes its role and state in worker threads:
    # virtual time may jump while they run, so the test waits for what it looks at.)
    await eventually(lambda: "t" in node.broker.topics)
    topic = node.broker.topics["t"]
    await eventually(lambda: topic.stream.next_offset == 5)
    assert topic.following
    stats = follower.statistics(trio.current_time())
    assert stats.state == "following" and stats.failures == 0
    (t,) = stats.topics
    assert (t.lag_messages, t.lag_seconds, t.copied_messages, t.gap_messages) == (0, 0.0, 5, 0)

    # The primary goes away again: disconnected, and the lag in seconds grows from the last
    # answer (everything published since is not copied).
    primary.up = False
    await trio.sleep(3.0)
    now = trio.current_time()
    stats = follower.statistics(now)
    assert stats.state == "disconnected"
    (t,) = stats.topics
    assert t.state == "disconnected"
    assert t.lag_seconds == pytest.approx((virtual_wall_ns() - follower.last_contact_ns) / 1e9)
    assert t.lag_seconds >= 2.0
    primary.publish(3)
    primary.up = True
    await eventually(lambda: topic.stream.next_offset == 8)
    assert follower.statistics(trio.current_time()).state == "following"
    await follower.stop()


async def test_an_answer_that_is_not_lmqd_stops_the_follower(
    autojump_clock: trio.testing.MockClock, start_daemon: StartDaemon
) -> None:
    primary = FakePrimary()
    primary.up = primary.answer_html = True
    _, follower = await follow(start_daemon, primary)
    with pytest.raises(BaseExceptionGroup) as info:
        async with trio.open_nursery() as inner:
            inner.start_soon(follower.run)
    assert info.group_contains(MirrorRefused, match="not an lmqd HTTP API", depth=None)


async def test_writes_are_refused_with_the_primary_named(
    autojump_clock: trio.testing.MockClock, start_daemon: StartDaemon
) -> None:
    node, follower = await follow(start_daemon, FakePrimary())
    broker = node.broker
    refused: Any
    for refused in (lambda: broker.publish("t", [b"x"]), lambda: broker.check_topic_write("t"),
                    lambda: broker.check_channel_write("t", "c")):  # fmt: skip
        with pytest.raises(Exception, match="mirror of primary:4151: read-only until promoted"):
            refused()
    broker.publish("scratch#ephemeral", [b"x"])  # ephemeral topics are the mirror's own
    follower.local_channels.add(("t", "replay"))
    broker.check_channel_write("t", "replay")
    assert broker.topic_or_none("t") is None  # a refused publish creates nothing
