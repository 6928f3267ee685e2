"""Overload: more arriving than the card serves, told apart from a line that is merely long.

A line is no harm in itself. A pool of workers draining a backlog (a closed loop: each client sends
its next request when the last is answered) keeps as many waiting as it has clients, for ever, and
first come, first served answers every one of them well within its deadline. What harms is a line
that the card cannot serve in time, and that shows in rates, not in a length:

- **it keeps growing**: while the queue stands (its oldest waiter has waited longer than `target_s`,
  one service time, ever since some moment), more have arrived since then than the slots took in,
  by more than chance explains (a quarter of what was taken in, and twice the counts' noise). A
  closed loop cannot pass this: its line grows by at most its number of clients, however long it
  stands, while what the slots take in grows with time;
- **or it cannot be served within its waiters' deadlines**: at the measured drain rate, a newcomer
  would start after its latest start, or a waiter in line can no longer be served before its own
  (`infeasible`).

While one of these holds the gate serves newest first (adaptive LIFO, as in Netflix's
concurrency-limits: under a growing line FIFO serves everyone late; newest first serves the fresh on
time) or sheds at arrival (`overload="shed"`). It lasts while more keep arriving than the slots take
in (over the last two intervals), or while some waiter was found unservable within the last one; it
ends when neither holds, or when the line empties.

The idea of a standing delay comes from CoDel (RFC 8289) and Facebook's RPC servers ("Fail at
Scale", 2015); counting arrivals against service is what keeps a closed loop out. Like the rest of
the core, this reads no clock: the time comes with every event.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["OverloadDetector"]

MIN_TARGET_S = 0.005  # RFC 8289's default target: below it a delay is noise
# The interval, in targets: four service times of standing delay is a queue, not a burst.
INTERVAL_TARGETS = 4
MIN_INTERVAL_S = 0.05
GROWTH_FRACTION = 0.25  # more arrived than taken in by this share of what was taken in ...
NOISE_SIGMAS = 2.0  # ... and by this many standard deviations of the counts (Poisson: sqrt of their sum)
LASTING_INTERVALS = 2  # overload lasts while more arrived than were taken in over this many intervals


def _outruns(arrived: int, taken: int, fraction: float, sigmas: float) -> bool:
    """More arrived than were taken in, by more than `fraction` of those and `sigmas` of noise."""
    excess = arrived - taken
    return excess > 0 and excess > fraction * taken and excess > sigmas * math.sqrt(arrived + taken)


class OverloadDetector:
    """Whether the queue is in overload (`overloaded`); see the module's docstring.

    Fed by the line and the core: `arrived` (a request found no free slot), `dequeued` (a waiter
    got one), `infeasible` (a waiter could not be served before its deadline), `drained` (the line
    emptied)."""

    __slots__ = (
        "target_s", "known", "overloaded", "episodes", "_above_since_s", "_arrived_since", "_taken_since",
        "_arrivals_s", "_takes_s", "_infeasible_s",
    )  # fmt: skip

    def __init__(self, target_s: float | None = MIN_TARGET_S) -> None:
        """`target_s` None: not known yet (no service time measured); nothing stands until it is."""
        self.known = target_s is not None
        self.target_s = max(MIN_TARGET_S, target_s or 0.0)
        self.overloaded = False
        self.episodes = 0  # how many times overload began: for the status
        self._above_since_s: float | None = None  # since when the queue stands
        self._arrived_since = 0  # arrivals to the line since then
        self._taken_since = 0  # waiters taken in since then
        # The window's arrivals and takes, and the last unservable waiter: whether overload lasts.
        self._arrivals_s: deque[float] = deque()
        self._takes_s: deque[float] = deque()
        self._infeasible_s = -math.inf

    @property
    def interval_s(self) -> float:
        return max(MIN_INTERVAL_S, INTERVAL_TARGETS * self.target_s)

    def set_target(self, target_s: float) -> None:
        self.target_s = max(MIN_TARGET_S, target_s)
        self.known = True

    def rates_per_s(self, now_s: float) -> tuple[float, float]:
        """Arrivals to the line and waiters taken in, per second, over the window."""
        self._forget(now_s)
        window_s = self.window_s
        return len(self._arrivals_s) / window_s, len(self._takes_s) / window_s

    # -- events -------------------------------------------------------------------------------------

    def arrived(self, now_s: float) -> None:
        """A request found no free slot: it waits, or it is turned away at once."""
        self._arrivals_s.append(now_s)
        if self._above_since_s is not None:
            self._arrived_since += 1
        self._decide(now_s)

    def dequeued(self, sojourn_s: float, now_s: float, *, empty: bool) -> None:
        """A waiter left the line for a slot; the line's oldest had waited `sojourn_s`; `empty`:
        nobody waits behind it."""
        self._takes_s.append(now_s)
        if empty:
            self.drained()
            return
        if not self.known:
            return  # a wait means nothing before the work it waits for has been measured
        if sojourn_s < self.target_s:
            self._above_since_s = None  # a good queue: it has just been short
        elif self._above_since_s is None:
            self._above_since_s, self._arrived_since, self._taken_since = now_s, 0, 0
        else:
            self._taken_since += 1
        self._decide(now_s)

    def infeasible(self, now_s: float) -> None:
        """A waiter, or a newcomer, could not be served before its deadline at the drain rate."""
        self._infeasible_s = now_s
        self._begin()

    def drained(self) -> None:
        """The line emptied: whatever stood has gone, first come first served again."""
        self.overloaded = False
        self._above_since_s = None

    # -- the decision -------------------------------------------------------------------------------

    def _begin(self) -> None:
        if not self.overloaded:
            self.overloaded = True
            self.episodes += 1

    def _decide(self, now_s: float) -> None:
        self._forget(now_s)
        if self.overloaded:
            arrived, taken = len(self._arrivals_s), len(self._takes_s)
            lasting = arrived > taken or now_s - self._infeasible_s <= self.interval_s
            if not lasting:
                self.overloaded = False
                self._above_since_s = None
            return
        since_s = self._above_since_s
        if since_s is None or now_s - since_s < self.interval_s:
            return
        if _outruns(self._arrived_since, self._taken_since, GROWTH_FRACTION, NOISE_SIGMAS):
            self._begin()

    @property
    def window_s(self) -> float:
        """How far back arrivals and takes are counted for whether overload lasts."""
        return LASTING_INTERVALS * self.interval_s

    def _forget(self, now_s: float) -> None:
        """Drop what left the window."""
        horizon_s = now_s - self.window_s
        for times in (self._arrivals_s, self._takes_s):
            while times and times[0] < horizon_s:
                times.popleft()
