"""Channel and topic policies across SIGTERM and ``kill -9`` (``--durable``), on a real lmqd.

Rules for this module (STYLE.md):
- The daemon is ``python -m lmqd`` (``tests.support.process.start_lmqd``) on 127.0.0.1 port 0
  with its data in ``tmp_path``; HTTP through ``tests.support.http.http``, V2 through ``Wire``.
- A policy counts as persisted once ``lmqd.dat`` shows it (the syncer writes the metadata in
  its next round, started at once); ``kill -9`` comes only after that.
- Bounded: every test under ``trio.fail_after``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from tests.support.daemon import eventually
from tests.support.http import http
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd
from tests.support.wire import Wire

from .conftest import IDENTIFY

TIMEOUT = 30.0
FLAGS = ["--durable", "--mem-queue-size=0", "--sync-timeout=100ms"]
CHANNEL_POLICY = {
    "max_attempts": 1, "dead_letter_topic": "jobs.dead", "backoff_ms": 250,
    "backoff_max_ms": 8000, "backoff_jitter": 0.5,
}  # fmt: skip


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


async def get(server: LmqdProcess, target: str) -> Any:
    r = await http(address(server), "GET", target)
    assert r.status == 200, (target, r.body)
    return r.json()


async def post(server: LmqdProcess, target: str, body: bytes | None = None) -> Any:
    r = await http(address(server), "POST", target, body)
    assert r.status == 200, (target, r.body)
    return r.json() if r.headers["content-type"].startswith("application/json") else r.body


async def poll(predicate: Callable[[], Awaitable[bool]]) -> None:
    """``eventually`` for a predicate that asks the daemon over HTTP (the caller bounds it)."""
    while True:  # polls: another process's state, no event to wait on
        if await predicate():
            return
        await trio.sleep(0.02)


async def set_policies(server: LmqdProcess, data_path: Path) -> None:
    await post(server, "/topic/create?topic=jobs")
    await post(server, "/channel/create?topic=jobs&channel=work")
    await post(server, "/topic/policy?topic=jobs", b'{"ttl_ms": 3600000}')
    await post(
        server, "/channel/policy?topic=jobs&channel=work", json.dumps(CHANNEL_POLICY).encode()
    )

    def persisted() -> bool:
        try:
            saved = json.loads((data_path / "lmqd.dat").read_text())
        except (OSError, ValueError):
            return False
        topics = saved["topics"]
        channels = topics[0]["channels"] if topics else []
        return bool(
            channels
            and topics[0].get("policy") == {"ttl_ms": 3600000}
            and channels[0].get("policy") == CHANNEL_POLICY
        )

    await eventually(persisted)


async def check_policies(server: LmqdProcess) -> None:
    assert (await get(server, "/topic/policy?topic=jobs"))["ttl_ms"] == 3_600_000
    assert await get(server, "/channel/policy?topic=jobs&channel=work") == CHANNEL_POLICY


async def test_policies_survive_sigterm(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        server = await start(tmp_path)
        try:
            await set_policies(server, tmp_path)
            stop_lmqd(server)
        finally:
            server.terminate()
        server = await start(tmp_path)
        try:
            await check_policies(server)
            stop_lmqd(server)
        finally:
            server.terminate()


async def test_policies_and_dead_letters_survive_kill9(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        server = await start(tmp_path)
        try:
            await set_policies(server, tmp_path)
            await post(server, "/pub?topic=jobs", b"doomed")
            wire = await Wire.connect(server.tcp_host_port, **IDENTIFY)
            await wire.sub("jobs", "work", rdy=1)
            m = await wire.message()
            assert (m.body, m.attempts) == (b"doomed", 1)
            await wire.req(m.id, 0)  # out of attempts: to jobs.dead

            async def dead_lettered() -> bool:
                stats = await get(server, "/stats?format=json&topic=jobs")
                return bool(stats["topics"][0]["channels"][0]["dead_letter_count"])

            await poll(dead_lettered)
            await kill9(server)
            await wire.aclose()
        finally:
            server.terminate()
        server = await start(tmp_path)
        try:
            await check_policies(server)
            # Never lost: in the dead-letter topic, or (its copy not yet synced at the kill)
            # still the source channel's, which dead-letters it again at the next delivery.
            wire = await Wire.connect(server.tcp_host_port, **IDENTIFY)
            await wire.sub("jobs", "work", rdy=1)
            with trio.move_on_after(1.0):
                again = await wire.message()
                await wire.req(again.id, 0)
            await wire.aclose()

            async def in_the_dead_letter_topic() -> bool:
                stats = await get(server, "/stats?format=json&topic=jobs.dead")
                return bool(stats["topics"]) and stats["topics"][0]["channels"][0]["depth"] >= 1

            await poll(in_the_dead_letter_topic)
            r = await post(server, "/channel/redrive?topic=jobs&channel=work&from=jobs.dead")
            assert r["moved"] >= 1
            stop_lmqd(server)
        finally:
            server.terminate()
