"""A tiny auth server for tests: HTTP/1.1 on 127.0.0.1, port 0, answers chosen by the test.

``FakeAuthServer.answer`` is called with each parsed request and returns ``(status, body)``, or
None to never answer (for timeouts). Every request is kept in ``requests``. Start it with
``address = await nursery.start(server.run)``; it serves until the nursery is cancelled. With
an ``ssl_context`` it speaks HTTPS.
"""

from __future__ import annotations

import json
import math
import ssl
import urllib.parse
from collections.abc import Callable
from typing import Any

import attrs
import trio


@attrs.frozen
class AuthRequest:
    """One request the server received."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    time: float


Answer = tuple[int, bytes] | None


def grant(**overrides: Any) -> bytes:
    """A typical auth server answer: publish and subscribe on everything for an hour."""
    doc: dict[str, Any] = {
        "ttl": 3600,
        "identity": "test-user",
        "identity_url": "http://auth.invalid/test-user",
        "authorizations": [
            {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
        ],
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


class FakeAuthServer:
    def __init__(
        self,
        answer: Callable[[AuthRequest], Answer] | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.answer = answer or (lambda request: (200, grant()))
        self.ssl_context = ssl_context
        self.requests: list[AuthRequest] = []

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            serving: list[trio.abc.Listener[Any]] = list(listeners)
            if self.ssl_context is not None:
                serving = [
                    trio.SSLListener(listener, self.ssl_context, https_compatible=True)
                    for listener in listeners
                ]
            task_status.started(f"127.0.0.1:{port}")
            await trio.serve_listeners(self._handle, serving, handler_nursery=nursery)

    async def _handle(self, stream: trio.abc.Stream) -> None:
        try:
            request = await self._read_request(stream)
            if request is None:
                return
            self.requests.append(request)
            answer = self.answer(request)
            if answer is None:
                await trio.sleep(math.inf)
                return
            status, body = answer
            head = (
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            await stream.send_all(head.encode() + body)
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()

    async def _read_request(self, stream: trio.abc.Stream) -> AuthRequest | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            body += chunk
        path, _, query = target.partition("?")
        return AuthRequest(
            method=method,
            path=path,
            query=dict(urllib.parse.parse_qsl(query, keep_blank_values=True)),
            headers=headers,
            body=body,
            time=trio.current_time(),
        )
