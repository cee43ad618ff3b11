"""gnsq 1.0.2 against an lmqlookupd: ``python gnsq_lookupd.py <scenario> '<json>'``.

``lookupd_client`` calls every method of gnsq's ``LookupdClient``; ``consume`` runs a gnsq
``Consumer`` that finds its nsqd only through the lookupd. gnsq does its I/O with
``gevent.socket`` and urllib3 itself; nothing is monkey-patched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gevent  # type: ignore[import-untyped]
import gnsq  # type: ignore[import-untyped]
from gnsq.errors import NSQHttpError  # type: ignore[import-untyped]
from harness import Params, Result, main


def _plain(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def lookupd_client(params: Params) -> Result:
    client: Any = gnsq.LookupdClient(host=params["host"], port=params["port"])
    topic = params["registered_topic"]
    out: Result = {}
    out["ping"] = _plain(client.ping())
    out["info"] = client.info()
    out["create_topic"] = _plain(client.create_topic("made"))
    out["create_channel"] = _plain(client.create_channel("made", "chan"))
    out["topics"] = client.topics()
    out["channels"] = client.channels("made")
    out["lookup_made"] = client.lookup("made")
    out["lookup_registered"] = client.lookup(topic)
    out["nodes"] = client.nodes()
    out["tombstone"] = _plain(client.tombstone_topic(topic, params["node"]))
    out["lookup_tombstoned"] = client.lookup(topic)
    out["nodes_tombstoned"] = client.nodes()
    out["delete_channel"] = _plain(client.delete_channel("made", "chan"))
    out["channels_after"] = client.channels("made")
    out["delete_topic"] = _plain(client.delete_topic("made"))
    out["topics_after"] = client.topics()
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("lookup_missing", lambda: client.lookup("missing")),
        ("delete_missing_channel", lambda: client.delete_channel("made", "nope")),
    ]
    for name, call in calls:
        try:
            out[name] = {"ok": _plain(call())}
        except NSQHttpError as exc:
            out[name] = {"error": str(exc)}
    return out


def consume(params: Params) -> Result:
    received: list[str] = []

    def handler(consumer: Any, message: Any) -> None:
        received.append(message.body.decode())

    consumer = gnsq.Consumer(
        params["topic"],
        params["channel"],
        lookupd_http_addresses=[params["lookupd_url"]],
        message_handler=handler,
        max_in_flight=10,
    )
    consumer.start(block=False)
    deadline = time.monotonic() + params["within_s"]
    while len(received) < params["count"] and time.monotonic() < deadline:
        gevent.sleep(0.01)
    # Private, but the only record of which nsqds it found; no nsqd address was given to it.
    connections = [str(conn) for conn in consumer._connections]
    consumer.close()
    return {"bodies": received, "connections": connections}


if __name__ == "__main__":
    main({"lookupd_client": lookupd_client, "consume": consume})
