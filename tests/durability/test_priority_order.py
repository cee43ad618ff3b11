"""Priority delivery order on a real ``lmqd`` subprocess: a backlog on disk (``--mem-queue-size``
small), messages published with priorities over HTTP (``/pub?priority=N``) and over TCP (XPUB,
negotiated in IDENTIFY), across a clean restart and a ``kill -9`` in ``--durable``.

Rules for this module: ``python -m lmqd`` on 127.0.0.1 port 0 with its data in ``tmp_path``; a
consumer with RDY 1 that FINs each message before the next, so what it sees is the order
delivery takes; every wait bounded by ``fail_after``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from lmqd.message_ext import MessageExt
from lmqd.protocol.extension import XpubMessage, encode_xpub
from tests.support.http import http
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd
from tests.support.wire import OK, Wire

from .test_crash import kill9

TIMEOUT = 30
NEGOTIATE = {"feature_negotiation": True, "lmq_ext": 1}
BACKLOG = 200
HTTP_RANKED = [(b"h-low", 2), (b"h-top", 9)]
TCP_RANKED = [(b"t-mid", 5), (b"t-top", 9), (b"t-low", 2)]
ORDER = [b"h-top", b"t-top", b"t-mid", b"h-low", b"t-low"]
"""Level 9, 5 then 2; within a level, in publish order (HTTP's first)."""


async def start(data_path: Path, flags: list[str]) -> LmqdProcess:
    return await trio.to_thread.run_sync(start_lmqd, data_path, flags)


def http_address(server: LmqdProcess) -> tuple[str, int]:
    host, _, port = (server.http_address or "").rpartition(":")
    return host, int(port)


async def publish_all(server: LmqdProcess) -> list[bytes]:
    """The backlog (plain MPUB over HTTP), then the ranked messages, then one plain message;
    the channel exists first, so it gets all of them."""
    address = http_address(server)
    assert (await http(address, "POST", "/topic/create?topic=t")).status == 200
    assert (await http(address, "POST", "/channel/create?topic=t&channel=c")).status == 200
    backlog = [b"plain%03d" % k for k in range(BACKLOG)]
    assert (await http(address, "POST", "/mpub?topic=t", b"\n".join(backlog))).status == 200
    for body, level in HTTP_RANKED:
        result = await http(address, "POST", f"/pub?topic=t&priority={level}", body)
        assert result.status == 200
    producer = await Wire.connect(server.tcp_host_port, **NEGOTIATE)
    for body, level in TCP_RANKED:
        await producer.send(encode_xpub("t", [XpubMessage(body, MessageExt(priority=level))]))
        assert await producer.frame() == OK
    await producer.aclose()
    assert (await http(address, "POST", "/pub?topic=t", b"last")).status == 200
    return [*backlog, b"last"]


async def consume(server: LmqdProcess, count: int) -> list[tuple[bytes, int]]:
    """``count`` messages, one at a time, FIN'd: (body, priority) in delivery order."""
    wire = await Wire.connect(server.tcp_host_port, **NEGOTIATE)
    await wire.sub("t", "c", rdy=1)
    got: list[tuple[bytes, int]] = []
    for _ in range(count):
        frame = await wire.message()
        got.append((frame.body, frame.ext.priority if frame.ext is not None else 0))
        await wire.fin(frame.id)
    await wire.aclose()
    return got


def levels(bodies: list[bytes]) -> list[int]:
    ranked = dict(HTTP_RANKED + TCP_RANKED)
    return [ranked.get(b, 0) for b in bodies]


async def test_ranked_messages_overtake_a_backlog_on_disk(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        server = await start(tmp_path, ["--mem-queue-size=10"])
        try:
            plain = await publish_all(server)
            address = http_address(server)
            stats = (await http(address, "GET", "/stats?format=json&topic=t")).json()
            [channel] = stats["topics"][0]["channels"]
            assert channel["priority_depths"] == {"9": 2, "5": 1, "2": 2}
            assert channel["depth"] == len(ORDER) + len(plain)
            metrics = (await http(address, "GET", "/metrics")).body.decode()
            assert 'lmqd_channel_priority_depth{channel="c",priority="9",topic="t"} 2.0' in metrics
            got = await consume(server, len(ORDER) + 3)
            assert got == list(zip([*ORDER, *plain[:3]], levels([*ORDER, *plain[:3]]), strict=True))
        finally:
            stop_lmqd(server)


@pytest.mark.parametrize("how", ["restart", "kill9"])
async def test_the_order_holds_across_a_restart(tmp_path: Path, how: str) -> None:
    flags = ["--mem-queue-size=10", "--sync-timeout=50ms"]
    flags += ["--durable"] if how == "kill9" else []
    with trio.fail_after(TIMEOUT):
        server = await start(tmp_path, flags)
        try:
            plain = await publish_all(server)
            first = await consume(server, 1)
            assert first == [(ORDER[0], 9)]
            await trio.sleep(0.5)  # the FIN's acknowledgement is synced (--sync-timeout)
        finally:
            if how == "kill9":
                await kill9(server)
            else:
                stop_lmqd(server)
        server = await start(tmp_path, flags)
        try:
            got = [body for body, _ in await consume(server, len(ORDER) - 1 + len(plain))]
            assert got == [*ORDER[1:], *plain]
        finally:
            stop_lmqd(server)
