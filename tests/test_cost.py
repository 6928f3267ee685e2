"""Admission by weight: the `cost` hook says what a request weighs, the limit counts units.

A request goes in when its units fit beside what runs, or alone when nothing runs; the line stays
first come, first served; units always come back whole, whatever path a request takes.
"""

from __future__ import annotations

import math
from fractions import Fraction

import anyio
import httpx
import numpy
import pytest
from fastapi import FastAPI, Request
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from adaptive_gate import AdaptiveGate, Fixed
from adaptive_gate._gate.queue import FairLine
from adaptive_gate.core import units_of_cost
from adaptive_gate.limiter import Limiter, Waiter

from .helpers import find_gate

pytestmark = pytest.mark.anyio


def test_units_are_64ths_and_bad_costs_say_what_is_wrong() -> None:
    assert units_of_cost(4) == 4.0 and units_of_cost(0.3) == 19 / 64 and units_of_cost(1e-9) == 1 / 64
    # What a hook computes from an array's shape is often a numpy scalar: any real number counts.
    assert units_of_cost(numpy.int64(3)) == 3.0 and units_of_cost(numpy.float32(0.5)) == 0.5
    assert units_of_cost(Fraction(1, 2)) == 0.5
    for bad in (0, -1, math.nan, math.inf, "3", None, True, 2.0**40, numpy.float64("nan"), numpy.bool_(True)):
        with pytest.raises(ValueError, match="cost hook must return a number > 0"):
            units_of_cost(bad)


def test_a_heavy_request_waits_for_room_and_a_light_one_behind_it_waits_its_turn() -> None:
    limiter = Limiter(5, max_queue=8)
    assert limiter.try_acquire(2, now_s=0.0) and limiter.try_acquire(2, now_s=0.0)
    assert not limiter.try_acquire(2, now_s=0.0)  # 4 + 2 > 5
    heavy = limiter.join(Waiter(units=4), now_s=0.0)
    light = limiter.join(Waiter(units=1), now_s=0.0)
    assert not heavy.granted and not light.granted  # first come, first served: 1 would fit, but waits
    limiter.release(2, now_s=0.0)
    assert not heavy.granted  # 2 + 4 > 5
    limiter.release(2, now_s=0.0)
    assert heavy.granted and light.granted and limiter.in_flight == 5


def test_a_request_heavier_than_the_limit_runs_alone() -> None:
    limiter = Limiter(3, max_queue=4)
    assert limiter.try_acquire(1, now_s=0.0)
    huge = limiter.join(Waiter(units=10), now_s=0.0)
    limiter.release(1, now_s=0.0)
    assert huge.granted and limiter.in_flight == 10  # alone: never starved by its own weight
    assert not limiter.try_acquire(1, now_s=0.0)
    limiter.release(10, now_s=0.0)
    assert limiter.in_flight == 0 and limiter.try_acquire(10, now_s=0.0)


class WeightedLimiterMachine(RuleBasedStateMachine):
    """Random weights, limits, joins, leaves and releases: no unit lost, none counted twice."""

    def __init__(self) -> None:
        super().__init__()
        self.limiter = Limiter(4, max_queue=6)
        self.holding: list[float] = []  # units of each holder
        self.waiting: list[Waiter] = []

    @rule(units=st.sampled_from([1 / 64, 0.5, 1, 1.5, 3, 7]))
    def arrive(self, units: float) -> None:
        if self.limiter.try_acquire(units, now_s=0.0):
            self.holding.append(units)
        elif self.limiter.queued < self.limiter.max_queue:
            self.waiting.append(self.limiter.join(Waiter(units=units), now_s=0.0))

    @precondition(lambda self: self.holding)
    @rule(index=st.integers(0, 100))
    def release(self, index: int) -> None:
        self.limiter.release(self.holding.pop(index % len(self.holding)), now_s=0.0)
        self.collect()

    @precondition(lambda self: self.waiting)
    @rule(index=st.integers(0, 100))
    def leave(self, index: int) -> None:
        self.limiter.leave(self.waiting.pop(index % len(self.waiting)), now_s=0.0)
        self.collect()

    @rule(limit=st.integers(1, 8))
    def resize(self, limit: int) -> None:
        self.limiter.set_limit(limit, 0.0)
        self.collect()

    def collect(self) -> None:
        for waiter in [w for w in self.waiting if w.granted]:
            self.waiting.remove(waiter)
            self.holding.append(waiter.units)

    @invariant()
    def books_balance(self) -> None:
        self.collect()
        assert self.limiter.in_flight == sum(self.holding)
        assert self.limiter.queued == len(self.waiting)
        # Over the limit only by a request let in alone, or by holders from before the limit fell.
        if self.waiting:
            head = self.waiting[0]
            assert self.limiter.in_flight > 0 and self.limiter.in_flight + head.units > self.limiter.limit


TestWeightedLimiter = WeightedLimiterMachine.TestCase


class WeightedFairLimiterMachine(WeightedLimiterMachine):
    """The same with priorities and tenants: whoever the fair line puts first keeps its place until
    its units fit, and nobody else goes in meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        # A still clock: aging moves nobody between two events, so the head is what the limiter saw.
        self.limiter = Limiter(4, max_queue=6, line=FairLine(aging_s=10.0))

    @rule(units=st.sampled_from([0.5, 1, 3, 7]), priority=st.integers(-1, 1), tenant=st.sampled_from(["a", "b", None]))
    def arrive_classed(self, units: float, priority: int, tenant: str | None) -> None:
        if self.limiter.try_acquire(units, now_s=0.0):
            self.holding.append(units)
        elif self.limiter.queued < self.limiter.max_queue:
            self.waiting.append(self.limiter.join(Waiter(priority, tenant, units=units), now_s=0.0))

    @invariant()
    def books_balance(self) -> None:
        self.collect()
        assert self.limiter.in_flight == sum(self.holding)
        assert self.limiter.queued == len(self.waiting)
        if self.waiting:  # the one the line serves next does not fit, or it would have gone in
            head = self.limiter.line.peek_next(0.0)
            assert self.limiter.in_flight > 0 and self.limiter.in_flight + head.units > self.limiter.limit


TestWeightedFairLimiter = WeightedFairLimiterMachine.TestCase


def weighted_app(**gate_options: object) -> tuple[FastAPI, list[float]]:
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None, **gate_options)  # type: ignore[arg-type]
    seen: list[float] = []

    @app.post("/infer", tags=["gpu"])
    async def infer(request: Request) -> dict[str, float]:
        seen.append(find_gate(app).statistics().in_flight)
        await anyio.sleep(0.01)
        return {"batch": float(request.query_params["n"])}

    return app, seen


async def test_the_gate_counts_what_requests_weigh() -> None:
    app, seen = weighted_app(controller=Fixed(4), cost=lambda scope: float(scope["query_string"].split(b"=")[1]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
        async with anyio.create_task_group() as tg:
            for n in [3, 1, 2, 4, 1, 1, 3, 2]:
                tg.start_soon(client.post, f"/infer?n={n}")
        gate = find_gate(app)
        assert max(seen) <= 4  # never more units at once than the limit
        stats = gate.statistics()
        assert stats.in_flight == 0 and stats.counters["completed"] == 8
        assert gate.status()["options"]["cost"].startswith("<function")


async def test_a_cost_hook_that_answers_nonsense_fails_the_request_and_holds_nothing() -> None:
    app, _ = weighted_app(cost=lambda scope: -1.0)
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post("/infer?n=1")
        assert response.status_code == 500
        assert find_gate(app).statistics().in_flight == 0


def test_a_cost_that_is_not_callable_is_refused_with_a_fix() -> None:
    with pytest.raises(TypeError, match=r"cost must be None .* or a callable \(scope\) -> float"):
        AdaptiveGate(FastAPI(), cost=3)  # type: ignore[arg-type]


def test_a_full_line_behind_a_heavy_head_is_not_ready() -> None:
    """Found in review: with units free beside a heavy waiter at the head, readiness said ready
    while every newcomer was answered queue_full."""
    from adaptive_gate import Fixed
    from adaptive_gate.core import ADMITTED, GateCore
    from adaptive_gate.limiter import Waiter

    core = GateCore(Fixed(4), min_limit=1, max_limit=4, initial_limit=None, max_queue=1, max_retry_after_s=60)
    assert core.arrive(30.0, units=3, now_s=0.0) is ADMITTED
    assert isinstance(core.arrive(30.0, units=2, now_s=0.0), Waiter)  # waits: 3 + 2 > 4
    assert core.arrive(30.0, units=1, now_s=0.0) == "queue_full"  # 1 would fit beside the 3, but the line is full
    assert core.readiness()[0] is False


def test_a_tick_serves_a_waiter_that_the_line_put_first_meanwhile() -> None:
    """Found in review: in overload the fair line turns newest first within a tenant once its line
    has stood long enough, with nobody arriving or leaving; a light waiter that now came first and
    fits sat beside a free unit until some unrelated event."""
    from adaptive_gate._gate.overload import OverloadDetector

    now_s = [0.0]
    detector = OverloadDetector(0.005)
    detector.overloaded = True  # in overload
    limiter = Limiter(4, max_queue=10, line=FairLine(10.0, detector))
    assert limiter.try_acquire(3, now_s=now_s[0])
    limiter.join(Waiter(0, "a", 99, units=2), now_s=now_s[0])  # the oldest: served first, but 3 + 2 > 4
    now_s[0] = 0.01
    light = limiter.join(Waiter(0, "a", 99, units=1), now_s=now_s[0])
    now_s[0] = 0.2  # tenant a's line has stood: newest first, and the light one fits
    assert not light.granted
    limiter.reconsider(now_s[0])
    assert light.granted and limiter.in_flight == 4


async def test_acquire_waits_for_room_for_its_units() -> None:
    limiter = Limiter(4, max_queue=4)
    await limiter.acquire(units=3)
    got: list[float] = []

    async def heavy() -> None:
        await limiter.acquire(units=2)
        got.append(limiter.in_flight)
        limiter.release(2, now_s=0.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(heavy)
        await anyio.sleep(0.01)
        assert got == [] and limiter.queued == 1  # 3 + 2 > 4: it waits
        limiter.release(3, now_s=0.0)
    assert got == [2] and limiter.in_flight == 0 and limiter.queued == 0
