"""Which storage backs which topic and channel, opened when first needed.

Every topic whose name is not ephemeral has a ``TopicLog`` in ``--data-path``: its messages,
stored once, and its channels' cursors (``lmqd.engine.stream``). A non-ephemeral channel of such
a topic has an **own store**, the ``DiskQueue`` ``topic:channel`` (acknowledgement mode with
``--durable``): requeued messages past the memory bound, what a shutdown writes, and a backlog a
daemon from before topic logs left there; it is opened the first time something is written to it
(``LazyBackend``), or at start-up if it has files. A channel's deferred messages have a queue of
their own, the *deferred store* ``topic:channel#deferred``, opened when first needed (``#`` is
in no valid name: no clash), and each level of its priority lanes one, the *lane store*
``topic:channel#p<level>`` (``lanes.py``), opened when first written to. Ephemeral topics and
channels keep a ``DummyBackend``, and a non-ephemeral channel of an ephemeral topic a
``MemoryBackend`` (nothing of an ephemeral topic touches disk).

A topic log's files have the names its disk queue had (``<topic>.lmq.<n>.dat``): opened on a
data directory written before topic logs, the log adopts the topic's queue segments
(``lmqd.storage.log_recovery``), and each channel's queue, which held what the topic had handed
it, becomes its own store.

Opening a log or a queue runs its recovery, which blocks:

* at start-up the service opens everything stored in one worker-thread call
  (``open_stored``), before listening, and hands them over with ``preopen``;
* a topic created at run time whose name had no files at start-up (``note_on_disk``: the
  service's scan; the data-directory lock keeps other writers out, and a deleted topic's files
  are removed) gets a **fresh** log (``TopicLog(fresh=True)``): no recovery, no file until its
  first message, so creating it makes no system call on the event loop (a full open is a
  directory scan, a header write and a state file with two fsyncs: 3-6 ms on the development
  VM, longer as the directory grows). Any other name (files seen at start-up, or no start-up
  scan at all) is opened with recovery, synchronously;
* a channel costs a cursor in memory; its own and deferred stores are opened when first
  written to (a disk queue's open is that same recovery and state file, ~3 ms).
"""

from __future__ import annotations

import enum
import logging
import os
import re
from collections.abc import Callable, Sequence

import attrs

from lmqd.engine.backend import (
    BackendError,
    BackendQueue,
    DummyBackend,
    LazyBackend,
    MemoryBackend,
)
from lmqd.engine.dedup import DEDUP_MAX_ENTRIES
from lmqd.engine.lanes import LANE_SUFFIX
from lmqd.engine.syncer import Syncer
from lmqd.names import is_ephemeral
from lmqd.options import Options
from lmqd.storage import (
    ChannelMetadata,
    DiskQueue,
    Metadata,
    TimeBase,
    TopicLog,
    TopicMetadata,
)
from lmqd.storage.atrest import PLAIN, AtRest
from lmqd.storage.atrest.compression import Compression
from lmqd.storage.files import name_from_stem
from lmqd.storage.metadata import is_durable_name

log = logging.getLogger("lmqd.stores")

DEFERRED_SUFFIX = "#deferred"

_LANE_NAME = re.compile(r"(.+)" + re.escape(LANE_SUFFIX) + r"([1-9])")
"""A lane store's name: the channel's queue name, the suffix, the level."""

_QUEUE_FILE = re.compile(r"(.+)\.lmq\.(?:pos\.json|log\.json|\d+\.dat)")


class Backing(enum.Enum):
    """What keeps a topic's or channel's messages past memory (``backing``)."""

    DISK = "disk"
    """Its log or disk queues in ``--data-path``."""
    MEMORY = "memory"
    """A ``MemoryBackend``: nothing of an ephemeral topic touches disk, not even the overflow
    of its durable-named channels."""
    NONE = "none"
    """Nothing: the overflow is dropped and counted (ephemeral names, nsqd's dummy backend)."""


def backing(topic: str, channel: str | None = None) -> Backing:
    """THE rule for which store backs a topic (``channel`` None) or one of its channels: an
    ephemeral name keeps nothing past memory; a channel of an ephemeral topic keeps its overflow
    in memory; every other topic and channel is on disk. Each store a channel has (own, deferred,
    priority lanes) follows its channel's."""
    if channel is None:
        return Backing.NONE if is_ephemeral(topic) else Backing.DISK
    if is_ephemeral(channel):
        return Backing.NONE
    return Backing.MEMORY if is_ephemeral(topic) else Backing.DISK


def deferred_store_name(topic: str, channel: str) -> str:
    """The queue holding a channel's deferred messages."""
    return f"{topic}:{channel}{DEFERRED_SUFFIX}"


def lane_store_name(topic: str, channel: str, level: int) -> str:
    """The queue holding a channel's ready messages of one priority level."""
    return f"{topic}:{channel}{LANE_SUFFIX}{level}"


def _channel_part(channel: str) -> str:
    """A queue name's channel part without a deferred or lane store's suffix."""
    lane = _LANE_NAME.fullmatch(channel)
    return lane.group(1) if lane is not None else channel.removesuffix(DEFERRED_SUFFIX)


def stored_queue_names(data_path: str) -> list[str]:
    """Names of the logs and queues that have files in ``data_path`` (topics,
    ``topic:channel`` and deferred stores), sorted; names of no durable topic or channel are
    left out. Blocking."""
    names = set()
    with os.scandir(data_path) as entries:
        for entry in entries:
            m = _QUEUE_FILE.fullmatch(entry.name)
            if m is None:
                continue
            name = name_from_stem(m.group(1))
            topic, _, channel = name.partition(":")
            channel = _channel_part(channel)
            if is_durable_name(topic) and (not channel or is_durable_name(channel)):
                names.add(name)
    return sorted(names)


def restore_plan(metadata: Metadata, on_disk: Sequence[str]) -> list[TopicMetadata]:
    """The metadata's topics and channels, plus those that only have files (unpaused).

    Queues found on disk but missing from the metadata file (a crash between creating a topic
    and writing the file, or a damaged file set aside) are restored too: their messages may have
    been acknowledged to publishers.
    """
    topics = {t.name: t for t in metadata.topics}
    for name in on_disk:
        if name.endswith(DEFERRED_SUFFIX) or _LANE_NAME.fullmatch(name):
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


def queues_to_open(plan: Sequence[TopicMetadata], on_disk: Sequence[str]) -> list[str]:
    """What a restore opens: every planned topic's log, and the channels' own, deferred and
    lane stores that have files (the others are opened when first needed)."""
    stored = set(on_disk)
    wanted = [t.name for t in plan]
    for t in plan:
        for c in t.channels:
            names = [f"{t.name}:{c.name}", deferred_store_name(t.name, c.name)]
            names += [lane_store_name(t.name, c.name, level) for level in range(1, 10)]
            wanted += [name for name in names if name in stored]
    return wanted


class Stores:
    """Opens the logs of topics and the queues of channels, and registers disk queues with the
    syncer. ``hold_data_dir`` (the service's) takes the data directory the first time something
    is opened and returns the time base stored deadlines use; ephemeral names never call it."""

    def __init__(
        self,
        options: Options,
        syncer: Syncer,
        *,
        hold_data_dir: Callable[[], TimeBase],
        on_health: Callable[[str | None], None],
        at_rest: AtRest = PLAIN,
    ) -> None:
        self.options = options
        self.at_rest = at_rest
        """Compression and encryption at rest, shared by every log and queue opened here."""
        self._syncer = syncer
        self._hold_data_dir = hold_data_dir
        self._on_health = on_health
        self._preopened: dict[str, DiskQueue | TopicLog] = {}
        self._on_disk: set[str] | None = None
        """Names that had files at start-up; None until the service's scan (``note_on_disk``)."""
        self._compressions: dict[str, Compression] = {}
        """Restored topics' own ``compression`` policies (``note_compressions``)."""
        self._open_disk = self._disk
        """``_disk`` bound once, shared by every channel's ``LazyBackend``."""
        self._offset_notes: dict[str, dict[bytes, int]] = {}
        """Each stored channel's offset notes (``offset_notes``), by its own store's name."""

    def open_queue(self, name: str) -> DiskQueue:
        """Open (recover) the disk queue ``name``; blocking, raises ``OSError``."""
        return DiskQueue(
            name,
            self.options.data_path,
            timebase=self._hold_data_dir(),
            max_bytes_per_file=self.options.max_bytes_per_file,
            ack_mode=self.options.durable,
            at_rest=self.at_rest,
        )

    def open_log(self, name: str, *, fresh: bool = False) -> TopicLog:
        """Open (recover) the log of topic ``name``; blocking, raises ``OSError``. ``fresh``: a
        name without files, nothing to recover (no system call until its first message)."""
        return TopicLog(
            name,
            self.options.data_path,
            timebase=self._hold_data_dir(),
            max_bytes_per_file=self.options.max_bytes_per_file,
            fresh=fresh,
            recover_ids=DEDUP_MAX_ENTRIES,
            at_rest=self.at_rest,
            compression=self._compressions.pop(name, None),
        )

    def note_compressions(self, compressions: dict[str, Compression]) -> None:
        """Restored topics' own ``compression`` policies, so that each log opens sealing as its
        topic will (its newest segment stays the one appended to; the policy, applied when the
        topic is made, then changes nothing)."""
        self._compressions = compressions

    def note_on_disk(self, names: Sequence[str]) -> None:
        """The names that have files in the data directory at start-up (``stored_queue_names``),
        taken while holding its lock: a topic created later under any other name has none."""
        self._on_disk = set(names)

    def topic_deleted(self, name: str) -> None:
        """Topic ``name`` was deleted and its log's files removed: a topic created again under
        that name starts fresh."""
        if self._on_disk is not None:
            self._on_disk.discard(name)

    def open_stored(
        self, names: Sequence[str]
    ) -> tuple[dict[str, DiskQueue | TopicLog], dict[str, OSError]]:
        """Open each log (a topic's name) or queue: (opened, failed) by name. Blocking: the
        service runs this in a worker thread."""
        opened: dict[str, DiskQueue | TopicLog] = {}
        failed: dict[str, OSError] = {}
        for name in names:
            try:
                opened[name] = self.open_queue(name) if ":" in name else self.open_log(name)
            except OSError as exc:
                failed[name] = exc
        return opened, failed

    def preopen(self, opened: dict[str, DiskQueue | TopicLog]) -> None:
        """Logs and queues opened by ``open_stored``, taken by the topics and channels restored
        next."""
        self._preopened = dict(opened)

    def close_unclaimed(self) -> None:
        """Close what no topic or channel took (their topic failed to open)."""
        for opened in self._preopened.values():
            opened.close()
        self._preopened.clear()

    def _disk(self, name: str) -> DiskQueue:
        queue = self._preopened.pop(name, None)
        if not isinstance(queue, DiskQueue):
            try:
                queue = self.open_queue(name)
            except OSError as exc:
                log.error("DISKQUEUE(%s): cannot open: %s", name, exc)
                self._on_health(f"cannot open queue {name}: {exc}")
                raise BackendError(f"cannot open queue {name}: {exc}") from exc
        self._syncer.register(queue)
        topic, _, channel = name.partition(":")
        queue.noted_offsets = self.offset_notes(topic, _channel_part(channel))
        return queue

    def offset_notes(self, topic: str, channel: str) -> dict[bytes, int]:
        """The channel's offset notes (``context.StoreSource``): every store of the channel
        opened here writes the offset noted for a message that does not carry one (a message
        read back from a store and written to one again). Made when first asked for; a deleted
        channel empties it (``Keeping.clear``) and one made again under its name takes it."""
        return self._offset_notes.setdefault(f"{topic}:{channel}", {})

    def topic_log(self, name: str) -> TopicLog | None:
        """A topic's log (None for an ephemeral topic). Raises ``BackendError`` if it cannot
        be opened. The topic registers it with the syncer."""
        if backing(name) is not Backing.DISK:
            return None
        opened = self._preopened.pop(name, None)
        if isinstance(opened, TopicLog):
            return opened
        fresh = self._on_disk is not None and name not in self._on_disk
        try:
            return self.open_log(name, fresh=fresh)
        except OSError as exc:
            log.error("TOPICLOG(%s): cannot open: %s", name, exc)
            self._on_health(f"cannot open log {name}: {exc}")
            raise BackendError(f"cannot open log {name}: {exc}") from exc

    def channel_backend(self, topic_name: str, channel_name: str) -> BackendQueue:
        """A channel's own store: its disk queue, opened when first written to (or now, if it
        has files from before). Never raises: a failure to open shows when it is written to."""
        return self._backend(f"{topic_name}:{channel_name}", backing(topic_name, channel_name))

    def lane_backend(self, topic_name: str, channel_name: str, level: int) -> BackendQueue:
        """A channel's priority lane's store for ``level``, as ``channel_backend``."""
        return self._backend(
            lane_store_name(topic_name, channel_name, level), backing(topic_name, channel_name)
        )

    def _backend(self, name: str, kind: Backing) -> BackendQueue:
        if kind is Backing.NONE:
            return DummyBackend()
        if kind is Backing.MEMORY:
            return MemoryBackend()
        existing = self._preopened.pop(name, None)
        if isinstance(existing, DiskQueue):
            self._syncer.register(existing)
            topic, _, channel = name.partition(":")
            existing.noted_offsets = self.offset_notes(topic, _channel_part(channel))
            return LazyBackend(self._open_disk, name, existing)
        return LazyBackend(self._open_disk, name)

    def deferred_store(self, topic_name: str, channel_name: str, create: bool) -> DiskQueue | None:
        """A channel's deferred store: opened when first needed (``create``), or at start-up if
        it has files; None for channels not stored on disk."""
        if backing(topic_name, channel_name) is not Backing.DISK:
            return None
        name = deferred_store_name(topic_name, channel_name)
        if not create and name not in self._preopened:
            return None
        queue = self._disk(name)
        queue.reads_are_deliveries = False  # read whole into the deferred heap, not delivered
        return queue

    def stored_lanes(self, topic_name: str, channel_name: str) -> list[int]:
        """The levels whose lane stores of the channel were opened at start-up (they have
        files)."""
        prefix = f"{topic_name}:{channel_name}{LANE_SUFFIX}"
        return sorted(
            int(name[len(prefix) :])
            for name in self._preopened
            if name.startswith(prefix) and _LANE_NAME.fullmatch(name)
        )


class MemoryStores:
    r"""Stores for an engine without a data directory (tests, tools): ``backing``'s rule with
    memory in place of disk. No log, no deferred store; what would be on disk is kept in
    ``MemoryBackend``\ s, what ephemeral names drop is dropped."""

    def topic_log(self, name: str) -> TopicLog | None:
        return None

    def channel_backend(self, topic_name: str, channel_name: str) -> BackendQueue:
        if backing(topic_name, channel_name) is Backing.NONE:
            return DummyBackend()
        return MemoryBackend()

    def lane_backend(self, topic_name: str, channel_name: str, level: int) -> BackendQueue:
        return self.channel_backend(topic_name, channel_name)

    def deferred_store(
        self, topic_name: str, channel_name: str, create: bool
    ) -> BackendQueue | None:
        return None

    def stored_lanes(self, topic_name: str, channel_name: str) -> list[int]:
        return []

    def offset_notes(self, topic: str, channel: str) -> dict[bytes, int]:
        return {}
