"""The sink's dedup ids make a stream into lmq exactly-once across a task failure and a driver
kill; with the lmq source on the other side, a pipeline lmq → Spark → lmq is exactly-once too.

Each scenario runs ``tests/spark/stream_job.py`` in its own process (its own Spark driver, so
that it can be killed with ``kill -9``, and ``local[2,2]`` so that a failed task is retried),
reading text files (Spark's file source: a re-run batch reads the same files) into a topic of
the package's shared lmqd, whose dedup window is the default five minutes. A consumer then
drains the topic. With dedup ids (the default) every row arrives exactly once; the same scenario
with ``dedupIds=false`` delivers the rows published before the fault twice, which shows that the
fault did strike after some rows were published.

Rules for this module: daemons and Spark on 127.0.0.1 only; each job process is bounded by
``JOB_PROCESS_TIMEOUT_S`` and killed (its whole process group) if it overruns; every wait for a
file or a message is bounded.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmq_client.sync import Producer
from tests.support.process import LmqdProcess

from .conftest import receive, receive_at_least, write_lines

JOB_PROCESS_TIMEOUT_S = 180.0
"""A job process: Spark's start (~10-15 s) and a few micro-batches of 50 rows, on a loaded
2-core machine; a hung job fails the test long before CI's limit."""

SIGNAL_TIMEOUT_S = 120.0
"""Waiting for the hanging task to say it has published its rows."""

FILES = 4
ROWS_PER_FILE = 50


def _input(directory: Path) -> set[bytes]:
    rows: set[bytes] = set()
    for f in range(FILES):
        lines = [f"file{f}-row{r:03d}" for r in range(ROWS_PER_FILE)]
        write_lines(directory, f"part-{f}.txt", lines)
        rows.update(line.encode() for line in lines)
    return rows


def _job_command(tmp: Path, daemon: LmqdProcess, topic: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "tests.spark.stream_job",
        "--input", str(tmp / "input"), "--checkpoint", str(tmp / "checkpoint"),
        "--address", daemon.tcp_address, "--topic", topic, *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def _job(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The job process, in a session of its own (the driver and its JVM: one process group),
    killed with that group if it is still running when the block ends."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    with log.open("ab") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
        try:
            yield process
        finally:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def _run(command: list[str], log: Path) -> None:
    with _job(command, log) as process:
        try:
            code = process.wait(JOB_PROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"job still running after {JOB_PROCESS_TIMEOUT_S:g} s; see {log}")
        assert code == 0, f"job failed ({code}); see {log}:\n{log.read_text()[-3000:]}"


def _kill_once_published(command: list[str], signal_file: Path, log: Path) -> None:
    """Run the job until its hanging task says (``signal_file``) that batch 1's partition 0
    has published every row and waits, then ``kill -9`` the driver with its JVM and the task's
    worker."""
    with _job(command, log) as process:
        deadline = time.monotonic() + SIGNAL_TIMEOUT_S
        while not signal_file.exists() or not signal_file.read_text():
            assert process.poll() is None, f"job ended before the fault; see {log}"
            assert time.monotonic() < deadline, f"batch 1 never published; see {log}"
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    with contextlib.suppress(ProcessLookupError):  # the task's worker, in pyspark's own group
        os.kill(int(signal_file.read_text()), signal.SIGKILL)


def _drain(daemon: LmqdProcess, topic: str, expected: set[bytes]) -> collections.Counter[bytes]:
    return collections.Counter(receive_at_least(daemon.tcp_address, topic, expected))


@pytest.mark.parametrize("dedup_ids", [True, False], ids=["dedup-ids", "no-dedup-ids"])
def test_a_task_failing_after_publishing_part_of_its_partition(
    daemon: LmqdProcess, topic: str, tmp_path: Path, dedup_ids: bool
) -> None:
    expected = _input(tmp_path / "input")
    marker = tmp_path / "failed-once"
    command = _job_command(
        tmp_path, daemon, topic, "--master", "local[2,2]", "--dedup-ids", str(dedup_ids).lower(),
        "--fail-once", str(marker), "--fail-after", "20",
    )  # fmt: skip
    _run(command, tmp_path / "job.log")
    assert marker.exists()  # the task did fail once, and Spark's retry succeeded
    if dedup_ids:
        bodies = receive(daemon.tcp_address, topic, len(expected))
        assert set(bodies) == expected  # every row, exactly once
        return
    counts = _drain(daemon, topic, expected)
    twice = sorted(body for body, n in counts.items() if n == 2)
    assert set(counts) == expected and max(counts.values()) == 2
    # the 20 rows the failed attempt published: the first 20 of one file
    assert len(twice) == 20 and len({body.split(b"-")[0] for body in twice}) == 1


@pytest.mark.parametrize("dedup_ids", [True, False], ids=["dedup-ids", "no-dedup-ids"])
def test_a_driver_killed_before_a_published_batch_was_committed(
    daemon: LmqdProcess, topic: str, tmp_path: Path, dedup_ids: bool
) -> None:
    expected = _input(tmp_path / "input")
    signal_file = tmp_path / "published"
    flags = ["--dedup-ids", str(dedup_ids).lower()]
    log = tmp_path / "job.log"
    command = _job_command(tmp_path, daemon, topic, *flags, "--hang-batch", "1",
                           "--hang-signal", str(signal_file))  # fmt: skip
    _kill_once_published(command, signal_file, log)
    checkpoint = tmp_path / "checkpoint"
    assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()
    # The same query (same checkpoint, so the same query id) starts again and re-runs batch 1.
    _run(_job_command(tmp_path, daemon, topic, *flags), log)
    assert (checkpoint / "commits" / "1").exists()
    if dedup_ids:
        bodies = receive(daemon.tcp_address, topic, len(expected))
        assert set(bodies) == expected
        return
    counts = _drain(daemon, topic, expected)
    twice = {body for body, n in counts.items() if n == 2}
    assert set(counts) == expected and max(counts.values()) == 2
    # batch 1's partition 0 (one whole file) came twice, and nothing of batch 0's two files
    assert len(twice) >= ROWS_PER_FILE
    assert len({body.split(b"-")[0] for body in twice}) <= 2


def test_a_pipeline_from_lmq_to_lmq_is_exactly_once_across_a_driver_kill(
    daemon: LmqdProcess, topic: str, tmp_path: Path
) -> None:
    # lmq → Spark → lmq with AvailableNow: the source reads 200 messages in batches of 50
    # (offsets fixed in the checkpoint before each batch runs), the sink publishes them with
    # dedup ids. The driver is killed once batch 1 has published and before it is committed;
    # restarted, the query re-runs batch 1 (the same offsets, so the same rows and ids) and the
    # rest. Every input message is in the output topic exactly once.
    source = f"{topic}-in"
    expected = [b"in-%03d" % i for i in range(200)]
    with Producer(daemon.tcp_address) as producer:
        producer.mpub(source, expected)
    signal_file = tmp_path / "published"
    log = tmp_path / "job.log"
    command = [
        sys.executable, "-m", "tests.spark.stream_job", "--checkpoint", str(tmp_path / "ck"),
        "--address", daemon.tcp_address, "--topic", topic, "--source-topic", source,
        "--per-trigger", "50",
    ]  # fmt: skip
    _kill_once_published([*command, "--hang-batch", "1", "--hang-signal", str(signal_file)],
                         signal_file, log)  # fmt: skip
    checkpoint = tmp_path / "ck"
    assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()
    offsets = json.loads((checkpoint / "offsets" / "1").read_text().splitlines()[-1])
    assert offsets == {source: {daemon.http_address: 100}}  # batch 1: offsets 50..99
    _run(command, log)
    assert (checkpoint / "commits" / "3").exists() and not (checkpoint / "offsets" / "4").exists()
    bodies = receive(daemon.tcp_address, topic, len(expected))
    assert sorted(bodies) == expected  # each exactly once (receive fails on any extra)
