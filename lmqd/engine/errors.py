"""The engine's exceptions that reach the network layers (besides ``BackendError``, storage's,
and FIN/REQ/TOUCH's ``ChannelError``\\ s, ``inflight.py``)."""

from __future__ import annotations

__all__ = ["TooManyConsumers", "TopicExiting"]


class TopicExiting(Exception):
    """The topic or channel is being deleted or closed: no publishing or subscribing on it."""


class TooManyConsumers(Exception):
    """``--max-channel-consumers`` reached; ``str()`` is nsqd's text for E_SUB_FAILED."""
