"""``GET``/``POST /topic/policy``: a topic's retention policy over HTTP, persisted.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs in-process on 127.0.0.1 port 0 (``start_daemon``) with its data in
  ``tmp_path``; a restart is a graceful stop and a new daemon on the same directory.
- Every test body runs under ``trio.fail_after(TIMEOUT)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from tests.support.daemon import StartDaemon, eventually
from tests.support.http import http
from tests.support.wire import Wire

PUBLISH_OFF = {
    "ttl_ms": 0, "max_depth": 0, "overflow": "reject", "publish_rate": 0, "publish_burst": 0,
    "dedup_window_ms": 0, "compression": "none", "min_insync_mirrors": 0,
}
"""The TTL and publish policy keys, all off (``lmqd.engine.policy``)."""

TIMEOUT = 10.0


async def test_policy_defaults_changes_and_persistence(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, http=True, retention_ms=3_600_000)
        base = running.http
        assert (await http(base, "POST", "/topic/create?topic=t")).status == 200
        r = await http(base, "GET", "/topic/policy?topic=t")
        assert (r.status, r.json()) == (
            200, {"retention_ms": 3_600_000, "retention_bytes": 0, **PUBLISH_OFF},
        )
        assert r.headers["content-type"] == "application/json; charset=utf-8"
        r = await http(base, "POST", "/topic/policy?topic=t", b'{"retention_bytes": 1000000}')
        assert (r.status, r.json()) == (
            200, {"retention_ms": 3_600_000, "retention_bytes": 1_000_000, **PUBLISH_OFF},
        )
        r = await http(base, "POST", "/topic/policy?topic=t", b'{"retention_ms": 0}')
        assert r.json() == {"retention_ms": 0, "retention_bytes": 1_000_000, **PUBLISH_OFF}
        topic = running.broker.topics["t"]
        assert topic.log is not None
        assert (topic.log.retention_ms, topic.log.retention_bytes) == (None, 1_000_000)
        assert topic.stream.write_through  # retention needs every message on disk
        await running.stop()
        saved = json.loads((tmp_path / "lmqd.dat").read_text())
        assert saved["topics"][0]["policy"] == {"retention_bytes": 1_000_000, "retention_ms": 0}

        again = await start_daemon(tmp_path, http=True)  # no daemon default now
        r = await http(again.http, "GET", "/topic/policy?topic=t")
        assert r.json() == {"retention_ms": 0, "retention_bytes": 1_000_000, **PUBLISH_OFF}
        await again.stop()


async def test_policy_errors(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        assert (await http(base, "POST", "/topic/create?topic=t")).status == 200
        cases = [
            ("GET", "/topic/policy", b"", 400, "MISSING_ARG_TOPIC"),
            ("GET", "/topic/policy?topic=b%20d", b"", 400, "INVALID_ARG_TOPIC"),
            ("GET", "/topic/policy?topic=nope", b"", 404, "TOPIC_NOT_FOUND"),
            ("POST", "/topic/policy?topic=t", b"{", 400, "INVALID_POLICY: the body is not JSON"),
            ("POST", "/topic/policy?topic=t", b"[1]", 400,
             "INVALID_POLICY: the policy must be a JSON object"),
            ("POST", "/topic/policy?topic=t", b'{"retention": 1}', 400,
             "INVALID_POLICY: unknown key 'retention' (known: retention_ms, retention_bytes, "
             "ttl_ms, max_depth, overflow, publish_rate, publish_burst, dedup_window_ms, "
             "compression, min_insync_mirrors)"),
            ("POST", "/topic/policy?topic=t", b'{"retention_ms": 1, "retention_bytes": -1}', 400,
             "INVALID_POLICY: retention_bytes must be an integer from 0 to 9223372036854775807"),
            ("POST", "/topic/policy?topic=t", b"{" + b" " * 70_000 + b"}", 413,
             "INVALID_POLICY: body too large"),
            # Thousands of digits (int() refuses past 4,300), nesting past the stack: 400.
            ("POST", "/topic/policy?topic=t", b'{"ttl_ms": ' + b"9" * 5000 + b"}", 400,
             "INVALID_POLICY: ttl_ms must be an integer from 0 to 9223372036854775807"),
            ("POST", "/topic/policy?topic=t", b'{"ttl_ms": -' + b"9" * 3000 + b"}", 400,
             "INVALID_POLICY: ttl_ms must be an integer from 0 to 9223372036854775807"),
            ("POST", "/topic/policy?topic=t", b"[" * 60_000, 400,
             "INVALID_POLICY: the body is not JSON"),
        ]
        for method, target, body, status, message in cases:
            r = await http(base, method, target, body or None)
            assert (r.status, r.json()) == (status, {"message": message}), target
        # A refused change changes nothing, not even its valid keys.
        r = await http(base, "GET", "/topic/policy?topic=t")
        assert r.json() == {"retention_ms": 0, "retention_bytes": 0, **PUBLISH_OFF}


async def test_time_retention_empties_an_idle_topic(start_daemon: StartDaemon) -> None:
    # Nothing is published after the messages expire: the syncer's tick applies the retention
    # all the same (it used to wait for the topic's next write, so a quiet topic kept all).
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, sync_timeout=0.05)
        base = running.http
        assert (await http(base, "POST", "/topic/create?topic=t")).status == 200
        assert (await http(base, "POST", "/channel/create?topic=t&channel=c")).status == 200
        r = await http(base, "POST", "/topic/policy?topic=t", b'{"retention_ms": 300}')
        assert r.status == 200
        assert (await http(base, "POST", "/mpub?topic=t", b"a\nb\nc")).status == 200
        wire = await Wire.connect(running.tcp)
        await wire.sub("t", "c", rdy=3)
        for _ in range(3):
            await wire.fin((await wire.message()).id)
        await wire.aclose()
        stored = await http(base, "GET", "/topic/read?topic=t&offset=0&format=json")
        assert len(stored.json()["messages"]) == 3  # kept while younger than the retention
        log = running.broker.topics["t"].log
        assert log is not None
        await eventually(lambda: log.earliest_offset == 3)
        r = await http(base, "GET", "/topic/offsets?topic=t")
        assert r.json() == {"topic": "t", "earliest": 3, "end": 3, "pumped": 3}
        assert log.segment_count == 1 and log.read_range(0, 10) == []
        assert (await http(base, "POST", "/pub?topic=t", b"d")).status == 200
        assert (await http(base, "GET", "/topic/offsets?topic=t")).json()["end"] == 4
