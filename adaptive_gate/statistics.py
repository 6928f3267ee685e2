"""Snapshots of the gate, as frozen dataclasses: what `/gate/status`, the metrics and the dashboard
render, in the manner of trio's `CapacityLimiter.statistics()`.

A snapshot is taken, never kept up to date: reading it changes nothing, and two renderings of one
snapshot cannot disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .memory import MemorySample

if TYPE_CHECKING:
    from .core import GateCore

__all__ = [
    "ControllerStatistics",
    "GateStatistics",
    "Histogram",
    "LimitChange",
    "ProbeStatistics",
    "snapshot",
]


@dataclass(frozen=True)
class LimitChange:
    at_unix_s: float
    old: int
    new: int
    reason: str


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts, as the Prometheus exposition format wants them: [(le, count)]."""

    buckets: tuple[tuple[str, int], ...]
    sum_s: float


@dataclass(frozen=True)
class ControllerStatistics:
    """`name` ("aimd", "fixed", or a custom controller's), the bound that sets the limit, and the
    controller's own figures (`details`, as its `describe()` gives them)."""

    name: str
    limit: int
    bound: str
    epoch: int
    reason: str
    details: dict[str, Any]


@dataclass(frozen=True)
class ProbeStatistics:
    description: str
    device: str
    simulated: bool
    running: bool
    last_sample: MemorySample | None
    last_error: str | None
    errors: int
    consecutive_errors: int

    @property
    def healthy(self) -> bool:
        return self.last_error is None


@dataclass(frozen=True)
class GateStatistics:
    """Everything the gate knows at one moment. `min_limit`/`max_limit` are the bounds in force (an
    operator's, where set); `counters` the cumulative counts as a plain dict."""

    limit: int
    in_flight: float
    queued: int
    max_queue: int
    min_limit: int
    max_limit: int
    bound: str
    operator: dict[str, int | bool] | None
    counters: dict[str, Any]
    queue_wait_ms: dict[str, float] | None
    service_ms: dict[str, float] | None
    queue_wait_histogram: Histogram
    service_histogram: Histogram
    controller: ControllerStatistics
    probe: ProbeStatistics
    limit_changes: tuple[LimitChange, ...]
    ready: bool
    not_ready: tuple[str, ...]
    degraded: tuple[str, ...]
    oom_unix_s: tuple[float, ...] = ()
    # Filled in by the middleware, which runs the loops that measure them.
    workers: int = 1
    workers_source: str = "assumed"
    loop_lag_s: float = 0.0
    findings: tuple[dict[str, Any], ...] = ()
    finding_appearances: dict[str, int] = field(default_factory=dict)
    # Per class, when a priority or a tenant is configured: {name: {arrived, admitted, rejected,
    # left}}, tenants bounded (the busiest, then "other"); and the state of the controlled delay.
    priorities: dict[str, dict[str, int]] = field(default_factory=dict)
    tenants: dict[str, dict[str, int]] = field(default_factory=dict)
    overload: dict[str, Any] = field(default_factory=dict)
    # What one request of each route weighs in slots, where readings have told routes apart
    # (`_route_weights`); empty while every request weighs 1.
    route_weights: dict[str, float] = field(default_factory=dict)


def snapshot(core: GateCore) -> GateStatistics:
    """The figures of `core` at this moment, as one frozen snapshot."""
    limiter = core.limiter.statistics()
    min_limit, max_limit = core.bounds()
    ready, not_ready = core.readiness()
    probe = core.probe
    controller = _controller_statistics(core)
    return GateStatistics(
        limit=limiter.limit,
        in_flight=limiter.in_flight,
        queued=limiter.queued,
        max_queue=limiter.max_queue,
        min_limit=min_limit,
        max_limit=max_limit,
        bound=_bound(core, controller),
        operator=None if core.operator is None else core.operator.describe(),
        counters=asdict(core.counters),
        queue_wait_ms=core.queue_wait_s.percentiles_ms(),
        service_ms=core.service_s.percentiles_ms(),
        queue_wait_histogram=Histogram(tuple(core.queue_wait_histogram.cumulative()), core.queue_wait_histogram.sum_s),
        service_histogram=Histogram(tuple(core.service_histogram.cumulative()), core.service_histogram.sum_s),
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
        limit_changes=tuple(core.limit_changes),
        ready=ready,
        not_ready=tuple(not_ready),
        degraded=tuple(core.degraded()),
        oom_unix_s=tuple(round(t + core.unix_offset_s, 3) for t in core.oom_s),
        priorities={} if core.classes is None else core.classes.shown_priorities(),
        tenants={} if core.classes is None else core.classes.shown_tenants(),
        overload=_overload(core),
        route_weights={} if core.route_weights is None else core.route_weights.weights(),
    )


def _overload(core: GateCore) -> dict[str, Any]:
    """What the gate does in overload, whether the queue is in overload now (`standing`), how often
    it has been, and the rates it is judged by: arrivals to the line against waiters taken in."""
    detector = core.detector
    if detector is None:
        return {"mode": core.overload, "standing": False}
    arriving_per_s, taken_per_s = detector.rates_per_s(core._clock())
    return {
        "mode": core.overload,
        "standing": detector.overloaded,
        "target_ms": round(detector.target_s * 1000, 3) if detector.known else None,  # None: no service time yet
        "interval_ms": round(detector.interval_s * 1000, 3),
        "episodes": detector.episodes,
        "arriving_per_s": round(arriving_per_s, 3),
        "taken_in_per_s": round(taken_per_s, 3),
    }


def _controller_statistics(core: GateCore) -> ControllerStatistics:
    details = dict(core.controller.describe())
    name = str(details.pop("controller", type(core.controller).__name__.lower()))
    bound = str(details.pop("bound", "controller"))
    return ControllerStatistics(
        name, core.controller.limit, bound, core.controller.epoch, core.controller.reason, details
    )


def _bound(core: GateCore, controller: ControllerStatistics) -> str:
    """Which bound sets the limit now: the controller's own answer, unless the operator clamps it."""
    operator = core.operator
    if operator is not None and operator.clamp(controller.limit) != controller.limit:
        return "operator"
    return controller.bound
