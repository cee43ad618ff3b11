"""The broker: what the network layers call — topics by name, the one publish path, health,
statistics and the admin operations (pause, empty, delete).

The TCP server, the HTTP API and the metrics collector talk to lmqd only through a ``Broker``;
it holds no socket and starts no task of its own (``lmqd.service`` runs everything). Topics
run their tasks (each only while it has work) in the service's nursery once it has handed one
over (``attach``), the ones created before that (the restore) included.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import trio

from lmqd.engine.admission import PublishGate
from lmqd.engine.backend import BackendError, Syncable
from lmqd.engine.channel import Channel
from lmqd.engine.channel_policy import REDRIVE_CHANNEL
from lmqd.engine.context import DeadLetterSource, EngineContext, Named
from lmqd.engine.insync import InSyncAcks, NotEnoughMirrors
from lmqd.engine.publish import PublishOutcome
from lmqd.engine.salvage import Salvage
from lmqd.engine.stores import Stores
from lmqd.engine.syncer import DurableCallback, Syncer
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory, Message
from lmqd.message_ext import MessageExt, dead_letter_ext
from lmqd.options import Options
from lmqd.stats import ClientStats, TopicStats
from lmqd.storage import Metadata, TimeBase, metadata_path
from lmqd.storage.atrest import PLAIN, AtRest

__all__ = ["BoundAddresses", "Broker", "BrokerObserver", "Connection", "NotPrimary", "WriteGuard"]

log = logging.getLogger("lmqd.broker")


@attrs.frozen
class BoundAddresses:
    """Where the daemon listens (``port`` 0 in the options resolves to the real port here)."""

    tcp: tuple[str, int]
    http: tuple[str, int] | None
    https: tuple[str, int] | None = None
    """Only with ``--tls-cert``/``--tls-key`` and a non-empty ``--https-address``."""


class Connection(Protocol):
    """What the broker needs of a connected TCP client (``lmqd.server`` implements it)."""

    @property
    def pub_counts(self) -> dict[str, int]:
        """Messages published on this connection, by topic."""
        ...

    def statistics(self) -> ClientStats:
        """A frozen snapshot of the connection, for /stats."""
        ...

    def close(self) -> None:
        """Stop reading; what is owed is still sent (shutdown, channel deleted)."""
        ...

    async def wait_sent(self) -> None:
        """Return once nothing waits to be sent (or the connection has ended)."""
        ...


class BrokerObserver(Protocol):
    """Told when topics and channels come and go, and when options change at run time.

    lmqd's lookupd registration is one (``lmqd.registration``); the broker does not know what
    an observer does with the news. Calls are synchronous and must not raise.
    """

    def topic_created(self, topic: str) -> None:
        """A topic was created (publish, subscribe, HTTP, or restored at start-up)."""
        ...

    def topic_deleted(self, topic: str, channels: Sequence[str]) -> None:
        """A topic was deleted with ``channels`` (HTTP, or ephemeral without channels)."""
        ...

    def channel_created(self, topic: str, channel: str) -> None:
        """A channel was created."""
        ...

    def channel_deleted(self, topic: str, channel: str) -> None:
        """A channel was deleted on its own (HTTP, or ephemeral without consumers)."""
        ...

    def options_changed(self, options: Options) -> None:
        """``update_options`` replaced the options (``PUT /config/...``)."""
        ...


class NotPrimary(Exception):
    """A write refused because this node mirrors another (``lmqd.mirror``); ``str()`` names
    the primary, and ``primary`` is its address."""

    def __init__(self, message: str, primary: str) -> None:
        super().__init__(message)
        self.primary = primary


class WriteGuard(Protocol):
    """What refuses writes while the node is a mirror (``lmqd.mirror.follower``): None from
    both means allowed."""

    @property
    def primary(self) -> str:
        """The primary's address."""
        ...

    def refuse_topic(self, topic: str) -> str | None:
        """Why a write to ``topic`` (a publish, its admin) is refused."""
        ...

    def refuse_channel(self, topic: str, channel: str) -> str | None:
        """Why a channel's admin or a subscription to it is refused (a mirror's own replay
        channels are allowed)."""
        ...


class Broker:
    """One lmqd's topics, connections, health and publish paths."""

    def __init__(
        self,
        options: Options,
        *,
        hold_data_dir: Callable[[], TimeBase],
        at_rest: AtRest = PLAIN,
    ) -> None:
        self.options = options
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, Connection] = {}
        self.start_time = int(time.time())
        self.addresses: BoundAddresses | None = None
        """Set by the service once every listener listens (the HTTP API's ``/info`` reads it)."""
        self.syncer = Syncer(
            sync_every=options.sync_every,
            sync_timeout=options.sync_timeout,
            metadata_file=metadata_path(options.data_path),
            metadata=self.metadata,
            on_health=self._sync_health,
        )
        self.stores = Stores(
            options,
            self.syncer,
            hold_data_dir=hold_data_dir,
            on_health=self.set_health,
            at_rest=at_rest,
        )
        self.engine = EngineContext(
            options=options,
            stores=self.stores,
            events=self,
            syncer=self.syncer,
            guid=GuidFactory(options.node_id),
        )
        """What every topic and channel shares; the broker is its events (``EngineEvents``)."""
        self._nursery: trio.Nursery | None = None
        self._health_error: str | None = None
        self._health_error_at = -math.inf
        """When (``trio.current_time``) the last error was reported."""
        self.write_failures = 0
        """Failed writes reported so far (each turned health NOK): ``/metrics`` counts them,
        so a failure between two scrapes of ``lmqd_healthy`` is not missed."""
        self._next_client_id = 0
        self._observers: list[BrokerObserver] = []
        self.guard: WriteGuard | None = None
        """While this node mirrors another (``lmqd.mirror``): what refuses writes."""
        self.insync = InSyncAcks(options.min_insync_mirrors, options.mirror_ack_timeout)
        """``--min-insync-mirrors`` and the topics' ``min_insync_mirrors`` policy: the
        publishes held for the mirrors (``engine/insync.py``)."""

    def add_observer(self, observer: BrokerObserver) -> None:
        """Tell ``observer`` about topic and channel creation and deletion from now on."""
        self._observers.append(observer)

    def update_options(self, options: Options) -> None:
        """Replace the options at run time (``PUT /config/...``) and tell the observers (topics
        and channels made from now on use them)."""
        self.options = options
        self.engine.options = options
        for observer in self._observers:
            observer.options_changed(options)

    # -- the engine's events (``lmqd.engine.context.EngineEvents``) ----------------------------

    takes_dead_letters = True

    def metadata_changed(self) -> None:
        self.syncer.metadata_changed()

    def channel_created(self, topic: str, channel: str) -> None:
        for observer in self._observers:
            observer.channel_created(topic, channel)

    def channel_deleted(self, topic: str, channel: str) -> None:
        for observer in self._observers:
            observer.channel_deleted(topic, channel)

    def ephemeral_topic_emptied(self, topic: Named) -> None:
        # An ephemeral topic whose last channel went away deleted itself (nsqd does).
        if self.topics.get(topic.name) is topic:
            del self.topics[topic.name]
            log.info("TOPIC(%s): deleted (ephemeral, no channels left)", topic.name)
            self._topic_deleted(topic.name, [])

    def _topic_deleted(self, topic: str, channels: Sequence[str]) -> None:
        for observer in self._observers:
            observer.topic_deleted(topic, channels)

    def attach(self, nursery: trio.Nursery | None) -> None:
        """Run every topic's tasks, and those of topics created from now on, in ``nursery``
        (``Topic.attach``: only while they have work); None: the service is stopping."""
        self._nursery = nursery
        for topic in self.topics.values():
            topic.attach(nursery)

    # -- health ------------------------------------------------------------------------------

    @property
    def health(self) -> str:
        """``"OK"``, or ``"NOK - <error>"`` while the last backend write failed (nsqd)."""
        return "OK" if self._health_error is None else f"NOK - {self._health_error}"

    @property
    def is_healthy(self) -> bool:
        return self._health_error is None

    def set_health(self, error: str | None) -> None:
        """The outcome of the last write (nsqd's ``SetHealth``): an error, or None (OK).

        While unhealthy the syncer rewrites the metadata file at each ``--sync-timeout`` tick
        (``Syncer.probe_on_tick``): once the disk takes writes again, health turns OK by
        itself, without waiting for a publish.
        """
        if error != self._health_error:
            if error is None:
                log.info("health: OK again")
            else:
                log.error("health: %s", error)
        self._health_error = error
        if error is not None:
            self.write_failures += 1
            self._health_error_at = trio.current_time()
            self.syncer.probe_on_tick()

    def _sync_health(self, error: str | None) -> None:
        # A round's success says nothing of writes that failed after it started (it ran in a
        # worker thread meanwhile): it must not clear their error.
        if error is None and self._health_error_at >= self.syncer.round_started:
            return
        self.set_health(error)

    # -- metadata ----------------------------------------------------------------------------

    def metadata(self) -> Metadata:
        """What the metadata file should say now (durable topics and channels, paused flags,
        topic and channel policies)."""
        return Metadata(tuple(t.metadata_entry() for t in self.topics.values() if not t.ephemeral))

    def persist_metadata(self) -> None:
        """Write the metadata file soon, in a worker thread (bursts coalesce into one write).

        Called on topic and channel creation and deletion and by the HTTP API after (un)pause.
        """
        self.syncer.metadata_changed()

    # -- registry ----------------------------------------------------------------------------

    def new_client_id(self) -> int:
        self._next_client_id += 1
        return self._next_client_id

    def get_topic(self, name: str) -> Topic:
        """The topic called ``name``, created (and started) if it doesn't exist yet.

        Raises ``BackendError`` if its log cannot be opened.
        """
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(self.engine, name, log=self.stores.topic_log(name))
            self.topics[name] = topic
            log.info("TOPIC(%s): created", name)
            for observer in self._observers:
                observer.topic_created(name)
            if not topic.ephemeral:
                self.syncer.metadata_changed()
            if self._nursery is not None:
                topic.attach(self._nursery)
        return topic

    def topic_or_none(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its channels and their stored messages; ``KeyError`` if unknown."""
        topic = self.topics.pop(name)
        channels = list(topic.channels)
        topic.delete()
        self.stores.topic_deleted(name)
        log.info("TOPIC(%s): deleted", name)
        self.insync.drop(name, "topic deleted")
        if not topic.ephemeral:
            self.syncer.metadata_changed()
        self._topic_deleted(name, channels)

    def close_topics(self, salvage: Salvage | None = None) -> None:
        """Shutdown, blocking: close every topic (channels first; each flushes to disk, as far
        as the disk takes it: ``salvage`` counts what it did not)."""
        if salvage is None:
            salvage = Salvage()
        for topic in list(self.topics.values()):
            try:
                topic.close(salvage)
            except Exception:
                log.error("TOPIC(%s): close failed", topic.name, exc_info=True)

    # -- writes refused on a mirror ----------------------------------------------------------

    def check_topic_write(self, topic: str) -> None:
        """Raise ``NotPrimary`` if this node mirrors another and ``topic`` is one it follows."""
        guard = self.guard
        if guard is not None and (reason := guard.refuse_topic(topic)) is not None:
            raise NotPrimary(reason, guard.primary)

    def check_channel_write(self, topic: str, channel: str) -> None:
        """Raise ``NotPrimary`` if ``channel`` of ``topic`` may not be changed or consumed
        here (a followed channel of a mirror)."""
        guard = self.guard
        if guard is not None and (reason := guard.refuse_channel(topic, channel)) is not None:
            raise NotPrimary(reason, guard.primary)

    # -- the one publish path (TCP PUB/MPUB/DPUB and HTTP /pub, /mpub) -----------------------

    def publish(
        self,
        topic_name: str,
        bodies: Sequence[bytes],
        defer: float = 0.0,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> None:
        """Put ``bodies`` on the topic (created if needed), deferred by ``defer`` seconds, each
        with its lmq extension from ``exts`` (one per body) if given.

        Raises ``BackendError`` (nothing stored; health turns NOK), ``TopicExiting``, or
        ``PublishRefused`` (a publish policy refused it; nothing stored). With ``--durable``
        the messages are written but not yet fsynced: answer the publisher after
        ``after_durable``. The rate limit is the caller's (``publish_gate``). On a mirror,
        ``NotPrimary`` (nothing stored).
        """
        self.check_topic_write(topic_name)
        topic = self.get_topic(topic_name)
        if topic.policy.min_insync_mirrors:
            self._check_insync(topic)
        try:
            topic.publish(bodies, trio.current_time(), defer, exts, keep=False)
        except BackendError as exc:
            self.set_health(str(exc))
            raise
        if self._health_error is not None:
            self._stored(topic)

    def publish_run(
        self,
        topic_name: str,
        bodies: Sequence[bytes],
        sizes: Sequence[int],
        defer: float = 0.0,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> PublishOutcome:
        """``publish`` for a run of commands (``sizes``: messages each) through the topic's
        publish policies: a prefix of the commands is accepted, the next one may be refused
        (``PublishOutcome``). Raises as ``publish`` does for failures of the whole run."""
        self.check_topic_write(topic_name)
        topic = self.get_topic(topic_name)
        if topic.policy.min_insync_mirrors:
            self._check_insync(topic)
        try:
            outcome = topic.publish_run(
                bodies, sizes, trio.current_time(), defer, exts, keep=False
            )
        except BackendError as exc:
            self.set_health(str(exc))
            raise
        if outcome.stored:
            self._stored(topic)
        return outcome

    def _check_insync(self, topic: Topic) -> None:
        """The topic's ``min_insync_mirrors``: raise ``NotEnoughMirrors`` before anything is
        stored if too few mirrors are in sync (ephemeral topics are never mirrored: not held)."""
        if topic.ephemeral or topic.stream.log is None:
            return
        now = trio.current_time()
        refusal = self.insync.refusal(topic.stream, now, topic.policy.min_insync_mirrors)
        if refusal is not None:
            raise refusal

    def _stored(self, topic: Topic) -> None:
        if self._health_error is not None and topic.wrote_backend and not topic.durable:
            # nsqd: a backend write that succeeds clears the health error. A durable write is
            # only good once fsynced: the syncer's next successful round clears it.
            self.set_health(None)

    def publish_gate(self, topic_name: str) -> PublishGate | None:
        """The topic's publish policies (created with the daemon's defaults if the topic does
        not exist yet); None without any, or if the topic cannot be created (the publish then
        fails as usual; on a mirror, as ``NotPrimary``)."""
        if self.guard is not None and self.guard.refuse_topic(topic_name) is not None:
            return None
        topic = self.topics.get(topic_name)
        if topic is None:
            try:
                topic = self.get_topic(topic_name)
            except BackendError:
                return None
        return topic.gate

    def after_durable(self, topic_name: str, callback: DurableCallback) -> bool:
        """``--durable``: call ``callback(error)`` once everything published to the topic so far
        is fsynced (``None``) or its sync failed (the ``OSError``).

        Returns False, and never calls back, when there is nothing to wait for (not durable
        mode, an ephemeral topic, no such topic).
        """
        topic = self.topics.get(topic_name)
        return topic is not None and self._when_durable(topic, callback)

    def _when_durable(self, topic: Topic, callback: DurableCallback) -> bool:
        queue = topic.durable_queue
        if queue is None:
            return False
        self.syncer.when_durable(queue, callback, urgent=True)
        return True

    def after_published(self, topic_name: str, callback: DurableCallback) -> bool:
        """When a publisher may be answered ``OK`` for what it published to a topic so far:
        ``after_durable``, and with the topic's ``min_insync_mirrors`` (``--min-insync-mirrors``
        by default) once the mirrors stored it too, the error a ``NotEnoughMirrors`` if they
        did not in time. False, and no call back, when there is nothing to wait for."""
        topic = self.topics.get(topic_name)
        if topic is None:
            return False
        needed = topic.policy.min_insync_mirrors
        if not needed or topic.ephemeral or topic.stream.log is None:
            return self._when_durable(topic, callback)
        insync = self.insync
        stream = topic.stream
        now = trio.current_time()
        queue = topic.durable_queue
        if queue is None:
            insync.wait(stream, now, callback, needed)
            return True
        # --durable: the fsync and the mirrors at once (the mirror is told at once that
        # publishers wait for it, so it neither lingers nor waits for a later fetch).
        outcome: list[OSError | None] = []

        def one(error: OSError | None) -> None:
            outcome.append(error)
            if len(outcome) == 2:
                callback(outcome[0] if outcome[0] is not None else outcome[1])

        self.syncer.when_durable(queue, one, urgent=True)
        insync.wait(stream, now, one, needed)
        return True

    async def publish_durable(
        self,
        topic_name: str,
        bodies: Sequence[bytes],
        defer: float = 0.0,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> None:
        """``publish``, then (``--durable``) wait until the messages are fsynced.

        For publishers that can wait (HTTP ``/pub``, ``/mpub``). Raises ``BackendError`` if the
        write or the sync failed.
        """
        self.publish(topic_name, bodies, defer, exts)
        await self.wait_durable(topic_name, published=True)

    async def wait_durable(self, topic_name: str, *, published: bool = False) -> None:
        """``--durable``: wait until what the topic holds so far (messages, and its channels'
        positions in its log) is fsynced; at once otherwise. Raises ``BackendError`` if the
        sync failed. ``published``: wait as for a publisher's ``OK`` (``after_published``),
        raising ``NotEnoughMirrors`` if the mirrors did not store it in time."""
        done = trio.Event()
        failure: list[OSError] = []

        def synced(error: OSError | None) -> None:
            if error is not None:
                failure.append(error)
            done.set()

        after = self.after_published if published else self.after_durable
        if after(topic_name, synced):
            await done.wait()
            if failure:
                if isinstance(failure[0], NotEnoughMirrors):
                    raise failure[0]
                raise BackendError(f"sync failed: {failure[0]}")

    # -- channel policies: dead letters and redrive ------------------------------------------

    def dead_letter(
        self, channel: DeadLetterSource, messages: Sequence[Message], reason: str
    ) -> Syncable | None:
        """The engine's dead letters (``EngineEvents``): publish copies of ``messages`` (id,
        body and timestamp kept; attempts from 0 again, the count they had in their
        ``lmq-dead-letter-attempts`` header, so that the dead-letter topic's own channels,
        under a daemon-wide ``--max-attempts``, deliver them instead of giving them up at once)
        to its dead-letter topic, created if needed with its ``REDRIVE_CHANNEL``. Returns what
        a durable channel waits for before acknowledging them; raises ``BackendError`` /
        ``TopicExiting`` having published none."""
        name = channel.dead_letter_topic
        topic = self.get_topic(name)
        topic.get_channel(REDRIVE_CHANNEL)
        copies = [
            Message(
                m.id, m.body, m.timestamp,
                ext=dead_letter_ext(m.ext, channel.topic_name, channel.name, reason, m.attempts),
            )
            for m in messages
        ]  # fmt: skip
        try:
            topic.put_many(copies)
        except BackendError as exc:
            self.set_health(str(exc))
            raise
        log.info(
            "CHANNEL(%s:%s): %d messages to dead-letter topic %s (%s)",
            channel.topic_name,
            channel.name,
            len(messages),
            name,
            reason,
        )
        return topic.durable_queue

    def redrive(self, channel: Channel, source: Topic, max_count: int) -> int:
        """Move up to ``max_count`` ready messages from ``source``'s ``REDRIVE_CHANNEL`` into
        ``channel`` (attempts reset, see ``Retry.accept_redriven``); returns how many.

        Raises ``KeyError`` if ``source`` has no redrive channel (nothing was ever
        dead-lettered there), ``BackendError`` if ``channel`` could not store them (then they
        stay in the dead-letter topic: the redrive channel gets them back at once)."""
        dead = source.channels[REDRIVE_CHANNEL]
        now = trio.current_time()
        taken = dead.retry.take_for_redrive(max_count, now)
        if not taken:
            return 0
        try:
            stored = channel.retry.accept_redriven(taken, now)
        except BackendError:
            dead.retry.put_back(taken)
            raise
        dead.retry.redriven(taken, stored)
        log.info(
            "CHANNEL(%s:%s): %d messages redriven from %s",
            channel.topic_name,
            channel.name,
            len(taken),
            source.name,
        )
        return len(taken)

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
        now = trio.current_time()
        for name in names:
            stats = self.topics[name].statistics(now, include_clients=include_clients)
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
