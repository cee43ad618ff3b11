"""nsqadmin's pages at nsqadmin's paths: ``/`` (streams), ``/topics/T``, ``/topics/T/C``,
``/nodes``, ``/nodes/N``, ``/counter``, ``/lookup``.

All but the lookup page render the sampler's latest snapshot and ask no daemon anything. Each
page's live part (``#live``) reloads itself every sampling interval with htmx, from the same
URL. The lookup page asks the lookupds (``/topics``, then ``/lookup`` per topic: nsqadmin's
queries) when it is opened, at most once per sampling interval (``?fresh=1``, where the
lookup actions return to, asks again).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

from lmq_client.admin.web.asgi import HTTPException, Request, Response
from lmq_client.admin.web.model import StatRow, TopicRow, channel_row, topic_row
from lmq_client.errors import LmqClientError
from lmq_client.http import HTTPError

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console

__all__ = ["LookupTopic", "register", "topic_or_404"]


@attrs.frozen
class LookupTopic:
    name: str
    channels: list[str]
    producers: list[str]


def topic_or_404(console: Console, name: str) -> TopicRow:
    topic = console.sampler.latest.topics.get(console.name("topic", name))
    if topic is None:
        raise HTTPException(404, f"topic {name} is on no node")
    return topic


def register(console: Console) -> None:
    lookup_cache: dict[str, Any] = {"at": -1.0}

    @console.route("GET", "/")
    async def streams(request: Request) -> Response:
        return console.render(request, "index.html")

    @console.route("GET", "/topics/{topic}")
    async def topic_page(request: Request) -> Response:
        topic = topic_or_404(console, request.params["topic"])
        return console.render(request, "topic.html", topic=topic)

    @console.route("GET", "/topics/{topic}/{channel}")
    async def channel_page(request: Request) -> Response:
        topic = topic_or_404(console, request.params["topic"])
        name = console.name("channel", request.params["channel"])
        for channel in topic.channels:
            if channel.name == name:
                return console.render(request, "channel.html", topic=topic, channel=channel)
        raise HTTPException(404, f"channel {topic.name}/{name} is on no node")

    @console.route("GET", "/nodes")
    async def nodes_page(request: Request) -> Response:
        return console.render(request, "nodes.html")

    @console.route("GET", "/nodes/{node}")
    async def node_page(request: Request) -> Response:
        snapshot = console.sampler.latest
        node = snapshot.node(request.params["node"])
        if node is None:
            raise HTTPException(404, f"node {request.params['node']} is not known")
        topics: list[tuple[str, StatRow, list[tuple[str, StatRow]]]] = []
        clients = 0
        for doc in node.topics:
            name = str(doc["topic_name"])
            row = topic_row(doc, snapshot.rates.get((node.http_address, name, "")))
            clients += row.clients
            channels = [
                (str(c["channel_name"]),
                 channel_row(c, snapshot.rates.get((node.http_address, name,
                                                    str(c["channel_name"])))))
                for c in doc.get("channels") or []
            ]  # fmt: skip
            topics.append((name, row, channels))
        return console.render(request, "node.html", node=node, topics=topics, clients=clients)

    @console.route("GET", "/counter")
    async def counter_page(request: Request) -> Response:
        return console.render(request, "counter.html")

    @console.route("GET", "/lookup")
    async def lookup_page(request: Request) -> Response:
        if not console.config.lookupd_http_addresses:
            raise HTTPException(404, "the console was given no lookupd (--lookupd-http-address)")
        if time.monotonic() - lookup_cache["at"] > console.config.sample_interval_s or (
            request.query.get("fresh")
        ):
            lookup_cache["topics"], lookup_cache["errors"] = await lookup_topics(console)
            lookup_cache["at"] = time.monotonic()
        return console.render(request, "lookup.html", topics=lookup_cache["topics"],
                              errors=lookup_cache["errors"])  # fmt: skip


async def lookup_topics(console: Console) -> tuple[list[LookupTopic], list[str]]:
    """Every topic the lookupds know, with its channels and producers (merged over them)."""
    names: set[str] = set()
    errors: list[str] = []
    lookupds = console.config.lookupd_http_addresses
    for lookupd in lookupds:
        try:
            doc = await console.upstream.lookupd_json(lookupd, "/topics")
            names.update(str(t) for t in (doc or {}).get("topics") or [])
        except LmqClientError as exc:
            errors.append(f"lookupd {lookupd}: {exc}")
    channels: dict[str, set[str]] = {n: set() for n in names}
    producers: dict[str, set[str]] = {n: set() for n in names}

    async def ask(lookupd: str, topic: str) -> None:
        try:
            doc = await console.upstream.lookupd_json(lookupd, "/lookup", {"topic": topic})
        except HTTPError as exc:
            if exc.status != 404:
                errors.append(f"lookupd {lookupd}: {exc}")
            return
        except LmqClientError as exc:
            errors.append(f"lookupd {lookupd}: {exc}")
            return
        channels[topic].update(str(c) for c in (doc or {}).get("channels") or [])
        for p in (doc or {}).get("producers") or []:
            producers[topic].add(f"{p.get('broadcast_address')}:{p.get('http_port')}")

    async with trio.open_nursery() as nursery:
        for lookupd in lookupds:
            for topic in names:
                nursery.start_soon(ask, lookupd, topic)
    return [
        LookupTopic(name=n, channels=sorted(channels[n]), producers=sorted(producers[n]))
        for n in sorted(names)
    ], errors
