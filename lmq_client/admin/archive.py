"""``lmqadmin archive TOPIC --dir D``: a topic's messages into rotating files, like nsq_to_file.

The batching loop is ``relay.py``'s (FIN only after the batch is in the file); the files are
``files.py``'s (naming, gzip, rotation, durability). This module is the command: options, the
worker thread for file I/O, progress on a terminal and the report.
"""

from __future__ import annotations

import collections
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click
import trio
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from lmq_client.admin.common import (
    EXIT_REFUSED,
    Settings,
    duration_ms_option,
    emit_json,
    fail,
    handle_errors,
    json_option,
    make_console,
    name_option,
    size_bytes_option,
)
from lmq_client.admin.files import (
    DEFAULT_DATETIME_FORMAT,
    DEFAULT_FILENAME_FORMAT,
    ClosedFile,
    FileRotator,
    FileSettings,
)
from lmq_client.admin.relay import check_connected, open_consumer, relay, run_trio
from lmq_client.admin.tail_hint import TAIL_HINT_AFTER_S, say_earlier_messages_hint
from lmq_client.errors import ConnectionFailed
from lmq_client.message import Message

__all__ = ["archive"]

REPORTED_FILES = 1000
"""Closed files the final report lists (the newest): a long-running archive rotating every
minute closes half a million files a year, which the report need not hold."""

TICK_S = 1.0
"""How often an idle archive checks whether its file is due for rotation by age."""


class _Report:
    def __init__(self) -> None:
        self.files: collections.deque[ClosedFile] = collections.deque(maxlen=REPORTED_FILES)
        self.file_count = 0

    def add(self, closed: list[ClosedFile], quiet: bool) -> None:
        for f in closed:
            self.files.append(f)
            self.file_count += 1
            if not quiet:
                click.echo(f"archive: closed {f.path} ({f.messages:,} messages, "
                           f"{f.bytes:,} bytes)", err=True)


async def _archive(
    settings: Settings,
    topic: str,
    channel: str,
    files: FileSettings,
    max_in_flight: int,
    sync_interval: float,
    count: int | None,
    quiet: bool,
    report: _Report,
) -> int:
    rotator = FileRotator(files)
    console = make_console(err=True)
    progress = Progress(
        SpinnerColumn(), TextColumn("archived {task.completed:,.0f} messages of {task.fields[src]}"
                                    " into {task.fields[file]}"),
        TimeElapsedColumn(), console=console, disable=quiet or not console.is_terminal,
    )
    task = progress.add_task("archive", total=None, src=f"{topic}/{channel}", file="-")
    received = 0

    async def handle(batch: list[Message]) -> None:
        nonlocal received
        received += len(batch)
        bodies = [m.body for m in batch]
        closed = await trio.to_thread.run_sync(rotator.write_batch, bodies, time.time())
        for message in batch:  # in the file (and synced, with --fsync): now it may go
            message.finish()
        report.add(closed, quiet)
        progress.update(task, advance=len(batch), file=str(rotator.current or "-"))

    async def tick() -> None:
        report.add(await trio.to_thread.run_sync(rotator.tick, time.time()), quiet)

    async def hint_when_quiet() -> None:
        # As tail does: nothing at first, because other channels took the earlier messages?
        await trio.sleep(TAIL_HINT_AFTER_S)
        if not received:
            await say_earlier_messages_hint(settings, topic, channel, command="archive")

    consumer = open_consumer(settings, topic, channel, max_in_flight)
    try:
        with progress:
            async with consumer, trio.open_nursery() as nursery:
                check_connected(settings, consumer)
                if not quiet:
                    nursery.start_soon(hint_when_quiet)
                handled = await relay(
                    consumer, batch_size=max_in_flight, interval_s=sync_interval,
                    handle=handle, limit=count, tick=tick,
                    tick_every_s=TICK_S if files.rotate_interval_s else float("inf"),
                )
                nursery.cancel_scope.cancel()
    finally:
        report.add(await trio.to_thread.run_sync(rotator.close), quiet)
    return handled


@click.command()
@click.argument("topic", callback=name_option("topic"))
@click.option("--dir", "directory", required=True, metavar="DIR",
              type=click.Path(file_okay=False, path_type=Path),
              help="Output directory (created if missing).")
@click.option("--work-dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
              help="Write open files here and move each to --dir when closed [default: --dir].")
@click.option("--channel", default="archive", show_default=True, callback=name_option("channel"),
              help="Channel to consume (durable: what arrives while archive is down waits).")
@click.option("--rotate-size", metavar="SIZE", callback=size_bytes_option,
              help="Start a new file once one holds SIZE bytes (100MB, 1GiB; default: never).")
@click.option("--rotate-interval", metavar="DURATION", callback=duration_ms_option,
              help="Start a new file every DURATION (1h, 10m; default: never).")
@click.option("--gzip", "use_gzip", is_flag=True, help="Write gzip files (.gz).")
@click.option("--gzip-level", default=6, show_default=True, type=click.IntRange(1, 9))
@click.option("--filename-format", default=DEFAULT_FILENAME_FORMAT, show_default=True,
              help="File name: <TOPIC>, <HOST>, <REV>, <DATETIME>.")
@click.option("--datetime-format", default=DEFAULT_DATETIME_FORMAT, show_default=True,
              help="strftime format of <DATETIME> (UTC, when the file is opened).")
@click.option("--host", default=None, help="<HOST> in file names [default: this host's name].")
@click.option("--fsync", is_flag=True, help="fsync each batch before finishing its messages.")
@click.option("--max-in-flight", default=200, show_default=True, type=click.IntRange(min=1),
              help="Messages in flight, and so the largest batch written at once.")
@click.option("--sync-interval", default=1.0, show_default=True,
              type=click.FloatRange(min=0.001, max=30), metavar="SECONDS",
              help="Longest a message waits in flight before its batch is written (well under "
                   "the daemon's --msg-timeout).")
@click.option("-n", "count", type=click.IntRange(min=1), help="Exit after N messages.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or per-file lines on stderr.")
@json_option
@click.pass_obj
@handle_errors
def archive(
    settings: Settings,
    topic: str,
    directory: Path,
    work_dir: Path | None,
    channel: str,
    rotate_size: int | None,
    rotate_interval: int | None,
    use_gzip: bool,
    gzip_level: int,
    filename_format: str,
    datetime_format: str,
    host: str | None,
    fsync: bool,
    max_in_flight: int,
    sync_interval: float,
    count: int | None,
    quiet: bool,
) -> None:
    """Write a topic's messages into files, one per line, rotating by size and/or time (like
    nsq_to_file); each batch is finished only once it is written. SIGINT/SIGTERM close the
    files cleanly."""
    files = FileSettings(
        directory=directory, work_directory=work_dir, topic=topic,
        host=host or socket.gethostname().split(".")[0], filename_format=filename_format,
        datetime_format=datetime_format, gzip_level=gzip_level if use_gzip else None,
        rotate_bytes=rotate_size or 0, rotate_interval_s=(rotate_interval or 0) / 1000,
        fsync=fsync,
    )
    report = _Report()
    started = time.monotonic()
    try:
        handled = run_trio(_archive, settings, topic, channel, files, max_in_flight,
                           sync_interval, count, quiet or settings.as_json, report)
    except ConnectionFailed:
        raise  # a ConnectionError, so an OSError too: the daemon's, exit 3 (handle_errors)
    except OSError as exc:
        fail(f"archive: {exc.strerror or exc} ({exc.filename or directory})", EXIT_REFUSED)
    seconds = time.monotonic() - started
    result: dict[str, Any] = {
        "topic": topic, "channel": channel, "messages": handled, "seconds": round(seconds, 3),
        "file_count": report.file_count,
        "files": [{"path": str(f.path), "messages": f.messages, "bytes": f.bytes}
                  for f in report.files],
    }
    if settings.as_json:
        emit_json(result)
    else:
        click.echo(f"archived {handled:,} messages from {topic}/{channel} into "
                   f"{report.file_count} file(s) in {directory} ({seconds:.2f}s)")
    sys.stdout.flush()
