"""``lmqadmin web``: the console's command (docs/console.md).

It takes lmqadmin's group options as they are -- ``--http-address`` and
``--lookupd-http-address`` (repeatable) say which nodes to show, ``--timeout`` bounds every
request, the ``--tls*`` options are the HTTPS client's (a daemon whose plain port answers
``TLS_REQUIRED`` is asked on its HTTPS port, as nsqadmin does) and, with compression and
``--auth-secret``, the live tail's consumer's -- and adds nsqadmin's own where they apply:
``--base-path``, ``--admin-user`` with ``--acl-http-header``, ``--notification-http-endpoint``,
``--read-only``, the ``--http-client-*`` timeouts and TLS files (HTTP only, over the group's),
``--log-level`` and ``--log-prefix``. It listens on ``--listen`` (nsqadmin's
``--http-address``: port 4171, on loopback by default) until SIGINT or SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import sys
import urllib.parse

import attrs
import click
import trio

from lmq_client.admin.common import EXIT_USAGE, Settings, duration_ms_option, fail
from lmq_client.admin.web.config import (
    DEFAULT_ACL_HTTP_HEADER,
    DEFAULT_LISTEN,
    DEFAULT_SAMPLE_INTERVAL_S,
    ConsoleConfig,
)
from lmq_client.http import HTTPOptions
from lmq_client.transport import TransportOptions
from lmqd.net import split_address

__all__ = ["web"]

log = logging.getLogger("lmq_client.admin.web")

DEFAULT_CONNECT_TIMEOUT = "2s"
"""nsqadmin's ``--http-client-connect-timeout`` default."""
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
              "error": logging.ERROR, "fatal": logging.CRITICAL}
"""nsqadmin's ``--log-level`` names (case-insensitive), as Python's levels."""
DEFAULT_LOG_PREFIX = "[lmqadmin web] "


def _endpoint(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value:
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise click.BadParameter(f"{value!r}: an http:// or https:// URL")
    return value or None


def _positive_duration(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> int | None:
    """A Go-style duration (``2s``, ``500ms``, ``1m``) in ms, more than 0."""
    ms = duration_ms_option(ctx, param, value)
    if ms is not None and ms <= 0:
        raise click.BadParameter(f"{value!r}: must be more than 0")
    return ms


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
@click.option("--http-client-connect-timeout", default=DEFAULT_CONNECT_TIMEOUT,
              show_default=True, callback=_positive_duration, metavar="DURATION",
              help="Bound of connecting to a daemon or lookupd (nsqadmin's).")
@click.option("--http-client-request-timeout", callback=_positive_duration, metavar="DURATION",
              help="Bound of each wait for an answer (nsqadmin's) [default: --timeout].")
@click.option("--http-client-tls-root-ca-file", metavar="PEM", type=click.Path(dir_okay=False),
              help="CA of the daemons' HTTPS certificates (nsqadmin's) "
                   "[default: --tls-root-ca-file].")
@click.option("--http-client-tls-cert", metavar="PEM", type=click.Path(dir_okay=False),
              help="Client certificate for HTTPS (nsqadmin's) [default: --tls-cert].")
@click.option("--http-client-tls-key", metavar="PEM", type=click.Path(dir_okay=False),
              help="Key of --http-client-tls-cert (nsqadmin's) [default: --tls-key].")
@click.option("--http-client-tls-insecure-skip-verify", is_flag=True,
              help="Don't verify the daemons' HTTPS certificates (nsqadmin's).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(list(LOG_LEVELS), case_sensitive=False),
              help="Log verbosity (nsqadmin's; -v is debug too).")
@click.option("--log-prefix", default=DEFAULT_LOG_PREFIX, show_default=True,
              help="Prefix of every log line (nsqadmin's).")
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
    http_client_connect_timeout: int,
    http_client_request_timeout: int | None,
    http_client_tls_root_ca_file: str | None,
    http_client_tls_cert: str | None,
    http_client_tls_key: str | None,
    http_client_tls_insecure_skip_verify: bool,
    log_level: str,
    log_prefix: str,
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
    http = _http_options(
        settings,
        connect_timeout_ms=http_client_connect_timeout,
        request_timeout_ms=http_client_request_timeout,
        tls_files=(http_client_tls_root_ca_file, http_client_tls_cert, http_client_tls_key),
        tls_insecure_skip_verify=http_client_tls_insecure_skip_verify,
    )
    config = ConsoleConfig(
        http_addresses=tuple(dict.fromkeys(given)),
        lookupd_http_addresses=tuple(settings.lookupd),
        http=http,
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
        logging.basicConfig(level=LOG_LEVELS[log_level.lower()], stream=sys.stderr,
                            format=_log_format(log_prefix))  # fmt: skip
    elif "log_level" in _given(click.get_current_context()):
        root.setLevel(LOG_LEVELS[log_level.lower()])
    try:
        trio.run(_serve, config, listen)
    except OSError as exc:
        fail(str(exc.strerror or exc), EXIT_USAGE)
    except KeyboardInterrupt:
        pass


def _given(ctx: click.Context) -> set[str]:
    """The parameters given on the command line (not defaults)."""
    return {name for name in ctx.params
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE}


def _log_format(prefix: str) -> str:
    # A prefix is text, not a format: a "%" in it stays a "%".
    return prefix.replace("%", "%%") + "%(asctime)s %(levelname)s: %(message)s"


def _http_options(
    settings: Settings,
    *,
    connect_timeout_ms: int,
    request_timeout_ms: int | None,
    tls_files: tuple[str | None, str | None, str | None],
    tls_insecure_skip_verify: bool,
) -> HTTPOptions:
    """The console's HTTP client: the group's options, with the ``--http-client-*`` ones over
    them (TLS files given there replace the group's for HTTP; the tail keeps the group's)."""
    context = settings.http_options.tls_context
    if any(tls_files) or tls_insecure_skip_verify:
        ca_file, cert, key = tls_files
        try:
            context = TransportOptions(
                tls=True, tls_root_ca_file=ca_file, tls_cert=cert, tls_key=key,
                tls_insecure_skip_verify=tls_insecure_skip_verify,
            ).ssl_context()  # fmt: skip
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--http-client-tls-*") from None
    timeout_s = request_timeout_ms / 1000 if request_timeout_ms else settings.timeout
    return attrs.evolve(settings.http_options, timeout_s=timeout_s,
                        connect_timeout_s=connect_timeout_ms / 1000, tls_context=context)


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
