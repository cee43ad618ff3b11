"""gnsq 1.0.2 (gevent) against a real lmqd.

Rules for this module (see STYLE.md, Tests):
- one fresh ``lmqd`` subprocess per test (``lmqd_server``), on 127.0.0.1 with port 0;
- gnsq runs in its own interpreter (``clients/gnsq_client.py``): gevent never enters the pytest
  process; the script has a hard time limit and the test a subprocess timeout.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from lmq_client.http import HTTPClient
from tests.support.process import LmqdProcess

from .runner import assert_every_message_once, run_client

pytestmark = pytest.mark.interop


def test_2000_messages_across_three_consumers(lmqd_server: LmqdProcess) -> None:
    count, batch, single = 2000, 100, 50
    result = run_client(
        "gnsq",
        "pubsub",
        timeout=60,
        address=lmqd_server.tcp_address,
        topic="interop",
        channel="workers",
        count=count,
        batch=batch,
        single_pubs=single,
        consumers=3,
        max_in_flight=100,
        consume_timeout_s=40,
        quiet_s=0.5,
    )
    assert_every_message_once(
        result, prefix="g", count=count, batch=batch, single=single, per="per_consumer"
    )


def test_invalid_command_surfaces_as_nsqinvalid(lmqd_server: LmqdProcess) -> None:
    result = run_client(
        "gnsq", "raw_error", timeout=20, address=lmqd_server.tcp_address, command="ASDF\n"
    )
    assert result["frame"] == 1  # FRAME_TYPE_ERROR
    assert result["error_class"] == "NSQInvalid"
    assert result["error_text"] == "invalid command ASDF"
    assert result["fatal"] is True
    assert result["connected_after"] is False


def test_cls_before_sub_is_e_invalid(lmqd_server: LmqdProcess) -> None:
    # From gnsq's own test suite.
    result = run_client("gnsq", "cls_before_sub", timeout=20, address=lmqd_server.tcp_address)
    assert result["frame"] == 1
    assert result["error_class"] == "NSQInvalid"
    assert result["error_text"] == "cannot CLS in current state"
    assert result["connected_after"] is False


def test_heartbeats_every_second_keep_the_connection(lmqd_server: LmqdProcess) -> None:
    result = run_client(
        "gnsq", "heartbeat", timeout=20, address=lmqd_server.tcp_address, topic="hb", seconds=2.9
    )
    beats = result["beats"]
    # heartbeat_interval=1 s: beats near 1, 2, 3 s; gnsq's NOPs keep the connection past 2 s.
    assert len(beats) >= 3, beats
    assert 0.8 <= beats[0] <= 1.5, beats
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert all(0.7 <= g <= 1.3 for g in gaps), beats
    assert (result["publish_frame"], result["publish_response"]) == (0, "OK")


def test_http_stats_depths(lmqd_server: LmqdProcess) -> None:
    http = lmqd_server.http_address
    assert http is not None, "lmqd logged no 'HTTP: listening on' line"
    result = run_client(
        "gnsq",
        "http_stats",
        timeout=30,
        address=lmqd_server.tcp_address,
        http_address=http,
        topic="statted",
        channel="c",
        count=5,
    )
    assert result["topic_depth"] == 0, result
    assert result["channels"] == [{"name": "c", "depth": 5, "deferred": 0}], result


def test_max_attempts_dead_letters_and_redrive(lmqd_server: LmqdProcess) -> None:
    """A stock gnsq consumer that REQs everything sees each message exactly max_attempts
    times; then it is in the dead-letter topic with its attempts, and redrive brings it back."""
    http = lmqd_server.http_address
    assert http is not None
    client = HTTPClient(http)
    client.topic_action("create", "jobs")
    client.channel_action("create", "jobs", "work")
    policy = client.channel_policy(
        "jobs", "work", {"max_attempts": 3, "dead_letter_topic": "jobs.dead"}
    )
    assert (policy["max_attempts"], policy["dead_letter_topic"]) == (3, "jobs.dead")
    bodies = [f"job-{i}" for i in range(5)]
    result = run_client(
        "gnsq", "consume", timeout=40, address=lmqd_server.tcp_address, topic="jobs",
        channel="work", bodies=bodies, action="requeue", expect=15, consume_timeout_s=30,
        quiet_s=0.5,
    )  # fmt: skip
    received = Counter(tuple(r) for r in result["received"])
    assert received == {(body, attempt): 1 for body in bodies for attempt in (1, 2, 3)}

    [jobs] = client.stats("jobs")["topics"]
    [work] = jobs["channels"]
    assert (work["dead_letter_count"], work["depth"], work["in_flight_count"]) == (5, 0, 0)
    dead, _ = client.read("jobs.dead", 0)
    # Attempts start again on the dead-letter topic (the count is in a header).
    assert sorted((m.body.decode(), m.attempts) for m in dead) == [(b, 0) for b in bodies]

    assert client.channel_redrive("jobs", "work", "jobs.dead", 100) == 5
    result = run_client(
        "gnsq", "consume", timeout=40, address=lmqd_server.tcp_address, topic="jobs",
        channel="work", action="finish", expect=5, consume_timeout_s=30, quiet_s=0.5,
    )  # fmt: skip
    assert sorted(tuple(r) for r in result["received"]) == [(b, 1) for b in bodies]
    assert client.channel_redrive("jobs", "work", "jobs.dead", 100) == 0


@pytest.mark.lmqd_args("--publish-rate=4", "--publish-burst=1")
def test_rate_limit_paces_publishes_and_refuses_an_oversized_mpub(
    lmqd_server: LmqdProcess,
) -> None:
    """The daemon-wide ``--publish-rate``: 5 PUBs, one at a time, take at least the 1 s their
    tokens need (burst 1, then 4 per second); an MPUB of 10 (2.25 s of tokens > the 1 s wait)
    reaches gnsq as its ``NSQMPubFailed`` with lmqd's reason."""
    result = run_client(
        "gnsq", "rate_limited", timeout=30, address=lmqd_server.tcp_address, topic="paced",
        count=5, mpub=10,
    )  # fmt: skip
    assert result["answers"] == ["OK"] * 5, result["stderr"]
    assert result["elapsed_s"] >= 0.95, result  # 4 waits of 1/4 s (timer slack aside)
    assert result["refusal"] == {
        "class": "NSQMPubFailed",
        "text": "MPUB failed topic paced is over its publish rate (4/s, burst 1)",
    }
