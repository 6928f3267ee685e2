"""A `cost` whose bytes are not in proportion to it: a part per request, learned from the readings."""

from __future__ import annotations

import random

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from adaptive_gate import AIMD, AdaptiveGate, MemorySample
from adaptive_gate._control.cost_shape import CostShape
from adaptive_gate.core import ADMITTED, GateCore, Outcome, Ticket
from adaptive_gate.limiter import Waiter
from adaptive_gate.simulation import Phase, simulate
from adaptive_gate.testing import SimulatedGPU

from .helpers import find_gate

GiB = 2**30
OTHERS = 8 * GiB


def feed(
    shape: CostShape, fixed: float, per_unit: float, mixes: list[list[int]], *, caught: float = 0.0
) -> list[float]:
    """Readings of `mixes` (the costs in flight at each) on a card whose requests hold `fixed + per_unit * cost`,
    each request caught before it allocates with chance `caught`; what each change of shape said a slot holds."""
    rng = random.Random(7)
    changes = []
    for mix in mixes:
        held = sum(fixed + per_unit * c for c in mix if rng.random() >= caught)
        per_slot = shape.reading(OTHERS + held, len(mix), sum(shape.told(c) for c in mix), OTHERS)
        if per_slot is not None:
            changes.append(per_slot)
    return changes


def mixes(count: int, seed: int = 1, most: int = 8) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(1, most) for _ in range(rng.randint(2, 6))] for _ in range(count)]


def test_a_part_per_request_is_learned_and_the_mean_request_keeps_its_weight() -> None:
    """Batches of 1 to 8 images, each holding 2 GiB of workspace and 0.1 GiB an image: a batch of 8 holds
    1.33 times a batch of 1, not 8 times. After the fit the slots are in proportion to the bytes, a slot
    holds what the fit says, and the mean request in flight weighs about what it was told."""
    shape = CostShape()
    readings = mixes(40)
    changes = feed(shape, 2 * GiB, 0.1 * GiB, readings)
    assert len(changes) == 1 and shape.fits == 1  # once: in proportion after it, nothing more to move
    for cost in range(1, 9):
        assert abs(changes[0] * shape.slots(cost) - (2 + 0.1 * cost) * GiB) < 0.01 * GiB
    assert abs(shape.slots(8) / shape.slots(1) - 2.8 / 2.1) < 0.01
    mean_cost = sum(sum(m) / len(m) for m in readings[:16]) / 16
    assert abs(shape.slots(mean_cost) - mean_cost) < 0.05 * mean_cost


def test_costs_in_proportion_to_the_bytes_change_nothing() -> None:
    shape = CostShape()
    assert feed(shape, 0.0, 0.5 * GiB, mixes(200)) == []
    assert (shape.offset, shape.scale, shape.slots(3.0)) == (0.0, 1.0, 3.0)


def test_one_cost_for_every_request_tells_no_part_per_request() -> None:
    """Every batch of 4: the workspace and the images cannot be told apart, and nothing changes."""
    shape = CostShape()
    assert feed(shape, 2 * GiB, 0.1 * GiB, [[4] * n for n in (2, 3, 5, 6, 4) * 20]) == []
    assert shape.slots(4.0) == 4.0


def test_readings_that_catch_requests_before_they_allocate_are_set_aside() -> None:
    """Requests that allocate a while after admission (an input decoded first) hold nothing at some
    readings, which lie below the line: set aside, the fit is the line the others lie on."""
    shape = CostShape()
    changes = feed(shape, 2 * GiB, 0.1 * GiB, mixes(200), caught=0.15)
    assert changes
    assert abs(shape.slots(8) / shape.slots(1) - 2.8 / 2.1) < 0.05 * 2.8 / 2.1


def test_readings_that_no_line_explains_change_nothing() -> None:
    """Bytes that stray from any line by more than a quarter of a request, up and down (a neighbour
    whose bytes move at every reading) are no shape of a cost."""
    shape = CostShape()
    rng = random.Random(3)
    for mix in mixes(300):
        held = sum(2 * GiB + 0.1 * GiB * c for c in mix) + rng.uniform(0, 3 * GiB)
        assert shape.reading(OTHERS + held, len(mix), sum(shape.told(c) for c in mix), OTHERS) is None
    assert shape.offset == 0.0


@settings(max_examples=60, deadline=None)
@given(
    fixed_gib=st.floats(0.0, 4.0),
    per_unit_gib=st.floats(0.05, 1.0),
    most=st.integers(2, 16),
    seed=st.integers(0, 1000),
)
def test_requests_weigh_in_proportion_to_their_bytes_once_the_readings_tell(
    fixed_gib: float, per_unit_gib: float, most: int, seed: int
) -> None:
    """Whatever the part per request, clean readings leave requests weighing in proportion to their bytes:
    to within the 5% a fit must move the heaviest against the lightest by before it changes anything."""
    shape = CostShape()
    feed(shape, fixed_gib * GiB, per_unit_gib * GiB, mixes(120, seed, most))
    for cost in range(1, most + 1):
        told = shape.slots(cost) / shape.slots(1)
        held = (fixed_gib + per_unit_gib * cost) / (fixed_gib + per_unit_gib)
        assert abs(told / held - 1) <= 0.051


class _Forced(CostShape):
    """A shape that changes whenever the machine says so: what the fit would do, at any moment."""

    forced: tuple[float, float] | None = None

    def reading(self, used_bytes: float, requests: float, units: float, others_bytes: float | None) -> float | None:
        if self.forced is None:
            return None
        self._before = (self.offset, self.scale)
        self.offset, self.scale = self.forced
        self.forced = None
        return 0.5 * GiB


class ReshapeMachine(RuleBasedStateMachine):
    """Requests told a cost arrive, wait, run and end every way while the shape of their cost changes under
    them: every slot comes back, those from before a change leave nothing behind, and the line waits
    with what its requests weigh now."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.core = GateCore(AIMD(), min_limit=1, max_limit=12, initial_limit=6, max_queue=6, max_retry_after_s=60)
        self.shape = self.core.cost_shape = _Forced()
        self.core.sample(MemorySample(OTHERS, 24 * GiB), self.now)
        self.running: list[Ticket] = []
        self.waiting: list[tuple[Waiter, float]] = []  # and the cost it was told

    def _start_granted(self) -> None:
        for waiter, requests in [(w, r) for w, r in self.waiting if w.refused is not None or w.granted]:
            self.waiting.remove((waiter, requests))
            if waiter.refused is not None:
                self.core.rejected("deadline", timed_out=True, now_s=self.now)
            else:
                units, heavier = self.core.granted(waiter)
                self.running.append(self.core.admitted(self.now, 0.0, units, None, requests, heavier))

    @rule(dt=st.floats(0.0, 0.3))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @rule(cost=st.integers(1, 8))
    def arrive(self, cost: int) -> None:
        requests = self.core.shaped(float(cost))
        units = self.core.weigh(None, requests)
        admission = self.core.arrive(30.0, now_s=self.now, units=units)
        if admission is ADMITTED:
            self.running.append(self.core.admitted(self.now, 0.0, units, None, requests))
        elif isinstance(admission, str):
            self.core.rejected(admission, now_s=self.now)
        else:
            self.waiting.append((admission, requests))
            self._start_granted()

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100), outcome=st.sampled_from(list(Outcome)))
    def end(self, index: int, outcome: Outcome) -> None:
        ticket = self.running.pop(index % len(self.running))
        if outcome is Outcome.OOM:  # told as the gate tells it, before the slot goes back
            self.core.oom(ticket, self.now, tried_bytes=2 * GiB)
        self.core.release(ticket, self.now, outcome)
        self._start_granted()

    @precondition(lambda self: self.waiting)
    @rule(index=st.integers(0, 100))
    def leave(self, index: int) -> None:
        waiter, _ = self.waiting.pop(index % len(self.waiting))
        self.core.leave(waiter, self.now)
        self.core.left()
        self._start_granted()

    @rule(used_gib=st.integers(8, 24), offset=st.floats(0.0, 6.0), scale=st.floats(0.05, 1.0), change=st.booleans())
    def reading(self, used_gib: int, offset: float, scale: float, change: bool) -> None:
        if change:
            self.shape.forced = (offset, scale)
        self.core.sample(MemorySample(used_gib * GiB, 24 * GiB), self.now)
        self._start_granted()

    @invariant()
    def books_balance(self) -> None:
        core, limiter = self.core, self.core.limiter
        assert abs(limiter.in_flight - sum(t.units for t in self.running)) < 1e-9
        assert limiter.queued == len(self.waiting)
        from_before = [t for t in self.running if t.serial <= core._reshaped_serial]
        assert core._reshaped_in_flight <= len(from_before)
        if not from_before:
            assert core._reshape_excess == 0.0
        assert 1 <= limiter.limit <= 12

    def teardown(self) -> None:
        """Everything ends: nothing is left held."""
        for waiter, _ in self.waiting:
            self.core.leave(waiter, self.now)
        for ticket in self.running:
            self.core.release(ticket, self.now, Outcome.FAILED)
        assert self.core.limiter.in_flight == 0 and self.core.limiter.queued == 0
        assert self.core._reshape_excess == 0.0


ReshapeMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestReshapeMachine = ReshapeMachine.TestCase


def test_the_line_waits_with_what_its_requests_weigh_after_a_change() -> None:
    """A request told 1 that waited while the shape changed weighs what one told 1 weighs now: let in at its
    old slot, four of them ran in the room of one."""
    core = GateCore(AIMD(), min_limit=1, max_limit=12, initial_limit=4, max_queue=6, max_retry_after_s=60)
    shape = core.cost_shape = _Forced()
    tickets = []
    for _ in range(2):  # two told 2, filling the limit
        assert core.arrive(30.0, now_s=0.0, units=2.0) is ADMITTED
        tickets.append(core.admitted(0.0, 0.0, 2.0, None, 2.0))
    waiter = core.arrive(30.0, now_s=0.0, units=1.0)
    assert isinstance(waiter, Waiter) and waiter.units == 1.0
    shape.forced = (4.0, 1.0)  # a request told 1 takes 5 slots now, one told 2 takes 6
    core.sample(MemorySample(OTHERS, 24 * GiB), 0.1)
    assert waiter.units == waiter.weighed == 5.0
    assert core._reshape_excess == 8.0  # the two in flight took 2 slots each, and are worth 6
    assert core.statistics(0.1).cost_shape == {"per_request": 4.0, "per_unit": 1.0}
    for ticket in tickets:
        core.release(ticket, 0.2, Outcome.COMPLETED)
    assert core._reshape_excess == 0.0


def test_batches_told_their_size_fill_the_card_in_a_run() -> None:
    """Batches of 1 to 8 images with a workspace of their own, told their size through `cost`, on the
    simulator: the gate learns the workspace and fills the card, where taking a unit for the batch of
    one's bytes left a third of it idle."""

    def batch(rng: random.Random) -> int:
        return int(1.5 * GiB) + rng.randint(1, 8) * GiB // 4

    phase = Phase(0.0, 60.0, batch, 0.1, cost=lambda nbytes: round((nbytes - 1.5 * GiB) / (GiB / 4)))
    result = simulate(
        [phase],
        total_bytes=24 * GiB,
        baseline_bytes=OTHERS,
        duration_s=30.0,
        controller=AIMD(),
        gpu=SimulatedGPU(24 * GiB, baseline_bytes=OTHERS),
        seed=3,
    )
    mean_bytes = 1.5 * GiB + 4.5 * GiB / 4
    fit = 16 * GiB / mean_bytes  # about six batches at once
    late = [s for s in result.series if s[0] > 10.0]
    held = sum(s[4] - OTHERS for s in late) / len(late)
    assert held >= 0.8 * fit * mean_bytes, held / GiB  # was about 55% before
    assert result.ooms <= 1


@pytest.mark.anyio
async def test_the_middleware_weighs_a_request_by_the_shape_and_the_status_says_it() -> None:
    """Where the readings found a part per request, a request told 4 takes `per_request + per_unit * 4`
    slots through the middleware too, and the status says how a cost is weighed."""
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None, cost=lambda scope: float(scope["query_string"].split(b"=")[1]))
    seen: list[float] = []

    @app.post("/infer", tags=["gpu"])
    async def infer() -> dict[str, bool]:
        seen.append(find_gate(app).statistics().in_flight)
        return {"ok": True}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
        assert (await client.post("/infer?n=4")).status_code == 200
        gate = find_gate(app)
        assert seen == [4.0] and gate.status()["cost_shape"] is None  # as told, until the readings say otherwise
        shape = gate.core.cost_shape
        assert shape is not None
        shape.offset, shape.scale = 2.0, 0.5  # what a fit of a workspace of 2 slots would leave
        assert (await client.post("/infer?n=4")).status_code == 200
        assert seen[-1] == 4.0 and gate.statistics().in_flight == 0
        assert (await client.post("/infer?n=1")).status_code == 200
        assert seen[-1] == 2.5
        assert gate.status()["cost_shape"] == {"per_request": 2.0, "per_unit": 0.5}
