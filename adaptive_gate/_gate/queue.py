"""The waiting line's order: who gets the next free slot.

The limiter counts slots; this module decides which waiter a freed slot goes to. Two lines share
one small interface (`push`, `pop`, `remove`, `evictable`, `ahead_of`, `len()`):

- `FifoLine`, the default: first come, first served, an `OrderedDict` underneath, so a gate
  configured without priorities or tenants pays what it paid before (truth and length are C calls).
- `FairLine`, when a priority or a tenant is configured: a level per priority, larger first; in a
  level, the tenants that have somebody waiting take turns (deficit round robin with a quantum of
  one request: every request weighs the same), so two light clients keep their share while thirty
  heavy ones wait. Priorities age: a waiter's level counts `age / aging_s` more per second waited,
  so the lowest is never starved for ever. A tenant's line exists only while somebody waits in it,
  so random tenant names cannot grow it past `max_queue`; a full line makes room for a tenant with
  fewer places in it than the one with the most (`evictable`), so a flood that filled it keeps nobody out.

Both take an `OverloadDetector` (`overload.py`): while more arrive than the slots take in, they
serve newest first (adaptive LIFO): the fresh get served while they can still use the answer, and
the stale reach their deadline instead of being served late.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Iterator
from itertools import takewhile

import anyio

from .overload import OverloadDetector
from .reasons import Reason

__all__ = ["FairLine", "FifoLine", "Waiter"]


class Waiter:
    """One place in the line. `granted` turns true when a slot has been handed over; `refused`
    holds the reason when the line gave up on it instead ("deadline": it could no longer be served
    before its deadline; "evicted": a more important request, or one of a tenant with fewer places, took
    its place)."""

    __slots__ = (
        "granted", "refused", "_event", "priority", "tenant", "enqueued_s", "latest_start_s", "units", "weighed",
    )  # fmt: skip

    def __init__(
        self,
        priority: int = 0,
        tenant: str | None = None,
        latest_start_s: float = math.inf,
        units: float = 1,
    ) -> None:
        self.units = units  # the slots it takes (the gate's `cost`); more, where it may be of sizes that shrank since
        self.weighed = units  # the slots it took as it joined the line
        self.granted = False
        self.refused: Reason | None = None
        self._event: anyio.Event | None = None
        self.priority = priority
        self.tenant = tenant
        self.enqueued_s = 0.0
        self.latest_start_s = latest_start_s

    def _wake(self) -> None:
        self.granted = True
        if self._event is not None:
            self._event.set()

    def _refuse(self, reason: Reason) -> None:
        self.refused = reason
        if self._event is not None:
            self._event.set()


class FifoLine(OrderedDict[Waiter, None]):
    """First come, first served; newest first while the detector says the queue is in overload."""

    def __init__(self, detector: OverloadDetector | None = None) -> None:
        super().__init__()
        self.detector = detector

    def push(self, waiter: Waiter, now_s: float) -> None:
        waiter.enqueued_s = now_s
        self[waiter] = None

    def peek_next(self, now_s: float) -> Waiter:
        """Whom `pop_next` would serve now, left in its place (it may not fit yet)."""
        detector = self.detector
        return next(reversed(self)) if detector is not None and detector.overloaded else next(iter(self))

    def pop_next(self, now_s: float) -> Waiter:
        detector = self.detector
        if detector is None:
            return self.popitem(last=False)[0]
        waiter = self.popitem(last=detector.overloaded)[0]
        # The delay of the line is its oldest member's: whoever is served (the newest, under LIFO).
        oldest = next(iter(self), waiter)
        detector.dequeued(now_s - min(oldest.enqueued_s, waiter.enqueued_s), now_s, empty=not self)
        return waiter

    def remove(self, waiter: Waiter) -> bool:
        return self.pop(waiter, 0) is None

    def joined_before(self, before_s: float) -> Iterator[Waiter]:
        """The waiters that joined before `before_s`, oldest first."""
        return takewhile(lambda waiter: waiter.enqueued_s < before_s, self)

    def turns(self, priority: int) -> int:
        """How many take turns with a newcomer: nobody, in a single line."""
        return 1

    def most_buried(self, priority: int, now_s: float) -> tuple[Waiter, int] | None:
        """The waiter newest first would serve last, and how many go first (everyone else and a
        newcomer): the one to answer first when the line is too deep."""
        oldest = next(iter(self), None)
        return None if oldest is None else (oldest, len(self))

    def evictable(self, priority: int, tenant: str | None = None) -> Waiter | None:
        """FIFO has no priorities nor tenants: nobody makes room for anybody."""
        return None

    def ahead_of(self, priority: int, tenant: str | None = None) -> int:
        """How many would be served before a newcomer (newest first: nobody)."""
        return 0 if self.detector is not None and self.detector.overloaded else len(self)


class _Level:
    """The waiters of one priority: per tenant in arrival order, tenants in turn."""

    __slots__ = ("arrivals", "tenants")

    def __init__(self) -> None:
        self.arrivals: OrderedDict[Waiter, None] = OrderedDict()  # every waiter, oldest first
        self.tenants: OrderedDict[str | None, OrderedDict[Waiter, None]] = OrderedDict()  # whose turn first

    def push(self, waiter: Waiter) -> None:
        self.arrivals[waiter] = None
        line = self.tenants.get(waiter.tenant)
        if line is None:
            line = self.tenants[waiter.tenant] = OrderedDict()
        line[waiter] = None

    def pop(self, newest: bool) -> Waiter:
        tenant, line = next(iter(self.tenants.items()))
        waiter = line.popitem(last=newest)[0]
        del self.arrivals[waiter]
        del self.tenants[tenant]
        if line:  # its turn is over: to the back of the round
            self.tenants[tenant] = line
        return waiter

    def remove(self, waiter: Waiter) -> None:
        del self.arrivals[waiter]
        line = self.tenants[waiter.tenant]
        del line[waiter]
        if not line:
            del self.tenants[waiter.tenant]


class FairLine:
    """Priorities first (with aging), tenants in turn within a priority; see the module's docstring."""

    def __init__(self, aging_s: float, detector: OverloadDetector | None = None) -> None:
        self.aging_s = aging_s
        self.detector = detector
        self._levels: dict[int, _Level] = {}  # only levels with somebody waiting
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def joined_before(self, before_s: float) -> Iterator[Waiter]:
        """The waiters that joined before `before_s`, oldest first within each priority."""
        for level in self._levels.values():
            yield from takewhile(lambda waiter: waiter.enqueued_s < before_s, level.arrivals)

    def __contains__(self, waiter: object) -> bool:
        if not isinstance(waiter, Waiter):
            return False
        level = self._levels.get(waiter.priority)
        return level is not None and waiter in level.arrivals

    def push(self, waiter: Waiter, now_s: float) -> None:
        waiter.enqueued_s = now_s
        level = self._levels.get(waiter.priority)
        if level is None:
            level = self._levels[waiter.priority] = _Level()
        level.push(waiter)
        self._size += 1

    def _choose(self, now_s: float) -> tuple[int, _Level, bool]:
        """The level to serve, and whether newest first within the tenant whose turn it is."""
        priority = self._level_to_serve(now_s)
        level = self._levels[priority]
        detector = self.detector
        newest = False
        if detector is not None and detector.overloaded:
            # Newest first only within a tenant whose own line stands (its oldest waited longer than
            # its turns take): a light tenant's second request is not sacrificed to its third.
            oldest = next(iter(next(iter(level.tenants.values()))))
            newest = now_s - oldest.enqueued_s > detector.interval_s * len(level.tenants)
        return priority, level, newest

    def peek_next(self, now_s: float) -> Waiter:
        """Whom `pop_next` would serve now, left in its place (it may not fit yet)."""
        _, level, newest = self._choose(now_s)
        line = next(iter(level.tenants.values()))
        return next(reversed(line)) if newest else next(iter(line))

    def pop_next(self, now_s: float) -> Waiter:
        priority, level, newest = self._choose(now_s)
        detector = self.detector
        waiter = level.pop(newest)
        if not level.arrivals:
            del self._levels[priority]
        self._size -= 1
        if detector is not None:
            # The delay of the line is its oldest member's, whoever is served: the newest under LIFO,
            # or a fresh important one while the less important wait on.
            oldest_s = min([waiter.enqueued_s] + [next(iter(lv.arrivals)).enqueued_s for lv in self._levels.values()])
            detector.dequeued(now_s - oldest_s, now_s, empty=self._size == 0)
        return waiter

    def turns(self, priority: int) -> int:
        """How many tenants take turns at `priority`: a newcomer's wait grows with them."""
        level = self._levels.get(priority)
        return 1 if level is None else max(1, len(level.tenants))

    def most_buried(self, priority: int, now_s: float) -> tuple[Waiter, int] | None:
        """The waiter buried deepest, and how many go first, when its level is not above `priority`:
        the oldest of the longest tenant line at the lowest level. Where that line is served newest
        first (`_choose`), its own tenant's newer ones go first and, for each of those, a turn of
        every other tenant; else its turn comes within one round of the tenants."""
        if not self._levels:
            return None
        lowest = min(self._levels)
        if lowest > priority:
            return None
        level = self._levels[lowest]
        longest = max(level.tenants.values(), key=len)
        oldest = next(iter(longest))
        higher = self._size - len(level.arrivals)
        turns = len(level.tenants)
        detector = self.detector
        if detector is None or now_s - oldest.enqueued_s <= detector.interval_s * turns:
            return oldest, higher + turns  # the tenants before it in the round, and a newcomer
        own = len(longest)
        others = sum(min(len(line), own) for line in level.tenants.values() if line is not longest)
        return oldest, higher + own - 1 + others + 1

    def _level_to_serve(self, now_s: float) -> int:
        """The level whose oldest waiter has the highest aged priority; ties go to the higher level."""
        best, best_score = 0, -math.inf
        for priority, level in self._levels.items():
            oldest = next(iter(level.arrivals))
            score = priority + (now_s - oldest.enqueued_s) / self.aging_s
            if score > best_score or (score == best_score and priority > best):
                best, best_score = priority, score
        return best

    def remove(self, waiter: Waiter) -> bool:
        """Take `waiter` out of the line; False when it was not in it (served, refused, gone)."""
        if waiter not in self:
            return False
        level = self._levels[waiter.priority]
        level.remove(waiter)
        if not level.arrivals:
            del self._levels[waiter.priority]
        self._size -= 1
        return True

    def evictable(self, priority: int, tenant: str | None = None) -> Waiter | None:
        """The waiter to turn away to make room for one of `priority` and `tenant`: the newest of the
        lowest level, when that level is below `priority` (the newest has lost the least by waiting);
        else, at its own level where that is the lowest, the newest of the tenant with the most places
        in the whole line, when that tenant holds more places than the newcomer's would (a flood that
        filled the line makes room for the others: a full line is shared as the slots are)."""
        if not self._levels:
            return None
        lowest = min(self._levels)
        if lowest < priority:
            return next(reversed(self._levels[lowest].arrivals))
        level = self._levels.get(priority)
        if level is None:
            return None
        places = Counter(waiter.tenant for other in self._levels.values() for waiter in other.arrivals)
        most = max(level.tenants, key=places.__getitem__)  # of the tenants at this level: one can give a place here
        return next(reversed(level.tenants[most])) if places[most] > places[tenant] + 1 else None

    def ahead_of(self, priority: int, tenant: str | None = None) -> int:
        """How many would be served before a newcomer of `priority` and `tenant` (an estimate:
        aging aside): everyone above, and at its own level its tenant's line (none of it while
        newest first) and, of every other tenant, as many turns as its own tenant takes."""
        ahead = sum(len(level.arrivals) for p, level in self._levels.items() if p > priority)
        level = self._levels.get(priority)
        if level is None:
            return ahead
        own_line = level.tenants.get(tenant)
        overloaded = self.detector is not None and self.detector.overloaded
        own = 0 if own_line is None or overloaded else len(own_line)
        others = sum(min(len(line), own + 1) for name, line in level.tenants.items() if name != tenant)
        return ahead + own + others
