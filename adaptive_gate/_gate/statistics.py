"""Snapshots of the gate, as frozen dataclasses: what `/gate/status`, the metrics and the dashboard
render, in the manner of trio's `CapacityLimiter.statistics()`.

A snapshot is taken, never kept up to date: reading it changes nothing, and two renderings of one
snapshot cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..memory import MemorySample

__all__ = [
    "ControllerStatistics",
    "GateStatistics",
    "Histogram",
    "LimitChange",
    "ProbeStatistics",
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
    budget: float  # the slots requests that weigh part of one may fill (`Limiter.budget`)
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
    # (`_control/route_weights.py`); empty while every request weighs 1.
    route_weights: dict[str, float] = field(default_factory=dict)
    # Where a `cost` holds a part per request beside its units (`_control/cost_shape.py`): a request told
    # `cost` weighs `per_request + per_unit * cost` slots. None while a cost is taken in proportion.
    cost_shape: dict[str, float] | None = None
    # The routes whose last requests were all too large for the card: answered at the door but for one
    # a second (`_gate/too_large.py`).
    too_large_routes: tuple[str, ...] = ()
