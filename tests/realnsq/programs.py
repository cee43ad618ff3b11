"""Real NSQ v1.3.0 programs (nsqd, nsqlookupd, nsqadmin, NSQ's tools) next to lmq's daemons.

``LMQ_NSQ_BIN`` names the folder with NSQ's programs (``scripts/test`` extracts them from
``../shared/nsq`` and sets it). Without it every test of this package skips, naming the
variable; with it, a program missing from the folder is an error, not a skip.

Daemons run on 127.0.0.1 with port 0 (their addresses come from their ``listening on`` lines,
which nsqd, nsqlookupd, nsqadmin, lmqd and lmqlookupd all log alike), data in the test's
temporary directories (``tests.support.process.DaemonProcess``: output drained by a thread,
``check_stop()`` at the end). NSQ's tools run with a timeout (``run_tool``) or in the
background (``Tool``: stopped with SIGINT, as a user's Ctrl-C, and killed if that is not
enough).

Comparing lmqd's answers with nsqd's: ``Labels`` replaces each daemon's addresses and ports by
a name (``node0``...), so two clusters doing the same things give the same normalized answers
(``normalized``), whatever ports they got.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.procs import Daemon
from tests.support.process import REPO_ROOT

__all__ = [
    "HARNESS_VERSION",
    "NSQ_BIN",
    "Consumer",
    "Daemon",
    "Labels",
    "Tool",
    "lmqd",
    "lmqlookupd",
    "normalized",
    "nsqadmin",
    "nsqd",
    "nsqlookupd",
    "program",
    "requires_nsq",
    "run_tool",
]

NSQ_BIN = os.environ.get("LMQ_NSQ_BIN") or None
"""The folder of NSQ's programs, or None (the tests skip)."""

requires_nsq = pytest.mark.skipif(
    NSQ_BIN is None,
    reason="LMQ_NSQ_BIN is not set: the folder of the real NSQ v1.3.0 programs "
    "(scripts/test sets it from ../shared/nsq)",
)

HARNESS_VERSION = re.compile(r"(\w+) v(\d+\.\d+\.\d+) \(built w/([a-z0-9.-]+)\)")
"""How test harnesses (gnsq's among them) read a daemon's version line."""

TOOL_TIMEOUT_S = 30.0
"""Longest a tool run to completion may take: the tests give each a few hundred messages."""


def program(name: str) -> str:
    """The path of NSQ's program ``name``."""
    assert NSQ_BIN is not None, "LMQ_NSQ_BIN is not set"
    path = Path(NSQ_BIN) / name
    assert path.is_file() and os.access(path, os.X_OK), f"LMQ_NSQ_BIN has no program {name}"
    return str(path)


def _node_flags(data_path: Path, lookupds: Iterable[str], flags: Sequence[str]) -> list[str]:
    data_path.mkdir(parents=True, exist_ok=True)
    return [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
        f"--data-path={data_path}",
        *(f"--lookupd-tcp-address={address}" for address in lookupds),
        *flags,
    ]


def nsqd(data_path: Path, *flags: str, lookupds: Iterable[str] = ()) -> Daemon:
    return Daemon([program("nsqd"), *_node_flags(data_path, lookupds, flags)])


def lmqd(data_path: Path, *flags: str, lookupds: Iterable[str] = ()) -> Daemon:
    return Daemon([sys.executable, "-m", "lmqd", *_node_flags(data_path, lookupds, flags)])


def _lookupd_flags(tcp_port: int, http_port: int) -> list[str]:
    return [
        f"--tcp-address=127.0.0.1:{tcp_port}",
        f"--http-address=127.0.0.1:{http_port}",
        "--broadcast-address=127.0.0.1",
    ]


def nsqlookupd(tcp_port: int = 0, http_port: int = 0) -> Daemon:
    return Daemon([program("nsqlookupd"), *_lookupd_flags(tcp_port, http_port)])


def lmqlookupd(tcp_port: int = 0, http_port: int = 0) -> Daemon:
    return Daemon([sys.executable, "-m", "lmqd.lookupd", *_lookupd_flags(tcp_port, http_port)])


def nsqadmin(*lookupd_http: str) -> Daemon:
    return Daemon(
        [program("nsqadmin"), "--http-address=127.0.0.1:0",
         *(f"--lookupd-http-address={address}" for address in lookupd_http)],
        wanted=("HTTP",),
    )  # fmt: skip


def run_tool(
    name: str, *args: str, input: bytes | None = None, timeout: float = TOOL_TIMEOUT_S
) -> subprocess.CompletedProcess[bytes]:
    """Run NSQ's tool ``name`` to completion (bounded); its output captured."""
    return subprocess.run(
        [program(name), *args], input=input, capture_output=True, timeout=timeout, check=False,
        cwd=REPO_ROOT,
    )  # fmt: skip


class Tool:
    """One of NSQ's tools running in the background; ``stop()`` is a user's Ctrl-C."""

    def __init__(self, name: str, *args: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [program(name), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
        )  # fmt: skip
        self._output: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._output.append(line)

    def output(self) -> str:
        return b"".join(self._output).decode("utf-8", "replace")

    def stop(self, timeout: float = 10.0) -> int:
        """SIGINT, then wait (SIGKILL after ``timeout``); the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


_ADDRESS = re.compile(r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}:\d+(?!\d)")


class Labels:
    """Names for addresses: ``"127.0.0.1:4151"`` and its port, wherever they appear, become a
    label (``node0``), so two clusters' answers compare equal when they did the same."""

    def __init__(self) -> None:
        self._by_text: dict[str, str] = {}
        self._by_port: dict[int, str] = {}

    def add(self, label: str, *addresses: str) -> None:
        for address in addresses:
            self._by_text[address] = label
            self._by_port[int(address.rpartition(":")[2])] = label

    def text(self, value: str) -> str:
        """``value`` with each whole address it holds replaced by its label (a whole one:
        127.0.0.1:4016 must not match inside 127.0.0.1:40167)."""
        return _ADDRESS.sub(lambda m: self._by_text.get(m.group(0), m.group(0)), value)

    def port(self, value: int) -> str | int:
        return self._by_port.get(value, value)


VOLATILE_KEYS = frozenset({
    "connect_ts", "start_time", "last_update", "remote_address", "remote_addresses",
    "hostname", "client_id", "id", "tombstoned_at", "memory", "ready_count_enabled",
    "uptime", "uptime_seconds", "last_ping", "timestamp", "connected",
})  # fmt: skip
"""Keys whose values differ between two runs of the same thing (times, ephemeral client ports,
the machine): ``normalized`` replaces them by their type's name. ``connected`` is nsqadmin's
time since a client's ``connect_ts``, in whole seconds (as nanoseconds): 0 or 1e9 by timing."""


def normalized(
    value: Any, labels: Labels, *, drop: Iterable[str] = (), sort_lists: bool = True
) -> Any:
    """``value`` (decoded JSON) with addresses and ports replaced by ``labels``, the
    ``VOLATILE_KEYS`` by a placeholder, the keys in ``drop`` removed, and lists sorted (Go's
    map iteration order is random: nsqlookupd's lists have no order)."""
    dropped = frozenset(drop)

    def walk(v: Any, key: str = "") -> Any:
        if isinstance(v, Mapping):
            return {
                labels.text(k): (f"<{type(x).__name__}>" if k in VOLATILE_KEYS else walk(x, k))
                for k, x in sorted(v.items())
                if k not in dropped
            }
        if isinstance(v, list | tuple):
            items = [walk(x, key) for x in v]
            if isinstance(v, tuple):
                return tuple(items)  # a fixed shape, (status, body): its order means something
            return sorted(items, key=repr) if sort_lists else items
        if isinstance(v, str):
            return labels.text(v)
        if isinstance(v, int) and not isinstance(v, bool) and key.endswith("port"):
            return labels.port(v)
        return v

    return walk(value)


class Consumer:
    """A blocking V2 consumer on one connection, to put a daemon in a known state: it takes
    exactly the messages asked (RDY n, then RDY 0) and finishes or requeues each when told;
    the connection stays open (a client in ``/stats``) until the ``with`` block ends."""

    def __init__(self, address: str, topic: str, channel: str) -> None:
        host, _, port = address.rpartition(":")
        self._sock = socket.create_connection((host, int(port)), timeout=10)
        self._buf = b""
        self._sock.sendall(b"  V2" + f"SUB {topic} {channel}\n".encode())
        assert self._frame() == (0, b"OK")

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()

    def _frame(self) -> tuple[int, bytes]:
        while True:
            if len(self._buf) >= 8:
                size, kind = struct.unpack_from(">Ii", self._buf)
                if len(self._buf) >= 4 + size:
                    data = self._buf[8 : 4 + size]
                    self._buf = self._buf[4 + size :]
                    if kind == 0 and data == b"_heartbeat_":
                        self._sock.sendall(b"NOP\n")
                        continue
                    return kind, data
            chunk = self._sock.recv(65536)
            assert chunk, "the daemon closed the connection"
            self._buf += chunk

    def take(self, count: int) -> list[bytes]:
        """The ids of the next ``count`` messages, held in flight."""
        self._sock.sendall(b"RDY %d\n" % count)
        ids = []
        while len(ids) < count:
            kind, data = self._frame()
            assert kind == 2, (kind, data)  # a message frame
            ids.append(data[10:26])
        self._sock.sendall(b"RDY 0\n")
        return ids

    def fin(self, ids: Sequence[bytes]) -> None:
        self._sock.sendall(b"".join(b"FIN %s\n" % i for i in ids))

    def req(self, msg_id: bytes, *, delay_ms: int) -> None:
        self._sock.sendall(b"REQ %s %d\n" % (msg_id, delay_ms))
