"""The in-process daemon of the tests: a real ``LmqDaemon`` running in the test's nursery.

``start_daemon`` (a fixture) builds ``Options`` from its defaults and the test's overrides, and
starts ``LmqDaemon(options)`` with ``await nursery.start(...)``: it returns once every listener
listens, with a ``RunningDaemon`` that knows the bound addresses. Defaults: TCP on 127.0.0.1
port 0; HTTP only with ``http=True`` (also 127.0.0.1 port 0: most tests speak V2 only, and the
HTTP server is one more task set to run); data in a fresh directory under ``tmp_path``, unless
``data_path`` is given (a restart passes the first daemon's again). Any other ``Options`` field
is a keyword override. The caller's ``fail_after`` bounds the start, as every other wait.

``RunningDaemon.stop()`` is the graceful shutdown SIGTERM triggers and returns once ``run()`` has
finished (everything written to disk, data directory released). Daemons still running when the
test ends are asked to shut down, then cancelled with the test's nursery.

``serve_in_memory(broker, nursery)`` serves one connection of a running daemon through
``trio.testing.memory_stream_pair()`` and returns the client's end (wrap it in
``tests.support.wire.Wire``): with no socket in between, times on the autojump clock are exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from lmqd.broker import Broker
from lmqd.options import Options
from lmqd.server import TcpConnection
from lmqd.service import BoundAddresses, LmqDaemon

__all__ = [
    "Address",
    "RunningDaemon",
    "StartDaemon",
    "eventually",
    "serve_in_memory",
    "start_daemon_fixture",
]

Address = tuple[str, int]

POLL_INTERVAL_S = 0.005
"""How often ``eventually`` looks again: short next to any wait a test makes (the daemon's tasks
change the state within a few scheduler rounds), long enough that polling costs the shared test
machine next to nothing."""


class RunningDaemon:
    """An ``LmqDaemon`` started by ``start_daemon``, where it listens and where its data lives."""

    def __init__(
        self, daemon: LmqDaemon, addresses: BoundAddresses, data_path: Path, done: trio.Event
    ) -> None:
        self.daemon = daemon
        self.addresses = addresses
        self.data_path = data_path
        self._done = done

    @property
    def broker(self) -> Broker:
        return self.daemon.broker

    @property
    def tcp(self) -> Address:
        """``(host, port)`` of the V2 TCP listener."""
        return self.addresses.tcp

    @property
    def tcp_address(self) -> str:
        """``"host:port"`` of the V2 TCP listener, as lmq_client takes it."""
        host, port = self.addresses.tcp
        return f"{host}:{port}"

    @property
    def http(self) -> Address:
        """``(host, port)`` of the HTTP API (started with ``http=True``)."""
        assert self.addresses.http is not None, "started without http=True"
        return self.addresses.http

    @property
    def running(self) -> bool:
        """Whether ``run()`` has not finished yet."""
        return not self._done.is_set()

    def shutdown(self) -> None:
        """Ask for the graceful shutdown without waiting for it."""
        self.daemon.shutdown()

    async def stop(self) -> None:
        """Graceful shutdown, as SIGTERM does; returns once ``run()`` has finished."""
        self.daemon.shutdown()
        await self._done.wait()


class StartDaemon:
    """``await start_daemon(data_path=None, *, http=False, **options)`` -> ``RunningDaemon``."""

    def __init__(self, nursery: trio.Nursery, tmp_path: Path) -> None:
        self._nursery = nursery
        self._tmp_path = tmp_path
        self._fresh = 0
        self.started: list[RunningDaemon] = []
        """Every daemon this test started, in order."""

    async def __call__(
        self, data_path: Path | None = None, *, http: bool = False, **overrides: Any
    ) -> RunningDaemon:
        if data_path is None:
            self._fresh += 1
            data_path = self._tmp_path / f"lmqd-{self._fresh}"
        settings: dict[str, Any] = {
            "tcp_address": "127.0.0.1:0",
            "http_address": "127.0.0.1:0" if http else "",
            "data_path": str(data_path),
        }
        settings.update(overrides)
        daemon = LmqDaemon(Options(**settings))
        done = trio.Event()

        async def run(*, task_status: trio.TaskStatus[BoundAddresses]) -> None:
            try:
                await daemon.run(task_status=task_status)
            finally:
                done.set()

        # A daemon that cannot start (its data directory locked, say) raises here.
        addresses = await self._nursery.start(run)
        running = RunningDaemon(daemon, addresses, data_path, done)
        self.started.append(running)
        return running

    def shutdown_all(self) -> None:
        """Ask every daemon still running to shut down (the end of the test)."""
        for running in self.started:
            if running.running:
                running.shutdown()


@pytest.fixture(name="start_daemon")
async def start_daemon_fixture(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[StartDaemon]:
    """Start in-process daemons in the test's nursery (see the module docstring)."""
    start = StartDaemon(nursery, tmp_path)
    yield start
    start.shutdown_all()


def serve_in_memory(
    broker: Broker, nursery: trio.Nursery, remote_address: str = "test:1"
) -> trio.abc.Stream:
    """Serve one V2 connection of ``broker`` over a memory stream; return the client's end.

    The server side is ``lmqd.server.TcpConnection``, the handler every accepted socket gets;
    ``remote_address`` is what it reports as the peer (``/stats``, logs).
    """
    client_end, server_end = trio.testing.memory_stream_pair()
    handler = TcpConnection(broker, server_end, remote_address)

    async def serve() -> None:
        try:
            await handler.serve()
        finally:
            await server_end.aclose()  # as lmqd.server does for a socket

    nursery.start_soon(serve)
    return client_end


async def eventually(predicate: Callable[[], bool]) -> None:
    """Wait until ``predicate()`` holds: for daemon state that changes in other tasks with no
    event to wait on. The caller's ``fail_after`` bounds the wait."""
    while True:  # polls: the state has no event to wait on
        if predicate():
            return
        await trio.sleep(POLL_INTERVAL_S)
