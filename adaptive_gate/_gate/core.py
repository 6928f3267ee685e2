"""`GateCore`: the gate's bookkeeping, loop-free, with the time passed in.

Think of it as the gate with the network taken away. It owns the limiter, the controller, the
operator's bounds, the counters, the recent service times and queue waits, the log of limit
changes and the accounting of out-of-memory errors. It is told what happens (a request admitted,
a request released with its outcome, an OOM, a memory reading, a probe error) and answers
questions (may this one go in now, how long should a client wait before retrying, is the replica
ready, what are the figures). It never awaits, sleeps or reads a clock: every event and every
question that depends on the time carries `now_s`, read by its driver.

Two drivers run it: `AdaptiveGate` (the ASGI middleware, on the monotonic clock) and
`adaptive_gate.simulation` (virtual time). So a controller tuned in the simulator is the one that
serves, and a test can feed both one sequence of events and compare what they did.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable

from .._checks import check_int
from .._control.control import Controller
from .._control.cost_shape import CostShape
from .._control.route_weights import RouteWeights
from ..memory import MemorySample
from .accounts import ClassCounts, ServiceEstimates
from .admission import OVERLOAD_MODES, DrainRate, queue_up
from .figures import BucketCounts, Counters, RecentValues
from .limiter import Limiter, Waiter, budget_of
from .operator import OperatorBounds
from .overload import OverloadDetector
from .queue import FairLine, FifoLine
from .reasons import ADMITTED, Admitted, Reason
from .snapshot import CoreSnapshot
from .statistics import LimitChange
from .swallowed import SwallowedOoms
from .tickets import COST_QUANTUM, MAX_COST, InFlight, Outcome, Ticket, _Probe, units_of_cost
from .too_large import TooLargeRoutes

__all__ = ["GateCore", "InFlight", "Outcome", "Ticket", "units_of_cost"]
QUEUE_WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SERVICE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
UNITS_SHARE = 0.05  # how far one admission moves the slots a request takes on average


class GateCore(CoreSnapshot):
    def __init__(
        self,
        controller: Controller,
        *,
        min_limit: int,
        max_limit: int,
        initial_limit: int | None,
        max_queue: int,
        max_retry_after_s: int,
        unix_offset_s: float = 0.0,
        seed: int | None = None,
        classes: bool = False,
        priority_aging_s: float = 10.0,
        overload: str = "lifo",
        queue_target_s: float | None = None,
    ) -> None:
        """The middleware and the simulator build it alike; `controller` is bound to the bounds here.

        `classes`: requests carry priorities and tenants (a fair line, counts per class);
        `overload`: what the gate does in overload ("lifo", "shed" or "off", see `admission.py`);
        `queue_target_s`: the delay above which the queue stands (None: the routes' service time)."""
        if overload not in OVERLOAD_MODES:
            raise ValueError(f"overload must be one of {', '.join(OVERLOAD_MODES)}; got {overload!r}")
        if isinstance(controller, type):
            name = controller.__name__
            raise TypeError(
                f"controller must be an instance, not the class: controller={name}(), not controller={name}"
            )
        if not isinstance(controller, Controller):
            raise TypeError(f"controller must implement adaptive_gate.control.Controller, got {controller!r}")
        check_int("max_limit", max_limit, check_int("min_limit", min_limit, 1))  # for whoever builds the core
        if initial_limit is not None:
            check_int("initial_limit", initial_limit, min_limit, max_limit)
        controller.bind(min_limit=min_limit, max_limit=max_limit, initial_limit=initial_limit)
        self.controller = controller
        self.min_limit, self.max_limit = min_limit, max_limit
        self.max_retry_after_s = max_retry_after_s
        # The limiter integrates in-flight over time (the busy area) at the times the events carry.
        self.detector = None if overload == "off" else OverloadDetector(queue_target_s)
        line = FairLine(priority_aging_s, self.detector) if classes else FifoLine(self.detector)
        self.limiter = Limiter(self._bounded(controller.limit), max_queue=max_queue, line=line)
        self.overload = overload
        self.queue_target_s = queue_target_s
        self.classes = ClassCounts() if classes else None
        self.services = ServiceEstimates()
        self._mean_by_route = self.services.mean_by_route
        self.too_large_routes = TooLargeRoutes()  # answered at the door while their requests never fit
        self._too_large_by_route = self.too_large_routes.by_route
        # Routes told apart by their bytes, for a controller that counts memory: a Fixed(N) is N requests.
        self.route_weights = RouteWeights() if getattr(controller, "memory", None) is not None else None
        # What a `cost` says of the bytes where they are not in proportion to it (one route only)
        self.cost_shape = CostShape() if self.route_weights is not None else None
        # Requests admitted before the shape last changed, still in flight, and what they weigh now beyond
        # the slots they took (`_reshape`)
        self._reshaped_serial = 0
        self._reshaped_in_flight = 0
        self._reshape_excess = 0.0
        self.requests_by_route: dict[object, float] = {}  # each route's requests in flight (`Ticket.requests`)
        self.drain = DrainRate()
        self.operator: OperatorBounds | None = None
        self.counters = Counters()
        self.queue_wait_histogram = BucketCounts(QUEUE_WAIT_BUCKETS_S)
        self.service_histogram = BucketCounts(SERVICE_BUCKETS_S)
        self.queue_wait_s = RecentValues(histogram=self.queue_wait_histogram)  # adds count there too
        self.service_s = RecentValues(histogram=self.service_histogram)
        self.limit_changes: deque[LimitChange] = deque(maxlen=32)
        self.oom_s: deque[float] = deque(maxlen=256)  # for the dashboard's marks
        self.probe = _Probe()
        self.limit_listeners: list[Callable[[LimitChange], None]] = []
        self.unix_offset_s = unix_offset_s
        self._random = random.Random(seed)
        self._swallowed = SwallowedOoms()
        self._probe_oom_epoch = 0
        # When each request in flight arrived, by its ticket's serial, for a controller that asks
        # (`oldest_in_flight`, optional in the protocol, told before each reading); None: nobody
        # asks, nothing is kept.
        oldest_told = getattr(controller, "oldest_in_flight", None)
        self._arrived_s: dict[int, float] | None = None if oldest_told is None else {}
        self._oldest_told: Callable[[float | None], None] = oldest_told or (lambda _: None)
        # Where the requests' sizes shrank: when, and how many slots a request that joined the line
        # before then may hold (`heavier_before`, optional in the protocol, asked after each reading).
        self._heavier_in_flight = 0.0  # of the slots in flight, what requests weigh beyond their own (`granted`)
        # The serials of the requests that waited in the line while the route weights changed (they
        # hold the slots of then), the last serial admitted before the weights last changed, and when
        # the last request weighed with older weights left
        self._stale: set[int] = set()
        self._weighed_before = 0
        self._weighed_before_in_flight = 0  # of the tickets in flight, those admitted before then
        self._stale_left_s = -math.inf
        self.units_per_request = 1.0  # the slots a request takes, on average lately (`expected_wait_s`)
        self._heavier_before: Callable[[], tuple[float, float] | None] | None = getattr(
            controller, "heavier_before", None
        )

    # -- requests -------------------------------------------------------------------------------

    def arrive(
        self,
        timeout_s: float,
        *,
        now_s: float,
        units: float = 1,
        route: object = None,
        priority: int = 0,
        tenant: str | None = None,
    ) -> Admitted | Reason | Waiter:
        """A request that weighs `units` slots may run: `ADMITTED` (its slots now), a `Waiter` (a
        place in the line, whose slots come with a release or a higher limit), or the reason to turn
        it away (a `Reason`): `QUEUE_FULL`, `DEADLINE` when it is not expected to finish (wait and
        `route`'s service time) within the `timeout_s` it has, or `OVERLOAD` when the gate sheds in
        overload. A waiter the line gives up on later is `refused` (`DEADLINE`: it could no longer
        finish in time; `EVICTED`). `now_s`: when it arrives, on the events' clock."""
        if self.classes is not None:
            self.classes.arrived(priority, tenant)
        mean_s = self._mean_by_route.get(route)
        # A deadline of 0 (`queue_timeout=0`) is no time to wait, not no time at all: its work is not judged
        if mean_s is not None and mean_s > timeout_s > 0 and not self.services.may_probe(route, timeout_s, now_s):
            return Reason.DEADLINE
        if self._too_large_by_route and self.too_large_routes.refuses(route, now_s, units):
            return Reason.TOO_LARGE
        if self.limiter.try_acquire(units, now_s=now_s):
            return ADMITTED
        return queue_up(self, now_s, timeout_s, self.services.planned_s(route) or 0.0, priority, tenant, units)

    def enter(
        self,
        timeout_s: float,
        units: float,
        route: object,
        arrived_s: float,
        now_s: float,
        requests: float | None = None,
    ) -> Ticket | None:
        """`arrive` and `admitted` in one, for the request that walks straight in (no classes, no
        "deadline" answer, its slots free and nobody waiting): its ticket, admitted at `now_s`
        (`arrived_s` where no body was read: one clock read per request). None: it takes the long
        way (`arrive`), and nothing has been counted or taken for it. `requests`: as `admitted`."""
        if self.classes is not None:
            return None
        mean_s = self._mean_by_route.get(route)
        if mean_s is not None and mean_s > timeout_s > 0:
            return None  # `arrive` decides: "deadline", or a request let through to measure again
        if self._too_large_by_route and self.too_large_routes.closed(route, units):
            return None  # `arrive` decides: "too_large" at the door, or a request let through to try the card
        limiter = self.limiter
        busy_area = limiter.take(units, now_s)
        if busy_area is None:
            return None
        if now_s == arrived_s:
            self.queue_wait_s.add_zero()
        else:
            self.queue_wait_s.add(now_s - arrived_s)
        return self._hold(now_s, busy_area, units, route, arrived_s, requests)

    def shaped(self, cost: float) -> float:
        """What a request told `cost` (`units_of_cost`) weighs before its route's weight: its cost, or
        where the readings found a part per request beside the units (`CostShape`), that part too."""
        shape = self.cost_shape
        if shape is None:
            return cost
        slots = shape.told(cost)
        return cost if shape.offset == 0.0 else units_of_cost(min(MAX_COST, slots))

    def weigh(self, route: object, units: float) -> float:
        """The slots a request of `route` that weighs `units` takes: times its route's learned weight."""
        weights = self.route_weights
        weight = 1.0 if weights is None else weights.by_route.get(route, 1.0)
        if weight == 1.0:
            return units
        # Up to the next 64th, not the nearest: slots counted short of the bytes they stand for filled a
        # budget a hair past the room (a route weighing 0.536 counted at 0.531 ran out at 5.86 of 5.87).
        slots = math.ceil(units * weight / COST_QUANTUM - 1e-9) * COST_QUANTUM  # a 64th exactly: no rounding left
        return min(MAX_COST, max(COST_QUANTUM, slots))

    @staticmethod
    def granted(waiter: Waiter) -> tuple[float, float]:
        """What a waiter the line handed its slots to weighs now, for `admitted`: its slots, and of
        them, what it weighs beyond the slots it took as it joined, where it joined before the sizes
        shrank and may be one of the old ones (`_reweigh_line`)."""
        return waiter.units, waiter.units - waiter.weighed

    def leave(self, waiter: Waiter, now_s: float) -> None:
        """Give the place back, or the slot if it came meanwhile."""
        self.limiter.leave(waiter, now_s=now_s)

    def wait_budget_s(self, waiter: Waiter, now_s: float) -> float:
        """How long `waiter` may still wait from `now_s`: past it, it could not finish before its deadline."""
        return max(0.0, waiter.latest_start_s - now_s)

    def admitted(
        self,
        now_s: float,
        waited_s: float,
        units: float = 1,
        route: object = None,
        requests: float | None = None,
        heavier: float = 0.0,
    ) -> Ticket:
        """A request holds its `units` slots (from `arrive` or a granted waiter) and starts now.
        `requests`: what it weighs before its route's weight (its `cost`, 1 without; `weigh` made
        `units` of it). None: `units` at the weight of now, which is that only where the weights did
        not change while it waited. `heavier`: of `units`, what it weighs as one from before the
        sizes shrank (`granted`)."""
        self.queue_wait_s.add(waited_s)
        return self._hold(now_s, self.limiter.busy_area(now_s), units, route, now_s - waited_s, requests, heavier)

    def _hold(
        self,
        now_s: float,
        busy_area: float,
        units: float,
        route: object,
        arrived_s: float,
        requests: float | None,
        heavier: float = 0.0,
    ) -> Ticket:
        """The ticket of a request holding its slots from `now_s` (the busy area then), counted, and
        counted in flight for its route (`RouteWeights`) in requests, as it will be given back. A
        request weighed before the weights changed, and admitted after, is one request all the same:
        counted as its slots at the new weight (a large one that took 1 slot, at a weight of 1.5:
        0.67), two of them read as 1.3 requests holding the bytes of two, and the next fit made the
        large route's requests 12 times the small ones', where they were 4."""
        counters = self.counters
        counters.admitted += 1
        weights = self.route_weights
        if weights is None:
            requests = units
        else:  # only a controller that learns memory weighs routes, from these
            told = requests  # what the caller weighed it at before its route's weight, where it did
            if requests is None:
                requests = weights.requests(route, units)
            elif arrived_s <= weights.changed_s and self._took_other_slots(route, units, requests, heavier):
                self._stale.add(counters.admitted)  # weighed before the weights changed: the slots of then
            if not weights.costs_told:
                # Its cost: what it weighs before its route's weight, less what it weighs as one from before a shrink.
                cost = requests
                if told is not None:
                    cost = told
                elif heavier:
                    cost = weights.requests(route, units - heavier)
                if cost != 1:
                    self._costs_told(weights)
            self.requests_by_route[route] = self.requests_by_route.get(route, 0.0) + requests
        if self._arrived_s is not None:
            self._arrived_s[counters.admitted] = arrived_s
        self._heavier_in_flight += heavier
        if units != self.units_per_request:  # requests of one weight (all of them, without `cost`) move nothing
            # A request heavier than the limit runs alone: it holds the limit, not its units, for its time.
            # The mean of all so far until they are many (from a start of 1, requests of a quarter of a
            # slot read as one slot each for dozens of admissions, and a closed loop was refused as late).
            share = max(UNITS_SHARE, 1 / counters.admitted)
            self.units_per_request += share * (min(units, self.limiter.limit) - self.units_per_request)
        in_flight = self.limiter.in_flight
        return Ticket(
            now_s, busy_area, self.controller.epoch, counters.admitted, in_flight, units, route, requests, heavier
        )

    def release(self, ticket: Ticket, now_s: float, outcome: Outcome) -> None:
        """The request ended: its slot goes back, and a success teaches the controller its latency."""
        if ticket.released:
            return
        ticket.released = True
        if ticket.serial <= self._reshaped_serial and self._reshaped_in_flight > 0:
            self._left_from_before_reshape(ticket, now_s)  # before its slots go to the line, at the limit of now
        limiter = self.limiter
        in_flight = limiter.in_flight
        busy_area = limiter.release(ticket.units, now_s=now_s)
        if self._arrived_s is not None:
            self._arrived_s.pop(ticket.serial, None)
        self._heavier_in_flight -= ticket.heavier
        if self.route_weights is not None:
            self.requests_by_route[ticket.route] -= ticket.requests
            in_flight_at_change = ticket.serial <= self._weighed_before
            waited_across = bool(self._stale) and ticket.serial in self._stale
            if in_flight_at_change:
                self._weighed_before_in_flight -= 1
            if waited_across:
                self._stale.remove(ticket.serial)
            if waited_across or (
                in_flight_at_change
                and self._took_other_slots(ticket.route, ticket.units, ticket.requests, ticket.heavier)
            ):
                self._stale_left_s = now_s  # it held the slots of older weights, and ran beside others
            if in_flight_at_change or waited_across:
                self._apply_limit(now_s)  # what it was worth beyond its slots is free again
        if outcome is not Outcome.COMPLETED:
            if outcome is Outcome.OOM:
                self.counters.admitted_ooms += 1
            else:
                self.counters.failed += 1
            return
        latency_s = now_s - ticket.admitted_s
        # The mean number of requests this one ran alongside (itself included), not a snapshot.
        concurrency = (busy_area - ticket.busy_area_at_admission) / latency_s if latency_s > 0 else in_flight
        self.counters.completed += 1
        self.service_s.add(latency_s)
        self.services.add(ticket.route, latency_s, now_s)
        if self._too_large_by_route:
            self.too_large_routes.served(ticket.route, ticket.units)
        limit = limiter.limit
        demand = in_flight >= limit or limiter.queued > 0
        controller, operator = self.controller, self.operator
        if operator is not None and controller.limit >= operator.max_limit:
            demand = False  # held down by the operator: growing underneath would only creep
        controller.on_success(now_s=now_s, latency_s=latency_s, concurrency=concurrency, demand=demand)
        if operator is not None or self._bounded(controller.limit) != limit:  # else _apply_limit changes nothing
            self._apply_limit(now_s)

    def oom(self, ticket: Ticket, now_s: float, tried_bytes: int | None = None) -> bool:
        """A gated request ran out of memory (asking for `tried_bytes`, where the error says); True
        when it is too large: it ran alone, or asked for more than the card has beside the others'
        bytes. Such an OOM teaches the controller nothing: no load could have avoided it."""
        limiter = self.limiter
        alone = (
            not ticket.released  # after its release the slot may be another's
            and ticket.in_flight_at_admission == ticket.units
            and ticket.serial == self.counters.admitted
            and limiter.in_flight == ticket.units
        )
        allocation_failed = getattr(self.controller, "allocation_failed", None)  # optional in the protocol
        too_large = alone
        if not alone and tried_bytes is not None and allocation_failed is not None:
            # Told only where an `on_oom` may follow: the allocation is that one's.
            too_large = allocation_failed(tried_bytes, ticket.units)
        self._count_ooms(1, now_s)
        self._swallowed.error_seen()
        if self.route_weights is not None and not ticket.released:  # released, the readings since did not count it
            self.route_weights.failed(ticket.route, ticket.requests, ticket.serial)
        if too_large:  # cutting would only starve the others; its route's next ones may be answered at the door
            self.too_large_routes.failed(ticket.route, now_s, ticket.units)
        else:
            # The level that ran out: as many as ran when it came in (its allocation may have failed
            # then, and been told a forward pass later, with fewer in flight), or run now.
            level = max(limiter.in_flight, ticket.in_flight_at_admission)
            told = self.controller.on_oom
            worth_now = self._worth_now()
            if abs(worth_now + self._heavier_in_flight - limiter.in_flight) > 0.01 * limiter.in_flight:
                # Some in flight were weighed before the route weights last changed (those that waited
                # in the line meanwhile) and hold the slots of then: a large one that took one slot where
                # it now takes two made the level look smaller than it was. Counted in the slots of now,
                # and weaker evidence (as an OOM the app caught), for what ran when it allocated is not
                # what runs now.
                level *= worth_now / limiter.in_flight
                told = getattr(self.controller, "on_swallowed_oom", told)
            elif self._stale_left_s >= ticket.admitted_s:
                # One such ran beside this one, and has left: the level of now is not what ran out.
                told = getattr(self.controller, "on_swallowed_oom", told)
            told(now_s=now_s, epoch=ticket.epoch, in_flight=level)
            after_oom = getattr(self.controller, "after_oom", None)  # optional in the protocol
            if after_oom is not None:
                after_oom(limiter.in_flight - (0.0 if ticket.released else ticket.units))
            self._apply_limit(now_s)
        return too_large

    def rejected(
        self,
        reason: Reason,
        *,
        now_s: float,
        timed_out: bool = False,
        priority: int | None = None,
        tenant: str | None = None,
    ) -> int:
        """A request turned away (503/429): counted; the `Retry-After` to give it, in whole seconds.
        `timed_out`: it waited in the queue until its deadline. `priority` (and `tenant`): the class
        of a request that `arrive` saw, counted per class; None for answers outside admission (a
        body buffer full, an OOM of an admitted request)."""
        self.counters.reject(reason)
        self.counters.timed_out += timed_out
        if priority is None:
            return self.retry_after_s(now_s)
        if self.classes is not None:
            self.classes.rejected(priority, tenant)
        return self.retry_after_s(now_s, priority)

    def left(self, priority: int = 0, tenant: str | None = None) -> None:
        """The client left before its request was admitted."""
        self.counters.left_queue += 1
        if self.classes is not None:
            self.classes.left(priority, tenant)

    def body_refused(self, *, too_large: bool) -> None:
        """The body was too large (413) or too slow (408): the client's doing, no capacity answer."""
        if too_large:
            self.counters.bodies_too_large += 1
        else:
            self.counters.body_timeouts += 1

    def failed(self) -> None:
        """A gated route raised something other than an out-of-memory error."""
        self.counters.errors += 1

    # -- the probe ------------------------------------------------------------------------------

    def probe_found(self, description: str, device: str, *, simulated: bool) -> None:
        self.probe.description, self.probe.device, self.probe.simulated = description, device, simulated

    def _costs_told(self, weights: RouteWeights) -> None:
        """The first request with a `cost` other than 1 came: the route weights and the controller
        (`costs_told`, optional in the protocol) hear it, once."""
        weights.costs_told = True
        costs_told = getattr(self.controller, "costs_told", None)
        if costs_told is not None:
            costs_told()

    def in_flight_now(self) -> InFlight:
        """The requests in flight, in slots and by route. Safe to call from the probe's thread while
        the loop runs: attribute reads and a copy of a plain dict, none of which yields the GIL. What they
        weigh beyond their own is read with the slots: read later, on the loop, after a request from
        before a shrink came or went, a reading of whole requests counted parts of one."""
        counters = self.counters
        return InFlight(
            self.limiter.in_flight,
            self.requests_by_route.copy(),
            counters.admitted,
            self._heavier_in_flight - self._reshape_excess,
            counters.admitted - counters.ended,
        )

    def sample(self, sample: MemorySample, now_s: float, then: InFlight | None = None) -> None:
        """A reading of the card, with the requests in flight when it was taken (`then`; None: now)."""
        probe = self.probe
        probe.last_sample, probe.last_error, probe.consecutive_errors = sample, None, 0
        if then is None:
            then = self.in_flight_now()
        if self.route_weights is not None and self.route_weights.reading(
            sample.used_bytes, then.by_route, self._others_bytes(), now_s, then.admitted
        ):
            # Those in flight hold the slots of the old weights
            counters = self.counters
            self._weighed_before, self._weighed_before_in_flight = counters.admitted, counters.admitted - counters.ended
            units_changed = getattr(self.controller, "units_changed", None)  # optional in the protocol
            if units_changed is not None:
                units_changed()
        reshaped_excess = self._reshape(sample, then, now_s)
        if self._arrived_s is not None:
            # Where several routes are gated, a slot's bytes are their weights' (`RouteWeights`), and
            # what one request asked for says little of another route's: nothing is held from before.
            several = len(self.requests_by_route) > 1
            self._oldest_told(None if several else min(self._arrived_s.values(), default=None))
        if self.route_weights is not None and self.route_weights.by_route:
            # In the slots of now, as the route fit reads them: a request weighed before the weights
            # last changed holds its route's bytes, not the slots it took, and read at those, a slot
            # held half again its bytes, the routes read as a mix of sizes and the limit stayed low.
            in_flight = self.route_weights.slots(then.by_route)
        else:
            # The model reads each request at its own slots: what the line weighs beyond them is a guess
            # of the sizes from before, and read as bytes a slot holds, it halved a slot at each reading.
            in_flight = max(0.0, then.units - then.heavier + reshaped_excess)
        self.controller.on_sample(now_s=now_s, sample=sample, in_flight=in_flight)
        self._count_swallowed_ooms(sample, now_s)
        if self._heavier_before is not None and len(self.requests_by_route) <= 1:
            # Before the limit: the reading that finds the sizes shrank raises it too, and a request
            # from before, granted one slot by it, ran out of memory beside the new ones.
            self._reweigh_line(now_s, self._heavier_before())
        self._apply_limit(now_s)

    def _reshape(self, sample: MemorySample, then: InFlight, sample_now_s: float) -> float:
        """Where requests came with a cost on one route, the reading may show a part per request beside
        their units (`CostShape`): the controller hears what a slot holds then (`reshaped`, optional).
        What those in flight weigh now beyond what they weighed at the reading, where the shape changed
        with it, else 0."""
        shape, weights = self.cost_shape, self.route_weights
        if shape is None or weights is None or not weights.costs_told or len(then.by_route) > 1:
            return 0.0
        # The slots in flight as the shape of now weighs them (`in_flight_now`: those from before its last
        # change at what they are worth now); the requests they took them for may be of an older shape.
        slots = then.units - then.heavier
        per_slot_bytes = shape.reading(sample.used_bytes, then.requests, slots, self._others_bytes())
        if per_slot_bytes is None:
            return 0.0
        # Those in flight took the slots of the old shape: what they weigh now beyond them, in sum (affine)
        counters = self.counters
        in_flight = counters.admitted - counters.ended
        held = self.limiter.in_flight - self._heavier_in_flight
        base, before = shape.again(0.0), self._reshape_excess
        self._reshaped_serial, self._reshaped_in_flight = counters.admitted, in_flight
        self._reshape_excess = in_flight * base + (shape.again(1.0) - base) * (held + before) - held
        reshaped = getattr(self.controller, "reshaped", None)
        if reshaped is not None:
            reshaped(per_slot_bytes)
        # The line weighs what it waits with anew: a request of one unit, weighed as 1 where it now takes
        # 4, let in four times its share beside the requests of the new shape.
        for waiter in list(self.limiter.line.joined_before(math.inf)):
            heavier = waiter.units / waiter.weighed  # what it weighs as one from before a shrink stays
            waiter.weighed = units_of_cost(min(MAX_COST, shape.again(waiter.weighed)))
            waiter.units = units_of_cost(min(MAX_COST, waiter.weighed * heavier))
        self.limiter.reconsider(sample_now_s)
        return self._reshape_excess - before

    def _left_from_before_reshape(self, ticket: Ticket, now_s: float) -> None:
        """A request that took the slots of the shape before the last change left: what it weighed
        beyond them goes with it (all of it with the last one)."""
        self._reshaped_in_flight -= 1
        if self._reshaped_in_flight == 0:
            self._reshape_excess = 0.0
        elif self.cost_shape is not None:
            slots = ticket.units - ticket.heavier
            self._reshape_excess -= self.cost_shape.again(slots) - slots
        self._apply_limit(now_s)  # what it was worth beyond its slots is free again

    def fits(self, now_s: float) -> int | None:
        """How many slots fit on the card now by the controller's model of its memory, before the bounds
        (`MemoryModel.cap`: in a mix, with room for its large ones), or None where the controller has no such
        model or it knows no request's bytes yet (for the diagnostics)."""
        cap = getattr(getattr(self.controller, "memory", None), "cap", None)
        level = cap(now_s) if callable(cap) else None
        return level if isinstance(level, int) and not isinstance(level, bool) else None

    def _others_bytes(self) -> float | None:
        """The others' bytes (weights, neighbours) as the controller's memory model holds them, or None."""
        estimate = getattr(getattr(self.controller, "memory", None), "estimate", None)
        held = None if estimate is None else estimate()
        return None if held is None else held.baseline_bytes

    def _reweigh_line(self, now_s: float, heavier: tuple[float, float] | None) -> None:
        """The requests' sizes shrank (the readings say so) while the line held requests from before:
        those weigh the slots of the old size until they are served (a slot is now the new, smaller
        size). Weighed as one slot, an old one let in among new ones ran out of memory, and several
        at once where a lull served them together. Admission by bytes, as far as the gate knows them:
        a request that joined after the change weighs its slot."""
        if heavier is None:
            return
        before_s, weight = heavier
        reweighed = False
        for waiter in list(self.limiter.line.joined_before(math.inf)):
            joined_before = waiter.enqueued_s < before_s
            units = units_of_cost(min(MAX_COST, waiter.weighed * weight)) if joined_before else waiter.weighed
            if units != waiter.units:
                waiter.units, reweighed = units, True
        if reweighed:
            self.limiter.reconsider(now_s)  # lighter than before: some may fit now

    def probe_error(self, message: str) -> bool:
        """A failed reading; True when its message differs from the last one (worth a log line)."""
        probe = self.probe
        probe.errors += 1
        probe.consecutive_errors += 1
        new = probe.last_error != message
        probe.last_error = message
        return new

    def _count_swallowed_ooms(self, sample: MemorySample, now_s: float) -> None:
        """OOMs the application caught itself show only in the probe's cumulative count."""
        swallowed = self._swallowed.reading(sample.oom_count, now_s)
        if swallowed > 0:
            self._count_ooms(swallowed, now_s)
            # Cut at most once for what happened since the previous sample: how many struck beside
            # how many is not known, so a controller that counts OOMs per level is told so.
            controller = self.controller
            told = getattr(controller, "on_swallowed_oom", controller.on_oom)  # optional in the protocol
            told(now_s=now_s, epoch=self._probe_oom_epoch, in_flight=self.limiter.in_flight)
        self._probe_oom_epoch = self.controller.epoch

    def _count_ooms(self, ooms: int, now_s: float) -> None:
        self.counters.ooms += ooms
        self.oom_s.append(now_s)

    # -- the limit ------------------------------------------------------------------------------

    def tick(self, now_s: float) -> None:
        """Time passed: the line may serve in another order now, and a controller that acts on time
        alone (`on_tick`, optional) may move the limit."""
        self.limiter.reconsider(now_s)
        on_tick = getattr(self.controller, "on_tick", None)
        if on_tick is not None:
            on_tick(now_s=now_s)
            self._apply_limit(now_s)

    def set_operator(self, bounds: OperatorBounds | None, now_s: float) -> None:
        """Pin or bound the limit at run time (None: back to the configured bounds)."""
        if bounds is not None and bounds == OperatorBounds(self.min_limit, self.max_limit):
            bounds = None
        self.operator = bounds
        self._apply_limit(now_s, "operator" if bounds is not None else "operator reset")

    def _took_other_slots(self, route: object, units: float, requests: float, heavier: float) -> bool:
        """Whether a request took other slots than it is worth at the route weights of now (it was
        weighed before they last changed); what it weighs as one from before a shrink aside."""
        return units - heavier != self.weigh(route, requests)

    def _worth_now(self) -> float:
        """The requests in flight in the slots of the route weights of now (each holds the slots it took,
        which differ where it was weighed before the weights last changed)."""
        weights = self.route_weights
        return self.limiter.in_flight if weights is None else weights.slots(self.requests_by_route)

    def _bounded(self, limit: int) -> int:
        """`limit` within `[min_limit, max_limit]`: a controller of one's own may ask for any number (the
        protocol asks it to keep to the bounds it was bound to; the limit in force keeps to them whatever it says)."""
        return min(self.max_limit, max(self.min_limit, limit))

    def _apply_limit(self, now_s: float, reason: str | None = None) -> None:
        new_limit = self._bounded(self.controller.limit)
        limiter = self.limiter
        operator = self.operator
        least, most = self.bounds()  # in force: the operator's where set, else the configured ones
        if self.route_weights is not None and (self._weighed_before_in_flight > 0 or self._stale):
            # Requests weighed before the weights last changed hold the slots of then: where they are
            # worth more now, the limiter would let others into their difference; never below the
            # least limit in force (the configured one, or an operator's).
            excess = self._worth_now() + self._heavier_in_flight - limiter.in_flight
            if excess > 0.01 * max(1.0, limiter.in_flight):
                new_limit = max(least, math.floor(new_limit - excess + 0.01))
                reason = reason or "reweighed"
        if self._reshape_excess > 0.01 * max(1.0, limiter.in_flight):
            # Requests admitted before a `cost` last changed shape weigh more now than the slots they took
            new_limit = max(least, math.floor(new_limit - self._reshape_excess + 0.01))
            reason = reason or "reweighed"
        if operator is not None and operator.clamp(new_limit) != new_limit:
            new_limit = operator.clamp(new_limit)
            reason = reason or ("operator pin" if operator.pinned else "operator bounds")
        # A bound is whole slots, configured or an operator's: no part of one past it
        budget: float | None = None
        if new_limit < most:
            budget = getattr(self.controller, "budget", None)  # optional in the protocol
        old_limit = limiter.limit
        if new_limit == old_limit:
            if limiter.budget != budget_of(new_limit, budget):
                limiter.set_limit(new_limit, now_s, budget=budget)
            return
        limiter.set_limit(new_limit, now_s, budget=budget)
        if new_limit > old_limit:
            self.counters.limit_increases += 1
        else:
            self.counters.limit_decreases += 1
        change = LimitChange(
            round(now_s + self.unix_offset_s, 3), old_limit, new_limit, reason or self.controller.reason
        )
        self.limit_changes.append(change)
        for listener in self.limit_listeners:
            listener(change)
