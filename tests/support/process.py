"""``lmqd`` (and ``lmqlookupd``) in a subprocess, for the tests and the bench scripts alike.

``DaemonProcess`` runs any command of this checkout and reads its output; ``LmqdProcess`` runs
``python -m lmqd`` from this checkout with this interpreter: TCP on
127.0.0.1 port 0, HTTP too unless ``http=False``, data in ``data_path``, then the caller's flags
(later flags win). A thread reads the daemon's output for its whole life -- a full pipe would
block the daemon's logging, and so the daemon -- and takes the bound addresses from its
``TCP: listening on`` / ``HTTP: listening on`` lines. The process's CPU time, memory and file
writes are read from ``/proc/<pid>``.

``start_lmqd`` starts one and waits until it listens; ``stop_lmqd`` sends SIGTERM and checks the
daemon had not died early, exited in time and logged no traceback. The tests' fixtures
(``lmqd_server``, ``lmqd_module_server`` in ``tests/conftest.py``) are built on these two.

No pytest here: the bench scripts import this module (they put the checkout on ``sys.path``),
in environments without the test tools. A daemon that does not start raises
``LmqdStartError``, with what it logged.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "BENCH_SHUTDOWN_TIMEOUT_S",
    "REPO_ROOT",
    "SHUTDOWN_TIMEOUT_S",
    "STARTUP_TIMEOUT_S",
    "DaemonProcess",
    "LmqdProcess",
    "LmqdStartError",
    "lmqadmin_command",
    "lmqd_command",
    "load_average",
    "own_cpu_seconds",
    "start_lmqd",
    "stop_lmqd",
    "tree_cpu_seconds",
]

REPO_ROOT = Path(__file__).resolve().parents[2]

STARTUP_TIMEOUT_S = 20.0
"""Starting the interpreter and importing trio takes ~1 s on an idle machine; 20 s leaves room
for a loaded 2-core box without letting a daemon that never listens hang a test. (A bench that
restores a large data directory passes more.)"""

SHUTDOWN_TIMEOUT_S = 15.0
"""SIGTERM writes every queue to disk first; tests keep their queues small."""

BENCH_SHUTDOWN_TIMEOUT_S = 120.0
"""The bench scripts' bound: their daemons may hold millions of messages in memory queues, all
written to disk at SIGTERM."""

_LISTENING = re.compile(r"(TCP|HTTPS?): listening on (\S+)")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class LmqdStartError(RuntimeError):
    """The daemon exited, or did not listen in time; the message holds its output."""


def lmqd_command(
    data_path: str | os.PathLike[str], flags: Sequence[str] = (), *, http: bool = True
) -> list[str]:
    """The command line of a daemon on ephemeral 127.0.0.1 ports with its data in ``data_path``."""
    return [
        sys.executable,
        "-m",
        "lmqd",
        "--tcp-address=127.0.0.1:0",
        f"--http-address={'127.0.0.1:0' if http else ''}",
        f"--data-path={os.fspath(data_path)}",
        *flags,
    ]


def lmqadmin_command(tcp_address: str, *args: str) -> list[str]:
    """``lmqadmin --tcp-address ADDRESS ARGS...`` run with this interpreter and checkout."""
    return [sys.executable, "-m", "lmq_client.admin", "--tcp-address", tcp_address, *args]


def load_average() -> str:
    """The 1-minute load average, as /proc/loadavg prints it."""
    return Path("/proc/loadavg").read_text().split()[0]


class DaemonProcess:
    """A daemon subprocess (``args``, run in the checkout unless ``cwd`` says where) and
    everything it has logged so far.

    Construction starts the process and returns at once; ``wait_started()`` waits until it has
    logged a ``<KIND>: listening on <address>`` line for every kind in ``wanted`` (lmqd and
    lmqlookupd log them as nsqd does).
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        wanted: Sequence[str] = ("TCP", "HTTP"),
        cwd: str | os.PathLike[str] = REPO_ROOT,
    ) -> None:
        self.args = list(args)
        self.process = subprocess.Popen(
            self.args,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._addresses: dict[str, str] = {}
        self._wanted = set(wanted)
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._read_output, name="daemon-output", daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self._lines.append(line)
            m = _LISTENING.search(line)
            if m and m.group(1) not in self._addresses:
                self._addresses[m.group(1)] = m.group(2)
                if self._wanted <= self._addresses.keys():
                    self._listening.set()
        self._listening.set()  # it exited: stop waiting

    def wait_started(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Wait until it listens; otherwise stop it and raise ``LmqdStartError``."""
        self._listening.wait(timeout)
        if not self._wanted <= self._addresses.keys():
            state = "exited" if self.process.poll() is not None else "still running"
            self.terminate()
            raise LmqdStartError(
                f"{self.args[2] if len(self.args) > 2 else self.args[0]} did not log 'listening "
                f"on' for {sorted(self._wanted)} within {timeout:.0f}s ({state}, exit code "
                f"{self.process.returncode}); command {' '.join(self.args)}; output:\n"
                f"{self.output()}"
            )

    def address(self, kind: str) -> str | None:
        """Where it listens for ``kind`` (``"TCP"``, ``"HTTP"``, ``"HTTPS"``), if it does."""
        return self._addresses.get(kind)

    @property
    def pid(self) -> int:
        return self.process.pid

    def output_lines(self) -> list[str]:
        """Everything the daemon has logged so far (stdout and stderr, in order)."""
        with self._lock:
            return list(self._lines)

    def output(self) -> str:
        return "\n".join(self.output_lines())

    # -- /proc ---------------------------------------------------------------------------------

    def _status(self) -> dict[str, str]:
        lines = Path(f"/proc/{self.pid}/status").read_text().splitlines()
        return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}

    def rss_bytes(self) -> int:
        """The daemon's resident set size now (``VmRSS``)."""
        return int(self._status()["VmRSS"].split()[0]) * 1024

    def memory_kb(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) in kB: resident now and its peak."""
        status = self._status()
        return int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])

    def cpu_seconds(self) -> float:
        """User + system CPU time of the daemon process so far (every thread)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def bytes_written(self) -> int:
        """Bytes the daemon has passed to write calls on files (``wchar`` in ``/proc/<pid>/io``;
        socket sends are not counted)."""
        for line in Path(f"/proc/{self.pid}/io").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "wchar":
                return int(value)
        raise RuntimeError("no wchar in /proc/<pid>/io")

    # -- stopping ------------------------------------------------------------------------------

    def terminate(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> bool:
        """SIGTERM, wait up to ``timeout``, SIGKILL if needed; True if it exited on its own.
        Also collects the rest of its output (a daemon already dead is only collected)."""
        clean = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
                clean = False
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return clean


    def stop(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> int:
        """``terminate``, then the exit code."""
        self.terminate(timeout)
        return self.process.returncode

    def check_stop(self) -> None:
        """Stop; fail if it had died early, did not exit cleanly or logged a traceback."""
        early = self.process.poll()
        code = self.stop()
        output = self.output()
        assert early is None, f"exited before the end of the test ({early}):\n{output}"
        assert code == 0, f"exit code {code}:\n{output}"
        assert "Traceback" not in output, f"logged a traceback:\n{output}"


class LmqdProcess(DaemonProcess):
    """A ``python -m lmqd`` subprocess.

    Construction starts the process and returns at once; ``wait_started()`` waits until it
    listens (TCP, and HTTP when ``http``). Pass ``http=False`` rather than an ``--http-address=``
    flag, so that no HTTP line is waited for. With ``bare``, ``flags`` are the whole command line
    after ``python -m lmqd`` (for tests of the command line itself): no defaults are added.
    """

    def __init__(
        self,
        data_path: str | os.PathLike[str],
        flags: Sequence[str] = (),
        *,
        http: bool = True,
        bare: bool = False,
    ) -> None:
        self.data_path = Path(data_path)
        if bare:
            args = [sys.executable, "-m", "lmqd", *flags]
        else:
            args = lmqd_command(data_path, flags, http=http)
        super().__init__(args, wanted=("TCP", "HTTP") if http else ("TCP",))

    @property
    def tcp_address(self) -> str:
        """``"127.0.0.1:<port>"`` of the V2 TCP listener."""
        return self._addresses["TCP"]

    @property
    def tcp_host_port(self) -> tuple[str, int]:
        host, _, port = self.tcp_address.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def http_address(self) -> str | None:
        """``"127.0.0.1:<port>"`` of the HTTP API, or None if the daemon serves none."""
        return self._addresses.get("HTTP")


def own_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` itself (all its threads; not its children)."""
    stat = (Path("/proc") / str(pid) / "stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and all its descendants so far, the ones that
    ended and were waited for included (a Spark JVM with its Python workers, say)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(f) for f in fields[11:15]) / _CLOCK_TICKS
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == current)
    return total


def start_lmqd(
    data_path: Path, flags: Sequence[str] = (), *, http: bool = True
) -> LmqdProcess:
    """Start a daemon with ``flags`` and wait until it listens."""
    data_path.mkdir(parents=True, exist_ok=True)
    server = LmqdProcess(data_path, flags, http=http)
    server.wait_started()
    return server


def stop_lmqd(server: LmqdProcess) -> None:
    """SIGTERM the daemon; fail if it died early, hung on shutdown or logged a traceback."""
    died = server.process.poll()
    clean = server.terminate()
    output = server.output()
    assert died is None, f"lmqd exited before the end of the test (code {died}); output:\n{output}"
    assert clean, f"lmqd did not exit within {SHUTDOWN_TIMEOUT_S:.0f}s of SIGTERM:\n{output}"
    assert "Traceback" not in output, f"lmqd logged a traceback:\n{output}"
