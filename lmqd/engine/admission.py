"""PublishGate: a topic's publish policies applied where a publish enters the topic.

A topic whose effective policy sets any of ``max_depth``, ``publish_rate``, ``dedup_window_ms``
(``lmqd.engine.policy``) has a gate (``Topic.gate``); one without has None, and its publish
path is nsqd's with one attribute test more. Everything here is plain ``def``: no task, no
await. The order on a publish run (a run of PUB/MPUB commands a connection sent together, or one
HTTP request):

1. **Rate** (``TokenBucket``), before anything is stored: the caller reserves the run's tokens
   with ``reserve`` and waits the returned time once for all the commands paid for within
   ``PUBLISH_WAIT_MAX`` (the rest of the run then waits its own turn), or refuses a command
   that cannot be paid for within it on its turn (``RateLimited``). Tokens are taken for every
   message offered, duplicates included.
2. **Dedup** (``DedupWindow``): duplicate bodies are left out (the command is still answered OK).
3. **Depth**, ``overflow="reject"``: commands are accepted whole, in order, while the topic's
   backlog plus what they add stays within ``max_depth``; the first that would pass it is
   refused whole (``TopicFull``) and nothing after it is taken. Messages already accepted are
   never touched.
4. The accepted messages are stored (``Topic``), then remembered by the dedup window (a refused
   or failed publish leaves no trace in it), then, ``overflow="drop_oldest"``, every backlog
   over ``max_depth`` loses its oldest messages.

**Backlog** (what ``max_depth`` bounds) is per channel, as users of bounded queues expect: a
channel's waiting messages (``Channel.depth``: its own store and what its cursor has not read,
in-flight and deferred ones not counted, as nsqd's depth) plus the topic's messages not yet
handed to the channels (``Topic.depth``), which every channel will get. The topic's backlog is
the deepest of those (``Topic.depth`` alone while it has no channels).

Counters (``PublishCounters``, per topic, kept across policy changes) are in messages.
"""

from __future__ import annotations

import attrs

from lmqd.engine.dedup import DedupWindow
from lmqd.engine.policy import TopicPolicy
from lmqd.engine.ratelimit import TokenBucket
from lmqd.stats import PublishPolicyStats

__all__ = [
    "PUBLISH_WAIT_MAX",
    "PublishCounters",
    "PublishGate",
    "PublishRefused",
    "RateLimited",
    "TopicFull",
]

PUBLISH_WAIT_MAX = 1.0
"""Seconds a publish may wait for its tokens. With ``publish_rate`` >= 1 a single message never
waits longer than this on an idle bucket, so a lone PUB is slowed, never refused; what is
refused is a command larger than the burst plus a second's refill, or one queued behind more
than a second of other publishers' reservations. It is also far below the heartbeat interval
(30 s by default): while a connection waits it reads nothing, and its client must not be
dropped for silence."""


class PublishRefused(Exception):
    """A publish command a topic's policy refuses; ``str()`` is the reason for the publisher
    (the text after ``PUB failed`` on the wire)."""


class TopicFull(PublishRefused):
    """``max_depth`` reached with ``overflow="reject"``."""


class RateLimited(PublishRefused):
    """The command's tokens would not be there within ``PUBLISH_WAIT_MAX``."""

    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        """Seconds until its tokens would be there (HTTP ``Retry-After``)."""


@attrs.define
class PublishCounters:
    """What a topic's publish policies did, in messages."""

    overflow_dropped: int = 0
    """Dropped to make room (``drop_oldest``): a message counts once for the topic if it was
    dropped before its channels got it, else once for each channel that dropped its copy."""
    overflow_refused: int = 0
    """Messages of the commands refused because the topic was full (``reject``)."""
    rate_limited: int = 0
    """Messages of the commands refused by the rate limit."""
    deduplicated: int = 0
    """Answered OK and not enqueued: equal to a body within the dedup window."""

    def snapshot(self) -> PublishPolicyStats:
        return PublishPolicyStats(
            overflow_dropped_count=self.overflow_dropped,
            overflow_refused_count=self.overflow_refused,
            rate_limited_count=self.rate_limited,
            deduplicated_count=self.deduplicated,
        )

    @property
    def any(self) -> bool:
        return bool(
            self.overflow_dropped or self.overflow_refused or self.rate_limited or self.deduplicated
        )


class PublishGate:
    """One topic's rate bucket, dedup window and depth bound; see the module docstring."""

    __slots__ = ("bucket", "counters", "dedup", "drop_oldest", "max_depth", "topic")

    def __init__(self, topic: str, counters: PublishCounters) -> None:
        self.topic = topic
        self.counters = counters
        self.max_depth = 0
        self.drop_oldest = False
        self.bucket: TokenBucket | None = None
        self.dedup: DedupWindow | None = None

    def configure(self, policy: TopicPolicy) -> None:
        """Apply ``policy``'s publish keys. A bucket whose rate and burst are unchanged keeps
        its tokens; a dedup window that stays on keeps what it remembers."""
        self.max_depth = policy.max_depth
        self.drop_oldest = policy.overflow == "drop_oldest"
        rate = policy.publish_rate
        if rate:
            burst = policy.publish_burst or rate
            bucket = self.bucket
            if bucket is None or (bucket.rate, bucket.burst) != (rate, burst):
                self.bucket = TokenBucket(rate, burst)  # full: from its first use
        else:
            self.bucket = None
        window = policy.dedup_window_ms / 1000
        if window:
            if self.dedup is None:
                self.dedup = DedupWindow(window)
            else:
                self.dedup.window = window
        else:
            self.dedup = None

    def reserve(self, sizes: list[int], now: float) -> tuple[int, float]:
        """Rate: take the tokens of the longest prefix of the commands (``sizes``: messages
        each) paid for within ``PUBLISH_WAIT_MAX``: ``(commands, wait)``; ``(len(sizes), 0.0)``
        without a rate limit. ``commands`` < ``len(sizes)``: the next command is refused
        (``refuse_rate`` gives the error)."""
        bucket = self.bucket
        if bucket is None:
            return len(sizes), 0.0
        return bucket.reserve(sizes, now, PUBLISH_WAIT_MAX)

    def refuse_rate(self, size: int, now: float) -> RateLimited:
        """Count a command of ``size`` messages refused by the rate; the error to answer."""
        bucket = self.bucket
        assert bucket is not None
        self.counters.rate_limited += size
        return RateLimited(
            f"topic {self.topic} is over its publish rate "
            f"({bucket.rate:g}/s, burst {bucket.burst:g})",
            bucket.retry_after(size, now),
        )

    def refuse_full(self, size: int) -> TopicFull:
        """Count a command of ``size`` messages refused by ``max_depth``; the error to answer."""
        self.counters.overflow_refused += size
        return TopicFull(f"topic {self.topic} is full (max_depth {self.max_depth})")
