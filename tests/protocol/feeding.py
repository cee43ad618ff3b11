"""Feeding helpers for the protocol tests, after ``h11/tests/test_io.py``.

Every parser case runs three ways: the bytes whole, one byte at a time, and whole followed by
another command in the same buffer ("trailing"), which must not disturb the first.
"""

from __future__ import annotations

import struct

from lmqd.protocol import (
    ClientConnection,
    Event,
    FrameEvent,
    Limits,
    Nop,
    ProtocolError,
    ServerConnection,
    one_per_command,
)

MAGIC = b"  V2"
MSG_ID = b"0123456789abcdef"
MODES = ("whole", "bytewise", "trailing")
TRAILER = b"NOP\n"
SUBSCRIBE = b"SUB topic channel\n"


def size(n: int) -> bytes:
    """A 4-byte big-endian signed size, as on the wire."""
    return struct.pack(">i", n)


def sized(body: bytes) -> bytes:
    """``[size][body]``."""
    return size(len(body)) + body


def chunks(data: bytes, mode: str) -> list[bytes]:
    if mode == "bytewise":
        return [data[i : i + 1] for i in range(len(data))]
    if mode == "trailing":
        return [data + TRAILER]
    assert mode == "whole"
    return [data]


def server(setup: bytes = b"", limits: Limits | None = None) -> ServerConnection:
    """A connection past the magic, with ``setup`` commands applied and their events dropped."""
    conn = ServerConnection(limits or Limits())
    conn.receive_data(MAGIC + setup)
    conn.next_events()
    return conn


def feed(
    conn: ServerConnection, data: bytes, mode: str
) -> tuple[list[Event], ProtocolError | None]:
    """Feed ``data`` in ``mode``; the events parsed (one per command: ``Fins`` runs are split
    into ``Fin`` events, as their grouping depends on the receive boundaries) and the error
    raised (if any).

    In "trailing" mode the trailing NOP's event is checked and removed, so every mode must give
    the same result.
    """
    events: list[Event] = []
    try:
        for chunk in chunks(data, mode):
            conn.receive_data(chunk)
            events.extend(conn.next_events())
        events.extend(conn.next_events())
    except ProtocolError as exc:
        return one_per_command(events), exc
    if mode == "trailing":
        assert events[-1] == Nop(), events
        events.pop()
    return one_per_command(events), None


def parse(
    data: bytes, mode: str, setup: bytes = b"", limits: Limits | None = None
) -> tuple[list[Event], ProtocolError | None]:
    """``feed`` on a fresh connection prepared with ``setup``."""
    return feed(server(setup, limits), data, mode)


def parse_ok(
    data: bytes, mode: str, setup: bytes = b"", limits: Limits | None = None
) -> list[Event]:
    events, error = parse(data, mode, setup, limits)
    assert error is None, error
    return events


def parse_error(
    data: bytes, mode: str, setup: bytes = b"", limits: Limits | None = None
) -> ProtocolError:
    """The error ``data`` raises, asserting that no event came before it."""
    events, error = parse(data, mode, setup, limits)
    assert error is not None, events
    assert events == [], events
    return error


def client_feed(
    conn: ClientConnection, data: bytes, mode: str, trailer: bytes
) -> tuple[list[FrameEvent], ProtocolError | None]:
    """Like ``feed`` for the client side; ``trailer`` is appended in "trailing" mode."""
    pieces = chunks(data, mode) if mode != "trailing" else [data + trailer]
    events: list[FrameEvent] = []
    try:
        for piece in pieces:
            conn.receive_data(piece)
            events.extend(conn.next_events())
        events.extend(conn.next_events())
    except ProtocolError as exc:
        return events, exc  # frames: nothing to split per command
    return events, None
