"""The ``lmqlookupd`` command (``python -m lmqd.lookupd``): flags, config file, failures.

Rules for this module:
- real subprocesses on 127.0.0.1 port 0, each bounded by a timeout; a started daemon is
  stopped with SIGTERM and must exit 0 without a traceback;
- every failure must be exactly one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lmqd.lookup import IdentifyResponse, LookupClientConnection

from .process import REPO_ROOT, LookupdProcess, lookupd_command
from .wire import identify

RUN_TIMEOUT_S = 30


def run(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        lookupd_command(*flags), cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def identify_answer(address: tuple[str, int]) -> IdentifyResponse:
    codec = LookupClientConnection()
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(codec.initial_bytes() + codec.send(identify(4150)))
        while (event := codec.next_event()) is None:
            codec.receive_data(sock.recv(4096))
    assert isinstance(event, IdentifyResponse), event
    return event


def started(*flags: str) -> LookupdProcess:
    return LookupdProcess(*flags)


def stop_cleanly(process: LookupdProcess) -> None:
    assert process.stop() == 0, process.output()
    assert "Traceback" not in process.output(), process.output()


def test_go_flag_syntaxes_and_listening_lines() -> None:
    process = started(
        "-tcp-address", "127.0.0.1:0", "-http-address=127.0.0.1:0",
        "--broadcast-address", "node.example", "--log-prefix=[lk] ", "-verbose",
        "--inactive-producer-timeout=5m0s", "-tombstone-lifetime", "1m30s",
    )  # fmt: skip
    try:
        answer = identify_answer(process.tcp)
        assert (answer.broadcast_address, answer.tcp_port, answer.http_port) == (
            "node.example", process.tcp[1], process.http[1],
        )  # fmt: skip
        assert answer.version == "1.3.0"
        lines = [line for line in process.output_lines() if "listening on" in line]
        assert lines[0].startswith("[lk] ") and " INFO: TCP: listening on 127.0.0.1:" in lines[0]
        assert " INFO: HTTP: listening on 127.0.0.1:" in lines[1]
    finally:
        stop_cleanly(process)


def test_config_file_under_flags(tmp_path: Path) -> None:
    config = tmp_path / "lookupd.toml"
    config.write_text(
        'tcp_address = "127.0.0.1:0"\nhttp_address = "127.0.0.1:0"\n'
        'broadcast_address = "from-config"\ntombstone_lifetime = 1500\n'
        'inactive_producer_timeout = "300s"\nlog_level = "WARN"\n'
    )
    process = started(f"--config={config}", "--log-level=info")
    try:
        assert identify_answer(process.tcp).broadcast_address == "from-config"
    finally:
        stop_cleanly(process)
    process = started(f"--config={config}", "--broadcast-address=from-flag", "--log-level=info")
    try:
        assert identify_answer(process.tcp).broadcast_address == "from-flag"
    finally:
        stop_cleanly(process)


def test_version() -> None:
    for flag in ("--version", "-version"):
        done = run(flag)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "nsqlookupd v1.3.0 (built w/lmq-0.1.0)\n"


HELP_LINE = re.compile(r"  (--[a-z-]+)(?: ([^ ]+))?(?: {2,}(.*))?")


def help_entries(text: str) -> dict[str, tuple[str, str]]:
    """``--help``'s options: flag -> (metavar, help with click's line wrapping undone)."""
    entries: dict[str, tuple[str, list[str]]] = {}
    flag = ""
    for line in text.partition("Options:")[2].splitlines():
        m = HELP_LINE.fullmatch(line)
        if m is not None:
            flag = m.group(1)
            entries[flag] = (m.group(2) or "", [m.group(3) or ""])
        elif flag and line.strip():
            entries[flag][1].append(line.strip())
    return {
        f: (metavar, " ".join(" ".join(parts).split()))
        for f, (metavar, parts) in entries.items()
    }


def test_help_shows_metavars_and_defaults_as_lmqd_does() -> None:
    done = run("-h")
    assert done.returncode == 0, done.stderr
    ours = help_entries(done.stdout)
    lmqd_help = subprocess.run(
        [sys.executable, "-m", "lmqd", "--help"], capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S, check=True, stdin=subprocess.DEVNULL,
    ).stdout  # fmt: skip
    theirs = help_entries(lmqd_help)
    # The flags both daemons have are shown alike: the same metavar, the default written the
    # same way (nsqd's: 1m0s, true, text as it is, quoted only when empty or padded).
    for flag in ("--config", "--version", "--verbose", "--tcp-address", "--http-address",
                 "--broadcast-address", "--log-level", "--log-prefix"):  # fmt: skip
        assert ours[flag][0] == theirs[flag][0], (flag, ours[flag], theirs[flag])
        default = re.search(r"\[default: (.*)\]$", theirs[flag][1])
        if default is not None:
            assert re.search(r"\[default: (.*)\]$", ours[flag][1]) is not None, ours[flag]
    assert ours["--version"] == theirs["--version"] == ("", "print the version and exit")
    assert ours["--tcp-address"][1].endswith("[default: 0.0.0.0:4160]")
    assert ours["--log-level"][1].endswith("[default: info]")
    assert ours["--log-prefix"][1].endswith('[default: "[lmqlookupd] "]')
    assert ours["--tombstone-lifetime"] == (
        "DURATION",
        "duration of time a producer will remain tombstoned if registration remains "
        "[default: 45s]",
    )
    assert ours["--inactive-producer-timeout"][1].endswith("[default: 5m0s]")


@pytest.mark.parametrize("flag", ["-version=false", "-version=0"])
def test_version_false_is_not_a_request(flag: str) -> None:
    done = run(flag, "--tcp-address=bad")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1, done.stderr


def test_help_names_the_flags() -> None:
    done = run("-h")
    assert done.returncode == 0, done.stderr
    for flag in ("--tcp-address", "--http-address", "--broadcast-address",
                 "--inactive-producer-timeout", "--tombstone-lifetime", "--log-level",
                 "--log-prefix", "--config"):  # fmt: skip
        assert flag in done.stdout


@pytest.mark.parametrize(
    ("flags", "code", "message"),
    [
        (["--bogus"], 2, "Error: No such option '--bogus'."),
        (["-tcp-address"], 2, "Error: flag needs an argument: -tcp-address"),
        (["extra"], 2, "Error: Got unexpected extra argument (extra)"),
        (["--tombstone-lifetime", "45"], 1,
         "Error: invalid value '45' for --tombstone-lifetime: "
         'time: missing unit in duration "45"'),
        (["--log-level=loud"], 1,
         "Error: invalid value 'loud' for --log-level: "
         "invalid log level 'loud' (debug, info, warn, error, fatal)"),
        (["--tcp-address=nowhere"], 1,
         "Error: invalid address 'nowhere': want HOST:PORT"),
        (["--version=maybe"], 2,
         "Error: invalid value for --version=maybe: not a boolean (true, false, 1, 0, t, f)"),
    ],
)  # fmt: skip
def test_bad_flags_are_one_line(flags: list[str], code: int, message: str) -> None:
    done = run(*flags)
    assert (done.returncode, done.stderr, done.stdout) == (code, message + "\n", "")


def test_bad_config_file_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('tombstone_lifetme = "45s"\n')
    done = run(f"--config={config}")
    assert (done.returncode, done.stderr) == (
        1, f"Error: unknown option 'tombstone_lifetme' in {config}\n",
    )  # fmt: skip
    done = run(f"--config={tmp_path / 'missing.toml'}")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: failed to load config file ")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("which", ["tcp", "http"])
def test_address_in_use_is_one_line(which: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        flags = {"tcp": "127.0.0.1:0", "http": "127.0.0.1:0"}
        flags[which] = f"127.0.0.1:{port}"
        done = run(f"--tcp-address={flags['tcp']}", f"--http-address={flags['http']}")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].endswith(
        f"FATAL: {which.upper()} listen (127.0.0.1:{port}) failed - Address already in use"
    ), lines
