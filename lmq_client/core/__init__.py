"""The clients' sans-IO core: what every front end decides, with no event loop and no socket.

* ``link`` — one connection past its handshake: output buffer, answers in order, heartbeats,
  the silence deadline.
* ``consumer`` — ``ConsumerCore``: connections by address, RDY (``flow``), backoff, max attempts
  and give-up, close, counters; ``schedule``: redials, lookupd discovery.
* ``producer`` — ``ProducerCore``: failover order, publishes in flight and how they ended.
* ``options`` — one vocabulary of settings for every front end.
* ``rdy`` and ``backoff`` — the pure rules under ``flow``: RDY shares and redistribution,
  exponential backoff and go-nsq's backoff state (also the reconnect and retry delays).

The drivers around it: ``lmq_client.consumer`` / ``lmq_client.producer`` (anyio: asyncio and
trio) and ``lmq_client.sync`` (blocking sockets). They take decoded ``ClientConnection`` events
to the core with ``now`` and send what it queued; tests/client/core drive it the same way.
"""

from typing import TYPE_CHECKING

from lmq_client._lazy import lazy_names

if TYPE_CHECKING:
    from lmq_client.core.consumer import ConsumerCore, ConsumerLink
    from lmq_client.core.link import Link, Reply
    from lmq_client.core.options import ConsumerOptions, ProducerOptions
    from lmq_client.core.producer import ProducerCore, ProducerStats
    from lmq_client.core.schedule import Action, Connect, Disconnect, QueryLookupds

_HOMES = {
    "ConsumerCore": "consumer", "ConsumerLink": "consumer", "Link": "link", "Reply": "link",
    "ConsumerOptions": "options", "ProducerOptions": "options", "ProducerCore": "producer",
    "ProducerStats": "producer", "Action": "schedule", "Connect": "schedule",
    "Disconnect": "schedule", "QueryLookupds": "schedule",
}  # fmt: skip

__getattr__ = lazy_names(__name__, _HOMES)

__all__ = [
    "Action",
    "Connect",
    "ConsumerCore",
    "ConsumerLink",
    "ConsumerOptions",
    "Disconnect",
    "Link",
    "ProducerCore",
    "ProducerOptions",
    "ProducerStats",
    "QueryLookupds",
    "Reply",
]
