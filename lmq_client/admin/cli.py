"""``lmqadmin``: the group, stats, topic/channel admin, peek and tail against lmqd or nsqd.

Commands with a module of their own are registered here: ``pub`` (``pub_stream.py``),
``bench`` (``bench_command.py``, its processes in ``bench.py``),
``archive`` (``archive.py``, ``files.py``) and ``forward`` (``forward.py``), the last two on
``relay.py``'s batching loop; ``common.py`` holds what every command shares (``Settings``, the
error handling, the console), ``stats.py``/``clients.py``/``columns.py`` the stats views.

With ``--lookupd-http-address`` the daemons are the nodes the lookupds list (``GET /nodes``)
rather than a fixed list: ``stats`` covers every node (one table, a node column), admin
actions go to the nodes that have the topic (a delete also removes it from the lookupds, as
nsqadmin does), ``pub`` spreads over the nodes with fail-over, ``tail``, ``archive``,
``forward`` and ``bench``'s readers find the topic's producers through the lookupds as any
consumer does.

Exit codes (docs/cli.md): 0 success; 1 the daemon refused (an HTTP or NSQ error, e.g.
TOPIC_NOT_FOUND, or ``stats`` of a topic no daemon has) or archive could not write; 2 bad usage,
including invalid topic/channel names; 3 a daemon could not be reached; 130 interrupted.
"""

from __future__ import annotations

import json
import logging
import random
import string
import sys
import time
from typing import Any

import click
import trio
from rich.live import Live

from lmq_client.admin.archive import archive
from lmq_client.admin.bench_command import bench
from lmq_client.admin.common import (
    DEFAULT_HTTP,
    DEFAULT_TCP,
    EXIT_REFUSED,
    Settings,
    duration_ms_option,
    emit_json,
    fail,
    handle_errors,
    json_body,
    json_option,
    make_console,
    name_option,
    parse_addresses,
    size_bytes_option,
)
from lmq_client.admin.forward import forward
from lmq_client.admin.mirror import mirror
from lmq_client.admin.positions import (
    POSITION_HELP,
    check_position,
    clamp_note,
    position_option,
    stored_range,
)
from lmq_client.admin.pub_stream import pub
from lmq_client.admin.rewrite import rewrite_at_rest
from lmq_client.admin.tail_hint import TAIL_HINT_AFTER_S, say_earlier_messages_hint
from lmq_client.admin.web.command import web
from lmq_client.errors import ConnectionFailed, LmqClientError
from lmq_client.lookupd import lookupd_addresses
from lmq_client.message import Message
from lmq_client.transport import TransportOptions
from lmqd import NSQD_COMPAT_VERSION, __version__
from lmqd.options import OVERFLOW_MODES

__all__ = ["cli", "main"]

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
    """Administer and exercise lmqd (or any nsqd): stats, topics, channels, pub, tail, archive,
    forward, bench."""
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
    tcp_list = parse_addresses(tcp, "--tcp-address")
    http_list = parse_addresses(http, "--http-address")
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
@click.argument("topic", required=False, callback=name_option("topic"))
@click.argument("channel", required=False, callback=name_option("channel"))
@click.option("--watch", "-w", is_flag=True, help="Refresh every --interval, like nsq_stat.")
@click.option("--interval", "-i", default=1.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds between samples (rates need two; 0 = one sample, no rates).")
@click.option("--count", "-c", type=click.IntRange(min=1), help="With --watch: stop after N.")
@click.option("--clients", "show_clients", is_flag=True,
              help="One row per connection (consumers and publishers) instead of per channel.")
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
    show_clients: bool,
) -> None:
    """Topics and channels: depth, in-flight, deferred, rates, e2e latency (every node); with
    --clients, every consumer and publisher."""
    from lmq_client.admin import clients as clients_view
    from lmq_client.admin import stats as stats_view

    http_clients = settings.http_clients(topic)
    if not http_clients:
        raise LmqClientError(
            f"the lookupds list no node{f' with topic {topic}' if topic else ''}"
        )
    console = make_console()

    def take(previous: Any) -> Any:
        if show_clients:
            return clients_view.sample_clients(http_clients, topic, channel, previous)
        return stats_view.sample(http_clients, topic, channel, previous)

    def render(snap: Any) -> Any:
        if show_clients:
            return clients_view.render_clients(snap, console.width)
        return stats_view.render_table(snap, console.width)

    def emit(snap: Any) -> None:
        if settings.as_json:
            emit_json(clients_view.clients_json(snap) if show_clients
                       else stats_view.snapshot_json(snap))
        else:
            console.print(render(snap))

    snap = take(None)
    if topic is not None:
        # nsqd answers an unknown topic with an empty list: say so, and exit non-zero.
        rows = snap if not show_clients else stats_view.sample(http_clients, topic, channel)
        problem = stats_view.missing(rows, topic, channel)
        if problem is not None and channel is not None:
            # nsqd leaves a topic out when the channel asked for is not in it: which is missing?
            problem = stats_view.missing(stats_view.sample(http_clients, topic), topic, None)
            problem = problem or f"channel {topic}/{channel} not found on {', '.join(snap.nodes)}"
        if problem is not None:
            fail(problem, EXIT_REFUSED)
    if not watch:
        if interval > 0:
            time.sleep(interval)
            snap = take(snap)
        emit(snap)
        return
    shown = 0
    live: Live | None = None
    if console.is_terminal and not settings.as_json:
        live = Live(render(snap), console=console, auto_refresh=False)
        live.start()
    try:
        while count is None or shown < count:
            time.sleep(interval)
            snap = take(snap)
            shown += 1
            if live is not None:
                live.update(render(snap), refresh=True)
            else:
                emit(snap)
    finally:
        if live is not None:
            live.stop()


# -- topic / channel admin ---------------------------------------------------------------------

ACTIONS = ("create", "delete", "empty", "pause", "unpause")
_PAST = {"create": "created", "delete": "deleted", "empty": "emptied", "pause": "paused",
         "unpause": "unpaused"}


@cli.command()
@click.argument("action", type=click.Choice((*ACTIONS, "policy")))
@click.argument("topic", callback=name_option("topic"))
@click.option("--retention", metavar="DURATION", callback=duration_ms_option,
              help="policy: keep the log this long after every channel passed it (7d, 12h, 0).")
@click.option("--retention-bytes", metavar="SIZE", callback=size_bytes_option,
              help="policy: keep up to this much of the log every channel passed (10GB, 0).")
@click.option("--ttl", metavar="DURATION", callback=duration_ms_option,
              help="policy: dead-letter or drop messages not delivered this long after their "
                   "publish (1h, 30m, 0).")
@click.option("--max-depth", type=click.IntRange(min=0),
              help="policy: most messages any channel may have waiting (0: unbounded).")
@click.option("--overflow", type=click.Choice(OVERFLOW_MODES),
              help="policy: at max-depth, refuse the publish or drop the oldest messages.")
@click.option("--rate", type=click.IntRange(min=0),
              help="policy: messages per second the topic accepts (0: no limit).")
@click.option("--burst", type=click.IntRange(min=0),
              help="policy: messages accepted at once above the rate (0: the rate).")
@click.option("--dedup-window", metavar="DURATION", callback=duration_ms_option,
              help="policy: drop a body equal to one published this recently (5m, 30s, 0).")
@click.option("--compression", metavar="CODEC",
              help="policy: how the log's new batches are compressed at rest: none, "
                   "zstd[:LEVEL], lz4, snappy, gzip[:LEVEL] (lmqd checks it).")
@click.option("--min-insync-mirrors", type=click.IntRange(min=0),
              help="policy: mirrors that must store a publish before its OK (0: none).")
@json_option
@click.pass_obj
@handle_errors
def topic(
    settings: Settings,
    action: str,
    topic: str,
    retention: int | None,
    retention_bytes: int | None,
    ttl: int | None,
    max_depth: int | None,
    overflow: str | None,
    rate: int | None,
    burst: int | None,
    dedup_window: int | None,
    compression: str | None,
    min_insync_mirrors: int | None,
) -> None:
    """create | delete | empty | pause | unpause a topic, on every daemon; policy shows or sets
    a topic's policy (lmqd)."""
    given: tuple[tuple[str, int | str | None], ...] = (
        ("retention_ms", retention),
        ("retention_bytes", retention_bytes),
        ("ttl_ms", ttl),
        ("max_depth", max_depth),
        ("overflow", overflow),
        ("publish_rate", rate),
        ("publish_burst", burst),
        ("dedup_window_ms", dedup_window),
        ("compression", compression),
        ("min_insync_mirrors", min_insync_mirrors),
    )
    changes = {key: value for key, value in given if value is not None}
    if changes and action != "policy":
        raise click.UsageError(
            "--retention, --retention-bytes, --ttl, --max-depth, --overflow, --rate, --burst, "
            "--dedup-window, --compression and --min-insync-mirrors go with policy"
        )
    # With lookupds: create on every node, anything else on the nodes that have the topic.
    addresses = settings.http_addresses(None if action == "create" else topic)
    _require_nodes(addresses, topic)
    if action == "policy":
        policies = {}
        for address in addresses:
            client = settings.http_client(address)
            policies[address] = policy = client.topic_policy(topic, changes)
            if not settings.as_json:
                shown = ", ".join(f"{k}={v}" for k, v in policy.items())
                click.echo(f"topic {topic} on {address}: {shown}")
        if settings.as_json:
            emit_json({"topic": topic, "policies": policies})
        return
    for address in addresses:
        settings.http_client(address).topic_action(action, topic)
        if not settings.as_json:
            click.echo(f"{_PAST[action]} topic {topic} on {address}")
    if action == "delete":
        settings.post_to_lookupds("/topic/delete", {"topic": topic})
    if settings.as_json:
        emit_json({"action": action, "topic": topic, "nodes": addresses})


def _require_nodes(addresses: list[str], topic: str) -> None:
    if not addresses:
        raise LmqClientError(f"the lookupds list no node with topic {topic}")


def _jitter(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not 0 <= value <= 1:
        raise click.BadParameter(f"{value}: a fraction from 0 to 1")
    return value


REDRIVE_CALL_MAX = 10_000
"""What one ``/channel/redrive`` call moves at most (lmqd's ``MAX_REDRIVE``): without ``--max``
lmqadmin calls again until a call moves fewer."""


@cli.command()
@click.argument("action", type=click.Choice((*ACTIONS, "seek", "policy", "redrive")))
@click.argument("topic", callback=name_option("topic"))
@click.argument("channel", callback=name_option("channel"))
@click.option("--from", "start", metavar="POS",
              help=f"create: where the channel starts reading: {POSITION_HELP} "
                   "redrive: the dead-letter topic to move messages back from.")
@click.option("--to", metavar="POS", callback=position_option,
              help=f"seek: where the channel reads from next: {POSITION_HELP}")
@click.option("--max", "max_count", type=click.IntRange(min=1), metavar="N",
              help="redrive: move at most this many messages (default: all).")
@click.option("--max-attempts", type=click.IntRange(0, 65535), metavar="N",
              help="policy: deliveries before a message is dead-lettered or dropped (0: no limit).")
@click.option("--dead-letter-topic", metavar="TOPIC",
              help='policy: where such messages go ("" : drop them).')
@click.option("--backoff", metavar="DURATION", callback=duration_ms_option,
              help="policy: server-side delay before retrying a timeout or REQ 0, doubling per "
                   "attempt (1s, 500ms, 0).")
@click.option("--backoff-max", metavar="DURATION", callback=duration_ms_option,
              help="policy: the cap of that delay (1m; 0: one hour).")
@click.option("--backoff-jitter", type=float, metavar="FRACTION", callback=_jitter,
              help="policy: fraction of the delay taken off at random, 0 to 1.")
@json_option
@click.pass_obj
@handle_errors
def channel(
    settings: Settings,
    action: str,
    topic: str,
    channel: str,
    start: str | None,
    to: str | None,
    max_count: int | None,
    max_attempts: int | None,
    dead_letter_topic: str | None,
    backoff: int | None,
    backoff_max: int | None,
    backoff_jitter: float | None,
) -> None:
    """create | delete | empty | pause | unpause | seek a channel, on every daemon; policy shows
    or sets a channel's policy, redrive moves dead letters back into it (lmqd)."""
    changes = {
        key: value
        for key, value in (
            ("max_attempts", max_attempts), ("dead_letter_topic", dead_letter_topic),
            ("backoff_ms", backoff), ("backoff_max_ms", backoff_max),
            ("backoff_jitter", backoff_jitter),
        )
        if value is not None
    }
    if changes and action != "policy":
        raise click.UsageError(
            "--max-attempts, --dead-letter-topic and --backoff* go with policy"
        )
    if start is not None and action not in ("create", "redrive"):
        raise click.UsageError("--from goes with create or redrive")
    if start is not None and action == "create":
        check_position(start, "--from")
    if (to is not None) != (action == "seek"):
        raise click.UsageError("seek needs --to (and only seek takes it)")
    if (max_count is not None) and action != "redrive":
        raise click.UsageError("--max goes with redrive")
    addresses = settings.http_addresses(topic)
    _require_nodes(addresses, topic)
    if action == "policy":
        _channel_policy(settings, addresses, topic, channel, changes)
        return
    if action == "redrive":
        if start is None:
            raise click.UsageError("redrive needs --from DEAD_LETTER_TOPIC")
        _channel_redrive(settings, addresses, topic, channel, start, max_count)
        return
    offsets: dict[str, int] = {}
    position = to if to is not None else start if action == "create" else None
    for address in addresses:
        client = settings.http_client(address)
        if position is not None and position.startswith("offset:"):
            # An offset outside what the daemon stores is clamped there: say so.
            where = f"channel {topic}/{channel} on {address}"
            note = clamp_note(position, where, stored_range(client, topic))
            if note is not None:
                click.echo(f"lmqadmin: note: {note}", err=True)
        if to is not None:
            offsets[address] = offset = client.channel_seek(topic, channel, to)
            if not settings.as_json:
                click.echo(f"channel {topic}/{channel} on {address} reads from offset {offset}")
            continue
        client.channel_action(action, topic, channel, start=start)
        if not settings.as_json:
            click.echo(f"{_PAST[action]} channel {topic}/{channel} on {address}")
    if action == "delete":
        settings.post_to_lookupds("/channel/delete", {"topic": topic, "channel": channel})
    if settings.as_json:
        result: dict[str, Any] = {
            "action": action, "topic": topic, "channel": channel, "nodes": addresses,
        }
        if to is not None:
            result["offsets"] = offsets
        emit_json(result)


def _channel_policy(
    settings: Settings, addresses: list[str], topic: str, channel: str, changes: dict[str, Any]
) -> None:
    policies = {}
    for address in addresses:
        client = settings.http_client(address)
        policies[address] = policy = client.channel_policy(topic, channel, changes)
        if not settings.as_json:
            shown = ", ".join(f"{k}={v}" for k, v in policy.items())
            click.echo(f"channel {topic}/{channel} on {address}: {shown}")
    if settings.as_json:
        emit_json({"topic": topic, "channel": channel, "policies": policies})


def _channel_redrive(
    settings: Settings,
    addresses: list[str],
    topic: str,
    channel: str,
    source: str,
    max_count: int | None,
) -> None:
    moved: dict[str, int] = {}
    for address in addresses:
        client = settings.http_client(address)
        total = 0
        while max_count is None or total < max_count:
            left = REDRIVE_CALL_MAX if max_count is None else max_count - total
            want = min(REDRIVE_CALL_MAX, left)
            got = client.channel_redrive(topic, channel, source, want)
            total += got
            if got < want:
                break
        moved[address] = total
        if not settings.as_json:
            click.echo(
                f"redrove {total} messages from {source} into {topic}/{channel} on {address}"
            )
    if settings.as_json:
        emit_json({"topic": topic, "channel": channel, "from": source, "moved": moved})


# -- commands in their own modules ------------------------------------------------------------

cli.add_command(pub)
cli.add_command(archive)
cli.add_command(forward)
cli.add_command(web)
cli.add_command(rewrite_at_rest)
cli.add_command(mirror)
cli.add_command(bench)


# -- peek --------------------------------------------------------------------------------------


@cli.command()
@click.argument("topic", callback=name_option("topic"))
@click.argument("channel", required=False, callback=name_option("channel"))
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
        address: settings.http_client(address).peek(topic, channel, state, count)
        for address in addresses
    }
    if settings.as_json:
        emit_json(answers)
        return
    console = make_console()
    for address, doc in answers.items():
        render_peek(console, address, doc)


# -- tail --------------------------------------------------------------------------------------


@cli.command()
@click.argument("topic", callback=name_option("topic"))
@click.option("-n", "count", type=click.IntRange(min=1), help="Exit after N messages.")
@click.option("--channel", callback=name_option("channel"),
              help="Channel to consume from [default: tail<random>#ephemeral].")
@click.option("--max-in-flight", default=200, show_default=True, type=click.IntRange(min=1))
@click.option("--print-topic", is_flag=True, help="Prefix each message with 'TOPIC: '.")
@click.option("--from", "start", metavar="POS", callback=position_option,
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
    # The hint is about tail's own new channel; a channel the user names is theirs to know.
    hint = channel is None
    if channel is None:
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
        channel = f"tail{suffix}#ephemeral"
    try:
        trio.run(_tail, settings, topic, channel, count, max_in_flight, print_topic, hint)
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
    positions: dict[str, int] = {}
    for c in clients:
        answer = c.topic_offsets(topic, at=start)
        note = clamp_note(start, f"tail {topic} on {c.address}",
                          (int(answer["earliest"]), int(answer["end"])))  # fmt: skip
        if note is not None:
            click.echo(f"lmqadmin: note: {note}", err=True)
        # Clamped as a channel's seek is: past the end is the end, too old the oldest.
        positions[c.address] = min(max(int(answer["offset"]), int(answer["earliest"])),
                                   int(answer["end"]))  # fmt: skip
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
                        "attempts": m.attempts, **json_body(m.body),
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


async def _tail(
    settings: Settings,
    topic: str,
    channel: str,
    count: int | None,
    max_in_flight: int,
    print_topic: bool,
    hint: bool,
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
    first: Message | None = None
    async with consumer:
        if not consumer.connected_addresses and not settings.lookupd:
            raise ConnectionFailed(", ".join(settings.tcp), "no daemon accepted the subscription")
        if hint:
            # Waiting for a message can be cancelled without losing one (nothing is taken yet).
            with trio.move_on_after(TAIL_HINT_AFTER_S):
                first = await consumer.__anext__()
            if first is None:
                await say_earlier_messages_hint(settings, topic, channel)
        message = first
        while True:
            if message is None:
                try:
                    message = await consumer.__anext__()
                except StopAsyncIteration:
                    break
            if settings.as_json:
                line = json.dumps({
                    "topic": topic, "id": message.id.decode("ascii", "replace"),
                    "timestamp": message.timestamp, "attempts": message.attempts,
                    **json_body(message.body),
                }).encode()
                out.write(line + b"\n")
            else:
                out.write(prefix + message.body + b"\n")
            out.flush()
            message.finish()
            seen += 1
            if count is not None and seen >= count:
                break
            message = None
