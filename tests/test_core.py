"""The gate's core on its own: events in, figures out, on a clock the test holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from adaptive_gate import AIMD, MemorySample
from adaptive_gate._swallowed import SwallowedOoms
from adaptive_gate.core import ADMITTED, GateCore, Outcome, make_core

GiB = 2**30


def core_at(now: list[float], **kwargs: object) -> GateCore:
    return make_core(
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
