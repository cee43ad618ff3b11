"""The blocking consumer on several daemons: RDY spread over them, one lost and redialled.

Rules for this module: ``lmqd`` subprocesses on 127.0.0.1 (port 0; a restarted node gets the
port it had, and its data directory), data in ``tmp_path``; the consumer's reconnect backoff is
shortened to a tenth of a second so the real clock costs little; every loop is bounded by a
deadline; every daemon must exit cleanly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmq_client.backoff import Backoff
from lmq_client.sync import Consumer, Producer

from . import procs
from .procs import Daemon

pytestmark = pytest.mark.interop

FAST = Backoff(base=0.1, max_delay=0.4, jitter=0.0)
WITHIN_S = 20.0


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Daemon]]:
    started = [procs.lmqd(tmp_path / f"n{i}") for i in range(2)]
    yield started
    for node in started:
        if node.process.poll() is None:
            node.check_stop()


def take(consumer: Consumer, count: int) -> list[str]:
    bodies: list[str] = []
    deadline = time.monotonic() + WITHIN_S
    while len(bodies) < count and time.monotonic() < deadline:
        message = consumer.get(timeout=0.5)
        if message is not None:
            bodies.append(message.body.decode())
            message.finish()
    return bodies


def test_two_daemons_one_lost_and_redialled(tmp_path: Path, nodes: list[Daemon]) -> None:
    a, b = nodes
    with Consumer("t", "c", [a.tcp, b.tcp], max_in_flight=4, reconnect_backoff=FAST,
                  connect_timeout=5) as consumer:  # fmt: skip
        assert consumer.rdy_counts() == {a.tcp: 2, b.tcp: 2}
        for node in nodes:
            with Producer(node.tcp) as producer:
                producer.mpub("t", [f"{node.tcp}-{i}".encode() for i in range(20)])
        assert sorted(take(consumer, 40)) == sorted(
            f"{n.tcp}-{i}" for n in nodes for i in range(20)
        )

        a.check_stop()
        with Producer(b.tcp) as producer:
            producer.mpub("t", [b"b-only-%d" % i for i in range(5)])
        assert sorted(take(consumer, 5)) == [f"b-only-{i}" for i in range(5)]
        assert consumer.rdy_counts() == {b.tcp: 4}  # a's share went to b

        restarted = procs.lmqd(tmp_path / "n0", f"--tcp-address={a.tcp}")
        try:
            deadline = time.monotonic() + WITHIN_S
            while len(consumer.connected_addresses) < 2 and time.monotonic() < deadline:
                consumer.get(timeout=0.1)  # redials happen inside get()
            assert consumer.rdy_counts() == {b.tcp: 2, a.tcp: 2}
            with Producer(a.tcp) as producer:
                producer.publish("t", b"a-again")
            assert take(consumer, 1) == ["a-again"]
        finally:
            restarted.check_stop()


def test_given_daemons_that_are_all_down_fail_the_constructor(tmp_path: Path) -> None:
    node = procs.lmqd(tmp_path / "gone")
    address = node.tcp
    node.check_stop()
    with pytest.raises(ConnectionError, match=address):
        Consumer("t", "c", [address], connect_timeout=2)
    with pytest.raises(ValueError, match="give daemon addresses, lookupd_http_addresses"):
        Consumer("t", "c")
