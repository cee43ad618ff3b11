"""Retry: a channel's policy at work -- screening, retries with backoff, giving up, redrive.

Theory of operation
-------------------
A channel's policy (``channel_policy.py``: ``max_attempts``, ``dead_letter_topic``, backoff) and
its topic's ``ttl_ms`` act where the message already is, in plain ``def`` paths, with no task and
no await per message:

* **A REQ or a timeout** (``retry``): a message out of attempts is given up; the others wait the
  client's delay, or the policy's backoff (exponential, with jitter), in the deferred queue, or
  go straight back to the ready queue.
* **A delivery round** (``screen``): each message taken is checked against the TTL (the topic's,
  and a message's own, lmq's extension: the shorter wins) and ``max_attempts``; at most
  ``SCREEN_BUDGET`` are given up per round, then the round yields and the next goes on, so a
  queue of expired messages never holds delivery back. On disk the log's time index skips a
  whole expired backlog without reading it (``skip_expired``), when there is no dead-letter topic
  to publish it to.
* **Giving up** (``give_up``): to the dead-letter topic through the engine's events (the broker
  publishes them there: an ordinary topic, whose ``lmq.redrive`` channel holds them for a
  redrive), or dropped; counted either way. A dead-letter topic that cannot take them (its disk
  failed) gets them again ``DEAD_LETTER_RETRY_S`` later: never lost to a disk error. A dead
  letter whose dead-letter topic it was already dead-lettered from (its
  ``lmq-dead-letter-path``: A/c -> B and B/c -> A, longer cycles, a daemon-wide
  ``--dead-letter-topic`` in one) is dropped and counted instead, with a WARNING: a loop of
  policies cannot make messages circle for ever (RabbitMQ's rule for its dead-letter cycles).
  Refusing such policies when they are set could not be complete: a channel created later, with
  the daemon's defaults, can close a loop too.
* **Redrive** (``take_for_redrive`` on the dead-letter topic's redrive channel, then
  ``accept_redriven`` on the target): the messages move as fresh copies with attempts 0.

With no policy set, each path costs one attribute test (``screening``): nsqd's behaviour, at
nsqd's cost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from lmqd.engine.backend import BackendError, Syncable
from lmqd.engine.channel_policy import ChannelPolicy, PolicyError, PolicyValue
from lmqd.engine.cursor import ChannelCursor
from lmqd.engine.errors import TopicExiting
from lmqd.engine.keeping import Keeping
from lmqd.engine.policy import shared_default
from lmqd.engine.sources import ChannelBasics, ReadySources
from lmqd.message import Message
from lmqd.message_ext import closes_dead_letter_loop, without_dead_letter_path
from lmqd.options import Options

__all__ = [
    "DEAD_LETTER_RETRY_S",
    "REASON_EXPIRED",
    "REASON_MAX_ATTEMPTS",
    "SCREEN_BUDGET",
    "SCREEN_CHUNK",
    "Retry",
    "RetryOwner",
]

log = logging.getLogger("lmqd.channel")

SCREEN_BUDGET = 2048
"""Channel policies: about the most messages one delivery round takes and gives up (expired,
or out of attempts) before it yields (it stops at the first chunk past it); the next round goes
on at once. Given up in chunks, a message costs ~2.5 us (``SCREEN_CHUNK``), so a round stays
near 5 ms however long the queue of expired messages is, and delivery of the live ones behind
it is not held back for longer than that (the topic's pump batch, ``PUMP_BATCH``, is of the same
size for the same reason)."""

SCREEN_CHUNK = 256
"""Under a policy, once a round found messages to give up, the fewest it takes at a time however
little room the consumers have: an expired backlog is then given up (one dead-letter publish)
256 at a time, not one by one behind a consumer with RDY 1 (tests/engine, a recording sink:
~18 us a message one by one, ~2.5 us in chunks). The unexpired surplus goes back to the front
of the channel's memory."""

DEAD_LETTER_RETRY_S = 1.0
"""When the dead-letter topic could not take a message (its disk failed, it is being deleted),
the message waits this long in the channel's deferred queue and is tried again: a retry a
second costs nothing, and a disk that failed rarely recovers faster."""

REASON_EXPIRED = "expired"
REASON_MAX_ATTEMPTS = "max_attempts"


class EntryOwner(Protocol):
    def entry_changed(self) -> None: ...


class RetryOwner(ChannelBasics, Protocol):
    """The channel, as its policy sees it."""

    @property
    def options(self) -> Options: ...

    @property
    def subject(self) -> str: ...

    @property
    def exiting(self) -> bool: ...

    @property
    def dead_letter_topic(self) -> str: ...

    @property
    def owner(self) -> EntryOwner: ...

    @property
    def keeping(self) -> Keeping: ...

    @property
    def sources(self) -> ReadySources: ...

    def request_delivery(self) -> None: ...

    def deliver_again(self) -> None: ...

    def put_many(self, messages: Sequence[Message], now: float) -> None: ...


class Retry:
    """One channel's policy, its TTL screening and what it gave up (see the module docstring)."""

    __slots__ = (
        "_channel",
        "_message_ttls",
        "dead_letter_count",
        "expired_count",
        "expired_seen",
        "max_attempts_dropped_count",
        "policy",
        "policy_settings",
        "screening",
        "ttl_ns",
    )

    def __init__(self, channel: RetryOwner) -> None:
        self._channel = channel
        options = channel.options
        self.policy_settings: dict[str, PolicyValue] = {}
        """The channel's own policy keys (``channel_policy.py``), persisted with the metadata."""
        self.policy = shared_default(
            ChannelPolicy, options, lambda: ChannelPolicy.effective(options, {})
        )
        """The effective policy: the daemon's defaults, then ``policy_settings``."""
        self.ttl_ns = 0
        """The topic's ``ttl_ms`` in ns (0: none); the topic sets it."""
        self.screening = False
        """Whether delivery looks at each message taken (a TTL or ``max_attempts`` is set)."""
        self._message_ttls = False
        """Some message of the topic has its own TTL (lmq's extension): screened too."""
        self.expired_seen = False
        """A message taken had expired: the next read skips the expired backlog in the log
        (``skip_expired``)."""
        self.dead_letter_count = 0
        """Messages published to the dead-letter topic (expired or out of attempts)."""
        self.expired_count = 0
        """Messages given up because their TTL ran out (dead-lettered or dropped)."""
        self.max_attempts_dropped_count = 0
        """Messages out of attempts dropped for want of a dead-letter topic."""

    # -- the policy ----------------------------------------------------------------------------

    def set_policy(self, changes: Mapping[str, PolicyValue]) -> ChannelPolicy:
        """Set policy keys (validated by ``channel_policy.parse_update``); returns the effective
        policy. Raises ``PolicyError`` (nothing changed) for a dead-letter topic that is the
        channel's own topic (its messages would come back to it for ever)."""
        channel = self._channel
        if changes.get("dead_letter_topic") == channel.topic_name:
            raise PolicyError("dead_letter_topic must not be the channel's own topic")
        settings = {**self.policy_settings, **changes}
        self.policy = ChannelPolicy.effective(channel.options, settings)
        self.policy_settings = settings
        channel.owner.entry_changed()  # the topic's metadata entry holds the policy too
        self._update_screening()
        channel.request_delivery()  # a new rule may free messages (or give them up)
        return self.policy

    def set_ttl(self, ttl_ms: int) -> None:
        """The topic's ``ttl_ms`` (0: none)."""
        self.ttl_ns = ttl_ms * 1_000_000
        self._update_screening()

    def note_message_ttls(self) -> None:
        """The topic took a message with its own ``ttl_ms`` (lmq's extension): from now on the
        channel screens messages for it too (until then it costs nothing)."""
        if not self._message_ttls:
            self._message_ttls = True
            self._update_screening()

    def _update_screening(self) -> None:
        self.screening = bool(self.ttl_ns or self.policy.max_attempts or self._message_ttls)
        if not self.ttl_ns:
            self.expired_seen = False

    @property
    def retries(self) -> bool:
        """Whether a REQ or a timeout goes through ``retry`` (screening, or a backoff)."""
        return self.screening or self.policy.backs_off

    @property
    def dead_letter_topic(self) -> str:
        """Where given-up messages go (``""``: dropped): the policy's, unless that is the
        channel's own topic (a daemon-wide ``--dead-letter-topic`` reaches the dead-letter
        topic's own channels too: those drop)."""
        name = self.policy.dead_letter_topic
        return "" if name == self._channel.topic_name else name

    # -- retries and screening -----------------------------------------------------------------

    def retry(self, messages: Sequence[Message], now: float, delay: float) -> None:
        """REQ'd or timed-out messages under a policy: out of attempts, they are given up;
        the others wait ``delay`` (a client's REQ), or the policy's backoff, or nothing."""
        if self.screening:
            messages = self.give_up_exhausted(messages, now)
            if not messages:
                return
        keeping = self._channel.keeping
        policy = self.policy
        if delay <= 0 and policy.backs_off:
            rng = self._channel.ctx.rng
            for m in messages:
                m.deliver_at = now + policy.backoff_s(m.attempts, rng)
            keeping.defer_owned(messages)
        elif delay > 0:
            for m in messages:
                m.deliver_at = now + delay
            keeping.defer_owned(messages)
        else:
            keeping.requeue(messages)

    def give_up_exhausted(self, messages: Sequence[Message], now: float) -> list[Message]:
        """Give up the messages delivered ``max_attempts`` times; returns the others."""
        limit = self.policy.max_attempts
        if not limit:
            return list(messages)
        kept = [m for m in messages if m.attempts < limit]
        if len(kept) < len(messages):
            self.give_up([m for m in messages if m.attempts >= limit], REASON_MAX_ATTEMPTS, now)
        return kept

    def screen(self, messages: list[Message], now: float) -> list[Message]:
        """Of messages about to be delivered, give up the expired ones and those out of
        attempts; returns the rest. One comparison or two per message."""
        ttl = self.ttl_ns
        limit = self.policy.max_attempts
        wall_clock = self._channel.ctx.wall_clock
        if ttl:
            cutoff = wall_clock() - ttl
            expired = [m for m in messages if m.timestamp < cutoff]
            if expired:
                self.expired_seen = True
                self.give_up(expired, REASON_EXPIRED, now)
                messages = [m for m in messages if m.timestamp >= cutoff]
        if self._message_ttls:
            # A message's own TTL (lmq's extension) beside the topic's: the shorter wins.
            wall = wall_clock()
            expired = [
                m for m in messages
                if m.ext is not None and m.ext.ttl_ms
                and m.timestamp < wall - m.ext.ttl_ms * 1_000_000
            ]  # fmt: skip
            if expired:
                gone = set(map(id, expired))
                self.give_up(expired, REASON_EXPIRED, now)
                messages = [m for m in messages if id(m) not in gone]
        if limit:
            messages = self.give_up_exhausted(messages, now)
        return messages

    def give_up(self, messages: Sequence[Message], reason: str, now: float) -> None:
        """Dead-letter ``messages`` (owned by the channel, not in flight) or drop them, and
        count them. If the dead-letter topic cannot take them, they wait in the deferred queue
        and are tried again (``DEAD_LETTER_RETRY_S``): never lost to a disk error."""
        channel = self._channel
        target = self.dead_letter_topic
        events = channel.ctx.events
        if not target or not events.takes_dead_letters:
            self._drop(messages, reason)
            log.debug("%s: dropped %d messages (%s)", channel.subject, len(messages), reason)
            return
        looping = [m for m in messages if m.ext and closes_dead_letter_loop(m.ext, target)]
        if looping:
            self._drop(looping, reason)
            log.warning(
                "%s: dropped %d dead letters (%s) instead of sending them back to %s, which "
                "they were dead-lettered from: the channels' dead-letter topics make a loop",
                channel.subject,
                len(looping),
                reason,
                target,
            )
            if len(looping) == len(messages):
                return
            gone = set(map(id, looping))
            messages = [m for m in messages if id(m) not in gone]
        n = len(messages)
        try:
            durable = events.dead_letter(channel, messages, reason)
        except (BackendError, TopicExiting) as exc:
            log.error(
                "%s: cannot dead-letter %d messages to %s (retried in %gs) - %s",
                channel.subject,
                n,
                target,
                DEAD_LETTER_RETRY_S,
                exc,
            )
            deferred = channel.deferred
            for m in messages:
                m.deliver_at = now + DEAD_LETTER_RETRY_S
                deferred.push(m)
            channel.wake_at(deferred.next_deadline())
            return
        if reason == REASON_EXPIRED:
            self.expired_count += n
        self.dead_letter_count += n
        channel.keeping.done_when_copied(messages, durable)
        log.debug(
            "%s: dead-lettered %d messages to %s (%s)", channel.subject, n, target, reason
        )

    def _drop(self, messages: Sequence[Message], reason: str) -> None:
        """Given-up messages that go nowhere: done here, counted by reason."""
        if reason == REASON_EXPIRED:
            self.expired_count += len(messages)
        else:
            self.max_attempts_dropped_count += len(messages)
        self._channel.keeping.done(messages)

    def skip_expired(self, cursor: ChannelCursor) -> None:
        """Before the channel reads its cursor, once a message taken had expired
        (``expired_seen``): the expired backlog in the topic's log is skipped by the log's time
        index without reading it (dropped and counted; a channel with a dead-letter topic reads
        them instead, to publish them)."""
        self.expired_seen = False
        if self.dead_letter_topic:
            return
        skipped = cursor.skip_older_than(self._channel.ctx.wall_clock() - self.ttl_ns)
        if skipped:
            self.expired_count += skipped
            log.debug(
                "%s: skipped %d expired messages in the log", self._channel.subject, skipped
            )

    # -- redrive -------------------------------------------------------------------------------

    def take_for_redrive(self, count: int, now: float) -> list[Message]:
        """Remove up to ``count`` ready messages (a dead-letter topic's redrive channel);
        ``redriven`` must follow with where their copies went."""
        channel = self._channel
        if channel.exiting:
            return []
        return channel.sources.take(count, now)

    def redriven(self, messages: Sequence[Message], copies_in: Syncable | None) -> None:
        """``take_for_redrive``'s messages were put elsewhere (durable once ``copies_in`` is
        synced): done here."""
        if messages:
            self._channel.keeping.done_when_copied(messages, copies_in)

    def put_back(self, messages: Sequence[Message]) -> None:
        """``take_for_redrive``'s messages could not be moved: ready here again."""
        self._channel.keeping.enqueue(messages)
        self._channel.request_delivery()

    def accept_redriven(self, messages: Sequence[Message], now: float) -> Syncable | None:
        """Messages redriven from a dead-letter topic, as fresh copies with attempts 0 (they
        get ``max_attempts`` tries again), onto the ready queue; returns the store whose sync
        makes them durable (None: not stored). Raises ``BackendError`` having taken none."""
        channel = self._channel
        copies = [
            Message(m.id, m.body, m.timestamp, ext=without_dead_letter_path(m.ext))
            for m in messages
        ]
        channel.put_many(copies, now)
        channel.request_delivery()
        return channel.keeping.redrive_store()

    def want_more(self) -> None:
        """The screening budget is spent: another round goes on after the other tasks ran."""
        self._channel.deliver_again()
