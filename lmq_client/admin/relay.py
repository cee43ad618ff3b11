"""Consume in batches, act on each batch, then answer it: what ``archive`` and ``forward`` share.

Theory of operation. One trio ``Consumer`` reads the topic's channel with ``max_in_flight`` equal
to the batch size. Messages collect in a pending batch; the batch is handed to the command's
``handle`` when it is full (no more can arrive before it is answered: RDY is a window), when
``interval_s`` has passed since its first message, or when ``-n`` is reached. ``handle`` writes
(``archive``) or publishes (``forward``) the batch and only then answers each message: FIN when
the batch is safely elsewhere, REQ otherwise. A crash at any point leaves unanswered messages in
flight at the daemon, which redelivers them after its message timeout: nothing is lost, a batch
may be seen twice (at least once, as nsq_to_file and nsq_to_nsq).

SIGINT and SIGTERM stop the loop where it waits for messages (never in the middle of ``handle``,
which is shielded from cancellation); the pending batch is handled, then the command closes its
files or connections and the consumer closes (its FINs sent), and the command exits 0. ``tick``
runs every ``tick_every_s`` even without traffic (``archive`` closes files that are too old).

Waiting for the next message is cancelled by the batch's deadline; the consumer's ``__anext__``
takes a message only after its wait, so cancelling it loses none.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from lmq_client.admin.common import Settings
from lmq_client.consumer import Consumer
from lmq_client.errors import ConnectionFailed
from lmq_client.message import Message

__all__ = ["open_consumer", "relay", "run_trio"]

log = logging.getLogger("lmq_client.admin.relay")

T = TypeVar("T")


def open_consumer(
    settings: Settings, topic: str, channel: str, max_in_flight: int, **options: Any
) -> Consumer:
    """A consumer of the daemons given (``--tcp-address``) and/or found (``--lookupd-...``)."""
    addresses = settings.tcp if settings.tcp_given or not settings.lookupd else []
    return Consumer(
        topic, channel, addresses, lookupd_http_addresses=settings.lookupd,
        max_in_flight=max_in_flight, max_attempts=0, connect_timeout=settings.timeout,
        close_timeout=10.0, transport=settings.transport, **options,
    )


def check_connected(settings: Settings, consumer: Consumer) -> None:
    """Fail as tail does when no daemon given by address accepted the subscription."""
    if not consumer.connected_addresses and not settings.lookupd:
        raise ConnectionFailed(", ".join(settings.tcp), "no daemon accepted the subscription")


async def relay(
    consumer: Consumer,
    *,
    batch_size: int,
    interval_s: float,
    handle: Callable[[list[Message]], Awaitable[None]],
    limit: int | None = None,
    tick: Callable[[], Awaitable[None]] | None = None,
    tick_every_s: float = math.inf,
) -> int:
    """Run the batching loop until ``limit`` messages were handled, the consumer closes, or a
    SIGINT/SIGTERM arrives; return how many messages were handled."""
    handled = 0
    pending: list[Message] = []
    loop = trio.CancelScope()

    async def flush() -> None:
        nonlocal handled, pending
        batch, pending = pending, []
        with trio.CancelScope(shield=True):
            await handle(batch)
        handled += len(batch)

    async def watch_signals() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("relay: %s: finishing the pending batch", signal.Signals(signum).name)
                loop.cancel()
                return

    async with trio.open_nursery() as nursery:
        # Signals can only be caught in the main thread (lmqadmin's; not an embedding program's).
        if threading.current_thread() is threading.main_thread():
            nursery.start_soon(watch_signals)
        with loop:
            first_at = math.inf
            next_tick = trio.current_time() + tick_every_s
            while limit is None or handled + len(pending) < limit:
                message: Message | None = None
                with trio.move_on_at(min(first_at + interval_s, next_tick)):
                    try:
                        message = await consumer.__anext__()
                    except StopAsyncIteration:
                        break
                now = trio.current_time()
                if message is not None:
                    if not pending:
                        first_at = now
                    pending.append(message)
                full = len(pending) >= batch_size or (
                    limit is not None and handled + len(pending) >= limit
                )
                if pending and (full or now >= first_at + interval_s):
                    await flush()
                    first_at = math.inf
                if tick is not None and now >= next_tick:
                    with trio.CancelScope(shield=True):
                        await tick()
                    next_tick = now + tick_every_s
        if pending:
            await flush()
        nursery.cancel_scope.cancel()
    return handled


def _single(exc: BaseException) -> BaseException:
    """The one exception inside nested exception groups of one (trio's nurseries wrap them)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def run_trio(func: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run``, re-raising a lone exception unwrapped so the CLI's handlers see it."""
    try:
        return trio.run(func, *args)
    except BaseExceptionGroup as group:
        single = _single(group)
        if single is group:
            raise
        raise single from None
