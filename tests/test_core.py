"""The gate's core on its own: events in, figures out, on a clock the test holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_gate import AIMD, Fixed, MemorySample
from adaptive_gate._gate.limiter import Waiter
from adaptive_gate._gate.swallowed import GRACE_S, SwallowedOoms
from adaptive_gate.core import ADMITTED, GateCore, Outcome

from .core_machine import CoreMachine

GiB = 2**30


def core_at(now: list[float], **kwargs: object) -> GateCore:
    return GateCore(
        AIMD(),
        min_limit=1,
        max_limit=16,
        initial_limit=kwargs.pop("initial_limit", 8),  # type: ignore[arg-type]
        max_queue=8,
        max_retry_after_s=60,
    )


def test_an_oom_alone_that_the_probe_counted_first_still_cuts_nothing() -> None:
    """The count moves when the allocator raises; the error reaches the gate later, after several
    readings when they come every few milliseconds. Such a reading used to count the OOM as
    swallowed (and cut), then the error counted it again."""
    now = [0.0]
    core = core_at(now)
    core.sample(MemorySample(1 * GiB, 24 * GiB, oom_count=0), now[0])
    assert core.arrive(30.0, now_s=now[0]) is ADMITTED
    ticket = core.admitted(now[0], 0.0)
    for step in range(1, 30):  # readings every 10 ms while the error is on its way
        now[0] = step * 0.01
        core.sample(MemorySample(1 * GiB, 24 * GiB, oom_count=1), now[0])
    assert core.oom(ticket, now[0]) is True  # it ran alone
    core.release(ticket, now[0], Outcome.OOM)
    now[0] = 2.0
    core.sample(MemorySample(1 * GiB, 24 * GiB, oom_count=1), now[0])
    assert core.counters.ooms == 1 and core.controller.epoch == 0 and core.limiter.limit == 8
    # A later OOM the application swallows is still seen, once the grace has passed.
    for at_s in (2.1, 2.6, 3.2):
        now[0] = at_s
        core.sample(MemorySample(1 * GiB, 24 * GiB, oom_count=2), now[0])
    assert core.counters.ooms == 2 and core.controller.epoch == 1


def test_an_oom_that_names_more_than_the_card_holds_is_too_large_beside_others() -> None:
    """20 GiB asked of a 24 GiB card with 8 GiB of others': no load could have avoided it, so it is
    `too_large` even with others in flight, and cuts nothing (it used to take the limit down with it)."""
    now = [0.0]
    core = core_at(now)
    core.sample(MemorySample(8 * GiB, 24 * GiB, oom_count=0), now[0])
    tickets = []
    for _ in range(3):
        assert core.arrive(30.0, now_s=now[0]) is ADMITTED
        tickets.append(core.admitted(now[0], 0.0))
    now[0] = 0.05
    core.sample(MemorySample(17 * GiB, 24 * GiB, oom_count=0), now[0])  # 3 GiB each
    limit = core.limiter.limit
    assert core.oom(tickets[0], now[0], tried_bytes=20 * GiB) is True
    core.release(tickets[0], now[0], Outcome.OOM)
    assert core.limiter.limit == limit and core.controller.epoch == 0
    assert core.oom(tickets[1], now[0], tried_bytes=3 * GiB) is False  # one of the card's own: it corrects


def test_swallowed_once_unexplained_for_the_grace() -> None:
    ledger = SwallowedOoms()
    assert ledger.reading(5, 0.0) == 0  # the starting point
    assert ledger.reading(7, 0.1) == 0  # pending: their errors may be on the way
    assert ledger.reading(7, 0.2) == 0
    ledger.error_seen()
    assert ledger.reading(7, 0.1 + GRACE_S / 2) == 0  # one explained by its error
    assert ledger.reading(7, 0.1 + GRACE_S) == 1  # the other was swallowed


def test_errors_the_count_never_sees_leave_no_debt() -> None:
    ledger = SwallowedOoms()
    ledger.reading(0, 0.0)
    for _ in range(3):
        ledger.error_seen()  # e.g. "CUDA error: out of memory", which num_ooms does not count
    assert ledger.reading(0, 0.1) == 0
    assert ledger.reading(1, 0.2) == 0
    assert ledger.reading(1, 0.2 + GRACE_S) == 1  # a later swallowed OOM is not hidden by those errors


def test_a_count_that_goes_down_is_a_new_start() -> None:
    ledger = SwallowedOoms()
    ledger.reading(10, 0.0)
    assert ledger.reading(2, 0.1) == 0  # statistics reset
    assert ledger.reading(3, 0.2) == 0
    assert ledger.reading(3, 0.2 + GRACE_S) == 1


PERIOD_S = 0.1  # readings this far apart; errors arrive up to `LATE_READINGS` of them late
LATE_READINGS = int(GRACE_S / PERIOD_S) - 1


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, LATE_READINGS), st.integers(0, 2)),
        max_size=40,
    )
)
def test_swallowed_counts_exactly_what_no_error_explained(steps: list[tuple[int, int, int, int]]) -> None:
    """Per reading: some OOMs are swallowed, some raised (their errors arrive within the grace, up to
    several readings late), and some errors come from OOMs the count never sees. What is reported
    swallowed is what was swallowed, once the grace has passed, less at most one per error whose OOM
    the count never saw (such an error and a swallowed OOM look alike); never more."""
    ledger = SwallowedOoms()
    count = 0
    ledger.reading(count, 0.0)
    errors_due: dict[int, int] = {}  # reading index -> errors that arrive just before it
    reported = truly_swallowed = unseen = 0
    for index, (swallowed, raised, late, unseen_errors) in enumerate(steps, start=1):
        count += swallowed + raised
        truly_swallowed += swallowed
        unseen += unseen_errors
        errors_due[index + late] = errors_due.get(index + late, 0) + raised
        for _ in range(errors_due.pop(index, 0) + unseen_errors):
            ledger.error_seen()
        reported += ledger.reading(count, index * PERIOD_S)
    for _ in range(sum(errors_due.values())):
        ledger.error_seen()
    reported += ledger.reading(count, (len(steps) + LATE_READINGS + 1) * PERIOD_S + GRACE_S)
    assert truly_swallowed - unseen <= reported <= truly_swallowed


CoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestCoreMachine = CoreMachine.TestCase


def test_a_reading_is_learned_beside_the_requests_in_flight_when_it_was_taken() -> None:
    """Two requests hold slots by the time the loop handles a reading that the probe took with none
    in flight: it is the others' bytes, exactly, not two requests that hold nothing."""
    from adaptive_gate.core import InFlight

    now = [0.0]
    core = core_at(now)
    for _ in range(2):
        assert core.arrive(30.0, now_s=now[0]) is ADMITTED
    core.sample(MemorySample(8 * GiB, 24 * GiB), now[0], InFlight(0.0, {}))
    model = core.controller.describe()["memory_model"]
    assert model is None  # an idle reading tells the others' bytes, and nothing yet of a request's
    now[0] = 0.1
    core.sample(MemorySample(14 * GiB, 24 * GiB), now[0], InFlight(2.0, {}))
    model = core.controller.describe()["memory_model"]
    assert model["baseline_bytes"] == 8 * GiB and model["per_request_bytes"] == 3 * GiB
    assert core.limiter.limit == 5  # five fit beside 8 GiB


def test_a_request_from_before_a_shrink_admitted_without_its_cost_is_told_no_cost() -> None:
    """Code that drives the core itself may leave out `requests` (its cost): it is then its slots less what
    it weighs as one from before a shrink (`heavier`). Its slots, 1.55, were taken for a cost, and the model
    read every later request as weighed in units (`MemoryModel.told`); a cost of 2 is one."""
    controller = AIMD()
    core = GateCore(controller, min_limit=1, max_limit=16, initial_limit=8, max_queue=8, max_retry_after_s=60)
    assert core.arrive(30.0, now_s=0.0, units=1.546875) is ADMITTED
    core.release(core.admitted(0.0, 0.0, units=1.546875, heavier=0.546875), 0.0, Outcome.COMPLETED)
    assert core.route_weights is not None and not core.route_weights.costs_told and not controller.memory.told()
    assert core.arrive(30.0, now_s=0.0, units=2) is ADMITTED
    core.release(core.admitted(0.0, 0.0, units=2), 0.0, Outcome.COMPLETED)
    assert core.route_weights.costs_told and controller.memory.told()


def test_a_reading_counts_what_requests_weigh_beyond_their_own_as_of_its_snapshot() -> None:
    """The probe's thread takes the slots in flight with the reading; the loop learns from it later.
    A request from before a shrink, weighed half a request more, handed its slots and started in
    between: subtracted as of the loop's moment, the reading counted 1.45 requests in flight where two
    ran, and the model read two requests' bytes as a request and a half's."""
    fed: list[float] = []

    class Recording(AIMD):
        def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: float) -> None:
            fed.append(in_flight)
            super().on_sample(now_s=now_s, sample=sample, in_flight=in_flight)

    core = GateCore(Recording(), min_limit=1, max_limit=16, initial_limit=8, max_queue=8, max_retry_after_s=60)
    core.sample(MemorySample(8 * GiB, 24 * GiB), 0.0)
    for _ in range(2):
        assert core.arrive(30.0, now_s=0.0) is ADMITTED
    then = core.in_flight_now()
    assert (then.units, then.heavier) == (2.0, 0.0)
    # On the loop, after the snapshot: a waiter from before the shrink is handed its slots, and starts
    assert core.limiter.take(1.546875, 0.1) is not None
    core.admitted(0.1, 0.0, units=1.546875, heavier=0.546875)
    core.sample(MemorySample(14 * GiB, 24 * GiB), 0.1, then)
    assert fed == [0.0, 2.0]


def test_the_controller_is_told_when_the_oldest_request_in_flight_arrived() -> None:
    """Before each reading: the earliest arrival among the requests in flight, whether they walked
    in or waited in the line (arrived when they joined it), and None once none runs."""
    told: list[float | None] = []

    class Listening(AIMD):
        def oldest_in_flight(self, arrived_s: float | None) -> None:
            told.append(arrived_s)
            super().oldest_in_flight(arrived_s)

    core = GateCore(Listening(), min_limit=1, max_limit=2, initial_limit=2, max_queue=8, max_retry_after_s=60)
    reading = MemorySample(8 * GiB, 24 * GiB)
    first = core.enter(30.0, 1, None, arrived_s=1.0, now_s=1.5)
    second = core.enter(30.0, 1, None, arrived_s=2.0, now_s=2.0)
    assert first is not None and second is not None
    core.sample(reading, 3.0)
    assert told[-1] == 1.0
    waiter = core.arrive(30.0, now_s=2.5)  # both slots taken: it waits from 2.5
    assert not isinstance(waiter, str) and waiter is not ADMITTED
    core.release(first, 4.0, Outcome.COMPLETED)
    third = core.admitted(4.0, 1.5)
    core.sample(reading, 4.1)
    assert told[-1] == 2.0
    core.release(second, 5.0, Outcome.OOM)
    core.sample(reading, 5.1)
    assert told[-1] == 2.5
    core.release(third, 6.0, Outcome.FAILED)
    core.sample(reading, 6.1)
    assert told[-1] is None
    # Where several routes are gated, a slot's bytes are the weights': nothing is held from before.
    for route in ("/infer", "/infer/large"):
        assert core.enter(30.0, 1, route, arrived_s=7.0, now_s=7.0) is not None
    core.sample(reading, 7.1)
    assert told[-1] is None


def test_a_controller_that_does_not_ask_keeps_no_arrivals() -> None:
    from adaptive_gate import Fixed

    core = GateCore(Fixed(2), min_limit=1, max_limit=2, initial_limit=2, max_queue=8, max_retry_after_s=60)
    ticket = core.enter(30.0, 1, None, arrived_s=1.0, now_s=1.0)
    assert ticket is not None and core._arrived_s is None


def test_an_oom_alone_teaches_nothing_not_even_to_the_next_oom() -> None:
    """A request that ran out alone is too large, whatever it asked for: the model keeps its size,
    and the allocation it named is not taken for the next OOM's (which named none)."""
    from adaptive_gate.core import InFlight

    core = GateCore(AIMD(), min_limit=1, max_limit=16, initial_limit=1, max_queue=8, max_retry_after_s=60)
    now_s = 0.0
    core.sample(MemorySample(8 * GiB, 24 * GiB), now_s, InFlight(0.0, {}))
    for n in (1, 2, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5):
        now_s += 0.1
        core.sample(MemorySample((8 + 3 * n) * GiB, 24 * GiB), now_s, InFlight(float(n), {}))
    assert core.limiter.limit == 5
    alone = core.enter(30.0, 1, None, arrived_s=now_s, now_s=now_s)
    assert alone is not None
    assert core.oom(alone, now_s, tried_bytes=6 * GiB) is True
    core.release(alone, now_s, Outcome.OOM)
    assert core.controller.describe()["memory_model"]["per_request_bytes"] == 3 * GiB
    tickets = [core.enter(30.0, 1, None, arrived_s=now_s, now_s=now_s) for _ in range(5)]
    assert all(ticket is not None for ticket in tickets)
    assert core.oom(tickets[0], now_s + 0.01) is False  # five of 3 GiB did not fit: that level is barred
    assert core.limiter.limit == 4


def test_requests_that_joined_the_line_before_the_sizes_shrank_weigh_the_old_size_until_served() -> None:
    """Where the controller says the sizes shrank (`heavier_before`), the waiters that joined the line
    before then weigh its slots each; the model reads each at its own slot (the weight is a guess of
    the sizes from before); every slot comes back on release, whichever way the request ends."""
    seen: list[float] = []

    class Shrunk(Fixed):
        def heavier_before(self) -> tuple[float, float] | None:
            return (2.0, 3.0)

        def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: float) -> None:
            seen.append(in_flight)

    core = GateCore(Shrunk(4), min_limit=1, max_limit=4, initial_limit=4, max_queue=8, max_retry_after_s=60)
    running = [core.enter(30.0, 1, None, arrived_s=0.5, now_s=0.5) for _ in range(4)]
    old = core.arrive(30.0, now_s=1.0)
    new = core.arrive(30.0, now_s=2.5)
    assert isinstance(old, Waiter) and isinstance(new, Waiter)
    core.sample(MemorySample(8 * GiB, 24 * GiB), 3.0)
    assert (old.units, new.units) == (3.0, 1.0)
    tickets = [ticket for ticket in running if ticket is not None]
    core.release(tickets.pop(), 3.5, Outcome.COMPLETED)
    assert not old.granted  # three slots of the old size, where one is free: nobody overtakes it
    core.release(tickets.pop(), 3.6, Outcome.OOM)
    core.release(tickets.pop(), 3.7, Outcome.FAILED)
    assert old.granted and not new.granted
    units, heavier = core.granted(old)
    assert (units, heavier) == (3.0, 2.0)
    ticket = core.admitted(3.7, 2.7, units, None, 1, heavier)
    assert core.limiter.in_flight == 4.0
    core.sample(MemorySample(8 * GiB, 24 * GiB), 3.8)
    assert seen[-1] == 2.0  # two requests run: one of the old size and one from the start
    core.release(ticket, 4.0, Outcome.COMPLETED)
    core.release(tickets.pop(), 4.1, Outcome.COMPLETED)
    assert new.granted
    assert core.granted(new) == (1.0, 0.0)  # joined after the change: its own slot
    last = core.admitted(4.1, 1.6)
    core.release(last, 4.2, Outcome.COMPLETED)
    assert core.limiter.in_flight == 0 and core._heavier_in_flight == 0


def test_where_the_sizes_shrank_earlier_than_believed_the_line_that_joined_since_weighs_its_own_slots() -> None:
    """The controller moves the time of the shrink back (a request that arrived before it was read
    at the new size): the waiters that joined since weigh their own slots again, and run beside each
    other, where each had weighed the old size's slots and ran alone."""

    class Earlier(Fixed):
        shrunk_s = 2.0

        def heavier_before(self) -> tuple[float, float] | None:
            return (self.shrunk_s, 4.0)

    controller = Earlier(4)
    core = GateCore(controller, min_limit=1, max_limit=4, initial_limit=4, max_queue=8, max_retry_after_s=60)
    running = [core.enter(30.0, 1, None, arrived_s=0.5, now_s=0.5) for _ in range(4)]
    oldest, later, newest = (core.arrive(30.0, now_s=t) for t in (0.8, 1.2, 1.5))
    assert isinstance(oldest, Waiter) and isinstance(later, Waiter) and isinstance(newest, Waiter)
    core.sample(MemorySample(8 * GiB, 24 * GiB), 3.0)
    assert (oldest.units, later.units, newest.units) == (4.0, 4.0, 4.0)
    controller.shrunk_s = 1.0
    core.sample(MemorySample(8 * GiB, 24 * GiB), 3.1)
    assert (oldest.units, later.units, newest.units) == (4.0, 1.0, 1.0)
    tickets = [ticket for ticket in running if ticket is not None]
    for ticket in tickets:
        core.release(ticket, 3.2, Outcome.COMPLETED)
    assert oldest.granted and not later.granted  # four slots of the old size: the whole limit
    units, heavier = core.granted(oldest)
    first = core.admitted(3.2, 2.4, units, None, 1, heavier)
    core.release(first, 3.3, Outcome.COMPLETED)
    assert later.granted and newest.granted  # one slot each: both run at once
    for waiter, arrived_s in ((later, 1.2), (newest, 1.5)):
        assert core.granted(waiter) == (1.0, 0.0)
        core.release(core.admitted(3.3, 3.3 - arrived_s), 3.4, Outcome.COMPLETED)
    assert core.limiter.in_flight == 0 and core._heavier_in_flight == 0


def test_the_reading_that_finds_the_sizes_shrank_weighs_the_line_before_the_limit_rises() -> None:
    """The reading that says the sizes shrank raises the limit as well (a slot is the smaller size
    now). The line's requests from before are weighed at the old size first: granted at one slot by
    the new limit before they were, one from before ran out of memory beside the new ones."""

    class Shrinks(Fixed):
        def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: float) -> None:
            self._limit = 4

        def heavier_before(self) -> tuple[float, float] | None:
            return (2.0, 4.0) if self._limit == 4 else None

    core = GateCore(Shrinks(1), min_limit=1, max_limit=4, initial_limit=1, max_queue=8, max_retry_after_s=60)
    running = core.enter(30.0, 1, None, arrived_s=2.5, now_s=2.5)
    old = core.arrive(30.0, now_s=1.0)
    new = core.arrive(30.0, now_s=2.6)
    assert running is not None and isinstance(old, Waiter) and isinstance(new, Waiter)
    core.sample(MemorySample(8 * GiB, 24 * GiB), 3.0)
    assert core.limiter.limit == 4
    assert old.units == 4.0 and not old.granted  # four slots of the old size, where three are free
    assert not new.granted  # nobody overtakes it
    core.release(running, 3.5, Outcome.COMPLETED)
    assert old.granted
    units, heavier = core.granted(old)
    assert (units, heavier) == (4.0, 3.0)
    ticket = core.admitted(3.5, 2.5, units, None, 1, heavier)
    core.release(ticket, 4.0, Outcome.COMPLETED)
    assert new.granted and core.granted(new) == (1.0, 0.0)
    core.release(core.admitted(4.0, 1.4), 4.1, Outcome.COMPLETED)
    assert core.limiter.in_flight == 0 and core._heavier_in_flight == 0


def test_an_oom_tells_the_controller_what_stays_in_flight_and_no_waiter_takes_its_slot() -> None:
    """Before the failed request's slot goes back: the controller hears what stays in flight once it
    has left (`after_oom`), so a waiter does not take the slot before the next reading, whichever
    order the driver tells the OOM and the release in. The request was admitted with six in flight,
    where the model now says five fit: the OOM bars nothing below five."""
    told: list[float] = []

    class Listening(AIMD):
        def after_oom(self, in_flight: float) -> None:
            told.append(in_flight)
            super().after_oom(in_flight)

    core = GateCore(Listening(), min_limit=1, max_limit=8, initial_limit=6, max_queue=8, max_retry_after_s=60)
    core.sample(MemorySample(8 * GiB, 24 * GiB), 0.0)
    tickets = [core.enter(30.0, 1, None, arrived_s=0.1, now_s=0.1) for _ in range(6)]
    assert all(ticket is not None for ticket in tickets)
    for ticket in tickets[:3]:
        assert ticket is not None
        core.release(ticket, 0.2, Outcome.COMPLETED)
    core.sample(MemorySample(17 * GiB, 24 * GiB), 0.3)  # three of 3 GiB beside 8: five fit
    assert core.limiter.limit == 5
    admissions = [core.arrive(30.0, now_s=0.35) for _ in range(3)]
    assert admissions[:2] == [ADMITTED, ADMITTED] and admissions[2] is not ADMITTED
    for _ in range(2):
        core.admitted(0.35, 0.0)
    failed = tickets[5]
    assert failed is not None
    assert not core.oom(failed, 0.4, tried_bytes=3 * GiB)
    assert told == [4.0] and core.limiter.limit == 4
    core.release(failed, 0.4, Outcome.OOM)
    assert core.limiter.in_flight == 4 and core.limiter.queued == 1  # the waiter did not take the slot
    core.sample(MemorySample(20 * GiB, 24 * GiB), 0.5)  # four hold 12 GiB: five fit
    assert core.limiter.limit == 5 and core.limiter.queued == 0 and core.limiter.in_flight == 5
    other = tickets[4]
    assert other is not None
    core.release(other, 0.6, Outcome.OOM)  # told after its release: nothing of it stays in flight
    core.oom(other, 0.6, tried_bytes=3 * GiB)
    assert told[-1] == core.limiter.in_flight == 4


def test_a_route_whose_requests_never_fit_is_answered_at_the_door_but_for_one_a_second() -> None:
    """Three requests of one route in a row too large for the card (each ran alone and ran out), with
    no success of the route between: its next are answered `too_large` at the door, without a slot,
    but one a second tries the card again, and the first that fits opens the door. Another route's
    requests come in meanwhile. One too large between successes closes nothing."""
    from adaptive_gate.core import Reason

    now = [0.0]
    core = core_at(now)
    core.sample(MemorySample(8 * GiB, 24 * GiB, oom_count=0), now[0])
    for step in range(3):
        now[0] = 0.1 + step * 0.1
        assert core.arrive(30.0, now_s=now[0], route="large") is ADMITTED
        ticket = core.admitted(now[0], 0.0, route="large")
        assert core.oom(ticket, now[0] + 0.05, tried_bytes=20 * GiB) is True  # alone: too large
        core.release(ticket, now[0] + 0.05, Outcome.OOM)
    now[0] = 0.5
    assert core.arrive(30.0, now_s=now[0], route="large") is Reason.TOO_LARGE
    assert core.enter(30.0, 1, "large", now[0], now[0]) is None  # the fast way leaves it to `arrive`
    assert core.limiter.in_flight == 0  # nothing taken for it
    assert core.statistics(now[0]).too_large_routes == ("large",)
    assert core.arrive(30.0, now_s=now[0], route="small") is ADMITTED
    core.release(core.admitted(now[0], 0.0, route="small"), 0.6, Outcome.COMPLETED)
    now[0] = 1.2  # a second after the route was last let through: one tries the card
    assert core.arrive(30.0, now_s=now[0], route="large") is ADMITTED
    tried = core.admitted(now[0], 0.0, route="large")
    assert core.arrive(30.0, now_s=now[0] + 0.1, route="large") is Reason.TOO_LARGE
    core.release(tried, 1.5, Outcome.COMPLETED)  # it fitted: a neighbour left, or the inputs changed
    assert core.arrive(30.0, now_s=1.6, route="large") is ADMITTED
    assert core.statistics(1.6).too_large_routes == ()
    core.release(core.admitted(1.6, 0.0, route="large"), 1.7, Outcome.COMPLETED)

    for step in range(6):  # too large, then a success, and so on: the door stays open
        now[0] = 2.0 + step * 0.1
        assert core.arrive(30.0, now_s=now[0], route="large") is ADMITTED
        ticket = core.admitted(now[0], 0.0, route="large")
        if step % 2:
            core.release(ticket, now[0] + 0.05, Outcome.COMPLETED)
        else:
            core.oom(ticket, now[0] + 0.05, tried_bytes=20 * GiB)
            core.release(ticket, now[0] + 0.05, Outcome.OOM)
    assert core.arrive(30.0, now_s=2.7, route="large") is ADMITTED


def test_requests_of_a_route_told_heavier_than_any_that_fit_are_answered_at_the_door_lighter_ones_not() -> None:
    """One route, its requests told apart by `cost`: the heavy ones (8 slots) never fit, the light ones
    (1) do. The light ones' successes say nothing of the heavy: after three heavy ones in a row were too
    large, the next heavy ones are answered at the door (one a second tries the card), while the light
    ones come in. Each heavy one let in had waited for the card to empty (a request alone always goes
    in), so a closed loop of them kept the card idle: 13 requests a second served where 55 fit."""
    from adaptive_gate.core import Reason

    now = [0.0]
    core = core_at(now)
    core.sample(MemorySample(8 * GiB, 24 * GiB, oom_count=0), now[0])
    for step in range(3):
        now[0] = 0.1 + step * 0.1
        assert core.arrive(30.0, now_s=now[0], units=8) is ADMITTED
        heavy = core.admitted(now[0], 0.0, 8)
        assert core.oom(heavy, now[0] + 0.05, tried_bytes=20 * GiB) is True  # alone: too large
        core.release(heavy, now[0] + 0.05, Outcome.OOM)
        assert core.arrive(30.0, now_s=now[0] + 0.05, units=1) is ADMITTED
        core.release(core.admitted(now[0] + 0.05, 0.0, 1), now[0] + 0.08, Outcome.COMPLETED)  # a light one fits
    now[0] = 0.5
    assert core.arrive(30.0, now_s=now[0], units=8) is Reason.TOO_LARGE
    assert core.arrive(30.0, now_s=now[0], units=12) is Reason.TOO_LARGE  # heavier still
    light = core.enter(30.0, 1, None, now[0], now[0])  # a light one walks straight in
    assert light is not None
    core.release(light, 0.6, Outcome.COMPLETED)
    assert core.arrive(30.0, now_s=1.2, units=8) is ADMITTED  # a second on: one tries the card
    tried = core.admitted(1.2, 0.0, 8)
    assert core.arrive(30.0, now_s=1.3, units=8) is Reason.TOO_LARGE
    core.release(tried, 1.5, Outcome.COMPLETED)  # it fitted: the heavy ones come in again
    assert core.arrive(30.0, now_s=1.6, units=8) is ADMITTED
    core.release(core.admitted(1.6, 0.0, 8), 1.7, Outcome.COMPLETED)
    assert core.statistics(1.7).in_flight == 0


def test_the_limit_in_force_keeps_to_the_bounds_whatever_a_controller_of_ones_own_says() -> None:
    """A controller of the user's own that asks past `max_limit` runs `max_limit`; one that asks for 0 (or
    less) runs `min_limit`, and requests still go in: the gate can always make progress."""

    class Asks(Fixed):
        def bind(self, *, min_limit: int, max_limit: int, initial_limit: int | None) -> None:
            pass  # keeps whatever it was made with, as a careless controller would

    greedy = Asks(1000)
    core = GateCore(greedy, min_limit=2, max_limit=8, initial_limit=None, max_queue=8, max_retry_after_s=60)
    assert core.limiter.limit == 8 and core.statistics(0.0).bound == "max_limit"
    tickets = [core.enter(30.0, 1, None, arrived_s=0.0, now_s=0.0) for _ in range(9)]
    assert tickets[-1] is None and core.limiter.in_flight == 8  # the ninth waits
    greedy._limit = 0
    core.sample(MemorySample(8 * GiB, 24 * GiB), 1.0)
    assert core.limiter.limit == 2 and core.statistics(1.0).bound == "min_limit"
    greedy._limit = -5
    core.sample(MemorySample(8 * GiB, 24 * GiB), 1.5)
    assert core.limiter.limit == 2
    for ticket in tickets[:-1]:
        assert ticket is not None
        core.release(ticket, 2.0, Outcome.COMPLETED)
    assert core.enter(30.0, 1, None, arrived_s=2.0, now_s=2.0) is not None  # progress at the least limit
