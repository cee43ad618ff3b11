"""``lmqadmin forward TOPIC --to ADDR``: a topic's messages republished elsewhere, like nsq_to_nsq.

The source is consumed as every lmqadmin consumer does (``--tcp-address`` daemons and/or the
daemons ``--lookupd-http-address`` finds); batches (``relay.py``) are published to the
destination as one MPUB each, and every message of a batch is finished only after the
destination answered OK. When the destination refuses or cannot be reached, the batch is
requeued at the source with go-nsq's growing delay (``REQUEUE_DELAY_S`` times the attempt, at
most ``MAX_REQUEUE_DELAY_S``) and backoff, so the source holds the messages until the destination
is back: nothing is dropped, and a batch the destination stored but whose OK was lost is
forwarded again (at least once). With several ``--to`` the first that accepts a connection is
used, and the next ones when it fails.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import click
import trio
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from lmq_client.admin.common import (
    Settings,
    emit_json,
    handle_errors,
    json_option,
    make_console,
    name_option,
    parse_addresses,
)
from lmq_client.admin.relay import check_connected, open_consumer, relay, run_trio
from lmq_client.errors import ConnectionFailed, NSQError
from lmq_client.message import Message
from lmq_client.producer import Producer

__all__ = ["forward"]

log = logging.getLogger("lmq_client.admin.forward")

REQUEUE_DELAY_S = 1.0
"""Delay of a batch's first requeue when the destination fails (times the attempt): a
destination restarting for a few seconds gets its messages soon after it is back."""

MAX_REQUEUE_DELAY_S = 60.0
"""The longest requeue delay: under nsqd's --max-req-timeout (1 h) and short enough that a
destination back after an outage is caught up within a minute."""


class _Counts:
    def __init__(self) -> None:
        self.forwarded = 0
        self.batches = 0
        self.requeued = 0


async def _forward(
    settings: Settings,
    topic: str,
    channel: str,
    destinations: list[str],
    to_topic: str,
    batch_size: int,
    flush_interval: float,
    count: int | None,
    counts: _Counts,
    quiet: bool,
) -> str | None:
    consumer = open_consumer(
        settings, topic, channel, batch_size,
        requeue_delay=REQUEUE_DELAY_S, max_requeue_delay=MAX_REQUEUE_DELAY_S,
    )
    producer = Producer(destinations, connect_timeout=settings.timeout,
                        transport=settings.transport)
    console = make_console(err=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("forwarded {task.completed:,.0f} messages of {task.fields[src]} to "
                   "{task.fields[dst]} ({task.fields[requeued]:,} requeued)"),
        TimeElapsedColumn(), console=console, disable=quiet or not console.is_terminal,
    )
    task = progress.add_task("forward", total=None, src=f"{topic}/{channel}", dst=to_topic,
                             requeued=0)

    async def handle(batch: list[Message]) -> None:
        bodies = [m.body for m in batch]
        try:
            with trio.fail_after(settings.timeout * 2):  # connect, then the answer
                if len(bodies) == 1:
                    await producer.publish(to_topic, bodies[0])
                else:
                    await producer.mpub(to_topic, bodies)
        except (ConnectionFailed, NSQError, trio.TooSlowError) as exc:
            reason = str(exc) or "no answer in time"
            click.echo(f"forward: {to_topic} on {', '.join(destinations)}: {reason}; "
                       f"{len(batch)} message(s) requeued at the source", err=True)
            for message in batch:
                message.requeue(consumer.requeue_delay_for(message))
            counts.requeued += len(batch)
            progress.update(task, requeued=counts.requeued)
            return
        for message in batch:  # the destination stored them: the source may let go
            message.finish()
        counts.forwarded += len(batch)
        counts.batches += 1
        progress.advance(task, len(batch))

    # The destination first: an unreachable one is reported before anything is consumed.
    async with producer, consumer:
        check_connected(settings, consumer)
        progress.start()
        try:
            await relay(consumer, batch_size=batch_size, interval_s=flush_interval,
                        handle=handle, limit=count)
        finally:
            progress.stop()
        return producer.address


@click.command()
@click.argument("topic", callback=name_option("topic"))
@click.option("--to", "to", multiple=True, required=True, metavar="HOST:PORT",
              help="Destination daemon's TCP address; repeatable (fail-over, in order).")
@click.option("--to-topic", callback=name_option("topic"), metavar="TOPIC",
              help="Topic to publish to [default: TOPIC].")
@click.option("--channel", default="forward", show_default=True, callback=name_option("channel"),
              help="Source channel (durable: what arrives while forward is down waits).")
@click.option("--batch-size", "-b", default=200, show_default=True, type=click.IntRange(min=1),
              help="Most messages per MPUB (and in flight from the source).")
@click.option("--flush-interval", default=0.02, show_default=True,
              type=click.FloatRange(min=0.001, max=10), metavar="SECONDS",
              help="Longest a message waits for more to share its MPUB.")
@click.option("-n", "count", type=click.IntRange(min=1), help="Exit after N messages.")
@click.option("--quiet", "-q", is_flag=True, help="No progress display.")
@json_option
@click.pass_obj
@handle_errors
def forward(
    settings: Settings,
    topic: str,
    to: tuple[str, ...],
    to_topic: str | None,
    channel: str,
    batch_size: int,
    flush_interval: float,
    count: int | None,
    quiet: bool,
) -> None:
    """Republish a topic's messages to another daemon in MPUB batches (like nsq_to_nsq); each
    message is finished at the source only after the destination's OK."""
    destinations = parse_addresses(to, "--to")
    to_topic = to_topic or topic
    counts = _Counts()
    started = time.monotonic()
    address = run_trio(_forward, settings, topic, channel, destinations, to_topic, batch_size,
                       flush_interval, count, counts, quiet or settings.as_json)
    seconds = time.monotonic() - started
    result: dict[str, Any] = {
        "topic": topic, "channel": channel, "to": address, "to_topic": to_topic,
        "messages": counts.forwarded, "batches": counts.batches, "requeued": counts.requeued,
        "seconds": round(seconds, 3),
    }
    if settings.as_json:
        emit_json(result)
    else:
        click.echo(f"forwarded {counts.forwarded:,} messages from {topic}/{channel} to "
                   f"{to_topic} on {address} ({counts.requeued:,} requeued, {seconds:.2f}s)")
