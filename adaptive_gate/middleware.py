"""`AdaptiveGate`: admission control in front of the routes that use the GPU.

Gated requests take a slot from the limiter before they reach the application and hold it until
the last byte of their response is sent. Requests that find no free slot wait in a FIFO queue
until their deadline; while they wait the gate keeps reading `receive()`, so a client that leaves
gives up its place at once, and the body messages read meanwhile are replayed to the application.
Whatever cannot be served is answered `503` (or `429`) with a `Retry-After` in whole seconds.

What happens to each request (its latency, an out-of-memory error) and what the probe reads goes
to the controller, and the controller's limit goes back to the limiter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import time
from collections import deque
from typing import Any

import anyio
import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import metrics as _metrics
from ._body import Body, BodyBudget, ReadOutcome, announced_length, read_body
from ._checks import check_int, check_seconds
from ._endpoints import Endpoints, check_token, send_json
from ._operator import OperatorBounds, parse_limits
from ._routes import GatedRoute, RouteTable, check_tags, route_path
from ._sampler import Monitor, Sampler
from ._version import __version__
from ._watch import Watch
from ._workers import WorkerCount
from .control import AIMD, Controller
from .diagnostics import Diagnostics
from .limiter import Limiter, QueueFull, QueueTimeout
from .memory import MemorySample
from .oom import is_oom
from .probes import Probe, auto_probe, device_label
from .status import Counters, LimitChange, ProbeState, RecentValues, status_document

__all__ = ["AdaptiveGate"]

logger = logging.getLogger("adaptive_gate")

DEADLINE_HEADER = b"x-envoy-expected-rq-timeout-ms"
MAX_QUEUE = 1 << 16  # a bigger queue only holds requests past any deadline a client keeps
MIN_BODY_READ_S = 1.0  # a request whose deadline is already near still gets this long to send its body
MAX_REQUEST_SECONDS_ASSUMED = 1.0  # for Retry-After before any request has finished
MONITOR_PERIOD_S = 0.1
PROBE_BROKEN_AFTER_ERRORS = 3  # readiness fails after this many failed readings in a row
HEALTH_PATHS = ("/health", "/healthz", "/livez", "/readyz")
FIRST_READING_WAIT_S = 2.0  # plus probe_timeout: how long start-up waits for the first reading
CLOSE = [(b"connection", b"close")]


class ClientNotReading(Exception):
    """A send to the client did not complete within `send_timeout`: the response is abandoned."""


def check_health_paths(health_paths: object) -> frozenset[str]:
    if isinstance(health_paths, str) or not isinstance(health_paths, tuple | list | set | frozenset):
        raise TypeError(f"health_paths must be a tuple of paths such as ('/healthz',), got {health_paths!r}")
    for path in health_paths:
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"health_paths must be paths starting with '/', such as '/healthz'; got {path!r}")
    return frozenset(health_paths)


class _Slot:
    """One admitted request's hold on the limiter; given back exactly once, whatever happens."""

    __slots__ = (
        "gate", "route", "admitted_s", "busy_area_at_admission", "epoch", "serial", "alone_at_admission", "released",
        "informative", "oom",
    )  # fmt: skip

    def __init__(self, gate: AdaptiveGate, route: GatedRoute, epoch: int) -> None:
        self.gate = gate
        self.route = route
        self.admitted_s = time.monotonic()
        self.busy_area_at_admission = gate.limiter.busy_area()
        self.epoch = epoch
        # Whether it has run alone so far: nothing ran when it came in, and nothing came in since.
        self.serial = gate.counters.admitted
        self.alone_at_admission = gate.limiter.in_flight == 1
        self.released = False
        # A 4xx/5xx answer says nothing about capacity: it gives the controller no latency sample.
        self.informative = True
        self.oom = False

    def release(self, *, success: bool) -> None:
        if self.released:
            return
        self.released = True
        self.gate._on_release(self, success=success)


class AdaptiveGate:
    """Pure ASGI middleware: `app.add_middleware(AdaptiveGate, **options)`.

    Options keep the meaning given in the README; see there for defaults and units.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        tag: str | None = "gpu",
        initial_limit: int | None = None,
        min_limit: int = 1,
        max_limit: int = 64,
        max_queue: int = 128,
        queue_timeout: float = 30.0,
        probe: Probe | str | None = "auto",
        controller: Controller | None = None,
        status_path: str | None = "/gate/status",
        reject_status: int = 503,
        max_retry_after: int = 60,
        sample_period: float = 0.1,
        probe_timeout: float = 1.0,
        metrics_path: str | None = "/gate/metrics",
        dashboard_path: str | None = "/gate/dashboard",
        ready_path: str | None = "/gate/ready",
        limits_path: str | None = "/gate/limits",
        admin_token: str | None = None,
        unprotected: tuple[str, ...] | frozenset[str] = (),
        health_paths: tuple[str, ...] = HEALTH_PATHS,
        workers: int | None = None,
        diagnostics: Diagnostics | None = None,
        max_body_bytes: int = 32 << 20,
        max_buffered_bytes: int = 256 << 20,
        body_timeout: float = 30.0,
        send_timeout: float = 30.0,
    ) -> None:
        self.app = app
        self.tags = check_tags(tag)
        self.min_limit = check_int("min_limit", min_limit, 1)
        self.max_limit = check_int("max_limit", max_limit, self.min_limit)
        if initial_limit is not None:
            check_int("initial_limit", initial_limit, self.min_limit, self.max_limit)
        check_int("max_queue", max_queue, 0, MAX_QUEUE)
        self.max_body_bytes = check_int("max_body_bytes", max_body_bytes, 0)
        self._body_budget = BodyBudget(check_int("max_buffered_bytes", max_buffered_bytes, self.max_body_bytes))
        self.body_timeout_s = check_seconds("body_timeout", body_timeout, allow_zero=False)
        self.send_timeout_s = check_seconds("send_timeout", send_timeout, allow_zero=False)
        self.queue_timeout_s = check_seconds("queue_timeout", queue_timeout)
        if reject_status not in (429, 503):
            raise ValueError(f"reject_status must be 503 or 429, got {reject_status!r}")
        self.reject_status = reject_status
        self.max_retry_after_s = check_int("max_retry_after", max_retry_after, 1)
        self.sample_period_s = check_seconds("sample_period", sample_period, allow_zero=False)
        self.probe_timeout_s = check_seconds("probe_timeout", probe_timeout, allow_zero=False)
        self._endpoints = Endpoints(
            paths={
                "status": status_path,
                "metrics": metrics_path,
                "dashboard": dashboard_path,
                "ready": ready_path,
                "limits": limits_path,
            },
            admin_token=check_token(admin_token),
            unprotected=unprotected,
        )
        self.health_paths = check_health_paths(health_paths)
        if workers is not None:
            check_int("workers", workers, 1)
        self._probe_option = self._check_probe(probe)

        if controller is None:
            controller = AIMD()
        elif not isinstance(controller, Controller):
            raise TypeError(f"controller must implement adaptive_gate.control.Controller, got {controller!r}")
        controller.bind(min_limit=self.min_limit, max_limit=self.max_limit, initial_limit=initial_limit)
        self.controller = controller
        self.limiter = Limiter(controller.limit, max_queue=max_queue)

        self.counters = Counters()
        self.queue_wait_s = RecentValues()
        self.service_s = RecentValues()
        self.limit_changes: deque[LimitChange] = deque(maxlen=32)
        self.probe_state = ProbeState(description="not started")
        self._routes = RouteTable(self.tags, fallback_app=app)
        self._sampler: Sampler | None = None
        self._sampler_task: asyncio.Task[None] | None = None
        self._ooms_from_errors = 0
        self._ooms_from_probe_counted = 0
        self._probe_oom_start: int | None = None
        self._probe_oom_epoch = 0
        self._thread_pool_tokens: float | None = None
        self._warned_thread_pool = False
        self._oom_logged_epoch = -1

        self.operator: OperatorBounds | None = None
        if diagnostics is not None and not isinstance(diagnostics, Diagnostics):
            raise TypeError(
                f"diagnostics must be an adaptive_gate.diagnostics.Diagnostics(...) or None, got {diagnostics!r}"
            )
        self.diagnostics = diagnostics if diagnostics is not None else Diagnostics()
        self.watch = Watch(self.diagnostics, period_s=MONITOR_PERIOD_S)
        self._monitor: Monitor | None = None
        self._monitor_task: asyncio.Task[None] | None = None
        self._workers = WorkerCount(workers)
        self.metrics = _metrics.GateMetrics(self.status) if _metrics.available() else None

    @staticmethod
    def _check_probe(probe: object) -> object:
        if probe is None or probe == "auto":
            return probe
        if isinstance(probe, str):
            raise ValueError(f"probe must be 'auto', None or an object with sample(), got {probe!r}")
        if not callable(getattr(probe, "sample", None)):
            raise TypeError(f"probe must have a sample() method returning a MemorySample, got {probe!r}")
        return probe

    # -- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        endpoint = self._endpoints.find(path)
        if endpoint is not None:
            await self._endpoints.handle(endpoint, self, scope, receive, send)
            return
        route = self._routes.match(scope, path)
        if route is None or path in self.health_paths:
            await self.app(scope, receive, send)
            return
        if self._monitor is None:
            self._start_background_without_lifespan()
        await self._gated(route, scope, receive, send)

    async def _gated(self, route: GatedRoute, scope: Scope, receive: Receive, send: Send) -> None:
        arrived_s = time.monotonic()
        deadline_s = self._deadline_s(scope)
        body = await self._read_body(scope, receive, send, deadline_s)
        if body is None:
            return
        try:
            if not self.limiter.try_acquire():
                waited_s = time.monotonic() - arrived_s
                if not await self._wait_for_slot(body, send, deadline_s - waited_s):
                    return
        finally:  # admitted or gone: the queue no longer holds these bytes
            self._body_budget.give_back(body.nbytes)
        self.counters.admitted += 1
        waited_s = time.monotonic() - arrived_s
        self.queue_wait_s.add(waited_s)
        if self.metrics is not None:
            self.metrics.queue_wait_s.observe(waited_s)
        slot = _Slot(self, route, self.controller.epoch)
        if route.is_async:  # only async routes can stall the loop: only they are watched
            self.watch.started(slot, route)
        await self._run_in_slot(slot, scope, body.receive, send)

    async def _run_in_slot(self, slot: _Slot, scope: Scope, receive: Receive, send: Send) -> None:
        response_started = False
        send_timeout_s = self.send_timeout_s

        async def send_and_release(message: Message) -> None:
            nonlocal response_started
            message_type = message["type"]
            if message_type == "http.response.start":
                response_started = True
                slot.informative = message["status"] < 400
            with anyio.move_on_after(send_timeout_s) as scope_:
                await send(message)
            if scope_.cancelled_caught:
                # The client reads nothing: the slot is for GPU work, not for waiting on a socket.
                slot.release(success=False)
                raise ClientNotReading(f"the client read nothing for {send_timeout_s} s; the response was abandoned")
            if message_type == "http.response.pathsend" or (
                message_type == "http.response.body" and not message.get("more_body", False)
            ):
                slot.release(success=slot.informative)

        out_of_memory = alone = False
        try:
            await self.app(scope, receive, send_and_release)
        except Exception as exc:
            if isinstance(exc, ClientNotReading):
                logger.info("adaptive_gate: %s %s: %s", scope["method"], scope["path"], exc)
                return  # the response is cut short; the server closes the connection
            if not is_oom(exc):
                self.counters.errors += 1
                raise
            slot.oom = True
            # Out of memory while it ran alone from start to end: its own size, not congestion.
            alone = slot.alone_at_admission and slot.serial == self.counters.admitted and self.limiter.in_flight == 1
            self._record_oom(slot.epoch, alone=alone)
            if response_started:
                raise  # mid-stream: the status line is gone, the server must close the connection
            out_of_memory = True
        finally:
            slot.release(success=False)
        if out_of_memory:
            self._log_oom(slot, scope, alone=alone)
            if alone:
                await self._reject(send, "too_large", "this request ran out of GPU memory while it ran alone: it is "
                                   "too large for the card as the card is now; send a smaller input")  # fmt: skip
            else:
                await self._reject(send, "oom", "the GPU ran out of memory for this request; retry later")

    def _log_oom(self, slot: _Slot, scope: Scope, *, alone: bool) -> None:
        # One line per congestion event, not per request: a burst of OOMs is one story.
        level = logging.WARNING if slot.epoch > self._oom_logged_epoch or alone else logging.DEBUG
        self._oom_logged_epoch = max(self._oom_logged_epoch, slot.epoch)
        logger.log(
            level,
            "adaptive_gate: out of memory in %s %s with %d in flight, answered %d; limit now %d%s",
            scope["method"],
            scope["path"],
            self.limiter.in_flight + 1,
            self.reject_status,
            self.limiter.limit,
            " (it ran alone: too large for the card, the limit is not cut for it)" if alone else "",
        )

    async def _read_body(self, scope: Scope, receive: Receive, send: Send, deadline_s: float) -> Body | None:
        """The whole body, before the request may take a slot; None when already answered."""
        length = announced_length(scope)
        if length is not None and length > self.max_body_bytes:
            await self._refuse_body(send, ReadOutcome.TOO_LARGE)
            return None
        timeout_s = min(self.body_timeout_s, max(deadline_s, MIN_BODY_READ_S))
        body = await read_body(
            receive, max_body_bytes=self.max_body_bytes, budget=self._body_budget, timeout_s=timeout_s
        )
        if body.outcome is ReadOutcome.COMPLETE:
            return body
        if body.outcome is ReadOutcome.DISCONNECTED:
            self.counters.left_queue += 1
        elif body.outcome is ReadOutcome.BUFFER_FULL:
            await self._reject(send, "queue_full", "the request bodies waiting for the GPU fill the gate's buffer")
        else:
            await self._refuse_body(send, body.outcome)
        return None

    async def _refuse_body(self, send: Send, outcome: ReadOutcome) -> None:
        """413 or 408: the client's own doing, no capacity answer (no Retry-After, not `rejected`)."""
        if outcome is ReadOutcome.TOO_LARGE:
            self.counters.bodies_too_large += 1
            detail = f"the request body is over max_body_bytes ({self.max_body_bytes} bytes)"
            await send_json(send, 413, {"detail": detail, "reason": "body_too_large"}, headers=CLOSE)
        else:
            self.counters.body_timeouts += 1
            detail = "the request body did not arrive within the body timeout (or the request's deadline)"
            await send_json(send, 408, {"detail": detail, "reason": "body_timeout"}, headers=CLOSE)

    async def _wait_for_slot(self, body: Body, send: Send, timeout_s: float) -> bool:
        """Queue for a slot, the body already read. True when admitted; False when already answered."""
        if self.limiter.queued >= self.limiter.max_queue:
            await self._reject(send, "queue_full", "too many requests are waiting for the GPU")
            return False
        estimate_s = self._estimated_wait_s(self.limiter.queued)
        if estimate_s is not None and estimate_s > timeout_s:
            await self._reject(send, "deadline", "the expected wait is longer than the request's deadline")
            return False

        outcome = "cancelled"
        try:
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(body.wait_for_disconnect, task_group.cancel_scope)
                try:
                    await self.limiter.acquire(timeout_s)
                    outcome = "granted"
                except QueueTimeout:
                    outcome = "timeout"
                except QueueFull:
                    outcome = "queue_full"
                task_group.cancel_scope.cancel()
        except BaseException:
            # Cancelled from outside while the task group wound down: a slot granted just before
            # is ours and nobody else will give it back.
            if outcome == "granted":
                self.limiter.release()
            raise
        if body.outcome is ReadOutcome.DISCONNECTED:
            # The client left while waiting: the cancelled wait gave its place (or slot) back. If
            # the slot came in the same instant, it is ours, and goes back here.
            if outcome == "granted":
                self.limiter.release()
            self.counters.left_queue += 1
            return False
        if outcome == "timeout":
            self.counters.timed_out += 1
            await self._reject(send, "deadline", "no GPU slot became free before the request's deadline")
            return False
        if outcome == "queue_full":
            await self._reject(send, "queue_full", "too many requests are waiting for the GPU")
            return False
        return True

    def _deadline_s(self, scope: Scope) -> float:
        """Seconds this request may wait: `queue_timeout`, or sooner if the proxy says so."""
        for name, value in scope["headers"]:
            if name == DEADLINE_HEADER:
                # Digits only (int() takes "1_000" and " 5"); more than 12 of them is past any
                # timeout we keep, and would overflow the float division.
                if value.isdigit():
                    return self.queue_timeout_s if len(value) > 12 else min(self.queue_timeout_s, int(value) / 1000)
                break  # malformed: ignored, never a 500
        return self.queue_timeout_s

    # -- bookkeeping on the event loop ----------------------------------------------------------

    def _on_release(self, slot: _Slot, *, success: bool) -> None:
        now_s = time.monotonic()
        in_flight = self.limiter.in_flight
        busy_area = self.limiter.busy_area()
        self.limiter.release()
        if slot.route.is_async:
            self.watch.ended(slot, now_s)
        if not success:
            if slot.oom:
                self.counters.admitted_ooms += 1
            else:
                self.counters.failed += 1
            return
        latency_s = now_s - slot.admitted_s
        # The mean number of requests this one ran alongside (itself included), not a snapshot.
        concurrency = (busy_area - slot.busy_area_at_admission) / latency_s if latency_s > 0 else in_flight
        self.counters.completed += 1
        self.service_s.add(latency_s)
        if self.metrics is not None:
            self.metrics.service_s.observe(latency_s)
        demand = self.limiter.queued > 0 or in_flight >= self.limiter.limit
        if self.operator is not None and self.controller.limit >= self.operator.max_limit:
            demand = False  # held down by the operator: growing underneath would only creep
        self.controller.on_success(now_s=now_s, latency_s=latency_s, concurrency=concurrency, demand=demand)
        self._apply_limit()

    def _record_oom(self, epoch: int, *, alone: bool) -> None:
        self._count_ooms(1)
        self._ooms_from_errors += 1
        if alone:
            return  # one request that does not fit even alone: cutting would only starve the others
        self.controller.on_oom(now_s=time.monotonic(), epoch=epoch, in_flight=self.limiter.in_flight)
        self._apply_limit()

    def _on_sample(self, sample: MemorySample) -> None:
        now_s = time.monotonic()
        self.probe_state.last_sample = sample
        self.probe_state.last_error = None
        self.probe_state.consecutive_errors = 0
        self.controller.on_sample(now_s=now_s, sample=sample, in_flight=self.limiter.in_flight)
        self._count_swallowed_ooms(sample, now_s)
        self._apply_limit()
        self.diagnostics.on_sample(now_s, sample, in_flight=self.limiter.in_flight, queued=self.limiter.queued)

    def _count_swallowed_ooms(self, sample: MemorySample, now_s: float) -> None:
        """OOMs the application caught itself show only in the probe's cumulative count."""
        if sample.oom_count is None:
            return
        if self._probe_oom_start is None:
            self._probe_oom_start = sample.oom_count - self._ooms_from_errors
        unseen = sample.oom_count - self._probe_oom_start - self._ooms_from_errors - self._ooms_from_probe_counted
        if unseen > 0:
            self._ooms_from_probe_counted += unseen
            self._count_ooms(unseen)
            # Cut at most once for what happened since the previous sample.
            self.controller.on_oom(now_s=now_s, epoch=self._probe_oom_epoch, in_flight=self.limiter.in_flight)
        self._probe_oom_epoch = self.controller.epoch

    def _count_ooms(self, ooms: int) -> None:
        self.counters.ooms += ooms
        self.watch.oom()

    def _on_probe_error(self, message: str) -> None:
        self.probe_state.errors += 1
        self.probe_state.consecutive_errors += 1
        if self.probe_state.last_error != message:
            logger.warning("adaptive_gate: %s; serving on OOM and latency signals meanwhile", message)
        self.probe_state.last_error = message

    def _on_probe(self, probe: Probe | None, description: str) -> None:
        self.probe_state.description = description or f"probe: {probe!r}"
        self.probe_state.simulated = type(probe).__name__ == "SimulatedGPU"
        self.probe_state.device = device_label(probe)
        logger.info("adaptive_gate: %s", self.probe_state.description)

    def _apply_limit(self, reason: str | None = None) -> None:
        new_limit = self.controller.limit
        if self.operator is not None and self.operator.clamp(new_limit) != new_limit:
            new_limit = self.operator.clamp(new_limit)
            reason = reason or ("operator pin" if self.operator.pinned else "operator bounds")
        old_limit = self.limiter.limit
        if new_limit == old_limit:
            return
        self.limiter.limit = new_limit
        reason = reason or self.controller.reason
        if new_limit > old_limit:
            self.counters.limit_increases += 1
        else:
            self.counters.limit_decreases += 1
        self.limit_changes.append(LimitChange(round(time.time(), 3), old_limit, new_limit, reason))
        logger.info(
            "adaptive_gate limit change: old=%d new=%d reason=%s",
            old_limit,
            new_limit,
            json.dumps(reason),
            extra={"adaptive_gate": {"event": "limit_change", "old": old_limit, "new": new_limit, "reason": reason}},
        )
        self._warn_thread_pool(new_limit)

    # -- answers --------------------------------------------------------------------------------

    def _estimated_wait_s(self, ahead: int) -> float | None:
        mean_service_s = self.service_s.mean()
        if mean_service_s is None:
            return None
        return (ahead + 1) * mean_service_s / self.limiter.limit

    def _retry_after_s(self) -> int:
        estimate_s = self._estimated_wait_s(self.limiter.queued)
        if estimate_s is None:
            estimate_s = MAX_REQUEST_SECONDS_ASSUMED
        # Jitter, so that the clients turned away together do not all come back together.
        estimate_s += random.uniform(0.0, 0.5 + 0.25 * estimate_s)
        return max(1, min(self.max_retry_after_s, math.ceil(estimate_s)))

    async def _reject(self, send: Send, reason: str, detail: str) -> None:
        self.counters.reject(reason)
        retry_after_s = self._retry_after_s()
        body = {"detail": detail, "reason": reason, "retry_after_s": retry_after_s}
        await send_json(send, self.reject_status, body, headers=[(b"retry-after", str(retry_after_s).encode())])

    def status(self) -> dict[str, Any]:
        """The document served at `status_path`. Nothing secret: the token shows only as set or not."""
        self.probe_state.running = self._sampler is not None and self._sampler.running
        ready, not_ready = self.readiness()
        controller = self.controller.describe()
        bound = controller.get("bound", "controller")
        if self.operator is not None and self.operator.clamp(self.controller.limit) != self.controller.limit:
            bound = "operator"
        min_limit, max_limit = self._bounds()
        workers, workers_source = self._workers.get()
        return status_document(
            limiter=self.limiter.statistics(),
            min_limit=min_limit,
            max_limit=max_limit,
            counters=self.counters,
            queue_wait_s=self.queue_wait_s,
            service_s=self.service_s,
            probe=self.probe_state,
            changes=self.limit_changes,
            controller=controller,
            options={
                "tag": None if self.tags is None else (min(self.tags) if len(self.tags) == 1 else sorted(self.tags)),
                "min_limit": self.min_limit,
                "max_limit": self.max_limit,
                "max_queue": self.limiter.max_queue,
                "queue_timeout_s": self.queue_timeout_s,
                "max_body_bytes": self.max_body_bytes,
                "max_buffered_bytes": self._body_budget.max_bytes,
                "body_timeout_s": self.body_timeout_s,
                "send_timeout_s": self.send_timeout_s,
                "reject_status": self.reject_status,
                "max_retry_after_s": self.max_retry_after_s,
                "sample_period_s": self.sample_period_s,
                "probe_timeout_s": self.probe_timeout_s,
                "paths": self._endpoints.paths,
                "admin_token_set": self._endpoints.token_set,
                "protected": sorted(self._endpoints.protected),
                "health_paths": sorted(self.health_paths),
            },
            extra={
                "version": __version__,
                "bound": bound,
                "operator": None if self.operator is None else self.operator.describe(),
                "ready": {"ready": ready, "reasons": not_ready, "degraded": self.degraded()},
                "workers": {"count": workers, "source": workers_source, "pid": os.getpid()},
                "loop_lag_s": round(self.watch.loop_lag_s, 4),
                "findings": self.diagnostics.findings(),
                "finding_appearances": self.diagnostics.appearances(),
            },
        )  # fmt: skip

    def metrics_body(self) -> bytes | None:
        """Prometheus exposition, or None where prometheus-client is not installed."""
        return None if self.metrics is None else self.metrics.render()

    def dashboard_data(self) -> dict[str, Any]:
        return {
            "now_unix_s": round(time.time(), 3),
            "status": self.status(),
            "history": self.watch.history.columns(),
            "oom_unix_s": [round(t, 3) for t in self.watch.oom_unix_s],
        }

    def readiness(self) -> tuple[bool, list[str]]:
        """Whether to send this replica traffic now, and if not, why.

        Only a full queue makes a replica unready. A broken probe does not: an NVML outage hits
        every replica at once, and taking them all out of rotation would turn a blind gate (which
        still serves on OOM and latency signals) into no service at all. It shows in `degraded`.
        """
        reasons = []
        if self.limiter.queued >= self.limiter.max_queue and self.limiter.in_flight >= self.limiter.limit:
            reasons.append(f"the queue is full ({self.limiter.queued} waiting)")
        return not reasons, reasons

    def degraded(self) -> list[str]:
        """What the gate serves without, while it still serves: said beside readiness, never instead of it."""
        if self.probe_state.consecutive_errors >= PROBE_BROKEN_AFTER_ERRORS:
            return [
                f"the memory probe failed {self.probe_state.consecutive_errors} times in a row; "
                "serving on OOM and latency signals"
            ]
        return []

    def operator_limits(self) -> dict[str, Any]:
        return {
            "limit": self.limiter.limit,
            "controller_limit": self.controller.limit,
            "operator": None if self.operator is None else self.operator.describe(),
            "configured": {"min_limit": self.min_limit, "max_limit": self.max_limit},
        }

    def _bounds(self) -> tuple[int, int]:
        """The bounds in force: the operator's where set, else the configured ones."""
        if self.operator is None:
            return self.min_limit, self.max_limit
        return self.operator.min_limit, self.operator.max_limit

    def set_operator_limits(self, body: object) -> dict[str, Any]:
        """Pin or bound the limit at run time (`PUT limits_path`); LimitsError leaves all as it was."""
        bounds = parse_limits(body, configured_min=self.min_limit, configured_max=self.max_limit)
        if bounds is not None and bounds == OperatorBounds(self.min_limit, self.max_limit):
            bounds = None
        self.operator = bounds
        logger.info(
            "adaptive_gate: operator limits set to %s",
            "the configured bounds" if bounds is None else f"[{bounds.min_limit}, {bounds.max_limit}]",
        )
        self._apply_limit("operator" if bounds is not None else "operator reset")
        return self.operator_limits()

    def _on_tick(self, now_s: float, lag_s: float) -> None:
        min_limit, max_limit = self._bounds()
        self.watch.tick(
            now_s,
            lag_s,
            limiter=self.limiter.statistics(),
            sample=self.probe_state.last_sample,
            min_limit=min_limit,
            max_limit=max_limit,
            probe_errors_in_row=self.probe_state.consecutive_errors,
        )

    # -- the sampler's life ---------------------------------------------------------------------

    def _make_sampler(self) -> Sampler | None:
        if self._probe_option is None:
            self.probe_state.description = "probe: none (probe=None), the gate runs on OOM and latency signals"
            return None
        self._sampler = Sampler(
            self._resolve_probe,
            period_s=self.sample_period_s,
            timeout_s=self.probe_timeout_s,
            on_probe=self._on_probe,
            on_sample=self._on_sample,
            on_error=self._on_probe_error,
        )
        return self._sampler

    def _resolve_probe(self) -> tuple[Probe | None, str]:
        if self._probe_option == "auto":
            return auto_probe()
        probe: Probe = self._probe_option  # type: ignore[assignment]
        return probe, f"probe: {probe!r}"

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._read_thread_pool()
        # A second lifespan in the same process (tests, reloads) starts fresh loops.
        sampler = self._make_sampler()
        loops = [loop for loop in (sampler, self._make_monitor()) if loop is not None]

        async def receive_and_watch() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                for loop in loops:
                    loop.stop()
            return message

        async def send_when_measured(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete" and sampler is not None:
                # The model is loaded and nothing runs yet: the reading to learn the baseline from.
                await sampler.fresh_reading(FIRST_READING_WAIT_S + self.probe_timeout_s)
            await send(message)

        error: Exception | None = None
        async with anyio.create_task_group() as task_group:
            for loop in loops:
                task_group.start_soon(loop.run)
            try:
                await self.app(scope, receive_and_watch, send_when_measured)
            except Exception as exc:  # re-raised below, unwrapped by the task group
                error = exc
            for loop in loops:
                loop.stop()
        if error is not None:
            raise error

    def _make_monitor(self) -> Monitor:
        self._monitor = Monitor(period_s=MONITOR_PERIOD_S, on_tick=self._on_tick)
        return self._monitor

    def _start_background_without_lifespan(self) -> None:
        """No lifespan ran (httpx ASGITransport, some servers): start the loops at the first request."""
        if not _on_asyncio():
            self._make_monitor()  # never run (not asyncio), so that this is tried once only
            self.probe_state.description = "probe: not sampled, no lifespan ran and the loop is not asyncio"
            return
        self._read_thread_pool()
        loop = asyncio.get_running_loop()
        self._monitor_task = loop.create_task(self._make_monitor().run())
        sampler = self._make_sampler()
        if sampler is not None:
            self._sampler_task = loop.create_task(sampler.run())

    async def aclose(self) -> None:
        """Stop the loops started without a lifespan (for tests and embedders)."""
        for loop in (self._sampler, self._monitor):
            if loop is not None:
                loop.stop()
        tasks = [task for task in (self._sampler_task, self._monitor_task) if task is not None]
        if tasks:
            await asyncio.wait(tasks)
        self._sampler_task = self._monitor_task = None

    def _read_thread_pool(self) -> None:
        if self._thread_pool_tokens is None:
            try:
                self._thread_pool_tokens = anyio.to_thread.current_default_thread_limiter().total_tokens
            except Exception:  # no running loop anyio knows: nothing to compare against
                self._thread_pool_tokens = None

    def _warn_thread_pool(self, limit: int) -> None:
        tokens = self._thread_pool_tokens
        if tokens is None or limit <= tokens or self._warned_thread_pool:
            return
        self._warned_thread_pool = True
        logger.warning(
            "adaptive_gate: the limit reached %d but sync routes share a thread pool of %d tokens, so at most %d "
            "of them run at once; raise anyio.to_thread.current_default_thread_limiter().total_tokens "
            "if the GPU holds more",
            limit,
            tokens,
            tokens,
        )


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
