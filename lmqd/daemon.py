"""LmqDaemon: the topic registry, the one publish path, and the service that runs everything.

``LmqDaemon.run()`` owns the nursery in which every topic (with its pump and channel timers), the
TCP server and the HTTP server run; ``task_status.started()`` reports the bound addresses once
every listener is listening. ``run_daemon()`` is the blocking entry point used by the CLI: it
adds signal handling (SIGINT/SIGTERM -> graceful shutdown).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from lmqd.backend import BackendQueue, DummyBackend, MemoryBackend
from lmqd.message import GuidFactory, Message
from lmqd.options import Options
from lmqd.stats import ClientStats, TopicStats
from lmqd.topic import Topic

if TYPE_CHECKING:
    from lmqd.server.client import TcpClient

log = logging.getLogger("lmqd.daemon")

EPHEMERAL_SUFFIXES = ("#ephemeral", "#tmp")


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL_SUFFIXES)


@attrs.frozen
class BoundAddresses:
    """Where the daemon listens (``port`` 0 in the options resolves to the real port here)."""

    tcp: tuple[str, int]
    http: tuple[str, int] | None


def split_host_port(address: str) -> tuple[str, int]:
    """``"127.0.0.1:4150"`` / ``"[::1]:4150"`` / ``":4150"`` -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid address {address!r}: want host:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class LmqDaemon:
    """One lmqd: topics by name, connected TCP clients, health, and the services."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, TcpClient] = {}
        self.start_time = int(time.time())
        self.addresses: BoundAddresses | None = None
        self._guid = GuidFactory(options.node_id)
        self._nursery: trio.Nursery | None = None
        self._health_error: str | None = None
        self._next_client_id = 0
        self._shutdown = trio.Event()

    # -- health ------------------------------------------------------------------------------

    @property
    def health(self) -> str:
        """``"OK"``, or ``"NOK - <error>"`` while the last backend write failed (nsqd)."""
        return "OK" if self._health_error is None else f"NOK - {self._health_error}"

    @property
    def is_healthy(self) -> bool:
        return self._health_error is None

    def set_health(self, error: str | None) -> None:
        if error != self._health_error:
            if error is None:
                log.info("health: OK again")
            else:
                log.error("health: %s", error)
        self._health_error = error

    # -- registry ----------------------------------------------------------------------------

    def new_client_id(self) -> int:
        self._next_client_id += 1
        return self._next_client_id

    def _backend_for(self, name: str) -> BackendQueue:
        if is_ephemeral(name):
            return DummyBackend()
        return MemoryBackend()

    def _channel_backend(self, topic_name: str, channel_name: str) -> BackendQueue:
        return self._backend_for(channel_name)

    def get_topic(self, name: str) -> Topic:
        """The topic called ``name``, created (and started) if it doesn't exist yet."""
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(
                name,
                self.options,
                backend=self._backend_for(name),
                channel_backend_factory=self._channel_backend,
                on_deleted_ephemeral=self._forget_topic,
                guid=self._guid,
            )
            self.topics[name] = topic
            log.info("TOPIC(%s): created", name)
            if self._nursery is not None:
                self._nursery.start_soon(topic.run)
        return topic

    def topic_or_none(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its channels and their stored messages; ``KeyError`` if unknown."""
        topic = self.topics.pop(name)
        topic.delete()
        log.info("TOPIC(%s): deleted", name)

    def _forget_topic(self, topic: Topic) -> None:
        # An ephemeral topic whose last channel went away (nsqd deletes it then).
        if self.topics.get(topic.name) is topic:
            del self.topics[topic.name]
            topic.delete()
            log.info("TOPIC(%s): deleted (ephemeral, no channels left)", topic.name)

    # -- the one publish path (TCP PUB/MPUB/DPUB and HTTP /pub, /mpub) -----------------------

    def publish(
        self, topic_name: str, bodies: Sequence[bytes], defer: float = 0.0
    ) -> list[Message]:
        """Put ``bodies`` on the topic (created if needed), deferred by ``defer`` seconds.

        Raises ``lmqd.backend.BackendError`` (nothing stored; health turns NOK) or
        ``lmqd.topic.TopicExiting``.
        """
        from lmqd.backend import BackendError

        topic = self.get_topic(topic_name)
        try:
            messages = topic.publish(bodies, trio.current_time(), defer)
        except BackendError as exc:
            self.set_health(str(exc))
            raise
        if self._health_error is not None:
            self.set_health(None)
        return messages

    # -- statistics --------------------------------------------------------------------------

    def statistics(
        self,
        *,
        topic: str | None = None,
        channel: str | None = None,
        include_clients: bool = True,
    ) -> list[TopicStats]:
        """Snapshots of the topics (sorted by name), filtered as nsqd's /stats filters them."""
        names = sorted(self.topics) if topic is None else [topic] if topic in self.topics else []
        result = []
        for name in names:
            stats = self.topics[name].statistics(include_clients=include_clients)
            if channel is not None:
                stats = attrs.evolve(
                    stats,
                    channels=tuple(c for c in stats.channels if c.channel_name == channel),
                )
            result.append(stats)
        return result

    def producers(self) -> list[ClientStats]:
        """TCP connections that have published (nsqd's ``producers``)."""
        return [c.statistics() for c in self.clients.values() if c.pub_counts]

    # -- running -----------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[BoundAddresses] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and serve until ``shutdown()``; then close every topic."""
        from lmqd.server.tcp import serve_tcp

        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for topic in self.topics.values():
                    nursery.start_soon(topic.run)
                tcp = await nursery.start(serve_tcp, self)
                http = None
                if self.options.http_address:
                    from lmqd.httpapi import serve_http

                    http = await nursery.start(serve_http, self, self.options.http_address)
                self.addresses = BoundAddresses(tcp=tcp, http=http)
                task_status.started(self.addresses)
                await self._shutdown.wait()
                log.info("shutting down")
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            for topic in list(self.topics.values()):
                topic.close()

    def shutdown(self) -> None:
        """Ask ``run()`` to stop: listeners close, connections end, topics are closed."""
        self._shutdown.set()


async def _main(options: Options) -> None:
    daemon = LmqDaemon(options)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)

            async def watch_signals() -> None:
                async for signum in signals:
                    log.info("signal %s: exiting", signal.Signals(signum).name)
                    daemon.shutdown()
                    return

            nursery.start_soon(watch_signals)
            await daemon._shutdown.wait()
            nursery.cancel_scope.cancel()


def run_daemon(options: Options) -> None:
    """Run lmqd until SIGINT/SIGTERM (the CLI's entry point)."""
    trio.run(_main, options)
