"""``serve_http``: the HTTP API on hypercorn's trio worker.

The listening socket is bound here (not by hypercorn) so that ``--http-address`` with port 0
works and the real port is known before anything is served: ``task_status.started((host, port))``
reports it, and "started" means "listening" (connections made from then on queue in the
backlog until hypercorn accepts them). hypercorn serves that socket with its own trio worker
(``hypercorn.trio.run.worker_serve``) until the task is cancelled; there is no graceful drain
beyond hypercorn's, because the daemon cancels its listeners only when it is shutting down.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, cast

import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app

from lmqd.httpapi.api import HttpApi
from lmqd.httpapi.memory import track_gc_pauses

if TYPE_CHECKING:
    from lmqd.broker import Broker

__all__ = ["serve_http"]

log = logging.getLogger("lmqd.httpapi")

# nsqd leaves Go's default listen backlog (the kernel's somaxconn); this is hypercorn's default.
BACKLOG = 100


def _format(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As Go's net.Listen does: a restarted daemon may rebind while old connections linger.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _hypercorn_config() -> Config:
    config = Config()
    errors = logging.getLogger("lmqd.httpapi.hypercorn")
    # hypercorn's own INFO line ("Running on http://...") would duplicate ours; keep its
    # warnings and errors.
    errors.setLevel(logging.WARNING)
    config.errorlog = errors
    config.accesslog = None  # the API logs its own request lines, as nsqd does
    config.include_server_header = False  # nsqd sends none
    # Go's net/http has no request-header limit below 1 MiB; nsqd clients send small headers.
    config.h11_max_incomplete_size = 64 * 1024
    return config


async def serve_http(
    broker: Broker,
    address: str,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the nsqd HTTP API for ``daemon`` on ``address`` (``host:port``, port 0 allowed)
    until cancelled; ``task_status.started`` gets the bound ``(host, port)``."""
    from lmqd.net import split_address

    host, port = split_address(address, default_host="0.0.0.0")
    sock = _bind(host, port)
    try:
        sockname = sock.getsockname()
        bound = (str(sockname[0]), int(sockname[1]))
        # HttpApi speaks ASGI 3 with plain mappings rather than hypercorn's TypedDicts.
        app = cast(ASGIFramework, HttpApi(broker, http_port=bound[1]))
        config = _hypercorn_config()
        sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
        with track_gc_pauses():
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    lambda task_status: worker_serve(
                        wrap_app(app, config.wsgi_max_body_size, "asgi"),
                        config,
                        sockets=sockets,
                        task_status=task_status,
                    )
                )
                log.info("HTTP: listening on %s", _format(*bound))
                task_status.started(bound)
    finally:
        sock.close()
