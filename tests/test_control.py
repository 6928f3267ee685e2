"""Controllers as state machines: unit tests and hypothesis properties over any event sequence."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_gate import AIMD, Fixed, MemorySample
from adaptive_gate.control import Controller, MemoryModel

GiB = 2**30
TOTAL = 24 * GiB


def bound(controller: AIMD | Fixed, min_limit: int = 1, max_limit: int = 64, initial: int | None = None) -> None:
    controller.bind(min_limit=min_limit, max_limit=max_limit, initial_limit=initial)


def successes(c: AIMD, n: int, *, now_s: float = 0.0, latency_s: float = 0.1, demand: bool = True) -> None:
    for _ in range(n):
        c.on_success(now_s=now_s, latency_s=latency_s, concurrency=c.limit, demand=demand)


def test_both_controllers_follow_the_protocol() -> None:
    assert isinstance(AIMD(), Controller) and isinstance(Fixed(3), Controller)


def test_slow_start_then_additive_increase() -> None:
    c = AIMD(knee_gain=0)
    bound(c)
    successes(c, 1)
    assert c.limit == 2 and c.reason == "slow start"
    c.on_oom(now_s=0, epoch=c.epoch, in_flight=2)
    assert c.limit == 1
    successes(c, 1, now_s=100)
    assert c.limit == 2 and c.reason == "additive increase"
    successes(c, 1, now_s=100)
    assert c.limit == 2  # a window is `limit` successes
    successes(c, 1, now_s=100)
    assert c.limit == 3


def test_no_blind_growth_while_memory_is_measured_but_not_understood() -> None:
    c = AIMD(knee_gain=0)
    bound(c)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)  # a probe is there
    successes(c, 50)
    assert c.limit == 1  # no sample with a request in flight yet: how much one takes is unknown
    c.on_sample(now_s=0.1, sample=MemorySample(11 * GiB, TOTAL), in_flight=1)
    successes(c, 50)
    assert c.limit == 5  # now known: grown to what fits, no further


def test_requests_that_hold_nothing_do_not_block_growth_forever() -> None:
    c = AIMD(knee_gain=0)
    bound(c)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    for i in range(25):
        c.on_sample(now_s=0.1 * (i + 1), sample=MemorySample(8 * GiB, TOTAL), in_flight=1)
    successes(c, 50)
    assert c.limit > 1


def test_no_growth_without_demand() -> None:
    c = AIMD(knee_gain=0)
    bound(c)
    successes(c, 50, demand=False)
    assert c.limit == 1


def test_oom_cuts_once_per_congestion_event() -> None:
    c = AIMD()
    bound(c, initial=16)
    admitted_epoch = c.epoch
    for _ in range(10):  # one over-admission, ten OOMs
        c.on_oom(now_s=1.0, epoch=admitted_epoch, in_flight=16)
    assert c.limit == 8 and c.ooms_seen == 10 and c.epoch == admitted_epoch + 1


def test_oom_always_cuts_at_least_one_step_and_never_below_min() -> None:
    c = AIMD(oom_backoff=0.99)
    bound(c, min_limit=2, initial=3)
    c.on_oom(now_s=0, epoch=c.epoch, in_flight=3)
    assert c.limit == 2
    c.on_oom(now_s=0, epoch=c.epoch, in_flight=2)
    assert c.limit == 2


def test_oom_ceiling_holds_then_lets_the_limit_probe_again() -> None:
    c = AIMD(knee_gain=0, oom_hold_s=30)
    bound(c, initial=4)
    c.on_oom(now_s=0, epoch=c.epoch, in_flight=4)
    assert c.limit == 2
    successes(c, 100, now_s=10)
    assert c.limit == 3  # 4 ran out of memory ten seconds ago
    successes(c, 100, now_s=31)
    assert c.limit > 3
    c.on_oom(now_s=31, epoch=c.epoch, in_flight=4)
    successes(c, 100, now_s=80)  # the second OOM at 4 doubled the hold to 60 s
    assert c.limit == 3
    successes(c, 100, now_s=92)
    assert c.limit > 3


def test_high_watermark_cuts_gently_and_stops_growth() -> None:
    c = AIMD(knee_gain=0, pressure_cooldown_s=1.0, memory=MemoryModel(target_utilisation=1.0))
    bound(c, initial=10)
    c.on_sample(now_s=-0.1, sample=MemorySample(int(0.9 * TOTAL), TOTAL), in_flight=0)  # the sampler starts idle
    c.on_sample(now_s=0, sample=MemorySample(int(0.99 * TOTAL), TOTAL), in_flight=10)
    assert c.limit == 9 and c.reason == "memory above high watermark"
    c.on_sample(now_s=0.5, sample=MemorySample(int(0.99 * TOTAL), TOTAL), in_flight=9)
    assert c.limit == 9  # cooldown
    successes(c, 100, now_s=0.6)
    assert c.limit == 9  # no growth above the watermark
    c.on_sample(now_s=0.7, sample=MemorySample(int(0.5 * TOTAL), TOTAL), in_flight=9)
    c.on_sample(now_s=0.75, sample=MemorySample(int(0.5 * TOTAL), TOTAL), in_flight=9)  # relief, read twice
    successes(c, 100, now_s=0.8)
    assert c.limit > 9


def test_memory_cap_from_idle_and_busy_samples() -> None:
    c = AIMD(knee_gain=0)
    bound(c, initial=1)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    c.on_sample(now_s=0.1, sample=MemorySample(11 * GiB, TOTAL), in_flight=1)
    described = c.describe()["memory_model"]
    assert described["baseline_bytes"] == 8 * GiB and described["per_request_bytes"] == 3 * GiB
    assert described["cap"] == 5  # floor((0.97 * 24 - 8) / 3)
    successes(c, 500)
    assert c.limit == 5 and c.describe()["bound"] == "memory_cap"


def test_memory_model_reads_growth_cautiously_and_relaxes() -> None:
    model = MemoryModel(target_utilisation=0.9, halflife_s=5)
    model.add(0, 0, 8 * GiB, TOTAL)
    model.add(1, 2, 14 * GiB, TOTAL)
    assert model.cap() == 4
    for i in range(20):  # inputs doubled: each request now holds 6 GiB
        model.add(2 + i * 0.1, 2, 20 * GiB, TOTAL)
    assert model.cap() == 2
    for i in range(400):  # back to 3 GiB, seen at one busy level only: ambiguous, read cautiously
        model.add(4 + i * 0.1, 2, 14 * GiB, TOTAL)
    assert 3 <= model.cap() <= 4  # relief is let in, never past the truth
    for i, in_flight in enumerate([1, 3, 2, 1, 3, 2, 1, 3, 2, 3] * 4):  # in-flight varies: the line is clear
        model.add(50 + i * 0.1, in_flight, 8 * GiB + in_flight * 3 * GiB, TOTAL)
    assert model.cap() == 4


def test_memory_model_follows_a_neighbour_seen_at_an_idle_moment() -> None:
    model = MemoryModel(target_utilisation=0.9)
    model.add(0, 0, 8 * GiB, TOTAL)
    model.add(1, 1, 11 * GiB, TOTAL)
    for i in range(10):
        model.add(2 + i * 0.1, 0, 14 * GiB, TOTAL)  # a neighbour took 6 GiB
    model.add(4, 1, 17 * GiB, TOTAL)
    estimate = model.estimate()
    assert estimate is not None and abs(estimate.baseline_bytes - 14 * GiB) < 0.05 * GiB
    assert model.cap() == 2


def test_memory_model_trusts_a_level_seen_under_target() -> None:
    model = MemoryModel()
    model.add(0, 0, 8 * GiB, TOTAL)
    model.add(0.1, 1, int(11.4 * GiB), TOTAL)  # one noisy reading: 3.4 GiB per request, so 4 would fit
    assert model.cap() == 4
    for i in range(20):  # but five have been running under target all along
        model.add(0.2 + i * 0.1, 5, 23 * GiB, TOTAL)
    assert model.cap() == 5
    over = MemoryModel()
    over.add(0, 0, 8 * GiB, TOTAL)
    for i in range(20):  # five at once, over target: not proven, and the estimate says four
        over.add(0.1 + i * 0.1, 5, int(23.9 * GiB), TOTAL)
    assert over.cap() == 4


def test_memory_model_busy_from_the_start_fits_a_line() -> None:
    model = MemoryModel(target_utilisation=0.9)
    for i, in_flight in enumerate([1, 2, 3, 2, 1, 3, 2, 1, 2, 3]):
        model.add(i * 0.1, in_flight, 8 * GiB + in_flight * 3 * GiB, TOTAL)
    assert model.cap() == 4


def test_fixed_is_clamped_and_deaf() -> None:
    c = Fixed(100)
    bound(c, max_limit=8)
    assert c.limit == 8
    c.on_oom(now_s=0, epoch=0, in_flight=8)
    assert c.limit == 8


def test_a_controller_serves_one_gate() -> None:
    c = AIMD()
    bound(c, max_limit=8)
    with pytest.raises(RuntimeError, match="already used by another gate"):
        bound(c, max_limit=16)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"oom_backoff": 1.0}, "oom_backoff"),
        ({"pressure_backoff": 0}, "pressure_backoff"),
        ({"high_watermark": 1.5}, "high_watermark"),
        ({"increase_step": 0}, "increase_step"),
        ({"knee_gain": 2}, "knee_gain"),
        ({"oom_hold_s": 700}, "oom_hold_s"),
    ],
)
def test_bad_knobs(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AIMD(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target_utilisation": 0}, "target_utilisation"),
        ({"halflife_s": 0}, "halflife_s"),
        ({"halflife_s": math.nan}, "halflife_s"),
        ({"window": 2}, "window"),
        # Found in review: 0 (or less) sized a request at 0 bytes and the room divided by it.
        ({"min_request_fraction": 0.0}, "min_request_fraction"),
        ({"min_request_fraction": -1.0}, "min_request_fraction"),
        ({"spread_z": -1.0}, "spread_z"),
        ({"spread_z": math.nan}, "spread_z"),
    ],
)
def test_bad_memory_knobs(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MemoryModel(**kwargs)  # type: ignore[arg-type]


def test_aimd_takes_a_memory_model_not_its_knobs() -> None:
    model = MemoryModel(target_utilisation=0.9)
    assert AIMD(memory=model).memory is model
    with pytest.raises(TypeError, match="memory must be an adaptive_gate.memory_model.MemoryModel"):
        AIMD(memory=0.9)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AIMD(target_utilisation=0.9)  # type: ignore[call-arg]


def test_latency_brake_stops_at_the_knee() -> None:
    c = AIMD()
    bound(c)
    # Throughput saturates at 4 at once: latency 0.1 s up to 4, then grows in proportion.
    for step in range(200):
        concurrency = c.limit
        latency_s = 0.1 * max(1.0, concurrency / 4)
        c.on_success(now_s=step * 0.01, latency_s=latency_s, concurrency=concurrency, demand=True)
    assert c.limit in (4, 5)  # the knee, or one probing step past it
    assert c.describe()["bound"] == "controller"


def test_latency_brake_compares_levels_seen_under_the_same_load() -> None:
    """The knee is found on an idle machine; then load from elsewhere slows every request.

    The machine runs two at once at full speed (throughput doubles from 1 to 2, flat beyond): 0.064 s
    per request idle, 0.15 s once loaded. The brake found 3 past the knee and barred it for
    `knee_memory_s`; once that lapses, 3 is probed again. Set against the idle latency at 1, 2
    looked past the knee under the load, and each such verdict barred 3 for another 30 s: on the
    2-core demo the limit never probed again. Judged on levels seen in the same stretch of traffic,
    it does, and comes back to 2.
    """
    c = AIMD(knee_memory_s=30.0)
    bound(c)
    limits: list[tuple[float, int]] = []
    for step in range(5000):
        now_s = step * 0.01
        concurrency = c.limit
        latency_s = (0.064 if now_s < 1.0 else 0.15) * max(1.0, concurrency / 2)
        c.on_success(now_s=now_s, latency_s=latency_s, concurrency=concurrency, demand=True)
        limits.append((now_s, c.limit))
    assert [limit for now_s, limit in limits if 0.9 < now_s < 1.0] == [2] * 9, "the knee, found idle"
    assert min(limit for now_s, limit in limits if now_s >= 1.0) == 2, "never below the knee"
    assert 3 in [limit for now_s, limit in limits if 30.0 < now_s < 35.0], "3 probed again once its bar lapsed"
    assert c.limit == 2


def test_a_few_slow_answers_in_slow_start_are_no_knee() -> None:
    """In slow start a window is one success: the first three at a new level used to decide.

    On the 2-core demo the limit went 1 -> 2 -> 3 in 0.1 s; three answers at 3 took 175 ms where 1
    and 2 had taken 95 ms (a request's first pass, the machine busy elsewhere), and the brake
    stepped back to 2 and barred 3 for 30 s: the whole run. A knee is judged on `KNEE_MIN_SAMPLES`
    answers at the level; these three are outliers among them, and the real knee (4) is found."""
    c = AIMD()
    bound(c)
    slow_left = 3
    for step in range(400):
        concurrency = c.limit
        latency_s = 0.095 * max(1.0, concurrency / 4)
        if concurrency == 3 and slow_left:
            slow_left -= 1
            latency_s = 0.175
        c.on_success(now_s=step * 0.01, latency_s=latency_s, concurrency=concurrency, demand=True)
    assert slow_left == 0 and c.limit in (4, 5), "past 3, to the knee (or one probing step beyond)"


def test_a_limit_that_requests_never_fill_exactly_still_grows() -> None:
    """Requests of three slots each under a limit of 2: one runs at a time, alone, at 3; the knee
    never measures 2 and used to wait for that for ever (found in review). After a few windows
    with no measure at the limit, it lets the limit grow."""
    c = AIMD()
    bound(c)
    for step in range(300):
        # As many slots run as whole requests fit: one of three slots until the limit reaches 6.
        concurrency = 3 * max(1, c.limit // 3)
        c.on_success(now_s=step * 0.1, latency_s=0.1, concurrency=concurrency, demand=True)
    assert c.limit >= 6, "grown to where two requests run at once"


# -- properties over any sequence of events ------------------------------------------------------

events = st.lists(
    st.one_of(
        st.tuples(
            st.just("success"),
            st.floats(0.001, 5.0),
            st.floats(1, 70),
            st.booleans(),
        ),
        st.tuples(st.just("oom"), st.integers(-2, 0), st.integers(1, 70), st.just(False)),
        st.tuples(st.just("sample"), st.floats(0.0, 1.0), st.integers(0, 70), st.just(False)),
        st.tuples(st.just("wait"), st.floats(0.0, 100.0), st.just(0), st.just(False)),
    ),
    max_size=200,
)


def replay(c: AIMD, steps: list[tuple[str, float, float, bool]], check: object = None) -> None:
    now_s = 0.0
    for kind, a, b, flag in steps:
        now_s += 0.05
        before = c.limit
        if kind == "success":
            c.on_success(now_s=now_s, latency_s=a, concurrency=b, demand=flag)
        elif kind == "oom":
            fresh = a == 0
            c.on_oom(now_s=now_s, epoch=c.epoch + int(a), in_flight=int(b))
            if fresh:
                assert c.limit < before or before == c.min_limit, "a fresh OOM must lower the limit"
        elif kind == "sample":
            c.on_sample(now_s=now_s, sample=MemorySample(int(a * TOTAL), TOTAL), in_flight=int(b))
        else:
            now_s += a
        assert c.min_limit <= c.limit <= c.max_limit
        if kind == "success" and c.describe()["over_watermark"]:
            assert c.limit <= before, "no growth above the high watermark"
        cap = c.memory.cap()
        if kind == "success" and cap is not None and c.limit > before:
            assert c.limit <= max(c.min_limit, cap), "no growth above the memory cap"


@settings(max_examples=300, deadline=None)
@given(
    steps=events,
    min_limit=st.integers(1, 4),
    spread=st.integers(0, 60),
    initial=st.none() | st.integers(1, 64),
)
def test_limit_stays_in_bounds_and_obeys_the_signals(
    steps: list[tuple[str, float, float, bool]], min_limit: int, spread: int, initial: int | None
) -> None:
    c = AIMD()
    max_limit = min_limit + spread
    bound(
        c,
        min_limit=min_limit,
        max_limit=max_limit,
        initial=None if initial is None else min(max(initial, min_limit), max_limit),
    )
    replay(c, steps)


@settings(max_examples=200, deadline=None)
@given(steps=events)
def test_growth_resumes_after_pressure_ends(steps: list[tuple[str, float, float, bool]]) -> None:
    c = AIMD()
    bound(c, max_limit=64)
    replay(c, steps)
    # Pressure ends: memory is low and well understood, no OOM for long, latency flat.
    later_s = 10_000.0
    for i in range(10):  # the sampler goes on: idle, then one request's worth
        c.on_sample(now_s=later_s + i * 0.01, sample=MemorySample(0, TOTAL), in_flight=0)
    c.on_sample(now_s=later_s + 0.1, sample=MemorySample(TOTAL // 100, TOTAL), in_flight=1)
    start = c.limit
    for i in range(2000):  # 200 s: long enough for any stale latency or memory reading to be forgotten
        now_s = later_s + 1 + i * 0.1
        c.on_success(now_s=now_s, latency_s=0.1, concurrency=c.limit, demand=True)
        if i % 5 == 0:  # and the sampler reads what the requests really take: 1% of the card each
            c.on_sample(now_s=now_s, sample=MemorySample(c.limit * TOTAL // 100, TOTAL), in_flight=c.limit)
    assert c.limit > start or c.limit == c.max_limit


def test_a_stale_huge_request_estimate_is_forgotten_when_readings_say_otherwise() -> None:
    """Found by hypothesis: one reading of a full card with one request in flight made the model
    believe a request takes the whole card, and every later reading (1% with one in flight) was
    explained away as a moved baseline, so the limit stayed at 1 for good."""
    c = AIMD()
    bound(c, max_limit=64)
    c.on_sample(now_s=0.0, sample=MemorySample(0, TOTAL), in_flight=0)
    c.on_sample(now_s=0.1, sample=MemorySample(TOTAL, TOTAL), in_flight=1)
    assert c.memory.cap() == 0
    for i in range(200):  # 40 s of readings (relief half-life 5 s): one request holds 1% of the card
        c.on_sample(now_s=1.0 + i * 0.2, sample=MemorySample(TOTAL // 100, TOTAL), in_flight=1)
    cap = c.memory.cap()
    assert cap is not None and cap > 50


# -- memory first (issue 11) ----------------------------------------------------------------------


def test_a_neighbour_shrinks_the_room_at_once_and_gives_it_back_after_three_readings() -> None:
    model = MemoryModel()
    model.add(0.0, 0, 8 * GiB, TOTAL)
    model.add(0.1, 1, 11 * GiB, TOTAL)
    assert model.cap() == 5
    model.add(0.2, 3, 23 * GiB, TOTAL)  # three in flight, and 6 GiB that are not theirs
    assert model.cap() == 3  # at once: before the next admission
    model.add(0.3, 3, 17 * GiB, TOTAL)  # it left: a reading may catch requests not allocated yet
    model.add(0.4, 3, 17 * GiB, TOTAL)  # (two in a row do, every few seconds at 50 requests/s)
    assert model.cap() == 3
    model.add(0.5, 3, 17 * GiB, TOTAL)  # three agree: the room is back
    assert model.cap() == 5


def test_relief_is_taken_at_the_most_cautious_of_the_readings() -> None:
    model = MemoryModel()
    model.add(0.0, 0, 14 * GiB, TOTAL)  # a neighbour's 6 GiB from the start
    model.add(0.1, 2, 20 * GiB, TOTAL)
    model.add(0.2, 2, 14 * GiB, TOTAL)  # 6 GiB gone
    model.add(0.3, 2, 17 * GiB, TOTAL)  # only 3 of them, this time
    model.add(0.4, 2, 14 * GiB, TOTAL)
    estimate = model.estimate()
    assert estimate is not None and estimate.baseline_bytes == 11 * GiB


def test_a_spread_that_no_reading_renews_fades() -> None:
    model = MemoryModel(halflife_s=5.0)
    model.add(0.0, 0, 8 * GiB, TOTAL)
    for i, in_flight in enumerate([1, 2, 3, 2, 1, 3, 2, 1, 3, 2]):  # a line, slightly off: some spread
        model.add(0.1 + 0.1 * i, in_flight, 8 * GiB + in_flight * 3 * GiB + (i % 2) * GiB // 2, TOTAL)
    spread = model.estimate().spread_bytes  # type: ignore[union-attr]
    assert spread > 0
    for i in range(30):  # one level, exactly on the line, until the window's line no longer renews it
        model.add(2 + 0.5 * i, 2, 14 * GiB, TOTAL)
    fading = model.estimate().spread_bytes  # type: ignore[union-attr]
    assert 0 < fading < spread
    for i in range(10):  # 5 s more: mostly gone (it fades with a fifth of the 5 s half-life)
        model.add(17 + 0.5 * i, 2, 14 * GiB, TOTAL)
    assert model.estimate().spread_bytes < fading / 4  # type: ignore[union-attr]


def test_an_oom_bars_its_level_only_while_the_card_is_as_tight() -> None:
    """0.1 held it for 30 s on a wall clock whatever memory said (issue 11)."""
    c = AIMD(knee_gain=0, oom_hold_s=30)
    bound(c, initial=1)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    c.on_sample(now_s=0.1, sample=MemorySample(11 * GiB, TOTAL), in_flight=1)
    successes(c, 50, now_s=0.2)
    assert c.limit == 5
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=5)  # a neighbour came between two readings
    c.on_sample(now_s=1.05, sample=MemorySample(23 * GiB, TOTAL), in_flight=3)  # it holds 6 GiB
    successes(c, 50, now_s=1.1)
    assert c.limit == 3  # what fits beside it, and the OOM's level barred
    for i in range(3):  # it left
        c.on_sample(now_s=5.0 + i * 0.1, sample=MemorySample(17 * GiB, TOTAL), in_flight=3)
    successes(c, 50, now_s=5.2)
    assert c.limit == 5  # four seconds after the OOM, not thirty


def test_without_readings_an_oom_still_holds_on_the_clock() -> None:
    c = AIMD(knee_gain=0, oom_hold_s=30)
    bound(c, initial=4)
    c.on_oom(now_s=0, epoch=c.epoch, in_flight=4)
    successes(c, 100, now_s=10)
    assert c.limit == 3  # no probe: the wall-clock hold is all there is


def test_each_oom_keeps_the_state_it_happened_in() -> None:
    """Found in review: the hold kept one room for all its OOMs, the latest's. Seven ran out with the
    card as it is (room for 7.64 by the readings); then six ran out beside a neighbour (room 4.64).
    When the neighbour left, the room was 7.64 again, exactly as at the first OOM, yet seven was
    tried again (the limit went back to 7), because only the second OOM's state was remembered."""
    c = AIMD(knee_gain=0)
    bound(c, initial=1)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    c.on_sample(now_s=0.1, sample=MemorySample(10 * GiB, TOTAL), in_flight=1)  # 2 GiB a request
    successes(c, 80, now_s=0.2)
    assert c.limit == 7
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=7)  # seven do not fit after all
    c.on_sample(now_s=1.05, sample=MemorySample(20 * GiB, TOTAL), in_flight=6)
    successes(c, 80, now_s=1.1)
    assert c.limit == 6
    c.on_oom(now_s=2.0, epoch=c.epoch, in_flight=6)  # a neighbour of 6 GiB came
    c.on_sample(now_s=2.05, sample=MemorySample(24 * GiB, TOTAL), in_flight=5)
    successes(c, 80, now_s=2.1)
    assert c.limit == 4
    for i in range(3):  # it left: the card is as it was at the first OOM
        c.on_sample(now_s=3.0 + i * 0.1, sample=MemorySample(16 * GiB, TOTAL), in_flight=4)
    successes(c, 200, now_s=3.5)
    assert c.limit == 6  # six fit again; seven ran out in this very state


def test_an_oom_in_a_roomier_card_does_not_bar_the_levels_that_ran_there() -> None:
    """Found in review: the other half of the same flaw. Four ran out beside a neighbour; it left
    and the limit grew to seven; seven ran out with the card roomy. The hold then barred four and
    up (the first OOM's level) while the room stayed below the second OOM's: a limit cut below six
    for any other reason could not climb back to six, which had run there, for up to ten minutes."""
    c = AIMD(knee_gain=0)
    bound(c, initial=1)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    c.on_sample(now_s=0.1, sample=MemorySample(10 * GiB, TOTAL), in_flight=1)
    successes(c, 80, now_s=0.2)
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=4)  # a neighbour of 6 GiB came
    c.on_sample(now_s=1.05, sample=MemorySample(20 * GiB, TOTAL), in_flight=3)
    for i in range(3):  # it left
        c.on_sample(now_s=2.0 + i * 0.1, sample=MemorySample(14 * GiB, TOTAL), in_flight=3)
    successes(c, 80, now_s=2.5)
    assert c.limit == 7
    c.on_oom(now_s=10.0, epoch=c.epoch, in_flight=7)  # seven do not fit after all
    c.on_sample(now_s=10.05, sample=MemorySample(20 * GiB, TOTAL), in_flight=6)
    assert c.limit == 6
    # Something else takes the limit lower: a reading above the high watermark (a neighbour's
    # blip, gone by the next readings), past the second the OOM's state is read in. Six may be
    # tried again, seven may not.
    c.on_sample(now_s=11.5, sample=MemorySample(int(23.6 * GiB), TOTAL), in_flight=6)
    assert c.limit < 6
    for i in range(5):
        c.on_sample(now_s=12.0 + i * 0.1, sample=MemorySample(18 * GiB, TOTAL), in_flight=5)
    assert c.memory.cap() == 7
    successes(c, 200, now_s=13.0)
    assert c.limit == 6


def test_one_odd_reading_does_not_set_the_slope_of_the_line() -> None:
    """Found in review: after one reading 3.6 GiB high (a neighbour's blip) at six in flight, then
    readings at five only, the line through the blip and the fives was fitted (two levels, no
    residual): 5.6 GiB a request, the baseline clamped to 0, the cap 4 where 7 fit; and since nothing
    at a single level can tell the baseline again, it stayed at 6 for as long as the load held."""
    model = MemoryModel()
    now_s = 0.0
    model.add(now_s, 0, 8 * GiB, TOTAL)
    for i in range(16):  # five and six in flight, 2 GiB each
        now_s += 0.1
        model.add(now_s, 5 + i % 2, (8 + 2 * (5 + i % 2)) * GiB, TOTAL)
    assert model.cap() == 7
    now_s += 0.1
    model.add(now_s, 6, int(23.6 * GiB), TOTAL)
    assert model.cap() == 5  # memory first: taken for a neighbour at once
    for i in range(300):  # 30 s at five
        now_s += 0.1
        model.add(now_s, 5, 18 * GiB, TOTAL)
        if i >= 2:  # the third reading in a row that shows it gone
            assert model.cap() == 7
    assert model.estimate().baseline_bytes == pytest.approx(8 * GiB)  # type: ignore[union-attr]
