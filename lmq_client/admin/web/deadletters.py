"""Dead letters: ``/dead-letters/T/C`` shows a channel's dead-letter topic (from each node's
``/channel/policy``), how many messages it gave up (``dead_letter_count``, ``expired_count``),
what waits in the dead-letter topic's ``lmq.redrive`` channel with its ``lmq-dead-letter-*``
headers (``/peek``), and redrives all or some of them back into the channel
(``/channel/redrive``, called again until a call moves fewer than asked, as ``lmqadmin channel
redrive`` does), after a confirmation that says how many will move.

lmqd's redrive takes whatever waits in ``lmq.redrive``: a dead-letter topic shared by several
channels gives each of them the others' messages too, and the page says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmq_client.admin.web.asgi import HTTPException, Request, Response
from lmq_client.admin.web.bodies import VIEWS, decode_body, render_body
from lmq_client.admin.web.pages import topic_or_404
from lmq_client.errors import LmqClientError

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console

__all__ = ["REDRIVE_CHANNEL", "register"]

REDRIVE_CHANNEL = "lmq.redrive"
"""lmqd's channel of a dead-letter topic that keeps every dead letter (docs/http.md)."""
REDRIVE_CALL_MAX = 10_000
"""lmqd's bound on one ``/channel/redrive`` (its ``MAX_REDRIVE``)."""
SHOWN = 50


def register(console: Console) -> None:
    upstream = console.upstream

    async def state(topic: str, channel: str, nodes: list[str]) -> list[dict[str, Any]]:
        """Per node: its dead-letter topic, what waits in it, or the error it gave."""
        snapshot = console.sampler.latest
        found = []
        for node in nodes:
            entry: dict[str, Any] = {"node": node, "error": "", "topic": "", "waiting": 0}
            try:
                policy = await upstream.run(upstream.node(node).channel_policy, topic, channel)
            except LmqClientError as exc:
                entry["error"] = str(exc)
                found.append(entry)
                continue
            dead = entry["topic"] = str(policy.get("dead_letter_topic") or "")
            dead_row = snapshot.topics.get(dead) if dead else None
            for redrive in dead_row.channels if dead_row else []:
                if redrive.name == REDRIVE_CHANNEL:
                    entry["waiting"] = sum(
                        row.depth for n, row in redrive.nodes if n.http_address == node
                    )
            found.append(entry)
        return found

    @console.route("GET", "/dead-letters/{topic}/{channel}")
    async def dead_letters(request: Request) -> Response:
        topic = topic_or_404(console, request.params["topic"])
        channel = console.name("channel", request.params["channel"])
        row = next((c for c in topic.channels if c.name == channel), None)
        if row is None:
            raise HTTPException(404, f"channel {topic.name}/{channel} is on no node")
        view = request.query.get("view", "text")
        if view not in VIEWS:
            view = "text"
        nodes = await state(topic.name, channel, [n.http_address for n, _ in topic.nodes])
        messages = []
        for entry in nodes:
            if not entry["topic"] or not entry["waiting"]:
                continue
            try:
                doc = await upstream.run(upstream.node(entry["node"]).peek, entry["topic"],
                                         REDRIVE_CHANNEL, "queued", SHOWN)  # fmt: skip
            except LmqClientError as exc:
                entry["error"] = str(exc)
                continue
            for item in doc.get("messages") or []:
                body = decode_body(item)
                messages.append({
                    "node": entry["node"], "id": item.get("id", ""), "offset": item.get("offset"),
                    "timestamp": item.get("timestamp"), "attempts": item.get("attempts", 0),
                    "priority": item.get("priority") or 0,
                    "headers": dict(item.get("headers") or {}),
                    "deliver_at": item.get("deliver_at"), "deadline": item.get("deadline"),
                    "size": len(body), "body": render_body(body, view),
                })  # fmt: skip
        waiting = sum(e["waiting"] for e in nodes)
        return console.render(request, "deadletters.html", topic=topic, channel=row,
                              nodes=nodes, messages=messages, waiting=waiting,
                              shown=SHOWN)  # fmt: skip

    @console.route("POST", "/dead-letters/{topic}/{channel}")
    async def redrive(request: Request) -> Response:
        user = await console.act(request)
        topic = topic_or_404(console, request.params["topic"])
        channel = console.name("channel", request.params["channel"])
        raw = (await request.field("max")).strip()
        try:
            limit = int(raw) if raw else None
        except ValueError:
            raise HTTPException(400, "max must be a number") from None
        if limit is not None and limit < 1:
            raise HTTPException(400, "max must be at least 1")
        lines = []
        moved_total = 0
        for entry in await state(topic.name, channel, [n.http_address for n, _ in topic.nodes]):
            if entry["error"] or not entry["topic"]:
                lines.append(entry["error"] or f"{entry['node']}: no dead-letter topic")
                continue
            client = upstream.node(entry["node"])
            moved = 0
            try:
                while limit is None or moved_total + moved < limit:
                    left = REDRIVE_CALL_MAX if limit is None else limit - moved_total - moved
                    want = min(REDRIVE_CALL_MAX, left)
                    got = await upstream.run(client.channel_redrive, topic.name, channel,
                                             entry["topic"], want)  # fmt: skip
                    moved += got
                    if got < want:
                        break
            except LmqClientError as exc:
                lines.append(str(exc))
            moved_total += moved
            lines.append(f"{entry['node']}: {moved} from {entry['topic']}")
        console.notifier.action(request, user, "redrive_channel", topic.name, channel)
        await console.sampler.refresh()
        back = f"/dead-letters/{topic.name}/{channel}"
        flash = f"redrove {moved_total} messages into {topic.name}/{channel}\n" + "\n".join(lines)
        return console.redirect(request, back, flash)
