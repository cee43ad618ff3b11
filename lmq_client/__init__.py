"""lmq_client: NSQ clients for lmqd (and nsqd) — async Producer/Consumer, blocking client, lmqadmin.

The async clients, under asyncio or trio (anyio underneath)::

    async with Producer("127.0.0.1:4150") as producer:
        await producer.publish("events", b"hello")

    async with Consumer("events", "archive", ["127.0.0.1:4150"], handler=handle) as consumer:
        ...

The blocking client for scripts and Spark executors is ``lmq_client.sync``; the command line is
``lmqadmin`` (``lmq_client.admin``). See docs/client.md.
"""

from lmq_client.backoff import Backoff
from lmq_client.consumer import Consumer, ConsumerStats
from lmq_client.core import ConsumerOptions, ProducerOptions, ProducerStats
from lmq_client.errors import ConnectionFailed, InvalidNameError, LmqClientError, NSQError
from lmq_client.message import Message
from lmq_client.producer import Producer
from lmq_client.transport import TransportOptions

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
