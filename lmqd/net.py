"""Network addresses as lmq writes them: ``host:port``, ``[v6]:port`` — one parser, one formatter.

The daemon's listen flags, the HTTP API's answers, the clients' daemon lists and lmqadmin all go
through these two functions, so an address means the same thing everywhere (nsqd's Go
``net.SplitHostPort`` rules, plus a port range check Go does at listen time).
"""

from __future__ import annotations

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
