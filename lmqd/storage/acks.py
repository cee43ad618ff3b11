"""Acknowledgement-mode bookkeeping: which messages handed out are not yet acknowledged.

In acknowledgement mode (``DiskQueue(..., ack_mode=True)``, the daemon's ``--durable``) every
message read carries a token (``tokens.py``), and the read position a sync persists is not the
reader's but the position of the **oldest message not yet acknowledged**: after a crash,
everything not acknowledged is read again (at-least-once), along with any acknowledged messages
that followed it.

Two structures, both touched in C loops only:

* ``outstanding``: the set of tokens handed out and not acknowledged. ``ack_many`` removes a
  whole batch of tokens with one ``set.difference_update``, not a call per token.
* ``order``: the tokens in the order they were handed out (which is the order on disk). An
  acknowledged token leaves it only from the front, so its head is the oldest outstanding token
  after ``ack_many`` has popped the acknowledged ones there: O(1) amortised per token, and
  ``len(order)`` is the number of messages a restart would read again.

The reader adds a record's tokens to both as one ``range`` when it hands the messages out
(``SegmentReader._take``); it holds the two containers directly (they are never replaced).

A topic log's cursor (``log_cursor.py``) keeps its unsettled messages in one too, with their
offsets as the tokens: they sort in read order just the same.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from lmqd.storage.tokens import token_index, token_position


class AckTracker:
    """Tokens handed out and not yet acknowledged; see the module docstring."""

    __slots__ = ("order", "outstanding")

    def __init__(self) -> None:
        self.outstanding: set[int] = set()
        """Tokens handed out and not acknowledged."""
        self.order: deque[int] = deque()
        """Tokens handed out, oldest first; acknowledged ones are dropped only from the front."""

    def __len__(self) -> int:
        """Messages handed out and not yet acknowledged."""
        return len(self.outstanding)

    def ack(self, token: int) -> bool:
        """Mark one message done; False if the token is unknown (or already acknowledged)."""
        outstanding = self.outstanding
        if token not in outstanding:
            return False
        outstanding.remove(token)
        order = self.order
        while order and order[0] not in outstanding:
            order.popleft()
        return True

    def ack_many(self, tokens: Iterable[int]) -> int:
        """Mark many messages done; returns how many tokens were known (each counted once)."""
        outstanding = self.outstanding
        before = len(outstanding)
        outstanding.difference_update(tokens)  # one C loop, not an ``ack`` call per token
        known = before - len(outstanding)
        order = self.order
        while order and order[0] not in outstanding:
            order.popleft()
        return known

    def oldest(self) -> int | None:
        """The oldest outstanding token (a topic log's cursor: offset); None if none is."""
        order = self.order
        return order[0] if order else None

    def oldest_position(self) -> tuple[int, int, int] | None:
        """(segment, record offset, index) of the oldest outstanding message; None if none is."""
        order = self.order
        if not order:
            return None
        oldest = order[0]
        segment, offset = token_position(oldest)
        return segment, offset, token_index(oldest)

    def clear(self) -> None:
        """Forget every token (the queue was emptied)."""
        self.outstanding.clear()
        self.order.clear()
