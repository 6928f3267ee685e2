"""The OOM rate per level as a budget, for sizes that vary where the gate cannot tell them apart.

With one size of request, a level fits or it does not, and its first OOM says which: `OomHold` bars
it. With a mix (a quarter of the requests four times the others', and nothing to tell which), every
level above the worst case runs out now and then, when the large ones happen to pile up. Barring a
level at each OOM there drives the limit to the worst case, or lets it back only when the room reads
larger (a mix makes the readings flicker), so it sat a level below what the mix allows a third of
the time; growing back after each OOM pays one at every level the mix does not allow. The rate of
OOMs among a level's requests tells the two apart: a level within `budget` keeps its OOMs without a
cut or a hold, and one over it is not grown into while the evidence lasts (`memory_s`).

A change of the card must not hide behind old successes: a level's requests count from its first
OOM on (in the window), so that OOM always cuts, as it would with one size, and the level earns its
budget only by running again, through the hold, among enough requests.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["MIN_OUTCOMES", "OomBudget"]

# Requests a level must have run since its first OOM before its rate means anything: a few dozen is
# all the evidence a level gets before it must be judged (half a second at 50 requests/s).
MIN_OUTCOMES = 24
WINDOW = 200  # the most recent outcomes kept per level


class OomBudget:
    """Outcomes (answered, or out of memory) per level, from the level's first OOM within the last
    `memory_s` seconds on, the last `WINDOW` of them."""

    def __init__(self, *, budget: float, memory_s: float) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 <= budget < 1:
            raise ValueError(f"oom_budget must be a share of requests in [0, 1), got {budget!r}")
        self.budget = float(budget)
        self.memory_s = float(memory_s)
        self._outcomes: dict[int, deque[tuple[float, bool]]] = {}  # level -> (when, ran out)

    def answered(self, concurrency: float, now_s: float) -> None:
        """A request answered after running beside `concurrency` requests on average (itself
        included): counted at the level it ran at, as an OOM is (the most in flight beside it,
        about). On every answer: nothing to do until a level has run out."""
        if self._outcomes:
            self.record(max(1, math.ceil(concurrency - 0.1)), now_s, oom=False)

    def record(self, level: int, now_s: float, *, oom: bool) -> None:
        if self.budget <= 0:
            return  # every OOM cuts: nothing to count
        outcomes = self._outcomes.get(level)
        if outcomes is None:
            if not oom:
                return  # a level's count starts at its first OOM
            outcomes = self._outcomes[level] = deque(maxlen=WINDOW)
        outcomes.append((now_s, oom))

    def _count(self, level: int, now_s: float) -> tuple[int, int]:
        """(requests, OOMs) at `level` from its first OOM within the last `memory_s` on."""
        outcomes = self._outcomes.get(level)
        while outcomes and (outcomes[0][0] < now_s - self.memory_s or not outcomes[0][1]):
            outcomes.popleft()
        if not outcomes:
            self._outcomes.pop(level, None)
            return 0, 0
        return len(outcomes), sum(oom for _, oom in outcomes)

    def _over(self, requests: int, ooms: int) -> bool:
        """More OOMs than the budget allows, beyond chance: at the budget's rate a level's count
        strays by about the square root of what is expected (Poisson)."""
        expected = self.budget * max(requests, MIN_OUTCOMES)
        return ooms >= 2 and ooms > expected + math.sqrt(expected)

    def within(self, level: int, now_s: float) -> bool:
        """Whether `level` has run among enough requests since its first OOM, within the budget: a
        level of the mix, which its OOMs must not bar."""
        requests, ooms = self._count(level, now_s)
        return requests >= MIN_OUTCOMES and not self._over(requests, ooms)

    def tolerates(self, level: int, now_s: float) -> bool:
        """Whether an OOM just recorded at `level` is the mix's, within the budget there (and not the
        level's first: that one is a change of the card until proven otherwise)."""
        requests, ooms = self._count(level, now_s)
        return ooms >= 2 and requests >= MIN_OUTCOMES and not self._over(requests, ooms)

    def bars(self, level: int, now_s: float) -> bool:
        """Whether `level`, or one below it, ran out more often than the budget allows, lately."""
        return any(self._over(*self._count(at, now_s)) for at in list(self._outcomes) if at <= level)

    def levels(self) -> dict[str, list[int]]:
        """The levels counted now, as `{level: [requests, OOMs]}` from each one's first OOM on, for
        the status (the window of a level not judged since may include expired ones)."""
        return {str(level): [len(kept), sum(oom for _, oom in kept)] for level, kept in sorted(self._outcomes.items())}

    def forget(self) -> None:
        """What a level means changed (the gate weighs its routes anew): its counts mean nothing."""
        self._outcomes.clear()
