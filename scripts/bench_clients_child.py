"""One client of ``scripts/bench_clients.py``: publish N messages with MPUB, then consume them.

    python bench_clients_child.py CLIENT ADDRESS TOPIC MESSAGES SIZE BATCH MAX_IN_FLIGHT LIMIT_S

CLIENT is one of lmq-trio, lmq-asyncio, lmq-blocking (lmq_client, from the checkout's
virtualenv) or pynsq, gnsq, ansq (from the scratch virtualenv ``bench_clients.py`` made: this
file imports nothing of lmq for them). Publishing sends MPUBs of BATCH bodies, one at a time,
each waiting for its OK. Consuming subscribes with MAX_IN_FLIGHT messages in flight and FINs
each message, until MESSAGES came or LIMIT_S seconds passed. Prints one JSON line: for each
phase the messages, the wall seconds and the process's CPU seconds (``time.process_time``:
user + system of every thread).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

CHANNEL = "bench"


class Phase:
    """Wall and CPU time of one phase, and the messages it handled."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        self.messages = 0

    def result(self) -> dict[str, float]:
        return {"messages": self.messages, "seconds": time.perf_counter() - self.wall,
                "cpu_seconds": time.process_time() - self.cpu}  # fmt: skip


def batches(messages: int, size: int, batch: int) -> list[list[bytes]]:
    body = b"x" * size
    return [[body] * min(batch, messages - i) for i in range(0, messages, batch)]


# -- lmq_client ----------------------------------------------------------------------------------


async def lmq_async(a: Any) -> dict[str, Any]:
    from lmq_client import Consumer, Producer

    groups = batches(a.messages, a.size, a.batch)
    publish = Phase()
    async with Producer(a.address) as producer:
        for group in groups:
            await producer.mpub(a.topic, group)
            publish.messages += len(group)
    published = publish.result()
    consume = Phase()
    limit = time.perf_counter() + a.limit_s
    async with Consumer(a.topic, CHANNEL, a.address, max_in_flight=a.max_in_flight) as consumer:
        async for message in consumer:
            message.finish()
            consume.messages += 1
            if consume.messages == a.messages or (
                consume.messages % 1000 == 0 and time.perf_counter() > limit
            ):
                break
    return {"publish": published, "consume": consume.result()}


def lmq_blocking(a: Any) -> dict[str, Any]:
    from lmq_client.sync import Consumer, Producer

    groups = batches(a.messages, a.size, a.batch)
    publish = Phase()
    with Producer(a.address) as producer:
        for group in groups:
            producer.mpub(a.topic, group)
            publish.messages += len(group)
    published = publish.result()
    consume = Phase()
    limit = time.perf_counter() + a.limit_s
    with Consumer(a.topic, CHANNEL, a.address, max_in_flight=a.max_in_flight) as consumer:
        for message in consumer:
            message.finish()
            consume.messages += 1
            if consume.messages == a.messages or (
                consume.messages % 1000 == 0 and time.perf_counter() > limit
            ):
                break
    return {"publish": published, "consume": consume.result()}


# -- pynsq (tornado, on asyncio's loop) ----------------------------------------------------------


async def pynsq(a: Any) -> dict[str, Any]:
    import asyncio

    import nsq  # type: ignore[import-untyped]

    loop = asyncio.get_running_loop()
    groups = batches(a.messages, a.size, a.batch)
    publish = Phase()
    writer = nsq.Writer([a.address])  # tornado 6 runs on asyncio's loop
    while not any(conn.connected() for conn in writer.conns.values()):  # noqa: ASYNC110
        await asyncio.sleep(0.001)  # pynsq's Writer has no event to wait on
    for group in groups:
        answer: asyncio.Future[Any] = loop.create_future()
        writer.mpub(a.topic, group, callback=lambda conn, data, f=answer: f.set_result(data))
        data = await answer
        if isinstance(data, nsq.Error):
            raise RuntimeError(f"pynsq: {data}")
        publish.messages += len(group)
    published = publish.result()

    consume = Phase()
    limit = time.perf_counter() + a.limit_s
    done = asyncio.Event()

    def handler(message: Any) -> bool:
        consume.messages += 1
        if consume.messages == a.messages or (
            consume.messages % 1000 == 0 and time.perf_counter() > limit
        ):
            done.set()
        return True  # pynsq FINs the message

    reader = nsq.Reader(topic=a.topic, channel=CHANNEL, nsqd_tcp_addresses=[a.address],
                        message_handler=handler, max_in_flight=a.max_in_flight)  # fmt: skip
    await asyncio.wait_for(done.wait(), a.limit_s + 60)
    result = consume.result()
    reader.connect_to_nsqd = lambda *args, **kwargs: None  # closed for good: no reconnect
    reader.close()
    return {"publish": published, "consume": result}


# -- gnsq (gevent) -------------------------------------------------------------------------------


def gnsq(a: Any) -> dict[str, Any]:
    import gevent  # type: ignore[import-untyped]
    import gnsq  # type: ignore[import-untyped]

    groups = batches(a.messages, a.size, a.batch)
    publish = Phase()
    producer = gnsq.Producer(nsqd_tcp_addresses=[a.address])
    producer.start()
    for group in groups:
        producer.multipublish(a.topic, group)
        publish.messages += len(group)
    published = publish.result()
    producer.close()
    producer.join()

    consume = Phase()
    limit = time.perf_counter() + a.limit_s
    done = gevent.event.Event()

    def handler(consumer: Any, message: Any) -> None:  # gnsq FINs it when this returns
        consume.messages += 1
        if consume.messages == a.messages or (
            consume.messages % 1000 == 0 and time.perf_counter() > limit
        ):
            done.set()

    consumer = gnsq.Consumer(a.topic, CHANNEL, nsqd_tcp_addresses=[a.address],
                             max_in_flight=a.max_in_flight, message_handler=handler)  # fmt: skip
    consumer.start(block=False)
    done.wait(a.limit_s + 60)
    result = consume.result()
    consumer.close()
    return {"publish": published, "consume": result}


# -- ansq (asyncio) ------------------------------------------------------------------------------


async def ansq(a: Any) -> dict[str, Any]:
    import ansq

    host, _, port = a.address.rpartition(":")
    groups = batches(a.messages, a.size, a.batch)
    publish = Phase()
    conn = await ansq.open_connection(host, int(port))
    for group in groups:
        await conn.mpub(a.topic, group)
        publish.messages += len(group)
    published = publish.result()
    await conn.close()

    consume = Phase()
    limit = time.perf_counter() + a.limit_s
    reader = await ansq.create_reader(topic=a.topic, channel=CHANNEL,
                                      nsqd_tcp_addresses=[a.address])  # fmt: skip
    for connection in reader.connections:  # ansq's reader keeps RDY 1: raise it as the others
        await connection.rdy(a.max_in_flight)
    async for message in reader.messages():
        await message.fin()
        consume.messages += 1
        if consume.messages == a.messages or (
            consume.messages % 1000 == 0 and time.perf_counter() > limit
        ):
            break
    result = consume.result()
    await reader.close()
    return {"publish": published, "consume": result}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    for name in ("client", "address", "topic"):
        parser.add_argument(name)
    for name in ("messages", "size", "batch", "max_in_flight"):
        parser.add_argument(name, type=int)
    parser.add_argument("limit_s", type=float)
    a = parser.parse_args()
    if a.client == "lmq-trio":
        import trio

        result = trio.run(lmq_async, a)
    elif a.client in ("lmq-asyncio", "ansq", "pynsq"):
        import asyncio

        main = {"lmq-asyncio": lmq_async, "ansq": ansq, "pynsq": pynsq}[a.client]
        result = asyncio.run(main(a))
    elif a.client == "lmq-blocking":
        result = lmq_blocking(a)
    elif a.client == "gnsq":
        result = gnsq(a)
    else:
        raise SystemExit(f"unknown client {a.client!r}")
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
