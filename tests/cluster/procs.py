"""lmqd and lmqlookupd subprocesses for the cluster tests, and a blocking HTTP helper.

``Daemon`` runs ``python -m lmqd`` or ``python -m lmqd.lookupd`` on 127.0.0.1 (port 0 unless a
test asks for a port, e.g. to restart a lookupd where it was), drains its output in a thread and
reads its addresses from the ``TCP: listening on`` / ``HTTP: listening on`` lines both daemons
log. ``stop()`` SIGTERMs (bounded, SIGKILL past it) and returns the exit code; ``check()``
fails the test if the daemon died early or logged a traceback.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[2]

# Interpreter start-up and imports take ~1 s on an idle machine; 20 s leaves room on a busy one.
STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
HTTP_TIMEOUT_S = 5.0

_LISTENING = re.compile(r"(TCP|HTTP): listening on (\S+)")

T = TypeVar("T")


class Daemon:
    """A running daemon and everything it has written so far (stdout and stderr)."""

    def __init__(self, module: str, *flags: str) -> None:
        self.command = [sys.executable, "-m", module, *flags]
        self.process = subprocess.Popen(
            self.command,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.lines: list[str] = []
        self.addresses: dict[str, str] = {}
        self._both = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._both.wait(STARTUP_TIMEOUT_S)
        if len(self.addresses) < 2:
            self.stop()
            raise AssertionError(f"{' '.join(self.command)} did not start:\n{self.output()}")

    def _read(self) -> None:
        # Drained for the daemon's whole life: a full pipe would block its logging.
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            if m := _LISTENING.search(line):
                self.addresses.setdefault(m.group(1), m.group(2))
                if len(self.addresses) == 2:
                    self._both.set()
        self._both.set()

    @property
    def tcp(self) -> str:
        return self.addresses["TCP"]

    @property
    def http(self) -> str:
        return self.addresses["HTTP"]

    @property
    def tcp_port(self) -> int:
        return int(self.tcp.rpartition(":")[2])

    @property
    def http_port(self) -> int:
        return int(self.http.rpartition(":")[2])

    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> int:
        """SIGTERM, wait (bounded; SIGKILL past it); the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode

    def check_stop(self) -> None:
        """Stop, and fail if the daemon had died, did not exit cleanly or logged a traceback."""
        early = self.process.poll()
        code = self.stop()
        output = self.output()
        assert early is None, f"exited early ({early}):\n{output}"
        assert code == 0, f"exit code {code}:\n{output}"
        assert "Traceback" not in output, output


def lookupd(tcp_port: int = 0, http_port: int = 0) -> Daemon:
    return Daemon(
        "lmqd.lookupd",
        f"--tcp-address=127.0.0.1:{tcp_port}",
        f"--http-address=127.0.0.1:{http_port}",
        "--broadcast-address=127.0.0.1",
    )


def lmqd(data_path: Path, *flags: str) -> Daemon:
    data_path.mkdir(parents=True, exist_ok=True)
    return Daemon(
        "lmqd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
        f"--data-path={data_path}",
        *flags,
    )


def http(address: str, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    """One request: ``(status, decoded JSON or text)``."""
    request = urllib.request.Request(f"http://{address}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def eventually(probe: Callable[[], T], accept: Callable[[T], bool], within: float) -> T:
    """Poll ``probe`` until ``accept`` holds for its result (a subprocess has no event to wait
    on); the last result, or AssertionError with it after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = probe()
        if accept(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {within:g}s")
        time.sleep(0.05)
