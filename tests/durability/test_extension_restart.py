"""lmq's per-message fields across ``kill -9`` on a real lmqd: dedup ids with ``--durable``, and
a stored message's own TTL.

Rules for this module (STYLE.md):
- The daemon is ``python -m lmqd`` (``tests.support.process.start_lmqd``) on 127.0.0.1 port 0
  with its data in ``tmp_path``; publishing over its HTTP API (``/pub`` and ``/mpub`` take
  ``dedup_id`` and ``ttl_ms``), consuming through ``Wire``.
- Small segments (``--max-bytes-per-file``) so that what the consumer FINs is in segments every
  cursor has passed: the ones a log without a dedup window deletes.
- A dedup window's length is wall-clock time here: the window is ``WINDOW_S``, long enough for
  a restart on a loaded machine; what happens after it is checked by waiting it out.
- Bounded: every test under ``trio.fail_after``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from tests.support.http import http
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd
from tests.support.wire import Wire

from .conftest import IDENTIFY

TIMEOUT = 60.0
WINDOW_S = 8.0
FLAGS = ["--durable", "--mem-queue-size=0", "--sync-timeout=100ms", "--max-bytes-per-file=1024"]


def address(server: LmqdProcess) -> tuple[str, int]:
    assert server.http_address is not None
    host, _, port = server.http_address.rpartition(":")
    return host, int(port)


async def start(data_path: Path) -> LmqdProcess:
    return await trio.to_thread.run_sync(start_lmqd, data_path, FLAGS)


async def kill9(server: LmqdProcess) -> None:
    server.process.kill()
    await trio.to_thread.run_sync(server.process.wait)
    server.terminate()  # already dead: only collects its output


async def post(server: LmqdProcess, target: str, body: bytes | None = None) -> None:
    r = await http(address(server), "POST", target, body)
    assert r.status == 200, (target, r.body)


async def topic_stats(server: LmqdProcess) -> Any:
    r = await http(address(server), "GET", "/stats?format=json&topic=t")
    [topic] = r.json()["topics"]
    return topic


async def receive_all(server: LmqdProcess, count: int) -> list[bytes]:
    """``count`` messages of ``t/c``, each FIN'd, then a short wait that nothing else comes."""
    consumer = await Wire.connect(server.tcp_host_port, **IDENTIFY)
    await consumer.sub("t", "c", rdy=100)
    got = []
    for _ in range(count):
        m = await consumer.message()
        got.append(m.body)
        await consumer.fin(m.id)
    with trio.move_on_after(0.5):
        extra = await consumer.message()
        raise AssertionError(f"one message too many: {extra.body!r}")
    await consumer.aclose()
    return got


async def test_dedup_ids_hold_across_kill_9_and_expire_with_their_window(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        server = await start(tmp_path)
        await post(server, "/topic/create?topic=t")
        await post(server, "/channel/create?topic=t&channel=c")
        policy = json.dumps({"dedup_window_ms": int(WINDOW_S * 1000)}).encode()
        await post(server, "/topic/policy?topic=t", policy)
        first = trio.current_time()
        for n in range(8):
            await post(server, f"/pub?topic=t&dedup_id=id-{n}", b"first-%d " % n + b"x" * 200)
        await post(server, "/mpub?topic=t&dedup_id=batch", b"b-0\nb-1\nb-2\n")  # batch:0..2
        got = await receive_all(server, 11)
        assert sorted(got)[:3] == [b"b-0", b"b-1", b"b-2"]
        await trio.sleep(0.5)  # a sync round: the passed segments would be deleted now
        await kill9(server)

        server = await start(tmp_path)
        try:
            assert trio.current_time() - first < WINDOW_S, "restart slower than the window"
            # The publisher retries everything (new bodies: only the ids are the same).
            for n in range(8):
                await post(server, f"/pub?topic=t&dedup_id=id-{n}", b"retry-%d" % n)
            await post(server, "/mpub?topic=t&dedup_id=batch", b"r-0\nr-1\nr-2\n")
            await post(server, "/pub?topic=t&dedup_id=id-new", b"new")
            assert await receive_all(server, 1) == [b"new"]
            assert (await topic_stats(server))["deduplicated_count"] == 11
            # Once the window has passed since the first publish, the ids are new again.
            await trio.sleep_until(first + WINDOW_S + 0.5)
            await post(server, "/pub?topic=t&dedup_id=id-0", b"late-0")
            assert await receive_all(server, 1) == [b"late-0"]
        finally:
            await trio.to_thread.run_sync(stop_lmqd, server)


async def test_a_stored_messages_own_ttl_holds_after_kill_9(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        server = await start(tmp_path)
        await post(server, "/topic/create?topic=t")
        await post(server, "/channel/create?topic=t&channel=c")
        published = trio.current_time()
        await post(server, "/pub?topic=t&ttl_ms=1000", b"short")
        await post(server, "/pub?topic=t&ttl_ms=600000", b"long")
        await post(server, "/pub?topic=t", b"plain")
        await kill9(server)
        await trio.sleep_until(published + 1.5)  # "short" is past its own TTL

        server = await start(tmp_path)
        try:
            assert sorted(await receive_all(server, 2)) == [b"long", b"plain"]
            [channel] = (await topic_stats(server))["channels"]
            assert channel["expired_count"] == 1
        finally:
            await trio.to_thread.run_sync(stop_lmqd, server)
