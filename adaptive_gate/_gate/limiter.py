"""A concurrency limiter whose limit may change at any moment, with a bounded queue.

Think of it as a counter of slots in use (`in_flight`) and a line of people waiting for one
(`queued`). Whoever arrives while a slot is free and nobody is waiting walks straight in. Everyone
else joins the line. When a slot comes back it is handed directly to the person the line puts
first (`queue.py`: the front, unless priorities, tenants or an overload say otherwise), so a
newcomer can never take a slot from somebody who waits. A waiter whose latest start has passed
when its turn comes is refused (`Waiter.refused`) and the slot goes on to the next. Raising the limit lets the
front of the line in at once; lowering it pre-empts nobody: work that holds a slot keeps it until it
is released, and no new one is handed out until `in_flight` is below the new limit.

A request may weigh more than one slot (`units`, the gate's `cost` option): it goes in when its
units fit under the limit beside what runs, or alone when nothing runs (so one heavier than the
whole limit is served, alone, rather than starved). Nobody overtakes the one the line puts first
because it is light: a heavy one at the front waits for its room, so it cannot be starved either.

Cancellation is where limiters leak: a waiter may be cancelled (a timeout, a client that left)
after a slot was already handed to it but before it woke up. `leave()` covers that case by passing
the slot on, so a slot is never lost and never counted twice.

The bookkeeping (`try_acquire`, `join`, `leave`, `release`, `set_limit`) is synchronous, touches
no event loop and reads no clock: each call says when it happens (`now_s`), so it can be checked
exhaustively and replayed on virtual time. `acquire` is the thin async layer on top of it, for use
on its own: it reads the clock it was given, as `release()` and the `limit` setter do where no time
is passed (the gate's core always passes one).
`anyio.CapacityLimiter` is not used on purpose: it has over-granted tokens while being resized.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from .queue import FairLine, FifoLine, Waiter
from .reasons import Reason

__all__ = ["Limiter", "LimiterStatistics", "QueueFull", "QueueTimeout", "Waiter"]


class QueueFull(Exception):
    """The waiting line already holds `max_queue` requests."""


class QueueTimeout(Exception):
    """The deadline passed before a slot became free."""


@dataclass(frozen=True)
class LimiterStatistics:
    limit: int
    in_flight: float  # units in flight: requests, where each weighs one
    queued: int
    max_queue: int


MAX_PART = 63 / 64  # the most of one slot a budget adds to the limit (costs are counted in 64ths)


def budget_of(limit: int, budget: float | None) -> float:
    """The budget a limiter keeps for `limit` and a `budget` asked for (`Limiter.set_limit`)."""
    return float(limit) if budget is None else min(max(budget, limit), limit + MAX_PART)


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, got {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1 so that the gate can always make progress, got {limit}")
    return limit


class Limiter:
    def __init__(
        self,
        limit: int,
        *,
        max_queue: int,
        line: FifoLine | FairLine | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` is read only for use on its own (`acquire`, and `release` or a new `limit` given no
        time): the bookkeeping is told the time."""
        self._limit = _check_limit(limit)
        self._budget = float(self._limit)
        if isinstance(max_queue, bool) or not isinstance(max_queue, int):
            raise TypeError(f"max_queue must be an int, got {type(max_queue).__name__}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self._max_queue = max_queue
        self._in_flight: float = 0
        self._clock = clock
        self._busy_area = 0.0  # integral of in_flight over time: slot-seconds
        self._busy_since_s = 0.0  # any start will do: nothing is in flight before the first event
        # Who is served next (`queue.py`): first come first served unless told otherwise. Each line
        # appends, pops and removes from the middle (a waiter that gives up) in O(1).
        self._waiters: FifoLine | FairLine = FifoLine() if line is None else line

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        """For the limiter on its own: `set_limit` at its clock's now."""
        self.set_limit(value, self._clock())

    @property
    def budget(self) -> float:
        """The slots requests may fill: the limit, or up to a slot more where requests weigh fractions
        of one (`set_limit`)."""
        return self._budget

    def set_limit(self, value: int, now_s: float, *, budget: float | None = None) -> None:
        """A new limit at `now_s`: a higher one lets the line in at once; a lower one pre-empts nobody.
        `budget`: the slots requests that weigh fractions of one (route weights, `cost`) may fill, where
        the card has room for part of a slot more than the limit (4.7 slots, where the limit shows 4);
        kept under the next whole slot, so that requests of one slot see the limit alone."""
        self._limit = _check_limit(value)
        self._budget = budget_of(self._limit, budget)
        self._hand_over(now_s)

    @property
    def in_flight(self) -> float:
        return self._in_flight

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def max_queue(self) -> int:
        return self._max_queue

    def busy_area(self, now_s: float) -> float:
        """Slot-seconds held until `now_s`. Over an interval, its growth divided by the interval's
        length is the mean concurrency during it: what a request really ran alongside."""
        return self._busy_area + self._in_flight * (now_s - self._busy_since_s)

    def _set_in_flight(self, value: float, now_s: float) -> None:
        self._busy_area += self._in_flight * (now_s - self._busy_since_s)
        self._busy_since_s = now_s
        self._in_flight = value

    def statistics(self) -> LimiterStatistics:
        return LimiterStatistics(self._limit, self._in_flight, len(self._waiters), self._max_queue)

    # -- synchronous bookkeeping --------------------------------------------------------------

    def try_acquire(self, units: float = 1, *, now_s: float) -> bool:
        """Take `units` slots if they are free (or nothing runs) and nobody is waiting for them."""
        return self.take(units, now_s) is not None

    def take(self, units: float, now_s: float) -> float | None:
        """`try_acquire` at `now_s`: the busy area then (with these slots taken), or None when they
        are not free."""
        in_flight = self._in_flight
        if self._waiters or (in_flight + units > self._budget and in_flight > 0):
            return None
        # _set_in_flight, written out: this is every request's path
        self._busy_area += in_flight * (now_s - self._busy_since_s)
        self._busy_since_s = now_s
        self._in_flight = in_flight + units
        return self._busy_area

    @property
    def line(self) -> FifoLine | FairLine:
        return self._waiters

    def join(self, waiter: Waiter | None = None, *, now_s: float) -> Waiter:
        """Join the line; the slot is handed over later by `release` or a higher limit, or the line
        refuses the waiter (`refused`) if it can no longer start by its `latest_start_s`."""
        if len(self._waiters) >= self._max_queue:
            raise QueueFull
        if waiter is None:
            waiter = Waiter()
        self._waiters.push(waiter, now_s)
        self._hand_over(now_s)
        return waiter

    def leave(self, waiter: Waiter, *, now_s: float) -> None:
        """Give up a place in the line, or the slot if it was handed over meanwhile."""
        if waiter.granted:
            waiter.granted = False  # leaving twice gives the slot back once
            self.release(waiter.units, now_s=now_s)
        elif self._waiters.remove(waiter):
            if not self._waiters and self._waiters.detector is not None:
                self._waiters.detector.drained()
            self._hand_over(now_s)  # a heavy one that left may have held up lighter ones behind it

    def evict(self, waiter: Waiter, reason: Reason) -> None:
        """Turn a waiter away from its place (to make room for a more important one)."""
        if self._waiters.remove(waiter):
            waiter._refuse(reason)
            if not self._waiters and self._waiters.detector is not None:
                self._waiters.detector.drained()

    def release(self, units: float = 1, *, now_s: float | None = None) -> float:
        """Give `units` slots back at `now_s` (the limiter's clock's now where not told, as after
        `acquire`); the busy area until then, as `busy_area(now_s)` would give."""
        in_flight = self._in_flight
        if in_flight < units:
            raise RuntimeError("release() called for more slots than were acquired")
        if now_s is None:
            now_s = self._clock()
        # _set_in_flight, written out: this is every request's path
        busy_area = self._busy_area = self._busy_area + in_flight * (now_s - self._busy_since_s)
        self._busy_since_s = now_s
        self._in_flight = in_flight - units
        if self._waiters:
            self._hand_over(now_s)
        return busy_area

    def reconsider(self, now_s: float) -> None:
        """Time passed with nobody arriving or leaving: the line's order may have changed (newest
        first within a tenant whose line has stood long enough, a waiter past its latest start), so
        hand over what the line now allows. The gate calls it on the monitor's tick."""
        if self._waiters:
            self._hand_over(now_s)

    def _hand_over(self, now_s: float) -> None:
        waiters = self._waiters
        while waiters and self._in_flight < self._budget:
            waiter = waiters.peek_next(now_s)
            if now_s > waiter.latest_start_s:
                # It could no longer finish before its deadline: the slot goes to the next one, not
                # to an answer that comes too late.
                waiters.pop_next(now_s)
                waiter._refuse(Reason.DEADLINE)
                continue
            if self._in_flight + waiter.units > self._budget and self._in_flight > 0:
                return  # its units do not fit yet: it keeps its place, and nobody overtakes it
            waiters.pop_next(now_s)
            self._set_in_flight(self._in_flight + waiter.units, now_s)
            waiter._wake()

    # -- async layer ----------------------------------------------------------------------------

    async def acquire(self, timeout_s: float | None = None, *, units: float = 1) -> None:
        """Wait for `units` slots, at most `timeout_s` seconds (`None`: no deadline); give them back
        with `release(units)`.

        Raises `QueueFull` at once when the line is full, `QueueTimeout` when the deadline passes.
        Cancelled at any point, it leaves no trace: neither a place in the line nor a slot.
        """
        clock = self._clock
        if self.try_acquire(units, now_s=clock()):
            return
        if timeout_s is not None and timeout_s <= 0:
            raise QueueTimeout
        waiter = self.join(Waiter(units=units), now_s=clock())
        if waiter.granted:
            return
        waiter._event = anyio.Event()
        try:
            with anyio.move_on_after(math.inf if timeout_s is None else timeout_s):
                await waiter._event.wait()
        except BaseException:
            self.leave(waiter, now_s=clock())
            raise
        if not waiter.granted:
            self.leave(waiter, now_s=clock())
            raise QueueTimeout
