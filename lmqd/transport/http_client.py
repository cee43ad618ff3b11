"""HttpClient: requests to one HTTP(S) server over a kept-alive connection, on trio.

What lmqd asks of other daemons' HTTP APIs: a mirror asks its primary (``lmqd.mirror``) several
times a second, so the connection is kept between requests (HTTP/1.1 keep-alive) instead of one
TCP (and TLS) handshake per request; the auth servers' one-off queries
(``lmqd.transport.auth_http``) share ``open_stream``. h11, the sans-I/O HTTP/1.1 codec hypercorn
is built on, speaks the protocol; this module only moves bytes.

One request at a time per client (a caller that needs two at once makes two clients). A request
on a kept connection that fails before any byte of the answer arrived (the server closed an idle
connection) is sent once more on a new one, as browsers and Go's net/http do for idempotent
requests: the caller's requests must be safe to repeat. Every failure -- no connection, a timeout,
a broken connection, something that does not speak HTTP -- is an ``HttpClientError`` whose text
says which.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence

import attrs
import h11
import trio

__all__ = ["HttpAnswer", "HttpClient", "HttpClientError", "open_stream"]

RECEIVE_SIZE = 256 * 1024
"""Bytes asked for per read: a mirror's answers are up to a few MiB of messages."""


class HttpClientError(Exception):
    """A request that got no complete HTTP answer; ``str()`` says why. ``unreachable``: no
    connection could be made, or nothing came back in time (as opposed to an answer that is
    not HTTP)."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@attrs.frozen
class HttpAnswer:
    """A complete answer: status, headers (names in lower case) and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


async def open_stream(
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None,
    connect_timeout: float,
) -> trio.abc.Stream:
    """A TCP connection (TLS with ``ssl_context``, its handshake done) within
    ``connect_timeout``; raises ``HttpClientError``."""
    stream: trio.abc.Stream | None = None
    try:
        with trio.move_on_after(connect_timeout):
            stream = await trio.open_tcp_stream(host, port)
            if ssl_context is not None:
                stream = trio.SSLStream(
                    stream, ssl_context, server_hostname=host, https_compatible=True
                )
                await stream.do_handshake()
            return stream
    except OSError as exc:
        if stream is not None:
            await trio.aclose_forcefully(stream)
        raise HttpClientError(f"cannot connect ({exc.strerror or exc})", unreachable=True) from None
    except trio.BrokenResourceError as exc:
        if stream is not None:
            await trio.aclose_forcefully(stream)
        raise HttpClientError(f"TLS handshake failed ({exc.__cause__ or exc})") from None
    except BaseException:
        if stream is not None:
            await trio.aclose_forcefully(stream)
        raise
    if stream is not None:
        await trio.aclose_forcefully(stream)
    raise HttpClientError(f"cannot connect within {connect_timeout:g}s", unreachable=True)


class HttpClient:
    """Requests to ``host:port`` (HTTPS with ``ssl_context``) on one kept-alive connection."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 2.0,
        request_timeout: float = 30.0,
        max_answer: int = 64 * 1024 * 1024,
        user_agent: str = "lmqd",
    ) -> None:
        self.host = host
        self.port = port
        self._ssl = ssl_context
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        """Longest a whole request may take (a long poll's wait included)."""
        self.max_answer = max_answer
        """Largest body accepted: past it the answer is refused, not buffered."""
        self._user_agent = user_agent
        self._stream: trio.abc.Stream | None = None
        self._conn: h11.Connection | None = None

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def request(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
    ) -> HttpAnswer:
        """One request (``target``: path and query); the answer whatever its status. Raises
        ``HttpClientError``."""
        try:
            with trio.fail_after(self.request_timeout):
                if self._stream is not None:
                    try:
                        return await self._exchange(method, target, body, headers)
                    except _Stale:
                        await self.aclose()  # closed while idle: once more on a new one
                return await self._exchange(method, target, body, headers)
        except trio.TooSlowError:
            await self.aclose()
            raise HttpClientError(
                f"no answer within {self.request_timeout:g}s", unreachable=True
            ) from None
        except _Stale:
            await self.aclose()
            raise HttpClientError("connection closed before an answer", unreachable=True) from None
        except HttpClientError:
            await self.aclose()
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            await self.aclose()
            raise HttpClientError(
                f"connection failed ({exc.__cause__ or exc})", unreachable=True
            ) from None
        except h11.ProtocolError as exc:
            await self.aclose()
            raise HttpClientError(f"not an HTTP answer ({exc})") from None

    async def aclose(self) -> None:
        """Close the kept connection (the next request opens another)."""
        stream, self._stream, self._conn = self._stream, None, None
        if stream is not None:
            await trio.aclose_forcefully(stream)

    async def _exchange(
        self, method: str, target: str, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> HttpAnswer:
        if self._stream is None:
            self._stream = await open_stream(
                self.host, self.port, ssl_context=self._ssl, connect_timeout=self.connect_timeout
            )
            self._conn = h11.Connection(h11.CLIENT)
        stream, conn = self._stream, self._conn
        assert conn is not None
        fields = [("Host", self.netloc), ("User-Agent", self._user_agent), *headers]
        if body or method in ("POST", "PUT"):
            fields.append(("Content-Length", str(len(body))))
        out = conn.send(h11.Request(method=method, target=target, headers=fields))
        if body:
            out += conn.send(h11.Data(data=body))
        out += conn.send(h11.EndOfMessage())
        try:
            await stream.send_all(out)
        except (trio.BrokenResourceError, OSError):
            raise _Stale from None
        status = 0
        answer_headers: dict[str, str] = {}
        chunks: list[bytes] = []
        size = 0
        started = False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(RECEIVE_SIZE)
                if not data and not started:
                    raise _Stale
                started = True
                conn.receive_data(bytes(data))
            elif isinstance(event, h11.Response):
                status = event.status_code
                answer_headers = {
                    k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers
                }
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.max_answer:
                    raise HttpClientError(f"answer larger than {self.max_answer} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    await self.aclose()
                else:
                    conn.start_next_cycle()
                return HttpAnswer(status, answer_headers, b"".join(chunks))
            elif isinstance(event, h11.ConnectionClosed):
                if not started:
                    raise _Stale
                raise HttpClientError("connection closed before the answer was complete")
            # h11.InformationalResponse (1xx): wait for the real answer


class _Stale(Exception):
    """The kept connection was closed by the server before it answered (send again)."""
