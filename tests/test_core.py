"""The gate's core on its own: events in, figures out, on a clock the test holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from adaptive_gate import AIMD, MemorySample
from adaptive_gate._operator import OperatorBounds
from adaptive_gate._swallowed import SwallowedOoms
from adaptive_gate.core import ADMITTED, GateCore, Outcome, Ticket
from adaptive_gate.limiter import Waiter

GiB = 2**30


def core_at(now: list[float], **kwargs: object) -> GateCore:
    return GateCore(
        AIMD(knee_gain=0),
        min_limit=1,
        max_limit=16,
        initial_limit=kwargs.pop("initial_limit", 8),  # type: ignore[arg-type]
        max_queue=8,
        max_retry_after_s=60,
        clock=lambda: now[0],
    )


def test_an_oom_alone_that_the_probe_counted_first_still_cuts_nothing() -> None:
    """The count moves when the allocator raises; the error reaches the gate later. A reading in
    between used to count the OOM as swallowed (and cut), then the error counted it again."""
    now = [0.0]
    core = core_at(now)
    core.sample(MemorySample(1 * GiB, 24 * GiB, oom_count=0), now[0])
    assert core.arrive(30.0) is ADMITTED
    ticket = core.admitted(now[0], 0.0)
    now[0] = 0.1
    core.sample(MemorySample(1 * GiB, 24 * GiB, oom_count=1), now[0])  # the count is ahead of the error
    now[0] = 0.15
    assert core.oom(ticket, now[0]) is True  # it ran alone
    core.release(ticket, now[0], Outcome.OOM)
    now[0] = 0.2
    core.sample(MemorySample(1 * GiB, 24 * GiB, oom_count=1), now[0])
    assert core.counters.ooms == 1 and core.controller.epoch == 0 and core.limiter.limit == 8
    # A later OOM the application swallows is still seen, one reading on.
    for step, count in ((0.3, 2), (0.4, 2)):
        now[0] = step
        core.sample(MemorySample(1 * GiB, 24 * GiB, oom_count=count), now[0])
    assert core.counters.ooms == 2 and core.controller.epoch == 1


def test_swallowed_after_one_reading_unexplained() -> None:
    ledger = SwallowedOoms()
    assert ledger.reading(5) == 0  # the starting point
    assert ledger.reading(7) == 0  # pending: their errors may be on the way
    ledger.error_seen()
    assert ledger.reading(7) == 1  # one explained by an error, one swallowed


def test_errors_the_count_never_sees_leave_no_debt() -> None:
    ledger = SwallowedOoms()
    ledger.reading(0)
    for _ in range(3):
        ledger.error_seen()  # e.g. "CUDA error: out of memory", which num_ooms does not count
    assert ledger.reading(0) == 0
    assert ledger.reading(1) == 0
    assert ledger.reading(1) == 1  # a later swallowed OOM is not hidden by those errors


def test_a_count_that_goes_down_is_a_new_start() -> None:
    ledger = SwallowedOoms()
    ledger.reading(10)
    assert ledger.reading(2) == 0  # statistics reset
    assert ledger.reading(3) == 0
    assert ledger.reading(3) == 1


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.booleans(), st.integers(0, 2)),
        max_size=30,
    )
)
def test_swallowed_counts_exactly_what_no_error_explained(steps: list[tuple[int, int, bool, int]]) -> None:
    """Per reading: some OOMs are swallowed, some raised (their errors arrive before this reading
    or the next), and some errors come from OOMs the count never sees. What is reported swallowed
    is what was swallowed, once the readings have caught up, less at most one per error whose OOM the
    count never saw (such an error and a swallowed OOM in the same reading look alike); never more,
    and no error hides an OOM of a later reading."""
    ledger = SwallowedOoms()
    count = 0
    ledger.reading(count)
    late_errors = 0
    reported = truly_swallowed = unseen = 0
    for swallowed, raised, errors_late, unseen_errors in steps:
        unseen += unseen_errors
        count += swallowed + raised
        truly_swallowed += swallowed
        for _ in range(late_errors + (0 if errors_late else raised) + unseen_errors):
            ledger.error_seen()
        late_errors = raised if errors_late else 0
        reported += ledger.reading(count)
    for _ in range(late_errors):
        ledger.error_seen()
    reported += ledger.reading(count) + ledger.reading(count)
    assert truly_swallowed - unseen <= reported <= truly_swallowed


class CoreMachine(RuleBasedStateMachine):
    """Any interleaving of arrivals, admissions, releases with every outcome, OOMs (alone or not),
    leaving the line, readings and operator pins keeps the core's books right."""

    def __init__(self) -> None:
        super().__init__()
        self.now = [0.0]
        self.core = GateCore(
            AIMD(knee_gain=0), min_limit=1, max_limit=6, initial_limit=2, max_queue=4, max_retry_after_s=60,
            clock=lambda: self.now[0],
        )  # fmt: skip
        self.running: list[Ticket] = []
        self.waiting: list[Waiter] = []
        self.turned_away = 0
        self.left = 0

    def _start_granted(self) -> None:
        for waiter in [w for w in self.waiting if w.granted]:
            self.waiting.remove(waiter)
            self.running.append(self.core.admitted(self.now[0], 0.0))

    @rule(dt=st.floats(0.0, 0.5))
    def time_passes(self, dt: float) -> None:
        self.now[0] += dt

    @rule()
    def arrive(self) -> None:
        admission = self.core.arrive(30.0)
        if admission is ADMITTED:
            self.running.append(self.core.admitted(self.now[0], 0.0))
        elif isinstance(admission, str):
            self.core.rejected(admission)
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
        self.core.leave(waiter)
        self.core.left()
        self.left += 1
        self._start_granted()

    @rule(used_gib=st.integers(0, 24), ooms=st.integers(0, 2))
    def reading(self, used_gib: int, ooms: int) -> None:
        count = (self.core.probe.last_sample.oom_count or 0) if self.core.probe.last_sample else 0
        self.core.sample(MemorySample(used_gib * GiB, 24 * GiB, oom_count=count + ooms), self.now[0])
        self._start_granted()

    @rule(pin=st.one_of(st.none(), st.integers(1, 6)))
    def operator(self, pin: int | None) -> None:
        self.core.set_operator(None if pin is None else OperatorBounds(pin, pin), self.now[0])
        self._start_granted()

    @invariant()
    def books_balance(self) -> None:
        counters, limiter = self.core.counters, self.core.limiter
        assert limiter.in_flight == len(self.running)
        assert limiter.queued == len(self.waiting) <= 4
        assert counters.admitted == counters.completed + counters.failed + counters.admitted_ooms + len(self.running)
        assert counters.rejected == self.turned_away and counters.left_queue == self.left
        low, high = self.core.bounds()
        assert low <= limiter.limit <= high and 1 <= limiter.limit <= 6
        assert not (self.waiting and limiter.in_flight < limiter.limit)  # nobody waits beside a free slot

    @invariant()
    def snapshot_is_consistent(self) -> None:
        stats = self.core.statistics()
        assert (stats.limit, stats.in_flight, stats.queued) == (
            self.core.limiter.limit, len(self.running), len(self.waiting)
        )  # fmt: skip


CoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestCoreMachine = CoreMachine.TestCase
