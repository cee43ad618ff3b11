"""LmqDaemon: the topic registry, the one publish path, storage, and the service that runs it all.

``LmqDaemon.run()`` holds the data directory (``DataDirLock``), restores the topics and channels
stored there, then owns the nursery in which the syncer, every topic (with its pump and channel
timers), the TCP server and the HTTP server run; ``task_status.started()`` reports the bound
addresses once every listener is listening. ``run_daemon()`` is the blocking entry point used by
the CLI: it adds signal handling (SIGINT/SIGTERM -> graceful shutdown).

Storage
-------
Every topic and channel whose name is not ephemeral has a ``DiskQueue`` in ``--data-path``
(acknowledgement mode with ``--durable``); ephemeral ones keep a ``DummyBackend``, and a
non-ephemeral channel of an ephemeral topic a ``MemoryBackend`` (nothing of an ephemeral topic
touches disk). Opening a queue runs its recovery, which blocks:

* at start-up every stored queue is opened in one worker-thread call, before listening;
* a topic or channel created at run time (``get_topic`` is a plain ``def`` called by the
  server) opens its queue synchronously. For a new name that is a directory scan, a header write
  and one positions file (temp, fsync, rename, fsync the directory): about 1-2 ms on the
  development VM, the price of one topic creation, not of a message. A name whose files were
  left on disk is restored at start-up, so run-time opens do not meet a backlog to verify.

Queues found on disk but missing from the metadata file (a crash between creating a topic and
writing the file, or a damaged file set aside) are restored too, unpaused: their messages may
have been acknowledged to publishers.

Shutdown (``shutdown()``, SIGTERM, SIGINT): connections stop reading, held durable ``OK``
responses get their sync round and every connection a moment to send what it owes; then the
listeners and connections are cancelled (each connection requeues its in-flight messages), the
metadata file is written, every topic is closed (channels first: memory and in-flight messages go
to the main queue, deferred ones to the deferred store, with their attempts and deadlines; each
queue is synced), and the data directory is released.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from lmqd.backend import BackendError, BackendQueue, DummyBackend, MemoryBackend
from lmqd.message import GuidFactory, Message
from lmqd.options import Options
from lmqd.stats import ClientStats, TopicStats
from lmqd.storage import (
    AnchoredTimeBase,
    ChannelMetadata,
    DataDirLock,
    DataDirLocked,
    DiskQueue,
    Metadata,
    TopicMetadata,
    load_metadata,
    metadata_path,
    save_metadata,
)
from lmqd.storage.files import name_from_stem
from lmqd.storage.metadata import is_durable_name
from lmqd.syncer import DurableCallback, Syncer
from lmqd.topic import Topic

if TYPE_CHECKING:
    from lmqd.server.client import TcpClient

log = logging.getLogger("lmqd.daemon")

EPHEMERAL_SUFFIXES = ("#ephemeral", "#tmp")

# At shutdown, how long held durable OKs may wait for their sync round, and then how long
# connections get to send what is in their output buffers before they are cancelled.
SHUTDOWN_SYNC_WAIT = 5.0
SHUTDOWN_FLUSH_WAIT = 1.0

DEFERRED_SUFFIX = "#deferred"

_QUEUE_FILE = re.compile(r"(.+)\.lmq\.(?:pos\.json|\d+\.dat)")


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


def deferred_store_name(topic: str, channel: str) -> str:
    """The queue holding a channel's deferred messages (``#`` is in no valid name: no clash)."""
    return f"{topic}:{channel}{DEFERRED_SUFFIX}"


def stored_queue_names(data_path: str) -> list[str]:
    """Names of the queues that have files in ``data_path`` (topics, ``topic:channel`` and
    deferred stores), sorted; names of no durable topic or channel are left out."""
    names = set()
    with os.scandir(data_path) as entries:
        for entry in entries:
            m = _QUEUE_FILE.fullmatch(entry.name)
            if m is None:
                continue
            name = name_from_stem(m.group(1))
            topic, _, channel = name.partition(":")
            channel = channel.removesuffix(DEFERRED_SUFFIX)
            if is_durable_name(topic) and (not channel or is_durable_name(channel)):
                names.add(name)
    return sorted(names)


def _restore_plan(metadata: Metadata, on_disk: Sequence[str]) -> list[TopicMetadata]:
    """The metadata's topics and channels, plus those that only have files (unpaused)."""
    topics = {t.name: t for t in metadata.topics}
    for name in on_disk:
        if name.endswith(DEFERRED_SUFFIX):
            continue  # restored with its channel
        topic_name, _, channel_name = name.partition(":")
        topic = topics.get(topic_name)
        if topic is None:
            log.warning("TOPIC(%s): not in the metadata file; restored from its files", topic_name)
            topic = topics[topic_name] = TopicMetadata(topic_name)
        if channel_name and all(c.name != channel_name for c in topic.channels):
            log.warning(
                "TOPIC(%s): channel(%s) not in the metadata file; restored from its files",
                topic_name,
                channel_name,
            )
            topics[topic_name] = attrs.evolve(
                topic, channels=(*topic.channels, ChannelMetadata(channel_name))
            )
    return list(topics.values())


class LmqDaemon:
    """One lmqd: topics by name, connected TCP clients, health, storage and the services."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, TcpClient] = {}
        self.start_time = int(time.time())
        self.addresses: BoundAddresses | None = None
        self.syncer = Syncer(
            sync_every=options.sync_every,
            sync_timeout=options.sync_timeout,
            metadata_file=metadata_path(options.data_path),
            metadata=self.metadata,
            on_health=self.set_health,
        )
        self._guid = GuidFactory(options.node_id)
        self._nursery: trio.Nursery | None = None
        self._health_error: str | None = None
        self._next_client_id = 0
        self._shutdown = trio.Event()
        self._lock: DataDirLock | None = None
        self._timebase: AnchoredTimeBase | None = None
        self._preopened: dict[str, DiskQueue] = {}

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

    # -- storage -----------------------------------------------------------------------------

    def _storage(self) -> AnchoredTimeBase:
        """Take the data directory (once) and return the time base stored deadlines use."""
        if self._lock is None:
            os.makedirs(self.options.data_path, exist_ok=True)
            lock = DataDirLock(self.options.data_path)
            lock.acquire()  # DataDirLocked: another lmqd uses this data path
            self._lock = lock
        if self._timebase is None:
            self._timebase = AnchoredTimeBase.now(trio.current_time())
        return self._timebase

    def _open_queue(self, name: str) -> DiskQueue:
        """Open (recover) the disk queue ``name``; blocking, raises ``OSError``."""
        assert self._timebase is not None
        return DiskQueue(
            name,
            self.options.data_path,
            timebase=self._timebase,
            max_bytes_per_file=self.options.max_bytes_per_file,
            ack_mode=self.options.durable,
        )

    def _disk_backend(self, name: str) -> DiskQueue:
        queue = self._preopened.pop(name, None)
        if queue is None:
            self._storage()
            try:
                queue = self._open_queue(name)
            except OSError as exc:
                log.error("DISKQUEUE(%s): cannot open: %s", name, exc)
                self.set_health(f"cannot open queue {name}: {exc}")
                raise BackendError(f"cannot open queue {name}: {exc}") from exc
        self.syncer.register(queue)
        return queue

    def _backend_for(self, name: str) -> BackendQueue:
        if is_ephemeral(name):
            return DummyBackend()
        return self._disk_backend(name)

    def _channel_backend(self, topic_name: str, channel_name: str) -> BackendQueue:
        if is_ephemeral(channel_name):
            return DummyBackend()
        if is_ephemeral(topic_name):
            return MemoryBackend()  # nothing of an ephemeral topic goes to disk
        return self._disk_backend(f"{topic_name}:{channel_name}")

    def _deferred_store(self, topic_name: str, channel_name: str, create: bool) -> DiskQueue | None:
        # A channel's deferred store: opened when first needed, or at start-up if it has files.
        if is_ephemeral(topic_name) or is_ephemeral(channel_name):
            return None
        name = deferred_store_name(topic_name, channel_name)
        if not create and name not in self._preopened:
            return None
        return self._disk_backend(name)

    def metadata(self) -> Metadata:
        """What the metadata file should say now (durable topics and channels, paused flags)."""
        return Metadata(
            tuple(
                TopicMetadata(
                    t.name,
                    t.paused,
                    tuple(
                        ChannelMetadata(c.name, c.paused)
                        for c in t.channels.values()
                        if not c.ephemeral
                    ),
                )
                for t in self.topics.values()
                if not t.ephemeral
            )
        )

    def persist_metadata(self) -> None:
        """Write the metadata file soon, in a worker thread (bursts coalesce into one write).

        Called on topic and channel creation and deletion and by the HTTP API after (un)pause.
        """
        self.syncer.metadata_changed()

    async def _restore(self) -> None:
        """Recreate the stored topics and channels (paused flags included) and their queues."""
        data_path = self.options.data_path
        path = metadata_path(data_path)

        def scan() -> tuple[Metadata, list[str]]:
            return load_metadata(path), stored_queue_names(data_path)

        metadata, on_disk = await trio.to_thread.run_sync(scan)
        plan = _restore_plan(metadata, on_disk)
        if not plan:
            return
        wanted = [t.name for t in plan] + [f"{t.name}:{c.name}" for t in plan for c in t.channels]
        stored = set(on_disk)
        wanted += [
            deferred_store_name(t.name, c.name)
            for t in plan
            for c in t.channels
            if deferred_store_name(t.name, c.name) in stored
        ]

        def open_all() -> dict[str, DiskQueue | OSError]:
            opened: dict[str, DiskQueue | OSError] = {}
            for name in wanted:
                try:
                    opened[name] = self._open_queue(name)
                except OSError as exc:
                    opened[name] = exc
            return opened

        started = time.perf_counter()
        opened = await trio.to_thread.run_sync(open_all)
        failed = {n: e for n, e in opened.items() if isinstance(e, OSError)}
        self._preopened = {n: q for n, q in opened.items() if isinstance(q, DiskQueue)}
        for name, exc in failed.items():
            log.error("DISKQUEUE(%s): cannot open, not restored: %s", name, exc)
            self.set_health(f"cannot open queue {name}: {exc}")
        for entry in plan:
            if entry.name in failed or entry.name in self.topics:
                continue
            topic = self.get_topic(entry.name)
            topic.paused = entry.paused
            for c in entry.channels:
                if f"{entry.name}:{c.name}" in failed:
                    continue
                channel = topic.get_channel(c.name)
                channel.paused = c.paused
        for queue in self._preopened.values():  # a topic that failed: its channels' queues
            queue.close()
        self._preopened.clear()
        log.info(
            "restored %d topic(s), %d channel(s) in %.2fs",
            len(self.topics),
            sum(len(t.channels) for t in self.topics.values()),
            time.perf_counter() - started,
        )

    def _close_storage(self) -> None:
        """Shutdown, blocking: metadata file, then every topic (channels first), then the lock."""
        try:
            if self._lock is not None:
                try:
                    save_metadata(metadata_path(self.options.data_path), self.metadata())
                except OSError:
                    log.error("METADATA: final write failed", exc_info=True)
            for topic in list(self.topics.values()):
                try:
                    topic.close()
                except Exception:
                    log.error("TOPIC(%s): close failed", topic.name, exc_info=True)
            stats = self.syncer.statistics()
            log.info(
                "SYNCER: %d rounds, %d queue syncs (%d failed), %d metadata writes",
                stats.rounds,
                stats.queue_syncs,
                stats.failed_syncs,
                stats.metadata_writes,
            )
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    # -- registry ----------------------------------------------------------------------------

    def new_client_id(self) -> int:
        self._next_client_id += 1
        return self._next_client_id

    def get_topic(self, name: str) -> Topic:
        """The topic called ``name``, created (and started) if it doesn't exist yet.

        Raises ``BackendError`` if its disk queue cannot be opened.
        """
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(
                name,
                self.options,
                backend=self._backend_for(name),
                channel_backend_factory=self._channel_backend,
                deferred_store_factory=self._deferred_store,
                on_deleted_ephemeral=self._forget_topic,
                guid=self._guid,
                syncer=self.syncer,
                on_change=self.syncer.metadata_changed,
                on_health=self.set_health,
            )
            self.topics[name] = topic
            log.info("TOPIC(%s): created", name)
            if not topic.ephemeral:
                self.syncer.metadata_changed()
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
        if not topic.ephemeral:
            self.syncer.metadata_changed()

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
        ``lmqd.topic.TopicExiting``. With ``--durable`` the messages are written but not yet
        fsynced: answer the publisher after ``after_durable``.
        """
        topic = self.get_topic(topic_name)
        try:
            messages = topic.publish(bodies, trio.current_time(), defer)
        except BackendError as exc:
            self.set_health(str(exc))
            raise
        if self._health_error is not None and topic.wrote_backend and not topic.durable:
            # nsqd: a backend write that succeeds clears the health error. A durable write is
            # only good once fsynced: the syncer's next successful round clears it.
            self.set_health(None)
        return messages

    def after_durable(self, topic_name: str, callback: DurableCallback) -> bool:
        """``--durable``: call ``callback(error)`` once everything published to the topic so far
        is fsynced (``None``) or its sync failed (the ``OSError``).

        Returns False, and never calls back, when there is nothing to wait for (not durable
        mode, an ephemeral topic, no such topic).
        """
        topic = self.topics.get(topic_name)
        queue = topic.durable_queue if topic is not None else None
        if queue is None:
            return False
        self.syncer.when_durable(queue, callback, urgent=True)
        return True

    async def publish_durable(
        self, topic_name: str, bodies: Sequence[bytes], defer: float = 0.0
    ) -> list[Message]:
        """``publish``, then (``--durable``) wait until the messages are fsynced.

        For publishers that can wait (HTTP ``/pub``, ``/mpub``). Raises ``BackendError`` if the
        write or the sync failed.
        """
        messages = self.publish(topic_name, bodies, defer)
        done = trio.Event()
        failure: list[OSError] = []

        def synced(error: OSError | None) -> None:
            if error is not None:
                failure.append(error)
            done.set()

        if self.after_durable(topic_name, synced):
            await done.wait()
            if failure:
                raise BackendError(f"sync failed: {failure[0]}")
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
        """Take the data directory, restore, listen and serve until ``shutdown()``; then close
        every topic (to disk) and release the data directory.

        Raises ``DataDirLocked`` if another lmqd holds ``--data-path``.
        """
        from lmqd.server.tcp import serve_tcp

        self._storage()
        try:
            await self._restore()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.syncer.run)
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
                await self._drain_responses()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            self._close_storage()

    async def _drain_responses(self) -> None:
        # Connections stop reading (no command is applied from here on), held durable OKs get
        # their sync round, and every connection a moment to send what it owes; then run()
        # cancels whatever is left.
        clients = list(self.clients.values())
        for client in clients:
            client.close()
        with trio.move_on_after(SHUTDOWN_SYNC_WAIT):
            await self.syncer.wait_idle()
        with trio.move_on_after(SHUTDOWN_FLUSH_WAIT):
            async with trio.open_nursery() as nursery:
                for client in clients:
                    nursery.start_soon(client.wait_sent)

    def shutdown(self) -> None:
        """Ask ``run()`` to stop: listeners close, connections end, topics are closed."""
        self._shutdown.set()


async def _main(options: Options) -> None:
    daemon = LmqDaemon(options)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                async for signum in signals:
                    log.info("signal %s: exiting", signal.Signals(signum).name)
                    daemon.shutdown()
                    return

            nursery.start_soon(watch_signals)
            await daemon.run()
            nursery.cancel_scope.cancel()


def _sole_exception(error: BaseException) -> BaseException:
    # trio wraps even a single failure in an ExceptionGroup; the CLI reports the failure itself.
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


# Every message allocates a few objects that live until it is FIN'd; with CPython's default
# young-generation threshold (700 allocations) the cyclic collector runs thousands of times a
# second under load and rescans them. A larger threshold cut the daemon's CPU per message by
# 15-20% in `lmqadmin bench` (docs/benchmarks.md). The older generations keep CPython's default
# pace relative to it; messages hold no reference cycles, so little waits for them.
GC_THRESHOLDS = (50_000, 50, 100)


def run_daemon(options: Options) -> None:
    """Run lmqd until SIGINT/SIGTERM (the CLI's entry point; it tunes the process's GC).

    Raises ``OSError`` if it cannot start (a listen address in use, an unusable data path);
    exits with status 1 if another lmqd holds the data directory.
    """
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        trio.run(_main, options)
    except BaseException as exc:
        error = _sole_exception(exc)
        if isinstance(error, DataDirLocked):
            log.critical("failed to start: %s", error)
            sys.exit(1)
        if isinstance(error, OSError) and error is not exc:
            raise error from None
        raise
