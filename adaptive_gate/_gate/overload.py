"""Overload: more arriving than the card serves, told apart from a line that is merely long.

A line is no harm in itself. A pool of workers draining a backlog (a closed loop: each client sends
its next request when the last is answered) keeps as many waiting as it has clients, for ever, and
first come, first served answers every one of them well within its deadline. What harms is a line
that grows faster than the card drains it, until it cannot be served in time. So the queue is in
overload when, at a newcomer's arrival, all three hold:

- **it stands**: its oldest waiter has waited longer than `target_s` (one service time) ever since
  some moment at least an interval ago (CoDel's idea, RFC 8289, as Facebook's RPC servers use it);
- **it grows**: over the last interval more arrived (found no free slot) than the slots took in, by
  a quarter of what they took in and by twice the counts' noise;
- **it is getting too long to wait out**: the newcomer's expected wait, first come first served, is
  past `DEEP_FRACTION` of the time it has to wait.

A closed loop with deadlines long enough for first come, first served never passes the third test,
however its clients start; an open loop at twice the capacity passes all three within an interval
and a quarter of its deadline.

While in overload the gate serves newest first (adaptive LIFO, as in Netflix's concurrency-limits:
under a growing line FIFO serves everyone late; newest first serves the fresh on time) or sheds at
arrival (`overload="shed"`). It lasts while more keep arriving than the slots take in (over the
last two intervals); it ends when they no longer do, or when the line empties. Every newcomer that
found no free slot arrives: one that joins the line, one shed, and one turned away because first
come, first served could not serve it in time. Had the last not counted, an open loop at twice what
one slot serves would have held the line at its deadline's depth, turned away as many as it took
in, and been served first come, first served for ever, every answer near its deadline.

A limit: a closed loop whose clients start one after another (a ramp) while first come, first
served would keep each waiting more than a quarter of its time looks like an open loop arriving
faster than the card drains, and is served newest first for as long as the answers bring its clients
back. With deadlines that first come, first served meets four times over, this cannot happen. A
closed loop that first come, first served cannot serve within its deadlines (more clients than they
allow, or the limit cut by an OOM) looks like one too: those turned away as too late come back and
arrive again.

Counts are kept in buckets (`WindowCount`), so the detector's memory does not grow with the rate.
Like the rest of the core, this reads no clock: the time comes with every event.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["OverloadDetector"]

MIN_TARGET_S = 0.005  # RFC 8289's default target: below it a delay is noise
# The interval, in targets: four service times of standing delay is a queue, not a burst.
INTERVAL_TARGETS = 4
MIN_INTERVAL_S = 0.05
GROWTH_FRACTION = 0.25  # more arrived than were taken in by this share of what was taken in ...
NOISE_SIGMAS = 2.0  # ... and by this many standard deviations of the counts (Poisson: sqrt of their sum)
DEEP_FRACTION = 0.25  # ... and a newcomer would wait, first come first served, past this share of its time
LASTING_INTERVALS = 2  # overload lasts while more arrived than were taken in over this many intervals
BUCKETS = 8  # per window: the counts' resolution in time


def _outruns(arrived: int, taken: int) -> bool:
    """More arrived than were taken in, by more than chance explains."""
    excess = arrived - taken
    return excess > 0 and excess > GROWTH_FRACTION * taken and excess > NOISE_SIGMAS * math.sqrt(arrived + taken)


class WindowCount:
    """Events over the last `window_s`, counted in buckets: memory bounded whatever the rate.

    A bucket starts at a multiple of its width, the same grid for every counter: two counts over one
    window then cover the same moments, and their difference is the events'. (Buckets that started at
    their first event let a count over an interval miss up to a bucket's width that the other held, a
    quarter of the interval: a closed loop's arrivals, each a moment after a take, read as growth.)"""

    __slots__ = ("_buckets",)

    def __init__(self) -> None:
        self._buckets: deque[list[float]] = deque()  # [bucket start, count], oldest first

    def add(self, now_s: float, window_s: float) -> None:
        width_s = window_s / BUCKETS
        start_s = math.floor(now_s / width_s) * width_s
        buckets = self._buckets
        if buckets and buckets[-1][0] >= start_s:
            buckets[-1][1] += 1  # this bucket (or, after the width changed, the latest)
        else:
            buckets.append([start_s, 1])
        while buckets[0][0] < now_s - window_s - width_s:
            buckets.popleft()  # not within the longest window any count asks for

    def total(self, now_s: float, window_s: float) -> int:
        """Events in the buckets that start within the last `window_s`."""
        return int(sum(count for start_s, count in self._buckets if start_s >= now_s - window_s))


class OverloadDetector:
    """Whether the queue is in overload (`overloaded`); see the module's docstring.

    Fed by the line and the core: `arrived` (a newcomer found no free slot: its expected wait against
    the time it has), `dequeued` (a waiter got a slot), `drained` (the line emptied)."""

    __slots__ = ("target_s", "known", "overloaded", "episodes", "_above_since_s", "_arrived", "_taken")

    def __init__(self, target_s: float | None = MIN_TARGET_S) -> None:
        """`target_s` None: not known yet (no service time measured); nothing stands until it is."""
        self.known = target_s is not None
        self.target_s = max(MIN_TARGET_S, target_s or 0.0)
        self.overloaded = False
        self.episodes = 0  # how many times overload began: for the status
        self._above_since_s: float | None = None  # since when the queue stands
        self._arrived = WindowCount()
        self._taken = WindowCount()

    @property
    def interval_s(self) -> float:
        return max(MIN_INTERVAL_S, INTERVAL_TARGETS * self.target_s)

    @property
    def window_s(self) -> float:
        """How far back arrivals and takes are counted for whether overload lasts."""
        return LASTING_INTERVALS * self.interval_s

    def set_target(self, target_s: float) -> None:
        self.target_s = max(MIN_TARGET_S, target_s)
        self.known = True

    def rates_per_s(self, now_s: float) -> tuple[float, float]:
        """Arrivals that found no free slot and waiters taken in, per second, over the window."""
        window_s = self.window_s
        return self._arrived.total(now_s, window_s) / window_s, self._taken.total(now_s, window_s) / window_s

    # -- events -------------------------------------------------------------------------------------

    def arrived(self, now_s: float, *, wait_s: float | None, budget_s: float) -> None:
        """A newcomer found no free slot, whether it joins the line or is turned away;
        `wait_s`: its expected wait first come first served (None: not known), `budget_s`: how long
        it may wait and still finish in time."""
        self._arrived.add(now_s, self.window_s)
        if self.overloaded:
            self._judge_lasting(now_s)
            return
        since_s = self._above_since_s
        if since_s is None or now_s - since_s < self.interval_s or wait_s is None:
            return
        if wait_s <= DEEP_FRACTION * budget_s:
            return  # first come, first served still answers it in good time: no reason to reorder
        interval_s = self.interval_s
        if _outruns(self._arrived.total(now_s, interval_s), self._taken.total(now_s, interval_s)):
            self._begin()

    def dequeued(self, sojourn_s: float, now_s: float, *, empty: bool) -> None:
        """A waiter left the line for a slot; the line's oldest had waited `sojourn_s`; `empty`:
        nobody waits behind it."""
        self._taken.add(now_s, self.window_s)
        if empty:
            self.drained()
            return
        if not self.known:
            return  # a wait means nothing before the work it waits for has been measured
        if sojourn_s < self.target_s:
            self._above_since_s = None  # a good queue: it has just been short
        elif self._above_since_s is None:
            self._above_since_s = now_s
        if self.overloaded:
            self._judge_lasting(now_s)

    def drained(self) -> None:
        """The line emptied: whatever stood has gone, first come first served again."""
        self.overloaded = False
        self._above_since_s = None

    # -- the decision -------------------------------------------------------------------------------

    def _begin(self) -> None:
        if not self.overloaded:
            self.overloaded = True
            self.episodes += 1

    def _judge_lasting(self, now_s: float) -> None:
        window_s = self.window_s
        if self._arrived.total(now_s, window_s) <= self._taken.total(now_s, window_s):
            self.overloaded = False
            self._above_since_s = None
