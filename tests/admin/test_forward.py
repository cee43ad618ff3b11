"""``lmqadmin forward`` (nsq_to_nsq) between two real lmqd daemons.

Rules for this module: the source is the module's daemon (``lmqd_module_server``), each test
starts its own destination (``start_lmqd``: 127.0.0.1, port 0, data in ``tmp_path``) and stops
it with SIGTERM; each test has its own topics. The destination's messages are read by offset
(``/topic/read``), which consumes nothing. Every wait is bounded (a few seconds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lmq_client.admin.cli import cli
from lmq_client.http import HTTPClient, HTTPError
from tests.support.process import REPO_ROOT, LmqdProcess, lmqadmin_command, start_lmqd, stop_lmqd

DEADLINE_S = 20.0


@pytest.fixture
def destination(tmp_path: Path) -> Iterator[LmqdProcess]:
    server = start_lmqd(tmp_path / "destination")
    try:
        yield server
    finally:
        if server.process.poll() is None:
            stop_lmqd(server)


def run(server: LmqdProcess, *args: str) -> Result:
    assert server.http_address is not None
    env = {"LMQ_TCP_ADDRESS": server.tcp_address, "LMQ_HTTP_ADDRESS": server.http_address}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def http(server: LmqdProcess) -> HTTPClient:
    assert server.http_address is not None
    return HTTPClient(server.http_address)


def stored(server: LmqdProcess, topic: str) -> list[bytes]:
    try:
        messages, _ = http(server).read(topic, 0, 10_000)
    except HTTPError as exc:
        assert exc.status == 404  # the topic does not exist (yet)
        return []
    return [m.body for m in messages]


def channel(server: LmqdProcess, topic: str, name: str) -> dict[str, int]:
    data = http(server).stats(topic, name)
    result: dict[str, int] = data["topics"][0]["channels"][0]
    return result


def test_forward_republishes_in_batches_and_finishes_after_ok(
    lmqd_module_server: LmqdProcess, destination: LmqdProcess
) -> None:
    source = lmqd_module_server
    bodies = [b"fw-%04d" % i for i in range(500)]
    for i in range(0, 500, 100):
        http(source).request("POST", "/mpub", {"topic": "fwd"}, b"\n".join(bodies[i : i + 100]))
    result = run(source, "--json", "forward", "fwd", "--to", destination.tcp_address,
                 "--to-topic", "fwd-copy", "-n", "500", "--batch-size", "100")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["messages"], report["requeued"], report["to"], report["to_topic"]) == (
        500, 0, destination.tcp_address, "fwd-copy",
    )
    assert sorted(stored(destination, "fwd-copy")) == bodies
    assert 5 <= report["batches"] < 50  # MPUBs of up to 100, not a PUB per message
    stats = channel(source, "fwd", "forward")
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)
    # the text report
    http(source).pub("fwd", b"one more")
    result = run(source, "forward", "fwd", "--to", destination.tcp_address, "-n", "1")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        f"forwarded 1 messages from fwd/forward to fwd on {destination.tcp_address} (0 requeued"
    )
    assert stored(destination, "fwd") == [b"one more"]


def test_an_unreachable_destination_is_exit_3_before_consuming(
    lmqd_module_server: LmqdProcess, destination: LmqdProcess
) -> None:
    source = lmqd_module_server
    http(source).pub("fwdead", b"kept")
    stop_lmqd(destination)
    result = run(source, "forward", "fwdead", "--to", destination.tcp_address, "-n", "1")
    assert result.exit_code == 3
    assert result.output.startswith(
        f"lmqadmin: error: cannot reach the daemon at {destination.tcp_address}"
    )
    assert len(result.output.splitlines()) == 1
    # nothing consumed: the topic never got the forward channel
    assert http(source).stats("fwdead")["topics"][0]["channels"] == []


def test_messages_stay_at_the_source_while_the_destination_is_down(
    lmqd_module_server: LmqdProcess, destination: LmqdProcess
) -> None:
    source = lmqd_module_server
    http(source).topic_action("create", "fwdown")
    proc = subprocess.Popen(
        [*lmqadmin_command(source.tcp_address), "--json", "forward", "fwdown", "--to",
         destination.tcp_address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not (http(source).stats("fwdown")["topics"][0]["channels"] or [{}])[0].get(
            "client_count"
        ):
            assert time.monotonic() < deadline, "forward did not subscribe"
            time.sleep(0.05)
        http(source).pub("fwdown", b"before")
        while stored(destination, "fwdown") != [b"before"]:
            assert time.monotonic() < deadline, "the first message was not forwarded"
            time.sleep(0.05)
        stop_lmqd(destination)
        for body in (b"a", b"b", b"c"):
            http(source).pub("fwdown", body)
        # each publish attempt fails and requeues the batch at the source
        while channel(source, "fwdown", "forward")["requeue_count"] < 3:
            assert time.monotonic() < deadline, channel(source, "fwdown", "forward")
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["messages"] == 1 and report["requeued"] >= 3
    assert b"message(s) requeued at the source" in err
    stats = channel(source, "fwdown", "forward")
    # all three are still at the source (deferred for their retry, or back in the queue)
    assert stats["depth"] + stats["deferred_count"] + stats["in_flight_count"] == 3
    assert stats["message_count"] == 4
