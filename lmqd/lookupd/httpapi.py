"""nsqlookupd's HTTP API as an ASGI application: routing, query strings and responses as Go's.

``views.py`` decides what each endpoint answers; this module is the HTTP around it, as
nsqlookupd v1.3.0 does it (``nsqlookupd/http.go``, ``internal/http_api``, httprouter v1.3.0):

- Routing is httprouter's: exact paths per method; a path that exists with another method is
  ``405 {"message":"METHOD_NOT_ALLOWED"}`` with ``Allow`` (the methods, ``OPTIONS`` added,
  sorted); ``OPTIONS`` on a known path is 200 with ``Allow`` and no body; a path that exists
  only with (or without) a trailing slash, or only in another case or uncleaned form
  (``/LOOKUP``, ``//lookup``), is redirected -- 301 for GET, 307 otherwise -- with the query
  kept; anything else is ``404 {"message":"NOT_FOUND"}``. HEAD is not routed (405, as in
  nsqlookupd; hypercorn leaves the body out).
- Responses are ``http_api.RespondV1``'s: data as compact JSON with ``Content-Type:
  application/json; charset=utf-8``; no data as an empty 200 without a ``Content-Type``; an
  error as ``{"message":"<TEXT>"}`` with its status; every one with ``X-NSQ-Content-Type: nsq;
  version=1.0`` (go-nsq decodes a lookup answer only when it sees it). ``/ping`` is plain text
  ``OK`` without it.
- Parameters come only from the query string, parsed as Go's ``url.ParseQuery`` (``&``
  separated, ``+`` is a space, a bad ``%`` escape or a ``;`` fails the whole query:
  ``400 INVALID_REQUEST``); a repeated key's first value wins. A request body is ignored.
- A handler that raises is ``500 {"message":"INTERNAL_ERROR"}``, logged with its traceback.

Each request is logged at INFO as nsqlookupd does: ``200 GET /lookup?topic=t (addr) 0.123ms``.
The Go pprof endpoints under ``/debug/pprof`` are not served (404).
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Awaitable, Callable, MutableMapping
from html import escape
from typing import Any

import attrs
import trio

from lmqd.gohttp import QueryError, parse_query
from lmqd.lookup import gojson
from lmqd.lookupd.views import ApiError, Views

__all__ = ["LookupdHttpApi", "QueryError", "parse_query"]

log = logging.getLogger("lmqd.lookupd.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
HTML_CONTENT_TYPE = "text/html; charset=utf-8"
# Header names as Go's net/http writes them (canonical case: X-NSQ-Content-Type becomes
# X-Nsq-Content-Type); clients compare them case-insensitively anyway.
_V1_HEADER = (b"X-Nsq-Content-Type", b"nsq; version=1.0")


@attrs.frozen
class Response:
    """An answer: ``content_type`` None sends no ``Content-Type`` header."""

    status: int
    body: bytes = b""
    content_type: str | None = None
    v1: bool = True
    """Send ``X-NSQ-Content-Type`` (every endpoint but ``/ping``, and not the router's
    redirects and OPTIONS answers)."""
    headers: tuple[tuple[str, str], ...] = ()


def respond_v1(status: int, data: Any) -> Response:
    """``http_api.RespondV1``: ``data`` as JSON (or nothing) for 200, an error message else."""
    if status != 200:
        return Response(status, gojson.dumps({"message": str(data)}), JSON_CONTENT_TYPE)
    if data is None:
        return Response(200)
    return Response(200, gojson.dumps(data), JSON_CONTENT_TYPE)


class Request:
    """One HTTP request as the handlers see it."""

    def __init__(self, scope: Scope) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.raw_query: bytes = scope.get("query_string", b"")
        client = scope.get("client")
        if client:
            host = client[0]
            self.remote = f"[{host}]:{client[1]}" if ":" in host else f"{host}:{client[1]}"
        else:
            self.remote = "-"
        self._query: dict[str, list[str]] | None = None

    @property
    def uri(self) -> str:
        return self.path + ("?" + self.raw_query.decode("latin-1") if self.raw_query else "")

    def param(self, name: str) -> str | None:
        """The first value of ``name`` in the query (None if absent); ``QueryError`` if the
        query string does not parse."""
        if self._query is None:
            self._query = parse_query(self.raw_query)
        values = self._query.get(name)
        return values[0] if values else None


Handler = Callable[[Request], Response]


def _clean_path(path: str) -> str:
    """httprouter's ``CleanPath``: ``path.Clean`` that keeps a trailing slash."""
    if not path:
        return "/"
    cleaned = posixpath.normpath("/" + path)
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    if path.endswith("/") and cleaned != "/":
        cleaned += "/"
    return cleaned


class Router:
    """httprouter v1.3.0's behaviour for a table of exact paths (see the module docstring)."""

    def __init__(self) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}  # method -> path -> handler

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._routes.setdefault(method, {})[path] = handler

    def _allowed(self, path: str, method: str) -> str:
        methods = [
            m
            for m, paths in self._routes.items()
            if m not in (method, "OPTIONS") and path in paths
        ]
        return ", ".join(sorted([*methods, "OPTIONS"])) if methods else ""

    def _redirect(self, request: Request, paths: dict[str, Handler]) -> str | None:
        path = request.path
        if path == "/":
            return None
        other = path[:-1] if path.endswith("/") else path + "/"
        if other in paths:
            return other
        # RedirectFixedPath: a case-insensitive match of the cleaned path, with or without
        # its trailing slash.
        cleaned = _clean_path(path).lower()
        for candidate in (cleaned, cleaned.rstrip("/") or "/", cleaned + "/"):
            for route in paths:
                if route.lower() == candidate:
                    return route
        return None

    def resolve(self, request: Request) -> Handler | Response:
        """The handler for ``request``, or the answer httprouter gives instead."""
        paths = self._routes.get(request.method)
        if paths is not None:
            handler = paths.get(request.path)
            if handler is not None:
                return handler
            target = self._redirect(request, paths)
            if target is not None:
                return _redirect_response(request, target)
        allow = self._allowed(request.path, request.method)
        if allow and request.method == "OPTIONS":
            return Response(200, v1=False, headers=(("Allow", allow),))
        if allow:
            response = respond_v1(405, "METHOD_NOT_ALLOWED")
            return attrs.evolve(response, headers=(("Allow", allow),))
        return respond_v1(404, "NOT_FOUND")


def _redirect_response(request: Request, path: str) -> Response:
    """Go's ``http.Redirect`` to ``path`` with the request's query kept."""
    location = path + ("?" + request.raw_query.decode("latin-1") if request.raw_query else "")
    if request.method == "GET":
        body = f'<a href="{escape(location)}">Moved Permanently</a>.\n\n'.encode()
        return Response(301, body, HTML_CONTENT_TYPE, v1=False, headers=(("Location", location),))
    # Go writes a body only for GET ("Shouldn't send the body for POST or HEAD").
    return Response(307, v1=False, headers=(("Location", location),))


class LookupdHttpApi:
    """The ASGI application: nsqlookupd's endpoints over ``views``."""

    def __init__(self, views: Views) -> None:
        self.views = views
        router = Router()
        router.add("GET", "/ping", self._ping)
        router.add("GET", "/info", self._info)
        router.add("GET", "/debug", self._debug)
        router.add("GET", "/lookup", self._lookup)
        router.add("GET", "/topics", self._topics)
        router.add("GET", "/channels", self._channels)
        router.add("GET", "/nodes", self._nodes)
        router.add("POST", "/topic/create", self._create_topic)
        router.add("POST", "/topic/delete", self._delete_topic)
        router.add("POST", "/channel/create", self._create_channel)
        router.add("POST", "/channel/delete", self._delete_channel)
        router.add("POST", "/topic/tombstone", self._tombstone_topic)
        self.router = router

    # -- endpoints ----------------------------------------------------------------------------

    def _ping(self, request: Request) -> Response:
        return Response(200, b"OK", TEXT_CONTENT_TYPE, v1=False)

    def _info(self, request: Request) -> Response:
        return respond_v1(200, self.views.info())

    def _debug(self, request: Request) -> Response:
        wall_offset = time.time() - trio.current_time()
        return respond_v1(200, self.views.debug(wall_offset))

    def _lookup(self, request: Request) -> Response:
        return respond_v1(200, self.views.lookup(_params(request), trio.current_time()))

    def _topics(self, request: Request) -> Response:
        return respond_v1(200, self.views.topics())

    def _channels(self, request: Request) -> Response:
        return respond_v1(200, self.views.channels(_params(request)))

    def _nodes(self, request: Request) -> Response:
        return respond_v1(200, self.views.nodes(trio.current_time()))

    def _create_topic(self, request: Request) -> Response:
        self.views.create_topic(_params(request))
        return respond_v1(200, None)

    def _delete_topic(self, request: Request) -> Response:
        self.views.delete_topic(_params(request))
        return respond_v1(200, None)

    def _create_channel(self, request: Request) -> Response:
        self.views.create_channel(_params(request))
        return respond_v1(200, None)

    def _delete_channel(self, request: Request) -> Response:
        self.views.delete_channel(_params(request))
        return respond_v1(200, None)

    def _tombstone_topic(self, request: Request) -> Response:
        self.views.tombstone_topic(_params(request), trio.current_time())
        return respond_v1(200, None)

    # -- ASGI ---------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, send)
        # Anything else (websocket) is not part of the API: returning makes hypercorn refuse.

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, send: Send) -> None:
        start = time.perf_counter()
        request = Request(scope)
        try:
            target = self.router.resolve(request)
            response = target if isinstance(target, Response) else target(request)
        except ApiError as exc:
            response = respond_v1(exc.status, exc.message)
        except Exception:
            # nsqlookupd's PanicHandler: a bug answers 500 and the server goes on.
            log.exception("HTTP: %s %s (%s): internal error", request.method, request.uri,
                          request.remote)  # fmt: skip
            response = respond_v1(500, "INTERNAL_ERROR")
        log.info("%d %s %s (%s) %.3fms", response.status, request.method, request.uri,
                 request.remote, (time.perf_counter() - start) * 1000)  # fmt: skip
        try:
            await _send_response(send, response)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            # The client hung up as soon as it had the whole response; nothing was lost.
            log.debug("HTTP: %s %s (%s): client closed during the response", request.method,
                      request.uri, request.remote)  # fmt: skip


def _params(request: Request) -> Callable[[str], str | None]:
    """The query lookup for a view, parsing the query first (nsqlookupd's ``NewReqParams``)."""
    try:
        request.param("")
    except QueryError:
        raise ApiError(400, "INVALID_REQUEST") from None
    return request.param


async def _send_response(send: Send, response: Response) -> None:
    headers: list[tuple[bytes, bytes]] = []
    if response.content_type is not None:
        headers.append((b"Content-Type", response.content_type.encode("latin-1")))
    headers.append((b"Content-Length", b"%d" % len(response.body)))
    if response.v1:
        headers.append(_V1_HEADER)
    headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers)
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
