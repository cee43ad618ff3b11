"""Fixtures for the bad-input suites: a daemon shared by a module, checked after every case."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.process import LmqdProcess
from tests.support.rawbytes import assert_daemon_serves


@pytest.fixture
def daemon(lmqd_module_server: LmqdProcess) -> Iterator[LmqdProcess]:
    """The module's daemon; after the case it must still be running, quiet and serving."""
    yield lmqd_module_server
    assert lmqd_module_server.process.poll() is None, lmqd_module_server.output()
    assert_daemon_serves(lmqd_module_server.tcp_address)
    output = lmqd_module_server.output()
    assert "Traceback" not in output, f"lmqd logged a traceback:\n{output}"
