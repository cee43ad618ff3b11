"""``lmqadmin archive`` (nsq_to_file): the file rotator alone, then against a real lmqd.

Rules for this module: the rotator's tests use ``tmp_path`` and pass the wall clock in as ``now``
(exact rotation times); the live tests share one daemon (``lmqd_module_server``: 127.0.0.1, port
0, data in a temp dir), each with its own topic, and run the command through click's CliRunner or,
for the signal test, as a subprocess. Every wait is bounded (a few seconds).
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import signal
import subprocess
import time
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lmq_client.admin.cli import cli
from lmq_client.admin.files import FileRotator, FileSettings
from lmq_client.http import HTTPClient
from tests.support.process import REPO_ROOT, LmqdProcess, lmqadmin_command

from .hints import past_the_hint

DEADLINE_S = 10.0
NOON = 1_767_268_800.0  # 2026-01-01T12:00:00Z


def settings(tmp_path: Path, **changes: object) -> FileSettings:
    base: dict[str, object] = {"directory": tmp_path / "out", "topic": "orders", "host": "h1"}
    return FileSettings(**{**base, **changes})  # type: ignore[arg-type]


# -- the rotator -------------------------------------------------------------------------------


def test_names_follow_nsq_to_file_and_never_reuse_a_file(tmp_path: Path) -> None:
    rotator = FileRotator(settings(tmp_path, rotate_bytes=10))
    closed = rotator.write_batch([b"0123456789"], NOON)  # 11 bytes: rotates at once
    assert [(c.path.name, c.messages, c.bytes) for c in closed] == [
        ("orders.h1.2026-01-01_12.log", 1, 11)
    ]
    closed = rotator.write_batch([b"a", b"b"], NOON + 1)
    assert closed == []
    assert rotator.current == tmp_path / "out" / "orders.h1-1.2026-01-01_12.log"
    (last,) = rotator.close()
    assert last.path.read_bytes() == b"a\nb\n"
    # a new rotator (a restart) picks the next revision
    again = FileRotator(settings(tmp_path, filename_format="<TOPIC>-<DATETIME>.txt"))
    again.write_batch([b"x"], NOON)
    assert again.close()[0].path.name == "orders-2026-01-01_12.txt"
    again.write_batch([b"y"], NOON)
    assert again.close()[0].path.name == "orders-2026-01-01_12.txt-1"  # <REV> at the end


def test_rotation_by_age_at_exact_times(tmp_path: Path) -> None:
    rotator = FileRotator(settings(tmp_path, rotate_interval_s=60, datetime_format="%H%M%S"))
    rotator.write_batch([b"1"], NOON)
    assert rotator.tick(NOON + 59.999) == []
    (closed,) = rotator.tick(NOON + 60)
    assert closed.path.name == "orders.h1.120000.log"
    assert rotator.tick(NOON + 1000) == []  # nothing open: nothing to close
    rotator.write_batch([b"2"], NOON + 100)
    # a write into a file past its age closes it first and goes into a new one
    (old,) = rotator.write_batch([b"3"], NOON + 160)
    assert old.path.name == "orders.h1.120140.log" and old.path.read_bytes() == b"2\n"
    assert rotator.current is not None and rotator.current.name == "orders.h1.120240.log"
    rotator.close()


def test_gzip_files_decompress_while_open_and_after_close(tmp_path: Path) -> None:
    work = tmp_path / "work"
    rotator = FileRotator(settings(tmp_path, gzip_level=9, work_directory=work, fsync=True))
    rotator.write_batch([b"first", b"second"], NOON)
    assert rotator.current is not None and rotator.current.parent == work
    # flushed, not closed: everything written so far decompresses (no trailer yet)
    data = rotator.current.read_bytes()
    assert zlib.decompressobj(31).decompress(data) == b"first\nsecond\n"
    assert list((tmp_path / "out").iterdir()) == []  # not in the output directory yet
    (closed,) = rotator.close()
    assert closed.path == tmp_path / "out" / "orders.h1.2026-01-01_12.log.gz"
    assert gzip.decompress(closed.path.read_bytes()) == b"first\nsecond\n"
    assert list(work.iterdir()) == []


# -- against the daemon ------------------------------------------------------------------------


def run(server: LmqdProcess, *args: str) -> Result:
    assert server.http_address is not None
    env = {"LMQ_TCP_ADDRESS": server.tcp_address, "LMQ_HTTP_ADDRESS": server.http_address}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def publish(server: LmqdProcess, topic: str, bodies: list[bytes]) -> None:
    assert server.http_address is not None
    http = HTTPClient(server.http_address)
    for body in bodies:
        http.pub(topic, body)


def channel_stats(server: LmqdProcess, topic: str, channel: str) -> dict[str, int]:
    assert server.http_address is not None
    data = HTTPClient(server.http_address).stats(topic, channel)
    result: dict[str, int] = data["topics"][0]["channels"][0]
    return result


def test_archive_writes_rotates_and_finishes(
    lmqd_module_server: LmqdProcess, tmp_path: Path
) -> None:
    server = lmqd_module_server
    bodies = [b"message-%03d" % i for i in range(60)]
    publish(server, "arch", bodies)
    out = tmp_path / "out"
    result = run(server, "--json", "archive", "arch", "--dir", str(out), "-n", "60",
                 "--rotate-size", "200", "--max-in-flight", "20")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["messages"], report["channel"]) == (60, "archive")
    files = sorted(out.iterdir())
    assert len(files) == report["file_count"] >= 3  # 20 messages of 12 bytes per batch: 240 B
    assert sum(f["messages"] for f in report["files"]) == 60
    lines = b"".join(f.read_bytes() for f in files).splitlines()
    assert sorted(lines) == bodies
    stats = channel_stats(server, "arch", "archive")
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)


def test_nothing_is_finished_when_the_write_fails(
    lmqd_module_server: LmqdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = lmqd_module_server
    publish(server, "archfail", [b"a", b"b", b"c"])

    def disk_full(self: FileRotator, bodies: list[bytes], now: float) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(FileRotator, "write_batch", disk_full)
    result = run(server, "archive", "archfail", "--dir", str(tmp_path), "-n", "3")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        f"lmqadmin: error: archive: No space left on device ({tmp_path})"
    )
    # the connection closed with the messages unanswered: the daemon has them back
    deadline = time.monotonic() + DEADLINE_S
    while channel_stats(server, "archfail", "archive")["depth"] != 3:
        assert time.monotonic() < deadline, channel_stats(server, "archfail", "archive")
        time.sleep(0.05)


def test_an_unreachable_daemon_is_exit_3(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    result = CliRunner().invoke(
        cli, ["--tcp-address", dead, "archive", "t", "--dir", str(tmp_path), "-n", "1"],
        catch_exceptions=False,
    )
    assert result.exit_code == 3
    assert result.output.splitlines()[-1].startswith(
        f"lmqadmin: error: cannot reach the daemon at {dead}"
    )


def test_sigterm_closes_gzip_files_cleanly_after_time_rotation(
    lmqd_module_server: LmqdProcess, tmp_path: Path
) -> None:
    server = lmqd_module_server
    assert server.http_address is not None
    HTTPClient(server.http_address).topic_action("create", "archsig")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*lmqadmin_command(server.tcp_address), "--json", "archive", "archsig", "--dir", str(out),
         "--gzip", "--rotate-interval", "1s", "--datetime-format", "%H%M%S.%f",
         "--sync-interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        http = HTTPClient(server.http_address)
        deadline = time.monotonic() + DEADLINE_S
        while not (http.stats("archsig")["topics"][0]["channels"] or [{}])[0].get("client_count"):
            assert time.monotonic() < deadline, "archive did not subscribe"
            time.sleep(0.05)
        publish(server, "archsig", [b"early-%d" % i for i in range(5)])
        time.sleep(1.3)  # the first file is older than 1 s by now: closed at the next tick
        publish(server, "archsig", [b"late-%d" % i for i in range(5)])
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        out_bytes, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    report = json.loads(out_bytes)
    assert report["messages"] == 10 and report["file_count"] == 2
    files = sorted(out.iterdir())
    assert [f.suffix for f in files] == [".gz", ".gz"]
    # gzip.decompress checks the trailer: both files were closed properly
    assert gzip.decompress(files[0].read_bytes()).splitlines() == [b"early-%d" % i for i in
                                                                  range(5)]
    assert sorted(gzip.decompress(files[1].read_bytes()).splitlines()) == [
        b"late-%d" % i for i in range(5)
    ]
    stats = channel_stats(server, "archsig", "archive")
    assert (stats["depth"], stats["in_flight_count"]) == (0, 0)


def test_archive_says_when_existing_channels_took_the_earlier_messages(
    lmqd_module_server: LmqdProcess, tmp_path: Path
) -> None:
    # As tail does: a new archive channel gets nothing published before it existed.
    server = lmqd_module_server
    assert server.http_address is not None
    http = HTTPClient(server.http_address)
    http.topic_action("create", "archint")
    http.channel_action("create", "archint", "billing")
    for i in range(3):
        http.pub("archint", b"old%d" % i)
    out, err = past_the_hint(server, "archint", "archive", "archive", "archint", "--dir",
                             str(tmp_path / "out"), "-n", "1")  # fmt: skip
    assert err.splitlines()[0] == (
        "archive: nothing new on archint yet; its 1 existing channel(s) (billing) took the 3 "
        "message(s) published before channel archive existed. 'lmqadmin channel seek archint "
        "archive --to earliest' makes it read the messages the topic still stores."
    )
    assert out.startswith("archived 1 messages from archint/archive")
