"""A small blocking client for nsqd's HTTP API (``/stats``, topic and channel admin, ``/pub``),
and lmqd's replay endpoints (``/channel/seek``, ``/topic/offsets``, ``/topic/read``);
``HTTPClient.fetch`` is also what lookupd queries use (``lmq_client.lookupd``).

Standard library only (``urllib.request``): lmqadmin makes a handful of requests, so a pooled
HTTP client would buy nothing. Works against lmqd and nsqd alike (both answer errors as
``{"message": "CODE"}``).

HTTPS as nsqd's own tools reach it (NSQ's ``internal/http_api`` client, used by nsqadmin): an
address is the plain HTTP one (lookupds list no other); a daemon that requires TLS answers
``403 {"message": "TLS_REQUIRED", "https_port": N}`` there, and the request is sent again to
``https://host:N`` with ``HTTPOptions.tls_context`` (CA, client certificate, or no
verification). Unlike NSQ's client, which asks the plain port again on every request, the
options remember the answer, so a console sampling every few seconds asks the plain port once.
An ``https://`` URL (a lookupd behind a TLS proxy) is used as it is.
"""

from __future__ import annotations

import functools
import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, NamedTuple

import attrs

from lmq_client.errors import ConnectionFailed, LmqClientError
from lmqd.message import decode_read_frames
from lmqd.net import split_address

__all__ = ["HTTPClient", "HTTPError", "HTTPOptions", "ReadMessage", "decode_read"]

class ReadMessage(NamedTuple):
    """A message read by offset (``/topic/read``)."""

    offset: int
    id: bytes
    timestamp: int
    attempts: int
    body: bytes


def decode_read(data: bytes) -> list[ReadMessage]:
    """The messages of a binary ``/topic/read`` answer (``lmqd.message.READ_FRAME``); raises
    ``LmqClientError`` if it is not framed as documented."""
    try:
        entries = decode_read_frames(data)
    except ValueError as exc:
        raise LmqClientError(f"bad /topic/read answer: {exc}") from None
    return [ReadMessage(o, m.id, m.timestamp, m.attempts, m.body) for o, m in entries]


@attrs.frozen(kw_only=True)
class HTTPOptions:
    """How requests reach an HTTP API: nsqadmin's ``--http-client-*`` settings.

    One object is shared by every request of a command (or of the console), so what a plain
    port answered about its HTTPS port is learned once (module docstring).
    """

    timeout_s: float = 5.0
    """Bound of each wait once connected: sending, the answer's header, each read of its body."""
    connect_timeout_s: float | None = None
    """Bound of the connection (TCP, and the TLS handshake for HTTPS); None: ``timeout_s``."""
    tls_context: ssl.SSLContext | None = None
    """For HTTPS: the CA, client certificate and verification (None: the system's CAs)."""
    https_hosts: dict[str, str] = attrs.field(factory=dict, eq=False, repr=False)
    """Learned: plain ``host:port`` -> ``host:https_port`` named by a ``TLS_REQUIRED`` answer."""

    def url_for(self, url: str) -> str:
        """``url``, sent to the HTTPS port its plain port named, if it named one."""
        parts = urllib.parse.urlsplit(url)
        https = self.https_hosts.get(parts.netloc) if parts.scheme == "http" else None
        return parts._replace(scheme="https", netloc=https).geturl() if https else url

    def learn_https(self, url: str, answer: bytes) -> str | None:
        """The HTTPS URL a ``403`` answer to plain ``url`` names (``https_port``), remembered;
        None if it names none."""
        parts = urllib.parse.urlsplit(url)
        try:
            port = json.loads(answer)["https_port"]
        except (ValueError, KeyError, TypeError):
            return None
        if parts.scheme != "http" or not isinstance(port, int) or not 0 < port < 65536:
            return None
        host = parts.hostname or ""
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.https_hosts[parts.netloc] = netloc
        return parts._replace(scheme="https", netloc=netloc).geturl()

    def opener(self) -> urllib.request.OpenerDirector:
        """A urllib opener with these timeouts and this TLS context."""
        return urllib.request.build_opener(
            _HTTPHandler(self.connect_timeout_s), _HTTPSHandler(self.connect_timeout_s,
                                                                self.tls_context),
        )  # fmt: skip


class _Connection(http.client.HTTPConnection):
    """A connection whose ``connect()`` (TCP, and the handshake for HTTPS) is bounded by
    ``connect_timeout``; then the socket waits ``timeout`` again."""

    def __init__(self, *args: Any, connect_timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connect_timeout = connect_timeout

    def connect(self) -> None:
        request_timeout = self.timeout
        if self.connect_timeout is not None:
            self.timeout = self.connect_timeout
        try:
            super().connect()
        finally:
            self.timeout = request_timeout
        if self.sock is not None:
            self.sock.settimeout(request_timeout)


class _TLSConnection(_Connection, http.client.HTTPSConnection):
    """``_Connection`` over TLS (the MRO puts HTTPSConnection's handshake inside the bound)."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, connect_timeout: float | None) -> None:
        super().__init__()
        self._connect_timeout = connect_timeout

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(
            functools.partial(_Connection, connect_timeout=self._connect_timeout), req
        )


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, connect_timeout: float | None, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._connect_timeout = connect_timeout
        self._tls_context = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(
            functools.partial(_TLSConnection, connect_timeout=self._connect_timeout), req,
            context=self._tls_context,
        )  # fmt: skip


class HTTPError(LmqClientError):
    """The daemon answered with an HTTP error: ``status`` and ``message`` (TOPIC_NOT_FOUND...)."""

    def __init__(self, address: str, status: int, message: str) -> None:
        super().__init__(f"{address}: HTTP {status} {message}")
        self.address = address
        self.status = status
        self.message = message


class HTTPClient:
    """nsqd's HTTP API at ``address`` (``HOST:PORT``)."""

    def __init__(
        self, address: str, *, timeout: float = 5.0, options: HTTPOptions | None = None
    ) -> None:
        """``options`` (timeouts, TLS) shared between clients; without them, ``timeout``."""
        split_address(address)
        self.address = address
        self.options = options or HTTPOptions(timeout_s=timeout)
        self.timeout = self.options.timeout_s

    def request(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> bytes:
        """One request: the body of a 2xx answer; raises ``HTTPError`` or ``ConnectionFailed``."""
        return self.request_with_headers(method, path, params, body)[0]

    def request_with_headers(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        """``request``, also returning the answer's headers (names in lower case)."""
        url = f"http://{self.address}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        return self.fetch_with_headers(url, address=self.address, method=method, body=body,
                                       options=self.options)  # fmt: skip

    @staticmethod
    def fetch(
        url: str,
        *,
        address: str,
        timeout: float = 5.0,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        options: HTTPOptions | None = None,
    ) -> bytes:
        """One request to ``url`` (errors name ``address``): the body of a 2xx answer; raises
        ``HTTPError`` (with the daemon's ``{"message"}``) or ``ConnectionFailed``.
        ``options``: timeouts and TLS (without them, ``timeout``)."""
        return HTTPClient.fetch_with_headers(
            url, address=address, timeout=timeout, method=method, body=body, headers=headers,
            options=options,
        )[0]  # fmt: skip

    @staticmethod
    def fetch_with_headers(
        url: str,
        *,
        address: str,
        timeout: float = 5.0,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        options: HTTPOptions | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        """``fetch``, also returning the answer's headers (names in lower case). A plain
        request refused with ``TLS_REQUIRED`` is sent again over HTTPS (module docstring)."""
        options = options or HTTPOptions(timeout_s=timeout)
        url = options.url_for(url)
        try:
            return _fetch_once(url, address, method, body, headers, options)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            https = options.learn_https(url, raw) if exc.code == 403 else None
            if https is None:
                raise _http_error(address, exc, raw) from None
        try:
            return _fetch_once(https, address, method, body, headers, options)
        except urllib.error.HTTPError as exc:
            raise _http_error(address, exc, exc.read()) from None

    def ping(self) -> str:
        """``/ping``: ``"OK"`` when healthy."""
        return self.request("GET", "/ping").decode("utf-8", "replace")

    def info(self) -> dict[str, Any]:
        """``/info`` as a dict (version, ports, ...)."""
        return self._json(self.request("GET", "/info"))

    def stats(
        self, topic: str | None = None, channel: str | None = None, *, include_clients: bool = False
    ) -> dict[str, Any]:
        """``/stats?format=json`` as a dict (nsq-reference.md §2.4 shape)."""
        params = {"format": "json", "include_clients": "true" if include_clients else "false"}
        if topic is not None:
            params["topic"] = topic
        if channel is not None:
            params["channel"] = channel
        data = self._json(self.request("GET", "/stats", params))
        # nsqd 0.x wrapped every answer in {"status_code", "status_txt", "data"}.
        if "data" in data and "topics" not in data and isinstance(data["data"], dict):
            inner: dict[str, Any] = data["data"]
            return inner
        return data

    def topic_action(self, action: str, topic: str) -> None:
        """POST ``/topic/<action>``: create, delete, empty, pause or unpause."""
        self.request("POST", f"/topic/{action}", {"topic": topic})

    def channel_action(
        self, action: str, topic: str, channel: str, *, start: str | None = None
    ) -> None:
        """POST ``/channel/<action>``: create, delete, empty, pause or unpause. ``start``
        (lmqd, create only): where the channel starts reading (``from``: ``earliest``,
        ``latest``, an RFC 3339 time, Unix ms, ``offset:N``)."""
        params = {"topic": topic, "channel": channel}
        if start is not None:
            params["from"] = start
        self.request("POST", f"/channel/{action}", params)

    def topic_policy(
        self, topic: str, changes: Mapping[str, int | str] | None = None
    ) -> dict[str, Any]:
        """GET (or, with ``changes``, POST) ``/topic/policy`` (lmqd): the topic's policy."""
        if not changes:
            return self._json(self.request("GET", "/topic/policy", {"topic": topic}))
        body = json.dumps(dict(changes)).encode()
        return self._json(self.request("POST", "/topic/policy", {"topic": topic}, body))

    def channel_policy(
        self, topic: str, channel: str, changes: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """GET (or, with ``changes``, POST) ``/channel/policy`` (lmqd): the channel's policy."""
        params = {"topic": topic, "channel": channel}
        if not changes:
            return self._json(self.request("GET", "/channel/policy", params))
        body = json.dumps(dict(changes)).encode()
        return self._json(self.request("POST", "/channel/policy", params, body))

    def channel_redrive(self, topic: str, channel: str, source: str, max_count: int) -> int:
        """POST ``/channel/redrive`` (lmqd): move up to ``max_count`` dead letters from topic
        ``source`` back into the channel; how many moved."""
        params = {"topic": topic, "channel": channel, "from": source, "max": str(max_count)}
        return int(self._json(self.request("POST", "/channel/redrive", params))["moved"])

    def channel_seek(self, topic: str, channel: str, to: str) -> int:
        """POST ``/channel/seek`` (lmqd): move a channel's cursor; the offset it now reads."""
        answer = self._json(
            self.request("POST", "/channel/seek", {"topic": topic, "channel": channel, "to": to})
        )
        return int(answer["offset"])

    def topic_offsets(self, topic: str, at: str | None = None) -> dict[str, Any]:
        """GET ``/topic/offsets`` (lmqd): ``earliest``, ``end``, ``pumped``[, ``offset``]."""
        params = {"topic": topic}
        if at is not None:
            params["at"] = at
        return self._json(self.request("GET", "/topic/offsets", params))

    def read(
        self, topic: str, offset: int, count: int = 1000, end: int | None = None
    ) -> tuple[list[ReadMessage], int]:
        """GET ``/topic/read`` (lmqd): messages from ``offset`` on, consuming nothing, and the
        offset to read on from."""
        params = {"topic": topic, "offset": str(offset), "count": str(count)}
        if end is not None:
            params["end"] = str(end)
        body, headers = self.request_with_headers("GET", "/topic/read", params)
        return decode_read(body), int(headers.get("x-lmq-next-offset", offset))

    def peek(
        self, topic: str, channel: str | None = None, state: str = "queued", count: int = 10,
        skip: int = 0,
    ) -> dict[str, Any]:
        """GET ``/peek`` (lmqd): what the topic or channel holds, changing nothing; ``skip``
        leaves out the first messages (the answer's ``more``: whether others follow)."""
        params = {"topic": topic, "state": state, "n": str(count)}
        if channel is not None:
            params["channel"] = channel
        if skip:
            params["skip"] = str(skip)
        return self._json(self.request("GET", "/peek", params))

    def pub(self, topic: str, body: bytes, *, defer_ms: int | None = None) -> None:
        """POST ``/pub``."""
        params = {"topic": topic}
        if defer_ms is not None:
            params["defer"] = str(defer_ms)
        self.request("POST", "/pub", params, body)

    def _json(self, data: bytes) -> dict[str, Any]:
        try:
            result = json.loads(data)
        except ValueError:
            # lmqd's API answers JSON here: whatever answered is something else.
            raise ConnectionFailed(
                self.address, "not an lmqd HTTP API (the answer is not JSON)"
            ) from None
        if not isinstance(result, dict):
            raise LmqClientError(f"{self.address}: HTTP API answered with unexpected JSON")
        return result


def _fetch_once(
    url: str,
    address: str,
    method: str,
    body: bytes | None,
    headers: dict[str, str] | None,
    options: HTTPOptions,
) -> tuple[bytes, Mapping[str, str]]:
    """One request; an error status passes through as ``urllib.error.HTTPError``, every other
    failure becomes ``ConnectionFailed`` naming ``address``."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with options.opener().open(req, timeout=options.timeout_s) as response:
            data: bytes = response.read()
            return data, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError:
        raise
    except urllib.error.URLError as exc:
        raise ConnectionFailed(address, f"HTTP API unreachable ({exc.reason})") from None
    except (TimeoutError, OSError) as exc:
        raise ConnectionFailed(address, f"HTTP API unreachable ({exc})") from None
    except http.client.HTTPException as exc:
        # Something answered, but not in HTTP: the daemon's TCP port, or not lmqd at all.
        raise ConnectionFailed(
            address, f"not an HTTP API ({type(exc).__name__}: {exc!s:.60}); is it the TCP port?"
        ) from None


def _http_error(address: str, exc: urllib.error.HTTPError, raw: bytes) -> HTTPError:
    """``HTTPError`` with the daemon's ``{"message"}`` (or the answer's text)."""
    try:
        doc = json.loads(raw)
        message = str(doc["message"])
        if doc.get("primary"):  # a mirror (lmqd: docs/mirrors.md) names its primary
            message += f" (primary: {doc['primary']})"
    except (ValueError, KeyError, TypeError, AttributeError):
        message = raw.decode("utf-8", "replace").strip() or str(exc.reason)
    return HTTPError(address, exc.code, message)
