"""Route weights: each route's bytes per request, told apart from one reading of the whole card."""

from __future__ import annotations

import random

import anyio
import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_gate import AIMD, AdaptiveGate, Fixed
from adaptive_gate._control.route_weights import MAX_ROUTES, MIN_READINGS, WEIGHT_RANGE, WINDOW_READINGS, RouteWeights
from adaptive_gate._gate.operator import OperatorBounds
from adaptive_gate.core import ADMITTED, GateCore, Outcome, Ticket
from adaptive_gate.memory import MemorySample

from .helpers import client_for, find_gate, wait_until

GiB = 1 << 30
BASELINE = 8 * GiB


def feed(weights: RouteWeights, sizes: dict[str, float], readings: int, seed: int = 1, neighbour=lambda i: 0) -> None:
    """`readings` readings of a card where each route's requests come and go at random."""
    rng = random.Random(seed)
    # As the core does: a request holds the weight of its route at its admission, and gives back
    # exactly that. What it holds on the card is its route's size, whatever it weighs.
    held: dict[str, list[float]] = {route: [] for route in sizes}
    for i in range(readings):
        for route in sizes:
            target = rng.randint(0, 3)
            while len(held[route]) < target:
                held[route].append(weights.weight(route))
            while len(held[route]) > target:
                held[route].pop(0)
        used = BASELINE + neighbour(i) + sum(sizes[r] * len(h) for r, h in held.items())
        weights.observe(used, {route: sum(h) for route, h in held.items()})


def test_two_routes_are_told_apart_by_the_mix_in_flight() -> None:
    weights = RouteWeights()
    feed(weights, {"/small": 1.5 * GiB, "/large": 6 * GiB}, 60)
    assert weights.fits > 0
    small, large = weights.weight("/small"), weights.weight("/large")
    assert large / small == pytest.approx(4.0, rel=0.01)
    # About as many of each ran: the mean request holds about 3.75 GiB, and weighs about 1.
    assert 0.3 < small < 0.6 and 1.2 < large < 2.4
    assert weights.weight("/never-seen") == 1.0
    assert weights.weights() == {"/small": round(small, 3), "/large": round(large, 3)}


@pytest.mark.parametrize(
    ("period_s", "fewest", "most"),
    [(0.1, MIN_READINGS, 2 * MIN_READINGS), (0.5, MIN_READINGS // 2, MIN_READINGS // 2 + 2)],
)
def test_readings_further_apart_are_fitted_after_fewer_of_them(period_s: float, fewest: int, most: int) -> None:
    """Sixteen readings at the default tenth of a second; half as many where they are half a second
    apart (each catches other requests): a mix of routes read every half second waited 8 s for its
    weights, and served 0.92 of the reader."""
    weights = RouteWeights()
    rng = random.Random(2)
    sizes = {"/small": 1.5 * GiB, "/large": 6 * GiB}
    readings = 0
    while weights.fits == 0 and readings < 2 * MIN_READINGS:
        held = {route: rng.randint(0, 3) for route in sizes}
        used = BASELINE + sum(sizes[route] * n for route, n in held.items())
        weights.observe(used, {route: float(n) for route, n in held.items()}, now_s=readings * period_s)
        readings += 1
    assert fewest <= readings <= most  # the first fit: one or two may not explain the readings yet
    assert weights.weight("/large") / weights.weight("/small") == pytest.approx(4.0, rel=0.01)


def test_a_route_in_flight_at_one_reading_in_twelve_is_weighed() -> None:
    """One request in ten is of a route that holds eight times the others' bytes and fills most of the card:
    it runs alone, and is in flight at about one reading in twelve. Its requests vary less than a route's in
    flight at one reading in nine (a variance of 0.1): it was never weighed, and a mix told nothing ran out of
    memory forty times a minute with 32 clients, at 0.85 of the reader."""
    weights = RouteWeights()
    for i in range(48):
        large = i % 12 == 0
        row = {"/small": 0.0 if large else float(2 + i % 4), "/large": 1.0 if large else 0.0}
        used = BASELINE + row["/small"] * 2 * GiB + row["/large"] * 16 * GiB
        weights.observe(used, row, now_s=i * 0.1)
    assert weights.fits > 0
    assert weights.weight("/large") / weights.weight("/small") == pytest.approx(8.0, rel=0.01)


@pytest.mark.parametrize("caught", [1, 2, 3])
def test_a_route_that_varied_in_one_request_alone_is_not_weighed_on_it(caught: int) -> None:
    """A window of one large request of 7 GiB and a few small ones; at the last readings, one or several in a
    row, a second large one is in flight, caught as it begins to allocate (it will fail: two do not fit). A fit
    on that one request weighed the large route at a fraction of the small one, and let its requests in by the
    handful."""
    weights = RouteWeights()
    readings = WINDOW_READINGS + 1  # the first registers the routes
    for i in range(readings):
        second = i >= readings - caught
        row = {"/small": float(i % 3), "/large": 2.0 if second else 1.0}
        # the second large one holds half a GiB so far
        used = BASELINE + row["/small"] * 1.75 * GiB + 7 * GiB + (GiB // 2 if second else 0)
        weights.observe(used, row, now_s=i * 0.1)
    assert weights.fits == 0 and weights.weight("/large") == 1.0


def test_one_route_is_never_weighed() -> None:
    weights = RouteWeights()
    feed(weights, {"/only": 3 * GiB}, 60)
    assert weights.fits == 0 and weights.weight("/only") == 1.0


def test_routes_that_always_run_together_cannot_be_told_apart() -> None:
    weights = RouteWeights()
    for _ in range(40):
        for n in (1, 2, 3, 2):
            weights.observe(BASELINE + n * (1 + 5) * GiB, {"/a": n, "/b": n})
    assert weights.fits == 0 and weights.weight("/a") == weights.weight("/b") == 1.0


def test_routes_of_a_gate_held_at_its_limit_are_told_apart_by_the_others_bytes() -> None:
    """Two in flight at every reading, of two routes in any mix: the sum never varies, so the others'
    bytes cannot be told from what every request holds alike, and no line fits. The others' bytes as
    the memory model holds them stand in for them."""
    sizes = {"/small": 2.2 * GiB, "/large": 17.6 * GiB}
    rng = random.Random(5)
    blind, told = RouteWeights(), RouteWeights()
    for _ in range(60):
        large = rng.choice([0, 1, 1, 2])
        used = BASELINE + large * sizes["/large"] + (2 - large) * sizes["/small"]
        units = {"/large": large * blind.weight("/large"), "/small": (2 - large) * blind.weight("/small")}
        blind.observe(used, units)
        units = {"/large": large * told.weight("/large"), "/small": (2 - large) * told.weight("/small")}
        told.observe(used, units, others_bytes=BASELINE)
    assert blind.fits == 0 and blind.weight("/large") == 1.0
    assert told.fits > 0 and told.weight("/large") / told.weight("/small") == pytest.approx(8.0, rel=0.01)


def test_requests_that_ran_out_of_memory_are_taken_out_of_the_readings_that_counted_them() -> None:
    """A large request whose allocation failed holds nothing, and counts in flight until its error is
    told two readings later. Counted, such readings say the large route holds little, and no fit
    explains them; taken out when the error comes, the routes are told apart (only the newest
    readings, whose failures are not told yet, stray, and the fit's tolerance, a quarter of the
    lightest route's bytes per request, keeps them from bending it)."""
    sizes = {"/small": 1.5 * GiB, "/large": 6 * GiB}
    rng = random.Random(4)
    blind, told = RouteWeights(), RouteWeights()
    doomed: list[tuple[int, int]] = []  # (its serial, told at reading)
    admitted = 0
    for i in range(100):
        now_s = i * 0.1
        held = {route: rng.randint(0, 3) for route in sizes}
        if rng.random() < 0.3:
            admitted += 1
            doomed.append((admitted, i + 2))
        used = BASELINE + sum(sizes[route] * n for route, n in held.items())
        counted = held | {"/large": held["/large"] + len(doomed)}
        for weights in (blind, told):
            units = {route: n * weights.weight(route) for route, n in counted.items()}
            weights.observe(used, units, now_s=now_s, admitted=admitted)
        for serial, _ in [d for d in doomed if d[1] == i]:
            told.failed("/large", 1, serial)
        doomed = [d for d in doomed if d[1] != i]
    assert blind.fits == 0 and blind.weight("/large") == 1.0
    assert told.fits > 0 and told.weight("/large") / told.weight("/small") == pytest.approx(4.0, rel=0.01)
    told.failed("/never-seen", 1, 1)  # a route with no column: nothing to take out
    assert told.weight("/large") / told.weight("/small") == pytest.approx(4.0, rel=0.01)


def test_a_neighbour_arriving_inside_the_window_is_no_evidence() -> None:
    weights = RouteWeights()
    sizes = {"/small": 1.5 * GiB, "/large": 6 * GiB}
    feed(weights, sizes, 30)
    fitted = weights.fits
    assert fitted > 0
    # From now on 6 GiB more is held by someone else: no line fits across the change.
    feed(weights, sizes, 30, seed=2, neighbour=lambda i: 6 * GiB)
    assert weights.fits == fitted and weights.weight("/large") / weights.weight("/small") == pytest.approx(4, rel=0.01)
    weights.forget()  # the memory model says the card changed: the window starts again
    feed(weights, sizes, 20, seed=3, neighbour=lambda i: 6 * GiB)
    assert weights.fits > fitted and weights.weight("/large") / weights.weight("/small") == pytest.approx(4, rel=0.01)


def caught_before_they_allocate(
    weights: RouteWeights, sizes: dict[str, float], *, others: bool, told: dict[str, float] | None = None
) -> int:
    """100 readings of up to six requests of each route in flight, each caught before it allocates one
    time in five (it holds nothing yet): no line explains them. `others`: the others' bytes are known;
    `told`: each route's cost (1 where not given). How many readings changed the weights."""
    rng = random.Random(3)
    changes = 0
    for i in range(100):
        held = {route: rng.randint(0, 6) for route in sizes}
        allocated = {route: sum(rng.random() < 0.8 for _ in range(n)) for route, n in held.items()}
        used = BASELINE + sum(sizes[route] * n for route, n in allocated.items())
        units = {route: n * (told or {}).get(route, 1.0) * weights.weight(route) for route, n in held.items()}
        changes += weights.observe(used, units, BASELINE if others else None, now_s=i * 0.1)
    return changes


def test_routes_whose_requests_allocate_late_are_weighed_by_the_readings_that_caught_them_all_allocated() -> None:
    """No line explains readings that catch requests before they allocate, and counted as one, a mix of
    routes ran out of memory five times a second. Those readings lie below the line of the routes' bytes;
    the readings on it, less the others' bytes, weigh the routes exactly, once, whether a cost came or not
    (a fit of all the readings is biased, and would flip the weights back and forth). Without the others'
    bytes nothing tells our bytes: no weight."""
    sizes = {"/small": 1.5 * GiB, "/large": 6 * GiB}
    told_nothing, blind, costed = RouteWeights(), RouteWeights(), RouteWeights()
    costed.costs_told = True
    assert caught_before_they_allocate(told_nothing, sizes, others=True) == 1  # refined since, never moved
    assert caught_before_they_allocate(costed, sizes, others=True) == 1
    assert caught_before_they_allocate(blind, sizes, others=False) == 0 and blind.by_route == {}
    for weights in (told_nothing, costed):
        assert weights.weight("/large") / weights.weight("/small") == pytest.approx(4.0, rel=1e-3)
        assert weights.fits > 1


def test_a_cost_told_off_the_bytes_ratio_is_corrected_by_the_readings_that_caught_every_request_allocated() -> None:
    """The large route told a cost of 6 where its requests hold 4 small ones' bytes, each caught before it
    allocates one time in five: a slot of the large route is worth two thirds of a small request's. Counted
    as told, the large route ran two thirds of the large requests that fit beside the small ones."""
    weights = RouteWeights()
    weights.costs_told = True
    sizes = {"/small": 1.5 * GiB, "/large": 6 * GiB}
    assert caught_before_they_allocate(weights, sizes, others=True, told={"/large": 6.0}) == 1
    # A large request weighs 6 units of its route's weight, and holds 4 small requests' bytes
    large, small = 6 * weights.weight("/large"), weights.weight("/small")
    assert large / small == pytest.approx(4.0, rel=1e-3)


def test_the_core_tells_its_route_weights_and_its_controller_whether_a_cost_came() -> None:
    controller = AIMD()
    core = core_with(controller, [0.0])
    weights = core.route_weights
    assert weights is not None
    for units, requests in ((1, 1.0), (1, None), (2, 2.0)):
        assert not weights.costs_told and not controller.memory.told()
        assert core.arrive(30.0, units=units, route="/a", now_s=0.0) is ADMITTED
        core.release(core.admitted(0.0, 0.0, units, "/a", requests), 0.0, Outcome.COMPLETED)
    assert weights.costs_told and controller.memory.told()


def test_routes_past_the_first_few_are_fitted_together_and_weigh_one() -> None:
    weights = RouteWeights()
    sizes = {"/small": 1.5 * GiB, "/large": 6 * GiB} | {f"/r{i}": 3 * GiB for i in range(MAX_ROUTES)}
    weights.observe(BASELINE + 7.5 * GiB, {"/small": 1, "/large": 1})  # the first two seen are told apart
    feed(weights, sizes, 200)
    assert weights.fits > 0
    # The last two share a column: fitted, so they bend nobody's bytes, but never weighed.
    assert len(weights.by_route) == MAX_ROUTES and weights.weight(f"/r{MAX_ROUTES - 1}") == 1.0
    assert weights.weight("/large") / weights.weight("/small") == pytest.approx(4, rel=0.01)


def test_a_route_weighed_at_next_to_nothing_is_weighed_again_once_its_requests_hold_their_bytes() -> None:
    """Requests that ran out of memory hold nothing while they count as in flight. On a card that
    holds one large request, most large ones do at first: the readings say the large route holds
    next to nothing, and it weighs a 16th of a slot. A few of them in flight then vary by a few
    16ths of a slot, which is no variation at all, counted in slots: the weight was never fitted
    again, and every OOM after it named the bytes of 91 GiB a slot. Counted in requests, it is."""
    weights = RouteWeights()
    feed(weights, {"/small": 1.5 * GiB, "/large": 0.05 * GiB}, 40)
    assert weights.weight("/large") < weights.weight("/small") / 16
    feed(weights, {"/small": 1.5 * GiB, "/large": 6 * GiB}, 60, seed=2)
    assert weights.weight("/large") / weights.weight("/small") == pytest.approx(4.0, rel=0.01)


def test_a_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match=f"window must be >= {MIN_READINGS}"):
        RouteWeights(window=3)


events = st.lists(
    st.tuples(
        st.floats(0, 2**50),
        st.dictionaries(st.sampled_from(["/a", "/b", "/c", 7]), st.floats(0, 64)),
        st.none() | st.floats(0, 2**50),
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(events)
def test_any_readings_leave_weights_finite_and_in_range(
    sequence: list[tuple[float, dict[object, float], float | None]],
) -> None:
    weights = RouteWeights(window=MIN_READINGS)
    for used, units_by_route, others_bytes in sequence:
        weights.observe(used, units_by_route, others_bytes)
        for name in ("/a", "/b", "/c", 7):
            assert WEIGHT_RANGE[0] <= weights.weight(name) <= WEIGHT_RANGE[1]


# -- in the core -------------------------------------------------------------------------------


def core_with(controller: object, now: list[float]) -> GateCore:
    return GateCore(
        controller,  # type: ignore[arg-type]
        min_limit=1,
        max_limit=64,
        initial_limit=64,
        max_queue=8,
        max_retry_after_s=60,
    )


def test_the_core_weighs_routes_by_what_their_requests_hold_and_gives_back_what_it_took() -> None:
    now = [0.0]
    controller = AIMD()
    units_changed = []
    forget = controller.memory.units_changed
    controller.memory.units_changed = lambda: (units_changed.append(now[0]), forget())[-1]  # type: ignore[method-assign]
    core = core_with(controller, now)
    sizes = {"/light": 1 * GiB, "/heavy": 4 * GiB}
    rng = random.Random(3)
    running: list[tuple[str, Ticket]] = []
    for _ in range(400):
        now[0] += 0.1
        for entry in list(running):  # each ends with even odds
            if rng.random() < 0.5:
                running.remove(entry)
                core.release(entry[1], now[0], Outcome.COMPLETED)
        for route in sizes:  # some start
            for _ in range(rng.randint(0, 2)):
                units = core.weigh(route, 1)
                assert core.arrive(30.0, units=units, route=route, now_s=now[0]) is ADMITTED
                running.append((route, core.admitted(now[0], 0.0, units, route)))
        used = 2 * GiB + sum(sizes[route] for route, _ in running)
        core.sample(MemorySample(used, 64 * GiB), now[0])
    assert core.weigh("/heavy", 1) / core.weigh("/light", 1) == pytest.approx(4, rel=0.05)
    assert core.weigh("/heavy", 0.5) == pytest.approx(core.weigh("/heavy", 1) / 2, abs=1 / 64)  # times its cost
    assert set(core.statistics(now[0]).route_weights) == {"/light", "/heavy"}
    assert units_changed, "a change of what one slot means restarts the knee's table"
    for _, ticket in running:
        core.release(ticket, now[0], Outcome.COMPLETED)
    assert core.statistics(now[0]).in_flight == 0 and all(units == 0 for units in core.requests_by_route.values())


def test_a_fixed_limit_counts_requests_whatever_they_hold() -> None:
    now = [0.0]
    core = core_with(Fixed(4), now)
    assert core.route_weights is None and core.weigh("/heavy", 1) == 1 and core.weigh("/heavy", 2.5) == 2.5
    assert core.statistics(now[0]).route_weights == {}


def test_weights_hold_steady_while_requests_weighed_before_a_change_still_run() -> None:
    # Requests that outlive a fit (here about 3 s, 30 readings) still hold the slots they were
    # weighed with. Fitted as if they held the new weights, they bent the next fit by the ratio of
    # the two: the weights swung (4 -> 5.7 -> 3.5 -> 7.6 -> 2.7 ...), each swing wiping the knee.
    now = [0.0]
    controller = AIMD()
    core = core_with(controller, now)
    sizes = {"/light": 1 * GiB, "/heavy": 4 * GiB}
    rng = random.Random(1)
    running: list[tuple[float, Ticket]] = []  # (when it ends, its ticket)
    ratios = []
    for _ in range(1500):
        now[0] += 0.1
        for entry in [e for e in running if e[0] <= now[0]]:
            running.remove(entry)
            core.release(entry[1], now[0], Outcome.COMPLETED)
        for route in sizes:
            if rng.random() < 0.3:
                units = core.weigh(route, 1)
                assert core.arrive(30.0, units=units, route=route, now_s=now[0]) is ADMITTED
                running.append((now[0] + rng.uniform(1.5, 4.5), core.admitted(now[0], 0.0, units, route)))
        used = 2 * GiB + sum(sizes[t.route] for _, t in running)  # type: ignore[index]
        before = dict(core.route_weights.by_route)  # type: ignore[union-attr]
        core.sample(MemorySample(used, 1 << 40), now[0])
        if core.route_weights.by_route != before:  # type: ignore[union-attr]
            ratios.append(core.weigh("/heavy", 1) / core.weigh("/light", 1))
    assert ratios, "the routes were told apart"
    assert all(ratio == pytest.approx(4, rel=0.1) for ratio in ratios), ratios
    for _, ticket in running:
        core.release(ticket, now[0], Outcome.COMPLETED)
    assert core.statistics(now[0]).in_flight == 0 and all(units == 0 for units in core.requests_by_route.values())


def weighed_before_a_change(core: GateCore) -> list[Ticket]:
    """Two heavy requests and a light one, admitted at a slot each; then the weights change to 2 and
    0.5 while they run: 4.5 slots of now where they took 3."""
    tickets = []
    for route in ("/heavy", "/heavy", "/light"):
        assert core.arrive(30.0, units=1, route=route, now_s=0.0) is ADMITTED
        tickets.append(core.admitted(0.0, 0.0, 1, route))
    assert core.route_weights is not None
    core.route_weights.by_route.update({"/heavy": 2.0, "/light": 0.5})
    return tickets


def test_an_oom_counts_its_level_in_the_slots_of_the_weights_of_now() -> None:
    """Three requests weighed one slot each; then the readings weigh the heavy route four times the
    light one. One of them runs out of memory: the level that did not fit is what they are worth now
    (2 + 2 + 0.5 slots), not the three slots they took, which barred a level the model knows fits;
    and it is weaker evidence, as an OOM the app caught, for what ran when it allocated was weighed
    otherwise."""
    now = [0.0]
    controller = AIMD()
    levels: list[float] = []
    weak = controller.on_swallowed_oom
    controller.on_oom = lambda **told: levels.append(-1)  # type: ignore[method-assign]
    controller.on_swallowed_oom = lambda **told: (levels.append(told["in_flight"]), weak(**told))[-1]  # type: ignore[method-assign]
    core = core_with(controller, now)
    tickets = weighed_before_a_change(core)
    core.oom(tickets[0], 0.1)
    assert levels == [4.5]
    for ticket in tickets:
        core.release(ticket, 0.2, Outcome.OOM if ticket is tickets[0] else Outcome.COMPLETED)
    assert core.statistics(0.2).in_flight == 0


def test_a_reading_counts_the_requests_in_flight_in_the_slots_of_the_weights_of_now() -> None:
    """Three requests weighed one slot each; then the readings weigh the heavy route four times the
    light one, and a reading comes while the three still run. The memory model reads what they hold
    in the slots of now (2 + 2 + 0.5), as the route fit does. Told the three slots they took, it read
    a slot as holding half again its bytes and took the routes for a mix of sizes: on a card read every
    half second, where five fit, the limit reached five 17 s after the weights, where it takes 3.5 s."""
    now = [0.0]
    controller = AIMD()
    read: list[float] = []
    on_sample = controller.on_sample
    controller.on_sample = lambda **told: (read.append(told["in_flight"]), on_sample(**told))[-1]  # type: ignore[method-assign]
    core = core_with(controller, now)
    tickets = weighed_before_a_change(core)
    core.sample(MemorySample(17 * GiB, 64 * GiB), 0.1)
    assert read == [4.5]
    for ticket in tickets:
        core.release(ticket, 0.2, Outcome.COMPLETED)
    assert core.statistics(0.2).in_flight == 0


def test_an_oom_beside_a_request_weighed_before_the_weights_changed_is_weaker_evidence_after_it_left() -> None:
    """A heavy request waited in the line while the heavy route's weight went from 1 to 2, and took 1
    slot where it is worth 2. A light one admitted beside it runs out of memory after it has left:
    the level in flight at the OOM is what runs now, not what ran out, and the OOM is weaker
    evidence (kept seconds, not minutes). Barred as any OOM, it held a mix of routes a quarter of a
    slot below the room for the rest of a minute."""
    now = [0.0]
    controller = AIMD()
    told: list[str] = []
    weak = controller.on_swallowed_oom
    controller.on_oom = lambda **_: told.append("placed")  # type: ignore[method-assign]
    controller.on_swallowed_oom = lambda **kw: (told.append("weak"), weak(**kw))[-1]  # type: ignore[method-assign]
    core = core_with(controller, now)
    assert core.route_weights is not None
    core.route_weights.by_route.update({"/heavy": 2.0, "/light": 0.5})
    core.route_weights.changed_s = -0.5  # as a reading would have at the change
    assert core.arrive(30.0, units=1, route="/heavy", now_s=0.0) is ADMITTED
    stale = core.admitted(0.0, 1.0, 1, "/heavy", requests=1)  # weighed 1 as it joined, before the change
    assert core.arrive(30.0, units=0.5, route="/light", now_s=0.1) is ADMITTED
    light = core.admitted(0.1, 0.0, 0.5, "/light", requests=1)
    core.release(stale, 0.2, Outcome.COMPLETED)
    core.oom(light, 0.3)
    core.release(light, 0.3, Outcome.OOM)
    fresh = []  # nothing stale ran beside these
    for _ in range(2):
        assert core.arrive(30.0, units=0.5, route="/light", now_s=0.4) is ADMITTED
        fresh.append(core.admitted(0.4, 0.0, 0.5, "/light", requests=1))
    core.oom(fresh[0], 0.5)
    for ticket in fresh:
        core.release(ticket, 0.5, Outcome.OOM if ticket is fresh[0] else Outcome.COMPLETED)
    assert told == ["weak", "placed"]
    assert core.statistics(0.5).in_flight == 0


def a_reading_that_refits(core: GateCore, refit: dict[str, float], now_s: float) -> None:
    """A reading whose route fit changes the weights to `refit`, as a fit of real readings would."""
    weights = core.route_weights
    assert weights is not None

    def reweighed(*_: object) -> bool:
        weights.by_route.update(refit)
        return True

    weights.reading = reweighed  # type: ignore[method-assign]
    core.sample(MemorySample(10 * GiB, 64 * GiB), now_s)
    del weights.reading


@pytest.mark.parametrize(("operator", "least"), [(None, 4), (OperatorBounds(1, 4), 2)], ids=["configured", "operator"])
def test_requests_weighed_before_the_weights_changed_never_hold_the_limit_below_the_least_in_force(
    operator: OperatorBounds | None, least: int
) -> None:
    """Three requests took a slot each; a reading weighs them 2 + 2 + 0.5 slots. The limit comes down by
    what they are worth beyond what they took, but not below the least limit in force: 4 as configured
    (it came down to 2), or an operator's 1 (down to 2, as the weights say)."""
    core = GateCore(AIMD(), min_limit=4, max_limit=4, initial_limit=4, max_queue=8, max_retry_after_s=60)
    core.set_operator(operator, 0.0)
    tickets = weighed_before_a_change(core)
    a_reading_that_refits(core, {"/heavy": 2.0, "/light": 0.5}, 0.1)  # as a reading tells it
    assert core.statistics(0.1).limit == least
    for ticket in tickets:
        core.release(ticket, 0.2, Outcome.COMPLETED)
    assert core.statistics(0.2).in_flight == 0


@pytest.mark.parametrize(
    ("refit", "told_first"),
    [({"/heavy": 2.0, "/light": 0.5}, "weak"), ({"/other": 0.5}, "placed")],
    ids=["their weights changed", "another route's changed"],
)
def test_an_oom_beside_a_request_that_ran_while_the_weights_changed_is_weaker_evidence_after_it_left(
    refit: dict[str, float], told_first: str
) -> None:
    """A heavy request runs at 1 slot when a reading weighs the heavy route 2: it holds the slot of
    then. A light one admitted beside it after the change runs out of memory once it has left: what
    ran when it allocated was heavier than the slots said, and the OOM is weaker evidence. Barred as
    any OOM, it held a mix of routes read every quarter second a slot below the room for a minute.
    Where the change left the weights of those in flight as they were, the OOM is placed."""
    controller = AIMD()
    told: list[str] = []
    weak = controller.on_swallowed_oom
    controller.on_oom = lambda **_: told.append("placed")  # type: ignore[method-assign]
    controller.on_swallowed_oom = lambda **kw: (told.append("weak"), weak(**kw))[-1]  # type: ignore[method-assign]
    core = core_with(controller, [0.0])
    before = []
    for route in ("/heavy", "/light"):
        assert core.arrive(30.0, units=1, route=route, now_s=0.0) is ADMITTED
        before.append(core.admitted(0.0, 0.0, 1, route))
    a_reading_that_refits(core, refit, 0.1)
    light_units = core.weigh("/light", 1)
    assert core.arrive(30.0, units=light_units, route="/light", now_s=0.15) is ADMITTED
    light = core.admitted(0.15, 0.0, light_units, "/light", requests=1)
    for ticket in before:
        core.release(ticket, 0.2, Outcome.COMPLETED)
    core.oom(light, 0.3)
    core.release(light, 0.3, Outcome.OOM)
    fresh = []  # nothing weighed before the change ran beside these
    for _ in range(2):
        assert core.arrive(30.0, units=light_units, route="/light", now_s=0.4) is ADMITTED
        fresh.append(core.admitted(0.4, 0.0, light_units, "/light", requests=1))
    core.oom(fresh[0], 0.5)
    for ticket in fresh:
        core.release(ticket, 0.5, Outcome.OOM if ticket is fresh[0] else Outcome.COMPLETED)
    assert told == [told_first, "placed"]
    assert core.statistics(0.5).in_flight == 0


def two_heavy_admitted(controller: AIMD) -> tuple[GateCore, list[Ticket]]:
    """A core on `controller` with two requests of "/heavy" admitted at 1 slot each, at time 0."""
    core = core_with(controller, [0.0])
    heavy = []
    for _ in range(2):
        assert core.arrive(30.0, units=1, route="/heavy", now_s=0.0) is ADMITTED
        heavy.append(core.admitted(0.0, 0.0, 1, "/heavy"))
    return core, heavy


def test_requests_worth_more_after_the_weights_changed_hold_the_difference_until_they_leave() -> None:
    """Two heavy requests took 1 slot each; a reading weighs their route 2. The limiter counts the
    slots they took, so it would let two more slots in beside them than the card holds: the limit
    stays lower by what they are worth beyond their slots, until they leave. Let in, the large ones
    of a mix of routes ran out of memory each time the weights were first learnt (10 OOMs in the first
    6 s where the card is read every quarter second). Once they have left, requests of a fraction of a
    slot, whose worth rounds a hair above the 64ths they took, move nothing."""
    controller = AIMD()
    core, heavy = two_heavy_admitted(controller)
    assert core.limiter.limit == controller.limit == 64
    a_reading_that_refits(core, {"/heavy": 2.0, "/light": 0.275}, 0.1)
    assert controller.limit == 64 and core.limiter.limit == 62
    core.release(heavy[0], 0.2, Outcome.COMPLETED)
    assert core.limiter.limit == 63
    core.release(heavy[1], 0.3, Outcome.COMPLETED)
    assert core.limiter.limit == 64 and core.statistics(0.3).in_flight == 0
    light = []
    for _ in range(20):  # a quarter of a light request: 1/16 of a slot taken, 0.0645 worth
        units = core.weigh("/light", 0.25)
        assert core.arrive(30.0, units=units, route="/light", now_s=0.4) is ADMITTED
        light.append(core.admitted(0.4, 0.0, units, "/light"))
    core.release(light.pop(), 0.5, Outcome.COMPLETED)
    core.sample(MemorySample(12 * GiB, 64 * GiB), 0.5)
    assert core.limiter.limit == controller.limit == 64
    for ticket in light:
        core.release(ticket, 0.6, Outcome.COMPLETED)
    assert core.statistics(0.6).in_flight == 0


@pytest.mark.parametrize("outcome", list(Outcome))
def test_the_difference_held_after_a_refit_comes_back_however_the_requests_end(outcome: Outcome) -> None:
    """A failure (an exception, a cancellation, a client gone) or an OOM gives back what a request
    from before the refit was worth beyond its slots, as a success does: the limit is whole again."""
    controller = AIMD()
    core, heavy = two_heavy_admitted(controller)
    a_reading_that_refits(core, {"/heavy": 2.0, "/light": 0.275}, 0.1)
    assert core.limiter.limit == 62
    for ticket in heavy:
        core.release(ticket, 0.2, outcome)
    assert core.limiter.limit == controller.limit == 64 and core.statistics(0.2).in_flight == 0


def test_a_request_weighed_before_the_weights_changed_is_one_request_when_admitted_after() -> None:
    """It took the slots of its arrival (1, at a weight of 1); admitted after its route's weight
    became 2, it is still one request, and the readings count it as the 2 slots it is worth now. As
    the slots it took at the weight of now (half a request), two large ones read as one holding the
    bytes of two, and the next fit made the large route's requests 12 times the small ones', where
    they were 4."""
    core = core_with(AIMD(), [0.0])
    assert core.arrive(30.0, units=1, route="/heavy", now_s=0.0) is ADMITTED
    assert core.route_weights is not None
    core.route_weights.by_route["/heavy"] = 2.0
    ticket = core.admitted(0.5, 0.5, 1, "/heavy", requests=1)
    assert core.in_flight_now().by_route == {"/heavy": 1.0}
    assert core.route_weights.slots(core.requests_by_route) == 2.0
    core.release(ticket, 1.0, Outcome.COMPLETED)
    assert core.in_flight_now()[:2] == (0, {"/heavy": 0.0})


@pytest.mark.anyio
async def test_the_middleware_counts_a_request_that_waited_across_a_change_of_weights_as_one() -> None:
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None, max_limit=1)
    go = anyio.Event()
    counted: list[dict[object, float]] = []

    @app.post("/heavy", tags=["gpu"])
    async def heavy() -> dict[str, bool]:
        counted.append(dict(find_gate(app).core.requests_by_route))
        await go.wait()
        return {"ok": True}

    async with client_for(app) as client, anyio.create_task_group() as tasks:
        tasks.start_soon(client.post, "/heavy")
        await wait_until(lambda: len(counted) == 1)
        tasks.start_soon(client.post, "/heavy")
        core = find_gate(app).core
        await wait_until(lambda: core.limiter.queued == 1)  # weighed 1 slot, at the weight of its arrival
        (route,) = counted[0]
        assert core.route_weights is not None
        core.route_weights.by_route[route] = 2.0
        go.set()
    assert [c[route] for c in counted] == [1.0, 1.0]
    assert core.statistics(0.0).in_flight == 0 and core.requests_by_route[route] == 0.0


def test_the_status_shows_every_weighed_route_even_where_labels_repeat() -> None:
    # Two apps mounted at /v1 and /v2 each have a "POST /predict": two routes, one label. The
    # status keyed them by label, so one weight hid the other; a label that is no str is shown as one.
    from adaptive_gate._observe.watch import GatedRoute

    v1, v2 = GatedRoute("POST /predict", True), GatedRoute("POST /predict", True)
    odd = GatedRoute("x", True)
    odd.label = ("POST", "/odd")  # type: ignore[assignment]
    weights = RouteWeights()
    weights.by_route.update({v1: 0.5, v2: 2.0, odd: 1.5})
    shown = weights.weights()
    assert sorted(shown.values()) == [0.5, 1.5, 2.0]
    assert all(isinstance(label, str) for label in shown) and "POST /predict" in shown


def test_a_change_of_units_restarts_the_memory_models_line() -> None:
    """Readings counted in the old slots and the new ones do not lie on one line: after a change of
    weights the model draws its line through the new readings only, and knows the new slot as soon
    as it has a line's worth of them."""
    from adaptive_gate.memory_model import MemoryModel

    def feed(model: MemoryModel, start_s: float, slots_per_request: float, readings: int = 12) -> None:
        for i in range(readings):
            requests = 1 + i % 5
            model.add(start_s + i * 0.1, requests * slots_per_request, BASELINE + requests * 2 * GiB, 64 * GiB)

    model = MemoryModel()
    feed(model, 0.0, 1.0)
    estimate = model.estimate()
    assert estimate is not None and estimate.per_request_bytes == pytest.approx(2 * GiB, rel=0.01)
    controller = AIMD(memory=model)
    controller.units_changed()  # a request now takes 1.25 slots of 1.6 GiB
    feed(model, 2.0, 1.25, readings=20)  # the first, read against the old slot, look like the others' moves
    estimate = model.estimate()
    assert estimate is not None and estimate.per_request_bytes == pytest.approx(1.6 * GiB, rel=0.01)
    assert estimate.baseline_bytes == pytest.approx(BASELINE, rel=0.01)


class Roomy(Fixed):
    """A controller whose model reads room for 4.7 slots at a limit of 4."""

    budget = 4.7


def test_a_budget_goes_no_further_than_an_operators_bound() -> None:
    """The model reads room for 4.7 slots; an operator who caps the gate at 4 gets 4 slots at most,
    not 4.7: a bound set by hand is whole slots."""
    now = [0.0]
    core = core_with(Roomy(4), now)
    core.set_operator(None, 0.0)  # the gate applies what its controller says
    assert core.limiter.limit == 4 and core.limiter.budget == 4.7
    assert core.statistics(0.0).budget == 4.7  # shown in the status beside the limit
    core.set_operator(OperatorBounds(1, 4), 0.0)
    assert core.limiter.limit == 4 and core.limiter.budget == 4
    core.set_operator(None, 0.0)
    assert core.limiter.budget == 4.7


def test_a_budget_goes_no_further_than_the_configured_max_limit() -> None:
    """The model reads room for 4.7 slots where the gate is configured with `max_limit=4`: 4 slots at most
    (it filled 4.7 with requests that weigh parts of one), as under an operator's bound; with room under
    the bound, the part of a slot more."""
    capped = GateCore(Roomy(4), min_limit=1, max_limit=4, initial_limit=4, max_queue=8, max_retry_after_s=60)
    capped.set_operator(None, 0.0)  # the gate applies what its controller says
    assert capped.limiter.limit == 4 and capped.limiter.budget == 4
    roomy = GateCore(Roomy(4), min_limit=1, max_limit=5, initial_limit=4, max_queue=8, max_retry_after_s=60)
    roomy.set_operator(None, 0.0)
    assert roomy.limiter.limit == 4 and roomy.limiter.budget == 4.7


def test_the_core_tells_routes_apart_at_its_limit() -> None:
    """Through the core: two requests in flight at every reading, of either route (a gate held at its
    limit). The sum never varies, and the others' bytes the memory model read idle tell the routes
    apart; every slot comes back."""
    now = [0.0]
    core = core_with(AIMD(), now)
    weights = core.route_weights
    assert weights is not None
    sizes = {"/light": 2 * GiB, "/heavy": 16 * GiB}
    core.sample(MemorySample(10 * GiB, 48 * GiB), now[0])  # idle: the others' bytes
    rng = random.Random(2)
    running: list[tuple[str, Ticket]] = []
    for _ in range(100):
        now[0] += 0.1
        for _, ticket in running:
            core.release(ticket, now[0], Outcome.COMPLETED)
        running = []
        if weights.fits:
            break  # told apart: two large ones now take more than the two slots of before
        for _ in range(2):
            route = rng.choice(list(sizes))
            units = core.weigh(route, 1)
            assert core.arrive(30.0, units=units, route=route, now_s=now[0]) is ADMITTED
            running.append((route, core.admitted(now[0], 0.0, units, route)))
        now[0] += 0.05
        core.sample(MemorySample(10 * GiB + sum(sizes[route] for route, _ in running), 48 * GiB), now[0])
    assert core.weigh("/heavy", 1) / core.weigh("/light", 1) == pytest.approx(8, rel=0.05)  # slots in 64ths
    assert core.statistics(now[0]).in_flight == 0 and all(units == 0 for units in core.requests_by_route.values())


def light_and_heavy_admitted() -> tuple[GateCore, RouteWeights, dict[str, Ticket]]:
    """A core that learns memory, with one request of `/light` and one of `/heavy` admitted at 0 s."""
    core = core_with(AIMD(), [0.0])
    weights = core.route_weights
    assert weights is not None
    tickets = {}
    for route in ("/light", "/heavy"):
        assert core.arrive(30.0, route=route, now_s=0.0) is ADMITTED
        tickets[route] = core.admitted(0.0, 0.0, 1, route)
    return core, weights, tickets


def test_the_core_takes_a_request_that_ran_out_of_memory_out_of_the_route_readings() -> None:
    core, weights, tickets = light_and_heavy_admitted()
    now_s = 0.1
    core.sample(MemorySample(12 * GiB, 48 * GiB), now_s)  # the heavy one holds nothing: it failed
    core.oom(tickets["/heavy"], now_s)
    core.release(tickets["/heavy"], now_s, Outcome.OOM)
    _, row, _, _, _ = weights._recent[-1]  # the reading, as the fit will read it
    assert sorted(row)[-2:] == [0.0, 1.0], "the light one stays, the heavy one is taken out"
    core.release(tickets["/light"], now_s, Outcome.COMPLETED)
    assert core.statistics(now_s).in_flight == 0


def test_a_reading_at_the_very_moment_of_an_admission_loses_the_failed_request_only_where_it_counted_it() -> None:
    """On virtual time, work and readings of round lengths put a reading and an admission at the same
    instant, either way round. A large request whose allocation failed leaves the readings that counted
    it, and no other: by time alone, one of the two orders kept it in flight holding nothing (a route
    fit on that reading weighed the large route at a sixteenth of the small one, and the limit let its
    requests in by the handful), and the other would take out a large one that held its bytes."""
    for reading_first in (False, True):
        core, weights, held = light_and_heavy_admitted()
        core.sample(MemorySample(16 * GiB, 48 * GiB), 0.5)  # both hold their bytes: 10 + 2 + 4
        if reading_first:
            core.sample(MemorySample(16 * GiB, 48 * GiB), 1.0)
        assert core.arrive(30.0, route="/heavy", now_s=1.0) is ADMITTED
        failing = core.admitted(1.0, 0.0, 1, "/heavy")
        if not reading_first:
            core.sample(MemorySample(16 * GiB, 48 * GiB), 1.0)  # two heavy in flight, one holding nothing
        core.oom(failing, 1.3)
        core.release(failing, 1.3, Outcome.OOM)
        when_s, row, *_ = weights._recent[-1]
        assert when_s == 1.0
        assert sorted(row)[-2:] == [1.0, 1.0], "the reading keeps the light one and the heavy one that held"
        for ticket in held.values():
            core.release(ticket, 1.5, Outcome.COMPLETED)
        assert core.statistics(1.5).in_flight == 0


def test_a_request_of_a_weighed_route_takes_the_64ths_above_its_weight_never_fewer() -> None:
    """Slots are counted in 64ths. To the nearest, a route weighing 0.536 of a slot took 0.531: a
    budget of 5.87 slots filled with such requests held 1% more bytes than it counted, and the card
    ran out at 5.86 of the 5.87 it had room for. The level that ran out was then held for two
    minutes, since the model had said it fitted (the limit one below what fits after a neighbour left)."""
    core = core_with(AIMD(), [0.0])
    assert core.route_weights is not None
    core.route_weights.by_route.update({"/light": 0.536, "/heavy": 2.14, "/exact": 0.5})
    assert core.weigh("/light", 1) == 35 / 64  # 0.547: not 34 / 64
    assert core.weigh("/heavy", 1) == 137 / 64
    assert core.weigh("/light", 2) == 69 / 64  # 1.072 of a slot
    assert core.weigh("/exact", 1) == 32 / 64  # a weight of whole 64ths takes those
    assert core.weigh("/light", 1e-6) == core.weigh("/light", 1e-12) == 1 / 64  # at least one
