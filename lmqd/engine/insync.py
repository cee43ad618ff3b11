"""InSyncAcks: publishes answered only once enough mirrors store them (``--min-insync-mirrors``).

Theory of operation
-------------------
Kafka's ``acks=all`` with ``min.insync.replicas``, on lmq's mirrors (``lmqd.mirror``): with
``--min-insync-mirrors=N`` (N > 0) a primary answers a publish ``OK`` only once N of its mirrors
have stored the message (fsynced it, for a ``--durable`` mirror), so a ``kill -9`` of the
primary followed by a promotion loses nothing a producer was told ``OK`` for.

**In sync.** A mirror is in sync for a topic (Kafka's ISR) while it fetched the topic within
``--mirror-ack-timeout`` and, within that time too, either had copied everything or asked from
at least the end the primary had told it the fetch before (``MirrorHold.fetched``: Kafka's
``lastCaughtUpTime``). A mirror that falls behind (a slow disk, a slow link) or stops asking
drops out of it on its own after the timeout; it is back at its first fetch that caught up.

**Before the append** (``refusal``): fewer than N mirrors in sync, the publish is refused and
nothing is stored (Kafka's ``NOT_ENOUGH_REPLICAS``): ``E_PUB_FAILED`` (``E_MPUB_FAILED``,
``E_DPUB_FAILED``), HTTP 503 ``NOT_ENOUGH_MIRRORS``; the producer retries, and no duplicate
comes of it.

**After the append** (``wait``): the publisher's ``OK`` is held, as ``--durable`` holds it for
its fsync (``lmqd.server.output``: no await per message, the connection keeps reading and a
pipelining producer's publishes share one round trip of the mirror), until N mirrors have
acknowledged the offset past the message (``acknowledged``: the N-th highest ``copied`` of the
holds in sync), or fails it after ``--mirror-ack-timeout`` (``expire``; Kafka's
``NOT_ENOUGH_REPLICAS_AFTER_APPEND``): the message is stored on the primary and may be
delivered, and the producer's retry may deliver it twice: at least once, never a silent loss.

**Per topic.** The topic policy ``min_insync_mirrors`` (``lmqd.engine.policy``; the flag is its
default) says how many mirrors a topic's publishes wait for: each call is given its topic's
number, and 0 is asynchronous replication.

Cost. A publish batch pays one look at its topic's policy (``Broker.after_published``); one
with 0 pays nothing more. With it: per publish batch, one look at the topic's holds (the
refusal) and one waiter in a deque; per fetch of a mirror, one pass over the waiters it
releases. The timer (``next_deadline``, ``expire``) is run by the primary's mirror registry.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from lmqd.engine.holds import MirrorHold
from lmqd.engine.stream import TopicStream

__all__ = ["InSyncAcks", "NotEnoughMirrors"]

AckCallback = Callable[[OSError | None], None]
"""What a held publish is answered with: ``None`` (stored by enough mirrors) or the error."""


class NotEnoughMirrors(OSError):
    """A publish refused (nothing stored) or failed after its append (stored here, not on
    enough mirrors in time). An ``OSError`` because it travels the way a failed fsync does, to
    the same held ``OK`` (``lmqd.server.output.Hold``); ``str()`` is the reason sent."""


class _Waiting:
    """One topic's held publishes, in order: (end offset, deadline, callback), and how many
    mirrors they wait for."""

    __slots__ = ("needed", "stream", "waiters")

    def __init__(self, stream: TopicStream, needed: int) -> None:
        self.stream = stream
        self.needed = needed
        self.waiters: deque[tuple[int, float, AckCallback]] = deque()


class InSyncAcks:
    """The publishes of a primary's topics waiting for their mirrors; see the module
    docstring."""

    __slots__ = ("_waiting", "held", "needed", "refused", "timed_out", "timeout")

    def __init__(self, needed: int, timeout: float) -> None:
        self.needed = needed
        """``--min-insync-mirrors``: the default of the topics' ``min_insync_mirrors`` policy
        (each call says how many its topic needs)."""
        self.timeout = timeout
        """``--mirror-ack-timeout``, seconds: the longest an ``OK`` is held, and how long a
        mirror stays in sync without a fetch that caught up."""
        self._waiting: dict[str, _Waiting] = {}
        """Topic name -> its held publishes (only topics with some)."""
        self.held = 0
        """Publishes (a command, an HTTP request) whose ``OK`` waited for the mirrors."""
        self.refused = 0
        """Publishes refused before the append: fewer mirrors in sync than ``needed``."""
        self.timed_out = 0
        """Held publishes failed after the append: not stored by the mirrors in time."""

    # -- the mirrors in sync -------------------------------------------------------------------

    def in_sync(self, stream: TopicStream, now: float) -> list[MirrorHold]:
        """The holds of ``stream``'s mirrors that are in sync at ``now``."""
        timeout = self.timeout
        return [c for c in stream.cursors if isinstance(c, MirrorHold) and c.in_sync(now, timeout)]

    def quorum(self, stream: TopicStream, now: float, needed: int) -> int:
        """The offset below which ``needed`` mirrors in sync have their copy (-1: too few)."""
        holds = self.in_sync(stream, now)
        if len(holds) < needed:
            return -1
        copied = sorted((h.copied for h in holds), reverse=True)
        return copied[needed - 1]

    def refusal(self, stream: TopicStream, now: float, needed: int) -> NotEnoughMirrors | None:
        """Why a publish to ``stream``, whose topic needs ``needed`` mirrors, is refused before
        it is stored (None: it may go on)."""
        count = len(self.in_sync(stream, now))
        if count >= needed:
            return None
        self.refused += 1
        return NotEnoughMirrors(
            f"NOT_ENOUGH_MIRRORS: {count} of --min-insync-mirrors={needed} in sync "
            "(nothing stored; retry)"
        )

    # -- held publishes ------------------------------------------------------------------------

    def wait(self, stream: TopicStream, now: float, callback: AckCallback, needed: int) -> None:
        """Call ``callback`` once ``needed`` mirrors store everything published to ``stream``
        so far (``None``), or with a ``NotEnoughMirrors`` after the timeout."""
        end = stream.next_offset
        if self.quorum(stream, now, needed) >= end:
            callback(None)
            return
        waiting = self._waiting.get(stream.name)
        if waiting is None or waiting.stream is not stream:
            waiting = self._waiting[stream.name] = _Waiting(stream, needed)
        waiting.needed = needed  # (the topic's policy may have changed)
        waiting.waiters.append((end, now + self.timeout, callback))
        self.held += 1

    @property
    def waiting_count(self) -> int:
        """Publishes held now."""
        return sum(len(w.waiters) for w in self._waiting.values())

    def waiting(self, name: str) -> bool:
        """Whether publishes to topic ``name`` wait for its mirrors (a fetch then answers at
        once, without lingering for more messages)."""
        return name in self._waiting

    def acknowledged(self, stream: TopicStream, now: float) -> None:
        """A mirror acknowledged offsets of ``stream``: answer the publishes it completed."""
        waiting = self._waiting.get(stream.name)
        if waiting is None or waiting.stream is not stream:
            return
        quorum = self.quorum(stream, now, waiting.needed)
        waiters = waiting.waiters
        while waiters and waiters[0][0] <= quorum:
            waiters.popleft()[2](None)
        if not waiters:
            del self._waiting[stream.name]

    @property
    def next_deadline(self) -> float:
        """When the oldest held publish times out (``math.inf``: none is held)."""
        return min((w.waiters[0][1] for w in self._waiting.values()), default=math.inf)

    def expire(self, now: float) -> int:
        """Fail the publishes held past their deadline; returns how many."""
        failed = 0
        for name in list(self._waiting):
            waiting = self._waiting[name]
            waiters = waiting.waiters
            while waiters and waiters[0][1] <= now:
                callback = waiters.popleft()[2]
                callback(NotEnoughMirrors(
                    f"NOT_ENOUGH_MIRRORS: not stored by {waiting.needed} mirror(s) within "
                    f"{self.timeout:g}s (stored here: a retry may duplicate it)"
                ))  # fmt: skip
                failed += 1
            if not waiters:
                del self._waiting[name]
        self.timed_out += failed
        return failed

    def drop(self, name: str, reason: str) -> None:
        """Topic ``name`` is deleted or closed: fail what it holds."""
        waiting = self._waiting.pop(name, None)
        if waiting is None:
            return
        for _, _, callback in waiting.waiters:
            callback(NotEnoughMirrors(f"NOT_ENOUGH_MIRRORS: {reason}"))
