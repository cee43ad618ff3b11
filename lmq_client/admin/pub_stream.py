"""``lmqadmin pub``: publish arguments, a file or stdin, streaming as to_nsq does.

Theory of operation. Input is read by a thread in chunks of whatever is available
(``read1``: it returns as soon as some bytes arrive, never waiting to fill the buffer) and handed
over through a bounded queue; the main thread cuts the chunks into messages at the delimiter
(``MessageSplitter``) and publishes. A message is published as soon as it has been read: when the
queue holds nothing more the pending messages go out at once (one PUB, or one MPUB for several),
so a line typed or piped in slowly reaches the daemon immediately, while a fast pipe
(``seq 1 1000000 | lmqadmin pub t``) fills MPUBs of up to ``--batch-size`` on its own. With
``--flush-interval`` the first pending message may wait that long for company, trading latency
for fewer, larger MPUBs. The queue's bound is the back-pressure: a daemon slower than the input
stops the reader, and so the process writing into the pipe.

``--rate N`` spaces messages N per second from the start (message i is not sent before
``start + i / N``), as to_nsq's ``--rate``; messages that are due go out together.
"""

from __future__ import annotations

import codecs
import queue
import random
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import click
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from lmq_client.admin.common import (
    Settings,
    duration_ms_option,
    emit_json,
    handle_errors,
    json_option,
    make_console,
    name_option,
)
from lmq_client.extension import message_ext
from lmq_client.sync import Producer
from lmqd.units import MiB

__all__ = ["MessageSplitter", "RateLimit", "pub"]

READ_CHUNK = 64 * 1024
"""Bytes asked of the input per read: a pipe's buffer is 64 KiB on Linux, so one read takes
everything a writer could have queued."""

QUEUED_CHUNKS = 64
"""Chunks the reader may be ahead of the publisher (4 MiB): enough to keep MPUBs full, small
enough that a stalled daemon stops the reader quickly."""

MAX_MESSAGE_BYTES = 16 * MiB
"""Longest input without a delimiter: sixteen times nsqd's default --max-msg-size (1 MiB), so
only input that is not delimited at all (a binary file, a wrong --delimiter) hits it, before it
can take the machine's memory."""


class MessageSplitter:
    """Cuts a byte stream into messages at ``delimiter``; empty messages are dropped (nsqd's
    ``/mpub`` skips empty lines), and with the newline delimiter a trailing ``\\r`` too."""

    def __init__(self, delimiter: bytes) -> None:
        if not delimiter:
            raise ValueError("the delimiter must not be empty")
        self.delimiter = delimiter
        self._partial = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes, in order."""
        parts = (self._partial + data).split(self.delimiter)
        self._partial = parts.pop()
        if len(self._partial) > MAX_MESSAGE_BYTES:
            raise click.UsageError(
                f"more than {MAX_MESSAGE_BYTES // MiB} MiB of input without a delimiter "
                f"({self.delimiter!r}): is --delimiter right?"
            )
        return self._clean(parts)

    def end(self) -> list[bytes]:
        """At the end of input: the last message, if it had no delimiter after it."""
        rest, self._partial = self._partial, b""
        return self._clean([rest])

    def _clean(self, parts: list[bytes]) -> list[bytes]:
        if self.delimiter == b"\n":
            parts = [p.removesuffix(b"\r") for p in parts]
        return [p for p in parts if p]


class RateLimit:
    """Message i may go at ``start + i / per_second`` (``per_second`` 0: no limit)."""

    def __init__(self, per_second: float, start: float) -> None:
        self.per_second = per_second
        self.start = start
        self.sent = 0

    def allowed(self, wanted: int, now: float) -> int:
        """How many of ``wanted`` messages may go at ``now``."""
        if self.per_second <= 0:
            return wanted
        due = int((now - self.start) * self.per_second) + 1 - self.sent
        return max(0, min(wanted, due))

    def next_at(self) -> float:
        """When the next message may go."""
        return self.start + self.sent / self.per_second

    def took(self, count: int) -> None:
        self.sent += count


_EOF = object()


def _reader(stream: IO[bytes], chunks: queue.Queue[Any]) -> None:
    read = getattr(stream, "read1", stream.read)
    try:
        while True:
            data = read(READ_CHUNK)
            if not data:
                break
            chunks.put(data)
    except BaseException as exc:  # handed to the main thread, which raises it
        chunks.put(exc)
        return
    chunks.put(_EOF)


def _messages_as_read(
    stream: IO[bytes], splitter: MessageSplitter, flush_interval: float, batch_size: int
) -> Iterator[list[bytes]]:
    """Groups of messages to publish now, as the input arrives (see the module docstring)."""
    chunks: queue.Queue[Any] = queue.Queue(QUEUED_CHUNKS)
    threading.Thread(target=_reader, args=(stream, chunks), daemon=True,
                     name="lmqadmin-pub-reader").start()
    pending: list[bytes] = []
    first_at = 0.0
    while True:
        if pending and chunks.empty():
            wait = first_at + flush_interval - time.monotonic()
            if wait <= 0:
                yield pending
                pending = []
                continue
            try:
                item = chunks.get(timeout=wait)
            except queue.Empty:
                continue
        else:
            item = chunks.get()
        if item is _EOF:
            pending.extend(splitter.end())
            if pending:
                yield pending
            return
        if isinstance(item, BaseException):
            raise item
        if not pending:
            first_at = time.monotonic()
        pending.extend(splitter.feed(item))
        while len(pending) >= batch_size:
            yield pending[:batch_size]
            pending = pending[batch_size:]
            first_at = time.monotonic()


def _delimiter(ctx: click.Context, param: click.Parameter, value: str) -> bytes:
    try:
        # "\n", "\t", "\0", "\x1e" as typed on a command line
        text = codecs.decode(value, "unicode_escape")
    except UnicodeDecodeError as exc:
        raise click.BadParameter(str(exc)) from None
    if not text:
        raise click.BadParameter("the delimiter must not be empty")
    return text.encode("utf-8")


def _headers(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    headers: dict[str, str] = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: KEY=VALUE")
        headers[key] = text
    return headers


@click.command()
@click.argument("topic", callback=name_option("topic"))
@click.argument("messages", nargs=-1)
@click.option("--file", "-f", "file", metavar="PATH",
              help="Read messages from PATH ('-' = stdin), as they are written.")
@click.option("--batch-size", "-b", default=200, show_default=True,
              type=click.IntRange(min=1), help="Most messages per MPUB.")
@click.option("--delimiter", "-d", default="\\n", show_default=True, callback=_delimiter,
              help="What separates messages in the input (escapes such as \\t, \\0 allowed).")
@click.option("--rate", type=click.FloatRange(min=0), default=0, metavar="N",
              help="Publish at most N messages per second (0: no limit).")
@click.option("--flush-interval", type=click.FloatRange(min=0, max=10), default=0,
              show_default=True, metavar="SECONDS",
              help="How long a message read may wait for more to share its MPUB.")
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", callback=_headers,
              help="lmq: a header on every message (repeatable; lmqd only).")
@click.option("--priority", type=click.IntRange(0, 9), metavar="N",
              help="lmq: every message's priority, 0-9 (lmqd only).")
@click.option("--ttl", metavar="DURATION", callback=duration_ms_option,
              help="lmq: every message's time to live, e.g. 10m (lmqd only).")
@click.option("--quiet", "-q", is_flag=True, help="No progress display.")
@json_option
@click.pass_obj
@handle_errors
def pub(
    settings: Settings,
    topic: str,
    messages: tuple[str, ...],
    file: str | None,
    batch_size: int,
    delimiter: bytes,
    rate: float,
    flush_interval: float,
    headers: dict[str, str],
    priority: int | None,
    ttl: int | None,
    quiet: bool,
) -> None:
    """Publish messages: arguments, or --file / stdin one per line, each as soon as it is read
    (like to_nsq). --header, --priority and --ttl set lmq's per-message fields."""
    fields: dict[str, Any] = {}
    if headers:
        fields["headers"] = headers
    if priority is not None:
        fields["priority"] = priority
    if ttl:
        fields["ttl"] = ttl / 1000
    try:
        message_ext(**fields)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if messages and file is not None:
        raise click.UsageError("give messages as arguments or with --file, not both")
    stream: IO[bytes] | None = None
    if not messages:
        if file is None or file == "-":
            if file is None and sys.stdin.isatty():
                raise click.UsageError("no messages: give them as arguments, --file or on stdin")
            stream = sys.stdin.buffer
        else:
            try:
                stream = open(file, "rb")  # noqa: SIM115 - closed in the finally below
            except OSError as exc:
                raise click.BadParameter(f"{file}: {exc.strerror}", param_hint="--file") from None
    started = time.monotonic()
    limit = RateLimit(rate, started)
    console = make_console(err=True)
    # Someone typing the messages (``-f -`` at a terminal) sees their own line: a spinner
    # redrawn on the terminal would write over it.
    typed = stream is sys.stdin.buffer and sys.stdin.isatty()
    progress = Progress(
        SpinnerColumn(),
        TextColumn("published {task.completed:,.0f} messages to {task.fields[topic]}"),
        TimeElapsedColumn(), console=console, disable=quiet or typed or not console.is_terminal,
    )
    addresses = settings.tcp_addresses()
    if settings.lookupd and not settings.tcp_given:
        random.shuffle(addresses)  # spread publishers over the nodes; the rest is fail-over
    if stream is None:
        bodies = [m.encode() for m in messages if m]
        groups: Iterator[list[bytes]] = iter(
            [bodies[i : i + batch_size] for i in range(0, len(bodies), batch_size)]
        )
    else:
        groups = _messages_as_read(stream, MessageSplitter(delimiter), flush_interval, batch_size)
    published = batches = 0
    try:
        with Producer(
            addresses, connect_timeout=settings.timeout, response_timeout=settings.timeout,
            transport=settings.transport,
        ) as producer, progress:
            producer.connect()  # an unreachable daemon is reported now, not at the first line
            task = progress.add_task("pub", total=None, topic=topic)
            for group in groups:
                while group:
                    now = time.monotonic()
                    count = limit.allowed(len(group), now)
                    if count == 0:
                        time.sleep(max(limit.next_at() - now, 0))
                        continue
                    batch, group = group[:count], group[count:]
                    if len(batch) == 1:
                        producer.publish(topic, batch[0], **fields)
                    else:
                        producer.mpub(topic, batch, **fields)
                    limit.took(len(batch))
                    published += len(batch)
                    batches += 1
                    progress.advance(task, len(batch))
            address = producer.address
    finally:
        if stream is not None and stream is not sys.stdin.buffer:
            stream.close()
    if not published:
        raise click.UsageError("no messages to publish (empty input)")
    seconds = time.monotonic() - started
    if settings.as_json:
        emit_json({"topic": topic, "messages": published, "batches": batches,
                   "seconds": round(seconds, 6), "address": address})
    else:
        click.echo(f"published {published} messages to {topic} on {address} "
                   f"({batches} batches, {seconds:.2f}s)")
