"""TCP listeners: accept V2 connections and run a ``TcpConnection`` for each."""

from __future__ import annotations

import logging
from functools import partial

import trio

from lmqd.broker import Broker
from lmqd.net import bind_listener, format_address
from lmqd.server.budget import BufferBudget
from lmqd.server.connection import TcpConnection
from lmqd.server.security import ServerSecurity

log = logging.getLogger("lmqd.server")


async def serve_tcp(
    broker: Broker,
    security: ServerSecurity | None = None,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``--tcp-address`` and serve until cancelled; started = listening.

    ``security`` is the daemon's TLS context and auth servers (built from the options if None).
    """
    if security is None:
        security = ServerSecurity.from_options(broker.options)
    sock = bind_listener("TCP", broker.options.tcp_address)
    listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock))]
    sockname = listeners[0].socket.getsockname()
    bound = (str(sockname[0]), int(sockname[1]))
    log.info("TCP: listening on %s", format_address(bound))
    # One budget for every connection: --max-buffered-bytes bounds their buffers together.
    budget = BufferBudget(broker.options.max_buffered_bytes)
    task_status.started(bound)
    await trio.serve_listeners(
        partial(_handle_connection, broker, security, budget), listeners
    )


async def _handle_connection(
    broker: Broker, security: ServerSecurity, budget: BufferBudget, stream: trio.SocketStream
) -> None:
    try:
        peer = stream.socket.getpeername()
        remote = format_address((str(peer[0]), int(peer[1])))
    except OSError:  # already reset by the peer
        await stream.aclose()
        return
    connection = TcpConnection(broker, stream, remote, security, budget)
    try:
        await connection.serve()
    except Exception:
        # One connection's failure must never take the listener (and the daemon) down with it.
        log.exception("CLIENT(%s): connection handler failed", remote)
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()
