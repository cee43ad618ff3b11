"""Clients that stop reading: a subscriber with RDY that never reads, a publisher that never reads.

Rules for this module (see STYLE.md, Tests):
- a fresh ``lmqd`` subprocess per test (``lmqd_server``), 127.0.0.1, port 0; plain blocking
  sockets in threads, every read and send bounded by a timeout;
- the daemon may stall such a client or drop it, but it must not buffer for it without bound: its
  resident memory (``/proc/<pid>/status`` VmRSS) is sampled throughout and compared with a
  generous bound, well under what unbounded buffering would need;
- meanwhile other clients are still served.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from tests.support.process import LmqdProcess
from tests.support.rawbytes import (
    FinningConsumer,
    NsqSocket,
    assert_daemon_serves,
    mpub,
    pub,
    rdy,
    sub,
    unique,
)

MiB = 1024 * 1024

# The stuck subscriber's in-flight window and the message size: one window is 8 MiB. With
# --msg-timeout=500ms a daemon that keeps re-sending timed-out messages to a client whose socket
# is full would buffer another window every half second (~160 MiB over the test).
STUCK_RDY = 1000
BODY_SIZE = 8 * 1024
PUBLISH_SECONDS = 10.0
BATCH = 100
BATCHES_PER_SECOND = 20
# Legitimately the daemon holds a few windows: the slow channel's memory queue (1000 messages),
# its in-flight messages, their frames waiting to be sent, the topic's queue. Four windows are
# 32 MiB; allocator slack gets the rest.
SLOW_CONSUMER_RSS_BOUND = 96 * MiB


@pytest.mark.lmqd_args("--msg-timeout=500ms", f"--mem-queue-size={STUCK_RDY}")
def test_subscriber_that_never_reads_is_stalled_or_dropped(lmqd_server: LmqdProcess) -> None:
    address = lmqd_server.tcp_address
    topic = unique("stuck")
    # Ephemeral, so the stuck channel's overflow is dropped rather than stored: what remains to
    # measure is what the daemon buffers for the stuck client itself.
    stuck_channel = "stuck#ephemeral"

    stuck = NsqSocket(address, rcvbuf=4096)
    stuck.send(sub(topic, stuck_channel) + rdy(STUCK_RDY))  # and never read again
    fast = FinningConsumer(address, topic, "fast", ready=2500, prefix=4)
    fast.start()
    publisher = NsqSocket(address, timeout=20)
    time.sleep(0.3)  # both subscriptions are in place before the first message
    baseline = lmqd_server.rss_bytes()
    peak = baseline

    padding = b"p" * (BODY_SIZE - 4)
    published = 0
    start = time.monotonic()
    try:
        for batch_no in range(int(PUBLISH_SECONDS * BATCHES_PER_SECOND)):
            bodies = [struct.pack(">I", published + i) + padding for i in range(BATCH)]
            publisher.send(mpub(topic, bodies))
            publisher.expect_response(timeout=20)
            published += BATCH
            peak = max(peak, lmqd_server.rss_bytes())
            # Keep a steady rate: messages keep coming for the whole test.
            delay = start + (batch_no + 1) / BATCHES_PER_SECOND - time.monotonic()
            if delay > 0:
                time.sleep(delay)

        # Others are served meanwhile: the fast channel gets every message.
        expected = {struct.pack(">I", i) for i in range(published)}
        deadline = time.monotonic() + 20
        while fast.bodies != expected and time.monotonic() < deadline and fast.error is None:
            peak = max(peak, lmqd_server.rss_bytes())
            time.sleep(0.1)
        assert fast.error is None, fast.error
        missing = len(expected - fast.bodies)
        assert missing == 0, f"the fast consumer is missing {missing} of {published} messages"
        assert_daemon_serves(address)
    finally:
        fast.stop.set()
        fast.join(5)
        fast.conn.close()
        publisher.close()
        stuck.close()

    growth = peak - baseline
    assert growth < SLOW_CONSUMER_RSS_BOUND, (
        f"lmqd grew by {growth / MiB:.0f} MiB serving a client that never reads "
        f"(bound {SLOW_CONSUMER_RSS_BOUND / MiB:.0f} MiB)"
    )


# What the flooding publisher may cost the daemon: its output buffer limit (4 MiB in
# lmqd/server/client.py) and queue slack. A daemon that answered every PUB into an unbounded
# buffer would pass this within the flood's first seconds.
FLOOD_RSS_BOUND = 48 * MiB
FLOOD_LIMIT_S = 30.0
STALL_S = 2.0


def test_publisher_that_never_reads_responses_is_stalled_or_dropped(
    lmqd_server: LmqdProcess,
) -> None:
    address = lmqd_server.tcp_address
    baseline = lmqd_server.rss_bytes()
    peak = baseline
    # One-byte messages: the most responses per byte sent. The topic is ephemeral so the daemon
    # may drop what its memory queue cannot hold: what is measured is the response buffering.
    chunk = pub("flood#ephemeral", b"x") * 5000
    flooder = NsqSocket(address, rcvbuf=4096, timeout=STALL_S)
    outcome = ""
    sent = 0
    start = time.monotonic()
    try:
        while time.monotonic() - start < FLOOD_LIMIT_S:
            try:
                flooder.send(chunk)
            except TimeoutError:
                outcome = "stalled"
                break
            except (BrokenPipeError, ConnectionResetError):
                outcome = "dropped"
                break
            sent += len(chunk)
            if sent % (50 * len(chunk)) == 0:
                peak = max(peak, lmqd_server.rss_bytes())
        peak = max(peak, lmqd_server.rss_bytes())
        assert outcome, (
            f"lmqd kept reading a publisher that never reads its responses: "
            f"{sent / MiB:.0f} MiB of PUBs in {FLOOD_LIMIT_S:.0f}s"
        )
        # While the flooder is stuck (still connected, or just dropped) others are served.
        assert_daemon_serves(address)
        peak = max(peak, lmqd_server.rss_bytes())
    finally:
        flooder.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        flooder.close()
    assert_daemon_serves(address)
    growth = peak - baseline
    assert growth < FLOOD_RSS_BOUND, (
        f"lmqd grew by {growth / MiB:.0f} MiB for a publisher that never reads ({outcome} "
        f"after {sent / MiB:.0f} MiB)"
    )
