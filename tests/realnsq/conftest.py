"""Fixtures of the tests with the real NSQ programs: a module's daemons, stopped and checked at
its end (``programs.Daemon.check_stop``: exited cleanly, no traceback)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .programs import Daemon


class Started:
    """The daemons a module started, stopped in reverse order at its end."""

    def __init__(self) -> None:
        self.daemons: list[Daemon] = []

    def __call__(self, daemon: Daemon) -> Daemon:
        self.daemons.append(daemon)
        return daemon

    def stop_all(self) -> None:
        failures = []
        for daemon in reversed(self.daemons):
            try:
                daemon.check_stop()
            except AssertionError as exc:
                failures.append(str(exc))
        self.daemons.clear()
        assert not failures, "\n\n".join(failures)


@pytest.fixture(scope="module")
def started() -> Iterator[Started]:
    keep = Started()
    try:
        yield keep
    finally:
        keep.stop_all()
