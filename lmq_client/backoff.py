"""``Backoff``, where applications import it from (the rule itself is the core's:
``lmq_client.core.backoff``)."""

from lmq_client.core.backoff import Backoff, BackoffState

__all__ = ["Backoff", "BackoffState"]
