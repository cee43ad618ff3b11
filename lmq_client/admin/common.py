"""What every ``lmqadmin`` command shares: the resolved group options (``Settings``), the
documented exit codes and the one-line error handling, ``--json``, name checks, the console
(width from the terminal or ``COLUMNS``) and the duration and size parsers.

Commands live in their own modules (``cli.py`` the group and the admin commands, ``archive.py``,
``forward.py``, ``pub_stream.py``) and import these; nothing here imports a command.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from lmq_client._util import check_name
from lmq_client.errors import (
    ConnectionFailed,
    InvalidNameError,
    LmqClientError,
    NSQError,
    all_addresses_failed,
)
from lmq_client.http import HTTPClient, HTTPError, HTTPOptions
from lmq_client.lookupd import LookupdNode, lookup_nodes, lookupd_url, merge_nodes
from lmq_client.transport import PLAIN, TransportOptions
from lmqd.net import split_address

log = logging.getLogger("lmq_client.admin")

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130

DEFAULT_TCP = "127.0.0.1:4150"
DEFAULT_HTTP = "127.0.0.1:4151"

F = TypeVar("F", bound=Callable[..., Any])


class Settings:
    """What the group options resolved to, passed to every command."""

    def __init__(
        self,
        tcp: list[str],
        http: list[str],
        as_json: bool,
        timeout: float,
        transport: TransportOptions = PLAIN,
        lookupd: list[str] | None = None,
        *,
        tcp_given: bool = True,
        http_given: bool = True,
    ) -> None:
        self.tcp = tcp
        self.http = http
        self.as_json = as_json
        self.timeout = timeout
        self.transport = transport
        self.lookupd = lookupd or []
        self.tcp_given = tcp_given
        """Whether --tcp-address was given (with lookupds, the default is not used)."""
        self.http_given = http_given
        self._nodes: list[LookupdNode] | None = None
        self._http_options: HTTPOptions | None = None

    @property
    def http_options(self) -> HTTPOptions:
        """Every HTTP request's timeout and TLS: the ``--tls*`` options' context, used when a
        daemon's plain port answers ``TLS_REQUIRED`` and for ``https://`` lookupds (made at the
        first request; unusable files: exit 2)."""
        if self._http_options is None:
            try:
                context = self.transport.ssl_context() if self.transport.tls else None
            except ValueError as exc:
                fail(str(exc), EXIT_USAGE)
            self._http_options = HTTPOptions(timeout_s=self.timeout, tls_context=context)
        return self._http_options

    def http_client(self, address: str) -> HTTPClient:
        """The daemon's HTTP API at ``address``, with these options."""
        return HTTPClient(address, options=self.http_options)

    def nodes(self) -> list[LookupdNode]:
        """The nodes the lookupds list now (asked once per command); [] without lookupds.

        A lookupd that cannot be reached is skipped; ``ConnectionFailed`` if none answers.
        """
        if not self.lookupd:
            return []
        if self._nodes is None:
            answers: list[list[LookupdNode]] = []
            failures: list[ConnectionFailed] = []
            for address in self.lookupd:
                try:
                    answers.append(lookup_nodes(address, options=self.http_options))
                except ConnectionFailed as exc:
                    log.info("lookupd %s: %s", address, exc)
                    failures.append(exc)
            if not answers:
                raise all_addresses_failed(failures)
            self._nodes = merge_nodes(answers)
        return self._nodes

    def http_addresses(self, topic: str | None = None) -> list[str]:
        """Daemons' HTTP addresses: the given ones, and (with lookupds) the nodes listed, only
        those that have ``topic`` when one is given."""
        given = self.http if self.http_given or not self.lookupd else []
        found = [n.http_address for n in self.nodes() if topic is None or topic in n.topics]
        return list(dict.fromkeys([*given, *found]))

    def tcp_addresses(self) -> list[str]:
        """Daemons' TCP addresses: the given ones, and (with lookupds) every node listed."""
        given = self.tcp if self.tcp_given or not self.lookupd else []
        return list(dict.fromkeys([*given, *(n.tcp_address for n in self.nodes())]))

    def http_clients(self, topic: str | None = None) -> list[HTTPClient]:
        return [self.http_client(a) for a in self.http_addresses(topic)]

    def post_to_lookupds(self, path: str, params: dict[str, str]) -> None:
        """nsqadmin's delete: also drop the keys from every lookupd (a node's UNREGISTER keeps
        them), so the topic or channel leaves /topics and /channels."""
        for lookupd in self.lookupd:
            url = lookupd_url(lookupd, path, params)
            try:
                HTTPClient.fetch(url, address=lookupd, method="POST", options=self.http_options)
            except LmqClientError as exc:
                log.warning("lookupd %s: %s", lookupd, exc)


def parse_addresses(values: Iterable[str], option: str) -> list[str]:
    # Each value may itself be a comma- or space-separated list (handy in the environment).
    result = [a for v in values for a in v.replace(",", " ").split()]
    for address in result:
        try:
            split_address(address)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=option) from None
    return result


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"lmqadmin: error: {message}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Turn the clients' exceptions into a one-line message and the documented exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConnectionFailed as exc:
            fail(f"cannot reach the daemon at {exc.address}: {exc.reason}", EXIT_UNREACHABLE)
        except InvalidNameError as exc:
            fail(str(exc), EXIT_USAGE)
        except HTTPError as exc:
            fail(f"{exc.address} answered HTTP {exc.status} {exc.message}", EXIT_REFUSED)
        except NSQError as exc:
            fail(str(exc), EXIT_REFUSED)
        except LmqClientError as exc:
            fail(str(exc), EXIT_REFUSED)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)

    return wrapper  # type: ignore[return-value]


def json_option(func: F) -> F:
    """``--json`` on a command as well as on the group (``lmqadmin stats --json`` works)."""

    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            ctx.ensure_object(Settings).as_json = True

    return click.option(
        "--json", "as_json", is_flag=True, expose_value=False, callback=callback,
        help="Machine-readable JSON output.",
    )(func)


def name_option(kind: str) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                check_name(kind, value)
            except InvalidNameError as exc:
                raise click.BadParameter(str(exc)) from None
        return value

    return callback


CAPTURED_WIDTH = 240
"""Width of tables written to a pipe or file when ``COLUMNS`` is not set: every column of a
``stats`` table with a node column and three e2e percentiles fits (about 230 characters), so
scripts see them all."""


def make_console(err: bool = False) -> Console:
    console = Console(stderr=err, highlight=False, soft_wrap=False)
    if not console.is_terminal:
        # Captured output (pipes, tests): COLUMNS when set (as a terminal's width), else wide
        # enough that no column is dropped.
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) > 0 else CAPTURED_WIDTH
        console = Console(stderr=err, highlight=False, width=width)
    return console


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, sort_keys=False))



def json_body(body: bytes) -> dict[str, str]:
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(body).decode()}


# -- durations and sizes -----------------------------------------------------------------------

DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
         "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def duration_ms_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """``7d``, ``12h``, ``90m``, ``30s``, ``500ms`` or ``0`` (none) in milliseconds."""
    if value is None:
        return None
    number, unit = split_unit(value.strip().lower())
    if number is None or (unit not in DURATION_MS and not (unit == "" and number == 0)):
        raise click.BadParameter(f"{value!r}: a duration such as 7d, 12h, 30m, 45s, 0")
    return round(number * DURATION_MS.get(unit, 1))


def size_bytes_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """``10GB``, ``512MiB``, ``1000000`` or ``0`` (none) in bytes."""
    if value is None:
        return None
    number, unit = split_unit(value.strip().lower())
    if number is None or unit not in SIZE_UNITS:
        raise click.BadParameter(f"{value!r}: a size such as 10GB, 512MiB, 1000000, 0")
    return round(number * SIZE_UNITS[unit])


def split_unit(text: str) -> tuple[float | None, str]:
    digits = len(text) - len(text.lstrip("0123456789."))
    try:
        number = float(text[:digits])
    except ValueError:
        return None, ""
    return number, text[digits:]
