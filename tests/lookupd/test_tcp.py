"""lmqlookupd over real sockets: nodes register over V1 TCP, answers are read over HTTP.

Rules for this module:
- one in-process ``LookupDaemon`` per test (the ``lookupd`` fixture), on 127.0.0.1 port 0;
  ``await nursery.start(...)`` returns its bound addresses;
- a ``fail_after`` guard per test; raw bytes for bad input, the client codec (``V1Peer``) for
  well-behaved nodes; expected error frames are nsqlookupd v1.3.0's, byte for byte.
"""

from __future__ import annotations

import struct

import pytest
import trio

from lmqd.lookup import IdentifyResponse, Ok, Ping, Register, Unregister

from .conftest import RunningLookupd
from .wire import V1Peer, get_json, http, identify, post_ok, raw_exchange

TIMEOUT_S = 10


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


async def wait_until_gone(lookupd: RunningLookupd, topic: str, remote: str) -> None:
    while True:  # the server task notices the close asynchronously
        producers = (await get_json(lookupd.http, f"/lookup?topic={topic}"))["producers"]
        if all(p["remote_address"] != remote for p in producers):
            return
        await trio.sleep(0.01)


async def test_identify_answer_has_the_real_ports(lookupd: RunningLookupd) -> None:
    with trio.fail_after(TIMEOUT_S):
        peer = await V1Peer.connect(lookupd.tcp)
        [answer] = await peer.command(identify(4150))
        assert isinstance(answer, IdentifyResponse)
        assert (answer.broadcast_address, answer.tcp_port, answer.http_port, answer.version) == (
            "127.0.0.1", lookupd.tcp[1], lookupd.http[1], "1.3.0",
        )  # fmt: skip
        assert answer.hostname
        await peer.aclose()


async def test_registering_and_every_query(lookupd: RunningLookupd) -> None:
    with trio.fail_after(TIMEOUT_S):
        a = await V1Peer.connect(lookupd.tcp)
        b = await V1Peer.connect(lookupd.tcp)
        await a.command(identify(4150, hostname="a"))
        await b.command(identify(5150, hostname="b"))
        # nsqd's start-up: one REGISTER per channel, a bare one for a topic without channels.
        assert await a.command(
            Register(topic="orders", channel="billing"),
            Register(topic="orders", channel="archive#ephemeral"),
            Register(topic="audit"),
            Ping(),
        ) == [Ok()] * 4
        await b.command(Register(topic="orders", channel="billing"))

        lookup = await get_json(lookupd.http, "/lookup?topic=orders")
        assert lookup["channels"] == ["billing", "archive#ephemeral"]
        assert lookup["producers"] == [
            {"remote_address": a.local_address, "hostname": "a", "broadcast_address": "127.0.0.1",
             "tcp_port": 4150, "http_port": 4151, "version": "1.3.0"},
            {"remote_address": b.local_address, "hostname": "b", "broadcast_address": "127.0.0.1",
             "tcp_port": 5150, "http_port": 5151, "version": "1.3.0"},
        ]  # fmt: skip
        assert await get_json(lookupd.http, "/topics") == {"topics": ["orders", "audit"]}
        assert await get_json(lookupd.http, "/channels?topic=orders") == {
            "channels": ["billing", "archive#ephemeral"]
        }
        nodes = (await get_json(lookupd.http, "/nodes"))["producers"]
        assert [(n["remote_address"], n["topics"], n["tombstones"]) for n in nodes] == [
            (a.local_address, ["orders", "audit"], [False, False]),
            (b.local_address, ["orders"], [False]),
        ]
        assert list(nodes[0]) == [
            "remote_address", "hostname", "broadcast_address", "tcp_port", "http_port",
            "version", "tombstones", "topics",
        ]  # fmt: skip

        assert await a.command(Unregister(topic="orders", channel="archive#ephemeral")) == [Ok()]
        assert await get_json(lookupd.http, "/channels?topic=orders") == {"channels": ["billing"]}
        await a.aclose()
        await b.aclose()


async def test_disconnect_removes_the_node_but_keeps_the_keys(lookupd: RunningLookupd) -> None:
    with trio.fail_after(TIMEOUT_S):
        a = await V1Peer.connect(lookupd.tcp)
        b = await V1Peer.connect(lookupd.tcp)
        await a.command(identify(4150), Register(topic="t", channel="c"))
        await b.command(identify(5150), Register(topic="t"))
        await a.aclose()
        await wait_until_gone(lookupd, "t", a.local_address)
        lookup = await get_json(lookupd.http, "/lookup?topic=t")
        assert lookup["channels"] == ["c"]
        assert [p["remote_address"] for p in lookup["producers"]] == [b.local_address]
        nodes = (await get_json(lookupd.http, "/nodes"))["producers"]
        assert [n["remote_address"] for n in nodes] == [b.local_address]
        await b.aclose()
        await wait_until_gone(lookupd, "t", b.local_address)
        assert await get_json(lookupd.http, "/lookup?topic=t") == {
            "channels": ["c"], "producers": []
        }  # fmt: skip
        assert await get_json(lookupd.http, "/nodes") == {"producers": []}


async def test_tombstoning_a_topic_on_one_node(lookupd: RunningLookupd) -> None:
    with trio.fail_after(TIMEOUT_S):
        a = await V1Peer.connect(lookupd.tcp)
        b = await V1Peer.connect(lookupd.tcp)
        await a.command(identify(4150), Register(topic="t"), Register(topic="other"))
        await b.command(identify(5150), Register(topic="t"), Register(topic="other"))
        # nsqadmin's "tombstone": node = the nsqd's broadcast_address:http_port.
        await post_ok(lookupd.http, "/topic/tombstone?topic=t&node=127.0.0.1:4151")

        def remotes(answer: dict[str, list[dict[str, object]]]) -> list[object]:
            return [p["remote_address"] for p in answer["producers"]]

        assert remotes(await get_json(lookupd.http, "/lookup?topic=t")) == [b.local_address]
        assert remotes(await get_json(lookupd.http, "/lookup?topic=other")) == [
            a.local_address, b.local_address,
        ]  # fmt: skip
        nodes = (await get_json(lookupd.http, "/nodes"))["producers"]
        assert [(n["topics"], n["tombstones"]) for n in nodes] == [
            (["t", "other"], [True, False]),
            (["t", "other"], [False, False]),
        ]
        await a.aclose()
        await b.aclose()


@pytest.mark.parametrize(
    ("data", "answer"),
    [
        (b"  V2PING\n", b"E_BAD_PROTOCOL"),
        (b"  V1FOO\n", b"E_INVALID invalid command FOO"),
        (b"  V1\n", b"E_INVALID invalid command "),
        (b"  V1REGISTER t\n", b"E_INVALID client must IDENTIFY"),
        (b"  V1IDENTIFY\n" + frame(b"{bad json"),
         b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"  V1IDENTIFY\n" + frame(b'{"broadcast_address":"a","tcp_port":1}'),
         b"E_BAD_BODY IDENTIFY missing fields"),
        (b"  V1IDENTIFY\n" + struct.pack(">i", -1),
         b"E_BAD_BODY IDENTIFY invalid body size -1"),
        (b"  V1IDENTIFY\n" + struct.pack(">i", 2**31 - 1),
         b"E_BAD_BODY IDENTIFY body too big 2147483647 > 1048576"),
        (b"  V1" + b"A" * 5000, b"E_INVALID command line too long (limit 1024 bytes)"),
    ],
)  # fmt: skip
async def test_bad_input_gets_the_error_then_close(
    lookupd: RunningLookupd, data: bytes, answer: bytes
) -> None:
    with trio.fail_after(TIMEOUT_S):
        assert await raw_exchange(lookupd.tcp, data) == frame(answer)
        # The daemon goes on serving others.
        assert (await http(lookupd.http, "GET", "/ping")).body == b"OK"


IDENTIFY = b"IDENTIFY\n" + frame(
    b'{"broadcast_address":"127.0.0.1","tcp_port":4150,"http_port":4151,"version":"1.3.0"}'
)


@pytest.mark.parametrize(
    ("data", "answer"),
    [
        (b"REGISTER bad!topic\n", b"E_BAD_TOPIC REGISTER topic name 'bad!topic' is not valid"),
        (b"UNREGISTER t bad!chan\n",
         b"E_BAD_CHANNEL UNREGISTER channel name 'bad!chan' is not valid"),
        (b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
        (IDENTIFY, b"E_INVALID cannot IDENTIFY again"),
    ],
)  # fmt: skip
async def test_bad_input_after_identify_answers_what_came_before(
    lookupd: RunningLookupd, data: bytes, answer: bytes
) -> None:
    with trio.fail_after(TIMEOUT_S):
        received = await raw_exchange(lookupd.tcp, b"  V1" + IDENTIFY + b"PING\n" + data)
        size = struct.unpack(">i", received[:4])[0]
        assert received[4 : 4 + size].startswith(b'{"broadcast_address":"127.0.0.1"')
        assert received[4 + size :] == frame(b"OK") + frame(answer)


async def test_eof_inside_identify_body(lookupd: RunningLookupd) -> None:
    with trio.fail_after(TIMEOUT_S):
        received = await raw_exchange(lookupd.tcp, b"  V1IDENTIFY\n" + IDENTIFY[9:-3], eof=True)
        assert received == frame(b"E_BAD_BODY IDENTIFY failed to read body")
        received = await raw_exchange(lookupd.tcp, b"  V1IDENTIFY\n\x00", eof=True)
        assert received == frame(b"E_BAD_BODY IDENTIFY failed to read body size")


async def test_a_fatal_error_unregisters_the_node(lookupd: RunningLookupd) -> None:
    with trio.fail_after(TIMEOUT_S):
        peer = await V1Peer.connect(lookupd.tcp)
        await peer.command(identify(4150), Register(topic="t"))
        await peer.stream.send_all(b"BOGUS\n")
        assert await peer.stream.receive_some() == frame(b"E_INVALID invalid command BOGUS")
        assert await peer.stream.receive_some() == b""
        await wait_until_gone(lookupd, "t", peer.local_address)
        await peer.aclose()


async def test_nsqd_style_fragmented_writes(lookupd: RunningLookupd) -> None:
    # nsqd writes each piece of a command (name, space, parameter, newline, size, body) with
    # its own write(): the server must reassemble them.
    with trio.fail_after(TIMEOUT_S):
        stream = await trio.open_tcp_stream(*lookupd.tcp)
        async with stream:
            for piece in [b"  V1", b"IDENTIFY", b"\n", IDENTIFY[9:13], IDENTIFY[13:],
                          b"REGISTER", b" ", b"t", b" ", b"c", b"\n"]:  # fmt: skip
                await stream.send_all(piece)
                await trio.sleep(0.001)
            received = b""
            while not received.endswith(frame(b"OK")):
                received += await stream.receive_some()
        lookup = await get_json(lookupd.http, "/lookup?topic=t")
        assert lookup["channels"] == ["c"]
