"""Every lmqadmin command end to end against a real lmqd subprocess.

Rules for this module: one daemon for the module (``lmqd_module_server`` from tests/conftest.py,
127.0.0.1, port 0, data in a temp dir); each test uses its own topic names; commands run through
click's CliRunner (and the console script once, through a subprocess) and the tests check what
they print and their exit codes. Nothing here waits longer than a few seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from lmq_client.admin.cli import cli
from lmq_client.http import HTTPClient
from tests.support.process import LmqdProcess


def run(server: LmqdProcess, *args: str, input: str | bytes | None = None) -> Result:
    assert server.http_address is not None
    env = {"LMQ_TCP_ADDRESS": server.tcp_address, "LMQ_HTTP_ADDRESS": server.http_address}
    return CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False)


def topic_stats(server: LmqdProcess, topic: str) -> dict[str, Any]:
    assert server.http_address is not None
    data = HTTPClient(server.http_address).stats(topic)
    topics = data["topics"] or []
    assert len(topics) == 1, data
    result: dict[str, Any] = topics[0]
    return result


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_pub_arguments_stdin_file_and_batches(
    lmqd_module_server: LmqdProcess, tmp_path: Path
) -> None:
    server = lmqd_module_server
    result = run(server, "pub", "p1", "hello", "world")
    assert result.exit_code == 0, result.output
    expected = f"published 2 messages to p1 on {server.tcp_address} (1 batches"
    assert result.output.startswith(expected)
    # stdin: empty lines skipped, \r\n tolerated
    result = run(server, "pub", "p1", input=b"a\r\nb\n\nc\n")
    assert result.exit_code == 0, result.output
    assert "published 3 messages" in result.output
    path = tmp_path / "msgs.txt"
    path.write_bytes(b"".join(b"m%d\n" % i for i in range(5)))
    result = run(server, "pub", "p1", "--file", str(path), "--batch-size", "2")
    assert result.exit_code == 0, result.output
    assert "published 5 messages" in result.output and "(3 batches" in result.output
    assert topic_stats(server, "p1")["message_count"] == 10
    result = run(server, "--json", "pub", "p1", "x")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert (data["topic"], data["messages"], data["batches"]) == ("p1", 1, 1)


def test_pub_usage_errors(lmqd_module_server: LmqdProcess, tmp_path: Path) -> None:
    result = run(lmqd_module_server, "pub", "p2", "x", "--file", str(tmp_path / "f"))
    assert result.exit_code == 2
    assert "not both" in result.output
    result = run(lmqd_module_server, "pub", "p2", "--file", str(tmp_path / "missing"))
    assert result.exit_code == 2
    assert "No such file" in result.output
    result = run(lmqd_module_server, "pub", "p2", input="\n\n")
    assert result.exit_code == 2
    assert "no messages" in result.output


def test_tail_prints_messages_and_stops_after_n(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    assert run(server, "pub", "tail1", "one", "two", "three", "four").exit_code == 0
    # the topic has no channel yet: tail's ephemeral channel is the first and gets the backlog
    result = run(server, "tail", "tail1", "-n", "3")
    assert result.exit_code == 0, result.output
    assert result.output == "one\ntwo\nthree\n"
    assert run(server, "pub", "tail2", "héllo").exit_code == 0
    result = run(server, "tail", "tail2", "-n", "1", "--json", "--channel", "c")
    assert result.exit_code == 0, result.output
    line = json.loads(result.output)
    assert (line["topic"], line["body"], line["attempts"]) == ("tail2", "héllo", 1)
    assert len(line["id"]) == 16
    assert run(server, "pub", "tail3", "m").exit_code == 0
    result = run(server, "tail", "tail3", "-n", "1", "--print-topic")
    assert (result.exit_code, result.output) == (0, "tail3: m\n")


def test_topic_and_channel_actions(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    http = server.http_address
    result = run(server, "topic", "create", "adm")
    assert (result.exit_code, result.output) == (0, f"created topic adm on {http}\n")
    result = run(server, "channel", "create", "adm", "ch")
    assert (result.exit_code, result.output) == (0, f"created channel adm/ch on {http}\n")
    assert run(server, "pub", "adm", "a", "b").exit_code == 0
    stats = topic_stats(server, "adm")
    assert [c["channel_name"] for c in stats["channels"]] == ["ch"]
    assert stats["channels"][0]["depth"] == 2

    assert run(server, "channel", "pause", "adm", "ch").exit_code == 0
    assert topic_stats(server, "adm")["channels"][0]["paused"] is True
    assert run(server, "channel", "unpause", "adm", "ch").exit_code == 0
    assert topic_stats(server, "adm")["channels"][0]["paused"] is False
    result = run(server, "channel", "empty", "adm", "ch")
    assert (result.exit_code, result.output) == (0, f"emptied channel adm/ch on {http}\n")
    assert topic_stats(server, "adm")["channels"][0]["depth"] == 0

    result = run(server, "--json", "topic", "pause", "adm")
    assert result.exit_code == 0
    assert json.loads(result.output) == {"action": "pause", "topic": "adm", "nodes": [http]}
    assert topic_stats(server, "adm")["paused"] is True
    assert run(server, "topic", "unpause", "adm").exit_code == 0
    assert run(server, "topic", "empty", "adm").exit_code == 0
    assert run(server, "channel", "delete", "adm", "ch").exit_code == 0
    assert topic_stats(server, "adm")["channels"] == []
    result = run(server, "topic", "delete", "adm")
    assert (result.exit_code, result.output) == (0, f"deleted topic adm on {http}\n")
    assert HTTPClient(http or "").stats("adm")["topics"] in (None, [])


def test_replay_channel_create_from_seek_and_tail_from(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    http = server.http_address
    assert run(server, "topic", "create", "rp").exit_code == 0
    # No channel: the topic keeps its messages, in memory; the log gets them on the way.
    assert run(server, "pub", "rp", "a", "b", "c").exit_code == 0
    result = run(server, "tail", "rp", "--from", "earliest", "-n", "3")
    assert (result.exit_code, result.output) == (0, "a\nb\nc\n")
    result = run(server, "--json", "tail", "rp", "--from", "offset:1", "-n", "1")
    line = json.loads(result.output)
    assert (line["offset"], line["body"], line["node"]) == (1, "b", http)
    assert topic_stats(server, "rp")["depth"] == 3  # reading consumed nothing

    result = run(server, "channel", "create", "rp", "all", "--from", "earliest")
    assert (result.exit_code, result.output) == (0, f"created channel rp/all on {http}\n")
    stats = topic_stats(server, "rp")
    assert [c["depth"] for c in stats["channels"]] == [3]
    result = run(server, "channel", "seek", "rp", "all", "--to", "offset:2")
    assert (result.exit_code, result.output) == (
        0, f"channel rp/all on {http} reads from offset 2\n",
    )
    assert topic_stats(server, "rp")["channels"][0]["depth"] == 1
    result = run(server, "--json", "channel", "seek", "rp", "all", "--to", "latest")
    assert json.loads(result.output)["offsets"] == {http: 3}
    assert run(server, "channel", "seek", "rp", "all").exit_code == 2  # seek needs --to
    assert run(server, "channel", "empty", "rp", "all", "--from", "earliest").exit_code == 2
    # A position that is none of the forms: refused before any request, the forms listed.
    forms = ("use earliest, latest, offset:N, a Unix time in milliseconds (1767225600000) or an "
             "RFC 3339 time (2026-01-01T00:00:00Z)")  # fmt: skip
    for args, option in (
        (("channel", "create", "rp", "x", "--from", "whenever"), "--from"),
        (("channel", "seek", "rp", "all", "--to", "offset:x"), "--to"),
        (("tail", "rp", "--from", "yesterday"), "--from"),
    ):
        result = run(server, *args)
        assert result.exit_code == 2, result.output
        assert f"Invalid value for {option}: " in result.stderr, result.stderr
        assert " ".join(result.stderr.split()).endswith(f"is not a position: {forms}"), (
            result.stderr
        )
    assert "x" not in [c["channel_name"] for c in topic_stats(server, "rp")["channels"]]
    # An offset past the end is clamped by the daemon, and lmqadmin says so.
    result = run(server, "channel", "seek", "rp", "all", "--to", "offset:99")
    assert (result.exit_code, result.stdout) == (
        0, f"channel rp/all on {http} reads from offset 3\n",
    )
    assert result.stderr == (
        f"lmqadmin: note: channel rp/all on {http}: offset:99 is past the end of the topic (its "
        "next offset is 3): reads from 3, the end\n"
    )
    result = run(server, "channel", "create", "rp", "late", "--from", "offset:7")
    assert result.exit_code == 0
    assert "offset:7 is past the end of the topic (its next offset is 3)" in result.stderr
    result = run(server, "channel", "seek", "rp", "all", "--to", "offset:1")
    assert result.stderr == ""  # within what is stored: nothing to say


def test_topic_policy(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    http = server.http_address
    assert run(server, "topic", "create", "pol").exit_code == 0
    publish_off = ("max_depth=0, overflow=reject, publish_rate=0, publish_burst=0, "
                   "dedup_window_ms=0, compression=none, min_insync_mirrors=0")  # fmt: skip
    result = run(server, "topic", "policy", "pol")
    assert (result.exit_code, result.output) == (
        0, f"topic pol on {http}: retention_ms=0, retention_bytes=0, ttl_ms=0, {publish_off}\n",
    )
    result = run(server, "topic", "policy", "pol", "--retention", "7d")
    assert result.output == (
        f"topic pol on {http}: retention_ms=604800000, retention_bytes=0, ttl_ms=0, "
        f"{publish_off}\n"
    )
    result = run(server, "--json", "topic", "policy", "pol", "--retention-bytes", "10MiB")
    assert json.loads(result.output) == {
        "topic": "pol",
        "policies": {http: {
            "retention_ms": 604_800_000, "retention_bytes": 10 * 1024**2, "ttl_ms": 0,
            "max_depth": 0, "overflow": "reject", "publish_rate": 0, "publish_burst": 0,
            "dedup_window_ms": 0, "compression": "none", "min_insync_mirrors": 0,
        }},
    }  # fmt: skip
    assert run(server, "topic", "policy", "pol", "--retention", "1.5h").exit_code == 0
    assert run(server, "topic", "policy", "pol", "--ttl", "1h").exit_code == 0
    assert run(server, "topic", "policy", "pol").output.endswith(
        f"retention_ms=5400000, retention_bytes=10485760, ttl_ms=3600000, {publish_off}\n"
    )
    assert run(server, "topic", "policy", "pol", "--retention", "soon").exit_code == 2
    assert run(server, "topic", "policy", "pol", "--retention-bytes", "lots").exit_code == 2
    assert run(server, "topic", "policy", "pol", "--ttl", "later").exit_code == 2
    assert run(server, "topic", "pause", "pol", "--retention", "1d").exit_code == 2
    assert run(server, "topic", "pause", "pol", "--ttl", "1d").exit_code == 2
    assert run(server, "topic", "policy", "nope").exit_code == 1
    result = run(server, "topic", "policy", "pol", "--min-insync-mirrors", "1")
    assert result.output.endswith("compression=none, min_insync_mirrors=1\n"), result.output
    assert run(server, "topic", "policy", "pol", "--min-insync-mirrors", "-1").exit_code == 2
    assert run(server, "topic", "policy", "pol", "--min-insync-mirrors", "0").exit_code == 0


def test_channel_policy_and_redrive(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    http = server.http_address
    assert run(server, "topic", "create", "cp").exit_code == 0
    assert run(server, "channel", "create", "cp", "work").exit_code == 0
    result = run(server, "channel", "policy", "cp", "work")
    assert (result.exit_code, result.output) == (0, (
        f"channel cp/work on {http}: max_attempts=0, dead_letter_topic=, backoff_ms=0, "
        "backoff_max_ms=0, backoff_jitter=0\n"
    ))
    result = run(server, "--json", "channel", "policy", "cp", "work", "--max-attempts", "5",
                 "--dead-letter-topic", "cp.dead", "--backoff", "1s", "--backoff-max", "1m",
                 "--backoff-jitter", "0.2")
    assert json.loads(result.output) == {
        "topic": "cp", "channel": "work",
        "policies": {http: {"max_attempts": 5, "dead_letter_topic": "cp.dead",
                            "backoff_ms": 1000, "backoff_max_ms": 60_000,
                            "backoff_jitter": 0.2}},
    }  # fmt: skip
    # Refused client-side (usage) or by the daemon (exit 1, its message).
    assert run(server, "channel", "policy", "cp", "work", "--backoff-jitter", "2").exit_code == 2
    assert run(server, "channel", "policy", "cp", "work", "--max-attempts", "-1").exit_code == 2
    assert run(server, "channel", "pause", "cp", "work", "--max-attempts", "1").exit_code == 2
    result = run(server, "channel", "policy", "cp", "work", "--dead-letter-topic", "cp")
    assert result.exit_code == 1
    assert "dead_letter_topic must not be the channel's own topic" in result.output
    # Redrive needs --from; a topic nothing was dead-lettered to is not found.
    assert run(server, "channel", "redrive", "cp", "work").exit_code == 2
    result = run(server, "channel", "seek", "cp", "work", "--to", "latest", "--max", "3")
    assert result.exit_code == 2
    result = run(server, "channel", "redrive", "cp", "work", "--from", "cp.dead")
    assert result.exit_code == 1
    assert "DEAD_LETTER_TOPIC_NOT_FOUND" in result.output


def test_topic_publish_policy_and_its_counters_in_stats(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    http = server.http_address
    assert run(server, "topic", "create", "bounded").exit_code == 0
    result = run(server, "topic", "policy", "bounded", "--max-depth", "10000", "--overflow",
                 "drop_oldest", "--rate", "100", "--burst", "200", "--dedup-window", "5m")
    assert (result.exit_code, result.output) == (0, (
        f"topic bounded on {http}: retention_ms=0, retention_bytes=0, ttl_ms=0, max_depth=10000, "
        "overflow=drop_oldest, publish_rate=100, publish_burst=200, dedup_window_ms=300000, "
        "compression=none, min_insync_mirrors=0\n"
    ))  # fmt: skip
    result = run(server, "--json", "topic", "policy", "bounded", "--max-depth", "2",
                 "--overflow", "reject")  # fmt: skip
    assert json.loads(result.output)["policies"][http]["max_depth"] == 2
    assert run(server, "pub", "bounded", "a", "a", "b").exit_code == 0  # one duplicate
    assert run(server, "pub", "bounded", "c").exit_code == 1  # full: refused
    for bad in (["--overflow", "drop_newest"], ["--rate", "-1"], ["--dedup-window", "soon"],
                ["--max-depth", "ten"]):  # fmt: skip
        assert run(server, "topic", "policy", "bounded", *bad).exit_code == 2, bad
    assert run(server, "topic", "pause", "bounded", "--rate", "1").exit_code == 2

    result = run(server, "--json", "stats", "bounded", "--interval", "0")
    (topic,) = json.loads(result.output)["topics"]
    assert (topic["deduplicated_count"], topic["overflow_refused_count"]) == (1, 1)
    assert (topic["rate_limited_count"], topic["overflow_dropped_count"]) == (0, 0)
    result = run(server, "stats", "bounded", "--interval", "0")
    header = next(line for line in result.output.splitlines() if "topic / channel" in line)
    assert "policy" in header
    row = next(line for line in result.output.splitlines() if "│ bounded " in line)
    assert row.split("│")[-2].strip() == "refused 1, deduplicated 1"


def test_errors_and_exit_codes(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    result = run(server, "topic", "delete", "never-existed")
    assert result.exit_code == 1
    assert result.output == (
        f"lmqadmin: error: {server.http_address} answered HTTP 404 TOPIC_NOT_FOUND\n"
    )
    result = run(server, "channel", "create", "bad name", "c")
    assert result.exit_code == 2
    assert "invalid topic name 'bad name'" in result.output
    result = run(server, "pub", "x" * 65, "m")
    assert result.exit_code == 2
    dead = free_address()
    result = run(server, "--http-address", dead, "stats")
    assert result.exit_code == 3
    assert result.output.startswith(f"lmqadmin: error: cannot reach the daemon at {dead}: ")
    result = run(server, "--tcp-address", dead, "pub", "t", "m")
    assert result.exit_code == 3
    assert f"cannot reach the daemon at {dead}: cannot connect" in result.output
    result = run(server, "--tcp-address", dead, "tail", "t", "-n", "1")
    assert result.exit_code == 3
    assert dead in result.output
    result = run(server, "--tcp-address", "nonsense", "pub", "t", "m")
    assert result.exit_code == 2
    assert "want HOST:PORT" in result.output


def test_stats_table_json_and_watch(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    assert run(server, "channel", "create", "st", "c1").exit_code == 1  # topic must exist
    assert run(server, "topic", "create", "st").exit_code == 0
    assert run(server, "channel", "create", "st", "c1").exit_code == 0
    assert run(server, "pub", "st", "a", "b", "c").exit_code == 0

    result = run(server, "stats", "st", "--interval", "0")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if "topic / channel" in line)
    for column in ("depth", "in-flight", "deferred", "rate/s", "e2e latency"):
        assert column in header
    topic_row = next(line for line in lines if "│ st " in line)
    channel_row = next(line for line in lines if "│   c1 " in line)
    assert topic_row.split("│")[9].strip() == "3"  # messages
    assert channel_row.split("│")[2].strip() == "3"  # depth

    result = run(server, "stats", "st", "--json", "--interval", "0.2")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["nodes"] == [server.http_address]
    (topic,) = data["topics"]
    assert (topic["topic"], topic["message_count"], topic["rate"]) == ("st", 3, 0.0)
    assert topic["channels"][0]["channel"] == "c1"
    assert topic["channels"][0]["depth"] == 3

    result = run(server, "--json", "stats", "st", "--watch", "--count", "2", "--interval", "0.1")
    assert result.exit_code == 0
    snapshots = [json.loads(line) for line in result.output.splitlines()]
    assert len(snapshots) == 2
    assert all(s["topics"][0]["rate"] == 0.0 for s in snapshots)
    result = run(server, "stats", "st", "--watch", "--count", "1", "--interval", "0.1")
    assert result.exit_code == 0 and "c1" in result.output


def test_stats_rates_between_samples(lmqd_module_server: LmqdProcess) -> None:
    from lmq_client.admin.stats import sample

    server = lmqd_module_server
    assert server.http_address is not None
    client = HTTPClient(server.http_address)
    client.topic_action("create", "rates")
    first = sample([client], "rates")
    for i in range(20):
        client.pub("rates", b"%d" % i)
    second = sample([client], "rates", previous=first)
    row = second.rows[("rates", None)]
    elapsed = second.taken_at - first.taken_at
    assert row.rate == pytest.approx(20 / elapsed)


def test_bench_reports_plausible_figures(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    result = run(server, "--json", "bench", "--count", "4000", "--batch-size", "100",
                 "--size", "64", "--rdy", "200")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["errors"] == []
    pub, sub, lat = report["publish"], report["consume"], report["latency_ms"]
    assert pub["messages"] == sub["messages"] == 4000
    for side in (pub, sub):
        assert side["msgs_per_s"] > 100
        assert side["mb_per_s"] == pytest.approx(side["msgs_per_s"] * 64 / 1e6, rel=0.01)
        # One process, its threads on every core (plus sampling slack): never more than that.
        assert 0 <= side["client_cpu_pct_per_process"] <= 100 * (os.cpu_count() or 1) + 10
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p99.9"] <= lat["max"] < 30_000
    # the bench topic was deleted afterwards
    assert server.http_address is not None
    topics = HTTPClient(server.http_address).stats()["topics"]
    assert not [t for t in topics if t["topic_name"] == report["topic"]]


def test_bench_text_report_with_duration(lmqd_module_server: LmqdProcess) -> None:
    result = run(lmqd_module_server, "bench", "--duration", "0.5", "--topic", "benchtext",
                 "--keep-topic")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("bench benchtext/bench on ")
    assert lines[1].startswith("publish ") and "msgs/s" in lines[1] and "MB/s" in lines[1]
    assert lines[2].startswith("consume ")
    assert lines[3].startswith("latency  p50=") and "p99.9=" in lines[3]
    assert topic_stats(lmqd_module_server, "benchtext")["channels"][0]["depth"] == 0


def test_bench_without_writers_drains_a_backlog_to_count(
    lmqd_module_server: LmqdProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = lmqd_module_server
    result = run(server, "--json", "bench", "--topic", "backlog", "--writers", "1",
                 "--readers", "0", "--count", "500", "--batch-size", "100")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["consume"] is None
    # The reader's SUB creates the first channel, which takes the topic's backlog.
    result = run(server, "--json", "bench", "--topic", "backlog", "--writers", "0",
                 "--readers", "1", "--count", "300", "--rdy", "1")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["publish"] is None and report["errors"] == []
    assert report["consume"]["messages"] == 300
    # Asking for more than is left: the idle timeout ends the drain, and says so.
    monkeypatch.setattr("lmq_client.admin.bench.DRAIN_IDLE_TIMEOUT", 0.5)
    result = run(server, "--json", "bench", "--topic", "backlog", "--writers", "0",
                 "--readers", "1", "--count", "1000")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["consume"]["messages"] == 200
    assert report["errors"] == ["consumed 200 of the 1000 messages asked for"]
    assert topic_stats(server, "backlog")["channels"][0]["depth"] == 0


def test_bench_unreachable_daemon_exit_code(lmqd_module_server: LmqdProcess) -> None:
    dead = free_address()
    result = run(lmqd_module_server, "--tcp-address", dead, "bench", "--count", "10")
    assert result.exit_code == 3
    assert dead in result.output


def test_console_script_module_entry(lmqd_module_server: LmqdProcess) -> None:
    """``python -m lmq_client.admin`` (what the lmqadmin script runs) with real exit codes."""
    server = lmqd_module_server
    assert server.http_address is not None
    env_args = ["--tcp-address", server.tcp_address, "--http-address", server.http_address]
    proc = subprocess.run(
        [sys.executable, "-m", "lmq_client.admin", *env_args, "topic", "create", "script"],
        capture_output=True, text=True, timeout=30,
    )
    assert (proc.returncode, proc.stdout) == (0, f"created topic script on {server.http_address}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "lmq_client.admin", *env_args, "topic", "delete", "nope-none"],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 1
    assert "TOPIC_NOT_FOUND" in proc.stderr


def test_the_wrong_port_or_not_lmqd_is_exit_3_in_one_line(
    lmqd_module_server: LmqdProcess, tmp_path: Path
) -> None:
    server = lmqd_module_server
    # --http-address pointed at the daemon's TCP port: it answers, but not in HTTP.
    result = CliRunner().invoke(
        cli, ["--http-address", server.tcp_address, "stats"], catch_exceptions=False
    )
    assert result.exit_code == 3
    expected = f"lmqadmin: error: cannot reach the daemon at {server.tcp_address}"
    assert result.stderr.startswith(expected)
    assert "is it the TCP port?" in result.stderr and len(result.stderr.splitlines()) == 1
    # The opposite mistake: --tcp-address pointed at the HTTP port.
    assert server.http_address is not None
    result = CliRunner().invoke(
        cli, ["--tcp-address", server.http_address, "pub", "t", "x"], catch_exceptions=False
    )
    assert result.exit_code == 3
    assert result.stderr == (
        f"lmqadmin: error: cannot reach the daemon at {server.http_address}: the answer is HTTP, "
        "not NSQ's TCP protocol; is it the HTTP port?\n"
    )
    # An HTTP server that is not lmqd (it serves this directory's listing as HTML).
    (tmp_path / "stats").write_text("<html>not lmqd</html>")
    web = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "-d", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert web.stdout is not None
        line = web.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (...)"
        port = line.split(" port ")[1].split()[0]
        result = CliRunner().invoke(
            cli, ["--http-address", f"127.0.0.1:{port}", "stats"], catch_exceptions=False
        )
    finally:
        web.terminate()
        web.wait(10)
        if web.stdout is not None:
            web.stdout.close()
    assert result.exit_code == 3, result.output
    assert "not an lmqd HTTP API" in result.stderr and len(result.stderr.splitlines()) == 1
