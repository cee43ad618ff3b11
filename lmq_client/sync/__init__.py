"""Blocking clients on plain sockets: no event loop, for scripts, threads and Spark executors.

The same sans-IO core as the async clients (``lmq_client.core``), driven by blocking sockets:
``Producer`` (``lmq_client.sync.producer``) sends a command and waits for its answer;
``Consumer`` (``lmq_client.sync.consumer``) waits on all its connections at once (``select``)
inside ``get()``, where it also does what the core says is due (redials, lookupd queries, the
end of a backoff pause). The connection itself, with the handshake and its upgrades (TLS,
compression, AUTH), is ``lmq_client.sync.connection``.
"""

from lmq_client.message import Message
from lmq_client.sync.consumer import Consumer
from lmq_client.sync.producer import Producer

__all__ = ["Consumer", "Message", "Producer"]
