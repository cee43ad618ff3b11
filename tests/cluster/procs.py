"""lmqd and lmqlookupd subprocesses for the cluster tests, and a blocking HTTP helper.

``Daemon`` runs ``python -m lmqd`` or ``python -m lmqd.lookupd`` on 127.0.0.1 (port 0 unless a
test asks for a port, e.g. to restart a lookupd where it was), on
``tests.support.process.DaemonProcess`` (output drained by a thread, addresses from the
``listening on`` lines, ``stop()`` / ``check_stop()``), with its addresses as strings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.support.process import REPO_ROOT, DaemonProcess

__all__ = ["REPO_ROOT", "Daemon", "eventually", "http", "lmqd", "lookupd", "run_reader"]

CLIENTS_DIR = Path(__file__).resolve().parent / "clients"
"""The third-party readers (``<library>_reader.py``), each run in its own interpreter."""

HTTP_TIMEOUT_S = 5.0

T = TypeVar("T")


class Daemon(DaemonProcess):
    """A running daemon (``args``: its command line), started and waited for, with its
    addresses as ``host:port`` strings; ``python_module`` runs ``python -m <module>`` (lmqd or
    lmqd.lookupd) of this checkout. tests/realnsq runs NSQ's daemons with it too."""

    def __init__(self, args: Sequence[str], *, wanted: Sequence[str] = ("TCP", "HTTP")) -> None:
        super().__init__(args, wanted=wanted)
        self.wait_started()

    @classmethod
    def python_module(cls, module: str, *flags: str) -> Daemon:
        return cls([sys.executable, "-m", module, *flags])

    @property
    def tcp(self) -> str:
        address = self.address("TCP")
        assert address is not None
        return address

    @property
    def http(self) -> str:
        address = self.address("HTTP")
        assert address is not None
        return address

    @property
    def tcp_port(self) -> int:
        return int(self.tcp.rpartition(":")[2])

    @property
    def http_port(self) -> int:
        return int(self.http.rpartition(":")[2])


def lookupd(tcp_port: int = 0, http_port: int = 0) -> Daemon:
    return Daemon.python_module(
        "lmqd.lookupd",
        f"--tcp-address=127.0.0.1:{tcp_port}",
        f"--http-address=127.0.0.1:{http_port}",
        "--broadcast-address=127.0.0.1",
    )


def lmqd(data_path: Path, *flags: str) -> Daemon:
    data_path.mkdir(parents=True, exist_ok=True)
    return Daemon.python_module(
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


def run_reader(library: str, *, within_s: float, quiet_s: float, **params: Any) -> Any:
    """Run ``clients/<library>_reader.py`` (pynsq, ansq) with ``params`` until it has
    ``count`` messages (within ``within_s``) and a quiet spell; what it printed, decoded."""
    timeout = within_s + quiet_s + 15
    params.update(hard_limit_s=int(timeout) - 2, within_s=within_s, quiet_s=quiet_s)
    done = subprocess.run(
        [sys.executable, str(CLIENTS_DIR / f"{library}_reader.py"), json.dumps(params)],
        capture_output=True, timeout=timeout, cwd=CLIENTS_DIR, check=False,
    )  # fmt: skip
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 0, f"{library}: exit {done.returncode}:\n{stderr}"
    return json.loads(done.stdout.decode().strip().splitlines()[-1])
