"""``ProducerCore`` and ``Link`` alone: failover order, pipelined answers, how publishes end.

Rules for this module: no sockets, no event loop; the test feeds decoded frames and asserts the
bytes queued and the replies' outcomes.
"""

from __future__ import annotations

import math

import pytest

from lmq_client.core import Link, ProducerCore, ProducerOptions
from lmq_client.errors import (
    ConnectionFailed,
    FinFailedError,
    LmqClientError,
    MpubFailedError,
    NSQError,
)
from lmq_client.extension import IDENTIFY_FIELDS

from .helpers import HEARTBEAT, OK, error, identify_answer, sent


def test_candidates_start_from_the_daemon_that_worked_last() -> None:
    core = ProducerCore(["a:1", "b:1", "c:1"], ProducerOptions())
    assert core.candidates() == ["a:1", "b:1", "c:1"]
    core.connected("b:1", identify_answer(), 0.0)
    assert core.candidates() == ["b:1", "c:1", "a:1"]


def test_pipelined_publishes_are_answered_in_order() -> None:
    core = ProducerCore(["a:1"], ProducerOptions())
    link = core.connected("a:1", identify_answer(), 0.0)
    first = core.publish(b"PUB t\n\x00\x00\x00\x01x", messages=1)
    second = core.publish(b"PUB t\n\x00\x00\x00\x01y", messages=1)
    assert link.take_output() == b"PUB t\n\x00\x00\x00\x01xPUB t\n\x00\x00\x00\x01y"
    core.receive(link, [HEARTBEAT, OK], 1.0)  # a heartbeat answers nothing
    assert sent(link) == [b"NOP"]
    assert (first.done, first.result(), second.done) == (True, b"OK", False)
    core.receive(link, [OK], 1.1)
    assert second.result() == b"OK"
    assert core.statistics().published == 2


def test_a_fatal_error_fails_its_command_and_everything_after_it() -> None:
    core = ProducerCore(["a:1"], ProducerOptions())
    link = core.connected("a:1", identify_answer(), 0.0)
    ok, bad, after = (core.publish(b"MPUB ...", messages=n) for n in (10, 20, 30))
    core.receive(link, [OK, error("E_MPUB_FAILED", "MPUB failed disk full"), OK], 1.0)
    assert ok.result() == b"OK"
    with pytest.raises(MpubFailedError, match="disk full"):
        bad.result()
    with pytest.raises(ConnectionFailed, match="connection closed after E_MPUB_FAILED"):
        after.result()
    assert not link.open
    stats = core.statistics()
    assert (stats.published, stats.failed, stats.in_doubt, stats.in_flight) == (10, 50, 0, 0)
    with pytest.raises(ConnectionFailed):
        core.publish(b"PUB ...", messages=1)  # the driver reconnects first


def test_a_lost_connection_leaves_its_publishes_in_doubt() -> None:
    core = ProducerCore(["a:1"], ProducerOptions())
    link = core.connected("a:1", identify_answer(), 0.0)
    waiting = core.publish(b"MPUB ...", messages=5)
    assert core.statistics().in_flight == 5
    core.ended(link, ConnectionFailed("a:1", "connection lost (Connection reset by peer)"))
    with pytest.raises(ConnectionFailed, match="Connection reset by peer"):
        waiting.result()
    assert core.statistics().in_doubt == 5


def test_the_extension_needs_a_daemon_that_accepted_it() -> None:
    core = ProducerCore(["a:1"], ProducerOptions())
    core.connected("a:1", identify_answer(), 0.0)
    with pytest.raises(LmqClientError, match="does not support lmq's message extension"):
        core.publish(b"XPUB ...", messages=1, extension=True)
    core.connected("a:1", identify_answer(**IDENTIFY_FIELDS), 0.0)
    core.publish(b"XPUB ...", messages=1, extension=True)


def test_link_non_fatal_errors_answer_nothing_and_silence_has_a_deadline() -> None:
    link = Link("a:1", heartbeat_interval=30.0, now=10.0)
    assert link.deadline == 10.0 + 65.0
    seen: list[NSQError] = []
    link.on_error = lambda _, e: seen.append(e)
    reply = link.command(b"PUB ...")
    link.receive([error("E_FIN_FAILED", "FIN failed"), OK], 20.0)
    assert [type(e) for e in seen] == [FinFailedError] and reply.result() == b"OK"
    assert link.open and link.deadline == 85.0
    assert Link("a:1", heartbeat_interval=0, now=0.0).deadline == math.inf
    link.lost(ConnectionFailed("a:1", "gone"))
    with pytest.raises(ConnectionFailed, match="gone"):
        link.write(b"NOP\n")
