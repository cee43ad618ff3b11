"""lmq's ``lmq_http_address`` IDENTIFY key on a real daemon: where its HTTP API listens, told
only to a client that asks (the Spark source, given a TCP address, finds ``/topic/read`` so).

Rules for this module: the in-process daemon on 127.0.0.1 port 0 (``start_daemon``); exact
bytes through ``tests.support.rawbytes.NsqSocket`` in a worker thread; a ``fail_after`` guard.
"""

from __future__ import annotations

import json

import trio

from lmqd.net import format_address
from tests.support.daemon import StartDaemon
from tests.support.rawbytes import NsqSocket, identify

TIMEOUT = 10


def _answer(address: str, fields: dict[str, object]) -> bytes:
    with NsqSocket(address) as s:
        s.send(identify(**fields))
        frame_type, data = s.read_skipping_heartbeats()
        assert frame_type == 0
        return data


async def test_a_client_that_asks_is_told_the_http_address(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        tcp = format_address(running.tcp)
        assert running.addresses.http is not None
        asked = await trio.to_thread.run_sync(
            _answer, tcp, {"feature_negotiation": True, "lmq_http_address": True}
        )
        assert json.loads(asked)["lmq_http_address"] == format_address(running.addresses.http)
        plain = await trio.to_thread.run_sync(_answer, tcp, {"feature_negotiation": True})
        # nsqd's answer, byte for byte: the asked-for key is the one difference, at the end.
        assert asked.startswith(plain[:-1] + b',"lmq_http_address":')
        assert b"lmq_http_address" not in plain


async def test_a_daemon_without_http_answers_an_empty_address(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon()
        asked = await trio.to_thread.run_sync(
            _answer, format_address(running.tcp),
            {"feature_negotiation": True, "lmq_http_address": True},
        )
        assert json.loads(asked)["lmq_http_address"] == ""
