"""Conversion between the trio clock (queue logic) and the wall clock (what is stored).

A message's ``deliver_at`` is trio time, which restarts from an arbitrary origin in every process;
stored as trio time a deferred message would lose its deadline across a restart (nsqd #1107). So
storage writes wall-clock nanoseconds and converts back through a ``TimeBase`` when it reads.
"""

from __future__ import annotations

import time
from typing import Protocol

import attrs


class TimeBase(Protocol):
    """Maps trio time to wall-clock time and back."""

    def to_wall_ns(self, trio_time: float) -> int:
        """Wall-clock nanoseconds since the epoch at trio time ``trio_time``."""
        ...

    def from_wall_ns(self, wall_ns: int) -> float:
        """Trio time at wall-clock ``wall_ns``."""
        ...


@attrs.frozen
class AnchoredTimeBase:
    """A ``TimeBase`` from one pair of readings of both clocks taken at the same instant.

    The daemon makes one at start-up: ``AnchoredTimeBase.now(trio.current_time())``. The anchor is
    not re-read later, so a wall-clock step (NTP) while running does not move deadlines that are
    already in memory; it only shifts what is written, by the size of the step.
    """

    trio_time: float
    wall_ns: int

    @classmethod
    def now(cls, trio_now: float) -> AnchoredTimeBase:
        """Anchor ``trio_now`` (the caller's ``trio.current_time()``) to the wall clock now."""
        return cls(trio_now, time.time_ns())

    def to_wall_ns(self, trio_time: float) -> int:
        return self.wall_ns + round((trio_time - self.trio_time) * 1e9)

    def from_wall_ns(self, wall_ns: int) -> float:
        return self.trio_time + (wall_ns - self.wall_ns) / 1e9
