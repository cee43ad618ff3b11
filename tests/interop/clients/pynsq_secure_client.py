"""pynsq (tornado) with TLS, snappy, deflate and AUTH against an lmqd.

``python pynsq_secure_client.py <scenario> '<json>'``. ``conn`` in the params holds pynsq's own
connection options (``tls_v1``, ``tls_options``, ``snappy``, ``deflate``, ``deflate_level``,
``auth_secret``), passed unchanged to ``nsq.Writer`` and ``nsq.Reader``, so pynsq negotiates
and upgrades its sockets itself (tornado's ``SSLIOStream``, pynsq's ``SnappySocket`` and
``DeflateSocket``). The results say what pynsq saw.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import Counter
from collections.abc import Callable
from typing import Any

import nsq  # type: ignore[import-untyped]
from clientlib import Params, Result, check_deadline, deadline_after, main
from tornado.ioloop import IOLoop
from tornado.iostream import SSLIOStream


async def wait_for(predicate: Callable[[], bool], within: float, what: str) -> None:
    deadline = deadline_after(within)
    while not predicate():
        check_deadline(deadline, what)
        await asyncio.sleep(0.01)


def conn_options(params: Params) -> dict[str, Any]:
    options: dict[str, Any] = dict(params["conn"])
    if options.get("tls_v1"):
        # pynsq's own default is CERT_REQUIRED: give it the test CA that signed lmqd's cert.
        options["tls_options"] = {"ca_certs": params["ca_file"]}
    return options


def publish(writer: Any, method: str, *args: Any) -> asyncio.Future[str]:
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def done(conn: Any, data: Any) -> None:
        if not future.done():
            text = data.decode() if isinstance(data, bytes) else f"error: {data}"
            future.set_result(text)

    getattr(writer, method)(*args, callback=done)
    return future


def layers(conn: Any) -> dict[str, Any]:
    """What pynsq wrapped its connection in."""
    return {
        "ssl_stream": isinstance(conn.stream, SSLIOStream),
        "socket": type(conn.socket).__name__,
        # pynsq's own test_conn_socket_upgrade: the codec socket wraps the SSL socket.
        "inner_ssl": isinstance(getattr(conn.socket, "_socket", None), ssl.SSLSocket),
    }


def close_reader(reader: Any) -> None:
    reader.connect_to_nsqd = lambda *args, **kwargs: None
    reader.close()


async def pubsub(params: Params) -> Result:
    """``count`` messages (MPUBs, then PUBs) through a Writer, back through a Reader."""
    n, topic = params["count"], params["topic"]
    received: list[str] = []

    def handler(message: Any) -> bool:
        received.append(message.body.decode())
        return True

    reader = nsq.Reader(
        topic=topic,
        channel="secure",
        message_handler=handler,
        nsqd_tcp_addresses=[params["address"]],
        max_in_flight=50,
        **conn_options(params),
    )
    writer = nsq.Writer([params["address"]], **conn_options(params))
    await wait_for(
        lambda: (
            any(c.connected() for c in writer.conns.values())
            and any(c.connected() and c.rdy > 0 for c in reader.conns.values())
        ),
        15,
        "the writer and reader connections",
    )
    bodies = [f"s-{i:05d}".encode() for i in range(n)]
    half = n // 2
    futures = [
        publish(writer, "mpub", topic, bodies[i : min(i + 50, half)]) for i in range(0, half, 50)
    ]
    futures += [publish(writer, "pub", topic, body) for body in bodies[half:]]
    responses = await asyncio.gather(*futures)
    await wait_for(lambda: len(received) >= n, 30, f"{n} messages")
    await asyncio.sleep(0.3)
    result: Result = {
        "responses": dict(Counter(responses)),
        "received": len(received),
        "distinct": len(set(received)),
        "writer_layers": [layers(c) for c in writer.conns.values()],
        "reader_layers": [layers(c) for c in reader.conns.values()],
    }
    close_reader(reader)
    return result


async def auth(params: Params) -> Result:
    """A Writer with ``auth_secret`` publishes where it may and where it may not; two Readers
    subscribe, on a channel they may read and on one they may not (pynsq logs that refusal on
    stderr)."""
    writer = nsq.Writer([params["address"]], **conn_options(params))
    await wait_for(
        lambda: any(c.connected() for c in writer.conns.values()), 15, "the writer connection"
    )
    allowed = await publish(writer, "pub", params["allowed_topic"], b"granted")
    refused = await publish(writer, "pub", params["refused_topic"], b"refused")
    got: dict[str, list[str]] = {params["allowed_channel"]: [], params["refused_channel"]: []}
    readers = [
        nsq.Reader(
            topic=params["allowed_topic"],
            channel=channel,
            message_handler=lambda m, channel=channel: got[channel].append(m.body.decode()) or True,
            nsqd_tcp_addresses=[params["address"]],
            **conn_options(params),
        )
        for channel in got
    ]
    await wait_for(lambda: bool(got[params["allowed_channel"]]), 15, "the granted message")
    await asyncio.sleep(params["reader_wait_s"])
    for reader in readers:
        close_reader(reader)
    return {"allowed": allowed, "refused": refused, "reader_got": got}


def run(coroutine: Callable[[Params], Any]) -> Callable[[Params], Result]:
    def scenario(params: Params) -> Result:
        result: Result = IOLoop.current().run_sync(
            lambda: coroutine(params), timeout=params["hard_limit_s"] - 1
        )
        return result

    return scenario


if __name__ == "__main__":
    main({"pubsub": run(pubsub), "auth": run(auth)})
