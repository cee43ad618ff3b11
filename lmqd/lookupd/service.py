"""``LookupDaemon``: the registration DB, the V1 TCP listener and the HTTP API, run together.

``run`` binds both sockets first (so an address in use fails the start-up before anything is
served, and port 0 is resolved; ``bind`` does it alone, outside any nursery, for the CLI to
report the failure plainly), then serves them in its own nursery; ``task_status.started``
gets the bound addresses once both listen. The IDENTIFY answer carries the real ports, so a
lookupd started on port 0 still tells nodes where its HTTP API is.

HTTP is hypercorn's trio worker on a socket bound here (as ``lmqd.httpapi.server`` does for
lmqd), in the same trio run as the TCP side: both use the one DB with plain ``def`` calls, so
no locks are needed.
"""

from __future__ import annotations

import logging
import socket
from typing import cast

import attrs
import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app

from lmqd.gohttp import send_reason_phrases
from lmqd.lookup import IdentifyResponse
from lmqd.lookupd.db import RegistrationDB
from lmqd.lookupd.httpapi import LookupdHttpApi
from lmqd.lookupd.options import NSQLOOKUPD_COMPAT_VERSION, LookupdOptions
from lmqd.lookupd.tcp import TcpPeerHandler
from lmqd.lookupd.views import Settings, Views
from lmqd.net import bind_listener, format_address

__all__ = ["Addresses", "LookupDaemon"]

log = logging.getLogger("lmqd.lookupd")

Address = tuple[str, int]


@attrs.frozen
class Addresses:
    """Where a running daemon listens."""

    tcp: Address
    http: Address


def _bound(sock: socket.socket) -> Address:
    name = sock.getsockname()
    return str(name[0]), int(name[1])


def _hypercorn_config() -> Config:
    config = Config()
    errors = logging.getLogger("lmqd.lookupd.hypercorn")
    # hypercorn's own INFO line ("Running on ...") would duplicate ours; keep its warnings.
    errors.setLevel(logging.WARNING)
    config.errorlog = errors
    config.accesslog = None  # requests are logged by the API itself, as nsqlookupd does
    config.include_server_header = False  # nsqlookupd sends none
    # Clients send a request line and a few headers; 64 KiB bounds a connection's buffer.
    config.h11_max_incomplete_size = 64 * 1024
    return config


class LookupDaemon:
    """lmqlookupd: see the module docstring."""

    def __init__(self, options: LookupdOptions) -> None:
        self.options = options
        self.db = RegistrationDB()
        self._cancel = trio.CancelScope()
        self._sockets: tuple[socket.socket, socket.socket] | None = None

    def bind(self) -> Addresses:
        """Bind both listening sockets now (``run`` does it if this was not called); OSError
        (``TCP listen (<address>) failed - <reason>``) if one cannot be bound."""
        if self._sockets is None:
            tcp_sock = bind_listener("TCP", self.options.tcp_address)
            try:
                http_sock = bind_listener("HTTP", self.options.http_address)
            except BaseException:
                tcp_sock.close()
                raise
            self._sockets = (tcp_sock, http_sock)
        return Addresses(tcp=_bound(self._sockets[0]), http=_bound(self._sockets[1]))

    async def run(
        self, *, task_status: trio.TaskStatus[Addresses] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until ``shutdown()`` or cancellation."""
        options = self.options
        addresses = self.bind()
        assert self._sockets is not None
        tcp_sock, http_sock = self._sockets
        try:
            answer = IdentifyResponse(
                broadcast_address=options.broadcast_address,
                hostname=socket.gethostname(),
                tcp_port=addresses.tcp[1],
                http_port=addresses.http[1],
                version=NSQLOOKUPD_COMPAT_VERSION,
            )
            handler = TcpPeerHandler(self.db, answer)
            views = Views(
                self.db,
                Settings(
                    inactive_producer_timeout=options.inactive_producer_timeout_s,
                    tombstone_lifetime=options.tombstone_lifetime_s,
                    version=NSQLOOKUPD_COMPAT_VERSION,
                ),
            )
            app = cast(ASGIFramework, LookupdHttpApi(views))
            send_reason_phrases()  # HTTP/1.1 404 Not Found, as nsqlookupd writes it
            config = _hypercorn_config()
            sockets = Sockets(secure_sockets=[], insecure_sockets=[http_sock], quic_sockets=[])
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(tcp_sock))
            with self._cancel:
                async with trio.open_nursery() as nursery:
                    await nursery.start(trio.serve_listeners, handler.serve_socket, [listener])
                    log.info("TCP: listening on %s", format_address(addresses.tcp))
                    await nursery.start(
                        lambda task_status: worker_serve(
                            wrap_app(app, config.wsgi_max_body_size, "asgi"),
                            config,
                            sockets=sockets,
                            task_status=task_status,
                        )
                    )
                    log.info("HTTP: listening on %s", format_address(addresses.http))
                    task_status.started(addresses)
            log.info("TCP: closing %s", format_address(addresses.tcp))
            log.info("HTTP: closing %s", format_address(addresses.http))
        finally:
            self._sockets = None
            tcp_sock.close()
            http_sock.close()

    def shutdown(self) -> None:
        """Stop serving: ``run`` closes the listeners and every connection, then returns."""
        self._cancel.cancel()


