"""``lmqadmin rewrite-at-rest DATA_PATH``: rewrite a stopped daemon's segments under its current
at-rest settings (the first encryption key, the compression), offline.

The same work as ``lmqd --rewrite-at-rest`` (``lmqd.storage.atrest.rewrite``), for an operator
who rotates a key without starting the daemon on the old data first, or who wants to see what is
rewritten: it checks the directory as lmqd's start-up does (a batch under a key not given stops
it, touching nothing), takes the data directory's lock (a running lmqd holds it: stop it first,
or restart it with ``--rewrite-at-rest``), rewrites, and prints what it did.
"""

from __future__ import annotations

import click

from lmq_client.admin.common import EXIT_REFUSED, EXIT_USAGE, emit_json, fail
from lmqd.storage import DataDirLock, DataDirLocked
from lmqd.storage.atrest import AtRestConfigError, build_at_rest
from lmqd.storage.atrest.check import AtRestRefused, check_data_dir
from lmqd.storage.atrest.rewrite import rewrite_data_dir


@click.command("rewrite-at-rest")
@click.argument("data_path", type=click.Path(exists=True, file_okay=False))
@click.option("--encryption-key-file", "key_files", multiple=True, metavar="PATH",
              help="A key file, as lmqd's flag: the first seals, all of them open (repeatable).")
@click.option("--encryption-cipher", default="aes-256-gcm", show_default=True,
              help="aes-256-gcm or chacha20-poly1305, as lmqd's flag.")
@click.option("--compression", default="none", show_default=True,
              help="The daemon's --compression (a topic's own policy wins for its log).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def rewrite_at_rest(
    data_path: str, key_files: tuple[str, ...], encryption_cipher: str, compression: str,
    as_json: bool,
) -> None:  # fmt: skip
    """Rewrite a stopped lmqd's segments under the first key and the compression given (after a
    key rotation, or to encrypt what was written in clear)."""
    try:
        at_rest = build_at_rest(compression, key_files, encryption_cipher)
    except AtRestConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    try:
        check_data_dir(data_path, at_rest.opener)
    except AtRestRefused as exc:
        fail(str(exc), EXIT_REFUSED)
    lock = DataDirLock(data_path)
    try:
        lock.acquire()
    except DataDirLocked as exc:
        fail(f"{exc}; stop it first, or restart it with --rewrite-at-rest", EXIT_REFUSED)
    try:
        report = rewrite_data_dir(data_path, at_rest)
    except OSError as exc:
        fail(f"rewrite failed: {exc}", EXIT_REFUSED)
    finally:
        lock.release()
    if as_json:
        emit_json({"checked": report.checked, "rewritten": report.rewritten,
                   "skipped": report.skipped})  # fmt: skip
        return
    line = f"{data_path}: {report.rewritten} of {report.checked} segment file(s) rewritten"
    if report.skipped:
        line += f", {report.skipped} left as they were (damaged: start lmqd once, then again)"
    click.echo(line)
