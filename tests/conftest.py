"""The fixtures every test area may use; their code lives in ``tests.support``.

- ``start_daemon``: in-process ``LmqDaemon``\\ s in the test's nursery (``tests.support.daemon``).
- ``connect``: ``Wire`` clients closed at the end of the test (``tests.support.wire``).
- ``fsync``: ``os.fsync`` held or failing in worker threads (``tests.support.faults``).
- ``lmqd_server``: a fresh ``lmqd`` subprocess for one test, extra flags from a marker::

      @pytest.mark.lmqd_args("--msg-timeout=1s", "--max-msg-size=100")
      def test_something(lmqd_server: LmqdProcess) -> None: ...

- ``lmqd_module_server``: one subprocess shared by a module's tests (flags from the module's
  ``LMQD_ARGS``), for suites of many short cases.

Both subprocess fixtures run on 127.0.0.1 with port 0 for TCP and HTTP and data in pytest's
temporary directories (``tests.support.process``); on teardown they send SIGTERM, wait (bounded)
and fail the test if the daemon had died, had to be killed or logged a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import start_daemon_fixture  # noqa: F401 - the start_daemon fixture
from tests.support.faults import disk_fixture, fsync_fixture  # noqa: F401 - fixtures
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd
from tests.support.wire import connect_fixture  # noqa: F401 - the connect fixture


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "lmqd_args(*flags): extra command-line flags for the lmqd_server fixture"
    )


@pytest.fixture
def lmqd_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LmqdProcess]:
    """A fresh lmqd subprocess for one test (flags from ``@pytest.mark.lmqd_args``)."""
    flags: list[str] = []
    for marker in request.node.iter_markers("lmqd_args"):
        flags.extend(marker.args)
    server = start_lmqd(tmp_path / "lmqd-data", flags)
    try:
        yield server
    finally:
        stop_lmqd(server)


@pytest.fixture(scope="module")
def lmqd_module_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LmqdProcess]:
    """One lmqd shared by a module's tests (flags from the module's ``LMQD_ARGS`` tuple).

    For suites of many short cases (bad input) where a daemon per case would cost more time than
    the cases; sharing also shows the daemon survives every case in turn.
    """
    flags = list(getattr(request.module, "LMQD_ARGS", ()))
    server = start_lmqd(tmp_path_factory.mktemp("lmqd-data"), flags)
    try:
        yield server
    finally:
        stop_lmqd(server)
