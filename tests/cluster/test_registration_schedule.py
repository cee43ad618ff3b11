"""lmqd's registration on the autojump clock: what it sends to a lookupd, in what order, when.

Rules for this module: a ``Broker`` and its ``Registration`` run in the test's nursery (not a
whole daemon: its worker threads would let the autojump clock jump while they run) and register
with a ``FakeLookupd`` on 127.0.0.1, port 0. Every test runs on the autojump clock and asserts
exact virtual times: PING every 15 s, reconnect after 1, 2, 4 ... 15 s, an answer due within
5 s. Each test is bounded by ``trio.fail_after`` in virtual time. Topics and channels come and
go through the broker, as the TCP and HTTP layers make them (those paths are exercised end to
end in test_registration_daemon.py).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from lmqd.broker import BoundAddresses, Broker
from lmqd.lookup import Command, Error, Identify, Ping, Register, Unregister
from lmqd.options import Options
from lmqd.registration import Registration
from lmqd.storage import AnchoredTimeBase

from .fakelookupd import FakeLookupd, Received

# Virtual seconds: generous, since the autojump clock makes waiting free.
TIMEOUT = 600.0
TCP_PORT, HTTP_PORT = 4150, 4151  # only reported in IDENTIFY: nothing listens in these tests


@attrs.frozen
class Node:
    broker: Broker
    registration: Registration


StartNode = Callable[..., Awaitable[Node]]


@pytest.fixture
async def start_node(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[StartNode]:
    brokers: list[Broker] = []
    scopes: list[trio.CancelScope] = []

    async def start(*, http: bool = True, **overrides: Any) -> Node:
        data = tmp_path / f"node{len(brokers)}"
        data.mkdir()
        options = Options(**{"broadcast_address": "127.0.0.1", "data_path": str(data),
                             **overrides})  # fmt: skip
        broker = Broker(options, hold_data_dir=lambda: AnchoredTimeBase.now(trio.current_time()))
        bound_http = ("127.0.0.1", HTTP_PORT) if http else None
        broker.addresses = BoundAddresses(tcp=("127.0.0.1", TCP_PORT), http=bound_http)
        registration = Registration(broker)
        scope = trio.CancelScope()

        async def run(*, task_status: trio.TaskStatus[None]) -> None:
            with scope:
                await registration.run(task_status=task_status)

        await nursery.start(run)
        brokers.append(broker)
        scopes.append(scope)
        return Node(broker, registration)

    yield start
    for scope in scopes:
        scope.cancel()
    for broker in brokers:
        broker.close_topics()


async def lookupd(nursery: trio.Nursery) -> FakeLookupd:
    fake = FakeLookupd(nursery)
    await fake.start()
    return fake


def identify(**overrides: object) -> Identify:
    fields: dict[str, object] = {
        "broadcast_address": "127.0.0.1", "tcp_port": TCP_PORT, "http_port": HTTP_PORT,
        "version": "1.3.0", "hostname": socket.gethostname(),
    }  # fmt: skip
    fields.update(overrides)
    return Identify(**fields)  # type: ignore[arg-type]


async def test_identify_then_ping_every_15_seconds(
    nursery: trio.Nursery, start_node: StartNode, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        started = trio.current_time()
        await start_node(nsqlookupd_tcp_addresses=(fake.address,))
        await trio.sleep(50)
        assert fake.received == [
            Received(started, 1, identify()),
            Received(started + 15, 1, Ping()),
            Received(started + 30, 1, Ping()),
            Received(started + 45, 1, Ping()),
        ]


async def test_handshake_registers_topics_bare_or_per_channel(
    nursery: trio.Nursery, start_node: StartNode, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        node = await start_node()
        broker = node.broker
        broker.get_topic("bare")
        broker.get_topic("t").get_channel("c")
        broker.get_topic("t").get_channel("d")
        broker.get_topic("e#ephemeral").get_channel("c#ephemeral")
        broker.get_topic("only-tmp").get_channel("c#tmp")
        broker.get_topic("x#tmp").get_channel("c")
        broker.update_options(attrs.evolve(broker.options, nsqlookupd_tcp_addresses=(
            fake.address,
        )))  # fmt: skip
        await fake.wait_for(6)
        await trio.sleep(1)
        assert fake.commands() == [
            identify(),
            Register(topic="bare"),
            Register(topic="t", channel="c"),
            Register(topic="t", channel="d"),
            Register(topic="e#ephemeral", channel="c#ephemeral"),
            Register(topic="only-tmp"),  # lmq's #tmp names are never registered
        ]


async def test_topic_and_channel_events_become_commands_in_order(
    nursery: trio.Nursery, start_node: StartNode, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        node = await start_node(nsqlookupd_tcp_addresses=(fake.address,))
        await fake.wait_for(1)
        broker = node.broker
        topic = broker.get_topic("t")
        topic.get_channel("c")
        topic.get_channel("d")
        topic.delete_channel("d")
        broker.get_topic("x#tmp").get_channel("c")
        topic.get_channel("c#tmp")
        topic.delete_channel("c#tmp")
        broker.delete_topic("t")
        ephemeral = broker.get_topic("e#ephemeral")
        ephemeral.get_channel("c")
        ephemeral.delete_channel("c")  # the last channel: the ephemeral topic goes too
        await fake.wait_for(11)
        at = trio.current_time()
        expected: list[Command] = [
            Register(topic="t"),
            Register(topic="t", channel="c"),
            Register(topic="t", channel="d"),
            Unregister(topic="t", channel="d"),
            Unregister(topic="t"),
            Unregister(topic="t", channel="c"),
            Register(topic="e#ephemeral"),
            Register(topic="e#ephemeral", channel="c"),
            Unregister(topic="e#ephemeral", channel="c"),
            Unregister(topic="e#ephemeral"),
        ]
        assert fake.received[1:] == [Received(at, 1, command) for command in expected]
        assert "e#ephemeral" not in broker.topics


async def test_a_dropped_connection_is_reregistered_one_second_later(
    nursery: trio.Nursery, start_node: StartNode, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        node = await start_node(nsqlookupd_tcp_addresses=(fake.address,))
        broker = node.broker
        broker.get_topic("t").get_channel("c")
        broker.get_topic("bare")
        await fake.wait_for(4)
        await trio.sleep(16)
        fake.drop()
        dropped = trio.current_time()
        # Meanwhile (not connected) the node changes: the next handshake says how it is now.
        broker.get_topic("bare").get_channel("late")
        broker.get_topic("new")
        await fake.wait_for(9)
        handshake: list[Command] = [
            identify(),
            Register(topic="t", channel="c"),
            Register(topic="bare", channel="late"),
            Register(topic="new"),
        ]
        assert [r for r in fake.received if r.connection == 2] == [
            Received(dropped + 1, 2, command) for command in handshake
        ]
        await trio.sleep(20)
        assert fake.times(Ping)[-1] == dropped + 16  # 15 s after the new connection


async def test_a_lookupd_that_is_down_is_tried_with_backoff(
    nursery: trio.Nursery, start_node: StartNode, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        fake.stop()
        started = trio.current_time()
        node = await start_node(nsqlookupd_tcp_addresses=(fake.address,))
        node.broker.get_topic("t")
        # attempts at +0, +1, +3, +7, +15, +30: up just after the fifth, found at the sixth
        await trio.sleep(16)
        [peer] = node.registration.peers
        assert (peer.failures, peer.connect_at) == (5, started + 30)
        await fake.start()
        await fake.wait_for(2)
        assert fake.received == [
            Received(started + 30, 1, identify()),
            Received(started + 30, 1, Register(topic="t")),
        ]


async def test_an_unanswered_ping_drops_the_connection_after_5_seconds(
    nursery: trio.Nursery, start_node: StartNode, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        started = trio.current_time()
        await start_node(nsqlookupd_tcp_addresses=(fake.address,))
        await fake.wait_for(1)
        fake.silent = True
        await fake.wait_for(2)  # the PING at +15, never answered
        fake.silent = False
        await fake.wait_for(3)
        assert fake.received == [
            Received(started, 1, identify()),
            Received(started + 15, 1, Ping()),
            Received(started + 21, 2, identify()),  # dropped at +20, back 1 s later
        ]


async def test_an_error_answer_ends_the_connection_and_it_comes_back(
    nursery: trio.Nursery, start_node: StartNode, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        fake.refuse = Error(code="E_BAD_BODY", text="IDENTIFY missing fields")
        started = trio.current_time()
        await start_node(nsqlookupd_tcp_addresses=(fake.address,))
        await fake.wait_for(2)
        assert fake.received == [
            Received(started, 1, identify()),
            Received(started + 1, 2, identify()),
        ]


async def test_changed_addresses_connect_at_once_and_keep_the_others(
    nursery: trio.Nursery, start_node: StartNode, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        a, b = await lookupd(nursery), await lookupd(nursery)
        node = await start_node(nsqlookupd_tcp_addresses=(a.address,))
        broker = node.broker
        broker.get_topic("t")
        await a.wait_for(2)
        await trio.sleep(3)
        changed = trio.current_time()
        broker.update_options(attrs.evolve(broker.options, nsqlookupd_tcp_addresses=(b.address,)))
        await b.wait_for(2)
        assert b.received == [
            Received(changed, 1, identify()),
            Received(changed, 1, Register(topic="t")),
        ]
        await trio.sleep(40)
        assert len(a.received) == 2  # disconnected: not even a PING since
        both = (b.address, a.address, b.address)  # duplicates are ignored (nsqd)
        added = trio.current_time()
        broker.update_options(attrs.evolve(broker.options, nsqlookupd_tcp_addresses=both))
        await a.wait_for(4)
        assert a.received[2:] == [
            Received(added, 2, identify()),
            Received(added, 2, Register(topic="t")),
        ]
        assert b.connections == 1
        assert [p.address for p in node.registration.peers] == [b.address, a.address]
        assert b.times(Ping) == [changed + 15, changed + 30]


async def test_without_an_http_port_the_lookupd_refuses_and_the_log_says_why(
    nursery: trio.Nursery, start_node: StartNode, autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        node = await start_node(http=False, nsqlookupd_tcp_addresses=(fake.address,))
        assert "no HTTP listener and no --broadcast-http-port" in caplog.text
        await trio.sleep(20)
        # every IDENTIFY is refused (E_BAD_BODY IDENTIFY missing fields); retried with backoff
        assert fake.received == []
        [peer] = node.registration.peers
        assert peer.failures >= 3 and peer.info is None
