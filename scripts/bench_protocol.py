"""Micro-benchmark of the protocol hot paths: ns per parsed command / encoded message frame.

Run: .venv/bin/python scripts/bench_protocol.py
"""

from __future__ import annotations

import struct
import timeit
from collections.abc import Callable, Sequence

from lmqd.message import Message
from lmqd.protocol import Limits, Mpub, ServerConnection, encode_message, encode_messages
from lmqd.protocol.frames import _MESSAGE_PREFIX

MSG_ID = b"0123456789abcdef"
BODY = b"x" * 100
N = 2000


def subscribed_connection() -> ServerConnection:
    conn = ServerConnection(Limits())
    conn.receive_data(b"  V2SUB topic channel\n")
    conn.next_events()
    return conn


def parse_ns(payload: bytes, items: int, subscribe: bool, repeat: int = 7) -> float:
    """Best-of-``repeat`` ns per item to parse ``payload`` on a fresh connection."""
    best = float("inf")
    for _ in range(repeat):
        conns = [
            subscribed_connection() if subscribe else ServerConnection(Limits()) for _ in range(5)
        ]
        if not subscribe:
            for c in conns:
                c.receive_data(b"  V2")
                c.next_events()
        start = timeit.default_timer()
        for c in conns:
            c.receive_data(payload)
            events = c.next_events()
        elapsed = timeit.default_timer() - start
        assert events
        best = min(best, elapsed / (len(conns) * items))
    return best * 1e9


def encode_join_of_concats(msgs: Sequence[Message]) -> bytes:
    return b"".join([encode_message(m) for m in msgs])


def encode_comprehension(msgs: Sequence[Message]) -> bytes:
    pack = _MESSAGE_PREFIX.pack
    return b"".join(
        [
            part
            for m in msgs
            for part in (pack(len(m.body) + 30, 2, m.timestamp, m.attempts & 0xFFFF), m.id, m.body)
        ]
    )


def encode_ns(fn: Callable[[Sequence[Message]], bytes], msgs: Sequence[Message]) -> float:
    number = 20
    best = min(timeit.repeat(lambda: fn(msgs), number=number, repeat=7))
    return best / (number * len(msgs)) * 1e9


def main() -> None:
    rows: list[tuple[str, float]] = []
    fins = b"FIN %s\n" % MSG_ID * N
    rows.append(("FIN line parsed", parse_ns(fins, N, subscribe=True)))
    pubs = (b"PUB topic\n" + struct.pack(">i", len(BODY)) + BODY) * N
    rows.append(("PUB (100 B body) parsed, one topic", parse_ns(pubs, N, subscribe=False)))
    mixed = b"".join(b"PUB t%d\n" % (i % 2) + struct.pack(">i", len(BODY)) + BODY for i in range(N))
    rows.append(("PUB (100 B body) parsed, topics alternate", parse_ns(mixed, N, subscribe=False)))
    mpub = Mpub(topic="topic", bodies=[BODY] * 200).encode() * 10
    rows.append(("message in a 200-message MPUB", parse_ns(mpub, 2000, subscribe=False)))
    msgs = [Message(MSG_ID, BODY, 1_700_000_000_000_000_000, 1) for _ in range(N)]
    rows.append(("message frame, encode_messages", encode_ns(encode_messages, msgs)))
    rows.append(("message frame, comprehension of parts", encode_ns(encode_comprehension, msgs)))
    rows.append(("message frame, join of encode_message", encode_ns(encode_join_of_concats, msgs)))
    for label, ns in rows:
        print(f"{label:44} {ns:6.0f} ns")


if __name__ == "__main__":
    main()
