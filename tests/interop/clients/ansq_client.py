"""ansq (asyncio) scenarios against an lmqd: ``python ansq_client.py <scenario> '<json>'``.

ansq's Reader gives each connection RDY 1 (its ``set_max_in_flight`` is not implemented), so the
throughput scenario raises RDY on the reader's connections with ``NSQConnection.rdy``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import ansq
from ansq import ConnectionFeatures, ConnectionOptions
from clientlib import Params, Result, check_deadline, deadline_after, main


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def pubsub(params: Params) -> Result:
    """N messages (MPUB batches, then some PUBs) consumed by several Readers on one channel."""
    n, batch, single = params["count"], params["batch"], params["single_pubs"]
    address, topic = params["address"], params["topic"]
    received: list[tuple[int, str, int]] = []

    async def consume(index: int, reader: Any) -> None:
        async for message in reader.messages():
            received.append((index, message.body.decode(), message.attempts))
            await message.fin()

    readers = [
        await ansq.create_reader(
            topic=topic, channel=params["channel"], nsqd_tcp_addresses=[address]
        )
        for _ in range(params["readers"])
    ]
    for reader in readers:
        for conn in reader.connections:
            await conn.rdy(params["rdy"])
    tasks = [asyncio.create_task(consume(i, r)) for i, r in enumerate(readers)]
    writer = await ansq.create_writer(nsqd_tcp_addresses=[address])

    bodies = [f"a-{i:06d}" for i in range(n)]
    responses = [
        await writer.mpub(topic, *bodies[i : min(i + batch, n - single)])
        for i in range(0, n - single, batch)
    ]
    responses += [await writer.pub(topic, body) for body in bodies[n - single :]]

    deadline = deadline_after(params["consume_timeout_s"])
    while len(received) < n:
        check_deadline(deadline, f"{n} messages")
        await asyncio.sleep(0.01)
    await asyncio.sleep(params["quiet_s"])  # a duplicate would arrive now
    for task in tasks:
        task.cancel()
    for reader in readers:
        await reader.close()
    await writer.close()
    return {
        "responses": dict(
            Counter("OK" if r is not None and r.is_ok else repr(r) for r in responses)
        ),
        "bodies": [body for _, body, _ in received],
        "per_reader": [sum(1 for r, _, _ in received if r == i) for i in range(len(readers))],
        "attempts": dict(Counter(a for _, _, a in received)),
    }


async def heartbeat(params: Params) -> Result:
    """ansq's expectation: with heartbeat_interval=1000, exactly one heartbeat within 1.1 s."""
    host, port = host_port(params["address"])
    beats: list[float] = []
    start = 0.0

    async def on_heartbeat(conn: Any) -> None:
        beats.append(round(time.monotonic() - start, 3))

    options = ConnectionOptions(
        features=ConnectionFeatures(heartbeat_interval=1000),
        on_heartbeat=on_heartbeat,
        auto_reconnect=False,
    )
    conn = ansq.tcp.connection.NSQConnection(host, port, connection_options=options)
    await conn.connect()
    start = time.monotonic()
    await conn.identify()
    await asyncio.sleep(1.1)
    within_1_1 = len(beats)
    await asyncio.sleep(params["more_s"])
    connected = conn.is_connected
    await conn.close()
    return {"beats_within_1_1s": within_1_1, "beats": beats, "connected_after": connected}


async def msg_timeout(params: Params) -> Result:
    """ansq's expectation: msg_timeout=1000 and no FIN -> redelivered with attempts 2 (~1.1 s)."""
    host, port = host_port(params["address"])
    options = ConnectionOptions(features=ConnectionFeatures(msg_timeout=1000), auto_reconnect=False)
    conn = await ansq.open_connection(host, port, connection_options=options)
    published = await conn.pub(params["topic"], b"time me out")
    await conn.subscribe(params["topic"], params["channel"], 1)
    first = await asyncio.wait_for(conn.message_queue.get(), 10)
    assert first is not None
    first_at = time.monotonic()
    second = await asyncio.wait_for(conn.message_queue.get(), 10)
    assert second is not None
    redelivered_after = time.monotonic() - first_at
    await second.fin()
    await asyncio.sleep(0.2)
    connected = conn.is_connected
    await conn.close()
    return {
        "published": published is not None and published.is_ok,
        "first": {"id": first.id, "attempts": first.attempts, "body": first.body.decode()},
        "second": {"id": second.id, "attempts": second.attempts, "body": second.body.decode()},
        "redelivered_after_s": round(redelivered_after, 3),
        "connected_after": connected,
    }


async def raw_error(params: Params) -> Result:
    """``NSQConnection.execute`` of a raw command: ansq returns the error frame as a schema."""
    host, port = host_port(params["address"])
    options = ConnectionOptions(auto_reconnect=False)
    conn = await ansq.open_connection(host, port, connection_options=options)
    response = await conn.execute(params["command"])
    assert response is not None
    deadline = deadline_after(5)
    while not conn.is_closed:  # the daemon closes after a fatal error; ansq notices the EOF
        check_deadline(deadline, "the daemon to close the connection")
        await asyncio.sleep(0.01)
    return {
        "is_error": response.is_error,
        "code": getattr(response, "code", None),
        "body": response.body.decode("utf-8", "replace"),
        "text": response.text,
        "closed_after": conn.is_closed,
    }


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def rdy_before_sub(params: Params) -> Result:
    """ansq's suite asserts the log text ``[E_INVALID] cannot RDY in current state``."""
    host, port = host_port(params["address"])
    collect = _Collect()
    logger = logging.getLogger("ansq-rdy-before-sub")
    logger.addHandler(collect)
    options = ConnectionOptions(auto_reconnect=False, logger=logger)
    conn = await ansq.open_connection(host, port, connection_options=options)
    await conn.rdy(1)  # RDY has no response, so the error frame is only logged
    deadline = deadline_after(5)
    while not conn.is_closed:
        check_deadline(deadline, "the daemon to close the connection")
        await asyncio.sleep(0.01)
    return {"logged": collect.messages, "closed_after": conn.is_closed}


async def consume(params: Params) -> Result:
    """A stock ``ansq`` reader on one channel FINs ``expect`` deliveries, then waits ``quiet_s``
    for one too many; every delivery as ansq decoded it (id, timestamp, attempts, body in hex)."""
    messages: list[dict[str, Any]] = []
    reader = await ansq.create_reader(
        topic=params["topic"], channel=params["channel"], nsqd_tcp_addresses=[params["address"]]
    )
    for conn in reader.connections:
        await conn.rdy(10)

    async def take() -> None:
        async for message in reader.messages():
            messages.append(
                {
                    "id": message.id,
                    "timestamp": message.timestamp,
                    "attempts": message.attempts,
                    "body_hex": message.body.hex(),
                }
            )
            await message.fin()

    task = asyncio.create_task(take())
    deadline = deadline_after(params["consume_timeout_s"])
    while len(messages) < params["expect"]:
        check_deadline(deadline, f"{params['expect']} deliveries")
        if task.done():
            task.result()  # the reader failed: its exception, not a timeout
        await asyncio.sleep(0.01)
    await asyncio.sleep(params["quiet_s"])  # one more delivery would arrive now
    task.cancel()
    await reader.close()
    return {"messages": messages}


def run(coroutine: Any) -> Any:
    def scenario(params: Params) -> Result:
        result: Result = asyncio.run(
            asyncio.wait_for(coroutine(params), timeout=params["hard_limit_s"] - 1)
        )
        return result

    return scenario


if __name__ == "__main__":
    main(
        {
            "pubsub": run(pubsub),
            "heartbeat": run(heartbeat),
            "msg_timeout": run(msg_timeout),
            "raw_error": run(raw_error),
            "rdy_before_sub": run(rdy_before_sub),
            "consume": run(consume),
        }
    )
