"""A real ``lmqlookupd`` in a subprocess (``python -m lmqd.lookupd``), for the CLI and interop
tests, on ``tests.support.process.DaemonProcess``: its ports come from its ``TCP: listening on``
and ``HTTP: listening on`` lines (it runs on port 0), and ``stop()`` SIGTERMs it (bounded).
"""

from __future__ import annotations

import sys

from tests.support.process import REPO_ROOT, DaemonProcess

__all__ = ["REPO_ROOT", "LookupdProcess", "host_port", "lookupd_command"]


def lookupd_command(*flags: str) -> list[str]:
    return [sys.executable, "-m", "lmqd.lookupd", *flags]


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class LookupdProcess(DaemonProcess):
    """A running lmqlookupd (started and waited for at construction)."""

    def __init__(self, *flags: str) -> None:
        super().__init__(lookupd_command(*flags))
        self.wait_started()

    @property
    def tcp(self) -> tuple[str, int]:
        address = self.address("TCP")
        assert address is not None
        return host_port(address)

    @property
    def http(self) -> tuple[str, int]:
        address = self.address("HTTP")
        assert address is not None
        return host_port(address)
