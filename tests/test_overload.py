"""Under sustained overload: no answer after its deadline, priorities first, tenants fairly, on a
fake clock (the core) or through the middleware where the wire matters (headers, status, metrics)."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from adaptive_gate import AIMD, AdaptiveGate, Fixed
from adaptive_gate._gate.accounts import MAX_TENANTS, OTHER, ClassCounts
from adaptive_gate._gate.overload import WindowCount, _outruns
from adaptive_gate.core import ADMITTED, GateCore, Outcome
from adaptive_gate.limiter import Waiter
from benchmarks.overload import Flow, Replay, capacity_per_s

from .asgi_helpers import RawClient, http_scope
from .core_machine import CoreMachine
from .helpers import client_for, find_gate, gated_app, parse, wait_until

SERVICE_S = 1.0


def core_at(now: list[float], *, limit: int = 1, max_queue: int = 100, **options: Any) -> GateCore:
    return GateCore(
        Fixed(limit), min_limit=1, max_limit=limit, initial_limit=limit, max_queue=max_queue, max_retry_after_s=60,
        seed=0, **options,
    )  # fmt: skip


def serve_one(core: GateCore, now: list[float], service_s: float = SERVICE_S) -> None:
    """One request alone, so the core learns the route's service time."""
    assert core.arrive(30.0, route="r", now_s=now[0]) is ADMITTED
    ticket = core.admitted(now[0], 0.0, route="r")
    now[0] += service_s
    core.release(ticket, now[0], Outcome.COMPLETED)


# -- the deadline includes the work -------------------------------------------------------------


def test_no_time_for_the_work_is_turned_away_even_with_a_free_slot() -> None:
    now = [0.0]
    core = core_at(now, limit=2)
    serve_one(core, now)
    assert core.arrive(0.5, route="r", now_s=now[0]) == "deadline"
    assert core.arrive(30.0, route="r", now_s=now[0]) is ADMITTED


def test_a_route_slower_than_every_deadline_is_still_tried_now_and_then() -> None:
    """One slow answer (a warm-up) must not turn the route away for ever: it is measured again."""
    now = [0.0]
    core = core_at(now, limit=2)
    serve_one(core, now, service_s=40.0)
    assert core.arrive(30.0, route="r", now_s=now[0]) == "deadline"
    now[0] += 41.0  # no answer for longer than the mean: one request may run, to measure again
    assert core.arrive(30.0, route="r", now_s=now[0]) is ADMITTED
    assert core.arrive(30.0, route="r", now_s=now[0]) == "deadline"  # one probe at a time
    assert core.arrive(30.0, route="other", now_s=now[0]) is ADMITTED  # other routes were never affected


def test_a_route_slower_than_every_deadline_is_tried_by_requests_of_any_deadline() -> None:
    """A slow warm-up (0.5 s), then clients whose deadline (0.2 s) is less than half of it: a request is let
    through once a second all the same, and the fast answers bring the mean under the deadline. Tried only by
    requests with half the mean at least, the route was refused for ever."""
    now = [0.0]
    core = core_at(now, limit=2)
    serve_one(core, now, service_s=0.5)
    assert core.arrive(0.2, route="r", now_s=now[0]) == "deadline"
    for _ in range(30):
        now[0] += 1.0
        if core.arrive(0.2, route="r", now_s=now[0]) is ADMITTED:
            ticket = core.admitted(now[0], 0.0, route="r")
            now[0] += 0.05
            core.release(ticket, now[0], Outcome.COMPLETED)
    assert core.services.mean_by_route["r"] < 0.2
    assert core.arrive(0.2, route="r", now_s=now[0]) is ADMITTED  # right after an answer: no probe, the mean fits


@pytest.mark.anyio
async def test_a_queue_timeout_of_0_runs_a_request_now_or_answers_at_once() -> None:
    """`queue_timeout=0` is no time to wait for a slot, not no time at all: a request that finds a slot runs,
    however long the route's work (once the route had answered, every request was turned away for good), and
    one that finds none is answered at once. A body in several parts is read as any other (it had 408)."""
    app, held = gated_app(controller=Fixed(1), queue_timeout=0)
    held.go.set()  # each answers at once
    async with client_for(app) as client:
        assert [(await client.post("/work")).status_code for _ in range(3)] == [200, 200, 200]

        async def parts() -> AsyncIterator[bytes]:
            yield b"a"
            await anyio.sleep(0.01)
            yield b"b"

        assert (await client.post("/work", content=parts())).status_code == 200
    busy, held = gated_app(controller=Fixed(1), queue_timeout=0)
    async with client_for(busy) as client, anyio.create_task_group() as tg:
        tg.start_soon(client.post, "/work")
        await wait_until(lambda: held.running == 1)
        refused = await client.post("/work")
        assert refused.status_code == 503 and refused.json()["reason"] == "deadline"
        assert find_gate(busy).statistics().queued == 0
        held.go.set()


def test_expected_wait_and_work_past_the_deadline_is_turned_away_at_once() -> None:
    now = [0.0]
    core = core_at(now, overload="off")
    for _ in range(30):  # a steady service time: the estimate's deviation settles
        serve_one(core, now)
    assert core.arrive(30.0, route="r", now_s=now[0]) is ADMITTED
    queued = [core.arrive(30.0, route="r", now_s=now[0]) for _ in range(3)]
    assert all(isinstance(w, Waiter) for w in queued)
    assert core.arrive(4.5, route="r", now_s=now[0]) == "deadline"  # 4 s of wait and ~1 s of work: past 4.5 s
    assert isinstance(core.arrive(6.0, route="r", now_s=now[0]), Waiter)


def test_the_expected_wait_counts_the_slots_each_request_takes() -> None:
    """Requests that weigh all four slots (`cost`) go in one at a time, not four: behind one running
    and two waiting, a request has about 3 s of wait and 1 of work ahead, not 0.75 and 1, and one
    with 3 s left is turned away at once, where it would wait out its deadline in the line."""
    now = [0.0]
    core = core_at(now, limit=4, overload="off")
    for _ in range(60):  # the service time settles, and what a request weighs with it
        assert core.arrive(30.0, units=4, route="r", now_s=now[0]) is ADMITTED
        ticket = core.admitted(now[0], 0.0, units=4, route="r")
        now[0] += SERVICE_S
        core.release(ticket, now[0], Outcome.COMPLETED)
    assert core.arrive(30.0, units=4, route="r", now_s=now[0]) is ADMITTED
    core.admitted(now[0], 0.0, units=4, route="r")
    queued = [core.arrive(30.0, units=4, route="r", now_s=now[0]) for _ in range(2)]
    assert all(isinstance(w, Waiter) for w in queued)
    assert core.arrive(3.0, units=4, route="r", now_s=now[0]) == "deadline"
    assert isinstance(core.arrive(5.0, units=4, route="r", now_s=now[0]), Waiter)


def test_a_waiter_that_can_no_longer_finish_gives_its_turn_on() -> None:
    now = [0.0]
    core = core_at(now, overload="off")
    for _ in range(30):
        serve_one(core, now)
    running = core.arrive(30.0, route="r", now_s=now[0])
    assert running is ADMITTED
    ticket = core.admitted(now[0], 0.0)
    short = core.arrive(2.5, route="r", now_s=now[0])  # may wait until ~1.5 s from now
    long = core.arrive(30.0, route="r", now_s=now[0])
    assert isinstance(short, Waiter) and isinstance(long, Waiter)
    assert 1.0 < core.wait_budget_s(short, now[0]) < 1.5
    now[0] += 1.6  # the running one took longer than usual
    core.release(ticket, now[0], Outcome.COMPLETED)
    assert short.refused == "deadline" and not short.granted
    assert long.granted and core.statistics(now[0]).in_flight == 1


@pytest.mark.parametrize("mode", ["lifo", "shed", "off"])
@pytest.mark.parametrize("factor", [2, 4])
def test_sustained_overload_never_answers_late(mode: str, factor: int) -> None:
    """Poisson arrivals at 2x and 4x capacity with 1 s deadlines, service +-20%: nothing late,
    the card kept busy (goodput near capacity)."""
    duration_s = 20.0
    [result] = Replay([Flow(factor * capacity_per_s())], overload=mode, seed=factor).run(duration_s)
    assert result.late == 0
    assert result.on_time / duration_s >= 0.9 * capacity_per_s()


def test_arrivals_that_follow_takes_are_counted_over_the_same_moments() -> None:
    """A closed loop: each client comes back a moment (1 ms) after its request took a slot, at Poisson
    times, 50 a second. Counted over any interval, the arrivals never outrun the takes: both counts
    cover the same moments. (Buckets that started at their first event let one count miss up to a
    quarter of the interval the other held: a closed loop of 300 clients was served newest first for
    10 s of a run.)"""
    rng = random.Random(7)
    arrived, taken = WindowCount(), WindowCount()
    window_s = 2.0
    now_s = 0.0
    for _ in range(5000):
        now_s += rng.expovariate(50.0)
        back_s = now_s + 0.001  # the client is back
        taken.add(now_s, window_s)
        arrived.add(back_s, window_s)
        for interval_s in (window_s / 2, window_s):
            counts = arrived.total(back_s, interval_s), taken.total(back_s, interval_s)
            assert abs(counts[0] - counts[1]) <= 1, counts
            assert not _outruns(*counts)


def test_one_slot_at_twice_what_it_serves_is_overload() -> None:
    """One slot of 0.2 s and an open loop at twice what it serves, with 5 s deadlines. First come,
    first served holds the line at the deadline's depth, turning away one newcomer in two as too late
    for it, so as many join as are taken in and every answer waits about 5 s. Those turned away
    arrived all the same: it is overload, and most answers come within a second."""
    duration_s = 60.0
    capacity = capacity_per_s(1, 0.2)
    [result] = Replay([Flow(2 * capacity, deadline_s=5.0)], limit=1, service_s=0.2, seed=1).run(duration_s)
    assert result.late == 0
    assert result.on_time >= 0.9 * capacity * duration_s
    assert sum(latency_s < 1.0 for latency_s in result.latencies_s) >= 0.8 * len(result.latencies_s)


def test_newest_first_keeps_the_successes_fresh() -> None:
    duration_s = 20.0
    [lifo] = Replay([Flow(4 * capacity_per_s())], overload="lifo", seed=3).run(duration_s)
    [fifo] = Replay([Flow(4 * capacity_per_s())], overload="off", seed=3).run(duration_s)
    lifo_slow = sum(latency_s > 0.5 for latency_s in lifo.latencies_s)
    fifo_slow = sum(latency_s > 0.5 for latency_s in fifo.latencies_s)
    assert lifo_slow <= 0.01 * len(lifo.latencies_s) < fifo_slow


@pytest.mark.parametrize(("deadline_s", "kept"), [(10.5, 9), (20.5, 19)])
def test_newest_first_answers_the_buried_at_once(deadline_s: float, kept: int) -> None:
    """In overload, whoever could no longer start in time with everyone newer served first is
    answered at once; a longer deadline keeps a deeper line (no fixed patience)."""
    now = [0.0]
    core = core_at(now)
    for _ in range(30):
        serve_one(core, now)
    assert core.arrive(deadline_s, route="r", now_s=now[0]) is ADMITTED
    assert core.detector is not None
    core.detector.overloaded = True  # in overload (how it gets there: tests/test_queue.py)
    # Each takes ~1 s on one slot, and may start until ~1 s before its deadline.
    waiters = [core.arrive(deadline_s, route="r", now_s=now[0]) for _ in range(kept + 6)]
    assert all(isinstance(w, Waiter) for w in waiters)
    assert core.statistics(now[0]).queued == kept
    assert [w.refused for w in waiters[:6]] == ["deadline"] * 6  # type: ignore[union-attr]  # the oldest, at once
    assert all(w.refused is None for w in waiters[6:])  # type: ignore[union-attr]


# -- priorities -----------------------------------------------------------------------------------


def test_a_high_priority_waits_at_most_one_service_time_behind_a_flood() -> None:
    now = [0.0]
    core = core_at(now, max_queue=30, classes=True)
    serve_one(core, now)
    assert core.arrive(30.0, route="r", tenant="flood", now_s=now[0]) is ADMITTED
    running = core.admitted(now[0], 0.0)
    low = [core.arrive(100.0, route="r", tenant="flood", now_s=now[0]) for _ in range(30)]  # the queue is full
    assert all(isinstance(w, Waiter) for w in low)
    assert core.arrive(100.0, route="r", tenant="flood", now_s=now[0]) == "queue_full"
    now[0] += 0.3
    high = core.arrive(100.0, route="r", priority=5, tenant="vip", now_s=now[0])
    assert isinstance(high, Waiter)
    assert low[-1].refused == "evicted"  # the newest of the lowest made room
    now[0] += SERVICE_S - 0.3
    core.release(running, now[0], Outcome.COMPLETED)
    assert high.granted and not any(w.granted for w in low)  # waited 0.7 s: under one service time


def test_the_lowest_priority_is_not_starved_for_ever() -> None:
    def served_after(aging_s: float) -> float | None:
        now = [0.0]
        core = core_at(now, max_queue=100, classes=True, priority_aging_s=aging_s, overload="off")
        serve_one(core, now)
        assert core.arrive(60.0, route="r", now_s=now[0]) is ADMITTED
        ticket = core.admitted(now[0], 0.0)
        lowest = core.arrive(60.0, route="r", priority=0, now_s=now[0])
        assert isinstance(lowest, Waiter)
        for _ in range(40):  # two important arrivals per service time: they alone could fill the card
            for _ in range(2):
                assert isinstance(core.arrive(60.0, route="r", priority=3, now_s=now[0]), Waiter | str)
            now[0] += SERVICE_S
            core.release(ticket, now[0], Outcome.COMPLETED)
            if lowest.granted:
                return now[0]
            ticket = core.admitted(now[0], 0.0)
        return None

    assert served_after(aging_s=2.0) is not None  # three levels are worth six seconds of waiting
    assert served_after(aging_s=1e9) is None  # without aging: starved


def test_retry_after_is_shorter_for_the_more_important() -> None:
    now = [0.0]
    core = core_at(now, max_queue=100, classes=True, overload="off")
    serve_one(core, now)
    assert core.arrive(60.0, route="r", now_s=now[0]) is ADMITTED
    for _ in range(20):
        core.arrive(60.0, route="r", now_s=now[0])
    assert core.retry_after_s(now[0], priority=5) < core.retry_after_s(now[0], priority=0)


# -- tenants --------------------------------------------------------------------------------------


def test_two_light_tenants_keep_their_share_while_thirty_heavy_ones_flood() -> None:
    capacity = capacity_per_s()
    # A fair share is 1/32 of the capacity; the light ones ask for 2/3 of it, the heavy ones 3x.
    flows = [Flow(capacity / 48, tenant=f"light-{i}") for i in range(2)]
    flows += [Flow(3 * capacity / 32, tenant=f"heavy-{i}") for i in range(30)]
    results = Replay(flows, seed=5).run(30.0)
    for light in results[:2]:
        assert light.on_time >= 0.9 * light.offered
    assert sum(r.late for r in results) == 0


def test_tenant_counts_are_bounded_and_keep_the_busiest() -> None:
    counts = ClassCounts()
    rng = random.Random(1)
    for i in range(20_000):
        if i % 4 == 0:
            counts.arrived(0, "busy")
        else:
            counts.arrived(0, f"random-{rng.random()}")  # a hostile client: a new name every time
    assert len(counts.tenants) <= MAX_TENANTS
    shown = counts.shown_tenants(top=3)
    assert shown["busy"]["arrived"] == 5000  # never pushed out by the one-off names
    assert len(shown) == 4 and sum(tally["arrived"] for tally in shown.values()) == 20_000
    assert shown[OTHER]["arrived"] >= 14_000  # the one-off names, folded


# -- the wire -------------------------------------------------------------------------------------


def classified_app(**options: Any) -> FastAPI:
    app = FastAPI()
    app.add_middleware(
        AdaptiveGate, probe=None, controller=Fixed(1), priority="x-priority", tenant="x-tenant", **options
    )
    release = anyio.Event()

    @app.post("/work", tags=["gpu"])
    async def work() -> dict[str, bool]:
        await release.wait()
        return {"ok": True}

    app.state.release = release
    return app


def headers(priority: str | None = None, tenant: str | None = None) -> list[tuple[bytes, bytes]]:
    found = [(b"host", b"test")]
    if priority is not None:
        found.append((b"x-priority", priority.encode()))
    if tenant is not None:
        found.append((b"x-tenant", tenant.encode()))
    return found


@pytest.mark.anyio
async def test_status_and_metrics_show_priorities_and_tenants() -> None:
    app = classified_app(max_queue=2)
    gate_client = RawClient()
    clients: list[RawClient] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(app, http_scope("/work", headers=headers("1", "a")), gate_client.receive, gate_client.send)
        await wait_until(lambda: find_gate(app).statistics().in_flight == 1)
        gate = find_gate(app)

        def arrived() -> int:
            return sum(counts["arrived"] for counts in gate.statistics().priorities.values())

        for priority, tenant in [("0", "a"), ("not a number", "b"), ("9", "b")]:  # the last evicts one
            client = RawClient()
            clients.append(client)
            before = arrived()
            tg.start_soon(app, http_scope("/work", headers=headers(priority, tenant)), client.receive, client.send)
            await wait_until(lambda: arrived() > before)  # noqa: B023 - awaited here, in this iteration
        assert gate.statistics().queued == 2
        app.state.release.set()
    statuses = sorted(c.status or 0 for c in [gate_client, *clients])
    assert statuses == [200, 200, 200, 503]
    evicted = next(c for c in clients if c.status == 503)
    assert b'"reason":"evicted"' in evicted.body and evicted.header(b"retry-after") is not None
    status = gate.status()
    assert status["priorities"]["0"]["arrived"] == 2  # "not a number" counts as priority 0
    assert status["priorities"]["9"] == {"arrived": 1, "admitted": 1, "rejected": 0, "left": 0}
    assert status["tenants"]["b"]["rejected"] == 1 and status["tenants"]["a"]["admitted"] == 2
    assert status["options"]["priority"] == "x-priority" and status["overload"]["mode"] == "lifo"
    metrics = gate.metrics
    assert metrics is not None
    samples = parse(metrics.render().decode())
    assert samples[("adaptive_gate_tenant_requests", (("outcome", "rejected"), ("tenant", "b")))] == 1
    assert samples[("adaptive_gate_priority_requests", (("outcome", "admitted"), ("priority", "9")))] == 1


@pytest.mark.anyio
async def test_a_tenant_whose_flood_filled_the_line_makes_room_for_another() -> None:
    """Tenant a fills the line (three places); b's request takes the place of a's newest, which is answered
    `503 evicted` at once; a's next finds the line full."""
    app = classified_app(max_queue=3)
    running, flood, other, late = RawClient(), [RawClient() for _ in range(3)], RawClient(), RawClient()
    async with anyio.create_task_group() as tg:
        tg.start_soon(app, http_scope("/work", headers=headers(tenant="a")), running.receive, running.send)
        await wait_until(lambda: find_gate(app).statistics().in_flight == 1)
        gate = find_gate(app)
        for queued, client in enumerate(flood, start=1):
            tg.start_soon(app, http_scope("/work", headers=headers(tenant="a")), client.receive, client.send)
            await wait_until(lambda queued=queued: gate.statistics().queued == queued)
        tg.start_soon(app, http_scope("/work", headers=headers(tenant="b")), other.receive, other.send)
        await wait_until(lambda: flood[-1].status is not None)
        assert flood[-1].status == 503 and b'"reason":"evicted"' in flood[-1].body
        assert gate.statistics().queued == 3 and other.status is None  # b waits in a's newest's place
        tg.start_soon(app, http_scope("/work", headers=headers(tenant="a")), late.receive, late.send)
        await wait_until(lambda: late.status is not None)
        assert late.status == 503 and b'"reason":"queue_full"' in late.body  # two of a's wait: no room for a third
        app.state.release.set()
    assert [c.status for c in (running, *flood[:2], other)] == [200, 200, 200, 200]
    assert gate.status()["tenants"]["a"]["rejected"] == 2 and gate.status()["tenants"]["b"]["admitted"] == 1


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"priority": 5}, TypeError, 'header name such as "x-priority"'),
        ({"tenant": "x tenant"}, TypeError, "tenant must be None, a header name"),
        ({"overload": "drop"}, ValueError, "overload must be one of 'lifo', 'shed', 'off'"),
        ({"priority_aging": 0}, ValueError, "priority_aging must be > 0 seconds"),
        ({"queue_target": -1.0}, ValueError, "queue_target must be > 0 seconds"),
    ],
)
def test_bad_options_say_what_is_wrong(options: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        AdaptiveGate(FastAPI(), **options)


def test_a_priority_callable_that_raises_counts_as_zero() -> None:
    from adaptive_gate._http.classify import Classifier

    def broken(scope: Any) -> int:
        raise KeyError("x")

    classifier = Classifier(broken, lambda scope: 42)
    assert classifier.classify(http_scope("/work")) == (0, None)  # 42 is not a tenant name
    assert Classifier("x-priority", None).priority(http_scope("/w", headers=headers("-7"))) == -7
    assert Classifier("x-priority", None).priority(http_scope("/w", headers=headers("100000"))) == 100  # clamped
    # However many digits a client sends, a number is clamped by its sign, never read as 0.
    assert Classifier("x-priority", None).priority(http_scope("/w", headers=headers("9" * 4000))) == 100
    assert Classifier("x-priority", None).priority(http_scope("/w", headers=headers("-1234567"))) == -100
    assert Classifier("x-priority", None).priority(http_scope("/w", headers=headers("12a"))) == 0


def test_a_priority_callable_may_answer_any_whole_number_and_a_wrong_answer_is_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from fractions import Fraction

    from adaptive_gate._http.classify import Classifier

    scope = http_scope("/work")
    for whole, read in [(Fraction(6, 2), 3), (7.0, 7), (-250.0, -100)]:  # a numpy integer is a Real as these are
        assert Classifier(lambda _, whole=whole: whole, None).priority(scope) == read
    with caplog.at_level(logging.WARNING, logger="adaptive_gate"):
        halves = Classifier(lambda _: 2.5, lambda _: 42)
        assert [halves.classify(scope) for _ in range(3)] == [(0, None)] * 3
        broken = Classifier(lambda _: {}["x"], None)
        assert [broken.priority(scope) for _ in range(3)] == [0] * 3
        silent = Classifier(lambda _: None, "x-tenant")  # none to say, and a header's value is the client's
        assert silent.classify(http_scope("/w", headers=headers(tenant=""))) == (0, None)
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 3, said
    assert "priority callable answered 2.5, not a whole number" in said[0]
    assert "tenant callable answered 42, not a str" in said[1]
    assert "priority callable raised KeyError" in said[2]


# -- the core's books, with classes and the controlled delay ---------------------------------------


class ClassedCoreMachine(CoreMachine):
    """The core's machine (tests/test_core.py) with priorities, tenants, newest first and deadlines
    short enough to be refused in line: the books balance whatever the line decides."""

    def __init__(self) -> None:
        super().__init__()
        self.core = GateCore(
            AIMD(), min_limit=1, max_limit=6, initial_limit=2, max_queue=4, max_retry_after_s=60,
            classes=True, overload="lifo", priority_aging_s=0.5,
        )  # fmt: skip
        self.arrivals = 0

    def _start_granted(self) -> None:
        for waiter in [w for w in self.waiting if w.refused is not None]:
            self.waiting.remove(waiter)
            self.core.rejected("deadline", priority=waiter.priority, tenant=waiter.tenant, now_s=self.now[0])
            self.turned_away += 1
        super()._start_granted()

    @rule()
    def arrive(self) -> None:
        self.arrive_classed(0, None, 30.0)

    @precondition(lambda self: self.waiting)
    @rule(index=st.integers(0, 100))
    def leave(self, index: int) -> None:
        waiter = self.waiting.pop(index % len(self.waiting))
        self.core.leave(waiter, self.now[0])
        self.core.left(waiter.priority, waiter.tenant)
        self.left += 1
        self._start_granted()

    @rule(priority=st.integers(-1, 2), tenant=st.sampled_from([None, "a", "b"]), timeout_s=st.floats(0.0, 2.0))
    def arrive_classed(self, priority: int, tenant: str | None, timeout_s: float) -> None:
        self.arrivals += 1
        queued = list(self.waiting)
        admission = self.core.arrive(timeout_s, route="r", priority=priority, tenant=tenant, now_s=self.now[0])
        if admission is ADMITTED:
            ticket = self.core.admitted(self.now[0], 0.0, route="r")
            self.running.append(ticket)
        elif isinstance(admission, str):
            self.core.rejected(admission, priority=priority, tenant=tenant, now_s=self.now[0])
            self.turned_away += 1
        else:
            assert all(w in queued for w in self.waiting)
            self.waiting.append(admission)
        self._start_granted()

    @invariant()
    def classes_add_up(self) -> None:
        classes = self.core.classes
        assert classes is not None
        tallied = sum(t.arrived for t in classes.tenants.values()) + classes.other.arrived
        assert tallied == self.arrivals == sum(t.arrived for t in classes.priorities.values())
        admitted = [t.as_dict()["admitted"] for t in classes.priorities.values()]
        assert min(admitted, default=0) >= 0
        assert sum(admitted) == self.core.counters.admitted + len(self.waiting)  # waiting: not turned away yet


ClassedCoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestClassedCoreMachine = ClassedCoreMachine.TestCase


@pytest.mark.anyio
async def test_a_waiter_buried_in_overload_is_answered_once_it_cannot_be_served_in_time() -> None:
    """A waiter that joined before the overload has the newer ones served first: it is answered as
    soon as they make it miss its deadline, not when the deadline comes."""
    from adaptive_gate._http.body import Body
    from adaptive_gate._http.line import wait_in_line

    now = [0.0]
    core = core_at(now)
    for _ in range(30):
        serve_one(core, now)  # one request takes a second on the one slot
    assert core.arrive(30.0, route="r", now_s=now[0]) is ADMITTED  # the slot, held throughout
    waiter = core.arrive(6.5, route="r", now_s=now[0])  # may start within ~5.5 s
    assert isinstance(waiter, Waiter) and core.detector is not None
    core.detector.overloaded = True  # overload begins (how: tests/test_queue.py)

    async def never_disconnects() -> dict[str, object]:
        await anyio.sleep_forever()
        return {}

    outcome: list[str] = []

    async def wait() -> None:
        # Its own timeout (60 s of real time) is a fallback it must not need: the line answers it.
        outcome.append(await wait_in_line(core, waiter, Body(never_disconnects), 60, lambda: now[0]))

    with anyio.fail_after(30):  # a guard against a hang: it would wait 60 s otherwise
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(wait)
            await anyio.sleep(0.01)
            for _ in range(4):  # newer ones, each served before it
                assert isinstance(core.arrive(30.0, route="r", now_s=now[0]), Waiter)
                await anyio.sleep(0.01)
                assert outcome == []  # still servable in time behind them
            assert isinstance(core.arrive(30.0, route="r", now_s=now[0]), Waiter)  # the fifth: no longer
    stats = core.statistics(now[0])
    assert outcome == ["deadline"] and stats.queued == 5 and stats.in_flight == 1


def test_the_overload_plot_is_drawn_from_virtual_time_and_http_documents(tmp_path: Any) -> None:
    """`python -m benchmarks.overload_plot`, as the README's picture is made: the freshness curves
    on virtual time, and the HTTP goodput bars from `benchmarks.http_demo` documents."""
    from benchmarks.overload_plot import latencies_ms, plot

    assert latencies_ms(2, "lifo", 5, 1)[-1] < latencies_ms(2, "off", 5, 1)[-1]  # what the curves show
    run = {"goodput_per_s": 20.0, "gave_up": 3}
    document = {"rate_per_s": 50.0, "duration_s": 60.0, "runs": {"classic": {"none": run, "adaptive": run}}}
    path = tmp_path / "overload.png"
    plot([document, document], path, duration_s=5, seed=1)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
