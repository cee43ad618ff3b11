"""Big messages to a subscriber that never reads: the daemon's memory stays within its byte bounds.

Rules for this module (see STYLE.md, Tests):
- a fresh ``lmqd`` subprocess per test (``lmqd_server``), 127.0.0.1, port 0; plain blocking
  sockets in threads, every read and send bounded by a timeout;
- the daemon's peak resident memory is ``VmHWM`` in ``/proc/<pid>/status``, compared with a
  generous bound well under what buffering a whole RDY window would take;
- meanwhile another client is served: it gets every message.

The defect (issue 18): RDY 300 and 300 x 1 MiB took lmqd from 42 MB to 656 MB, a whole window of
frames plus their joined copy in the stuck connection's output. Issue 30: 280 clients that each
sent most of a 4 MiB MPUB and disconnected left lmqd at 1.19 GB (the partial bodies lived on
with their connections' objects until a garbage collection).
"""

from __future__ import annotations

import json
import socket
import struct
import time
import urllib.request

import pytest

from tests.support.process import LmqdProcess
from tests.support.rawbytes import (
    FinningConsumer,
    NsqSocket,
    assert_daemon_serves,
    mpub,
    rdy,
    unique,
)

MiB = 1024 * 1024

STUCK_RDY = 300
MESSAGES = 300
BODY_SIZE = 1 * MiB
PER_MPUB = 4  # 4 MiB: under the default --max-body-size (5 MiB)
# What lmqd may hold meanwhile: the stuck consumer's output (4 MiB + one message, and the joined
# copy of a send), the other consumer's likewise and its window in flight, the topic's memory
# tail (--mem-queue-size=16: 16 MiB), a 4 MiB MPUB being parsed (its chunks, their join, the
# bodies cut from it), the log's tail cache. Measured: a 94 MiB peak from a 41 MiB start (690
# MiB before the byte bounds). 200 MiB is generous and still well under one RDY window (300 MiB).
PEAK_RSS_BOUND = 200 * MiB
TEST_LIMIT_S = 25.0  # under the 30 s write deadline after which the stuck client is dropped


def channel_stats(server: LmqdProcess, topic: str, channel: str) -> dict[str, int]:
    url = f"http://{server.http_address}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as response:
        data = json.load(response)
    [found] = [c for t in data["topics"] for c in t["channels"] if c["channel_name"] == channel]
    return {key: found[key] for key in ("depth", "in_flight_count", "timeout_count")}


@pytest.mark.lmqd_args("--mem-queue-size=16")
def test_big_messages_to_a_subscriber_that_never_reads_stay_within_the_byte_bound(
    lmqd_server: LmqdProcess,
) -> None:
    address = lmqd_server.tcp_address
    topic = unique("big")
    stuck = NsqSocket(address, rcvbuf=4096)
    stuck.subscribe(topic, "stuck", ready=0)  # its channel keeps every message from now on
    reader = FinningConsumer(address, topic, "fast", ready=50, prefix=8)
    reader.start()
    publisher = NsqSocket(address, timeout=20)
    time.sleep(0.3)  # both subscriptions are in place before the first message
    start = time.monotonic()
    try:
        padding = b"p" * (BODY_SIZE - 8)
        for first in range(0, MESSAGES, PER_MPUB):
            bodies = [b"%08d" % n + padding for n in range(first, first + PER_MPUB)]
            publisher.send(mpub(topic, bodies))
            publisher.expect_response(timeout=20)
        # A whole backlog and a big window: one delivery round could take all 300 messages.
        stuck.send(rdy(STUCK_RDY))  # and never read again
        expected = {b"%08d" % n for n in range(MESSAGES)}
        while reader.bodies != expected and reader.error is None:
            assert time.monotonic() - start < TEST_LIMIT_S, (
                f"the other consumer got {len(reader.bodies)} of {MESSAGES} in {TEST_LIMIT_S}s"
            )
            time.sleep(0.1)
        assert reader.error is None, reader.error
        time.sleep(0.5)  # the stuck consumer's round is long done
        # The stuck consumer holds a few messages in flight; the rest wait in its channel.
        stats = channel_stats(lmqd_server, topic, "stuck")
        assert stats["in_flight_count"] <= 5, stats
        assert stats["depth"] + stats["in_flight_count"] == MESSAGES, stats
        assert_daemon_serves(address)
        rss_kb, peak_kb = lmqd_server.memory_kb()
    finally:
        reader.stop.set()
        reader.join(5)
        reader.conn.close()
        publisher.close()
        stuck.close()
    assert peak_kb * 1024 < PEAK_RSS_BOUND, (
        f"lmqd peaked at {peak_kb / 1024:.0f} MiB (now {rss_kb / 1024:.0f} MiB) sending "
        f"{MESSAGES} x 1 MiB to a client with RDY {STUCK_RDY} that never reads "
        f"(bound {PEAK_RSS_BOUND / MiB:.0f} MiB)"
    )


ABANDONED_UPLOADS = 280
ABANDONED_BODY = 4 * MiB
ABANDONED_RSS_BOUND = 100 * MiB
"""Above the idle daemon's RSS, after the abandoned uploads (issue 30's bound; measured: 12 MiB
above idle, 1,095 MiB before the fix)."""


def test_abandoned_large_uploads_give_their_memory_back(lmqd_server: LmqdProcess) -> None:
    host, _, port = lmqd_server.tcp_address.rpartition(":")
    assert_daemon_serves(lmqd_server.tcp_address)
    idle = lmqd_server.rss_bytes()
    # Most of a 4 MiB MPUB body (its count, then bytes that never make a whole message), then
    # the client is gone: nothing in it can ever be applied.
    partial = (
        b"  V2MPUB abandoned\n"
        + struct.pack(">ii", ABANDONED_BODY, 1000)
        + b"x" * (ABANDONED_BODY - 100_000)
    )
    start = time.monotonic()
    for _ in range(ABANDONED_UPLOADS):
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(partial)
        assert time.monotonic() - start < 60, "the daemon stopped reading abandoned uploads"
    deadline = time.monotonic() + 10  # the last connections are still being read
    while (rss := lmqd_server.rss_bytes()) - idle > ABANDONED_RSS_BOUND:
        assert time.monotonic() < deadline, (
            f"lmqd holds {rss / MiB:.0f} MiB after {ABANDONED_UPLOADS} abandoned "
            f"{ABANDONED_BODY // MiB} MiB uploads ({idle / MiB:.0f} MiB idle, bound "
            f"+{ABANDONED_RSS_BOUND / MiB:.0f} MiB)"
        )
        time.sleep(0.2)
    assert_daemon_serves(lmqd_server.tcp_address)
