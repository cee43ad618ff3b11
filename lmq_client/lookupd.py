"""Finding daemons through lookupds (nsqlookupd's HTTP API, or lmqlookupd's).

- **Queries.** ``lookup_producers(address, topic)`` asks one lookupd which nodes have a topic
  (``GET /lookup?topic=``) and returns their TCP addresses (``broadcast_address:tcp_port``, as
  every NSQ client connects; ``lookup_http_producers``: their HTTP addresses, for readers by
  offset); ``lookup_nodes(address)`` lists every active node
  (``GET /nodes``), with its HTTP address and the topics tombstoned on it, for admin tools and
  publishers. An address is ``host:port`` or a URL (``http://host:port[/path]``): as in pynsq
  and go-nsq, a URL's path, when it is neither empty nor ``/``, replaces ``/lookup``. Requests
  send nsqd's ``Accept: application/vnd.nsq; version=1.0``; they are blocking
  (``urllib``, through ``lmq_client.http``), and the async consumer runs them in a worker thread.
- **The poll schedule** (go-nsq's: at once, then every ``lookupd_poll_interval`` after a random
  share of it) and **Discovery** (what a consumer connects to and drops, from the answers) are
  sans-IO: ``lmq_client.core.discovery``, re-exported here.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from lmq_client.core.discovery import (
    DEFAULT_POLL_INTERVAL,
    DEFAULT_POLL_JITTER,
    DEFAULT_TIMEOUT,
    DROP_AFTER_MISSES,
    Discovery,
    check_schedule,
    poll_times,
)
from lmq_client.errors import LmqClientError
from lmq_client.http import HTTPClient, HTTPError, HTTPOptions
from lmqd.net import format_address, split_address

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_POLL_JITTER",
    "DEFAULT_TIMEOUT",
    "DROP_AFTER_MISSES",
    "Discovery",
    "LookupdNode",
    "check_schedule",
    "lookup_http_producers",
    "lookup_nodes",
    "lookup_producers",
    "lookupd_addresses",
    "lookupd_url",
    "merge_nodes",
    "poll_times",
]

_LOOKUP_PATH = "/lookup"
_ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}


def lookupd_addresses(addresses: str | Sequence[str]) -> list[str]:
    """One lookupd address or many, checked (``ValueError`` naming a bad one)."""
    result = [addresses] if isinstance(addresses, str) else list(addresses)
    for address in result:
        lookupd_url(address, "/ping")
    return result


def lookupd_url(address: str, path: str = _LOOKUP_PATH, params: dict[str, str] | None = None
                ) -> str:  # fmt: skip
    """The URL of ``path`` on the lookupd at ``address`` (``host:port`` or ``http://...``).

    For ``/lookup``, a URL's own path (not empty, not ``/``) is used instead, as pynsq and
    go-nsq do, so a lookupd behind a proxy prefix still works.
    """
    if "://" in address:
        parts = urllib.parse.urlsplit(address)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"invalid lookupd address {address!r}: want HOST:PORT or http://...")
        base = f"{parts.scheme}://{parts.netloc}"
        if path == _LOOKUP_PATH and parts.path not in ("", "/"):
            path = parts.path
    else:
        split_address(address)  # raises ValueError naming the address
        base = f"http://{address}"
    return base + path + ("?" + urllib.parse.urlencode(params) if params else "")


def _get_json(
    address: str, path: str, params: dict[str, str] | None, timeout: float,
    options: HTTPOptions | None = None,
) -> Any:  # fmt: skip
    url = lookupd_url(address, path, params)
    data = HTTPClient.fetch(url, address=address, timeout=timeout, headers=_ACCEPT,
                            options=options)  # fmt: skip
    try:
        return json.loads(data)
    except ValueError:
        raise LmqClientError(f"lookupd {address}: answered with invalid JSON") from None


def lookup_producers(address: str, topic: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """The TCP addresses of the nodes the lookupd at ``address`` lists for ``topic``.

    An unknown topic (``404 TOPIC_NOT_FOUND``) has no producers. Raises ``ConnectionFailed``
    (unreachable), ``HTTPError`` (another error status) or ``LmqClientError`` (an answer that
    is not nsqlookupd's).
    """
    producers = _lookup(address, topic, timeout)
    return list(dict.fromkeys(_tcp_address(p, address) for p in producers))


def lookup_http_producers(
    address: str, topic: str, *, timeout: float = DEFAULT_TIMEOUT
) -> list[str]:
    """The HTTP addresses (``broadcast_address:http_port``) of the nodes the lookupd at
    ``address`` lists for ``topic``: where readers by offset (the Spark source) go. Raises as
    ``lookup_producers``."""
    found = []
    for producer in _lookup(address, topic, timeout):
        try:
            host = producer.get("broadcast_address") or producer["address"]
            found.append(format_address((str(host), int(producer["http_port"]))))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LmqClientError(f"lookupd {address}: malformed producer in /lookup") from None
    return list(dict.fromkeys(found))


def _lookup(address: str, topic: str, timeout: float) -> list[Any]:
    """The producers of ``/lookup?topic=`` (an unknown topic: none)."""
    try:
        data = _get_json(address, _LOOKUP_PATH, {"topic": topic}, timeout)
    except HTTPError as exc:
        if exc.status == 404:
            return []
        raise
    # nsqlookupd < 1.0 wrapped answers in {"status_code", "status_txt", "data"}.
    if isinstance(data, dict) and "producers" not in data and isinstance(data.get("data"), dict):
        data = data["data"]
    if not isinstance(data, dict) or not isinstance(data.get("producers"), list):
        raise LmqClientError(f"lookupd {address}: /lookup answer has no producers list")
    producers: list[Any] = data["producers"]
    return producers


@attrs.frozen
class LookupdNode:
    """One active node as ``/nodes`` lists it."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str = ""
    version: str = ""
    topics: tuple[str, ...] = ()
    tombstoned: frozenset[str] = frozenset()
    """Topics tombstoned on this node (nsqadmin tombstones a topic before deleting it)."""

    @property
    def tcp_address(self) -> str:
        return format_address((self.broadcast_address, self.tcp_port))

    @property
    def http_address(self) -> str:
        return format_address((self.broadcast_address, self.http_port))


def lookup_nodes(
    address: str, *, timeout: float = DEFAULT_TIMEOUT, options: HTTPOptions | None = None
) -> list[LookupdNode]:
    """Every active node the lookupd at ``address`` knows (``GET /nodes``); ``options``:
    timeouts and TLS for an ``https://`` lookupd (without them, ``timeout``)."""
    data = _get_json(address, "/nodes", None, timeout, options)
    if isinstance(data, dict) and "producers" not in data and isinstance(data.get("data"), dict):
        data = data["data"]
    if not isinstance(data, dict) or not isinstance(data.get("producers"), list):
        raise LmqClientError(f"lookupd {address}: /nodes answer has no producers list")
    nodes = []
    for item in data["producers"]:
        try:
            topics = [str(t) for t in item.get("topics") or []]
            # nsqlookupd sends both lists with the same length (nsqadmin relies on it)
            tombstones = [bool(b) for b in item.get("tombstones") or []]
            tombstones = (tombstones + [False] * len(topics))[: len(topics)]
            nodes.append(LookupdNode(
                broadcast_address=str(item["broadcast_address"]),
                tcp_port=int(item["tcp_port"]),
                http_port=int(item["http_port"]),
                hostname=str(item.get("hostname", "")),
                version=str(item.get("version", "")),
                topics=tuple(topics),
                tombstoned=frozenset(t for t, dead in zip(topics, tombstones, strict=True) if dead),
            ))  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LmqClientError(f"lookupd {address}: malformed node in /nodes") from None
    return nodes


def merge_nodes(answers: Iterable[Iterable[LookupdNode]]) -> list[LookupdNode]:
    """Nodes from several lookupds, one per TCP address (the first seen), sorted by it."""
    merged: dict[str, LookupdNode] = {}
    for nodes in answers:
        for node in nodes:
            merged.setdefault(node.tcp_address, node)
    return [merged[k] for k in sorted(merged)]


def _tcp_address(producer: Any, lookupd: str) -> str:
    try:
        # nsqlookupd < 0.2.29 called it "address"; pynsq still falls back to it.
        host = producer.get("broadcast_address") or producer["address"]
        port = int(producer["tcp_port"])
    except (KeyError, TypeError, ValueError, AttributeError):
        raise LmqClientError(f"lookupd {lookupd}: malformed producer in /lookup") from None
    return format_address((str(host), port))
