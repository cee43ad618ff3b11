"""nsqadmin's JSON API at its paths, for the scripts operators wrote against nsqadmin.

Reads (from the sampler's snapshot, like the pages): ``GET /api/topics``,
``/api/topics/T``, ``/api/topics/T/C``, ``/api/nodes``, ``/api/nodes/N``, ``/api/counter``,
in nsqadmin's shapes, key for key as nsqadmin 1.3.0 answers them (``clusterinfo``'s
``TopicStats``, ``ChannelStats``, ``ClientStats``, ``Producer``: a topic or channel summed over
nodes as ``node: "*"`` with one entry per node in ``nodes``; the counter's
``"topic:channel:node"`` map). Actions (``actions.Actions``, as the forms): ``POST /api/topics``
(``{"topic", "channel"}``: create in the lookupds, as nsqadmin), ``POST /api/topics/T[/C]``
(``{"action": "pause"|"unpause"|"empty"}``), ``DELETE /api/topics/T[/C]``,
``DELETE /api/nodes/N`` (``{"topic"}``: tombstone). Answers ``{"message": ""}`` or
``{"message": "<error>"}`` with nsqadmin's statuses (403 ``FORBIDDEN``, 400 ``INVALID_...``).

An action needs a JSON body (``Content-Type: application/json``) or the DELETE method -- both
of which a browser sends across origins only after a CORS preflight this API never grants, which
is its CSRF protection -- and passes the same read-only and ACL checks as the pages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lmq_client.admin.web.actions import Actions
from lmq_client.admin.web.asgi import HTTPException, Request, Response
from lmq_client.admin.web.model import ChannelRow, ClientRow, Node, StatRow, TopicRow

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console

__all__ = ["register"]


def reply(data: Mapping[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(data).encode(), status=status, content_type="application/json")


def _e2e(row: StatRow, topic: str = "", channel: str = "", host: str = "") -> dict[str, Any]:
    return {"count": 1 if row.e2e else 0,
            "percentiles": [{"quantile": q, "value": v} for q, v in row.e2e] or None,
            "topic": topic, "channel": channel, "host": host}  # fmt: skip


def _client(client: ClientRow) -> dict[str, Any]:
    return {
        "node": client.node.http_address, "remote_address": client.remote_address,
        "version": client.version, "client_id": client.client_id, "hostname": client.hostname,
        "user_agent": client.user_agent, "connected": int(client.connected_for_s * 1e9),
        "in_flight_count": client.in_flight, "ready_count": client.ready,
        "finish_count": client.finished, "requeue_count": client.requeued,
        "message_count": client.messages, "deflate": client.deflate, "snappy": client.snappy,
        "authed": client.authed, "auth_identity": client.auth_identity, "tls": client.tls,
        "tls_version": client.tls_version,
    }  # fmt: skip


def _channel(channel: ChannelRow, node: Node | None, row: StatRow) -> dict[str, Any]:
    """nsqadmin's ``ChannelStats``: one node's (``node``), or the sum (``node: "*"``) with the
    per-node entries in ``nodes``."""
    clients = [c for c in channel.clients if node is None or c.node is node]
    return {
        "node": node.http_address if node else "*", "hostname": node.hostname if node else "",
        "topic_name": channel.topic, "channel_name": channel.name, "depth": row.depth,
        "memory_depth": row.memory_depth, "backend_depth": row.backend_depth,
        "in_flight_count": row.in_flight, "deferred_count": row.deferred,
        "requeue_count": row.requeued, "timeout_count": row.timed_out,
        "message_count": row.messages, "client_count": row.clients,
        "nodes": None if node else [_channel(channel, n, r) for n, r in channel.nodes],
        "clients": [_client(c) for c in clients], "paused": row.paused,
        "e2e_processing_latency": _e2e(row, *((channel.topic, channel.name, "*") if node is None
                                              else ("", "", ""))),
    }  # fmt: skip


def _topic(topic: TopicRow, node: Node | None, row: StatRow) -> dict[str, Any]:
    """nsqadmin's ``TopicStats``, the same way."""
    if node is None:
        channels = [_channel(c, None, c.total) for c in topic.channels]
    else:
        channels = [_channel(c, node, r) for c in topic.channels for n, r in c.nodes if n is node]
    return {
        "node": node.http_address if node else "*", "hostname": node.hostname if node else "",
        "topic_name": topic.name, "depth": row.depth, "memory_depth": row.memory_depth,
        "backend_depth": row.backend_depth, "message_count": row.messages,
        "nodes": None if node else [_topic(topic, n, r) for n, r in topic.nodes],
        "channels": channels, "paused": row.paused,
        "e2e_processing_latency": _e2e(row, *((topic.name, "", "*") if node is None
                                              else ("", "", ""))),
    }  # fmt: skip


def producer_doc(node: Node) -> dict[str, Any]:
    return {
        "remote_addresses": [node.http_address], "remote_address": node.http_address,
        "hostname": node.hostname, "broadcast_address": node.broadcast_address,
        "tcp_port": node.tcp_port, "http_port": node.http_port, "version": node.version,
        "topics": [{"topic": str(t["topic_name"]), "tombstoned": t["topic_name"] in node.tombstoned}
                   for t in node.topics],
        "out_of_date": False,
    }  # fmt: skip


def register(console: Console) -> None:
    actions = Actions(console)

    def topic_or_404(name: str) -> TopicRow:
        topic = console.sampler.latest.topics.get(name)
        if topic is None:
            raise HTTPException(404, "TOPIC_NOT_FOUND")
        return topic

    async def acting(request: Request) -> tuple[str, dict[str, Any]]:
        """The user, and the JSON body, of an API action allowed to act."""
        if console.guard.refusal(request) is not None:
            raise HTTPException(403, "FORBIDDEN")
        body: dict[str, Any] = {}
        content_type = request.headers.get("content-type", "")
        if request.method == "POST" and not content_type.startswith("application/json"):
            raise HTTPException(415, "UNSUPPORTED_MEDIA_TYPE: send application/json")
        raw = await request.body()
        if raw.strip():
            try:
                decoded = json.loads(raw)
            except ValueError:
                raise HTTPException(400, "MALFORMED_BODY") from None
            if not isinstance(decoded, dict):
                raise HTTPException(400, "MALFORMED_BODY")
            body = decoded
        return console.guard.user(request), body

    def result(done: list[str], failed: list[str]) -> Response:
        if failed and not done:
            return reply({"message": f"UPSTREAM_ERROR: {'; '.join(failed)}"}, 502)
        return reply({"message": "; ".join(f"Partial error: {f}" for f in failed)})

    @console.route("GET", "/api/topics")
    async def topics(request: Request) -> Response:
        return reply({"topics": list(console.sampler.latest.topics), "message": ""})

    @console.route("GET", "/api/topics/{topic}")
    async def topic(request: Request) -> Response:
        found = topic_or_404(request.params["topic"])
        return reply({**_topic(found, None, found.total), "message": ""})

    @console.route("GET", "/api/topics/{topic}/{channel}")
    async def channel(request: Request) -> Response:
        found = topic_or_404(request.params["topic"])
        for row in found.channels:
            if row.name == request.params["channel"]:
                return reply({**_channel(row, None, row.total), "message": ""})
        raise HTTPException(404, "CHANNEL_NOT_FOUND")

    @console.route("GET", "/api/nodes")
    async def nodes(request: Request) -> Response:
        return reply({"nodes": [producer_doc(n) for n in console.sampler.latest.nodes],
                      "message": ""})  # fmt: skip

    @console.route("GET", "/api/nodes/{node}")
    async def node(request: Request) -> Response:
        snapshot = console.sampler.latest
        found = snapshot.node(request.params["node"])
        if found is None:
            raise HTTPException(404, "NODE_NOT_FOUND")
        stats = [_topic(t, n, r) for t in snapshot.topics.values() for n, r in t.nodes
                 if n is found]  # fmt: skip
        return reply({
            "node": found.http_address, "topics": stats,
            "total_messages": sum(t["message_count"] for t in stats),
            "total_clients": sum(len(c["clients"]) for t in stats for c in t["channels"]),
            "message": "",
        })  # fmt: skip

    @console.route("GET", "/api/counter")
    async def counter(request: Request) -> Response:
        stats = {
            f"{t.name}:{c.name}:{n.http_address}": {
                "node": n.http_address, "topic_name": t.name, "channel_name": c.name,
                "message_count": r.messages,
            }
            for t in console.sampler.latest.topics.values() for c in t.channels
            for n, r in c.nodes
        }  # fmt: skip
        return reply({"stats": stats, "message": ""})

    @console.route("POST", "/api/topics")
    async def create(request: Request) -> Response:
        user, body = await acting(request)
        name = console.name("topic", str(body.get("topic", "")))
        channel_name = str(body.get("channel") or "")
        if channel_name:
            console.name("channel", channel_name)
        if console.config.lookupd_http_addresses:
            return result(*await actions.lookup(request, user, name, channel_name, "create"))
        done, failed = await actions.topic(request, user, name, "create")
        if channel_name:
            more = await actions.channel(request, user, name, channel_name, "create")
            failed += more[1]
        return result(done, failed)

    def posted_action(body: Mapping[str, Any]) -> str:
        action = str(body.get("action", ""))
        if action not in ("pause", "unpause", "empty"):
            raise HTTPException(400, "INVALID_ACTION")
        return action

    @console.route("POST", "/api/topics/{topic}")
    async def topic_post(request: Request) -> Response:
        user, body = await acting(request)
        return result(*await actions.topic(request, user, request.params["topic"],
                                           posted_action(body)))  # fmt: skip

    @console.route("DELETE", "/api/topics/{topic}")
    async def topic_delete(request: Request) -> Response:
        user, _ = await acting(request)
        return result(*await actions.topic(request, user, request.params["topic"], "delete"))

    @console.route("POST", "/api/topics/{topic}/{channel}")
    async def channel_post(request: Request) -> Response:
        user, body = await acting(request)
        return result(*await actions.channel(request, user, request.params["topic"],
                                             request.params["channel"], posted_action(body)))

    @console.route("DELETE", "/api/topics/{topic}/{channel}")
    async def channel_delete(request: Request) -> Response:
        user, _ = await acting(request)
        return result(*await actions.channel(request, user, request.params["topic"],
                                             request.params["channel"], "delete"))

    @console.route("DELETE", "/api/nodes/{node}")
    async def tombstone(request: Request) -> Response:
        user, body = await acting(request)
        name = console.name("topic", str(body.get("topic", "")))
        return result(*await actions.topic(request, user, name, "tombstone",
                                           request.params["node"]))
