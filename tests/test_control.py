"""Controllers as state machines: unit tests and hypothesis properties over any event sequence."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from adaptive_gate import AIMD, Fixed, MemorySample
from adaptive_gate._control.memory_model import RELIEF_READINGS
from adaptive_gate.control import Controller, MemoryModel
from adaptive_gate.memory_model import MemoryEstimate
from adaptive_gate.simulation import Phase, simulate

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
    c = AIMD()
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
    c = AIMD()
    bound(c)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)  # a probe is there
    successes(c, 50)
    assert c.limit == 1  # no sample with a request in flight yet: how much one takes is unknown
    c.on_sample(now_s=0.1, sample=MemorySample(11 * GiB, TOTAL), in_flight=1)
    c.on_sample(now_s=0.2, sample=MemorySample(14 * GiB, TOTAL), in_flight=2)
    c.on_sample(now_s=0.3, sample=MemorySample(20 * GiB, TOTAL), in_flight=4)
    successes(c, 50)
    assert c.limit == 5  # now known: what fits, and successes add nothing to it


def test_requests_that_hold_nothing_do_not_block_growth_forever() -> None:
    c = AIMD()
    bound(c)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    for i in range(25):
        c.on_sample(now_s=0.1 * (i + 1), sample=MemorySample(8 * GiB, TOTAL), in_flight=1)
    successes(c, 50)
    assert c.limit > 1


def test_no_growth_without_demand() -> None:
    c = AIMD()
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


def test_without_readings_an_oom_holds_its_level_on_the_clock_then_lets_it_be_tried() -> None:
    c = AIMD(oom_hold_s=30)
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


def learned(c: AIMD, *, others_gib: float = 8, request_gib: float = 3, levels: tuple[int, ...] = (1, 2, 4, 5)) -> float:
    """Readings idle, then at `levels` in flight: the model knows the card. The time after them."""
    c.on_sample(now_s=0.0, sample=MemorySample(int(others_gib * GiB), TOTAL), in_flight=0)
    now_s = 0.0
    for n in levels:
        now_s += 0.1
        c.on_sample(now_s=now_s, sample=MemorySample(int((others_gib + n * request_gib) * GiB), TOTAL), in_flight=n)
    return now_s


def test_the_limit_is_what_fits_beside_the_others_and_climbs_at_most_twofold_a_reading() -> None:
    c = AIMD()
    bound(c, initial=1)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    c.on_sample(now_s=0.1, sample=MemorySample(11 * GiB, TOTAL), in_flight=1)
    described = c.describe()["memory_model"]
    assert described["baseline_bytes"] == 8 * GiB and described["per_request_bytes"] == 3 * GiB
    assert described["cap"] == 5  # floor((24 - 8) / 3)
    assert c.limit == 2  # one request read alone: at most twice what ran
    c.on_sample(now_s=0.2, sample=MemorySample(14 * GiB, TOTAL), in_flight=2)
    assert c.limit == 4
    c.on_sample(now_s=0.3, sample=MemorySample(20 * GiB, TOTAL), in_flight=4)
    assert c.limit == 5 and c.describe()["bound"] == "memory"
    assert "16.00 GiB of room beside 8.00 GiB" in c.describe()["why"]


def test_a_card_that_fits_exactly_is_filled() -> None:
    """A 7 GiB neighbour beside 8 GiB of weights on 24 GiB: three requests of 3 GiB fit, at 100% of
    the card. The high watermark cut such a card to two and held it there."""
    c = AIMD()
    bound(c, initial=1)
    learned(c, others_gib=15, levels=(1, 2, 3, 3, 3))
    assert c.limit == 3


def test_the_others_rise_is_believed_at_once_and_their_fall_after_two_readings() -> None:
    model = MemoryModel()
    model.add(0.0, 0, 8 * GiB, TOTAL)
    model.add(0.1, 1, 11 * GiB, TOTAL)
    assert model.cap() == 5
    model.add(0.2, 3, 23 * GiB, TOTAL)  # three in flight, and 6 GiB that are not theirs
    assert model.cap() == 3  # at once: before the next admission
    model.add(0.3, 3, 23 * GiB, TOTAL)  # and the next reading says so too
    model.add(0.4, 3, 17 * GiB, TOTAL)  # it left: a reading may catch requests not allocated yet
    assert model.cap() == 3
    model.add(0.5, 3, 17 * GiB, TOTAL)  # two agree: the room is back
    assert model.cap() == 5


def test_relief_is_taken_at_the_most_cautious_of_the_readings() -> None:
    model = MemoryModel()
    model.add(0.0, 0, 8 * GiB, TOTAL)
    model.add(0.1, 2, 14 * GiB, TOTAL)
    model.add(0.2, 2, 20 * GiB, TOTAL)  # a neighbour's 6 GiB
    model.add(0.3, 2, 20 * GiB, TOTAL)
    model.add(0.4, 2, 17 * GiB, TOTAL)  # 3 GiB of it gone
    model.add(0.5, 2, 14 * GiB, TOTAL)  # all of it, this time
    estimate = model.estimate()
    assert estimate is not None and estimate.baseline_bytes == 11 * GiB


def test_two_neighbours_that_leave_together_give_all_their_room_back_in_two_readings() -> None:
    """One neighbour read at an idle moment (the others' bytes anchored there), a second one read
    busy, then both gone: two readings say so, and the room is back in full. It came back in two
    steps, first to the bytes of the one read idle, two readings later to the rest: at a sampler of
    half a second, 1.5 s for what one second shows."""
    model = MemoryModel()
    model.add(0.0, 0, 8 * GiB, TOTAL)
    model.add(0.1, 2, 14 * GiB, TOTAL)
    model.add(0.2, 0, 11 * GiB, TOTAL)  # the first neighbour's 3 GiB, read idle
    for i in range(3):
        model.add(0.3 + 0.1 * i, 2, 17 * GiB, TOTAL)
    model.add(0.6, 2, int(18.5 * GiB), TOTAL)  # the second one's 1.5 GiB, read busy
    model.add(0.7, 2, int(18.5 * GiB), TOTAL)
    assert model.estimate().baseline_bytes == 12.5 * GiB  # type: ignore[union-attr]
    model.add(0.8, 2, 14 * GiB, TOTAL)  # both gone
    model.add(0.9, 2, 14 * GiB, TOTAL)
    assert model.estimate().baseline_bytes == 8 * GiB  # type: ignore[union-attr]
    assert model.cap() == 5


def test_the_others_hold_no_more_than_the_card_holds() -> None:
    """A reading below the others' bytes as believed is proof that they hold less: at once."""
    model = MemoryModel()
    model.add(0.0, 0, 8 * GiB, TOTAL)
    model.add(0.1, 1, 11 * GiB, TOTAL)
    model.add(0.2, 2, 20 * GiB, TOTAL)  # 8 GiB more than two requests: a rise
    model.add(0.3, 2, 20 * GiB, TOTAL)  # that lasts: the others hold 14 GiB
    assert model.estimate().baseline_bytes == 14 * GiB  # type: ignore[union-attr]
    model.add(0.4, 1, 9 * GiB, TOTAL)  # less than that in all
    estimate = model.estimate()
    assert estimate is not None and estimate.baseline_bytes == 8 * GiB  # back to what was read idle


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


def test_memory_model_busy_from_the_start_fits_a_line() -> None:
    model = MemoryModel(target_utilisation=0.9)
    for i, in_flight in enumerate([1, 2, 3, 2, 1, 3, 2, 1, 2, 3]):
        model.add(i * 0.1, in_flight, 8 * GiB + in_flight * 3 * GiB, TOTAL)
    assert model.cap() == 4


def test_inputs_that_grow_at_one_level_are_read_as_the_others_rise_then_told_apart() -> None:
    model = MemoryModel()
    model.add(0, 0, 8 * GiB, TOTAL)
    model.add(1, 2, 14 * GiB, TOTAL)
    assert model.cap() == 5
    for i in range(5):  # inputs doubled: each request now holds 6 GiB, seen at one level only
        model.add(2 + i * 0.1, 2, 20 * GiB, TOTAL)
    assert model.cap() == 3  # cautious: as if 6 GiB were the others', where two of 6 GiB fit
    model.add(3, 0, 8 * GiB, TOTAL)  # an idle moment: the others hold what they held
    for i, in_flight in enumerate([1, 2, 1, 2, 1, 2, 1, 2, 1, 2]):  # and in-flight that varies
        model.add(3.1 + i * 0.1, in_flight, 8 * GiB + in_flight * 6 * GiB, TOTAL)
    assert model.estimate().baseline_bytes == 8 * GiB  # type: ignore[union-attr]
    assert model.cap() == 2


def test_an_oom_bars_its_level_only_while_the_card_is_as_tight() -> None:
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c)
    assert c.limit == 5
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=5)  # a neighbour came between two readings
    assert c.limit == 4 and c.describe()["bound"] == "oom"
    c.on_sample(now_s=1.05, sample=MemorySample(23 * GiB, TOTAL), in_flight=3)  # it holds 6 GiB
    c.on_sample(now_s=1.1, sample=MemorySample(23 * GiB, TOTAL), in_flight=3)
    assert c.limit == 3  # what fits beside it
    for i in range(2):  # it left
        c.on_sample(now_s=5.0 + i * 0.1, sample=MemorySample(17 * GiB, TOTAL), in_flight=3)
    assert c.limit == 5 and now_s < 1.0  # as soon as the readings say so, with no timer


def test_an_oom_on_a_card_that_did_not_change_bars_its_level_there() -> None:
    """Five fit by the readings, yet five ran out (fragmentation, a peak the readings miss): five is
    not tried again while the card reads the same, and is once it reads roomier, or the bar's
    memory is over (so that one misread OOM costs one OOM every two minutes, not the level)."""
    c = AIMD()
    bound(c, initial=1)
    learned(c)
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=5)
    for i in range(100):
        c.on_sample(now_s=1.1 + i * 0.1, sample=MemorySample(20 * GiB, TOTAL), in_flight=4)
    assert c.limit == 4
    assert "5 ran out of memory" in c.describe()["why"]
    c.on_sample(now_s=200.0, sample=MemorySample(20 * GiB, TOTAL), in_flight=4)
    assert c.limit == 5


def test_a_bar_the_readings_explain_lifts_as_soon_as_its_level_fits_again() -> None:
    """Five ran out as a neighbour smaller than one request came (2 GiB: room for 4.67 of 3 GiB),
    and the readings after the OOM showed it. When it left, the card had room for 5.33: five fit
    again. The bar waited for a whole request more room than at the OOM, which the neighbour's
    leaving never gives: the limit sat at four for two minutes."""
    c = AIMD()
    bound(c, initial=1)
    learned(c)
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=5)
    for i in range(20):  # 8 + 2 + 4 x 3
        c.on_sample(now_s=1.05 + i * 0.1, sample=MemorySample(22 * GiB, TOTAL), in_flight=4)
    assert c.limit == 4 and c.describe()["oom"]["room_then"] == pytest.approx(14 / 3, abs=0.01)
    for i in range(2):  # it left
        c.on_sample(now_s=5.0 + i * 0.1, sample=MemorySample(20 * GiB, TOTAL), in_flight=4)
    assert c.limit == 5 and c.describe()["oom"] is None


def test_the_ooms_of_one_pile_up_leave_what_fits_and_the_next_reading_reads_what_took_the_room() -> None:
    """A neighbour took the room of five of eight requests between two readings: the readings
    cannot tell its bytes from ours while the five that ran out count as in flight (they hold none),
    only the OOMs can. Each OOM's slot waits for the next reading, so three stay in flight; that
    reading, without the five, shows the neighbour's 10 GiB as the others' rise, and three fit. That
    reading finds the card full: the neighbour may want more, so a slot is held back until one of ours
    has finished and a reading shows its bytes free: the neighbour took no more. (Where each OOM of the
    pile-up stepped the limit down one at a time, it took five limits, and their OOMs, to find three.)"""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, request_gib=2, levels=(1, 2, 4, 7))
    assert c.limit == 8
    epoch = c.epoch
    for failed in range(1, 6):
        c.on_oom(now_s=now_s + 0.05, epoch=epoch, in_flight=8)
        c.after_oom(8.0 - failed)
    assert c.limit == 3 and c.epoch == epoch + 1
    c.on_oom(now_s=now_s + 0.05, epoch=epoch - 1, in_flight=8)  # older than the pile-up: nothing new
    assert c.limit == 3
    c.on_sample(now_s=now_s + 0.1, sample=MemorySample((8 + 10 + 3 * 2) * GiB, TOTAL), in_flight=3)
    assert c.limit == 2 and c.describe()["bound"] == "memory"  # the rise read on a full card
    c.on_sample(now_s=now_s + 0.2, sample=MemorySample((8 + 10 + 3 * 2) * GiB, TOTAL), in_flight=3)
    assert c.limit == 2  # none of ours finished: no bytes freed to tell whether it wants more
    c.on_success(now_s=now_s + 0.25, latency_s=0.2, concurrency=3, demand=True)
    c.on_sample(now_s=now_s + 0.3, sample=MemorySample((8 + 10 + 2 * 2) * GiB, TOTAL), in_flight=2)
    assert c.limit == 3 and c.describe()["bound"] == "memory"  # its 2 GiB stayed free


def test_readings_that_counted_a_failing_request_in_flight_do_not_size_the_others() -> None:
    """Three in flight, and one of them failed to allocate: the reading before its error came
    counts three where two hold the card. Left in the line through the idle readings of the
    worker's restart and the next busy ones, it put a request at 4.5 GiB where 5 are, and the OOM's
    bar at room for 3.9 where 3.2 are. (In a run where three fitted by a hair, the room so misread
    let three in again, and they ran out; that bar then held two for the 15 s after a neighbour
    left, where three fit.)"""
    c = AIMD()
    bound(c, initial=1)
    now_s = 0.0

    def read(in_flight: int, used_gib: float) -> None:
        nonlocal now_s
        now_s += 0.1
        c.on_sample(now_s=now_s, sample=MemorySample(int(used_gib * GiB), TOTAL), in_flight=in_flight)

    for _ in range(10):
        read(0, 8)
    for n in (1, 2, 1, 2):
        read(n, 8 + 5 * n)
        c.on_success(now_s=now_s, latency_s=0.2, concurrency=n, demand=True)
    read(3, 18)
    c.on_oom(now_s=now_s + 0.04, epoch=c.epoch, in_flight=3)
    for _ in range(10):
        read(0, 8)
    for _ in range(3):
        read(2, 18)
    est = c.memory.estimate()
    assert est is not None and est.per_request_bytes == pytest.approx(5 * GiB, rel=0.01)
    assert c.describe()["oom"]["room_then"] == pytest.approx(3.2, abs=0.01)


def test_a_rise_the_own_count_reads_is_the_others_not_a_point_of_the_line() -> None:
    """Nine requests of 1.9 GiB fill a 24 GiB card beside 6 GiB of weights, on a line through many
    levels, and the process's own count agrees with it. A neighbour comes and takes the 0.95 GiB
    left: under half a request, within what a point of the line may stray. By the own count our requests
    hold what they did: the others rose, into a full card, and a slot is held back until the next
    reading (absorbed into the line, the rise was missed, and three requests admitted into the room
    the neighbour took next ran out of memory)."""
    c = AIMD()
    bound(c, initial=1)
    weights, size = 6 * GiB, 1.9 * GiB
    now_s = 0.0

    def read(in_flight: int, extra: float = 0.0) -> None:
        nonlocal now_s
        now_s += 0.1
        own = int(weights + size * in_flight)
        c.on_sample(now_s=now_s, sample=MemorySample(int(own + extra), TOTAL, allocated_bytes=own), in_flight=in_flight)

    read(0)
    for n in [1, 2, 4] + [6, 8, 9, 7, 9, 8, 9, 9] * 5:
        read(n)
    est = c.memory.estimate()
    assert est is not None and est.baseline_bytes == pytest.approx(weights, rel=0.001)
    assert c.limit == 9
    read(9, extra=TOTAL - weights - 9 * size)  # the neighbour took what was left
    est = c.memory.estimate()
    assert est is not None and est.baseline_bytes == pytest.approx(TOTAL - 9 * size, rel=0.001)
    assert c.limit == 8 and c.describe()["bound"] == "memory"


def test_the_budget_is_the_room_the_model_reads_where_the_model_alone_sets_the_limit() -> None:
    """16 GiB of room and 3.5 GiB a slot: 4.57 slots, the limit 4. Requests that weigh fractions of a
    slot (route weights, `cost`) may fill the 4.57. Under an OOM's bar they fill up to under the slots
    that ran out, never to them: the bar is at 4, and 4 did not fit."""
    c = AIMD()
    bound(c, initial=1)
    learned(c, request_gib=3.5, levels=(1, 2, 3, 4))
    assert c.limit == 4 and c.budget == pytest.approx(16 / 3.5)
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=4)
    assert c.limit == 3 and c.budget == pytest.approx(4 - 1 / 64)


def test_under_a_bar_requests_that_weigh_fractions_fill_up_to_under_what_ran_out() -> None:
    """An OOM with 3.5 slots in flight bars 4 (the limit is 3), and says 3.5 did not fit: requests
    that weigh parts of a slot may fill up to under 3.5, not to under 4. Held at the limit instead
    (as before), a mix of routes whose model erred once sat a sixth under the room for two minutes."""
    c = AIMD()
    bound(c, initial=1)
    learned(c, request_gib=3.5, levels=(1, 2, 3, 4))
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=3.5)
    assert c.limit == 3 and c.budget == pytest.approx(3.5 - 1 / 64)
    c.on_oom(now_s=1.1, epoch=c.epoch, in_flight=3.25)  # a tighter one: the least that ran out holds
    assert c.limit == 3 and c.budget == pytest.approx(3.25 - 1 / 64)


def test_a_reading_above_the_line_is_the_others_rise_not_a_point_of_the_line() -> None:
    """Readings at many levels lie on one line (8 GiB of others', 3 GiB a request); a neighbour then
    takes 4 GiB between two readings. Absorbed into the line over the readings from before, the new
    reading tilted it a little at a time and hid the change (in a run at the capacity the limit then
    stayed one below the fit after the neighbour left). Read against the model it is the others'
    rise, believed at once."""
    memory = MemoryModel()
    levels = [1, 3, 5, 2, 4, 5, 3, 1]
    now_s = 0.0
    for i in range(32):
        now_s += 0.1
        memory.add(now_s, levels[i % len(levels)], (8 + 3 * levels[i % len(levels)]) * GiB, TOTAL)
    assert memory.room() == pytest.approx(16 / 3)
    memory.add(now_s + 0.1, 3, (8 + 4 + 3 * 3) * GiB, TOTAL)
    estimate = memory.estimate()
    assert estimate is not None
    assert estimate.baseline_bytes == pytest.approx(12 * GiB, rel=0.01)
    assert estimate.per_request_bytes == pytest.approx(3 * GiB, rel=0.01)


def test_a_card_that_fits_exactly_is_filled_whatever_the_readings_noise() -> None:
    """Three requests of 3 GiB fit beside 15 GiB with nothing to spare. Readings a few MiB off the
    line (a count taken a moment apart from the bytes) gave a spread of sizes, planned for as a
    tail, and estimates a hair short of an exact three: the limit sat at two in real time. One size
    has no tail to plan for, and a hundredth of a request is a fit."""
    memory = MemoryModel()
    memory.add(0.0, 0, 15 * GiB, TOTAL)
    levels = [1, 2, 3, 1, 3, 2, 1, 3]
    for i in range(16):
        n = levels[i % len(levels)]
        noise_bytes = (1 if i % 2 else -1) * 40 * 2**20
        memory.add(0.1 * (i + 1), n, 15 * GiB + n * (3 * GiB - 2**20) + noise_bytes, TOTAL)
    estimate = memory.estimate()
    assert estimate is not None and estimate.spread_bytes > 0 and not memory.is_mix()
    assert memory.room() is not None and memory.room() < 3  # type: ignore[operator]
    assert memory.cap() == 3


def test_a_line_that_puts_the_others_below_the_idle_card_is_no_line() -> None:
    """Readings that caught a request admitted and not yet allocated (it holds nothing) at the low
    levels tilt a line: 3.36 GiB a request beside 6.3 GiB of others, where the card held 8 GiB with
    nothing of ours in flight. Our own weights are in those 8 GiB: the others hold no less, and the
    line is refused. (In real time the tilted model left two of the three that fit beside a
    neighbour.)"""
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, TOTAL)
    levels = [1, 2, 3, 4, 5, 5, 5, 5]
    for i in range(32):
        n = levels[i % len(levels)]
        hollow = 1 if n <= 2 and (i // len(levels)) % 2 == 0 else 0
        memory.add(0.1 * (i + 1), n, int((8 + 3 * (n - hollow)) * GiB), TOTAL)
    estimate = memory.estimate()
    assert estimate is not None
    assert estimate.baseline_bytes == pytest.approx(8 * GiB, rel=0.02)
    assert estimate.per_request_bytes == pytest.approx(3 * GiB, rel=0.05)


def test_a_swallowed_oom_is_weaker_evidence() -> None:
    c = AIMD()
    bound(c, initial=1)
    learned(c)
    c.on_swallowed_oom(now_s=1.0, epoch=None, in_flight=5)
    assert c.limit == 4
    c.on_sample(now_s=20.0, sample=MemorySample(20 * GiB, TOTAL), in_flight=4)
    assert c.limit == 5  # forgotten after seconds, not minutes


def test_each_oom_keeps_the_state_it_happened_in() -> None:
    """Found in review: the hold kept one room for all its OOMs, the latest's. Seven ran out with the
    card as it is; then six ran out beside a neighbour. When the neighbour left, the card was as at
    the first OOM, yet seven was tried again, because only the second OOM's state was remembered."""
    c = AIMD()
    bound(c, initial=1)
    learned(c, request_gib=2, levels=(1, 2, 4, 7))
    assert c.limit == 8
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=8)  # eight do not fit after all
    c.on_sample(now_s=1.05, sample=MemorySample(22 * GiB, TOTAL), in_flight=7)  # the card as it is
    assert c.limit == 7
    c.on_oom(now_s=2.0, epoch=c.epoch, in_flight=7)  # a neighbour of 6 GiB came
    c.on_sample(now_s=2.05, sample=MemorySample(24 * GiB, TOTAL), in_flight=5)
    c.on_success(now_s=2.07, latency_s=0.1, concurrency=5, demand=True)  # a slot held back till one finished
    c.on_sample(now_s=2.1, sample=MemorySample(22 * GiB, TOTAL), in_flight=4)  # its bytes stayed free
    assert c.limit == 5  # ten GiB of room beside it: five fit, exactly
    for i in range(2):  # it left: the card is as it was at the first OOM
        c.on_sample(now_s=3.0 + i * 0.1, sample=MemorySample(16 * GiB, TOTAL), in_flight=4)
    assert c.limit == 7  # seven fit again; eight ran out in this very state


def test_an_allocation_larger_than_the_card_holds_beside_the_others_is_too_large() -> None:
    c = AIMD()
    bound(c, initial=1)
    learned(c)
    assert c.allocation_failed(20 * GiB, 1)  # 16 GiB of room on an empty card
    assert not c.allocation_failed(3 * GiB, 1)


def test_an_allocation_beyond_one_size_says_the_inputs_grew() -> None:
    """Requests of one size for a while, then an OOM that names 6 GiB: a request now holds 6 GiB,
    believed before any reading shows it, and no level is barred for it (the model explains it)."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, levels=(1, 2, 4) + (5,) * 12)
    assert c.limit == 5
    assert not c.allocation_failed(6 * GiB, 1)
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=5)
    assert c.limit == 2 and c.describe()["oom"] is None


def test_an_allocation_a_light_request_names_beyond_what_any_slot_could_hold_teaches_no_size() -> None:
    """A request weighed at a sixteenth of a slot (a route weight fitted on a reading of its requests
    holding nothing) names 12 GiB: read as the inputs that grew, a slot would hold 192 GiB and none
    fit, and the limit sat at one for seconds until readings brought the size down. The weight is
    what is wrong: the level that ran out is barred, and the size stays."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, levels=(1, 2, 4) + (5,) * 12)
    assert not c.allocation_failed(12 * GiB, 1 / 16)  # it fits on the empty card: not too large
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=5)
    assert c.memory.estimate().per_request_bytes == pytest.approx(3 * GiB, rel=0.01)  # type: ignore[union-attr]
    assert c.limit == 4


def test_inputs_that_grew_read_as_sizes_that_shrank_in_steps_are_believed_from_the_size_an_oom_names() -> None:
    """Inputs grew from 3 to 12 GiB. The larger requests fail before they allocate and hold nothing,
    so the readings say the sizes shrank, a step every two readings. The size the first OOM names is
    well beyond the size from before the first step: inputs grew, believed at once. It was taken
    for a request left from before (a second step had forgotten that size), and, with 20 readings a
    second and requests of a second, a dozen more ran out of memory."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, levels=(1, 2, 4) + (5,) * 12)
    for held in (4, 4, 3, 3, 2, 2):  # of the five in flight, only so many hold their 3 GiB
        now_s += 0.05
        c.oldest_in_flight(now_s - 1.0)
        c.on_sample(now_s=now_s, sample=MemorySample((8 + 3 * held) * GiB, TOTAL), in_flight=5)
    assert not c.allocation_failed(12 * GiB, 1)
    c.on_oom(now_s=now_s + 0.01, epoch=c.epoch, in_flight=5)
    assert c.memory.estimate().per_request_bytes == 12 * GiB  # type: ignore[union-attr]
    assert c.limit == 1


def test_a_size_an_oom_named_holds_until_the_requests_read_arrived_after_it() -> None:
    """Inputs grew from 3 to 6 GiB while requests of 3 waited in the line. After the OOM that named
    6 GiB the line still serves them: their readings (2 x 3 GiB) say nothing of the new sizes, and
    taken for a shrink they raised the limit back to five, where the next requests of 6 ran out
    again (nine OOMs in ten seconds in real time). Once every request in flight arrived after the
    OOM, the readings describe the new sizes, and a shrink they show is believed."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, levels=(1, 2, 4) + (5,) * 12)
    assert not c.allocation_failed(6 * GiB, 1)
    oom_s = now_s + 0.05
    c.on_oom(now_s=oom_s, epoch=c.epoch, in_flight=5)
    assert c.limit == 2
    for i in range(20):  # two requests of 3 GiB that arrived before the OOM
        c.oldest_in_flight(oom_s - 1.0)
        c.on_sample(now_s=oom_s + 0.1 * (i + 1), sample=MemorySample(14 * GiB, TOTAL), in_flight=2)
        assert c.limit == 2
    now_s = oom_s + 2.1
    c.oldest_in_flight(oom_s + 0.5)  # the first reading of requests that came after it: of 6 GiB
    c.on_sample(now_s=now_s, sample=MemorySample(20 * GiB, TOTAL), in_flight=2)
    assert c.limit == 2 and c.describe()["memory_model"]["per_request_bytes"] == 6 * GiB
    for i in range(40):  # the new requests shrink to 3 GiB: believed, the level comes back
        c.oldest_in_flight(now_s)
        c.on_sample(now_s=now_s + 0.1 * (i + 1), sample=MemorySample(14 * GiB, TOTAL), in_flight=2)
    assert c.limit == 5


def test_without_requests_in_flight_a_size_an_oom_named_holds_as_any_other() -> None:
    """Nothing in flight is nothing from before the OOM: the size it named is the model's, and the
    readings move it as they move any."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, levels=(1, 2, 4) + (5,) * 12)
    assert not c.allocation_failed(6 * GiB, 1)
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=5)
    c.oldest_in_flight(None)
    c.on_sample(now_s=now_s + 0.1, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    assert c.memory.estimate() is not None and c.memory.estimate().per_request_bytes == 6 * GiB  # type: ignore[union-attr]
    assert c.limit == 2


def test_inputs_that_grow_read_first_as_the_others_rise_are_learnt_from_the_oom_that_follows() -> None:
    """Requests of 3 GiB for a while; then they grow to 6 GiB, and the first readings take the extra
    bytes for the others' (a change of the card, not yet of the sizes). The OOM that follows names
    6 GiB: sizes grew, believed at once, where it used to wait for ten readings of the changed card
    and three more levels ran out meanwhile."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, levels=(1, 2, 3) + (4,) * 12)
    for used_gib in (23, 24):  # one of four grew to 6 GiB, then the card is full: read as the others' rise
        now_s += 0.1
        c.on_sample(now_s=now_s, sample=MemorySample(used_gib * GiB, TOTAL), in_flight=4)
    assert not c.allocation_failed(6 * GiB, 1)
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=5)
    assert c.describe()["memory_model"]["per_request_bytes"] == 6 * GiB
    assert c.limit <= 2


def _after_an_oom_named_9_gib() -> tuple[MemoryModel, float]:
    """`_steady_on_own_count` (3 GiB requests), then an OOM that named 9 GiB, taken for inputs that
    grew. The model, and the time of its last reading."""
    memory = MemoryModel()
    now_s = _steady_on_own_count(memory, own_moves=True)
    assert memory.learn_size(9 * GiB, 1, now_s + 0.01)
    return memory, now_s


def test_a_size_an_oom_named_gives_way_to_the_readings_when_the_routes_get_weights() -> None:
    """Requests read at 3 GiB, and an OOM names 9 GiB: taken for inputs that grew, a request holds 9
    from now on. But it was one request of a large route, and when the routes get their weights a slot
    means the mean request again: kept, 9 GiB a slot left room for none where five fit (a mix of
    routes held at one request for 2.5 s). The readings' size from before the OOM comes back; where
    readings since showed the new size, it stays."""
    named, _ = _after_an_oom_named_9_gib()
    assert named.cap() == 1
    named.units_changed()
    estimate = named.estimate()
    assert estimate is not None and estimate.per_request_bytes == pytest.approx(3 * GiB)
    assert named.cap() == 5
    read, now_s = _after_an_oom_named_9_gib()
    for i in range(3):  # one request in flight, holding the 9 GiB the OOM named
        read.add(now_s + 0.1 * (i + 1), 1, 17 * GiB, TOTAL, own_bytes=15 * GiB)
    read.units_changed()
    estimate = read.estimate()
    assert estimate is not None and estimate.per_request_bytes == pytest.approx(9 * GiB)


def test_inputs_that_grow_among_many_in_flight_are_learnt_from_the_oom_though_the_readings_look_like_a_mix() -> None:
    """Thirty-two requests of 0.67 GiB run on a 48 GiB card; inputs grow to 1.51 GiB. The next reading
    catches six new ones among the old, and the process's own count says the extra bytes are ours: read
    as one mean of 32 requests, 0.83 GiB each, a spread appears at once that makes them a mix. An OOM
    naming 1.51 GiB then said nothing new ("a mix's large one"), and 55 more followed over 0.3 s before
    the readings settled (`--family many`, a held-out draw). One size until the last readings: the
    spread is the larger ones among the old, and the OOM says the inputs grew."""
    memory = MemoryModel()
    total, others = 48 * GiB, int(21.08 * GiB)
    memory.add(0.0, 0, others, total, own_bytes=others)
    now_s = 0.0
    for i in range(24):
        now_s += 0.1
        n = [32, 32, 31, 32, 30, 32, 32, 31][i % 8]
        used = others + int(n * 0.67 * GiB)
        memory.add(now_s, n, used, total, own_bytes=used)
    assert not memory.is_mix()
    now_s += 0.1
    grown = others + int((26 * 0.67 + 6 * 1.51) * GiB)
    memory.add(now_s, 32, grown, total, own_bytes=grown)
    assert memory.is_mix()  # what the reading looks like
    assert memory.learn_size(1.51 * GiB, 1, now_s + 0.01)
    estimate = memory.estimate()
    assert estimate is not None and estimate.per_request_bytes == pytest.approx(1.51 * GiB)
    assert memory.cap() <= 17  # (48 - 21.08) / 1.51; 32 where the OOM taught nothing


def test_soon_after_sizes_shrank_a_size_beyond_the_one_from_before_is_believed() -> None:
    """Requests of 6 GiB, then two readings say they hold 3 (sizes shrank, or requests that grew and
    ran out hold nothing: the readings cannot tell). An OOM naming 6 GiB soon after is one left from
    before, no news; one naming 12 GiB is beyond any size from before: inputs grew, believed at once.
    Ignored for ten readings (as a size soon after a change was), 65 OOMs followed at 14 in flight."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, request_gib=6, levels=(1, 2) + (2,) * 12)
    assert c.limit == 2
    for _ in range(2):
        now_s += 0.1
        c.on_sample(now_s=now_s, sample=MemorySample(14 * GiB, TOTAL), in_flight=2)
    shrunk = c.describe()["memory_model"]["per_request_bytes"]
    assert shrunk < 6 * GiB
    assert not c.allocation_failed(6 * GiB, 1)
    c.on_oom(now_s=now_s + 0.02, epoch=c.epoch, in_flight=2)
    assert c.describe()["memory_model"]["per_request_bytes"] == shrunk  # a request from before
    assert not c.allocation_failed(12 * GiB, 1)
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=2)
    assert c.describe()["memory_model"]["per_request_bytes"] == 12 * GiB
    assert c.limit == 1


def shrunk_a_step(c: AIMD, now_s: float) -> float:
    """Requests of 6 GiB, two of which fit, then two readings of two that hold 3 GiB each, which
    arrived just before them: the model takes a first step down. The time after them."""
    for _ in range(2):
        now_s += 0.1
        c.oldest_in_flight(now_s - 0.05)
        c.on_sample(now_s=now_s, sample=MemorySample(14 * GiB, TOTAL), in_flight=2)
    return now_s


def test_a_shrink_read_in_steps_weighs_the_line_at_the_size_its_first_step_came_from() -> None:
    """Inputs shrink from 6 GiB to 3; the model's size comes down a step at a time, and the sizes
    may hold between two steps for longer than it takes to call them settled. The requests that
    joined the line before the first step are of 6 GiB all the while: a later step that took the
    size between steps for the one from before weighed them 1.15 slots where they hold 1.37, and in
    `shrink` at twice the capacity one of them, let in among the new ones, ran out."""
    c = AIMD()
    bound(c, initial=1)
    now_s = shrunk_a_step(c, learned(c, request_gib=6, levels=(1, 2) + (2,) * 12))
    first = c.heavier_before()
    assert first is not None
    per_request = c.describe()["memory_model"]["per_request_bytes"]
    assert first[1] == pytest.approx(6 * GiB / per_request)
    for _ in range(12):  # the size between steps holds for longer than ten readings
        now_s += 0.1
        c.oldest_in_flight(now_s - 0.05)
        c.on_sample(now_s=now_s, sample=MemorySample(int((8 + 2 * per_request / GiB + 0.1) * GiB), TOTAL), in_flight=2)
    assert c.heavier_before() == first
    shrunk_a_step(c, now_s)
    later = c.heavier_before()
    assert later is not None and c.describe()["memory_model"]["per_request_bytes"] < per_request
    assert later[0] == first[0]
    assert later[1] == pytest.approx(6 * GiB / c.describe()["memory_model"]["per_request_bytes"], rel=0.01)


def test_a_shrink_the_next_pair_of_readings_confirms_is_believed_whole() -> None:
    """Inputs shrink from 6 GiB to 1. Two readings in a row take a first step, a quarter of the way
    (two may be slots caught between a request's admission and its allocation); the next two, which
    say the same, the rest. A quarter at a time, inputs that shrank to a seventh took seven seconds
    to be believed, and the gate served 0.92 of the reader. A pair that a reading at the old size
    interrupts is a first step again."""

    def read(c: AIMD, now_s: float, size_gib: float) -> float:
        now_s += 0.1
        c.oldest_in_flight(now_s - 0.05)
        c.on_sample(now_s=now_s, sample=MemorySample(int((8 + 2 * size_gib) * GiB), TOTAL), in_flight=2)
        return now_s

    def per_request_gib(c: AIMD) -> float:
        return float(c.describe()["memory_model"]["per_request_bytes"] / GiB)

    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, request_gib=6, levels=(1, 2) + (2,) * 12)
    for _ in range(2):
        now_s = read(c, now_s, 1)
    assert per_request_gib(c) == pytest.approx(6 - 5 / 4)
    for _ in range(2):
        now_s = read(c, now_s, 1)
    assert per_request_gib(c) == pytest.approx(1)
    assert c.memory.cap() == 16

    interrupted = AIMD()
    bound(interrupted, initial=1)
    now_s = learned(interrupted, request_gib=6, levels=(1, 2) + (2,) * 12)
    for size_gib in (1, 1, 6, 1, 1):
        now_s = read(interrupted, now_s, size_gib)
    assert per_request_gib(interrupted) > 3

    # Nor while a request that arrived before the first step runs: it was let in at a weight of the
    # size between steps, and taken whole, the limit let others in beside it (in real time, OOMs).
    old_runs = AIMD()
    bound(old_runs, initial=1)
    now_s = learned(old_runs, request_gib=6, levels=(1, 2) + (2,) * 12)
    first_s = now_s
    for _ in range(2):
        now_s = read(old_runs, now_s, 1)
    for _ in range(2):
        now_s += 0.1
        old_runs.oldest_in_flight(first_s - 1.0)
        old_runs.on_sample(now_s=now_s, sample=MemorySample(10 * GiB, TOTAL), in_flight=2)
    assert per_request_gib(old_runs) > 3


def misread_shrink(c: AIMD) -> float:
    """Five requests of 3 GiB beside 8 GiB of others (five fit), then readings that catch one and two of
    them not allocated yet, two pairs in a row: the model takes them for a shrink to 2.4 GiB (cap 6).
    The time after them."""
    now_s = learned(c, request_gib=3, levels=(1, 2, 4, 5) + (5,) * 12)
    assert c.memory.cap() == 5
    for used_gib in (20, 20, 20, 20, 17):
        now_s += 0.1
        c.oldest_in_flight(now_s - 0.05)
        c.on_sample(now_s=now_s, sample=MemorySample(used_gib * GiB, TOTAL), in_flight=5)
    assert c.memory.cap() == 6
    return now_s


def oom_of_the_size_before(c: AIMD, *, oldest_s: float | None = None) -> float:
    """`misread_shrink`, then an OOM of one of the six let in, asking for 3 GiB, the size from before
    (the oldest in flight arrived at `oldest_s`, where given). The time of the OOM."""
    bound(c, initial=1)
    now_s = misread_shrink(c) + 0.01
    if oldest_s is not None:
        c.oldest_in_flight(oldest_s)
    assert not c.allocation_failed(3 * GiB, 1)
    c.on_oom(now_s=now_s, epoch=c.epoch, in_flight=6)
    return now_s


def test_a_shrink_is_taken_at_the_most_cautious_reading_of_its_pair() -> None:
    """Five requests of 3 GiB fit beside 8 GiB of others (5.3 in 16 GiB of room). Readings catch one
    of them not allocated yet (20 GiB where 23), and the model takes a first step; then one and two
    of them (20, 17), and the step is taken whole. At the newest reading, that is 1.8 GiB a
    request, and eight were let in where five fit (`late-start` with 32 clients on virtual time,
    arrivals of seed 8: two OOMs where the reader has none); at the most cautious of the pair, 2.4,
    as a pair of readings is believed at the most cautious of them."""
    c = AIMD()
    bound(c, initial=1)
    misread_shrink(c)  # five fit (cap 5), then those readings
    assert c.describe()["memory_model"]["per_request_bytes"] == pytest.approx(2.4 * GiB)
    assert c.memory.cap() == 6


def test_an_oom_soon_after_a_shrink_that_asks_for_less_than_the_size_before_is_the_size_it_shrank_to() -> None:
    """Inputs shrink from 6 GiB to 2, each allocating late: the readings of the change, two in flight, catch
    one of them allocated and read a shrink to 1 GiB, sixteen where eight fit. One runs out asking for 2 GiB
    at once, less than the size before: the shrink was to that. Ignored as long as the sizes had not settled
    since the change, it let the next ones in at 1 GiB too (`--family late`, seed 7059: 55 OOMs in a minute
    where 12)."""

    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, request_gib=6, levels=(1, 2) + (2,) * 12)
    for _ in range(4):
        now_s += 0.1
        c.oldest_in_flight(now_s - 0.05)
        c.on_sample(now_s=now_s, sample=MemorySample(int((8 + 2 * 1) * GiB), TOTAL), in_flight=2)
    assert c.memory.cap() == 16
    assert not c.allocation_failed(2 * GiB, 1)
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=2)
    assert c.describe()["memory_model"]["per_request_bytes"] == pytest.approx(2 * GiB)
    assert c.memory.cap() == 8


def test_an_oom_that_asks_for_the_size_from_before_a_shrink_undoes_it() -> None:
    """After a shrink misread as above, six are let in; one of them, which arrived after the first
    step (by the model of the new size), runs out asking for 3 GiB, the size from before. The shrink
    was readings of requests not allocated yet: the size goes back to 3 GiB, and five fit (in a run
    of `late-start` with 32 clients in real time, the model kept 2.4, went on to read the requests
    as a mix, where an OOM bars no level, and ran out three times)."""
    c = AIMD()
    oom_of_the_size_before(c)
    assert c.describe()["memory_model"]["per_request_bytes"] == pytest.approx(3 * GiB)
    assert c.memory.cap() == 5 and c.heavier_before() is None


def test_after_a_shrink_was_misread_readings_of_whole_requests_are_not_taken_for_another() -> None:
    """After the OOM above, the same readings again (one and then two of five not allocated): the
    size stays 3 GiB. Taken for a shrink each time, requests that decode for three times their work
    on the card went round misread shrink, OOM, undo every second or two (`decode-first` with 32
    clients, four runs of 30 s: 0.75 of the reader and 32 OOMs, where 0.94 and 7)."""
    c = AIMD()
    now_s = oom_of_the_size_before(c)
    for used_gib in (8, 20, 20, 20, 20, 17, 17, 14):
        now_s += 0.1
        c.oldest_in_flight(now_s - 0.05)
        c.on_sample(now_s=now_s, sample=MemorySample(used_gib * GiB, TOTAL), in_flight=5)
    assert c.describe()["memory_model"]["per_request_bytes"] == pytest.approx(3 * GiB)
    assert c.memory.cap() == 5


def test_an_oom_of_a_request_from_before_a_shrink_leaves_it() -> None:
    """The same OOM, where a request that arrived before the first step may still run (the oldest in
    flight arrived before it): that request is of the size from before, and says nothing of the new."""
    c = AIMD()
    oom_of_the_size_before(c, oldest_s=0.0)
    assert c.describe()["memory_model"]["per_request_bytes"] == pytest.approx(2.4 * GiB, rel=0.02)
    assert c.heavier_before() is not None


def test_no_line_is_drawn_through_readings_of_a_request_from_before_the_sizes_shrank() -> None:
    """After the sizes shrank from 6 GiB to 3, one request of 6 that joined the line before runs
    beside two, three or four of the new ones. A line through those readings puts the others at
    11 GiB and a request at 3 (8 and 3 are, and one of 6): in `shrink` one such line let six in
    where five fit. The model keeps the others' bytes read idle until no request from before runs,
    also once the readings from before the shrink have left the window a line looks over."""
    c = AIMD()
    bound(c, initial=1)
    now_s = shrunk_a_step(c, learned(c, request_gib=6, levels=(1, 2) + (2,) * 12))
    shrunk = c.heavier_before()
    assert shrunk is not None
    for n in [2, 3, 4, 3] * 10:
        now_s += 0.1
        c.oldest_in_flight(shrunk[0] - 1.0)
        c.on_sample(now_s=now_s, sample=MemorySample((14 + 3 * (n - 1)) * GiB, TOTAL), in_flight=n)
        assert c.describe()["memory_model"]["baseline_bytes"] == 8 * GiB


def test_a_request_read_at_the_new_size_that_arrived_before_the_shrink_was_read_moves_its_time_back() -> None:
    """Sizes shrink from 6 GiB to 1; the first requests read at 1 arrived at the time the line is
    weighed from (`heavier_before`). Those that joined before it may be of 6 and weigh six slots each,
    so they run one at a time. When one of them runs and a reading shows it holding the new size (the
    size from before alone is more than all in flight hold), it arrived after the sizes shrank, and so
    did every request that joined after it. With a line of ten such requests, a closed loop ran one at
    a time for two seconds where twelve fit (`--family many`, seed 120024: 0.93 of the reader). Not
    where it holds the old size (read as the others' rise, it reads as one of the new size beside
    them: told apart by the least the card held idle), nor where it may not have allocated yet (the
    others hold the new size and it nothing)."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, request_gib=6, levels=(1, 2) + (2,) * 12)

    def read(n: float, held_gib: float, oldest_s: float) -> None:
        nonlocal now_s
        now_s += 0.1
        c.oldest_in_flight(oldest_s)
        c.on_sample(now_s=now_s, sample=MemorySample(int((8 + held_gib) * GiB), TOTAL), in_flight=n)

    for _ in range(4):
        read(2, 2, now_s - 0.05)
    shrunk = c.heavier_before()
    assert shrunk is not None and shrunk[1] > 5  # the size taken whole: one from before weighs six
    for _ in range(3):  # one from before, of the old size: read as the others' rise, then as itself
        read(1, 6, shrunk[0] - 1.0)
    read(2, 1, shrunk[0] - 0.8)  # one from before, not allocated yet, beside one of the new size
    assert c.heavier_before() == shrunk
    read(1, 1, shrunk[0] - 0.5)  # one from before, at the new size
    moved = c.heavier_before()
    assert moved is not None and moved[0] == shrunk[0] - 0.5 and moved[1] == shrunk[1]


def test_readings_of_whole_numbers_of_a_size_an_oom_named_lately_are_no_shrink() -> None:
    """Requests of 2.5 GiB that allocate late read at less in the first seconds (a reading catches
    two of five allocated), and the model held them at 2.2; an OOM named 2.5, the model did not take it
    (the readings spread as a mix's). Then two readings of five in flight holding two and three of 2.5
    GiB are requests caught before they allocate, as where the model holds that size: no shrink. Taken
    for one, the size went to 1 GiB, and fourteen were let in where five fit (`--family late`, seed
    120043). A pair not whole in it is a shrink still."""

    def run(held_gib: tuple[float, float]) -> float:
        c = AIMD()
        bound(c, initial=1)
        now_s = learned(c, request_gib=2.2, levels=(1, 2, 4, 5))
        for held in (10.0, 11.0, 12.0) * 6:  # the readings spread (the size 2.2, give or take 0.2)
            now_s += 0.1
            c.on_sample(now_s=now_s, sample=MemorySample(int((8 + held) * GiB), TOTAL), in_flight=5)
        per_request = c.describe()["memory_model"]["per_request_bytes"]
        assert not c.allocation_failed(2.5 * GiB, 1)  # within three spreads of the mean: not taken
        c.on_oom(now_s=now_s, epoch=c.epoch, in_flight=5)
        assert c.describe()["memory_model"]["per_request_bytes"] == per_request
        for held in held_gib:
            now_s += 0.1
            c.on_sample(now_s=now_s, sample=MemorySample(int((8 + held) * GiB), TOTAL), in_flight=5)
        return c.describe()["memory_model"]["per_request_bytes"] / per_request

    assert run((5.0, 7.5)) == 1.0
    assert run((4.4, 4.4)) < 1.0


def test_a_pair_that_catches_one_request_fewer_allocated_than_the_readings_just_before_is_no_shrink() -> None:
    """Nine requests of 2.5 GiB in flight that allocate late: the readings catch eight of them allocated, or
    seven, never nine, and then a pair catches seven. No reading showed nine at their size, but one just
    before held a request's worth more at the pair's share: requests caught before they allocate, not a
    shrink. Taken for one, the size came down a step and a tenth was let in where nine fit (`--family
    late`, seed 50)."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, others_gib=1.0, request_gib=2.5, levels=(1, 2, 4, 8))
    c.on_success(now_s=now_s, latency_s=0.25, concurrency=8, demand=True)

    def read(allocated: int) -> None:
        nonlocal now_s
        now_s += 0.1
        c.on_sample(now_s=now_s, sample=MemorySample(int((1.0 + 2.5 * allocated) * GiB), TOTAL), in_flight=9)

    for allocated in (8, 8, 7, 8):
        read(allocated)
    assert c.describe()["memory_model"]["per_request_bytes"] == pytest.approx(2.5 * GiB, rel=1e-3)
    read(7)
    read(7)
    assert c.describe()["memory_model"]["per_request_bytes"] == pytest.approx(2.5 * GiB, rel=1e-3)
    assert c.memory.cap() == 9


def test_a_shrink_after_the_sizes_grew_back_is_another_shrink() -> None:
    """Sizes shrink from 6 GiB to 3, grow back to 5 (read from the readings: no OOM tells it), and
    shrink to 2.5. The second shrink is no later step of the first: requests that joined the line
    after the first are of 5 GiB, and weigh two slots of the new size. Kept from the first shrink,
    the record weighed them one, and the size from before was 6."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, request_gib=6, levels=(1, 2) + (2,) * 12)

    def read(n: int, size_gib: float) -> None:
        nonlocal now_s
        now_s += 0.1
        c.oldest_in_flight(now_s - 0.05)
        c.on_sample(now_s=now_s, sample=MemorySample(int((8 + n * size_gib) * GiB), TOTAL), in_flight=n)

    for n in [2, 3, 4, 3, 2, 4] * 6:
        read(n, 3)
    first = c.heavier_before()
    assert first is not None
    for n in [1, 2, 1, 2, 1, 2, 2, 1] * 5:
        read(n, 5)
    grown_s = now_s
    now_s += 5.0
    for n in [2, 3, 4, 3, 2, 4] * 4:
        read(n, 2.5)
    second = c.heavier_before()
    assert second is not None and second[0] > grown_s  # a request that joined while they were 5 GiB
    assert second[1] == pytest.approx(2.0, rel=0.05)


def test_slots_caught_between_admission_and_allocation_are_no_shrink_but_a_shrink_still_is() -> None:
    """Five 3 GiB requests at the fit; in real time, with 30 ms requests, a reading every second or so
    catches one of the slots between a request's admission and its allocation, sometimes two readings
    in a row. Taken for requests that shrank, each such pair brought the size down a step and the
    limit up one: nine ran where five fit. Readings that show none at the old size for a while are a
    shrink, and believed."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, levels=(1, 2, 4, 5, 5, 5))
    successes(c, 5, now_s=now_s, latency_s=0.03)  # three readings to a request's time
    assert c.limit == 5
    for used_gib in [23, 23, 23, 20, 20] * 12:  # one of the five caught unallocated, two readings in a row
        now_s += 0.01
        c.on_sample(now_s=now_s, sample=MemorySample(used_gib * GiB, TOTAL), in_flight=5)
        assert c.limit == 5
    assert c.describe()["memory_model"]["per_request_bytes"] == 3 * GiB  # read as shrinks: 2.8 GiB by now
    for _ in range(RELIEF_READINGS + 6):  # 2 GiB each, at every reading for two requests' times
        now_s += 0.01
        c.on_sample(now_s=now_s, sample=MemorySample(18 * GiB, TOTAL), in_flight=5)
    assert c.describe()["memory_model"]["per_request_bytes"] < 3 * GiB and c.limit > 5


def test_inputs_that_grow_a_fifth_are_learnt_from_the_oom_whatever_spread_their_first_readings_made() -> None:
    """Twelve requests of 1 GiB for a while, read by the process's own count; then they grow to 1.2 GiB,
    and two readings catch some of each size: the own count says ours hold more than the model, and
    their spread (all requests moved together) passes for three times the growth. The OOM that follows
    names 1.2 GiB, more than any reading showed a request holding: the inputs grew. Taken for a level
    that did not fit, the size stayed at 1 GiB; on a card that holds 37, each idle spell after an
    OOM's crash brought the limit back to the old fit, and the next requests ran out again."""
    c = AIMD()
    bound(c, initial=1)

    def read(now_s: float, used_gib: float, in_flight: int) -> None:
        used = int(used_gib * GiB)
        c.on_sample(now_s=now_s, sample=MemorySample(used, TOTAL, allocated_bytes=used), in_flight=in_flight)

    read(0.0, 8, 0)
    now_s = 0.0
    for n in (1, 2, 4, 8) + (12,) * 20:
        now_s += 0.1
        read(now_s, 8 + n, n)
    assert c.describe()["memory_model"]["per_request_bytes"] == GiB
    for grown in (6, 10):  # of the twelve in flight, so many hold 1.2 GiB
        now_s += 0.1
        read(now_s, 8 + (12 - grown) + 1.2 * grown, 12)
    assert not c.allocation_failed(1.2 * GiB, 1)
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=12)
    assert c.describe()["memory_model"]["per_request_bytes"] == pytest.approx(1.2 * GiB)
    for _ in range(20):  # the crash: nothing in flight, and the size stays what the OOM named
        now_s += 0.1
        read(now_s, 8, 0)
    assert c.describe()["memory_model"]["per_request_bytes"] == pytest.approx(1.2 * GiB)
    for n in (1, 2, 4, 8) + (11,) * 20:
        now_s += 0.1
        read(now_s, 8 + 1.2 * n, n)
    assert c.memory.cap() == 13  # floor(16 / 1.2), not the 16 of before


def test_a_large_request_left_from_before_the_sizes_shrank_bars_its_level_briefly() -> None:
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c)
    assert not c.allocation_failed(6 * GiB, 1)  # too few readings since the card changed: a stray
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=5)  # 4 x 3 + 6 > 16, 5 x 3 is not
    assert c.limit == 4  # weak evidence: kept for seconds, not minutes
    c.on_sample(now_s=now_s + 20, sample=MemorySample(23 * GiB, TOTAL), in_flight=5)
    assert c.limit == 5 and c.describe()["oom"] is None


def test_a_request_a_little_larger_than_the_model_says_bars_its_level_as_any_oom() -> None:
    """The model has 3.15 GiB a request where requests hold 3.5 (readings caught some not yet
    allocated). Five ran out of memory, and the OOM named 3.5 GiB: four at the model's size and one of
    3.5 overflow the room where five fit by the model. Within a mix's spread of the mean, that is no
    large request left from before the sizes shrank: it says the model is short, and bars five as any
    OOM does. Taken for a stray, the bar lasted seconds, five were tried again and again, and with a
    crash per OOM the gate served 0.76 of the reader (`late-start`)."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, request_gib=3.15)
    assert c.limit == 5
    assert not c.allocation_failed(3.5 * GiB, 1)
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=5)
    assert c.limit == 4
    c.on_sample(now_s=now_s + 20, sample=MemorySample(int(23.75 * GiB), TOTAL), in_flight=5)
    assert c.limit == 4 and c.describe()["bound"] == "oom"


def a_mix(total_bytes: int) -> AIMD:
    """An `AIMD` that read three seconds of two requests at a time, of 1.5 or 6 GiB, beside 8 GiB of others'
    bytes on a card of `total_bytes`: sizes it cannot tell apart (a mix)."""
    c = AIMD()
    bound(c, initial=1)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, total_bytes), in_flight=0)
    sums_gib = [3, 7.5, 12, 4.5, 9, 7.5, 3, 12, 7.5, 4.5]  # two requests each time
    for i, used_gib in enumerate(sums_gib * 3):
        c.on_sample(now_s=0.1 * (i + 1), sample=MemorySample(int((8 + used_gib) * GiB), total_bytes), in_flight=2)
    assert c.memory.is_mix()
    return c


def test_a_mix_learns_how_heavy_a_tail_to_plan_for_from_its_ooms() -> None:
    """Sizes the gate cannot tell apart (1.5 GiB and 6 GiB): an OOM there is their large ones
    meeting. It bars no level; it makes the cap plan for a heavier tail, which successes relax."""
    c = a_mix(TOTAL)
    before, z = c.memory.cap(), c.memory.z
    for _ in range(8):
        c.on_oom(now_s=4.0, epoch=c.epoch, in_flight=4)
    assert c.memory.z > z and c.describe()["oom"] is None
    heavier = c.memory.cap()
    assert heavier is not None and before is not None and heavier < before
    successes(c, 2000, now_s=5.0)
    assert c.memory.z == 1.0 and c.memory.cap() == before


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
    # With the same bounds too: a second gate, or a second simulation, started from what the first learnt
    # (a run of a tuning loop read the card through 51 readings of the run before it) and fed it its own.
    with pytest.raises(RuntimeError, match=r"carries what it learnt there: give each its own, controller=AIMD\(\)"):
        bound(c, max_limit=8)
    phases = [Phase(0.0, 20, GiB, 0.05)]
    tuned = AIMD()
    simulate(phases, total_bytes=8 * GiB, baseline_bytes=0, duration_s=1.0, controller=tuned)
    with pytest.raises(RuntimeError, match="or an earlier simulate run"):
        simulate(phases, total_bytes=8 * GiB, baseline_bytes=0, duration_s=1.0, controller=tuned)
    fixed = Fixed(3)  # nothing learnt: a fixed limit may be reused
    bound(fixed, max_limit=8)
    bound(fixed, max_limit=8)
    assert fixed.limit == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"oom_backoff": 1.0}, "oom_backoff"),
        ({"increase_step": 0}, "increase_step"),
        ({"oom_hold_s": 700}, "oom_hold_s"),
        ({"oom_hold_s": -1}, "oom_hold_s"),
    ],
)
def test_bad_knobs(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AIMD(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"oom_hold_s": "30"}, "oom_hold_s must be a number of seconds, got str '30'"),  # was: '<=' not supported
        ({"slow_start": "no"}, "slow_start must be True or False, got 'no'"),  # was: read as True
    ],
)
def test_knobs_of_the_wrong_type(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        AIMD(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target_utilisation": 0}, "target_utilisation"),
        ({"target_utilisation": 1.5}, "target_utilisation"),
        ({"target_utilisation": math.nan}, "target_utilisation"),
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
        # An OOM that names its allocation (a share of the card), after a cost was told or not.
        st.tuples(st.just("named oom"), st.floats(0.0, 1.0), st.integers(1, 70), st.booleans()),
        st.tuples(st.just("sample"), st.floats(0.0, 1.0), st.integers(0, 70), st.just(False)),
        st.tuples(st.just("wait"), st.floats(0.0, 100.0), st.just(0), st.just(False)),
    ),
    max_size=200,
)


def replay(c: AIMD, steps: list[tuple[str, float, float, bool]], check: object = None) -> None:
    now_s = 0.0
    last_reading_s: float | None = None
    read_limit: int | None = None  # the limit the last reading left
    for kind, a, b, flag in steps:
        now_s += 0.05
        before = c.limit
        if kind == "success":
            c.on_success(now_s=now_s, latency_s=a, concurrency=b, demand=flag)
        elif kind == "oom":
            fresh = a == 0
            reads_memory = c.memory.estimate() is not None
            mix = c.memory.is_mix()
            c.on_oom(now_s=now_s, epoch=c.epoch + int(a), in_flight=int(b))
            assert c.limit <= before, "an OOM never raises the limit"
            if fresh and reads_memory and not mix:
                assert c.limit <= max(c.min_limit, int(b) - 1), "a fresh OOM bars its level"
            if fresh and not reads_memory:
                assert c.limit < before or before == c.min_limit, "without readings, a fresh OOM cuts"
        elif kind == "named oom":
            if flag:
                c.costs_told()
            if not c.allocation_failed(a * TOTAL, 1):
                c.on_oom(now_s=now_s, epoch=c.epoch, in_flight=int(b))
                assert c.limit <= before, "an OOM never raises the limit"
        elif kind == "sample":
            c.on_sample(now_s=now_s, sample=MemorySample(int(a * TOTAL), TOTAL), in_flight=int(b))
            # Twofold a reading, or per tenth of a second where readings are further apart (8 at most), from the
            # limit the last reading left: a slot held back between readings (a request of ours finished on a card
            # the others pressed into) comes back at the next, and is no growth.
            periods = 1 if last_reading_s is None else math.floor((now_s - last_reading_s) / 0.1 + 1e-6)
            last_reading_s = now_s
            growth = 2 ** max(1, min(periods, 8))
            since = before if read_limit is None else max(before, read_limit)
            assert c.limit <= max(c.min_limit, growth * since), "at most twofold a reading (or a tenth of a second)"
            read_limit = c.limit
        else:
            now_s += a
        assert c.min_limit <= c.limit <= c.max_limit
        cap = c.memory.cap(now_s)
        if cap is not None:
            assert c.limit <= max(c.min_limit, cap), "never above what the model says fits"


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


Steps = list[tuple[str, float, float, bool]]

# Event sequences hypothesis found that broke `test_growth_resumes_after_pressure_ends`, run at every run.
PRESSURE_FOUND: list[Steps] = [
    # Told by a cost, a reading of 3 in flight showed a unit holding 1.4% of the card, the mean of the readings
    # 0.8%: read by the mean, 64 requests of 1% read as the others rising by 13% of the card, a rise that no later
    # reading at the limit could tell from the requests, and the limit stayed at 60 for good.
    [("sample", 0.30078125, 0, False), ("sample", 0.5, 33, False), ("sample", 0.34375, 3, False),
     ("named oom", 0.0, 1, True), ("sample", 0.5, 39, False)],
    # Told by a cost, a reading showed a unit holding 1.6% of the card; later requests of 1%, every one allocated
    # at every reading, showed more than 60% of it, and the limit stayed at 61 for good.
    [("sample", 0.298828125, 0, False), ("sample", 0.375, 5, False), ("sample", 0.34765625, 3, False),
     ("named oom", 0.0, 1, True), ("sample", 0.375, 5, False)],
    # A slot held back after a request finished on a full card, and the next reading's limit twice the one the
    # reading before left, not twice the slot held back.
    [("sample", 0.0, 0, False), ("sample", 1.0, 4, False), ("sample", 1.0, 3, False),
     ("success", 1.0, 1.0, False), ("sample", 0.0, 0, False)],
]  # fmt: skip


def pinned(cases: list[Steps]) -> Callable[[Callable[[Steps], None]], Callable[[Steps], None]]:
    """Each of `cases` as a hypothesis `example` of a property over `steps`."""

    def pin(test: Callable[[Steps], None]) -> Callable[[Steps], None]:
        for steps in cases:
            test = example(steps=steps)(test)
        return test

    return pin


@settings(max_examples=200, deadline=None)
@given(steps=events)
@pinned(PRESSURE_FOUND)
def test_growth_resumes_after_pressure_ends(steps: Steps) -> None:
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
    assert c.memory.cap() == 1  # one request holds the whole card
    for i in range(200):  # 40 s of readings: one request holds 1% of the card
        c.on_sample(now_s=1.0 + i * 0.2, sample=MemorySample(TOTAL // 100, TOTAL), in_flight=1)
    cap = c.memory.cap()
    assert cap is not None and cap > 50


def test_a_spread_learned_from_a_few_large_requests_is_forgotten_when_every_reading_is_small() -> None:
    """Found by hypothesis: three busy readings (15 GiB at six, the whole card at five, 12 GiB at
    five) left a mix of 2.9 GiB a request with a spread of 3.5. Every later reading, 1% of the card
    a request, was within that spread's noise and under a quarter of the mean, so it taught nothing:
    the limit stayed at 5 where 64 fit."""
    c = AIMD()
    bound(c, max_limit=64)
    for i, (share, n) in enumerate([(0.0, 0), (0.625, 6), (1.0, 5), (0.5, 5)]):
        c.on_sample(now_s=i * 0.05, sample=MemorySample(int(share * TOTAL), TOTAL), in_flight=n)
    assert c.memory.is_mix()
    for i in range(10):
        c.on_sample(now_s=10.0 + i * 0.01, sample=MemorySample(0, TOTAL), in_flight=0)
    stuck = c.limit
    for i in range(12):  # a little over a second of readings: five requests hold 1% of the card each
        c.on_sample(now_s=11.0 + i * 0.1, sample=MemorySample(5 * TOTAL // 100, TOTAL), in_flight=5)
    assert not c.memory.is_mix()
    cap = c.memory.cap()
    assert cap is not None and cap > 50 and c.limit > stuck


def test_requests_that_hold_nothing_between_ooms_do_not_shrink_a_mix() -> None:
    """The same readings with an OOM after each are requests that failed to allocate, which hold
    nothing, not small ones: the mix's sizes stay."""
    c = AIMD()
    bound(c, max_limit=64)
    for i, (share, n) in enumerate([(0.0, 0), (0.625, 6), (1.0, 5), (0.5, 5)]):
        c.on_sample(now_s=i * 0.05, sample=MemorySample(int(share * TOTAL), TOTAL), in_flight=n)
    for i in range(10):
        c.on_sample(now_s=10.0 + i * 0.01, sample=MemorySample(0, TOTAL), in_flight=0)
    size = c.memory.estimate()
    for i in range(15):  # more than the hollow readings that say requests hold that little, with no OOM
        c.on_sample(now_s=11.0 + i * 0.1, sample=MemorySample(5 * TOTAL // 100, TOTAL), in_flight=5)
        c.on_oom(now_s=11.05 + i * 0.1, epoch=c.epoch, in_flight=5)
    assert c.memory.is_mix() and c.memory.estimate() == size


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
    assert model.cap() == 8
    now_s += 0.1
    model.add(now_s, 6, int(23.6 * GiB), TOTAL)
    assert model.cap() == 6  # memory first: taken for a neighbour at once
    for i in range(300):  # 30 s at five
        now_s += 0.1
        model.add(now_s, 5, 18 * GiB, TOTAL)
        if i >= 1:  # the second reading in a row that shows it gone
            assert model.cap() == 8
    assert model.estimate().baseline_bytes == pytest.approx(8 * GiB)  # type: ignore[union-attr]


def _steady_on_own_count(memory: MemoryModel, *, own_moves: bool) -> float:
    """Idle readings before and after the weights were loaded, and twenty busy ones at five requests
    of 3 GiB beside 8 GiB of others (our weights among them), the process's own count beside each:
    with the requests' bytes in it, or standing still (a framework that allocates outside PyTorch's
    allocator). The time of the last."""
    memory.add(0.0, 0, 2 * GiB, TOTAL, own_bytes=0)  # before the lifespan loaded the weights
    memory.add(0.05, 0, 8 * GiB, TOTAL, own_bytes=6 * GiB)
    now_s = 0.05
    for _ in range(20):
        now_s += 0.1
        memory.add(now_s, 5, 23 * GiB, TOTAL, own_bytes=(21 if own_moves else 6) * GiB)
    assert memory.cap() == 5
    return now_s


def test_a_neighbour_that_takes_the_room_of_requests_that_failed_is_read_from_the_own_count() -> None:
    """Two requests finish, a neighbour takes their 6 GiB, and the two admitted in their place fail
    to allocate: they hold nothing, but count as in flight until their OOM is told. The card reads
    as full as before with five in flight, and from that alone nothing changed (every request
    admitted meanwhile ran out of memory: 15 where the reader had 3). The process's own count says
    our five hold 9 GiB, not 15: the others hold 14 GiB, and three fit."""
    told = MemoryModel()
    now_s = _steady_on_own_count(told, own_moves=True)
    told.add(now_s + 0.1, 5, 23 * GiB, TOTAL, own_bytes=15 * GiB)
    assert told.cap() == 3
    unread = MemoryModel()
    now_s = _steady_on_own_count(unread, own_moves=True)
    unread.add(now_s + 0.1, 5, 23 * GiB, TOTAL)  # a probe that does not tell the process's own bytes
    assert unread.cap() == 5


def test_the_own_count_reads_a_neighbour_beside_requests_not_allocated_however_the_readings_swing() -> None:
    """Requests of 3 GiB allocate a while after their admission, so readings of five in flight catch two to
    five of them allocated: the card less the model's requests swings by 9 GiB from reading to reading.
    Then a neighbour takes 6 GiB while the five in flight hold nothing (the worker restarting after an
    OOM, its requests admitted and failing before they allocate). The own count says ours hold nothing:
    the 6 GiB are the others'. Weighed against the readings' swing, they were taken for our requests, a
    request read at 1.2 GiB, a mix's spread, and the limit let eight in once the neighbour left (seven
    OOMs in ten seconds, on virtual time, where the reader had one)."""
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, TOTAL, own_bytes=8 * GiB)
    now_s = 0.0
    for i in range(40):
        now_s += 0.1
        allocated = [5, 2, 4, 3, 5, 2, 5, 4][i % 8]
        used = (8 + 3 * allocated) * GiB
        memory.add(now_s, 5, used, TOTAL, own_bytes=used)
    for _ in range(3):
        now_s += 0.1
        memory.add(now_s, 5, 14 * GiB, TOTAL, own_bytes=8 * GiB)
    estimate = memory.estimate()
    assert estimate is not None
    assert estimate.baseline_bytes == pytest.approx(14 * GiB)
    assert memory.cap() <= 3  # (24 - 14) / 3; five where the 6 GiB were taken for ours


def test_an_own_count_that_does_not_move_with_the_requests_is_not_believed() -> None:
    """Where the model runs outside PyTorch's allocator, its count stands still while requests run:
    read as the others' bytes, every busy reading would be a neighbour's arrival, and the limit 1."""
    memory = MemoryModel()
    now_s = _steady_on_own_count(memory, own_moves=False)
    memory.add(now_s + 0.1, 5, 23 * GiB, TOTAL, own_bytes=6 * GiB)
    assert memory.cap() == 5


def test_the_slots_an_oom_freed_wait_for_the_next_reading() -> None:
    """Seven were admitted before the readings showed that five fit; one of them runs out of memory.
    The model already says five, so the OOM bars nothing below it, and four stay in flight. Refilled
    at once, the freed slot went to a request that ran out too, where a neighbour that takes what
    our requests free had grown since the reading (a pile-up one OOM at a time). It waits for the
    next reading, which says what the card holds now."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c)
    assert c.limit == 5
    c.on_oom(now_s=now_s + 0.01, epoch=c.epoch, in_flight=7)
    assert c.limit == 5
    c.after_oom(4.0)
    assert c.limit == 4 and c.budget == 4.0
    described = c.describe()
    assert described["bound"] == "oom" and "until the next reading" in described["why"]
    c.after_oom(4.5)  # a later one with more in flight does not raise it
    assert c.limit == 4
    c.on_sample(now_s=now_s + 0.1, sample=MemorySample(20 * GiB, TOTAL), in_flight=4)
    assert c.limit == 5 and c.describe()["bound"] == "memory"


def test_without_readings_an_oom_holds_no_slot_back_for_a_reading() -> None:
    c = AIMD()
    bound(c, initial=8)
    c.on_oom(now_s=1.0, epoch=c.epoch, in_flight=8)
    assert c.limit == 4
    c.after_oom(2.0)  # no reading will come to release it: AIMD's cut is the answer
    assert c.limit == 4


def test_a_level_the_model_took_for_a_fit_within_its_slack_is_barred_when_it_runs_out() -> None:
    """Room for 20.99 requests is room for 21 (a hundredth of a request is estimation error). When 21
    then run out of memory, the model was wrong, not behind the card: the level is barred. Taken for
    an OOM the readings explained (the room then below the level), it was tried again at the end of
    each request, and ran out each time (an OOM every 0.3 s for 15 s, beside a neighbour read exactly)."""
    from adaptive_gate._control.oom_states import OomStates

    states = OomStates()
    states.record(10.0, 21, 20.993)
    assert states.barred_from(10.5, 20.993) == 21
    assert states.barred_from(10.5, 22.0) is None  # a whole request roomier: tried again
    explained = OomStates()
    explained.record(10.0, 23, 20.993)  # admitted before a neighbour was read: the model says 21 now
    assert explained.barred_from(10.5, 20.993) == 23


def test_a_level_that_ran_out_at_an_exact_fit_comes_back_once_a_leak_frees_less_than_a_request() -> None:
    """A neighbour leaked until four requests fitted with 6 MiB to spare short of nothing: room for
    3.998, taken for four within the slack. Four ran out: the model was right, its slack was not.
    When the leak freed 2 GiB (room for 4.67, two thirds of a request more than at the OOM), four fit
    again. The bar waited for a whole request more room, which that never gives: the limit sat at
    three until the bar's two minutes were over (a leak that left, 12 s of a 60 s run)."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c)  # 8 GiB of weights, 3 GiB a request: five fit
    leaked = int((8 + 4) * GiB + 6 * 2**20)  # weights and a 4 GiB leak, and 6 MiB more
    for _ in range(3):
        now_s += 0.1
        c.on_sample(now_s=now_s, sample=MemorySample(leaked + 9 * GiB, TOTAL), in_flight=3)
    assert c.memory.room() == pytest.approx(3.998, abs=0.001) and c.limit == 4  # within the slack
    c.on_oom(now_s=now_s + 0.05, epoch=c.epoch, in_flight=4)
    for _ in range(20):
        now_s += 0.1
        c.on_sample(now_s=now_s, sample=MemorySample(leaked + 9 * GiB, TOTAL), in_flight=3)
    assert c.limit == 3 and "4 ran out of memory" in c.describe()["why"]  # the same card: not tried again
    for _ in range(2):  # the leak freed 2 GiB
        now_s += 0.1
        c.on_sample(now_s=now_s, sample=MemorySample(int((8 + 2 + 9) * GiB), TOTAL), in_flight=3)
    assert c.limit == 4 and c.describe()["oom"] is None


def test_an_oom_whose_neighbour_the_readings_show_late_is_explained_by_it() -> None:
    """Five of 10 GiB ran out with room for 5.9 by the model: a greedy neighbour took the card while
    requests were caught before they allocate, and its first bytes were read as our requests growing
    (room for 5.14, then 5.05), the others' rise only at the fourth reading (room for 2.4). That
    reading explains the OOM. (Counted only within a quarter second, the bar kept room for 5.05 as
    the card the OOM happened on: after the neighbour left, with room for 5.9, four were let in for
    the last 20 s of a draw of `--family late`, where five fit.) A neighbour that comes a second after
    the OOM explains nothing of it."""
    from adaptive_gate._control.oom_states import OomStates

    states = OomStates()
    states.record(10.0, 5, 5.9)
    for now_s, room in [(10.1, 5.14), (10.2, 5.05), (10.3, 5.05), (10.4, 2.4)]:
        states.observe(now_s, room)
    assert states.barred_from(10.5, 2.4) == 5
    assert states.barred_from(30.0, 5.9) is None  # the neighbour left: five fit again
    later = OomStates()
    later.record(10.0, 5, 5.9)
    for now_s, room in [(10.1, 5.9), (10.5, 5.9), (11.0, 2.4)]:
        later.observe(now_s, room)
    assert later.barred_from(30.0, 5.9) == 5  # the card read as it was at the OOM: a whole request roomier needed


def test_a_bar_at_a_fit_by_the_slack_alone_holds_until_the_level_fits_without_it() -> None:
    from adaptive_gate._control.oom_states import OomStates

    states = OomStates()
    states.record(10.0, 4, 3.998)
    assert states.barred_from(10.5, 4.005) == 4  # within the slack still: the same fit that ran out
    assert states.barred_from(10.5, 4.011) is None  # four fit without the slack: tried again


def test_no_line_is_drawn_through_a_rise_the_next_reading_has_yet_to_confirm() -> None:
    """On a card of 141 GiB that holds 44 requests of 2.089 GiB, a neighbour takes the 1.1 GiB that is
    free: the others' rise is read at once. At the next reading, the same, a line drawn through the
    window (its two high readings among thirty at the old bytes) put the others at 48.06 GiB, most of
    the neighbour hidden in it, and the requests admitted on that ran out beside it. Until the next
    reading says whether the rise lasts, no line is drawn."""
    memory = MemoryModel()
    per_gib, others_gib, total = 2.089, 47.988, 141 * GiB
    memory.add(0.0, 0, int(others_gib * GiB), total)
    now_s = 0.0
    for i in range(48):
        now_s += 0.1
        n = [44, 44, 44, 43, 44, 44, 45, 44][i % 8]
        memory.add(now_s, n, int((others_gib + per_gib * n) * GiB), total)
    for _ in range(3):
        now_s += 0.1
        memory.add(now_s, 44, total, total)  # the neighbour took what was free: the card is full
        estimate = memory.estimate()
        assert estimate is not None
        assert estimate.baseline_bytes / GiB == pytest.approx(141 - 44 * per_gib, abs=0.01)
        assert estimate.per_request_bytes / GiB == pytest.approx(per_gib, abs=0.001)


def test_the_others_rising_into_a_full_card_hold_a_slot_back_until_one_of_ours_finished() -> None:
    """A neighbour takes the 2 GiB a full card of five had free. It may want more: only the bytes of a
    request that finishes tell (a neighbour that waits for them takes them first). With none finished
    by the next reading, the hold let go there, and the request let in ran out beside the neighbour
    that took the room it was given. It holds until one finished and a reading shows what its bytes
    became: here free, and five fit beside the neighbour."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, others_gib=7, levels=(1, 2, 4) + (5,) * 20)
    assert c.limit == 5
    now_s += 0.1
    c.on_sample(now_s=now_s, sample=MemorySample(TOTAL, TOTAL), in_flight=5)
    assert c.limit == 4 and c.describe()["bound"] == "memory"
    now_s += 0.1
    c.on_sample(now_s=now_s, sample=MemorySample(TOTAL, TOTAL), in_flight=5)  # nothing finished meanwhile
    assert c.limit == 4 and "full card" in c.describe()["why"]
    c.on_success(now_s=now_s + 0.05, latency_s=0.3, concurrency=5, demand=True)
    c.on_sample(now_s=now_s + 0.1, sample=MemorySample(21 * GiB, TOTAL), in_flight=4)  # its 3 GiB stay free
    assert c.limit == 5


def test_requests_that_ran_out_on_a_card_the_others_press_full_leave_it_pressed() -> None:
    """The others rose into a full card, and two of ours, admitted into room they had taken, ran out.
    The slots those leave are held till the next reading, as after any OOM; that hold used to replace
    the one for the pressed card, and the successes after it refilled what they freed: a neighbour
    that waits for the card took those bytes too, and the refills ran out in turn (15 OOMs where the
    reader of the card has 9, `--family many` seed 90055). What ours free stays theirs till the reading."""
    c = AIMD()
    bound(c, initial=1)
    now_s = learned(c, others_gib=7, levels=(1, 2, 4) + (5,) * 20)
    now_s += 0.1
    c.on_sample(now_s=now_s, sample=MemorySample(TOTAL, TOTAL), in_flight=5)
    assert c.limit == 4
    for in_flight in (5, 4):
        c.on_oom(now_s=now_s + 0.02, epoch=c.epoch, in_flight=in_flight)
        c.after_oom(in_flight - 1)
    assert c.limit == 3
    c.on_success(now_s=now_s + 0.05, latency_s=0.3, concurrency=3, demand=True)
    assert c.limit == 2 and "full card" in c.describe()["why"]


def test_a_bar_counts_the_room_then_in_requests_of_the_size_the_model_learned_since() -> None:
    """Nine ran out with room for 9.36 requests of 0.561 GiB, a size that readings of a request that
    held nothing (its allocation had failed) had brought 4% below the 0.585 it is. Once the model holds
    0.585 again, the room then was 8.98 of them: nine did not fit then, and the bar holds only while
    they do not fit now. Left in the old size, room for 9.24 after the neighbour that caused it left
    read as less than then, and nine stayed barred for two minutes where nine fitted."""
    from adaptive_gate._control.oom_states import OomStates

    states = OomStates()
    states.observe(9.9, 9.5, 0.561 * GiB)
    states.record(10.0, 9, 9.5)
    states.observe(10.1, 9.36, 0.561 * GiB)  # the first reading after it: the room then
    assert states.barred_from(10.2, 9.5) == 9  # the same size: a request roomier than then, or barred
    states.observe(20.0, 8.9, 0.585 * GiB)
    assert states.barred_from(20.0, 8.9) == 9  # the size learned again: nine do not fit now either
    states.observe(20.1, 9.24, 0.585 * GiB)
    assert states.barred_from(20.1, 9.24) is None  # they fit now: tried again
    states.observe(30.0, 9.9, 0.5 * GiB)
    assert states.barred_from(30.0, 9.9) == 9  # a smaller size is counted as then: 9.9 is not 10.36


def test_part_slots_that_ran_out_as_a_neighbour_came_are_barred_only_while_they_do_not_fit() -> None:
    """Requests of two routes weigh parts of a slot: 4.31 slots ran out as a neighbour arrived, and the
    first reading after it showed room for 3.6. When the neighbour left, the card read room for 4.5
    again, as before it came, when as many ran without an OOM. The bar, held while the room was under
    its level (5), kept what part slots may fill under 4.31 for two minutes: 0.93-0.95 of the reader
    with 32 clients in three draws of a mix of routes beside a neighbour. It holds while 4.31 does not
    fit; with whole slots, the level is the load and nothing changes."""
    from adaptive_gate._control.oom_states import OomStates

    states = OomStates()
    states.observe(19.9, 4.48, GiB)
    states.record(20.03, 5, 4.48, load=4.3125)
    states.observe(20.1, 3.6, GiB)  # the reading that shows the neighbour: the room then
    assert states.barred_load(30.0, 3.6) == 4.3125 and states.barred_from(30.0, 3.6) == 5
    assert states.barred_load(40.1, 4.2) == 4.3125  # it would not fit yet
    assert states.barred_load(40.1, 4.5) is None and states.barred_from(40.1, 4.5) is None  # it fits
    whole = OomStates()
    whole.observe(19.9, 5.5, GiB)
    whole.record(20.03, 5, 5.5, load=5)
    whole.observe(20.1, 3.6, GiB)
    assert whole.barred_from(40.1, 4.5) == 5 and whole.barred_from(40.1, 5.0) is None


def test_a_rise_the_own_count_read_is_kept_where_requests_that_failed_hold_nothing() -> None:
    """A neighbour takes 7 GiB: the reading shows the others' rise, by the count in flight and by
    the own count alike. At the next, three of the five in flight failed to allocate and hold
    nothing: by the count in flight the card reads emptier than before the neighbour came, as if
    the rise had been our requests (taken back, it was taught as their size, and the limit fell
    below the fit). The own count reads the neighbour still there: three fit beside it."""
    memory = MemoryModel()
    now_s = _steady_on_own_count(memory, own_moves=True)
    memory.add(now_s + 0.1, 3, (8 + 7 + 9) * GiB, TOTAL, own_bytes=(6 + 9) * GiB)
    assert memory.cap() == 3
    memory.add(now_s + 0.2, 5, (8 + 7 + 6) * GiB, TOTAL, own_bytes=(6 + 6) * GiB)
    estimate = memory.estimate()
    assert estimate is not None and memory.cap() == 3
    assert estimate.baseline_bytes == pytest.approx(15 * GiB, rel=0.01)
    assert estimate.per_request_bytes == pytest.approx(3 * GiB, rel=0.01)


def test_the_own_count_still_agrees_after_a_reading_of_requests_that_held_too_little_to_tell() -> None:
    """Five small requests of a mix (1 GiB each where the mean is 3) hold too little for the own count
    to tell whether it follows our requests; at the next reading four large ones (3.75 GiB) fill the
    card. The own count agreed before the small ones and reads the others where they were: the large
    ones are ours, not a neighbour's rise (forgetting its agreement, the model took the others to 11
    GiB and held them there)."""
    memory = MemoryModel()
    now_s = _steady_on_own_count(memory, own_moves=True)
    memory.add(now_s + 0.1, 5, 13 * GiB, TOTAL, own_bytes=11 * GiB)
    for i in range(2):
        memory.add(now_s + 0.2 + 0.1 * i, 4, 23 * GiB, TOTAL, own_bytes=21 * GiB)
        estimate = memory.estimate()
        assert estimate is not None
        assert estimate.baseline_bytes == pytest.approx(8 * GiB, rel=0.01)
        assert estimate.per_request_bytes > 3 * GiB


def test_requests_that_hold_little_on_a_card_with_no_room_for_one_are_no_confirmed_shrink() -> None:
    """A neighbour leaves room for one 3 GiB request; two are in flight and one failed to allocate
    (it holds nothing until its OOM is told). Pairs of readings in a row look like sizes that shrank
    to 1.5 GiB, but on a card without room for one request of the size before, requests that hold
    nothing may have failed: each pair moves the size a step, not the whole way (taken whole, the
    model let two in, and the next OOMs followed)."""
    memory = MemoryModel()
    now_s = _steady_on_own_count(memory, own_moves=True)
    for n in (1, 1) + (2,) * 6:
        now_s += 0.1
        memory.oldest_in_flight(now_s - 0.05)
        memory.add(now_s, n, int(23.5 * GiB), TOTAL, own_bytes=9 * GiB)
        estimate = memory.estimate()
        assert estimate is not None and estimate.per_request_bytes > 1.9 * GiB
        assert memory.cap() == 1


def _beside_a_neighbour(memory: MemoryModel, neighbour_gib: int, requests: int) -> float:
    """`_steady_on_own_count`, then five readings with a neighbour of `neighbour_gib` beside the 8 GiB
    of others and `requests` of ours that fill the card with it, the own count beside each. The
    time of the last."""
    now_s = _steady_on_own_count(memory, own_moves=True)
    for _ in range(5):
        now_s += 0.1
        memory.add(now_s, requests, (8 + neighbour_gib + 3 * requests) * GiB, TOTAL, own_bytes=(6 + 3 * requests) * GiB)
    assert memory.cap() == requests
    return now_s


def _read_twice(memory: MemoryModel, now_s: float, requests: int, used_gib: int, own_gib: int) -> float:
    """Two readings 0.1 s apart of `used_gib` on the card, the own count at `own_gib`, with `requests`
    in flight. The time of the last."""
    for _ in range(2):
        now_s += 0.1
        memory.add(now_s, requests, used_gib * GiB, TOTAL, own_bytes=own_gib * GiB)
    return now_s


def test_slots_not_allocated_yet_beside_a_neighbour_are_not_read_as_its_leaving() -> None:
    """A neighbour takes 7 GiB, and three of our 3 GiB requests fill the card exactly. Two readings
    in a row catch one of the three admitted and not allocated yet: by the count in flight the
    others hold 12 GiB, as if the neighbour had shrunk, and four would fit (the fourth ran out of
    memory in real time). The process's own count reads the others at 15 GiB at both: our requests
    held less, the neighbour did not. When it does leave, the own count reads that at once."""
    memory = MemoryModel()
    now_s = _read_twice(memory, _beside_a_neighbour(memory, 7, 3), 3, 8 + 7 + 6, 6 + 6)
    estimate = memory.estimate()
    assert estimate is not None and estimate.baseline_bytes == pytest.approx(15 * GiB, rel=0.01)
    assert memory.cap() == 3
    _read_twice(memory, now_s, 3, 8 + 9, 6 + 9)  # the neighbour left
    assert memory.cap() == 5


def test_half_the_slots_not_allocated_beside_a_neighbour_do_not_bring_back_the_room_from_before() -> None:
    """Beside a 4 GiB neighbour, four requests fit. Two readings in a row each catch two of the
    four not allocated yet: by the count in flight the others hold 6 GiB, below what they held
    before the neighbour came, which reads as the neighbour gone (and six fit). The own count reads
    the others at 12 GiB at both: four still fit."""
    memory = MemoryModel()
    _read_twice(memory, _beside_a_neighbour(memory, 4, 4), 4, 8 + 4 + 6, 6 + 6)
    estimate = memory.estimate()
    assert estimate is not None and estimate.baseline_bytes == pytest.approx(12 * GiB, rel=0.01)
    assert memory.cap() == 4


def read_beside_own_count(
    memory: MemoryModel, in_flight: int, held_gib: list[int], neighbour_gib: int, *, start: int = 0, total: int = TOTAL
) -> MemoryEstimate:
    """Readings 0.1 s apart, from the `start`-th, of `in_flight` requests holding `held_gib` (one figure a
    reading) beside 8 GiB of weights and a neighbour's `neighbour_gib`, with the process's own count (6
    GiB of its own beside our requests' bytes). The estimate after the last."""
    for i, held in enumerate(held_gib, start=start):
        memory.add(0.1 * (i + 1), in_flight, (8 + neighbour_gib + held) * GiB, total, own_bytes=(6 + held) * GiB)
    estimate = memory.estimate()
    assert estimate is not None
    return estimate


def test_a_neighbour_read_by_the_own_count_beside_requests_read_whole_is_believed_at_once() -> None:
    """Five 3 GiB requests beside 8 GiB of others, five fit; readings catch up to three of them not
    allocated yet, and each holds a whole number of 3 GiB: the requests are of that size, and the
    readings' spread is wide. A neighbour's 2 GiB comes: the own count reads the others 2 GiB higher
    at once. Weighed against a slack of the readings' spread, that was within it: the rise was read as
    our requests holding more, and five were let in where four fit. They are of one size: it is the others'."""
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, TOTAL, own_bytes=6 * GiB)
    held_gib = [3 * (5 - short) for short in [0, 1, 0, 2, 1, 0, 0, 1, 0, 3] * 4]
    estimate = read_beside_own_count(memory, 5, held_gib[:30], 0)
    assert estimate.per_request_bytes == pytest.approx(3 * GiB)
    assert estimate.spread_bytes > 0.5 * GiB and memory.cap() == 5
    estimate = read_beside_own_count(memory, 5, held_gib[30:33], 2, start=30)
    assert estimate.per_request_bytes == pytest.approx(3 * GiB)
    assert estimate.baseline_bytes == pytest.approx(10 * GiB) and memory.cap() == 4


def test_a_neighbour_read_leaving_by_the_own_count_beside_requests_read_whole_is_believed_gone() -> None:
    """A neighbour's 2 GiB beside 8 GiB of weights, four 3 GiB requests in flight; readings catch up
    to three of them not allocated yet, so they swing by 9 GiB. The neighbour leaves: the own count
    reads the others 2 GiB lower at two readings in a row, within that swing. Believed: five fit. (Read
    by the count in flight alone, the fall was our requests holding less: the others stayed at 10 GiB
    and the size fell to 2.3 GiB.)"""
    memory = MemoryModel()
    memory.add(0.0, 0, 10 * GiB, TOTAL, own_bytes=6 * GiB)
    held_gib = [3 * (4 - short) for short in [0, 1, 0, 2, 1, 0, 0, 1, 0, 3] * 4]
    estimate = read_beside_own_count(memory, 4, held_gib[:30], 2)
    assert estimate.baseline_bytes == pytest.approx(10 * GiB) and memory.cap() == 4
    estimate = read_beside_own_count(memory, 4, held_gib[30:33], 0, start=30)
    assert estimate.per_request_bytes == pytest.approx(3 * GiB)
    assert estimate.baseline_bytes == pytest.approx(8 * GiB) and memory.cap() == 5


def test_a_neighbour_read_shrinking_by_the_own_count_beside_requests_not_allocated_keeps_what_it_holds() -> None:
    """A neighbour's 6 GiB beside 8 GiB of weights, four 3 GiB requests in flight. The neighbour shrinks
    to 2 GiB, read at two readings that each catch one of ours not allocated: the own count reads the
    others at 10 GiB at both. They hold that, not what the card held idle before the neighbour came (8
    GiB): in a draw of `--family late`, a crash that then left our requests holding nothing read the
    neighbour's 2 GiB as theirs, and let in 43 where 7 fit."""
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, TOTAL, own_bytes=6 * GiB)
    memory.add(0.05, 0, 14 * GiB, TOTAL, own_bytes=6 * GiB)  # the neighbour came
    held_gib = [3 * (4 - short) for short in [0, 0, 0, 0, 1, 0, 0, 0, 0, 0] * 3]
    estimate = read_beside_own_count(memory, 4, held_gib, 6)
    assert estimate.baseline_bytes == pytest.approx(14 * GiB)
    estimate = read_beside_own_count(memory, 4, [9, 9], 2, start=30)
    assert estimate.baseline_bytes == pytest.approx(10 * GiB)


def test_a_neighbour_read_leaving_by_the_own_count_beside_a_mix_is_believed_gone() -> None:
    """A neighbour's 2 GiB beside 8 GiB of weights, four requests of 2 or 4 GiB in flight: their sum
    swings by 6 GiB, a mix. The neighbour leaves: the own count reads the others 2 GiB lower at two
    readings in a row. Believed: the others hold 8 GiB. (Weighed against the count's slack, which
    counts the mix's spread, the fall was within it, and read as our requests holding less; in a draw
    of `--family late` the neighbour's room came back only at an idle reading, 1.1 s later.)"""
    total = 32 * GiB
    memory = MemoryModel()
    memory.add(0.0, 0, 10 * GiB, total, own_bytes=6 * GiB)
    held_gib = [8 + 2 * large for large in [0, 1, 2, 1, 3, 0, 2, 1] * 5]
    estimate = read_beside_own_count(memory, 4, held_gib[:30], 2, total=total)
    assert estimate.baseline_bytes == pytest.approx(10 * GiB) and memory.is_mix()
    size_bytes = estimate.per_request_bytes
    estimate = read_beside_own_count(memory, 4, held_gib[30:33], 0, start=30, total=total)
    assert estimate.baseline_bytes == pytest.approx(8 * GiB)
    assert estimate.per_request_bytes == pytest.approx(size_bytes)


def test_a_neighbour_that_leaves_between_the_two_readings_of_a_fall_is_believed_gone() -> None:
    """Beside a 4 GiB neighbour four requests fit. The first reading of a fall catches one of ours
    not allocated yet (the own count reads the others still at 12 GiB); before the second, the
    neighbour leaves (the own count reads them at 8). The least the own count read is where the
    others are: the neighbour's room comes back, and no request is taken to have shrunk."""
    memory = MemoryModel()
    now_s = _beside_a_neighbour(memory, 4, 4)
    memory.add(now_s + 0.1, 4, (8 + 4 + 9) * GiB, TOTAL, own_bytes=(6 + 9) * GiB)
    memory.add(now_s + 0.2, 4, (8 + 12) * GiB, TOTAL, own_bytes=(6 + 12) * GiB)
    estimate = memory.estimate()
    assert estimate is not None and estimate.per_request_bytes == pytest.approx(3 * GiB, rel=0.01)
    assert memory.cap() == 5


def test_an_idle_reading_of_tensors_not_yet_freed_is_corrected_by_the_count_in_flight() -> None:
    """An idle reading catches a finished request's 3 GiB not yet freed, on the card and in the
    process's own count alike: the others read 11 GiB, and the own count's rest takes the 3 GiB in.
    The next readings, two requests in flight, read the others at 8 GiB by the count in flight
    and at 11 by the own count, which agrees with the misread. A rest that rose at an idle reading
    after requests had run is not believed over the count in flight, which brings the room back."""
    memory = MemoryModel()
    now_s = _steady_on_own_count(memory, own_moves=True)
    memory.add(now_s + 0.1, 0, 11 * GiB, TOTAL, own_bytes=9 * GiB)
    assert memory.cap() == 4
    for step in range(2, 6):
        memory.add(now_s + step / 10, 2, 14 * GiB, TOTAL, own_bytes=12 * GiB)
    estimate = memory.estimate()
    assert estimate is not None and estimate.baseline_bytes == pytest.approx(8 * GiB, rel=0.01)
    assert memory.cap() == 5


def test_a_rise_read_on_a_full_card_refills_nothing_until_the_next_reading() -> None:
    """Four 3.5 GiB requests beside 8 GiB of weights leave 2 GiB free; a neighbour takes them and
    the card reads full. Whatever the requests that finish free may be the neighbour's too: the
    limit is one below the four in flight, and one lower at each that finishes, until the next
    reading says where the room went; the status says why. A rise on a card with room left holds
    nothing back."""
    c = AIMD()
    bound(c, initial=8)
    c.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    for step in range(1, 6):
        c.on_sample(now_s=step / 10, sample=MemorySample(int(22 * GiB), TOTAL), in_flight=4)
    assert c.limit == 4
    c.on_sample(now_s=0.6, sample=MemorySample(TOTAL, TOTAL), in_flight=4)  # the neighbour took the 2 GiB
    described = c.describe()
    assert c.limit == 3 and described["bound"] == "memory" and "full card" in described["why"]
    successes(c, 2, now_s=0.65)  # what they free may be the neighbour's too: no refill till the next reading
    assert c.limit == 1
    c.on_sample(now_s=0.7, sample=MemorySample(int(20.5 * GiB), TOTAL), in_flight=3)  # it wanted no more
    assert c.limit == 4  # 14 GiB of room beside the neighbour's 2: four fit
    roomy = AIMD()
    bound(roomy, initial=8)
    roomy.on_sample(now_s=0.0, sample=MemorySample(8 * GiB, TOTAL), in_flight=0)
    for step in range(1, 6):
        roomy.on_sample(now_s=step / 10, sample=MemorySample(int(15 * GiB), TOTAL), in_flight=2)
    roomy.on_sample(now_s=0.6, sample=MemorySample(17 * GiB, TOTAL), in_flight=2)  # a neighbour of 2 GiB
    assert roomy.limit == 4  # 14 GiB of room beside it: four fit, and nothing pressed for more


def test_requests_that_allocate_late_are_sized_by_what_they_hold_at_their_peak() -> None:
    """Requests of 3 GiB beside 8 GiB, with room for 5.9 of them: five fit. Some readings catch one
    of the four or five in flight admitted and not allocated yet, and by the count in flight each
    holds less (2.25 or 2.4 GiB): the mean of such readings sat below a request's peak (2.88 GiB),
    and a sixth was let in. Where requests are of one size, one holds at least what the readings
    showed it holding in all but a tenth of them."""
    total = int(25.75 * GiB)
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, total)
    not_allocated = [0, 1, 0, 0, 1, 0, 0, 0, 1, 0]
    for i in range(40):
        n = 4 + i % 2
        memory.add(0.1 * (i + 1), n, (8 + 3 * (n - not_allocated[i % len(not_allocated)])) * GiB, total)
        assert memory.cap() == 5
    estimate = memory.estimate()
    assert estimate is not None and not memory.is_mix()
    assert estimate.per_request_bytes == pytest.approx(3 * GiB, rel=0.01)


def test_requests_that_mostly_hold_nothing_yet_are_read_as_whole_requests_not_a_mix() -> None:
    """The same card, where requests decode their input for longer than they run on the card: most
    readings catch one to three of the four or five in flight not allocated yet. Their spread is
    as wide as a mix's, and read as one the requests were sized by their mean (under 2.5 GiB) and a
    sixth let in (`decode-first`: 0.43 of the reader, 38 OOMs). Each reading holds a whole number
    of 3 GiB requests: one size, read where all had allocated."""
    total = int(25.75 * GiB)
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, total)
    not_allocated = [0, 2, 1, 3, 0, 1, 2, 0, 1, 2, 3, 1]
    for i in range(40):
        n = 4 + i % 2
        memory.add(0.1 * (i + 1), n, (8 + 3 * (n - not_allocated[i % len(not_allocated)])) * GiB, total)
    estimate = memory.estimate()
    assert estimate is not None and not memory.is_mix()
    assert estimate.spread_bytes > 0.25 * 2.5 * GiB  # a mix's, by the spread alone
    assert estimate.per_request_bytes == pytest.approx(3 * GiB)
    assert memory.cap() == 5


def read_whole_requests(
    readings: list[tuple[int, int]],
    *,
    weights_gib: float,
    size_gib: float,
    total: int,
    latency_s: float | None = None,
) -> tuple[MemoryModel, MemoryEstimate]:
    """A model that read the card idle with `weights_gib` of weights, then, 0.1 s apart, each of the
    (in flight, allocated) `readings`: so many requests in flight, so many of them holding `size_gib`
    and the rest nothing yet; where `latency_s` is given, a request served in that long before each.
    The model and its estimate after the last."""
    memory = MemoryModel()
    memory.add(0.0, 0, int(weights_gib * GiB), total)
    for i, (in_flight, allocated) in enumerate(readings):
        if latency_s is not None:
            memory.served(latency_s)
        memory.add(0.1 * (i + 1), in_flight, int((weights_gib + size_gib * allocated) * GiB), total)
    estimate = memory.estimate()
    assert estimate is not None
    return memory, estimate


def test_a_pair_of_readings_of_whole_requests_one_short_is_no_shrink_once_they_have_read_whole() -> None:
    """Five 3 GiB requests fit; every few readings catch one of them not allocated yet, and each reading
    holds a whole number of 3 GiB: for thirty readings in a row. Then two readings in a row catch one
    not allocated: whole requests, one short, as before, not requests that shrank. (Taken for a shrink,
    the size fell to 2.8 GiB and a sixth was let in; in a draw of `--family late`, where two requests
    fit, to half the size the next pair, and four were let in, two of them to run out.)"""
    not_allocated = [1, 0, 1, 0, 0, 0] + [1, 0, 0, 0] * 6 + [0, 0, 1, 1]
    readings = [(5, 5 - short) for short in not_allocated]
    memory, estimate = read_whole_requests(readings, weights_gib=8, size_gib=3, total=int(25.75 * GiB))
    assert estimate.per_request_bytes == pytest.approx(3 * GiB)
    assert memory.cap() == 5


def test_readings_of_whole_requests_one_short_while_the_first_are_learnt_are_no_shrink() -> None:
    """Five 3 GiB requests fit. From the first readings, requests allocate a while after admission: one
    in flight holds 3 GiB, two hold 6, then four hold 9 and five 12 (one short). Whole numbers of the
    size just learnt, before any size has settled, are slots not allocated yet. (Taken for a shrink, the
    size fell to 2.8 GiB and a sixth was let in: the one or two OOMs of the first second, in a draw of
    `--family late` where the reader has none.)"""
    readings = [(1, 1), (2, 2), (4, 3), (5, 4), (5, 3), (5, 4)]
    memory, estimate = read_whole_requests(readings, weights_gib=8, size_gib=3, total=int(25.75 * GiB))
    assert estimate.per_request_bytes == pytest.approx(3 * GiB)
    assert memory.cap() == 5


def test_readings_of_whole_requests_one_short_before_four_have_taught_a_size_are_no_shrink() -> None:
    """Six 2 GiB requests fit beside 2.5 GiB of weights. One in flight holds 2 GiB, two hold 4; then
    six are in flight and each reading catches one to four of them not allocated yet, for eight
    readings: none taught a size (`MIN_QUANTILE_READINGS`), though ten have passed since the sizes
    changed. The eleventh pair, four allocated of six twice, is whole requests again, not a shrink.
    (Taken for one, the size fell to 1.78 GiB and a seventh was let in: the one OOM, a second into a
    draw of `--family late`, where the reader has none.)"""
    readings = [(1, 1), (2, 2), (4, 3), (6, 4), (6, 2), (6, 4), (6, 3), (6, 5), (6, 4), (6, 4)]
    memory, estimate = read_whole_requests(readings, weights_gib=2.5, size_gib=2, total=16 * GiB)
    assert estimate.per_request_bytes == pytest.approx(2 * GiB)
    assert memory.cap() == 6


def test_readings_of_whole_requests_one_short_as_the_sizes_settle_are_no_shrink() -> None:
    """Five 3 GiB requests fit beside 8 GiB of weights on a 24 GiB card; each allocates a while after its
    admission. One reading catches all five allocated, the others four of five, then three: short by
    different numbers, requests caught before they allocate. The pair that came as the sizes settled (the
    tenth reading since they changed), four of five twice, was taken for a shrink to 2.4 GiB once four
    readings had taught a size, and a sixth was let in: one OOM a second into `late-start` (seed 8, with 32
    clients), where the reader has none. Whole requests, at any time the readings caught them short so."""
    readings = [(1, 1), (2, 2), (4, 4), (5, 4), (5, 5), (5, 4), (5, 4), (5, 4), (5, 4), (5, 4), (5, 3)]
    memory, estimate = read_whole_requests(readings, weights_gib=8, size_gib=3, total=24 * GiB)
    assert estimate.per_request_bytes == pytest.approx(3 * GiB)
    assert memory.cap() == 5


def test_readings_one_short_from_a_change_on_are_a_shrink_however_short_they_read_before() -> None:
    """Two 6 GiB requests fit beside 8 GiB of weights; one early reading caught one of them not allocated yet.
    Then the inputs shrink to 3 GiB: two in flight hold 6 GiB, one request of the size before, reading after
    reading. Short by none for forty readings, then by one from the change on: a shrink, not requests caught
    before they allocate (which are caught short by fewer again now and then). Taken for those, the limit stayed
    at two where five fit (`shrink`, 32 clients: 0.95 of the reader where 0.99)."""
    readings = [(1, 1), (2, 2), (2, 1)] + [(2, 2)] * 40 + [(2, 1)] * 18
    memory, _ = read_whole_requests(readings, weights_gib=8, size_gib=6, total=24 * GiB, latency_s=0.1)
    assert memory.cap() == 5


def test_requests_that_shrank_to_whole_numbers_of_the_size_before_and_read_steady_are_a_shrink() -> None:
    """Requests of 3.5 GiB shrink: a first pair of readings moves the size a step down, to 3.12 GiB,
    and four in flight then hold what three of 3.12 GiB would, reading after reading. Whole numbers of
    the size, but the readings catch them short by the same number each time, where requests caught
    before they allocate are more at some readings than at others: a shrink, not slots not allocated
    yet. (Taken for those, the size stayed at 3.12 GiB for the rest of a draw of `--family neighbours`,
    four let in where five fit: 0.87 of the reader.)"""
    total = 24 * GiB
    memory, first_step = read_whole_requests([(3, 3)] * 30 + [(3, 2)] * 2, weights_gib=10.5, size_gib=3.5, total=total)
    assert first_step.per_request_bytes < 3.2 * GiB
    for i in range(16):
        memory.add(3.3 + 0.1 * i, 4, int(10.5 * GiB + 3 * first_step.per_request_bytes), total)
    estimate = memory.estimate()
    assert estimate is not None and estimate.per_request_bytes < 2.6 * GiB
    assert memory.cap() == 5


def test_a_mix_whose_sums_fall_whole_is_a_mix_once_an_oom_asks_for_another_size() -> None:
    """Requests of 1.5 and 6 GiB, three at a time, hold 4.5, 9 or 13.5 GiB: whole numbers of 4.5, as
    if requests of 4.5 GiB were caught before they allocate. An OOM that asks for 6 GiB says they are
    not: the requests are a mix again, where a large one failing says nothing new. Taken for inputs
    that grew to 6 GiB, it cut the mix to two requests (`mixed` at twice the capacity: 0.62 of the
    reader where 0.68)."""
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, TOTAL)
    large = [0, 1, 0, 2, 1, 0, 1, 0]
    for i in range(40):
        memory.add(0.1 * (i + 1), 3, int((8 + 4.5 + 4.5 * large[i % len(large)]) * GiB), TOTAL)
    estimate = memory.estimate()
    assert estimate is not None and not memory.is_mix()
    assert estimate.per_request_bytes == pytest.approx(4.5 * GiB)
    assert not memory.learn_size(6 * GiB, 1, 4.05)
    assert memory.is_mix()
    memory.add(4.1, 3, int(17 * GiB), TOTAL)
    assert memory.is_mix()  # and stays one


def test_a_mix_is_sized_by_its_mean_and_tail_not_its_large_requests() -> None:
    """A quarter of the requests hold 6 GiB, the rest 1.5: readings of four show 1.5 to 6 GiB each.
    The mix is planned for by its mean and its tail, not as if every request were a large one."""
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, TOTAL)
    large = [0, 1, 0, 2, 1, 0, 1, 0]
    for i in range(40):
        n_large = large[i % len(large)]
        memory.add(0.1 * (i + 1), 4, int((8 + 6 * n_large + 1.5 * (4 - n_large)) * GiB), TOTAL)
    estimate = memory.estimate()
    assert estimate is not None and memory.is_mix()
    assert estimate.per_request_bytes < 2.5 * GiB  # the mean; readings of two large ones show 3.75 each
    assert memory.cap() == 5


def across_a_change_from_six_gib_to_four(memory: MemoryModel) -> float:
    """Five 6 GiB requests beside 10 GiB on a 40 GiB card, read whole (some caught before they allocate) for
    a window of readings; then four readings across a change to 4 GiB, old and new in flight. The time after."""
    total = 40 * GiB
    memory.add(0.0, 0, 10 * GiB, total)
    now_s = 0.0
    for short in [0, 1, 0, 2, 0, 1, 0, 0, 2, 1] * 4:  # one size for a window of readings
        now_s += 0.1
        memory.add(now_s, 5, (10 + 6 * (5 - short)) * GiB, total)
    assert memory.cap() == 5 and not memory.is_mix()
    for old, new in [(3, 2), (2, 3), (1, 4), (1, 5)]:
        now_s += 0.1
        memory.add(now_s, old + new, (10 + 6 * old + 4 * (new - 1)) * GiB, total)
    return now_s


def test_readings_that_hold_whole_numbers_of_one_size_since_a_shrink_end_the_mix() -> None:
    """Five 6 GiB requests fit beside 10 GiB; read whole, some caught before they allocate. The inputs shrink
    to 4 GiB: the readings across the change (old and new in flight) make a mix, and the readings after it,
    of seven requests catching one to three not allocated yet, held its mean at 3.65 GiB, five where seven
    fit, till an OOM asked for 4 GiB (`--family late`, seed 90018: 14 OOMs where the reader has none). Ten
    readings in a row that each hold a whole number of 4 GiB are requests of that size, OOM or not, where the
    requests were of one size for a window of readings before (a mix may read whole for a while)."""
    memory = MemoryModel()
    now_s = across_a_change_from_six_gib_to_four(memory)
    shorts = [1, 2, 0, 3, 1, 2, 1, 0, 2, 1]
    for short in shorts[:-1]:
        now_s += 0.1
        memory.add(now_s, 7, (10 + 4 * (7 - short)) * GiB, 40 * GiB)
    assert memory.is_mix() and memory.cap() == 5  # nine of them, and one across the change
    now_s += 0.1
    memory.add(now_s, 7, (10 + 4 * (7 - shorts[-1])) * GiB, 40 * GiB)
    estimate = memory.estimate()
    assert not memory.is_mix() and memory.cap() == 7
    assert estimate is not None and estimate.per_request_bytes == pytest.approx(4 * GiB)


def test_a_mix_all_along_is_not_taken_for_the_size_an_oom_names() -> None:
    """Requests of 2 and 6 GiB on two routes told nothing, a mix from the first readings. Then twelve readings
    catch the large ones before they allocate: each holds a whole number of 2 GiB, no more than 2 GiB a
    request. An OOM of a small one asks for 2 GiB; taken for the size of them all, the large ones ran out by
    the dozen (`--family late`, seed 52). A mix before those readings began stays one."""
    total = 40 * GiB
    memory = MemoryModel()
    memory.add(0.0, 0, 10 * GiB, total)
    now_s = 0.0
    for large, small in [(1, 3), (2, 1), (0, 5), (3, 1), (1, 2), (2, 3)] * 4:
        now_s += 0.1
        memory.add(now_s, large + small, (10 + 6 * large + 2 * small) * GiB, total)
    for held_gib in [8, 10, 6, 10, 4, 8, 10, 8, 6, 10, 8, 10]:
        now_s += 0.1
        memory.add(now_s, 5, (10 + held_gib) * GiB, total)
    assert memory.is_mix()
    assert not memory.learn_size(2 * GiB, 1, now_s)
    assert memory.is_mix()


def test_whole_requests_whose_readings_spread_are_a_mix() -> None:
    """A request weighs one slot, however its readings spread: not told (`costs_told`), a spread is a mix."""
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, TOTAL)
    for i, held_gib in enumerate([1.5, 6, 3, 4.5, 7.5, 3, 6, 1.5] * 4):
        memory.add(0.1 * (i + 1), 2, int((8 + held_gib) * GiB), TOTAL)
    assert memory.is_mix()


def test_a_size_an_oom_named_under_a_cost_goes_once_the_readings_stop_showing_it() -> None:
    """Requests told through a cost of 1.5 hold 3 GiB (2 GiB a unit). One from before the inputs shrank runs
    out asking for 6 GiB: a unit is taken to hold 4 GiB, as inputs that grew, while requests from before it
    may run. Held against readings that never show a unit above 2 GiB, the limit had stayed at half of what
    fits for good; readings of requests that all arrived after it bring the size back to theirs."""
    memory = MemoryModel()
    memory.costs_told()
    memory.add(0.0, 0, 8 * GiB, TOTAL)
    now_s = 0.0
    for _ in range(20):
        now_s += 0.1
        memory.add(now_s, 4.5, 17 * GiB, TOTAL)
    assert memory.told() and memory.cap() == 8
    assert memory.learn_size(6 * GiB, 1.5, now_s)
    assert memory.cap() == 4
    for _ in range(40):
        now_s += 0.1
        memory.oldest_in_flight(now_s - 0.05)  # as the gate tells it before each reading
        memory.add(now_s, 4.5, 17 * GiB, TOTAL)
    assert memory.cap() == 8


def test_under_a_cost_a_unit_holds_the_most_a_reading_showed_one_holding_though_most_have_not_allocated_yet() -> None:
    """Requests told through a cost hold 2 GiB a unit, and allocate late: most readings of ten units in
    flight catch only three to six of them allocated. A reading of two units, both allocated, showed 2 GiB
    each; the others, read as smaller requests or a line through them, had sized a unit at half that and
    sent twice what fits to an OOM. Each reading shows a unit holding at most what it holds, so the most a
    reading showed is what a unit holds; readings that stop showing a unit near it (a shrink) let it go."""
    memory = MemoryModel()
    memory.costs_told()
    memory.add(0.0, 0, 8 * GiB, TOTAL)
    memory.add(0.1, 2, 12 * GiB, TOTAL)
    allocated = [3, 5, 4, 6, 3, 4, 5, 3]
    now_s = 0.1
    for i in range(31):
        now_s += 0.1
        memory.add(now_s, 10, int((8 + 2 * allocated[i % len(allocated)]) * GiB), TOTAL)
    estimate = memory.estimate()
    assert estimate is not None and estimate.per_request_bytes == pytest.approx(2 * GiB)
    assert memory.cap() == 8
    for _ in range(40):  # the units shrank to a quarter, all allocated at every reading
        now_s += 0.1
        memory.add(now_s, 10, 13 * GiB, TOTAL)
    assert memory.cap() > 8


def test_under_a_cost_units_that_shrink_a_little_are_followed_once_every_reading_shows_the_smaller_size() -> None:
    """Told through a cost, a unit held 2 GiB; then 1.6 GiB, every unit allocated at every reading. More than 60%
    of the size it held, so it had stayed 2 GiB for good (8 where 10 fit); 32 readings of one smaller size say it
    shrank."""
    memory = MemoryModel()
    memory.costs_told()
    memory.add(0.0, 0, 8 * GiB, TOTAL)
    memory.add(0.1, 2, 12 * GiB, TOTAL)
    assert memory.cap() == 8
    now_s = 0.1
    for _ in range(64):  # the window the size was seen in, then one of the smaller size alone
        now_s += 0.1
        memory.add(now_s, 5, 16 * GiB, TOTAL)
    assert memory.cap() == 10


def test_slots_weigh_what_the_gate_was_told_where_it_was_told_not_where_readings_count_parts() -> None:
    """Told by the gate (a request came with a `cost` other than 1, or the routes got their weights), not
    read off the slots in flight: parts of a request in flight are as often a snapshot taken as a request
    came or went, and a whole cost is told as much as one in parts (a large route told 3 where it holds 4
    small requests' bytes, read as a mix, ran out of memory by the hundred a minute)."""
    memory = MemoryModel()
    memory.add(0.0, 0, 8 * GiB, TOTAL)
    for i in range(5):
        memory.add(0.1 * (i + 1), 2.5, 15 * GiB, TOTAL)
    assert not memory.told()
    memory.costs_told()
    assert memory.told()
    weighed = MemoryModel()
    weighed.units_changed()
    assert weighed.told()


def test_an_oom_in_a_mix_with_few_in_flight_holds_the_slots_it_freed_till_the_next_reading() -> None:
    """In a mix, an OOM with the cap in flight is its large ones meeting, which the tail plans for: the freed
    slot goes back to the line (the next reading explains nothing). With no more than half the cap in flight,
    no pile-up of the mix explains it: the card changed (a neighbour came), and, as where sizes are one, the
    limit is the requests left in flight till the next reading. Without it, the demo's requests (read as a mix)
    answered 503 beside a neighbour that had taken the card came straight back in and ran out again: 10 to 29
    OOMs at its arrival with 8 clients, where 5 to 6 with it."""
    card = 48 * GiB
    c = a_mix(card)
    assert c.limit == 8
    c.on_oom(now_s=3.01, epoch=c.epoch, in_flight=8)
    c.after_oom(7.0)
    assert c.limit == 8 and c.describe()["bound"] == "memory"  # the cap in flight: a pile-up
    c.on_oom(now_s=3.02, epoch=c.epoch, in_flight=4)
    c.after_oom(3.0)
    assert c.limit == 3 and c.describe()["bound"] == "oom"  # half the cap: the card changed
    c.on_sample(now_s=3.1, sample=MemorySample(int(15.5 * GiB), card), in_flight=2)
    assert c.limit > 3 and c.describe()["bound"] == "memory"  # the next reading says what the card holds


def test_an_oom_in_a_mix_with_few_in_flight_plans_no_heavier_tail() -> None:
    """In a mix, OOMs with no more than half the cap in flight are no pile-up of its large ones: a neighbour
    came. They plan no heavier tail, so once the readings show the card as before, so is the limit; OOMs with
    the cap in flight (its large ones meeting) do plan for one."""
    card = 48 * GiB
    c = a_mix(card)
    z = c.memory.z
    for i in range(6):  # a neighbour's arrival, with four in flight each time
        c.on_oom(now_s=3.01 + i / 1000, epoch=c.epoch, in_flight=4)
        c.after_oom(3.0)
    assert c.memory.z == z and c.limit == 3
    # One that weighed a quarter of a slot: 3.75 stay. Judged once, by `on_oom`'s count: no pile-up, so the
    # slots wait for the next reading (judged again on 3.75 + 1, it had been ignored altogether).
    quarter = a_mix(card)
    quarter.on_oom(now_s=3.01, epoch=quarter.epoch, in_flight=4.0)
    quarter.after_oom(3.75)
    assert quarter.memory.z == z and quarter.limit == 3
    sums_gib = [3, 7.5, 12, 4.5, 9, 7.5, 3, 12, 7.5, 4.5]  # the neighbour gone: the readings of before
    for i, used_gib in enumerate(sums_gib):
        c.on_sample(now_s=3.1 + 0.1 * i, sample=MemorySample(int((8 + used_gib) * GiB), card), in_flight=2)
    assert c.limit == 8
    c.on_oom(now_s=4.2, epoch=c.epoch, in_flight=8)
    assert c.memory.z > z  # the cap in flight: a pile-up, planned for
