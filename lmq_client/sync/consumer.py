"""The blocking Consumer: ``ConsumerCore`` driven by blocking sockets, one thread.

Everything happens inside ``get()`` (and the iteration, and ``run``): it does what the core says
is due (dials, lookupd queries, which block for at most ``connect_timeout`` and
``lookupd_timeout``; the end of a backoff pause), sends what the core and the answers queued,
hands out a message already received, or waits on every connection at once (``select``) until
one has bytes or the core's next deadline. Answers (``finish``, ``requeue``) go out at once when
no received message waits to be handed out; during a burst they are queued on their connection
and sent by the next ``get()`` (once ``FLUSH_AT`` are waiting, or when nothing is ready), so a
burst of FINs costs a few sends. ``touch`` goes out at once.
"""

from __future__ import annotations

import logging
import math
import random
import select
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Unpack

from lmq_client._front import ConsumerFront
from lmq_client.core.consumer import ConsumerCore, ConsumerLink
from lmq_client.core.link import Link
from lmq_client.core.options import ConsumerSettings
from lmq_client.core.schedule import Connect, Disconnect
from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError, all_addresses_failed
from lmq_client.lookupd import lookup_producers
from lmq_client.message import Message
from lmq_client.sync.connection import SocketConnection

__all__ = ["Consumer"]

log = logging.getLogger("lmq_client.sync")

FLUSH_AT = 256
"""Commands queued on a connection (FINs, mostly: ~5 KB) that are sent without waiting for the
ready messages to run out: a window of 2500 messages is answered in ~10 sends, and the daemon
refills it while the rest are handled."""


class Consumer(ConsumerFront):
    """A blocking consumer of ``topic``/``channel`` on one or several daemons, listed in
    ``address`` and/or found through the lookupds at ``lookupd_http_addresses``.

    ``get(timeout)`` returns the next ``Message`` (or None when nothing came within ``timeout``);
    iterating yields messages until ``close()``; ``run(handler)`` hands each to ``handler`` (it
    returns: finished; it raises: requeued after ``requeue_delay * attempts`` and backs off).
    Heartbeats are answered while inside ``get``: don't leave it uncalled for longer than two
    heartbeat intervals. Settings are ``lmq_client.core.ConsumerOptions``'; the rules (RDY,
    backoff, max attempts and ``on_give_up``, redials, discovery) are the core's, as for the
    async consumer.

    The constructor connects to the addresses given and queries the lookupds once. Without
    lookupds it raises ``ConnectionFailed`` when none of the addresses could be subscribed; it
    raises the daemon's ``NSQError`` when one refuses the subscription. A connection lost later
    is never an exception: ``get`` goes on with the others and redials.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        address: str | Sequence[str] = (),
        *,
        lookupd_http_addresses: str | Sequence[str] = (),
        on_give_up: Callable[[Message], object] | None = None,
        rng: random.Random | None = None,
        **settings: Unpack[ConsumerSettings],
    ) -> None:
        super().__init__(topic, channel, address, lookupd_http_addresses, dict(settings))
        self.on_give_up = on_give_up
        now = time.monotonic()
        core = self._new_core(rng or random.Random(), time.monotonic, now)
        core.notify = self._notified
        core.send_now = self._send_now
        self._conns: dict[str, SocketConnection] = {}
        self._closed = False
        self._due = -math.inf
        try:
            core.start(now)
            failures = self._act(strict=True)
            if not self.lookupd_addresses and not core.links:
                raise all_addresses_failed(failures)
            self._flush(0)
        except BaseException:
            self.close()
            raise

    @property
    def core(self) -> ConsumerCore:
        assert self._core is not None
        return self._core

    @property
    def address(self) -> str:
        """The daemon consumed from (the first connected one, when there are several)."""
        return next(iter(self.core.links), "")

    # -- consuming -------------------------------------------------------------------------------

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[Message]:
        while not self._closed:
            message = self.get(None)
            if message is not None:
                yield message

    def run(self, handler: Callable[[Message], object]) -> None:
        """Hand every message to ``handler`` until ``close()`` (which the handler may call)."""
        for message in self:
            try:
                handler(message)
            except Exception:
                self._handled(message, failed=True)
            else:
                self._handled(message, failed=False)

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: until one comes)."""
        core = self.core
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while not self._closed:
            now = time.monotonic()
            if now >= self._due:
                core.timers(now)
                self._act()
                self._due = core.deadline
            item = core.next_message()
            if item is not None:
                self._flush(FLUSH_AT)
                message, give_up = item
                if not give_up:
                    return message
                self._give_up(message)
                continue
            self._flush(0)
            if now >= deadline:
                return None
            wake = min(self._due, deadline)
            self._wait(None if wake == math.inf else max(0.0, wake - now))
        return None

    def close(self) -> None:
        """Send CLS, requeue what was received and not handed out, and disconnect; messages
        handed out and not answered are redelivered by the daemons."""
        if self._closed:
            return
        self._closed = True
        self.core.close(time.monotonic())
        self._flush(0)
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def _give_up(self, message: Message) -> None:
        if self.on_give_up is not None:
            try:
                self.on_give_up(message)
            except Exception:
                log.exception("consumer %s/%s: give-up hook failed", self.topic, self.channel)
        self.core.gave_up(message)

    # -- driving the core ------------------------------------------------------------------------

    def _notified(self) -> None:
        self._due = -math.inf

    def _send_now(self, link: Link) -> None:
        conn = self._conns.get(link.address)
        if conn is not None and conn.link is link:
            try:
                conn.flush()
            except ConnectionFailed as exc:
                self._lost(conn, exc)

    def _act(self, *, strict: bool = False) -> list[ConnectionFailed]:
        """Carry out the core's actions (dials block). ``strict``: a daemon's error is raised."""
        core = self.core
        failures: list[ConnectionFailed] = []
        while actions := core.take_actions():
            for action in actions:
                if isinstance(action, Connect):
                    failure = self._dial(action.address, strict=strict)
                    if failure is not None:
                        failures.append(failure)
                elif isinstance(action, Disconnect):
                    conn = self._conns.pop(action.address, None)
                    if conn is not None:
                        conn.close()
                else:
                    core.answered(time.monotonic(), self._query_lookupds())
        self._due = -math.inf
        return failures

    def _dial(self, address: str, *, strict: bool) -> ConnectionFailed | None:
        """Connect to ``address`` and wait for the SUB's answer (``connect_timeout`` each)."""
        core = self.core
        try:
            conn = SocketConnection(
                address, connect_timeout=self.options.connect_timeout,
                heartbeat_interval=self.options.heartbeat_interval, identify=self._identify,
                transport=self.options.transport,
                make_link=lambda settings, now: core.connected(address, settings, now),
            )  # fmt: skip
        except (ConnectionFailed, NSQError) as exc:
            log.warning("consumer %s/%s: %s", self.topic, self.channel, exc)
            core.connect_failed(address, time.monotonic())
            if strict and isinstance(exc, NSQError):
                raise
            return exc if isinstance(exc, ConnectionFailed) else None
        self._conns[address] = conn
        link = conn.link
        assert isinstance(link, ConsumerLink)
        limit = time.monotonic() + self.options.connect_timeout
        try:
            conn.flush()
            while not link.sub.done:
                events = conn.receive(max(0.0, limit - time.monotonic()))
                if events is None:
                    raise ConnectionFailed(address, "no answer to SUB in time")
                core.receive(link, events, time.monotonic())
        except ConnectionFailed as exc:
            self._lost(conn, exc)
            return exc
        if link.sub.error is not None:
            self._conns.pop(address, None)
            conn.close()
            if strict and isinstance(link.sub.error, NSQError):
                raise link.sub.error
        return None

    def _lost(self, conn: SocketConnection, error: LmqClientError) -> None:
        if self._conns.get(conn.address) is conn:
            del self._conns[conn.address]
        conn.close()
        link = conn.link
        assert isinstance(link, ConsumerLink)
        self.core.ended(link, time.monotonic(), error)
        self._due = -math.inf

    def _flush(self, at_least: int) -> None:
        """Send what each connection has queued (if ``at_least`` commands)."""
        for conn in list(self._conns.values()):
            if len(conn.link.out) >= max(1, at_least):
                try:
                    conn.flush()
                except ConnectionFailed as exc:
                    self._lost(conn, exc)

    def _wait(self, timeout: float | None) -> None:
        """Until some connection has bytes (read and handed to the core), or ``timeout``."""
        conns = list(self._conns.values())
        if not conns:
            time.sleep(timeout if timeout is not None else self.options.heartbeat_interval)
            return
        if any(c.buffered() for c in conns):
            timeout = 0.0
        ready, _, _ = select.select([c.socket for c in conns], [], [], timeout)
        core = self.core
        for conn in conns:
            if conn.socket in ready or conn.buffered():
                try:
                    events = conn.receive(0)
                except ConnectionFailed as exc:
                    self._lost(conn, exc)
                    continue
                if events:
                    link = conn.link
                    assert isinstance(link, ConsumerLink)
                    core.receive(link, events, time.monotonic())
                    if not link.open:
                        self._lost(conn, link.error or ConnectionFailed(conn.address, "closed"))
        self._act()

    def _query_lookupds(self) -> set[str] | None:
        found: set[str] | None = None
        for lookupd in self.lookupd_addresses:
            try:
                producers = lookup_producers(lookupd, self.topic,
                                             timeout=self.options.lookupd_timeout)  # fmt: skip
            except LmqClientError as exc:
                log.warning("consumer %s/%s: lookupd %s: %s", self.topic, self.channel,
                            lookupd, exc)  # fmt: skip
                continue
            found = (found or set()) | set(producers)
        return found
