"""``/channel/policy`` and ``/channel/redrive`` (lmq; ``lmqd.engine.channel_policy``).

``GET /channel/policy?topic=T&channel=C`` answers the channel's effective policy as a JSON
object (the daemon's ``--max-attempts`` ... ``--backoff-jitter`` where the channel sets nothing
of its own). ``POST`` takes a JSON object of the keys to change, applies them all or none,
persists them with the metadata (a non-ephemeral channel), and answers the whole policy as
``GET`` does. Errors are those of ``/topic/policy`` (``policy.py``), plus 400
``MISSING_ARG_CHANNEL`` / ``INVALID_ARG_CHANNEL`` and 404 ``CHANNEL_NOT_FOUND``.

``POST /channel/redrive?topic=T&channel=C&from=D&max=N`` moves up to ``N`` (1 to
``MAX_REDRIVE``, default ``MAX_REDRIVE``) ready messages from the dead-letter topic ``D``'s
redrive channel into channel ``C`` of topic ``T``, attempts reset (``Broker.redrive``), and
answers ``{"moved": k}``; fewer than ``N`` moved means the dead-letter topic has no more ready
now. Errors: those of the channel, 400 ``MISSING_ARG_FROM``, ``INVALID_ARG_FROM`` (a bad name,
or ``T`` itself), ``INVALID_ARG_MAX``, 404 ``DEAD_LETTER_TOPIC_NOT_FOUND`` (no such topic, or
nothing was ever dead-lettered to it), 500 ``INTERNAL_ERROR`` if channel ``C`` could not store
them (they stay in ``D``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lmqd.engine.backend import BackendError
from lmqd.engine.channel import Channel
from lmqd.engine.channel_policy import REDRIVE_CHANNEL, PolicyError, parse_update
from lmqd.httpapi import args
from lmqd.httpapi.asgi import HttpError, Request, Response, json_response
from lmqd.httpapi.policy import read_policy_body
from lmqd.names import valid_name

if TYPE_CHECKING:
    from lmqd.broker import Broker

__all__ = ["MAX_REDRIVE", "ChannelPolicyApi"]

MAX_REDRIVE = 10_000
"""Messages one redrive call moves at most: each costs a few microseconds (and, on disk, a
write), all in one event-loop turn, so 10 000 keep a call within tens of milliseconds while the
daemon serves everyone else. ``lmqadmin channel redrive`` calls again until the dead-letter
topic has no more."""


class ChannelPolicyApi:
    """The ``/channel/policy`` and ``/channel/redrive`` handlers, for ``HttpApi`` to route."""

    def __init__(self, broker: Broker, existing_channel: Callable[[Request], Channel]) -> None:
        self.broker = broker
        self._existing_channel = existing_channel
        """``HttpApi``'s lookup: nsqd's topic and channel checks and their error strings."""

    async def channel_policy(self, request: Request) -> Response:
        channel = self._existing_channel(request)
        if request.method == "POST":
            doc = await read_policy_body(request)
            try:
                channel.set_policy(parse_update(doc))
            except PolicyError as exc:
                raise HttpError(400, f"INVALID_POLICY: {exc}") from None
            if not channel.ephemeral:
                self.broker.persist_metadata()
        return json_response(channel.policy.to_dict())

    async def channel_redrive(self, request: Request) -> Response:
        channel = self._existing_channel(request)
        query = args.query(request)
        source_name = query.get("from")
        if source_name is None:
            raise HttpError(400, "MISSING_ARG_FROM")
        if not valid_name(source_name):
            raise HttpError(400, "INVALID_ARG_FROM")
        if source_name == channel.topic_name:
            raise HttpError(400, "INVALID_ARG_FROM: the channel's own topic")
        raw_max = query.get("max")
        max_count = MAX_REDRIVE
        if raw_max is not None:
            digits = raw_max.isascii() and raw_max.isdigit()
            if not digits or not 1 <= int(raw_max) <= MAX_REDRIVE:
                raise HttpError(400, f"INVALID_ARG_MAX: an integer from 1 to {MAX_REDRIVE}")
            max_count = int(raw_max)
        source = self.broker.topic_or_none(source_name)
        if source is None or REDRIVE_CHANNEL not in source.channels:
            raise HttpError(404, "DEAD_LETTER_TOPIC_NOT_FOUND")
        try:
            moved = self.broker.redrive(channel, source, max_count)
        except BackendError:
            raise HttpError(500, "INTERNAL_ERROR") from None
        return json_response({"moved": moved})
