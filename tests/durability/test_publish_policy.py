"""Topic publish policies survive restarts: SIGTERM, and ``kill -9`` with ``--durable``.

Rules for this module (STYLE.md):
- The daemon is ``python -m lmqd`` (``tests.support.process.start_lmqd``) on 127.0.0.1 port 0
  with its data in ``tmp_path``; policies are set and read over its HTTP API.
- A policy counts as set only once ``POST /topic/policy`` answered 200 (with ``--durable`` that
  answer waits for the metadata file's fsync).
- Bounded: every wait has a ``fail_after``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.support.http import http
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd
from tests.support.wire import Wire

TIMEOUT = 30.0

POLICY = {"max_depth": 2, "overflow": "reject", "publish_rate": 1000, "publish_burst": 50,
          "dedup_window_ms": 60_000}  # fmt: skip


def address(server: LmqdProcess) -> tuple[str, int]:
    assert server.http_address is not None
    host, _, port = server.http_address.rpartition(":")
    return host, int(port)


async def start(data_path: Path) -> LmqdProcess:
    return await trio.to_thread.run_sync(start_lmqd, data_path, ["--durable"])


async def kill9(server: LmqdProcess) -> None:
    server.process.kill()
    await trio.to_thread.run_sync(server.process.wait)
    server.terminate()  # already dead: only collects its output


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
async def test_policy_survives_a_restart(tmp_path: Path, how: str) -> None:
    with trio.fail_after(TIMEOUT):
        server = await start(tmp_path)
        base = address(server)
        assert (await http(base, "POST", "/topic/create?topic=t")).status == 200
        r = await http(base, "POST", "/topic/policy?topic=t", json.dumps(POLICY).encode())
        assert r.status == 200
        assert (await http(base, "POST", "/mpub?topic=t", b"a\nb\n")).status == 200
        if how == "kill9":
            await kill9(server)
        else:
            await trio.to_thread.run_sync(stop_lmqd, server)

        server = await start(tmp_path)
        try:
            base = address(server)
            r = await http(base, "GET", "/topic/policy?topic=t")
            assert {k: r.json()[k] for k in POLICY} == POLICY
            # In force again: the two acknowledged messages fill the topic.
            r = await http(base, "POST", "/pub?topic=t", b"c")
            assert (r.status, r.json()) == (503, {"message": "TOPIC_FULL"})
            stats = (await http(base, "GET", "/stats?format=json&topic=t")).json()
            assert stats["topics"][0]["depth"] == 2
            assert stats["topics"][0]["overflow_refused_count"] == 1
        finally:
            await trio.to_thread.run_sync(stop_lmqd, server)


async def test_dropped_messages_stay_dropped_after_sigterm(tmp_path: Path) -> None:
    """``drop_oldest`` with ``--durable``: a channel's dropped messages are acknowledged as a
    FIN would be, so a restart does not bring them back."""
    with trio.fail_after(TIMEOUT):
        server = await start(tmp_path)
        base = address(server)
        assert (await http(base, "POST", "/topic/create?topic=t")).status == 200
        assert (await http(base, "POST", "/channel/create?topic=t&channel=c")).status == 200
        policy = b'{"max_depth": 3, "overflow": "drop_oldest"}'
        assert (await http(base, "POST", "/topic/policy?topic=t", policy)).status == 200
        for n in range(10):
            assert (await http(base, "POST", "/pub?topic=t", b"m%d" % n)).status == 200
        await trio.to_thread.run_sync(stop_lmqd, server)

        server = await start(tmp_path)
        try:
            base = address(server)
            stats = (await http(base, "GET", "/stats?format=json&topic=t")).json()
            assert stats["topics"][0]["channels"][0]["depth"] == 3
            r = await http(base, "GET", "/topic/policy?topic=t")
            assert r.json()["overflow"] == "drop_oldest"
            consumer = await Wire.connect(server.tcp_host_port)
            await consumer.sub("t", "c", rdy=10)
            got = [(await consumer.message()).body for _ in range(3)]
            assert got == [b"m7", b"m8", b"m9"]
            await consumer.aclose()
        finally:
            await trio.to_thread.run_sync(stop_lmqd, server)
