"""ansq 0.3.0 (asyncio) against a real lmqd, including ansq's own expectations of nsqd.

Rules for this module (see STYLE.md, Tests):
- one fresh ``lmqd`` subprocess per test (``lmqd_server``), on 127.0.0.1 with port 0;
- ansq runs in its own interpreter (``clients/ansq_client.py``) with its own asyncio loop; the
  script has a hard time limit and the test a subprocess timeout.
"""

from __future__ import annotations

import pytest

from tests.support.process import LmqdProcess

from .runner import assert_every_message_once, run_client

pytestmark = pytest.mark.interop


def test_2000_messages_across_three_readers(lmqd_server: LmqdProcess) -> None:
    count, batch, single = 2000, 100, 50
    result = run_client(
        "ansq",
        "pubsub",
        timeout=60,
        address=lmqd_server.tcp_address,
        topic="interop",
        channel="workers",
        count=count,
        batch=batch,
        single_pubs=single,
        readers=3,
        rdy=50,
        consume_timeout_s=40,
        quiet_s=0.5,
    )
    assert_every_message_once(
        result, prefix="a", count=count, batch=batch, single=single, per="per_reader"
    )


def test_exactly_one_heartbeat_within_1_1s_of_identify(lmqd_server: LmqdProcess) -> None:
    # ansq's expectation: the heartbeat ticker is replaced at IDENTIFY (heartbeat_interval=1000).
    result = run_client(
        "ansq", "heartbeat", timeout=20, address=lmqd_server.tcp_address, more_s=1.2
    )
    assert result["beats_within_1_1s"] == 1, result
    assert 0.9 <= result["beats"][0] <= 1.1, result
    assert len(result["beats"]) == 2, result  # and the next one a second later
    assert result["connected_after"] is True


def test_msg_timeout_1000_redelivers_with_attempts_2(lmqd_server: LmqdProcess) -> None:
    result = run_client(
        "ansq",
        "msg_timeout",
        timeout=30,
        address=lmqd_server.tcp_address,
        topic="slow",
        channel="ch",
    )
    assert result["published"] is True
    first, second = result["first"], result["second"]
    assert first["id"] == second["id"]
    assert (first["attempts"], second["attempts"]) == (1, 2)
    assert first["body"] == second["body"] == "time me out"
    # msg_timeout is 1 s from delivery; ansq's suite allows ~1.1 s.
    assert 0.95 <= result["redelivered_after_s"] <= 1.6, result
    assert result["connected_after"] is True


def test_invalid_command_returns_the_error_and_connection_closes(lmqd_server: LmqdProcess) -> None:
    result = run_client(
        "ansq", "raw_error", timeout=20, address=lmqd_server.tcp_address, command="ASDF"
    )
    assert result["is_error"] is True
    assert result["code"] == "E_INVALID"
    assert result["body"] == "invalid command ASDF"
    assert result["text"] == "[E_INVALID] invalid command ASDF"
    assert result["closed_after"] is True


def test_rdy_before_sub_logs_the_exact_error(lmqd_server: LmqdProcess) -> None:
    # ansq's own suite asserts this log text.
    result = run_client("ansq", "rdy_before_sub", timeout=20, address=lmqd_server.tcp_address)
    assert "[E_INVALID] cannot RDY in current state" in result["logged"], result
    assert result["closed_after"] is True
