"""``OutputBuffer``: frames in order behind durable holds, without trio.

Rules for this module: plain ``def`` tests; ``on_ready`` calls are counted, frames are bytes.
"""

from __future__ import annotations

from lmqd.server.output import OutputBuffer


def make() -> tuple[OutputBuffer, list[int]]:
    wakes: list[int] = []
    return OutputBuffer(lambda: wakes.append(1)), wakes


def test_frames_go_out_in_order_in_one_take() -> None:
    out, wakes = make()
    out.write(b"a")
    out.write_parts([b"b", b"cc"], 3)
    assert out.ready_bytes == 4 and out.has_ready and len(wakes) == 2
    assert out.take() == b"abcc"
    assert out.take() == b"" and not out.has_unsent
    assert out.pending_bytes == 4  # the joined copy lives until the send completes
    out.sent()
    assert out.pending_bytes == 0


def test_a_hold_keeps_its_frames_and_everything_after_it() -> None:
    out, wakes = make()
    out.write(b"before;")
    hold = out.hold("PUB", [b"OK1;"])
    out.write(b"after;")
    assert out.take() == b"before;"
    assert out.held_bytes == len(b"OK1;after;") and out.has_unsent and not out.has_ready
    assert out.release(hold, None) is None
    assert out.take() == b"OK1;after;"
    assert wakes  # the writer is woken when the hold is released


def test_holds_release_in_order() -> None:
    out, _ = make()
    first = out.hold("PUB", [b"1"])
    second = out.hold("MPUB", [b"2"])
    out.release(second, None)
    assert out.take() == b""  # the first is still waiting
    out.release(first, None)
    assert out.take() == b"12"


def test_heartbeats_jump_the_holds() -> None:
    out, _ = make()
    out.hold("PUB", [b"OK"])
    out.write_now(b"_heartbeat_")
    assert out.take() == b"_heartbeat_"


def test_a_failed_sync_becomes_the_fatal_publish_error_and_drops_what_followed() -> None:
    out, _ = make()
    hold = out.hold("MPUB", [b"OK"])
    out.write(b"later")
    later = out.hold("PUB", [b"OK2"])
    failure = out.release(hold, OSError("disk on fire"))
    assert failure is not None and failure.fatal
    assert failure.code == "E_MPUB_FAILED"
    data = out.take()
    assert b"OK" not in data and b"later" not in data
    assert data == failure.frame()  # size, frame type 1 (error), body
    assert out.held_bytes == 0 and not out.has_unsent
    assert out.release(later, None) is None  # a hold dropped by the failure: nothing to send
    assert out.take() == b""
