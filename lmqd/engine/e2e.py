"""End-to-end processing latency percentiles over a rolling window (nsq-reference §4.8).

Theory of operation
-------------------
nsqd keeps, per channel, two quantile streams that each cover half of
``--e2e-processing-latency-window-time``: new samples go into the current one, and every
``window / 2`` the *older* stream is reset and becomes the current one. A query merges both, so
it always covers between ``window / 2`` and ``window`` of history (a coarse rolling window). A
topic reports the merge of its channels' streams. Samples are ``FIN time - publish timestamp`` in
nanoseconds, recorded only on FIN.

This module keeps nsqd's window mechanics exactly (the same two halves, the same strict
"stale when ``now > last_move + window/2``" rule, the same count) but replaces bmizerany/perks'
targeted-quantile summaries with a **bounded uniform sample** per half: the first
``sample_size`` latencies are kept as they are, after that each new one replaces a random kept
one with the right probability (Vitter's Algorithm L, which draws the *gap* to the next
replacement, so ``record`` is a counter compare for almost every call). Every kept sample
stands for ``count / len(samples)`` observations of its half; a query sorts the weighted samples
of both halves and returns, for each configured quantile ``q``, the smallest value whose
cumulative weight reaches ``q * count`` (nearest rank).

Consequences: with at most ``sample_size`` observations per half the answer is the exact nearest
-rank percentile; beyond that it is a uniform-sampling estimate whose rank error has a standard
deviation of about ``sqrt(q * (1 - q) / (2 * sample_size))`` (0.3 percentile points at p99 with
the default 512), which is the same order as perks' targeted error for p99 and far cheaper per
FIN in Python. An empty window reports every percentile as 0, as perks does.

Time is the trio clock (``now`` is passed in, never read here), so tests drive the window with
plain numbers or ``autojump_clock``.
"""

from __future__ import annotations

import math
import random
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from lmqd.options import Options
from lmqd.stats import NO_E2E_LATENCY, E2eLatency, Percentile

__all__ = ["DEFAULT_SAMPLE_SIZE", "E2eLatencyStream", "empty_latency", "new_stream"]

DEFAULT_SAMPLE_SIZE = 512
"""Samples kept per half-window: 2 x 512 x 8 bytes = 8 KiB per channel (only when percentiles
are configured), and a p99 rank error of ~0.3 points."""


def _open_unit(rng: random.Random) -> float:
    """A uniform draw in the open interval (0, 1): Algorithm L takes its logarithm."""
    u = rng.random()
    while u == 0.0:
        u = rng.random()
    return u


class _Half:
    """One half-window: its observation count, a bounded uniform sample of them, and the
    sample sets merged in from other streams (``merge``), each with its own weight."""

    __slots__ = ("_next", "_w", "count", "merged", "merged_count", "samples")

    def __init__(self) -> None:
        self.count = 0
        self.samples = array("q")
        self.merged: list[tuple[float, array[int]]] = []
        self.merged_count = 0
        self._w = 0.0
        self._next = 0

    def reset(self) -> None:
        self.count = 0
        del self.samples[:]
        self.merged = []
        self.merged_count = 0

    def add(self, value: int, size: int, rng: random.Random) -> None:
        self.count += 1
        samples = self.samples
        if len(samples) < size:
            samples.append(value)
            if len(samples) == size:
                self._w = math.exp(math.log(_open_unit(rng)) / size)
                self._skip(rng)
        elif self.count == self._next:
            samples[rng.randrange(size)] = value
            self._w *= math.exp(math.log(_open_unit(rng)) / size)
            self._skip(rng)

    def _skip(self, rng: random.Random) -> None:
        # The index of the next observation to keep: a geometric gap whose rate falls as the
        # count grows, so replacements get rarer (k * ln(n / k) of them for n observations).
        w = self._w
        if w >= 1.0:  # exp() rounded a tiny negative exponent up; keep log(1 - w) finite
            w = self._w = math.nextafter(1.0, 0.0)
        self._next += math.floor(math.log(_open_unit(rng)) / math.log1p(-w)) + 1
        if self._next <= self.count:
            self._next = self.count + 1

    @property
    def total(self) -> int:
        return self.count + self.merged_count

    def weighted(self) -> list[tuple[float, array[int]]]:
        """(weight, samples) pairs covering every observation of this half."""
        parts = list(self.merged)
        if self.samples:
            parts.append((self.count / len(self.samples), array("q", self.samples)))
        return parts


class E2eLatencyStream:
    """One channel's (or a merged topic's) end-to-end latency over the rolling window.

    ``record`` is O(1) and allocation-free after the sample fills (it runs once per FIN);
    ``result`` is O(s log s) in the samples kept (at most ``4 * sample_size`` per stream).
    """

    __slots__ = (
        "_current",
        "_halves",
        "_last_move",
        "_move_every",
        "_rng",
        "_sample_size",
        "_stale_at",
        "percentiles",
    )

    def __init__(
        self,
        percentiles: Sequence[float],
        window: float,
        now: float,
        *,
        sample_size: int = DEFAULT_SAMPLE_SIZE,
        rng: random.Random | None = None,
    ) -> None:
        if not percentiles:
            raise ValueError("an E2E latency stream needs at least one percentile")
        if window <= 0:
            raise ValueError("the E2E latency window must be > 0")
        if sample_size < 1:
            raise ValueError("sample_size must be >= 1")
        self.percentiles = tuple(percentiles)
        self._move_every = window / 2
        self._sample_size = sample_size
        self._rng = rng if rng is not None else random.Random()
        self._halves = (_Half(), _Half())
        self._current = 0
        self._last_move = now
        self._stale_at = now + self._move_every

    def _advance(self, now: float) -> None:
        # nsqd: "for IsDataStale(now) { moveWindow() }", stale meaning now > last + window/2.
        # Each move flips to the other half and resets it; compute the number of moves at once
        # so a stream idle for days doesn't loop once per half-window.
        moves = math.ceil((now - self._last_move) / self._move_every) - 1
        if moves <= 0:  # float rounding at the boundary; not stale after all
            moves = 1 if now > self._last_move + self._move_every else 0
        if moves == 0:
            return
        if moves >= 2:
            self._halves[0].reset()
            self._halves[1].reset()
        else:
            self._halves[self._current ^ 1].reset()
        self._current ^= moves & 1
        self._last_move += moves * self._move_every
        self._stale_at = self._last_move + self._move_every

    def record(self, now: float, latency_ns: int) -> None:
        """Add one FIN's latency (``FIN wall time - message.timestamp``, in ns) at trio ``now``."""
        if now > self._stale_at:
            self._advance(now)
        self._halves[self._current].add(latency_ns, self._sample_size, self._rng)

    @property
    def window(self) -> float:
        """The configured window, in seconds."""
        return 2 * self._move_every

    def count(self, now: float) -> int:
        """Observations in the window at ``now``."""
        if now > self._stale_at:
            self._advance(now)
        return self._halves[0].total + self._halves[1].total

    def merge(self, other: E2eLatencyStream, now: float) -> None:
        """Add ``other``'s window into this one (nsqd ``Quantile.Merge``): current half into
        current half, older into older. ``other`` is not changed."""
        if now > self._stale_at:
            self._advance(now)
        if now > other._stale_at:
            other._advance(now)
        for mine, theirs in (
            (self._halves[self._current], other._halves[other._current]),
            (self._halves[self._current ^ 1], other._halves[other._current ^ 1]),
        ):
            if theirs.total:
                mine.merged.extend(theirs.weighted())
                mine.merged_count += theirs.total

    def result(self, now: float) -> E2eLatency:
        """The snapshot nsqd reports: the window's count and each configured percentile."""
        if now > self._stale_at:
            self._advance(now)
        return _result(self.percentiles, [self], now)

    @classmethod
    def combined(
        cls, streams: Iterable[E2eLatencyStream | None], now: float
    ) -> E2eLatency:
        """A topic's latency: its channels' streams merged (nsqd
        ``AggregateChannelE2eProcessingLatency``). ``NO_E2E_LATENCY`` if every stream is None
        (percentiles not configured)."""
        present = [s for s in streams if s is not None]
        if not present:
            return NO_E2E_LATENCY
        for s in present:
            if now > s._stale_at:
                s._advance(now)
        return _result(present[0].percentiles, present, now)


def _result(
    percentiles: Sequence[float], streams: Sequence[E2eLatencyStream], now: float
) -> E2eLatency:
    pairs: list[tuple[int, float]] = []
    total = 0
    for stream in streams:
        for half in stream._halves:
            total += half.total
            for weight, samples in half.weighted():
                pairs.extend((v, weight) for v in samples)
    if not pairs:
        return E2eLatency(
            count=total,
            percentiles=tuple(Percentile(quantile=q, value=0.0) for q in percentiles),
        )
    pairs.sort(key=lambda p: p[0])
    cumulative = []
    acc = 0.0
    for _, weight in pairs:
        acc += weight
        cumulative.append(acc)
    # Tolerance so that q * n landing exactly on a rank (0.99 * 100 = 99.00000000000001) picks
    # that rank, not the next one.
    slack = 1e-9 * acc
    last = len(pairs) - 1
    out = []
    for q in percentiles:
        i = min(bisect_left(cumulative, q * acc - slack), last)
        out.append(Percentile(quantile=q, value=float(pairs[i][0])))
    return E2eLatency(count=total, percentiles=tuple(out))


def new_stream(
    options: Options, now: float, *, rng: random.Random | None = None
) -> E2eLatencyStream | None:
    """A stream for a new channel, or None when ``--e2e-processing-latency-percentile`` is
    unset (the channel then reports ``NO_E2E_LATENCY``, as nsqd does)."""
    if not options.e2e_processing_latency_percentiles:
        return None
    return E2eLatencyStream(
        options.e2e_processing_latency_percentiles,
        options.e2e_processing_latency_window_time,
        now,
        rng=rng,
    )


def empty_latency(options: Options) -> E2eLatency:
    """What a channel reports before its first FIN (it makes its stream then, ``new_stream``):
    an empty window (every configured percentile 0, as perks reports it), or
    ``NO_E2E_LATENCY`` when no percentile is configured."""
    percentiles = options.e2e_processing_latency_percentiles
    if not percentiles:
        return NO_E2E_LATENCY
    zeros = tuple(Percentile(quantile=q, value=0.0) for q in percentiles)
    return E2eLatency(count=0, percentiles=zeros)
