"""The live tail: ``/tail/T`` shows a topic's messages as they arrive, as ``nsq_tail`` prints
them: the console subscribes an ephemeral channel (``console<random>#ephemeral``, so it never
touches disk and disappears with its last consumer) on every node that has the topic -- and,
with lookupds, on the nodes they list later -- and streams each message to the page as a
server-sent event, which htmx's SSE extension puts at the top of the list. Each browser has its
own channel, like each ``nsq_tail``; closing the page ends the consumer (the stream's
disconnect cancels it) and so deletes the channel.

``status`` events say when the subscription is live, so a page (and a test) knows that a
message published from then on will be shown.
"""

from __future__ import annotations

import random
import string
from typing import TYPE_CHECKING

from lmq_client.admin.web.asgi import EventSender, EventStream, Request, Response
from lmq_client.admin.web.bodies import VIEWS, render_body
from lmq_client.admin.web.pages import topic_or_404
from lmq_client.consumer import Consumer
from lmq_client.errors import LmqClientError

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console

__all__ = ["TAIL_MAX_IN_FLIGHT", "register"]

TAIL_MAX_IN_FLIGHT = 50
"""Messages the tail's consumer holds at once: a page shows a few a second to a person; RDY
keeps a busy topic from flooding the browser (the ephemeral channel drops what overflows)."""


def register(console: Console) -> None:
    @console.route("GET", "/tail/{topic}")
    async def tail_page(request: Request) -> Response:
        topic = topic_or_404(console, request.params["topic"])
        view = request.query.get("view", "text")
        return console.render(request, "tail.html", topic=topic,
                              view=view if view in VIEWS else "text")  # fmt: skip

    @console.route("GET", "/tail/{topic}/events")
    async def tail_events(request: Request) -> EventStream:
        topic = topic_or_404(console, request.params["topic"])
        view = request.query.get("view", "text")
        view = view if view in VIEWS else "text"
        addresses = [a for a in (n.tcp_address for n, _ in topic.nodes) if a]
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=8))
        channel = f"console{suffix}#ephemeral"
        template = console.env.get_template("tail_message.html")

        async def produce(send: EventSender) -> None:
            try:
                await follow(send)
            except (LmqClientError, ValueError) as exc:
                await send("status", f"stopped: {exc}")

        async def follow(send: EventSender) -> None:
            consumer = Consumer(
                topic.name, channel, addresses,
                lookupd_http_addresses=console.config.lookupd_http_addresses,
                max_in_flight=TAIL_MAX_IN_FLIGHT, max_attempts=0,
                connect_timeout=console.config.timeout_s, close_timeout=1.0,
                transport=console.config.transport,
            )  # fmt: skip
            async with consumer:  # entered once every node was tried
                await send("status", f"live on {len(consumer.connected_addresses)} node(s)")
                async for message in consumer:
                    entry = {
                        "node": message.address, "id": message.id.decode("ascii", "replace"),
                        "offset": None, "timestamp": message.timestamp,
                        "attempts": message.attempts, "priority": message.priority,
                        "headers": message.headers, "deliver_at": None, "deadline": None,
                        "size": len(message.body), "body": render_body(message.body, view),
                    }  # fmt: skip
                    message.finish()
                    await send("message", template.render(m=entry))

        return EventStream(produce)
