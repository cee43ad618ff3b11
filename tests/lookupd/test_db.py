"""The registration DB and the answers built from it, on trio's virtual clock.

Rules for this module:
- every timing test runs on ``autojump_clock`` and asserts exact virtual times: the inactive
  timeout is strictly greater-than (active at exactly 300 s, gone just after), a tombstone hides
  while ``now - at < 45`` (hidden just before 45 s, back at exactly 45 s);
- the real connection handler (``TcpPeerHandler``) is driven over ``memory_stream_pair`` by a
  node speaking through the client codec: fakes, not mocks;
- answers are read through ``Views``, what the HTTP endpoints serialise.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing

from lmqd.lookup import (
    Command,
    ConnectionClosed,
    Identify,
    IdentifyResponse,
    LookupClientConnection,
    Ok,
    Ping,
    Register,
    Response,
    Unregister,
)
from lmqd.lookupd.db import RegistrationDB
from lmqd.lookupd.tcp import TcpPeerHandler
from lmqd.lookupd.views import GO_ZERO_TIME_NS, ApiError, Settings, Views

INACTIVE_S = 300.0
TOMBSTONE_S = 45.0
ANSWER = IdentifyResponse(
    broadcast_address="lookupd", tcp_port=4160, http_port=4161, version="1.3.0"
)


def q(**params: str) -> Callable[[str], str | None]:
    return params.get


class Node:
    """A registering node on a memory stream to the real handler."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.codec = LookupClientConnection()
        self.sent_magic = False

    async def send(self, *commands: Command) -> list[Response]:
        data = b"".join(self.codec.send(c) for c in commands)
        if not self.sent_magic:
            data = self.codec.initial_bytes() + data
            self.sent_magic = True
        await self.stream.send_all(data)
        responses: list[Response] = []
        while len(responses) < len(commands):
            event = self.codec.next_event()
            if event is None:
                self.codec.receive_data(await self.stream.receive_some())
            else:
                assert not isinstance(event, ConnectionClosed), responses
                responses.append(event)
        return responses


class Lookupd:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.db = RegistrationDB()
        self.handler = TcpPeerHandler(self.db, ANSWER)
        self.views = Views(
            self.db,
            Settings(
                inactive_producer_timeout=INACTIVE_S,
                tombstone_lifetime=TOMBSTONE_S,
                version="1.3.0",
            ),
        )

    async def connect(self, remote: str, *, port: int = 4150, address: str = "10.0.0.1") -> Node:
        client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.handler.serve, server, remote)
        node = Node(client)
        identify = Identify(
            broadcast_address=address, tcp_port=port, http_port=port + 1, version="1.3.0",
            hostname="host-" + remote,
        )  # fmt: skip
        assert await node.send(identify) == [ANSWER]
        return node

    def lookup(self, topic: str) -> dict[str, Any]:
        return self.views.lookup(q(topic=topic), trio.current_time())

    def producers(self, topic: str) -> list[str]:
        return [p["remote_address"] for p in self.lookup(topic)["producers"]]

    def nodes(self) -> list[tuple[str, list[str], list[bool]]]:
        answer = self.views.nodes(trio.current_time())
        return [(n["remote_address"], n["topics"], n["tombstones"]) for n in answer["producers"]]


@pytest.fixture
async def lookupd(nursery: trio.Nursery) -> AsyncIterator[Lookupd]:
    with trio.fail_after(3600):  # virtual seconds: the guard for a hung handler
        yield Lookupd(nursery)


async def test_register_then_lookup_shapes(lookupd: Lookupd) -> None:
    node = await lookupd.connect("10.0.0.1:5000")
    assert await node.send(Register(topic="t", channel="c"), Register(topic="u")) == [Ok(), Ok()]
    assert lookupd.lookup("t") == {
        "channels": ["c"],
        "producers": [
            {
                "remote_address": "10.0.0.1:5000",
                "hostname": "host-10.0.0.1:5000",
                "broadcast_address": "10.0.0.1",
                "tcp_port": 4150,
                "http_port": 4151,
                "version": "1.3.0",
            }
        ],
    }
    assert lookupd.views.topics() == {"topics": ["t", "u"]}
    assert lookupd.views.channels(q(topic="t")) == {"channels": ["c"]}
    assert lookupd.views.channels(q(topic="nope")) == {"channels": []}
    assert lookupd.nodes() == [("10.0.0.1:5000", ["t", "u"], [False, False])]


async def test_inactive_exactly_after_the_timeout_and_back_on_ping(
    lookupd: Lookupd, autojump_clock: trio.testing.MockClock
) -> None:
    node = await lookupd.connect("10.0.0.1:5000")
    await node.send(Register(topic="t"))  # REGISTER does not refresh liveness
    start = trio.current_time()
    await trio.sleep(200)
    await node.send(Register(topic="u"))
    await trio.sleep(100)
    assert trio.current_time() - start == INACTIVE_S
    assert lookupd.producers("t") == ["10.0.0.1:5000"]  # not yet: the rule is "> 300 s"
    assert len(lookupd.nodes()) == 1
    await trio.sleep(0.001)
    assert lookupd.producers("t") == []
    assert lookupd.nodes() == []
    # Hidden, not removed: the keys are listed and /debug still shows the records.
    assert lookupd.views.topics() == {"topics": ["t", "u"]}
    assert "topic:t:" in lookupd.views.debug(0.0)
    assert await node.send(Ping()) == [Ok()]
    assert lookupd.producers("t") == ["10.0.0.1:5000"]
    assert lookupd.nodes() == [("10.0.0.1:5000", ["t", "u"], [False, False])]


async def test_ping_every_15s_keeps_a_node_active(
    lookupd: Lookupd, autojump_clock: trio.testing.MockClock
) -> None:
    node = await lookupd.connect("10.0.0.1:5000")
    await node.send(Register(topic="t"))
    for _ in range(40):  # 600 s of nsqd's PING ticker
        await trio.sleep(15)
        await node.send(Ping())
    await trio.sleep(INACTIVE_S)
    assert lookupd.producers("t") == ["10.0.0.1:5000"]
    await trio.sleep(0.001)
    assert lookupd.producers("t") == []


async def test_ping_before_identify_is_ok_and_registers_nothing(lookupd: Lookupd) -> None:
    client, server = trio.testing.memory_stream_pair()
    lookupd.nursery.start_soon(lookupd.handler.serve, server, "10.0.0.9:1")
    node = Node(client)
    assert await node.send(Ping()) == [Ok()]
    assert lookupd.views.nodes(trio.current_time()) == {"producers": []}
    assert len(lookupd.db) == 0


async def test_tombstone_hides_one_node_for_one_topic_for_exactly_the_lifetime(
    lookupd: Lookupd, autojump_clock: trio.testing.MockClock
) -> None:
    a = await lookupd.connect("10.0.0.1:5000", address="10.0.0.1", port=4150)
    b = await lookupd.connect("10.0.0.2:5000", address="10.0.0.2", port=4150)
    for node in (a, b):
        await node.send(Register(topic="t", channel="c"), Register(topic="other"))
    await trio.sleep(10)
    at = trio.current_time()
    lookupd.views.tombstone_topic(q(topic="t", node="10.0.0.1:4151"), trio.current_time())
    assert lookupd.producers("t") == ["10.0.0.2:5000"]
    assert lookupd.producers("other") == ["10.0.0.1:5000", "10.0.0.2:5000"]
    assert lookupd.lookup("t")["channels"] == ["c"]  # channels are unaffected
    assert lookupd.nodes() == [
        ("10.0.0.1:5000", ["t", "other"], [True, False]),
        ("10.0.0.2:5000", ["t", "other"], [False, False]),
    ]
    await a.send(Register(topic="t"))  # a re-REGISTER does not clear the tombstone
    await trio.sleep(TOMBSTONE_S - 0.001)
    assert lookupd.producers("t") == ["10.0.0.2:5000"]
    await trio.sleep(0.001)
    assert trio.current_time() - at == pytest.approx(TOMBSTONE_S)
    assert trio.current_time() - at >= TOMBSTONE_S
    assert lookupd.producers("t") == ["10.0.0.1:5000", "10.0.0.2:5000"]
    assert lookupd.nodes()[0] == ("10.0.0.1:5000", ["t", "other"], [False, False])


async def test_unregister_clears_a_tombstone_and_register_starts_fresh(
    lookupd: Lookupd, autojump_clock: trio.testing.MockClock
) -> None:
    a = await lookupd.connect("10.0.0.1:5000")
    await a.send(Register(topic="t"))
    lookupd.views.tombstone_topic(q(topic="t", node="10.0.0.1:4151"), trio.current_time())
    assert lookupd.producers("t") == []
    await a.send(Unregister(topic="t"), Register(topic="t"))
    assert lookupd.producers("t") == ["10.0.0.1:5000"]


async def test_tombstone_matches_broadcast_address_and_http_port(lookupd: Lookupd) -> None:
    a = await lookupd.connect("10.0.0.1:5000", address="10.0.0.1", port=4150)
    await a.send(Register(topic="t"))
    for node in ("10.0.0.1:4150", "10.0.0.2:4151", "[10.0.0.1]:4151", "10.0.0.1"):
        lookupd.views.tombstone_topic(q(topic="t", node=node), trio.current_time())
    assert lookupd.producers("t") == ["10.0.0.1:5000"]


async def test_disconnect_removes_producers_and_keeps_keys(lookupd: Lookupd) -> None:
    a = await lookupd.connect("10.0.0.1:5000")
    b = await lookupd.connect("10.0.0.2:5000")
    await a.send(Register(topic="t", channel="c"), Register(topic="e#ephemeral"))
    await b.send(Register(topic="t"))
    await a.stream.aclose()
    await trio.testing.wait_all_tasks_blocked()
    assert lookupd.producers("t") == ["10.0.0.2:5000"]
    assert lookupd.producers("e#ephemeral") == []  # the key stays, even an ephemeral one
    assert lookupd.views.topics() == {"topics": ["t", "e#ephemeral"]}
    assert lookupd.views.channels(q(topic="t")) == {"channels": ["c"]}
    assert [n[0] for n in lookupd.nodes()] == ["10.0.0.2:5000"]
    assert sorted(lookupd.views.debug(0.0)) == ["client::", "topic:t:"]


async def test_unregister_rules_for_ephemeral_and_topic(lookupd: Lookupd) -> None:
    a = await lookupd.connect("10.0.0.1:5000")
    b = await lookupd.connect("10.0.0.2:5000")
    await a.send(
        Register(topic="t", channel="keep"),
        Register(topic="t", channel="tmp#ephemeral"),
        Register(topic="e#ephemeral", channel="c"),
    )
    await b.send(Register(topic="t", channel="tmp#ephemeral"))
    # An #ephemeral channel key goes when its last producer unregisters, not before.
    await a.send(Unregister(topic="t", channel="tmp#ephemeral"))
    assert lookupd.views.channels(q(topic="t")) == {"channels": ["keep", "tmp#ephemeral"]}
    await b.send(Unregister(topic="t", channel="tmp#ephemeral"))
    assert lookupd.views.channels(q(topic="t")) == {"channels": ["keep"]}
    # A non-ephemeral key stays without producers; so does an unknown one's absence.
    await a.send(Unregister(topic="t", channel="keep"), Unregister(topic="t", channel="nope"))
    assert lookupd.views.channels(q(topic="t")) == {"channels": ["keep"]}
    # UNREGISTER of an ephemeral topic deletes the topic key but keeps its channel keys.
    await a.send(Unregister(topic="e#ephemeral"))
    assert lookupd.views.topics() == {"topics": ["t"]}
    assert lookupd.views.channels(q(topic="e#ephemeral")) == {"channels": ["c"]}
    assert "channel:e#ephemeral:c" not in lookupd.views.debug(0.0)  # no producer left in it


async def test_http_admin_endpoints_on_the_db(lookupd: Lookupd) -> None:
    views = lookupd.views
    views.create_channel(q(topic="t", channel="c"))
    assert lookupd.lookup("t") == {"channels": ["c"], "producers": []}
    views.create_topic(q(topic="u"))
    assert views.topics() == {"topics": ["t", "u"]}
    a = await lookupd.connect("10.0.0.1:5000")
    await a.send(Register(topic="t", channel="c"))
    views.delete_channel(q(topic="t", channel="c"))
    assert lookupd.lookup("t")["channels"] == []
    with pytest.raises(ApiError) as info:
        views.delete_channel(q(topic="t", channel="c"))
    assert (info.value.status, info.value.message) == (404, "CHANNEL_NOT_FOUND")
    # Deleting a topic under a live producer hides it until it registers again.
    views.delete_topic(q(topic="t"))
    with pytest.raises(ApiError) as info:
        lookupd.lookup("t")
    assert (info.value.status, info.value.message) == (404, "TOPIC_NOT_FOUND")
    assert lookupd.nodes() == [("10.0.0.1:5000", [], [])]
    await a.send(Register(topic="t"))
    assert lookupd.producers("t") == ["10.0.0.1:5000"]
    views.delete_topic(q(topic="never!valid"))  # 200 for any name


async def test_debug_shape_and_times(
    lookupd: Lookupd, autojump_clock: trio.testing.MockClock
) -> None:
    a = await lookupd.connect("10.0.0.1:5000")
    identified = trio.current_time()
    await a.send(Register(topic="t"))
    await trio.sleep(2)
    lookupd.views.tombstone_topic(q(topic="t", node="10.0.0.1:4151"), trio.current_time())
    offset = 1_700_000_000.0
    debug = lookupd.views.debug(offset)
    assert list(debug) == ["client::", "topic:t:"]
    entry = debug["topic:t:"][0]
    assert list(entry) == sorted(entry)
    assert entry["id"] == "10.0.0.1:5000"
    assert entry["last_update"] == round((identified + offset) * 1e9)
    assert entry["tombstoned"] is True
    assert entry["tombstoned_at"] == round((identified + 2 + offset) * 1e9)
    assert debug["client::"][0]["tombstoned_at"] == GO_ZERO_TIME_NS


def test_wildcard_patterns() -> None:
    db = RegistrationDB()
    views = Views(db, Settings(inactive_producer_timeout=1, tombstone_lifetime=1, version="v"))
    views.create_channel(q(topic="a", channel="x"))
    views.create_channel(q(topic="b", channel="y"))
    assert views.lookup(q(topic="*"), 0.0) == {"channels": ["x", "y"], "producers": []}
    assert views.channels(q(topic="*")) == {"channels": ["x", "y"]}
