"""Replay: point a channel (new or existing) at an earlier offset or time, after a confirmation
that says how many messages will be delivered.

``GET /replay/T?channel=C&to=POS&preview=1`` asks every node that has the topic where ``POS``
is (``/topic/offsets?at=``) and counts the messages its log stores from there to its end
(``/topic/read``, which skips offsets never written or lost), up to ``COUNT_MAX`` a node; the
page states the total and the range per node. The POST then creates the channel there
(``/channel/create?from=``) or moves it (``/channel/seek?to=``) on each node: those messages are
delivered to it -- again, for the ones it had already had -- besides whatever it still holds
(its in-flight, requeued and deferred messages stay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from lmq_client.admin.web.actions import run_on_nodes, summary
from lmq_client.admin.web.asgi import HTTPException, Request, Response
from lmq_client.admin.web.pages import topic_or_404
from lmq_client.errors import LmqClientError

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console
    from lmq_client.admin.web.upstream import Upstream

__all__ = ["NodePlan", "register"]

COUNT_MAX = 200_000
"""Messages counted per node before the page says "at least": twenty ``/topic/read`` calls of
10,000 small messages; a bigger range is announced as its offsets' span, as an upper bound."""
READ_COUNT = 10_000
"""lmqd's own bound on one ``/topic/read``."""


@attrs.frozen
class NodePlan:
    node: str
    start: int
    end: int
    count: int
    exact: bool
    error: str = ""


async def count_stored(upstream: Upstream, node: str, topic: str, start: int, end: int
                       ) -> tuple[int, bool]:  # fmt: skip
    """Messages the node's log stores in ``[start, end)``, and whether that is exact."""
    client = upstream.node(node)
    counted = 0
    offset = start
    while offset < end:
        if counted >= COUNT_MAX:
            return counted, False
        messages, following = await upstream.run(client.read, topic, offset, READ_COUNT, end)
        counted += len(messages)
        if following <= offset:
            break
        offset = following
    return counted, True


async def plan(console: Console, topic: str, nodes: list[str], to: str) -> list[NodePlan]:
    plans = []
    for node in nodes:
        try:
            offsets = await console.upstream.run(console.upstream.node(node).topic_offsets,
                                                 topic, to)  # fmt: skip
            start, end = int(offsets["offset"]), int(offsets["end"])
            count, exact = await count_stored(console.upstream, node, topic, start, end)
            plans.append(NodePlan(node=node, start=start, end=end, count=count, exact=exact))
        except LmqClientError as exc:
            plans.append(NodePlan(node=node, start=0, end=0, count=0, exact=False,
                                  error=str(exc)))  # fmt: skip
    return plans


def register(console: Console) -> None:
    upstream = console.upstream

    @console.route("GET", "/replay/{topic}")
    async def replay_form(request: Request) -> Response:
        topic = topic_or_404(console, request.params["topic"])
        channel = request.query.get("channel", "").strip()
        to = request.query.get("to", "").strip()
        plans: list[NodePlan] = []
        if channel:
            console.name("channel", channel)
        if request.query.get("preview") and channel and to:
            plans = await plan(console, topic.name, [n.http_address for n, _ in topic.nodes], to)
        exists = any(c.name == channel for c in topic.channels)
        context: dict[str, Any] = dict(
            topic=topic, channel=channel, to=to, plans=plans, exists=exists,
            total=sum(p.count for p in plans), exact=all(p.exact for p in plans),
            failed=[p for p in plans if p.error],
        )  # fmt: skip
        return console.render(request, "replay.html", **context)

    @console.route("POST", "/replay/{topic}")
    async def replay(request: Request) -> Response:
        user = await console.act(request)
        topic = topic_or_404(console, request.params["topic"])
        channel = console.name("channel", await request.field("channel"))
        to = (await request.field("to")).strip()
        if not to:
            raise HTTPException(400, "say where to replay from")
        exists = any(c.name == channel for c in topic.channels)
        nodes = [n.http_address for n, _ in topic.nodes]
        offsets: dict[str, int] = {}

        async def call(address: str) -> None:
            client = upstream.node(address)
            if exists:
                offsets[address] = await upstream.run(client.channel_seek, topic.name, channel,
                                                      to)  # fmt: skip
            else:
                await upstream.run(client.channel_action, "create", topic.name, channel,
                                   start=to)  # fmt: skip

        done, failed = await run_on_nodes(console, nodes, call)
        console.notifier.action(request, user, "replay_channel", topic.name, channel)
        await console.sampler.refresh()
        what = (f"moved channel {topic.name}/{channel} to {to}" if exists
                else f"created channel {topic.name}/{channel} from {to}")  # fmt: skip
        announced = await request.field("announced")
        if announced:
            what += f" ({announced} messages announced)"
        target = f"/topics/{topic.name}/{channel}"
        return console.redirect(request, target, summary(what, done, failed))
