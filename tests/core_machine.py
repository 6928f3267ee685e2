"""The core's books as a Hypothesis state machine: `test_core` runs it as it is, `test_overload`
with priority classes on top."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from adaptive_gate import AIMD, MemorySample
from adaptive_gate._gate.operator import OperatorBounds
from adaptive_gate.core import ADMITTED, GateCore, Outcome, Ticket
from adaptive_gate.limiter import Waiter

GiB = 2**30


class _Shrinking(AIMD):
    """The default controller, and sizes that shrank whenever the machine says so."""

    shrunk: tuple[float, float] | None = None

    def heavier_before(self) -> tuple[float, float] | None:
        return self.shrunk


class CoreMachine(RuleBasedStateMachine):
    """Any interleaving of arrivals, admissions, releases with every outcome, OOMs (alone or not),
    leaving the line, readings, sizes that shrank (waiters from before weigh more) and operator pins
    keeps the core's books right."""

    def __init__(self) -> None:
        super().__init__()
        self.now = [0.0]
        self.controller = _Shrinking()
        self.core = GateCore(
            self.controller, min_limit=1, max_limit=6, initial_limit=2, max_queue=4, max_retry_after_s=60,
        )  # fmt: skip
        self.running: list[Ticket] = []
        self.waiting: list[Waiter] = []
        self.turned_away = 0
        self.left = 0

    def _start_granted(self) -> None:
        for waiter in [w for w in self.waiting if w.refused is not None]:
            # The line gave up on it (it could no longer finish in time, or went stale in a standing queue).
            self.waiting.remove(waiter)
            self.core.rejected("deadline", timed_out=True, now_s=self.now[0])
            self.turned_away += 1
        for waiter in [w for w in self.waiting if w.granted]:
            self.waiting.remove(waiter)
            units, heavier = self.core.granted(waiter)
            self.running.append(self.core.admitted(self.now[0], 0.0, units, None, 1, heavier))

    @rule(dt=st.floats(0.0, 0.5))
    def time_passes(self, dt: float) -> None:
        self.now[0] += dt

    @rule()
    def arrive(self) -> None:
        admission = self.core.arrive(30.0, now_s=self.now[0])
        if admission is ADMITTED:
            self.running.append(self.core.admitted(self.now[0], 0.0))
        elif isinstance(admission, str):
            self.core.rejected(admission, now_s=self.now[0])
            self.turned_away += 1
        else:
            self.waiting.append(admission)
            self._start_granted()

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100), outcome=st.sampled_from(list(Outcome)), oom=st.booleans())
    def end(self, index: int, outcome: Outcome, oom: bool) -> None:
        ticket = self.running.pop(index % len(self.running))
        if oom:
            self.core.oom(ticket, self.now[0])
            outcome = Outcome.OOM
        self.core.release(ticket, self.now[0], outcome)
        self.core.release(ticket, self.now[0], Outcome.FAILED)  # a second release is a no-op
        self._start_granted()

    @precondition(lambda self: self.waiting)
    @rule(index=st.integers(0, 100))
    def leave(self, index: int) -> None:
        waiter = self.waiting.pop(index % len(self.waiting))
        self.core.leave(waiter, self.now[0])
        self.core.left()
        self.left += 1
        self._start_granted()

    @rule(used_gib=st.integers(0, 24), ooms=st.integers(0, 2))
    def reading(self, used_gib: int, ooms: int) -> None:
        count = (self.core.probe.last_sample.oom_count or 0) if self.core.probe.last_sample else 0
        self.core.sample(MemorySample(used_gib * GiB, 24 * GiB, oom_count=count + ooms), self.now[0])
        self._start_granted()

    @rule(weight=st.sampled_from([1.0, 1.5, 3.0]), forget=st.booleans())
    def sizes_shrank(self, weight: float, forget: bool) -> None:
        self.controller.shrunk = None if forget else (self.now[0], weight)

    @rule(pin=st.one_of(st.none(), st.integers(1, 6)))
    def operator(self, pin: int | None) -> None:
        self.core.set_operator(None if pin is None else OperatorBounds(pin, pin), self.now[0])
        self._start_granted()

    @invariant()
    def books_balance(self) -> None:
        counters, limiter = self.core.counters, self.core.limiter
        assert limiter.in_flight == sum(ticket.units for ticket in self.running)
        assert self.core._heavier_in_flight == sum(ticket.heavier for ticket in self.running)
        assert all(ticket.units - ticket.heavier == 1 for ticket in self.running)
        assert limiter.queued == len(self.waiting) <= 4
        assert counters.admitted == counters.completed + counters.failed + counters.admitted_ooms + len(self.running)
        assert counters.rejected == self.turned_away and counters.left_queue == self.left
        low, high = self.core.bounds()
        assert low <= limiter.limit <= high and 1 <= limiter.limit <= 6
        assert limiter.limit <= limiter.budget <= high  # a part of a slot, never past a bound (whole slots)
        # Nobody waits beside a free slot, unless one heavier than its own waits for its room. A free
        # slot is a whole one: one that waited across a shrink may hold 1.5, and 5.5 of 6 leave none.
        assert not (self.waiting and limiter.in_flight + 1 <= limiter.limit and all(w.units == 1 for w in self.waiting))
        # When each request in flight arrived is kept for exactly those in flight: none leaks.
        assert sorted(self.core._arrived_s or {}) == sorted(ticket.serial for ticket in self.running)

    @invariant()
    def snapshot_is_consistent(self) -> None:
        stats = self.core.statistics(self.now[0])
        assert (stats.limit, stats.in_flight, stats.queued) == (
            self.core.limiter.limit, sum(ticket.units for ticket in self.running), len(self.waiting)
        )  # fmt: skip
