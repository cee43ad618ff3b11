"""nsqadmin's actions: create, pause, unpause, empty and delete topics and channels, tombstone a
topic on one node, and create or remove topics and channels in the lookupds.

Each is a POST from a form (CSRF token, read-only and ACL checked first: ``Console.act``),
applied as lmqadmin applies it: create on every node (and in the lookupds, as nsqadmin does),
anything else on the nodes that have the topic; a delete also removes the topic or channel
from the lookupds (a node's unregistration keeps the keys). Then nsqadmin's notification is
sent, the sampler takes a round at once, and the browser is sent back with what happened on
each node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from lmq_client.admin.web.asgi import HTTPException, Request, Response
from lmq_client.errors import LmqClientError

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console

__all__ = ["Actions", "register", "run_on_nodes", "summary"]

PAST = {"create": "created", "delete": "deleted", "empty": "emptied", "pause": "paused",
        "unpause": "unpaused", "tombstone": "tombstoned"}  # fmt: skip
TOPIC_ACTIONS = ("create", "delete", "empty", "pause", "unpause", "tombstone")
CHANNEL_ACTIONS = ("create", "delete", "empty", "pause", "unpause")


async def run_on_nodes(
    console: Console, addresses: list[str], call: Callable[[str], Awaitable[object]]
) -> tuple[list[str], list[str]]:
    """``call(address)`` on each node in turn: (the addresses done, the failures' messages)."""
    done, failed = [], []
    for address in addresses:
        try:
            await call(address)
            done.append(address)
        except LmqClientError as exc:
            failed.append(str(exc))
    return done, failed


def summary(what: str, done: list[str], failed: list[str]) -> str:
    lines = [f"{what} on {', '.join(done)}" if done else f"{what}: no node"]
    lines += failed
    return "\n".join(lines)


class Actions:
    """The actions themselves, shared by the forms (below) and nsqadmin's JSON API
    (``api.py``): each applies one action, sends its notification, samples again, and returns
    the nodes (or lookupds) it was done on and the failures' messages."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.upstream = console.upstream

    async def _on_lookupds(self, path: str, params: dict[str, str]) -> list[str]:
        failed = []
        for lookupd in self.console.config.lookupd_http_addresses:
            try:
                await self.upstream.lookupd_json(lookupd, path, params, method="POST")
            except LmqClientError as exc:
                failed.append(f"lookupd {lookupd}: {exc}")
        return failed

    async def topic(
        self, request: Request, user: str, topic: str, action: str, node: str = ""
    ) -> tuple[list[str], list[str]]:
        """``action`` (TOPIC_ACTIONS) on ``topic``; ``node``: the one to tombstone it on."""
        console, upstream = self.console, self.upstream
        if action not in TOPIC_ACTIONS:
            raise HTTPException(400, f"unknown topic action {action!r}")
        snapshot = console.sampler.latest
        if action == "tombstone":
            target = snapshot.node(node)
            if target is None or not target.broadcast_address:
                raise HTTPException(400, f"node {node!r} is not one the lookupds list")
            lookupd_node = f"{target.broadcast_address}:{target.http_port}"
            failed = await self._on_lookupds("/topic/tombstone",
                                             {"topic": topic, "node": lookupd_node})
            done = [node] if not failed else []
        else:
            addresses = ([n.http_address for n in snapshot.nodes] if action == "create"
                         else [n.http_address for n in snapshot.nodes_with(topic)])  # fmt: skip

            async def call(address: str) -> None:
                await upstream.run(upstream.node(address).topic_action, action, topic)

            done, failed = await run_on_nodes(console, addresses, call)
            if action in ("create", "delete"):
                failed += await self._on_lookupds(f"/topic/{action}", {"topic": topic})
        names = {"tombstone": "tombstone_topic_producer"}
        console.notifier.action(request, user, names.get(action, f"{action}_topic"), topic,
                                node=node if action == "tombstone" else "")  # fmt: skip
        await console.sampler.refresh()
        return done, failed

    async def channel(
        self, request: Request, user: str, topic: str, channel: str, action: str
    ) -> tuple[list[str], list[str]]:
        """``action`` (CHANNEL_ACTIONS) on ``topic``/``channel`` on the nodes with the topic."""
        console, upstream = self.console, self.upstream
        if action not in CHANNEL_ACTIONS:
            raise HTTPException(400, f"unknown channel action {action!r}")
        addresses = [n.http_address for n in console.sampler.latest.nodes_with(topic)]

        async def call(address: str) -> None:
            await upstream.run(upstream.node(address).channel_action, action, topic, channel)

        done, failed = await run_on_nodes(console, addresses, call)
        if action == "delete":
            failed += await self._on_lookupds("/channel/delete",
                                              {"topic": topic, "channel": channel})
        console.notifier.action(request, user, f"{action}_channel", topic, channel)
        await console.sampler.refresh()
        return done, failed

    async def lookup(
        self, request: Request, user: str, topic: str, channel: str, action: str
    ) -> tuple[list[str], list[str]]:
        """Create ``topic`` (and ``channel``) in the lookupds, as nsqadmin does, or remove an
        inactive one from them."""
        if action not in ("create", "delete"):
            raise HTTPException(400, f"unknown lookup action {action!r}")
        notify = self.console.notifier.action
        params = {"topic": topic, **({"channel": channel} if channel else {})}
        failed = []
        if action == "create":
            failed += await self._on_lookupds("/topic/create", {"topic": topic})
            notify(request, user, "create_topic", topic)  # nsqadmin: the topic's, then the
            if channel:  # channel's notification
                failed += await self._on_lookupds("/channel/create", params)
                notify(request, user, "create_channel", topic, channel)
        else:
            kind = "channel" if channel else "topic"
            failed += await self._on_lookupds(f"/{kind}/delete", params)
            notify(request, user, f"delete_{kind}", topic, channel)
        done = list(self.console.config.lookupd_http_addresses) if not failed else []
        return done, failed


def register(console: Console) -> None:
    actions = Actions(console)

    @console.route("POST", "/actions/topic")
    async def topic_action(request: Request) -> Response:
        user = await console.act(request)
        topic = console.name("topic", await request.field("topic"))
        action = await request.field("action")
        done, failed = await actions.topic(request, user, topic, action,
                                           await request.field("node"))  # fmt: skip
        back = "/" if action == "delete" else await request.field("next", "/")
        return console.redirect(request, back, summary(f"{PAST[action]} topic {topic}", done,
                                                       failed))  # fmt: skip

    @console.route("POST", "/actions/channel")
    async def channel_action(request: Request) -> Response:
        user = await console.act(request)
        topic = console.name("topic", await request.field("topic"))
        channel = console.name("channel", await request.field("channel"))
        action = await request.field("action")
        done, failed = await actions.channel(request, user, topic, channel, action)
        back = await request.field("next", f"/topics/{topic}")
        return console.redirect(request, back, summary(
            f"{PAST[action]} channel {topic}/{channel}", done, failed))

    @console.route("POST", "/actions/lookup")
    async def lookup_action(request: Request) -> Response:
        """Create a topic (and channel) in the lookupds, or remove an inactive one."""
        user = await console.act(request)
        topic = console.name("topic", await request.field("topic"))
        channel = await request.field("channel")
        if channel:
            console.name("channel", channel)
        action = await request.field("action")
        done, failed = await actions.lookup(request, user, topic, channel, action)
        what = f"{topic}/{channel}" if channel else topic
        kind = "channel" if channel else "topic"
        return console.redirect(request, "/lookup?fresh=1",
                                summary(f"{PAST[action]} {kind} {what}", done, failed))
