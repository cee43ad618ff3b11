"""A real ``lmqlookupd`` in a subprocess (``python -m lmqd.lookupd``), for the CLI and interop
tests: its output is read by a thread, its ports come from its ``TCP: listening on`` and
``HTTP: listening on`` lines (it runs on port 0), and ``stop()`` SIGTERMs it (bounded).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Interpreter start-up and imports take ~1 s on an idle machine; 20 s leaves room on a busy one.
STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0

_LISTENING = re.compile(r"(TCP|HTTP): listening on (\S+)")


def lookupd_command(*flags: str) -> list[str]:
    return [sys.executable, "-m", "lmqd.lookupd", *flags]


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class LookupdProcess:
    """A running lmqlookupd and everything it has written so far (stdout and stderr)."""

    def __init__(self, *flags: str) -> None:
        self.process = subprocess.Popen(
            lookupd_command(*flags),
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
            raise AssertionError(f"lmqlookupd did not start; output:\n{self.output()}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            if m := _LISTENING.search(line):
                self.addresses[m.group(1)] = m.group(2)
                if len(self.addresses) == 2:
                    self._both.set()
        self._both.set()

    @property
    def tcp(self) -> tuple[str, int]:
        return host_port(self.addresses["TCP"])

    @property
    def http(self) -> tuple[str, int]:
        return host_port(self.addresses["HTTP"])

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
