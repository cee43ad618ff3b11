"""The parts a DiskQueue is composed of, as units: acknowledgements, segments, the write cache.

Rules for this module: no trio, no files (except where a part's whole job is a file); each part
is driven through its own small interface. What the parts do together is tested through
``DiskQueue`` in the other modules. Also here: the storage package's import rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lmqd.storage
from lmqd.engine import backend
from lmqd.storage.acks import AckTracker
from lmqd.storage.errors import BackendError
from lmqd.storage.record import BATCH_ENTRY_SIZE, BATCH_OVERHEAD, SEGMENT_HEADER_SIZE
from lmqd.storage.segments import Segment, SegmentList
from lmqd.storage.tokens import record_token
from lmqd.storage.write_cache import WriteCache

from .storage_helpers import make_messages

STORAGE = Path(lmqd.storage.__file__).parent


def _lmqd_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "lmqd" or name.startswith("lmqd.")}


def test_storage_imports_nothing_above_it() -> None:
    # lmqd: __version__ only
    allowed = {"lmqd", "lmqd.message", "lmqd.message_ext", "lmqd.names", "lmqd.units"}
    for path in sorted(STORAGE.glob("*.py")):
        above = {
            name
            for name in _lmqd_imports(path)
            if name not in allowed and not name.startswith("lmqd.storage.")
        }
        assert not above, f"{path.name} imports {above}"


def test_the_queue_s_parts_do_not_import_the_queue() -> None:
    for path in sorted(STORAGE.glob("*.py")):
        if path.name not in ("__init__.py", "diskqueue.py"):
            assert "lmqd.storage.diskqueue" not in _lmqd_imports(path), path.name


def test_backend_error_has_one_definition() -> None:
    assert backend.BackendError is BackendError


# -- acknowledgements -----------------------------------------------------------------------


def _handed_out(acks: AckTracker, segment: int, offset: int, count: int) -> list[int]:
    """What the reader does when it hands out ``count`` messages of one record."""
    first = record_token(segment, offset)
    tokens = range(first, first + count)
    acks.outstanding.update(tokens)
    acks.order.extend(tokens)
    return list(tokens)


def test_the_oldest_unacknowledged_message_is_the_position_to_persist() -> None:
    acks = AckTracker()
    assert acks.oldest_position() is None
    a = _handed_out(acks, 1, 4096, 3)
    b = _handed_out(acks, 2, SEGMENT_HEADER_SIZE, 2)
    assert (len(acks), acks.oldest_position()) == (5, (1, 4096, 0))
    assert acks.ack_many([a[0], a[2], b[1]]) == 3
    # a[2] and b[1] stay behind a[1]: a restart reads them again (duplicates, never loss).
    assert (len(acks), len(acks.order), acks.oldest_position()) == (2, 4, (1, 4096, 1))
    assert acks.ack(a[1])
    assert (len(acks), len(acks.order), acks.oldest_position()) == (1, 2, (2, 32, 0))


def test_unknown_and_repeated_tokens_are_not_counted() -> None:
    acks = AckTracker()
    tokens = _handed_out(acks, 0, SEGMENT_HEADER_SIZE, 2)
    assert acks.ack_many([tokens[0], tokens[0], 12345]) == 1
    assert not acks.ack(tokens[0])
    assert not acks.ack(12345)
    acks.clear()
    assert (len(acks), acks.oldest_position(), acks.ack(tokens[1])) == (0, None, False)


# -- segments -------------------------------------------------------------------------------


def test_bounds_jump_over_skipped_regions() -> None:
    seg = Segment(0, "x", 1000, [(100, 200), (200, 250), (400, 500)], 0)
    assert seg.bounds(32) == (32, 100)
    assert seg.bounds(100) == (250, 400)
    assert seg.bounds(150) == (250, 400)
    assert seg.bounds(450) == (500, 1000)
    assert seg.bounds(1000) == (1000, 1000)


def test_retired_segments_are_released_only_before_the_read_segment(tmp_path: Path) -> None:
    segments = SegmentList("t", str(tmp_path))
    for number in range(3):
        segments.append(Segment(number, segments.path(number), 100 + number, [], 1))
    assert (segments.next_number, segments.bytes_on_disk) == (3, 303)
    segments.retire_first()
    segments.retire_first()
    assert [seg.number for seg in segments.live] == [2]
    assert segments.release_consumed(1) == [segments.path(0)]
    assert segments.bytes_on_disk == 203  # segment 1 still counts: no job unlinks it yet
    assert segments.paths() == [segments.path(1), segments.path(2)]
    assert segments.release_consumed(2) == [segments.path(1)]
    assert segments.bytes_on_disk == 102


def test_a_created_segment_starts_with_its_header(tmp_path: Path) -> None:
    segments = SegmentList("t:c", str(tmp_path))
    fd = segments.create(5)
    try:
        data = Path(segments.path(5)).read_bytes()
    finally:
        segments.discard_new(5, fd, segments.path(5))
    assert len(data) == SEGMENT_HEADER_SIZE and data.startswith(b"\x89LMQSEG\n")
    assert Path(segments.path(5)).name == "t%3Ac.lmq.000005.dat"
    assert not Path(segments.path(5)).exists()
    assert segments.entry(5).end == SEGMENT_HEADER_SIZE


# -- the write cache ------------------------------------------------------------------------


def _record(count: int, body: int) -> int:
    return BATCH_OVERHEAD + count * (BATCH_ENTRY_SIZE + body)


def test_the_cache_opens_only_empty_and_closes_when_a_write_does_not_fit() -> None:
    msgs = make_messages(6, body_size=10)  # bodies of 10 bytes
    cache = WriteCache(2 * _record(2, 10))
    assert not cache.open
    cache.reader_caught_up()
    assert cache.open
    first = (0, SEGMENT_HEADER_SIZE, [(0, 2, 2 * (BATCH_ENTRY_SIZE + 10))], [_record(2, 10)])
    cache.remember(msgs[:2], [first])
    assert cache.bytes == _record(2, 10)
    assert cache.records[0] == (0, SEGMENT_HEADER_SIZE, SEGMENT_HEADER_SIZE + cache.bytes, msgs[:2])
    # Three more messages do not fit: the cache closes, what it holds stays for the reader.
    cache.remember(msgs[2:5], [(0, 200, [(0, 3, 3 * (BATCH_ENTRY_SIZE + 10))], [_record(3, 10)])])
    assert not cache.open and len(cache.records) == 1
    cache.reader_caught_up()  # not empty yet: it stays closed
    assert not cache.open
    cache.drop()
    assert (cache.open, cache.bytes, len(cache.records)) == (False, 0, 0)
    cache.reader_caught_up()
    assert cache.open


def test_a_disabled_cache_never_opens() -> None:
    cache = WriteCache(enabled=False)
    cache.reader_caught_up()
    assert not cache.open
