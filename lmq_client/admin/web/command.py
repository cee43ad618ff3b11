"""``lmqadmin web``: the console's command (docs/console.md).

It takes lmqadmin's group options as they are -- ``--http-address`` and
``--lookupd-http-address`` (repeatable) say which nodes to show, ``--timeout`` bounds every
request, the TLS, compression and ``--auth-secret`` options are the live tail's consumer's --
and adds nsqadmin's own where they apply: ``--base-path``, ``--admin-user`` with
``--acl-http-header``, ``--notification-http-endpoint``, and ``--read-only``. It listens on
``--listen`` (nsqadmin's port, 4171, on loopback by default) until SIGINT or SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import sys
import urllib.parse

import click
import trio

from lmq_client.admin.common import EXIT_USAGE, Settings, fail
from lmq_client.admin.web.config import (
    DEFAULT_ACL_HTTP_HEADER,
    DEFAULT_LISTEN,
    DEFAULT_SAMPLE_INTERVAL_S,
    ConsoleConfig,
)
from lmqd.net import split_address

__all__ = ["web"]

log = logging.getLogger("lmq_client.admin.web")


def _endpoint(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value:
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise click.BadParameter(f"{value!r}: an http:// or https:// URL")
    return value or None


@click.command()
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="HOST:PORT",
              help="Where the console listens (port 0: any free port, logged).")
@click.option("--base-path", default="/", show_default=True, metavar="PATH",
              help="URL prefix of every page, behind a proxy that forwards it (nsqadmin's).")
@click.option("--read-only", is_flag=True,
              help="Show everything, change nothing: every action is refused.")
@click.option("--admin-user", "admin_users", multiple=True, metavar="USER",
              help="Only these users may act, named by --acl-http-header (repeatable).")
@click.option("--acl-http-header", default=DEFAULT_ACL_HTTP_HEADER, show_default=True,
              metavar="HEADER", help="The header an authenticating proxy sets to the user.")
@click.option("--notification-http-endpoint", callback=_endpoint, metavar="URL",
              help="POST nsqadmin's JSON notification to this URL after each action.")
@click.option("--sample-interval", default=DEFAULT_SAMPLE_INTERVAL_S, show_default=True,
              type=click.FloatRange(min=0.5, max=600), metavar="SECONDS",
              help="How often every node's /stats is sampled (pages, rates, charts).")
@click.pass_obj
def web(
    settings: Settings,
    listen: str,
    base_path: str,
    read_only: bool,
    admin_users: tuple[str, ...],
    acl_http_header: str,
    notification_http_endpoint: str | None,
    sample_interval: float,
) -> None:
    """The web console at nsqadmin's paths, and lmq's message browser, publish, replay, dead
    letters, policies, charts and live tail."""
    try:
        split_address(listen, default_host="0.0.0.0")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    if not acl_http_header.strip():
        raise click.BadParameter("must not be empty", param_hint="--acl-http-header")
    given = settings.http if settings.http_given or not settings.lookupd else []
    config = ConsoleConfig(
        http_addresses=tuple(dict.fromkeys(given)),
        lookupd_http_addresses=tuple(settings.lookupd),
        timeout_s=settings.timeout,
        transport=settings.transport,
        base_path=base_path,
        read_only=read_only,
        admin_users=frozenset(admin_users),
        acl_http_header=acl_http_header.strip(),
        notification_http_endpoint=notification_http_endpoint,
        sample_interval_s=sample_interval,
    )
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="[lmqadmin web] %(asctime)s %(levelname)s: %(message)s")
    try:
        trio.run(_serve, config, listen)
    except OSError as exc:
        fail(str(exc.strerror or exc), EXIT_USAGE)
    except KeyboardInterrupt:
        pass


async def _serve(config: ConsoleConfig, listen: str) -> None:
    # Imported here: the other lmqadmin commands need neither Jinja2 nor hypercorn.
    from lmq_client.admin.web.server import serve_console

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_console, config, listen)
            async for signum in signals:
                log.info("signal %d: exiting", signum)
                nursery.cancel_scope.cancel()
                break
