"""pynsq (tornado) scenarios against an lmqd: ``python pynsq_client.py <scenario> '<json>'``.

Uses only pynsq's public API (``nsq.Writer``, ``nsq.Reader``, ``nsq.Message``). The tornado loop
runs for a bounded time through ``IOLoop.run_sync(..., timeout=...)``; each scenario is one
coroutine that waits on its own conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import nsq  # type: ignore[import-untyped]
import tornado.httpclient
from clientlib import Params, Result, check_deadline, deadline_after, main
from tornado.ioloop import IOLoop

Handler = Callable[[Any], Any]


async def wait_for(predicate: Callable[[], bool], within: float, what: str) -> None:
    deadline = deadline_after(within)
    while not predicate():
        check_deadline(deadline, what)
        await asyncio.sleep(0.01)


def new_reader(params: Params, channel: str, handler: Handler, max_in_flight: int) -> Any:
    return nsq.Reader(
        topic=params["topic"],
        channel=channel,
        message_handler=handler,
        nsqd_tcp_addresses=[params["address"]],
        max_in_flight=max_in_flight,
    )


def reader_connected(reader: Any) -> bool:
    return any(conn.connected() and conn.rdy > 0 for conn in reader.conns.values())


async def ready_writer(params: Params) -> Any:
    writer = nsq.Writer([params["address"]])
    await wait_for(
        lambda: any(conn.connected() for conn in writer.conns.values()), 10, "writer connection"
    )
    return writer


def close_reader(reader: Any) -> None:
    """Close for good: pynsq would otherwise reconnect 15 s later."""
    reader.connect_to_nsqd = lambda *args, **kwargs: None
    reader.close()


def publish(writer: Any, method: str, *args: Any) -> asyncio.Future[str]:
    """PUB/MPUB/DPUB through the Writer; the future is the response (``"OK"`` or the error)."""
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def done(conn: Any, data: Any) -> None:
        if not future.done():
            text = data.decode() if isinstance(data, bytes) else f"error: {data!r}"
            future.set_result(text)

    getattr(writer, method)(*args, callback=done)
    return future


async def pubsub(params: Params) -> Result:
    """N messages (MPUB batches, then some PUBs) consumed by several Readers on one channel."""
    n, batch, single = params["count"], params["batch"], params["single_pubs"]
    received: list[tuple[int, str, int]] = []

    def handler_for(index: int) -> Handler:
        def handler(message: Any) -> bool:
            received.append((index, message.body.decode(), message.attempts))
            return True

        return handler

    readers = [
        new_reader(params, params["channel"], handler_for(i), params["max_in_flight"])
        for i in range(params["readers"])
    ]
    writer = await ready_writer(params)
    await wait_for(lambda: all(reader_connected(r) for r in readers), 10, "readers")

    bodies = [f"m-{i:06d}".encode() for i in range(n)]
    futures = [
        publish(writer, "mpub", params["topic"], bodies[i : min(i + batch, n - single)])
        for i in range(0, n - single, batch)
    ]
    futures += [publish(writer, "pub", params["topic"], body) for body in bodies[n - single :]]
    responses = await asyncio.gather(*futures)
    await wait_for(lambda: len(received) >= n, params["consume_timeout_s"], f"{n} messages")
    # Anything lost would have shown above; a duplicate would arrive now.
    await asyncio.sleep(params["quiet_s"])
    for reader in readers:
        close_reader(reader)
    return {
        "responses": dict(Counter(responses)),
        "commands": len(futures),
        "bodies": [body for _, body, _ in received],
        "per_reader": [sum(1 for r, _, _ in received if r == i) for i in range(len(readers))],
        "attempts": dict(Counter(a for _, _, a in received)),
    }


async def dpub(params: Params) -> Result:
    """One DPUB with a delay and one PUB right after it; when does each arrive?"""
    arrivals: dict[str, float] = {}
    start = 0.0

    def handler(message: Any) -> bool:
        arrivals[message.body.decode()] = time.monotonic() - start
        return True

    reader = new_reader(params, params["channel"], handler, 10)
    writer = await ready_writer(params)
    await wait_for(lambda: reader_connected(reader), 10, "reader")
    await asyncio.sleep(0.2)  # SUB is processed: the channel exists before the publishes
    start = time.monotonic()
    responses = await asyncio.gather(
        publish(writer, "dpub", params["topic"], params["delay_ms"], b"deferred"),
        publish(writer, "pub", params["topic"], b"immediate"),
    )
    await wait_for(lambda: len(arrivals) == 2, params["delay_ms"] / 1000 + 10, "both messages")
    close_reader(reader)
    return {"responses": responses, "arrival_s": arrivals}


async def requeue(params: Params) -> Result:
    """A handler that REQs a message on its first attempt and FINs it on the next."""
    deliveries: list[dict[str, Any]] = []
    start = time.monotonic()

    def handler(message: Any) -> None:
        deliveries.append(
            {
                "id": message.id.decode(),
                "body": message.body.decode(),
                "attempts": message.attempts,
                "at_s": time.monotonic() - start,
            }
        )
        if message.attempts == 1:
            message.requeue(delay=params["delay_s"], backoff=False)
        else:
            message.finish()

    reader = new_reader(params, params["channel"], handler, 10)
    writer = await ready_writer(params)
    await wait_for(lambda: reader_connected(reader), 10, "reader")
    response = await publish(writer, "pub", params["topic"], b"requeue me")
    await wait_for(
        lambda: any(d["attempts"] >= 2 for d in deliveries),
        params["delay_s"] + 10,
        "the redelivery",
    )
    await asyncio.sleep(params["quiet_s"])
    close_reader(reader)
    return {"response": response, "deliveries": deliveries}


async def stats_channels(http_address: str, topic: str) -> list[str]:
    client = tornado.httpclient.AsyncHTTPClient()
    response = await client.fetch(
        f"http://{http_address}/stats?format=json&topic={topic}", request_timeout=5
    )
    stats = json.loads(response.body)
    return [
        c["channel_name"]
        for t in stats.get("topics") or []
        if t["topic_name"] == topic
        for c in t.get("channels") or []
    ]


async def ephemeral(params: Params) -> Result:
    """An ``#ephemeral`` channel goes away when its consumer leaves.

    Observable over TCP: the topic also has a durable channel, so it keeps distributing; a message
    published while no one is on the ephemeral channel is kept for the durable channel only, and a
    new consumer of the ephemeral channel (a new channel) never sees it. With the HTTP API, the
    channel must also be gone from ``/stats``.
    """
    topic, eph, http = params["topic"], params["channel"], params.get("http_address")
    got: dict[str, list[str]] = {"first": [], "second": [], "keeper": []}

    def handler_for(name: str) -> Handler:
        def handler(message: Any) -> bool:
            got[name].append(message.body.decode())
            return True

        return handler

    keeper = new_reader(params, "keeper", handler_for("keeper"), 10)
    first = new_reader(params, eph, handler_for("first"), 10)
    writer = await ready_writer(params)
    await wait_for(lambda: reader_connected(keeper) and reader_connected(first), 10, "readers")
    result: Result = {}

    # Publish until the first consumer gets one: then its SUB has surely been processed.
    for i in range(50):
        await publish(writer, "pub", topic, f"before-{i}".encode())
        if got["first"]:
            break
        await asyncio.sleep(0.1)
    await wait_for(lambda: bool(got["first"]), 5, "the first ephemeral consumer's message")
    if http:
        result["stats_while_subscribed"] = await stats_channels(http, topic)

    close_reader(first)
    if http:
        deadline = deadline_after(5)
        while eph in (channels := await stats_channels(http, topic)):
            check_deadline(deadline, "the ephemeral channel to leave /stats")
            await asyncio.sleep(0.05)
        result["stats_after_leaving"] = channels
    else:
        await asyncio.sleep(1.0)  # the daemon notices the disconnect and deletes the channel

    await publish(writer, "pub", topic, b"while-nobody-listens")
    await wait_for(lambda: "while-nobody-listens" in got["keeper"], 5, "the keeper's copy")

    second = new_reader(params, eph, handler_for("second"), 10)
    await wait_for(lambda: reader_connected(second), 10, "the second ephemeral reader")
    for i in range(50):
        await publish(writer, "pub", topic, f"after-{i}".encode())
        if got["second"]:
            break
        await asyncio.sleep(0.1)
    await wait_for(lambda: bool(got["second"]), 5, "the second ephemeral consumer's message")
    await asyncio.sleep(params["quiet_s"])
    close_reader(second)
    close_reader(keeper)
    result.update(got)
    return result


async def consume(params: Params) -> Result:
    """A stock ``nsq.Reader`` on one channel answering every delivery with ``REQ <id> 0``
    (``message.requeue(delay=0, backoff=False)``) or ``FIN`` (``action``), until ``expect``
    deliveries and then ``quiet_s`` with nothing more; returns every body and attempts
    (``received``) and every delivery as the library decoded it (``messages``: id, timestamp,
    attempts, body in hex)."""
    received: list[tuple[str, int]] = []
    messages: list[dict[str, Any]] = []
    requeue = params["action"] == "requeue"

    def handler(message: Any) -> bool | None:
        received.append((message.body.decode("utf-8", "replace"), message.attempts))
        messages.append(
            {
                "id": message.id.decode("ascii", "backslashreplace"),
                "timestamp": message.timestamp,
                "attempts": message.attempts,
                "body_hex": message.body.hex(),
            }
        )
        if requeue:
            message.requeue(delay=0, backoff=False)
            return None
        return True

    reader = nsq.Reader(
        topic=params["topic"],
        channel=params["channel"],
        message_handler=handler,
        nsqd_tcp_addresses=[params["address"]],
        max_in_flight=10,
        max_tries=0,  # pynsq's own limit off: the daemon's max_attempts decides
    )
    await wait_for(lambda: reader_connected(reader), 10, "reader")
    if params.get("bodies"):
        writer = await ready_writer(params)
        for body in params["bodies"]:
            assert await publish(writer, "pub", params["topic"], body.encode()) == "OK"
    await wait_for(
        lambda: len(received) >= params["expect"],
        params["consume_timeout_s"],
        f"{params['expect']} deliveries",
    )
    await asyncio.sleep(params["quiet_s"])  # one more delivery would arrive now
    close_reader(reader)
    return {"received": received, "messages": messages}


async def publish_until_refused(params: Params) -> Result:
    """PUB one message at a time (each waits for its answer) until one is refused; then one
    Reader takes everything the topic holds. What did the Writer see, what was kept?"""
    topic = params["topic"]
    writer = await ready_writer(params)
    answers: list[str] = []
    for i in range(params["count"]):
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def done(conn: Any, data: Any, future: asyncio.Future[str] = future) -> None:
            if future.done():
                return
            if isinstance(data, bytes):
                future.set_result(data.decode())
            elif isinstance(data, nsq.Error) and data.args and isinstance(data.args[0], bytes):
                future.set_result(data.args[0].decode())  # the error frame's data, as sent
            else:
                future.set_result(f"error: {data!r}")

        writer.pub(topic, f"m-{i}".encode(), callback=done)
        answers.append(await future)
        if answers[-1] != "OK":
            break
    received: list[str] = []

    def handler(message: Any) -> bool:
        received.append(message.body.decode())
        return True

    reader = new_reader(params, params["channel"], handler, 100)
    await wait_for(lambda: len(received) >= params["expect"], 10, "the accepted messages")
    await asyncio.sleep(params["quiet_s"])
    close_reader(reader)
    return {"answers": answers, "received": received}


def run(coroutine: Callable[[Params], Any]) -> Callable[[Params], Result]:
    def scenario(params: Params) -> Result:
        result: Result = IOLoop.current().run_sync(
            lambda: coroutine(params), timeout=params["hard_limit_s"] - 1
        )
        return result

    return scenario


if __name__ == "__main__":
    main(
        {
            "pubsub": run(pubsub),
            "dpub": run(dpub),
            "requeue": run(requeue),
            "ephemeral": run(ephemeral),
            "consume": run(consume),
            "publish_until_refused": run(publish_until_refused),
        }
    )
