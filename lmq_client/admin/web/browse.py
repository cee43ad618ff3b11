"""The message browser (what nsqadmin never had, NSQ PR #667 never merged).

- ``/browse/T/C``: a channel's queued, deferred or in-flight messages on each node, through
  lmqd's ``/peek`` (read-only: nothing is consumed, no cursor moves), in delivery order, paged
  with ``/peek``'s ``skip``: a page is the same positions of that order on every node.
- ``/browse/T``: a topic's log on one node by offset or time (``/topic/offsets?at=`` then
  ``/topic/read?format=json&ext=1``), paged forward and back; or the messages the topic has
  not handed to its channels yet (``/peek`` of the topic).

Every message shows its id, offset, publish time, attempts, due time or deadline, priority and
headers, and its body as text, pretty JSON or hex (``bodies.py``). The filter (a substring, or
``path.to.key=value`` on a JSON body) applies to what one page read: with a filter a page reads
up to ``SCAN_MAX`` messages to find its matches.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from lmq_client.admin.web.asgi import HTTPException, Request, Response
from lmq_client.admin.web.bodies import VIEWS, BodyFilter, decode_body, render_body
from lmq_client.admin.web.pages import topic_or_404
from lmq_client.errors import LmqClientError

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console

__all__ = ["register"]

PAGE_DEFAULT = 20
PAGE_MAX = 1000
"""lmqd's own bound on ``/peek``'s ``n``."""
SCAN_MAX = 1000
"""Messages one filtered page reads at most (a ``/topic/read`` or ``/peek`` of 1,000 small
messages takes lmqd a few milliseconds)."""
STATES = ("queued", "deferred", "in_flight")
SKIP_MAX = 100_000
"""lmqd's own bound on ``/peek``'s ``skip``."""


def _skip(request: Request) -> int:
    raw = request.query.get("skip", "0").strip() or "0"
    if not raw.isdigit() or int(raw) > SKIP_MAX:
        raise HTTPException(400, f"skip must be a number from 0 to {SKIP_MAX}")
    return int(raw)


def page_step(window: list[int], more: list[bool], n: int, filtered: bool) -> int | None:
    """How far the next page starts after this one (None: this is the last page).

    Per node: ``window`` entries read from the page's start, ``more`` whether any follow them.
    Unfiltered, a page is ``n`` positions. Filtered, a node's part of the page ends after its
    ``n``-th match (``window`` is then that position); the page ends where the first of the
    nodes with more ends, so that no node's match is skipped and none is shown twice (the
    matches after that position wait for the next page)."""
    ahead = [w for w, m in zip(window, more, strict=True) if m]
    if not ahead:
        return None
    return min(ahead) if filtered else n


def _page_size(request: Request) -> int:
    try:
        n = int(request.query.get("n", PAGE_DEFAULT))
    except ValueError:
        raise HTTPException(400, "n must be a number") from None
    return max(1, min(PAGE_MAX, n))


def _entry(node: str, doc: dict[str, Any], body: bytes, view: str) -> dict[str, Any]:
    return {
        "node": node,
        "id": doc.get("id", ""),
        "offset": doc.get("offset"),
        "timestamp": doc.get("timestamp"),
        "attempts": doc.get("attempts", 0),
        "priority": doc.get("priority") or 0,
        "headers": dict(doc.get("headers") or {}),
        "deliver_at": doc.get("deliver_at"),
        "deadline": doc.get("deadline"),
        "size": len(body),
        "body": render_body(body, view),
    }


def register(console: Console) -> None:
    upstream = console.upstream

    def common(request: Request) -> tuple[str, BodyFilter, int]:
        view = request.query.get("view", "text")
        if view not in VIEWS:
            raise HTTPException(400, f"view must be one of {', '.join(VIEWS)}")
        return view, BodyFilter(request.query.get("q", ""), request.query.get("field", "")), (
            _page_size(request))

    @console.route("GET", "/browse/{topic}/{channel}")
    async def channel_messages(request: Request) -> Response:
        topic = topic_or_404(console, request.params["topic"])
        channel = console.name("channel", request.params["channel"])
        view, keep, n = common(request)
        state = request.query.get("state", "queued")
        if state not in STATES:
            raise HTTPException(400, f"state must be one of {', '.join(STATES)}")
        chosen = request.query.get("node", "")
        skip = _skip(request)
        nodes = [node for node, _ in topic.nodes if not chosen or node.http_address == chosen]
        errors = []
        scanned = 0
        found: list[list[tuple[int, dict[str, Any]]]] = []  # per node: (position, entry)
        window: list[int] = []
        more: list[bool] = []
        for node in nodes:
            try:
                doc = await upstream.run(upstream.node(node.http_address).peek, topic.name,
                                         channel, state, SCAN_MAX if keep.active else n, skip)
            except LmqClientError as exc:
                errors.append(str(exc))
                continue
            items = doc.get("messages") or []
            matched: list[tuple[int, dict[str, Any]]] = []
            for position, item in enumerate(items):
                scanned += 1
                body = decode_body(item)
                if keep.matches(body):
                    matched.append((position, _entry(node.http_address, item, body, view)))
                    if len(matched) == n:
                        break
            read = matched[-1][0] + 1 if len(matched) == n else len(items)
            found.append(matched)
            window.append(read)
            more.append(bool(doc.get("more")) or read < len(items))
        step = page_step(window, more, n, keep.active)
        messages = [e for matched in found for p, e in matched if step is None or p < step]
        pages = {
            "skip": skip, "next": skip + step if step is not None else None,
            "previous": max(0, skip - n) if skip and not keep.active else None,
        }  # fmt: skip
        return console.render(
            request, "browse.html", topic=topic, channel=channel, state=state, view=view,
            keep=keep, n=n, node=chosen, messages=messages, errors=errors, scanned=scanned,
            mode="channel", log=None, pages=pages,
        )  # fmt: skip

    @console.route("GET", "/browse/{topic}")
    async def topic_messages(request: Request) -> Response:
        topic = topic_or_404(console, request.params["topic"])
        view, keep, n = common(request)
        mode = request.query.get("mode", "log")
        nodes = [node.http_address for node, _ in topic.nodes]
        chosen = request.query.get("node") or nodes[0]
        if chosen not in nodes:
            raise HTTPException(404, f"topic {topic.name} is not on node {chosen}")
        client = upstream.node(chosen)
        messages: list[dict[str, Any]] = []
        errors: list[str] = []
        scanned = 0
        log: dict[str, Any] | None = None
        try:
            if mode == "queued":
                doc = await upstream.run(client.peek, topic.name, None, "queued",
                                         SCAN_MAX if keep.active else n)  # fmt: skip
                for item in doc.get("messages") or []:
                    scanned += 1
                    body = decode_body(item)
                    if keep.matches(body) and len(messages) < n:
                        messages.append(_entry(chosen, item, body, view))
            elif mode == "log":
                log = await _read_log(console, request, chosen, topic.name, n, keep, view,
                                      messages)  # fmt: skip
                scanned = log["scanned"]
            else:
                raise HTTPException(400, "mode must be log or queued")
        except LmqClientError as exc:
            errors.append(str(exc))
        return console.render(
            request, "browse.html", topic=topic, channel="", state="", view=view, keep=keep,
            n=n, node=chosen, messages=messages, errors=errors, scanned=scanned, mode=mode,
            log=log, pages=None,
        )  # fmt: skip


async def _read_log(
    console: Console, request: Request, node: str, topic: str, n: int, keep: BodyFilter,
    view: str, messages: list[dict[str, Any]],
) -> dict[str, Any]:
    """One page of the topic's log from ``offset`` (or the position ``at`` names)."""
    upstream = console.upstream
    client = upstream.node(node)
    at = request.query.get("at", "").strip()
    offsets = await upstream.run(client.topic_offsets, topic, at or None)
    if "offset" in request.query and request.query["offset"].strip():
        try:
            start = int(request.query["offset"])
        except ValueError:
            raise HTTPException(400, "offset must be a number") from None
    elif at:
        start = int(offsets["offset"])
    else:
        start = max(int(offsets["earliest"]), int(offsets["end"]) - n)
    params = {"topic": topic, "offset": str(max(0, start)),
              "count": str(SCAN_MAX if keep.active else n), "format": "json", "ext": "1"}
    doc = json.loads(await upstream.run(client.request, "GET", "/topic/read", params))
    scanned = 0
    following = int(doc.get("next", start))
    for item in doc.get("messages") or []:
        scanned += 1
        body = decode_body(item, base64_always=True)
        if keep.matches(body):
            messages.append(_entry(node, item, body, view))
            if len(messages) >= n:
                following = int(item["offset"]) + 1
                break
    return {
        "earliest": int(offsets["earliest"]), "end": int(offsets["end"]), "start": start,
        "next": following, "previous": max(int(offsets["earliest"]), start - n),
        "scanned": scanned, "at": at,
    }  # fmt: skip
