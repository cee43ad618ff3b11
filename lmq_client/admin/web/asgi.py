"""The console's HTTP layer on ASGI: requests, responses, routes, under ``--base-path``.

hypercorn does the HTTP; this turns a scope into a ``Request`` (query, cookies, a bounded form
body), finds the route (a regular expression per path, segments percent-decoded by hypercorn so
``%23ephemeral`` arrives as ``#ephemeral``) and sends the handler's ``Response`` or
``EventStream``. Every response carries the security headers of ``security.py``.
"""

from __future__ import annotations

import contextlib
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from http.cookies import SimpleCookie
from typing import Any

import attrs
import trio

__all__ = ["EventSender", "EventStream", "HTTPException", "Request", "Response", "Router"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

MAX_FORM_BYTES = 8 * 1024 * 1024
"""A form's body: the publish form carries a message (lmqd's default --max-msg-size is 1 MiB,
its largest allowed much more); 8 MiB, percent-encoding included, bounds what one request can
make the console hold."""


class HTTPException(Exception):
    """Answer ``status`` with ``message`` as the page's error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    """The browser disconnected while its request body was arriving."""


@attrs.define
class Request:
    method: str
    path: str
    """The path below the base path, decoded."""
    query: dict[str, str]
    headers: dict[str, str]
    """Lower-case names; a repeated header keeps its first value."""
    client: str
    raw_query: str
    receive: Receive
    params: dict[str, str] = attrs.Factory(dict)
    """The route's named groups."""
    session: str = ""
    """The browser's session id (``security.Guard``), set before the handler runs."""
    _form: dict[str, list[str]] | None = None
    _body: bytes | None = None

    @property
    def cookies(self) -> dict[str, str]:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(self.headers.get("cookie", ""))
        except Exception:  # a malformed Cookie header is no cookie
            return {}
        return {k: v.value for k, v in jar.items()}

    async def body(self) -> bytes:
        """The request's body (bounded by ``MAX_FORM_BYTES``; 413 past it)."""
        if self._body is None:
            if int(self.headers.get("content-length", "0") or 0) > MAX_FORM_BYTES:
                raise HTTPException(413, "the request body is too large")
            chunks = bytearray()
            while True:
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunks += message.get("body", b"")
                if len(chunks) > MAX_FORM_BYTES:
                    raise HTTPException(413, "the request body is too large")
                if not message.get("more_body"):
                    break
            self._body = bytes(chunks)
        return self._body

    async def form(self) -> dict[str, list[str]]:
        """The urlencoded body, parsed."""
        if self._form is None:
            try:
                text = (await self.body()).decode("utf-8")
            except UnicodeDecodeError:
                raise HTTPException(400, "the form is not UTF-8") from None
            self._form = urllib.parse.parse_qs(text, keep_blank_values=True)
        return self._form

    async def field(self, name: str, default: str = "") -> str:
        return (await self.form()).get(name, [default])[0]


@attrs.frozen
class Response:
    body: bytes = b""
    status: int = 200
    content_type: str = "text/html; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


EventSender = Callable[[str, str], Awaitable[None]]
"""``send(event, data)``: one server-sent event."""


@attrs.frozen
class EventStream:
    """A ``text/event-stream`` response: ``produce(send)`` sends events until it returns, or is
    cancelled when the browser goes. (A callable rather than an async generator: the producer
    may hold a nursery, which must not stay open across a generator's yield.)"""

    produce: Callable[[EventSender], Awaitable[None]]


def encode_event(event: str, data: str) -> bytes:
    """One server-sent event (every line of ``data`` as its own ``data:`` field)."""
    lines = [f"event: {event}", *(f"data: {line}" for line in data.splitlines() or [""])]
    return ("\n".join(lines) + "\n\n").encode()


Handler = Callable[[Request], Awaitable[Response | EventStream]]


class Router:
    """Routes under a base path: (method, pattern) -> handler."""

    def __init__(self, base_path: str) -> None:
        self.base_path = base_path
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        """``pattern``: a path with ``{name}`` segments (one path segment each)."""
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)
        self._routes.append((method, re.compile(f"^{regex}$"), handler))

    def match(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        allowed = False
        for route_method, regex, handler in self._routes:
            m = regex.match(path)
            if m is None:
                continue
            if route_method == method or (method == "HEAD" and route_method == "GET"):
                return handler, m.groupdict()
            allowed = True
        if allowed:
            raise HTTPException(405, "method not allowed")
        raise HTTPException(404, "no such page")

    def request(self, scope: Scope, receive: Receive) -> Request:
        path = scope["path"]
        if self.base_path:
            if path == self.base_path:
                path = "/"
            elif path.startswith(self.base_path + "/"):
                path = path[len(self.base_path):]
            else:
                raise HTTPException(404, "no such page")
        raw_query = scope.get("query_string", b"").decode("latin-1")
        query = {k: v[0] for k, v in urllib.parse.parse_qs(raw_query).items()}
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        client = scope.get("client") or ("", 0)
        return Request(
            method=scope["method"], path=path, query=query, headers=headers,
            client=str(client[0]), raw_query=raw_query, receive=receive,
        )  # fmt: skip


async def send_response(send: Send, response: Response, extra: Mapping[str, str]) -> None:
    headers = [(b"content-type", response.content_type.encode())]
    headers += [(k.encode(), v.encode()) for k, v in extra.items()]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


async def send_stream(
    send: Send, receive: Receive, stream: EventStream, extra: Mapping[str, str]
) -> None:
    """Send events until they end or the browser goes (an ``http.disconnect``)."""
    headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-store")]  # fmt: skip
    headers += [(k.encode(), v.encode()) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": 200, "headers": headers})

    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            nursery.cancel_scope.cancel()

        async def send_event(event: str, data: str) -> None:
            chunk = encode_event(event, data)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        nursery.start_soon(watch)
        await stream.produce(send_event)
        nursery.cancel_scope.cancel()
    with contextlib.suppress(Exception):  # the browser is gone: nothing to finish
        await send({"type": "http.response.body", "body": b"", "more_body": False})
