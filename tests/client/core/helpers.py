"""Frames and fakes for the core tests: the daemon's frames as the decoded events the core takes,
a clock the test sets, and a reader of what a link has queued."""

from __future__ import annotations

import json
from typing import Any

from lmq_client.core.link import Link
from lmqd.protocol import Error, FrameEvent, MessageFrame, Response
from lmqd.protocol.frames import make_message_frame

IDENTIFY_ANSWER: dict[str, Any] = {"max_rdy_count": 2500, "version": "1.3.0"}
OK = Response(data=b"OK")
HEARTBEAT = Response(data=b"_heartbeat_")
CLOSE_WAIT = Response(data=b"CLOSE_WAIT")


def error(code: str, text: str = "") -> Error:
    return Error(code=code, text=text)


def msg_id(i: int) -> bytes:
    return b"%016x" % i


def message(i: int, body: bytes = b"x", attempts: int = 1) -> MessageFrame:
    return make_message_frame(msg_id(i), 0, attempts, body)


def identify_answer(**overrides: Any) -> dict[str, Any]:
    return json.loads(json.dumps({**IDENTIFY_ANSWER, **overrides}))


def sent(link: Link) -> list[bytes]:
    """The commands ``link`` has queued since the last call, one per line (bodies aside)."""
    data = link.take_output()
    return [line for line in data.split(b"\n") if line] if data else []


class Clock:
    """The time the core reads for answers; the test moves it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def frames(*events: FrameEvent) -> list[FrameEvent]:
    return list(events)
