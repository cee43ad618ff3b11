"""Topics created at run time make no file until their first message, and lose nothing for it.

Rules for this module (STYLE.md):
- Real ``LmqDaemon``\\ s run in the test's nursery on 127.0.0.1 port 0 with ``data_path`` in
  ``tmp_path``; "restart" is a graceful shutdown (what SIGTERM does) and a new daemon on the same
  directory. Clients speak V2 through ``tests.support.wire.Wire`` and HTTP through
  ``tests.support.http``.
- Every test has a ``fail_after`` guard.
"""

from __future__ import annotations

from pathlib import Path

import trio

from lmqd.protocol import MessageFrame, Response
from lmqd.storage.files import queue_stem
from tests.support.daemon import StartDaemon
from tests.support.http import http
from tests.support.wire import Connect

TIMEOUT = 20.0
OK = Response(data=b"OK")


def files_of(data_path: Path, topic: str) -> list[str]:
    """The names of ``topic``'s log files (segments and state file) in ``data_path``."""
    return sorted(p.name for p in data_path.glob(f"{queue_stem(topic)}.lmq.*"))


async def test_a_new_topic_makes_no_file_until_its_first_message(
    start_daemon: StartDaemon, connect: Connect
) -> None:
    with trio.fail_after(TIMEOUT):
        # --mem-queue-size=0: every message goes to the log at once (else the memory tail).
        running = await start_daemon(http=True, mem_queue_size=0)
        data = running.data_path
        assert (await http(running.http, "POST", "/topic/create?topic=orders")).status == 200
        assert (
            await http(running.http, "POST", "/channel/create?topic=orders&channel=ship")
        ).status == 200
        consumer = await connect(running.tcp)
        await consumer.sub("clicks", "c")  # SUB creates a topic and a channel too
        assert files_of(data, "orders") == files_of(data, "clicks") == []

        producer = await connect(running.tcp)
        assert await producer.pub("orders", b"first") == OK
        assert files_of(data, "orders") == ["orders.lmq.000000.dat"]
        await running.stop()

        # The state file came with the shutdown's sync; the empty topic is in the metadata.
        assert files_of(data, "orders") == ["orders.lmq.000000.dat", "orders.lmq.log.json"]
        again = await start_daemon(data, http=True)
        assert set(again.broker.topics) == {"orders", "clicks"}
        assert set(again.broker.topics["clicks"].channels) == {"c"}
        consumer = await connect(again.tcp)
        await consumer.sub("orders", "ship", rdy=1)
        message = await consumer.frame()
        assert isinstance(message, MessageFrame) and message.body == b"first"


async def test_a_topic_deleted_and_created_again_starts_empty(
    start_daemon: StartDaemon, connect: Connect
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        data = running.data_path
        producer = await connect(running.tcp)
        assert await producer.pub("orders", b"old") == OK
        await running.stop()

        # Restored from its files at start-up: deleting removes them, the new one has none.
        again = await start_daemon(data, http=True)
        assert (await http(again.http, "POST", "/topic/delete?topic=orders")).status == 200
        assert files_of(data, "orders") == [], list(data.iterdir())
        assert (await http(again.http, "POST", "/topic/create?topic=orders")).status == 200
        assert files_of(data, "orders") == []
        producer = await connect(again.tcp)
        assert await producer.pub("orders", b"new") == OK
        consumer = await connect(again.tcp)
        await consumer.sub("orders", "c", rdy=5)
        message = await consumer.frame()
        assert isinstance(message, MessageFrame) and message.body == b"new"
