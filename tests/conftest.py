"""Shared fixture: a real ``lmqd`` daemon in a subprocess.

``lmqd_server`` starts ``python -m lmqd`` on 127.0.0.1 with port 0 for TCP and HTTP and a data path
in ``tmp_path``, waits for its ``TCP: listening on <addr>`` log line (read from its output by a
thread), yields an ``LmqdServer`` and, on teardown, sends SIGTERM, waits (bounded) and fails the
test if the daemon had to be killed or logged a traceback.

Extra daemon flags come from a marker::

    @pytest.mark.lmqd_args("--msg-timeout=1s", "--max-msg-size=100")
    def test_something(lmqd_server: LmqdServer) -> None: ...

``lmqd_module_server`` is the same daemon shared by all tests of a module (flags from the module's
``LMQD_ARGS``), for suites of many short cases.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Starting the interpreter and importing trio takes ~1 s on an idle machine; 20 s leaves room for
# a loaded 2-core CI box without letting a daemon that never listens hang the suite.
STARTUP_TIMEOUT_S = 20.0
# SIGTERM triggers a graceful shutdown that writes queues to disk; tests keep queues small.
SHUTDOWN_TIMEOUT_S = 15.0
# The HTTP line follows the TCP line within milliseconds when the HTTP API is served at all.
HTTP_LINE_WAIT_S = 2.0

_TCP_LINE = re.compile(r"TCP: listening on (\S+)")
_HTTP_LINE = re.compile(r"HTTP: listening on (\S+)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "lmqd_args(*flags): extra command-line flags for the lmqd_server fixture"
    )


class LmqdServer:
    """A running ``lmqd`` subprocess and what it has logged so far."""

    def __init__(self, args: list[str], data_path: Path) -> None:
        self.args = args
        self.data_path = data_path
        self.process = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._tcp_address: str | None = None
        self._http_address: str | None = None
        self._tcp_seen = threading.Event()
        self._http_seen = threading.Event()
        self._eof = threading.Event()
        self._reader = threading.Thread(target=self._read_output, name="lmqd-output", daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        # One thread drains the pipe for the daemon's whole life: a full pipe would block its
        # logging, and so the daemon itself.
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self._lines.append(line)
            if self._tcp_address is None and (m := _TCP_LINE.search(line)):
                self._tcp_address = m.group(1)
                self._tcp_seen.set()
            if self._http_address is None and (m := _HTTP_LINE.search(line)):
                self._http_address = m.group(1)
                self._http_seen.set()
        self._eof.set()
        self._tcp_seen.set()
        self._http_seen.set()

    def wait_started(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Wait for the TCP listening line; fail the test, showing the daemon's output, if none."""
        self._tcp_seen.wait(timeout)
        if self._tcp_address is None:
            state = "exited" if self.process.poll() is not None else "still running"
            self.terminate()
            pytest.fail(
                f"lmqd did not log 'TCP: listening on' within {timeout:.0f}s ({state}, "
                f"exit code {self.process.returncode}); command {' '.join(self.args)}; "
                f"output:\n{self.output()}"
            )

    @property
    def tcp_address(self) -> str:
        """``"127.0.0.1:<port>"`` of the V2 TCP listener."""
        assert self._tcp_address is not None
        return self._tcp_address

    @property
    def tcp_host_port(self) -> tuple[str, int]:
        host, _, port = self.tcp_address.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def http_address(self) -> str | None:
        """``"127.0.0.1:<port>"`` of the HTTP API, or None if the daemon serves none."""
        if self._http_address is None and not self._eof.is_set():
            self._http_seen.wait(HTTP_LINE_WAIT_S)
        return self._http_address

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr_lines(self) -> list[str]:
        """Everything the daemon has logged so far (stdout and stderr, in order)."""
        with self._lock:
            return list(self._lines)

    def output(self) -> str:
        return "\n".join(self.stderr_lines())

    def rss_bytes(self) -> int:
        """The daemon's resident set size now (``VmRSS`` in ``/proc/<pid>/status``)."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert m is not None, status
        return int(m.group(1)) * 1024

    def terminate(self) -> bool:
        """SIGTERM, wait (bounded), SIGKILL if needed; True if it exited on its own."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
                self._close_pipe()
                return False
        self._close_pipe()
        return True

    def _close_pipe(self) -> None:
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()


def lmqd_command(data_path: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """The command line that runs a daemon on ephemeral 127.0.0.1 ports in ``data_path``."""
    return [
        sys.executable,
        "-m",
        "lmqd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={data_path}",
        *extra,
    ]


def start_lmqd(data_path: Path, extra: list[str]) -> LmqdServer:
    """Start a daemon with ``extra`` flags and wait until it listens on TCP."""
    data_path.mkdir(parents=True, exist_ok=True)
    server = LmqdServer(lmqd_command(data_path, tuple(extra)), data_path)
    server.wait_started()
    return server


def stop_lmqd(server: LmqdServer) -> None:
    """SIGTERM the daemon; fail if it died early, hung on shutdown or logged a traceback."""
    died = server.process.poll()
    clean = server.terminate()
    output = server.output()
    assert died is None, f"lmqd exited before the end of the test (code {died}); output:\n{output}"
    assert clean, f"lmqd did not exit within {SHUTDOWN_TIMEOUT_S:.0f}s of SIGTERM:\n{output}"
    assert "Traceback" not in output, f"lmqd logged a traceback:\n{output}"


@pytest.fixture
def lmqd_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LmqdServer]:
    """A fresh lmqd subprocess for one test (flags from ``@pytest.mark.lmqd_args``)."""
    extra: list[str] = []
    for marker in request.node.iter_markers("lmqd_args"):
        extra.extend(marker.args)
    server = start_lmqd(tmp_path / "lmqd-data", extra)
    try:
        yield server
    finally:
        stop_lmqd(server)


@pytest.fixture(scope="module")
def lmqd_module_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LmqdServer]:
    """One lmqd shared by a module's tests (flags from the module's ``LMQD_ARGS`` tuple).

    For suites of many short cases (bad input) where a daemon per case would cost more time than
    the cases; sharing also shows the daemon survives every case in turn.
    """
    extra = list(getattr(request.module, "LMQD_ARGS", ()))
    server = start_lmqd(tmp_path_factory.mktemp("lmqd-data"), extra)
    try:
        yield server
    finally:
        stop_lmqd(server)
