"""pynsq 0.9.1 (nsq.Writer / nsq.Reader, tornado) against a real lmqd.

Rules for this module (see STYLE.md, Tests):
- one fresh ``lmqd`` subprocess per test (``lmqd_server``), on 127.0.0.1 with port 0;
- pynsq runs in its own interpreter (``clients/pynsq_client.py``) so tornado's loop never meets
  pytest's or trio's; the script has a hard time limit and the test a subprocess timeout;
- assertions are on what the client library saw: bodies, attempts, arrival times.
"""

from __future__ import annotations

from collections import Counter

import pytest

from lmq_client.http import HTTPClient
from tests.support.process import LmqdProcess

from .runner import assert_every_message_once, run_client

pytestmark = pytest.mark.interop


def test_10000_messages_across_three_readers_none_lost_or_duplicated(
    lmqd_server: LmqdProcess,
) -> None:
    count, batch, single = 10_000, 100, 100
    result = run_client(
        "pynsq",
        "pubsub",
        timeout=100,
        address=lmqd_server.tcp_address,
        topic="interop",
        channel="workers",
        count=count,
        batch=batch,
        single_pubs=single,
        readers=3,
        max_in_flight=200,
        consume_timeout_s=60,
        quiet_s=0.5,
    )
    # 99 MPUBs of 100 messages and 100 PUBs; every reader took part, nothing needed a retry.
    assert_every_message_once(
        result, prefix="m", count=count, batch=batch, single=single, per="per_reader"
    )


def test_dpub_is_not_delivered_before_its_delay(lmqd_server: LmqdProcess) -> None:
    delay_ms = 1500
    result = run_client(
        "pynsq",
        "dpub",
        timeout=30,
        address=lmqd_server.tcp_address,
        topic="deferred",
        channel="c",
        delay_ms=delay_ms,
    )
    assert result["responses"] == ["OK", "OK"], result["stderr"]
    arrival = result["arrival_s"]
    assert arrival["immediate"] < 1.0, arrival
    assert delay_ms / 1000 <= arrival["deferred"] < delay_ms / 1000 + 2.0, arrival


@pytest.mark.parametrize("delay_s", [0, 1])
def test_req_redelivers_with_attempts_2(lmqd_server: LmqdProcess, delay_s: int) -> None:
    result = run_client(
        "pynsq",
        "requeue",
        timeout=30,
        address=lmqd_server.tcp_address,
        topic="requeue",
        channel="c",
        delay_s=delay_s,
        quiet_s=0.5,
    )
    assert result["response"] == "OK", result["stderr"]
    first, second, *rest = result["deliveries"]
    assert not rest, result["deliveries"]  # FIN'd on the second attempt: no third delivery
    assert (first["attempts"], second["attempts"]) == (1, 2)
    assert first["id"] == second["id"]
    assert first["body"] == second["body"] == "requeue me"
    waited = second["at_s"] - first["at_s"]
    assert delay_s <= waited < delay_s + 2.0, result["deliveries"]


def test_ephemeral_channel_is_gone_once_its_consumer_leaves(lmqd_server: LmqdProcess) -> None:
    # Observed over TCP only: a new consumer of the same ephemeral channel is on a new channel.
    result = run_client(
        "pynsq",
        "ephemeral",
        timeout=40,
        address=lmqd_server.tcp_address,
        topic="eph_tcp",
        channel="c#ephemeral",
        quiet_s=0.5,
    )
    check_ephemeral(result)


def test_ephemeral_channel_disappears_from_stats(lmqd_server: LmqdProcess) -> None:
    http = lmqd_server.http_address
    assert http is not None, "lmqd logged no 'HTTP: listening on' line"
    result = run_client(
        "pynsq",
        "ephemeral",
        timeout=40,
        address=lmqd_server.tcp_address,
        http_address=http,
        topic="eph_http",
        channel="c#ephemeral",
        quiet_s=0.5,
    )
    check_ephemeral(result)
    assert sorted(result["stats_while_subscribed"]) == ["c#ephemeral", "keeper"]
    assert result["stats_after_leaving"] == ["keeper"]


def check_ephemeral(result: dict[str, object]) -> None:
    first, second, keeper = result["first"], result["second"], result["keeper"]
    assert isinstance(first, list) and isinstance(second, list) and isinstance(keeper, list)
    assert first and all(b.startswith("before-") for b in first), first
    # Nothing from before the second consumer came: not the message published while no one
    # was on the channel, not leftovers of the first consumer's channel.
    assert second and all(b.startswith("after-") for b in second), second
    # The durable channel saw everything.
    assert "while-nobody-listens" in keeper
    assert set(first) | set(second) <= set(keeper)


def test_max_attempts_dead_letters_and_redrive(lmqd_server: LmqdProcess) -> None:
    """A stock pynsq Reader that REQs everything sees each message exactly max_attempts times;
    then it is in the dead-letter topic with its attempts, and redrive brings it back."""
    http = lmqd_server.http_address
    assert http is not None
    client = HTTPClient(http)
    client.topic_action("create", "jobs")
    client.channel_action("create", "jobs", "work")
    client.channel_policy("jobs", "work", {"max_attempts": 4, "dead_letter_topic": "jobs.dead"})
    bodies = [f"job-{i}" for i in range(5)]
    result = run_client(
        "pynsq", "consume", timeout=40, address=lmqd_server.tcp_address, topic="jobs",
        channel="work", bodies=bodies, action="requeue", expect=20, consume_timeout_s=30,
        quiet_s=0.5,
    )  # fmt: skip
    received = Counter(tuple(r) for r in result["received"])
    assert received == {(body, attempt): 1 for body in bodies for attempt in (1, 2, 3, 4)}
    dead, _ = client.read("jobs.dead", 0)
    # Attempts start again on the dead-letter topic (the count is in a header).
    assert sorted((m.body.decode(), m.attempts) for m in dead) == [(b, 0) for b in bodies]
    [jobs] = client.stats("jobs")["topics"]
    assert jobs["channels"][0]["dead_letter_count"] == 5

    assert client.channel_redrive("jobs", "work", "jobs.dead", 3) == 3
    assert client.channel_redrive("jobs", "work", "jobs.dead", 3) == 2
    result = run_client(
        "pynsq", "consume", timeout=40, address=lmqd_server.tcp_address, topic="jobs",
        channel="work", action="finish", expect=5, consume_timeout_s=30, quiet_s=0.5,
    )  # fmt: skip
    assert sorted(tuple(r) for r in result["received"]) == [(b, 1) for b in bodies]


@pytest.mark.lmqd_args("--max-depth=5")
def test_full_topic_refuses_with_the_exact_error_and_loses_nothing(
    lmqd_server: LmqdProcess,
) -> None:
    """``--max-depth`` (the daemon-wide default, overflow ``reject``): pynsq's Writer gets
    ``E_PUB_FAILED`` with its reason for the sixth PUB; the five accepted are all delivered."""
    result = run_client(
        "pynsq",
        "publish_until_refused",
        timeout=30,
        address=lmqd_server.tcp_address,
        topic="bounded",
        channel="c",
        count=10,
        expect=5,
        quiet_s=0.5,
    )
    assert result["answers"] == [
        "OK", "OK", "OK", "OK", "OK", "E_PUB_FAILED PUB failed topic bounded is full (max_depth 5)",
    ], result["stderr"]  # fmt: skip
    assert result["received"] == [f"m-{i}" for i in range(5)]


@pytest.mark.lmqd_args("--max-depth=3", "--overflow=drop_oldest")
def test_drop_oldest_accepts_everything_and_keeps_the_newest(lmqd_server: LmqdProcess) -> None:
    result = run_client(
        "pynsq",
        "publish_until_refused",
        timeout=30,
        address=lmqd_server.tcp_address,
        topic="newest",
        channel="c",
        count=10,
        expect=3,
        quiet_s=0.5,
    )
    assert result["answers"] == ["OK"] * 10, result["stderr"]
    assert result["received"] == ["m-7", "m-8", "m-9"]
