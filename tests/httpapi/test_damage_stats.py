"""Storage damage is visible: ``/stats`` (extra key ``storage_damage``), ``/metrics``
(``lmqd_storage_*_total``) and ``lmqadmin stats`` (a caption line per damaged queue).

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs in-process on 127.0.0.1 port 0 (``start_daemon``) over a data
  directory the test wrote with the storage classes and then damaged (a zeroed middle segment
  of the topic's log and of a channel's own store), as a bad disk would leave it.
- Every test body runs under ``trio.fail_after(TIMEOUT)``; the blocking lmqadmin client runs in a
  worker thread so the daemon keeps serving.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from click.testing import CliRunner

from lmq_client.admin.cli import cli
from lmqd.message import Message
from lmqd.storage import DiskQueue, TopicLog
from lmqd.storage.files import queue_stem
from tests.support.daemon import StartDaemon
from tests.support.http import http

from .test_metrics_storage import scrape

TIMEOUT = 15.0
MAX_BYTES = 600


class _WallClock:
    """The time base for writing files before the daemon starts (deadlines are not used)."""

    def to_wall_ns(self, trio_time: float) -> int:
        return round(trio_time * 1e9)

    def from_wall_ns(self, wall_ns: int) -> float:
        return wall_ns / 1e9


def _messages(count: int, start: int = 0) -> list[Message]:
    return [
        Message(b"%016x" % i, (b"m%d." % i).ljust(30, b"x"), 1_700_000_000 * 10**9 + i, 1)
        for i in range(start, start + count)
    ]


def _zero_middle_segment(data_path: Path, name: str) -> int:
    files = sorted(data_path.glob(f"{queue_stem(name)}.lmq.*.dat"))
    assert len(files) >= 3
    size = files[1].stat().st_size
    files[1].write_bytes(bytes(size))
    return size


def _damaged_data_dir(data_path: Path) -> tuple[int, int]:
    """A topic ``orders`` (channel ``archive``) whose log and whose channel's own store each
    have a zeroed middle segment; returns the two segments' sizes."""
    data_path.mkdir()
    log = TopicLog("orders", data_path, timebase=_WallClock(), max_bytes_per_file=MAX_BYTES)
    for m in _messages(30):
        log.append_many([m])
    log.create_cursor("#topic", "earliest")
    log.create_cursor("archive", "earliest")
    log.close()
    store = DiskQueue(
        "orders:archive", data_path, timebase=_WallClock(), max_bytes_per_file=MAX_BYTES
    )
    for m in _messages(30, 100):
        store.put_many([m])
    store.close()
    return _zero_middle_segment(data_path, "orders"), _zero_middle_segment(
        data_path, "orders:archive"
    )


async def test_damage_found_at_start_up_is_in_stats_metrics_and_lmqadmin(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        log_bytes, store_bytes = _damaged_data_dir(tmp_path / "data")
        running = await start_daemon(tmp_path / "data", http=True, max_bytes_per_file=MAX_BYTES)
        r = await http(running.http, "GET", "/stats?format=json&topic=orders")
        assert r.status == 200
        (topic,) = json.loads(r.body)["topics"]
        damage = topic["storage_damage"]
        assert (damage["regions"], damage["bytes"]) == (1, log_bytes)
        assert damage["lost_messages"] >= 1
        (channel,) = topic["channels"]
        assert channel["channel_name"] == "archive"
        own = channel["storage_damage"]
        assert (own["regions"], own["bytes"]) == (1, store_bytes)
        # The store's positions recorded 30 messages; the segments hold fewer: exactly the loss.
        assert own["lost_messages"] == 30 - channel["backend_depth"]
        assert own["lost_messages"] > 0

        samples, types = await scrape(running.http)
        for family in ("damaged_regions", "damaged_bytes", "lost_messages",
                       "missing_segments", "rebuilt_positions"):  # fmt: skip
            assert types[f"lmqd_storage_{family}"] == "counter"

        def sample(family: str, channel: str) -> float:
            key = frozenset({("topic", "orders"), ("channel", channel)})
            return samples[(f"lmqd_storage_{family}_total", key)]

        assert sample("damaged_regions", "") == 1
        assert sample("damaged_bytes", "") == log_bytes
        assert sample("lost_messages", "") == damage["lost_messages"]
        assert sample("damaged_regions", "archive") == 1
        assert sample("damaged_bytes", "archive") == store_bytes
        assert sample("lost_messages", "archive") == own["lost_messages"]
        assert sample("rebuilt_positions", "archive") == 0

        host, port = running.http
        env = {"LMQ_HTTP_ADDRESS": f"{host}:{port}"}

        def lmqadmin(*args: str) -> Any:
            return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)

        result = await trio.to_thread.run_sync(lmqadmin, "stats", "orders", "--interval", "0")
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())
        assert f"storage damage in orders: 1 region(s) set aside ({log_bytes} bytes)" in text
        assert (
            f"storage damage in orders/archive: 1 region(s) set aside ({store_bytes} bytes), "
            f"at least {own['lost_messages']} message(s) lost" in text
        )
        result = await trio.to_thread.run_sync(
            lmqadmin, "stats", "orders", "--json", "--interval", "0"
        )
        data = json.loads(result.output)
        assert data["topics"][0]["storage_damage"]["regions"] == 1


async def test_a_healthy_daemon_reports_no_damage(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        assert (await http(running.http, "POST", "/pub?topic=fine", b"x")).status == 200
        r = await http(running.http, "GET", "/stats?format=json&topic=fine")
        (topic,) = json.loads(r.body)["topics"]
        assert set(topic["storage_damage"].values()) == {0}
        samples, _ = await scrape(running.http)
        key = frozenset({("topic", "fine"), ("channel", "")})
        assert samples[("lmqd_storage_damaged_regions_total", key)] == 0
