"""The query arguments every topic and channel endpoint checks, with nsqd's error strings.

``query(request)``: the parsed query string (``400 INVALID_REQUEST`` when it cannot be parsed).
``names(query)``: a valid topic name (``MISSING_ARG_TOPIC`` / ``INVALID_ARG_TOPIC``) and, with
``channel=True``, a valid channel name (``MISSING_ARG_CHANNEL`` / ``INVALID_ARG_CHANNEL``).
``existing_topic(broker, name)``: the topic, or ``404 TOPIC_NOT_FOUND`` (nsqd's
``getExistingTopicFromQuery``). The handlers call them in nsqd's order: names first, their own
arguments next, existence last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmqd.engine.topic import Topic
from lmqd.gohttp import QueryError
from lmqd.httpapi.asgi import HttpError, Query, Request
from lmqd.names import valid_name

if TYPE_CHECKING:
    from lmqd.broker import Broker

__all__ = ["existing_topic", "names", "query", "topic_name"]


def query(request: Request) -> Query:
    """The request's query string; ``400 INVALID_REQUEST`` if it cannot be parsed."""
    try:
        return request.query()
    except QueryError:
        raise HttpError(400, "INVALID_REQUEST") from None


def _name(q: Query, key: str) -> str:
    value = q.get(key)
    upper = key.upper()
    if value is None:
        raise HttpError(400, f"MISSING_ARG_{upper}")
    if not valid_name(value):
        raise HttpError(400, f"INVALID_ARG_{upper}")
    return value


def topic_name(q: Query) -> str:
    """A valid ``topic``: ``400 MISSING_ARG_TOPIC`` / ``INVALID_ARG_TOPIC`` otherwise."""
    return _name(q, "topic")


def names(q: Query) -> tuple[str, str]:
    """A valid ``topic`` and ``channel``, topic checked first."""
    return _name(q, "topic"), _name(q, "channel")


def existing_topic(broker: Broker, name: str) -> Topic:
    """The topic ``name``; ``404 TOPIC_NOT_FOUND`` if it does not exist."""
    topic = broker.topic_or_none(name)
    if topic is None:
        raise HttpError(404, "TOPIC_NOT_FOUND")
    return topic
