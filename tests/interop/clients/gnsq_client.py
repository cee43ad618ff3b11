"""gnsq (gevent) scenarios against an lmqd: ``python gnsq_client.py <scenario> '<json>'``.

gnsq does its I/O through ``gevent.socket`` itself, so nothing is monkey-patched here (and never
in the pytest process). Waits are ``gevent.sleep`` loops with deadlines.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import gevent  # type: ignore[import-untyped]
import gnsq  # type: ignore[import-untyped]
from clientlib import Params, Result, check_deadline, deadline_after, main
from gnsq import protocol as nsq_protocol


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def pubsub(params: Params) -> Result:
    """N messages (MPUB batches, then some PUBs) consumed by several Consumers on one channel."""
    n, batch, single = params["count"], params["batch"], params["single_pubs"]
    received: list[tuple[int, str, int]] = []

    def handler_for(index: int) -> Any:
        def handler(consumer: Any, message: Any) -> None:
            received.append((index, message.body.decode(), message.attempts))

        return handler

    consumers = [
        gnsq.Consumer(
            params["topic"],
            params["channel"],
            nsqd_tcp_addresses=[params["address"]],
            max_in_flight=params["max_in_flight"],
            message_handler=handler_for(i),
        )
        for i in range(params["consumers"])
    ]
    for consumer in consumers:
        consumer.start(block=False)
    producer = gnsq.Producer(nsqd_tcp_addresses=[params["address"]])
    producer.start()

    bodies = [f"g-{i:06d}".encode() for i in range(n)]
    responses = [
        producer.multipublish(params["topic"], bodies[i : min(i + batch, n - single)])
        for i in range(0, n - single, batch)
    ]
    responses += [producer.publish(params["topic"], body) for body in bodies[n - single :]]

    deadline = deadline_after(params["consume_timeout_s"])
    while len(received) < n:
        check_deadline(deadline, f"{n} messages")
        gevent.sleep(0.01)
    gevent.sleep(params["quiet_s"])  # a duplicate would arrive now
    for consumer in consumers:
        consumer.close()
    producer.close()
    return {
        "responses": dict(Counter(r.decode() for r in responses)),
        "bodies": [body for _, body, _ in received],
        "per_consumer": [sum(1 for c, _, _ in received if c == i) for i in range(len(consumers))],
        "attempts": dict(Counter(a for _, _, a in received)),
    }


def raw_error(params: Params) -> Result:
    """Send a raw command with gnsq's low-level client; how does gnsq surface the answer?"""
    host, port = host_port(params["address"])
    conn = gnsq.NsqdTCPClient(host, port, timeout=5.0)
    conn.connect()
    identify = conn.identify()
    conn.send(params["command"].encode())
    frame, error = conn.read_response()
    return {
        "identify_version": identify.get("version") if isinstance(identify, dict) else None,
        "frame": frame,
        "error_class": type(error).__name__,
        "error_text": error.args[0].decode() if error.args else "",
        "fatal": bool(getattr(error, "fatal", False)),
        # gnsq closes its side on a fatal error; the daemon closes its side too (raw tests).
        "connected_after": conn.is_connected,
    }


def cls_before_sub(params: Params) -> Result:
    """gnsq's own suite: CLS before SUB is answered with an E_INVALID error frame."""
    host, port = host_port(params["address"])
    conn = gnsq.NsqdTCPClient(host, port, timeout=5.0)
    conn.connect()
    conn.identify()
    conn.close()  # sends CLS
    frame, error = conn.read_response()
    return {
        "frame": frame,
        "error_class": type(error).__name__,
        "error_text": error.args[0].decode() if error.args else "",
        "connected_after": conn.is_connected,
    }


def heartbeat(params: Params) -> Result:
    """gnsq answers heartbeats with NOP by itself; the connection outlives 2 intervals."""
    host, port = host_port(params["address"])
    conn = gnsq.NsqdTCPClient(host, port, timeout=5.0, heartbeat_interval=1)
    conn.connect()
    conn.identify()
    beats: list[float] = []
    start = time.monotonic()
    while time.monotonic() - start < params["seconds"]:
        frame, data = conn.read_response()  # a heartbeat triggers the NOP inside gnsq
        if frame == nsq_protocol.FRAME_TYPE_RESPONSE and data == nsq_protocol.HEARTBEAT:
            beats.append(round(time.monotonic() - start, 3))
    conn.publish(params["topic"], b"still here")
    while True:
        frame, data = conn.read_response()
        if data != nsq_protocol.HEARTBEAT:
            break
    return {"beats": beats, "publish_frame": frame, "publish_response": data.decode()}


def http_stats(params: Params) -> Result:
    """gnsq's HTTP client against lmqd's /stats (gnsq's suite reads topic/channel depths)."""
    host, port = host_port(params["http_address"])
    http = gnsq.NsqdHTTPClient(host, port)
    producer = gnsq.Producer(nsqd_tcp_addresses=[params["address"]])
    producer.start()
    http.create_topic(params["topic"])
    http.create_channel(params["topic"], params["channel"])
    for i in range(params["count"]):
        producer.publish(params["topic"], b"%d" % i)
    producer.close()
    # The topic's pump moves the messages to the channel right after the publishes; poll briefly.
    deadline = deadline_after(5)
    while True:
        stats = http.stats()
        topics = [t for t in stats["topics"] if t["topic_name"] == params["topic"]]
        channels = topics[0]["channels"] if topics else []
        if (channels and channels[0]["depth"] == params["count"]) or time.monotonic() > deadline:
            break
        gevent.sleep(0.05)
    return {
        "topic_depth": topics[0]["depth"] if topics else None,
        "channels": [
            {"name": c["channel_name"], "depth": c["depth"], "deferred": c["deferred_count"]}
            for c in channels
        ],
    }


def consume(params: Params) -> Result:
    """Publish ``bodies`` (if any), then consume ``expect`` deliveries on one channel with a
    stock ``gnsq.Consumer``: each is REQ'd at once (``requeue``: REQ <id> 0) or FIN'd
    (``action``); returns every delivery's body and attempts, after ``quiet_s`` with nothing
    more; and every delivery as gnsq decoded it (``messages``: id, timestamp, attempts, body
    in hex)."""
    received: list[tuple[str, int]] = []
    messages: list[dict[str, Any]] = []
    requeue = params["action"] == "requeue"

    def handler(consumer: Any, message: Any) -> None:
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
            message.requeue(0, backoff=False)
        else:
            message.finish()

    consumer = gnsq.Consumer(
        params["topic"],
        params["channel"],
        nsqd_tcp_addresses=[params["address"]],
        max_in_flight=10,
        max_tries=0,  # gnsq's own limit off: the daemon's max_attempts decides
        message_handler=handler,
    )
    consumer.start(block=False)
    if params.get("bodies"):
        producer = gnsq.Producer(nsqd_tcp_addresses=[params["address"]])
        producer.start()
        for body in params["bodies"]:
            producer.publish(params["topic"], body.encode())
        producer.close()
    deadline = deadline_after(params["consume_timeout_s"])
    while len(received) < params["expect"]:
        check_deadline(deadline, f"{params['expect']} deliveries")
        gevent.sleep(0.01)
    gevent.sleep(params["quiet_s"])  # one more delivery would arrive now
    consumer.close()
    return {"received": received, "messages": messages}


def rate_limited(params: Params) -> Result:
    """A Producer publishing one message at a time to a rate-limited topic, then one MPUB
    bigger than the bucket: how long did the PUBs take, how is the refusal surfaced?"""
    producer = gnsq.Producer(nsqd_tcp_addresses=[params["address"]])
    producer.start()
    start = time.monotonic()
    answers = [
        producer.publish(params["topic"], b"%d" % i).decode() for i in range(params["count"])
    ]
    elapsed = time.monotonic() - start
    try:
        producer.multipublish(params["topic"], [b"x"] * params["mpub"])
        refusal: dict[str, str] = {}
    except gnsq.errors.NSQException as exc:
        text = exc.args[0] if exc.args else b""
        refusal = {
            "class": type(exc).__name__,
            "text": text.decode() if isinstance(text, bytes) else str(text),
        }
    producer.close()
    return {"answers": answers, "elapsed_s": elapsed, "refusal": refusal}


if __name__ == "__main__":
    main(
        {
            "pubsub": pubsub,
            "raw_error": raw_error,
            "cls_before_sub": cls_before_sub,
            "heartbeat": heartbeat,
            "http_stats": http_stats,
            "consume": consume,
            "rate_limited": rate_limited,
        }
    )
