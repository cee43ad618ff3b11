"""Which of a topic log's oldest segments may be deleted now: the cursors, then retention.

By default (nsqd's behaviour) a segment is deleted once every cursor has passed it: all its
offsets are below every cursor's low-water mark. A topic may instead keep its log longer, for a
time (``retention_ms``, judged by the segment's newest message timestamp against the wall clock)
and/or a size (``retention_bytes``, the bytes of the segment and every newer one): a segment
every cursor has passed is kept while each limit that is set still holds for it, so with both
set, whichever is reached first lets it go (as Kafka's ``retention.ms`` and ``retention.bytes``).
Retention only ever keeps more: a segment some cursor has not passed is never deleted, and a log
with no cursor at all deletes nothing (nsqd: a topic without channels holds its messages for the
first channel created).

A **floor** (``keep_recent_ms``, set by the topic for its dedup windows) keeps every segment
whose newest message is younger than that, whatever the retention says: the ids and bodies
published within a dedup window stay on disk for the next start to rebuild the window from
(``lmqd.engine.topic``). It too only ever keeps more.

Deletion goes from the oldest segment on and stops at the first one that must stay (a log has no
holes). The write segment goes only by time, as Kafka's active segment does: when time retention
is set, every cursor has passed it and its newest message is past ``retention_ms`` (an idle
topic's last messages), it is counted too, and the caller starts a new, empty write segment
before retiring it; size retention, or nsqd's rule alone, never takes it. The caller
(``TopicLog.prepare_sync``) retires the segments counted here; the sync job that persists the
cursors' marks unlinks them afterwards. Time passes without a write, so the syncer asks
``TopicLog.retire_due`` at each tick of an idle log that keeps segments by time.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from lmqd.storage.log_index import NO_TIMESTAMP, SegmentIndex

NS_PER_MS = 1_000_000


def deletable_segments(
    segments: Sequence[SegmentIndex],
    lows: Collection[int],
    *,
    now_ns: int,
    retention_ms: int | None = None,
    retention_bytes: int | None = None,
    keep_recent_ms: int | None = None,
) -> int:
    """How many segments from the front of ``segments`` (oldest first, the write segment last)
    may be deleted, given the cursors' low-water marks ``lows`` and wall-clock ``now_ns``; all
    of them when the write segment expired by time (the caller rolls first)."""
    if not lows or not segments:
        return 0
    low = min(lows)
    newer_bytes = sum(seg.file.end for seg in segments)
    """Bytes of the segment under consideration and every newer one."""
    count = 0
    last = len(segments) - 1
    for k, seg in enumerate(segments):
        if k == last and (
            retention_ms is None
            or seg.newest_ns == NO_TIMESTAMP
            or now_ns - seg.newest_ns < retention_ms * NS_PER_MS
        ):
            break  # the write segment goes only when its messages expired by time
        if seg.next > low:
            break  # some cursor has not passed it
        if keep_recent_ms is not None and (
            seg.newest_ns != NO_TIMESTAMP and now_ns - seg.newest_ns < keep_recent_ms * NS_PER_MS
        ):
            break  # within the floor
        keep: list[bool] = []
        if retention_ms is not None:
            keep.append(
                seg.newest_ns != NO_TIMESTAMP and now_ns - seg.newest_ns < retention_ms * NS_PER_MS
            )
        if retention_bytes is not None:
            keep.append(newer_bytes <= retention_bytes)
        if keep and all(keep):
            break
        newer_bytes -= seg.file.end
        count += 1
    return count
