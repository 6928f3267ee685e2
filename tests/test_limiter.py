"""The limiter: slots, the FIFO line, deadlines, a moving limit, and every cancellation race."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from adaptive_gate.limiter import Limiter, QueueFull, QueueTimeout, Waiter

pytestmark = pytest.mark.anyio


# -- synchronous bookkeeping ----------------------------------------------------------------------


def test_takes_free_slots_then_queues() -> None:
    limiter = Limiter(2, max_queue=5)
    assert limiter.try_acquire(now_s=0.0) and limiter.try_acquire(now_s=0.0)
    assert not limiter.try_acquire(now_s=0.0)
    waiter = limiter.join(now_s=0.0)
    assert not waiter.granted and limiter.queued == 1
    limiter.release(now_s=0.0)
    assert waiter.granted and limiter.in_flight == 2 and limiter.queued == 0


def test_newcomer_cannot_overtake_a_waiter() -> None:
    limiter = Limiter(1, max_queue=5)
    assert limiter.try_acquire(now_s=0.0)
    first = limiter.join(now_s=0.0)
    limiter.set_limit(1, 0.0)  # no change, no grant
    limiter.release(now_s=0.0)
    assert first.granted
    assert not limiter.try_acquire(now_s=0.0)  # the slot went to the waiter, not to whoever asks next


def test_raising_the_limit_admits_waiters_in_order() -> None:
    limiter = Limiter(1, max_queue=5)
    assert limiter.try_acquire(now_s=0.0)
    waiters = [limiter.join(now_s=0.0) for _ in range(4)]
    limiter.set_limit(3, 0.0)
    assert [w.granted for w in waiters] == [True, True, False, False]
    assert limiter.in_flight == 3


def test_lowering_the_limit_preempts_nobody() -> None:
    limiter = Limiter(4, max_queue=5)
    for _ in range(4):
        assert limiter.try_acquire(now_s=0.0)
    waiter = limiter.join(now_s=0.0)
    limiter.set_limit(2, 0.0)
    assert limiter.in_flight == 4
    limiter.release(now_s=0.0)
    limiter.release(now_s=0.0)
    assert not waiter.granted and limiter.in_flight == 2
    limiter.release(now_s=0.0)
    assert waiter.granted and limiter.in_flight == 2


def test_queue_is_bounded() -> None:
    limiter = Limiter(1, max_queue=2)
    limiter.try_acquire(now_s=0.0)
    limiter.join(now_s=0.0)
    limiter.join(now_s=0.0)
    with pytest.raises(QueueFull):
        limiter.join(now_s=0.0)


def test_leaving_after_the_grant_passes_the_slot_on() -> None:
    limiter = Limiter(1, max_queue=5)
    limiter.try_acquire(now_s=0.0)
    first, second = limiter.join(now_s=0.0), limiter.join(now_s=0.0)
    limiter.release(now_s=0.0)
    assert first.granted
    limiter.leave(first, now_s=0.0)  # cancelled after the slot was handed over, before it woke up
    assert second.granted and limiter.in_flight == 1


def test_release_without_acquire_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="release"):
        Limiter(1, max_queue=0).release(now_s=0.0)


@pytest.mark.parametrize("bad", [0, -3])
def test_limit_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        Limiter(bad, max_queue=1)
    limiter = Limiter(1, max_queue=1)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        limiter.set_limit(bad, 0.0)
    assert limiter.limit == 1


def test_limit_must_be_an_int() -> None:
    with pytest.raises(TypeError, match="limit must be an int"):
        Limiter(2.5, max_queue=1)  # type: ignore[arg-type]


def test_ten_thousand_waiters_half_leaving_from_the_middle_are_served_in_order() -> None:
    limiter = Limiter(1, max_queue=20_000)
    limiter.try_acquire(now_s=0.0)
    waiters = [limiter.join(now_s=0.0) for _ in range(10_000)]
    for waiter in waiters[1::2]:
        limiter.leave(waiter, now_s=0.0)  # half give up, from the middle of the line
    for _ in range(5_000):
        limiter.release(now_s=0.0)
    assert all(w.granted for w in waiters[0::2]) and not any(w.granted for w in waiters[1::2])
    assert limiter.in_flight == 1 and limiter.queued == 0


class LimiterMachine(RuleBasedStateMachine):
    """Any interleaving of acquire, release, cancel, timeout and limit changes keeps the books right."""

    def __init__(self) -> None:
        super().__init__()
        self.limiter = Limiter(2, max_queue=6)
        self.holders = 0  # slots the "application" holds
        self.line: list[Waiter] = []  # waiters not yet woken, in arrival order
        self.woken_order: list[int] = []
        self.arrival: dict[int, int] = {}
        self.next_arrival = 0

    def _collect_grants(self) -> None:
        granted = [w for w in self.line if w.granted]
        for waiter in granted:
            self.line.remove(waiter)
            self.holders += 1
            self.woken_order.append(self.arrival[id(waiter)])
        if granted:
            assert self.limiter.in_flight <= self.limiter.limit, "a grant went past the limit"

    @rule()
    def arrive(self) -> None:
        limit_before, in_flight_before = self.limiter.limit, self.limiter.in_flight
        if self.limiter.try_acquire(now_s=0.0):
            assert in_flight_before < limit_before and not self.line
            self.holders += 1
            return
        try:
            waiter = self.limiter.join(now_s=0.0)
        except QueueFull:
            assert self.limiter.queued == self.limiter.max_queue
            return
        self.arrival[id(waiter)] = self.next_arrival
        self.next_arrival += 1
        self.line.append(waiter)
        self._collect_grants()

    @precondition(lambda self: self.holders > 0)
    @rule()
    def finish(self) -> None:
        self.holders -= 1
        self.limiter.release(now_s=0.0)
        self._collect_grants()

    @precondition(lambda self: bool(self.line))
    @rule(data=st.data())
    def give_up(self, data: st.DataObject) -> None:
        """A cancellation or a timeout of a waiter anywhere in the line."""
        waiter = data.draw(st.sampled_from(self.line))
        self.line.remove(waiter)
        self.limiter.leave(waiter, now_s=0.0)
        self._collect_grants()

    @precondition(lambda self: self.holders > 0 and bool(self.line) and self.limiter.in_flight <= self.limiter.limit)
    @rule()
    def grant_then_cancel(self) -> None:
        """A slot handed to the front waiter, which is cancelled before it wakes up."""
        front = self.line[0]
        self.holders -= 1
        self.limiter.release(now_s=0.0)
        assert front.granted
        self.line.remove(front)
        self.limiter.leave(front, now_s=0.0)  # must pass the slot on, not lose it
        self._collect_grants()

    @rule(limit=st.integers(min_value=1, max_value=5))
    def set_limit(self, limit: int) -> None:
        self.limiter.set_limit(limit, 0.0)
        self._collect_grants()

    @invariant()
    def no_slot_lost_or_doubled(self) -> None:
        assert self.limiter.in_flight == self.holders

    @invariant()
    def line_is_accounted(self) -> None:
        assert self.limiter.queued == len(self.line)

    @invariant()
    def nobody_waits_while_a_slot_is_free(self) -> None:
        if self.line:
            assert self.limiter.in_flight >= self.limiter.limit

    @invariant()
    def grants_keep_arrival_order(self) -> None:
        assert self.woken_order == sorted(self.woken_order)


LimiterMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestLimiterMachine = LimiterMachine.TestCase


# -- the async layer ------------------------------------------------------------------------------


async def test_acquire_waits_for_release() -> None:
    limiter = Limiter(1, max_queue=5)
    await limiter.acquire()
    got = anyio.Event()

    async def second() -> None:
        await limiter.acquire()
        got.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        await anyio.sleep(0.01)
        assert not got.is_set() and limiter.queued == 1
        limiter.release(now_s=0.0)
        await got.wait()
    assert limiter.in_flight == 1
    limiter.release(now_s=0.0)


async def test_acquire_times_out_and_leaves_the_line() -> None:
    limiter = Limiter(1, max_queue=5)
    await limiter.acquire()
    with pytest.raises(QueueTimeout):
        await limiter.acquire(0.02)
    assert limiter.queued == 0 and limiter.in_flight == 1


async def test_zero_timeout_does_not_queue() -> None:
    limiter = Limiter(1, max_queue=5)
    await limiter.acquire()
    with pytest.raises(QueueTimeout):
        await limiter.acquire(0)
    assert limiter.queued == 0


async def test_cancel_during_acquire() -> None:
    limiter = Limiter(1, max_queue=5)
    await limiter.acquire()
    with anyio.move_on_after(0.02):
        await limiter.acquire()
    assert limiter.queued == 0 and limiter.in_flight == 1


async def test_cancel_after_grant_before_wakeup_gives_the_slot_back() -> None:
    limiter = Limiter(1, max_queue=5)
    await limiter.acquire()
    task = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert limiter.queued == 1
    limiter.release(now_s=0.0)  # hands the slot to the waiter...
    task.cancel()  # ...which is cancelled before it gets to run again
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limiter.in_flight == 0 and limiter.queued == 0


async def test_cancelled_holder_released_in_finally_leaves_nothing() -> None:
    limiter = Limiter(1, max_queue=5)
    await limiter.acquire()

    async def request() -> None:
        await limiter.acquire()
        try:
            await anyio.sleep(1)
        finally:
            limiter.release(now_s=0.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(request)
        await anyio.sleep(0.01)
        limiter.release(now_s=0.0)
        tg.cancel_scope.cancel()
    assert limiter.in_flight == 0 and limiter.queued == 0


async def test_cancel_after_release() -> None:
    limiter = Limiter(1, max_queue=5)
    with anyio.CancelScope() as scope:
        await limiter.acquire()
        limiter.release(now_s=0.0)
        scope.cancel()
        await anyio.sleep(1)
    assert limiter.in_flight == 0


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["start", "cancel", "limit"]), st.integers(min_value=0, max_value=6)),
        min_size=1,
        max_size=40,
    )
)
def test_random_tasks_never_exceed_the_limit_nor_leak(ops: list[tuple[str, int]]) -> None:
    """Real tasks on a real loop: random arrivals, cancellations, timeouts and limit changes."""

    async def main() -> None:
        limiter = Limiter(2, max_queue=8)
        running = 0
        highest_limit = limiter.limit
        scopes: list[anyio.CancelScope] = []

        async def request(hold_s: float, timeout_s: float | None) -> None:
            nonlocal running
            scope = anyio.CancelScope()
            scopes.append(scope)
            with scope:
                try:
                    await limiter.acquire(timeout_s)
                except (QueueFull, QueueTimeout):
                    return
                try:
                    running += 1
                    assert running <= limiter.in_flight  # granted ones may not have woken yet
                    assert running <= highest_limit
                    await anyio.sleep(hold_s)
                finally:
                    running -= 1
                    limiter.release(now_s=0.0)

        async with anyio.create_task_group() as tg:
            for op, value in ops:
                if op == "start":
                    tg.start_soon(request, value / 1000, None if value % 3 else value / 2000)
                elif op == "cancel" and scopes:
                    scopes[value % len(scopes)].cancel()
                elif op == "limit":
                    limiter.set_limit(value + 1, 0.0)
                    highest_limit = max(highest_limit, limiter.limit)
                await anyio.lowlevel.checkpoint()
        assert limiter.in_flight == 0 and limiter.queued == 0

    anyio.run(main)


@pytest.mark.anyio
async def test_the_limiter_on_its_own_needs_no_times() -> None:
    """Used as a semaphore outside the gate: acquire, release and a new limit read its own clock."""
    limiter = Limiter(1, max_queue=4)
    await limiter.acquire()
    limiter.limit = 2
    await limiter.acquire()
    assert limiter.in_flight == 2
    limiter.release()
    limiter.release()
    assert limiter.in_flight == 0 and limiter.limit == 2


def test_a_budget_lets_requests_that_weigh_fractions_fill_part_of_a_slot_more() -> None:
    """Route weights make a slot the mean request: the card has room for 4.7 of them where the limit
    shows 4. Requests that weigh fractions fill the 4.7; one of a whole slot sees the limit alone;
    no budget reaches the next whole slot, and none goes below the limit."""
    limiter = Limiter(4, max_queue=8)
    limiter.set_limit(4, 0.0, budget=4.7)
    assert limiter.limit == 4 and limiter.budget == 4.7
    for _ in range(9):
        assert limiter.try_acquire(0.5, now_s=0.0)
    assert not limiter.try_acquire(0.5, now_s=0.0)  # 5.0 > 4.7
    limiter.release(4.5, now_s=0.0)
    for _ in range(4):
        assert limiter.try_acquire(1, now_s=0.0)
    assert not limiter.try_acquire(1, now_s=0.0)  # whole slots: the limit, as without a budget
    limiter.set_limit(4, 0.0, budget=9.0)
    assert limiter.budget < 5
    limiter.set_limit(4, 0.0, budget=2.0)
    assert limiter.budget == 4
    limiter.set_limit(3, 0.0)
    assert limiter.budget == 3


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("take"), st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0])),
            st.tuples(st.just("release"), st.integers(min_value=0, max_value=20)),
            st.tuples(st.just("limit"), st.integers(min_value=1, max_value=5), st.floats(0.0, 8.0)),
        ),
        max_size=60,
    )
)
def test_requests_of_any_weight_fill_the_budget_and_no_more(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    """Takes of any weight, releases and new limits with budgets, in any order: the slots held are
    the sum of what was taken and not given back, never past the budget unless one request runs
    alone, and the budget stays within a slot of the limit."""
    limiter = Limiter(2, max_queue=0)
    held: list[float] = []
    for step in steps:
        if step[0] == "take":
            alone = not held
            if limiter.try_acquire(step[1], now_s=0.0):
                held.append(step[1])
                assert alone or sum(held) <= limiter.budget + 1e-9
            else:
                assert held and sum(held) + step[1] > limiter.budget
        elif step[0] == "release" and held:
            limiter.release(held.pop(step[1] % len(held)), now_s=0.0)
        elif step[0] == "limit":
            limiter.set_limit(step[1], 0.0, budget=step[2])
            assert limiter.limit <= limiter.budget < limiter.limit + 1
        assert limiter.in_flight == pytest.approx(sum(held))
