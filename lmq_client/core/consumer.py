"""The consumer, sans I/O: one core for the async and the blocking consumers.

Theory of operation
-------------------
The drivers (``lmq_client.consumer`` on anyio, ``lmq_client.sync`` on sockets) only move bytes
and wait; every decision is made here, from what they report and the time they pass in:

* ``start``, ``timers(now)``, ``answered`` (lookupds) produce **actions** (``take_actions``):
  dial an address, close a connection, query the lookupds (``lmq_client.core.schedule``).
* ``connected(address, settings, now)`` (the handshake is done) returns the connection's
  ``ConsumerLink`` with its ``SUB`` queued; ``receive(link, events, now)`` takes the decoded
  frames of one read: the SUB's answer, heartbeats (``NOP``), errors and messages;
  ``ended(link, now)`` reports a connection that is gone, ``connect_failed(address, now)`` one
  that never came up.
* **Bytes** go out through each link's output buffer (``Link.take_output``; ``Link.wake`` tells
  a writer task), **messages** come out of ``next_message()``, and ``deadline`` says when
  ``timers`` must run next (backoff pause, RDY redistribution, redials, lookupd polls, silent
  daemons, the end of ``close_timeout``).

Messages are answered by the application through ``Message.finish/requeue/touch``, which hand
their command to the core (``_answer``): counters, the backoff (``Flow``), whose RDY 0 goes out
before the failed message's REQ (go-nsq's order), and the command queued on the message's link.
Those calls carry no time, so the core reads ``clock()`` for them; everything else takes
``now``.

A message delivered more than ``max_attempts`` times is not handed out as one to handle:
``next_message`` flags it to be given up (the give-up hook sees it, then it is finished). A
message whose connection was lost before it was handed out is dropped (the daemon delivers it
again). ``close(now)`` sends CLS, requeues what was not handed out, and ``drained`` turns true
once every message handed out was answered and CLS acknowledged, or ``close_timeout`` passed.
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from lmq_client.core.flow import Flow
from lmq_client.core.link import Link, Reply
from lmq_client.core.options import ConsumerOptions
from lmq_client.core.schedule import Action, Disconnect, Schedule
from lmq_client.errors import ConnectionFailed, LmqClientError
from lmq_client.message import Message
from lmq_client.stats import ConsumerStats
from lmqd.protocol import Cls, FrameEvent, Rdy, Sub

__all__ = ["ConsumerCore", "ConsumerLink"]

log = logging.getLogger("lmq_client.consumer")

_CLS = Cls().encode()


class ConsumerLink(Link):
    """A consumer's connection: the link, its SUB, its RDY and whether it delivered lately."""

    __slots__ = ("cls", "got_message", "rdy", "sub")

    def __init__(self, address: str, *, heartbeat_interval: float, now: float,
                 settings: Mapping[str, Any]) -> None:  # fmt: skip
        super().__init__(address, heartbeat_interval=heartbeat_interval, now=now,
                         settings=settings)  # fmt: skip
        self.sub: Reply = Reply()
        self.cls: Reply | None = None
        self.rdy = 0
        self.got_message = False


class ConsumerCore:
    """One consumer of ``topic``/``channel`` (see the module docstring)."""

    def __init__(
        self,
        topic: str,
        channel: str,
        addresses: Sequence[str],
        *,
        lookupds: bool,
        options: ConsumerOptions,
        rng: random.Random,
        clock: Callable[[], float],
        now: float,
    ) -> None:
        self.topic = topic
        self.channel = channel
        self.options = options
        self.clock = clock
        self.notify: Callable[[], None] = _nothing
        """Set by the driver: called when an answer changed ``deadline`` or ``drained``."""
        self.send_now: Callable[[Link], None] | None = None
        """Set by a driver without a writer task (the blocking one): a link's output should go
        out now (after a TOUCH; after an answer once no received message waits to be handed
        out: during a burst, answers wait for the next ``get()`` and go out together)."""
        self.schedule = Schedule(
            addresses, lookupds=lookupds, poll_interval=options.lookupd_poll_interval,
            poll_jitter=options.lookupd_poll_jitter,
            reconnect_backoff=options.reconnect_backoff, rng=rng, now=now,
        )  # fmt: skip
        self.flow: Flow[ConsumerLink] = Flow(
            max_in_flight=options.max_in_flight, backoff=options.backoff,
            redistribute_interval=options.rdy_redistribute_interval, rng=rng,
        )  # fmt: skip
        self.links: dict[str, ConsumerLink] = {}
        """Subscribed connections, by address, in the order they subscribed."""
        self._pending: dict[str, ConsumerLink] = {}
        """Connections whose SUB is not answered yet."""
        self._actions: list[Action] = []
        self.ready: deque[Message] = deque()
        self.unanswered = 0
        """Messages received and not answered yet."""
        self.closing = False
        self._close_by = math.inf
        self.received = self.finished = self.requeued = self.given_up = 0

    # -- what the driver asks --------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Every daemon was tried once (drivers open the consumer then)."""
        return self.schedule.started

    @property
    def deadline(self) -> float:
        """When ``timers`` must run next."""
        if self.closing:
            return self._close_by if not self.drained else math.inf
        silence = min((link.deadline for link in self._all_links()), default=math.inf)
        return min(self.flow.deadline, self.schedule.deadline, silence)

    @property
    def drained(self) -> bool:
        """Closing, and every message handed out answered and CLS acknowledged (or
        ``close_timeout`` passed): the connections may be closed."""
        if not self.closing:
            return False
        if self._close_by == -math.inf:
            return True
        return self.unanswered == 0 and all(
            link.cls is None or link.cls.done for link in self.links.values()
        )

    def take_actions(self) -> list[Action]:
        """The actions decided since the last call, in order."""
        actions, self._actions = self._actions, []
        return actions

    def statistics(self) -> ConsumerStats:
        return ConsumerStats(
            received=self.received, finished=self.finished, requeued=self.requeued,
            given_up=self.given_up, connections=len(self.links), backoff_level=self.flow.level,
        )  # fmt: skip

    def next_message(self) -> tuple[Message, bool] | None:
        """The next message received and not handed out, and whether to give it up (more than
        ``max_attempts`` deliveries); None if there is none."""
        ready = self.ready
        max_attempts = self.options.max_attempts
        while ready:
            message = ready.popleft()
            if self._unanswerable(message):
                continue
            if max_attempts and message.attempts > max_attempts:
                log.warning("consumer %s/%s: giving up on %r after %d attempts",
                            self.topic, self.channel, message, message.attempts)  # fmt: skip
                self.given_up += 1
                return message, True
            return message, False
        return None

    def gave_up(self, message: Message) -> None:
        """The application was told (``on_give_up``) of a message ``next_message`` gave up on:
        it is finished unless the hook answered it (go-nsq's ``LogFailedMessage``, then FIN)."""
        if not message.responded:
            message.finish()

    # -- what the driver reports -----------------------------------------------------------------

    def start(self, now: float) -> None:
        self._actions.extend(self.schedule.due(now))

    def connected(self, address: str, settings: Mapping[str, Any], now: float) -> ConsumerLink:
        """The handshake with ``address`` is done: its link, with SUB queued."""
        link = ConsumerLink(address, heartbeat_interval=self.options.heartbeat_interval,
                            now=now, settings=settings)  # fmt: skip
        link.command(Sub(topic=self.topic, channel=self.channel).encode(), link.sub)
        self._pending[address] = link
        return link

    def receive(self, link: ConsumerLink, events: list[FrameEvent], now: float) -> None:
        """Decoded frames from ``link``'s connection."""
        frames = link.receive(events, now)
        if link.sub.done and link.sub.error is None and self._pending.get(link.address) is link:
            del self._pending[link.address]
            self._subscribed(link, now)
        if not link.open:
            self._gone(link, now)
            return
        if not frames:
            return
        link.got_message = True
        count = len(frames)
        self.received += count
        self.unanswered += count
        messages = [Message(f.id, f.body, f.timestamp, f.attempts, link, self, f.ext)
                    for f in frames]  # fmt: skip
        if self.closing:
            for message in messages:
                message.requeue(0, backoff=False)
        else:
            self.ready.extend(messages)

    def connect_failed(self, address: str, now: float) -> None:
        """The attempt to open a connection to ``address`` failed."""
        if not self.closing:
            self.schedule.ended(address, now)
            self._update_rdy()

    def ended(self, link: ConsumerLink, now: float, error: LmqClientError | None = None) -> None:
        """``link``'s connection ended (``error`` says why; nothing if the core closed it)."""
        link.lost(error or ConnectionFailed(link.address, "connection closed"))
        self._gone(link, now, close=False)

    def answered(self, now: float, found: Iterable[str] | None) -> None:
        """The lookupds' answer to ``QueryLookupds`` (None: no lookupd answered)."""
        for action in self.schedule.answered(now, found):
            if isinstance(action, Disconnect):
                self._disconnect(action.address, now)
            else:
                self._actions.append(action)
        self._update_rdy()

    def timers(self, now: float) -> None:
        """Do what is due at ``now``."""
        if self.closing:
            if now >= self._close_by and not self.drained:
                log.warning("consumer %s/%s: closed with %d messages unanswered",
                            self.topic, self.channel, self.unanswered)  # fmt: skip
                self._close_by = -math.inf
            return
        for link in list(self._all_links()):
            if link.silent(now):
                self._gone(link, now)  # logs the link's error
        conns = list(self.links.values())
        idle = _take_idle(conns) if now >= self.flow.redistribute_at else ()
        if self.flow.due(now, conns, idle):
            self._update_rdy()
        self._actions.extend(self.schedule.due(now))

    def close(self, now: float) -> None:
        """Stop: CLS to every daemon, requeue what was not handed out, start ``close_timeout``."""
        if self.closing:
            return
        self.closing = True
        self.schedule.stop()
        self._close_by = now + self.options.close_timeout
        for link in self.links.values():
            if link.open:
                link.cls = link.command(_CLS)
        while self.ready:
            message = self.ready.popleft()
            if not self._unanswerable(message):
                message.requeue(0, backoff=False)

    # -- answers (from Message) ------------------------------------------------------------------

    def _answer(self, message: Message, command: bytes, *, success: bool, backoff: bool
                ) -> None:  # fmt: skip
        """``message`` answered with ``command`` (FIN or REQ): counters, backoff, and the command
        queued on its link, after the backoff's RDY 0 for a failure (go-nsq's order: the daemon
        cannot hand the message straight back during the pause). A message whose connection
        is gone cannot be answered (the daemon delivers it again)."""
        link = message._conn
        self.unanswered -= 1
        if success:
            self.finished += 1
            if link.open:
                link.write(command)
            if self.flow.backoff.level == 0:  # the common case: nothing else changes
                self._after_answer(link)
                return
        else:
            self.requeued += 1
        if (success or backoff) and self.flow.outcome(self.clock(), failure=not success):
            log.info("consumer %s/%s: %s", self.topic, self.channel,
                     self.flow.describe(self.clock()))  # fmt: skip
            self._update_rdy()
            self.notify()
        if not success and link.open:
            link.write(command)
        self._after_answer(link)

    def _touch(self, message: Message, command: bytes) -> None:
        link = message._conn
        if link.open:
            link.write(command)
            if self.send_now is not None:
                self.send_now(link)

    def _after_answer(self, link: Link) -> None:
        if self.closing and self.unanswered == 0:
            self.notify()
        if self.send_now is not None and not self.ready and link.out:
            self.send_now(link)

    def _unanswerable(self, message: Message) -> bool:
        """Whether ``message``'s connection is gone: the daemon delivers it again, and it
        cannot be answered (it counts as answered)."""
        if message._conn.is_open:
            return False
        message.responded = True
        self.unanswered -= 1
        if self.closing and self.unanswered == 0:
            self.notify()
        return True

    # -- connections and RDY ---------------------------------------------------------------------

    def _all_links(self) -> Iterable[ConsumerLink]:
        yield from self.links.values()
        yield from self._pending.values()

    def _subscribed(self, link: ConsumerLink, now: float) -> None:
        self.links[link.address] = link
        self.schedule.subscribed(link.address)
        if self.closing:
            link.cls = link.command(_CLS)
            return
        self.flow.connections_changed(list(self.links.values()), now)
        self._update_rdy()

    def _gone(self, link: ConsumerLink, now: float, *, close: bool = True) -> None:
        """``link`` ended: forget it, tell the schedule, and (``close``) have the driver close
        its connection."""
        address = link.address
        if self.links.get(address) is link:
            del self.links[address]
        elif self._pending.get(address) is link:
            del self._pending[address]
        else:
            return
        if link.error is not None and not self.closing:
            log.warning("consumer %s/%s: %s", self.topic, self.channel, link.error)
        if close:
            self._actions.append(Disconnect(address))
        if self.closing:
            return
        self.schedule.ended(address, now)
        self.flow.connections_changed(list(self.links.values()), now)
        self._update_rdy()

    def _disconnect(self, address: str, now: float) -> None:
        """Drop ``address`` (the lookupds no longer list it)."""
        link = self.links.pop(address, None) or self._pending.pop(address, None)
        if link is not None:
            link.lost(ConnectionFailed(address, "no longer listed by the lookupds"))
            self.flow.connections_changed(list(self.links.values()), now)
        self._actions.append(Disconnect(address))

    def _update_rdy(self) -> None:
        """Send RDY wherever the wanted value differs from the last one sent."""
        if self.closing or not self.schedule.started:
            return
        conns = list(self.links.values())
        caps = {link: link.max_rdy_count for link in conns}
        for link, count in self.flow.targets(conns, caps).items():
            if link.rdy != count and link.open:
                link.rdy = count
                link.write(Rdy(count=count).encode())


def _take_idle(conns: list[ConsumerLink]) -> tuple[ConsumerLink, ...]:
    """The connections that received no message since the last call (RDY redistribution's
    idle ones), and a new count started."""
    idle = tuple(link for link in conns if not link.got_message)
    for link in conns:
        link.got_message = False
    return idle


def _nothing() -> None:
    pass
