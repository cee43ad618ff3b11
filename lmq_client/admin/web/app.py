"""``Console``: the ASGI application of ``lmqadmin web`` -- routes, rendering, errors.

Each area registers its routes from its own module: ``pages.py`` (nsqadmin's pages),
``actions.py`` (nsqadmin's actions), ``api.py`` (nsqadmin's JSON API), ``browse.py`` (the
message browser), ``publish.py``, ``replay.py``, ``deadletters.py``, ``policy.py``, ``tail.py``
(the live tail) and ``charts.py``.
They share this object: the config, the sampler's latest snapshot, the upstream clients, the
guard (CSRF, read-only, ACL), the notifier and ``render``. Static files (htmx, its SSE
extension, uPlot, the console's own CSS and script) are read from the package once, at start.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import jinja2

from lmq_client._util import check_name
from lmq_client.admin.web.asgi import (
    ClientGone,
    EventStream,
    HTTPException,
    Receive,
    Request,
    Response,
    Router,
    Scope,
    Send,
    send_response,
    send_stream,
)
from lmq_client.admin.web.config import ConsoleConfig
from lmq_client.admin.web.notify import Notifier
from lmq_client.admin.web.sampler import Sampler
from lmq_client.admin.web.security import SECURITY_HEADERS, Guard
from lmq_client.admin.web.upstream import Upstream
from lmq_client.errors import InvalidNameError
from lmqd import __version__

__all__ = ["Console"]

log = logging.getLogger("lmq_client.admin.web")

FLASH_COOKIE = "lmq_console_flash"

NONE = "\u2013"
"""An en dash: what a figure the daemons did not give shows."""

STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
}


def _number(value: float | int | None) -> str:
    if value is None:
        return NONE
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def _rate(value: float | None) -> str:
    return NONE if value is None else f"{value:,.1f}/s"


def nanoseconds(value: float) -> str:
    """nsq's ``NanoSecondToHuman``: 850ns, 1.5us, 2.3ms, 1.2s."""
    if value < 1e3:
        return f"{value:.0f}ns"
    if value < 1e6:
        return f"{value / 1e3:.1f}us"
    if value < 1e9:
        return f"{value / 1e6:.1f}ms"
    return f"{value / 1e9:.1f}s"


def duration(seconds: float) -> str:
    """1h2m3s, 4m0s, 12s."""
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def wall_time(value: float | int | None, unit: str = "s") -> str:
    """A time since the epoch in ``unit`` (s, ms, ns) as UTC ISO 8601, to the millisecond."""
    if value is None:
        return NONE
    seconds = value / {"s": 1, "ms": 1e3, "ns": 1e9}[unit]
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class Console:
    """The ASGI app (module docstring)."""

    def __init__(
        self, config: ConsoleConfig, upstream: Upstream, sampler: Sampler, notifier: Notifier
    ) -> None:
        self.config = config
        self.upstream = upstream
        self.sampler = sampler
        self.notifier = notifier
        self.guard = Guard(config)
        self.router = Router(config.base_path)
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("lmq_client.admin.web", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            num=_number, rate=_rate, ns=nanoseconds, duration=duration, when=wall_time,
        )  # fmt: skip
        self.env.globals.update(url=self.url, here=self.here, config=config, version=__version__)
        self.static = self._load_static()
        self.router.add("GET", "/static/{name}", self._serve_static)
        from lmq_client.admin.web import (
            actions,
            api,
            browse,
            charts,
            deadletters,
            pages,
            policy,
            publish,
            replay,
            tail,
        )

        for module in (pages, actions, browse, publish, replay, deadletters, policy, tail,
                       charts, api):  # fmt: skip
            module.register(self)

    # -- helpers for the areas ----------------------------------------------------------------

    def url(self, *parts: str, **query: Any) -> str:
        """The console's URL of ``/part/part...`` (each part percent-encoded) with ``query``."""
        path = "/".join(urllib.parse.quote(str(p), safe="") for p in parts)
        url = f"{self.config.base_path}/{path}"
        kept = {k: v for k, v in query.items() if v is not None and v != ""}
        return url + ("?" + urllib.parse.urlencode(kept) if kept else "")

    def here(self, request: Request) -> str:
        """The URL of ``request`` itself, encoded (for a page that reloads itself)."""
        url = urllib.parse.quote(self.config.base_path + request.path, safe="/")
        return url + (f"?{request.raw_query}" if request.raw_query else "")

    def route(self, method: str, pattern: str) -> Callable[[Any], Any]:
        def decorator(handler: Any) -> Any:
            self.router.add(method, pattern, handler)
            return handler

        return decorator

    def render(self, request: Request, template: str, status: int = 200, **context: Any
               ) -> Response:  # fmt: skip
        refusal = self.guard.refusal(request)
        flash = urllib.parse.unquote(request.cookies.get(FLASH_COOKIE, ""))
        page = self.env.get_template(template).render(
            request=request,
            snapshot=self.sampler.latest,
            csrf_token=self.guard.token(request.session),
            can_act=refusal is None,
            refusal=refusal,
            flash=flash,
            now=time.time(),
            **context,
        )
        headers: tuple[tuple[str, str], ...] = ()
        if flash:
            path = self.config.base_path or "/"
            headers = (("set-cookie", f"{FLASH_COOKIE}=; Path={path}; Max-Age=0"),)
        return Response(page.encode(), status=status, headers=headers)

    def redirect(self, request: Request, target: str, flash: str = "") -> Response:
        """303 to ``target`` (a console path as the router sees it, not percent-encoded; the
        base path is added), showing ``flash`` there."""
        if not target.startswith("/") or target.startswith("//"):
            target = "/"
        # Names may hold "#" (#ephemeral): encoded, or the browser would take it for a fragment.
        location = urllib.parse.quote(self.config.base_path + target, safe="/?=&")
        headers = [("location", location)]
        if flash:
            path = self.config.base_path or "/"
            value = urllib.parse.quote(flash[:1500])
            headers.append(("set-cookie", f"{FLASH_COOKIE}={value}; Path={path}; SameSite=Strict"))
        return Response(b"", status=303, headers=tuple(headers))

    @staticmethod
    def name(kind: str, value: str) -> str:
        """``value`` if it is a valid topic or channel name, else 400."""
        try:
            check_name(kind, value)
        except InvalidNameError as exc:
            raise HTTPException(400, str(exc)) from None
        return value

    async def act(self, request: Request) -> str:
        """Check that this POST may act (CSRF, read-only, ACL); the user it is on behalf of."""
        await self.guard.check_post(request)
        return self.guard.user(request)

    # -- ASGI ---------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        headers = dict(SECURITY_HEADERS)
        request: Request | None = None
        try:
            request = self.router.request(scope, receive)
            session, new = self.guard.session(request)
            request.session = session
            if new:
                headers["set-cookie"] = self.guard.cookie(session)
            handler, request.params = self.router.match(request.method, request.path)
            result = await handler(request)
        except ClientGone:
            return
        except HTTPException as exc:
            result = self._error(request, exc.status, exc.message)
        except Exception:
            log.exception("console: %s %s failed", scope.get("method"), scope.get("path"))
            result = self._error(request, 500, "the console failed: see its log")
        if isinstance(result, EventStream):
            await send_stream(send, receive, result, headers)
            return
        if result.content_type.startswith("text/html"):
            headers["cache-control"] = "no-store"
        await send_response(send, result, headers)
        log.info("%d %s %s (%s) %.3fms", result.status, scope["method"], scope["path"],
                 request.client if request else "", (time.perf_counter() - started) * 1e3)

    def _error(self, request: Request | None, status: int, message: str) -> Response:
        if request is None:
            return Response(message.encode(), status=status, content_type="text/plain")
        if request.path.startswith("/api/"):  # nsqadmin's API answers errors in JSON
            return Response(json.dumps({"message": message}).encode(), status=status,
                            content_type="application/json")
        return self.render(request, "error.html", status=status, status_code=status,
                           message=message)  # fmt: skip

    # -- static files --------------------------------------------------------------------------

    def _load_static(self) -> dict[str, tuple[bytes, str]]:
        files = {}
        root = resources.files("lmq_client.admin.web") / "static"
        for entry in root.iterdir():
            suffix = "." + entry.name.rpartition(".")[2]
            if entry.is_file() and suffix in STATIC_TYPES:
                files[entry.name] = (entry.read_bytes(), STATIC_TYPES[suffix])
        return files

    async def _serve_static(self, request: Request) -> Response:
        found = self.static.get(request.params["name"])
        if found is None:
            raise HTTPException(404, "no such file")
        body, content_type = found
        return Response(body, content_type=content_type,
                        headers=(("cache-control", "public, max-age=3600"),))
