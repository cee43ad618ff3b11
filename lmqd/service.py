"""The service: runs one lmqd — data directory, restore, nursery, listeners, syncer, signals and
the shutdown order. The network layers never import it; it imports them.

``LmqDaemon.run()`` holds the data directory (``DataDirLock``), restores the topics and channels
stored there, then owns the nursery in which the syncer, every topic (with its pump and channel
timers), the TCP server, the HTTP server and the lookupd registration run;
``task_status.started()`` reports the bound addresses once every listener is listening.
``run_daemon()`` is the blocking entry point used by the CLI: it adds signal handling
(SIGINT/SIGTERM -> graceful shutdown).

Shutdown (``shutdown()``, SIGTERM, SIGINT): connections stop reading, held durable ``OK``
responses get their sync round and every connection a moment to send what it owes; then the
listeners and connections are cancelled (each connection requeues its in-flight messages), the
metadata file is written, every topic is closed (channels first: in-flight and requeued messages
go to their own store, deferred ones to the deferred store, with their attempts and deadlines,
each synced; then the topic's memory tail goes to its log and the log is synced with every
cursor where its channel is), and the data directory is released. On a full or failing disk
those writes keep what fits (``lmqd.engine.salvage``); the messages lost are logged per queue,
kept in ``LmqDaemon.lost_at_shutdown``, and ``run_daemon`` exits with ``EXIT_MESSAGES_LOST``.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from functools import partial

import trio

from lmqd.broker import BoundAddresses, Broker
from lmqd.engine import channel_policy
from lmqd.engine.backend import BackendError
from lmqd.engine.channel import Channel
from lmqd.engine.policy import PolicyError, parse_update
from lmqd.engine.salvage import Salvage
from lmqd.engine.stores import queues_to_open, restore_plan, stored_queue_names
from lmqd.engine.topic import Topic
from lmqd.mirror.follower import MirrorRefused
from lmqd.mirror.role import RoleFileError
from lmqd.mirror.service import Replication
from lmqd.options import Options
from lmqd.registration import Registration
from lmqd.server import serve_tcp
from lmqd.server.security import ServerSecurity
from lmqd.statsd_push import StatsdPusher
from lmqd.storage import (
    AnchoredTimeBase,
    DataDirLock,
    DataDirLocked,
    Metadata,
    TopicMetadata,
    load_metadata,
    metadata_path,
    save_metadata,
)
from lmqd.storage.atrest import AtRestConfigError, build_at_rest
from lmqd.storage.atrest.check import AtRestRefused, check_data_dir
from lmqd.storage.atrest.compression import Compression
from lmqd.storage.atrest.rewrite import rewrite_data_dir

__all__ = ["EXIT_MESSAGES_LOST", "GC_THRESHOLDS", "BoundAddresses", "LmqDaemon", "run_daemon"]

log = logging.getLogger("lmqd.daemon")

# At shutdown, how long held durable OKs may wait for their sync round, and then how long
# connections get to send what is in their output buffers before they are cancelled.
SHUTDOWN_SYNC_WAIT = 5.0
SHUTDOWN_FLUSH_WAIT = 1.0

EXIT_MESSAGES_LOST = 3
"""Exit status of a shutdown that could not write every message memory held to disk (a full or
failing disk; ``lmqd.engine.salvage``): 1 and 2 already mean "could not start" and "usage"
(docs/operations.md), and a supervisor must be able to tell a loss from a clean stop."""


class LmqDaemon:
    """One lmqd: its broker, its data directory and the tasks that serve them."""

    def __init__(self, options: Options, *, freeze_gc: bool = False) -> None:
        """``freeze_gc``: after the restore, move every object then alive out of the cyclic
        collector's reach (``gc.freeze``; see ``_freeze_restored``). The CLI's daemon does;
        in-process daemons (tests) leave the process's collector alone."""
        self.options = options
        self._freeze_gc = freeze_gc
        # Built first: certificates or keys that cannot be used stop lmqd before anything
        # else happens (``lmqd.transport.tls.TLSConfigError``), rather than serving plaintext.
        self.security = ServerSecurity.from_options(options)
        # Likewise key files and at-rest settings that cannot be used (``AtRestConfigError``).
        self.at_rest = build_at_rest(
            options.compression, options.encryption_key_files, options.encryption_cipher
        )
        self.broker = Broker(options, hold_data_dir=self._hold_data_dir, at_rest=self.at_rest)
        self.registration = Registration(self.broker)
        self.replication = Replication(self.broker, announce=self.registration.announce)
        """Mirrors of this node, or the primary it mirrors (``lmqd.mirror``)."""
        self._shutdown = trio.Event()
        self._lock: DataDirLock | None = None
        self._timebase: AnchoredTimeBase | None = None
        self.lost_at_shutdown: dict[str, int] = {}
        """After ``run()``: queue name (``topic``, ``topic:channel``) -> messages its shutdown
        could not write to disk (a full or failing disk) and so lost; empty if none."""

    @property
    def addresses(self) -> BoundAddresses | None:
        """Where it listens, once ``run`` has started."""
        return self.broker.addresses

    # -- the data directory --------------------------------------------------------------------

    def _hold_data_dir(self) -> AnchoredTimeBase:
        """Take the data directory (once) and return the time base stored deadlines use."""
        if self._lock is None:
            path = self.options.data_path
            try:
                os.makedirs(path, exist_ok=True)
            except FileExistsError:
                raise NotADirectoryError(
                    errno.ENOTDIR, f"--data-path {path}: not a directory"
                ) from None
            except OSError as exc:
                raise OSError(exc.errno, f"--data-path {path}: {exc.strerror}") from None
            lock = DataDirLock(self.options.data_path)
            lock.acquire()  # DataDirLocked: another lmqd uses this data path
            self._lock = lock
        if self._timebase is None:
            self._timebase = AnchoredTimeBase.now(trio.current_time())
        return self._timebase

    def _rewrite_at_rest(self) -> None:
        """``--rewrite-at-rest``: every segment as the settings seal now (blocking)."""
        report = rewrite_data_dir(self.options.data_path, self.at_rest)
        log.info(
            "AT-REST: rewrote %d of %d segment file(s) (%d left as they were: damaged)",
            report.rewritten,
            report.checked,
            report.skipped,
        )

    def _freeze_restored(self) -> None:
        """``gc.freeze()`` once the restore is done, before listening.

        What it solves: every object alive then — the modules of lmqd and its libraries, and
        the restored topics and channels (their logs, cursors, queues) — moves to CPython's
        permanent generation, which no collection traverses: a full collection of a daemon
        restarted with 20,000 topics then walks only what was made since. What it does not:
        topics, channels and messages created after start-up are collected as before (lazy
        tasks and fewer objects per topic are what shrink those, ``lmqd.engine.topic``); and a
        frozen object that becomes cyclic garbage is never collected while frozen. So the
        first deletion of a restored topic or channel (``_Thaw``) calls ``gc.unfreeze()``:
        the next full collection walks (and frees) them as it would have without the freeze.
        """
        gc.collect()  # no garbage frozen for good
        gc.freeze()
        restored = frozenset(
            [t.name for t in self.broker.topics.values()]
            + [f"{t.name}:{c}" for t in self.broker.topics.values() for c in t.channels]
        )
        log.info("GC: %d objects frozen after the restore", gc.get_freeze_count())
        self.broker.add_observer(_Thaw(restored))

    async def _restore(self) -> None:
        """Recreate the stored topics and channels (paused flags included) and their queues."""
        data_path = self.options.data_path
        path = metadata_path(data_path)
        broker = self.broker
        stores = broker.stores

        def scan() -> tuple[Metadata, list[str]]:
            return load_metadata(path), stored_queue_names(data_path)

        metadata, on_disk = await trio.to_thread.run_sync(scan)
        stores.note_on_disk(on_disk)
        plan = restore_plan(metadata, on_disk)
        if not plan:
            return
        stores.note_compressions(_compressions(plan))
        started = time.perf_counter()
        opened, failed = await trio.to_thread.run_sync(
            stores.open_stored, queues_to_open(plan, on_disk)
        )
        stores.preopen(opened)
        for name, exc in failed.items():
            log.error("DISKQUEUE(%s): cannot open, not restored: %s", name, exc)
            broker.set_health(f"cannot open queue {name}: {exc}")
        for entry in plan:
            if entry.name in failed or entry.name in broker.topics:
                continue
            topic = broker.get_topic(entry.name)
            topic.paused = entry.paused
            _restore_policy(topic, entry.policy)
            topic.recover_dedup(trio.current_time())
            for c in entry.channels:
                if f"{entry.name}:{c.name}" in failed:
                    continue
                channel = topic.get_channel(c.name)
                channel.paused = c.paused
                _restore_channel_policy(channel, c.policy)
            _restore_log_channels(topic)
        stores.close_unclaimed()
        log.info(
            "restored %d topic(s), %d channel(s) in %.2fs",
            len(broker.topics),
            sum(len(t.channels) for t in broker.topics.values()),
            time.perf_counter() - started,
        )

    def _close_storage(self) -> None:
        """Shutdown, blocking: metadata file, then every topic (channels first), then the lock."""
        broker = self.broker
        try:
            if self._lock is not None:
                try:
                    save_metadata(metadata_path(self.options.data_path), broker.metadata())
                except OSError as exc:
                    # A full or failing disk (no traceback: not a bug). A restart finds the
                    # topics from their logs and queues (docs/durability.md).
                    log.error("METADATA: final write failed: %s", exc)
            salvage = Salvage()
            broker.close_topics(salvage)
            self.lost_at_shutdown = salvage.lost
            if salvage.lost:
                log.error(
                    "SHUTDOWN: %d messages could not be written to disk and are lost (%s)",
                    salvage.lost_count,
                    ", ".join(f"{name}: {n}" for name, n in sorted(salvage.lost.items())),
                )
            stats = broker.syncer.statistics()
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

    # -- running -----------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[BoundAddresses] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Take the data directory, restore, listen and serve until ``shutdown()``; then close
        every topic (to disk) and release the data directory.

        Raises ``DataDirLocked`` if another lmqd holds ``--data-path``.
        """
        broker = self.broker
        # Before the data directory is taken (its lock file written): a data directory these
        # at-rest settings cannot read is refused untouched (``AtRestRefused``).
        await trio.to_thread.run_sync(
            check_data_dir, self.options.data_path, self.at_rest.opener
        )
        self._hold_data_dir()
        try:
            await trio.to_thread.run_sync(self.replication.load)
            if self.options.rewrite_at_rest:
                await trio.to_thread.run_sync(self._rewrite_at_rest)
            await self._restore()
            if self._freeze_gc:
                self._freeze_restored()
            async with trio.open_nursery() as nursery:
                await nursery.start(broker.syncer.run)
                # Before the topics' tasks (a mirror's topics do not pump) and the listeners (a
                # mirror refuses writes from the first connection on).
                await self.replication.start(nursery)
                broker.attach(nursery)
                tcp = await nursery.start(serve_tcp, broker, self.security)
                http, https = await self._start_http(nursery)
                broker.addresses = BoundAddresses(tcp=tcp, http=http, https=https)
                # IDENTIFY needs the bound ports; topics restored above are in its first
                # REGISTERs, topics created from now on are its events.
                await nursery.start(self.registration.run)
                if self.options.statsd_address:
                    await nursery.start(StatsdPusher(broker).run)
                task_status.started(broker.addresses)
                await self._shutdown.wait()
                log.info("shutting down")
                await self._drain_responses()
                nursery.cancel_scope.cancel()
        finally:
            broker.attach(None)
            self._close_storage()

    async def _start_http(
        self, nursery: trio.Nursery
    ) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
        """HTTPS (with a certificate, as nsqd), then HTTP; their bound addresses.

        HTTPS first so that, with ``--tls-required=true``, plain HTTP's ``TLS_REQUIRED``
        answer can name the real HTTPS port.
        """
        options = self.options
        if not (options.http_address or (self.security.tls is not None and options.https_address)):
            return None, None
        # Imported only when served: hypercorn and prometheus-client cost ~6 MB of RSS that a
        # daemon without an HTTP listener does not need to carry.
        from lmqd.httpapi import serve_http

        tls = self.security.tls
        https = None
        if tls is not None and options.https_address:
            https = await nursery.start(
                partial(
                    serve_http,
                    broker=self.broker,
                    address=options.https_address,
                    tls=tls.http_context,
                    replication=self.replication,
                )
            )
        http = None
        if options.http_address:
            refuse_port = None
            if options.tls_required == "true" or options.tls_client_auth_policy:
                # nsqd: TLS for HTTP too ("tcp-https" leaves plain HTTP open).
                refuse_port = https[1] if https is not None else 0
            http = await nursery.start(
                partial(
                    serve_http,
                    broker=self.broker,
                    address=options.http_address,
                    tls_required_https_port=refuse_port,
                    replication=self.replication,
                )
            )
        return http, https

    async def _drain_responses(self) -> None:
        # Connections stop reading (no command is applied from here on), held durable OKs get
        # their sync round, and every connection a moment to send what it owes; then run()
        # cancels whatever is left.
        clients = list(self.broker.clients.values())
        for client in clients:
            client.close()
        with trio.move_on_after(SHUTDOWN_SYNC_WAIT):
            await self.broker.syncer.wait_idle()
        with trio.move_on_after(SHUTDOWN_FLUSH_WAIT):
            async with trio.open_nursery() as nursery:
                for client in clients:
                    nursery.start_soon(client.wait_sent)

    def shutdown(self) -> None:
        """Ask ``run()`` to stop: listeners close, connections end, topics are closed."""
        self._shutdown.set()


def _restore_policy(topic: Topic, stored: Sequence[tuple[str, int | str]]) -> None:
    """The topic's own policy keys from the metadata file (ones this build does not know are
    logged and left out)."""
    if not stored:
        return
    try:
        changes = parse_update(dict(stored))
    except PolicyError as exc:
        log.error("TOPIC(%s): policy in the metadata file not applied: %s", topic.name, exc)
        return
    try:
        topic.set_policy(changes)
    except BackendError as exc:
        log.error("TOPIC(%s): applying its policy: %s", topic.name, exc)


def _compressions(plan: Sequence[TopicMetadata]) -> dict[str, Compression]:
    """The topics' own valid ``compression`` policies (an invalid one is refused, and logged,
    when the topic's policy is restored)."""
    out = {}
    for entry in plan:
        spelling = dict(entry.policy).get("compression")
        if isinstance(spelling, str):
            with contextlib.suppress(ValueError):
                out[entry.name] = Compression.parse(spelling)
    return out


def _restore_channel_policy(
    channel: Channel, stored: Sequence[tuple[str, channel_policy.PolicyValue]]
) -> None:
    """The channel's own policy keys from the metadata file, all or none (a key this build
    does not know, or a bad value, is logged and the channel keeps the daemon's defaults)."""
    if not stored:
        return
    try:
        channel.set_policy(channel_policy.parse_update(dict(stored)))
    except PolicyError as exc:
        log.error(
            "CHANNEL(%s:%s): policy in the metadata file not applied: %s",
            channel.topic_name,
            channel.name,
            exc,
        )


def _restore_log_channels(topic: Topic) -> None:
    """Channels the topic's log has a cursor for but the metadata file does not list (created
    just before a crash, or the file was damaged): they come back too, unpaused."""
    for name in topic.stored_channel_names():
        if name not in topic.channels:
            log.warning(
                "TOPIC(%s): channel(%s) not in the metadata file; restored from the log",
                topic.name,
                name,
            )
            topic.get_channel(name)


class _Thaw:
    """A broker observer: ``gc.unfreeze()`` at the first deletion of a topic or channel that
    was frozen with the restore (``LmqDaemon._freeze_restored``), so its cyclic garbage is
    collected."""

    def __init__(self, restored: frozenset[str]) -> None:
        self._restored = restored

    def _deleted(self, name: str) -> None:
        if name in self._restored:
            self._restored = frozenset()
            log.info("GC: %d objects unfrozen (%s was deleted)", gc.get_freeze_count(), name)
            gc.unfreeze()

    def topic_created(self, topic: str) -> None:
        pass

    def topic_deleted(self, topic: str, channels: Sequence[str]) -> None:
        self._deleted(topic)

    def channel_created(self, topic: str, channel: str) -> None:
        pass

    def channel_deleted(self, topic: str, channel: str) -> None:
        self._deleted(f"{topic}:{channel}")

    def options_changed(self, options: Options) -> None:
        pass


async def _main(options: Options) -> LmqDaemon:
    daemon = LmqDaemon(options, freeze_gc=True)
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
    return daemon


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
    exits with status 1 if another lmqd holds the data directory, and with
    ``EXIT_MESSAGES_LOST`` if its shutdown could not write every message to disk.
    """
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        daemon = trio.run(_main, options)
    except BaseException as exc:
        error = _sole_exception(exc)
        if isinstance(error, DataDirLocked | AtRestRefused | MirrorRefused | RoleFileError):
            log.critical("failed to start: %s", error)
            sys.exit(1)
        if isinstance(error, OSError | AtRestConfigError) and error is not exc:
            raise error from None
        raise
    if daemon.lost_at_shutdown:
        sys.exit(EXIT_MESSAGES_LOST)
