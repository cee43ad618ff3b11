"""pynsq 0.9.1: a ``Reader`` that finds its nsqds only through a lookupd, until it has
``count`` messages plus a quiet spell (a duplicate would arrive then). ``python pynsq_reader.py
'<json>'``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nsq  # type: ignore[import-untyped]
from harness import Params, Result, main
from tornado.ioloop import IOLoop


async def _consume(params: Params) -> Result:
    received: list[str] = []
    all_received = asyncio.Event()

    def handler(message: Any) -> bool:
        received.append(message.body.decode())
        if len(received) >= params["count"]:
            all_received.set()
        return True

    reader = nsq.Reader(
        topic=params["topic"],
        channel=params["channel"],
        message_handler=handler,
        lookupd_http_addresses=[params["lookupd_url"]],
        lookupd_poll_interval=60,
        max_in_flight=20,
    )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_received.wait(), params["within_s"])
    await asyncio.sleep(params["quiet_s"])
    connections = sorted(reader.conns)
    reader.connect_to_nsqd = lambda *args, **kwargs: None  # no reconnect timers
    reader.close()
    return {"bodies": received, "connections": connections}


def consume(params: Params) -> Result:
    result: Result = IOLoop.current().run_sync(
        lambda: _consume(params), timeout=params["within_s"] + params["quiet_s"] + 5
    )
    return result


if __name__ == "__main__":
    main(consume)
