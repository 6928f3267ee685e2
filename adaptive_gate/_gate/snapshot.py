"""The core's figures as one frozen snapshot (`GateCore.statistics()`): what the status, the
metrics and the dashboard render. A mixin of `GateCore`, kept apart from `core.py`, whose events
are every request's path; it reads what the core holds and changes nothing."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict
from typing import Any

from .._control.control import Controller
from .._control.cost_shape import CostShape
from .._control.route_weights import RouteWeights
from .accounts import ClassCounts
from .answers import CoreAnswers
from .figures import BucketCounts, RecentValues
from .overload import OverloadDetector
from .statistics import ControllerStatistics, GateStatistics, Histogram, LimitChange, ProbeStatistics
from .too_large import TooLargeRoutes

__all__ = ["CoreSnapshot"]


class CoreSnapshot(CoreAnswers):
    # What `GateCore` holds and the snapshot reads, beside what `CoreAnswers` reads.
    controller: Controller
    queue_wait_s: RecentValues
    queue_wait_histogram: BucketCounts
    service_histogram: BucketCounts
    limit_changes: deque[LimitChange]
    oom_s: deque[float]
    unix_offset_s: float
    classes: ClassCounts | None
    route_weights: RouteWeights | None
    cost_shape: CostShape | None
    too_large_routes: TooLargeRoutes
    detector: OverloadDetector | None
    overload: str

    def statistics(self, now_s: float) -> GateStatistics:
        """A snapshot of the figures at `now_s`; reading it changes nothing."""
        self.queue_wait_s.flush()  # the zeros counted lazily, into the histogram too
        limiter = self.limiter.statistics()
        min_limit, max_limit = self.bounds()
        ready, not_ready = self.readiness()
        probe = self.probe
        controller = self._controller_statistics()
        return GateStatistics(
            limit=limiter.limit,
            in_flight=limiter.in_flight,
            budget=self.limiter.budget,
            queued=limiter.queued,
            max_queue=limiter.max_queue,
            min_limit=min_limit,
            max_limit=max_limit,
            bound=self._bound(controller),
            operator=None if self.operator is None else self.operator.describe(),
            counters=asdict(self.counters),
            queue_wait_ms=self.queue_wait_s.percentiles_ms(),
            service_ms=self.service_s.percentiles_ms(),
            queue_wait_histogram=_histogram(self.queue_wait_histogram),
            service_histogram=_histogram(self.service_histogram),
            controller=controller,
            probe=ProbeStatistics(
                probe.description,
                probe.device,
                probe.simulated,
                False,
                probe.last_sample,
                probe.last_error,
                probe.errors,
                probe.consecutive_errors,
            ),  # fmt: skip
            limit_changes=tuple(self.limit_changes),
            ready=ready,
            not_ready=tuple(not_ready),
            degraded=tuple(self.degraded()),
            oom_unix_s=tuple(round(t + self.unix_offset_s, 3) for t in self.oom_s),
            priorities={} if self.classes is None else self.classes.shown_priorities(),
            tenants={} if self.classes is None else self.classes.shown_tenants(),
            overload=self._overload_figures(now_s),
            route_weights={} if self.route_weights is None else self.route_weights.weights(),
            cost_shape=None if self.cost_shape is None else self.cost_shape.shown(),
            too_large_routes=tuple(self.too_large_routes.refused()),
        )

    def _overload_figures(self, now_s: float) -> dict[str, Any]:
        """What the gate does in overload, whether the queue is in overload now (`standing`), how often
        it has been, and the rates it is judged by: arrivals to the line against waiters taken in."""
        detector = self.detector
        if detector is None:
            return {"mode": self.overload, "standing": False}
        arriving_per_s, taken_per_s = detector.rates_per_s(now_s)
        return {
            "mode": self.overload,
            "standing": detector.overloaded,
            "target_ms": round(detector.target_s * 1000, 3) if detector.known else None,  # None: no service time yet
            "interval_ms": round(detector.interval_s * 1000, 3),
            "episodes": detector.episodes,
            "arriving_per_s": round(arriving_per_s, 3),
            "taken_in_per_s": round(taken_per_s, 3),
        }

    def _controller_statistics(self) -> ControllerStatistics:
        details = dict(self.controller.describe())
        name = str(details.pop("controller", type(self.controller).__name__.lower()))
        bound = str(details.pop("bound", "controller"))
        return ControllerStatistics(
            name, self.controller.limit, bound, self.controller.epoch, self.controller.reason, details
        )

    def _bound(self, controller: ControllerStatistics) -> str:
        """Which bound sets the limit now: the controller's own answer, unless the operator pinned it or
        its bounds clamp it."""
        operator = self.operator
        if operator is not None and (operator.pinned or operator.clamp(controller.limit) != controller.limit):
            return "operator"
        # A controller of one's own that asks past the configured bounds is held to them (`GateCore._bounded`)
        if controller.limit > self.max_limit:
            return "max_limit"
        if controller.limit < self.min_limit:
            return "min_limit"
        return controller.bound


def _histogram(counts: BucketCounts) -> Histogram:
    return Histogram(tuple(counts.cumulative()), counts.sum_s)
