"""ServerConnection's view of what it holds: ``buffered_bytes`` and ``missing_bytes``.

The server's daemon-wide buffer bound counts ``buffered_bytes``, and while over it reads only
``missing_bytes`` to complete a command already begun; both must follow every receive exactly.
Rules for this module: plain ``def`` tests, bytes fed one receive at a time.
"""

from __future__ import annotations

from lmqd.protocol import Limits, Pub

from .feeding import server, sized


def test_nothing_pending_between_commands() -> None:
    conn = server()
    assert (conn.buffered_bytes, conn.missing_bytes) == (0, 0)
    conn.receive_data(b"NOP\n")
    conn.next_events()
    assert (conn.buffered_bytes, conn.missing_bytes) == (0, 0)


def test_a_pub_body_in_progress_needs_exactly_the_rest() -> None:
    conn = server()
    command = b"PUB t\n" + sized(b"x" * 100)
    conn.receive_data(command[:20])
    assert conn.next_events() == []
    assert conn.buffered_bytes == 20
    assert conn.missing_bytes == len(command) - 20
    conn.receive_data(command[20:] + b"NOP\n")
    assert conn.next_events()[0] == Pub(topic="t", body=b"x" * 100)
    assert (conn.buffered_bytes, conn.missing_bytes) == (0, 0)


def test_a_size_not_yet_read_needs_its_four_bytes_first() -> None:
    conn = server()
    conn.receive_data(b"PUB t\n\x00\x00")
    assert conn.next_events() == []
    assert conn.missing_bytes == 2  # the rest of the size; then the body's length is known
    conn.receive_data(b"\x00\x03")
    assert conn.next_events() == []
    assert conn.missing_bytes == 3


def test_a_line_in_progress_may_take_up_to_the_line_limit() -> None:
    limits = Limits()
    conn = server(limits=limits)
    conn.receive_data(b"SUB a")
    assert conn.next_events() == []
    assert conn.buffered_bytes == 5
    assert conn.missing_bytes == limits.max_line_length - 5
