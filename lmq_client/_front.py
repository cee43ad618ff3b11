"""What the async and the blocking consumers share around their core: the arguments, checked,
and their state, read from the core (``lmq_client.core.ConsumerCore``)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

from lmq_client._util import address_list, check_name
from lmq_client.core.consumer import ConsumerCore
from lmq_client.core.options import ConsumerOptions, from_settings
from lmq_client.lookupd import lookupd_addresses
from lmq_client.message import Message
from lmq_client.stats import ConsumerStats

__all__ = ["ConsumerFront"]

log = logging.getLogger("lmq_client.consumer")


class ConsumerFront:
    """The topic, channel, daemons, lookupds and options of a consumer, and its state."""

    def __init__(
        self,
        topic: str,
        channel: str,
        address: str | Sequence[str],
        lookupd_http_addresses: str | Sequence[str],
        settings: dict[str, Any],
    ) -> None:
        check_name("topic", topic)
        check_name("channel", channel)
        self.options = from_settings(ConsumerOptions, settings, stacklevel=4)
        self.topic = topic
        self.channel = channel
        self.lookupd_addresses = lookupd_addresses(lookupd_http_addresses)
        given = [address] if isinstance(address, str) else list(address)
        if not given and not self.lookupd_addresses:
            raise ValueError("give daemon addresses, lookupd_http_addresses, or both")
        self.addresses = address_list(given) if given else []
        self._core: ConsumerCore | None = None

    def _new_core(self, rng: random.Random, clock: Callable[[], float], now: float
                  ) -> ConsumerCore:  # fmt: skip
        msg_timeout = self.options.msg_timeout
        self._identify = {} if msg_timeout is None else {"msg_timeout": round(msg_timeout * 1000)}
        """The consumer's own IDENTIFY keys."""
        self._core = ConsumerCore(
            self.topic, self.channel, self.addresses, lookupds=bool(self.lookupd_addresses),
            options=self.options, rng=rng, clock=clock, now=now,
        )  # fmt: skip
        return self._core

    @property
    def connected_addresses(self) -> list[str]:
        """Daemons this consumer is subscribed on right now."""
        return list(self._core.links) if self._core is not None else []

    @property
    def discovered_addresses(self) -> list[str]:
        """Daemons the lookupds listed in their last answer (sorted)."""
        discovery = self._core.schedule.discovery if self._core is not None else None
        return sorted(discovery.producers) if discovery is not None else []

    def rdy_counts(self) -> dict[str, int]:
        """The RDY last sent on each live connection, by daemon address."""
        core = self._core
        return {a: link.rdy for a, link in core.links.items()} if core is not None else {}

    def statistics(self) -> ConsumerStats:
        """Counters and state, for logs and tests."""
        if self._core is None:
            return ConsumerStats(0, 0, 0, 0, 0, 0)
        return self._core.statistics()

    def requeue_delay_for(self, message: Message) -> float:
        """The delay of an automatic requeue: ``requeue_delay * attempts``, capped (go-nsq)."""
        return self.options.requeue_delay_for(message.attempts)

    def _handled(self, message: Message, *, failed: bool) -> None:
        """A handler returned (the message is finished) or raised (called in its ``except``:
        requeued after ``requeue_delay_for`` with backoff), unless it answered itself."""
        if failed:
            log.warning("consumer %s/%s: handler failed on %r", self.topic, self.channel,
                        message, exc_info=True)  # fmt: skip
            if not message.responded:
                message.requeue(self.requeue_delay_for(message))
        elif not message.responded:
            message.finish()
