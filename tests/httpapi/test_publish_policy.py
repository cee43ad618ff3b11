"""Topic publish policies over HTTP: ``/topic/policy`` for their keys, ``/pub`` and ``/mpub``
refused (503 ``TOPIC_FULL``, 429 ``RATE_LIMITED``), the counters in ``/stats`` and ``/metrics``.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs in-process on 127.0.0.1 port 0 (``start_daemon``) with its data in
  ``tmp_path``; requests go over real sockets, so times are not asserted here (the TCP tests
  on the autojump clock measure the rate).
- Every test body runs under ``trio.fail_after(TIMEOUT)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon import StartDaemon
from tests.support.http import http

TIMEOUT = 10.0

DEFAULTS = {
    "retention_ms": 0, "retention_bytes": 0, "ttl_ms": 0, "max_depth": 0, "overflow": "reject",
    "publish_rate": 0, "publish_burst": 0, "dedup_window_ms": 0, "compression": "none",
    "min_insync_mirrors": 0,
}  # fmt: skip


async def test_publish_keys_set_shown_persisted(start_daemon: StartDaemon, tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, http=True, max_depth=500, publish_rate=50)
        base = running.http
        assert (await http(base, "POST", "/topic/create?topic=t")).status == 200
        r = await http(base, "GET", "/topic/policy?topic=t")
        assert r.json() == {**DEFAULTS, "max_depth": 500, "publish_rate": 50}
        change = {"max_depth": 10, "overflow": "drop_oldest", "publish_burst": 100,
                  "dedup_window_ms": 300_000}  # fmt: skip
        r = await http(base, "POST", "/topic/policy?topic=t", json.dumps(change).encode())
        assert (r.status, r.json()) == (200, {**DEFAULTS, **change, "publish_rate": 50})
        await running.stop()
        saved = json.loads((tmp_path / "lmqd.dat").read_text())
        assert saved["topics"][0]["policy"] == change
        again = await start_daemon(tmp_path, http=True)  # the daemon defaults are gone
        r = await http(again.http, "GET", "/topic/policy?topic=t")
        assert r.json() == {**DEFAULTS, **change}
        gate = again.broker.topics["t"].gate
        assert gate is not None and gate.drop_oldest and gate.dedup is not None
        await again.stop()


async def test_bad_publish_keys_are_400_and_change_nothing(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        assert (await http(base, "POST", "/topic/create?topic=t")).status == 200
        integer = "must be an integer from 0 to 9223372036854775807"
        one_of = 'must be one of "reject", "drop_oldest"'
        cases = [
            (b'{"overflow": "drop_newest"}', f"overflow {one_of}"),
            (b'{"overflow": 0}', f"overflow {one_of}"),
            (b'{"overflow": null}', f"overflow {one_of}"),
            (b'{"max_depth": 10, "overflow": "Reject"}', f"overflow {one_of}"),
            (b'{"max_depth": -1}', f"max_depth {integer}"),
            (b'{"max_depth": "10"}', f"max_depth {integer}"),
            (b'{"max_depth": 1e3}', f"max_depth {integer}"),
            (b'{"publish_rate": 2.5}', f"publish_rate {integer}"),
            (b'{"publish_rate": true}', f"publish_rate {integer}"),
            (b'{"publish_burst": 9223372036854775808}', f"publish_burst {integer}"),
            (b'{"publish_rate": 5, "dedup_window_ms": "5m"}', f"dedup_window_ms {integer}"),
            (b'{"dedup_window_ms": [1]}', f"dedup_window_ms {integer}"),
            (b'{"max_depth": 5, "ttl": 1}', "unknown key 'ttl' (known: "),
        ]
        for body, message in cases:
            r = await http(base, "POST", "/topic/policy?topic=t", body)
            assert r.status == 400, body
            assert r.json()["message"].startswith(f"INVALID_POLICY: {message}"), body
        r = await http(base, "GET", "/topic/policy?topic=t")
        assert r.json() == DEFAULTS
        assert running.broker.topics["t"].gate is None


async def test_full_topic_is_503_and_over_the_rate_is_429(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        base = running.http
        assert (await http(base, "POST", "/topic/create?topic=full")).status == 200
        r = await http(base, "POST", "/topic/policy?topic=full", b'{"max_depth": 2}')
        assert r.status == 200
        assert (await http(base, "POST", "/pub?topic=full", b"1")).status == 200
        r = await http(base, "POST", "/mpub?topic=full", b"2\n3\n")  # would be 3: refused whole
        assert (r.status, r.json()) == (503, {"message": "TOPIC_FULL"})
        assert (await http(base, "POST", "/pub?topic=full", b"2")).status == 200
        r = await http(base, "POST", "/pub?topic=full", b"3")
        assert (r.status, r.json()) == (503, {"message": "TOPIC_FULL"})
        assert running.broker.topics["full"].message_count == 2

        assert (await http(base, "POST", "/topic/create?topic=slow")).status == 200
        policy = b'{"publish_rate": 1, "publish_burst": 1}'
        assert (await http(base, "POST", "/topic/policy?topic=slow", policy)).status == 200
        r = await http(base, "POST", "/mpub?topic=slow", b"a\nb\nc\nd\n")  # 3 s of tokens
        assert (r.status, r.json()) == (429, {"message": "RATE_LIMITED"})
        assert r.headers["retry-after"] == "3"
        assert (await http(base, "POST", "/pub?topic=slow", b"a")).status == 200  # the burst
        # Within the rate but ahead of its token: this request waits for it, then succeeds.
        policy = b'{"publish_rate": 4, "publish_burst": 1}'
        assert (await http(base, "POST", "/topic/policy?topic=slow", policy)).status == 200
        assert (await http(base, "POST", "/pub?topic=slow", b"b")).status == 200
        before = trio.current_time()
        assert (await http(base, "POST", "/pub?topic=slow", b"c")).status == 200
        assert trio.current_time() - before >= 0.2  # 1/4 s for its token (timer slack aside)

        r = await http(base, "GET", "/stats?format=json&topic=full")
        topic = r.json()["topics"][0]
        assert list(topic)[-4:] == ["overflow_dropped_count", "overflow_refused_count",
                                    "rate_limited_count", "deduplicated_count"]  # fmt: skip
        assert (topic["overflow_refused_count"], topic["message_count"]) == (3, 2)
        r = await http(base, "GET", "/metrics")
        samples = {
            (s.name, s.labels.get("topic")): s.value
            for family in text_string_to_metric_families(r.body.decode())
            for s in family.samples
        }
        assert samples[("lmqd_topic_overflow_refused_messages_total", "full")] == 3
        assert samples[("lmqd_topic_rate_limited_messages_total", "slow")] == 4
        assert samples[("lmqd_topic_overflow_dropped_messages_total", "slow")] == 0
        assert samples[("lmqd_topic_deduplicated_messages_total", "full")] == 0


async def test_dedup_and_drop_oldest_over_http(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, dedup_window_ms=60_000)
        base = running.http
        for _ in range(3):
            assert (await http(base, "POST", "/pub?topic=d", b"same")).status == 200
        assert (await http(base, "POST", "/mpub?topic=d", b"same\nnew\nnew\n")).status == 200
        topic = running.broker.topics["d"]
        assert (topic.message_count, topic.depth) == (2, 2)
        r = await http(base, "POST", "/topic/policy?topic=d",
                       b'{"max_depth": 1, "overflow": "drop_oldest", "dedup_window_ms": 0}')
        assert r.status == 200
        assert (await http(base, "POST", "/pub?topic=d", b"newest")).status == 200
        assert topic.depth == 1
        stats = (await http(base, "GET", "/stats?format=json&topic=d")).json()["topics"][0]
        assert (stats["deduplicated_count"], stats["overflow_dropped_count"]) == (4, 2)
