"""What the gate does beside admitting requests: it takes the background loops' reports (probe
readings, the monitor's ticks) to the core and the diagnostics, and answers the operating endpoints
(status, metrics, dashboard, readiness, operator limits) with renderings of one snapshot."""

from __future__ import annotations

import json
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import anyio.to_thread

from .._gate.core import GateCore, InFlight, Outcome
from .._gate.operator import parse_limits
from .._gate.statistics import GateStatistics, LimitChange
from .._observe import metrics as _metrics
from .._observe.diagnostics import Diagnostics
from .._observe.sampler import Monitor, Sampler
from .._observe.status import status_document
from .._observe.watch import Watch
from .._observe.workers import WorkerCount
from .._version import __version__
from ..memory import MemorySample
from ..options import GateOptions
from ..probes import NO_DEVICE, Probe, auto_probe, device_label
from .background import FIRST_READING_WAIT_S, Background

__all__ = ["MONITOR_PERIOD_S", "Operations"]

logger = logging.getLogger("adaptive_gate")

MONITOR_PERIOD_S = 0.1
MAX_BATCHERS_NAMED = 8  # in the finding of batchers behind a gate that do not set its limit


class Operations:
    def __init__(
        self, options: GateOptions, core: GateCore, diagnostics: Diagnostics, *, clock: Callable[[], float]
    ) -> None:
        self.clock = clock
        self.options = options
        self.core = core
        self.diagnostics = diagnostics
        self.watch = Watch(diagnostics, period_s=MONITOR_PERIOD_S)
        self.metrics = _metrics.GateMetrics(self.statistics) if _metrics.available() else None
        self.background = Background(
            make_sampler=self._make_sampler,
            make_monitor=lambda: Monitor(period_s=MONITOR_PERIOD_S, on_tick=self._on_tick),
            first_reading_timeout_s=FIRST_READING_WAIT_S + options.probe_timeout,
        )
        self._workers = WorkerCount(options.workers)
        self.tick_hooks: list[Callable[[], None]] = []  # more work for the monitor's tick
        self._thread_pool: anyio.CapacityLimiter | None = None  # its tokens read when the limit rises
        self._warned_thread_pool = False
        core.limit_listeners.append(self._limit_changed)
        read_through = getattr(core.controller, "read_through", None)  # a batcher's (optional in the protocol)
        if read_through is not None:
            read_through(SamplerReader(self))
        # A batcher running under a gated request reports itself: any but the controller's is a finding.
        self._own_batcher = getattr(core.controller, "batcher", None)
        self._batchers_told: weakref.WeakSet[object] = weakref.WeakSet()
        self._batcher_names: list[str] = []

    # -- what the loops report -----------------------------------------------------------------

    def _on_tick(self, _monitor_s: float, lag_s: float) -> None:
        # The monitor measures the loop's lag on the real clock; the events are stamped with the
        # gate's own clock, as every other event is (a test's fake clock stays the one clock).
        now_s = self.clock()
        self._abandon_stuck_sends(now_s)
        self.core.tick(now_s)
        for hook in self.tick_hooks:
            hook()
        core = self.core
        min_limit, max_limit = core.bounds()
        self.watch.tick(
            now_s,
            lag_s,
            unix_s=now_s + core.unix_offset_s,
            limiter=core.limiter.statistics(),
            sample=core.probe.last_sample,
            min_limit=min_limit,
            max_limit=max_limit,
            probe_errors_in_row=core.probe.consecutive_errors,
            fits=core.fits,
        )

    def _abandon_stuck_sends(self, now_s: float) -> None:
        """A client that reads nothing holds no slot past `send_timeout`: the slot is for GPU work."""
        for ticket in self.watch.running:
            since_s = ticket.sending_since_s
            if since_s is not None and now_s - since_s >= self.options.send_timeout and not ticket.abandoned:
                ticket.abandoned = True
                self.core.release(ticket, self.clock(), Outcome.FAILED)

    def _on_sample(self, sample: MemorySample, before: InFlight | None = None, after: InFlight | None = None) -> None:
        """A reading, with the requests in flight just before and just after it was taken (on the
        probe's thread). Where one came or went meanwhile, the fewer are taken: one that came had not
        allocated yet, one that went had freed its bytes before it gave its slot back."""
        now_s = self.clock()
        core = self.core
        then = None if before is None or after is None else min(before, after, key=lambda taken: taken.units)
        core.sample(sample, now_s, then)
        self.diagnostics.on_sample(now_s, sample, in_flight=core.limiter.in_flight, queued=core.limiter.queued)

    def batcher_behind(self, batched: object) -> None:
        """A batcher ran under one of this gate's requests (`BEHIND_A_GATE`): once for each batcher
        whose capacity is not the limit, a finding names it."""
        if batched is self._own_batcher or batched in self._batchers_told:
            return
        self._batchers_told.add(batched)
        name = str(getattr(batched, "__name__", "batched"))
        if name in self._batcher_names or len(self._batcher_names) >= MAX_BATCHERS_NAMED:
            return  # each function once (a factory makes many of one name), and a few at most
        self._batcher_names.append(name)
        own = None if self._own_batcher is None else str(getattr(self._own_batcher, "__name__", "batched"))
        self.diagnostics.on_batcher(self.clock(), self._batcher_names, follows=own)

    def _on_probe_error(self, message: str) -> None:
        if self.core.probe_error(message):
            logger.warning("adaptive_gate: %s; serving on OOM and latency signals meanwhile", message)

    def _on_probe(self, probe: Probe | None, description: str) -> None:
        description = description or f"probe: {probe!r}"
        simulated = bool(getattr(probe, "simulated", False))
        self.core.probe_found(description, device_label(probe), simulated=simulated)
        logger.info("adaptive_gate: %s", description)

    def _limit_changed(self, change: LimitChange) -> None:
        logger.info(
            "adaptive_gate limit change: old=%d new=%d reason=%s",
            change.old,
            change.new,
            json.dumps(change.reason),
            extra={"adaptive_gate": {"event": "limit_change", "old": change.old, "new": change.new,
                                     "reason": change.reason}},
        )  # fmt: skip
        self._warn_thread_pool(change.new)

    # -- what the endpoints ask ----------------------------------------------------------------

    def statistics(self) -> GateStatistics:
        """A snapshot of everything the gate knows; reading it changes nothing."""
        workers, source = self._workers.get()
        stats = self.core.statistics(self.clock())
        return replace(
            stats,
            probe=replace(stats.probe, running=self.background.sampler_running),
            workers=workers,
            workers_source=source,
            loop_lag_s=self.watch.loop_lag_s,
            findings=tuple(self.diagnostics.findings()),
            finding_appearances=self.diagnostics.appearances(),
        )

    def status(self, stats: GateStatistics | None = None) -> dict[str, Any]:
        """The document served at `status_path`. Nothing secret: the token shows only as set or not."""
        stats = stats or self.statistics()
        return status_document(stats, options=self.options.describe(), version=__version__, pid=os.getpid())

    def metrics_body(self) -> bytes | None:
        """Prometheus exposition, or None where prometheus-client is not installed."""
        return None if self.metrics is None else self.metrics.render()

    def dashboard_data(self) -> dict[str, Any]:
        stats = self.statistics()
        return {
            "now_unix_s": round(self.clock() + self.core.unix_offset_s, 3),
            "status": self.status(stats),
            "history": self.watch.history.columns(),
            "oom_unix_s": list(stats.oom_unix_s),
        }

    def readiness(self) -> tuple[bool, list[str]]:
        return self.core.readiness()

    def degraded(self) -> list[str]:
        return self.core.degraded()

    def operator_limits(self) -> dict[str, Any]:
        core = self.core
        return {
            "limit": core.limiter.limit,
            "controller_limit": core.controller.limit,
            "operator": None if core.operator is None else core.operator.describe(),
            "configured": {"min_limit": self.options.min_limit, "max_limit": self.options.max_limit},
        }

    def set_operator_limits(self, body: object) -> dict[str, Any]:
        """Pin or bound the limit at run time (`PUT limits_path`); LimitsError leaves all as it was."""
        options = self.options
        bounds = parse_limits(body, configured_min=options.min_limit, configured_max=options.max_limit)
        self.core.set_operator(bounds, self.clock())
        operator = self.core.operator
        logger.info(
            "adaptive_gate: operator limits set to %s",
            "the configured bounds" if operator is None else f"[{operator.min_limit}, {operator.max_limit}]",
        )
        return self.operator_limits()

    def _make_sampler(self) -> Sampler[InFlight] | None:
        if self.options.probe is None:
            self.core.probe_found("probe: none (probe=None), the gate runs on OOM and latency signals", NO_DEVICE,
                                  simulated=False)  # fmt: skip
            return None
        return Sampler(
            self._resolve_probe,
            period_s=self.options.sample_period,
            timeout_s=self.options.probe_timeout,
            on_probe=self._on_probe,
            alongside=self.core.in_flight_now,
            on_sample=self._on_sample,
            on_error=self._on_probe_error,
        )

    def _resolve_probe(self) -> tuple[Probe | None, str]:
        if self.options.probe == "auto":
            return auto_probe()
        probe: Probe = self.options.probe  # type: ignore[assignment]
        return probe, f"probe: {probe!r}"

    def read_thread_pool(self) -> None:
        """Keep the event loop's thread pool (on the loop, before the app starts): its size is read when
        the limit rises, after the app's start-up, where the app may have raised it."""
        if self._thread_pool is None:
            try:
                self._thread_pool = anyio.to_thread.current_default_thread_limiter()
            except Exception:  # no running loop anyio knows: nothing to compare against
                self._thread_pool = None

    def _warn_thread_pool(self, limit: int) -> None:
        pool = self._thread_pool
        if pool is None or self._warned_thread_pool:
            return
        tokens = pool.total_tokens
        if limit <= tokens:
            return
        self._warned_thread_pool = True
        logger.warning(
            "adaptive_gate: the limit reached %d but sync routes (and work an async route hands to "
            "run_in_threadpool) share a thread pool of %d tokens, so at most %d of them run at once; raise "
            "anyio.to_thread.current_default_thread_limiter().total_tokens if the GPU holds more",
            limit,
            tokens,
            tokens,
        )


class SamplerReader:
    """The gate's sampler as a batcher behind the gate reads the card (`_batch.probe.CardReader`):
    a reading on the sampler's thread before each batch. It holds the gate weakly: a batcher
    outlives the gates built around it (a middleware stack built again), and must not keep them."""

    def __init__(self, operations: Operations) -> None:
        self._operations = weakref.ref(operations)
        self._configured = operations.options.probe

    @property
    def configured(self) -> Probe | str | None:
        return cast("Probe | str | None", self._configured)  # checked by the options

    @property
    def probe(self) -> Probe | None:
        operations = self._operations()
        return None if operations is None else operations.background.probe

    @property
    def alive(self) -> bool:
        return self._operations() is not None

    async def reading(self) -> MemorySample | None:
        operations = self._operations()
        return None if operations is None else await operations.background.read_now(operations.options.probe_timeout)
