"""``serve_console``: the console on hypercorn's trio worker, with its sampler.

As lmqd's HTTP API (``lmqd/httpapi/server.py``): the socket is bound here, so ``--listen`` with
port 0 works and ``task_status.started`` reports the real address; hypercorn serves it until
cancelled. One nursery holds the sampler, the server and the notifications in flight.
"""

from __future__ import annotations

import logging
from typing import cast

import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app

from lmq_client.admin.web.app import Console
from lmq_client.admin.web.config import ConsoleConfig
from lmq_client.admin.web.notify import Notifier
from lmq_client.admin.web.sampler import Sampler
from lmq_client.admin.web.upstream import Upstream
from lmqd.net import bind_listener, format_address

__all__ = ["serve_console"]

log = logging.getLogger("lmq_client.admin.web")


def _hypercorn_config() -> Config:
    config = Config()
    errors = logging.getLogger("lmq_client.admin.web.hypercorn")
    errors.setLevel(logging.WARNING)
    config.errorlog = errors
    config.accesslog = None  # the console logs its own request lines
    config.include_server_header = False
    return config


async def serve_console(
    config: ConsoleConfig,
    listen: str,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the console on ``listen`` (``host:port``, port 0 allowed) until cancelled."""
    sock = bind_listener("HTTP", listen)
    try:
        sockname = sock.getsockname()
        bound = (str(sockname[0]), int(sockname[1]))
        upstream = Upstream(config.http)
        sampler = Sampler(config, upstream)
        async with trio.open_nursery() as nursery:
            await nursery.start(sampler.run)
            console = Console(config, upstream, sampler, Notifier(config, upstream, nursery))
            hypercorn = _hypercorn_config()
            sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
            app = cast(ASGIFramework, console)
            await nursery.start(
                lambda task_status: worker_serve(
                    wrap_app(app, hypercorn.wsgi_max_body_size, "asgi"),
                    hypercorn,
                    sockets=sockets,
                    task_status=task_status,
                )
            )
            log.info("HTTP: listening on %s", format_address(bound))
            task_status.started(bound)
    finally:
        sock.close()
