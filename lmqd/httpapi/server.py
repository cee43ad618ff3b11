"""``serve_http``: the HTTP API on hypercorn's trio worker.

The listening socket is bound here (not by hypercorn) so that ``--http-address`` with port 0
works and the real port is known before anything is served: ``task_status.started((host, port))``
reports it, and "started" means "listening" (connections made from then on queue in the
backlog until hypercorn accepts them). hypercorn serves that socket with its own trio worker
(``hypercorn.trio.run.worker_serve``) until the task is cancelled; there is no graceful drain
beyond hypercorn's, because the daemon cancels its listeners only when it is shutting down.

HTTPS (``--https-address`` with ``--tls-cert``/``--tls-key``) is the same API on a second
listener whose connections hypercorn wraps in TLS with the daemon's own ``ssl.SSLContext`` (the
one the TCP ``tls_v1`` upgrade uses, client certificate policy included), as nsqd serves both
from one ``tls.Config``. With ``--tls-required=true`` the plain listener answers every request
``403 {"message": "TLS_REQUIRED", "https_port": N}`` (nsqd's exact body) and only HTTPS serves.
"""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING, cast

import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app

from lmqd.gohttp import send_reason_phrases
from lmqd.httpapi.api import HttpApi
from lmqd.memory import track_gc_pauses
from lmqd.net import bind_listener, format_address

if TYPE_CHECKING:
    from lmqd.broker import Broker
    from lmqd.mirror.service import Replication

__all__ = ["serve_http"]

log = logging.getLogger("lmqd.httpapi")

class _TLSConfig(Config):
    """hypercorn's Config serving TLS with the daemon's own context (hypercorn would build its
    own from file names, with HTTP/2 ciphers and ALPN that nsqd does not have)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._context = context

    @property
    def ssl_enabled(self) -> bool:
        return True

    def create_ssl_context(self) -> ssl.SSLContext:
        return self._context


def _hypercorn_config(tls: ssl.SSLContext | None = None) -> Config:
    config = Config() if tls is None else _TLSConfig(tls)
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
    tls: ssl.SSLContext | None = None,
    tls_required_https_port: int | None = None,
    replication: Replication | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the nsqd HTTP API for ``daemon`` on ``address`` (``host:port``, port 0 allowed)
    until cancelled; ``task_status.started`` gets the bound ``(host, port)``.

    ``tls``: serve HTTPS with this context. ``tls_required_https_port``: refuse every request
    with nsqd's ``TLS_REQUIRED`` answer naming that HTTPS port.
    """
    send_reason_phrases()  # HTTP/1.1 404 Not Found, as nsqd writes it
    sock = bind_listener("HTTPS" if tls is not None else "HTTP", address)
    try:
        sockname = sock.getsockname()
        bound = (str(sockname[0]), int(sockname[1]))
        # HttpApi speaks ASGI 3 with plain mappings rather than hypercorn's TypedDicts.
        api = HttpApi(broker, http_port=bound[1], tls_required_https_port=tls_required_https_port,
                      replication=replication)  # fmt: skip
        app = cast(ASGIFramework, api)
        config = _hypercorn_config(tls)
        if tls is None:
            sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
        else:
            sockets = Sockets(secure_sockets=[sock], insecure_sockets=[], quic_sockets=[])
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
                kind = "HTTP" if tls is None else "HTTPS"
                log.info("%s: listening on %s", kind, format_address(bound))
                task_status.started(bound)
    finally:
        sock.close()
