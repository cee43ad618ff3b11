"""``lmqadmin pub`` streaming its input (to_nsq) and ``tail``'s hint, against a real lmqd.

Rules for this module: one daemon for the module (``lmqd_module_server``: 127.0.0.1, port 0, data
in a temp dir); each test its own topics. The streaming test runs the console script as a
subprocess with a pipe for stdin, so "delivered before stdin closes" is observed from outside;
the others use click's CliRunner. Every wait is bounded (a few seconds).
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time

import pytest
from click.testing import CliRunner, Result

from lmq_client.admin.cli import cli
from lmq_client.admin.pub_stream import MessageSplitter, RateLimit
from lmq_client.http import HTTPClient
from tests.support.process import REPO_ROOT, LmqdProcess, lmqadmin_command

from .hints import past_the_hint

DEADLINE_S = 10.0


def run(server: LmqdProcess, *args: str, input: str | bytes | None = None) -> Result:
    assert server.http_address is not None
    env = {"LMQ_TCP_ADDRESS": server.tcp_address, "LMQ_HTTP_ADDRESS": server.http_address}
    return CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False)


def stored(server: LmqdProcess, topic: str) -> list[bytes]:
    """Every message the topic stores, read by offset (consumes nothing)."""
    assert server.http_address is not None
    messages, _ = HTTPClient(server.http_address).read(topic, 0, 1000)
    return [m.body for m in messages]


def wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S}s: {what}")
        time.sleep(0.02)


# -- the splitter and the rate limit -----------------------------------------------------------


@pytest.mark.parametrize("step", [1, 2, 3, 1000])
def test_splitter_gives_the_same_messages_however_the_input_is_cut(step: int) -> None:
    data = b"one\r\ntwo\n\nthree\nlast"
    splitter = MessageSplitter(b"\n")
    got = []
    for i in range(0, len(data), step):
        got += splitter.feed(data[i : i + step])
    assert got == [b"one", b"two", b"three"]
    assert splitter.end() == [b"last"]
    assert splitter.end() == []
    multi = MessageSplitter(b"<>")
    assert multi.feed(b"a<>b<") + multi.feed(b">c\r<>") + multi.end() == [b"a", b"b", b"c\r"]


def test_rate_limit_spaces_messages_from_the_start() -> None:
    limit = RateLimit(10, start=100.0)
    assert limit.allowed(5, 100.0) == 1  # message 0 at once
    limit.took(1)
    assert limit.allowed(5, 100.05) == 0
    assert limit.next_at() == pytest.approx(100.1)
    assert limit.allowed(5, 100.35) == 3  # messages 1, 2, 3 are due
    limit.took(3)
    assert limit.allowed(100, 101.0) == 7
    assert RateLimit(0, 0).allowed(10**6, 0) == 10**6


# -- pub against the daemon --------------------------------------------------------------------


def test_the_first_line_is_delivered_before_stdin_closes(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    assert server.http_address is not None
    HTTPClient(server.http_address).topic_action("create", "stream")
    proc = subprocess.Popen(
        lmqadmin_command(server.tcp_address, "pub", "stream"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"first\n")
        proc.stdin.flush()
        wait_for(lambda: stored(server, "stream") == [b"first"], "the first line stored")
        assert proc.poll() is None  # still reading stdin
        proc.stdin.write(b"second\nthird")  # the last one without a newline
        proc.stdin.flush()
        wait_for(lambda: stored(server, "stream") == [b"first", b"second"], "the second line")
        proc.stdin.close()
        proc.wait(DEADLINE_S)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert proc.returncode == 0, err
    assert out.decode().startswith("published 3 messages to stream on ")
    assert stored(server, "stream") == [b"first", b"second", b"third"]


def test_typing_at_a_terminal_draws_no_spinner_over_the_line(
    lmqd_module_server: LmqdProcess,
) -> None:
    # ``pub -f -`` with a terminal on stdin and stderr (a pty): a person types the messages.
    server = lmqd_module_server
    assert server.http_address is not None
    HTTPClient(server.http_address).topic_action("create", "typed")
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        lmqadmin_command(server.tcp_address, "pub", "typed", "-f", "-"),
        stdin=terminal, stdout=subprocess.PIPE, stderr=terminal, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TERM": "xterm", "COLUMNS": "80"},
    )  # fmt: skip
    os.close(terminal)
    seen = bytearray()

    def drain() -> None:
        while select.select([controller], [], [], 0)[0]:
            try:
                seen.extend(os.read(controller, 4096))
            except OSError:  # EIO: the last holder of the terminal exited
                return

    try:
        os.write(controller, b"hello\n")
        wait_for(lambda: (drain(), stored(server, "typed") == [b"hello"])[1], "the typed line")
        time.sleep(0.3)  # a spinner would redraw several times meanwhile
        os.write(controller, b"world\n\x04")  # then ^D: end of input
        proc.wait(DEADLINE_S)
        drain()
        assert proc.stdout is not None
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        os.close(controller)
    assert proc.returncode == 0, bytes(seen)
    assert out.decode().startswith("published 2 messages to typed on ")
    # The terminal shows what was typed (its echo) and nothing drawn over it: no cursor
    # hiding, no carriage return redrawing the line, no spinner.
    assert b"\x1b[" not in seen and b"published" not in seen, bytes(seen)
    assert seen.replace(b"\r\n", b"\n").startswith(b"hello\nworld\n"), bytes(seen)


def test_rate_limits_messages_per_second(lmqd_module_server: LmqdProcess) -> None:
    lines = "".join(f"r{i}\n" for i in range(10))
    started = time.monotonic()
    result = run(lmqd_module_server, "--json", "pub", "rated", "--rate", "20", input=lines)
    elapsed = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["messages"] == 10
    # message i goes at i/20 s: the last at 0.45 s
    assert elapsed >= 0.45
    assert stored(lmqd_module_server, "rated") == [b"r%d" % i for i in range(10)]


def test_delimiter_and_batches(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    result = run(server, "--json", "pub", "delim", "-d", "|", input=b"a|b||c\nd|")
    assert result.exit_code == 0, result.output
    assert stored(server, "delim") == [b"a", b"b", b"c\nd"]
    result = run(server, "pub", "delim0", "--delimiter", "\\0", input=b"x\x00y")
    assert result.exit_code == 0, result.output
    assert stored(server, "delim0") == [b"x", b"y"]
    # a fast input fills MPUBs up to --batch-size
    result = run(server, "--json", "pub", "batched", "-b", "100",
                 input="".join(f"{i}\n" for i in range(1000)))
    report = json.loads(result.output)
    assert report["messages"] == 1000 and 10 <= report["batches"] < 1000
    assert run(server, "pub", "delim", "-d", "").exit_code == 2


# -- tail's hint -------------------------------------------------------------------------------


def test_tail_says_when_existing_channels_took_the_earlier_messages(
    lmqd_module_server: LmqdProcess,
) -> None:
    server = lmqd_module_server
    assert server.http_address is not None
    http = HTTPClient(server.http_address)
    http.topic_action("create", "hinted")
    http.channel_action("create", "hinted", "billing")
    for i in range(3):
        http.pub("hinted", b"old%d" % i)
    out, err = past_the_hint(server, "hinted", "tail", "tail", "hinted", "-n", "1")
    assert out == "new\n"
    assert err == (
        "tail: nothing new on hinted yet; its 1 existing channel(s) (billing) took the 3 "
        "message(s) published before this tail subscribed. 'lmqadmin tail hinted --from "
        "earliest' reads the messages the topic still stores.\n"
    )


def test_tail_gives_no_hint_when_it_would_not_be_true(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    assert server.http_address is not None
    http = HTTPClient(server.http_address)
    # a topic with a channel but nothing published before: nothing was missed
    http.topic_action("create", "unhinted")
    http.channel_action("create", "unhinted", "billing")
    out, err = past_the_hint(server, "unhinted", "tail", "tail", "unhinted", "-n", "1")
    assert (out, err) == ("new\n", "")


def test_hint_sums_nodes_and_needs_other_channels_and_missed_messages() -> None:
    from lmq_client.admin.tail_hint import earlier_messages_hint

    def node(published: int, channels: dict[str, int]) -> dict[str, object]:
        return {"topics": [{"topic_name": "t", "message_count": published, "channels": [
            {"channel_name": name, "message_count": n} for name, n in channels.items()]}]}

    two = [node(5, {"a": 5, "me": 2}), node(4, {"b": 4, "me": 4})]
    hint = earlier_messages_hint(two, "t", "me")
    assert hint is not None and "2 existing channel(s) (a, b) took the 3 message(s)" in hint
    assert earlier_messages_hint([node(5, {"me": 2})], "t", "me") is None  # no other channel
    assert earlier_messages_hint([node(5, {"a": 5, "me": 5})], "t", "me") is None  # none missed
    assert earlier_messages_hint([{"topics": []}], "t", "me") is None


def test_flush_interval_lets_lines_read_apart_share_an_mpub(
    lmqd_module_server: LmqdProcess,
) -> None:
    server = lmqd_module_server
    proc = subprocess.Popen(
        [*lmqadmin_command(server.tcp_address), "--json", "pub", "gathered",
         "--flush-interval", "2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert proc.stdin is not None
        for line in (b"x\n", b"y\n", b"z\n"):  # three reads, well within the 2 s
            proc.stdin.write(line)
            proc.stdin.flush()
            time.sleep(0.1)
        proc.stdin.close()
        proc.wait(DEADLINE_S)
        assert proc.stdout is not None
        report = json.loads(proc.stdout.read())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert (report["messages"], report["batches"]) == (3, 1)
    assert stored(server, "gathered") == [b"x", b"y", b"z"]
