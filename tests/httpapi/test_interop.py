"""The HTTP API driven by NSQ clients from PyPI: gnsq's ``NsqdHTTPClient`` and ansq's writer.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs in-process on 127.0.0.1 port 0.
- gnsq's client is blocking (urllib3): it runs in a worker thread via ``trio.to_thread``; ansq's
  is asyncio (aiohttp): it runs in its own event loop in a worker thread.
- Every test body runs under ``trio.fail_after(TIMEOUT)``.
- Results are checked both as the client returns them and in the daemon's state.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import trio
from ansq.http.http_exceptions import NSQHTTPException
from ansq.http.writer import NSQDHTTPWriter
from gnsq import NsqdHTTPClient  # type: ignore[import-untyped]
from gnsq.errors import NSQHttpError  # type: ignore[import-untyped]

from tests.support.daemon import StartDaemon, eventually
from tests.support.wire import Wire

pytestmark = pytest.mark.interop

TIMEOUT = 20.0
T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


async def test_gnsq_every_endpoint(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        daemon = running.broker
        client = NsqdHTTPClient("127.0.0.1", running.http[1])
        try:
            assert await in_thread(client.ping) == b"OK"
            info = await in_thread(client.info)
            assert (info["version"], info["tcp_port"], info["http_port"]) == (
                "1.3.0", running.tcp[1], running.http[1])

            assert await in_thread(client.create_topic, "gtopic") == b""
            assert await in_thread(client.create_channel, "gtopic", "gchan") == b""
            consumer = await Wire.connect(running.tcp)
            await consumer.sub("gtopic", "gchan", 10)

            assert await in_thread(client.publish, "gtopic", b"one") == b"OK"
            assert await in_thread(client.multipublish, "gtopic", [b"two", b"three"]) == b"OK"
            assert await in_thread(client.multipublish, "gtopic", [b"four\nlines", b"5"],
                                   binary=True) == b"OK"
            assert [(await consumer.message()).body for _ in range(5)] == [
                b"one", b"two", b"three", b"four\nlines", b"5"]
            assert await in_thread(client.publish, "gtopic", b"later", defer=60000) == b"OK"
            channel = daemon.topics["gtopic"].channels["gchan"]
            await eventually(lambda: channel.deferred_count == 1)

            stats = await in_thread(client.stats)
            (topic,) = stats["topics"]
            assert (topic["topic_name"], topic["message_count"]) == ("gtopic", 6)
            (chan,) = topic["channels"]
            assert (chan["channel_name"], chan["deferred_count"], chan["in_flight_count"]) == (
                "gchan", 1, 5)
            assert (await in_thread(client.stats, topic="nope"))["topics"] is None
            filtered = await in_thread(client.stats, topic="gtopic", channel="gchan")
            assert [c["channel_name"] for c in filtered["topics"][0]["channels"]] == ["gchan"]
            text = await in_thread(client.stats, text=True)
            assert text.startswith(b"lmqd v") and b"[gtopic         ]" in text

            assert await in_thread(client.pause_topic, "gtopic") == b""
            assert daemon.topics["gtopic"].paused
            assert await in_thread(client.unpause_topic, "gtopic") == b""
            assert not daemon.topics["gtopic"].paused
            assert await in_thread(client.pause_channel, "gtopic", "gchan") == b""
            assert channel.paused
            assert await in_thread(client.unpause_channel, "gtopic", "gchan") == b""
            assert not channel.paused
            assert await in_thread(client.empty_channel, "gtopic", "gchan") == b""
            assert (channel.depth, channel.in_flight_count, channel.deferred_count) == (0, 0, 0)
            await in_thread(client.pause_topic, "gtopic")
            await in_thread(client.publish, "gtopic", b"held")
            assert daemon.topics["gtopic"].depth == 1
            assert await in_thread(client.empty_topic, "gtopic") == b""
            assert daemon.topics["gtopic"].depth == 0
            assert await in_thread(client.delete_channel, "gtopic", "gchan") == b""
            assert "gchan" not in daemon.topics["gtopic"].channels
            assert await in_thread(client.delete_topic, "gtopic") == b""
            assert "gtopic" not in daemon.topics

            # errors surface as gnsq's NSQHttpError with nsqd's status
            with pytest.raises(NSQHttpError, match="<404>"):
                await in_thread(client.delete_topic, "gtopic")
            with pytest.raises(NSQHttpError, match="<404>"):
                await in_thread(client.create_channel, "gtopic", "gchan")
            with pytest.raises(NSQHttpError, match="<400>"):
                await in_thread(client.publish, "gtopic", b"")
            await consumer.aclose()
        finally:
            client._connection.close()


async def test_ansq_writer(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        daemon = running.broker
        port = running.http[1]

        async def session() -> dict[str, Any]:
            writer = NSQDHTTPWriter("127.0.0.1", port)
            results: dict[str, Any] = {}
            try:
                results["ping"] = await writer.ping()
                results["info"] = await writer.info()
                results["create_topic"] = await writer.create_topic("atopic")
                results["create_channel"] = await writer.create_channel("atopic", "achan")
                results["pub"] = await writer.pub("atopic", "hello")
                results["mpub"] = await writer.mpub("atopic", "a", "b", "c")
                results["stats"] = await writer.stats()
                results["lookupd"] = await writer.nsqlookupd_tcp_addresses()
                results["pause"] = await writer.pause_channel("achan", "atopic")
                results["unpause"] = await writer.unpause_channel("achan", "atopic")
                results["topic_pause"] = await writer.topic_pause("atopic")
                results["topic_unpause"] = await writer.topic_unpause("atopic")
                results["empty_topic"] = await writer.empty_topic("atopic")
                try:
                    await writer.delete_channel("atopic", "nope")
                except NSQHTTPException as exc:
                    results["error"] = exc
                results["delete_channel"] = await writer.delete_channel("atopic", "achan")
                results["delete_topic"] = await writer.delete_topic("atopic")
            finally:
                await writer.close()
            return results

        results = await in_thread(asyncio.run, session())
        assert results["ping"] == "OK"
        assert results["info"]["tcp_port"] == running.tcp[1]
        assert results["info"]["http_port"] == port
        for key in ("create_topic", "create_channel", "pause", "unpause", "topic_pause",
                    "topic_unpause", "empty_topic", "delete_channel", "delete_topic"):
            assert results[key] == "", key
        assert (results["pub"], results["mpub"]) == ("OK", "OK")
        (topic,) = results["stats"]["topics"]
        assert (topic["topic_name"], topic["message_count"]) == ("atopic", 4)
        assert topic["channels"][0]["depth"] == 4
        assert results["lookupd"] == []
        assert results["error"].args[0] == 404
        assert "atopic" not in daemon.topics
