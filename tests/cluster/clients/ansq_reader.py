"""ansq 0.3.0: a ``Reader`` that finds its nsqds only through a lookupd, until it has ``count``
messages plus a quiet spell (a duplicate would arrive then). ``python ansq_reader.py '<json>'``.
"""

from __future__ import annotations

import asyncio
import contextlib

import ansq
from harness import Params, Result, main


async def _consume(params: Params) -> Result:
    received: list[str] = []
    all_received = asyncio.Event()
    reader = await ansq.create_reader(
        topic=params["topic"],
        channel=params["channel"],
        lookupd_http_addresses=[params["lookupd_url"]],
        lookupd_poll_interval=60_000,
    )

    async def consume() -> None:
        async for message in reader.messages():
            received.append(message.body.decode())
            await message.fin()
            if len(received) >= params["count"]:
                all_received.set()

    task = asyncio.create_task(consume())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_received.wait(), params["within_s"])
    await asyncio.sleep(params["quiet_s"])
    connections = sorted(str(c.endpoint) for c in reader.connections)
    task.cancel()
    await reader.close()
    return {"bodies": received, "connections": connections}


def consume(params: Params) -> Result:
    return asyncio.run(_consume(params))


if __name__ == "__main__":
    main(consume)
