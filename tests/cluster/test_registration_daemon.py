"""A whole lmqd registering: HTTP and TCP clients make the events, a scripted lookupd sees them.

Rules for this module: real ``LmqDaemon``s in-process (``start_lmqd``) on 127.0.0.1 port 0 and a
``FakeLookupd``; the real clock (the daemon's worker threads and the autojump clock do not mix:
exact times are test_registration_schedule.py's business), every test bounded by
``trio.fail_after``; waits are for what the lookupd received, never sleeps for a guessed time.
"""

from __future__ import annotations

import json
import socket

import trio

from lmq_client.consumer import Consumer
from lmqd.lookup import Identify, Register, Unregister

from .conftest import LmqdNode, StartLmqd, http_request
from .fakelookupd import FakeLookupd

TIMEOUT = 20.0


async def lookupd(nursery: trio.Nursery) -> FakeLookupd:
    fake = FakeLookupd(nursery)
    await fake.start()
    return fake


def identify(node: LmqdNode, **overrides: object) -> Identify:
    fields: dict[str, object] = {
        "broadcast_address": "127.0.0.1", "tcp_port": node.tcp[1], "http_port": node.http[1],
        "version": "1.3.0", "hostname": socket.gethostname(),
    }  # fmt: skip
    fields.update(overrides)
    return Identify(**fields)  # type: ignore[arg-type]


async def post(node: LmqdNode, target: str) -> None:
    result = await http_request(node.http, "POST", target)
    assert result.status == 200, (target, result)


async def test_identify_has_the_bound_ports_or_the_broadcast_ones(
    nursery: trio.Nursery, start_lmqd: StartLmqd
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        plain = await start_lmqd(nsqlookupd_tcp_addresses=(fake.address,))
        await fake.wait_for(1)
        assert fake.commands() == [identify(plain)]
        behind_nat = await start_lmqd(
            nsqlookupd_tcp_addresses=(fake.address,),
            broadcast_address="node-b.example",
            broadcast_tcp_port=5150,
            broadcast_http_port=5151,
        )
        await fake.wait_for(2)
        assert fake.commands(2) == [identify(
            behind_nat, broadcast_address="node-b.example", tcp_port=5150, http_port=5151
        )]  # fmt: skip


async def test_http_and_consumers_make_the_events(
    nursery: trio.Nursery, start_lmqd: StartLmqd
) -> None:
    with trio.fail_after(TIMEOUT):
        fake = await lookupd(nursery)
        node = await start_lmqd(nsqlookupd_tcp_addresses=(fake.address,))
        await fake.wait_for(1)
        await post(node, "/topic/create?topic=t")
        await post(node, "/channel/create?topic=t&channel=c")
        await post(node, "/channel/create?topic=t&channel=d")
        await post(node, "/channel/delete?topic=t&channel=d")
        await post(node, "/topic/create?topic=x%23tmp")  # never registered
        await post(node, "/channel/create?topic=t&channel=c%23tmp")  # never registered
        await post(node, "/topic/delete?topic=t")
        # SUB creates both; the last consumer leaving deletes the channel, and with it the
        # ephemeral topic
        async with Consumer("e#ephemeral", "c#ephemeral", node.tcp_address):
            pass
        await fake.wait_for(11)
        assert fake.commands()[1:] == [
            Register(topic="t"),
            Register(topic="t", channel="c"),
            Register(topic="t", channel="d"),
            Unregister(topic="t", channel="d"),
            Unregister(topic="t"),
            Unregister(topic="t", channel="c"),
            Register(topic="e#ephemeral"),
            Register(topic="e#ephemeral", channel="c#ephemeral"),
            Unregister(topic="e#ephemeral", channel="c#ephemeral"),
            Unregister(topic="e#ephemeral"),
        ]


async def test_put_config_nsqlookupd_tcp_addresses_takes_effect_at_once(
    nursery: trio.Nursery, start_lmqd: StartLmqd
) -> None:
    with trio.fail_after(TIMEOUT):
        a, b = await lookupd(nursery), await lookupd(nursery)
        node = await start_lmqd(nsqlookupd_tcp_addresses=(a.address,))
        await post(node, "/topic/create?topic=t")
        await a.wait_for(2)
        body = json.dumps([b.address]).encode()
        result = await http_request(node.http, "PUT", "/config/nsqlookupd_tcp_addresses", body)
        assert (result.status, result.json()) == (200, [b.address])
        await b.wait_for(2)
        assert b.commands() == [identify(node), Register(topic="t")]
        result = await http_request(node.http, "GET", "/config/nsqlookupd_tcp_addresses")
        assert result.json() == [b.address]
        await a.wait_no_connections()  # a sees the node disconnect
        result = await http_request(node.http, "PUT", "/config/nsqlookupd_tcp_addresses", b"[]")
        assert (result.status, result.json()) == (200, [])
        assert node.daemon.registration.peers == []
