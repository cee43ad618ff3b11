"""``GET``/``POST /topic/policy?topic=T``: a topic's policy (lmq; ``lmqd.engine.policy``).

``GET`` answers the topic's effective policy as a JSON object, ``{"retention_ms": N,
"retention_bytes": M, "max_depth": ..., "overflow": "reject", ...}`` (every key of
``lmqd.engine.policy``; the daemon's flags of the same names where the topic sets nothing of its
own). ``POST`` takes a JSON object of the keys to change, applies them all or none, persists them
with the metadata, and answers the whole policy as ``GET`` does; with ``--durable`` it answers
once the metadata file with the change is fsynced (as a durable publish waits for its ``OK``),
so a policy answered survives ``kill -9``.

Errors: 400 ``MISSING_ARG_TOPIC`` / ``INVALID_ARG_TOPIC``, 404 ``TOPIC_NOT_FOUND`` (the topic
must exist, as for the other topic endpoints that change one), 413 ``INVALID_POLICY: ...``
for a body over ``MAX_POLICY_BODY``, 400 ``INVALID_POLICY: <what is wrong>`` for a body that is
not a JSON object, an unknown key or a bad value (nothing is changed then), and 500
``INTERNAL_ERROR`` if turning retention on could not write the topic's memory to its log (the
policy is set; the memory is written with the next publish).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from lmqd.engine.backend import BackendError
from lmqd.engine.policy import PolicyError, parse_update
from lmqd.engine.topic import Topic
from lmqd.httpapi import args
from lmqd.httpapi.asgi import HttpError, Request, Response, json_response
from lmqd.units import KiB

if TYPE_CHECKING:
    from lmqd.broker import Broker

__all__ = ["MAX_POLICY_BODY", "PolicyApi", "read_policy_body"]

MAX_POLICY_BODY = 64 * KiB
"""A policy object is a few keys: anything much larger is not one (bounded like every read)."""


async def read_policy_body(request: Request) -> Any:
    """A policy ``POST``'s body as parsed JSON (413 / 400 ``INVALID_POLICY: ...`` if too large
    or not JSON); topic and channel policies alike."""
    if request.content_length is not None and request.content_length > MAX_POLICY_BODY:
        raise HttpError(413, "INVALID_POLICY: body too large")
    body = await request.read_body(MAX_POLICY_BODY + 1)
    if len(body) > MAX_POLICY_BODY:
        raise HttpError(413, "INVALID_POLICY: body too large")
    try:
        return json.loads(body, parse_int=_parse_int)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested past the stack
        raise HttpError(400, "INVALID_POLICY: the body is not JSON") from None


_MAX_INT_DIGITS = 20
"""Digits of the longest integer kept as one: every policy value fits in 19 (int64)."""


def _parse_int(digits: str) -> int | float:
    """A JSON integer. Python's ``int()`` takes time quadratic in the digits and refuses more
    than 4,300 (a 500 and a traceback); a longer integer than any policy value can be is kept as
    a float instead, which each integer key refuses with its own message (``parse_update``)."""
    return int(digits) if len(digits) <= _MAX_INT_DIGITS else float(digits)


class PolicyApi:
    """The ``/topic/policy`` handler, for ``HttpApi`` to route."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def _topic(self, request: Request) -> Topic:
        return args.existing_topic(self.broker, args.topic_name(args.query(request)))

    async def topic_policy(self, request: Request) -> Response:
        topic = self._topic(request)
        if request.method == "POST":
            doc = await read_policy_body(request)
            try:
                changes = parse_update(doc)
            except PolicyError as exc:
                raise HttpError(400, f"INVALID_POLICY: {exc}") from None
            try:
                topic.set_policy(changes)
            except BackendError:
                raise HttpError(500, "INTERNAL_ERROR") from None
            if self.broker.options.durable and not topic.ephemeral:
                await self.broker.syncer.wait_idle()  # the round that writes the metadata
        return json_response(topic.policy.to_dict())
