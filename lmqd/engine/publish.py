"""PublishPath: how a topic takes messages -- ids, the publish policies, dedup, overflow.

Theory of operation
-------------------
``publish`` gives each body a new id (the engine's ``GuidFactory``, hex-encoded in one call per
batch) and the batch one wall-clock timestamp, and stores the messages at the topic's next
offsets in its ``TopicStream`` (``stream.py``): memory first, past that the log, once whatever
the number of channels. All or none, so a publisher whose messages could not be stored gets an
error and still has them. Then one ``Event.set`` wakes the topic's pump.

**Publish policies** (``admission.py``): a topic with any has a ``PublishGate``; one without has
``gate = None`` and its path is nsqd's plus one attribute test. ``publish_run`` takes a run of
publish commands through them: the dedup window (``DedupWindow``: body digests) and the
``max_depth`` check decide which commands of the run are accepted, whole, before one put stores
them; ``drop_oldest`` then trims every channel's backlog. The rate limit is the caller's
(``PublishGate.reserve``, once per run).

**Dedup ids** (lmq's extension): a message whose ``dedup_id`` the topic accepted within its
window (``dedup_window_ms``, else ``DEDUP_ID_WINDOW_S``) is left out and counted. Both windows
are rebuilt from the log after a restart (``recover_dedup``), and the log keeps the segments
they need (``_keep_for_dedup``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from itertools import repeat
from typing import Protocol

import attrs

from lmqd.engine.admission import PublishCounters, PublishGate, PublishRefused
from lmqd.engine.channel import Channel
from lmqd.engine.cursor import pushed
from lmqd.engine.dedup import DedupWindow, body_digest
from lmqd.engine.errors import TopicExiting
from lmqd.engine.internal import waiting_beyond_topic
from lmqd.engine.pins import TopicBasics
from lmqd.engine.policy import TopicPolicy
from lmqd.message import Message
from lmqd.message_ext import MessageExt, any_set

__all__ = ["DEDUP_ID_WINDOW_S", "PublishOutcome", "PublishPath", "PublishTopic"]


class PublishTopic(TopicBasics, Protocol):
    """The topic, as its publish path sees it."""

    message_count: int
    message_bytes: int

    @property
    def channels(self) -> dict[str, Channel]: ...

    @property
    def ahead(self) -> list[Channel]:
        """The internal channels, which read ahead of the pump (``internal.py``)."""
        ...

    @property
    def policy(self) -> TopicPolicy: ...

    def wake_pump(self) -> None: ...

log = logging.getLogger("lmqd.topic")

RECOVER_CHUNK = 1024
"""Messages ``recover_dedup`` reads from the log per step (a few read-aheads of the log's
reader): the decoded messages of one step are all it holds at a time besides the digests."""

DEDUP_ID_WINDOW_S = 300.0
"""How long a topic without a ``dedup_window_ms`` remembers a dedup id: five minutes, SQS FIFO's
deduplication interval (at most ``DEDUP_MAX_ENTRIES`` ids, oldest forgotten first)."""

_ID_NAMESPACE = b"\x00dedup_id:"
"""Dedup ids are remembered in a namespace of their own: an id never matches a body's digest."""


@attrs.frozen
class PublishOutcome:
    """What ``PublishPath.publish_run`` did with a run of publish commands."""

    messages: list[Message]
    """The messages stored (duplicates the dedup window left out are not among them), if the
    caller kept them (``keep``)."""
    accepted: int
    """Commands accepted (answered OK), a prefix of the run."""
    refusal: PublishRefused | None = None
    """Why command ``accepted`` was refused (None: the whole run was accepted)."""
    stored: int = 0
    """How many messages were stored."""


class PublishPath:
    """One topic's publishing: ids, policies, dedup windows (see the module docstring)."""

    __slots__ = ("_topic", "counters", "gate", "id_window", "message_ttls")

    def __init__(self, topic: PublishTopic) -> None:
        self._topic = topic
        log_ = topic.stream.log
        self.counters = PublishCounters()
        """What the publish policies did (kept when the policy changes)."""
        self.gate: PublishGate | None = None
        """The publish policies (``admission.py``); None when none is on: nsqd's path."""
        self.id_window: DedupWindow | None = None
        """The dedup ids (lmq's extension) accepted recently; made by the first one."""
        self.message_ttls = log_ is not None and log_.stored_message_ttls
        """A message with its own ``ttl_ms`` (lmq's extension) was published in this run, or
        the log held one when it opened: every channel screens for it
        (``Retry.note_message_ttls``)."""

    def apply_policy(self, policy: TopicPolicy) -> None:
        """The topic's policy changed (or was set at start): the gate and the windows follow."""
        if policy.gates_publishing:
            if self.gate is None:
                self.gate = PublishGate(self._topic.name, self.counters)
            self.gate.configure(policy)
        else:
            self.gate = None
        if self.id_window is not None:
            self._ids_window()  # its length follows dedup_window_ms
        self.keep_for_dedup()

    # -- publishing --------------------------------------------------------------------------

    def publish(
        self,
        bodies: Sequence[bytes],
        now: float,
        defer: float = 0.0,
        exts: Sequence[MessageExt | None] | None = None,
        *,
        keep: bool = True,
    ) -> list[Message]:
        """See ``Topic.publish``."""
        if self.gate is not None:
            outcome = self.publish_run(bodies, [len(bodies)], now, defer, exts, keep=keep)
            if outcome.refusal is not None:
                raise outcome.refusal
            return outcome.messages
        digests: list[bytes] = []
        if exts is not None:
            bodies, exts, digests = self._unseen_ids(bodies, exts, now)
            if not bodies:
                return []
        messages: list[Message] = []
        self._publish(bodies, now, defer, exts, messages if keep else None)
        if digests:
            self._remember_ids(digests, now)
        return messages

    def publish_run(
        self,
        bodies: Sequence[bytes],
        sizes: Sequence[int],
        now: float,
        defer: float = 0.0,
        exts: Sequence[MessageExt | None] | None = None,
        *,
        keep: bool = True,
    ) -> PublishOutcome:
        """See ``Topic.publish_run``."""
        gate = self.gate
        if gate is None:
            stream = self._topic.stream
            first = stream.next_offset
            made = self.publish(bodies, now, defer, exts, keep=keep)
            return PublishOutcome(made, len(sizes), stored=stream.next_offset - first)
        id_digests: list[bytes] = []
        if exts is not None and len(sizes) == 1:  # an XPUB: alone in its run (the session)
            bodies, exts, id_digests = self._unseen_ids(bodies, exts, now)
            if not bodies:
                return PublishOutcome([], 1)
            sizes = [len(bodies)]
        topic = self._topic
        if topic.exiting:
            raise TopicExiting(f"topic {topic.name} is exiting")
        window = gate.dedup
        pending: set[bytes] = set()
        if window is not None:
            window.expire(now)
        reject = gate.max_depth > 0 and not gate.drop_oldest
        room = gate.max_depth - self.backlog() if reject else 0
        kept: list[bytes] = []
        kept_exts: list[MessageExt | None] = []
        digests: list[bytes] = []
        accepted = 0
        refusal: PublishRefused | None = None
        offered = 0
        start = 0
        for size in sizes:
            command = bodies[start : start + size]
            if window is not None:
                new, new_digests = window.unseen(command, pending)
            else:
                new, new_digests = list(command), []
            if reject and new and len(kept) + len(new) > room:
                refusal = gate.refuse_full(size)
                log.debug("TOPIC(%s): refused %d messages: %s", topic.name, size, refusal)
                break
            if exts is not None:
                kept_exts += _kept_exts(command, exts[start : start + size], new)
            start += size
            kept += new
            digests += new_digests
            offered += size
            accepted += 1
        messages: list[Message] = []
        stored = 0
        if kept:
            stored = self._publish(
                kept, now, defer, kept_exts if exts is not None else None,
                messages if keep else None,
            )  # fmt: skip
        if window is not None:
            window.remember(digests, now)
            gate.counters.deduplicated += offered - len(kept)
        if gate.drop_oldest and gate.max_depth > 0 and stored:
            gate.counters.overflow_dropped += self._drop_oldest(gate.max_depth, now)
        if id_digests and accepted:
            self._remember_ids(id_digests, now)
        return PublishOutcome(messages, accepted, refusal, stored)

    def _publish(
        self,
        bodies: Sequence[bytes],
        now: float,
        defer: float,
        exts: Sequence[MessageExt | None] | None,
        out: list[Message] | None,
    ) -> int:
        """Store ``bodies`` as new messages; ``out`` takes the messages made (None: the caller
        does not want them, and a backlog's plain publish makes none, ``append_plain``).
        Returns how many were stored (an ephemeral topic drops what its memory cannot hold)."""
        topic = self._topic
        if topic.exiting:
            raise TopicExiting(f"topic {topic.name} is exiting")
        ctx = topic.ctx
        ids = ctx.guid.new_ids(len(bodies))
        ts = ctx.wall_clock()
        deliver_at = now + defer if defer > 0 else 0.0
        stream = topic.stream
        first = stream.next_offset
        ranked = False
        if exts is not None:
            if len(exts) != len(bodies):
                raise ValueError("one extension per body")
            if not self.message_ttls and any_set(exts, "ttl_ms"):
                self.message_ttls = True
                for channel in topic.channels.values():
                    channel.retry.note_message_ttls()
            ranked = any_set(exts, "priority")
            if not any(filter(None, exts)):  # only None (an extension object is always true)
                exts = None
        if out is None and not deliver_at and not ranked:
            # Not pushed to the channels (no deferral, no priority): a backlog's publish goes to
            # the log from its columns (``append_plain``), no message object made.
            nbytes = sum(map(len, bodies))
            listed = bodies if isinstance(bodies, list) else list(bodies)
            if stream.append_plain(ids, listed, ts, nbytes, exts):
                self._stored(len(bodies), nbytes)
                return len(bodies)
        # map() calls the constructor without a Python-level loop: ~25% less per message. The
        # offsets are not set on the objects (~20% more per message): the stream knows them,
        # and the copies channels read from the log carry theirs.
        if exts is None:
            messages = list(map(Message, ids, bodies, repeat(ts), repeat(0), repeat(deliver_at)))
        else:
            # The same with each one's extension (the fields after deliver_at: their defaults).
            messages = list(
                map(Message, ids, bodies, repeat(ts), repeat(0), repeat(deliver_at), repeat(0),
                    repeat(0.0), repeat(0.0), repeat(-1), exts)
            )  # fmt: skip
        self._put(messages, sum(map(len, bodies)), deliver_at > 0 or ranked, ts, exts is None)
        if out is not None:
            out += messages
        return stream.next_offset - first

    def put_many(self, messages: Sequence[Message]) -> None:
        """See ``Topic.put_many``."""
        topic = self._topic
        if topic.exiting:
            raise TopicExiting(f"topic {topic.name} is exiting")
        self._put(messages, sum(len(m.body) for m in messages), any(map(pushed, messages)))

    def _put(
        self,
        messages: Sequence[Message],
        nbytes: int,
        some_pushed: bool,
        timestamp: int | None = None,
        plain: bool = False,
    ) -> None:
        topic = self._topic
        stream = topic.stream
        first = stream.next_offset
        # Raises BackendError having stored none.
        stream.append(messages, nbytes, timestamp=timestamp, plain=plain)
        if some_pushed:
            kept = stream.next_offset - first  # an ephemeral topic may have dropped the rest
            stream.note_pushed([first + k for k, m in enumerate(messages[:kept]) if pushed(m)])
        self._stored(len(messages), nbytes)

    def _stored(self, count: int, nbytes: int) -> None:
        """``count`` messages of ``nbytes`` were taken: counted, the syncer and the internal
        channels told, the pump woken."""
        topic = self._topic
        stream = topic.stream
        topic.message_count += count
        topic.message_bytes += nbytes
        syncer = topic.ctx.syncer
        if stream.wrote_backend and syncer is not None:
            syncer.note_dirty(stream)
        for channel in topic.ahead:  # they read what is stored, not what the pump hands on
            channel.message_count += count
            channel.consumer_ready()
        topic.wake_pump()
        if stream.on_append is not None:  # a mirror waits for news (``lmqd.mirror.primary``)
            stream.on_append()

    # -- max_depth ---------------------------------------------------------------------------

    def backlog(self) -> int:
        """The deepest backlog of a channel: its waiting messages plus the topic's not yet
        handed on (the topic's alone without channels); what ``max_depth`` bounds."""
        topic = self._topic
        deepest = 0
        for channel in topic.channels.values():
            if not channel.exiting:
                depth = waiting_beyond_topic(channel, topic.stream)
                if depth > deepest:
                    deepest = depth
        return topic.stream.depth + deepest

    def _drop_oldest(self, limit: int, now: float) -> int:
        """Drop the oldest waiting messages of every backlog over ``limit`` (the topic's not
        yet handed on first, which every channel would get); how many (see
        ``PublishCounters.overflow_dropped``)."""
        topic = self._topic
        stream = topic.stream
        dropped = 0
        over = stream.depth - limit
        if over > 0:
            dropped += stream.drop_unpumped(over)
        pending = stream.depth
        for channel in topic.channels.values():
            if channel.exiting:
                continue
            over = waiting_beyond_topic(channel, stream) + pending - limit
            if over > 0:
                dropped += channel.drop_oldest(over, now)
        return dropped

    # -- dedup ids and their windows ---------------------------------------------------------

    def _unseen_ids(
        self, bodies: Sequence[bytes], exts: Sequence[MessageExt | None], now: float
    ) -> tuple[Sequence[bytes], Sequence[MessageExt | None], list[bytes]]:
        """lmq's dedup ids: the messages whose ``dedup_id`` the topic accepted within its dedup
        window (``dedup_window_ms``, else ``DEDUP_ID_WINDOW_S``), or that repeat one earlier in
        the same publish, are left out and counted (``deduplicated``); returns the rest and the
        digests to remember once they are stored (``_remember_ids``)."""
        if not any_set(exts, "dedup_id"):
            return bodies, exts, []
        window = self._ids_window()
        window.expire(now)
        keys = [_ID_NAMESPACE + e.dedup_id if e is not None and e.dedup_id else b"" for e in exts]
        with_ids = list(filter(None, keys))
        new, digests = window.unseen(with_ids, set())
        if len(new) == len(with_ids):
            return bodies, exts, digests  # nothing repeated: the common case
        self.counters.deduplicated += len(with_ids) - len(new)
        first = set(new)  # each kept once: at its first occurrence
        kept_bodies: list[bytes] = []
        kept_exts: list[MessageExt | None] = []
        for body, ext, key in zip(bodies, exts, keys, strict=True):
            if key:
                if key not in first:
                    continue
                first.discard(key)
            kept_bodies.append(body)
            kept_exts.append(ext)
        return kept_bodies, kept_exts, digests

    def _remember_ids(self, digests: list[bytes], now: float) -> None:
        if self.id_window is not None:
            self.id_window.remember(digests, now)

    def _ids_window(self) -> DedupWindow:
        """The dedup-id window, made (and kept on disk: ``keep_for_dedup``) by the first id,
        its length the policy's ``dedup_window_ms``, else ``DEDUP_ID_WINDOW_S``."""
        ms = self._topic.policy.dedup_window_ms
        length = ms / 1000 if ms else DEDUP_ID_WINDOW_S
        window = self.id_window
        if window is None:
            window = self.id_window = DedupWindow(length)
            self.keep_for_dedup()
        window.window = length
        return window

    def keep_for_dedup(self) -> None:
        """Keep the log's segments for as long as the dedup windows look back (the dedup-id
        window once the topic has one, the body window of ``dedup_window_ms``), so that a
        restart rebuilds them from the log (``recover_dedup``) even after every channel has
        passed those segments."""
        log_ = self._topic.stream.log
        if log_ is None:
            return
        keep = self._topic.policy.dedup_window_ms
        if self.id_window is not None:
            keep = max(keep, int(self.id_window.window * 1000))
        log_.keep_recent_ms = keep or None

    def recover_dedup(self, now: float) -> None:
        """See ``Topic.recover_dedup``."""
        topic = self._topic
        log_ = topic.stream.log
        if log_ is None:
            return
        started = time.perf_counter()
        wall = topic.ctx.wall_clock()
        ids = log_.take_recovered_ids()
        id_count = self._recover_ids(ids, now, wall) if ids else 0
        body_count = 0
        gate = self.gate
        if gate is not None and gate.dedup is not None and log_.next_offset:
            body_count = self._recover_bodies(gate.dedup, now, wall)
        if id_count or body_count:
            log.info(
                "TOPIC(%s): dedup windows rebuilt from the log: %d id(s), %d body digest(s) "
                "in %.3fs",
                topic.name,
                id_count,
                body_count,
                time.perf_counter() - started,
            )

    def _recover_ids(self, ids: list[tuple[int, bytes]], now: float, wall: int) -> int:
        window = self._ids_window()
        cutoff = wall - int(window.window * 1e9)
        return window.restore(
            (now - max(wall - ts, 0) / 1e9, body_digest(_ID_NAMESPACE + dedup_id))
            for ts, dedup_id in ids
            if ts > cutoff
        )

    def _recover_bodies(self, window: DedupWindow, now: float, wall: int) -> int:
        stream = self._topic.stream
        log_ = stream.log
        assert log_ is not None
        end = stream.known_from
        start = max(log_.offset_for_time(wall - int(window.window * 1e9)), end - window.max_entries)
        if start >= end:
            return 0
        reader = log_.open_reader(start)
        entries: list[tuple[float, bytes]] = []
        try:
            while got := reader.read_many(RECOVER_CHUNK, end):
                entries += (
                    (now - max(wall - m.timestamp, 0) / 1e9, body_digest(m.body)) for _, m in got
                )
        finally:
            reader.close()
        return window.restore(entries)


def _kept_exts(
    command: Sequence[bytes], exts: Sequence[MessageExt | None], kept: Sequence[bytes]
) -> list[MessageExt | None]:
    """The extensions of the bodies of ``command`` that dedup kept (``kept`` is a subsequence
    of ``command``, the same objects)."""
    out: list[MessageExt | None] = []
    k = 0
    for body, ext in zip(command, exts, strict=True):
        if k < len(kept) and kept[k] is body:
            out.append(ext)
            k += 1
    return out
