"""The console's calls to the daemons and lookupds, off the event loop.

Every call goes through lmqadmin's own blocking clients (``lmq_client.http.HTTPClient``,
``lmq_client.lookupd``), run in a worker thread: one client for the command line and the console,
one set of error strings (``HTTPError`` carries the daemon's ``{"message"}``, which the policy
editor shows at its field). A ``trio.CapacityLimiter`` bounds the threads (and so the requests
at once): the sampler asks each node once per interval, and a page that asks a daemon (the
message browser, a policy) asks one node at a time.

``requests`` counts every call made, for the benchmark's "load on the daemons" and for
``/debug/vars``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import trio

from lmq_client.http import HTTPClient, HTTPOptions
from lmq_client.lookupd import LookupdNode, lookup_nodes, lookupd_url

__all__ = ["MAX_THREADS", "Upstream"]

T = TypeVar("T")

MAX_THREADS = 16
"""Requests in flight at once: enough for every node of a large cluster to be sampled in one
round trip, few enough that a burst of page views cannot flood a daemon."""

ACCEPT_NSQ = {"Accept": "application/vnd.nsq; version=1.0"}


class Upstream:
    """The daemons' and lookupds' HTTP APIs, awaited from trio."""

    def __init__(self, options: HTTPOptions) -> None:
        self.options = options
        """Timeouts and TLS of every request (and the HTTPS ports learned, for all of them)."""
        self.requests = 0
        self._limiter = trio.CapacityLimiter(MAX_THREADS)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker thread; one request counted."""
        self.requests += 1
        call = functools.partial(fn, *args, **kwargs)
        return await trio.to_thread.run_sync(call, limiter=self._limiter)

    def node(self, address: str) -> HTTPClient:
        return HTTPClient(address, options=self.options)

    async def stats(self, address: str) -> dict[str, Any]:
        """A node's ``/stats?format=json`` with its clients."""
        return await self.run(self.node(address).stats, include_clients=True)

    async def info(self, address: str) -> dict[str, Any]:
        return await self.run(self.node(address).info)

    async def lookupd_nodes(self, lookupd: str) -> list[LookupdNode]:
        return await self.run(lookup_nodes, lookupd, options=self.options)

    async def lookupd_json(
        self, lookupd: str, path: str, params: Mapping[str, str] | None = None,
        method: str = "GET",
    ) -> Any:
        """``path`` on a lookupd: its JSON answer (an empty POST answer: None)."""
        url = lookupd_url(lookupd, path, dict(params or {}))
        data = await self.run(
            HTTPClient.fetch, url, address=lookupd, method=method, headers=ACCEPT_NSQ,
            options=self.options,
        )  # fmt: skip
        return json.loads(data) if data.strip() else None
