"""lmq_client: NSQ clients for lmqd (and nsqd) — async Producer/Consumer, blocking client, lmqadmin.

The async clients, under asyncio or trio (anyio underneath)::

    async with Producer("127.0.0.1:4150") as producer:
        await producer.publish("events", b"hello")

    async with Consumer("events", "archive", ["127.0.0.1:4150"], handler=handle) as consumer:
        ...

The blocking client for scripts and Spark executors is ``lmq_client.sync``; the command line is
``lmqadmin`` (``lmq_client.admin``). See docs/client.md.
"""

from typing import TYPE_CHECKING

from lmq_client._lazy import lazy_names

if TYPE_CHECKING:
    from lmq_client.backoff import Backoff
    from lmq_client.consumer import Consumer, ConsumerStats
    from lmq_client.core import ConsumerOptions, ProducerOptions, ProducerStats
    from lmq_client.errors import ConnectionFailed, InvalidNameError, LmqClientError, NSQError
    from lmq_client.message import Message
    from lmq_client.producer import Producer
    from lmq_client.transport import TransportOptions

_HOMES = {
    "Backoff": "backoff", "Consumer": "consumer", "ConsumerStats": "consumer",
    "ConsumerOptions": "core", "ProducerOptions": "core", "ProducerStats": "core",
    "ConnectionFailed": "errors", "InvalidNameError": "errors", "LmqClientError": "errors",
    "NSQError": "errors", "Message": "message", "Producer": "producer",
    "TransportOptions": "transport",
}  # fmt: skip
"""Where each public name lives (``lmq_client._lazy``)."""

__getattr__ = lazy_names(__name__, _HOMES)

__all__ = [
    "Backoff",
    "ConnectionFailed",
    "Consumer",
    "ConsumerOptions",
    "ConsumerStats",
    "InvalidNameError",
    "LmqClientError",
    "Message",
    "NSQError",
    "Producer",
    "ProducerOptions",
    "ProducerStats",
    "TransportOptions",
]
