"""The status document: a rendering of one `GateStatistics` snapshot for `GET /gate/status`."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from .._gate.statistics import GateStatistics
from ..probes import NO_DEVICE

__all__ = ["render_json", "status_document"]


def status_document(stats: GateStatistics, *, options: dict[str, Any], version: str, pid: int) -> dict[str, Any]:
    """The document served at `status_path`. Nothing secret: the token shows only as set or not."""
    probe = stats.probe
    return {
        "limit": stats.limit,
        "in_flight": stats.in_flight,
        "budget": round(stats.budget, 3),
        "queued": stats.queued,
        "min_limit": stats.min_limit,
        "max_limit": stats.max_limit,
        "max_queue": stats.max_queue,
        "version": version,
        "bound": stats.bound,
        "operator": stats.operator,
        "ready": {"ready": stats.ready, "reasons": list(stats.not_ready), "degraded": list(stats.degraded)},
        "workers": {"count": stats.workers, "source": stats.workers_source, "pid": pid},
        "loop_lag_s": round(stats.loop_lag_s, 4),
        "findings": list(stats.findings),
        "finding_appearances": stats.finding_appearances,
        "device": None if probe.device == NO_DEVICE else probe.device,
        "memory": _memory(stats),
        "counters": stats.counters,
        "queue_wait_ms": stats.queue_wait_ms,
        "service_ms": stats.service_ms,
        "overload": stats.overload,
        "priorities": stats.priorities,
        "tenants": stats.tenants,
        "route_weights": stats.route_weights,
        "cost_shape": stats.cost_shape,
        "too_large_routes": list(stats.too_large_routes),
        "controller": {
            "controller": stats.controller.name,
            "bound": stats.controller.bound,
            **stats.controller.details,
        },
        "probe": {
            "description": probe.description,
            "running": probe.running,
            "healthy": probe.healthy,
            "last_error": probe.last_error,
            "errors": probe.errors,
            "consecutive_errors": probe.consecutive_errors,
        },
        "limit_changes": [asdict(change) for change in stats.limit_changes],
        "options": options,
    }


def render_json(document: dict[str, Any]) -> bytes:
    # allow_nan=False: NaN is not JSON; a reading that carries one is refused before it gets here.
    return json.dumps(document, separators=(",", ":"), default=str, allow_nan=False).encode()


def _memory(stats: GateStatistics) -> dict[str, Any] | None:
    sample = stats.probe.last_sample
    if sample is None:
        return None
    return {
        "used_bytes": sample.used_bytes,
        "total_bytes": sample.total_bytes,
        "utilisation": round(sample.utilisation, 4),
        "oom_count": sample.oom_count,
        "allocated_bytes": sample.allocated_bytes,
        "reserved_bytes": sample.reserved_bytes,
        "process_count": sample.process_count,
        "simulated": stats.probe.simulated,
    }
