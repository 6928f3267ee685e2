"""The OOM rate per level as a budget, for sizes that vary where the gate cannot tell them apart.

With one size of request, a level fits or it does not, and its first OOM says which: `OomHold` bars
it. With a mix (a quarter of the requests four times the others', and nothing to tell which), every
level above the worst case runs out now and then, when the large ones happen to pile up. Barring a
level at each OOM there drives the limit to the worst case, or lets it back only when the room reads
larger (a mix makes the readings flicker), so it sat a level below what the mix allows a third of
the time; growing back after each OOM pays one at every level the mix does not allow. The rate of
OOMs among a level's requests tells the two apart: a level within `budget` keeps its OOMs without a
cut or a hold, and one over it is not grown into while the evidence lasts (`memory_s`).

A change of the card must not hide behind old successes:

* a level's requests count from its first OOM in the window on, so that OOM always cuts, as it would
  with one size, and the level earns its budget only by running again, through the hold, among
  enough requests;
* an OOM is kept only while the level's last `MIN_OUTCOMES` requests hold two OOMs at most (this
  one included: one in twelve, whatever the budget), so a change that makes every request at the
  level run out is cut at its third OOM there at the latest, however long the level ran well
  before;
* and only while the readings show the card no tighter than at the level's first OOM (the caller
  passes the room, in requests): a neighbour that the readings show is a change, not the mix.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

__all__ = ["MIN_OUTCOMES", "OomBudget"]

# Requests a level must have run since its first OOM before its rate means anything, and the
# recent stretch that must be within the budget too: a few dozen is all the evidence a level gets
# before it must be judged (half a second at 50 requests/s).
MIN_OUTCOMES = 24
WINDOW = 200  # the most recent outcomes kept per level
ROOM_MARGIN = 0.5  # requests: a card tighter than this against the level's first OOM has changed
RECENT_OOMS = 2  # the most OOMs among a level's last MIN_OUTCOMES requests for one to be kept


@dataclass
class _Level:
    first_oom_s: float
    room: float | None  # the room (in requests) at the first OOM, as the readings told
    # (when, ran out, the room then where it ran out and the readings told it)
    outcomes: deque[tuple[float, bool, float | None]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    ooms: int = 0  # among `outcomes`, kept as they come and go: every end of a window asks

    def add(self, now_s: float, oom: bool, room: float | None) -> None:
        outcomes = self.outcomes
        if len(outcomes) == WINDOW:
            self.ooms -= outcomes[0][1]  # the oldest falls out as this one comes in
        outcomes.append((now_s, oom, room))
        self.ooms += oom

    def drop_oldest(self) -> None:
        self.ooms -= self.outcomes.popleft()[1]


class OomBudget:
    """Outcomes (answered, or out of memory) per level, from the level's first OOM within the last
    `memory_s` seconds on, the last `WINDOW` of them."""

    def __init__(self, *, budget: float, memory_s: float) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 <= budget < 1:
            raise ValueError(f"oom_budget must be a share of requests in [0, 1), got {budget!r}")
        self.budget = float(budget)
        self.memory_s = float(memory_s)
        self._levels: dict[int, _Level] = {}

    def answered(self, concurrency: float, now_s: float) -> None:
        """A request answered after running beside `concurrency` requests on average (itself
        included): counted at the level it ran at, as an OOM is (the most in flight beside it,
        about). On every answer: nothing to do until a level has run out."""
        if self._levels:
            level = self._levels.get(max(1, math.ceil(concurrency - 0.1)))
            if level is not None:
                level.add(now_s, False, None)

    def ran_out(self, level: int, now_s: float, room: float | None) -> bool:
        """An OOM with `level` requests in flight, when the readings gave `room` (None: not read).
        True where it is the mix's, within the budget: no cut, no hold."""
        if self.budget <= 0:
            return False  # every OOM cuts: nothing to count
        counted = self._levels.get(level)
        if counted is None or self._expire(level, now_s) is None:
            self._levels[level] = _Level(now_s, room)
            self._levels[level].add(now_s, True, room)
            return False  # the first at its level lately: a change of the card until proven otherwise
        counted.add(now_s, True, room)
        if counted.room is None:
            counted.room = room  # the first OOM came before the readings could tell: this one's
        if room is not None and counted.room is not None and room < counted.room - ROOM_MARGIN:
            return False  # the readings show the card tighter than at the first: a change
        return self.within(level, now_s)

    def _expire(self, level: int, now_s: float) -> _Level | None:
        """The level's count, with what is older than `memory_s` gone; from its first OOM still
        within it on (None, and dropped, when none is)."""
        counted = self._levels.get(level)
        if counted is None:
            return None
        outcomes, horizon_s = counted.outcomes, now_s - self.memory_s
        while outcomes and outcomes[0][0] < horizon_s:
            counted.drop_oldest()
        if counted.first_oom_s < horizon_s:
            # The first OOM expired: the count starts again at the next one still kept, if any.
            while outcomes and not outcomes[0][1]:
                counted.drop_oldest()
            if not outcomes:
                del self._levels[level]
                return None
            counted.first_oom_s, _, counted.room = outcomes[0]
        return counted

    def _count(self, level: int, now_s: float) -> tuple[int, int]:
        """(requests, OOMs) at `level` since its first OOM within the last `memory_s`."""
        counted = self._expire(level, now_s)
        if counted is None:
            return 0, 0
        return len(counted.outcomes), counted.ooms

    def _over(self, requests: int, ooms: int) -> bool:
        """More OOMs than the budget allows. The count starts at an OOM, which says nothing of the
        rate (a level is counted because it ran out): the rate is the OOMs after it among the
        requests after it."""
        return ooms >= 2 and ooms - 1 > self.budget * max(requests - 1, MIN_OUTCOMES - 1)

    def within(self, level: int, now_s: float) -> bool:
        """Whether `level` has run among enough requests since its first OOM within the budget, with
        at most `RECENT_OOMS` among its last `MIN_OUTCOMES`: a level of the mix, whose OOMs are kept
        and whose hold gives way. A change that makes every request there run out fails the second
        test at its third OOM."""
        requests, ooms = self._count(level, now_s)
        if requests < MIN_OUTCOMES or self._over(requests, ooms):
            return False
        recent = islice(reversed(self._levels[level].outcomes), MIN_OUTCOMES)
        return sum(outcome[1] for outcome in recent) <= RECENT_OOMS

    def bars(self, level: int, now_s: float, room: float | None = None) -> bool:
        """Whether `level`, or one below it, ran out more often than the budget allows among enough
        requests, lately, on a card no roomier than then: where the readings give `room` for half a
        request more than at that level's first OOM (a neighbour left), it may be tried again, as
        the OOM hold's levels may. (Fewer requests prove nothing: OOMs at the lowest limit, where
        growth never counted a success, leave the hold to judge.)"""
        for at in [at for at in self._levels if at <= level]:
            requests, ooms = self._count(at, now_s)
            if requests >= MIN_OUTCOMES and self._over(requests, ooms):
                room_then = self._levels[at].room
                if room is None or room_then is None or room < room_then + ROOM_MARGIN:
                    return True
        return False

    def levels(self) -> dict[str, list[int]]:
        """The levels counted now, as `{level: [requests, OOMs]}` from each one's first OOM on, for
        the status (a level not judged since may still hold expired ones)."""
        return {str(at): [len(counted.outcomes), counted.ooms] for at, counted in sorted(self._levels.items())}

    def forget(self) -> None:
        """What a level means changed (the gate weighs its routes anew): its counts mean nothing."""
        self._levels.clear()
