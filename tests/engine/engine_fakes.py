"""Fakes for the engine tests: a subscriber that records what it is sent, and backends that fail.

Not a test module (no ``test_`` prefix); the engine tests import it relatively
(``from .engine_fakes import ...``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import trio

from lmqd.engine.backend import BackendError, BackendQueue, DummyBackend, MemoryBackend
from lmqd.engine.channel import Channel
from lmqd.engine.context import EngineContext, EngineEvents, Named, NoEvents, StoreSource
from lmqd.engine.stores import Backing, MemoryStores, backing
from lmqd.engine.subscription import Subscription
from lmqd.message import Message
from lmqd.options import Options
from lmqd.stats import ClientStats


def engine(options: Options | None = None, **parts: Any) -> EngineContext:
    """An engine context for a test: ``options`` (default ``Options()``), nothing on disk
    (``MemoryStores``) and no broker (``NoEvents``) unless ``parts`` say otherwise (``stores``,
    ``events``, ``syncer``, ``rng``, ``clock``, ``wall_clock``, ``guid``)."""
    return EngineContext(options=options if options is not None else Options(), **parts)


class RecordingEvents(NoEvents):
    """Events a test looks at: ephemeral topics that deleted themselves, health reports."""

    def __init__(self) -> None:
        self.emptied: list[Named] = []
        self.health: list[str | None] = []

    def set_health(self, error: str | None) -> None:
        self.health.append(error)

    def ephemeral_topic_emptied(self, topic: Named) -> None:
        self.emptied.append(topic)


class GivenBackends(MemoryStores):
    """``MemoryStores`` whose channels' own stores are made by ``make(topic, channel)`` (a
    test's failing or pre-filled backend), but for those that keep nothing (``backing``)."""

    def __init__(self, make: Callable[[str, str], BackendQueue]) -> None:
        self._make = make

    def channel_backend(self, topic_name: str, channel_name: str) -> BackendQueue:
        if backing(topic_name, channel_name) is Backing.NONE:
            return DummyBackend()
        return self._make(topic_name, channel_name)


class OneBackend(MemoryStores):
    """``MemoryStores`` giving ``backend`` to the (one) channel made, whatever its name."""

    def __init__(self, backend: BackendQueue) -> None:
        self._backend = backend

    def channel_backend(self, topic_name: str, channel_name: str) -> BackendQueue:
        return self._backend


def given_backend(backend: BackendQueue) -> StoreSource:
    """Stores giving ``backend`` to the (one) channel made."""
    return OneBackend(backend)


def lone_channel(
    options: Options | None = None,
    name: str = "c",
    *,
    backend: BackendQueue | None = None,
    rng: random.Random | None = None,
    events: EngineEvents | None = None,
    **kwargs: Any,
) -> Channel:
    """A channel of topic ``t`` made on its own (no topic), its own store ``backend`` (memory
    by default)."""
    parts: dict[str, Any] = {}
    if backend is not None:
        parts["stores"] = given_backend(backend)
    if rng is not None:
        parts["rng"] = rng
    if events is not None:
        parts["events"] = events
    return Channel(engine(options, **parts), "t", name, **kwargs)


def now_or_none() -> float | None:
    try:
        return trio.current_time()
    except RuntimeError:  # a synchronous test, outside trio.run
        return None


class FakeClient:
    """A ``lmqd.engine.subscription.Consumer`` that records every ``write_messages`` call.

    ``subscribe(channel)`` keeps the ``Subscription`` the channel makes, whose counters the
    ``*_count`` properties read."""

    def __init__(
        self,
        client_id: int,
        *,
        ready: int = 0,
        msg_timeout: float = 60.0,
        sample_rate: int = 0,
        output_limit: int = 2**62,
    ) -> None:
        self.id = client_id
        self.output_limit = output_limit
        """Body bytes its (modelled) output buffer takes before it has no room."""
        self.pending_bytes = 0
        """Body bytes written and not yet ``drain``ed."""
        self.ready_count = ready
        self.sub: Subscription | None = None
        self.msg_timeout = msg_timeout
        self.sample_rate = sample_rate
        self.closed = False
        self.writes: list[list[Message]] = []
        self.write_times: list[float | None] = []
        self._written = trio.Event()

    def subscribe(self, channel: Channel) -> Subscription:
        self.sub = channel.add_consumer(self)
        return self.sub

    @property
    def in_flight_count(self) -> int:
        return self.sub.in_flight_count if self.sub is not None else 0

    @property
    def message_count(self) -> int:
        return self.sub.message_count if self.sub is not None else 0

    @property
    def finish_count(self) -> int:
        return self.sub.finish_count if self.sub is not None else 0

    @property
    def requeue_count(self) -> int:
        return self.sub.requeue_count if self.sub is not None else 0

    def byte_room(self) -> int:
        return self.output_limit - self.pending_bytes

    def drain(self) -> None:
        """Its (modelled) writer sent everything: room again (the caller asks for a round)."""
        self.pending_bytes = 0

    def write_messages(self, messages: Sequence[Message]) -> None:
        assert messages, "the channel must not make empty writes"
        self.pending_bytes += sum(len(m.body) for m in messages)
        self.writes.append(list(messages))
        self.write_times.append(now_or_none())
        self._written.set()

    def close(self) -> None:
        self.closed = True

    @property
    def received(self) -> list[Message]:
        """Every message delivered, in order."""
        return [m for batch in self.writes for m in batch]

    async def wait_writes(self, count: int) -> None:
        """Wait until ``write_messages`` has been called ``count`` times in all."""
        while len(self.writes) < count:
            self._written = trio.Event()
            await self._written.wait()

    def statistics(self) -> ClientStats:
        return ClientStats(
            client_id=f"fake{self.id}",
            hostname="fake",
            version="V2",
            remote_address="127.0.0.1:1",
            state=3,
            ready_count=self.ready_count,
            in_flight_count=self.in_flight_count,
            message_count=self.message_count,
            finish_count=self.finish_count,
            requeue_count=self.requeue_count,
            connect_ts=0,
            sample_rate=self.sample_rate,
            deflate=False,
            snappy=False,
            user_agent="fake/1.0",
        )


class FailingBackend(MemoryBackend):
    """A memory backend whose writes fail while ``failing`` is true (a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True

    def put_many(self, messages: Sequence[Message]) -> None:
        if self.failing:
            raise BackendError("disk full")
        super().put_many(messages)


def make_messages(count: int, *, start: int = 0, deliver_at: float = 0.0) -> list[Message]:
    """Messages with ids ``%016x`` of start.. and bodies ``b"m<n>"``."""
    return [
        Message(b"%016x" % i, b"m%d" % i, 1_700_000_000_000_000_000, 0, deliver_at)
        for i in range(start, start + count)
    ]


def bodies(messages: Sequence[Message]) -> list[bytes]:
    return [m.body for m in messages]
