"""The OOM budget: a level of a mix keeps its OOMs, a change of the card never hides behind old
successes, and a level over budget is not grown into (issue 11: mixed sizes without `cost`)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_gate import AIMD, MemorySample
from adaptive_gate._oom_budget import MIN_OUTCOMES, WINDOW, OomBudget

GiB = 2**30
TOTAL = 24 * GiB


def run_at(budget: OomBudget, level: int, now_s: float, *, answered: int) -> None:
    for _ in range(answered):
        budget.record(level, now_s, oom=False)


def test_the_first_oom_at_a_level_is_never_tolerated_however_many_ran_there_before() -> None:
    budget = OomBudget(budget=0.1, memory_s=30)
    run_at(budget, 4, 0.0, answered=1000)
    budget.record(4, 1.0, oom=True)
    assert not budget.tolerates(4, 1.0)  # a change of the card, until proven otherwise
    assert not budget.within(4, 1.0)  # and its hold stands: nothing has run there since


def test_a_level_that_runs_within_the_budget_keeps_its_ooms() -> None:
    budget = OomBudget(budget=0.1, memory_s=30)
    budget.record(4, 0.0, oom=True)
    run_at(budget, 4, 1.0, answered=MIN_OUTCOMES)
    assert budget.within(4, 1.0)  # the mix's level: its first OOM's hold gives way
    budget.record(4, 2.0, oom=True)
    assert budget.tolerates(4, 2.0)
    assert not budget.bars(4, 2.0)


def test_a_level_over_the_budget_is_barred_and_so_is_every_level_above_it() -> None:
    budget = OomBudget(budget=0.1, memory_s=30)
    for i in range(5):  # one request in three runs out
        budget.record(5, float(i), oom=True)
        run_at(budget, 5, float(i), answered=2)
    assert budget.bars(5, 5.0) and budget.bars(6, 5.0)
    assert not budget.bars(4, 5.0)
    assert not budget.tolerates(5, 5.0) and not budget.within(5, 5.0)
    assert not budget.bars(5, 40.0)  # the evidence expires with `memory_s`: the level may be tried again


def test_too_few_requests_prove_nothing_either_way() -> None:
    budget = OomBudget(budget=0.1, memory_s=30)
    budget.record(4, 0.0, oom=True)
    run_at(budget, 4, 0.5, answered=MIN_OUTCOMES - 3)
    budget.record(4, 1.0, oom=True)
    assert not budget.tolerates(4, 1.0)  # 2 in 22: too few requests to call it the mix's
    assert not budget.bars(4, 1.0)  # nor enough OOMs to call it over


def test_a_zero_budget_keeps_nothing() -> None:
    budget = OomBudget(budget=0.0, memory_s=30)
    for i in range(50):
        budget.record(4, i * 0.1, oom=i % 10 == 0)
    assert not budget.tolerates(4, 5.0) and not budget.within(4, 5.0) and not budget.bars(4, 5.0)


@pytest.mark.parametrize("value", [-0.1, 1.0, 2, math.nan, True, "0.1", None])
def test_a_budget_that_is_not_a_share_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"oom_budget must be a share of requests in \[0, 1\)"):
        AIMD(oom_budget=value)  # type: ignore[arg-type]


# One request in eight runs out: at a 0.1 or 0.3 budget, both sides of it come up.
outcomes = st.integers(0, 7).map(lambda draw: draw == 0)
events = st.lists(st.tuples(st.floats(0, 0.05), st.integers(1, 2), outcomes), min_size=50, max_size=400)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([0.0, 0.1, 0.3]), events)
def test_an_oom_is_tolerated_only_after_an_earlier_one_at_its_level_and_within_the_budget(
    share: float, sequence: list[tuple[float, int, bool]]
) -> None:
    """Against a plain recount: the requests at a level from its first OOM in the window on."""
    memory_s = 10.0
    budget = OomBudget(budget=share, memory_s=memory_s)
    now_s = 0.0
    seen: list[tuple[float, int, bool]] = []
    for step_s, level, oom in sequence:
        now_s += step_s
        budget.record(level, now_s, oom=oom)
        seen.append((now_s, level, oom))
        recent = [ran_out for when, at, ran_out in seen if at == level and when >= now_s - memory_s]
        from_first_oom = recent[recent.index(True) :][-WINDOW:] if True in recent else []
        while from_first_oom and not from_first_oom[0]:
            from_first_oom.pop(0)  # the window's first kept request must be an OOM
        tolerated = oom and budget.tolerates(level, now_s)
        if tolerated:
            ooms = from_first_oom.count(True)
            expected = share * max(len(from_first_oom), MIN_OUTCOMES)
            assert ooms >= 2 and len(from_first_oom) >= MIN_OUTCOMES
            assert ooms <= expected + math.sqrt(expected)
        if share == 0:
            assert not tolerated and not budget.bars(level, now_s)


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
    assert c.oom_budget.tolerates(4, 3.5)
    requests, ooms = c.describe()["oom_budget"]["levels"]["4"]  # the status shows it
    assert ooms == 2 and requests >= MIN_OUTCOMES
    for i in range(6):  # then one in two (all admitted at 4): over the budget
        c.on_oom(now_s=4.0 + i, epoch=epoch, in_flight=4)
        c.on_success(now_s=4.0 + i, latency_s=0.1, concurrency=4, demand=True)
    assert c.limit == 3
    for i in range(3):  # however roomy the readings, 4 is not grown into while the evidence lasts
        c.on_sample(now_s=9.0 + 0.1 * i, sample=MemorySample(11 * GiB, TOTAL), in_flight=3)
    for _ in range(50):
        c.on_success(now_s=9.5, latency_s=0.1, concurrency=c.limit, demand=True)
    assert c.limit == 3
