"""The OOM budget: a level of a mix keeps its OOMs, a change of the card never hides behind old
successes, and a level over budget is not grown into (issue 11: mixed sizes without `cost`)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_gate import AIMD, Fixed, MemorySample
from adaptive_gate._oom_budget import MIN_OUTCOMES, WINDOW, OomBudget
from adaptive_gate.core import GateCore, Outcome

GiB = 2**30
TOTAL = 24 * GiB


def run_at(budget: OomBudget, level: int, now_s: float, *, answered: int) -> None:
    for _ in range(answered):
        budget.answered(level, now_s)  # run beside `level` requests in all


def test_the_first_oom_at_a_level_is_never_tolerated_however_many_ran_there_before() -> None:
    budget = OomBudget(budget=0.1, memory_s=30)
    run_at(budget, 4, 0.0, answered=1000)
    assert not budget.ran_out(4, 1.0, None)  # a change of the card, until proven otherwise
    assert not budget.within(4, 1.0)  # and its hold stands: nothing has run there since


def test_a_level_that_runs_within_the_budget_keeps_its_ooms() -> None:
    budget = OomBudget(budget=0.1, memory_s=30)
    assert not budget.ran_out(4, 0.0, None)
    run_at(budget, 4, 1.0, answered=MIN_OUTCOMES)
    assert budget.within(4, 1.0)  # the mix's level: its first OOM's hold gives way
    assert budget.ran_out(4, 2.0, None)
    assert not budget.bars(4, 2.0)


def test_a_change_after_a_long_good_stretch_is_cut_at_its_third_oom_at_most() -> None:
    """Found in review: the successes since a level's first OOM diluted a change's OOMs, 22 of them
    kept before the cut. The last requests at the level must be within the budget too."""
    budget = OomBudget(budget=0.1, memory_s=30)
    budget.ran_out(4, 0.0, None)
    run_at(budget, 4, 1.0, answered=150)
    kept = 0
    while budget.ran_out(4, 2.0, None):  # from now on every request at 4 runs out
        kept += 1
    assert kept <= 2


@pytest.mark.parametrize("share", [0.1, 0.5, 0.9])
def test_whatever_the_budget_a_change_is_cut_at_its_third_oom(share: float) -> None:
    """Found in review: the recent test allowed `budget * 24` OOMs, so a budget of 0.9 kept 21."""
    budget = OomBudget(budget=share, memory_s=30)
    budget.ran_out(4, 0.0, None)
    run_at(budget, 4, 1.0, answered=150)
    kept = 0
    while budget.ran_out(4, 2.0, None):
        kept += 1
    assert kept <= 2


def test_the_room_to_compare_with_is_the_first_the_readings_told() -> None:
    """Found in review: a first OOM before the readings could tell the room (None) turned the room
    test off for as long as the level kept running out."""
    budget = OomBudget(budget=0.1, memory_s=30)
    budget.ran_out(4, 0.0, None)  # the model still learning
    run_at(budget, 4, 0.5, answered=MIN_OUTCOMES)
    assert budget.ran_out(4, 1.0, 5.0)  # the mix's; now the room is known: 5 requests
    run_at(budget, 4, 1.5, answered=MIN_OUTCOMES)
    assert not budget.ran_out(4, 2.0, 3.0)  # two requests' room gone: a change


def test_a_level_over_the_budget_may_be_tried_again_once_the_card_is_roomier() -> None:
    """Found in review: 24 OOMs at the lowest limit beside a neighbour barred every level above for
    30 s after it left, whatever the readings said; the OOM hold gives way there, so must this."""
    budget = OomBudget(budget=0.1, memory_s=30)
    for i in range(MIN_OUTCOMES):
        budget.ran_out(4, 0.1 * i, 2.0)
    assert budget.bars(5, 3.0, 2.0) and budget.bars(5, 3.0, None)
    assert not budget.bars(5, 3.0, 2.6)  # half a request roomier: the neighbour left


def test_a_card_the_readings_show_tighter_is_a_change_not_the_mix() -> None:
    budget = OomBudget(budget=0.1, memory_s=30)
    budget.ran_out(4, 0.0, 5.0)  # room for 5 requests, as the readings told
    run_at(budget, 4, 1.0, answered=MIN_OUTCOMES)
    assert not budget.ran_out(4, 2.0, 4.0)  # a request's room gone: a neighbour came
    assert budget.ran_out(4, 3.0, 4.8)  # within half a request of it: the mix


def test_a_long_count_does_not_collapse_when_its_first_oom_leaves_the_window() -> None:
    """Found in review: when the window's length pushed the first OOM out, every success up to the
    next OOM went with it, and a level of the mix lost its standing (its hold came back)."""
    budget = OomBudget(budget=0.1, memory_s=30)
    budget.ran_out(4, 0.0, None)
    run_at(budget, 4, 1.0, answered=WINDOW + 30)
    assert budget.within(4, 1.0)
    assert budget.levels()["4"] == [WINDOW, 0]


def test_a_level_over_the_budget_is_barred_and_so_is_every_level_above_it() -> None:
    budget = OomBudget(budget=0.1, memory_s=30)
    for i in range(6):  # one request in five runs out
        budget.ran_out(5, float(i), None)
        run_at(budget, 5, float(i), answered=4)
    assert budget.bars(5, 5.0) and budget.bars(6, 5.0)
    assert not budget.bars(4, 5.0)
    assert not budget.within(5, 5.0) and not budget.ran_out(5, 5.0, None)
    assert not budget.bars(5, 40.0)  # the evidence expires with `memory_s`: the level may be tried again


def test_too_few_requests_prove_nothing_either_way() -> None:
    budget = OomBudget(budget=0.1, memory_s=30)
    budget.ran_out(4, 0.0, None)
    run_at(budget, 4, 0.5, answered=MIN_OUTCOMES - 3)
    assert not budget.ran_out(4, 1.0, None)  # 2 in 23: too few requests to call it the mix's
    for _ in range(4):  # OOMs where nothing was answered (the lowest limit): nothing to bar with
        budget.ran_out(2, 1.0, None)
    assert not budget.bars(4, 1.0)


def test_a_zero_budget_keeps_nothing() -> None:
    budget = OomBudget(budget=0.0, memory_s=30)
    for i in range(50):
        if i % 10 == 0:
            assert not budget.ran_out(4, i * 0.1, None)
        else:
            budget.answered(4, i * 0.1)
    assert not budget.within(4, 5.0) and not budget.bars(4, 5.0) and budget.levels() == {}


@pytest.mark.parametrize("value", [-0.1, 1.0, 2, math.nan, True, "0.1", None])
def test_a_budget_that_is_not_a_share_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"oom_budget must be a share of requests in \[0, 1\)"):
        AIMD(oom_budget=value)  # type: ignore[arg-type]


# One request in eight runs out: at a 0.1 or 0.3 budget, both sides of it come up.
outcomes = st.integers(0, 7).map(lambda draw: draw == 0)
events = st.lists(st.tuples(st.floats(0, 0.05), st.integers(1, 2), outcomes), min_size=50, max_size=400)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([0.0, 0.1, 0.3]), events)
def test_an_oom_is_kept_only_after_an_earlier_one_at_its_level_and_within_the_budget(
    share: float, sequence: list[tuple[float, int, bool]]
) -> None:
    """Against a plain recount of the requests at a level from its first OOM in the window on."""
    memory_s = 10.0
    budget = OomBudget(budget=share, memory_s=memory_s)
    now_s = 0.0
    seen: list[tuple[float, int, bool]] = []
    for step_s, level, oom in sequence:
        now_s += step_s
        kept = budget.ran_out(level, now_s, None) if oom else budget.answered(level, now_s)
        seen.append((now_s, level, oom))
        recent = [ran_out for when, at, ran_out in seen if at == level and when >= now_s - memory_s]
        since_first = recent[recent.index(True) :] if True in recent else []
        if kept:
            assert since_first.count(True) >= 2 and len(since_first) >= MIN_OUTCOMES  # never a first, nor on little
            window = since_first[-WINDOW:]  # the rate after the OOM that started the count
            assert window.count(True) - 1 <= share * max(len(window) - 1, MIN_OUTCOMES - 1)
            assert since_first[-MIN_OUTCOMES:].count(True) <= max(2, share * MIN_OUTCOMES)
        if share == 0:
            assert not kept and not budget.bars(level, now_s)
        for counted in budget._levels.values():  # the running counts agree with a recount
            assert counted.ooms == sum(outcome[1] for outcome in counted.outcomes)


def test_aimd_keeps_a_mix_level_through_its_pile_ups_and_gives_up_one_over_budget() -> None:
    """The mixed scenario in small: a level where the large requests sometimes pile up keeps its
    OOMs; one where they pile up often is given up and not grown into again."""
    c = AIMD(knee_gain=0)
    c.bind(min_limit=1, max_limit=4, initial_limit=1)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    c.on_sample(now_s=0.1, sample=MemorySample(10 * GiB, TOTAL), in_flight=1)
    for _ in range(20):
        c.on_success(now_s=0.2, latency_s=0.1, concurrency=c.limit, demand=True)
    assert c.limit == 4
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=4)  # the first at 4: a cut, as with one size
    assert c.limit == 3
    for i in range(3):  # the readings show room again (the large ones finished): the hold gives way
        c.on_sample(now_s=2.1 + 0.1 * i, sample=MemorySample(13 * GiB, TOTAL), in_flight=3)
    for _ in range(10):
        c.on_success(now_s=2.5, latency_s=0.1, concurrency=c.limit, demand=True)
    assert c.limit == 4
    for _ in range(MIN_OUTCOMES):
        c.on_success(now_s=3.0, latency_s=0.1, concurrency=4, demand=True)
    epoch = c.epoch
    c.on_oom(now_s=3.5, epoch=c.epoch, in_flight=4)  # 2 in 26 at 4: the mix's, within the budget
    assert (c.limit, c.epoch) == (4, epoch)
    assert c.oom_budget.within(4, 3.5)
    requests, ooms = c.describe()["oom_budget"]["levels"]["4"]  # the status shows it
    assert ooms == 2 and requests >= MIN_OUTCOMES
    for i in range(6):  # then one in two (all admitted at 4): over the budget
        c.on_oom(now_s=4.0 + i, epoch=epoch, in_flight=4)
        c.on_success(now_s=4.0 + i, latency_s=0.1, concurrency=4, demand=True)
    assert c.limit == 3
    for _ in range(50):  # on a card as it was, 4 is not grown into while the evidence lasts
        c.on_success(now_s=9.5, latency_s=0.1, concurrency=c.limit, demand=True)
    assert c.limit == 3 and not c.oom_budget.within(4, 9.5) and c.oom_budget.bars(4, 9.5)


def test_a_hold_gives_way_only_where_every_level_grown_through_ran_within_the_budget() -> None:
    """Found in review: with `increase_step=2`, a fresh OOM at 3 (a neighbour) cut to 2, and growth
    went straight to 4 because 4 was a level of the mix within its budget: 3's hold was skipped."""
    c = AIMD(knee_gain=0, increase_step=2, slow_start=False)
    c.bind(min_limit=1, max_limit=4, initial_limit=4)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    c.on_sample(now_s=0.1, sample=MemorySample(10 * GiB, TOTAL), in_flight=1)
    c.oom_budget.ran_out(4, 1.0, c.memory.room())  # the mix's level 4: an OOM long handled, then
    for _ in range(60):  # 60 requests there
        c.on_success(now_s=1.5, latency_s=0.1, concurrency=4, demand=True)
    assert c.limit == 4 and c.oom_budget.within(4, 1.5)
    c.on_oom(now_s=2.0, epoch=c.epoch, in_flight=3)  # a neighbour's first OOM, at 3
    assert c.limit == 2
    for _ in range(10):
        c.on_success(now_s=2.1, latency_s=0.1, concurrency=c.limit, demand=True)
    assert c.limit == 2  # 3 is held, and 4 is not reached through it


def test_ooms_at_the_lowest_limit_do_not_bar_the_levels_above_once_the_card_is_roomy() -> None:
    """Found in review: OOMs at `min_limit` (no cut possible) were filed one level up, where no
    success is ever counted, and four of them barred every level above for 30 s after the neighbour
    that caused them had left."""
    c = AIMD(knee_gain=0)
    c.bind(min_limit=4, max_limit=8, initial_limit=4)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    c.on_sample(now_s=0.05, sample=MemorySample(20 * GiB, TOTAL), in_flight=4)  # 3 GiB a request
    for _ in range(40):
        c.on_success(now_s=0.1, latency_s=0.1, concurrency=4, demand=True)
    assert c.limit == 5
    for i in range(4):  # a neighbour of 6 GiB, read: even the floor runs out, again and again
        c.on_sample(now_s=1.0 + i, sample=MemorySample(23 * GiB, TOTAL), in_flight=3)
        c.on_oom(now_s=1.01 + i, epoch=c.epoch, in_flight=4)
    assert c.limit == 4
    for i in range(3):  # it left: the readings show five fit again
        c.on_sample(now_s=8.0 + 0.1 * i, sample=MemorySample(20 * GiB, TOTAL), in_flight=4)
    for _ in range(10):
        c.on_success(now_s=8.3, latency_s=0.1, concurrency=4, demand=True)
    assert c.limit == 5  # at once, not 30 s later


def swallowing_core(controller: Any, readings: int) -> tuple[GateCore, list[int]]:
    """Rounds of requests at the limit, each of which ran out once and was retried (a 200): the
    OOMs show only in the probe's count, read every 0.1 s."""
    now = [0.0]
    core = GateCore(controller, min_limit=1, max_limit=8, initial_limit=8, max_queue=8,
                    max_retry_after_s=60, clock=lambda: now[0])  # fmt: skip
    count = 0
    core.sample(MemorySample(8 * GiB, TOTAL, oom_count=count), now[0])
    limits = []
    for step in range(1, readings + 1):
        tickets = []
        while (ticket := core.enter(30.0, 1, None, now[0], now[0])) is not None:
            tickets.append(ticket)
        now[0] = step * 0.1
        for ticket in tickets:
            core.release(ticket, now[0], Outcome.COMPLETED)
        count += len(tickets)
        core.sample(MemorySample(8 * GiB + len(tickets) * GiB, TOTAL, oom_count=count), now[0])
        limits.append(core.limiter.limit)
    return core, limits


def test_ooms_the_application_swallowed_are_never_kept_for_the_budget() -> None:
    """Found in review: they reach the controller once per reading, however many struck (the probe
    counts them, not where), so a level where every request ran out once read as 1 OOM in 16: within
    the budget, kept for good. They cut as before the budget, once per reading."""
    core, limits = swallowing_core(AIMD(knee_gain=0), readings=40)
    assert core.counters.ooms > 30 and core.controller.epoch >= 10  # past the grace, a cut a reading
    assert max(limits[-10:]) <= 2
    assert AIMD(knee_gain=0).oom_budget.budget > 0  # with the default budget on


class Halving(Fixed):
    """A controller of the user's own that halves on every OOM it is told of, and knows no
    `on_swallowed_oom`: it is told once per reading, as before the budget."""

    def __init__(self) -> None:
        super().__init__(8)
        self.told = 0

    def on_oom(self, *, now_s: float, epoch: int | None, in_flight: float) -> None:
        self.told += 1
        self._limit = max(1, self._limit // 2)


def test_a_controller_without_the_hook_is_told_once_per_reading() -> None:
    controller = Halving()
    core, _ = swallowing_core(controller, readings=15)  # the grace passes at 1 s: then five readings
    assert core.counters.ooms > controller.told > 0
    assert controller.told <= 5
