"""Listening sockets for lmqlookupd, and its ``host:port`` address syntax.

Sockets are bound here, before anything is served, so that port 0 works (the real port is known
and reported before the first connection) and so that an address in use fails the start-up as a
whole, as ``net.Listen`` does in nsqlookupd. Addresses are written as Go writes them:
``127.0.0.1:4160``, ``[::1]:4160``.
"""

from __future__ import annotations

import socket

from lmqd.net import split_address

__all__ = ["BACKLOG", "bind_tcp"]

BACKLOG = 128
"""Listen backlog: nsqlookupd leaves Go's default (the kernel's somaxconn, 4096 on recent
Linux); registering nodes connect once and stay, so a short queue is never full."""


def bind_tcp(address: str) -> socket.socket:
    """A listening TCP socket on ``address`` (port 0: any free port); OSError if it can't be."""
    host, port = split_address(address, default_host="0.0.0.0")
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
