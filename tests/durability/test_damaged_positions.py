"""Positions that disagree with the segments cost redeliveries, never messages, end to end.

Rules for this module (STYLE.md):
- The data directory is written with the storage classes (a topic log with a channel's cursor,
  the channel's own store), then its positions are edited to disagree with the segments, as a
  bad disk or a stray script would leave them; a real ``LmqDaemon`` (127.0.0.1, port 0) starts
  on it and a V2 consumer (``tests.support.wire``) reads the channel.
- What is checked: every message on disk is delivered intact (duplicates allowed, none
  missing), and ``/stats`` counts the rebuilt positions.
- Every test has a ``fail_after`` guard.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from lmqd.message import Message
from lmqd.protocol import MessageFrame
from lmqd.storage import DiskQueue, TopicLog
from lmqd.storage.files import log_state_filename, positions_filename
from tests.storage.log_helpers import edit_state_file
from tests.support.daemon import StartDaemon
from tests.support.http import http
from tests.support.wire import Connect

TIMEOUT = 20.0
MAX_BYTES = 600


class _WallClock:
    def to_wall_ns(self, trio_time: float) -> int:
        return round(trio_time * 1e9)

    def from_wall_ns(self, wall_ns: int) -> float:
        return wall_ns / 1e9


def _messages(count: int, start: int) -> list[Message]:
    return [
        Message(b"%016x" % i, b"body-%d" % i, 1_700_000_000 * 10**9 + i, 1)
        for i in range(start, start + count)
    ]


def _edit(path: Path, **changes: object) -> None:
    edit_state_file(path, **changes)


async def test_positions_past_the_segments_are_rebuilt_and_everything_is_delivered(
    start_daemon: StartDaemon, connect: Connect, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        data = tmp_path / "data"
        data.mkdir()
        log = TopicLog("orders", data, timebase=_WallClock(), max_bytes_per_file=MAX_BYTES)
        for m in _messages(30, 0):
            log.append_many([m])
        log.create_cursor("#topic", 30)  # every message handed on to the channels
        log.create_cursor("archive", 10)  # the channel had read 10 of them
        log.close()
        # Segments every cursor had passed are gone: what is left on disk is what must come.
        log = TopicLog("orders", data, timebase=_WallClock(), max_bytes_per_file=MAX_BYTES)
        earliest = log.earliest_offset
        log.close()
        assert 0 < earliest <= 10
        store = DiskQueue(
            "orders:archive", data, timebase=_WallClock(), max_bytes_per_file=MAX_BYTES
        )
        for m in _messages(12, 100):  # requeued messages in the channel's own store
            store.put_many([m])
        store.close()
        # The channel's mark past the log's end; the store's read position in a segment that
        # does not exist: trusted, they would skip 20 messages and delete the store's segments.
        _edit(data / log_state_filename("orders"), cursors={"#topic": 30, "archive": 10**6})
        _edit(data / positions_filename("orders:archive"), read=[9, 32, 0], write=[9, 32])

        running = await start_daemon(data, http=True, max_bytes_per_file=MAX_BYTES)
        consumer = await connect(running.tcp)
        await consumer.sub("orders", "archive", rdy=100)
        bodies: set[bytes] = set()
        want = {m.body for m in _messages(30 - earliest, earliest) + _messages(12, 100)}
        while not want <= bodies:
            frame = await consumer.frame()
            if isinstance(frame, MessageFrame):
                bodies.add(frame.body)
                await consumer.fin(frame.id)
        assert bodies == want  # nothing skipped, nothing corrupt

        r = await http(running.http, "GET", "/stats?format=json&topic=orders")
        (topic,) = r.json()["topics"]
        assert topic["storage_damage"]["rebuilt_positions"] == 1  # the channel's cursor
        (channel,) = topic["channels"]
        assert channel["storage_damage"]["rebuilt_positions"] == 1  # its own store
        assert topic["storage_damage"]["lost_messages"] == 0
        assert channel["storage_damage"]["lost_messages"] == 0


async def test_a_cursor_moved_forward_by_hand_is_found_logged_and_rebuilt(
    start_daemon: StartDaemon, connect: Connect, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30: a channel's mark moved forward in the log's state file (its checksum not made
    to match) skipped 1,462 messages without a log line. Now the file is set aside, the ERROR
    says so, and the channel reads everything on disk again: no message skipped."""
    with trio.fail_after(TIMEOUT):
        data = tmp_path / "data"
        data.mkdir()
        log = TopicLog("orders", data, timebase=_WallClock(), max_bytes_per_file=100 * 1024)
        log.append_many(_messages(3000, 0))
        log.create_cursor("#topic", 3000)
        log.create_cursor("archive", 1000)  # the channel had read a thousand
        log.close()
        state = data / log_state_filename("orders")
        edit_state_file(state, resign=False, cursors={"#topic": 3000, "archive": 2462})

        with caplog.at_level(logging.ERROR, logger="lmqd.storage"):
            running = await start_daemon(data, http=True)
        assert "its checksum does not match its content" in caplog.text
        assert "rebuilding the log state from the segments" in caplog.text
        consumer = await connect(running.tcp)
        await consumer.sub("orders", "archive", rdy=1000)
        want = {m.body for m in _messages(2000, 1000)}  # what it had not read, none skipped
        bodies: set[bytes] = set()
        while not want <= bodies:
            frame = await consumer.message()
            bodies.add(frame.body)
            await consumer.fin(frame.id)
        r = await http(running.http, "GET", "/stats?format=json&topic=orders")
        (topic,) = r.json()["topics"]
        assert topic["storage_damage"]["rebuilt_positions"] == 1
