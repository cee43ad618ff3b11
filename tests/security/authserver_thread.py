"""A deny-by-default auth server for subprocess tests: ``http.server`` in a thread.

The daemon under test runs in another process, so the auth server must answer without the test's
event loop: ``ThreadedAuthServer`` serves ``GET /auth`` on 127.0.0.1 (port 0) from a thread,
answers with ``answer(query)`` (a status and a JSON document) and records every query.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[dict[str, str]], tuple[int, dict[str, Any]]]


def deny_all(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """A valid answer that grants nothing (nsqd: ``E_UNAUTHORIZED``)."""
    return 200, {"ttl": 3600, "identity": "nobody", "authorizations": []}


def publish_on(topic_regex: str) -> Answer:
    """Grants ``publish`` on topics matching ``topic_regex`` (channels ``.*``), nothing else."""

    def answer(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        return 200, {
            "ttl": 3600,
            "identity": "publisher",
            "identity_url": "",
            "authorizations": [
                {"topic": topic_regex, "channels": [".*"], "permissions": ["publish"]}
            ],
        }

    return answer


def grant(*authorizations: dict[str, Any]) -> Answer:
    """A valid answer with these ``authorizations`` (an hour's ttl)."""

    def answer(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        return 200, {
            "ttl": 3600,
            "identity": "granted-user",
            "identity_url": "",
            "authorizations": list(authorizations),
        }

    return answer


class ThreadedAuthServer:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.queries: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
                outer.queries.append(query)
                status, doc = outer.answer(query)
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output quiet

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"


@contextmanager
def auth_server(answer: Answer) -> Iterator[ThreadedAuthServer]:
    """Run a ``ThreadedAuthServer`` for the duration of the ``with`` block."""
    server = ThreadedAuthServer(answer)
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()
        thread.join(5)
