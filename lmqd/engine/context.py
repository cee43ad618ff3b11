"""EngineContext: what every topic and channel of one daemon shares, and the events they report.

One object for the whole engine instead of a fan of callbacks per topic (hypercorn hands each of
its servers one ``Config`` and one ``WorkerContext`` the same way): the options, the stores (which
log or queue backs which name, ``stores.py``), the syncer, the message-id factory, the random
source, the clocks, and ``events``, the one interface through which the engine tells its owner
(the broker) what happened: health, the metadata file's content, channels created and deleted,
an ephemeral topic left without channels, and dead letters to publish. A topic or channel keeps
a reference to the context and nothing per hook: an idle topic costs one slot for all of it.

**Time.** ``clock`` (``trio.current_time``) is for task code only: the topics' pumps and the
channels' timer tasks read it when they wake. Everything plain-``def`` takes ``now`` from its
caller, so tests drive it with plain numbers or trio's autojump clock. ``wall_clock`` gives
message timestamps and the TTL screening's cut-off (ns since the epoch; tests make it follow the
virtual clock).

``NoEvents`` and ``MemoryStores`` (``stores.py``) make a context for tests and tools that run an
engine without a broker: nothing is reported, nothing touches disk, and given-up messages are
dropped (there is no topic to dead-letter them to).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from lmqd.engine.backend import BackendQueue, Syncable
from lmqd.message import GuidFactory, Message
from lmqd.options import Options

if TYPE_CHECKING:
    from lmqd.engine.syncer import Syncer
    from lmqd.storage import TopicLog

__all__ = ["DeadLetterSource", "EngineContext", "EngineEvents", "Named", "NoEvents", "StoreSource"]


class Named(Protocol):
    """A topic as the events see it (the engine's modules import this one, not the reverse)."""

    @property
    def name(self) -> str: ...


class DeadLetterSource(Protocol):
    """A channel giving messages up, as the events see it."""

    @property
    def topic_name(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def dead_letter_topic(self) -> str:
        """Where its given-up messages go."""
        ...


class EngineEvents(Protocol):
    """What the engine tells its owner (the broker implements it). Calls are synchronous, from
    plain ``def`` code: they must not block or await."""

    takes_dead_letters: bool
    """Whether ``dead_letter`` publishes (False: a channel drops what it gives up)."""

    def set_health(self, error: str | None) -> None:
        """The outcome of the last write: an error (health NOK), or None (OK again)."""
        ...

    def metadata_changed(self) -> None:
        """Something the metadata file holds changed (a channel, a paused flag, a policy)."""
        ...

    def channel_created(self, topic: str, channel: str) -> None:
        """A channel was created."""
        ...

    def channel_deleted(self, topic: str, channel: str) -> None:
        """A channel was deleted on its own (not with its whole topic)."""
        ...

    def ephemeral_topic_emptied(self, topic: Named) -> None:
        """An ephemeral topic lost its last channel and deleted itself (nsqd): forget it."""
        ...

    def dead_letter(
        self, channel: DeadLetterSource, messages: Sequence[Message], reason: str
    ) -> Syncable | None:
        """Publish ``messages``, given up by ``channel``, to its dead-letter topic; returns what
        to wait for before they are durable there (None: nothing). Raises ``BackendError`` or
        ``TopicExiting`` having published none of them."""
        ...


class NoEvents:
    """Events nobody listens to (tests and tools without a broker); dead letters are dropped."""

    takes_dead_letters = False

    def set_health(self, error: str | None) -> None:
        pass

    def metadata_changed(self) -> None:
        pass

    def channel_created(self, topic: str, channel: str) -> None:
        pass

    def channel_deleted(self, topic: str, channel: str) -> None:
        pass

    def ephemeral_topic_emptied(self, topic: Named) -> None:
        pass

    def dead_letter(
        self, channel: DeadLetterSource, messages: Sequence[Message], reason: str
    ) -> Syncable | None:
        raise RuntimeError("no dead-letter topic without a broker")  # takes_dead_letters=False


class StoreSource(Protocol):
    """Which log or queue backs which topic and channel (``stores.Stores``, ``MemoryStores``)."""

    def topic_log(self, name: str) -> TopicLog | None:
        """A topic's log (None: nothing of it on disk). Raises ``BackendError``."""
        ...

    def channel_backend(self, topic: str, channel: str) -> BackendQueue:
        """A channel's own store (never raises: a failure shows when it is written to)."""
        ...

    def deferred_store(self, topic: str, channel: str, create: bool) -> BackendQueue | None:
        """A channel's deferred store if it has one (``create``: open it now if needed)."""
        ...

    def lane_backend(self, topic: str, channel: str, level: int) -> BackendQueue:
        """The store of a channel's priority lane ``level``."""
        ...

    def stored_lanes(self, topic: str, channel: str) -> list[int]:
        """The levels whose lane stores the channel had on disk at start-up."""
        ...

    def offset_notes(self, topic: str, channel: str) -> dict[bytes, int]:
        """The channel's notes of the topic offsets of what it keeps in its stores
        (``holds.note_offsets``), one dict for the channel's life, which its stores write
        with those messages (``record.FLAG_OFFSET``)."""
        ...


_SHARED_RNG = random.Random()
"""The engine's random source unless it is given one (tests give a seeded one): delivery's
shuffles and the backoff's jitter need no stream per channel, and a ``Random`` is 2.5 KB."""


def _memory_stores() -> StoreSource:
    from lmqd.engine.stores import MemoryStores  # stores.py imports this module's protocol

    return MemoryStores()


@attrs.define(slots=True, kw_only=True, eq=False)
class EngineContext:
    """One engine's shared parts (see the module docstring). ``options`` may be replaced at
    run time (``Broker.update_options``): topics and channels made after that use the new
    ones, the others keep those they were made with."""

    options: Options
    stores: StoreSource = attrs.field(factory=_memory_stores)
    events: EngineEvents = attrs.field(factory=NoEvents)
    syncer: Syncer | None = None
    guid: GuidFactory = attrs.field(
        default=attrs.Factory(lambda self: GuidFactory(self.options.node_id), takes_self=True)
    )
    """Message ids, shared by every topic of the daemon (nsqd: one per node)."""
    rng: random.Random = _SHARED_RNG
    clock: Callable[[], float] = trio.current_time
    """The trio clock, for task code only (plain ``def`` code takes ``now``)."""
    wall_clock: Callable[[], int] = time.time_ns
    """Message timestamps and TTL cut-offs: ns since the epoch."""

    @property
    def on_backend_change(self) -> Callable[[BackendQueue], None] | None:
        """What a channel's store calls after a write or read (the syncer's one shared
        callback: it counts the store as dirty if it is on disk); None without a syncer."""
        return self.syncer.backend_changed if self.syncer is not None else None
