"""A fresh ``lmqd`` in a subprocess for the bench scripts (not a benchmark itself).

``Daemon`` starts ``python -m lmqd`` from this checkout on 127.0.0.1 port 0 (TCP, and HTTP when
asked), waits for its ``... listening on`` lines, and reads its CPU time and memory from
``/proc/<pid>``. ``lmqadmin`` runs the same way: ``lmqadmin_command`` is its command line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["REPO", "Daemon", "lmqadmin_command", "load_average"]

REPO = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"(TCP|HTTP): listening on (\S+)")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Generous: a daemon that recovers a large data directory takes a while to listen.
START_TIMEOUT_S = 60.0


def load_average() -> str:
    """The 1-minute load average, as /proc/loadavg prints it."""
    return Path("/proc/loadavg").read_text().split()[0]


def lmqadmin_command(tcp_address: str, *args: str) -> list[str]:
    """``lmqadmin --tcp-address ADDRESS ARGS...`` run with this interpreter and checkout."""
    return [sys.executable, "-m", "lmq_client.admin", "--tcp-address", tcp_address, *args]


class Daemon:
    """``python -m lmqd`` in a subprocess; its output is collected by a thread.

    ``flags`` go after the defaults, so they win. ``http``: also listen for HTTP (127.0.0.1,
    port 0) and set ``http_address``.
    """

    def __init__(self, data_path: str, flags: list[str], *, http: bool = False) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lmqd",
                "--tcp-address=127.0.0.1:0",
                f"--http-address={'127.0.0.1:0' if http else ''}",
                f"--data-path={data_path}",
                *flags,
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.pid = self.process.pid
        self.lines: list[str] = []
        self.address = ""
        self.http_address = ""
        self._wanted = {"TCP", "HTTP"} if http else {"TCP"}
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self._listening.wait(START_TIMEOUT_S) or not self.address:
            self.process.kill()
            raise RuntimeError("lmqd did not start:\n" + "\n".join(self.lines))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append(line)
            m = _LISTENING.search(line)
            if m and m.group(1) in self._wanted:
                self._wanted.discard(m.group(1))
                if m.group(1) == "TCP":
                    self.address = m.group(2)
                else:
                    self.http_address = m.group(2)
                if not self._wanted:
                    self._listening.set()
        self._listening.set()  # it exited: stop waiting

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

    def memory_kb(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) in kB: resident now and its peak."""
        found: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0])
        return found["VmRSS"], found["VmHWM"]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._thread.join(5)
