"""The policy editor: ``/policy/T`` (retention, TTL, max depth and overflow, publish rate and
burst, dedup window, compression at rest) and ``/policy/T/C`` (max attempts, dead-letter topic,
backoff), read from and written to every node that has the topic through lmqd's
``/topic/policy`` and ``/channel/policy``.

The form shows the first node's effective policy (and says where another node differs). Only
the keys the user changed are sent -- a key a topic never set keeps following the daemon's flag
-- and they go to lmqd as typed: lmqd validates them, and its ``INVALID_POLICY: <key> ...``
answer is shown at that key's field. Nodes are written one after the other; a refusal stops
there (the policy validator is the same on every node, so the first refuses what all would).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmq_client.admin.web.asgi import HTTPException, Request, Response
from lmq_client.admin.web.pages import topic_or_404
from lmq_client.errors import LmqClientError
from lmq_client.http import HTTPError

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console

__all__ = ["CHANNEL_KEYS", "TOPIC_KEYS", "field_of", "register"]

TOPIC_KEYS = {
    "retention_ms": "keep segments every channel has passed this long (ms; 0: not at all)",
    "retention_bytes": "keep up to this many bytes of such segments (0: none)",
    "ttl_ms": "give up messages not delivered this long after their publish (ms; 0: no TTL)",
    "max_depth": "most messages any channel may have waiting (0: unbounded)",
    "overflow": "at max_depth: reject the publish, or drop the oldest",
    "publish_rate": "messages per second accepted (0: no limit)",
    "publish_burst": "messages accepted at once above the rate (0: the rate)",
    "dedup_window_ms": "an equal body within this many ms is stored once (0: off)",
    "compression": "how the log's new batches are compressed at rest: none, zstd[:LEVEL], lz4, "
    "snappy, gzip[:LEVEL]",
    "min_insync_mirrors": "mirrors that must store a publish before its OK (0: none)",
}
CHANNEL_KEYS = {
    "max_attempts": "deliveries before a message is given up (0: unlimited)",
    "dead_letter_topic": "where given-up messages go (empty: dropped)",
    "backoff_ms": "server-side delay before a timed-out or REQ 0 message returns (ms)",
    "backoff_max_ms": "the cap of that delay, doubling per attempt (ms; 0: one hour)",
    "backoff_jitter": "fraction of the delay taken off at random, 0 to 1",
}
TEXT_KEYS = ("overflow", "dead_letter_topic", "compression")


def field_of(message: str, keys: list[str]) -> str:
    """The key lmqd's ``INVALID_POLICY: <why>`` is about ("" if none)."""
    why = message.partition(":")[2].strip()
    for key in keys:
        if why.startswith(f"{key} ") or why.startswith(f"unknown key '{key}'"):
            return key
    return ""


def _typed(key: str, text: str) -> Any:
    """What the form's text means in JSON; lmqd refuses what it should not be."""
    if key in TEXT_KEYS:
        return text
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def register(console: Console) -> None:
    upstream = console.upstream

    async def read(nodes: list[str], topic: str, channel: str) -> tuple[dict[str, Any], list[str]]:
        """The first node's policy and a line per node that differs or fails."""
        first: dict[str, Any] | None = None
        notes = []
        for node in nodes:
            client = upstream.node(node)
            try:
                policy = await (upstream.run(client.channel_policy, topic, channel) if channel
                                else upstream.run(client.topic_policy, topic))  # fmt: skip
            except LmqClientError as exc:
                notes.append(str(exc))
                continue
            if first is None:
                first = policy
            elif policy != first:
                shown = ", ".join(f"{k}={v}" for k, v in policy.items() if first.get(k) != v)
                notes.append(f"{node} differs: {shown}")
        return first or {}, notes

    async def page(request: Request, channel: str) -> Response:
        topic = topic_or_404(console, request.params["topic"])
        if channel:
            console.name("channel", channel)
        nodes = [n.http_address for n, _ in topic.nodes]
        keys = CHANNEL_KEYS if channel else TOPIC_KEYS
        current, notes = await read(nodes, topic.name, channel)
        values = {k: str(current.get(k, "")) for k in keys}
        errors: dict[str, str] = {}
        status = 200
        if request.method == "POST":
            user = await console.act(request)
            form = {k: (await request.field(k)).strip() for k in keys}
            changes = {k: _typed(k, v) for k, v in form.items() if v != values[k]}
            values.update(form)
            done = []
            for node in nodes if changes else []:
                client = upstream.node(node)
                try:
                    if channel:
                        await upstream.run(client.channel_policy, topic.name, channel, changes)
                    else:
                        await upstream.run(client.topic_policy, topic.name, changes)
                    done.append(node)
                except HTTPError as exc:
                    errors[field_of(exc.message, list(keys))] = f"{node}: {exc.message}"
                    break
                except LmqClientError as exc:
                    errors[""] = str(exc)
                    break
            if not errors:
                kind = "channel" if channel else "topic"
                console.notifier.action(request, user, f"{kind}_policy", topic.name, channel)
                what = f"{topic.name}/{channel}" if channel else topic.name
                shown = ", ".join(f"{k}={v}" for k, v in changes.items()) or "nothing changed"
                target = "/policy/" + "/".join(p for p in (topic.name, channel) if p)
                return console.redirect(request, target, f"policy of {what}: {shown} on "
                                        f"{', '.join(done) or 'no node'}")
            status = 400
        return console.render(request, "policy.html", status=status, topic=topic,
                              channel=channel, keys=keys, values=values, errors=errors,
                              notes=notes)  # fmt: skip

    @console.route("GET", "/policy/{topic}")
    async def topic_policy(request: Request) -> Response:
        return await page(request, "")

    @console.route("POST", "/policy/{topic}")
    async def set_topic_policy(request: Request) -> Response:
        return await page(request, "")

    @console.route("GET", "/policy/{topic}/{channel}")
    async def channel_policy(request: Request) -> Response:
        return await page(request, request.params["channel"])

    @console.route("POST", "/policy/{topic}/{channel}")
    async def set_channel_policy(request: Request) -> Response:
        if not any(c.name == request.params["channel"]
                   for c in topic_or_404(console, request.params["topic"]).channels):
            raise HTTPException(404, "no such channel")
        return await page(request, request.params["channel"])
