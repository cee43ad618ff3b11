"""Asking the auth servers (``--auth-http-address``), and one connection's AUTH state, on trio.

nsqd's ``auth.QueryAnyAuthd`` starts at a random one of the configured servers and tries each
in turn until one gives a valid answer; only if all fail does AUTH fail. Each request is
``GET <endpoint>?common_name=..&remote_ip=..&secret=..&tls=true|false`` (Go's
``url.Values.Encode``: keys sorted, ``+`` for spaces) where the endpoint is
``http://<host:port>/auth``, or the address itself when it contains ``://`` (so an HTTPS auth
server is ``https://host:port/auth``, verified with ``--tls-root-ca-file``). With
``--auth-http-request-method=post`` (nsqd master) the same form is POSTed instead. The request
sends nsqd's ``Accept: application/vnd.nsq; version=1.0``; anything but ``200`` with a valid
answer (``lmqd.transport.auth.parse_auth_response``) is a failure.

Refusal, never admission: an unreachable server, a timeout, a non-200 status, an oversized or
invalid answer all raise ``AuthQueryError``, which the connection turns into
``E_AUTH_FAILED AUTH failed`` (the detail is only logged, as nsqd does not tell untrusted
clients how its auth server failed).

HTTP is h11 (the sans-I/O HTTP/1.1 codec hypercorn is built on) over trio streams: one request
per connection, as an auth check is rare (once per AUTH and per ttl), and no async generators
or connection pools to clean up when a request is abandoned. Timeouts are nsqd's two:
``--http-client-connect-timeout`` (2 s) for the TCP connect and TLS handshake and
``--http-client-request-timeout`` (5 s) for the whole request, per server tried.

Not reproduced: Go's http_api client retries a ``403`` from a plain-HTTP endpoint over HTTPS
when the body names an ``https_port`` (meant for nsqd's own ``TLS_REQUIRED`` answers); here a
403 is a failure like any other status.
"""

from __future__ import annotations

import logging
import random
import ssl
import urllib.parse
from collections.abc import Sequence

import h11
import trio

import lmqd
from lmqd.protocol import errors
from lmqd.transport.auth import (
    AuthExpired,
    AuthResponseError,
    AuthState,
    auth_outcome,
    auth_response_body,
    check_authorized,
    parse_auth_response,
)
from lmqd.transport.http_client import HttpClientError, open_stream

__all__ = [
    "MAX_AUTH_RESPONSE_SIZE",
    "AuthQueryError",
    "AuthService",
    "ConnectionAuth",
    "auth_endpoint",
    "query_auth_servers",
]

log = logging.getLogger("lmqd.auth")

DEFAULT_CONNECT_TIMEOUT_S = 2.0
"""nsqd's ``--http-client-connect-timeout``."""
DEFAULT_REQUEST_TIMEOUT_S = 5.0
"""nsqd's ``--http-client-request-timeout``."""

MAX_AUTH_RESPONSE_SIZE = 1024 * 1024
"""Largest answer read from an auth server. A real answer lists a few authorisations (~100 bytes
each), so 1 MiB holds thousands; past that the server is broken or hostile and AUTH fails
instead of the daemon buffering whatever it sends."""

ACCEPT_V1 = "application/vnd.nsq; version=1.0"
USER_AGENT = f"lmqd/{lmqd.__version__}"


class AuthQueryError(Exception):
    """No auth server gave a valid answer; AUTH (or the check that re-asked) must fail."""


def auth_endpoint(address: str) -> str:
    """``host:port`` -> ``http://host:port/auth``; an address with ``://`` is used as it is."""
    return address if "://" in address else f"http://{address}/auth"


def _form(remote_ip: str, tls: bool, secret: bytes | str, common_name: str) -> str:
    # Go's url.Values.Encode: sorted keys, QueryEscape (space -> "+").
    values: list[tuple[str, str | bytes]] = [
        ("common_name", common_name),
        ("remote_ip", remote_ip),
        ("secret", secret),
        ("tls", "true" if tls else "false"),
    ]
    return urllib.parse.urlencode(values, quote_via=urllib.parse.quote_plus)


async def query_auth_server(
    address: str,
    form: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
    method: str = "get",
) -> AuthState:
    """Ask one auth server; ``AuthQueryError`` for any failure."""
    endpoint = auth_endpoint(address)
    if method == "post":
        url, body = endpoint, form.encode("ascii")
    else:
        url, body = endpoint + ("&" if "?" in endpoint else "?") + form, b""
    try:
        with trio.fail_after(request_timeout):
            status, answer = await _http_request(
                method.upper(), url, body, ssl_context=ssl_context, connect_timeout=connect_timeout
            )
    except trio.TooSlowError:
        raise AuthQueryError(f"{endpoint}: no answer within {request_timeout:g}s") from None
    except AuthQueryError as exc:
        raise AuthQueryError(f"{endpoint}: {exc}") from None
    if status != 200:
        raise AuthQueryError(f"{endpoint}: got response {status} {answer[:200]!r}")
    try:
        return parse_auth_response(answer, trio.current_time())
    except AuthResponseError as exc:
        raise AuthQueryError(f"{endpoint}: {exc}") from None


async def _http_request(
    method: str,
    url: str,
    body: bytes,
    *,
    ssl_context: ssl.SSLContext | None,
    connect_timeout: float,
) -> tuple[int, bytes]:
    """One HTTP/1.1 request on a new connection: the status and the (bounded) body."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AuthQueryError(f"unsupported URL {url!r}")
    https = parts.scheme == "https"
    try:
        port = parts.port or (443 if https else 80)
    except ValueError:
        raise AuthQueryError(f"invalid port in {url!r}") from None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = [
        ("Host", parts.netloc),
        ("Accept", ACCEPT_V1),
        ("User-Agent", USER_AGENT),
        ("Connection", "close"),
    ]
    if method == "POST":
        headers.append(("Content-Type", "application/x-www-form-urlencoded"))
        headers.append(("Content-Length", str(len(body))))
    try:
        stream = await open_stream(
            parts.hostname, port,
            ssl_context=(ssl_context or ssl.create_default_context()) if https else None,
            connect_timeout=connect_timeout,
        )  # fmt: skip
        async with stream:
            return await _exchange(stream, method, target, headers, body)
    except HttpClientError as exc:
        raise AuthQueryError(str(exc)) from None
    except OSError as exc:
        raise AuthQueryError(f"cannot connect ({exc.strerror or exc})") from None
    except trio.BrokenResourceError as exc:
        raise AuthQueryError(f"connection failed ({exc.__cause__ or exc})") from None
    except h11.ProtocolError as exc:
        raise AuthQueryError(f"invalid HTTP answer ({exc})") from None


async def _exchange(
    stream: trio.abc.Stream,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes,
) -> tuple[int, bytes]:
    conn = h11.Connection(h11.CLIENT)
    out = conn.send(h11.Request(method=method, target=target, headers=headers))
    if body:
        out += conn.send(h11.Data(data=body))
    out += conn.send(h11.EndOfMessage())
    await stream.send_all(out)
    status = 0
    chunks: list[bytes] = []
    size = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(64 * 1024)))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_AUTH_RESPONSE_SIZE:
                raise AuthQueryError(f"answer larger than {MAX_AUTH_RESPONSE_SIZE} bytes")
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return status, b"".join(chunks)
        elif isinstance(event, h11.ConnectionClosed):
            raise AuthQueryError("connection closed before the answer was complete")
        # h11.InformationalResponse (1xx): wait for the real answer


async def query_auth_servers(
    addresses: Sequence[str],
    remote_ip: str,
    tls: bool,
    secret: bytes | str,
    common_name: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
    method: str = "get",
    rng: random.Random | None = None,
) -> AuthState:
    """nsqd's ``QueryAnyAuthd``: from a random start, the first server that answers validly.

    Raises ``AuthQueryError`` (the last server's failure) when none does. ``ssl_context``
    verifies ``https://`` auth servers (nsqd uses ``--tls-root-ca-file`` for that).
    """
    if not addresses:
        raise AuthQueryError("no auth server configured")
    form = _form(remote_ip, tls, secret, common_name)
    start = (rng or random).randrange(len(addresses))
    last_error = AuthQueryError("no auth server answered")
    for i in range(len(addresses)):
        address = addresses[(start + i) % len(addresses)]
        try:
            return await query_auth_server(
                address,
                form,
                ssl_context=ssl_context,
                connect_timeout=connect_timeout,
                request_timeout=request_timeout,
                method=method,
            )
        except AuthQueryError as exc:
            log.warning("AUTH(%s): failed: %s", address, exc)
            last_error = exc
    raise last_error


class AuthService:
    """The daemon's auth servers and HTTP settings (one per daemon, shared by connections)."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
        method: str = "get",
        rng: random.Random | None = None,
    ) -> None:
        if method not in ("get", "post"):
            raise ValueError("--auth-http-request-method must be post or get")
        self.addresses = tuple(addresses)
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.method = method
        self.rng = rng

    @property
    def enabled(self) -> bool:
        """Auth is on when at least one server is configured (IDENTIFY's ``auth_required``)."""
        return bool(self.addresses)

    async def query(
        self, *, remote_ip: str, tls: bool, secret: bytes | str, common_name: str
    ) -> AuthState:
        """``query_auth_servers`` with this service's settings."""
        return await query_auth_servers(
            self.addresses,
            remote_ip,
            tls,
            secret,
            common_name,
            ssl_context=self.ssl_context,
            connect_timeout=self.connect_timeout,
            request_timeout=self.request_timeout,
            method=self.method,
            rng=self.rng,
        )


class ConnectionAuth:
    """One TCP connection's AUTH as a single awaitable object: the secret, the cached answer,
    and nsqd's checks.

    For code that may await per command (a simple server or a test); lmqd's own connections
    keep the session trio-free instead: ``lmqd.server.session`` checks the cached answer with
    the same ``check_authorized`` and asks ``AuthService.query`` through the connection when it
    must. Call ``auth()`` for the AUTH command and ``check()`` before PUB/MPUB/DPUB/SUB.
    Errors are ``ProtocolError`` with nsqd's codes, all fatal: ``E_AUTH_FAILED`` (no valid
    answer), ``E_UNAUTHORIZED``, ``E_AUTH_FIRST``.
    ``check_nowait`` is the plain-def fast path for the command loop: it only needs an await
    (``refresh``) once per ttl.
    """

    def __init__(self, service: AuthService, *, remote_ip: str) -> None:
        self.service = service
        self.remote_ip = remote_ip
        self.state: AuthState | None = None
        self._secret: bytes = b""
        self._tls = False
        self._common_name = ""

    @property
    def authed(self) -> bool:
        """nsqd's stats ``authed``: an answer that grants something is cached."""
        return self.state is not None and self.state.has_authorizations

    async def auth(self, secret: bytes, *, tls: bool, common_name: str) -> bytes:
        """AUTH: ask the servers; the response body to send, or ``ProtocolError``."""
        self._secret = secret
        self._tls = tls
        self._common_name = common_name
        await self.refresh()
        assert self.state is not None
        outcome = auth_outcome(self.state)
        if outcome is not None:
            raise outcome
        return auth_response_body(self.state)

    async def refresh(self) -> None:
        """Ask the servers again (the answer expired); ``E_AUTH_FAILED`` if none answers."""
        try:
            self.state = await self.service.query(
                remote_ip=self.remote_ip,
                tls=self._tls,
                secret=self._secret,
                common_name=self._common_name,
            )
        except AuthQueryError as exc:
            log.warning("AUTH(%s): failed: %s", self.remote_ip, exc)
            raise errors.auth_failed() from None

    def check_nowait(self, cmd: str, topic: str, channel: str | None, now: float) -> bool:
        """True if allowed; False if the answer expired (await ``refresh()``, then check
        again); ``ProtocolError`` if refused."""
        try:
            check_authorized(self.state, cmd, topic, channel, now)
        except AuthExpired:
            return False
        return True

    async def check(self, cmd: str, topic: str, channel: str | None = None) -> None:
        """The whole check for PUB/MPUB/DPUB (``channel=None``) or SUB, re-asking if expired."""
        if not self.check_nowait(cmd, topic, channel, trio.current_time()):
            await self.refresh()
            if not self.check_nowait(cmd, topic, channel, trio.current_time()):
                # A fresh answer with ttl > 0 cannot be expired at once; be safe anyway.
                raise errors.auth_failed()
