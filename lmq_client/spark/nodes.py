"""The source's nodes: finding a daemon's HTTP API from the address a user gives, telling two
spellings of one address apart from two daemons, and asking the lookupds.

One address for both sides. The sink publishes over TCP and takes the daemons' TCP addresses
(``address``); the source reads over HTTP (``GET /topic/read``). So that the same ``address``
serves both, the source asks the daemon where its HTTP API listens: it opens a TCP connection,
sends the magic and an IDENTIFY with ``"lmq_http_address": true`` (lmq's key, answered only to a
client that asks: docs/protocol.md) and closes the connection after the answer. IDENTIFY is
legal before TLS and AUTH, so this works against a daemon that requires either. nsqd ignores
the key (its answer has none): the source then says it needs lmqd. An address that answers in
HTTP is already an HTTP API (the source's ``address`` meant that before it meant the TCP
address) and is read as such.

A node's identity, the key of its offsets in the checkpoint and the ``node`` column, is its
HTTP address: as given (``httpAddress``), as the lookupds list it (``broadcast_address:
http_port``), or as IDENTIFY told it (its bound HTTP address, with the host the user gave when
the daemon listens on a wildcard address). Offsets JSON written by a user or read from a
checkpoint may spell a node otherwise (``localhost:4151`` for ``127.0.0.1:4151``, or its TCP
address): ``NodeSpellings`` finds the node a key means by port and resolved host.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import socket
import struct
from collections.abc import Iterable, Mapping

from lmq_client._util import USER_AGENT
from lmq_client.errors import ConnectionFailed
from lmqd.net import format_address, split_address
from lmqd.protocol.events import encode_identify
from lmqd.protocol.identify import HTTP_ADDRESS_KEY

__all__ = ["NodeSpellings", "http_address_of", "same_host"]

MAGIC = b"  V2"
_FRAME_HEAD = struct.Struct(">ii")
_FRAME_ERROR = 1
MAX_ANSWER = 64 * 1024
"""Bytes an IDENTIFY answer may take (nsqd's is ~300): past it, the peer is not a daemon."""
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def http_address_of(address: str, *, timeout: float) -> str:
    """The HTTP address of the daemon whose TCP address is ``address`` (or ``address`` itself
    when it is an HTTP API). Raises ``ConnectionFailed`` naming ``address`` and what went wrong:
    nothing listening, not a daemon, nsqd (no ``/topic/read``), no HTTP listener."""
    host, port = split_address(address)
    body = {"feature_negotiation": True, HTTP_ADDRESS_KEY: True, "user_agent": USER_AGENT}
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(MAGIC + encode_identify(body))
            answer = _read_answer(sock, address)
    except ConnectionFailed:
        raise
    except TimeoutError:
        raise ConnectionFailed(address, f"no answer within {timeout:g}s") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConnectionFailed(address, f"cannot connect ({reason})") from None
    if answer is None:
        return address  # an HTTP API: the address is the node's
    try:
        told = json.loads(answer).get(HTTP_ADDRESS_KEY)
    except (ValueError, AttributeError):
        told = None
    if told is None:
        raise ConnectionFailed(
            address, "not lmqd (nsqd?): its IDENTIFY answer has no HTTP address, and the source "
            "reads lmqd's /topic/read; give lmqd's address"
        )
    if not told:
        raise ConnectionFailed(address, "this lmqd has no HTTP listener (--http-address)")
    http_host, http_port = split_address(str(told))
    if http_host in _WILDCARDS:
        http_host = host  # listening everywhere: where we reached its TCP port
    return format_address((http_host, http_port))


def _read_answer(sock: socket.socket, address: str) -> bytes | None:
    """IDENTIFY's answer, or None when the peer speaks HTTP."""
    data = b""
    while True:
        if data.startswith(b"HTTP/"):
            return None
        if len(data) >= _FRAME_HEAD.size:
            size, frame_type = _FRAME_HEAD.unpack_from(data)
            if not 4 <= size <= MAX_ANSWER:
                break
            if len(data) >= 4 + size:
                text = data[8 : 4 + size]
                if frame_type == _FRAME_ERROR:
                    raise ConnectionFailed(address, text.decode("utf-8", "replace"))
                return text
        chunk = sock.recv(MAX_ANSWER)
        if not chunk:
            break
        data += chunk
    raise ConnectionFailed(address, "not an NSQ daemon (its answer to IDENTIFY is not NSQ's)")


@functools.lru_cache(maxsize=256)
def _resolved(host: str) -> frozenset[str]:
    """The IP addresses ``host`` stands for (itself if it cannot be resolved)."""
    try:
        return frozenset({ipaddress.ip_address(host).compressed})
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return frozenset({host.lower()})
    return frozenset(str(info[4][0]) for info in infos)


def same_host(a: str, b: str) -> bool:
    """Whether host names or IP addresses ``a`` and ``b`` name one machine (they resolve to a
    common IP address: ``localhost`` and ``127.0.0.1`` do)."""
    return a.lower() == b.lower() or bool(_resolved(a) & _resolved(b))


class NodeSpellings:
    """Which node a ``host:port`` names, among the known ones: the node itself, its TCP
    address (``also``), or either with another spelling of the host."""

    def __init__(self, nodes: Iterable[str] = (), also: Mapping[str, str] | None = None) -> None:
        self._aliases: dict[str, str] = {}
        for node in nodes:
            self.add(node)
        for alias, node in (also or {}).items():
            self.add(node, alias)

    def add(self, node: str, alias: str | None = None) -> None:
        """Know ``node`` (and ``alias``, another address of it: its TCP address)."""
        self._aliases.setdefault(node, node)
        if alias is not None:
            self._aliases.setdefault(alias, node)

    def node_of(self, key: str) -> str | None:
        """The node ``key`` names, or None if it names none of them."""
        found = self._aliases.get(key)
        if found is not None:
            return found
        try:
            host, port = split_address(key)
        except ValueError:
            return None
        for alias, node in self._aliases.items():
            other_host, other_port = split_address(alias)
            if other_port == port and same_host(host, other_host):
                return node
        return None
