"""What the gate watches on a clock rather than per request: the event loop's lag, the history the
dashboard draws, and the diagnostics that judge states over time.

The monitor calls `tick` ten times a second; requests only tell it when a gated `async def` route
starts and ends (sync routes run in threads and cannot stall the loop, so they cost nothing here).
When the loop wakes late, the async routes that ran meanwhile are the suspects.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from .._gate.core import Ticket
from .._gate.limiter import LimiterStatistics
from ..memory import MemorySample
from .diagnostics import Diagnostics

__all__ = ["GatedRoute", "History", "Watch"]


class GatedRoute:
    """What the diagnostics need of a gated route: how to name it, and whether it is `async def`."""

    __slots__ = ("label", "is_async")

    def __init__(self, label: str, is_async: bool) -> None:
        self.label = label
        self.is_async = is_async


class History:
    """One point per second over the last minutes, for the dashboard.

    The monitor records several times a second; a point keeps the highest in-flight and queue seen
    within its second (a burst between two reads is not lost) and the last limit and memory.
    """

    COLUMNS = ("unix_s", "limit", "in_flight", "queued", "used_bytes", "total_bytes")

    def __init__(self, seconds: int = 600) -> None:
        self._points: deque[list[float | None]] = deque(maxlen=seconds)

    def record(
        self,
        unix_s: float,
        *,
        limit: int,
        in_flight: float,
        queued: int,
        used_bytes: int | None,
        total_bytes: int | None,
    ) -> None:
        second = float(math.floor(unix_s))
        last = self._points[-1] if self._points else None
        if last is not None and last[0] == second:
            last[1] = limit
            last[2] = max(in_flight, last[2] or 0)
            last[3] = max(queued, last[3] or 0)
            last[4], last[5] = used_bytes, total_bytes
            return
        self._points.append([second, limit, in_flight, queued, used_bytes, total_bytes])

    def columns(self) -> dict[str, list[float | None]]:
        return {name: [point[i] for point in self._points] for i, name in enumerate(self.COLUMNS)}


class Watch:
    def __init__(self, diagnostics: Diagnostics, *, period_s: float) -> None:
        self.diagnostics = diagnostics
        self.period_s = period_s
        self.history = History()
        self.loop_lag_s = 0.0
        # Every gated request holding a slot, by its ticket: the suspects of a stall (the async ones)
        # and what the send watchdog looks through. The middleware adds each as it starts.
        self.running: dict[Ticket, GatedRoute] = {}
        self._finished: deque[tuple[GatedRoute, float]] = deque(maxlen=256)  # (async route, released at)
        self._last_second_s = -math.inf

    def ended(self, ticket: Ticket, clock: Callable[[], float]) -> None:
        """A request gave its slot back; `clock`, the gate's, is read only for an async route."""
        route = self.running.pop(ticket)
        if route.is_async:  # only async routes can stall the loop
            self._finished.append((route, clock()))

    def tick(
        self,
        now_s: float,
        lag_s: float,
        *,
        unix_s: float,
        limiter: LimiterStatistics,
        sample: MemorySample | None,
        min_limit: int,
        max_limit: int,
        probe_errors_in_row: int,
        fits: Callable[[float], int | None] | None = None,
    ) -> None:
        """`fits`: how many slots fit on the card at a time, by the controller's model (`GateCore.fits`), asked
        only at the tick that judges the states that last, once a second."""
        self.loop_lag_s = lag_s
        if lag_s >= self.diagnostics.loop_stall_s:
            self.diagnostics.on_loop_stall(now_s, lag_s, self._routes_since(now_s - lag_s - self.period_s))
        self.history.record(
            unix_s,
            limit=limiter.limit,
            in_flight=limiter.in_flight,
            queued=limiter.queued,
            used_bytes=None if sample is None else sample.used_bytes,
            total_bytes=None if sample is None else sample.total_bytes,
        )
        if now_s - self._last_second_s >= 1.0:
            self._last_second_s = now_s
            self.diagnostics.on_tick(
                now_s,
                limit=limiter.limit,
                min_limit=min_limit,
                max_limit=max_limit,
                queued=limiter.queued,
                probe_errors_in_row=probe_errors_in_row,
                fits=None if fits is None else fits(now_s),
            )

    def _routes_since(self, since_s: float) -> list[tuple[str, bool]]:
        """Gated async routes that ran at some point after `since_s`: the suspects of a stall."""
        routes: list[tuple[str, bool]] = [(r.label, r.is_async) for r in self.running.values() if r.is_async]
        for route, released_s in reversed(self._finished):
            if released_s < since_s:
                break
            routes.append((route.label, route.is_async))
        return routes
