"""What the gate measures per request, kept small and bounded: the counters, the recent values
behind the percentiles, and the latency histograms. The core keeps them; the status, the metrics
and the dashboard render them."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["BucketCounts", "Counters", "RecentValues", "percentiles_ms"]


@dataclass
class Counters:
    """Cumulative counts since start.

    Every admitted request ends as one of `completed` (a response below 400), `failed` (4xx/5xx,
    an exception, a cancellation) or `admitted_ooms` (it ran out of memory). `rejected` counts
    every 503/429 answer, the OOM answers among them; `timed_out` is the deadline part of it.
    `ooms` adds the OOMs that the application caught itself, seen through the probe. `errors`
    counts exceptions other than OOMs. Requests never admitted end as `rejected`, `left_queue`
    (the client left before a slot), `body_timeouts` (408) or `bodies_too_large` (413).
    """

    admitted: int = 0
    completed: int = 0
    failed: int = 0
    admitted_ooms: int = 0
    rejected: int = 0
    timed_out: int = 0
    ooms: int = 0
    errors: int = 0
    left_queue: int = 0
    body_timeouts: int = 0
    bodies_too_large: int = 0
    limit_increases: int = 0
    limit_decreases: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def ended(self) -> int:
        """The admitted requests that have ended, whichever way: those in flight are `admitted` less these."""
        return self.completed + self.failed + self.admitted_ooms

    def reject(self, reason: str) -> None:  # a `Reason`: a str, kept as a key of plain JSON
        self.rejected += 1
        self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1


class BucketCounts:
    """A latency histogram as Prometheus defines one (`le` bounds, cumulative at exposition), kept
    as plain counts: one bisect and one add per request, no lock (all on the event loop)."""

    def __init__(self, bounds_s: tuple[float, ...]) -> None:
        self.bounds_s = tuple(sorted(bounds_s))
        self.counts = [0] * (len(self.bounds_s) + 1)  # the last one is +Inf
        self.sum_s = 0.0

    def observe(self, value_s: float) -> None:
        self.counts[bisect_left(self.bounds_s, value_s)] += 1
        self.sum_s += value_s

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, count of values <= le)], ending with +Inf, as the exposition format wants."""
        total, buckets = 0, []
        for bound, count in zip((*self.bounds_s, math.inf), self.counts, strict=True):
            total += count
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), total))
        return buckets


class RecentValues:
    """The last `size` values of a measure (queue wait, service time), for percentiles and means;
    with a `histogram`, every value is counted there too (one call per request for both)."""

    def __init__(self, size: int = 1024, histogram: BucketCounts | None = None) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._size = size
        self._sum = 0.0  # kept as values come and go: every rejection asks for the mean
        self.histogram = histogram
        self._zeros = 0  # zeros not yet added (`add_zero`)

    def add_zero(self) -> None:
        """A zero (a request admitted the moment it arrived, the common case): only counted here,
        and added with `flush` before anything reads or adds, so the order of values is kept."""
        self._zeros += 1

    def flush(self) -> None:
        zeros, self._zeros = self._zeros, 0
        kept = min(zeros, self._size)  # the older ones would fall out of the window at once
        if len(self._values) + kept > self._size:
            self._sum -= sum(list(self._values)[: len(self._values) + kept - self._size])
        self._values.extend([0.0] * kept)
        histogram = self.histogram
        if histogram is not None and zeros:
            histogram.counts[bisect_left(histogram.bounds_s, 0.0)] += zeros

    def add(self, value: float) -> None:
        if self._zeros:
            self.flush()
        values = self._values
        if len(values) == self._size:
            self._sum -= values[0]
        values.append(value)
        self._sum += value
        histogram = self.histogram
        if histogram is not None:  # BucketCounts.observe, written out: every request's path
            histogram.counts[bisect_left(histogram.bounds_s, value)] += 1
            histogram.sum_s += value

    def __len__(self) -> int:
        return len(self._values) + min(self._zeros, self._size - len(self._values))

    def mean(self) -> float | None:
        if self._zeros:
            self.flush()
        return self._sum / len(self._values) if self._values else None

    def percentiles_ms(self) -> dict[str, float] | None:
        if self._zeros:
            self.flush()
        return percentiles_ms(self._values)


def percentiles_ms(values_s: Iterable[float], digits: int = 3) -> dict[str, float] | None:
    """p50, p95 and p99 (nearest rank) of durations in seconds, in milliseconds; None when empty."""
    ordered = sorted(values_s)
    if not ordered:
        return None
    last = len(ordered) - 1
    return {
        f"p{q}": round(ordered[min(last, math.ceil(q / 100 * len(ordered)) - 1)] * 1000, digits) for q in (50, 95, 99)
    }
