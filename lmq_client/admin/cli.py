"""``lmqadmin``: stats, topic/channel admin, pub, tail and bench against lmqd or nsqd.

With ``--lookupd-http-address`` the daemons are the nodes the lookupds list (``GET /nodes``)
rather than a fixed list: ``stats`` covers every node (one table, a node column), admin
actions go to the nodes that have the topic (a delete also removes it from the lookupds, as
nsqadmin does), ``pub`` spreads over the nodes with fail-over, ``tail`` and ``bench``'s readers
find the topic's producers through the lookupds as any consumer does.

Exit codes (docs/cli.md): 0 success; 1 the daemon refused (an HTTP or NSQ error, e.g.
TOPIC_NOT_FOUND); 2 bad usage, including invalid topic/channel names; 3 a daemon could not be
reached; 130 interrupted.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import random
import string
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, TypeVar

import click
import trio
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lmq_client._util import check_name
from lmq_client.errors import (
    ConnectionFailed,
    InvalidNameError,
    LmqClientError,
    NSQError,
    all_addresses_failed,
)
from lmq_client.http import HTTPClient, HTTPError
from lmq_client.lookupd import (
    LookupdNode,
    lookup_nodes,
    lookupd_addresses,
    lookupd_url,
    merge_nodes,
)
from lmq_client.transport import PLAIN, TransportOptions
from lmqd import NSQD_COMPAT_VERSION, __version__
from lmqd.net import split_address

__all__ = ["cli", "main"]

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
                    answers.append(lookup_nodes(address, timeout=self.timeout))
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
        return [HTTPClient(a, timeout=self.timeout) for a in self.http_addresses(topic)]


def _addresses(values: Iterable[str], option: str) -> list[str]:
    # Each value may itself be a comma- or space-separated list (handy in the environment).
    result = [a for v in values for a in v.replace(",", " ").split()]
    for address in result:
        try:
            split_address(address)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=option) from None
    return result


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"lmqadmin: error: {message}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Turn the clients' exceptions into a one-line message and the documented exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConnectionFailed as exc:
            _fail(f"cannot reach the daemon at {exc.address}: {exc.reason}", EXIT_UNREACHABLE)
        except InvalidNameError as exc:
            _fail(str(exc), EXIT_USAGE)
        except HTTPError as exc:
            _fail(f"{exc.address} answered HTTP {exc.status} {exc.message}", EXIT_REFUSED)
        except NSQError as exc:
            _fail(str(exc), EXIT_REFUSED)
        except LmqClientError as exc:
            _fail(str(exc), EXIT_REFUSED)
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


def _name(kind: str) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                check_name(kind, value)
            except InvalidNameError as exc:
                raise click.BadParameter(str(exc)) from None
        return value

    return callback


def _console(err: bool = False) -> Console:
    console = Console(stderr=err, highlight=False, soft_wrap=False)
    if not console.is_terminal:
        # Captured output (pipes, tests): wide enough that no column is squeezed or cut.
        console = Console(stderr=err, highlight=False, width=200)
    return console


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, sort_keys=False))


# -- the group ---------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__,
    "--version",
    prog_name="lmqadmin",
    message=f"%(prog)s v%(version)s (lmq {__version__}, nsqd-compatible v{NSQD_COMPAT_VERSION})",
)
@click.option(
    "--tcp-address", "tcp", multiple=True, envvar="LMQ_TCP_ADDRESS", metavar="HOST:PORT",
    help=f"Daemon TCP address, repeatable [env LMQ_TCP_ADDRESS; default {DEFAULT_TCP}].",
)
@click.option(
    "--http-address", "http", multiple=True, envvar="LMQ_HTTP_ADDRESS", metavar="HOST:PORT",
    help=f"Daemon HTTP address, repeatable [env LMQ_HTTP_ADDRESS; default {DEFAULT_HTTP}].",
)
@click.option(
    "--lookupd-http-address", "lookupd", multiple=True, envvar="LMQ_LOOKUPD_HTTP_ADDRESS",
    metavar="HOST:PORT|URL",
    help="Find the daemons through this lookupd, repeatable [env LMQ_LOOKUPD_HTTP_ADDRESS].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds to wait for a daemon.")
@click.option("-v", "--verbose", count=True, help="Log client activity to stderr (-vv: debug).")
@click.option("--tls", is_flag=True, help="TLS on TCP connections (go-nsq's tls_v1).")
@click.option("--tls-root-ca-file", metavar="PEM", type=click.Path(dir_okay=False),
              help="CA certificates that sign the daemon's (default: the system's). Implies --tls.")
@click.option("--tls-cert", metavar="PEM", type=click.Path(dir_okay=False),
              help="Client certificate, for --tls-client-auth-policy daemons. Implies --tls.")
@click.option("--tls-key", metavar="PEM", type=click.Path(dir_okay=False),
              help="Private key of --tls-cert.")
@click.option("--tls-insecure-skip-verify", is_flag=True,
              help="Don't verify the daemon's certificate. Implies --tls.")
@click.option("--snappy", is_flag=True, help="Snappy compression on TCP connections.")
@click.option("--deflate", is_flag=True, help="Deflate compression on TCP connections.")
@click.option("--deflate-level", default=6, show_default=True, type=click.IntRange(1, 9),
              help="Deflate level (the daemon caps it at its --max-deflate-level).")
@click.option("--auth-secret", envvar="LMQ_AUTH_SECRET", metavar="SECRET",
              help="Secret for daemons with --auth-http-address [env LMQ_AUTH_SECRET].")
@click.pass_context
def cli(
    ctx: click.Context,
    tcp: tuple[str, ...],
    http: tuple[str, ...],
    lookupd: tuple[str, ...],
    as_json: bool,
    timeout: float,
    verbose: int,
    tls: bool,
    tls_root_ca_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_insecure_skip_verify: bool,
    snappy: bool,
    deflate: bool,
    deflate_level: int,
    auth_secret: str | None,
) -> None:
    """Administer and exercise lmqd (or any nsqd): stats, topics, channels, pub, tail, bench."""
    if verbose:
        logging.basicConfig(
            level=logging.DEBUG if verbose > 1 else logging.INFO,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
    if snappy and deflate:
        raise click.UsageError("give --snappy or --deflate, not both")
    if tls_key and not tls_cert:
        raise click.UsageError("--tls-key needs --tls-cert")
    transport = TransportOptions(
        tls=tls or bool(tls_root_ca_file or tls_cert or tls_insecure_skip_verify),
        tls_root_ca_file=tls_root_ca_file,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_insecure_skip_verify=tls_insecure_skip_verify,
        snappy=snappy,
        deflate=deflate,
        deflate_level=deflate_level,
        auth_secret=auth_secret,
    )
    lookupds = [a for v in lookupd for a in v.replace(",", " ").split()]
    try:
        lookupd_addresses(lookupds)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--lookupd-http-address") from None
    tcp_list = _addresses(tcp, "--tcp-address")
    http_list = _addresses(http, "--http-address")
    settings = Settings(
        tcp_list or [DEFAULT_TCP],
        http_list or [DEFAULT_HTTP],
        as_json,
        timeout,
        transport,
        lookupds,
        tcp_given=bool(tcp_list),
        http_given=bool(http_list),
    )
    if isinstance(ctx.obj, Settings) and ctx.obj.as_json:
        settings.as_json = True
    ctx.obj = settings


def main() -> None:
    """The ``lmqadmin`` console script."""
    cli(prog_name="lmqadmin")


# -- stats -------------------------------------------------------------------------------------


@cli.command()
@click.argument("topic", required=False, callback=_name("topic"))
@click.argument("channel", required=False, callback=_name("channel"))
@click.option("--watch", "-w", is_flag=True, help="Refresh every --interval, like nsq_stat.")
@click.option("--interval", "-i", default=1.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds between samples (rates need two; 0 = one sample, no rates).")
@click.option("--count", "-c", type=click.IntRange(min=1), help="With --watch: stop after N.")
@json_option
@click.pass_obj
@handle_errors
def stats(
    settings: Settings,
    topic: str | None,
    channel: str | None,
    watch: bool,
    interval: float,
    count: int | None,
) -> None:
    """Topics and channels: depth, in-flight, deferred, rates, e2e latency (every node)."""
    from lmq_client.admin.stats import render_table, sample, snapshot_json

    clients = settings.http_clients(topic)
    if not clients:
        raise LmqClientError(
            f"the lookupds list no node{f' with topic {topic}' if topic else ''}"
        )
    if not watch:
        snap = sample(clients, topic, channel)
        if interval > 0:
            time.sleep(interval)
            snap = sample(clients, topic, channel, snap)
        if settings.as_json:
            _emit_json(snapshot_json(snap))
        else:
            _console().print(render_table(snap))
        return
    console = _console()
    previous = sample(clients, topic, channel)
    shown = 0
    live: Live | None = None
    if console.is_terminal and not settings.as_json:
        live = Live(render_table(previous), console=console, auto_refresh=False)
        live.start()
    try:
        while count is None or shown < count:
            time.sleep(interval)
            snap = sample(clients, topic, channel, previous)
            previous = snap
            shown += 1
            if settings.as_json:
                _emit_json(snapshot_json(snap))
            elif live is not None:
                live.update(render_table(snap), refresh=True)
            else:
                console.print(render_table(snap))
    finally:
        if live is not None:
            live.stop()


# -- topic / channel admin ---------------------------------------------------------------------

ACTIONS = ("create", "delete", "empty", "pause", "unpause")
_PAST = {"create": "created", "delete": "deleted", "empty": "emptied", "pause": "paused",
         "unpause": "unpaused"}


_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
         "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def _retention_ms(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """``7d``, ``12h``, ``90m``, ``30s``, ``500ms`` or ``0`` (none) in milliseconds."""
    if value is None:
        return None
    number, unit = _split_unit(value.strip().lower())
    if number is None or (unit not in _DURATION_MS and not (unit == "" and number == 0)):
        raise click.BadParameter(f"{value!r}: a duration such as 7d, 12h, 30m, 45s, 0")
    return round(number * _DURATION_MS.get(unit, 1))


def _retention_bytes(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """``10GB``, ``512MiB``, ``1000000`` or ``0`` (none) in bytes."""
    if value is None:
        return None
    number, unit = _split_unit(value.strip().lower())
    if number is None or unit not in _SIZE:
        raise click.BadParameter(f"{value!r}: a size such as 10GB, 512MiB, 1000000, 0")
    return round(number * _SIZE[unit])


def _split_unit(text: str) -> tuple[float | None, str]:
    digits = len(text) - len(text.lstrip("0123456789."))
    try:
        number = float(text[:digits])
    except ValueError:
        return None, ""
    return number, text[digits:]


@cli.command()
@click.argument("action", type=click.Choice((*ACTIONS, "policy")))
@click.argument("topic", callback=_name("topic"))
@click.option("--retention", metavar="DURATION", callback=_retention_ms,
              help="policy: keep the log this long after every channel passed it (7d, 12h, 0).")
@click.option("--retention-bytes", metavar="SIZE", callback=_retention_bytes,
              help="policy: keep up to this much of the log every channel passed (10GB, 0).")
@json_option
@click.pass_obj
@handle_errors
def topic(
    settings: Settings,
    action: str,
    topic: str,
    retention: int | None,
    retention_bytes: int | None,
) -> None:
    """create | delete | empty | pause | unpause a topic, on every daemon; policy shows or sets
    a topic's policy (lmqd)."""
    changes = {
        key: value
        for key, value in (("retention_ms", retention), ("retention_bytes", retention_bytes))
        if value is not None
    }
    if changes and action != "policy":
        raise click.UsageError("--retention and --retention-bytes go with policy")
    # With lookupds: create on every node, anything else on the nodes that have the topic.
    addresses = settings.http_addresses(None if action == "create" else topic)
    _require_nodes(addresses, topic)
    if action == "policy":
        policies = {}
        for address in addresses:
            client = HTTPClient(address, timeout=settings.timeout)
            policies[address] = policy = client.topic_policy(topic, changes)
            if not settings.as_json:
                shown = ", ".join(f"{k}={v}" for k, v in policy.items())
                click.echo(f"topic {topic} on {address}: {shown}")
        if settings.as_json:
            _emit_json({"topic": topic, "policies": policies})
        return
    for address in addresses:
        HTTPClient(address, timeout=settings.timeout).topic_action(action, topic)
        if not settings.as_json:
            click.echo(f"{_PAST[action]} topic {topic} on {address}")
    if action == "delete":
        _on_lookupds(settings, "/topic/delete", {"topic": topic})
    if settings.as_json:
        _emit_json({"action": action, "topic": topic, "nodes": addresses})


def _require_nodes(addresses: list[str], topic: str) -> None:
    if not addresses:
        raise LmqClientError(f"the lookupds list no node with topic {topic}")


def _on_lookupds(settings: Settings, path: str, params: dict[str, str]) -> None:
    """nsqadmin's delete: also drop the keys from every lookupd (a node's UNREGISTER keeps
    them), so the topic or channel leaves /topics and /channels."""
    for lookupd in settings.lookupd:
        url = lookupd_url(lookupd, path, params)
        try:
            HTTPClient.fetch(url, address=lookupd, timeout=settings.timeout, method="POST")
        except LmqClientError as exc:
            log.warning("lookupd %s: %s", lookupd, exc)


POSITION_HELP = "earliest, latest, an RFC 3339 time, Unix milliseconds or offset:N (lmqd)."


@cli.command()
@click.argument("action", type=click.Choice((*ACTIONS, "seek")))
@click.argument("topic", callback=_name("topic"))
@click.argument("channel", callback=_name("channel"))
@click.option("--from", "start", metavar="POS",
              help=f"create: where the channel starts reading: {POSITION_HELP}")
@click.option("--to", metavar="POS",
              help=f"seek: where the channel reads from next: {POSITION_HELP}")
@json_option
@click.pass_obj
@handle_errors
def channel(
    settings: Settings, action: str, topic: str, channel: str, start: str | None, to: str | None
) -> None:
    """create | delete | empty | pause | unpause | seek a channel, on every daemon."""
    if start is not None and action != "create":
        raise click.UsageError("--from goes with create")
    if (to is not None) != (action == "seek"):
        raise click.UsageError("seek needs --to (and only seek takes it)")
    addresses = settings.http_addresses(topic)
    _require_nodes(addresses, topic)
    offsets: dict[str, int] = {}
    for address in addresses:
        client = HTTPClient(address, timeout=settings.timeout)
        if to is not None:
            offsets[address] = offset = client.channel_seek(topic, channel, to)
            if not settings.as_json:
                click.echo(f"channel {topic}/{channel} on {address} reads from offset {offset}")
            continue
        client.channel_action(action, topic, channel, start=start)
        if not settings.as_json:
            click.echo(f"{_PAST[action]} channel {topic}/{channel} on {address}")
    if action == "delete":
        _on_lookupds(settings, "/channel/delete", {"topic": topic, "channel": channel})
    if settings.as_json:
        result: dict[str, Any] = {
            "action": action, "topic": topic, "channel": channel, "nodes": addresses,
        }
        if to is not None:
            result["offsets"] = offsets
        _emit_json(result)


# -- pub ---------------------------------------------------------------------------------------


def _read_messages(messages: Sequence[str], file: str | None) -> list[bytes]:
    if messages and file is not None:
        raise click.UsageError("give messages as arguments or with --file, not both")
    if messages:
        bodies = [m.encode() for m in messages]
    else:
        if file is None or file == "-":
            if file is None and sys.stdin.isatty():
                raise click.UsageError("no messages: give them as arguments, --file or on stdin")
            bodies = sys.stdin.buffer.read().split(b"\n")
        else:
            try:
                with open(file, "rb") as f:
                    bodies = f.read().split(b"\n")
            except OSError as exc:
                raise click.BadParameter(f"{file}: {exc.strerror}", param_hint="--file") from None
        bodies = [b.removesuffix(b"\r") for b in bodies]
    # NSQ rejects empty messages (nsqd's /mpub skips empty lines the same way).
    return [b for b in bodies if b]


@cli.command()
@click.argument("topic", callback=_name("topic"))
@click.argument("messages", nargs=-1)
@click.option("--file", "-f", "file", metavar="PATH",
              help="Read messages from PATH, one per line ('-' = stdin).")
@click.option("--batch-size", "-b", default=200, show_default=True,
              type=click.IntRange(min=1), help="Messages per MPUB.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@json_option
@click.pass_obj
@handle_errors
def pub(
    settings: Settings,
    topic: str,
    messages: tuple[str, ...],
    file: str | None,
    batch_size: int,
    quiet: bool,
) -> None:
    """Publish messages (arguments, --file or stdin, one per line) in MPUB batches."""
    from lmq_client.sync import Producer

    bodies = _read_messages(messages, file)
    if not bodies:
        raise click.UsageError("no messages to publish (empty input)")
    started = time.monotonic()
    batches = 0
    console = _console(err=True)
    progress = Progress(
        TextColumn("publishing to {task.fields[topic]}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, disable=quiet or not console.is_terminal,
    )
    addresses = settings.tcp_addresses()
    if settings.lookupd and not settings.tcp_given:
        random.shuffle(addresses)  # spread publishers over the nodes; the rest is fail-over
    with Producer(
        addresses, timeout=settings.timeout, transport=settings.transport
    ) as producer, progress:
        task = progress.add_task("pub", total=len(bodies), topic=topic)
        for i in range(0, len(bodies), batch_size):
            batch = bodies[i : i + batch_size]
            if len(batch) == 1:
                producer.publish(topic, batch[0])
            else:
                producer.mpub(topic, batch)
            batches += 1
            progress.advance(task, len(batch))
        address = producer.address
    seconds = time.monotonic() - started
    if settings.as_json:
        _emit_json({"topic": topic, "messages": len(bodies), "batches": batches,
                    "seconds": round(seconds, 6), "address": address})
    else:
        click.echo(f"published {len(bodies)} messages to {topic} on {address} "
                   f"({batches} batches, {seconds:.2f}s)")


# -- peek --------------------------------------------------------------------------------------


@cli.command()
@click.argument("topic", callback=_name("topic"))
@click.argument("channel", required=False, callback=_name("channel"))
@click.option("--state", type=click.Choice(("queued", "deferred", "in_flight")),
              default="queued", show_default=True, help="Which of the channel's messages.")
@click.option("-n", "count", default=10, show_default=True, type=click.IntRange(1, 1000),
              help="At most this many messages per daemon.")
@json_option
@click.pass_obj
@handle_errors
def peek(
    settings: Settings, topic: str, channel: str | None, state: str, count: int
) -> None:
    """Show a topic's or channel's messages without consuming them (lmqd): the topic's
    backlog, or the channel's queued, deferred or in-flight messages."""
    from lmq_client.admin.peek import render_peek

    if channel is None and state != "queued":
        raise click.UsageError(f"--state {state} needs a CHANNEL")
    addresses = settings.http_addresses(topic)
    _require_nodes(addresses, topic)
    answers = {
        address: HTTPClient(address, timeout=settings.timeout).peek(topic, channel, state, count)
        for address in addresses
    }
    if settings.as_json:
        _emit_json(answers)
        return
    console = _console()
    for address, doc in answers.items():
        render_peek(console, address, doc)


# -- tail --------------------------------------------------------------------------------------


@cli.command()
@click.argument("topic", callback=_name("topic"))
@click.option("-n", "count", type=click.IntRange(min=1), help="Exit after N messages.")
@click.option("--channel", callback=_name("channel"),
              help="Channel to consume from [default: tail<random>#ephemeral].")
@click.option("--max-in-flight", default=200, show_default=True, type=click.IntRange(min=1))
@click.option("--print-topic", is_flag=True, help="Prefix each message with 'TOPIC: '.")
@click.option("--from", "start", metavar="POS",
              help=f"Read the stored topic from POS on, consuming nothing: {POSITION_HELP}")
@json_option
@click.pass_obj
@handle_errors
def tail(
    settings: Settings,
    topic: str,
    count: int | None,
    channel: str | None,
    max_in_flight: int,
    print_topic: bool,
    start: str | None,
) -> None:
    """Print a topic's messages as they arrive, one per line (like nsq_tail); with --from, the
    messages stored from there on, then the new ones (lmqd)."""
    if start is not None:
        if channel is not None:
            raise click.UsageError("--from reads the topic itself, not a channel")
        try:
            _tail_from(settings, topic, start, count, print_topic)
        except KeyboardInterrupt:
            sys.exit(0)
        return
    if channel is None:
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
        channel = f"tail{suffix}#ephemeral"
    try:
        trio.run(_tail, settings, topic, channel, count, max_in_flight, print_topic)
    except KeyboardInterrupt:
        sys.exit(0)


TAIL_POLL_S = 0.2
"""How long ``tail --from`` waits before it asks again once it has read everything stored: a
human watching a terminal does not notice it, and a daemon answers the poll in microseconds."""


def _tail_from(
    settings: Settings, topic: str, start: str, count: int | None, print_topic: bool
) -> None:
    """``tail --from``: read every node's topic by offset (``/topic/read``), round robin."""
    out = sys.stdout.buffer
    prefix = f"{topic}: ".encode() if print_topic else b""
    clients = settings.http_clients()
    positions = {c.address: int(c.topic_offsets(topic, at=start)["offset"]) for c in clients}
    seen = 0
    while True:
        idle = True
        for client in clients:
            want = 1000 if count is None else min(1000, count - seen)
            messages, following = client.read(topic, positions[client.address], want)
            positions[client.address] = following
            for m in messages:
                idle = False
                if settings.as_json:
                    out.write(json.dumps({
                        "topic": topic, "node": client.address, "offset": m.offset,
                        "id": m.id.decode("ascii", "replace"), "timestamp": m.timestamp,
                        "attempts": m.attempts, **_json_body(m.body),
                    }).encode() + b"\n")
                else:
                    out.write(prefix + m.body + b"\n")
                seen += 1
                if count is not None and seen >= count:
                    out.flush()
                    return
            out.flush()
        if idle:
            time.sleep(TAIL_POLL_S)


def _json_body(body: bytes) -> dict[str, str]:
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(body).decode()}


async def _tail(
    settings: Settings,
    topic: str,
    channel: str,
    count: int | None,
    max_in_flight: int,
    print_topic: bool,
) -> None:
    from lmq_client.consumer import Consumer

    out = sys.stdout.buffer
    prefix = f"{topic}: ".encode() if print_topic else b""
    if count is not None:
        max_in_flight = min(max_in_flight, count)
    addresses = settings.tcp if settings.tcp_given or not settings.lookupd else []
    consumer = Consumer(
        topic, channel, addresses, lookupd_http_addresses=settings.lookupd,
        max_in_flight=max_in_flight, max_attempts=0, connect_timeout=settings.timeout,
        close_timeout=2.0, transport=settings.transport,
    )
    seen = 0
    async with consumer:
        if not consumer.connected_addresses and not settings.lookupd:
            raise ConnectionFailed(", ".join(settings.tcp), "no daemon accepted the subscription")
        async for message in consumer:
            if settings.as_json:
                line = json.dumps({
                    "topic": topic, "id": message.id.decode("ascii", "replace"),
                    "timestamp": message.timestamp, "attempts": message.attempts,
                    **_json_body(message.body),
                }).encode()
                out.write(line + b"\n")
            else:
                out.write(prefix + message.body + b"\n")
            out.flush()
            message.finish()
            seen += 1
            if count is not None and seen >= count:
                break


# -- bench -------------------------------------------------------------------------------------


@cli.command()
@click.option("--topic", default=None, callback=_name("topic"),
              help="Topic to use [default: a fresh bench-<random>, deleted afterwards].")
@click.option("--channel", default="bench", show_default=True, callback=_name("channel"))
@click.option("--channels", default=1, show_default=True, type=click.IntRange(min=1),
              help="Channels to consume (CHANNEL0..N-1 when more than one): each message is "
                   "consumed once per channel.")
@click.option("--writers", default=1, show_default=True, type=click.IntRange(min=0),
              help="Publishing processes.")
@click.option("--readers", default=1, show_default=True, type=click.IntRange(min=0),
              help="Consuming processes.")
@click.option("--batch-size", default=200, show_default=True, type=click.IntRange(min=1),
              help="Messages per MPUB.")
@click.option("--rdy", default=2500, show_default=True, type=click.IntRange(min=1),
              help="RDY (max in flight) per reader.")
@click.option("--size", default=100, show_default=True, type=click.IntRange(min=8),
              help="Message size in bytes (the first 8 carry the send time).")
@click.option("--duration", type=click.FloatRange(min=0.1),
              help="Seconds to publish for [default: 10 unless --count].")
@click.option("--count", type=click.IntRange(min=1),
              help="Messages to publish in total (with --writers 0: to consume).")
@click.option("--pipeline", default=4, show_default=True, type=click.IntRange(min=1),
              help="MPUBs in flight per writer.")
@click.option("--incompressible", is_flag=True,
              help="Random, all different bodies (default: one repeated body; measures "
                   "--snappy/--deflate at their worst).")
@click.option("--keep-topic", is_flag=True, help="Don't delete the bench topic afterwards.")
@click.option("--quiet", "-q", is_flag=True, help="No progress display.")
@json_option
@click.pass_obj
@handle_errors
def bench(
    settings: Settings,
    topic: str | None,
    channel: str,
    channels: int,
    writers: int,
    readers: int,
    batch_size: int,
    rdy: int,
    size: int,
    duration: float | None,
    count: int | None,
    pipeline: int,
    incompressible: bool,
    keep_topic: bool,
    quiet: bool,
) -> None:
    """Load test: writer and reader processes; msgs/s, MB/s and e2e latency percentiles."""
    from lmq_client.admin.bench import BenchConfig, format_report, run_bench

    if duration is not None and count is not None:
        raise click.UsageError("give --duration or --count, not both")
    if writers == 0 and readers == 0:
        raise click.UsageError("nothing to do: --writers and --readers are both 0")
    if duration is None and count is None:
        duration = 10.0
    fresh = topic is None
    if topic is None:
        topic = "bench-" + "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    if settings.lookupd and readers:
        _prepare_discovery(settings, topic, channel)
    config = BenchConfig(
        tcp=settings.tcp_addresses(), topic=topic, channel=channel, channels=channels,
        writers=writers, readers=readers, batch_size=batch_size, rdy=rdy, size=size,
        duration=duration, count=count, pipeline=pipeline, timeout=settings.timeout,
        transport=settings.transport, lookupd=settings.lookupd, incompressible=incompressible,
    )
    console = _console(err=True)
    report = run_bench(config, console=None if quiet or not console.is_terminal else console)
    if fresh and not keep_topic:
        for client in settings.http_clients():
            try:
                client.topic_action("delete", topic)
            except LmqClientError as exc:
                log.info("bench: could not delete %s: %s", topic, exc)
        _on_lookupds(settings, "/topic/delete", {"topic": topic})
    if settings.as_json:
        _emit_json(report)
    else:
        click.echo(format_report(report))
    if report.get("errors"):
        sys.exit(EXIT_REFUSED)


# A node registers a new topic with its lookupds within milliseconds; 10 s covers a busy machine.
DISCOVERY_WAIT = 10.0


def _prepare_discovery(settings: Settings, topic: str, channel: str) -> None:
    """Before readers that discover: the topic and channel on every node, and every node listed
    for the topic by the lookupds (readers query once, as a consumer's first poll does)."""
    from lmq_client.lookupd import lookup_producers

    nodes = settings.nodes()
    if not nodes:
        raise LmqClientError("the lookupds list no node")
    for node in nodes:
        client = HTTPClient(node.http_address, timeout=settings.timeout)
        client.topic_action("create", topic)
        client.channel_action("create", topic, channel)
    wanted = {n.tcp_address for n in nodes}
    deadline = time.monotonic() + DISCOVERY_WAIT
    while True:
        listed: set[str] = set()
        for lookupd in settings.lookupd:
            try:
                listed.update(lookup_producers(lookupd, topic, timeout=settings.timeout))
            except LmqClientError as exc:
                log.info("lookupd %s: %s", lookupd, exc)
        if wanted <= listed:
            return
        if time.monotonic() > deadline:
            raise LmqClientError(f"the lookupds list {sorted(listed)} for {topic}, "
                                 f"not every node of {sorted(wanted)}")
        time.sleep(0.05)
