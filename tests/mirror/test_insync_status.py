"""In-sync status on a primary with ``--min-insync-mirrors``: per mirror (in sync or not, since
when, the offsets it stored and synced), the publishes held, refused and timed out, in
``/stats``, ``/metrics`` and ``lmqadmin``; and the topic policy ``min_insync_mirrors``, which
overrides the flag per topic.

Rules for this module:
- Real processes (``tests.cluster.procs``): a primary and its mirror on 127.0.0.1, ports from
  the OS, data in ``tmp_path``; every wait is bounded; every process is stopped in ``finally``.
- ``--mirror-ack-timeout=1s`` so that a mirror gone drops out of sync within seconds.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from lmq_client.errors import LmqClientError
from lmq_client.sync import Producer
from tests.cluster.procs import Daemon, eventually, http, lmqd
from tests.support.process import lmqadmin_command

TOPIC = "orders"


def primary_stats(address: str) -> dict[str, Any]:
    status, doc = http(address, "GET", "/stats?format=json")
    assert status == 200, doc
    return doc  # type: ignore[no-any-return]


def metrics(address: str) -> dict[str, float]:
    """The lines of ``/metrics`` that are samples, by series."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


def admin(tcp: str, *args: str) -> str:
    done = subprocess.run(lmqadmin_command(tcp, *args), capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "250"},  # one line each
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_in_sync_status_is_shown_per_mirror_with_the_publish_counts(tmp_path: Path) -> None:
    primary = lmqd(tmp_path / "p", "--min-insync-mirrors=1", "--mirror-ack-timeout=1s")
    mirror: Daemon | None = None
    try:
        # No mirror yet: refused, nothing stored.
        try:
            with Producer(primary.tcp) as producer:
                producer.publish(TOPIC, b"early")
        except LmqClientError as exc:
            assert "NOT_ENOUGH_MIRRORS" in str(exc)
        else:
            raise AssertionError("a publish without a mirror in sync was accepted")
        insync = primary_stats(primary.http)["min_insync"]
        assert insync["refused_publishes"] == 1 and insync["topics_below"] == [TOPIC], insync

        started = time.time()
        mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}")
        link = eventually(lambda: (primary_stats(primary.http).get("mirrors") or [{}])[0],
                          lambda m: m.get("in_sync") is True, 30)  # fmt: skip
        assert started <= link["in_sync_since"] <= time.time()
        with Producer(primary.tcp) as producer:
            for n in range(5):
                producer.publish(TOPIC, b"m%d" % n)
        doc = primary_stats(primary.http)
        [link] = doc["mirrors"]
        [hold] = link["holds"]
        assert hold["topic_name"] == TOPIC and hold["in_sync"] and hold["end_offset"] == 5
        # Every OK came once the mirror had stored it: its next fetch says so.
        hold = eventually(lambda: primary_stats(primary.http)["mirrors"][0]["holds"][0],
                          lambda h: h["stored_offset"] == 5, 10)  # fmt: skip
        assert hold["synced_offset"] == 5 and hold["lag_messages"] == 0
        assert link["topics_in_sync"] == 1 and link["topics"] == 1
        insync = doc["min_insync"]
        assert insync["min_insync_mirrors"] == 1 and insync["topics_below"] == []
        assert insync["held_publishes"] == 5 and insync["timed_out_publishes"] == 0, insync
        assert insync["waiting_publishes"] == 0

        samples = metrics(primary.http)
        key = f'{{address="{link["address"]}",mirror="{link["mirror_id"]}"}}'
        assert samples[f"lmqd_primary_mirror_in_sync{key}"] == 1
        assert samples[f'lmqd_primary_topic_mirrors_in_sync{{topic="{TOPIC}"}}'] == 1
        assert samples[f'lmqd_primary_topic_min_insync_mirrors{{topic="{TOPIC}"}}'] == 1
        assert samples["lmqd_primary_insync_held_publishes_total"] == 5
        assert samples["lmqd_primary_insync_refused_publishes_total"] == 1
        assert samples["lmqd_primary_insync_timed_out_publishes_total"] == 0

        shown = admin(primary.tcp, "--http-address", primary.http, "stats", "--interval", "0")
        assert f"mirror {link['mirror_id']} at {link['address']}: in sync for " in shown
        assert "--min-insync-mirrors=1: 0 publish(es) waiting; held 5, refused 1" in shown
        shown = admin(primary.tcp, "--http-address", primary.http, "mirror", "status")
        assert TOPIC in shown.split("synced", 1)[1]  # the table of holds

        # The mirror gone: out of sync after the timeout, the topic below the bound.
        mirror.terminate()
        link = eventually(lambda: primary_stats(primary.http)["mirrors"][0],
                          lambda m: m["in_sync"] is False, 10)  # fmt: skip
        assert link["in_sync_since"] == 0 and link["topics_in_sync"] == 0
        assert primary_stats(primary.http)["min_insync"]["topics_below"] == [TOPIC]
        samples = metrics(primary.http)
        assert samples[f'lmqd_primary_topic_mirrors_in_sync{{topic="{TOPIC}"}}'] == 0
        shown = admin(primary.tcp, "--http-address", primary.http, "stats", "--interval", "0")
        assert "NOT in sync (0 of 1 topic(s))" in shown
        assert f"TOO FEW IN SYNC on 1 topic(s): {TOPIC}" in shown
    finally:
        for process in (mirror, primary):
            if process is not None:
                process.terminate()


def publish(tcp: str, topic: str) -> str:
    """``OK`` or the error a publish of one message to ``topic`` got."""
    try:
        with Producer(tcp) as producer:
            producer.publish(topic, b"x")
    except LmqClientError as exc:
        return str(exc)
    return "OK"


def set_policy(address: str, topic: str, needed: int) -> None:
    status, doc = http(address, "POST", f"/topic/policy?topic={topic}",
                       b'{"min_insync_mirrors": %d}' % needed)  # fmt: skip
    assert status == 200 and doc["min_insync_mirrors"] == needed, doc


def test_the_topic_policy_overrides_the_flag(tmp_path: Path) -> None:
    # Without the flag: one topic waits for a mirror, the other does not.
    primary = lmqd(tmp_path / "p", "--mirror-ack-timeout=1s")
    flagged: Daemon | None = None
    mirror: Daemon | None = None
    try:
        for name in ("must", "may"):
            assert http(primary.http, "POST", f"/topic/create?topic={name}")[0] == 200
        assert primary_stats(primary.http).get("min_insync") is None  # nothing waits
        set_policy(primary.http, "must", 1)
        assert publish(primary.tcp, "may") == "OK"
        assert "NOT_ENOUGH_MIRRORS: 0 of --min-insync-mirrors=1" in publish(primary.tcp, "must")
        insync = primary_stats(primary.http)["min_insync"]
        assert insync["min_insync_mirrors"] == 0 and insync["topics_below"] == ["must"], insync
        assert insync["refused_publishes"] == 1
        samples = metrics(primary.http)
        assert samples['lmqd_primary_topic_min_insync_mirrors{topic="must"}'] == 1
        assert samples['lmqd_primary_topic_min_insync_mirrors{topic="may"}'] == 0
        mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}")
        eventually(lambda: (primary_stats(primary.http).get("mirrors") or [{}])[0],
                   lambda m: m.get("in_sync") is True, 30)  # fmt: skip
        assert publish(primary.tcp, "must") == "OK"
        assert publish(primary.tcp, "may") == "OK"
        insync = primary_stats(primary.http)["min_insync"]
        assert insync["held_publishes"] == 1 and insync["topics_below"] == [], insync
        # The mirror follows the policy (a promoted node keeps it).
        eventually(lambda: http(mirror.http, "GET", "/topic/policy?topic=must")[1],
                   lambda p: p["min_insync_mirrors"] == 1, 10)  # fmt: skip

        # With the flag: a topic with 0 of its own does not wait.
        flagged = lmqd(tmp_path / "f", "--min-insync-mirrors=1")
        assert http(flagged.http, "POST", "/topic/create?topic=free")[0] == 200
        assert "NOT_ENOUGH_MIRRORS" in publish(flagged.tcp, "free")
        set_policy(flagged.http, "free", 0)
        assert publish(flagged.tcp, "free") == "OK"
        assert primary_stats(flagged.http)["min_insync"]["topics_below"] == []
    finally:
        for process in (flagged, mirror, primary):
            if process is not None:
                process.terminate()
