"""``lmqadmin bench``'s command line: its options, the bench topic's set-up and clean-up around
``bench.py``'s writer and reader processes (imported when the command runs: ``multiprocessing``
is not loaded for the other commands)."""

from __future__ import annotations

import random
import string
import sys
import time

import click

from lmq_client.admin.common import (
    EXIT_REFUSED,
    Settings,
    emit_json,
    handle_errors,
    json_option,
    log,
    make_console,
    name_option,
)
from lmq_client.errors import LmqClientError

__all__ = ["bench"]


@click.command()
@click.option("--topic", default=None, callback=name_option("topic"),
              help="Topic to use [default: a fresh bench-<random>, deleted afterwards].")
@click.option("--channel", default="bench", show_default=True, callback=name_option("channel"))
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
@click.option("--headers", "header_count", default=0, show_default=True,
              type=click.IntRange(0, 64), metavar="N",
              help="lmq: N small headers on every message (XPUB; lmqd only).")
@click.option("--dedup-ids", is_flag=True,
              help="lmq: a distinct dedup id on every message (XPUB; lmqd only).")
@click.option("--priority", default=0, show_default=True, type=click.IntRange(0, 9), metavar="N",
              help="lmq: priority N on every message (XPUB; lmqd only; 0: none).")
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
    header_count: int,
    dedup_ids: bool,
    priority: int,
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
        headers=header_count, dedup_ids=dedup_ids, priority=priority,
    )
    console = make_console(err=True)
    report = run_bench(config, console=None if quiet or not console.is_terminal else console)
    if fresh and not keep_topic:
        for client in settings.http_clients():
            try:
                client.topic_action("delete", topic)
            except LmqClientError as exc:
                log.info("bench: could not delete %s: %s", topic, exc)
        settings.post_to_lookupds("/topic/delete", {"topic": topic})
    if settings.as_json:
        emit_json(report)
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
        client = settings.http_client(node.http_address)
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
