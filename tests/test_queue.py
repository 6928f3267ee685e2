"""The waiting line's order (`_gate/queue.py`) and the overload detector (`_gate/overload.py`), on a fake clock."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from adaptive_gate._gate.overload import BUCKETS, OverloadDetector
from adaptive_gate._gate.queue import FairLine, FifoLine, Waiter
from adaptive_gate.limiter import Limiter, QueueFull


def fair_limiter(limit: int = 1, *, aging_s: float = 1e9, max_queue: int = 1000) -> Limiter:
    return Limiter(limit, max_queue=max_queue, line=FairLine(aging_s))


def joins(detector: OverloadDetector, now_s: float, *, wait_s: float = 1.0, budget_s: float = 1.0) -> None:
    """A newcomer finds no free slot (it joins the line or is turned away), expecting `wait_s` first come
    first served of its `budget_s`."""
    detector.arrived(now_s, wait_s=wait_s, budget_s=budget_s)


def test_fifo_is_first_come_first_served_until_more_arrive_than_are_taken_in() -> None:
    detector = OverloadDetector(0.01)  # interval: 50 ms
    line = FifoLine(detector)
    waiters = [Waiter() for _ in range(40)]
    for waiter in waiters[:4]:
        line.push(waiter, 0.0)
    assert line.pop_next(0.02) is waiters[0]  # waited above the target: the clock starts
    for step, waiter in enumerate(waiters[4:], start=1):  # four arrive for each one taken in
        now_s = 0.02 + step * 0.002
        joins(detector, now_s)
        line.push(waiter, now_s)
        if step % 4 == 0:
            assert line.pop_next(now_s) is waiters[step // 4]  # first come, first served until then
        if detector.overloaded:
            break
    assert detector.overloaded and detector.episodes == 1
    assert 0.07 <= now_s < 0.09  # one interval after the clock started, not before
    assert line.pop_next(now_s) is waiter  # newest first now
    assert line.ahead_of(0) == 0
    while line:
        line.pop_next(now_s)
    line.push(Waiter(), now_s)
    line.pop_next(now_s)  # the line emptied: first come first served again
    assert not detector.overloaded


def test_a_growing_line_that_is_served_in_good_time_is_no_overload() -> None:
    """Clients that start one after another (a ramp) grow the line, but while first come, first
    served answers each in a quarter of its time, there is nothing to reorder."""
    detector = OverloadDetector(0.01)
    line = FifoLine(detector)
    line.push(Waiter(), 0.0)
    line.pop_next(0.02)
    now_s = 0.02
    for _ in range(200):  # four arrive for each one taken in, for a second
        for _ in range(4):
            now_s += 0.001
            joins(detector, now_s, wait_s=0.2, budget_s=60.0)
            line.push(Waiter(), now_s)
        line.pop_next(now_s)
    assert not detector.overloaded and detector.episodes == 0
    joins(detector, now_s, wait_s=20.0, budget_s=60.0)  # a third of its time: too long a wait now
    assert detector.overloaded


def test_a_line_that_stands_without_growing_is_no_overload() -> None:
    """A closed loop: each answer brings its client back, so the line stands for ever, as long as it
    is, and it is served first come, first served."""
    detector = OverloadDetector(0.01)
    line = FifoLine(detector)
    for _ in range(100):  # a hundred clients, all at once
        joins(detector, 0.0)
        line.push(Waiter(), 0.0)
    now_s = 0.0
    for _ in range(2000):  # each one taken in is back a moment later
        now_s += 0.0025
        first = next(iter(line))
        assert line.pop_next(now_s) is first
        joins(detector, now_s + 0.0001)
        line.push(Waiter(), now_s + 0.0001)
        assert not detector.overloaded
    assert detector.episodes == 0


def test_overload_ends_once_no_more_arrive_than_are_taken_in() -> None:
    detector = OverloadDetector(0.01)  # window: 100 ms
    line = FifoLine(detector)
    for _ in range(10):
        line.push(Waiter(), 0.0)
    detector.overloaded = True  # in overload (how it gets there: the tests above)
    now_s = 0.0
    for _ in range(60):  # two join for each one taken in: it lasts
        now_s += 0.005
        joins(detector, now_s)
        joins(detector, now_s)
        line.push(Waiter(), now_s)
        line.pop_next(now_s)
        assert detector.overloaded
    for _ in range(60):  # one arrives for each one taken in: it ends
        now_s += 0.005
        joins(detector, now_s)
        line.push(Waiter(), now_s)
        line.pop_next(now_s)
    assert not detector.overloaded and detector.episodes == 0  # set by hand: no episode counted
    assert line  # it ended with people waiting: the line did not have to empty


def test_a_short_wait_resets_the_clock() -> None:
    detector = OverloadDetector(0.01)
    detector.dequeued(0.02, 0.02, empty=False)
    detector.dequeued(0.001, 0.04, empty=False)  # the queue was short a moment: a burst, not a standing queue
    detector.dequeued(0.02, 0.06, empty=False)
    for index in range(40):
        joins(detector, 0.07 + index * 0.001)
    assert not detector.overloaded  # 49 ms of standing since 60 ms, not 89 since 20 ms
    joins(detector, 0.111)
    assert detector.overloaded and detector.episodes == 1


def test_the_counts_keep_few_buckets_whatever_the_rate() -> None:
    detector = OverloadDetector(0.01)
    for index in range(100_000):  # 100,000 joins in a second
        joins(detector, index * 1e-5)
    assert len(detector._arrived._buckets) <= 2 * BUCKETS + 1
    assert detector.rates_per_s(1.0)[0] > 50_000


def test_higher_priority_first_and_tenants_in_turn() -> None:
    line = FairLine(aging_s=1e9)
    a1, a2, a3 = (Waiter(0, "a") for _ in range(3))
    b1 = Waiter(0, "b")
    urgent = Waiter(5, "a")
    for waiter in (a1, a2, a3, b1, urgent):
        line.push(waiter, 0.0)
    order = [line.pop_next(1.0) for _ in range(5)]
    assert order == [urgent, a1, b1, a2, a3]


def test_aging_lets_the_old_low_priority_one_pass() -> None:
    line = FairLine(aging_s=2.0)
    old = Waiter(0)
    line.push(old, 0.0)
    line.push(Waiter(3), 5.0)
    assert line.pop_next(5.9) is not old  # 0 + 5.9/2 < 3
    line.push(Waiter(3), 6.5)
    assert line.pop_next(6.6) is old  # 0 + 6.6/2 > 3 + 0.1/2: three levels make up for six seconds


def test_a_full_line_makes_room_for_a_tenant_that_a_flood_crowded_out() -> None:
    """One tenant's flood filled the line: another tenant's newcomer takes the place of the flood's newest,
    until the two lines are as long; then the line is full for both, and neither makes room for the other."""
    now = [0.0]
    limiter = fair_limiter(max_queue=4)
    assert limiter.try_acquire(now_s=now[0])
    flood = [limiter.join(Waiter(0, "a"), now_s=now[0]) for _ in range(4)]
    line = limiter.line
    assert line.evictable(0, "a") is None  # its own line is the longest
    others = []
    for expected in (flood[3], flood[2]):
        victim = line.evictable(0, "b")
        assert victim is expected  # the newest of the flood: it lost the least by waiting
        limiter.evict(victim, "evicted")
        others.append(limiter.join(Waiter(0, "b"), now_s=now[0]))
    assert flood[3].refused == "evicted" and flood[2].refused == "evicted" and flood[1].refused is None
    assert line.evictable(0, "b") is None and line.evictable(0, "a") is None  # two each: shared
    assert line.evictable(1, "c") is others[-1]  # a higher priority evicts the lowest level's newest
    victim = line.evictable(0, "c")  # a third tenant: a place from a line of two
    assert victim is not None and victim.tenant in ("a", "b") and victim.refused is None
    limiter.evict(victim, "evicted")
    limiter.join(Waiter(0, "c"), now_s=now[0])
    assert line.evictable(0, "c") is None  # one, one and two: c's second would make its line the longest


def test_a_tenant_counts_its_places_at_every_priority_before_it_takes_one() -> None:
    """Tenant a holds six places at priority 5, b two at priority 0: a's newcomer at priority 0 takes none of
    b's (it holds most of the line already), and b's takes none of a's more important places."""
    now = [0.0]
    limiter = fair_limiter(max_queue=8)
    assert limiter.try_acquire(now_s=now[0])
    for _ in range(6):
        limiter.join(Waiter(5, "a"), now_s=now[0])
    for _ in range(2):
        limiter.join(Waiter(0, "b"), now_s=now[0])
    line = limiter.line
    assert line.evictable(0, "a") is None and line.evictable(0, "b") is None
    victim = line.evictable(0, "c")  # a third tenant: one of b's two, never one of a's more important places
    assert victim is not None and victim.tenant == "b"


def test_a_full_line_evicts_the_newest_of_the_lowest_level() -> None:
    now = [0.0]
    limiter = fair_limiter(max_queue=3)
    assert limiter.try_acquire(now_s=now[0])
    low_old, low_new, mid = (
        limiter.join(Waiter(0), now_s=now[0]),
        limiter.join(Waiter(0), now_s=now[0]),
        limiter.join(Waiter(1), now_s=now[0]),
    )
    line = limiter.line
    assert line.evictable(0) is None and line.evictable(1) is low_new and line.evictable(9) is low_new
    limiter.evict(low_new, "evicted")
    assert low_new.refused == "evicted" and limiter.queued == 2
    high = limiter.join(Waiter(2), now_s=now[0])
    limiter.release(now_s=now[0])
    assert high.granted and not mid.granted and not low_old.granted


def test_tenant_lines_exist_only_while_somebody_waits() -> None:
    now = [0.0]
    limiter = fair_limiter(max_queue=10_000)
    assert limiter.try_acquire(now_s=now[0])
    waiters = [limiter.join(Waiter(0, f"random-{i}"), now_s=now[0]) for i in range(5000)]
    for waiter in waiters:
        limiter.leave(waiter, now_s=now[0])
    level_count = len(limiter.line._levels)  # type: ignore[union-attr]
    assert limiter.queued == 0 and level_count == 0


def test_backlogged_tenants_get_equal_shares() -> None:
    """Thirty heavy tenants with twenty waiting each and two light ones: every one gets 1/32."""
    now = [0.0]
    limiter = fair_limiter()
    assert limiter.try_acquire(now_s=now[0])
    tenant_of: dict[Waiter, str] = {}
    for _ in range(20):
        for tenant in [f"heavy-{i}" for i in range(30)] + ["light-1", "light-2"]:
            tenant_of[limiter.join(Waiter(0, tenant), now_s=now[0])] = tenant
            now[0] += 0.001
    served: Counter[str] = Counter()
    for _ in range(320):  # half the backlog
        limiter.release(now_s=now[0])
        granted = [w for w in tenant_of if w.granted]
        for waiter in granted:
            served[tenant_of.pop(waiter)] += 1
    fair = 320 / 32
    assert len(served) == 32
    assert all(abs(count - fair) <= 0.15 * fair for count in served.values()), served


def test_a_waiter_past_its_latest_start_is_refused_and_the_slot_goes_on() -> None:
    now = [0.0]
    limiter = Limiter(1, max_queue=5)
    assert limiter.try_acquire(now_s=now[0])
    late = limiter.join(Waiter(latest_start_s=1.0), now_s=now[0])
    next_one = limiter.join(Waiter(latest_start_s=10.0), now_s=now[0])
    now[0] = 2.0
    limiter.release(now_s=now[0])
    assert late.refused == "deadline" and not late.granted
    assert next_one.granted and limiter.in_flight == 1


class FairLimiterMachine(RuleBasedStateMachine):
    """Any interleaving of arrivals (priorities, tenants, deadlines), evictions, releases, leaving
    before and after a grant, limit changes and time: every waiter is granted at most once,
    in_flight never passes the limit by a grant, no waiter is lost, nobody waits beside a free slot."""

    def __init__(self) -> None:
        super().__init__()
        self.now = [0.0]
        self.detector = OverloadDetector(0.01)
        line = FairLine(aging_s=0.5, detector=self.detector)
        self.limiter = Limiter(2, max_queue=6, line=line)
        self.holders = 0
        self.waiting: list[Waiter] = []
        self.ever_granted: set[Waiter] = set()  # the waiters themselves: an id() could be reused
        self.refused = 0

    def _collect(self) -> None:
        for waiter in list(self.waiting):
            if waiter.granted:
                assert waiter.refused is None and waiter not in self.ever_granted
                self.ever_granted.add(waiter)
                self.waiting.remove(waiter)
                self.holders += 1
                assert self.limiter.in_flight <= self.limiter.limit, "a grant went past the limit"
            elif waiter.refused is not None:
                self.waiting.remove(waiter)
                self.refused += 1

    @rule(dt=st.floats(0.0, 0.2))
    def time_passes(self, dt: float) -> None:
        self.now[0] += dt

    @rule(priority=st.integers(-1, 2), tenant=st.sampled_from([None, "a", "b", "c"]), budget=st.floats(0.0, 1.0))
    def arrive(self, priority: int, tenant: str | None, budget: float) -> None:
        if self.limiter.try_acquire(now_s=self.now[0]):
            self.holders += 1
            return
        waiter = Waiter(priority, tenant, self.now[0] + budget)
        joins(self.detector, self.now[0])  # as the core tells it: overload turns the line newest first
        if self.limiter.queued >= self.limiter.max_queue:
            victim = self.limiter.line.evictable(priority, tenant)
            if victim is None:
                return
            self.limiter.evict(victim, "evicted")
        try:
            self.limiter.join(waiter, now_s=self.now[0])
        except QueueFull:
            raise AssertionError("an eviction must make room") from None
        self.waiting.append(waiter)
        self._collect()

    @precondition(lambda self: self.holders)
    @rule()
    def release(self) -> None:
        self.holders -= 1
        self.limiter.release(now_s=self.now[0])
        self._collect()

    @precondition(lambda self: self.waiting)
    @rule(index=st.integers(0, 100))
    def leave(self, index: int) -> None:
        waiter = self.waiting.pop(index % len(self.waiting))
        self.limiter.leave(waiter, now_s=self.now[0])
        self.limiter.leave(waiter, now_s=self.now[0])  # twice: still nothing lost or given twice
        self._collect()

    @precondition(lambda self: self.holders and self.waiting)
    @rule()
    def release_then_the_granted_one_leaves(self) -> None:
        self.holders -= 1
        self.limiter.release(now_s=self.now[0])
        for waiter in [w for w in self.waiting if w.granted]:
            self.waiting.remove(waiter)
            self.limiter.leave(waiter, now_s=self.now[0])  # cancelled after the grant, before it woke: the slot goes on
        self._collect()

    @rule(limit=st.integers(1, 4))
    def set_limit(self, limit: int) -> None:
        self.limiter.set_limit(limit, self.now[0])
        self._collect()

    @invariant()
    def books_balance(self) -> None:
        limiter = self.limiter
        assert limiter.in_flight == self.holders
        assert limiter.queued == len(self.waiting) <= limiter.max_queue
        assert all(waiter in limiter.line for waiter in self.waiting), "a waiter was lost"
        assert not (self.waiting and limiter.in_flight < limiter.limit)


FairLimiterMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
TestFairLimiterMachine = FairLimiterMachine.TestCase
