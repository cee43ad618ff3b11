"""DedupWindow: a topic's ``dedup_window_ms`` (content-based deduplication, as SQS FIFO does).

A message whose body equals the body of a message the topic accepted less than ``window``
seconds before is answered OK and not enqueued again. Bodies are remembered by their BLAKE2b
digest of 16 bytes (``hashlib.blake2b(body, digest_size=16)``: 128 bits, so two different
bodies collide with probability ~2^-128 per pair; BLAKE2b is in the standard library and, at
~1 GB/s, costs less per message than the rest of the publish path for bodies up to a few KiB).

Theory of operation
-------------------
``_seen`` is a set of digests, ``_order`` a deque of ``(accepted_at, digest)`` in the order they
were accepted, which is time order (``now`` never goes back). A duplicate does not renew its
entry: the window runs from the first acceptance (SQS's rule), so each digest is in the deque
once. Expiry pops from the left while the oldest entry is at least ``window`` old: amortised
O(1) per message. The window length may change while entries exist (a policy change): they are
judged by the new length, as entries hold their time, not their expiry.

Memory is bounded: at most ``max_entries`` digests per topic (``DEDUP_MAX_ENTRIES`` by default);
remembering one more evicts the oldest first, which only shortens the window for the oldest
bodies (a duplicate of an evicted body is enqueued again: deduplication is best-effort, never a
loss). Measured on CPython 3.11 (tracemalloc, 100 000 entries) at about 155 bytes per entry: 49
for the digest's bytes object, about 106 for its tuple, deque slot and set slot (the float of a
publish is shared by its batch); so a full window costs about 16 MB per topic.

The window lives in memory; a restart rebuilds it from what the topic's log holds of the window
(``Topic.recover_dedup``: ``restore`` takes the entries with their ages converted to this run's
times). What the log holds depends on the mode: docs/durability.md.

The check and the remembering are separate steps (``unseen``, then ``remember``) so that a
publish refused after the check (topic full, a failed write) leaves no trace: its retry is not
mistaken for a duplicate.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from hashlib import blake2b
from itertools import repeat

__all__ = ["DEDUP_DIGEST_SIZE", "DEDUP_MAX_ENTRIES", "DedupWindow", "body_digest"]

DEDUP_DIGEST_SIZE = 16
"""Bytes of BLAKE2b digest per remembered body (see the module docstring)."""

DEDUP_MAX_ENTRIES = 100_000
"""Digests a topic remembers at most: ~16 MB at the measured ~155 B each; a 10 s window at
10k distinct messages per second fits whole."""


def body_digest(body: bytes) -> bytes:
    """The digest a body is remembered by."""
    return blake2b(body, digest_size=DEDUP_DIGEST_SIZE).digest()


class DedupWindow:
    """The digests of the bodies a topic accepted within ``window`` seconds."""

    __slots__ = ("_order", "_seen", "evicted", "max_entries", "window")

    def __init__(self, window: float, max_entries: int = DEDUP_MAX_ENTRIES) -> None:
        if window <= 0 or max_entries <= 0:
            raise ValueError("a dedup window needs a positive length and size")
        self.window = window
        self.max_entries = max_entries
        self._seen: set[bytes] = set()
        self._order: deque[tuple[float, bytes]] = deque()
        self.evicted = 0
        """Digests forgotten before their time because the window was full."""

    def __len__(self) -> int:
        return len(self._order)

    def expire(self, now: float) -> None:
        """Forget the digests accepted ``window`` or more seconds before ``now``."""
        order = self._order
        oldest = now - self.window
        seen = self._seen
        while order and order[0][0] <= oldest:
            seen.discard(order.popleft()[1])

    def unseen(
        self, bodies: Sequence[bytes], pending: set[bytes]
    ) -> tuple[list[bytes], list[bytes]]:
        """The bodies of ``bodies`` that are new (not in the window, not in ``pending``, not
        earlier in ``bodies``) and their digests; adds those to ``pending`` (the digests of
        the run being checked). Call ``expire`` first. Remembers nothing."""
        seen = self._seen
        kept: list[bytes] = []
        digests: list[bytes] = []
        for body in bodies:
            digest = blake2b(body, digest_size=DEDUP_DIGEST_SIZE).digest()
            if digest in seen or digest in pending:
                continue
            pending.add(digest)
            kept.append(body)
            digests.append(digest)
        return kept, digests

    def restore(self, entries: Iterable[tuple[float, bytes]]) -> int:
        """Remember ``(accepted_at, digest)`` entries of an earlier run, oldest first (times in
        this run's clock, at or before any ``now`` to come; a time earlier than the last one
        remembered is taken as that one, so the deque stays in time order); how many were new.
        Call before this run remembers anything."""
        order = self._order
        seen = self._seen
        limit = self.max_entries
        last = order[-1][0] if order else -math.inf
        added = 0
        for at, digest in entries:
            if digest in seen:
                continue
            last = max(last, at)
            if len(order) >= limit:
                seen.discard(order.popleft()[1])
                self.evicted += 1
            seen.add(digest)
            order.append((last, digest))
            added += 1
        return added

    def remember(self, digests: Iterable[bytes], now: float) -> None:
        """The bodies of ``digests`` were accepted at ``now``; the oldest entries make room."""
        seen = self._seen
        if isinstance(digests, list) and seen.isdisjoint(digests):
            size = len(seen)
            seen.update(digests)
            if len(seen) - size != len(digests):  # one of them twice: one at a time, below
                seen.difference_update(digests)
                self._remember_each(digests, now)
                return
            # All new and distinct (what ``unseen`` returns): remembered with C loops, then
            # the oldest go, as many as making room one at a time would have removed.
            order = self._order
            order.extend(zip(repeat(now), digests))
            excess = len(order) - self.max_entries
            if excess > 0:
                popleft = order.popleft
                for _ in range(excess):
                    seen.discard(popleft()[1])
                self.evicted += excess
            return
        self._remember_each(digests, now)

    def _remember_each(self, digests: Iterable[bytes], now: float) -> None:
        order = self._order
        seen = self._seen
        limit = self.max_entries
        for digest in digests:
            if digest in seen:
                continue
            if len(order) >= limit:
                seen.discard(order.popleft()[1])
                self.evicted += 1
            seen.add(digest)
            order.append((now, digest))
