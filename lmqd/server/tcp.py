"""TCP listeners: accept V2 connections and run a ``TcpClient`` for each."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

import trio

from lmqd.server.client import TcpClient

if TYPE_CHECKING:
    from lmqd.daemon import LmqDaemon

log = logging.getLogger("lmqd.server")


def format_address(address: tuple[str, int]) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_tcp(
    daemon: LmqDaemon,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``--tcp-address`` and serve until cancelled; started = listening."""
    from lmqd.daemon import split_host_port

    host, port = split_host_port(daemon.options.tcp_address)
    listeners = await trio.open_tcp_listeners(port, host=host)
    sockname = listeners[0].socket.getsockname()
    bound = (str(sockname[0]), int(sockname[1]))
    log.info("TCP: listening on %s", format_address(bound))
    task_status.started(bound)
    await trio.serve_listeners(partial(_handle_connection, daemon), listeners)


async def _handle_connection(daemon: LmqDaemon, stream: trio.SocketStream) -> None:
    try:
        peer = stream.socket.getpeername()
        remote = format_address((str(peer[0]), int(peer[1])))
    except OSError:  # already reset by the peer
        await stream.aclose()
        return
    client = TcpClient(daemon, stream, remote)
    try:
        await client.serve()
    except Exception:
        # One connection's failure must never take the listener (and the daemon) down with it.
        log.exception("CLIENT(%s): connection handler failed", remote)
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()
