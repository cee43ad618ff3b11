"""A streaming query of the ``lmq`` source moved from a primary to its mirror (docs/mirrors.md):
the mirror has the primary's offsets and says so (``replica_of`` in ``/topics/offsets``), so
the query goes on from its checkpoint exactly where it stood, before and after a promotion.

Rules for this module (see conftest.py): the package's one SparkSession; a primary and its
mirror are lmqd subprocesses on 127.0.0.1, port 0, data in ``tmp_path``, stopped in
``finally``; every query is bounded (``run_available``) and every wait is ``eventually``.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from lmq_client.sync import Producer
from tests.cluster.procs import eventually, http, lmqd

from .test_source_stream import Collected, run_available, stream


def copied(mirror_http: str, topic: str) -> int:
    status, doc = http(mirror_http, "GET", "/stats?format=json")
    topics = doc["mirror"]["topics"] if status == 200 else []
    return next((t["end_offset"] for t in topics if t["topic_name"] == topic), 0)


def test_a_query_moved_to_the_mirror_reads_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    topic = "moved"
    primary = lmqd(tmp_path / "p")
    mirror = lmqd(tmp_path / "m", f"--mirror-of={primary.http}")
    try:
        with Producer(primary.tcp) as producer:
            producer.mpub(topic, [b"m%d" % i for i in range(50)])
        checkpoint = tmp_path / "ck"
        first = Collected()
        run_available(spark, stream(spark, checkpoint, first, available_now=True,
                                    address=primary.tcp, subscribe=topic,
                                    startingOffsets="earliest"))  # fmt: skip
        assert first.rows() == [(topic, i, b"m%d" % i) for i in range(50)]
        with Producer(primary.tcp) as producer:
            producer.mpub(topic, [b"m%d" % i for i in range(50, 80)])
        eventually(lambda: copied(mirror.http, topic), lambda end: end == 80, 30)

        # The same checkpoint, the mirror's address: the 30 new ones, once.
        second = Collected()
        run_available(spark, stream(spark, checkpoint, second, available_now=True,
                                    address=mirror.tcp, subscribe=topic))  # fmt: skip
        assert second.rows() == [(topic, i, b"m%d" % i) for i in range(50, 80)]

        # The primary is lost, the mirror promoted and published to: the query goes on.
        primary.process.kill()
        assert http(mirror.http, "POST", "/mirror/promote")[0] == 200
        with Producer(mirror.tcp) as producer:
            producer.mpub(topic, [b"m%d" % i for i in range(80, 100)])
        third = Collected()
        run_available(spark, stream(spark, checkpoint, third, available_now=True,
                                    address=mirror.tcp, subscribe=topic))  # fmt: skip
        assert third.rows() == [(topic, i, b"m%d" % i) for i in range(80, 100)]
    finally:
        mirror.terminate()
        primary.terminate()
