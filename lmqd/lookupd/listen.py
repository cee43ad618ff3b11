"""Listening sockets for lmqlookupd, and its ``host:port`` address syntax.

Sockets are bound here, before anything is served, so that port 0 works (the real port is known
and reported before the first connection) and so that an address in use fails the start-up as a
whole, as ``net.Listen`` does in nsqlookupd. Addresses are written as Go writes them:
``127.0.0.1:4160``, ``[::1]:4160``.
"""

from __future__ import annotations

import socket

__all__ = ["BACKLOG", "bind_tcp", "format_address", "split_host_port"]

BACKLOG = 128
"""Listen backlog: nsqlookupd leaves Go's default (the kernel's somaxconn, 4096 on recent
Linux); registering nodes connect once and stay, so a short queue is never full."""


def split_host_port(address: str) -> tuple[str, int]:
    """``"127.0.0.1:4160"`` / ``"[::1]:4160"`` / ``":4160"`` -> ``(host, port)``; ValueError
    for anything else. An empty host means every IPv4 interface."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"invalid address {address!r}: want host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid address {address!r}: an IPv6 host needs brackets")
    return host or "0.0.0.0", int(port)


def format_address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host (Go's ``net.JoinHostPort``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_tcp(address: str) -> socket.socket:
    """A listening TCP socket on ``address`` (port 0: any free port); OSError if it can't be."""
    host, port = split_host_port(address)
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As Go's net.Listen: a restarted daemon may rebind while old connections linger.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock
