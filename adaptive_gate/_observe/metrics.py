"""Prometheus metrics for one gate, through `prometheus-client` (the `metrics` extra).

Each gate has its own `CollectorRegistry`, so two gates in one process (two apps, tests) never
collide; `GateMetrics.registry` is there to be merged into an application's own exposition.
Every family is a rendering of one `GateStatistics` snapshot taken when scraped, so a scrape and
`/gate/status` never disagree. The two latency histograms are counted per request by the gate's
core (buckets cannot be rebuilt from a bounded sample) as plain counts that prometheus-client
renders at scrape time: an observation costs one bisect, where a client `Histogram` also takes a lock.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .._gate.reasons import Reason
from .._gate.statistics import GateStatistics, Histogram

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["CONTENT_TYPE", "MISSING", "GateMetrics", "available"]

MISSING = "prometheus-client is not installed: pip install 'adaptive-gate[metrics]' to serve metrics here"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

BOUNDS = ("controller", "memory", "oom", "min_limit", "max_limit", "operator", "batcher")
CLASS_OUTCOMES = ("admitted", "rejected", "left")


def available() -> bool:
    """Whether prometheus-client is installed; it is imported only when a gate is built, not here."""
    return importlib.util.find_spec("prometheus_client") is not None


class _StatisticsCollector:
    """A custom collector (prometheus-client's protocol: `collect()`) taking a snapshot per scrape."""

    def __init__(self, statistics: Callable[[], GateStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        stats = self._statistics()
        yield from _families(stats)
        yield from _histograms(stats)


def _gauge(name: str, documentation: str, value: float) -> Metric:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(f"adaptive_gate_{name}", documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> Metric:
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(f"adaptive_gate_{name}", documentation, value=value)


def _labelled(
    kind: type[GaugeMetricFamily | CounterMetricFamily],
    name: str,
    documentation: str,
    label: str,
    values: dict[str, Any],
) -> Metric:
    family = kind(f"adaptive_gate_{name}", documentation, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def _families(stats: GateStatistics) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    from .._version import __version__

    info = GaugeMetricFamily(
        "adaptive_gate_info", "The gate's version, controller and device", labels=["version", "controller", "device"]
    )
    info.add_metric([__version__, stats.controller.name, stats.probe.device], 1)
    yield info
    yield _gauge("limit", "Gated requests allowed to run at once now", stats.limit)
    yield _labelled(
        GaugeMetricFamily,
        "limit_bound",
        "Which bound sets the limit now (1) and which do not (0)",
        "bound",
        {bound: float(bound == stats.bound) for bound in BOUNDS},
    )
    yield _gauge("min_limit", "Lowest limit allowed now", stats.min_limit)
    yield _gauge("max_limit", "Highest limit allowed now", stats.max_limit)
    yield _gauge("in_flight", "Gated requests running now", stats.in_flight)
    yield _gauge("queued", "Gated requests waiting for a slot now", stats.queued)
    yield _gauge("max_queue", "How many requests may wait", stats.max_queue)
    yield _gauge("ready", "1 when the readiness endpoint answers 200", float(stats.ready))
    yield _gauge("workers", "Worker processes of this service, as detected", stats.workers)
    yield from _request_families(stats)
    yield from _memory_families(stats)
    yield from _health_families(stats)
    yield from _class_families(stats)
    yield from _batching_families(stats)


def _request_families(stats: GateStatistics) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily

    counters = stats.counters
    yield _counter("admitted", "Gated requests given a slot", counters["admitted"])
    by_reason = counters["rejected_by_reason"]
    yield _labelled(
        CounterMetricFamily,
        "requests",
        "Gated requests by how they ended: each counted once",
        "outcome",
        {
            "completed": counters["completed"],
            "failed": counters["failed"],
            "oom": counters["admitted_ooms"],
            # OOM answers went to admitted requests, counted under "oom" already.
            "rejected": counters["rejected"] - by_reason.get(Reason.OOM, 0) - by_reason.get(Reason.TOO_LARGE, 0),
            "left_queue": counters["left_queue"],
            "bad_body": counters["body_timeouts"] + counters["bodies_too_large"],
        },
    )
    reasons = {reason.value: 0 for reason in Reason} | by_reason
    yield _labelled(CounterMetricFamily, "rejections", "503/429 answers by reason", "reason", reasons)
    yield _counter("ooms", "Out-of-memory events: raised by gated routes or seen by the probe", counters["ooms"])
    yield _labelled(
        CounterMetricFamily,
        "limit_changes",
        "Changes of the limit by direction",
        "direction",
        {"up": counters["limit_increases"], "down": counters["limit_decreases"]},
    )


def _class_families(stats: GateStatistics) -> Iterator[Metric]:
    """Per priority and per tenant (the busiest, the rest as "other": bounded label values)."""
    from prometheus_client.core import GaugeMetricFamily

    # Gauges, not counters: the busiest tenants change (and with them what "other" holds), and a
    # request still waiting counts as admitted until it is turned away or leaves.
    for label, tallies in (("priority", stats.priorities), ("tenant", stats.tenants)):
        if not tallies:
            continue
        family = GaugeMetricFamily(
            f"adaptive_gate_{label}_requests",
            f"Gated requests per {label} so far, by what became of them before a slot (admitted: not turned "
            "away, nor gone, yet); a snapshot per class, not monotonic",
            labels=[label, "outcome"],
        )
        for name, tally in tallies.items():
            for outcome in CLASS_OUTCOMES:
                family.add_metric([name, outcome], tally[outcome])
        yield family
    overload = stats.overload
    yield _gauge(
        "queue_standing",
        "1 while the queue is in overload (more arriving than served)",
        float(overload.get("standing", False)),
    )
    if "episodes" in overload:
        yield _counter("queue_standing_episodes", "Times the queue went into overload", overload["episodes"])
    if overload.get("target_ms") is not None:
        target_s = overload["target_ms"] / 1000
        yield _gauge("queue_target_seconds", "The sojourn above which the queue counts as standing", target_s)


def _health_families(stats: GateStatistics) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    yield _counter("probe_errors", "Failed probe readings", stats.probe.errors)
    yield _gauge("probe_healthy", "1 while the last probe reading succeeded", float(stats.probe.healthy))
    yield _gauge("event_loop_lag_seconds", "How late the event loop woke at the last check", stats.loop_lag_s)
    findings = {finding["code"]: finding for finding in stats.findings}
    appearances = stats.finding_appearances
    yield _labelled(CounterMetricFamily, "findings", "Times each diagnostic finding appeared", "code", appearances)
    yield _labelled(
        GaugeMetricFamily,
        "finding_active",
        "1 while a diagnostic finding holds",
        "code",
        {code: float(code in findings and findings[code]["active"]) for code in appearances},
    )


def _memory_families(stats: GateStatistics) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    sample = stats.probe.last_sample
    if sample is None:
        return
    device = stats.probe.device
    used = GaugeMetricFamily("adaptive_gate_memory_used_bytes", "Device memory in use", labels=["device"])
    used.add_metric([device], sample.used_bytes)
    total = GaugeMetricFamily("adaptive_gate_memory_total_bytes", "Device memory in all", labels=["device"])
    total.add_metric([device], sample.total_bytes)
    yield used
    yield total


def _histograms(stats: GateStatistics) -> Iterator[Metric]:
    from prometheus_client.core import HistogramMetricFamily

    histograms: tuple[tuple[str, str, Histogram], ...] = (
        ("queue_wait_seconds", "Time gated requests waited for a slot", stats.queue_wait_histogram),
        ("service_seconds", "Time from a slot's grant to the response's last byte, successes only",
         stats.service_histogram),
    )  # fmt: skip
    for name, documentation, histogram in histograms:
        yield HistogramMetricFamily(
            f"adaptive_gate_{name}", documentation, buckets=list(histogram.buckets), sum_value=histogram.sum_s
        )


class GateMetrics:
    """One gate's registry, with a collector that renders a snapshot of the gate per scrape."""

    def __init__(self, statistics: Callable[[], GateStatistics]) -> None:
        try:
            import prometheus_client
        except ImportError as exc:
            raise RuntimeError(MISSING) from exc
        self._generate_latest = prometheus_client.generate_latest
        self.registry = prometheus_client.CollectorRegistry(auto_describe=False)
        self.registry.register(_StatisticsCollector(statistics))

    def render(self) -> bytes:
        return self._generate_latest(self.registry)


# A batcher's figures, where the gate's controller is its `gate_controller()` (`controller.batching`).
BATCH_COUNTERS = {
    "batches": ("batches", "Batches run that answered their items"),
    "items": ("batch_items", "Items answered by batches"),
    "splits": ("batch_splits", "Batches split in halves after an out-of-memory error"),
    "ooms": ("batch_ooms", "Items that failed alone with an out-of-memory error"),
    "failed_items": ("batch_failed_items", "Items that failed (their own error, or their batch's)"),
    "cancelled": ("batch_cancelled", "Callers that left before their batch answered them"),
}
BATCH_BYTES = {
    "workspace_bytes": ("batch_workspace_bytes", "Bytes a batch holds beside its items, as learned"),
    "bytes_per_unit": ("batch_bytes_per_unit", "Bytes one unit of an item's cost holds in a batch, as learned"),
}


def _batching_families(stats: GateStatistics) -> Iterator[Metric]:
    batching = stats.controller.details.get("batching")
    if not isinstance(batching, dict):
        return
    yield _gauge("batch_size", "Items the next batch may hold now", batching["batch_size"])
    for key, (name, documentation) in BATCH_COUNTERS.items():
        yield _counter(name, documentation, batching[key])
    wait_ms = batching.get("wait_added_ms_mean")
    if wait_ms is not None:
        yield _gauge("batch_wait_added_seconds_mean", "Mean wait from an item's arrival to its batch", wait_ms / 1000)
    for key, (name, documentation) in BATCH_BYTES.items():
        if batching.get(key) is not None:
            yield _gauge(name, documentation, batching[key])
