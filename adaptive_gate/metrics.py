"""Prometheus metrics for one gate, through `prometheus-client` (the `metrics` extra).

Each gate has its own `CollectorRegistry`, so two gates in one process (two apps, tests) never
collide; `GateMetrics.registry` is there to be merged into an application's own exposition.
Gauges and counters are read from the status document when scraped, so a scrape and
`/gate/status` never disagree. The two latency histograms are counted per request (buckets cannot
be rebuilt from a bounded sample) as plain counts that prometheus-client renders at scrape time: an
observation costs one bisect, where a client `Histogram` also takes a lock.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .status import BucketCounts

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["CONTENT_TYPE", "MISSING", "GateMetrics", "available"]

MISSING = "prometheus-client is not installed: pip install 'adaptive-gate[metrics]' to serve metrics here"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

QUEUE_WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SERVICE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

BOUNDS = ("controller", "memory_cap", "max_limit", "operator")
REJECT_REASONS = ("queue_full", "deadline", "oom", "too_large")


def available() -> bool:
    """Whether prometheus-client is installed; it is imported only when a gate is built, not here."""
    return importlib.util.find_spec("prometheus_client") is not None


class _StatusCollector:
    """A custom collector (prometheus-client's protocol: `collect()`) reading the status per scrape."""

    def __init__(self, status: Callable[[], dict[str, Any]], metrics: GateMetrics) -> None:
        self._status = status
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from _families(self._status())
        yield from self._metrics.histograms()


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


def _families(status: dict[str, Any]) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    counters = status["counters"]
    info = GaugeMetricFamily(
        "adaptive_gate_info", "The gate's version, controller and device", labels=["version", "controller", "device"]
    )
    info.add_metric([status["version"], status["controller"].get("controller", "custom"), status["device"]], 1)
    yield info
    yield _gauge("limit", "Gated requests allowed to run at once now", status["limit"])
    yield _labelled(
        GaugeMetricFamily,
        "limit_bound",
        "Which bound sets the limit now (1) and which do not (0)",
        "bound",
        {bound: float(bound == status["bound"]) for bound in BOUNDS},
    )
    yield _gauge("min_limit", "Lowest limit allowed now", status["min_limit"])
    yield _gauge("max_limit", "Highest limit allowed now", status["max_limit"])
    yield _gauge("in_flight", "Gated requests running now", status["in_flight"])
    yield _gauge("queued", "Gated requests waiting for a slot now", status["queued"])
    yield _gauge("max_queue", "How many requests may wait", status["max_queue"])
    yield _gauge("ready", "1 when the readiness endpoint answers 200", float(status["ready"]["ready"]))
    yield _gauge("workers", "Worker processes of this service, as detected", status["workers"]["count"])
    yield _counter("admitted", "Gated requests given a slot", counters["admitted"])
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
            "rejected": counters["rejected"]
            - counters["rejected_by_reason"].get("oom", 0)
            - counters["rejected_by_reason"].get("too_large", 0),
            "left_queue": counters["left_queue"],
            "bad_body": counters["body_timeouts"] + counters["bodies_too_large"],
        },
    )
    reasons = {reason: 0 for reason in REJECT_REASONS} | counters["rejected_by_reason"]
    yield _labelled(CounterMetricFamily, "rejections", "503/429 answers by reason", "reason", reasons)
    yield _counter("ooms", "Out-of-memory events: raised by gated routes or seen by the probe", counters["ooms"])
    yield _labelled(
        CounterMetricFamily,
        "limit_changes",
        "Changes of the limit by direction",
        "direction",
        {"up": counters["limit_increases"], "down": counters["limit_decreases"]},
    )
    yield from _memory_families(status)
    probe = status["probe"]
    yield _counter("probe_errors", "Failed probe readings", probe["errors"])
    yield _gauge("probe_healthy", "1 while the last probe reading succeeded", float(probe["healthy"]))
    yield _gauge("event_loop_lag_seconds", "How late the event loop woke at the last check", status["loop_lag_s"])
    findings = {finding["code"]: finding for finding in status["findings"]}
    appearances = status["finding_appearances"]
    yield _labelled(CounterMetricFamily, "findings", "Times each diagnostic finding appeared", "code", appearances)
    yield _labelled(
        GaugeMetricFamily,
        "finding_active",
        "1 while a diagnostic finding holds",
        "code",
        {code: float(code in findings and findings[code]["active"]) for code in appearances},
    )


def _memory_families(status: dict[str, Any]) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    memory = status["memory"]
    if memory is None:
        return
    device = status["device"]
    used = GaugeMetricFamily("adaptive_gate_memory_used_bytes", "Device memory in use", labels=["device"])
    used.add_metric([device], memory["used_bytes"])
    total = GaugeMetricFamily("adaptive_gate_memory_total_bytes", "Device memory in all", labels=["device"])
    total.add_metric([device], memory["total_bytes"])
    yield used
    yield total


class GateMetrics:
    """One gate's registry, with a collector that reads the status and the gate's two histograms."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        try:
            import prometheus_client
        except ImportError as exc:
            raise RuntimeError(MISSING) from exc
        self._generate_latest = prometheus_client.generate_latest
        self.queue_wait_s = BucketCounts(QUEUE_WAIT_BUCKETS_S)
        self.service_s = BucketCounts(SERVICE_BUCKETS_S)
        self.registry = prometheus_client.CollectorRegistry(auto_describe=False)
        self.registry.register(_StatusCollector(status, self))

    def render(self) -> bytes:
        return self._generate_latest(self.registry)

    def histograms(self) -> Iterator[Metric]:
        from prometheus_client.core import HistogramMetricFamily

        for name, documentation, counts in (
            ("queue_wait_seconds", "Time gated requests waited for a slot", self.queue_wait_s),
            ("service_seconds", "Time from a slot's grant to the response's last byte, successes only", self.service_s),
        ):
            yield HistogramMetricFamily(
                f"adaptive_gate_{name}", documentation, buckets=counts.cumulative(), sum_value=counts.sum_s
            )
