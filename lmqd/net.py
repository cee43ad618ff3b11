"""Network addresses as lmq writes them (``host:port``, ``[v6]:port``) and listening on them.

The daemons' listen flags, the HTTP API's answers, the clients' daemon lists and lmqadmin all go
through ``split_address`` / ``format_address``, so an address means the same thing everywhere
(Go's ``net.SplitHostPort`` rules, plus the port range check Go does at listen time); lmqd's and
lmqlookupd's listeners all bind through ``bind_listener``.
"""

from __future__ import annotations

import socket

MAX_PORT = 65535


def split_address(address: str, *, default_host: str | None = None) -> tuple[str, int]:
    """``"127.0.0.1:4150"`` / ``"[::1]:4150"`` -> ``(host, port)``.

    With ``default_host`` (a listen address) the host may be empty (``":4150"``) and the port 0
    (any free port); without it (an address to connect to) both are required. Raises
    ``ValueError`` with a message naming the address.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid address {address!r}: want HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid address {address!r}: an IPv6 host needs brackets")
    number = int(port)
    if number > MAX_PORT:
        raise ValueError(f"invalid address {address!r}: port {number} is out of range (0-65535)")
    if default_host is not None:
        return host or default_host, number
    if not host or number == 0:
        raise ValueError(f"invalid address {address!r}: want HOST:PORT")
    return host, number


def format_address(address: tuple[str, int] | tuple[str, int, int, int]) -> str:
    """``(host, port)`` (or a socket's 4-tuple for IPv6) -> ``"host:port"`` / ``"[v6]:port"``."""
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


BACKLOG = socket.SOMAXCONN
"""Listen backlog: Go's default, the kernel's limit (nsqd and nsqlookupd leave it so)."""


def bind_listener(what: str, address: str) -> socket.socket:
    """A listening TCP socket on ``address`` (port 0: any free port), bound before anything is
    served so that port 0 works and a start-up fails as a whole, as Go's ``net.Listen``.

    ``OSError`` worded as nsqd's: ``<what> listen (<address>) failed - <reason>`` (an address in
    use, a host that is not this machine's); ``ValueError`` for a malformed address.
    """
    host, port = split_address(address, default_host="0.0.0.0")
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise OSError(exc.errno, f"{what} listen ({address}) failed - {exc.strerror}") from None
    try:
        # As Go's net.Listen: a restarted daemon may rebind while old connections linger.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"{what} listen ({address}) failed - {exc.strerror}") from None
    except BaseException:
        sock.close()
        raise
    return sock
