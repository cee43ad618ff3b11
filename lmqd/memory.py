"""The ``/stats`` ``memory`` block: Python's nearest equivalents of Go's ``runtime.MemStats``.

nsqd reports nine numbers from the Go runtime; lmqd keeps the keys (tools such as nsqadmin and
nsq_stat read them by name) and fills them with what CPython can tell cheaply:

==================== ==========================================================================
key                  lmqd's value
==================== ==========================================================================
heap_objects         ``sys.getallocatedblocks()``: memory blocks the interpreter holds
heap_in_use_bytes    resident set size now (``/proc/self/statm``; peak RSS where unavailable)
heap_idle_bytes      0 (CPython keeps no idle-heap figure)
heap_released_bytes  peak RSS minus current RSS: memory the process used and has given back
gc_pause_usec_100    longest of the last 256 garbage collections, in microseconds
gc_pause_usec_99     99th percentile of those (nsqd's ``percentile`` rule)
gc_pause_usec_95     95th percentile of those
next_gc_bytes        allocations left before the next generation-0 collection (**objects**,
                     not bytes: CPython's collector is triggered by counts)
gc_total_runs        collections of every generation since start (``gc.get_stats()``)
==================== ==========================================================================

GC pauses are measured by a ``gc.callbacks`` hook that the HTTP server installs while it runs
(``track_gc_pauses``); it times each collection with ``perf_counter_ns`` and keeps the last 256,
as Go's ``MemStats.PauseNs`` does. Without it the three pause keys are 0. ``tracemalloc`` is
deliberately not used: it slows every allocation.

``POST /debug/freememory`` (nsqd's ``debug.FreeOSMemory``) runs ``FREE_MEMORY_GENERATIONS``,
the youngest generation (bounded by ``GC_THRESHOLDS``: fast), and ``trim_heap`` (glibc's
``malloc_trim``, which gives free heap pages back to the OS: the part that is Go's FreeOSMemory)
in a worker thread. Never a full collection: it traverses every tracked object with the GIL
held and CPython 3.11 cannot split it (85 ms with a few thousand topics, 2.7 s measured with
ten thousand topics and channels): an admin call must not stall every client for that long, and
Python's own schedule runs the full collections anyway.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import resource
import sys
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

__all__ = [
    "FREE_MEMORY_GENERATIONS",
    "MEMORY_KEYS",
    "memory_stats",
    "track_gc_pauses",
    "trim_heap",
]

FREE_MEMORY_GENERATIONS = (0,)
"""What ``/debug/freememory`` collects: the youngest generation only, bounded by its threshold
(``GC_THRESHOLDS``). Generation 1 is not: right after a flood of topic creations it holds every
object they made, and collecting it stalled clients 0.4 s with ten thousand topics."""

MEMORY_KEYS = (
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
)
"""nsqd's ``memStats`` JSON keys, in its order."""

# Go's runtime keeps the last 256 GC pause times (MemStats.PauseNs is a [256]uint64 ring).
_PAUSE_HISTORY = 256
_pauses: deque[int] = deque(maxlen=_PAUSE_HISTORY)
_gc_started = 0
_trackers = 0


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter_ns()
    elif _gc_started:
        _pauses.append(time.perf_counter_ns() - _gc_started)
        _gc_started = 0


@contextlib.contextmanager
def track_gc_pauses() -> Iterator[None]:
    """Record GC pause times while the context is open (nestable: several daemons in one
    process, as in tests, share one hook)."""
    global _trackers
    if _trackers == 0:
        gc.callbacks.append(_on_gc)
    _trackers += 1
    try:
        yield
    finally:
        _trackers -= 1
        if _trackers == 0:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(_on_gc)


_malloc_trim: Any = None


def trim_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim(0)``); False where there
    is no such call. Blocking but without the GIL (a ctypes call): run it in a worker thread."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim is False:
        return False
    _malloc_trim(0)
    return True


def _percentile(perc: float, ordered: list[int]) -> int:
    # nsqd/stats.go percentile(): index floor(perc/100 * n + 0.5), clamped to the last one.
    n = len(ordered)
    if n == 0:
        return 0
    index = min(math.floor(perc / 100.0 * n + 0.5), n - 1)
    return ordered[index]


def _rss_bytes() -> tuple[int, int]:
    """(current, peak) resident set size in bytes."""
    # ru_maxrss is in KiB on Linux (bytes on macOS, where /proc is absent anyway).
    peak_raw = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = peak_raw if sys.platform == "darwin" else peak_raw * 1024
    try:
        with open("/proc/self/statm", "rb") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        current = peak
    return current, max(peak, current)


def memory_stats() -> dict[str, int]:
    """The nine values, keyed and ordered as nsqd's ``memory`` object."""
    current, peak = _rss_bytes()
    pauses_us = sorted(p // 1000 for p in _pauses)
    threshold = gc.get_threshold()[0]
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": current,
        "heap_released_bytes": peak - current,
        "gc_pause_usec_100": _percentile(100.0, pauses_us),
        "gc_pause_usec_99": _percentile(99.0, pauses_us),
        "gc_pause_usec_95": _percentile(95.0, pauses_us),
        "next_gc_bytes": max(0, threshold - gc.get_count()[0]),
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()),
    }
