"""The topic log's state file: what it keeps, and that anything malformed is refused whole."""

from __future__ import annotations

import pytest

from lmqd.storage.log_state import LogState, decode_log_state, encode_log_state


def test_the_state_round_trips_with_read_positions_and_skipped_ranges() -> None:
    state = LogState(
        next_offset=120, write_segment=3, write_offset=4096,
        cursors=(("a", 10), ("b", 100)), legacy=((0, 0),), adopted=None,
        read=(("a", 15),), skips=(("a", ((40, 50), (60, 61))),),
    )
    data = encode_log_state("t", state)
    assert b'"skips":{"a":[[40,50],[60,61]]}' in data
    assert decode_log_state("t", data) == state


def test_a_state_without_skips_has_no_skips_key() -> None:
    data = encode_log_state("t", LogState(5, 0, 32, (("a", 5),)))
    assert b"skips" not in data
    assert decode_log_state("t", data).skips == ()


@pytest.mark.parametrize(
    "skips",
    ['[]', '{"a": 5}', '{"a": [[5]]}', '{"a": [[5, 5]]}', '{"a": [[7, 3]]}', '{"a": [[-1, 3]]}',
     '{"a": [["1", 3]]}'],
)
def test_malformed_skipped_ranges_are_refused(skips: str) -> None:
    data = (
        '{"version":1,"name":"t","next_offset":9,"write":[0,32],"cursors":{"a":1},'
        f'"legacy":[],"skips":{skips}}}'
    ).encode()
    with pytest.raises(ValueError, match="skipped range"):
        decode_log_state("t", data)
