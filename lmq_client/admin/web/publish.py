"""The publish form: ``/publish/T`` publishes one message to one node through its ``/pub``,
with lmq's per-message fields (headers as ``Lmq-Header-*``, ``priority``, ``ttl_ms``,
``dedup_id``) and nsqd's ``defer``. lmqd validates every field; its error (``INVALID_PRIORITY``,
``INVALID_HEADER``...) is shown at the field it names."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from lmq_client.admin.web.asgi import HTTPException, Request, Response
from lmq_client.admin.web.pages import topic_or_404
from lmq_client.errors import LmqClientError
from lmq_client.http import HTTPClient, HTTPError

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console

__all__ = ["parse_headers", "register"]

FIELDS = ("body", "headers", "priority", "ttl_ms", "defer", "dedup_id")
ERROR_FIELDS = {
    "INVALID_PRIORITY": "priority", "INVALID_TTL_MS": "ttl_ms", "INVALID_DEDUP_ID": "dedup_id",
    "INVALID_HEADER": "headers", "INVALID_DEFER": "defer", "MSG_EMPTY": "body",
    "MSG_TOO_BIG": "body",
}  # fmt: skip


def parse_headers(text: str) -> dict[str, str]:
    """``name: value`` lines (blank lines skipped) -> headers; ValueError naming a bad line."""
    headers = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"line {number}: want name: value")
        headers[name.strip().lower()] = value.strip()
    return headers


def register(console: Console) -> None:
    upstream = console.upstream

    @console.route("GET", "/publish/{topic}")
    async def publish_form(request: Request) -> Response:
        topic = topic_or_404(console, request.params["topic"])
        values = dict.fromkeys(FIELDS, "")
        return console.render(request, "publish.html", topic=topic, values=values, errors={},
                              node=topic.nodes[0][0].http_address)  # fmt: skip

    @console.route("POST", "/publish/{topic}")
    async def publish(request: Request) -> Response:
        user = await console.act(request)
        del user  # publishing is no admin action: nsqadmin sends no notification for it
        topic = topic_or_404(console, request.params["topic"])
        values = {f: await request.field(f) for f in FIELDS}
        node = await request.field("node")
        if node not in [n.http_address for n, _ in topic.nodes]:
            raise HTTPException(400, f"topic {topic.name} is not on node {node!r}")
        errors: dict[str, str] = {}
        params = {"topic": topic.name}
        for key in ("priority", "ttl_ms", "defer", "dedup_id"):
            if values[key].strip():
                params[key] = values[key].strip()
        headers: dict[str, str] = {}
        try:
            headers = {f"Lmq-Header-{k}": v for k, v in parse_headers(values["headers"]).items()}
        except ValueError as exc:
            errors["headers"] = str(exc)
        if not errors:
            url = f"http://{node}/pub?{urllib.parse.urlencode(params)}"
            body = values["body"].replace("\r\n", "\n").encode()
            try:
                await upstream.run(HTTPClient.fetch, url, address=node, method="POST",
                                   body=body, headers=headers,
                                   options=upstream.options)  # fmt: skip
            except HTTPError as exc:
                errors[ERROR_FIELDS.get(exc.message, "")] = f"{node}: {exc.message}"
            except LmqClientError as exc:
                errors[""] = str(exc)
        if errors:
            return console.render(request, "publish.html", status=400, topic=topic,
                                  values=values, errors=errors, node=node)  # fmt: skip
        await console.sampler.refresh()
        return console.redirect(request, f"/publish/{topic.name}",
                                f"published 1 message to {topic.name} on {node}")
