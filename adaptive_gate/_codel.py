"""Controlled delay: telling a queue that absorbs a burst from a queue that only adds waiting.

CoDel's idea (RFC 8289), as Facebook's RPC servers use it ("Fail at Scale", 2015): a good queue
empties now and then; a bad one holds a standing delay. Each time a waiter leaves the line for a
slot, the line reports its delay: how long its oldest member has waited (not the one served: under
newest first, or with priorities, the served are fresh while the others wait on). When that has
stayed above `target_s` for a whole `interval_s`, the queue is declared to stand (`overloaded`), and the line
serves newest first (adaptive LIFO, as in Netflix's concurrency-limits): under a standing queue a
FIFO serves everyone late, newest-first serves the fresh on time and lets the stale reach their
deadline. While it stands, nobody waits longer than its patience (`Waiter.patience_s`: half its
deadline less its work, at most eight intervals): Facebook's servers cut the queue timeout the same
way, so the successes stay fresh and the 503s come soon, whatever the order. The line goes back to first
come, first served once it drains (it empties).

The gate derives the target from its routes' service time (a waiter that waited longer than one
request's work is waiting on a queue, not on a burst) unless the `queue_target` option fixes it.
Like the rest of the core, it reads no clock: the time comes with every event.
"""

from __future__ import annotations

__all__ = ["ControlledDelay"]

MIN_TARGET_S = 0.005  # RFC 8289's default target: below it a delay is noise
# The interval, in targets. RFC 8289 has 100 ms for 5 ms, because its target is tiny beside a
# round trip; ours is a whole service time, and four of them standing is a queue, not a burst.
INTERVAL_TARGETS = 4
MIN_INTERVAL_S = 0.05


class ControlledDelay:
    """Whether the queue stands: `overloaded`, fed with each waiter's sojourn when it leaves the line."""

    __slots__ = ("target_s", "known", "overloaded", "_above_since_s", "episodes")

    def __init__(self, target_s: float | None = MIN_TARGET_S) -> None:
        """`target_s` None: not known yet (no service time measured); nothing stands until it is."""
        self.known = target_s is not None
        self.target_s = max(MIN_TARGET_S, target_s or 0.0)
        self.overloaded = False
        self._above_since_s: float | None = None
        self.episodes = 0  # how many times the queue was found standing: for the status

    @property
    def interval_s(self) -> float:
        return max(MIN_INTERVAL_S, INTERVAL_TARGETS * self.target_s)

    def set_target(self, target_s: float) -> None:
        self.target_s = max(MIN_TARGET_S, target_s)
        self.known = True

    def dequeued(self, sojourn_s: float, now_s: float, *, empty: bool) -> None:
        """A waiter left the line for a slot after `sojourn_s`; `empty`: nobody waits behind it."""
        if empty:
            self.drained()
            return
        if not self.known:
            return  # a wait means nothing before the work it waits for has been measured
        if sojourn_s < self.target_s:
            self._above_since_s = None  # a good queue: it has just been short
            return
        if self._above_since_s is None:
            self._above_since_s = now_s
        elif not self.overloaded and now_s - self._above_since_s >= self.interval_s:
            self.overloaded = True
            self.episodes += 1

    def drained(self) -> None:
        """The line emptied: whatever stood has gone, first come first served again."""
        self.overloaded = False
        self._above_since_s = None
