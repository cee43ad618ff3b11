"""The thin layer between hypercorn and the endpoints: requests, responses, routing, nsqd's rules.

hypercorn's trio worker does all HTTP parsing and framing; this module turns an ASGI ``http``
scope into a ``Request``, routes it like nsqd's httprouter (exact paths plus ``/config/:opt``,
405 with an ``Allow`` header for a known path and another method, a trailing-slash redirect,
404 otherwise) and sends the handler's ``Response``.

Responses follow nsqd's ``http_api.RespondV1`` (nsq-reference §2.1): a 200 with text is the text
(``OK``), a 200 with nothing is an empty body, structured data is compact JSON with
``Content-Type: application/json; charset=utf-8``; an error is ``{"message":"<TEXT>"}`` with its
status; every V1 response carries ``X-NSQ-Content-Type: nsq; version=1.0``. Bodies that are not
JSON get ``text/plain; charset=utf-8``, which is what Go's content sniffing gives them.

Query strings are parsed as Go's ``url.ParseQuery`` does (``&`` separated, ``+`` is a space, a
bad ``%`` escape or a ``;`` is an error that nsqd answers ``400 INVALID_REQUEST``), and only the
query string carries parameters, never a form body.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import attrs
import trio

from lmqd.gohttp import parse_query

log = logging.getLogger("lmqd.httpapi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
_V1_HEADER = (b"x-nsq-content-type", b"nsq; version=1.0")


class HttpError(Exception):
    """An nsqd error response: ``status`` and the ``message`` text (``TOPIC_NOT_FOUND``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    """The client disconnected before its request body arrived: nothing to answer."""


@attrs.frozen
class Response:
    """What a handler returns; ``content_type`` None means plain text."""

    status: int
    body: bytes = b""
    content_type: str | None = None
    v1: bool = True
    """Send ``X-NSQ-Content-Type`` (every nsqd endpoint but ``/ping`` and ``/debug``)."""
    headers: tuple[tuple[str, str], ...] = ()


OK = Response(200, b"OK")
EMPTY = Response(200)


def go_json(value: Any) -> bytes:
    """Compact JSON as Go's ``encoding/json`` writes it: integral floats have no ``.0``
    (Go prints ``float64(5)`` as ``5``), non-ASCII stays UTF-8."""
    return json.dumps(_go_floats(value), separators=(",", ":"), ensure_ascii=False).encode()


def _go_floats(value: Any) -> Any:
    if isinstance(value, float):
        # Go switches to exponent form at 1e21; below that an integral float prints as an int.
        if value.is_integer() and abs(value) < 1e21:
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: _go_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_go_floats(v) for v in value]
    return value


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, go_json(value), JSON_CONTENT_TYPE)


def error_response(status: int, message: str) -> Response:
    return json_response({"message": message}, status)


class Query:
    """Parsed query parameters: ``get`` is nsqd's ``ReqParams.Get`` (the first value)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, list[str]]) -> None:
        self._values = values

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def get(self, key: str) -> str | None:
        """The first value of ``key``, or None if the key is absent (``""`` if present empty)."""
        values = self._values.get(key)
        return values[0] if values else None


# -- requests ----------------------------------------------------------------------------------


LMQ_HEADER_PREFIX = b"lmq-header-"


class Request:
    """One HTTP request as the handlers see it."""

    __slots__ = ("_query", "_receive", "accept", "content_length", "lmq_headers", "method",
                 "path", "path_params", "raw_query", "remote")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.raw_query: bytes = scope.get("query_string", b"")
        client = scope.get("client")
        self.remote = f"{client[0]}:{client[1]}" if client else "-"
        self.content_length: int | None = None
        self.accept = ""
        self.lmq_headers: list[tuple[bytes, bytes]] = []
        """``Lmq-Header-<name>: <value>`` request headers (lmq's message headers for /pub and
        /mpub), as (name after the prefix, value), names lowercase as h11 gives them."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                # h11 has already rejected a malformed or conflicting Content-Length.
                self.content_length = int(value)
            elif name == b"accept":
                self.accept = value.decode("latin-1")
            elif name.startswith(LMQ_HEADER_PREFIX):
                self.lmq_headers.append((name[len(LMQ_HEADER_PREFIX) :], value))
        self.path_params: dict[str, str] = {}
        self._receive = receive
        self._query: Query | None = None

    @property
    def uri(self) -> str:
        return self.path + ("?" + self.raw_query.decode("latin-1") if self.raw_query else "")

    def query(self) -> Query:
        """The parsed query string; raises ``QueryError``."""
        if self._query is None:
            self._query = Query(parse_query(self.raw_query))
        return self._query

    async def read_body(self, limit: int) -> bytes:
        """The body, but never more than ``limit`` bytes (the rest is left unread; hypercorn
        then closes the connection after the response). Callers pass ``max + 1`` so that a
        result of ``limit`` bytes means "too big", as nsqd's ``io.LimitReader`` idiom does."""
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            if chunk:
                chunk = chunk[: limit - size]
                chunks.append(chunk)
                size += len(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


Handler = Callable[[Request], Awaitable[Response]]


class Router:
    """nsqd's routes: exact paths, plus one-segment parameters written ``/config/:opt``."""

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Handler]] = {}
        self._params: list[tuple[str, str, dict[str, Handler]]] = []  # (prefix, name, methods)

    def add(self, method: str, path: str, handler: Handler) -> None:
        head, sep, param = path.rpartition("/:")
        if sep:
            for prefix, name, methods in self._params:
                if prefix == head + "/" and name == param:
                    methods[method] = handler
                    return
            self._params.append((head + "/", param, {method: handler}))
        else:
            self._exact.setdefault(path, {})[method] = handler

    def _methods(self, path: str) -> tuple[dict[str, Handler], dict[str, str]] | None:
        methods = self._exact.get(path)
        if methods is not None:
            return methods, {}
        for prefix, name, methods in self._params:
            if path.startswith(prefix):
                value = path[len(prefix):]
                if value and "/" not in value:
                    return methods, {name: value}
        return None

    def resolve(self, request: Request) -> Handler | Response:
        """The handler for ``request``, or the response httprouter would give instead."""
        found = self._methods(request.path)
        if found is None:
            # httprouter's RedirectTrailingSlash: 301 for GET, 307 for other methods.
            other = request.path[:-1] if request.path.endswith("/") else request.path + "/"
            if len(other) > 0 and self._methods(other) is not None:
                location = other + ("?" + request.raw_query.decode("latin-1")
                                    if request.raw_query else "")
                code = 301 if request.method == "GET" else 307
                return Response(code, v1=False, headers=(("location", location),))
            return error_response(404, "NOT_FOUND")
        methods, params = found
        handler = methods.get(request.method)
        if handler is not None:
            request.path_params = params
            return handler
        # httprouter lists the methods with OPTIONS added, sorted.
        allow = ", ".join(sorted({*methods, "OPTIONS"}))
        if request.method == "OPTIONS":
            return Response(200, v1=False, headers=(("allow", allow),))
        response = error_response(405, "METHOD_NOT_ALLOWED")
        return attrs.evolve(response, headers=(("allow", allow),))


class AsgiApp:
    """An ASGI application that routes to nsqd-style handlers (subclassed by ``HttpApi``)."""

    def __init__(self) -> None:
        self.router = Router()
        self.quiet_paths: frozenset[str] = frozenset()
        """Paths not logged per request (nsqd does not log /pub and /mpub: the hot path)."""
        self.debug_paths: frozenset[str] = frozenset()
        """Paths whose request lines are logged at DEBUG, not INFO (polled by machines)."""
        self.refusal: Response | None = None
        """If set, the answer to every request (nsqd's ``TLS_REQUIRED`` on plain HTTP)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        # Anything else (websocket) is not part of nsqd's API: returning makes hypercorn refuse.

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        request = Request(scope, receive)
        try:
            target = self.refusal or self.router.resolve(request)
            response = target if isinstance(target, Response) else await target(request)
        except HttpError as exc:
            response = error_response(exc.status, exc.message)
        except ClientGone:
            log.debug("HTTP: %s %s (%s): client went away", request.method, request.uri,
                      request.remote)
            return
        except Exception:
            # nsqd's PanicHandler: never let a bug take the server down, answer 500.
            log.exception("HTTP: %s %s (%s): internal error", request.method, request.uri,
                          request.remote)
            response = error_response(500, "INTERNAL_ERROR")
        if request.path not in self.quiet_paths:
            level = logging.DEBUG if request.path in self.debug_paths else logging.INFO
            log.log(level, "%d %s %s (%s) %.3fms", response.status, request.method, request.uri,
                    request.remote, (time.perf_counter() - start) * 1000)
        try:
            await send_response(send, response)
        except (trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError):
            # The client hung up as soon as it had the whole response: hypercorn's reader then
            # half-closes the socket (outside its send lock) while the final, empty
            # end-of-message write is still due, and that write fails. Nothing was lost.
            log.debug("HTTP: %s %s (%s): client closed during the response", request.method,
                      request.uri, request.remote)


async def send_response(send: Send, response: Response) -> None:
    headers = [
        (b"content-type",
         (response.content_type or TEXT_CONTENT_TYPE).encode("latin-1")),
        (b"content-length", b"%d" % len(response.body)),
    ]
    if response.v1:
        headers.append(_V1_HEADER)
    headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers)
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
